//! The CA that signs the control plane's serving certificate: one key of a ConfigMap or a
//! Secret, so the pod can verify the server it calls.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{
    AuditItem, CaSource, Check, EnvSpec, Injection, MountSpec, ObjectKind, Provider, Provision, Requirement, Source,
    Unresolved, VolumeSpec,
};
use crate::names::{is_dns1123_label, is_dns1123_subdomain, DNS1123_LABEL_RULE, DNS1123_SUBDOMAIN_RULE};
use crate::names::{NameTemplate, TemplateContext};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServerCa {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<NameTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<NameTemplate>,
    #[serde(default = "default_key")]
    pub key: String,
    #[serde(default = "default_volume")]
    pub volume_name: String,
    pub mount_path: String,
    /// Env var set to `<mountPath>/<key>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_env: Option<String>,
    /// Who makes the ConfigMap or Secret exist in each namespace: the admin (the default), or
    /// keyward, which copies it from `source`.
    #[serde(default)]
    pub provider: Provider,
    /// With `provider: keyward`, where the CA comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<CaSource>,
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
        let Self { secret_name: _, config_map_name: _, key, volume_name, mount_path, file_env, provider, source } =
            self;
        match self.object() {
            None => check.problem("", "set exactly one of secretName or configMapName"),
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
        match (injection.item.get("secret"), injection.item.get("configMap")) {
            (Some(s), _) => format!("server CA: Secret {s} key {} at {}/{}", self.key, self.mount_path, self.key),
            (_, Some(c)) => format!("server CA: ConfigMap {c} key {} at {}/{}", self.key, self.mount_path, self.key),
            _ => format!("server CA at {}", self.mount_path),
        }
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
    fn exactly_one_source_and_a_usable_key() {
        let spec: ServerCa = yaml("secretName: a\nconfigMapName: b\nkey: ../x\nmountPath: /m\n");
        let problems = problems(&spec);
        assert_eq!(problems[0], "spec.inject.k: set exactly one of secretName or configMapName");
        assert!(problems[1].starts_with("spec.inject.k.key: must be a Secret or ConfigMap key"), "{problems:?}");
    }
}
