//! One small injector per kind of credential, each a pure function from the profile's
//! settings to the volume, mount and env vars it needs, and [`apply`], which merges them into
//! a pod without ever clobbering what is there.

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EnvVar, EnvVarSource, KeyToPath, Pod, ProjectedVolumeSource, SecretKeySelector,
    SecretVolumeSource, ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use serde_json::Value;

use crate::audit::InjectedItem;
use crate::error::Error;
use crate::names::{KUBE_API_ACCESS_PREFIX, SERVICE_ACCOUNT_MOUNT_PATH};
use crate::patch::{PatchBuilder, Seg};
use crate::profile::{self, ApiToken, EnvConflictPolicy, Profile};

/// `0644`, the mode the apiserver defaults onto secret, configMap and projected volumes. We
/// write it ourselves so that a reinvocation, which sees the defaulted pod, finds our volume
/// identical to what it would inject.
const DEFAULT_MODE: i32 = 0o644;

/// What one credential needs in the pod.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Injection {
    pub volume: Volume,
    pub mount: VolumeMount,
    pub env: Vec<EnvVar>,
    pub item: InjectedItem,
}

fn read_only_mount(volume: &str, path: &str) -> VolumeMount {
    VolumeMount { name: volume.into(), mount_path: path.into(), read_only: Some(true), ..Default::default() }
}

fn file_env(name: Option<&str>, mount_path: &str, file: &str) -> Option<EnvVar> {
    name.map(|n| EnvVar { name: n.into(), value: Some(format!("{mount_path}/{file}")), value_from: None })
}

fn secret_volume(volume: &str, secret: &str, items: Option<Vec<KeyToPath>>) -> Volume {
    Volume {
        name: volume.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items,
            default_mode: Some(DEFAULT_MODE),
            optional: None,
        }),
        ..Default::default()
    }
}

fn key_item(key: &str) -> Option<Vec<KeyToPath>> {
    Some(vec![KeyToPath { key: key.into(), path: key.into(), mode: None }])
}

// === injectors ===

/// 1. The client certificate Secret (`tls.crt`, `tls.key`, maybe `ca.crt`), mounted whole.
pub(crate) fn client_certificate(spec: &profile::ClientCertificate, secret: &str) -> Injection {
    let mut env = Vec::new();
    env.extend(file_env(spec.cert_file_env.as_deref(), &spec.mount_path, "tls.crt"));
    env.extend(file_env(spec.key_file_env.as_deref(), &spec.mount_path, "tls.key"));
    Injection {
        volume: secret_volume(&spec.volume_name, secret, None),
        mount: read_only_mount(&spec.volume_name, &spec.mount_path),
        env,
        item: InjectedItem::ClientCertificate {
            secret: secret.into(),
            volume: spec.volume_name.clone(),
            mount_path: spec.mount_path.clone(),
        },
    }
}

/// 2. The server CA, from a Secret or a ConfigMap; only its one key is projected.
pub(crate) fn server_ca(spec: &profile::ServerCa, name: &str) -> Injection {
    let volume = if spec.config_map_name.is_some() {
        Volume {
            name: spec.volume_name.clone(),
            config_map: Some(ConfigMapVolumeSource {
                name: name.into(),
                items: key_item(&spec.key),
                default_mode: Some(DEFAULT_MODE),
                optional: None,
            }),
            ..Default::default()
        }
    } else {
        secret_volume(&spec.volume_name, name, key_item(&spec.key))
    };
    let is_config_map = spec.config_map_name.is_some();
    Injection {
        volume,
        mount: read_only_mount(&spec.volume_name, &spec.mount_path),
        env: file_env(spec.file_env.as_deref(), &spec.mount_path, &spec.key).into_iter().collect(),
        item: InjectedItem::ServerCa {
            secret: (!is_config_map).then(|| name.to_string()),
            config_map: is_config_map.then(|| name.to_string()),
            volume: spec.volume_name.clone(),
            mount_path: spec.mount_path.clone(),
        },
    }
}

/// 3. A token or API key: one Secret key as a file, optionally also as an env var.
pub(crate) fn token(spec: &profile::Token, secret: &str) -> Injection {
    let mut env: Vec<EnvVar> = file_env(spec.file_env.as_deref(), &spec.mount_path, &spec.key).into_iter().collect();
    if let Some(name) = &spec.value_env {
        env.push(EnvVar {
            name: name.clone(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector { name: secret.into(), key: spec.key.clone(), optional: None }),
                ..Default::default()
            }),
        });
    }
    Injection {
        volume: secret_volume(&spec.volume_name, secret, key_item(&spec.key)),
        mount: read_only_mount(&spec.volume_name, &spec.mount_path),
        env,
        item: InjectedItem::Token {
            secret: secret.into(),
            key: spec.key.clone(),
            volume: spec.volume_name.clone(),
            mount_path: spec.mount_path.clone(),
        },
    }
}

/// 4. A projected service-account token bound to an audience; the kubelet refreshes it.
pub(crate) fn service_account_token(spec: &profile::ServiceAccountToken) -> Injection {
    Injection {
        volume: Volume {
            name: spec.volume_name.clone(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(DEFAULT_MODE),
                sources: Some(vec![VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        audience: Some(spec.audience.clone()),
                        expiration_seconds: Some(spec.expiration_seconds),
                        path: spec.path.clone(),
                    }),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        },
        mount: read_only_mount(&spec.volume_name, &spec.mount_path),
        env: file_env(spec.file_env.as_deref(), &spec.mount_path, &spec.path).into_iter().collect(),
        item: InjectedItem::ServiceAccountToken {
            audience: spec.audience.clone(),
            expiration_seconds: spec.expiration_seconds,
            volume: spec.volume_name.clone(),
            mount_path: spec.mount_path.clone(),
        },
    }
}

// === merging into the pod ===

/// The containers of a pod, as (field, index, container). Init containers come first, as
/// they run first; native sidecars (`restartPolicy: Always`) are init containers.
pub(crate) fn containers(pod: &Pod) -> Vec<(&'static str, usize, &Container)> {
    let Some(spec) = &pod.spec else { return Vec::new() };
    let init = spec.init_containers.iter().flatten().enumerate().map(|(i, c)| ("initContainers", i, c));
    let main = spec.containers.iter().enumerate().map(|(i, c)| ("containers", i, c));
    init.chain(main).collect()
}

/// The result of merging: conflicts deny the pod; warnings go back to the user.
#[derive(Debug, Default)]
pub(crate) struct Merge {
    pub conflicts: Vec<String>,
    pub warnings: Vec<String>,
    pub containers: Vec<String>,
}

/// Adds every injection's volume to the pod, and its mount and env vars to each target
/// container, skipping what is already there and identical.
pub(crate) fn apply(
    profile: &Profile,
    pod: &Pod,
    injections: &[Injection],
    b: &mut PatchBuilder,
) -> Result<Merge, Error> {
    let mut merge = Merge::default();
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
    for inj in injections {
        match volumes.iter().position(|v| v.name == inj.volume.name) {
            Some(i) if normalized_volume(&volumes[i]) == normalized_volume(&inj.volume) => {}
            Some(i) => merge.conflicts.push(format!(
                "spec.volumes[{i}] is a volume named {:?} that differs from the one profile {:?} injects; rename your volume (names starting with keyward- are reserved for keyward)",
                inj.volume.name, profile.name
            )),
            None => b.push(&["spec".into()], "volumes", to_value(&inj.volume)?)?,
        }
    }

    let selected = &profile.spec.containers;
    let all = containers(pod);
    for &(field, index, container) in &all {
        if !selected.is_empty() && !selected.contains(&container.name) {
            continue;
        }
        merge.containers.push(container.name.clone());
        let at = [Seg::from("spec"), Seg::from(field), Seg::from(index)];
        let mounts = container.volume_mounts.as_deref().unwrap_or_default();
        let envs = container.env.as_deref().unwrap_or_default();
        for inj in injections {
            match mounts.iter().position(|m| m.mount_path == inj.mount.mount_path) {
                Some(i) if normalized_mount(&mounts[i]) == inj.mount => {}
                Some(i) => merge.conflicts.push(format!(
                    "container {:?} already mounts volume {:?} at {:?} (spec.{field}[{index}].volumeMounts[{i}]), where profile {:?} mounts {:?}; move that mount to another path{}",
                    container.name, mounts[i].name, inj.mount.mount_path, profile.name, inj.mount.name, container_hint(profile)
                )),
                None => b.push(&at, "volumeMounts", to_value(&inj.mount)?)?,
            }
            for var in &inj.env {
                match envs.iter().position(|e| e.name == var.name) {
                    Some(i) if normalized_env(&envs[i]) == *var => {}
                    Some(i) => {
                        let what = format!(
                            "container {:?} already sets {} (spec.{field}[{index}].env[{i}]) to {}, profile {:?} sets it to {}",
                            container.name, var.name, describe_env(&envs[i]), profile.name, describe_env(var)
                        );
                        match profile.spec.on_env_conflict {
                            EnvConflictPolicy::KeepUser => merge.warnings.push(format!("keyward: {what}; keeping the container's value")),
                            EnvConflictPolicy::Deny => merge.conflicts.push(format!(
                                "{what}; remove it from the container, or set spec.onEnvConflict: keepUser in the profile"
                            )),
                        }
                    }
                    None => b.push(&at, "env", to_value(var)?)?,
                }
            }
        }
    }
    for name in selected {
        if !all.iter().any(|(_, _, c)| &c.name == name) {
            merge.warnings.push(format!(
                "keyward: profile {:?} lists container {name:?}, which this pod does not have",
                profile.name
            ));
        }
    }
    Ok(merge)
}

fn container_hint(profile: &Profile) -> &'static str {
    if profile.spec.containers.is_empty() {
        ", or list the containers that need credentials in the profile's spec.containers"
    } else {
        ""
    }
}

fn describe_env(e: &EnvVar) -> String {
    match (&e.value, &e.value_from) {
        (_, Some(from)) => match &from.secret_key_ref {
            Some(s) => format!("secretKeyRef {}/{}", s.name, s.key),
            None => "a valueFrom reference".into(),
        },
        (Some(v), None) => crate::text::quoted(v, 64),
        (None, None) => "\"\"".into(),
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Result<Value, Error> {
    serde_json::to_value(v).map_err(|e| Error::Internal(format!("cannot serialise an injected object: {e}")))
}

/// A volume as the apiserver leaves it after defaulting, so that our own output compares equal.
fn normalized_volume(v: &Volume) -> Volume {
    let mut v = v.clone();
    if let Some(s) = &mut v.secret {
        s.default_mode.get_or_insert(DEFAULT_MODE);
    }
    if let Some(c) = &mut v.config_map {
        c.default_mode.get_or_insert(DEFAULT_MODE);
    }
    if let Some(p) = &mut v.projected {
        p.default_mode.get_or_insert(DEFAULT_MODE);
        for src in p.sources.iter_mut().flatten() {
            if let Some(t) = &mut src.service_account_token {
                t.expiration_seconds.get_or_insert(3600);
            }
        }
    }
    v
}

fn normalized_mount(m: &VolumeMount) -> VolumeMount {
    let mut m = m.clone();
    if m.sub_path.as_deref() == Some("") {
        m.sub_path = None;
    }
    if m.mount_propagation.as_deref() == Some("None") {
        m.mount_propagation = None;
    }
    m
}

fn normalized_env(e: &EnvVar) -> EnvVar {
    let mut e = e.clone();
    if e.value.as_deref() == Some("") && e.value_from.is_some() {
        e.value = None;
    }
    e
}

// === service-account swap ===

/// What the swap did, for the audit record.
#[derive(Debug, Default)]
pub(crate) struct Swap {
    /// The account the pod asked for, when it was changed.
    pub original: Option<String>,
}

/// Injector 5: runs the pod as `target`. With [`ApiToken::Remove`], also removes the API token
/// the ServiceAccount admission plugin added for the original account.
pub(crate) fn swap_service_account(
    pod: &Pod,
    target: &str,
    api_token: ApiToken,
    b: &mut PatchBuilder,
) -> Result<Swap, Error> {
    let spec = pod.spec.as_ref();
    let current = spec
        .and_then(|s| s.service_account_name.as_deref().or(s.service_account.as_deref()))
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    let mut swap = Swap::default();
    let at = [Seg::from("spec")];
    if current != target {
        swap.original = Some(current.to_string());
    }
    // Set both fields whenever either is off: the deprecated `serviceAccount` must agree.
    if spec.and_then(|s| s.service_account_name.as_deref()) != Some(target) {
        b.insert(&at, "serviceAccountName", Value::from(target))?;
    }
    if spec.and_then(|s| s.service_account.as_deref()) != Some(target) {
        b.insert(&at, "serviceAccount", Value::from(target))?;
    }
    if api_token == ApiToken::Keep {
        return Ok(swap);
    }
    if spec.and_then(|s| s.automount_service_account_token) != Some(false) {
        b.insert(&at, "automountServiceAccountToken", Value::Bool(false))?;
    }
    let removed: Vec<String> = spec
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|v| v.name.starts_with(KUBE_API_ACCESS_PREFIX))
        .map(|v| v.name.clone())
        .collect();
    // Mounts first, from the last index down, so every index stays valid as we go.
    for (field, index, container) in containers(pod).into_iter().rev() {
        let mounts = container.volume_mounts.as_deref().unwrap_or_default();
        for (i, m) in mounts.iter().enumerate().rev() {
            if m.mount_path == SERVICE_ACCOUNT_MOUNT_PATH || removed.contains(&m.name) {
                b.remove(&["spec".into(), field.into(), index.into(), "volumeMounts".into(), i.into()])?;
            }
        }
    }
    let doomed: Vec<usize> = b
        .get(&["spec".into(), "volumes".into()])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, v)| v.get("name").and_then(Value::as_str).is_some_and(|n| removed.iter().any(|r| r == n)))
        .map(|(i, _)| i)
        .collect();
    for i in doomed.into_iter().rev() {
        b.remove(&["spec".into(), "volumes".into(), i.into()])?;
    }
    Ok(swap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn client() -> profile::ClientCertificate {
        serde_yaml::from_str(
            "secretName: x\nmountPath: /var/run/secrets/keyward/client\ncertFileEnv: CERT\nkeyFileEnv: KEY\n",
        )
        .unwrap()
    }

    #[test]
    fn client_certificate_mounts_the_secret_whole_with_file_env() {
        let inj = client_certificate(&client(), "eval-7-keyward-client");
        assert_eq!(
            serde_json::to_value(&inj.volume).unwrap(),
            json!({"name": "keyward-client-cert", "secret": {"secretName": "eval-7-keyward-client", "defaultMode": 420}})
        );
        assert_eq!(
            serde_json::to_value(&inj.mount).unwrap(),
            json!({"name": "keyward-client-cert", "mountPath": "/var/run/secrets/keyward/client", "readOnly": true})
        );
        assert_eq!(
            serde_json::to_value(&inj.env).unwrap(),
            json!([
                {"name": "CERT", "value": "/var/run/secrets/keyward/client/tls.crt"},
                {"name": "KEY", "value": "/var/run/secrets/keyward/client/tls.key"}
            ])
        );
    }

    #[test]
    fn server_ca_from_config_map_or_secret_projects_one_key() {
        let spec: profile::ServerCa =
            serde_yaml::from_str("configMapName: ca\nmountPath: /etc/keyward/ca\nfileEnv: CA\n").unwrap();
        let inj = server_ca(&spec, "ca");
        assert_eq!(
            serde_json::to_value(&inj.volume).unwrap(),
            json!({"name": "keyward-server-ca", "configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}], "defaultMode": 420}})
        );
        assert_eq!(serde_json::to_value(&inj.env).unwrap(), json!([{"name": "CA", "value": "/etc/keyward/ca/ca.crt"}]));
        let spec: profile::ServerCa =
            serde_yaml::from_str("secretName: ca\nkey: root.pem\nmountPath: /etc/keyward/ca\n").unwrap();
        let inj = server_ca(&spec, "ca");
        assert_eq!(
            serde_json::to_value(&inj.volume).unwrap(),
            json!({"name": "keyward-server-ca", "secret": {"secretName": "ca", "items": [{"key": "root.pem", "path": "root.pem"}], "defaultMode": 420}})
        );
        assert!(inj.env.is_empty());
    }

    #[test]
    fn token_as_file_and_secret_key_ref_env() {
        let spec: profile::Token = serde_yaml::from_str(
            "secretName: k\nkey: api-key\nmountPath: /var/run/secrets/keyward/token\nfileEnv: TOKEN_FILE\nvalueEnv: TOKEN\n",
        )
        .unwrap();
        let inj = token(&spec, "job-1-token");
        assert_eq!(
            serde_json::to_value(&inj.volume).unwrap(),
            json!({"name": "keyward-token", "secret": {"secretName": "job-1-token", "items": [{"key": "api-key", "path": "api-key"}], "defaultMode": 420}})
        );
        assert_eq!(
            serde_json::to_value(&inj.env).unwrap(),
            json!([
                {"name": "TOKEN_FILE", "value": "/var/run/secrets/keyward/token/api-key"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "job-1-token", "key": "api-key"}}}
            ])
        );
    }

    #[test]
    fn service_account_token_is_a_projected_volume_with_audience_and_expiry() {
        let spec: profile::ServiceAccountToken = serde_yaml::from_str(
            "audience: keyward.io/control-plane\nexpirationSeconds: 900\nmountPath: /var/run/secrets/keyward/sa-token\nfileEnv: SA_TOKEN\n",
        )
        .unwrap();
        let inj = service_account_token(&spec);
        assert_eq!(
            serde_json::to_value(&inj.volume).unwrap(),
            json!({"name": "keyward-sa-token", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"audience": "keyward.io/control-plane", "expirationSeconds": 900, "path": "token"}}
            ]}})
        );
        assert_eq!(
            serde_json::to_value(&inj.env).unwrap(),
            json!([{"name": "SA_TOKEN", "value": "/var/run/secrets/keyward/sa-token/token"}])
        );
    }

    #[test]
    fn defaulted_volume_compares_equal_to_ours() {
        let ours = client_certificate(&client(), "s").volume;
        let mut theirs = ours.clone();
        if let Some(s) = &mut theirs.secret {
            s.default_mode = None;
        }
        assert_eq!(normalized_volume(&theirs), normalized_volume(&ours));
        theirs.secret.as_mut().unwrap().secret_name = Some("other".into());
        assert_ne!(normalized_volume(&theirs), normalized_volume(&ours));
    }
}
