//! Property tests over generated pods: whatever shape the pod has, the patch applies strictly,
//! the result passes validation, and a second call on the result changes nothing.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use support::*;

/// Which built-in profile the generated pod is shaped for, with a requester it allows.
fn target() -> impl Strategy<Value = (Value, Value, &'static str, &'static str)> {
    prop_oneof![
        Just((
            json!({"app.kubernetes.io/name": "ta-lmes"}),
            json!({"apiVersion": "trustyai.opendatahub.io/v1alpha1", "kind": "LMEvalJob", "name": "job-1", "uid": "u1", "controller": true}),
            "team-a",
            LMEVAL_OPERATOR,
        )),
        Just((
            json!({"ray.io/is-ray-node": "yes", "ray.io/cluster": "rc"}),
            json!({"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "rc", "uid": "u2", "controller": true}),
            "ray",
            KUBERAY_OPERATOR,
        )),
        Just((
            json!({"serving.kserve.io/inferencegraph": "g1"}),
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "g1-abc", "uid": "u3", "controller": true}),
            "models",
            REPLICASET_CONTROLLER,
        )),
    ]
}

#[derive(Debug, Clone)]
struct ContainerShape {
    sidecar: bool,
    mounts: Vec<usize>,
    env: Option<Vec<usize>>,
}

fn container_shape() -> impl Strategy<Value = ContainerShape> {
    (
        any::<bool>(),
        proptest::collection::vec(0usize..4, 0..4),
        proptest::option::of(proptest::collection::vec(0usize..6, 0..4)),
    )
        .prop_map(|(sidecar, mounts, env)| ContainerShape { sidecar, mounts, env })
}

#[derive(Debug, Clone)]
struct PodShape {
    init: Vec<ContainerShape>,
    main: Vec<ContainerShape>,
    user_volumes: usize,
    api_token: bool,
    sa_fields: u8,
    annotations: Option<Vec<(String, String)>>,
    volumes_key_absent: bool,
}

fn pod_shape() -> impl Strategy<Value = PodShape> {
    (
        proptest::collection::vec(container_shape(), 0..3),
        proptest::collection::vec(container_shape(), 1..4),
        0usize..4,
        any::<bool>(),
        0u8..4,
        proptest::option::of(proptest::collection::vec(("[a-z~/.]{1,8}", "[ -~]{0,8}"), 0..3)),
        any::<bool>(),
    )
        .prop_map(|(init, main, user_volumes, api_token, sa_fields, annotations, volumes_key_absent)| PodShape {
            init,
            main,
            user_volumes,
            api_token,
            sa_fields,
            annotations,
            volumes_key_absent,
        })
}

fn build(shape: &PodShape, labels: &Value, owner: &Value) -> Value {
    let mut volumes: Vec<Value> =
        (0..shape.user_volumes).map(|i| json!({"name": format!("data-{i}"), "emptyDir": {}})).collect();
    if shape.api_token {
        volumes.push(json!({"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
        ]}}));
    }
    let container = |prefix: &str, i: usize, c: &ContainerShape, init: bool| {
        let mut obj = Map::new();
        obj.insert("name".into(), json!(format!("{prefix}-{i}")));
        obj.insert("image".into(), json!("busybox:1.36"));
        obj.insert("terminationMessagePath".into(), json!("/dev/termination-log"));
        if init && c.sidecar {
            obj.insert("restartPolicy".into(), json!("Always"));
        }
        let mut mounts: Vec<Value> = Vec::new();
        for m in &c.mounts {
            if *m < shape.user_volumes && !mounts.iter().any(|x| x["name"] == json!(format!("data-{m}"))) {
                mounts.push(json!({"name": format!("data-{m}"), "mountPath": format!("/data/{m}")}));
            }
        }
        if shape.api_token {
            mounts.push(json!({"name": "kube-api-access-x7k2p", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}));
        }
        if !mounts.is_empty() {
            obj.insert("volumeMounts".into(), Value::Array(mounts));
        }
        if let Some(env) = &c.env {
            let vars: Vec<Value> = env.iter().map(|e| json!({"name": format!("USER_VAR_{e}"), "value": "x"})).collect();
            obj.insert("env".into(), Value::Array(vars));
        }
        Value::Object(obj)
    };
    let init: Vec<Value> = shape.init.iter().enumerate().map(|(i, c)| container("init", i, c, true)).collect();
    let main: Vec<Value> = shape.main.iter().enumerate().map(|(i, c)| container("app", i, c, false)).collect();

    let mut spec = Map::new();
    if !(volumes.is_empty() && shape.volumes_key_absent) {
        spec.insert("volumes".into(), Value::Array(volumes));
    }
    if !init.is_empty() {
        spec.insert("initContainers".into(), Value::Array(init));
    }
    spec.insert("containers".into(), Value::Array(main));
    if !shape.api_token {
        spec.insert("automountServiceAccountToken".into(), json!(false));
    }
    match shape.sa_fields {
        0 => {}
        1 => {
            spec.insert("serviceAccountName".into(), json!("default"));
        }
        _ => {
            spec.insert("serviceAccountName".into(), json!("runner"));
            spec.insert("serviceAccount".into(), json!("runner"));
        }
    }
    let mut metadata = json!({"generateName": "pod-", "labels": labels, "ownerReferences": [owner]});
    if let Some(a) = &shape.annotations {
        let map: Map<String, Value> = a.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        metadata["annotations"] = Value::Object(map);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn patch_applies_result_is_valid_and_second_call_is_a_no_op(
        (labels, owner, namespace, user) in target(),
        shape in pod_shape(),
    ) {
        let pod = build(&shape, &labels, &owner);
        // `admit` applies the patch strictly, validates, and re-runs the engine on the result.
        let (decision, after) = admit(&create(namespace, user), &pod, &builtin());
        prop_assert!(decision.profile.is_some());
        // Every container (init, sidecar, regular) got the audience-bound token.
        for field in ["initContainers", "containers"] {
            for c in after["spec"][field].as_array().into_iter().flatten() {
                prop_assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["name"] == "keyward-sa-token"));
            }
        }
        // Nothing the user had is lost, bar what the API-token removal takes by design.
        for i in 0..shape.user_volumes {
            let name = format!("data-{i}");
            prop_assert!(after["spec"]["volumes"].as_array().unwrap().iter().any(|v| v["name"] == json!(name)));
        }
    }
}

/// Any JSON at all, nested a few levels, with keys that look like pod fields.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[ -~]{0,12}".prop_map(Value::String),
    ];
    let keys = prop_oneof![
        Just("metadata".to_string()),
        Just("labels".to_string()),
        Just("spec".to_string()),
        Just("containers".to_string()),
        Just("volumes".to_string()),
        Just("volumeMounts".to_string()),
        Just("env".to_string()),
        Just("name".to_string()),
        Just("ownerReferences".to_string()),
        "[a-z/~.]{1,10}",
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(keys.clone(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Garbage in never panics; whatever is admitted with a patch, the patch applies.
    #[test]
    fn arbitrary_objects_never_panic(object in any_json(), labelled in any::<bool>()) {
        let mut object = object;
        if labelled {
            // Steer some inputs into a profile, so the injectors see garbage too.
            if let Value::Object(map) = &mut object {
                map.insert("metadata".into(), json!({"labels": {"app.kubernetes.io/name": "ta-lmes"},
                    "ownerReferences": [{"apiVersion": "trustyai.opendatahub.io/v1alpha1", "kind": "LMEvalJob", "name": "j", "uid": "u", "controller": true}]}));
            }
        }
        let decision = decide(&create("team-a", LMEVAL_OPERATOR), &object, &builtin());
        if decision.allowed() && !decision.patch().is_empty() {
            let patch: json_patch::Patch = serde_json::from_value(patch_json(&decision)).unwrap();
            let mut out = object.clone();
            prop_assert!(json_patch::patch(&mut out, &patch).is_ok());
        }
    }
}
