//! The Kubernetes objects keyward writes, built from what is desired: pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::ByteString;
use keyward_engine::inject::RoleKind;

use crate::desired::{Desired, Owner, MANAGED_BY, PROFILE_ANNOTATION, PROVISIONED_FOR};

/// What an object was provisioned for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Namespace,
    Owner,
    ClientCa,
    Attestation,
    /// The self-managed serving certificate.
    Serving,
    /// The cluster facts the webhook resolves `delivery: auto` against.
    ClusterFacts,
    /// A server CA published as a ClusterTrustBundle.
    ServerCaBundle,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Namespace => "namespace",
            Self::Owner => "owner",
            Self::ClientCa => "client-ca",
            Self::Attestation => "attestation",
            Self::Serving => "serving",
            Self::ClusterFacts => "cluster-facts",
            Self::ServerCaBundle => "server-ca-bundle",
        }
    }
}

/// The label selector of everything keyward provisioned for `scope`.
pub fn managed_selector(scope: Scope) -> String {
    format!("{}={},{PROVISIONED_FOR}={}", MANAGED_BY.0, MANAGED_BY.1, scope.as_str())
}

/// Whether keyward manages the object: only then may it change or delete it.
pub fn is_managed(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().and_then(|l| l.get(MANAGED_BY.0)).map(String::as_str) == Some(MANAGED_BY.1)
}

pub fn meta(namespace: &str, name: &str, profile: Option<&str>, scope: Scope, owner: Option<&Owner>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(namespace.to_string()),
        labels: Some(BTreeMap::from([
            (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
            (PROVISIONED_FOR.to_string(), scope.as_str().to_string()),
        ])),
        annotations: profile.map(|p| BTreeMap::from([(PROFILE_ANNOTATION.to_string(), p.to_string())])),
        // The garbage collector deletes it with its owner. Not blockOwnerDeletion: that would
        // need update rights on every owner kind's finalizers, for nothing keyward needs.
        owner_references: owner.map(|o| {
            vec![OwnerReference {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
                controller: Some(true),
                block_owner_deletion: None,
            }]
        }),
        ..ObjectMeta::default()
    }
}

fn desired_meta(d: &Desired, scope: Scope, owner: Option<&Owner>) -> ObjectMeta {
    meta(&d.namespace, &d.name, Some(&d.profile), scope, owner)
}

/// The server CA as a ConfigMap (`data`) or a Secret (`data`, base64 on the wire).
pub fn server_ca_config_map(d: &Desired, key: &str, ca_pem: &str) -> ConfigMap {
    ConfigMap {
        metadata: desired_meta(d, Scope::Namespace, None),
        data: Some(BTreeMap::from([(key.to_string(), ca_pem.to_string())])),
        ..ConfigMap::default()
    }
}

pub fn server_ca_secret(d: &Desired, key: &str, ca_pem: &str) -> Secret {
    Secret {
        metadata: desired_meta(d, Scope::Namespace, None),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(key.to_string(), ByteString(ca_pem.as_bytes().to_vec()))])),
        ..Secret::default()
    }
}

pub fn service_account(d: &Desired) -> ServiceAccount {
    ServiceAccount { metadata: desired_meta(d, Scope::Namespace, None), ..ServiceAccount::default() }
}

pub fn role_binding(d: &Desired, account: &str, role: &keyward_engine::inject::RoleBinding) -> RoleBinding {
    RoleBinding {
        metadata: desired_meta(d, Scope::Namespace, None),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: match role.kind {
                RoleKind::ClusterRole => "ClusterRole".into(),
                RoleKind::Role => "Role".into(),
            },
            name: role.name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.to_string(),
            namespace: Some(d.namespace.clone()),
            api_group: None,
        }]),
    }
}

/// A `kubernetes.io/tls` Secret: `tls.crt` and `tls.key` together, and the client CA.
pub fn client_certificate_secret(d: &Desired, owner: &Owner, cert: &str, key: &str, ca: &str) -> Secret {
    Secret {
        metadata: desired_meta(d, Scope::Owner, Some(owner)),
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            (crate::identity::TLS_CRT.to_string(), ByteString(cert.as_bytes().to_vec())),
            (crate::identity::TLS_KEY.to_string(), ByteString(key.as_bytes().to_vec())),
            (crate::identity::CA_CRT.to_string(), ByteString(ca.as_bytes().to_vec())),
        ])),
        ..Secret::default()
    }
}

pub fn token_secret(d: &Desired, owner: &Owner, key: &str, token: &str) -> Secret {
    Secret {
        metadata: desired_meta(d, Scope::Owner, Some(owner)),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(key.to_string(), ByteString(token.as_bytes().to_vec()))])),
        ..Secret::default()
    }
}

/// The client CA's certificate (never its key), for control planes to trust.
pub fn client_ca_config_map(
    namespace: &str,
    name: &str,
    bundle_pem: &str,
    previous_until: Option<std::time::SystemTime>,
) -> ConfigMap {
    let mut metadata = meta(namespace, name, None, Scope::ClientCa, None);
    if let Some(until) = previous_until {
        metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(crate::signer::PREVIOUS_UNTIL.into(), keyward_certs::rfc3339(until));
    }
    ConfigMap {
        metadata,
        data: Some(BTreeMap::from([(crate::identity::CA_CRT.to_string(), bundle_pem.to_string())])),
        ..ConfigMap::default()
    }
}

/// The ConfigMap `keyward-cluster-facts` in keyward's namespace, which the webhook mounts.
pub fn cluster_facts_config_map(namespace: &str, facts: &keyward_engine::ClusterFacts) -> ConfigMap {
    use keyward_engine::cluster::{CONFIG_MAP, FILE_NAME};
    ConfigMap {
        metadata: meta(namespace, CONFIG_MAP, None, Scope::ClusterFacts, None),
        data: Some(BTreeMap::from([(FILE_NAME.to_string(), facts.to_text())])),
        ..ConfigMap::default()
    }
}

/// A JSON merge patch that puts `desired`'s data, keyward's labels and annotation, and its
/// owner on the existing object at `resource_version` (409 if it changed since): labels and
/// annotations that others put on it stay.
pub fn merge_patch<K: serde::Serialize>(desired: &K, resource_version: &str) -> serde_json::Value {
    let value = serde_json::to_value(desired).unwrap_or_default();
    let meta = &value["metadata"];
    let mut patch = serde_json::json!({"metadata": {"resourceVersion": resource_version}});
    for field in ["labels", "annotations", "ownerReferences"] {
        if !meta[field].is_null() {
            patch["metadata"][field] = meta[field].clone();
        }
    }
    if !value["data"].is_null() {
        patch["data"] = value["data"].clone();
    }
    patch
}

/// The Secret holding the admission attestation's keys (raw 32-byte keys, as the webhook reads
/// them from the mounted files `current` and `previous`).
pub fn attestation_secret(
    namespace: &str,
    name: &str,
    current: &[u8],
    previous: Option<&[u8]>,
    rotated_at: &str,
) -> Secret {
    let mut data =
        BTreeMap::from([(keyward_certs::attestation::CURRENT_FILE.to_string(), ByteString(current.to_vec()))]);
    if let Some(previous) = previous {
        data.insert(keyward_certs::attestation::PREVIOUS_FILE.to_string(), ByteString(previous.to_vec()));
    }
    let mut metadata = meta(namespace, name, None, Scope::Attestation, None);
    metadata.annotations = Some(BTreeMap::from([(ROTATED_AT.to_string(), rotated_at.to_string())]));
    Secret { metadata, type_: Some("Opaque".into()), data: Some(data), ..Secret::default() }
}

/// When the attestation key was last rotated (RFC 3339).
pub const ROTATED_AT: &str = "keyward.io/rotated-at";

/// Pods, read as the apiserver sends them: untyped, so that a field newer than this build's
/// Kubernetes types (a `podCertificate` volume, say) is kept when a pod is re-evaluated.
pub fn pod_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&())
}
