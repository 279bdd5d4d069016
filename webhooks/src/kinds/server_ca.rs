//! The CA that signs the control plane's serving certificate, so the pod can verify the server
//! it calls: one key of a ConfigMap or a Secret (copied into each namespace), or a
//! `clusterTrustBundle` projection (one cluster-wide ClusterTrustBundle, by name, or the bundles
//! of a signer that a label selector picks), written to a file of the same name.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{
    AuditItem, CaSource, Check, EnvSpec, Injection, MatchLabels, MountSpec, ObjectKind, Provider, Provision,
    Requirement, Source, TrustBundleSource, Unresolved, VolumeSpec,
};
use crate::names::{
    is_dns1123_label, is_dns1123_subdomain, is_label_value, is_qualified_name, signer_name_problem, DNS1123_LABEL_RULE,
    DNS1123_SUBDOMAIN_RULE,
};
use crate::names::{NameTemplate, TemplateContext};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerCa {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<NameTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<NameTemplate>,
    /// A `clusterTrustBundle` projection instead of a copied object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_trust_bundle: Option<TrustBundle>,
    /// The key of the Secret or ConfigMap; with a trust bundle, the file it is written to.
    #[serde(default = "default_key")]
    pub key: String,
    #[serde(default = "default_volume")]
    pub volume_name: String,
    pub mount_path: String,
    /// Env var set to `<mountPath>/<key>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_env: Option<String>,
    /// Who makes the ConfigMap or Secret exist in each namespace (or the trust bundle, once for
    /// the cluster): the admin (the default), or keyward, which copies it from `source`.
    #[serde(default)]
    pub provider: Provider,
    /// With `provider: keyward`, where the CA comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<CaSource>,
}

/// Which ClusterTrustBundles the pod trusts (Kubernetes' `ClusterTrustBundleProjection`):
/// one by `name`, or those of `signerName` that `labelSelector` picks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrustBundle {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<MatchLabels>,
}

fn default_key() -> String {
    "ca.crt".into()
}

fn default_volume() -> String {
    "keyward-server-ca".into()
}

impl ServerCa {
    /// The object holding the CA: `(is a ConfigMap, its name template, its field)`.
    fn object(&self) -> Option<(bool, &NameTemplate, &'static str)> {
        match (&self.secret_name, &self.config_map_name) {
            (Some(name), None) => Some((false, name, "secretName")),
            (None, Some(name)) => Some((true, name, "configMapName")),
            _ => None,
        }
    }
}

impl Kind for ServerCa {
    fn validate(&self, check: &mut Check) {
        let Self {
            secret_name: _,
            config_map_name: _,
            cluster_trust_bundle,
            key,
            volume_name,
            mount_path,
            file_env,
            provider,
            source,
        } = self;
        match (self.object(), cluster_trust_bundle) {
            (None, Some(bundle)) if self.secret_name.is_none() && self.config_map_name.is_none() => {
                bundle.validate(*provider, check)
            }
            (_, Some(_)) | (None, None) => {
                check.problem("", "set exactly one of secretName, configMapName or clusterTrustBundle")
            }
            (Some(_), None) => {}
        }
        match self.object().filter(|_| cluster_trust_bundle.is_none()) {
            None => {}
            Some((_, name, field)) if *provider == Provider::Keyward && name.depends_on_pod() => check.problem(
                field,
                format!("{:?}: keyward provisions the server CA once per namespace, so the name may use {{namespace}} but not the pod's owner or labels", name.as_str()),
            ),
            Some(_) => {}
        }
        match (provider, source) {
            (Provider::Keyward, None) => check.problem(
                "source",
                "with provider: keyward, say where the CA comes from: source: {secret: {name, key}} or {configMap: {name, key}} (in the operator's namespace unless a namespace is given)",
            ),
            (Provider::User, Some(_)) => check.problem("source", "only with provider: keyward (the admin provides the CA otherwise)"),
            (_, Some(source)) => match (&source.secret, &source.config_map) {
                (Some(object), None) | (None, Some(object)) => {
                    if let Some(ns) = &object.namespace {
                        if !is_dns1123_label(ns) {
                            check.problem("source.namespace", format!("{ns:?} is not a namespace name ({DNS1123_LABEL_RULE})"));
                        }
                    }
                    if !is_dns1123_subdomain(&object.name) {
                        check.problem("source.name", format!("{:?} is not an object name ({DNS1123_SUBDOMAIN_RULE})", object.name));
                    }
                    check.data_key("source.key", &object.key);
                }
                _ => check.problem("source", "set exactly one of secret or configMap"),
            },
            (Provider::User, None) => {}
        }
        check.data_key("key", key);
        check.volume_name("volumeName", volume_name);
        check.mount_path("mountPath", mount_path);
        if let Some(env) = file_env {
            check.env_name("fileEnv", env);
        }
    }

    fn plan(&self, pod: &TemplateContext<'_>) -> Result<Injection, Unresolved> {
        if let Some(bundle) = &self.cluster_trust_bundle {
            return Ok(self.plan_bundle(bundle));
        }
        let Some((is_config_map, template, field)) = self.object() else {
            return Err(Unresolved {
                field: "secretName",
                reason: "set exactly one of secretName or configMapName".into(),
            });
        };
        let name = template.resolve(pod).map_err(|reason| Unresolved { field, reason })?;
        let keys = Some(vec![self.key.clone()]);
        let (source, item, kind) = if is_config_map {
            (
                Source::ConfigMap { name: name.clone(), keys },
                AuditItem::new("serverCA").with("configMap", &name),
                ObjectKind::ConfigMap,
            )
        } else {
            (
                Source::Secret { name: name.clone(), keys },
                AuditItem::new("serverCA").with("secret", &name),
                ObjectKind::Secret,
            )
        };
        let provision = match (&self.provider, &self.source) {
            (Provider::Keyward, Some(source)) => Provision::ServerCa { source: source.clone(), key: self.key.clone() },
            _ => Provision::User,
        };
        let mut injection = Injection::new(item.with("volume", &self.volume_name).with("mountPath", &self.mount_path));
        injection.volume = Some((
            VolumeSpec { name: self.volume_name.clone(), source },
            MountSpec { volume: self.volume_name.clone(), path: self.mount_path.clone() },
        ));
        injection.env.extend(self.file_env.as_deref().map(|e| EnvSpec::file(e, &self.mount_path, &self.key)));
        injection.requires.push(Requirement::new(kind, name, provision));
        Ok(injection)
    }

    fn describe(&self, injection: &Injection) -> String {
        let at = format!("{}/{}", self.mount_path, self.key);
        match (injection.item.get("secret"), injection.item.get("configMap"), &self.cluster_trust_bundle) {
            (Some(s), _, _) => format!("server CA: Secret {s} key {} at {at}", self.key),
            (_, Some(c), _) => format!("server CA: ConfigMap {c} key {} at {at}", self.key),
            (_, _, Some(TrustBundle { name: Some(name), .. })) => {
                format!("server CA: ClusterTrustBundle {name} at {at}")
            }
            (_, _, Some(TrustBundle { signer_name: Some(signer), label_selector, .. })) => {
                let labels = label_selector.as_ref().map(|l| &l.match_labels).filter(|l| !l.is_empty());
                let which = match labels {
                    None => "every ClusterTrustBundle".to_string(),
                    Some(l) => format!(
                        "the ClusterTrustBundles labelled {}",
                        l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
                    ),
                };
                format!("server CA: {which} of signer {signer}, at {at}")
            }
            _ => format!("server CA at {}", self.mount_path),
        }
    }
}

// === impl TrustBundle ===

impl TrustBundle {
    fn validate(&self, provider: Provider, check: &mut Check) {
        match (&self.name, &self.signer_name) {
            (Some(name), None) => {
                // A bundle linked to no signer may not have ':' in its name; a subdomain has none.
                if !is_dns1123_subdomain(name) {
                    check.problem(
                        "clusterTrustBundle.name",
                        format!("{name:?} is not a ClusterTrustBundle name ({DNS1123_SUBDOMAIN_RULE})"),
                    );
                }
                if self.label_selector.is_some() {
                    check.problem("clusterTrustBundle.labelSelector", "only with signerName (a name picks one bundle)");
                }
            }
            (None, Some(signer)) => {
                if let Some(problem) = signer_name_problem(signer) {
                    check.problem("clusterTrustBundle.signerName", problem);
                }
                match &self.label_selector {
                    // Kubernetes reads an unset selector as "match nothing": the pod would never start.
                    None => check.problem(
                        "clusterTrustBundle.labelSelector",
                        "required with signerName (unset matches no bundle); {} picks every bundle of the signer",
                    ),
                    Some(selector) => {
                        for (k, v) in &selector.match_labels {
                            if !is_qualified_name(k) {
                                check.problem(
                                    "clusterTrustBundle.labelSelector.matchLabels",
                                    format!("{k:?} is not a valid label key"),
                                );
                            }
                            if !is_label_value(v) {
                                check.problem(
                                    &format!("clusterTrustBundle.labelSelector.matchLabels[{k:?}]"),
                                    format!("{v:?} is not a valid label value"),
                                );
                            }
                        }
                    }
                }
                if provider == Provider::Keyward {
                    check.problem("provider", "keyward publishes one bundle of its own, by name: use clusterTrustBundle.name with provider: keyward, or provider: user for a signer's bundles");
                }
            }
            _ => check.problem("clusterTrustBundle", "set exactly one of name or signerName"),
        }
    }
}

impl ServerCa {
    fn plan_bundle(&self, bundle: &TrustBundle) -> Injection {
        let source = TrustBundleSource {
            name: bundle.name.clone(),
            signer_name: bundle.signer_name.clone(),
            label_selector: bundle.label_selector.clone(),
            path: self.key.clone(),
        };
        // Required by a name or a signer: the object a person would look for.
        let (name, item) = match (&bundle.name, &bundle.signer_name) {
            (Some(name), _) => (name.clone(), AuditItem::new("serverCA").with("clusterTrustBundle", name)),
            (None, signer) => {
                let signer = signer.clone().unwrap_or_default();
                let item = AuditItem::new("serverCA").with("clusterTrustBundleSigner", &signer);
                (signer, item)
            }
        };
        let provision = match (&self.provider, &self.source, &bundle.name) {
            (Provider::Keyward, Some(source), Some(_)) => {
                Provision::TrustBundle { source: source.clone(), key: self.key.clone() }
            }
            _ => Provision::User,
        };
        let mut injection = Injection::new(item.with("volume", &self.volume_name).with("mountPath", &self.mount_path));
        injection.volume = Some((
            VolumeSpec { name: self.volume_name.clone(), source: Source::ClusterTrustBundle(source) },
            MountSpec { volume: self.volume_name.clone(), path: self.mount_path.clone() },
        ));
        injection.env.extend(self.file_env.as_deref().map(|e| EnvSpec::file(e, &self.mount_path, &self.key)));
        injection.requires.push(Requirement::new(ObjectKind::ClusterTrustBundle, name, provision));
        injection
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::testing::*;
    use serde_json::json;

    #[test]
    fn a_config_map_or_a_secret_projects_one_key() {
        let spec: ServerCa = yaml("configMapName: ca\nmountPath: /etc/keyward/ca\nfileEnv: CA\n");
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        let (volume, _) = injection.volume.clone().unwrap();
        assert_eq!(
            volume.to_json(),
            json!({"name": "keyward-server-ca", "configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}], "defaultMode": 420}})
        );
        assert_eq!(injection.env[0].to_json(), json!({"name": "CA", "value": "/etc/keyward/ca/ca.crt"}));
        assert_eq!(
            serde_json::to_value(&injection.item).unwrap(),
            json!({"kind": "serverCA", "configMap": "ca", "volume": "keyward-server-ca", "mountPath": "/etc/keyward/ca"})
        );

        let spec: ServerCa = yaml("secretName: ca\nkey: root.pem\nmountPath: /etc/keyward/ca\n");
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        assert_eq!(
            injection.volume.unwrap().0.to_json(),
            json!({"name": "keyward-server-ca", "secret": {"secretName": "ca", "items": [{"key": "root.pem", "path": "root.pem"}], "defaultMode": 420}})
        );
        assert!(injection.env.is_empty());
    }

    #[test]
    fn keyward_provisions_it_per_namespace_from_a_source() {
        let spec: ServerCa = yaml(
            "configMapName: keyward-ca\nmountPath: /ca\nprovider: keyward\nsource: {secret: {name: grpc-server-cert}}\n",
        );
        assert!(problems(&spec).is_empty(), "{:?}", problems(&spec));
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        let source = CaSource {
            secret: Some(crate::inject::ObjectKey {
                namespace: None,
                name: "grpc-server-cert".into(),
                key: "ca.crt".into(),
            }),
            config_map: None,
        };
        assert_eq!(
            injection.requires,
            [Requirement::new(
                ObjectKind::ConfigMap,
                "keyward-ca",
                Provision::ServerCa { source, key: "ca.crt".into() }
            )]
        );
        let spec: ServerCa = yaml("configMapName: \"{owner.name}-ca\"\nmountPath: /ca\nprovider: keyward\n");
        let found = problems(&spec);
        assert!(
            found[0].starts_with(
                "spec.inject.k.configMapName: \"{owner.name}-ca\": keyward provisions the server CA once per namespace"
            ),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("spec.inject.k.source: with provider: keyward, say where the CA comes from"),
            "{found:?}"
        );
        let spec: ServerCa = yaml("configMapName: ca\nmountPath: /ca\nsource: {secret: {name: x}}\n");
        assert_eq!(
            problems(&spec),
            ["spec.inject.k.source: only with provider: keyward (the admin provides the CA otherwise)"]
        );
    }

    #[test]
    fn a_trust_bundle_is_projected_by_name_or_by_signer_and_labels() {
        let spec: ServerCa = yaml(
            "clusterTrustBundle: {name: keyward-lmeval-server-ca}\nmountPath: /ca\nfileEnv: CA\nprovider: keyward\nsource: {secret: {namespace: lm-eval, name: grpc-server-cert}}\n",
        );
        assert!(problems(&spec).is_empty(), "{:?}", problems(&spec));
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        let (volume, mount) = injection.volume.clone().unwrap();
        assert_eq!(
            volume.to_json(),
            json!({"name": "keyward-server-ca", "projected": {"defaultMode": 420, "sources": [
                {"clusterTrustBundle": {"name": "keyward-lmeval-server-ca", "path": "ca.crt"}}]}})
        );
        assert_eq!(mount.to_json(), json!({"name": "keyward-server-ca", "mountPath": "/ca", "readOnly": true}));
        assert_eq!(injection.env[0].to_json(), json!({"name": "CA", "value": "/ca/ca.crt"}));
        let source = CaSource {
            secret: Some(crate::inject::ObjectKey {
                namespace: Some("lm-eval".into()),
                name: "grpc-server-cert".into(),
                key: "ca.crt".into(),
            }),
            config_map: None,
        };
        assert_eq!(
            injection.requires,
            [Requirement::new(
                ObjectKind::ClusterTrustBundle,
                "keyward-lmeval-server-ca",
                Provision::TrustBundle { source, key: "ca.crt".into() }
            )]
        );
        assert_eq!(spec.describe(&injection), "server CA: ClusterTrustBundle keyward-lmeval-server-ca at /ca/ca.crt");

        // Someone else's: the bundles of a signer, picked by labels ({} for all of them).
        let spec: ServerCa = yaml(
            "clusterTrustBundle: {signerName: example.com/serving, labelSelector: {matchLabels: {tier: api}}}\nkey: roots.pem\nmountPath: /ca\n",
        );
        assert!(problems(&spec).is_empty(), "{:?}", problems(&spec));
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        assert_eq!(
            injection.volume.clone().unwrap().0.to_json()["projected"]["sources"][0],
            json!({"clusterTrustBundle": {"signerName": "example.com/serving", "labelSelector": {"matchLabels": {"tier": "api"}}, "path": "roots.pem"}})
        );
        assert_eq!(
            injection.requires,
            [Requirement::new(ObjectKind::ClusterTrustBundle, "example.com/serving", Provision::User)]
        );
        assert_eq!(
            spec.describe(&injection),
            "server CA: the ClusterTrustBundles labelled tier=api of signer example.com/serving, at /ca/roots.pem"
        );
        let spec: ServerCa =
            yaml("clusterTrustBundle: {signerName: example.com/serving, labelSelector: {}}\nmountPath: /ca\n");
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        assert_eq!(
            injection.volume.unwrap().0.to_json()["projected"]["sources"][0]["clusterTrustBundle"]["labelSelector"],
            json!({})
        );
    }

    #[test]
    fn a_trust_bundle_is_named_by_kubernetes_rules_and_keyward_publishes_only_its_own() {
        for (yaml_text, expected) in [
            (
                "clusterTrustBundle: {name: \"a:b\"}\nmountPath: /m\n",
                vec!["spec.inject.k.clusterTrustBundle.name: \"a:b\" is not a ClusterTrustBundle name (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters)"],
            ),
            (
                "clusterTrustBundle: {name: a, signerName: example.com/x}\nmountPath: /m\n",
                vec!["spec.inject.k.clusterTrustBundle: set exactly one of name or signerName"],
            ),
            (
                "clusterTrustBundle: {signerName: example.com/x}\nmountPath: /m\nprovider: keyward\nsource: {secret: {name: s}}\n",
                vec![
                    "spec.inject.k.clusterTrustBundle.labelSelector: required with signerName (unset matches no bundle); {} picks every bundle of the signer",
                    "spec.inject.k.provider: keyward publishes one bundle of its own, by name: use clusterTrustBundle.name with provider: keyward, or provider: user for a signer's bundles",
                ],
            ),
            (
                "clusterTrustBundle: {signerName: nodomain, labelSelector: {matchLabels: {\"bad key\": \"-v\"}}}\nmountPath: /m\n",
                vec![
                    "spec.inject.k.clusterTrustBundle.signerName: \"nodomain\" must be a fully qualified domain and path of the form 'example.com/signer-name'",
                    "spec.inject.k.clusterTrustBundle.labelSelector.matchLabels: \"bad key\" is not a valid label key",
                    "spec.inject.k.clusterTrustBundle.labelSelector.matchLabels[\"bad key\"]: \"-v\" is not a valid label value",
                ],
            ),
            (
                "clusterTrustBundle: {name: a, labelSelector: {}}\nconfigMapName: c\nmountPath: /m\n",
                vec!["spec.inject.k: set exactly one of secretName, configMapName or clusterTrustBundle"],
            ),
            (
                "clusterTrustBundle: {name: a}\nmountPath: /m\nprovider: keyward\n",
                vec!["spec.inject.k.source: with provider: keyward, say where the CA comes from: source: {secret: {name, key}} or {configMap: {name, key}} (in the operator's namespace unless a namespace is given)"],
            ),
        ] {
            let spec: ServerCa = yaml(yaml_text);
            assert_eq!(problems(&spec), expected, "{yaml_text}");
        }
    }

    /// The signer names and file names the apiserver refuses in a pod (ValidateSignerName,
    /// ValidateLocalNonReservedPath) are refused in the profile, before any pod is.
    #[test]
    fn signer_names_and_file_names_as_the_apiserver_checks_them() {
        let refused = |signer: &str| {
            let spec: ServerCa =
                yaml(&format!("clusterTrustBundle: {{signerName: {signer:?}, labelSelector: {{}}}}\nmountPath: /m\n"));
            problems(&spec)
        };
        for (signer, why) in [
            (
                "example.com/a/b",
                "\"example.com/a/b\" must be a fully qualified domain and path of the form 'example.com/signer-name'"
                    .to_string(),
            ),
            ("Example.com/ca", format!("\"Example.com/ca\": domain label \"Example\" is not {DNS1123_LABEL_RULE}")),
            (
                "example.com/serving_ca",
                format!("\"example.com/serving_ca\": path segment \"serving_ca\" is not {DNS1123_SUBDOMAIN_RULE}"),
            ),
            (
                "localhost/ca",
                "\"localhost/ca\": its domain should be a domain with at least two segments separated by dots"
                    .to_string(),
            ),
            ("example.com/", format!("\"example.com/\": path segment \"\" is not {DNS1123_SUBDOMAIN_RULE}")),
        ] {
            let problems = refused(signer);
            assert_eq!(problems.len(), 1, "{signer}: {problems:?}");
            assert_eq!(problems[0], format!("spec.inject.k.clusterTrustBundle.signerName: {why}"));
        }
        for good in ["example.com/serving-ca", "cert-manager.io/ca.v2", "a.b/c"] {
            assert_eq!(refused(good), Vec::<String>::new(), "{good}");
        }
        let spec: ServerCa = yaml("configMapName: b\nkey: ..data\nmountPath: /m\n");
        assert_eq!(
            problems(&spec),
            ["spec.inject.k.key: must be a Secret or ConfigMap key: letters, digits, '-', '_' and '.', not '.' and not starting with '..'"]
        );
    }

    #[test]
    fn exactly_one_source_and_a_usable_key() {
        let spec: ServerCa = yaml("secretName: a\nconfigMapName: b\nkey: ../x\nmountPath: /m\n");
        let problems = problems(&spec);
        assert_eq!(problems[0], "spec.inject.k: set exactly one of secretName, configMapName or clusterTrustBundle");
        assert!(problems[1].starts_with("spec.inject.k.key: must be a Secret or ConfigMap key"), "{problems:?}");
    }
}
