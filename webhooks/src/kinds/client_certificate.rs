//! The pod's own mTLS identity: a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`, and the
//! client CA as `ca.crt`), mounted whole.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{
    AuditItem, Check, EnvSpec, Injection, MountSpec, ObjectKind, Provider, Provision, Requirement, Source, Unresolved,
    VolumeSpec,
};
use crate::names::{NameTemplate, TemplateContext};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientCertificate {
    pub secret_name: NameTemplate,
    #[serde(default = "default_volume")]
    pub volume_name: String,
    pub mount_path: String,
    /// Env var set to `<mountPath>/tls.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file_env: Option<String>,
    /// Env var set to `<mountPath>/tls.key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file_env: Option<String>,
    /// Who issues the Secret: keyward (the default: one certificate per owner, signed by its
    /// client CA) or the admin.
    #[serde(default = "keyward")]
    pub provider: Provider,
}

fn default_volume() -> String {
    "keyward-client-cert".into()
}

fn keyward() -> Provider {
    Provider::Keyward
}

impl Kind for ClientCertificate {
    fn validate(&self, check: &mut Check) {
        let Self { secret_name, volume_name, mount_path, cert_file_env, key_file_env, provider } = self;
        if *provider == Provider::Keyward && !secret_name.uses_owner() {
            check.problem(
                "secretName",
                format!("{:?}: keyward issues one client certificate per owner, so the name must include {{owner.name}}; or set provider: user", secret_name.as_str()),
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
    }

    fn plan(&self, pod: &TemplateContext<'_>) -> Result<Injection, Unresolved> {
        let secret = self.secret_name.resolve(pod).map_err(|reason| Unresolved { field: "secretName", reason })?;
        let volume =
            VolumeSpec { name: self.volume_name.clone(), source: Source::Secret { name: secret.clone(), keys: None } };
        let mount = MountSpec { volume: self.volume_name.clone(), path: self.mount_path.clone() };
        let item = AuditItem::new("clientCertificate")
            .with("secret", &secret)
            .with("volume", &self.volume_name)
            .with("mountPath", &self.mount_path);
        let mut injection = Injection::new(item);
        injection.env.extend(self.cert_file_env.as_deref().map(|e| EnvSpec::file(e, &self.mount_path, "tls.crt")));
        injection.env.extend(self.key_file_env.as_deref().map(|e| EnvSpec::file(e, &self.mount_path, "tls.key")));
        injection.volume = Some((volume, mount));
        let provision = match self.provider {
            Provider::Keyward => Provision::ClientCertificate,
            Provider::User => Provision::User,
        };
        injection.requires.push(Requirement::new(ObjectKind::Secret, secret, provision));
        Ok(injection)
    }

    fn describe(&self, injection: &Injection) -> String {
        format!(
            "client certificate: Secret {} at {}",
            injection.item.get("secret").unwrap_or_default(),
            self.mount_path
        )
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
