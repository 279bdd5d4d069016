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

use std::borrow::Cow;

use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::inject::{ApiToken, EnvSpec, Injection};
use crate::names::{KUBE_API_ACCESS_PREFIX, SERVICE_ACCOUNT_MOUNT_PATH};
use crate::tree::{self, Node, ReadError, CONTAINER_FIELDS, EXEC_HANDLERS, HOST_FIELDS};

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

    fn masks_volume(&self, volume: &Node<'_>) -> bool {
        let name = volume.get("name").and_then(Node::as_str).unwrap_or_default();
        self.volumes.contains(&name)
            || (self.removes_api_token && (name.starts_with(KUBE_API_ACCESS_PREFIX) || projects_an_api_token(volume)))
    }

    fn masks_mount(&self, mount: &Node<'_>, masked_volumes: &[&str]) -> bool {
        let volume = mount.get("name").and_then(Node::as_str).unwrap_or_default();
        let path = mount.get("mountPath").and_then(Node::as_str).unwrap_or_default();
        masked_volumes.contains(&volume) || (self.removes_api_token && path == SERVICE_ACCOUNT_MOUNT_PATH)
    }

    /// An env var of keyward's, exactly as keyward injects it (one of the pod's own of that
    /// name and another value stays bound). Only env vars of keyward's names are compared.
    fn masks_env(&self, env: &Node<'_>) -> bool {
        let name = env.get("name").and_then(Node::as_str).unwrap_or_default();
        let mut ours = self.env.iter().filter(|e| e.name == name).peekable();
        if ours.peek().is_none() {
            return false;
        }
        let theirs = env.to_value();
        ours.any(|e| crate::inject::same_env_value(&theirs, e))
    }
}

/// The binding of a pod's `spec` (raw JSON), under `masks`. `Err`: the spec is not JSON.
pub fn of_raw(spec: Option<&RawValue>, masks: &Masks<'_>) -> Result<Digest32, String> {
    Ok(Sha256::digest(canonical_view(spec, masks)?).into())
}

/// The binding of a pod's `spec` already read into a tree ([`tree::read_spec`]).
pub(crate) fn of_tree(spec: &Node<'_>, masks: &Masks<'_>) -> Digest32 {
    let mut out = Vec::with_capacity(spec_len_hint(spec.len_hint()));
    view(spec, masks, &mut out);
    Sha256::digest(out).into()
}

/// The canonical JSON of the bound view of a pod's `spec` (raw JSON), under `masks`: the bytes
/// the binding is the digest of.
pub fn canonical_view(spec: Option<&RawValue>, masks: &Masks<'_>) -> Result<Vec<u8>, String> {
    // Within the tree's budget: the webhook refuses to attest a larger spec, so no pod it
    // admitted has one, and a hostile one costs no more memory here than there.
    let spec = match spec {
        Some(raw) => match tree::read_spec(raw, tree::MAX_SPEC_VALUES) {
            Ok(spec) => spec,
            Err(ReadError::Json(e)) => return Err(format!("spec: {e}")),
            Err(ReadError::TooLarge) => return Err(tree::too_large_message()),
        },
        None => Node::Null,
    };
    let mut out = Vec::with_capacity(spec_len_hint(spec.len_hint()));
    view(&spec, masks, &mut out);
    Ok(out)
}

fn spec_len_hint(n: usize) -> usize {
    (n * 48).clamp(256, 64 * 1024)
}

/// Writes the view of `spec` as canonical JSON: an object with the view's keys in sorted order.
fn view(spec: &Node<'_>, masks: &Masks<'_>, out: &mut Vec<u8>) {
    if !matches!(spec, Node::Object(_)) {
        out.extend_from_slice(b"null");
        return;
    }
    let mut object = ObjectWriter::new(out);
    // The account after the patch: the swap target, else the pod's (the ServiceAccount plugin
    // writes `default` when none is given, before any webhook).
    if masks.removes_api_token {
        object.entry("automountServiceAccountToken", |out| out.extend_from_slice(b"false"));
    } else if let Some(v) = spec.get("automountServiceAccountToken").filter(|v| !v.absent()) {
        object.entry("automountServiceAccountToken", |out| canonical(v, out));
    }
    // The volumes the masks leave, and the names of those they take: a mount of one is keyward's.
    let masked_volumes: Vec<&str> = match spec.get("volumes") {
        Some(Node::Array(volumes)) => volumes
            .iter()
            .filter(|v| masks.masks_volume(v))
            .filter_map(|v| v.get("name").and_then(Node::as_str))
            .collect(),
        _ => Vec::new(),
    };
    containers(&mut object, spec.get("containers"), "containers", masks, &masked_volumes);
    for field in HOST_FIELDS {
        if let Some(v) = spec.get(field).filter(|v| !v.absent()) {
            object.entry(field, |out| canonical(v, out));
        }
    }
    containers(&mut object, spec.get("initContainers"), "initContainers", masks, &masked_volumes);
    if let Some(v) = spec.get("securityContext").filter(|v| !v.absent()) {
        object.entry("securityContext", |out| canonical(v, out));
    }
    let account = match masks.service_account {
        Some(target) => target,
        None => spec.get("serviceAccountName").and_then(Node::as_str).filter(|s| !s.is_empty()).unwrap_or("default"),
    };
    object.entry("serviceAccountName", |out| string(account, out));
    if let Some(v) = spec.get("shareProcessNamespace").filter(|v| !v.absent()) {
        object.entry("shareProcessNamespace", |out| canonical(v, out));
    }
    if let Some(volumes) = spec.get("volumes") {
        filtered(&mut object, "volumes", volumes, |v| masks.masks_volume(v));
    }
    object.finish();
}

fn containers(
    object: &mut ObjectWriter<'_>,
    list: Option<&Node<'_>>,
    key: &str,
    masks: &Masks<'_>,
    masked_volumes: &[&str],
) {
    match list {
        Some(Node::Array(items)) if !items.is_empty() => {
            object.entry(key, |out| array(items, out, |c, out| container(c, masks, masked_volumes, out)))
        }
        Some(other) if !other.absent() && !matches!(other, Node::Array(_)) => {
            object.entry(key, |out| canonical(other, out))
        }
        _ => {}
    }
}

/// One container's view, keys in sorted order.
fn container(c: &Node<'_>, masks: &Masks<'_>, masked_volumes: &[&str], out: &mut Vec<u8>) {
    if !matches!(c, Node::Object(_)) {
        canonical(c, out);
        return;
    }
    let mut object = ObjectWriter::new(out);
    let plain = |object: &mut ObjectWriter<'_>, field: &str| {
        if let Some(v) = c.get(field).filter(|v| !v.absent()) {
            object.entry(field, |out| canonical(v, out));
        }
    };
    // In sorted order: args, command, env, envFrom, image, lifecycle.*, livenessProbe.exec,
    // name, readinessProbe.exec, restartPolicy, securityContext, startupProbe.exec,
    // volumeDevices, volumeMounts, workingDir.
    plain(&mut object, CONTAINER_FIELDS[0]);
    plain(&mut object, CONTAINER_FIELDS[1]);
    if let Some(env) = c.get("env") {
        filtered(&mut object, "env", env, |e| masks.masks_env(e));
    }
    plain(&mut object, CONTAINER_FIELDS[2]);
    plain(&mut object, CONTAINER_FIELDS[3]);
    let exec = |object: &mut ObjectWriter<'_>, (key, at, hook): (&str, &str, Option<&str>)| {
        let handler = match hook {
            Some(hook) => c.get(at).and_then(|l| l.get(hook)),
            None => c.get(at),
        };
        if let Some(v) = handler.and_then(|h| h.get("exec")).filter(|v| !v.absent()) {
            object.entry(key, |out| canonical(v, out));
        }
    };
    exec(&mut object, EXEC_HANDLERS[0]);
    exec(&mut object, EXEC_HANDLERS[1]);
    exec(&mut object, EXEC_HANDLERS[2]);
    plain(&mut object, CONTAINER_FIELDS[4]);
    exec(&mut object, EXEC_HANDLERS[3]);
    plain(&mut object, CONTAINER_FIELDS[5]);
    plain(&mut object, CONTAINER_FIELDS[6]);
    exec(&mut object, EXEC_HANDLERS[4]);
    plain(&mut object, CONTAINER_FIELDS[7]);
    if let Some(mounts) = c.get("volumeMounts") {
        filtered(&mut object, "volumeMounts", mounts, |m| masks.masks_mount(m, masked_volumes));
    }
    plain(&mut object, CONTAINER_FIELDS[8]);
    object.finish();
}

/// `items` under `key`, without those `masked` says are keyward's; an empty list is absent. A
/// non-array is written as it is.
fn filtered(object: &mut ObjectWriter<'_>, key: &str, items: &Node<'_>, masked: impl Fn(&Node<'_>) -> bool) {
    match items {
        Node::Array(items) => {
            let kept: Vec<&Node<'_>> = items.iter().filter(|i| !masked(i)).collect();
            if !kept.is_empty() {
                object.entry(key, |out| array(kept, out, canonical));
            }
        }
        other if !other.absent() => object.entry(key, |out| canonical(other, out)),
        _ => {}
    }
}

/// Whether a volume projects a service account token for no audience (the API server's): the
/// volumes keyward removes with the API token, besides `kube-api-access-*`.
fn projects_an_api_token(volume: &Node<'_>) -> bool {
    let sources = volume.get("projected").and_then(|p| p.get("sources"));
    let Some(Node::Array(sources)) = sources else { return false };
    sources.iter().any(|source| {
        source
            .get("serviceAccountToken")
            .is_some_and(|t| t.get("audience").and_then(Node::as_str).is_none_or(str::is_empty))
    })
}

// === canonical JSON ===

/// An object being written: its entries must come in sorted key order (the callers write them
/// so); it knows whether a comma is due.
struct ObjectWriter<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl<'o> ObjectWriter<'o> {
    fn new(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        Self { out, first: true }
    }

    fn entry(&mut self, key: &str, value: impl FnOnce(&mut Vec<u8>)) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        string(key, self.out);
        self.out.push(b':');
        value(self.out);
    }

    fn finish(self) {
        self.out.push(b'}');
    }
}

/// Canonical JSON: keys sorted (the last of duplicates kept, as a JSON decoder keeps it),
/// `null` and `[]` members left out, no whitespace; strings and numbers as serde_json writes
/// them (both sides decode JSON text and write it again, so an escape one encoder uses and the
/// other does not makes no difference).
fn canonical(node: &Node<'_>, out: &mut Vec<u8>) {
    match node {
        Node::Null => out.extend_from_slice(b"null"),
        Node::Bool(true) => out.extend_from_slice(b"true"),
        Node::Bool(false) => out.extend_from_slice(b"false"),
        Node::Number(n) => {
            // Writing a number into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, n);
        }
        Node::Str(s) => string(s, out),
        Node::Array(items) => array(items, out, canonical),
        Node::Object(entries) => {
            let mut sorted: Vec<(usize, &(Cow<'_, str>, Node<'_>))> = entries.iter().enumerate().collect();
            // By key, then by position, so the last of equal keys is the last of its run.
            sorted.sort_by(|(i, a), (j, b)| a.0.cmp(&b.0).then(i.cmp(j)));
            let mut object = ObjectWriter::new(out);
            for (n, (_, (key, value))) in sorted.iter().enumerate() {
                let superseded = sorted.get(n + 1).is_some_and(|(_, (next, _))| next == key);
                if superseded || value.absent() {
                    continue;
                }
                object.entry(key, |out| canonical(value, out));
            }
            object.finish();
        }
    }
}

/// `[a,b,...]`, each item written by `write`.
fn array<'n, 'a: 'n>(
    items: impl IntoIterator<Item = &'n Node<'a>>,
    out: &mut Vec<u8>,
    write: impl Fn(&Node<'a>, &mut Vec<u8>),
) {
    out.push(b'[');
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write(item, out);
    }
    out.push(b']');
}

/// A JSON string, escaped as serde_json escapes it. Most strings of a pod need no escape (no
/// `"`, `\` or control character): those are copied as they are, without serde_json's
/// per-call machinery, which was a sixth of the binding's time.
fn string(s: &str, out: &mut Vec<u8>) {
    // No early exit, so that the compiler can check many bytes at once.
    let needs_escape = s.bytes().fold(false, |any, b| any | (b < 0x20) | (b == b'"') | (b == b'\\'));
    if needs_escape {
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::{AuditItem, EnvValue, MountSpec, Source, VolumeSpec};
    use serde_json::{json, Value};

    /// A change to a pod, named.
    type Change = (&'static str, fn(&mut Value));

    fn raw(v: &Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(v).unwrap()
    }

    /// `v`'s canonical JSON.
    fn text(v: &Value) -> String {
        let json = v.to_string();
        let node: Node<'_> = serde_json::from_str(&json).unwrap();
        let mut out = Vec::new();
        canonical(&node, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn view_text(spec: &Value, masks: &Masks<'_>) -> String {
        String::from_utf8(canonical_view(Some(&raw(spec)), masks).unwrap()).unwrap()
    }

    fn bind(spec: &Value, masks: &Masks<'_>) -> Digest32 {
        of_raw(Some(&raw(spec)), masks).unwrap()
    }

    #[test]
    fn canonical_json_sorts_keys_and_drops_nulls_and_empty_lists_only() {
        let v =
            json!({"b": [2, {"z": null, "y": "é\"\n<"}, []], "a": {}, "c": false, "d": "", "e": [], "f": 0, "g": -1.5});
        assert_eq!(text(&v), r#"{"a":{},"b":[2,{"y":"é\"\n<"},[]],"c":false,"d":"","f":0,"g":-1.5}"#);
        // Escapes another encoder uses (Go escapes '<' as \u003c) make no difference, and of a
        // key given twice the last counts, as a decoder reads it.
        let go: Node<'_> = serde_json::from_str(r#"{"k":"\u003cb\u003e","k2":1,"k2":2}"#).unwrap();
        let mut out = Vec::new();
        canonical(&go, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), r#"{"k":"<b>","k2":2}"#);
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
                "lifecycle": {"preStop": {"exec": {"command": ["/bin/drain"]}}, "postStart": {"httpGet": {"port": 1}}},
            }],
            "initContainers": [{"name": "setup", "image": "busybox", "args": ["-c", "x"], "restartPolicy": "Always",
                "securityContext": {"runAsNonRoot": true}, "startupProbe": {"exec": {"command": ["ok"]}}}],
            "hostNetwork": true, "securityContext": {"runAsUser": 1000}, "shareProcessNamespace": true,
        })
    }

    #[test]
    fn the_view_keeps_what_runs_and_mounts_and_masks_keywards_own() {
        let injections = injection();
        let masks = Masks::of(&injections);
        let expected = json!({
            "serviceAccountName": "job-runner", "automountServiceAccountToken": false,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{
                "name": "main", "image": "quay.io/op/driver:1", "command": ["/bin/driver"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "env": [{"name": "MODE", "value": "eval"}],
                "readinessProbe.exec": {"command": ["true"]},
                "lifecycle.preStop.exec": {"command": ["/bin/drain"]},
            }],
            "initContainers": [{"name": "setup", "image": "busybox", "args": ["-c", "x"], "restartPolicy": "Always",
                "securityContext": {"runAsNonRoot": true}, "startupProbe.exec": {"command": ["ok"]}}],
            "hostNetwork": true, "securityContext": {"runAsUser": 1000}, "shareProcessNamespace": true,
        });
        let view = view_text(&pod(), &masks);
        assert_eq!(view, text(&expected));
        // The view is itself canonical: its keys were written in sorted order.
        assert_eq!(text(&serde_json::from_str(&view).unwrap()), view);
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
        assert_eq!(bind(&before, &masks), bind(&after, &masks));
        // A pod with no lists at all binds as one with empty ones.
        let bare = json!({"containers": [{"name": "c", "image": "x"}]});
        let empty = json!({"containers": [{"name": "c", "image": "x", "env": [], "volumeMounts": []}], "volumes": [], "initContainers": null});
        let none: Vec<(&'static str, Injection)> = Vec::new();
        assert_eq!(bind(&bare, &Masks::of(&none)), bind(&empty, &Masks::of(&none)));
        // An empty list of init containers is no list (mutation: the guard on emptiness forced).
        let empty_init = json!({"containers": [{"name": "c", "image": "x"}], "initContainers": []});
        assert_eq!(bind(&bare, &Masks::of(&none)), bind(&empty_init, &Masks::of(&none)));
        // A list that is not one (the apiserver refuses such a pod after the webhooks) is still
        // bound as it is, never dropped (mutations: that guard forced false, or its `!` deleted).
        let odd = |v: Value| {
            bind(&json!({"containers": [{"name": "c", "image": "x"}], "initContainers": v}), &Masks::of(&none))
        };
        assert_ne!(odd(json!({"name": "x"})), odd(json!("y")));
        assert_ne!(odd(json!({"name": "x"})), bind(&bare, &Masks::of(&none)));
        // The same for a container's env and mounts: `null` is none, anything else is bound as it
        // is (mutations: the guard in `filtered` forced either way, or its `!` deleted).
        let field = |k: &str, v: Value| {
            let mut c = json!({"name": "c", "image": "x"});
            c[k] = v;
            bind(&json!({"containers": [c]}), &Masks::of(&none))
        };
        for k in ["env", "volumeMounts"] {
            assert_eq!(field(k, Value::Null), bind(&bare, &Masks::of(&none)), "{k}: null");
            assert_ne!(field(k, json!({"name": "x"})), field(k, json!("y")), "{k}");
            assert_ne!(field(k, json!("y")), bind(&bare, &Masks::of(&none)), "{k}");
        }
    }

    #[test]
    fn anything_else_a_pod_runs_or_mounts_changes_the_binding() {
        let injections = injection();
        let masks = Masks::of(&injections);
        let bound = bind(&pod(), &masks);
        let changes: [Change; 14] = [
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
                p["containers"][0]["lifecycle"]["postStart"] = json!({"exec": {"command": ["x"]}})
            }),
            ("a sidecar", |p| p["initContainers"] = json!([{"name": "s", "image": "evil", "restartPolicy": "Always"}])),
            ("host PID", |p| p["hostPID"] = json!(true)),
            ("privileged", |p| p["containers"][0]["securityContext"] = json!({"privileged": true})),
            ("the pod's security context", |p| p["securityContext"] = json!({"runAsUser": 0})),
            ("the containers' order", |p| {
                let c = p["containers"][0].clone();
                p["containers"] = json!([{"name": "first", "image": "x"}, c]);
            }),
        ];
        for (what, change) in changes {
            let mut p = pod();
            change(&mut p);
            assert_ne!(bind(&p, &masks), bound, "{what}");
        }
        // Without a swap, the account the pod runs as is bound too.
        let none: Vec<(&'static str, Injection)> = Vec::new();
        let plain = Masks::of(&none);
        let mut p = pod();
        p["serviceAccountName"] = json!("builder");
        assert_ne!(bind(&p, &plain), bind(&pod(), &plain));
        // Without a removal, whether the API token is mounted is bound as the pod says it
        // (mutation: `!` deleted in that field's filter drops it).
        let mut no_token = pod();
        no_token["automountServiceAccountToken"] = json!(false);
        let mut token = pod();
        token["automountServiceAccountToken"] = json!(true);
        assert_ne!(bind(&no_token, &plain), bind(&pod(), &plain));
        assert_ne!(bind(&no_token, &plain), bind(&token, &plain));
        // A volume named like the API token's is the API token's only when the profile removes it.
        let mut p = pod();
        p["volumes"][0] = json!({"name": "kube-api-access-x2x", "hostPath": {"path": "/"}});
        assert_ne!(bind(&p, &plain), bind(&pod(), &plain));
    }

    #[test]
    fn a_spec_of_any_shape_binds_without_a_panic() {
        let none: Vec<(&'static str, Injection)> = Vec::new();
        let masks = Masks::of(&none);
        for spec in [
            json!(null),
            json!([]),
            json!("x"),
            json!({"containers": "x", "volumes": {"a": 1}}),
            json!({"containers": [1, null, {"env": 3, "volumeMounts": [null]}]}),
        ] {
            assert!(of_raw(Some(&raw(&spec)), &masks).is_ok(), "{spec}");
        }
        assert!(of_raw(None, &masks).is_ok());
    }

    #[test]
    fn a_spec_past_the_trees_budget_is_not_bound() {
        let none: Vec<(&'static str, Injection)> = Vec::new();
        let masks = Masks::of(&none);
        // The spec, its containers list, the container, its name and its args list: 5 values
        // besides the args.
        let spec = |args: usize| json!({"containers": [{"name": "c", "args": vec![""; args]}]});
        assert!(of_raw(Some(&raw(&spec(tree::MAX_SPEC_VALUES - 5))), &masks).is_ok());
        assert_eq!(of_raw(Some(&raw(&spec(tree::MAX_SPEC_VALUES - 4))), &masks), Err(tree::too_large_message()));
        // A list the view leaves out costs nothing from the budget: it is never read.
        let ports = json!({"containers": [{"name": "c", "ports": vec![1; 3 * tree::MAX_SPEC_VALUES]}]});
        assert!(of_raw(Some(&raw(&ports)), &masks).is_ok());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// The binding's bytes must not change with how strings are written: exactly as
        /// serde_json writes them, escapes and all.
        #[test]
        fn strings_are_written_as_serde_json_writes_them(s in "(\\PC|[\"\\\\\u{0}-\u{1f}\u{7f}])*") {
            let mut out = Vec::new();
            string(&s, &mut out);
            proptest::prop_assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&s).unwrap());
        }
    }
}
