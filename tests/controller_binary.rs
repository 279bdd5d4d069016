//! `keyward controller`, the real binary, against the in-process fake API served over HTTP:
//! profiles mounted kubelet-style and changed while it runs.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

#[path = "../controller/tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use keyward_certs::testing::KubeletVolume;
use keyward_engine::match_conditions::match_expression;
use keyward_engine::ProfileSet;
use serde_json::{json, Value};
use support::*;

const EXTRA: &str = "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {name: extra}\nspec:\n  selector: {matchLabels: {app: extra}}\n  requesters: {usernames: [bot]}\n  inject: {apiToken: remove}\n";
const ROUTER: &str = "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {name: router}\nspec:\n  selector: {matchLabels: {app: router}}\n  requesters: {usernames: [router-operator]}\n  inject:\n    serviceAccount: {name: keyward-router, provider: keyward}\n";

/// The expression the controller should keep, for the built-ins plus `files`.
fn expression(files: &[(&str, &str)]) -> String {
    let extra = ProfileSet::from_sources(files.iter().map(|(n, t)| (n.to_string(), t.to_string()))).unwrap();
    match_expression(&ProfileSet::builtin().unwrap().overlay(extra).unwrap())
}

fn conditions(f: &FakeApi) -> Value {
    f.get("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "", "keyward").unwrap()["webhooks"][0]
        ["matchConditions"][0]["expression"]
        .clone()
}

#[test]
fn the_controller_takes_a_profile_change_without_a_restart_and_keeps_the_last_good_set() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "keyward"},
        "webhooks": [{"name": "pods.keyward.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"service": {"name": "keyward", "namespace": "keyward-system"}},
            "matchConditions": [{"name": "selected-by-a-keyward-profile", "expression": "false"}]}]}));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = runtime.block_on(fake.kubeconfig(dir.path(), "default"));
    let ca_dir = dir.path().join("client-ca");
    std::fs::create_dir(&ca_dir).unwrap();
    std::fs::write(ca_dir.join("tls.crt"), certs_fixture("ca-ec256.crt")).unwrap();
    std::fs::write(ca_dir.join("tls.key"), certs_fixture("ca-ec256-sec1.key")).unwrap();
    let profiles = dir.path().join("profiles");
    std::fs::create_dir(&profiles).unwrap();
    let mut volume = KubeletVolume::new(&profiles, &[("extra.yaml", EXTRA.as_bytes())]);

    let mut child = Command::new(env!("CARGO_BIN_EXE_keyward"))
        .args(["controller", "--identity", "t", "--metrics-listen", "off", "--log-format", "json"])
        .args(["--cert-poll-interval", "1h", "--resync-interval", "1h"])
        .arg("--client-ca-dir")
        .arg(&ca_dir)
        .arg("--profiles")
        .arg(&profiles)
        .arg("--provision-accounts")
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, logs) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&line) {
                if tx.send(v).is_err() {
                    return;
                }
            }
        }
    });
    let wait_log = |message: &str| loop {
        let v = logs.recv_timeout(LIMIT).unwrap_or_else(|e| panic!("no log line {message:?}: {e}"));
        if v["message"].as_str().is_some_and(|m| m.starts_with(message)) {
            return v;
        }
    };

    // At start: the configuration follows the profiles it runs with.
    let first = expression(&[("extra.yaml", EXTRA)]);
    runtime.block_on(fake.until(LIMIT, |f| (conditions(f) == first.as_str()).then_some(())));

    // A new profile arrives through the volume: provisioned, and sent pods, without a restart.
    volume.rotate(&[("extra.yaml", EXTRA.as_bytes()), ("router.yaml", ROUTER.as_bytes())]);
    let reloaded = wait_log("profiles reloaded");
    assert_eq!(
        reloaded["profiles"],
        "[\"lmeval\", \"kfp-persistence-agent\", \"kfp-scheduled-workflow\", \"extra\", \"router\"]"
    );
    runtime.block_on(fake.until(LIMIT, |f| f.get("v1", "ServiceAccount", "team-a", "keyward-router")));
    let second = expression(&[("extra.yaml", EXTRA), ("router.yaml", ROUTER)]);
    runtime.block_on(fake.until(LIMIT, |f| (conditions(f) == second.as_str()).then_some(())));

    // A bad set: refused whole, the last good one kept (nothing removed, nothing re-patched).
    fake.clear_calls();
    volume.rotate(&[("router.yaml", ROUTER.replace("app: router", "").as_bytes())]);
    let refused = wait_log("profiles refused");
    assert!(refused["error"].as_str().unwrap().contains("router.yaml"), "{refused}");
    assert!(fake.get("v1", "ServiceAccount", "team-a", "keyward-router").is_some());
    assert_eq!(conditions(&fake), second.as_str());
    let writes: Vec<Call> = fake.writes().into_iter().filter(|c| !c.resource.ends_with("/leases")).collect();
    assert!(writes.is_empty(), "{writes:#?}");

    child.kill().unwrap();
    child.wait().unwrap();
}

/// The default install grants no rights on ServiceAccounts or RoleBindings: a profile that
/// provides one is refused at start, naming the flag and the component that grant them.
#[test]
fn a_profile_that_provides_an_account_needs_provision_accounts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("router.yaml"), ROUTER).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_keyward"))
        .args(["controller", "--identity", "t", "--metrics-listen", "off"])
        .arg("--client-ca-dir")
        .arg(dir.path())
        .arg("--profiles")
        .arg(dir.path())
        .env("KUBECONFIG", dir.path().join("no-kubeconfig"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("profiles router provide service accounts (provider: keyward): give --provision-accounts, with the rights it needs (kustomize component deploy/components/account-provisioning)"),
        "{stderr}"
    );
}
