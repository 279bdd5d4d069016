//! The AdmissionReview v1 envelope, as the apiserver sends it and expects it back.
//!
//! The request is parsed with borrowed strings and `request.object` kept raw: the engine reads
//! only what it decides on. The response is written straight into bytes.

use std::borrow::Cow;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::engine::{Decision, RequestFacts, Requester};
use crate::error::Error;
use crate::text::{clip, quoted};

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";
/// The longest `request.uid` keyward echoes back (the apiserver's are 36-character UUIDs).
pub const MAX_UID_BYTES: usize = 128;
/// The most of a parse error keyward puts in a 400 answer.
const MAX_ECHO: usize = 512;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<'a> {
    #[serde(borrow, default)]
    api_version: Cow<'a, str>,
    #[serde(borrow, default)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    request: Option<AdmissionRequest<'a>>,
}

/// `request`, as far as keyward reads it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest<'a> {
    #[serde(borrow)]
    pub uid: Cow<'a, str>,
    #[serde(borrow)]
    pub resource: Resource<'a>,
    #[serde(borrow, default)]
    pub sub_resource: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub namespace: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub operation: Cow<'a, str>,
    #[serde(borrow, default)]
    pub user_info: UserInfo<'a>,
    #[serde(borrow, default)]
    pub object: Option<&'a RawValue>,
    #[serde(default)]
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

/// Parses a request envelope. The error is one line that says what is wrong, and echoes at most
/// a little of what was sent.
pub fn parse_request(body: &[u8]) -> Result<AdmissionRequest<'_>, Error> {
    let envelope: Envelope<'_> = serde_json::from_slice(body)
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
        }
    }
}

/// The response envelope for `uid`, as JSON bytes. `patchType` is set only with a patch.
pub fn respond(uid: &str, decision: &Decision) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(
        b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"response\":{\"uid\":",
    );
    write_json(&mut out, uid);
    out.extend_from_slice(if decision.allowed() { b",\"allowed\":true" } else { b",\"allowed\":false" });
    match &decision.outcome {
        Ok(m) if !m.patch.is_empty() => {
            // Serialising owned JSON values into a Vec cannot fail.
            let patch = serde_json::to_vec(&m.patch).unwrap_or_default();
            out.extend_from_slice(b",\"patchType\":\"JSONPatch\",\"patch\":\"");
            let start = out.len();
            out.resize(start + base64::encoded_len(patch.len(), true).unwrap_or_default(), 0);
            let written =
                base64::engine::general_purpose::STANDARD.encode_slice(&patch, &mut out[start..]).unwrap_or(0);
            out.truncate(start + written);
            out.push(b'"');
        }
        Ok(_) => {}
        Err(denial) => {
            out.extend_from_slice(b",\"status\":{\"code\":403,\"reason\":\"Forbidden\",\"message\":");
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

fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Strings, maps of strings and lists of strings always serialise.
    let _ = serde_json::to_writer(&mut *out, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn strings_are_borrowed_from_the_body() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"namespace":"team-a","operation":"CREATE","userInfo":{"username":"system:serviceaccount:a:b","groups":["x"]},"object":{"kind":"Pod"},"oldObject":null,"dryRun":false}}"#;
        let request = parse_request(body).unwrap();
        assert!(matches!(request.uid, Cow::Borrowed("u-1")));
        assert_eq!(request.object.unwrap().get(), r#"{"kind":"Pod"}"#);
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
