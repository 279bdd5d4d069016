//! `keyward controller`, the real binary, against the in-process fake API server served over
//! HTTP on loopback, at scale: 10,000 LMEvalJobs, each with an attested driver pod, across 100
//! opted-in namespaces. It measures the time to issue every client certificate, the requests
//! each owner cost, the requests a minute once nothing changes (by kind), the cost of a new
//! owner then, and the controller's peak resident memory (its own process, not the fake's).
//!
//! Run: `cargo bench --bench controller` (or `scripts/bench.sh`). Bounded; stops by itself.
//! Knobs: KEYWARD_BENCH_OWNERS (default 10000), KEYWARD_BENCH_STEADY_SECONDS (default 30),
//! KEYWARD_BENCH_LOG (a file for the controller's log).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the benchmark failure report

#[path = "../controller/tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

/// The keyward binary to run: `KEYWARD_BIN` when set (another build of it, to compare), else
/// the one cargo built with this benchmark.
fn keyward_bin() -> std::ffi::OsString {
    std::env::var_os("KEYWARD_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_keyward").into())
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Peak and current resident memory of a process, in MiB.
fn memory(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// The controller container's environment variable `name` in deploy/base/controller.yaml (the
/// benchmark runs the controller as the Deployment does).
fn deployed_env(name: &str) -> String {
    // Read when run, not included at build: the image's build context leaves deploy/ out.
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/base/controller.yaml")).unwrap();
    let mut lines = manifest.lines().skip_while(|l| l.trim() != format!("- name: {name}"));
    lines
        .nth(1)
        .and_then(|l| l.trim().strip_prefix("value: "))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| panic!("deploy/base/controller.yaml sets no {name}"))
}

/// Requests by `METHOD resource`, leaving out watches (long-lived streams) when asked.
fn by_kind(calls: &[Call]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for c in calls {
        let kind = if c.query.contains("watch=true") { "WATCH" } else { c.method.as_str() };
        *out.entry(format!("{kind} {}", c.resource)).or_insert(0) += 1;
    }
    out
}

async fn wait_for_secrets(fake: &FakeApi, n: usize, limit: Duration) -> Duration {
    let started = Instant::now();
    // A benchmark polls the fake's state; tests wait on its events instead.
    while fake.count("/v1/secrets") < n {
        assert!(started.elapsed() < limit, "only {} of {n} Secrets after {limit:?}", fake.count("/v1/secrets"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let owners = env_or("KEYWARD_BENCH_OWNERS", 10_000);
    let steady = Duration::from_secs(env_or("KEYWARD_BENCH_STEADY_SECONDS", 30) as u64);
    let namespaces = 100.min(owners.max(1));
    let fake = FakeApi::default();

    // The attestation key, made beforehand so the pods can be attested as the webhook would.
    let key = keyward_certs::attestation::generate().unwrap();
    let keys = keyward_certs::attestation::Keys {
        current: Some(keyward_certs::attestation::Key::from_bytes(&key, "current").unwrap()),
        previous: None,
    };
    fake.seed(json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "keyward-attestation", "namespace": "keyward-system",
            "labels": {"app.kubernetes.io/managed-by": "keyward", "keyward.io/provisioned-for": "attestation"},
            "annotations": {"keyward.io/rotated-at": "2099-01-01T00:00:00Z"}},
        "data": {"current": b64(key)}}));
    let server_ca = keyward_certs::pki::Ca::mint("lm-eval gRPC", now(), Duration::from_secs(86400)).unwrap();
    fake.seed(json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "grpc-server-cert", "namespace": "lm-eval"}, "data": {"ca.crt": b64(server_ca.cert_pem())}}));
    for n in 0..namespaces {
        fake.seed(opted_in(&format!("team-{n}")));
    }
    for i in 0..owners {
        let ns = format!("team-{}", i % namespaces);
        let (name, uid) = (format!("job-{i}"), format!("uid-{i}"));
        fake.seed(lmevaljob(&ns, &name, &uid));
        fake.seed(fms_pod(Some(&keys), &ns, &name, &name, &uid));
    }
    let existing = fake.count("/v1/secrets");

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = fake.kubeconfig(dir.path(), "default").await;
    let ca_dir = dir.path().join("client-ca");
    std::fs::create_dir(&ca_dir).unwrap();
    std::fs::write(ca_dir.join("tls.crt"), certs_fixture("ca-ec256.crt")).unwrap();
    std::fs::write(ca_dir.join("tls.key"), certs_fixture("ca-ec256-sec1.key")).unwrap();

    // KEYWARD_BENCH_LOG=FILE keeps the controller's log there.
    let log_file = std::env::var("KEYWARD_BENCH_LOG").ok().map(|p| std::fs::File::create(p).unwrap());
    let log = log_file.as_ref();
    let started = Instant::now();
    let mut child = Command::new(keyward_bin())
        .args([
            "controller",
            "--identity",
            "bench",
            "--namespace",
            "keyward-system",
            "--metrics-listen",
            "off",
            "--log-format",
            "json",
        ])
        .arg("--client-ca-dir")
        .arg(&ca_dir)
        .env("KUBECONFIG", &kubeconfig)
        .env("MALLOC_ARENA_MAX", deployed_env("MALLOC_ARENA_MAX"))
        .env("RUST_LOG", if log.is_some() { "info" } else { "warn" })
        .stdout(log.map_or_else(Stdio::null, |f| Stdio::from(f.try_clone().unwrap())))
        .stderr(log.map_or_else(Stdio::null, |f| Stdio::from(f.try_clone().unwrap())))
        .spawn()
        .unwrap();
    let pid = child.id();
    let issue_all = wait_for_secrets(&fake, existing + owners, Duration::from_secs(1800)).await;
    let leading_at = fake
        .calls()
        .iter()
        .find(|c| c.resource == "coordination.k8s.io/v1/leases" && c.method != "GET" && c.status < 300)
        .map(|c| c.at)
        .unwrap();
    let since_leading = issue_all.saturating_sub(leading_at.duration_since(started));
    let issuing_calls = fake.calls();
    let issuing = by_kind(&issuing_calls);
    let per_owner: usize = issuing_calls
        .iter()
        .filter(|c| {
            !c.query.contains("watch=true")
                && c.resource != "coordination.k8s.io/v1/leases"
                && (c.resource.ends_with("lmevaljobs") || c.resource == "/v1/secrets")
                && c.namespace.starts_with("team-")
        })
        .count();
    let (peak_issue, _) = memory(pid);

    // Nothing changes: what a minute costs.
    // Let the first resync's reads finish before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    fake.clear_calls();
    tokio::time::sleep(steady).await;
    let quiet = by_kind(&fake.calls());
    let scale = 60.0 / steady.as_secs_f64();

    // New owners in steady state.
    let new = 100;
    fake.clear_calls();
    for i in owners..owners + new {
        let ns = format!("team-{}", i % namespaces);
        let (name, uid) = (format!("job-{i}"), format!("uid-{i}"));
        fake.seed(lmevaljob(&ns, &name, &uid));
        fake.seed(fms_pod(Some(&keys), &ns, &name, &name, &uid));
    }
    wait_for_secrets(&fake, existing + owners + new, Duration::from_secs(120)).await;
    let new_calls: Vec<Call> = fake
        .calls()
        .into_iter()
        .filter(|c| {
            !c.query.contains("watch=true")
                && c.resource != "coordination.k8s.io/v1/leases"
                && !c.resource.starts_with("events")
        })
        .collect();
    let (peak, rss) = memory(pid);
    let _ = child.kill();
    let _ = child.wait();

    println!("owners: {owners} in {namespaces} namespaces (attested driver pods), 8 workers, the fake over HTTP/1.1 on loopback");
    println!(
        "issue all: {:.1} s from start ({:.1} s from leading); {:.0} owners/s",
        issue_all.as_secs_f64(),
        since_leading.as_secs_f64(),
        owners as f64 / since_leading.as_secs_f64().max(0.001)
    );
    println!(
        "requests per owner while issuing (owner GETs and Secret writes in the namespaces): {:.2}",
        per_owner as f64 / owners as f64
    );
    println!("all requests while issuing, by kind:");
    for (kind, n) in &issuing {
        println!("  {n:>7}  {kind}");
    }
    println!("steady state, requests per minute by kind (measured over {} s):", steady.as_secs());
    for (kind, n) in &quiet {
        println!("  {:>7.1}  {kind}", *n as f64 * scale);
    }
    println!(
        "a new owner in steady state: {:.2} requests ({} owners: {:?})",
        new_calls.len() as f64 / new as f64,
        new,
        by_kind(&new_calls)
    );
    let arenas = deployed_env("MALLOC_ARENA_MAX");
    println!("controller memory (MALLOC_ARENA_MAX={arenas}, as deployed): peak {peak_issue:.1} MiB while issuing, peak {peak:.1} MiB overall, {rss:.1} MiB at the end");
}
