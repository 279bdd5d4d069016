//! What an admission attestation binds of the pod: what it runs and what it mounts, so that the
//! attestation of one pod buys nothing on a pod that runs or mounts anything else.
//!
//! The binding is a SHA-256 digest of a canonical view of the pod's `spec`, computed by the
//! webhook on the pod it admits and by the controller on the pod as stored. Both must get the
//! same bytes, so the view leaves out what changes between the two for reasons that have
//! nothing to do with what the pod runs:
//!
//! - keyward's own injection (its volumes and their mounts, its env vars, the API token it
//!   removes, the account it swaps to): the webhook sees the pod before its patch, the
//!   controller after it and after the apiserver's defaulting. The controller's re-decision
//!   already holds those to exactly what the profile injects; the binding covers the rest.
//! - what the scheduler, the kubelet and the in-tree admission plugins set or change (node,
//!   scheduling, resources, pull policy and secrets, DNS, ports, priority, tolerations), and
//!   HTTP, TCP and gRPC probes (they run no code in the pod; service meshes rewrite them).
//!
//! Bound, in every init container and container: `name`, `image`, `command`, `args`,
//! `workingDir`, `env`, `envFrom`, `volumeMounts`, `volumeDevices`, `securityContext`,
//! `restartPolicy`, and the `exec` commands of its probes and lifecycle hooks (they run in
//! the container, with its credentials). For the pod: `volumes`, `serviceAccountName`,
//! `automountServiceAccountToken`, `securityContext`, `hostNetwork`, `hostPID`, `hostIPC`,
//! `hostUsers` and `shareProcessNamespace`. Ephemeral containers cannot be set on create; who
//! may add them may exec into the pod, which Kubernetes trusts as it trusts the pod.
//!
//! The view is canonical JSON: object keys sorted, `null` and empty-list members dropped
//! (Kubernetes reads them as absent, and the apiserver writes neither), arrays in order (order matters for containers, mounts and env vars). Its
//! size and depth are those of the spec, which the request body and the JSON parser bound.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::inject::{ApiToken, EnvSpec, Injection};
use crate::names::{KUBE_API_ACCESS_PREFIX, SERVICE_ACCOUNT_MOUNT_PATH};

/// The pod fields bound as they are (besides `volumes`, the containers and the account).
const POD_FIELDS: [&str; 6] =
    ["securityContext", "hostNetwork", "hostPID", "hostIPC", "hostUsers", "shareProcessNamespace"];
/// The container fields bound as they are (besides `volumeMounts` and `env`, filtered).
const CONTAINER_FIELDS: [&str; 9] =
    ["name", "image", "command", "args", "workingDir", "envFrom", "volumeDevices", "securityContext", "restartPolicy"];
/// The probes whose `exec` command is bound.
const PROBES: [&str; 3] = ["livenessProbe", "readinessProbe", "startupProbe"];
/// The lifecycle hooks whose `exec` command is bound.
const HOOKS: [&str; 2] = ["postStart", "preStop"];

/// A binding: the SHA-256 of the canonical view.
pub type Digest32 = [u8; 32];

/// What keyward's injection puts on or takes off the pod: left out of the view.
#[derive(Debug, Clone, Default)]
pub struct Masks<'a> {
    volumes: Vec<&'a str>,
    env: Vec<&'a EnvSpec>,
    /// The account the pod runs as after the patch, when the profile swaps it.
    service_account: Option<&'a str>,
    /// The profile removes the Kubernetes API token (its volumes, mounts and automount).
    removes_api_token: bool,
}

impl<'a> Masks<'a> {
    /// The masks of a profile's injections for one pod.
    pub fn of(injections: &'a [(&'static str, Injection)]) -> Self {
        let mut masks = Self::default();
        for (_, injection) in injections {
            if let Some((volume, _)) = &injection.volume {
                masks.volumes.push(&volume.name);
            }
            masks.env.extend(injection.env.iter());
            if let Some(account) = &injection.service_account {
                masks.service_account = Some(account);
            }
            masks.removes_api_token |= injection.api_token == ApiToken::Remove;
        }
        masks
    }

    fn masks_volume(&self, volume: &Value) -> bool {
        let name = volume.get("name").and_then(Value::as_str).unwrap_or_default();
        self.volumes.contains(&name)
            || (self.removes_api_token && (name.starts_with(KUBE_API_ACCESS_PREFIX) || projects_an_api_token(volume)))
    }

    fn masks_env(&self, env: &Value) -> bool {
        let name = env.get("name").and_then(Value::as_str).unwrap_or_default();
        self.env.iter().any(|ours| ours.name == name && crate::plan::same_env_value(env, ours))
    }
}

/// The binding of a pod's `spec` (raw JSON), under `masks`. `Err`: the spec is not JSON.
pub fn of_raw(spec: Option<&serde_json::value::RawValue>, masks: &Masks<'_>) -> Result<Digest32, String> {
    let spec: Value = match spec {
        Some(raw) => serde_json::from_str(raw.get()).map_err(|e| format!("spec: {e}"))?,
        None => Value::Null,
    };
    Ok(digest(&view(&spec, masks)))
}

/// The SHA-256 of `view`'s canonical JSON.
pub fn digest(view: &Value) -> Digest32 {
    let mut bytes = Vec::with_capacity(1024);
    canonical(view, &mut bytes);
    Sha256::digest(&bytes).into()
}

/// The bound view of a pod's `spec`: what the binding is the digest of.
pub fn view(spec: &Value, masks: &Masks<'_>) -> Value {
    let mut out = Map::new();
    let Some(spec) = spec.as_object() else {
        return Value::Null;
    };
    for field in POD_FIELDS {
        copy(spec, &mut out, field);
    }
    // The account after the patch: the swap target, else the pod's (the ServiceAccount plugin
    // writes `default` when none is given, before any webhook).
    let account = match masks.service_account {
        Some(target) => target,
        None => spec.get("serviceAccountName").and_then(Value::as_str).filter(|s| !s.is_empty()).unwrap_or("default"),
    };
    out.insert("serviceAccountName".into(), Value::from(account));
    if masks.removes_api_token {
        out.insert("automountServiceAccountToken".into(), Value::Bool(false));
    } else {
        copy(spec, &mut out, "automountServiceAccountToken");
    }
    // The volumes the masks leave, and their names: a mount of any other is keyward's.
    let mut kept_volumes = Vec::new();
    let mut masked_names: Vec<&str> = Vec::new();
    match spec.get("volumes") {
        Some(Value::Array(volumes)) => {
            for volume in volumes {
                if masks.masks_volume(volume) {
                    masked_names.extend(volume.get("name").and_then(Value::as_str));
                } else {
                    kept_volumes.push(volume.clone());
                }
            }
            out.insert("volumes".into(), Value::Array(kept_volumes));
        }
        Some(other) => {
            out.insert("volumes".into(), other.clone());
        }
        None => {}
    }
    for list in ["initContainers", "containers"] {
        match spec.get(list) {
            Some(Value::Array(containers)) => {
                let containers = containers.iter().map(|c| container(c, masks, &masked_names)).collect();
                out.insert(list.into(), Value::Array(containers));
            }
            Some(other) => {
                out.insert(list.into(), other.clone());
            }
            None => {}
        }
    }
    Value::Object(out)
}

fn container(c: &Value, masks: &Masks<'_>, masked_volumes: &[&str]) -> Value {
    let Some(c) = c.as_object() else { return c.clone() };
    let mut out = Map::new();
    for field in CONTAINER_FIELDS {
        copy(c, &mut out, field);
    }
    if let Some(mounts) = c.get("volumeMounts") {
        out.insert(
            "volumeMounts".into(),
            filtered(mounts, |m| {
                let volume = m.get("name").and_then(Value::as_str).unwrap_or_default();
                let path = m.get("mountPath").and_then(Value::as_str).unwrap_or_default();
                masked_volumes.contains(&volume) || (masks.removes_api_token && path == SERVICE_ACCOUNT_MOUNT_PATH)
            }),
        );
    }
    if let Some(env) = c.get("env") {
        out.insert("env".into(), filtered(env, |e| masks.masks_env(e)));
    }
    for probe in PROBES {
        if let Some(exec) = c.get(probe).and_then(|p| p.get("exec")) {
            out.insert(format!("{probe}.exec"), exec.clone());
        }
    }
    for hook in HOOKS {
        if let Some(exec) = c.get("lifecycle").and_then(|l| l.get(hook)).and_then(|h| h.get("exec")) {
            out.insert(format!("lifecycle.{hook}.exec"), exec.clone());
        }
    }
    Value::Object(out)
}

/// `items` without those `masked` says are keyward's (a non-array is kept as it is).
fn filtered(items: &Value, masked: impl Fn(&Value) -> bool) -> Value {
    match items {
        Value::Array(items) => Value::Array(items.iter().filter(|i| !masked(i)).cloned().collect()),
        other => other.clone(),
    }
}

fn copy(from: &Map<String, Value>, to: &mut Map<String, Value>, field: &str) {
    if let Some(value) = from.get(field) {
        to.insert(field.into(), value.clone());
    }
}

/// Whether a volume projects a service account token for no audience (the API server's): the
/// volumes keyward removes with the API token, besides `kube-api-access-*`.
fn projects_an_api_token(volume: &Value) -> bool {
    volume.pointer("/projected/sources").and_then(Value::as_array).into_iter().flatten().any(|source| {
        source
            .get("serviceAccountToken")
            .is_some_and(|t| t.get("audience").and_then(Value::as_str).is_none_or(str::is_empty))
    })
}

/// Canonical JSON: keys sorted, `null` and `[]` members left out, no whitespace. Strings and numbers as
/// serde_json writes them (the same on both sides: both parse JSON text).
fn canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.iter().filter(|(_, v)| !absent(v)).map(|(k, _)| k).collect();
            keys.sort_unstable();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                scalar(&Value::String(key.clone()), out);
                out.push(b':');
                canonical(&map[key], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        other => scalar(other, out),
    }
}

/// `null` and `[]` read as absent: Kubernetes treats them so, and the apiserver writes neither
/// (`omitempty`), while a masked list can end up empty.
fn absent(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

fn scalar(value: &Value, out: &mut Vec<u8>) {
    // Writing a scalar into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::{AuditItem, EnvValue, MountSpec, Source, VolumeSpec};
    use serde_json::json;

    fn text(v: &Value) -> String {
        let mut out = Vec::new();
        canonical(v, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn canonical_json_sorts_keys_and_drops_nulls_and_empty_lists_only() {
        let v = json!({"b": [2, {"z": null, "y": "é\"\n"}, []], "a": {}, "c": false, "d": "", "e": [], "f": 0});
        assert_eq!(text(&v), r#"{"a":{},"b":[2,{"y":"é\"\n"},[]],"c":false,"d":"","f":0}"#);
    }

    fn injection() -> Vec<(&'static str, Injection)> {
        let mut i = Injection::new(AuditItem::new("clientCertificate"));
        i.volume = Some((
            VolumeSpec { name: "keyward-cert".into(), source: Source::Secret { name: "s".into(), keys: None } },
            MountSpec { volume: "keyward-cert".into(), path: "/var/run/keyward".into() },
        ));
        i.env = vec![EnvSpec { name: "CERT".into(), value: EnvValue::Value("/var/run/keyward/tls.crt".into()) }];
        i.service_account = Some("job-runner".into());
        i.api_token = ApiToken::Remove;
        vec![("clientCertificate", i)]
    }

    /// A change to a pod, named.
    type Change = (&'static str, fn(&mut Value));

    fn pod() -> Value {
        json!({
            "serviceAccountName": "default", "nodeName": "n1", "dnsPolicy": "ClusterFirst",
            "volumes": [
                {"name": "kube-api-access-x2x", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
                {"name": "data", "emptyDir": {}},
            ],
            "containers": [{
                "name": "main", "image": "quay.io/op/driver:1", "command": ["/bin/driver"],
                "imagePullPolicy": "IfNotPresent", "resources": {"limits": {"cpu": "1"}},
                "volumeMounts": [
                    {"name": "kube-api-access-x2x", "mountPath": SERVICE_ACCOUNT_MOUNT_PATH, "readOnly": true},
                    {"name": "data", "mountPath": "/data"},
                ],
                "env": [{"name": "MODE", "value": "eval"}],
                "livenessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 10},
                "readinessProbe": {"exec": {"command": ["true"]}},
            }]
        })
    }

    #[test]
    fn the_view_keeps_what_runs_and_mounts_and_masks_keywards_own() {
        let injections = injection();
        let masks = Masks::of(&injections);
        let view = view(&pod(), &masks);
        assert_eq!(
            view,
            json!({
                "serviceAccountName": "job-runner", "automountServiceAccountToken": false,
                "volumes": [{"name": "data", "emptyDir": {}}],
                "containers": [{
                    "name": "main", "image": "quay.io/op/driver:1", "command": ["/bin/driver"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "env": [{"name": "MODE", "value": "eval"}],
                    "readinessProbe.exec": {"command": ["true"]},
                }]
            })
        );
    }

    #[test]
    fn the_pod_as_patched_and_stored_binds_the_same_as_the_pod_admitted() {
        let injections = injection();
        let masks = Masks::of(&injections);
        let before = pod();
        // After keyward's patch and the apiserver's defaulting: the token gone, keyward's
        // volume, mount and env var in, the account swapped, node and resources changed.
        let mut after = pod();
        after["serviceAccountName"] = json!("job-runner");
        after["serviceAccount"] = json!("job-runner");
        after["automountServiceAccountToken"] = json!(false);
        after["nodeName"] = json!("n7");
        after["volumes"] = json!([{"name": "data", "emptyDir": {}}, {"name": "keyward-cert", "secret": {"secretName": "s", "defaultMode": 420}}]);
        let c = &mut after["containers"][0];
        c["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}, {"name": "keyward-cert", "mountPath": "/var/run/keyward", "readOnly": true}]);
        c["env"] = json!([{"name": "MODE", "value": "eval"}, {"name": "CERT", "value": "/var/run/keyward/tls.crt"}]);
        c["resources"] = json!({"limits": {"cpu": "2"}});
        c["livenessProbe"] = json!({"httpGet": {"path": "/app-health/main/livez", "port": 15020}});
        assert_eq!(digest(&view(&before, &masks)), digest(&view(&after, &masks)));
    }

    #[test]
    fn anything_else_a_pod_runs_or_mounts_changes_the_binding() {
        let injections = injection();
        let masks = Masks::of(&injections);
        let bound = digest(&view(&pod(), &masks));
        let changes: [Change; 12] = [
            ("image", |p| p["containers"][0]["image"] = json!("evil:1")),
            ("command", |p| p["containers"][0]["command"] = json!(["/bin/sh"])),
            ("args", |p| p["containers"][0]["args"] = json!(["-c", "cat /var/run/keyward/tls.key"])),
            ("env", |p| p["containers"][0]["env"][0]["value"] = json!("other")),
            ("an env var of keyward's name with another value", |p| {
                p["containers"][0]["env"] =
                    json!([{"name": "MODE", "value": "eval"}, {"name": "CERT", "value": "/tmp/x"}])
            }),
            ("a volume", |p| p["volumes"][1] = json!({"name": "data", "hostPath": {"path": "/"}})),
            ("a mount", |p| p["containers"][0]["volumeMounts"][1]["mountPath"] = json!("/usr/bin")),
            ("an exec probe", |p| p["containers"][0]["readinessProbe"]["exec"]["command"] = json!(["sh", "-c", "x"])),
            ("a lifecycle hook", |p| {
                p["containers"][0]["lifecycle"] = json!({"postStart": {"exec": {"command": ["x"]}}})
            }),
            ("a sidecar", |p| p["initContainers"] = json!([{"name": "s", "image": "evil", "restartPolicy": "Always"}])),
            ("host PID", |p| p["hostPID"] = json!(true)),
            ("privileged", |p| p["containers"][0]["securityContext"] = json!({"privileged": true})),
        ];
        for (what, change) in changes {
            let mut p = pod();
            change(&mut p);
            assert_ne!(digest(&view(&p, &masks)), bound, "{what}");
        }
        // Without a swap, the account the pod runs as is bound too.
        let none: Vec<(&'static str, Injection)> = Vec::new();
        let plain = Masks::of(&none);
        let mut p = pod();
        p["serviceAccountName"] = json!("builder");
        assert_ne!(digest(&view(&p, &plain)), digest(&view(&pod(), &plain)));
        // A volume named like the API token's is the API token's only when the profile removes it.
        let mut p = pod();
        p["volumes"][0] = json!({"name": "kube-api-access-x2x", "hostPath": {"path": "/"}});
        assert_ne!(digest(&view(&p, &plain)), digest(&view(&pod(), &plain)));
    }
}
