//! The AdmissionReview v1 envelope, as the apiserver sends it and expects it back.
//!
//! The request is parsed with borrowed strings and `request.object` kept raw: the engine reads
//! only what it decides on. The response is written straight into bytes.

use std::borrow::Cow;

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

pub use crate::decision::Object;
use crate::decision::{Decision, RequestFacts, Requester};
use crate::error::Error;
use crate::pod::ReadSeed;
use crate::text::{clip, quoted};

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";
/// The longest `request.uid` keyward echoes back (the apiserver's are 36-character UUIDs).
pub const MAX_UID_BYTES: usize = 128;
/// The most of a parse error keyward puts in a 400 answer.
const MAX_ECHO: usize = 512;

/// `request`, as far as keyward reads it.
#[derive(Debug)]
pub struct AdmissionRequest<'a> {
    pub uid: Cow<'a, str>,
    pub resource: Resource<'a>,
    pub sub_resource: Option<Cow<'a, str>>,
    pub namespace: Option<Cow<'a, str>>,
    pub operation: Cow<'a, str>,
    pub user_info: UserInfo<'a>,
    pub object: Object<'a>,
    pub dry_run: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Resource<'a> {
    #[serde(borrow, default)]
    pub group: Cow<'a, str>,
    #[serde(borrow, default)]
    pub resource: Cow<'a, str>,
}

#[derive(Debug, Default, Deserialize)]
pub struct UserInfo<'a> {
    #[serde(borrow, default)]
    pub username: Option<Cow<'a, str>>,
}

/// Parses a request envelope, keeping `request.object` raw. The error is one line that says
/// what is wrong, and echoes at most a little of what was sent.
pub fn parse_request(body: &[u8]) -> Result<AdmissionRequest<'_>, Error> {
    parse(body, None)
}

/// Parses a request envelope and reads the pod in the same pass (its metadata decoded, keeping
/// the values of the annotations in `keep`): the body is scanned once. A pod that is not
/// readable is left raw, for the engine to refuse with the reason.
pub fn read_request<'a>(body: &'a [u8], keep: &[String]) -> Result<AdmissionRequest<'a>, Error> {
    match parse(body, Some(keep)) {
        Ok(request) => Ok(request),
        // Whether the envelope or the pod is at fault, the raw parse tells.
        Err(_) => parse(body, None),
    }
}

fn parse<'a>(body: &'a [u8], read_pod: Option<&[String]>) -> Result<AdmissionRequest<'a>, Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let envelope = EnvelopeSeed { read_pod }
        .deserialize(&mut de)
        .and_then(|e| de.end().map(|()| e))
        .map_err(|e| Error::Review(format!("body is not an AdmissionReview: {}", clip(&e.to_string(), MAX_ECHO))))?;
    if envelope.api_version != API_VERSION || envelope.kind != KIND {
        return Err(Error::Review(format!(
            "body is apiVersion {} kind {}, expected {API_VERSION} {KIND}; set admissionReviewVersions: [v1] in the webhook configuration",
            quoted(&envelope.api_version, 64),
            quoted(&envelope.kind, 64)
        )));
    }
    let request = envelope.request.ok_or_else(|| Error::Review("AdmissionReview has no request".into()))?;
    if request.uid.is_empty() || request.uid.len() > MAX_UID_BYTES {
        return Err(Error::Review(format!(
            "request.uid is {} bytes; the apiserver sends a UID of 36 characters, and keyward accepts up to {MAX_UID_BYTES}",
            request.uid.len()
        )));
    }
    Ok(request)
}

struct Envelope<'a> {
    api_version: Cow<'a, str>,
    kind: Cow<'a, str>,
    request: Option<AdmissionRequest<'a>>,
}

/// The envelope, with `request.object` read (`read_pod`) or kept raw.
struct EnvelopeSeed<'k> {
    read_pod: Option<&'k [String]>,
}

impl<'de> DeserializeSeed<'de> for EnvelopeSeed<'_> {
    type Value = Envelope<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EnvelopeSeed<'_> {
    type Value = Envelope<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionReview object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut envelope = Envelope { api_version: Cow::Borrowed(""), kind: Cow::Borrowed(""), request: None };
        while let Some(Borrowed(key)) = map.next_key::<Borrowed<'de>>()? {
            match key.as_ref() {
                "apiVersion" => envelope.api_version = map.next_value::<Borrowed<'de>>()?.0,
                "kind" => envelope.kind = map.next_value::<Borrowed<'de>>()?.0,
                "request" => envelope.request = map.next_value_seed(RequestSeed { read_pod: self.read_pod })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(envelope)
    }
}

/// A string borrowed where the JSON allows (serde's `Cow` always copies).
#[derive(Deserialize)]
struct Borrowed<'a>(#[serde(borrow)] Cow<'a, str>);

struct RequestSeed<'k> {
    read_pod: Option<&'k [String]>,
}

impl<'de> DeserializeSeed<'de> for RequestSeed<'_> {
    type Value = Option<AdmissionRequest<'de>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for RequestSeed<'_> {
    type Value = Option<AdmissionRequest<'de>>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request as an object")
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut uid, mut resource, mut operation) = (None, None, None);
        let mut request = AdmissionRequest {
            uid: Cow::Borrowed(""),
            resource: Resource::default(),
            sub_resource: None,
            namespace: None,
            operation: Cow::Borrowed(""),
            user_info: UserInfo::default(),
            object: Object::Missing,
            dry_run: None,
        };
        while let Some(Borrowed(key)) = map.next_key::<Borrowed<'de>>()? {
            match key.as_ref() {
                "uid" => uid = Some(map.next_value::<Borrowed<'de>>()?.0),
                "resource" => resource = Some(map.next_value::<Resource<'de>>()?),
                "subResource" => request.sub_resource = map.next_value::<Option<Borrowed<'de>>>()?.map(|b| b.0),
                "namespace" => request.namespace = map.next_value::<Option<Borrowed<'de>>>()?.map(|b| b.0),
                "operation" => operation = Some(map.next_value::<Borrowed<'de>>()?.0),
                "userInfo" => request.user_info = map.next_value::<Option<UserInfo<'de>>>()?.unwrap_or_default(),
                "dryRun" => request.dry_run = map.next_value()?,
                "object" => {
                    request.object = match self.read_pod {
                        Some(keep) => map.next_value_seed(ObjectSeed { keep })?,
                        None => map.next_value::<Option<&'de RawValue>>()?.map_or(Object::Missing, Object::Raw),
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        request.uid = uid.ok_or_else(|| de::Error::missing_field("uid"))?;
        request.resource = resource.ok_or_else(|| de::Error::missing_field("resource"))?;
        request.operation = operation.ok_or_else(|| de::Error::missing_field("operation"))?;
        Ok(Some(request))
    }
}

/// `request.object`, read as a pod.
struct ObjectSeed<'k> {
    keep: &'k [String],
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_> {
    type Value = Object<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_> {
    type Value = Object<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request.object as a Pod")
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Object::Missing)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Object::Missing)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        ReadSeed { keep: self.keep }.deserialize(d).map(Object::Read)
    }
}

impl AdmissionRequest<'_> {
    /// The facts the engine decides on.
    pub fn facts(&self) -> RequestFacts<'_> {
        RequestFacts {
            operation: &self.operation,
            group: &self.resource.group,
            resource: &self.resource.resource,
            sub_resource: self.sub_resource.as_deref().unwrap_or_default(),
            namespace: self.namespace.as_deref().unwrap_or_default(),
            requester: Requester::User(self.user_info.username.as_deref().unwrap_or_default()),
            admitting: false,
            attestor: None,
        }
    }
}

/// The response envelope for `uid`, as JSON bytes. `patchType` is set only with a patch.
pub fn respond(uid: &str, decision: &Decision) -> Vec<u8> {
    let patch = decision.patch();
    let mut out = Vec::with_capacity(512 + patch.len() * 200 + decision.message().map_or(0, str::len));
    out.extend_from_slice(
        b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"response\":{\"uid\":",
    );
    write_json(&mut out, uid);
    match &decision.outcome {
        Ok(_) if !patch.is_empty() => {
            let mark = out.len();
            out.extend_from_slice(b",\"patchType\":\"JSONPatch\",\"patch\":\"");
            // The patch's JSON, then its base64 straight into the response.
            let mut json = Vec::with_capacity(patch.len() * 160);
            let ok = patch.write_json(&mut json).is_ok() && append_base64(&mut out, &json);
            if ok {
                out.extend_from_slice(b"\",\"allowed\":true");
            } else {
                // A bug in keyward: refuse rather than send half a patch.
                out.truncate(mark);
                out.extend_from_slice(b",\"allowed\":false,\"status\":{\"code\":500,\"reason\":\"InternalError\",\"message\":\"keyward: internal error: the patch could not be written; the pod was refused rather than risk a wrong one\"}");
            }
        }
        Ok(_) => out.extend_from_slice(b",\"allowed\":true"),
        Err(denial) => {
            out.extend_from_slice(b",\"allowed\":false,\"status\":{\"code\":403,\"reason\":\"Forbidden\",\"message\":");
            write_json(&mut out, &denial.message);
            out.push(b'}');
        }
    }
    if !decision.audit_annotations.is_empty() {
        out.extend_from_slice(b",\"auditAnnotations\":");
        write_json(&mut out, &decision.audit_annotations);
    }
    if !decision.warnings.is_empty() {
        out.extend_from_slice(b",\"warnings\":");
        write_json(&mut out, &decision.warnings);
    }
    out.extend_from_slice(b"}}");
    out
}

/// Appends `bytes` in standard base64. False, with `out` as it was, if they cannot be encoded:
/// the caller then refuses the pod rather than admit it with an empty patch.
fn append_base64(out: &mut Vec<u8>, bytes: &[u8]) -> bool {
    use base64::Engine as _;
    let start = out.len();
    let Some(len) = base64::encoded_len(bytes.len(), true) else {
        return false;
    };
    out.resize(start + len, 0);
    match base64::engine::general_purpose::STANDARD.encode_slice(bytes, &mut out[start..]) {
        Ok(written) => {
            out.truncate(start + written);
            true
        }
        Err(_) => {
            out.truncate(start);
            false
        }
    }
}

fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Strings, maps of strings and lists of strings always serialise.
    let _ = serde_json::to_writer(&mut *out, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn base64_is_appended_after_what_is_there_with_its_padding() {
        let mut out = b"\"patch\":\"".to_vec();
        assert!(append_base64(&mut out, b"[{\"op\":\"add\"}]"));
        assert_eq!(out, b"\"patch\":\"W3sib3AiOiJhZGQifV0=".to_vec());
        let mut empty = b"x".to_vec();
        assert!(append_base64(&mut empty, b""));
        assert_eq!(empty, b"x".to_vec());
    }

    #[test]
    fn strings_are_borrowed_from_the_body() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"team-a","operation":"CREATE","userInfo":{"username":"system:serviceaccount:a:b","groups":["x"]},"object":{"kind":"Pod"},"oldObject":null,"dryRun":false}}"#;
        let request = parse_request(body).unwrap();
        assert!(matches!(request.uid, Cow::Borrowed("u-1")));
        assert_eq!(request.object.raw().unwrap().get(), r#"{"kind":"Pod"}"#);
        let read = read_request(body, &[]).unwrap();
        assert!(matches!(read.object, Object::Read(_)));
        let facts = read.facts();
        assert_eq!(facts.requester, Requester::User("system:serviceaccount:a:b"));
        let facts = request.facts();
        assert_eq!((facts.operation, facts.resource, facts.namespace), ("CREATE", "pods", "team-a"));
        assert_eq!(facts.requester, Requester::User("system:serviceaccount:a:b"));
    }

    #[test]
    fn a_response_without_a_patch_has_no_patch_type() {
        let d = crate::engine::decide(
            &RequestFacts::pod_create("ns", Requester::User("u")),
            &RawValue::from_string(r#"{"metadata":{}}"#.into()).unwrap(),
            &crate::ProfileSet::default(),
        );
        let v: Value = serde_json::from_slice(&respond("u-\"1", &d)).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "u-\"1", "allowed": true}})
        );
    }
}
