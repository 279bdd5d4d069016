//! The `InjectionProfile` format: which pods, who may create them, what to inject.
//!
//! Profiles are YAML (one file may hold several documents). They are parsed strictly
//! (unknown fields are refused) and validated as a whole before any is used, so a typo
//! never turns into a silently skipped injection.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::{Error, ProfileError};
use crate::names::{
    is_dns1123_label, is_dns1123_subdomain, is_env_var_name, is_label_value, is_qualified_name, mount_path_problem,
    relative_path_problem, service_account_pattern, NameTemplate, DNS1123_LABEL_RULE, DNS1123_SUBDOMAIN_RULE,
    ENV_VAR_NAME_RULE, KUBE_API_ACCESS_PREFIX, SERVICE_ACCOUNT_MOUNT_PATH,
};

pub const API_VERSION: &str = "keyward.io/v1alpha1";
pub const KIND: &str = "InjectionProfile";
/// The apiserver refuses projected tokens that expire sooner than this.
pub const MIN_TOKEN_EXPIRATION_SECONDS: i64 = 600;
/// The longest token lifetime the apiserver issues by default (`--service-account-max-token-expiration` unset).
pub const MAX_TOKEN_EXPIRATION_SECONDS: i64 = 48 * 3600;

/// The built-in profiles, shipped inside the binary.
const BUILTIN_SOURCES: &[(&str, &str)] = &[
    ("builtin:lmeval-job.yaml", include_str!("../profiles/lmeval-job.yaml")),
    ("builtin:kuberay.yaml", include_str!("../profiles/kuberay.yaml")),
    ("builtin:kserve-inferencegraph.yaml", include_str!("../profiles/kserve-inferencegraph.yaml")),
];

// === Profile document ===

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
    /// A standard label selector. Must not be empty: a profile never selects every pod.
    pub selector: LabelSelector,
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
    pub inject: Injections,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
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

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Injections {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<ClientCertificate>,
    #[serde(default, rename = "serverCA", skip_serializing_if = "Option::is_none")]
    pub server_ca: Option<ServerCa>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Token>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_token: Option<ServiceAccountToken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<ServiceAccountSwap>,
}

/// 1. The pod's own mTLS identity: a `kubernetes.io/tls` Secret mounted whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientCertificate {
    pub secret_name: String,
    #[serde(default = "default_client_cert_volume")]
    pub volume_name: String,
    pub mount_path: String,
    /// Env var set to `<mountPath>/tls.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file_env: Option<String>,
    /// Env var set to `<mountPath>/tls.key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file_env: Option<String>,
}

/// 2. The CA that signs the control plane's serving certificate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerCa {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<String>,
    #[serde(default = "default_ca_key")]
    pub key: String,
    #[serde(default = "default_server_ca_volume")]
    pub volume_name: String,
    pub mount_path: String,
    /// Env var set to `<mountPath>/<key>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_env: Option<String>,
}

/// 3. A token or API key from a Secret key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Token {
    pub secret_name: String,
    #[serde(default = "default_token_key")]
    pub key: String,
    #[serde(default = "default_token_volume")]
    pub volume_name: String,
    pub mount_path: String,
    /// Env var set to `<mountPath>/<key>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_env: Option<String>,
    /// Env var holding the value itself, via `secretKeyRef`. Prefer the file: env vars leak
    /// into child processes and crash dumps, and do not rotate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_env: Option<String>,
}

/// 4. A projected service-account token for an audience; the kubelet rotates it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAccountToken {
    pub audience: String,
    #[serde(default = "default_expiration")]
    pub expiration_seconds: i64,
    #[serde(default = "default_token_key")]
    pub path: String,
    #[serde(default = "default_sa_token_volume")]
    pub volume_name: String,
    pub mount_path: String,
    /// Env var set to `<mountPath>/<path>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_env: Option<String>,
}

/// 5. Run the pod as a dedicated service account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAccountSwap {
    pub name: String,
    /// Whether the pod keeps a Kubernetes API token (for the new service account).
    #[serde(default)]
    pub api_token: ApiToken,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ApiToken {
    /// Leave the `kube-api-access-*` volume; the kubelet issues it for the new account.
    #[default]
    Keep,
    /// Set `automountServiceAccountToken: false` and remove the `kube-api-access-*` volume and
    /// every mount at `/var/run/secrets/kubernetes.io/serviceaccount`.
    Remove,
}

fn default_client_cert_volume() -> String {
    "keyward-client-cert".into()
}
fn default_server_ca_volume() -> String {
    "keyward-server-ca".into()
}
fn default_token_volume() -> String {
    "keyward-token".into()
}
fn default_sa_token_volume() -> String {
    "keyward-sa-token".into()
}
fn default_ca_key() -> String {
    "ca.crt".into()
}
fn default_token_key() -> String {
    "token".into()
}
fn default_expiration() -> i64 {
    3600
}

// === Validated profile ===

/// A profile that passed validation, with its templates parsed. Only these reach the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    /// Where it came from (a file path or `builtin:…`), for messages.
    pub source: String,
    pub spec: ProfileSpec,
    pub(crate) templates: Templates,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Templates {
    pub client_secret: Option<NameTemplate>,
    pub server_ca: Option<NameTemplate>,
    pub token_secret: Option<NameTemplate>,
    pub service_account: Option<NameTemplate>,
}

/// The profiles in force, validated together (names unique).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProfileSet {
    profiles: Vec<Profile>,
}

impl ProfileSet {
    /// The profiles that ship with keyward.
    pub fn builtin() -> Result<Self, Error> {
        Self::from_sources(BUILTIN_SOURCES.iter().map(|(s, t)| (s.to_string(), t.to_string())))
    }

    /// The built-in profiles' YAML, for `keyward` to show or write out.
    pub fn builtin_sources() -> &'static [(&'static str, &'static str)] {
        BUILTIN_SOURCES
    }

    /// Parses and validates `(source name, YAML text)` pairs. Every problem in every source is
    /// reported, not just the first.
    pub fn from_sources(sources: impl IntoIterator<Item = (String, String)>) -> Result<Self, Error> {
        let mut errors = Vec::new();
        let mut profiles: Vec<Profile> = Vec::new();
        for (source, text) in sources {
            for doc in parse_documents(&source, &text, &mut errors) {
                if let Some(profile) = validate(&source, doc, &mut errors) {
                    if let Some(first) = profiles.iter().find(|p| p.name == profile.name) {
                        errors.push(ProfileError {
                            source: source.clone(),
                            profile: Some(profile.name.clone()),
                            field: "metadata.name".into(),
                            reason: format!(
                                "a profile with this name is already defined in {}; profile names must be unique",
                                first.source
                            ),
                        });
                    } else {
                        profiles.push(profile);
                    }
                }
            }
        }
        if errors.is_empty() {
            Ok(Self { profiles })
        } else {
            Err(Error::Profiles(errors))
        }
    }

    /// This set, with every profile of `overrides` added; an override replaces the profile of
    /// the same name. This is how `--profiles DIR` extends or replaces the built-ins.
    pub fn overlay(mut self, overrides: ProfileSet) -> Self {
        for profile in overrides.profiles {
            match self.profiles.iter_mut().find(|p| p.name == profile.name) {
                Some(slot) => *slot = profile,
                None => self.profiles.push(profile),
            }
        }
        self
    }

    pub fn iter(&self) -> impl Iterator<Item = &Profile> {
        self.profiles.iter()
    }

    pub fn len(&self) -> usize {
        self.profiles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// Pins the operator's namespace in a profile's requesters: every
    /// `system:serviceaccount:NAMESPACE:NAME` pattern whose namespace is a wildcard gets
    /// `namespace` instead, so that only the operator's own account (not a tenant's account of
    /// the same name) may create the profile's pods. Returns the patterns now in force.
    pub fn pin_operator_namespace(&mut self, profile: &str, namespace: &str) -> Result<Vec<String>, String> {
        if !is_dns1123_label(namespace) {
            return Err(format!("{namespace:?} is not a namespace name ({DNS1123_LABEL_RULE})"));
        }
        let known = self.profiles.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
        let Some(p) = self.profiles.iter_mut().find(|p| p.name == profile) else {
            return Err(format!("no profile named {profile:?} (profiles: {known})"));
        };
        let mut pinned = 0;
        for pattern in &mut p.spec.requesters.usernames {
            if let Some((ns, name)) = service_account_pattern(pattern) {
                if ns.contains(['*', '?']) {
                    *pattern = format!("system:serviceaccount:{namespace}:{name}");
                    pinned += 1;
                }
            }
        }
        if pinned == 0 {
            return Err(format!(
                "profile {profile:?} has no requester of the form system:serviceaccount:*:NAME to pin (requesters: {})",
                p.spec.requesters.usernames.join(", ")
            ));
        }
        Ok(p.spec.requesters.usernames.clone())
    }
}

fn parse_documents(source: &str, text: &str, errors: &mut Vec<ProfileError>) -> Vec<ProfileDocument> {
    let mut docs = Vec::new();
    for (index, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = match serde_yaml::Value::deserialize(de) {
            Ok(serde_yaml::Value::Null) => continue, // an empty document (`---` at the end)
            Ok(value) => value,
            Err(e) => {
                errors.push(ProfileError {
                    source: source.to_string(),
                    profile: None,
                    field: String::new(),
                    reason: format!("document {}: not valid YAML: {e}", index + 1),
                });
                // After a syntax error the stream cannot be resynchronised.
                break;
            }
        };
        let name = value.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()).map(str::to_string);
        match serde_path_to_error::deserialize::<_, ProfileDocument>(value) {
            Ok(doc) => docs.push(doc),
            Err(e) => errors.push(ProfileError {
                source: source.to_string(),
                profile: name,
                field: match e.path().to_string().as_str() {
                    "." => String::new(),
                    path => path.to_string(),
                },
                reason: format!("document {}: {}", index + 1, e.inner()),
            }),
        }
    }
    docs
}

/// Checks one profile and returns it validated, or records every problem found.
fn validate(source: &str, doc: ProfileDocument, errors: &mut Vec<ProfileError>) -> Option<Profile> {
    let before = errors.len();
    let name = doc.metadata.name.clone();
    let mut problem = |field: &str, reason: String| {
        errors.push(ProfileError {
            source: source.to_string(),
            profile: Some(name.clone()),
            field: field.to_string(),
            reason,
        })
    };

    if doc.api_version != API_VERSION {
        problem("apiVersion", format!("is {:?}; use {API_VERSION:?}", doc.api_version));
    }
    if doc.kind != KIND {
        problem("kind", format!("is {:?}; use {KIND:?}", doc.kind));
    }
    if !is_dns1123_subdomain(&name) {
        problem("metadata.name", format!("must be a DNS-1123 subdomain ({DNS1123_SUBDOMAIN_RULE})"));
    }

    let spec = &doc.spec;
    validate_selector(&spec.selector, &mut problem);
    for (i, owner) in spec.controller_owners.iter().enumerate() {
        if owner.kind.is_empty() {
            problem(&format!("spec.controllerOwners[{i}].kind"), "must not be empty".into());
        }
    }
    for (i, ns) in spec.namespaces.iter().enumerate() {
        if ns.is_empty() {
            problem(&format!("spec.namespaces[{i}]"), "must not be empty; use \"*\" for every namespace".into());
        }
    }
    if spec.requesters.usernames.is_empty() {
        problem(
            "spec.requesters.usernames",
            "must name at least one requester (e.g. system:serviceaccount:*:my-operator); a profile that hands out credentials says who may create its pods".into(),
        );
    }
    for (i, u) in spec.requesters.usernames.iter().enumerate() {
        if let Some(reason) = requester_problem(u) {
            problem(&format!("spec.requesters.usernames[{i}]"), reason);
        }
    }
    let mut seen_containers = BTreeSet::new();
    for (i, c) in spec.containers.iter().enumerate() {
        if !seen_containers.insert(c) {
            problem(&format!("spec.containers[{i}]"), format!("{c:?} is listed twice"));
        }
    }

    let templates = validate_injections(&spec.inject, &mut problem);

    if errors.len() > before {
        return None;
    }
    Some(Profile { name: doc.metadata.name, source: source.to_string(), spec: doc.spec, templates: templates? })
}

fn validate_selector(selector: &LabelSelector, problem: &mut impl FnMut(&str, String)) {
    if selector.match_labels.is_empty() && selector.match_expressions.is_empty() {
        problem(
            "spec.selector",
            "must not be empty: give matchLabels or matchExpressions so the profile never selects every pod".into(),
        );
    }
    for (key, value) in &selector.match_labels {
        if !is_qualified_name(key) {
            problem(&format!("spec.selector.matchLabels[{key:?}]"), label_key_reason(key));
        }
        if !is_label_value(value) {
            problem(&format!("spec.selector.matchLabels[{key:?}]"), label_value_reason(value));
        }
    }
    for (i, req) in selector.match_expressions.iter().enumerate() {
        if !is_qualified_name(&req.key) {
            problem(&format!("spec.selector.matchExpressions[{i}].key"), label_key_reason(&req.key));
        }
        let field = format!("spec.selector.matchExpressions[{i}].values");
        match req.operator {
            SelectorOperator::In | SelectorOperator::NotIn if req.values.is_empty() => {
                problem(&field, format!("must not be empty with operator {:?}", req.operator))
            }
            SelectorOperator::Exists | SelectorOperator::DoesNotExist if !req.values.is_empty() => {
                problem(&field, format!("must be empty with operator {:?}", req.operator))
            }
            _ => {}
        }
        for (j, value) in req.values.iter().enumerate() {
            if !is_label_value(value) {
                problem(&format!("{field}[{j}]"), label_value_reason(value));
            }
        }
    }
}

fn label_key_reason(key: &str) -> String {
    format!("{key:?} is not a valid label key: an optional DNS-1123 subdomain and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
}

fn label_value_reason(value: &str) -> String {
    format!("{value:?} is not a valid label value: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
}

/// Why a requester pattern does not say who may create the pods, if it does not.
fn requester_problem(pattern: &str) -> Option<String> {
    let wild = |s: &str| !s.is_empty() && s.chars().all(|c| c == '*' || c == '?');
    if pattern.is_empty() || pattern.split(':').all(wild) {
        return Some(format!(
            "{pattern:?} would allow anyone; name the operator's service account, e.g. system:serviceaccount:*:my-operator"
        ));
    }
    if pattern.split(':').any(str::is_empty) {
        return Some(format!("{pattern:?} has an empty ':'-separated segment, which no username has"));
    }
    if let Some((_, name)) = service_account_pattern(pattern) {
        if wild(name) {
            return Some(format!(
                "{pattern:?} would allow every service account; name the operator's account, e.g. system:serviceaccount:*:my-operator"
            ));
        }
    }
    None
}

/// Validates the injections and parses their name templates. Returns `None` if any failed.
fn validate_injections(inject: &Injections, problem: &mut impl FnMut(&str, String)) -> Option<Templates> {
    let mut ok = true;
    let mut template = |field: &str, source: &str, ok: &mut bool| match NameTemplate::parse(source) {
        Ok(t) => Some(t),
        Err(reason) => {
            problem(field, reason);
            *ok = false;
            None
        }
    };
    // Volume names, mount paths and env names, each with its field, checked together below.
    let mut volumes: Vec<(String, &str)> = Vec::new();
    let mut mounts: Vec<(String, &str)> = Vec::new();
    let mut envs: Vec<(String, &str)> = Vec::new();
    let mut templates = Templates { client_secret: None, server_ca: None, token_secret: None, service_account: None };

    if let Some(c) = &inject.client_certificate {
        let f = "spec.inject.clientCertificate";
        templates.client_secret = template(&format!("{f}.secretName"), &c.secret_name, &mut ok);
        volumes.push((format!("{f}.volumeName"), &c.volume_name));
        mounts.push((format!("{f}.mountPath"), &c.mount_path));
        envs.extend(c.cert_file_env.as_deref().map(|e| (format!("{f}.certFileEnv"), e)));
        envs.extend(c.key_file_env.as_deref().map(|e| (format!("{f}.keyFileEnv"), e)));
    }
    let mut deferred: Vec<(String, String)> = Vec::new();
    if let Some(ca) = &inject.server_ca {
        let f = "spec.inject.serverCA";
        match (&ca.secret_name, &ca.config_map_name) {
            (Some(name), None) => templates.server_ca = template(&format!("{f}.secretName"), name, &mut ok),
            (None, Some(name)) => templates.server_ca = template(&format!("{f}.configMapName"), name, &mut ok),
            _ => deferred.push((f.to_string(), "set exactly one of secretName or configMapName".into())),
        }
        if let Some(p) = key_problem(&ca.key) {
            deferred.push((format!("{f}.key"), p.into()));
        }
        volumes.push((format!("{f}.volumeName"), &ca.volume_name));
        mounts.push((format!("{f}.mountPath"), &ca.mount_path));
        envs.extend(ca.file_env.as_deref().map(|e| (format!("{f}.fileEnv"), e)));
    }
    if let Some(t) = &inject.token {
        let f = "spec.inject.token";
        templates.token_secret = template(&format!("{f}.secretName"), &t.secret_name, &mut ok);
        if let Some(p) = key_problem(&t.key) {
            deferred.push((format!("{f}.key"), p.into()));
        }
        volumes.push((format!("{f}.volumeName"), &t.volume_name));
        mounts.push((format!("{f}.mountPath"), &t.mount_path));
        envs.extend(t.file_env.as_deref().map(|e| (format!("{f}.fileEnv"), e)));
        envs.extend(t.value_env.as_deref().map(|e| (format!("{f}.valueEnv"), e)));
    }
    if let Some(s) = &inject.service_account_token {
        let f = "spec.inject.serviceAccountToken";
        if s.audience.trim().is_empty() {
            deferred.push((
                format!("{f}.audience"),
                "must not be empty: name the service that will verify the token".into(),
            ));
        }
        if s.expiration_seconds < MIN_TOKEN_EXPIRATION_SECONDS {
            deferred.push((
                format!("{f}.expirationSeconds"),
                format!(
                    "is {}; the apiserver refuses projected tokens under {MIN_TOKEN_EXPIRATION_SECONDS} seconds (10 minutes): use 600 or more (3600 is usual)",
                    s.expiration_seconds
                ),
            ));
        } else if s.expiration_seconds > MAX_TOKEN_EXPIRATION_SECONDS {
            deferred.push((
                format!("{f}.expirationSeconds"),
                format!(
                    "is {}; keep it at most {MAX_TOKEN_EXPIRATION_SECONDS} (48 hours): the kubelet rotates the token at 80% of its life, so short is safe",
                    s.expiration_seconds
                ),
            ));
        }
        if let Some(p) = relative_path_problem(&s.path) {
            deferred.push((format!("{f}.path"), p.into()));
        }
        volumes.push((format!("{f}.volumeName"), &s.volume_name));
        mounts.push((format!("{f}.mountPath"), &s.mount_path));
        envs.extend(s.file_env.as_deref().map(|e| (format!("{f}.fileEnv"), e)));
    }
    if let Some(sa) = &inject.service_account {
        templates.service_account = template("spec.inject.serviceAccount.name", &sa.name, &mut ok);
    }

    if inject == &Injections::default() {
        deferred.push(("spec.inject".into(), "must inject at least one thing".into()));
    }

    for (field, name) in &volumes {
        if !is_dns1123_label(name) {
            deferred.push((field.clone(), format!("{name:?} is not a DNS-1123 label ({DNS1123_LABEL_RULE})")));
        } else if name.starts_with(KUBE_API_ACCESS_PREFIX) {
            deferred.push((field.clone(), format!("{name:?} starts with {KUBE_API_ACCESS_PREFIX:?}, which belongs to the ServiceAccount admission plugin; use a keyward-… name")));
        }
    }
    for (field, path) in &mounts {
        if let Some(p) = mount_path_problem(path) {
            deferred.push((field.clone(), format!("{path:?} {p}")));
        } else if path.starts_with(SERVICE_ACCOUNT_MOUNT_PATH) {
            deferred.push((field.clone(), format!("{path:?} is where Kubernetes mounts the API token; choose another path, e.g. /var/run/secrets/keyward/…")));
        }
    }
    for (field, env) in &envs {
        if !is_env_var_name(env) {
            deferred.push((
                field.clone(),
                format!("{env:?} is not a valid environment variable name ({ENV_VAR_NAME_RULE})"),
            ));
        }
    }
    for (what, list) in [("volume name", &volumes), ("mount path", &mounts), ("env var", &envs)] {
        for (i, (field, value)) in list.iter().enumerate() {
            if let Some((first, _)) = list[..i].iter().find(|(_, v)| v == value) {
                deferred.push((
                    field.clone(),
                    format!("{what} {value:?} is already used by {first}; each injection needs its own"),
                ));
            }
        }
    }

    let failed = !deferred.is_empty();
    for (field, reason) in deferred {
        problem(&field, reason);
    }
    (ok && !failed).then_some(templates)
}

/// Why a Secret or ConfigMap key is unusable as a file name in the volume, if it is.
fn key_problem(key: &str) -> Option<&'static str> {
    let valid = !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    (!valid).then_some("must be a Secret or ConfigMap key: letters, digits, '-', '_' and '.', not '.' or '..'")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str) -> Result<ProfileSet, Vec<String>> {
        ProfileSet::from_sources([("profiles/test.yaml".to_string(), yaml.to_string())]).map_err(|e| match e {
            Error::Profiles(errs) => errs.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        })
    }

    const VALID: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata:
  name: demo
spec:
  selector:
    matchLabels:
      app: demo
  requesters:
    usernames: ["system:serviceaccount:*:demo-operator"]
  inject:
    serviceAccountToken:
      audience: https://control-plane.example
      mountPath: /var/run/secrets/keyward/sa-token
"#;

    #[test]
    fn builtin_profiles_are_valid() {
        let set = ProfileSet::builtin().unwrap();
        let names: Vec<_> = set.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["lmeval-job", "kuberay-node", "rayjob-submitter", "kserve-inferencegraph"]);
    }

    #[test]
    fn defaults_fill_in() {
        let set = load(VALID).unwrap();
        let sat = set.get("demo").unwrap().spec.inject.service_account_token.clone().unwrap();
        assert_eq!(sat.expiration_seconds, 3600);
        assert_eq!(sat.path, "token");
        assert_eq!(sat.volume_name, "keyward-sa-token");
        assert_eq!(set.get("demo").unwrap().spec.requesters.otherwise, Otherwise::Skip);
    }

    #[test]
    fn unknown_field_is_refused_with_file_and_profile() {
        let errs = load(&VALID.replace("audience:", "audiense:")).unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with("profiles/test.yaml: profile \"demo\": spec.inject.serviceAccountToken.audiense: document 1: unknown field `audiense`, expected one of `audience`"),
            "{}",
            errs[0]
        );
    }

    #[test]
    fn short_expiration_is_refused() {
        let errs = load(
            &VALID.replace("audience: https://control-plane.example", "audience: a\n      expirationSeconds: 599"),
        )
        .unwrap_err();
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs[0],
            "profiles/test.yaml: profile \"demo\": spec.inject.serviceAccountToken.expirationSeconds: is 599; the apiserver refuses projected tokens under 600 seconds (10 minutes): use 600 or more (3600 is usual)"
        );
    }

    #[test]
    fn bad_names_and_paths_are_each_reported() {
        let yaml = VALID.replace(
            "      mountPath: /var/run/secrets/keyward/sa-token\n",
            "      mountPath: /var/run/secrets/keyward/sa-token\n      volumeName: kube-api-access-x\n      path: ../token\n    token:\n      secretName: api-key\n      volumeName: Bad_Name\n      mountPath: relative/path\n      fileEnv: 1BAD\n    serverCA:\n      secretName: ca\n      mountPath: /var/run/secrets/keyward/sa-token\n",
        );
        let errs = load(&yaml).unwrap_err();
        let joined = errs.join("\n");
        for needle in [
            "spec.inject.serviceAccountToken.volumeName: \"kube-api-access-x\" starts with \"kube-api-access-\"",
            "spec.inject.serviceAccountToken.path: must not contain a '..' segment",
            "spec.inject.token.volumeName: \"Bad_Name\" is not a DNS-1123 label",
            "spec.inject.token.mountPath: \"relative/path\" must be an absolute path",
            "spec.inject.token.fileEnv: \"1BAD\" is not a valid environment variable name",
            "spec.inject.serviceAccountToken.mountPath: mount path \"/var/run/secrets/keyward/sa-token\" is already used by spec.inject.serverCA.mountPath",
        ] {
            assert!(joined.contains(needle), "missing {needle:?} in:\n{joined}");
        }
    }

    #[test]
    fn requester_patterns_must_name_someone() {
        for (pattern, reason) in [
            ("*", "would allow anyone"),
            ("*:*", "would allow anyone"),
            ("system:serviceaccount:*:*", "would allow every service account"),
            ("system:serviceaccount::op", "has an empty ':'-separated segment"),
        ] {
            let joined = load(&VALID.replace("system:serviceaccount:*:demo-operator", pattern)).unwrap_err().join("\n");
            assert!(joined.contains(&format!("spec.requesters.usernames[0]: {pattern:?} {reason}")), "{joined}");
        }
    }

    #[test]
    fn selector_keys_and_values_follow_kubernetes() {
        let yaml = VALID.replace(
            "    matchLabels:\n      app: demo\n",
            "    matchLabels:\n      app: \"-bad\"\n    matchExpressions:\n      - {key: \"Bad Key\", operator: In, values: [ok, \"not ok\"]}\n",
        );
        let joined = load(&yaml).unwrap_err().join("\n");
        for needle in [
            "spec.selector.matchLabels[\"app\"]: \"-bad\" is not a valid label value",
            "spec.selector.matchExpressions[0].key: \"Bad Key\" is not a valid label key",
            "spec.selector.matchExpressions[0].values[1]: \"not ok\" is not a valid label value",
        ] {
            assert!(joined.contains(needle), "missing {needle:?} in:\n{joined}");
        }
    }

    #[test]
    fn the_operator_namespace_can_be_pinned() {
        let mut set = ProfileSet::builtin().unwrap();
        let pinned = set.pin_operator_namespace("lmeval-job", "opendatahub").unwrap();
        assert_eq!(pinned, ["system:serviceaccount:opendatahub:trustyai-service-operator-controller-manager"]);
        let err = set.pin_operator_namespace("no-such", "x").unwrap_err();
        assert!(err.starts_with("no profile named \"no-such\" (profiles: lmeval-job, "), "{err}");
        let err = set.pin_operator_namespace("rayjob-submitter", "ray").unwrap_err();
        assert!(err.contains("has no requester of the form system:serviceaccount:*:NAME"), "{err}");
        let err = set.pin_operator_namespace("lmeval-job", "Bad_NS").unwrap_err();
        assert!(err.starts_with("\"Bad_NS\" is not a namespace name"), "{err}");
    }

    #[test]
    fn empty_selector_and_open_requesters_are_refused() {
        let yaml = VALID
            .replace("    matchLabels:\n      app: demo\n", "    matchLabels: {}\n")
            .replace("[\"system:serviceaccount:*:demo-operator\"]", "[\"*\"]");
        let joined = load(&yaml).unwrap_err().join("\n");
        assert!(joined.contains("spec.selector: must not be empty"), "{joined}");
        assert!(joined.contains("spec.requesters.usernames[0]: \"*\" would allow anyone"), "{joined}");
    }

    #[test]
    fn duplicate_names_are_refused_and_overlay_replaces() {
        let two = format!("{VALID}\n---\n{VALID}");
        let errs = load(&two).unwrap_err();
        assert!(errs[0].contains("already defined in profiles/test.yaml"), "{errs:?}");

        let base = ProfileSet::builtin().unwrap();
        let user = load(&VALID.replace("name: demo", "name: lmeval-job")).unwrap();
        let merged = base.clone().overlay(user);
        assert_eq!(merged.len(), base.len());
        assert_eq!(merged.get("lmeval-job").unwrap().source, "profiles/test.yaml");
    }

    #[test]
    fn bad_yaml_and_bad_template_name_the_problem() {
        let errs = load("spec: [unclosed").unwrap_err();
        assert!(errs[0].starts_with("profiles/test.yaml: document 1: not valid YAML"), "{errs:?}");
        let errs = load(&VALID.replace(
            "    serviceAccountToken:",
            "    serviceAccount:\n      name: \"{pod.name}-sa\"\n    serviceAccountToken:",
        ))
        .unwrap_err();
        assert!(errs[0].contains("spec.inject.serviceAccount.name: unknown placeholder {pod.name}"), "{errs:?}");
    }
}
