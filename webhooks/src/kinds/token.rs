//! A token or API key from a Secret key: a file, and optionally an env var.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{
    AuditItem, Check, EnvSpec, EnvValue, Injection, MountSpec, ObjectKind, Provider, Provision, Requirement, Source,
    Unresolved, VolumeSpec,
};
use crate::names::{NameTemplate, TemplateContext};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Token {
    pub secret_name: NameTemplate,
    #[serde(default = "default_key")]
    pub key: String,
    #[serde(default = "default_volume")]
    pub volume_name: String,
    pub mount_path: String,
    /// Env var set to `<mountPath>/<key>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_env: Option<String>,
    /// Env var holding the value itself, via `secretKeyRef`. Prefer the file: env vars leak
    /// into child processes and crash dumps, and do not rotate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_env: Option<String>,
    /// Who creates the Secret: the admin or their control plane (the default), or keyward,
    /// which generates one token per owner and never replaces it.
    #[serde(default)]
    pub provider: Provider,
}

fn default_key() -> String {
    "token".into()
}

fn default_volume() -> String {
    "keyward-token".into()
}

impl Kind for Token {
    fn validate(&self, check: &mut Check) {
        let Self { secret_name, key, volume_name, mount_path, file_env, value_env, provider } = self;
        if *provider == Provider::Keyward && !secret_name.uses_owner() {
            check.problem(
                "secretName",
                format!(
                    "{:?}: keyward generates one token per owner, so the name must include {{owner.name}}",
                    secret_name.as_str()
                ),
            );
        }
        check.data_key("key", key);
        check.volume_name("volumeName", volume_name);
        check.mount_path("mountPath", mount_path);
        if let Some(env) = file_env {
            check.env_name("fileEnv", env);
        }
        if let Some(env) = value_env {
            check.env_name("valueEnv", env);
        }
    }

    fn plan(&self, pod: &TemplateContext<'_>) -> Result<Injection, Unresolved> {
        let secret = self.secret_name.resolve(pod).map_err(|reason| Unresolved { field: "secretName", reason })?;
        let item = AuditItem::new("token")
            .with("secret", &secret)
            .with("key", &self.key)
            .with("volume", &self.volume_name)
            .with("mountPath", &self.mount_path);
        let mut injection = Injection::new(item);
        injection.env.extend(self.file_env.as_deref().map(|e| EnvSpec::file(e, &self.mount_path, &self.key)));
        if let Some(name) = &self.value_env {
            injection.env.push(EnvSpec {
                name: name.clone(),
                value: EnvValue::SecretKey { secret: secret.clone(), key: self.key.clone() },
            });
        }
        let provision = match self.provider {
            Provider::Keyward => Provision::GeneratedToken { key: self.key.clone() },
            Provider::User => Provision::User,
        };
        injection.requires.push(Requirement::new(ObjectKind::Secret, secret.clone(), provision));
        injection.volume = Some((
            VolumeSpec {
                name: self.volume_name.clone(),
                source: Source::Secret { name: secret, keys: Some(vec![self.key.clone()]) },
            },
            MountSpec { volume: self.volume_name.clone(), path: self.mount_path.clone() },
        ));
        Ok(injection)
    }

    fn describe(&self, injection: &Injection) -> String {
        let secret = injection.item.get("secret").unwrap_or_default();
        let mut line = format!("token: Secret {secret} key {} at {}/{}", self.key, self.mount_path, self.key);
        if let Some(env) = &self.value_env {
            line.push_str(&format!(", and in ${env}"));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::testing::*;
    use serde_json::json;

    #[test]
    fn a_file_and_a_secret_key_ref_env() {
        let spec: Token = yaml(
            "secretName: \"{label:team}-api-key\"\nkey: api-key\nmountPath: /var/run/secrets/keyward/token\nfileEnv: TOKEN_FILE\nvalueEnv: TOKEN\n",
        );
        let injection = with_pod(None, &[("team", "blue")], |pod| spec.plan(pod)).unwrap();
        assert_eq!(
            injection.volume.clone().unwrap().0.to_json(),
            json!({"name": "keyward-token", "secret": {"secretName": "blue-api-key", "items": [{"key": "api-key", "path": "api-key"}], "defaultMode": 420}})
        );
        let env: Vec<_> = injection.env.iter().map(EnvSpec::to_json).collect();
        assert_eq!(
            env,
            [
                json!({"name": "TOKEN_FILE", "value": "/var/run/secrets/keyward/token/api-key"}),
                json!({"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "blue-api-key", "key": "api-key"}}})
            ]
        );
        assert_eq!(
            spec.describe(&injection),
            "token: Secret blue-api-key key api-key at /var/run/secrets/keyward/token/api-key, and in $TOKEN"
        );
    }

    #[test]
    fn a_generated_token_is_one_per_owner() {
        let spec: Token = yaml("secretName: \"{owner.name}-token\"\nmountPath: /t\nprovider: keyward\n");
        let injection = with_pod(Some("rc"), &[], |pod| spec.plan(pod)).unwrap();
        assert_eq!(
            injection.requires,
            [Requirement::new(ObjectKind::Secret, "rc-token", Provision::GeneratedToken { key: "token".into() })]
        );
        let spec: Token = yaml("secretName: shared\nmountPath: /t\nprovider: keyward\n");
        assert_eq!(
            problems(&spec),
            ["spec.inject.k.secretName: \"shared\": keyward generates one token per owner, so the name must include {owner.name}"]
        );
    }

    #[test]
    fn a_missing_label_is_unresolved() {
        let spec: Token = yaml("secretName: \"{label:team}-k\"\nmountPath: /m\n");
        let err = with_pod(None, &[], |pod| spec.plan(pod)).unwrap_err();
        assert_eq!(err.reason, "\"{label:team}-k\" needs the pod label \"team\", which the pod does not have");
    }
}
