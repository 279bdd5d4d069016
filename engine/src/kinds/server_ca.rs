//! The CA that signs the control plane's serving certificate: one key of a ConfigMap or a
//! Secret, so the pod can verify the server it calls.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{AuditItem, Check, EnvSpec, Injection, MountSpec, Source, Unresolved, VolumeSpec};
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
        let Self { secret_name: _, config_map_name: _, key, volume_name, mount_path, file_env } = self;
        if self.object().is_none() {
            check.problem("", "set exactly one of secretName or configMapName");
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
        let (source, item) = if is_config_map {
            (Source::ConfigMap { name: name.clone(), keys }, AuditItem::new("serverCA").with("configMap", name))
        } else {
            (Source::Secret { name: name.clone(), keys }, AuditItem::new("serverCA").with("secret", name))
        };
        let mut injection = Injection::new(item.with("volume", &self.volume_name).with("mountPath", &self.mount_path));
        injection.volume = Some((
            VolumeSpec { name: self.volume_name.clone(), source },
            MountSpec { volume: self.volume_name.clone(), path: self.mount_path.clone() },
        ));
        injection.env.extend(self.file_env.as_deref().map(|e| EnvSpec::file(e, &self.mount_path, &self.key)));
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
    fn exactly_one_source_and_a_usable_key() {
        let spec: ServerCa = yaml("secretName: a\nconfigMapName: b\nkey: ../x\nmountPath: /m\n");
        let problems = problems(&spec);
        assert_eq!(problems[0], "spec.inject.k: set exactly one of secretName or configMapName");
        assert!(problems[1].starts_with("spec.inject.k.key: must be a Secret or ConfigMap key"), "{problems:?}");
    }
}
