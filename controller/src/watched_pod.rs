//! A pod as the controller's pod watches and lists deliver it: the few metadata fields a watch
//! and the index use, and the pod's JSON as the API server sent it, kept as text.
//!
//! Never a tree of values: the pod is read once more, by [`crate::desired::for_pod`], straight
//! from that text. Decoded as `DynamicObject`s, a page of 500 pods held about 20 MB of maps at
//! 10,000 owners, and each pod was encoded back into JSON to be read; as text a page costs its
//! size (BENCHMARKS.md, History, issue 29).

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use serde::de::{Deserializer, Error as _, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// One pod: its name, namespace, UID and resourceVersion (what the watch and the index need),
/// whether it carries keyward's attestation annotation, and its JSON.
#[derive(Clone)]
pub(crate) struct WatchedPod {
    meta: ObjectMeta,
    carries_attestation: bool,
    json: Box<RawValue>,
}

// === impl WatchedPod ===

impl WatchedPod {
    /// The pod's JSON, as the API server sent it.
    pub(crate) fn json(&self) -> &RawValue {
        &self.json
    }

    /// Whether the pod has a `keyward.io/attestation` annotation, whatever its value.
    pub(crate) fn carries_attestation(&self) -> bool {
        self.carries_attestation
    }
}

impl fmt::Debug for WatchedPod {
    // The name, never the pod: its env may hold what a log must not.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchedPod")
            .field("namespace", &self.meta.namespace)
            .field("name", &self.meta.name)
            .field("uid", &self.meta.uid)
            .finish_non_exhaustive()
    }
}

impl Resource for WatchedPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

impl<'de> Deserialize<'de> for WatchedPod {
    /// Keeps the object's text (serde_json hands it over without decoding it: kube reads list
    /// pages and watch lines with serde_json, and the API server writes a watch event's `type`
    /// before its `object`), then reads the metadata fields from it.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let json = Box::<RawValue>::deserialize(d)?;
        let head: Head<'_> = serde_json::from_str(json.get()).map_err(D::Error::custom)?;
        let m = head.metadata;
        let meta = ObjectMeta {
            name: m.name.map(Cow::into_owned),
            namespace: m.namespace.map(Cow::into_owned),
            uid: m.uid.map(Cow::into_owned),
            resource_version: m.resource_version.map(Cow::into_owned),
            ..ObjectMeta::default()
        };
        Ok(Self { meta, carries_attestation: m.annotations.0, json })
    }
}

/// What is read of the pod beside its text.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    metadata: HeadMeta<'a>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HeadMeta<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    uid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    resource_version: Option<Cow<'a, str>>,
    #[serde(default)]
    annotations: AttestationKey,
}

/// Whether a map of annotations has keyward's attestation key (its values skipped unread).
#[derive(Default)]
struct AttestationKey(bool);

impl<'de> Deserialize<'de> for AttestationKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_option(AttestationKeyVisitor)
    }
}

/// Looks at each key as it passes, without building a map of them.
struct AttestationKeyVisitor;

impl<'de> Visitor<'de> for AttestationKeyVisitor {
    type Value = AttestationKey;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of annotations")
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(AttestationKey(false))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(AttestationKey(false))
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = false;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            found |= key == keyward_engine::ANNOTATION_ATTESTATION;
            map.next_value::<IgnoredAny>()?;
        }
        Ok(AttestationKey(found))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kube::core::{ObjectList, WatchEvent};

    /// A pod as the API server stores it after admission (trimmed: one container, the
    /// `kube-api-access-*` volume the ServiceAccount admission plugin adds, managedFields).
    const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"evaljob-sample","namespace":"team-a","uid":"7d8c4a2e-0f3b-4c55-9f1e-2a6b8d1c3e4f","resourceVersion":"48213","creationTimestamp":"2026-12-02T10:00:00Z","labels":{"app.kubernetes.io/name":"fms-lm-eval-service"},"annotations":{"keyward.io/attestation":"v1.k1.AAAA","keyward.io/injected":"clientCertificate"},"managedFields":[{"manager":"kube-controller-manager","operation":"Update","apiVersion":"v1","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:labels":{}}}}]},"spec":{"containers":[{"name":"main","image":"quay.io/trustyai/ta-lmes-job:latest","volumeMounts":[{"name":"kube-api-access-x7k2p","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}]}],"volumes":[{"name":"kube-api-access-x7k2p","projected":{"defaultMode":420,"sources":[{"serviceAccountToken":{"expirationSeconds":3607,"path":"token"}}]}}]},"status":{"phase":"Pending","qosClass":"BestEffort"}}"#;

    #[test]
    fn a_watch_line_keeps_the_pod_as_sent_and_reads_its_identity() {
        // The API server's order: `type`, then `object` (metav1.WatchEvent's fields).
        let line = format!(r#"{{"type":"ADDED","object":{POD}}}"#);
        let WatchEvent::Added(pod) = serde_json::from_str::<WatchEvent<WatchedPod>>(&line).unwrap() else {
            panic!("not an ADDED event")
        };
        assert_eq!(pod.json().get(), POD);
        assert_eq!(pod.meta().name.as_deref(), Some("evaljob-sample"));
        assert_eq!(pod.meta().namespace.as_deref(), Some("team-a"));
        assert_eq!(pod.meta().uid.as_deref(), Some("7d8c4a2e-0f3b-4c55-9f1e-2a6b8d1c3e4f"));
        assert_eq!(pod.meta().resource_version.as_deref(), Some("48213"));
        assert!(pod.carries_attestation());
        // Nothing else of the metadata is kept: the pod is read from its text.
        assert!(pod.meta().annotations.is_none() && pod.meta().managed_fields.is_none());
        assert_eq!(
            format!("{pod:?}"),
            r#"WatchedPod { namespace: Some("team-a"), name: Some("evaljob-sample"), uid: Some("7d8c4a2e-0f3b-4c55-9f1e-2a6b8d1c3e4f"), .. }"#
        );
    }

    #[test]
    fn a_list_page_keeps_each_pod_and_its_continue_token() {
        let other = POD.replace(r#""keyward.io/attestation":"v1.k1.AAAA","#, "").replace("evaljob-sample", "other");
        let page = format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"48300","continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"}},"items":[{POD},{other}]}}"#
        );
        let list: ObjectList<WatchedPod> = serde_json::from_str(&page).unwrap();
        assert_eq!(list.metadata.continue_.as_deref(), Some("eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"));
        let names: Vec<_> =
            list.items.iter().map(|p| (p.meta().name.clone().unwrap(), p.carries_attestation())).collect();
        assert_eq!(names, [("evaljob-sample".to_string(), true), ("other".to_string(), false)]);
        assert_eq!(list.items[1].json().get(), other);
    }

    #[test]
    fn a_pod_without_annotations_or_metadata_fields_reads_as_absent() {
        let pod: WatchedPod =
            serde_json::from_str(r#"{"metadata":{"name":"p","annotations":null},"spec":{}}"#).unwrap();
        assert!(!pod.carries_attestation());
        assert_eq!((pod.meta().namespace.as_deref(), pod.meta().uid.as_deref()), (None, None));
        let pod: WatchedPod = serde_json::from_str(r#"{"kind":"Pod"}"#).unwrap();
        assert_eq!(pod.meta().name, None);
    }

    #[test]
    fn a_pod_that_is_not_an_object_is_an_error_not_a_panic() {
        let err = serde_json::from_str::<WatchedPod>(r#""a string""#).unwrap_err().to_string();
        assert!(err.contains("invalid type: string \"a string\", expected struct Head"), "{err}");
        let err = serde_json::from_str::<WatchedPod>(r#"{"metadata":{"name":7}}"#).unwrap_err().to_string();
        assert!(err.contains("invalid type: integer `7`, expected a string"), "{err}");
    }
}
