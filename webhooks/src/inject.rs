//! The building blocks every kind of injection is made of, described without the pod: the
//! volume, mount and env vars a kind wants, its audit entry, and the checks a profile's
//! settings go through. This module sits below the kinds and imports none of them, nor the
//! profile schema, the engine or the audit record.

use std::fmt;

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::Value;

use crate::names::{
    is_dns1123_label, is_env_var_name, mount_path_problem, relative_path_problem, DNS1123_LABEL_RULE,
    ENV_VAR_NAME_RULE, KUBE_API_ACCESS_PREFIX, SERVICE_ACCOUNT_MOUNT_PATH,
};

/// `0644`, the mode the apiserver defaults onto secret, configMap and projected volumes. keyward
/// writes it itself so that a reinvocation, which sees the defaulted pod, finds its volume
/// identical to what it would inject.
pub const DEFAULT_MODE: i64 = 0o644;
/// The apiserver refuses projected tokens that expire sooner than this.
pub const MIN_TOKEN_EXPIRATION_SECONDS: i64 = 600;
/// The longest token lifetime the apiserver issues by default.
pub const MAX_TOKEN_EXPIRATION_SECONDS: i64 = 48 * 3600;
/// What the apiserver defaults a projected token's `expirationSeconds` to.
pub const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;

// === volumes, mounts, env ===

/// Where a volume's files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A Secret: all its keys (`keys: None`), or only these, each at a file of its own name.
    Secret { name: String, keys: Option<Vec<String>> },
    /// A ConfigMap, likewise.
    ConfigMap { name: String, keys: Option<Vec<String>> },
    /// A projected service-account token for `audience`, at `path` in the volume.
    ServiceAccountToken { audience: String, expiration_seconds: i64, path: String },
    /// A projected `podCertificate`: the kubelet makes the key on the node and asks the signer.
    PodCertificate(PodCertificateSource),
    /// A projected `clusterTrustBundle`: the certificates of one bundle, or of a signer's.
    ClusterTrustBundle(TrustBundleSource),
}

/// A `clusterTrustBundle` projection (Kubernetes' `ClusterTrustBundleProjection`), as the pod
/// spec has it: `name`, or `signerName` with `labelSelector` (labels only), and `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrustBundleSource {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<MatchLabels>,
    pub path: String,
}

/// A label selector of labels only (`{}` picks every bundle of the signer).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MatchLabels {
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub match_labels: std::collections::BTreeMap<String, String>,
}

/// A `podCertificate` projection (Kubernetes' `PodCertificateProjection`), as the pod spec has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodCertificateSource {
    pub signer_name: String,
    pub key_type: String,
    pub max_expiration_seconds: i64,
    pub key_path: String,
    pub certificate_chain_path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_bundle_path: Option<String>,
}

/// A volume a kind adds to the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    pub name: String,
    pub source: Source,
}

impl VolumeSpec {
    /// The volume as the pod spec has it, with the apiserver's defaults written out.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Written as the pod spec has it: `{"name", "secret"|"configMap"|"projected"}`, with the
/// apiserver's defaults (`defaultMode`) written out.
impl Serialize for VolumeSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Items<'a>(&'a [String]);
        impl Serialize for Items<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.iter().map(|k| KeyToPath { key: k, path: k }))
            }
        }
        #[derive(Serialize)]
        struct KeyToPath<'a> {
            key: &'a str,
            path: &'a str,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Object<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            secret_name: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            name: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            items: Option<Items<'a>>,
            default_mode: i64,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Token<'a> {
            audience: &'a str,
            expiration_seconds: i64,
            path: &'a str,
        }
        /// One projection source: exactly one of these is set.
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        enum Projection<'a> {
            ServiceAccountToken(Token<'a>),
            PodCertificate(&'a PodCertificateSource),
            ClusterTrustBundle(&'a TrustBundleSource),
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Projected<'a> {
            default_mode: i64,
            sources: [Projection<'a>; 1],
        }
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("name", &self.name)?;
        match &self.source {
            Source::Secret { name, keys } => map.serialize_entry(
                "secret",
                &Object {
                    secret_name: Some(name),
                    name: None,
                    items: keys.as_deref().map(Items),
                    default_mode: DEFAULT_MODE,
                },
            )?,
            Source::ConfigMap { name, keys } => map.serialize_entry(
                "configMap",
                &Object {
                    secret_name: None,
                    name: Some(name),
                    items: keys.as_deref().map(Items),
                    default_mode: DEFAULT_MODE,
                },
            )?,
            Source::ServiceAccountToken { audience, expiration_seconds, path } => {
                let token = Token { audience, expiration_seconds: *expiration_seconds, path };
                let sources = [Projection::ServiceAccountToken(token)];
                map.serialize_entry("projected", &Projected { default_mode: DEFAULT_MODE, sources })?
            }
            Source::PodCertificate(certificate) => {
                let sources = [Projection::PodCertificate(certificate)];
                map.serialize_entry("projected", &Projected { default_mode: DEFAULT_MODE, sources })?
            }
            Source::ClusterTrustBundle(bundle) => {
                let sources = [Projection::ClusterTrustBundle(bundle)];
                map.serialize_entry("projected", &Projected { default_mode: DEFAULT_MODE, sources })?
            }
        }
        map.end()
    }
}

/// A read-only mount of one of the kind's volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub volume: String,
    pub path: String,
}

impl MountSpec {
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

impl Serialize for MountSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("name", &self.volume)?;
        map.serialize_entry("mountPath", &self.path)?;
        map.serialize_entry("readOnly", &true)?;
        map.end()
    }
}

/// The value of an env var a kind sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    /// A plain value (often a file path inside a mounted volume).
    Value(String),
    /// A Secret key, via `valueFrom.secretKeyRef`.
    SecretKey { secret: String, key: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSpec {
    pub name: String,
    pub value: EnvValue,
}

impl EnvSpec {
    /// `name` set to `<mount_path>/<file>`.
    pub fn file(name: &str, mount_path: &str, file: &str) -> Self {
        Self { name: name.to_string(), value: EnvValue::Value(format!("{mount_path}/{file}")) }
    }

    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

impl Serialize for EnvSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct KeyRef<'a> {
            name: &'a str,
            key: &'a str,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct From<'a> {
            secret_key_ref: KeyRef<'a>,
        }
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("name", &self.name)?;
        match &self.value {
            EnvValue::Value(v) => map.serialize_entry("value", v)?,
            EnvValue::SecretKey { secret, key } => {
                map.serialize_entry("valueFrom", &From { secret_key_ref: KeyRef { name: secret, key } })?
            }
        }
        map.end()
    }
}

/// What the pod's Kubernetes API token becomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ApiToken {
    /// Leave the `kube-api-access-*` volume; the kubelet issues it for the pod's account.
    #[default]
    Keep,
    /// Set `automountServiceAccountToken: false` and remove the `kube-api-access-*` volume and
    /// every mount at `/var/run/secrets/kubernetes.io/serviceaccount`.
    Remove,
}

impl ApiToken {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keep => "keep",
            Self::Remove => "remove",
        }
    }
}

// === who provides what the pod needs ===

/// Who makes an object an injection refers to exist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Provider {
    /// keyward's controller issues it (per owner) or provisions it (per opted-in namespace).
    Keyward,
    /// The admin (or their control plane) creates it; keyward only points the pod at it.
    #[default]
    User,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keyward => "keyward",
            Self::User => "user",
        }
    }
}

/// Where a server CA comes from, for keyward to copy into each opted-in namespace: one key of a
/// Secret or a ConfigMap, in the operator's namespace unless another is named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CaSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ObjectKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ObjectKey>,
}

/// A key of a Secret or ConfigMap. Without a namespace: the operator's, as pinned with
/// `--operator-namespace`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectKey {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default = "default_ca_key")]
    pub key: String,
}

fn default_ca_key() -> String {
    "ca.crt".into()
}

/// The kind of an object a pod depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ObjectKind {
    Secret,
    ConfigMap,
    ServiceAccount,
    /// Not an object: a certificate signer (`keyward.io/<name>`) the kubelet asks through a
    /// PodCertificateRequest.
    Signer,
    /// A ClusterTrustBundle (cluster-wide), by name; or, required by a signer's name, the
    /// bundles of that signer.
    ClusterTrustBundle,
}

/// How keyward provides an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provision {
    /// Not keyward's: the admin creates it.
    User,
    /// A `kubernetes.io/tls` Secret per owner: a key keyward generates, a certificate its client
    /// CA signs for the owner's identity, and the CA as `ca.crt`.
    ClientCertificate,
    /// A Secret per owner holding a generated token under `key`.
    GeneratedToken { key: String },
    /// Certificates keyward's controller signs, as the signer named by the requirement, for the
    /// PodCertificateRequests the kubelet makes for the pod (a key made on the node, never
    /// stored): the owner's identity, as with [`Provision::ClientCertificate`].
    PodCertificate,
    /// A ConfigMap or Secret per namespace holding the CA from `source` under `key`.
    ServerCa { source: CaSource, key: String },
    /// One ClusterTrustBundle for the cluster holding the CA from `source` (its `key`).
    TrustBundle { source: CaSource, key: String },
    /// A ServiceAccount per namespace, with role bindings.
    ServiceAccount { bindings: Vec<RoleBinding> },
}

/// A role a keyward-provided ServiceAccount is bound to in its namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoleBinding {
    /// `ClusterRole` (bound with a RoleBinding in the namespace) or `Role`.
    pub kind: RoleKind,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum RoleKind {
    ClusterRole,
    Role,
}

/// An object a pod needs once injected, and who provides it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Requirement {
    pub kind: ObjectKind,
    pub name: String,
    pub provided_by: Provider,
    #[serde(skip)]
    pub provision: Provision,
}

impl Requirement {
    pub fn new(kind: ObjectKind, name: impl Into<String>, provision: Provision) -> Self {
        let provided_by = if provision == Provision::User { Provider::User } else { Provider::Keyward };
        Self { kind, name: name.into(), provided_by, provision }
    }

    /// Whether it names one object a lookup can find. A signer is not an object, and a
    /// signer's trust bundles (required by the signer's name, which has a '/' no object name
    /// has) are whichever its label selector picks.
    pub fn is_object(&self) -> bool {
        match self.kind {
            ObjectKind::Signer => false,
            ObjectKind::ClusterTrustBundle => !self.name.contains('/'),
            _ => true,
        }
    }
}

// === the injection ===

/// Everything one kind puts into a pod, resolved for that pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// A volume and where it is mounted in every target container.
    pub volume: Option<(VolumeSpec, MountSpec)>,
    /// Env vars for every target container.
    pub env: Vec<EnvSpec>,
    /// Run the pod as this service account.
    pub service_account: Option<String>,
    /// What happens to the pod's Kubernetes API token.
    pub api_token: ApiToken,
    /// What the audit record says about it.
    pub item: AuditItem,
    /// The objects the pod will need, and who provides them.
    pub requires: Vec<Requirement>,
    /// How often the program that reads the injected projected token re-reads it, when the
    /// profile says: a same-named token volume of the pod's that differs only in its lifetime
    /// is then given the profile's (see [`crate::rotation`]).
    pub token_reader_seconds: Option<i64>,
    /// keyward gate placed in the pod, in front of one of its servers ([`crate::placement`]).
    pub placement: Option<Placement>,
}

impl Injection {
    /// An injection of nothing yet, recorded as `item`.
    pub fn new(item: AuditItem) -> Self {
        Self {
            volume: None,
            env: Vec::new(),
            service_account: None,
            api_token: ApiToken::Keep,
            item,
            requires: Vec::new(),
            token_reader_seconds: None,
            placement: None,
        }
    }
}

// === keyward gate, placed in a pod ===

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProbeKind {
    LivenessProbe,
    ReadinessProbe,
    StartupProbe,
}

impl ProbeKind {
    pub fn field(self) -> &'static str {
        match self {
            Self::LivenessProbe => "livenessProbe",
            Self::ReadinessProbe => "readinessProbe",
            Self::StartupProbe => "startupProbe",
        }
    }
}

/// What the gate's injection does to one pod, its names resolved (`kinds::gate`; applied by `placement.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The gate's init container, without the API token's mount (added once its volume is found).
    pub container: Value,
    /// The gate file's volume.
    pub volume: Value,
    /// Volumes of the pod's that the gate mounts.
    pub pod_volumes: Vec<String>,
    pub server: String,
    pub argument: String,
    pub port: u16,
    /// The argument's value once moved: `127.0.0.1:PORT`.
    pub moved_to: String,
    pub remove_probes: Vec<ProbeKind>,
}

/// A name template that could not be resolved for a pod: the field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// The field under the kind, e.g. `secretName`.
    pub field: &'static str,
    pub reason: String,
}

// === impl AuditItem ===

/// One entry of the audit record: the kind, then its fields (names, paths, audiences; never
/// secret data), serialised as one JSON object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditItem {
    kind: &'static str,
    fields: Vec<(&'static str, AuditValue)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum AuditValue {
    Str(String),
    Int(i64),
}

impl AuditItem {
    pub fn new(kind: &'static str) -> Self {
        Self { kind, fields: Vec::new() }
    }

    pub fn with(mut self, field: &'static str, value: impl Into<String>) -> Self {
        self.fields.push((field, AuditValue::Str(value.into())));
        self
    }

    pub fn with_int(mut self, field: &'static str, value: i64) -> Self {
        self.fields.push((field, AuditValue::Int(value)));
        self
    }

    /// The kind, as in the profile's `spec.inject` key.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// A string field's value.
    pub fn get(&self, field: &str) -> Option<&str> {
        self.fields.iter().find_map(|(f, v)| match v {
            AuditValue::Str(s) if *f == field => Some(s.as_str()),
            _ => None,
        })
    }

    /// An integer field's value.
    pub fn get_int(&self, field: &str) -> Option<i64> {
        self.fields.iter().find_map(|(f, v)| match v {
            AuditValue::Int(n) if *f == field => Some(*n),
            _ => None,
        })
    }
}

impl Serialize for AuditItem {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.fields.len() + 1))?;
        map.serialize_entry("kind", self.kind)?;
        for (field, value) in &self.fields {
            match value {
                AuditValue::Str(s) => map.serialize_entry(field, s)?,
                AuditValue::Int(n) => map.serialize_entry(field, n)?,
            }
        }
        map.end()
    }
}

// === impl Check ===

/// Collects one profile's problems while its kinds check their settings, and the names each
/// kind claims in the pod, so that two kinds never claim the same one.
#[derive(Debug, Default)]
pub struct Check {
    prefix: String,
    problems: Vec<(String, String)>,
    claims: Vec<Claim>,
}

/// A name a kind puts into every pod it selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub what: ClaimKind,
    pub value: String,
    pub field: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKind {
    Volume,
    MountPath,
    EnvVar,
}

impl fmt::Display for ClaimKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Volume => "volume name",
            Self::MountPath => "mount path",
            Self::EnvVar => "env var",
        })
    }
}

impl Check {
    /// Checks under `prefix` (e.g. `spec.inject.token`).
    pub fn scoped(&mut self, prefix: &str) -> &mut Self {
        self.prefix = prefix.to_string();
        self
    }

    fn field(&self, field: &str) -> String {
        if field.is_empty() {
            self.prefix.clone()
        } else {
            format!("{}.{field}", self.prefix)
        }
    }

    pub fn problem(&mut self, field: &str, reason: impl Into<String>) {
        let field = self.field(field);
        self.problems.push((field, reason.into()));
    }

    /// A volume name: a DNS-1123 label, not the ServiceAccount plugin's.
    pub fn volume_name(&mut self, field: &str, name: &str) {
        if !is_dns1123_label(name) {
            self.problem(field, format!("{name:?} is not a DNS-1123 label ({DNS1123_LABEL_RULE})"));
        } else if name.starts_with(KUBE_API_ACCESS_PREFIX) {
            self.problem(field, format!("{name:?} starts with {KUBE_API_ACCESS_PREFIX:?}, which belongs to the ServiceAccount admission plugin; use a keyward-… name"));
        }
        self.claim(ClaimKind::Volume, field, name);
    }

    /// An absolute mount path, away from the API token's.
    pub fn mount_path(&mut self, field: &str, path: &str) {
        if let Some(p) = mount_path_problem(path) {
            self.problem(field, format!("{path:?} {p}"));
        } else if path.starts_with(SERVICE_ACCOUNT_MOUNT_PATH) {
            self.problem(field, format!("{path:?} is where Kubernetes mounts the API token; choose another path, e.g. /var/run/secrets/keyward/…"));
        }
        self.claim(ClaimKind::MountPath, field, path);
    }

    /// An env var name keyward sets.
    pub fn env_name(&mut self, field: &str, name: &str) {
        if !is_env_var_name(name) {
            self.problem(field, format!("{name:?} is not a valid environment variable name ({ENV_VAR_NAME_RULE})"));
        }
        self.claim(ClaimKind::EnvVar, field, name);
    }

    /// A Secret or ConfigMap key, used as a file name in the volume.
    pub fn data_key(&mut self, field: &str, key: &str) {
        // Kubernetes' IsConfigMapKey, and ValidateLocalNonReservedPath for the file it becomes
        // (`..data` and its like are the kubelet's own files in the volume).
        let valid = !key.is_empty()
            && key.len() <= 253
            && key != "."
            && !key.starts_with("..")
            && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !valid {
            self.problem(
                field,
                "must be a Secret or ConfigMap key: letters, digits, '-', '_' and '.', not '.' and not starting with '..'",
            );
        }
    }

    /// A path inside a volume: relative, without `..`.
    pub fn relative_path(&mut self, field: &str, path: &str) {
        if let Some(p) = relative_path_problem(path) {
            self.problem(field, p);
        }
    }

    fn claim(&mut self, what: ClaimKind, field: &str, value: &str) {
        let field = self.field(field);
        self.claims.push(Claim { what, value: value.to_string(), field });
    }

    /// Every problem found, then every claim made.
    pub fn finish(self) -> (Vec<(String, String)>, Vec<Claim>) {
        (self.problems, self.claims)
    }
}

/// A JSON value without its `null` members, as the apiserver stores it.
pub(crate) fn without_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(without_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(without_nulls),
        _ => {}
    }
}

/// Whether an env var, as JSON, is `ours` (as the apiserver leaves it: `null`s dropped, an
/// empty `value` beside `valueFrom` ignored).
pub(crate) fn same_env_value(theirs: &Value, ours: &EnvSpec) -> bool {
    let mut v = theirs.clone();
    without_nulls(&mut v);
    if let Value::Object(e) = &mut v {
        if e.get("value").and_then(Value::as_str) == Some("") && e.contains_key("valueFrom") {
            e.remove("value");
        }
    }
    v == ours.to_json()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn volumes_are_written_as_the_apiserver_defaults_them() {
        let secret = VolumeSpec { name: "v".into(), source: Source::Secret { name: "s".into(), keys: None } };
        assert_eq!(secret.to_json(), json!({"name": "v", "secret": {"secretName": "s", "defaultMode": 420}}));
        let config_map = VolumeSpec {
            name: "v".into(),
            source: Source::ConfigMap { name: "c".into(), keys: Some(vec!["ca.crt".into()]) },
        };
        assert_eq!(
            config_map.to_json(),
            json!({"name": "v", "configMap": {"name": "c", "items": [{"key": "ca.crt", "path": "ca.crt"}], "defaultMode": 420}})
        );
        let token = VolumeSpec {
            name: "t".into(),
            source: Source::ServiceAccountToken { audience: "a".into(), expiration_seconds: 900, path: "token".into() },
        };
        assert_eq!(
            token.to_json(),
            json!({"name": "t", "projected": {"defaultMode": 420, "sources": [{"serviceAccountToken": {"audience": "a", "expirationSeconds": 900, "path": "token"}}]}})
        );
    }

    #[test]
    fn audit_items_serialise_kind_first() {
        let item = AuditItem::new("token").with("secret", "s").with_int("n", 3);
        assert_eq!(serde_json::to_string(&item).unwrap(), r#"{"kind":"token","secret":"s","n":3}"#);
        assert_eq!(item.get("secret"), Some("s"));
        assert_eq!(item.get_int("n"), Some(3));
    }

    #[test]
    fn checks_name_the_field_under_the_prefix() {
        let mut check = Check::default();
        check.scoped("spec.inject.token").volume_name("volumeName", "Bad_Name");
        check.mount_path("mountPath", "relative");
        check.env_name("fileEnv", "1BAD");
        let (problems, claims) = check.finish();
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            ["spec.inject.token.volumeName", "spec.inject.token.mountPath", "spec.inject.token.fileEnv"]
        );
        assert_eq!(claims.len(), 3);
    }
}
