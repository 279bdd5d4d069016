//! The engine's cost per admission, on the fixtures the tests use.
//! Run: `cargo bench -p keyward-engine --bench decide`.
#![allow(clippy::unwrap_used)] // a panic is the benchmark failure report

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use keyward_engine::engine::decide_object;
use keyward_engine::review;
use keyward_engine::{decide, ProfileSet, RequestFacts, Requester};
use serde_json::value::RawValue;
use serde_json::Value;

/// A fixture, compacted as the apiserver sends JSON (the files are indented for people).
fn fixture(name: &str) -> Vec<u8> {
    let text = std::fs::read(format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    serde_json::to_vec(&serde_json::from_slice::<Value>(&text).unwrap()).unwrap()
}

fn raw(v: &Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(v).unwrap()
}

/// The webhook's attestor: HMAC-SHA256 with keyward-certs' keys.
#[derive(Debug)]
struct HmacAttestor(keyward_certs::attestation::Keys);

impl keyward_engine::Attestor for HmacAttestor {
    fn now(&self) -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
    }

    fn nonce(&self) -> String {
        keyward_certs::attestation::nonce()
    }

    fn sign(&self, payload: &[u8]) -> Option<keyward_engine::attest::Signature> {
        self.0.sign(payload).map(|(key_id, tag)| keyward_engine::attest::Signature { key_id, tag })
    }

    fn verifies(&self, payload: &[u8], key_id: &str, tag: &str) -> bool {
        self.0.verify(payload, key_id, tag)
    }
}

fn bench(c: &mut Criterion) {
    // The built-ins, plus the example profiles of the engine's tests (the previous built-ins),
    // which serve the trustyai LMEvalJob and KubeRay pods, so that the figures compare.
    let key = keyward_certs::attestation::generate().unwrap();
    let attestor = HmacAttestor(keyward_certs::attestation::Keys {
        current: Some(keyward_certs::attestation::Key::from_bytes(&key, "current").unwrap()),
        previous: None,
    });
    let dir = format!("{}/tests/profiles", env!("CARGO_MANIFEST_DIR"));
    let examples = ["lmeval-job.yaml", "kuberay.yaml", "kserve-inferencegraph.yaml"]
        .map(|f| (format!("examples/{f}"), std::fs::read_to_string(format!("{dir}/{f}")).unwrap()));
    let profiles = ProfileSet::builtin().unwrap().overlay(ProfileSet::from_sources(examples).unwrap()).unwrap();
    let operator = "system:serviceaccount:opendatahub:trustyai-service-operator-controller-manager";
    let lmeval: Value = serde_json::from_slice(&fixture("lmeval-driver-pod.json")).unwrap();
    let facts = RequestFacts::pod_create("team-a", Requester::User(operator));

    let pod = raw(&lmeval);
    c.bench_function("decide/lmeval-inject", |b| b.iter(|| decide(black_box(&facts), black_box(&pod), &profiles)));

    let d = decide(&facts, &pod, &profiles);
    let patch: json_patch::Patch = serde_json::from_value(serde_json::to_value(d.patch()).unwrap()).unwrap();
    let mut injected = lmeval.clone();
    json_patch::patch(&mut injected, &patch).unwrap();
    let injected = raw(&injected);
    c.bench_function("decide/lmeval-reinvocation-noop", |b| {
        b.iter(|| decide(black_box(&facts), black_box(&injected), &profiles))
    });

    let mut unselected = lmeval.clone();
    unselected["metadata"]["labels"] = serde_json::json!({"app": "web"});
    let unselected = raw(&unselected);
    c.bench_function("decide/no-profile", |b| b.iter(|| decide(black_box(&facts), black_box(&unselected), &profiles)));

    for (name, file) in
        [("lmeval", "admissionreview-lmeval.json"), ("kuberay-worker", "admissionreview-kuberay-worker.json")]
    {
        let body = fixture(file);
        c.bench_function(&format!("review/{name}/parse"), |b| {
            b.iter(|| review::parse_request(black_box(&body)).unwrap())
        });
        let request = review::parse_request(&body).unwrap();
        let object = request.object.raw().unwrap();
        let read = review::read_request(&body, profiles.annotations_read()).unwrap();
        c.bench_function(&format!("review/{name}/decide"), |b| {
            b.iter(|| decide_object(black_box(&read.facts()), black_box(&read.object), &profiles))
        });
        let decision = decide(&request.facts(), object, &profiles);
        assert!(decision.allowed() && !decision.patch().is_empty(), "{name}: {:?}", decision.message());
        c.bench_function(&format!("review/{name}/respond"), |b| {
            b.iter(|| review::respond(black_box(&request.uid), black_box(&decision)))
        });
        c.bench_function(&format!("review/{name}/parse-decide-respond"), |b| {
            b.iter(|| {
                let request = review::read_request(black_box(&body), profiles.annotations_read()).unwrap();
                let decision = decide_object(&request.facts(), &request.object, &profiles);
                review::respond(&request.uid, &decision)
            })
        });
        // As keyward serves it: with the attestation key loaded (both profiles issue per-owner
        // credentials, so the pod's spec is bound and the attestation signed).
        c.bench_function(&format!("review/{name}/parse-decide-respond-attested"), |b| {
            b.iter(|| {
                let request = review::read_request(black_box(&body), profiles.annotations_read()).unwrap();
                let decision = decide_object(&request.facts().attested_by(&attestor), &request.object, &profiles);
                review::respond(&request.uid, &decision)
            })
        });
    }

    // The admission attestation: the fms driver pod under the built-in lmeval profile, with
    // and without the webhook's HMAC key; and the reinvocation, which verifies the one there.
    let builtin = ProfileSet::builtin().unwrap();
    let fms: Value = serde_json::from_slice(&fixture("lmeval-fms-driver-pod.json")).unwrap();
    let fms = raw(&fms);
    let fms_operator = "system:serviceaccount:lm-eval:lm-eval-controller-manager";
    let plain = RequestFacts::pod_create("team-a", Requester::User(fms_operator));
    let attested = plain.attested_by(&attestor);
    c.bench_function("decide/fms-inject", |b| b.iter(|| decide(black_box(&plain), black_box(&fms), &builtin)));
    c.bench_function("decide/fms-inject-attested", |b| {
        b.iter(|| decide(black_box(&attested), black_box(&fms), &builtin))
    });
    let d = decide(&attested, &fms, &builtin);
    let patch: json_patch::Patch = serde_json::from_value(serde_json::to_value(d.patch()).unwrap()).unwrap();
    let mut injected: Value = serde_json::from_str(fms.get()).unwrap();
    json_patch::patch(&mut injected, &patch).unwrap();
    let injected = raw(&injected);
    c.bench_function("decide/fms-reinvocation-attested", |b| {
        b.iter(|| decide(black_box(&attested), black_box(&injected), &builtin))
    });

    c.bench_function("profiles/load-builtin", |b| b.iter(|| ProfileSet::builtin().unwrap()));
}

criterion_group!(benches, bench);
criterion_main!(benches);
