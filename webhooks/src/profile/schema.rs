//! The `InjectionProfile` document, exactly as written in YAML: which pods, who may create them,
//! what to inject (the kinds, from [`crate::kinds::Injections`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::kinds::Injections;

pub const API_VERSION: &str = "keyward.io/v1alpha1";
pub const KIND: &str = "InjectionProfile";

/// One profile, exactly as written in YAML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileDocument {
    pub api_version: String,
    pub kind: String,
    pub metadata: ProfileMetadata,
    pub spec: ProfileSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileMetadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A standard label selector. This or the annotation selector must not be empty: a
    /// profile never selects every pod.
    #[serde(default)]
    pub selector: LabelSelector,
    /// The same on the pod's annotations (`matchAnnotations`, and `matchExpressions` with the
    /// label selector's operators).
    #[serde(default, skip_serializing_if = "AnnotationSelector::is_empty")]
    pub annotation_selector: AnnotationSelector,
    /// If set, the pod's controller owner (the ownerReference with `controller: true`) must be
    /// one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub controller_owners: Vec<OwnerKind>,
    /// Namespace name patterns (`*`, `?`). Empty means every namespace the webhook is sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    pub requesters: Requesters,
    /// Containers (init or regular) that receive mounts and env. Empty means all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<String>,
    /// What to do when a container already sets one of the env vars with another value.
    #[serde(default)]
    pub on_env_conflict: EnvConflictPolicy,
    /// What to do when the pod has something that collides with an injection: refuse it (the
    /// default), or admit it unchanged, with a warning.
    #[serde(default)]
    pub on_conflict: ConflictPolicy,
    pub inject: Injections,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnnotationSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

impl AnnotationSelector {
    pub fn is_empty(&self) -> bool {
        self.match_annotations.is_empty() && self.match_expressions.is_empty()
    }

    /// The annotation keys it reads.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.match_annotations.keys().map(String::as_str).chain(self.match_expressions.iter().map(|r| r.key.as_str()))
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ConflictPolicy {
    /// Refuse the pod, naming the field and the fix.
    #[default]
    Deny,
    /// Admit the pod unchanged, with a warning, a log line and the reason `conflict-skipped`:
    /// for profiles where a missing credential is better than a pod that cannot start.
    Skip,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

impl LabelSelector {
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// A controller kind, matched on the API group (any version) and kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OwnerKind {
    /// `""` for the core group, `apps` for ReplicaSet, `batch` for Job.
    pub api_group: String,
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Requesters {
    /// `request.userInfo.username` patterns, e.g. `system:serviceaccount:*:kuberay-operator`.
    pub usernames: Vec<String>,
    /// What happens when someone else creates a selected pod.
    #[serde(default)]
    pub otherwise: Otherwise,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Otherwise {
    /// Admit the pod unchanged, with a warning (nothing is handed out).
    #[default]
    Skip,
    /// Refuse the pod.
    Deny,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EnvConflictPolicy {
    /// Refuse the pod, naming the container and the variable.
    #[default]
    Deny,
    /// Keep the user's value and return a warning.
    KeepUser,
}
