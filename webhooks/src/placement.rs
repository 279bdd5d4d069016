//! keyward gate placed in a pod ([`crate::kinds::Gate`]): what the pod must already have, and
//! the operations that put the gate in front of its server. Read from the spec's tree, whose
//! size is bounded ([`crate::tree::MAX_SPEC_VALUES`]); nothing here allocates past it.
//!
//! Idempotent, as every injection: on a reinvocation (or a pod re-sent with the gate in it) an
//! argument already moved, a probe already gone and a gate container that holds everything
//! keyward sets (the API server adds defaults to it) need nothing; a gate container or volume
//! that differs is a conflict, never overwritten.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::inject::Placement;
use crate::kinds::{GATE_CONFIG_VOLUME, GATE_CONTAINER};
use crate::names::{KUBE_API_ACCESS_PREFIX, SERVICE_ACCOUNT_MOUNT_PATH};
use crate::patch::{OpValue, PatchOp, Path};
use crate::tree::Node;

/// The operations, or the conflicts (each naming the field and the fix).
pub(crate) fn plan(raw: &RawValue, spec: &Node<'_>, placement: &Placement) -> Result<Vec<PatchOp>, Vec<String>> {
    let mut ops = Vec::new();
    let mut conflicts = Vec::new();
    let volumes = items(spec.get("volumes"));
    let volume_named = |name: &str| volumes.iter().find(|v| v.get("name").and_then(Node::as_str) == Some(name));

    // The volumes the gate mounts of the pod's own.
    for name in &placement.pod_volumes {
        if volume_named(name).is_none() {
            conflicts.push(format!(
                "the pod has no volume {name:?}, which keyward gate mounts (spec.inject.gate.tlsVolume or inFrontOf.ca.volume); give the profile the name of the pod's volume"
            ));
        }
    }
    // The pod's API token: the gate's TokenReviews, SubjectAccessReviews and pod watch use it.
    let token = volumes
        .iter()
        .filter_map(|v| v.get("name").and_then(Node::as_str))
        .find(|n| n.starts_with(KUBE_API_ACCESS_PREFIX));
    if token.is_none() {
        conflicts.push(format!(
            "the pod has no {KUBE_API_ACCESS_PREFIX}* volume (automountServiceAccountToken is false), and keyward gate asks the API server as the pod's service account; let the pod mount its token"
        ));
    }

    // The server: its listen argument on the gate's port, and the probes that cannot follow it.
    let (list, index, server) = match find_container(spec, &placement.server) {
        Some(found) => found,
        None => {
            conflicts.push(format!(
                "the pod has no container {:?} (spec.inject.gate.inFrontOf.container) to put keyward gate in front of",
                placement.server
            ));
            return Err(conflicts);
        }
    };
    let prefix = format!("{}=", placement.argument);
    let args = items(server.get("args"));
    let listen: Vec<(usize, &str)> = args
        .iter()
        .enumerate()
        .filter_map(|(i, a)| a.as_str().and_then(|a| a.strip_prefix(&prefix)).map(|v| (i, v)))
        .collect();
    match listen.as_slice() {
        [(_, value)] if *value == placement.moved_to => {}
        [(i, value)] if value.rsplit_once(':').is_some_and(|(_, port)| port == placement.port.to_string()) => {
            ops.push(PatchOp::replace(
                Path::Spec(format!("/{list}/{index}/args/{i}")),
                OpValue::Json(json!(format!("{prefix}{}", placement.moved_to))),
            ));
        }
        [(_, value)] => conflicts.push(format!(
            "container {:?} listens on {value:?} ({}), not on port {} that keyward gate takes; give spec.inject.gate.port the port it listens on",
            placement.server, placement.argument, placement.port
        )),
        [] => conflicts.push(format!(
            "container {:?} has no argument {}=HOST:{} to move behind keyward gate (the flag and its value in one argument); give spec.inject.gate.inFrontOf.listenArgument the flag it listens by",
            placement.server, placement.argument, placement.port
        )),
        _ => conflicts.push(format!(
            "container {:?} has {} arguments {}=…, and which one it obeys is its own affair; keyward moves only one",
            placement.server,
            listen.len(),
            placement.argument
        )),
    }
    for probe in &placement.remove_probes {
        if server.get(probe.field()).is_some_and(|p| !p.absent()) {
            ops.push(PatchOp::remove(Path::Spec(format!("/{list}/{index}/{}", probe.field()))));
        }
    }

    // The gate file's volume.
    match volume_named(GATE_CONFIG_VOLUME) {
        Some(there) if holds(&there.to_value(), &placement.volume) => {}
        Some(_) => {
            conflicts.push(format!("the pod has a volume {GATE_CONFIG_VOLUME:?} that is not keyward gate's; rename it"))
        }
        // Appended: the pod has volumes (its API token's, or it is refused above).
        None => ops.push(PatchOp::add(Path::Spec("/volumes/-".into()), OpValue::Json(placement.volume.clone()))),
    }

    // The gate, as a native sidecar, with the pod's token mounted.
    let mut container = placement.container.clone();
    if let (Some(token), Some(mounts)) = (token, container.get_mut("volumeMounts").and_then(Value::as_array_mut)) {
        mounts.push(json!({"name": token, "mountPath": SERVICE_ACCOUNT_MOUNT_PATH, "readOnly": true}));
    }
    match find_container(spec, GATE_CONTAINER) {
        // Compared as sent: the tree leaves out what an attestation does not bind (ports,
        // resources).
        Some(("initContainers", index, _)) if gate_as_sent(raw, index).is_some_and(|there| holds(&there, &container)) => {}
        Some(_) => conflicts.push(format!(
            "the pod has a container {GATE_CONTAINER:?} that is not the gate this profile places; rename it, or remove it"
        )),
        None if spec.get("initContainers").is_some_and(|c| !c.absent()) => {
            ops.push(PatchOp::add(Path::Spec("/initContainers/-".into()), OpValue::Json(container)));
        }
        None => ops.push(PatchOp::add(Path::Spec("/initContainers".into()), OpValue::Json(json!([container])))),
    }
    if conflicts.is_empty() {
        Ok(ops)
    } else {
        Err(conflicts)
    }
}

/// Init container `index` of the spec as sent, whole; `None` if it cannot be read so.
fn gate_as_sent(raw: &RawValue, index: usize) -> Option<Value> {
    #[derive(Deserialize)]
    struct InitContainers<'a> {
        #[serde(borrow, rename = "initContainers")]
        init_containers: Vec<&'a RawValue>,
    }
    let read: InitContainers<'_> = serde_json::from_str(raw.get()).ok()?;
    serde_json::from_str(read.init_containers.get(index)?.get()).ok()
}

/// The items of a list, or none.
fn items<'t, 'a>(node: Option<&'t Node<'a>>) -> &'t [Node<'a>] {
    match node {
        Some(Node::Array(items)) => items,
        _ => &[],
    }
}

/// A container by name: its list's field, its index there, and it.
fn find_container<'t, 'a>(spec: &'t Node<'a>, name: &str) -> Option<(&'static str, usize, &'t Node<'a>)> {
    ["initContainers", "containers"].into_iter().find_map(|list| {
        items(spec.get(list))
            .iter()
            .enumerate()
            .find(|(_, c)| c.get("name").and_then(Node::as_str) == Some(name))
            .map(|(i, c)| (list, i, c))
    })
}

/// Whether `there` holds everything `wanted` sets: the API server adds defaults (a probe's
/// `timeoutSeconds`, a container's `terminationMessagePath`), never removes what was set.
fn holds(there: &Value, wanted: &Value) -> bool {
    match (there, wanted) {
        (Value::Object(there), Value::Object(wanted)) => {
            wanted.iter().all(|(k, w)| there.get(k).is_some_and(|t| holds(t, w)))
        }
        (Value::Array(there), Value::Array(wanted)) => {
            there.len() == wanted.len() && there.iter().zip(wanted).all(|(t, w)| holds(t, w))
        }
        _ => there == wanted,
    }
}

#[cfg(test)]
mod tests {
    use super::holds;
    use serde_json::json;

    #[test]
    fn what_the_api_server_adds_is_held_and_what_it_would_change_is_not() {
        let wanted = json!({"ports": [{"containerPort": 9091}], "args": ["gate", "--x"]});
        // Defaults added, in an object and in a list's objects.
        let defaulted = json!({"ports": [{"containerPort": 9091, "protocol": "TCP"}], "args": ["gate", "--x"], "imagePullPolicy": "IfNotPresent"});
        assert!(holds(&defaulted, &wanted));
        // A list of another length, or an item that differs, is not the gate's.
        assert!(!holds(&json!({"ports": [{"containerPort": 9091}], "args": ["gate"]}), &wanted));
        assert!(!holds(&json!({"ports": [{"containerPort": 9091}], "args": ["gate", "--y"]}), &wanted));
        assert!(!holds(&json!({"ports": [{"containerPort": 9091}], "args": ["gate", "--x", "--y"]}), &wanted));
        assert!(!holds(&json!({"args": ["gate", "--x"]}), &wanted));
        assert!(!holds(&json!({"ports": [{"containerPort": 80}], "args": ["gate", "--x"]}), &wanted));
    }
}
