//! Shared helpers for the engine tests: run the engine the way the apiserver would, apply the
//! patch strictly, and check what the apiserver's pod validation would check.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::collections::BTreeSet;

use keyward_engine::{Decision, Explanation, ProfileSet, RequestFacts, Requester};
use serde_json::value::RawValue;
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

/// Profiles for testing the engine's general behaviour on realistic pods (`tests/profiles/`).
/// They are examples, not the built-ins: they inject `KEYWARD_*` variables no real workload reads.
pub fn examples() -> ProfileSet {
    let dir = format!("{}/tests/profiles", env!("CARGO_MANIFEST_DIR"));
    let sources = ["lmeval-job.yaml", "kuberay.yaml", "kserve-inferencegraph.yaml"].map(|name| {
        let text = std::fs::read_to_string(format!("{dir}/{name}")).unwrap();
        (format!("examples/{name}"), text)
    });
    ProfileSet::from_sources(sources).unwrap()
}

pub fn profiles(yaml: &str) -> ProfileSet {
    ProfileSet::from_sources([("test.yaml".to_string(), yaml.to_string())]).unwrap()
}

pub fn create<'a>(namespace: &'a str, user: &'a str) -> RequestFacts<'a> {
    RequestFacts::pod_create(namespace, Requester::User(user))
}

/// The pod as the request carries it: raw JSON.
pub fn raw(pod: &Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(pod).unwrap()
}

pub fn decide(facts: &RequestFacts<'_>, pod: &Value, profiles: &ProfileSet) -> Decision {
    keyward_engine::decide(facts, &raw(pod), profiles)
}

pub fn explain(facts: &RequestFacts<'_>, pod: &Value, profiles: &ProfileSet) -> Explanation {
    keyward_engine::explain(facts, &raw(pod), profiles)
}

/// Applies the decision's patch with the strict RFC 6902 implementation, as the apiserver does.
pub fn apply(pod: &Value, decision: &Decision) -> Value {
    let patch: json_patch::Patch = serde_json::from_value(patch_json(decision)).unwrap();
    let mut out = pod.clone();
    json_patch::patch(&mut out, &patch).unwrap_or_else(|e| panic!("patch does not apply: {e}"));
    out
}

/// Asserts the pod passes the validation rules an injection could break.
pub fn assert_valid(pod: &Value) {
    let v = violations(pod);
    assert!(v.is_empty(), "invalid pod: {v:?}\n{pod:#}");
}

/// The apiserver's pod rules that an injection could break, checked on the JSON independently
/// of the engine's own self-check.
pub fn violations(pod: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let annotations: usize = pod["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
        .sum();
    if annotations > 256 * 1024 {
        out.push(format!("metadata.annotations: {annotations} bytes"));
    }
    let spec = &pod["spec"];
    let mut names = BTreeSet::new();
    for (i, v) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        let name = v["name"].as_str().unwrap_or_default();
        let label = !name.is_empty()
            && name.len() <= 63
            && name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !label {
            out.push(format!("spec.volumes[{i}].name: {name:?} is not a DNS-1123 label"));
        }
        if !names.insert(name.to_string()) {
            out.push(format!("spec.volumes[{i}].name: {name:?} is duplicated"));
        }
        for source in v["projected"]["sources"].as_array().into_iter().flatten() {
            let token = &source["serviceAccountToken"];
            if token.is_object() {
                let path = token["path"].as_str().unwrap_or_default();
                if path.is_empty() || path.starts_with('/') || path.split('/').any(|s| s == "..") {
                    out.push(format!("spec.volumes[{i}]: token path {path:?}"));
                }
                if token["expirationSeconds"].as_i64().is_some_and(|s| s < 600) {
                    out.push(format!("spec.volumes[{i}]: expirationSeconds under 600"));
                }
            }
        }
    }
    for field in ["initContainers", "containers"] {
        for (c, container) in spec[field].as_array().into_iter().flatten().enumerate() {
            let mut paths = BTreeSet::new();
            for (m, mount) in container["volumeMounts"].as_array().into_iter().flatten().enumerate() {
                let at = format!("spec.{field}[{c}].volumeMounts[{m}]");
                if !names.contains(mount["name"].as_str().unwrap_or_default()) {
                    out.push(format!("{at}.name: {} is not a volume of the pod", mount["name"]));
                }
                if !paths.insert(mount["mountPath"].as_str().unwrap_or_default().to_string()) {
                    out.push(format!("{at}.mountPath: {} is already mounted", mount["mountPath"]));
                }
            }
        }
    }
    if let (Some(a), Some(b)) = (spec["serviceAccountName"].as_str(), spec["serviceAccount"].as_str()) {
        if !a.is_empty() && !b.is_empty() && a != b {
            out.push(format!("spec.serviceAccount: {b:?} differs from spec.serviceAccountName {a:?}"));
        }
    }
    out
}

/// Runs the engine, applies its patch, checks the result, and checks that a second call on
/// the result changes nothing. Returns the decision and the mutated pod.
pub fn admit(facts: &RequestFacts<'_>, pod: &Value, profiles: &ProfileSet) -> (Decision, Value) {
    let decision = decide(facts, pod, profiles);
    assert!(decision.allowed(), "denied: {:?}", decision.message());
    let after = apply(pod, &decision);
    assert_valid(&after);
    let again = decide(facts, &after, profiles);
    assert!(again.allowed(), "second call denied: {:?}", again.message());
    assert!(again.patch().is_empty(), "second call is not a no-op: {:?}", patch_json(&again));
    (decision, after)
}

pub fn patch_json(decision: &Decision) -> Value {
    serde_json::to_value(decision.patch()).unwrap()
}

/// An attestor for engine tests: a keyed FNV-1a "tag", deterministic and key-dependent (the
/// engine only asks for a tag and compares it; the real HMAC is keyward-certs'), stamped at
/// [`ADMITTED_AT`] with a nonce that counts up.
#[derive(Debug, Clone)]
pub struct TestAttestor {
    pub key: Option<u64>,
}

/// The time a [`TestAttestor`] stamps: 2026-12-02T07:22:22Z.
pub const ADMITTED_AT: u64 = 1_796_196_142;

impl TestAttestor {
    fn tag(key: u64, payload: &[u8]) -> String {
        let mut h = 0xcbf2_9ce4_8422_2325u64 ^ key;
        for b in payload {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

impl keyward_engine::Attestor for TestAttestor {
    fn now(&self) -> u64 {
        ADMITTED_AT
    }

    fn nonce(&self) -> String {
        static NONCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        format!("n{}", NONCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

    fn sign(&self, payload: &[u8]) -> Option<keyward_engine::attest::Signature> {
        self.key.map(|k| keyward_engine::attest::Signature { key_id: format!("{k:x}"), tag: Self::tag(k, payload) })
    }

    fn verifies(&self, payload: &[u8], key_id: &str, tag: &str) -> bool {
        self.key.is_some_and(|k| format!("{k:x}") == key_id && Self::tag(k, payload) == tag)
    }
}
