//! The engine's cost per admission, on the fixtures the tests use.
//! Run: `cargo bench -p keyward-webhooks --bench decide`.
#![allow(clippy::unwrap_used)] // a panic is the benchmark failure report

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use keyward_webhooks::review::AdmissionReview;
use keyward_webhooks::{decide, ProfileSet, RequestFacts, Requester};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn bench(c: &mut Criterion) {
    let profiles = ProfileSet::builtin().unwrap();
    let operator = "system:serviceaccount:opendatahub:trustyai-service-operator-controller-manager";
    let lmeval = fixture("lmeval-driver-pod.json");
    let facts = RequestFacts::pod_create("team-a", Requester::User(operator.into()));

    c.bench_function("decide/lmeval-inject", |b| b.iter(|| decide(black_box(&facts), black_box(&lmeval), &profiles)));

    let injected = match decide(&facts, &lmeval, &profiles).outcome {
        Ok(m) => m.pod.unwrap(),
        Err(d) => panic!("{}", d.message),
    };
    c.bench_function("decide/lmeval-reinvocation-noop", |b| {
        b.iter(|| decide(black_box(&facts), black_box(&injected), &profiles))
    });

    let mut unselected = lmeval.clone();
    unselected["metadata"]["labels"] = serde_json::json!({"app": "web"});
    c.bench_function("decide/no-profile", |b| b.iter(|| decide(black_box(&facts), black_box(&unselected), &profiles)));

    let body =
        std::fs::read(format!("{}/../tests/fixtures/admissionreview-lmeval.json", env!("CARGO_MANIFEST_DIR"))).unwrap();
    c.bench_function("review/parse-decide-respond", |b| {
        b.iter(|| {
            let request = AdmissionReview::parse_request(black_box(&body)).unwrap();
            let decision = decide(&request.facts(), request.object.as_ref().unwrap(), &profiles);
            serde_json::to_vec(&AdmissionReview::respond(&request.uid, &decision).unwrap()).unwrap()
        })
    });

    c.bench_function("profiles/load-builtin", |b| b.iter(|| ProfileSet::builtin().unwrap()));
}

criterion_group!(benches, bench);
criterion_main!(benches);
