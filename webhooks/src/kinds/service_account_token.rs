//! A projected service-account token bound to an audience, with an expiry; the kubelet rotates
//! it.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{
    AuditItem, Check, EnvSpec, Injection, MountSpec, Source, Unresolved, VolumeSpec, DEFAULT_TOKEN_EXPIRATION_SECONDS,
    MAX_TOKEN_EXPIRATION_SECONDS, MIN_TOKEN_EXPIRATION_SECONDS,
};
use crate::names::TemplateContext;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAccountToken {
    pub audience: String,
    #[serde(default = "default_expiration")]
    pub expiration_seconds: i64,
    #[serde(default = "default_path")]
    pub path: String,
    #[serde(default = "default_volume")]
    pub volume_name: String,
    pub mount_path: String,
    /// Env var set to `<mountPath>/<path>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_env: Option<String>,
}

fn default_expiration() -> i64 {
    DEFAULT_TOKEN_EXPIRATION_SECONDS
}

fn default_path() -> String {
    "token".into()
}

fn default_volume() -> String {
    "keyward-sa-token".into()
}

impl Kind for ServiceAccountToken {
    fn validate(&self, check: &mut Check) {
        let Self { audience, expiration_seconds, path, volume_name, mount_path, file_env } = self;
        if audience.trim().is_empty() {
            check.problem("audience", "must not be empty: name the service that will verify the token");
        }
        if *expiration_seconds < MIN_TOKEN_EXPIRATION_SECONDS {
            check.problem("expirationSeconds", format!(
                "is {expiration_seconds}; the apiserver refuses projected tokens under {MIN_TOKEN_EXPIRATION_SECONDS} seconds (10 minutes): use 600 or more (3600 is usual)"
            ));
        } else if *expiration_seconds > MAX_TOKEN_EXPIRATION_SECONDS {
            check.problem("expirationSeconds", format!(
                "is {expiration_seconds}; keep it at most {MAX_TOKEN_EXPIRATION_SECONDS} (48 hours): the kubelet rotates the token at 80% of its life, so short is safe"
            ));
        }
        check.relative_path("path", path);
        check.volume_name("volumeName", volume_name);
        check.mount_path("mountPath", mount_path);
        if let Some(env) = file_env {
            check.env_name("fileEnv", env);
        }
    }

    fn plan(&self, _pod: &TemplateContext<'_>) -> Result<Injection, Unresolved> {
        let item = AuditItem::new("serviceAccountToken")
            .with("audience", &self.audience)
            .with_int("expirationSeconds", self.expiration_seconds)
            .with("volume", &self.volume_name)
            .with("mountPath", &self.mount_path);
        let mut injection = Injection::new(item);
        injection.volume = Some((
            VolumeSpec {
                name: self.volume_name.clone(),
                source: Source::ServiceAccountToken {
                    audience: self.audience.clone(),
                    expiration_seconds: self.expiration_seconds,
                    path: self.path.clone(),
                },
            },
            MountSpec { volume: self.volume_name.clone(), path: self.mount_path.clone() },
        ));
        injection.env.extend(self.file_env.as_deref().map(|e| EnvSpec::file(e, &self.mount_path, &self.path)));
        Ok(injection)
    }

    fn describe(&self, _injection: &Injection) -> String {
        format!(
            "service-account token: audience {}, expires after {}s, at {}/{}",
            self.audience, self.expiration_seconds, self.mount_path, self.path
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::testing::*;
    use serde_json::json;

    #[test]
    fn a_projected_volume_with_audience_and_expiry() {
        let spec: ServiceAccountToken = yaml(
            "audience: pipelines.kubeflow.org\nexpirationSeconds: 900\nmountPath: /var/run/secrets/keyward/sa-token\nfileEnv: SA_TOKEN\n",
        );
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        assert_eq!(
            injection.volume.clone().unwrap().0.to_json(),
            json!({"name": "keyward-sa-token", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"audience": "pipelines.kubeflow.org", "expirationSeconds": 900, "path": "token"}}
            ]}})
        );
        assert_eq!(
            injection.env[0].to_json(),
            json!({"name": "SA_TOKEN", "value": "/var/run/secrets/keyward/sa-token/token"})
        );
    }

    #[test]
    fn lifetimes_and_paths_the_apiserver_refuses() {
        let spec: ServiceAccountToken = yaml("audience: \" \"\nexpirationSeconds: 599\npath: ../t\nmountPath: /m\n");
        let problems = problems(&spec);
        assert_eq!(
            problems[0],
            "spec.inject.k.audience: must not be empty: name the service that will verify the token"
        );
        assert_eq!(problems[1], "spec.inject.k.expirationSeconds: is 599; the apiserver refuses projected tokens under 600 seconds (10 minutes): use 600 or more (3600 is usual)");
        assert_eq!(problems[2], "spec.inject.k.path: must not contain a '..' segment");
    }
}
