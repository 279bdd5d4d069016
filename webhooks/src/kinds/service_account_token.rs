//! A projected service-account token bound to an audience, with an expiry; the kubelet rotates
//! it. A profile that says how often the token's reader re-reads the file gets a lifetime the
//! reader never outlives ([`crate::rotation`]), checked on load.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{
    AuditItem, Check, EnvSpec, Injection, MountSpec, Source, Unresolved, VolumeSpec, DEFAULT_TOKEN_EXPIRATION_SECONDS,
    MAX_TOKEN_EXPIRATION_SECONDS, MIN_TOKEN_EXPIRATION_SECONDS,
};
use crate::names::TemplateContext;
use crate::rotation::Rotation;

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
    /// How often the program that reads the token re-reads the file, in seconds (from its
    /// upstream code). With it, a lifetime under which that program can hold an expired token
    /// is refused, and a token volume of the same name that the pod already declares with
    /// another lifetime gets this one instead of being a conflict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reader_refresh_seconds: Option<i64>,
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
        let Self { audience, expiration_seconds, path, volume_name, mount_path, file_env, reader_refresh_seconds } =
            self;
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
        if let Some(reader) = *reader_refresh_seconds {
            check_reader(check, *expiration_seconds, reader);
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
        injection.token_reader_seconds = self.reader_refresh_seconds;
        Ok(injection)
    }

    fn describe(&self, _injection: &Injection) -> String {
        let mut line = format!(
            "service-account token: audience {}, expires after {}s, at {}/{}",
            self.audience, self.expiration_seconds, self.mount_path, self.path
        );
        if let Some(rotation) = self.rotation() {
            line.push_str(&format!("; {rotation}"));
        }
        line
    }
}

impl ServiceAccountToken {
    /// The token's lifetime against its reader, when the profile names the reader's interval.
    pub fn rotation(&self) -> Option<Rotation> {
        self.reader_refresh_seconds.map(|reader| Rotation::new(self.expiration_seconds, reader))
    }
}

/// A reader interval that makes sense, and a lifetime it never outlives.
fn check_reader(check: &mut Check, lifetime: i64, reader: i64) {
    if reader < 1 {
        check.problem(
            "readerRefreshSeconds",
            format!("is {reader}; give the interval, in seconds, at which the program re-reads the token file"),
        );
        return;
    }
    let rotation = Rotation::new(lifetime, reader);
    if !rotation.fits() {
        let fix = match rotation.shortest_lifetime() {
            shortest if shortest <= MAX_TOKEN_EXPIRATION_SECONDS => {
                format!("use expirationSeconds: {shortest} or more")
            }
            _ => format!("no lifetime up to {MAX_TOKEN_EXPIRATION_SECONDS} s outlasts that reader"),
        };
        let faster = match rotation.longest_reader() {
            longest if longest > 0 => format!(", or make the program re-read it at least every {longest} s"),
            _ => String::new(),
        };
        check.problem("expirationSeconds", format!("{rotation}: {fix}{faster}"));
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

    /// kubeflow/pipelines #13290: an hour-long token for a reader that re-reads it hourly.
    #[test]
    fn a_lifetime_its_reader_outlives_is_refused_with_the_numbers_and_the_fix() {
        let spec: ServiceAccountToken =
            yaml("audience: a\nexpirationSeconds: 3600\nreaderRefreshSeconds: 3600\nmountPath: /m\n");
        assert_eq!(
            problems(&spec),
            ["spec.inject.k.expirationSeconds: lives 3600 s; the kubelet asks for the next at 2880 s (80% of its life, at most 24 h) and the file has it by 3000 s (+120 s); the reader re-reads every 3600 s, so it can hold an expired token for up to 3000 s of every 3600 s: use expirationSeconds: 18600 or more, or make the program re-read it at least every 600 s"]
        );
        let spec: ServiceAccountToken =
            yaml("audience: a\nexpirationSeconds: 18600\nreaderRefreshSeconds: 3600\nmountPath: /m\n");
        assert_eq!(problems(&spec), Vec::<String>::new());
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        assert_eq!(injection.token_reader_seconds, Some(3600));
        assert!(
            spec.describe(&injection)
                .ends_with("the reader re-reads every 3600 s, so it never holds an expired token (0 s to spare)"),
            "{}",
            spec.describe(&injection)
        );
        // No lifetime the apiserver issues by default outlasts a reader slower than a day.
        let spec: ServiceAccountToken =
            yaml("audience: a\nexpirationSeconds: 172800\nreaderRefreshSeconds: 90000\nmountPath: /m\n");
        assert!(
            problems(&spec)[0]
                .ends_with(": no lifetime up to 172800 s outlasts that reader, or make the program re-read it at least every 86280 s"),
            "{:?}",
            problems(&spec)
        );
        let spec: ServiceAccountToken = yaml("audience: a\nreaderRefreshSeconds: 0\nmountPath: /m\n");
        assert_eq!(
            problems(&spec),
            ["spec.inject.k.readerRefreshSeconds: is 0; give the interval, in seconds, at which the program re-reads the token file"]
        );
    }
}
