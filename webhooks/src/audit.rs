//! What keyward records on the pod so admins can audit it: never secret data, only names.

use serde::{Deserialize, Serialize};

/// The annotation holding the [`AuditRecord`] as compact JSON.
pub const ANNOTATION_INJECTED: &str = "keyward.io/injected";
/// The apiserver's limit on the total size of a pod's annotations (keys and values).
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;
/// The service account the pod asked for, when keyward swapped it.
pub const ANNOTATION_ORIGINAL_SA: &str = "keyward.io/original-service-account";

/// The machine-readable record in `keyward.io/injected`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    pub profile: String,
    pub injected: Vec<InjectedItem>,
    /// The containers (init and regular) that received the mounts and env vars.
    pub containers: ContainerScope,
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

    /// For people: `all containers`, or the names.
    pub fn describe(&self) -> String {
        match self {
            Self::All(_) => "all".into(),
            Self::Named(names) => names.join(", "),
        }
    }
}

/// One credential handed to the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum InjectedItem {
    ClientCertificate {
        secret: String,
        volume: String,
        mount_path: String,
    },
    #[serde(rename = "serverCA")]
    ServerCa {
        #[serde(skip_serializing_if = "Option::is_none")]
        secret: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        config_map: Option<String>,
        volume: String,
        mount_path: String,
    },
    Token {
        secret: String,
        key: String,
        volume: String,
        mount_path: String,
    },
    ServiceAccountToken {
        audience: String,
        expiration_seconds: i64,
        volume: String,
        mount_path: String,
    },
    ServiceAccount {
        name: String,
        api_token: crate::profile::ApiToken,
    },
}

impl InjectedItem {
    /// The kind, as in the profile's `spec.inject` key.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ClientCertificate { .. } => "clientCertificate",
            Self::ServerCa { .. } => "serverCA",
            Self::Token { .. } => "token",
            Self::ServiceAccountToken { .. } => "serviceAccountToken",
            Self::ServiceAccount { .. } => "serviceAccount",
        }
    }
}

impl AuditRecord {
    pub fn to_annotation(&self) -> String {
        // Serialising plain strings and numbers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}
