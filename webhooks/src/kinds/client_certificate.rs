//! The pod's own mTLS identity, delivered one of two ways:
//! - `secret` (the default): a `kubernetes.io/tls` Secret per owner (`tls.crt`, `tls.key`, and
//!   the client CA as `ca.crt`) that keyward's controller issues, mounted whole;
//! - `podCertificate`: a projected `podCertificate` volume. The kubelet makes the key on the
//!   node and asks keyward's controller, as the signer named here, through a
//!   PodCertificateRequest; the key is never stored in the API. Files: `tls.key`, `tls.crt`
//!   (the chain), and with `bundleFileEnv` also `credentials.pem` (the key, then the chain);
//! - `auto`: `podCertificate` where keyward signs them (the cluster facts, [`crate::cluster`]),
//!   else `secret`; both are configured, and the files and env vars are the same either way.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{
    AuditItem, Check, EnvSpec, Injection, MountSpec, ObjectKind, PodCertificateSource, Provider, Provision,
    Requirement, Source, Unresolved, VolumeSpec,
};
use crate::names::{NameTemplate, TemplateContext};

/// The domain of every signer name keyward serves (its RBAC: `sign` on `keyward.io/*`).
pub const SIGNER_DOMAIN: &str = "keyward.io";
/// The files a `podCertificate` volume holds.
const KEY_FILE: &str = "tls.key";
const CHAIN_FILE: &str = "tls.crt";
const BUNDLE_FILE: &str = "credentials.pem";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientCertificate {
    /// How the certificate reaches the pod.
    #[serde(default)]
    pub delivery: Delivery,
    /// The Secret keyward issues (`delivery: secret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<NameTemplate>,
    /// The signer and key the kubelet asks for (`delivery: podCertificate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_certificate: Option<PodCertificate>,
    #[serde(default = "default_volume")]
    pub volume_name: String,
    pub mount_path: String,
    /// Env var set to `<mountPath>/tls.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file_env: Option<String>,
    /// Env var set to `<mountPath>/tls.key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file_env: Option<String>,
    /// Env var set to `<mountPath>/credentials.pem`, the key and the chain in one file
    /// (`delivery: podCertificate` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_file_env: Option<String>,
    /// Who issues the Secret: keyward (the default: one certificate per owner, signed by its
    /// client CA) or the admin.
    #[serde(default = "keyward")]
    pub provider: Provider,
    /// What `delivery: auto` resolved to against the cluster facts ([`Self::resolve`]); `None`
    /// until resolved, which delivers a Secret (what every cluster supports).
    #[serde(skip)]
    pub resolved: Option<Delivery>,
}

/// How a client certificate reaches the pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Delivery {
    #[default]
    Secret,
    PodCertificate,
    /// `podCertificate` where keyward's controller signs them, else `secret`.
    Auto,
}

impl Delivery {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Secret => "secret",
            Self::PodCertificate => "podCertificate",
            Self::Auto => "auto",
        }
    }
}

/// What the kubelet asks keyward's signer for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodCertificate {
    /// `keyward.io/<name>`: the signer keyward's controller serves for this profile.
    pub signer_name: String,
    #[serde(default)]
    pub key_type: KeyType,
    /// The longest life the kubelet asks for (3600 to 7862400, Kubernetes' limits for signers
    /// outside `kubernetes.io`); keyward never issues for longer.
    #[serde(default = "one_day")]
    pub max_expiration_seconds: i64,
}

/// The key types the kubelet can make (`PodCertificateProjection.keyType`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyType {
    #[default]
    #[serde(rename = "ECDSAP256")]
    EcdsaP256,
    #[serde(rename = "ECDSAP384")]
    EcdsaP384,
    #[serde(rename = "ED25519")]
    Ed25519,
    #[serde(rename = "RSA3072")]
    Rsa3072,
    #[serde(rename = "RSA4096")]
    Rsa4096,
}

impl KeyType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EcdsaP256 => "ECDSAP256",
            Self::EcdsaP384 => "ECDSAP384",
            Self::Ed25519 => "ED25519",
            Self::Rsa3072 => "RSA3072",
            Self::Rsa4096 => "RSA4096",
        }
    }
}

/// Kubernetes' bounds on `maxExpirationSeconds` for a signer outside `kubernetes.io`.
pub const MIN_EXPIRATION_SECONDS: i64 = 3600;
pub const MAX_EXPIRATION_SECONDS: i64 = 91 * 86_400;

fn one_day() -> i64 {
    86_400
}

fn default_volume() -> String {
    "keyward-client-cert".into()
}

fn keyward() -> Provider {
    Provider::Keyward
}

// === impl ClientCertificate ===

impl ClientCertificate {
    /// The delivery pods get: as set, or what `auto` resolved to (a Secret until resolved).
    pub fn effective(&self) -> Delivery {
        match self.delivery {
            Delivery::Auto => self.resolved.unwrap_or(Delivery::Secret),
            set => set,
        }
    }

    /// Resolves `delivery: auto`: a pod certificate when keyward signs them (`signed`), else a
    /// Secret. Other deliveries are as set.
    pub fn resolve(&mut self, signed: bool) {
        self.resolved = (self.delivery == Delivery::Auto).then_some(if signed {
            Delivery::PodCertificate
        } else {
            Delivery::Secret
        });
    }

    /// The signer it names, when pods get pod certificates.
    pub fn signer(&self) -> Option<&str> {
        let p = self.pod_certificate.as_ref()?;
        (self.effective() == Delivery::PodCertificate).then_some(p.signer_name.as_str())
    }
}

/// Why `name` cannot be one of keyward's signer names, if it cannot: a signer name the
/// apiserver accepts ([`crate::names::signer_name_problem`]) in keyward's domain.
pub fn keyward_signer_problem(name: &str) -> Option<String> {
    let ours = name.split_once('/').is_some_and(|(domain, _)| domain == SIGNER_DOMAIN);
    match crate::names::signer_name_problem(name) {
        Some(problem) => {
            Some(format!("{problem} (keyward's signers are {SIGNER_DOMAIN}/<name>, e.g. {SIGNER_DOMAIN}/lmeval)"))
        }
        None if !ours => Some(format!(
            "{} is not one of keyward's signer names: use {SIGNER_DOMAIN}/<name> (e.g. {SIGNER_DOMAIN}/lmeval)",
            crate::text::quoted(name, 128)
        )),
        None => None,
    }
}

impl Kind for ClientCertificate {
    fn validate(&self, check: &mut Check) {
        let Self {
            delivery,
            secret_name,
            pod_certificate,
            volume_name,
            mount_path,
            cert_file_env,
            key_file_env,
            bundle_file_env,
            provider,
            resolved: _,
        } = self;
        let delivery = delivery.as_str();
        let (by_secret, by_signer) = match self.delivery {
            Delivery::Secret => (true, false),
            Delivery::PodCertificate => (false, true),
            Delivery::Auto => (true, true),
        };
        if by_secret {
            match secret_name {
                None => check.problem("secretName", format!("required with delivery: {delivery} (the Secret the pod mounts)")),
                Some(name) if *provider == Provider::Keyward && !name.uses_owner() => check.problem(
                    "secretName",
                    format!(
                        "{:?}: keyward issues one client certificate per owner, so the name must include {{owner.name}}{}",
                        name.as_str(),
                        // With auto keyward may be the signer, which provider: user refuses.
                        if by_signer { "" } else { "; or set provider: user" }
                    ),
                ),
                Some(_) => {}
            }
            if bundle_file_env.is_some() {
                check.problem(
                    "bundleFileEnv",
                    format!("not with delivery: {delivery} (a Secret holds no credential bundle); use certFileEnv and keyFileEnv, or delivery: podCertificate"),
                );
            }
        } else if secret_name.is_some() {
            check.problem(
                "secretName",
                "not with delivery: podCertificate (no Secret is made: the key stays on the node); remove it, or use delivery: auto",
            );
        }
        if by_signer {
            if *provider == Provider::User {
                check.problem("provider", format!("with delivery: {delivery} keyward's controller is the signer; remove provider: user, or deliver a Secret of your own"));
            }
            match pod_certificate {
                None => {
                    check.problem("podCertificate", format!("required with delivery: {delivery} (at least signerName)"))
                }
                Some(p) => {
                    if let Some(problem) = keyward_signer_problem(&p.signer_name) {
                        check.problem("podCertificate.signerName", problem);
                    }
                    if !(MIN_EXPIRATION_SECONDS..=MAX_EXPIRATION_SECONDS).contains(&p.max_expiration_seconds) {
                        check.problem(
                            "podCertificate.maxExpirationSeconds",
                            format!("{} is outside {MIN_EXPIRATION_SECONDS}..={MAX_EXPIRATION_SECONDS}, the range Kubernetes accepts for a signer outside kubernetes.io", p.max_expiration_seconds),
                        );
                    }
                }
            }
        } else if pod_certificate.is_some() {
            check.problem(
                "podCertificate",
                "only with delivery: podCertificate or auto; remove it, or set the delivery",
            );
        }
        check.volume_name("volumeName", volume_name);
        check.mount_path("mountPath", mount_path);
        if let Some(env) = cert_file_env {
            check.env_name("certFileEnv", env);
        }
        if let Some(env) = key_file_env {
            check.env_name("keyFileEnv", env);
        }
        if let Some(env) = bundle_file_env {
            check.env_name("bundleFileEnv", env);
        }
    }

    fn plan(&self, pod: &TemplateContext<'_>) -> Result<Injection, Unresolved> {
        let mount = MountSpec { volume: self.volume_name.clone(), path: self.mount_path.clone() };
        let (source, requirement, item) = match (self.effective(), &self.secret_name, &self.pod_certificate) {
            (Delivery::PodCertificate, _, Some(p)) => {
                let source = Source::PodCertificate(PodCertificateSource {
                    signer_name: p.signer_name.clone(),
                    key_type: p.key_type.as_str().into(),
                    max_expiration_seconds: p.max_expiration_seconds,
                    key_path: KEY_FILE.into(),
                    certificate_chain_path: CHAIN_FILE.into(),
                    credential_bundle_path: self.bundle_file_env.as_ref().map(|_| BUNDLE_FILE.into()),
                });
                let requirement = Requirement::new(ObjectKind::Signer, &p.signer_name, Provision::PodCertificate);
                let item = AuditItem::new("clientCertificate").with("signer", &p.signer_name);
                (source, requirement, item)
            }
            (Delivery::Secret | Delivery::Auto, Some(template), _) => {
                let secret = template.resolve(pod).map_err(|reason| Unresolved { field: "secretName", reason })?;
                let provision = match self.provider {
                    Provider::Keyward => Provision::ClientCertificate,
                    Provider::User => Provision::User,
                };
                let requirement = Requirement::new(ObjectKind::Secret, &secret, provision);
                let item = AuditItem::new("clientCertificate").with("secret", &secret);
                (Source::Secret { name: secret, keys: None }, requirement, item)
            }
            // Validation refuses these settings before a profile loads.
            (Delivery::PodCertificate, _, None) => {
                return Err(Unresolved {
                    field: "podCertificate",
                    reason: "required with delivery: podCertificate".into(),
                })
            }
            (Delivery::Secret | Delivery::Auto, None, _) => {
                return Err(Unresolved { field: "secretName", reason: "required with delivery: secret".into() })
            }
        };
        let item = item.with("volume", &self.volume_name).with("mountPath", &self.mount_path);
        let mut injection = Injection::new(item);
        injection.env.extend(self.cert_file_env.as_deref().map(|e| EnvSpec::file(e, &self.mount_path, CHAIN_FILE)));
        injection.env.extend(self.key_file_env.as_deref().map(|e| EnvSpec::file(e, &self.mount_path, KEY_FILE)));
        injection.env.extend(self.bundle_file_env.as_deref().map(|e| EnvSpec::file(e, &self.mount_path, BUNDLE_FILE)));
        injection.volume = Some((VolumeSpec { name: self.volume_name.clone(), source }, mount));
        injection.requires.push(requirement);
        Ok(injection)
    }

    fn describe(&self, injection: &Injection) -> String {
        let chosen = if self.delivery == Delivery::Auto { ", chosen by delivery: auto" } else { "" };
        match injection.item.get("signer") {
            Some(signer) => format!(
                "client certificate: key made on the node, signed by {signer} (podCertificate{chosen}), at {}",
                self.mount_path
            ),
            None => format!(
                "client certificate: Secret {} at {}{}",
                injection.item.get("secret").unwrap_or_default(),
                self.mount_path,
                if chosen.is_empty() {
                    ""
                } else {
                    " (delivery: auto: a Secret where keyward signs no pod certificates)"
                }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::testing::*;
    use serde_json::json;

    #[test]
    fn mounts_the_secret_whole_with_file_env() {
        let spec: ClientCertificate = yaml(
            "secretName: \"{owner.name}-keyward-client\"\nmountPath: /var/run/secrets/keyward/client\ncertFileEnv: CERT\nkeyFileEnv: KEY\n",
        );
        let injection = with_pod(Some("eval-7"), &[], |pod| spec.plan(pod)).unwrap();
        let (volume, mount) = injection.volume.clone().unwrap();
        assert_eq!(
            volume.to_json(),
            json!({"name": "keyward-client-cert", "secret": {"secretName": "eval-7-keyward-client", "defaultMode": 420}})
        );
        assert_eq!(
            mount.to_json(),
            json!({"name": "keyward-client-cert", "mountPath": "/var/run/secrets/keyward/client", "readOnly": true})
        );
        let env: Vec<_> = injection.env.iter().map(EnvSpec::to_json).collect();
        assert_eq!(
            env,
            [
                json!({"name": "CERT", "value": "/var/run/secrets/keyward/client/tls.crt"}),
                json!({"name": "KEY", "value": "/var/run/secrets/keyward/client/tls.key"})
            ]
        );
        assert_eq!(
            serde_json::to_value(&injection.item).unwrap(),
            json!({"kind": "clientCertificate", "secret": "eval-7-keyward-client", "volume": "keyward-client-cert", "mountPath": "/var/run/secrets/keyward/client"})
        );
        assert_eq!(
            spec.describe(&injection),
            "client certificate: Secret eval-7-keyward-client at /var/run/secrets/keyward/client"
        );
    }

    #[test]
    fn keyward_issues_it_per_owner() {
        let spec: ClientCertificate = yaml("secretName: \"{owner.name}-c\"\nmountPath: /m\n");
        let injection = with_pod(Some("job"), &[], |pod| spec.plan(pod)).unwrap();
        assert_eq!(injection.requires, [Requirement::new(ObjectKind::Secret, "job-c", Provision::ClientCertificate)]);
        let spec: ClientCertificate = yaml("secretName: fixed\nmountPath: /m\n");
        assert_eq!(
            problems(&spec),
            ["spec.inject.k.secretName: \"fixed\": keyward issues one client certificate per owner, so the name must include {owner.name}; or set provider: user"]
        );
        let spec: ClientCertificate = yaml("secretName: fixed\nmountPath: /m\nprovider: user\n");
        assert!(problems(&spec).is_empty());
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        assert_eq!(injection.requires[0].provided_by, Provider::User);
    }

    #[test]
    fn a_pod_certificate_is_a_projected_volume_the_signer_fills_and_no_secret() {
        let spec: ClientCertificate = yaml(
            "delivery: podCertificate\npodCertificate:\n  signerName: keyward.io/lmeval\nmountPath: /var/run/secrets/keyward/client\ncertFileEnv: CERT\nkeyFileEnv: KEY\nbundleFileEnv: BUNDLE\n",
        );
        assert!(problems(&spec).is_empty(), "{:?}", problems(&spec));
        let injection = with_pod(Some("eval-7"), &[], |pod| spec.plan(pod)).unwrap();
        let (volume, mount) = injection.volume.clone().unwrap();
        assert_eq!(
            volume.to_json(),
            json!({"name": "keyward-client-cert", "projected": {"defaultMode": 420, "sources": [{"podCertificate": {
                "signerName": "keyward.io/lmeval", "keyType": "ECDSAP256", "maxExpirationSeconds": 86400,
                "keyPath": "tls.key", "certificateChainPath": "tls.crt", "credentialBundlePath": "credentials.pem"}}]}})
        );
        assert_eq!(
            mount.to_json(),
            json!({"name": "keyward-client-cert", "mountPath": "/var/run/secrets/keyward/client", "readOnly": true})
        );
        let env: Vec<_> = injection.env.iter().map(EnvSpec::to_json).collect();
        assert_eq!(
            env,
            [
                json!({"name": "CERT", "value": "/var/run/secrets/keyward/client/tls.crt"}),
                json!({"name": "KEY", "value": "/var/run/secrets/keyward/client/tls.key"}),
                json!({"name": "BUNDLE", "value": "/var/run/secrets/keyward/client/credentials.pem"})
            ]
        );
        assert_eq!(
            injection.requires,
            [Requirement::new(ObjectKind::Signer, "keyward.io/lmeval", Provision::PodCertificate)]
        );
        assert_eq!(
            serde_json::to_value(&injection.item).unwrap(),
            json!({"kind": "clientCertificate", "signer": "keyward.io/lmeval", "volume": "keyward-client-cert", "mountPath": "/var/run/secrets/keyward/client"})
        );
        assert_eq!(
            spec.describe(&injection),
            "client certificate: key made on the node, signed by keyward.io/lmeval (podCertificate), at /var/run/secrets/keyward/client"
        );
        // Without bundleFileEnv, no bundle file; the key type and lifetime as set.
        let spec: ClientCertificate = yaml(
            "delivery: podCertificate\npodCertificate: {signerName: keyward.io/a.b, keyType: ED25519, maxExpirationSeconds: 3600}\nmountPath: /m\n",
        );
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        assert_eq!(
            injection.volume.unwrap().0.to_json()["projected"]["sources"][0]["podCertificate"],
            json!({"signerName": "keyward.io/a.b", "keyType": "ED25519", "maxExpirationSeconds": 3600, "keyPath": "tls.key", "certificateChainPath": "tls.crt"})
        );
    }

    #[test]
    fn each_delivery_refuses_the_other_ones_settings() {
        let spec: ClientCertificate = yaml(
            "delivery: podCertificate\nsecretName: \"{owner.name}-c\"\nprovider: user\npodCertificate: {signerName: example.com/x, maxExpirationSeconds: 60}\nmountPath: /m\n",
        );
        assert_eq!(
            problems(&spec),
            [
                "spec.inject.k.secretName: not with delivery: podCertificate (no Secret is made: the key stays on the node); remove it, or use delivery: auto",
                "spec.inject.k.provider: with delivery: podCertificate keyward's controller is the signer; remove provider: user, or deliver a Secret of your own",
                "spec.inject.k.podCertificate.signerName: \"example.com/x\" is not one of keyward's signer names: use keyward.io/<name> (e.g. keyward.io/lmeval)",
                "spec.inject.k.podCertificate.maxExpirationSeconds: 60 is outside 3600..=7862400, the range Kubernetes accepts for a signer outside kubernetes.io",
            ]
        );
        let spec: ClientCertificate = yaml("delivery: podCertificate\nmountPath: /m\n");
        assert_eq!(
            problems(&spec),
            ["spec.inject.k.podCertificate: required with delivery: podCertificate (at least signerName)"]
        );
        let spec: ClientCertificate =
            yaml("podCertificate: {signerName: keyward.io/x}\nbundleFileEnv: B\nmountPath: /m\n");
        assert_eq!(
            problems(&spec),
            [
                "spec.inject.k.secretName: required with delivery: secret (the Secret the pod mounts)",
                "spec.inject.k.bundleFileEnv: not with delivery: secret (a Secret holds no credential bundle); use certFileEnv and keyFileEnv, or delivery: podCertificate",
                "spec.inject.k.podCertificate: only with delivery: podCertificate or auto; remove it, or set the delivery",
            ]
        );
        for bad in
            ["keyward.io/", "keyward.io/Upper", "keyward.io/a/b", "keyward.io", "keyward.io/a_b", "example.com/x"]
        {
            assert!(keyward_signer_problem(bad).is_some(), "{bad}");
        }
        assert_eq!(keyward_signer_problem("keyward.io/lm.eval-v2"), None);
    }

    #[test]
    fn auto_is_a_secret_until_resolved_and_the_files_are_the_same_either_way() {
        let mut spec: ClientCertificate = yaml(
            "delivery: auto\nsecretName: \"{owner.name}-c\"\npodCertificate: {signerName: keyward.io/lmeval}\nmountPath: /m\ncertFileEnv: CERT\nkeyFileEnv: KEY\n",
        );
        assert!(problems(&spec).is_empty(), "{:?}", problems(&spec));
        let plan = |spec: &ClientCertificate| with_pod(Some("job"), &[], |pod| spec.plan(pod)).unwrap();
        let env = |i: &Injection| i.env.iter().map(EnvSpec::to_json).collect::<Vec<_>>();
        let mount = |i: &Injection| i.volume.clone().unwrap().1.to_json();

        // Not resolved (no cluster facts): a Secret, as on every cluster.
        let unresolved = plan(&spec);
        assert_eq!(spec.effective(), Delivery::Secret);
        assert_eq!(unresolved.requires, [Requirement::new(ObjectKind::Secret, "job-c", Provision::ClientCertificate)]);
        assert_eq!(spec.signer(), None);
        assert_eq!(
            spec.describe(&unresolved),
            "client certificate: Secret job-c at /m (delivery: auto: a Secret where keyward signs no pod certificates)"
        );

        spec.resolve(true);
        let signed = plan(&spec);
        assert_eq!(spec.effective(), Delivery::PodCertificate);
        assert_eq!(spec.signer(), Some("keyward.io/lmeval"));
        assert_eq!(
            signed.requires,
            [Requirement::new(ObjectKind::Signer, "keyward.io/lmeval", Provision::PodCertificate)]
        );
        assert_eq!(
            signed.volume.clone().unwrap().0.to_json()["projected"]["sources"][0]["podCertificate"]["signerName"],
            "keyward.io/lmeval"
        );
        assert_eq!(
            spec.describe(&signed),
            "client certificate: key made on the node, signed by keyward.io/lmeval (podCertificate, chosen by delivery: auto), at /m"
        );
        // The workload sees the same paths and env whichever way it came.
        assert_eq!((env(&signed), mount(&signed)), (env(&unresolved), mount(&unresolved)));

        spec.resolve(false);
        assert_eq!(plan(&spec), unresolved);
        // A set delivery is never changed by resolving.
        let mut set: ClientCertificate = yaml("secretName: \"{owner.name}-c\"\nmountPath: /m\n");
        set.resolve(true);
        assert_eq!(set.effective(), Delivery::Secret);
    }

    #[test]
    fn auto_needs_both_deliveries_configured_and_nothing_only_one_can_give() {
        let spec: ClientCertificate = yaml("delivery: auto\nmountPath: /m\nbundleFileEnv: B\nprovider: user\n");
        assert_eq!(
            problems(&spec),
            [
                "spec.inject.k.secretName: required with delivery: auto (the Secret the pod mounts)",
                "spec.inject.k.bundleFileEnv: not with delivery: auto (a Secret holds no credential bundle); use certFileEnv and keyFileEnv, or delivery: podCertificate",
                "spec.inject.k.provider: with delivery: auto keyward's controller is the signer; remove provider: user, or deliver a Secret of your own",
                "spec.inject.k.podCertificate: required with delivery: auto (at least signerName)",
            ]
        );
        let spec: ClientCertificate =
            yaml("delivery: auto\nsecretName: fixed\npodCertificate: {signerName: keyward.io/x}\nmountPath: /m\n");
        assert_eq!(
            problems(&spec),
            ["spec.inject.k.secretName: \"fixed\": keyward issues one client certificate per owner, so the name must include {owner.name}"]
        );
    }

    #[test]
    fn an_owner_template_needs_an_owner() {
        let spec: ClientCertificate = yaml("secretName: \"{owner.name}-c\"\nmountPath: /m\n");
        let err = with_pod(None, &[], |pod| spec.plan(pod)).unwrap_err();
        assert_eq!(err.field, "secretName");
        assert!(err.reason.contains("needs the pod's controller owner"), "{}", err.reason);
    }

    #[test]
    fn bad_settings_are_each_named() {
        let spec: ClientCertificate =
            yaml("secretName: s\nmountPath: rel\nvolumeName: Bad\ncertFileEnv: 1X\nprovider: user\n");
        let problems = problems(&spec);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("spec.inject.k.volumeName: \"Bad\" is not a DNS-1123 label"));
        assert!(problems[1].starts_with("spec.inject.k.mountPath: \"rel\" must be an absolute path"));
        assert!(problems[2].starts_with("spec.inject.k.certFileEnv: \"1X\" is not a valid environment variable name"));
    }
}
