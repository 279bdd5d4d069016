//! What keyward records on the pod so admins can audit it: never secret data, only names.

use serde::{Deserialize, Serialize};

use crate::inject::AuditItem;

/// The annotation holding the [`AuditRecord`] as compact JSON.
pub const ANNOTATION_INJECTED: &str = "keyward.io/injected";

/// The annotation holding the admission attestation ([`crate::attest`]).
pub const ANNOTATION_ATTESTATION: &str = "keyward.io/attestation";
/// The label on every pod keyward injected, naming the profile: `kubectl get pods -l
/// keyward.io/profile` lists them. A listing aid, never a proof (anyone may set it).
pub const LABEL_PROFILE: &str = "keyward.io/profile";
/// The apiserver's limit on the total size of a pod's annotations (keys and values).
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;
/// The service account the pod asked for, when keyward swapped it.
pub const ANNOTATION_ORIGINAL_SA: &str = "keyward.io/original-service-account";

/// The machine-readable record in `keyward.io/injected`, borrowed from the decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord<'a> {
    pub profile: &'a str,
    /// Each kind's own entry (see [`AuditItem`]).
    pub injected: Vec<&'a AuditItem>,
    /// The containers (init and regular) that received the mounts and env vars.
    pub containers: &'a ContainerScope,
}

/// Which containers received the credentials. Never one entry per container of the pod: a pod
/// may have thousands, and the apiserver limits all annotations together to 256 KiB.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ContainerScope {
    /// Every init container and container (the profile names none): `"all"`.
    All(All),
    /// The containers the profile names that the pod has: bounded by the profile, not the pod.
    Named(Vec<String>),
}

/// The string `"all"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum All {
    #[serde(rename = "all")]
    All,
}

impl ContainerScope {
    pub fn all() -> Self {
        Self::All(All::All)
    }

    /// For people: `all`, or the names.
    pub fn describe(&self) -> String {
        match self {
            Self::All(_) => "all".into(),
            Self::Named(names) => names.join(", "),
        }
    }
}

impl AuditRecord<'_> {
    pub fn to_annotation(&self) -> String {
        // Serialising strings and numbers into a String cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The kinds injected, comma-separated (`clientCertificate,serverCA`).
    pub fn kinds(&self) -> String {
        self.injected.iter().map(|i| i.kind()).collect::<Vec<_>>().join(",")
    }
}
