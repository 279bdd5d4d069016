//! Shared helpers for the engine tests: run the engine the way the apiserver would, apply the
//! patch strictly, and check what the apiserver's pod validation would check.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use k8s_openapi::api::core::v1::Pod;
use keyward_webhooks::validate::violations;
use keyward_webhooks::{decide, Decision, ProfileSet, RequestFacts, Requester};
use serde_json::Value;

pub const LMEVAL_OPERATOR: &str = "system:serviceaccount:opendatahub:trustyai-service-operator-controller-manager";
pub const KUBERAY_OPERATOR: &str = "system:serviceaccount:ray-system:kuberay-operator";
pub const REPLICASET_CONTROLLER: &str = "system:serviceaccount:kube-system:replicaset-controller";
pub const JOB_CONTROLLER: &str = "system:serviceaccount:kube-system:job-controller";

pub fn fixture(name: &str) -> Value {
    let path = format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn builtin() -> ProfileSet {
    ProfileSet::builtin().unwrap()
}

pub fn profiles(yaml: &str) -> ProfileSet {
    ProfileSet::from_sources([("test.yaml".to_string(), yaml.to_string())]).unwrap()
}

pub fn create(namespace: &str, user: &str) -> RequestFacts {
    RequestFacts::pod_create(namespace, Requester::User(user.to_string()))
}

/// Applies the decision's patch with the strict RFC 6902 implementation, as the apiserver does.
pub fn apply(pod: &Value, decision: &Decision) -> Value {
    let mut out = pod.clone();
    json_patch::patch(&mut out, decision.patch()).unwrap_or_else(|e| panic!("patch does not apply: {e}"));
    out
}

/// Asserts the pod passes the validation rules an injection could break.
pub fn assert_valid(pod: &Value) {
    let typed: Pod = serde_json::from_value(pod.clone()).expect("result is a Pod");
    let v = violations(&typed);
    assert!(v.is_empty(), "invalid pod: {v:?}\n{pod:#}");
}

/// Runs the engine, applies its patch, checks the result, and checks that a second call on
/// the result changes nothing. Returns the decision and the mutated pod.
pub fn admit(facts: &RequestFacts, pod: &Value, profiles: &ProfileSet) -> (Decision, Value) {
    let decision = decide(facts, pod, profiles);
    assert!(decision.allowed(), "denied: {:?}", decision.message());
    let after = apply(pod, &decision);
    assert_valid(&after);
    if let Ok(m) = &decision.outcome {
        if let Some(p) = &m.pod {
            assert_eq!(p, &after, "the decision's pod differs from the patch applied to the input");
        }
    }
    let again = decide(facts, &after, profiles);
    assert!(again.allowed(), "second call denied: {:?}", again.message());
    assert_eq!(again.patch(), &[], "second call is not a no-op");
    (decision, after)
}

pub fn patch_json(decision: &Decision) -> Value {
    serde_json::to_value(decision.patch()).unwrap()
}
