//! keyward gate placed in front of kube-rbac-proxy in TrustyAI EvalHub's pod
//! (deploy/gate/evalhub/profile.yaml), on the pod as the ReplicaSet controller creates it
//! (`tests/fixtures/evalhub-api-pod.json`, trustyai-service-operator 11c335b deployment.go).
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use keyward_engine::Reason;
use serde_json::{json, Value};
use support::*;

fn evalhub_gate() -> keyward_engine::ProfileSet {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/gate/evalhub/profile.yaml");
    keyward_engine::ProfileSet::from_sources([(path.to_string(), std::fs::read_to_string(path).unwrap())]).unwrap()
}

fn spec_ops(decision: &keyward_engine::Decision) -> Vec<Value> {
    let ops = patch_json(decision);
    ops.as_array().unwrap().iter().filter(|op| op["path"].as_str().unwrap().starts_with("/spec")).cloned().collect()
}

#[test]
fn the_gate_takes_evalhubs_port_and_kube_rbac_proxy_moves_behind_it() {
    let pod = fixture("evalhub-api-pod.json");
    let (decision, after) = admit(&create("evalhub-system", REPLICASET_CONTROLLER), &pod, &evalhub_gate());
    assert_eq!(decision.reason, Reason::Injected);
    let gate = json!({
        "name": "keyward-gate",
        "image": "ghcr.io/keyward/keyward:unreleased",
        "restartPolicy": "Always",
        "args": [
            "gate",
            "--config=/etc/keyward/gate/gate.yaml",
            "--listen=0.0.0.0:8443",
            "--metrics-listen=0.0.0.0:9091",
            "--tls-dir=/var/run/keyward/gate-tls",
            "--upstream=https://127.0.0.1:8442",
            "--upstream-ca=/var/run/keyward/upstream-ca/service-ca.crt",
            "--upstream-server-name=evalhub.evalhub-system.svc",
            "--log-format=json"
        ],
        "ports": [{"name": "gate-metrics", "containerPort": 9091, "protocol": "TCP"}],
        "startupProbe": {"httpGet": {"path": "/healthz", "port": 9091}, "periodSeconds": 1, "failureThreshold": 60},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9091}, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 9091}, "periodSeconds": 10, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "20m", "memory": "24Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}
        },
        "volumeMounts": [
            {"name": "keyward-gate-config", "mountPath": "/etc/keyward/gate", "readOnly": true},
            {"name": "evalhub-tls", "mountPath": "/var/run/keyward/gate-tls", "readOnly": true},
            {"name": "service-ca", "mountPath": "/var/run/keyward/upstream-ca", "readOnly": true},
            {"name": "kube-api-access-7zq4m", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}
        ]
    });
    assert_eq!(
        spec_ops(&decision),
        [
            json!({"op": "replace", "path": "/spec/containers/1/args/0", "value": "--secure-listen-address=127.0.0.1:8442"}),
            json!({"op": "remove", "path": "/spec/containers/1/livenessProbe"}),
            json!({"op": "add", "path": "/spec/volumes/-", "value": {"name": "keyward-gate-config", "configMap": {"name": "keyward-gate-evalhub"}}}),
            json!({"op": "add", "path": "/spec/initContainers", "value": [gate]}),
        ]
    );
    // Everything else of kube-rbac-proxy and EvalHub is as the operator made it.
    let (mut before, mut changed) = (pod.clone(), after.clone());
    for p in [&mut before, &mut changed] {
        p["spec"]["containers"][1]["args"][0] = json!("moved");
        p["spec"]["containers"][1].as_object_mut().unwrap().remove("livenessProbe");
        p["spec"].as_object_mut().unwrap().remove("initContainers");
        p["spec"]["volumes"].as_array_mut().unwrap().retain(|v| v["name"] != "keyward-gate-config");
        p["metadata"].as_object_mut().unwrap().remove("annotations");
        p["metadata"]["labels"].as_object_mut().unwrap().retain(|k, _| !k.starts_with("keyward.io/"));
    }
    assert_eq!(before, changed);
    assert_eq!(
        after["metadata"]["annotations"]["keyward.io/injected"].as_str().map(|a| a.contains("\"kind\":\"gate\"")),
        Some(true),
        "{}",
        after["metadata"]
    );

    // The API server defaults the gate container (its pull policy, termination message, probes'
    // timeouts and scheme): a reinvocation on that pod changes nothing.
    let mut defaulted = after.clone();
    let c = &mut defaulted["spec"]["initContainers"][0];
    c["imagePullPolicy"] = json!("IfNotPresent");
    c["terminationMessagePath"] = json!("/dev/termination-log");
    c["terminationMessagePolicy"] = json!("File");
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        c[probe]["timeoutSeconds"] = json!(1);
        c[probe]["successThreshold"] = json!(1);
        c[probe]["httpGet"]["scheme"] = json!("HTTP");
    }
    let again = decide(&create("evalhub-system", REPLICASET_CONTROLLER), &defaulted, &evalhub_gate());
    assert!(again.allowed() && again.patch().is_empty(), "{:?} {:?}", again.message(), patch_json(&again));
}

#[test]
fn what_the_gate_cannot_be_placed_in_front_of_is_refused_with_the_field_and_the_fix() {
    let refused = |pod: &Value| {
        let d = decide(&create("evalhub-system", REPLICASET_CONTROLLER), pod, &evalhub_gate());
        assert_eq!(d.reason, Reason::Conflict, "{:?}", d.message());
        d.message().unwrap().to_string()
    };
    let mut other_port = fixture("evalhub-api-pod.json");
    other_port["spec"]["containers"][1]["args"][0] = json!("--secure-listen-address=0.0.0.0:9000");
    assert_eq!(
        refused(&other_port),
        "keyward: profile \"evalhub-gate\" cannot inject into this pod: container \"kube-rbac-proxy\" listens on \"0.0.0.0:9000\" (--secure-listen-address), not on port 8443 that keyward gate takes; give spec.inject.gate.port the port it listens on"
    );
    let mut no_token = fixture("evalhub-api-pod.json");
    no_token["spec"]["volumes"].as_array_mut().unwrap().retain(|v| v["name"] != "kube-api-access-7zq4m");
    for c in no_token["spec"]["containers"].as_array_mut().unwrap() {
        c["volumeMounts"].as_array_mut().unwrap().retain(|m| m["name"] != "kube-api-access-7zq4m");
    }
    no_token["spec"]["automountServiceAccountToken"] = json!(false);
    assert!(refused(&no_token).ends_with("the pod has no kube-api-access-* volume (automountServiceAccountToken is false), and keyward gate asks the API server as the pod's service account; let the pod mount its token"));
    let mut foreign = fixture("evalhub-api-pod.json");
    foreign["spec"]["initContainers"] =
        json!([{"name": "keyward-gate", "image": "attacker/gate", "restartPolicy": "Always"}]);
    assert!(refused(&foreign).ends_with(
        "the pod has a container \"keyward-gate\" that is not the gate this profile places; rename it, or remove it"
    ));
    let mut no_proxy = fixture("evalhub-api-pod.json");
    no_proxy["spec"]["containers"].as_array_mut().unwrap().truncate(1);
    assert!(refused(&no_proxy).ends_with("the pod has no container \"kube-rbac-proxy\" (spec.inject.gate.inFrontOf.container) to put keyward gate in front of"));
    let mut no_argument = fixture("evalhub-api-pod.json");
    no_argument["spec"]["containers"][1]["args"].as_array_mut().unwrap().remove(0);
    assert!(refused(&no_argument).ends_with("container \"kube-rbac-proxy\" has no argument --secure-listen-address=HOST:8443 to move behind keyward gate (the flag and its value in one argument); give spec.inject.gate.inFrontOf.listenArgument the flag it listens by"));
    let mut twice = fixture("evalhub-api-pod.json");
    twice["spec"]["containers"][1]["args"].as_array_mut().unwrap().push(json!("--secure-listen-address=0.0.0.0:8443"));
    assert!(refused(&twice).ends_with("container \"kube-rbac-proxy\" has 2 arguments --secure-listen-address=…, and which one it obeys is its own affair; keyward moves only one"));
    let mut foreign_volume = fixture("evalhub-api-pod.json");
    foreign_volume["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "keyward-gate-config", "emptyDir": {}}));
    assert!(refused(&foreign_volume)
        .ends_with("the pod has a volume \"keyward-gate-config\" that is not keyward gate's; rename it"));
    let mut renamed_tls = fixture("evalhub-api-pod.json");
    renamed_tls["metadata"]["labels"]["instance"] = json!("other");
    let message = refused(&renamed_tls);
    assert!(message.contains("the pod has no volume \"other-tls\", which keyward gate mounts (spec.inject.gate.tlsVolume or inFrontOf.ca.volume)"), "{message}");

    // A look-alike pod of someone else's, which the Service would send callers to, is refused.
    let d = decide(&create("evalhub-system", "alice"), &fixture("evalhub-api-pod.json"), &evalhub_gate());
    assert_eq!(d.reason, Reason::RequesterDenied, "{:?}", d.message());
}

/// A pod with init containers of its own: the gate is appended after them (they run to
/// completion first and need nothing of it), and the result is whole.
#[test]
fn the_gate_follows_the_pods_own_init_containers() {
    let mut pod = fixture("evalhub-api-pod.json");
    pod["spec"]["initContainers"] = json!([{"name": "wait-for-db", "image": "busybox", "command": ["true"],
        "imagePullPolicy": "Always", "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}]);
    let (decision, after) = admit(&create("evalhub-system", REPLICASET_CONTROLLER), &pod, &evalhub_gate());
    let added: Vec<Value> = spec_ops(&decision)
        .into_iter()
        .filter(|op| op["path"].as_str().unwrap().starts_with("/spec/initContainers"))
        .collect();
    assert_eq!(added.len(), 1);
    assert_eq!(added[0]["path"], "/spec/initContainers/-");
    let names: Vec<&str> =
        after["spec"]["initContainers"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["wait-for-db", "keyward-gate"]);
}
