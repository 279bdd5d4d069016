//! `keyward audit -A`, the real binary, against the in-process fake API served over HTTP on
//! loopback: 10,000 pods in 100 namespaces, 1,000 of them fms driver pods keyward injected (with
//! their owners and the objects they depend on), the rest pods no profile selects. It measures
//! the audit's wall time, the pages it listed and the requests it made by kind; and, as a floor on the same machine in the same run, the time to list the same pods
//! in the same pages with a bare client that does nothing with them.
//!
//! Run: `cargo bench --bench audit` (or `scripts/bench.sh`). Knob: KEYWARD_BENCH_PODS (10000).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the benchmark failure report

#[path = "../controller/tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use serde_json::json;
use support::*;

/// The keyward binary to run: `KEYWARD_BIN` when set (another build of it, to compare), else
/// the one cargo built with this benchmark.
fn keyward_bin() -> std::ffi::OsString {
    std::env::var_os("KEYWARD_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_keyward").into())
}

fn main() {
    let pods: usize = std::env::var("KEYWARD_BENCH_PODS").ok().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    let injected = pods / 10;
    let namespaces = 100;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let fake = FakeApi::default();
    for n in 0..namespaces {
        let ns = format!("team-{n}");
        fake.seed(opted_in(&ns));
        fake.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keyward-lmeval-server-ca", "namespace": ns}, "data": {"ca.crt": "x"}}));
    }
    let ca = keyward_certs::pki::Ca::mint("bench", now(), std::time::Duration::from_secs(30 * 86_400)).unwrap();
    for i in 0..pods {
        let ns = format!("team-{}", i % namespaces);
        if i < injected {
            let (name, uid) = (format!("job-{i}"), format!("uid-{i}"));
            fake.seed(lmevaljob(&ns, &name, &uid));
            fake.seed(fms_pod(None, &ns, &name, &name, &uid));
            let owner =
                json!({"apiVersion": OWNER_API, "kind": "LMEvalJob", "name": name, "uid": uid, "controller": true});
            fake.seed(managed_secret(
                &ns,
                &format!("{name}-lmeval-client"),
                owner,
                json!({"tls.crt": b64(ca.cert_pem())}),
            ));
        } else {
            fake.seed(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("web-{i}"), "namespace": ns, "labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx", "env": [{"name": "A", "value": "b"}]}]}}));
        }
    }
    let addr = runtime.block_on(fake.serve_http());
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"http://{addr}\"}}}}]\nusers: [{{name: u, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: fake, user: u, namespace: default}}}}]\ncurrent-context: c\n"
    )).unwrap();

    // The floor: the same pages of the same pods, listed and decoded, nothing else.
    fake.clear_calls();
    let started = Instant::now();
    runtime.block_on(async {
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let api = kube::Api::<Pod>::all(client);
        let mut params = ListParams::default().limit(500);
        loop {
            let page = api.list(&params).await.unwrap();
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    });
    let floor = started.elapsed();

    fake.clear_calls();
    let started = Instant::now();
    let out = Command::new(keyward_bin())
        .args(["audit", "-A", "-o", "json", "--kubeconfig"])
        .arg(&kubeconfig)
        .env_remove("KEYWARD_PROFILES")
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for c in fake.calls() {
        *by_kind.entry(format!("{} {}", c.method, c.resource)).or_insert(0) += 1;
    }
    println!("### keyward audit -A: {pods} pods in {namespaces} namespaces, {injected} of them injected");
    println!();
    println!("| pods | pages | audit s | floor (list only) s | audit / floor | findings |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {:.2} | {:.2} | {:.1}× | {} |",
        report["summary"]["podsListed"],
        report["summary"]["pages"],
        took.as_secs_f64(),
        floor.as_secs_f64(),
        took.as_secs_f64() / floor.as_secs_f64(),
        report["summary"]["findings"]
    );
    println!();
    println!("requests by kind: {by_kind:?}");
    println!("findings by kind: {}", report["summary"]["byFinding"]);
}
