//! `keyward audit` and `keyward explain --cluster`, the real binary, against the in-process fake
//! API served over HTTP (a kubeconfig pointing at it): cluster states that produce every finding,
//! and a clean one that produces none; the table and the JSON checked, and the exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

#[path = "../controller/tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

/// The webhook configuration `keyward manifests webhook` renders from the built-ins, as the
/// apiserver stores it (created on 1 November).
fn webhook_config() -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_keyward")).args(["manifests", "webhook"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut config: Value = serde_saphyr::from_str(&text).unwrap();
    config["metadata"]["creationTimestamp"] = json!("2026-11-01T00:00:00Z");
    config
}

/// How long keyward's controller makes its client certificates valid by default
/// (`--client-cert-validity`, src/controller.rs).
const CONTROLLER_VALIDITY: Duration = Duration::from_secs(24 * 3600);

/// A client certificate Secret as the controller writes it, issued `ago` and valid for
/// `validity`; with when it is due for renewal (two thirds of its life) and when it expires
/// (RFC 3339): minted on a whole second, as X.509 records it.
fn certificate_issued(namespace: &str, name: &str, ago: Duration, validity: Duration) -> (Value, String, String) {
    let seconds = now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() - ago.as_secs();
    let start = std::time::UNIX_EPOCH + Duration::from_secs(seconds);
    let ca = keyward_certs::pki::Ca::mint("keyward client CA", start, validity).unwrap();
    let owner = json!({"apiVersion": OWNER_API, "kind": "LMEvalJob", "name": name.trim_end_matches("-lmeval-client"), "uid": "u", "controller": true});
    let secret = managed_secret(
        namespace,
        name,
        owner,
        json!({"tls.crt": b64(ca.cert_pem()), "tls.key": b64("k"), "ca.crt": b64(ca.cert_pem())}),
    );
    // As the controller reckons it, from the certificate (which the CA backdates).
    let renew = keyward_controller::identity::renew_at(Some(ca.cert_pem().as_bytes())).unwrap();
    (secret, keyward_certs::rfc3339(renew), keyward_certs::rfc3339(start + validity))
}

/// An fms driver pod keyward injected (`support::fms_pod`: the engine's own patch), created at
/// `created`, for the owner `owner` with `uid`.
fn injected(name: &str, owner: &str, uid: &str) -> Value {
    let mut pod = fms_pod(None, "team-a", name, owner, uid);
    pod["metadata"]["creationTimestamp"] = json!("2026-11-30T10:00:00Z");
    pod
}

/// The same pod as the operator submits it: never injected.
fn plain(namespace: &str, name: &str, created: &str) -> Value {
    let mut pod = fixture("lmeval-fms-driver-pod.json");
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]["namespace"] = json!(namespace);
    pod["metadata"]["uid"] = json!(format!("uid-{name}"));
    pod["metadata"]["creationTimestamp"] = json!(created);
    pod
}

/// keyward's own Deployment, available or not (with the Deployment controller's message).
fn deployment(name: &str, available: bool) -> Value {
    let (status, message) = if available {
        ("True", "Deployment has minimum availability.")
    } else {
        ("False", "Deployment does not have minimum availability.")
    };
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "keyward-system"},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "keyward"}]}}},
        "status": {"conditions": [{"type": "Available", "status": status, "reason": "MinimumReplicasAvailable", "message": message}]}})
}

/// The controller's Lease, renewed `ago` seconds ago for 15 seconds.
fn lease(ago: u64) -> Value {
    let renewed = keyward_certs::rfc3339(now() - Duration::from_secs(ago));
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "keyward-controller", "namespace": "keyward-system"},
        "spec": {"holderIdentity": "keyward-controller-7d9f-abcde", "leaseDurationSeconds": 15, "renewTime": renewed}})
}

/// The serving Secret cert-manager writes, for the Service's name, and the CA that signed it.
fn serving(fake: &FakeApi) -> keyward_certs::pki::Ca {
    let ca = keyward_certs::pki::Ca::mint("keyward serving CA", now(), Duration::from_secs(90 * 86_400)).unwrap();
    let leaf =
        ca.issue_serving(&["keyward.keyward-system.svc".to_string()], now(), Duration::from_secs(30 * 86_400)).unwrap();
    fake.seed(json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": {"name": "keyward-serving", "namespace": "keyward-system"},
        "data": {"tls.crt": b64(&leaf.cert_pem), "tls.key": b64(&leaf.key_pem), "ca.crt": b64(ca.cert_pem())}}));
    ca
}

/// What every state has: the namespaces, keyward installed and running, and one healthy
/// injected pod with everything it depends on.
fn healthy() -> FakeApi {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(namespace("team-b"));
    let ca = serving(&fake);
    let mut config = webhook_config();
    config["webhooks"][0]["clientConfig"]["caBundle"] = json!(b64(ca.cert_pem()));
    fake.seed(config);
    fake.seed(deployment("keyward", true));
    fake.seed(deployment("keyward-controller", true));
    fake.seed(lease(3));
    fake.seed(lmevaljob("team-a", "good", "uid-good-job"));
    fake.seed(injected("good", "good", "uid-good-job"));
    // Just issued, as the controller issues by default: it ends within a day, and is healthy.
    fake.seed(certificate_issued("team-a", "good-lmeval-client", Duration::ZERO, CONTROLLER_VALIDITY).0);
    fake.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keyward-lmeval-server-ca", "namespace": "team-a"}, "data": {"ca.crt": "x"}}));
    // Not keyward's concern: not counted.
    fake.seed(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "team-a", "labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}));
    fake
}

fn audit(fake: &FakeApi, args: &[&str]) -> Output {
    let mut all = vec!["audit", "--kubeconfig", "{kubeconfig}"];
    all.extend_from_slice(args);
    against(fake, &all)
}

/// Runs keyward with `args`, `{kubeconfig}` standing for a kubeconfig that points at the fake.
fn against(fake: &FakeApi, args: &[&str]) -> Output {
    run_against(std::path::Path::new(env!("CARGO_BIN_EXE_keyward")), fake, args)
}

/// The same, running `program` (keyward under another name).
fn run_against(program: &std::path::Path, fake: &FakeApi, args: &[&str]) -> Output {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = runtime.block_on(fake.kubeconfig(dir.path(), "team-a"));
    let path = kubeconfig.to_str().unwrap();
    let out = Command::new(program)
        .args(args.iter().map(|a| if *a == "{kubeconfig}" { path } else { a }))
        .env_remove("KEYWARD_PROFILES")
        .output()
        .unwrap();
    drop(runtime);
    out
}

/// The findings a table shows, as the JSON report states them (a cluster finding has empty
/// `namespace` and `pod`, a finding of no profile a null `profile`).
fn findings_in_table(table: &str) -> Vec<Value> {
    let lines: Vec<&str> = table.lines().collect();
    let header = lines[0];
    let column = |name: &str| header.find(name).unwrap();
    let (pod, profile, finding, detail) = (column("POD"), column("PROFILE"), column("FINDING"), column("DETAIL"));
    lines[1..lines.len() - 1]
        .iter()
        .map(|line| {
            let namespace = line[..pod].trim();
            let dash = |v: &str| (v != "-").then(|| v.to_string());
            json!({
                "namespace": if namespace == "(cluster)" { "" } else { namespace },
                "pod": dash(line[pod..profile].trim()).unwrap_or_default(),
                "profile": dash(line[profile..finding].trim()),
                "finding": line[finding..detail].trim(),
                "detail": &line[detail..],
            })
        })
        .collect()
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).unwrap()
}

/// The built-in lmeval profile with delivery: auto (its server CA still a copied ConfigMap),
/// written to a file in `dir`.
fn auto_profile(dir: &std::path::Path) -> std::path::PathBuf {
    let auto = std::fs::read_to_string("webhooks/profiles/lmeval.yaml").unwrap().replace(
        "      secretName: \"{owner.name}-lmeval-client\"\n",
        "      delivery: auto\n      secretName: \"{owner.name}-lmeval-client\"\n      podCertificate: {signerName: keyward.io/lmeval}\n",
    );
    assert!(auto.contains("delivery: auto"));
    let path = dir.join("lmeval-auto.yaml");
    std::fs::write(&path, &auto).unwrap();
    path
}

/// Makes discovery say the cluster serves PodCertificateRequest v1beta1 (the fake serves a
/// version once it holds an object of it): one request, for a pod of team-a.
fn serves_pod_certificates(fake: &FakeApi) {
    let pod = fms_pod(None, "team-a", "p", "good", "uid-good-job");
    let key = support::pcr::KeyField::Pkix(b"key");
    fake.seed(support::pcr::request("certificates.k8s.io/v1beta1", "req-1", &pod, "keyward.io/lmeval", key));
}

#[test]
fn a_healthy_cluster_has_no_findings_and_exits_0() {
    let fake = healthy();
    let out = audit(&fake, &["-A"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(text(&out.stdout), "no findings; 1 of 2 pods concern keyward, in 1 namespace (1 page read)\n");
    // Read-only: not one write.
    assert!(fake.attempted_writes().is_empty(), "{:#?}", fake.attempted_writes());
}

/// Issue 57: the shipped daily CronJob, with its own arguments, exits 0 on a healthy cluster
/// whose certificates the controller issued with its default validity (24 hours, which always
/// ends within the old 7-day warning), and 1 once a renewal is overdue.
#[test]
fn the_shipped_cronjob_is_green_on_a_healthy_cluster_and_red_on_an_overdue_renewal() {
    let cronjob: Value =
        serde_saphyr::from_str(&std::fs::read_to_string("deploy/audit/cronjob.yaml").unwrap()).unwrap();
    let container = &cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args[0], "audit");
    let mut with_kubeconfig = args.clone();
    with_kubeconfig.extend(["--kubeconfig", "{kubeconfig}"]);
    let fake = healthy();
    // Twelve hours into its life: well before the renewal at sixteen.
    fake.seed(
        certificate_issued("team-a", "good-lmeval-client", Duration::from_secs(12 * 3600), CONTROLLER_VALIDITY).0,
    );
    let out = against(&fake, &with_kubeconfig);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["findings"], json!([]), "{report:#}");
    // Seventeen hours in, the controller is an hour late: a finding, and exit 1.
    fake.seed(
        certificate_issued("team-a", "good-lmeval-client", Duration::from_secs(17 * 3600), CONTROLLER_VALIDITY).0,
    );
    let out = against(&fake, &with_kubeconfig);
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["findings"][0]["finding"], "expiring", "{report:#}");
    // --expiry-warning, asked for, reports a healthy certificate that ends within it.
    fake.seed(certificate_issued("team-a", "good-lmeval-client", Duration::ZERO, CONTROLLER_VALIDITY).0);
    let out = audit(&fake, &["-A", "--expiry-warning", "2d"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("within --expiry-warning"), "{}", text(&out.stdout));
}

#[test]
fn every_finding_is_reported_with_what_to_do_and_exits_1() {
    let fake = healthy();
    // not-injected: created after the install (the webhook was not called), before it, in a
    // namespace that did not opt in, and opted out.
    fake.seed(plain("team-a", "missed", "2026-11-30T09:00:00Z"));
    fake.seed(plain("team-a", "older", "2026-10-01T00:00:00Z"));
    fake.seed(plain("team-b", "elsewhere", "2026-11-30T09:00:00Z"));
    let mut opted_out = plain("team-a", "opted-out", "2026-11-30T09:00:00Z");
    opted_out["metadata"]["labels"]["keyward.io/inject"] = json!("disabled");
    fake.seed(opted_out);
    // claim-mismatch: keyward's record copied onto a pod keyward never admitted (anyone who
    // creates a pod writes its annotations): the mounts it claims are not there.
    let record = injected("x", "good", "uid-good-job")["metadata"]["annotations"]["keyward.io/injected"].clone();
    let mut forged = plain("team-a", "forged", "2026-11-30T09:00:00Z");
    forged["metadata"]["annotations"]["keyward.io/injected"] = record;
    fake.seed(forged);
    // stale: no profile selects it any more (its label changed).
    let mut stale = injected("relabelled", "good", "uid-good-job");
    stale["metadata"]["labels"]["app.kubernetes.io/name"] = json!("something-else");
    fake.seed(stale);
    // expiring: issued 20 hours ago for 24, so due for renewal 4 hours ago; and an orphan
    // whose Secret is gone too.
    fake.seed(lmevaljob("team-a", "soon", "uid-soon-job"));
    fake.seed(injected("soon", "soon", "uid-soon-job"));
    let (secret, renew, expiry) =
        certificate_issued("team-a", "soon-lmeval-client", Duration::from_secs(20 * 3600), CONTROLLER_VALIDITY);
    fake.seed(secret);
    fake.seed(injected("orphan", "gone", "uid-gone-job"));
    // The configuration's matchConditions drifted.
    let mut config =
        fake.get("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "", "keyward").unwrap();
    config["webhooks"][0]["matchConditions"][0]["expression"] = json!("false");
    fake.seed(config);

    // The table, whole: one line per finding, grouped by namespace, and the summary.
    let out = audit(&fake, &["-A"]);
    assert_eq!(out.status.code(), Some(1));
    let table = text(&out.stdout);
    let generated = serde_json::to_string(&webhook_config()["webhooks"][0]["matchConditions"]).unwrap();
    let expected = TABLE_OF_EVERY_FINDING
        .replace("{renew}", &renew)
        .replace("{expiry}", &expiry)
        .replace("{generated}", &generated);
    assert_eq!(table, expected, "got:\n{table}");

    // The JSON says the same, finding for finding.
    let out = audit(&fake, &["-A", "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["findings"], json!(findings_in_table(&expected)), "{report:#}");
    assert_eq!(
        report["summary"],
        json!({"findings": 10, "byFinding": {"claim-mismatch": 1, "expiring": 1, "missing-dependency": 1, "not-injected": 4, "owner-gone": 1, "stale": 1, "webhook-config": 1}, "podsListed": 10, "podsAudited": 9, "namespaces": 2, "pages": 1})
    );
    assert_eq!(report["notes"], json!([]));

    // One namespace (the context's by default), and without reading Secrets.
    fake.clear_calls();
    let out = audit(&fake, &["--no-secrets", "-o", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: Vec<&str> =
        report["findings"].as_array().unwrap().iter().map(|f| f["finding"].as_str().unwrap()).collect();
    assert!(!kinds.contains(&"expiring") && !kinds.contains(&"missing-dependency"), "{kinds:?}");
    assert!(report["findings"].as_array().unwrap().iter().all(|f| f["namespace"] != "team-b"));
    assert_eq!(
        report["notes"][0],
        "--no-secrets: Secrets were not read, so missing Secrets and expiring client certificates are not reported"
    );
    assert!(fake.calls().iter().all(|c| !c.resource.ends_with("/secrets")), "{:#?}", fake.calls());
}

#[test]
fn an_unreachable_or_forbidding_cluster_exits_2_naming_the_permission() {
    let fake = healthy();
    fake.fail("GET", "/v1/pods", 403, usize::MAX);
    let out = audit(&fake, &["-A"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.starts_with("keyward: error: forbidden: list pods in any namespace; keyward audit needs the read-only ClusterRole in deploy/audit/rbac.yaml"), "{err}");
    assert!(out.stdout.is_empty());

    let out =
        Command::new(env!("CARGO_BIN_EXE_keyward")).args(["audit", "--kubeconfig", "/no/such/file"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).starts_with("keyward: error: --kubeconfig /no/such/file:"), "{}", text(&out.stderr));
}

#[test]
fn as_kubectls_plugin_it_is_the_same_audit_and_its_usage_says_kubectl_keyward() {
    // kubectl runs `kubectl-keyward` from the PATH, with that path as argv[0].
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("kubectl-keyward");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_keyward"), &plugin).unwrap();
    let fake = healthy();
    fake.seed(injected("orphan", "gone", "uid-gone-job"));
    let args = ["audit", "--kubeconfig", "{kubeconfig}", "-n", "team-a"];
    let as_plugin = run_against(&plugin, &fake, &args);
    let direct = against(&fake, &args);
    assert_eq!(as_plugin.status.code(), Some(1), "{}", text(&as_plugin.stderr));
    assert_eq!(text(&as_plugin.stdout), text(&direct.stdout));

    let help = Command::new(&plugin).args(["audit", "--help"]).output().unwrap();
    assert!(text(&help.stdout).contains("\nUsage: kubectl keyward audit [OPTIONS]\n"), "{}", text(&help.stdout));
    let wrong = Command::new(&plugin).args(["audit", "--bogus"]).output().unwrap();
    assert_eq!(wrong.status.code(), Some(2));
    assert!(text(&wrong.stderr).contains("Usage: kubectl keyward audit [OPTIONS]"), "{}", text(&wrong.stderr));
    // Under its own name, its own usage.
    let help = Command::new(env!("CARGO_BIN_EXE_keyward")).args(["audit", "--help"]).output().unwrap();
    assert!(text(&help.stdout).contains("\nUsage: keyward audit [OPTIONS]\n"), "{}", text(&help.stdout));
}

#[test]
fn pods_are_read_in_pages() {
    let fake = healthy();
    for i in 0..1200 {
        fake.seed(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("web-{i}"), "namespace": "team-a", "labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}));
    }
    let out = audit(&fake, &["-A"]);
    assert_eq!(text(&out.stdout), "no findings; 1 of 1202 pods concern keyward, in 1 namespace (3 pages read)\n");
    let lists: Vec<String> =
        fake.calls().iter().filter(|c| c.resource == "/v1/pods").map(|c| c.query.clone()).collect();
    assert_eq!(lists.len(), 3, "{lists:?}");
    assert!(lists.iter().all(|q| q.contains("limit=500")), "{lists:?}");
}

#[test]
fn keyward_itself_is_checked_its_deployments_its_leader_and_the_ca_bundle() {
    let fake = healthy();
    fake.seed(deployment("keyward", false));
    fake.remove("apps/v1", "Deployment", "keyward-system", "keyward-controller");
    fake.seed(lease(600));
    // cert-manager renewed the serving certificate from a new CA, and the caBundle was not
    // updated (cainjector down): the apiserver no longer trusts keyward.
    let other = serving(&fake);
    drop(other);
    let out = audit(&fake, &["-A", "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let details: Vec<(String, String)> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["finding"].as_str().unwrap().to_string(), f["detail"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(details.len(), 4, "{details:#?}");
    assert_eq!(details[0].0, "ca-bundle");
    assert!(details[0].1.starts_with("webhook pods.keyward.io's caBundle does not verify the certificate in Secret keyward-system/keyward-serving as keyward.keyward-system.svc: "), "{}", details[0].1);
    assert_eq!(details[1], ("deployment-unavailable".into(), "keyward's controller Deployment keyward-system/keyward-controller does not exist: nothing is issued or renewed; kubectl -n keyward-system describe deployment keyward-controller".into()));
    assert_eq!(details[2], ("deployment-unavailable".into(), "keyward's webhook Deployment keyward-system/keyward is not available (Deployment does not have minimum availability): with failurePolicy Fail, pods in opted-in namespaces that a profile selects cannot be created; kubectl -n keyward-system describe deployment keyward".into()));
    assert_eq!(details[3], ("no-leader".into(), "the controller's Lease keyward-system/keyward-controller was last renewed by \"keyward-controller-7d9f-abcde\" and has lapsed: no replica leads, nothing is issued or renewed; see the controller's logs".into()));
}

#[test]
fn explain_resolves_delivery_auto_by_the_cluster_or_the_facts_file_and_says_which() {
    let dir = tempfile::tempdir().unwrap();
    let profile = auto_profile(dir.path());
    let profile = profile.to_str().unwrap();
    let pod = "tests/fixtures/lmeval-fms-driver-pod.json";
    let line = |out: &Output| {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let out = text(&out.stdout);
        out.lines().find(|l| l.contains("client certificate:")).unwrap_or_else(|| panic!("{out}")).trim().to_string()
    };
    let secret = "client certificate: Secret evaljob-sample-lmeval-client at /var/run/secrets/keyward/lmeval-client (delivery: auto: a Secret where keyward signs no pod certificates)";
    let signed = "client certificate: key made on the node, signed by keyward.io/lmeval (podCertificate, chosen by delivery: auto), at /var/run/secrets/keyward/lmeval-client";
    let fake = healthy();
    // Offline and told nothing: what the webhook does without the cluster facts.
    assert!(line(&against(&fake, &["explain", "--profiles", profile, pod])).ends_with(secret));
    // Offline, with the facts file the webhook reads.
    let facts = dir.path().join("facts.json");
    std::fs::write(&facts, "{\"podCertificates\":\"v1\"}\n").unwrap();
    let out = against(&fake, &["explain", "--profiles", profile, "--cluster-facts", facts.to_str().unwrap(), pod]);
    assert!(line(&out).ends_with(signed), "{}", line(&out));
    // --cluster: as keyward's controller decides there, by discovery; none served here yet.
    let cluster = ["explain", "--cluster", "--kubeconfig", "{kubeconfig}", "--profiles", profile, pod];
    assert!(line(&against(&fake, &cluster)).ends_with(secret));
    serves_pod_certificates(&fake);
    assert!(line(&against(&fake, &cluster)).ends_with(signed));
    assert!(fake.attempted_writes().is_empty(), "read-only");
}

#[test]
fn explain_cluster_reads_the_opt_in_and_which_dependencies_exist() {
    let fake = healthy();
    let pod = "tests/fixtures/lmeval-fms-driver-pod.json";
    let out = against(&fake, &["explain", "--cluster", "--kubeconfig", "{kubeconfig}", "-o", "json", pod]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["cluster"],
        json!({"namespace": "team-a", "namespaceExists": true, "optedIn": true, "requires": [
            {"kind": "Secret", "name": "evaljob-sample-lmeval-client", "providedBy": "keyward", "exists": false},
            {"kind": "ConfigMap", "name": "keyward-lmeval-server-ca", "providedBy": "keyward", "exists": true}
        ]})
    );
    let out = against(&fake, &["explain", "--cluster", "--kubeconfig", "{kubeconfig}", "-n", "team-b", pod]);
    let out = text(&out.stdout);
    assert!(out.contains("cluster:    namespace team-b is NOT labelled keyward.io/inject=enabled: the webhook is not called for its pods\n"), "{out}");
    assert!(out.contains("  - ConfigMap team-b/keyward-lmeval-server-ca: missing now (keyward's controller makes it when the namespace opts in or the pod is admitted)\n"), "{out}");
    assert!(fake.attempted_writes().is_empty(), "read-only");
}

#[test]
fn the_table_and_the_json_are_exactly_one_entry_per_finding_and_a_summary() {
    let fake = healthy();
    fake.seed(injected("orphan", "gone", "uid-gone-job"));
    let out = audit(&fake, &["-n", "team-a"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "NAMESPACE  POD     PROFILE  FINDING             DETAIL\n\
         team-a     orphan  lmeval   missing-dependency  Secret gone-lmeval-client does not exist: the pod cannot start (or restart) without it; if keyward provides it, see the controller's logs; otherwise create it\n\
         team-a     orphan  lmeval   owner-gone          its owner LMEvalJob gone does not exist: the pod is orphaned and its per-owner credentials are no longer renewed; delete the pod\n\
         2 findings (1 missing-dependency, 1 owner-gone); 2 of 3 pods concern keyward, in 1 namespace (1 page read)\n"
    );
    // The same state as JSON, whole.
    let out = audit(&fake, &["-n", "team-a", "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report,
        json!({
            "apiVersion": "keyward.io/v1alpha1",
            "kind": "AuditReport",
            "findings": [
                {"namespace": "team-a", "pod": "orphan", "finding": "missing-dependency", "profile": "lmeval",
                 "detail": "Secret gone-lmeval-client does not exist: the pod cannot start (or restart) without it; if keyward provides it, see the controller's logs; otherwise create it"},
                {"namespace": "team-a", "pod": "orphan", "finding": "owner-gone", "profile": "lmeval",
                 "detail": "its owner LMEvalJob gone does not exist: the pod is orphaned and its per-owner credentials are no longer renewed; delete the pod"}
            ],
            "summary": {"findings": 2, "byFinding": {"missing-dependency": 1, "owner-gone": 1}, "podsListed": 3, "podsAudited": 2, "namespaces": 1, "pages": 1},
            "notes": []
        })
    );
}

#[test]
fn a_pod_that_already_has_what_its_profile_injects_is_no_finding() {
    let fake = healthy();
    fake.seed(opted_in("kubeflow"));
    // The KFP persistence agent with its own token where the profile would put it, living long
    // enough for the agent's hourly re-read: the agent works, keyward would add only its
    // record. As the manifest deploys it (3600 s, kubeflow/pipelines #13290) the agent holds
    // an expired token every hour, and without the token it does not start: both need keyward.
    let mut long_lived = fixture("kfp-persistenceagent-pod.json");
    long_lived["spec"]["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] =
        json!(21600);
    for (mut pod, name) in [
        (long_lived, "agent-long"),
        (fixture("kfp-persistenceagent-pod.json"), "agent-hourly"),
        (fixture("kfp-persistenceagent-pod-no-token.json"), "agent-none"),
    ] {
        pod["metadata"]["name"] = json!(name);
        pod["metadata"]["creationTimestamp"] = json!("2026-11-30T09:00:00Z");
        fake.seed(pod);
    }
    let out = audit(&fake, &["-n", "kubeflow", "-o", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let found: Vec<(&str, &str)> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["pod"].as_str().unwrap(), f["finding"].as_str().unwrap()))
        .collect();
    assert_eq!(found, [("agent-hourly", "not-injected"), ("agent-none", "not-injected")], "{report:#}");
}

/// Issue 57: the fms driver as its operator still creates it (its own gRPC TLS env and mounts,
/// `patch4GrpcTLS`) is admitted unchanged under `onConflict: skip`; the audit says so, with the
/// conflict and the fix, where it was silent.
#[test]
fn a_selected_pod_keyward_skipped_on_a_conflict_is_not_injected_with_the_conflict() {
    let fake = healthy();
    let mut pod = fixture("lmeval-fms-driver-pod-grpc-tls.json");
    pod["metadata"]["name"] = json!("patched");
    pod["metadata"]["uid"] = json!("uid-patched");
    pod["metadata"]["creationTimestamp"] = json!("2026-11-30T09:00:00Z");
    fake.seed(pod);
    let out = audit(&fake, &["-n", "team-a", "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{report:#}");
    assert_eq!((findings[0]["pod"].as_str(), findings[0]["finding"].as_str()), (Some("patched"), Some("not-injected")));
    let detail = findings[0]["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("profile \"lmeval\" selects it, but keyward admitted it without its injection (onConflict: skip) because container \"main\" already sets GRPC_CLIENT_CERT (spec.containers[0].env[2])"),
        "{detail}"
    );
    assert!(detail.ends_with("; it works only with credentials of its own: remove what conflicts and recreate it, or narrow the profile if the pod is not its to serve"), "{detail}");
}

/// `keyward audit -A` on the state of `every_finding_is_reported_with_what_to_do_and_exits_1`;
/// `{renew}` and `{expiry}` are when the expiring certificate was due for renewal and expires, `{generated}` the matchConditions
/// `keyward manifests webhook` renders.
const TABLE_OF_EVERY_FINDING: &str = "\
NAMESPACE  POD         PROFILE  FINDING             DETAIL\n\
(cluster)  -           -        webhook-config      webhook pods.keyward.io matchConditions differs from what the profiles generate: the cluster has [{\"expression\":\"false\",\"name\":\"selected-by-a-keyward-profile\"}], keyward manifests webhook gives {generated}\n\
team-a     forged      lmeval   claim-mismatch      the keyward.io/injected record claims volume \"keyward-client-cert\" mounted at \"/var/run/secrets/keyward/lmeval-client\"; volume \"keyward-server-ca\" mounted at \"/var/run/secrets/keyward/lmeval-server-ca\", which the pod does not have: the record was written by hand or copied; recreate the pod\n\
team-a     missed      lmeval   not-injected        profile \"lmeval\" selects it, but it has no keyward injection: it was created while keyward's webhook was not called for it (down, failurePolicy Ignore, or a matchConditions gap); recreate it\n\
team-a     older       lmeval   not-injected        profile \"lmeval\" selects it, but it has no keyward injection: it was created at 2026-10-01T00:00:00Z, before keyward's webhook configuration (2026-11-01T00:00:00Z); recreate it\n\
team-a     opted-out   lmeval   not-injected        profile \"lmeval\" selects it, but it has no keyward injection: it is labelled keyward.io/inject=disabled (opted out); remove the label and recreate it if it needs credentials\n\
team-a     orphan      lmeval   missing-dependency  Secret gone-lmeval-client does not exist: the pod cannot start (or restart) without it; if keyward provides it, see the controller's logs; otherwise create it\n\
team-a     orphan      lmeval   owner-gone          its owner LMEvalJob gone does not exist: the pod is orphaned and its per-owner credentials are no longer renewed; delete the pod\n\
team-a     relabelled  lmeval   stale               injected by profile \"lmeval\", which no longer selects it (removed, or its selector changed); recreate the pod, or it keeps its old credentials\n\
team-a     soon        lmeval   expiring            the client certificate in Secret soon-lmeval-client was due for renewal at {renew} (two thirds of its life) and expires at {expiry}: keyward's controller has not renewed it (check its logs and keyward_controller_objects_total{result=\"error\"})\n\
team-b     elsewhere   lmeval   not-injected        profile \"lmeval\" selects it, but it has no keyward injection: its namespace is not labelled keyward.io/inject=enabled; label it, then recreate the pod\n\
10 findings (1 claim-mismatch, 1 expiring, 1 missing-dependency, 4 not-injected, 1 owner-gone, 1 stale, 1 webhook-config); 9 of 10 pods concern keyward, in 2 namespaces (1 page read)\n\
";

#[test]
fn a_pod_waiting_for_its_pod_certificate_says_why() {
    use support::pcr::{self, KeyField};
    let fake = healthy();
    let path = "deploy/profiles/lmeval-pod-certificate.yaml";
    let profiles =
        keyward_engine::ProfileSet::from_sources([(path.to_string(), std::fs::read_to_string(path).unwrap())]).unwrap();
    // Pods of that profile, scheduled an hour ago and not started.
    let waiting = |name: &str| {
        let mut pod = admitted_fms_pod(&profiles, None, "team-a", name, "good", "uid-good-job");
        pod["metadata"]["creationTimestamp"] = json!(keyward_certs::rfc3339(now() - Duration::from_secs(3600)));
        pod["spec"]["nodeName"] = json!("worker-1");
        pod["status"] = json!({"phase": "Pending"});
        fake.seed(pod.clone());
        pod
    };
    let denied = waiting("denied");
    let unanswered = waiting("unanswered");
    waiting("unasked");
    let started = waiting("started");
    let api = "certificates.k8s.io/v1beta1";
    let mut request = pcr::request(api, "req-d", &denied, "keyward.io/lmeval", KeyField::Pkix(b"key"));
    request["status"] = json!({"conditions": [{"type": "Denied", "status": "True", "reason": "NamespaceNotOptedIn", "message": "namespace team-a is not labelled\nkeyward.io/inject=enabled", "lastTransitionTime": "2026-11-30T10:00:01Z"}]});
    fake.seed(request);
    fake.seed(pcr::request(api, "req-u", &unanswered, "keyward.io/lmeval", KeyField::Pkix(b"key")));
    let mut issued = pcr::request(api, "req-s", &started, "keyward.io/lmeval", KeyField::Pkix(b"key"));
    issued["status"] = json!({"conditions": [{"type": "Issued", "status": "True", "reason": "Issued", "message": "", "lastTransitionTime": "2026-11-30T10:00:01Z"}]});
    fake.seed(issued);

    let out = audit(&fake, &["-n", "team-a", "--profiles", path, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pending: Vec<(String, String)> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["finding"] == "certificate-pending")
        .map(|f| (f["pod"].as_str().unwrap().to_string(), f["detail"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        pending,
        [
            ("denied".to_string(), "its PodCertificateRequest to keyward.io/lmeval was denied (NamespaceNotOptedIn: \"namespace team-a is not labelled\\nkeyward.io/inject=enabled\"): the pod never starts; fix that, then recreate the pod".to_string()),
            ("unanswered".to_string(), "its PodCertificateRequest req-u to keyward.io/lmeval is not answered (created 2026-12-01T10:00:00Z): is keyward's controller running with pod certificates on, and does a replica lead? see its logs".to_string()),
            ("unasked".to_string(), "its kubelet has not asked keyward.io/lmeval for its certificate (no PodCertificateRequest): the cluster must serve PodCertificateRequests and the node's kubelet have the feature on (Kubernetes 1.35 and 1.36: the PodCertificateRequest feature gate; see the README, \"Pod certificates\")".to_string()),
        ],
        "{report:#}"
    );
    // Only the namespace where pods wait was asked, and nothing was written.
    let lists: Vec<String> = fake
        .calls()
        .iter()
        .filter(|c| c.resource.ends_with("/podcertificaterequests"))
        .map(|c| format!("{} {}", c.resource, c.namespace))
        .collect();
    assert!(lists.iter().all(|l| l.ends_with(" team-a")), "{lists:?}");
    assert!(fake.attempted_writes().is_empty());
}

#[test]
fn with_delivery_auto_a_pod_admitted_either_way_is_as_keyward_admits_it() {
    use support::pcr::{self, KeyField};
    // The lmeval profile with delivery: auto; the cluster serves PodCertificateRequest v1beta1.
    let dir = tempfile::tempdir().unwrap();
    let path = auto_profile(dir.path());
    let profiles = keyward_engine::ProfileSet::from_sources([(
        path.display().to_string(),
        std::fs::read_to_string(&path).unwrap(),
    )])
    .unwrap();
    let fake = healthy();
    // healthy()'s pod "good" got a Secret (a webhook without the cluster facts); this one a
    // pod certificate (a webhook that has them), issued, and the pod running.
    let informed = profiles
        .clone()
        .resolved(keyward_controller::signer::cluster_facts(Some(keyward_controller::signer::ApiVersion::V1beta1)));
    let mut pod = admitted_fms_pod(&informed, None, "team-a", "informed", "good", "uid-good-job");
    assert!(pod.to_string().contains("\"podCertificate\""));
    pod["metadata"]["creationTimestamp"] = json!("2026-11-30T10:00:00Z");
    pod["spec"]["nodeName"] = json!("worker-1");
    pod["status"] = json!({"phase": "Running"});
    fake.seed(pod.clone());
    let mut issued =
        pcr::request("certificates.k8s.io/v1beta1", "req-i", &pod, "keyward.io/lmeval", KeyField::Pkix(b"key"));
    issued["status"] = json!({"conditions": [{"type": "Issued", "status": "True", "reason": "Issued", "message": "", "lastTransitionTime": "2026-11-30T10:00:01Z"}]});
    fake.seed(issued);

    let out = audit(&fake, &["-n", "team-a", "--profiles", path.to_str().unwrap()]);
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), "no findings; 2 of 3 pods concern keyward, in 1 namespace (1 page read)\n".to_string()),
        "{}",
        text(&out.stderr)
    );
    // Each is checked for what it got: the Secret pod's Secret, gone now, is missed (and
    // nothing is said of a signer for it, nor of a Secret for the other).
    fake.remove("v1", "Secret", "team-a", "good-lmeval-client");
    let out = audit(&fake, &["-n", "team-a", "--profiles", path.to_str().unwrap(), "-o", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let found: Vec<(&str, &str, &str)> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["pod"].as_str().unwrap(), f["finding"].as_str().unwrap(), f["detail"].as_str().unwrap()))
        .collect();
    assert_eq!(
        found,
        [("good", "missing-dependency", "Secret good-lmeval-client does not exist: the pod cannot start (or restart) without it; if keyward provides it, see the controller's logs; otherwise create it")],
        "{report:#}"
    );
}

#[test]
fn manifests_cluster_facts_renders_what_the_controller_writes_from_discovery_or_as_told() {
    let facts_of = |out: &Output| {
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let yaml = text(&out.stdout);
        assert!(yaml.starts_with("# Generated by `keyward manifests cluster-facts`: "), "{yaml}");
        let object: Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(
            (&object["kind"], &object["metadata"]["name"], &object["metadata"]["namespace"]),
            (&json!("ConfigMap"), &json!("keyward-cluster-facts"), &json!("keyward-system"))
        );
        // Labelled as the controller's, so that it takes the object over and keeps it current.
        assert_eq!(object["metadata"]["labels"]["app.kubernetes.io/managed-by"], "keyward");
        let text = object["data"]["facts.json"].as_str().unwrap().to_string();
        keyward_engine::ClusterFacts::parse(&text).unwrap().pod_certificates.as_str().to_string()
    };
    // As told, offline: no cluster is asked.
    let fake = FakeApi::default();
    let out =
        against(&fake, &["manifests", "cluster-facts", "--pod-certificates", "v1", "--kubeconfig", "{kubeconfig}"]);
    assert_eq!(facts_of(&out), "v1");
    assert!(fake.calls().is_empty());
    // From discovery: nothing served, then PodCertificateRequests at v1beta1.
    let out = against(&fake, &["manifests", "cluster-facts", "--kubeconfig", "{kubeconfig}"]);
    assert_eq!(facts_of(&out), "off");
    serves_pod_certificates(&fake);
    let out = against(&fake, &["manifests", "cluster-facts", "--kubeconfig", "{kubeconfig}"]);
    assert_eq!(facts_of(&out), "v1beta1");
    assert!(fake.attempted_writes().is_empty());
}

#[test]
fn a_server_ca_trust_bundle_is_looked_up_cluster_wide_by_explain_and_the_audit() {
    let fake = healthy();
    let profile = "deploy/profiles/lmeval-pod-certificate.yaml";
    let pod = "tests/fixtures/lmeval-fms-driver-pod.json";
    let explain = |output: &str| {
        let out = against(
            &fake,
            &["explain", "--cluster", "--kubeconfig", "{kubeconfig}", "--profiles", profile, "-o", output, pod],
        );
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    // Missing: said, and where it comes from. (The signer is not an object: not looked up.)
    let report: Value = serde_json::from_str(&explain("json")).unwrap();
    assert_eq!(
        report["cluster"]["requires"],
        json!([{"kind": "ClusterTrustBundle", "name": "keyward-lmeval-server-ca", "providedBy": "keyward", "exists": false}])
    );
    assert!(explain("text").contains("  - ClusterTrustBundle keyward-lmeval-server-ca: missing now (keyward's controller publishes it from the profile's source; see its logs)\n"));
    // A pod of that profile whose bundle is missing: a missing dependency for the audit.
    let profiles =
        keyward_engine::ProfileSet::from_sources([(profile.to_string(), std::fs::read_to_string(profile).unwrap())])
            .unwrap();
    let mut driver = admitted_fms_pod(&profiles, None, "team-a", "pc-driver", "good", "uid-good-job");
    driver["status"] = json!({"phase": "Running"});
    fake.seed(driver);
    let out = audit(&fake, &["-n", "team-a", "--profiles", profile, "-o", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let missing: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["finding"] == "missing-dependency" && f["pod"] == "pc-driver")
        .map(|f| f["detail"].as_str().unwrap())
        .collect();
    assert_eq!(missing, ["ClusterTrustBundle keyward-lmeval-server-ca does not exist: the pod cannot start (or restart) without it; if keyward provides it (a server CA, published once for the cluster), see the controller's logs; otherwise create it"], "{report:#}");

    // Published (at v1beta1, as a 1.35 cluster serves it): found by both.
    fake.seed(json!({"apiVersion": "certificates.k8s.io/v1beta1", "kind": "ClusterTrustBundle",
        "metadata": {"name": "keyward-lmeval-server-ca"}, "spec": {"trustBundle": "x"}}));
    let report: Value = serde_json::from_str(&explain("json")).unwrap();
    assert_eq!(report["cluster"]["requires"][0]["exists"], true);
    let out = audit(&fake, &["-n", "team-a", "--profiles", profile, "-o", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["findings"].as_array().unwrap().iter().all(|f| f["pod"] != "pc-driver"), "{report:#}");
    assert!(fake.attempted_writes().is_empty(), "read-only");
}

#[test]
fn where_keyward_signs_anyone_but_the_nodes_who_may_create_requests_is_reported() {
    let fake = healthy();
    let profile = "deploy/profiles/lmeval-pod-certificate.yaml";
    let rbac = "rbac.authorization.k8s.io/v1";
    // The nodes' own grant, and a robot's.
    fake.seed(json!({"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "system:node"},
        "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["podcertificaterequests"], "verbs": ["create"]}]}));
    fake.seed(json!({"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": "system:node"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
        "subjects": [{"kind": "Group", "name": "system:nodes"}]}));
    fake.seed(json!({"apiVersion": rbac, "kind": "Role", "metadata": {"name": "requester", "namespace": "team-a"},
        "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["podcertificaterequests"], "verbs": ["create"]}]}));
    fake.seed(json!({"apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": "ci", "namespace": "team-a"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "requester"},
        "subjects": [{"kind": "ServiceAccount", "name": "ci"}]}));

    let out = audit(&fake, &["-n", "team-a", "--profiles", profile, "-o", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let requesters: Vec<&Value> =
        report["findings"].as_array().unwrap().iter().filter(|f| f["finding"] == "certificate-requesters").collect();
    assert_eq!(
        requesters,
        [&json!({"namespace": "", "pod": "", "finding": "certificate-requesters", "profile": null,
            "detail": "ServiceAccount team-a/ci may create PodCertificateRequests (RoleBinding team-a/ci -> Role requester): with a key of its own it can ask keyward's signers for the identity of any pod in namespace team-a that keyward signs for, and keyward cannot tell its requests from a kubelet's; grant it to the nodes only"})],
        "{report:#}"
    );
    assert_eq!(out.status.code(), Some(1));

    // Profiles that sign nothing: RBAC is not read at all.
    let calls_before = fake.calls().len();
    let out = audit(&fake, &["-n", "team-a"]);
    assert!(fake.calls()[calls_before..].iter().all(|c| !c.resource.starts_with("rbac.authorization.k8s.io")));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));

    // Not allowed to read RBAC: said, and the rest of the audit goes on.
    fake.fail("GET", "rbac.authorization.k8s.io/v1/clusterroles", 403, usize::MAX);
    let out = audit(&fake, &["-n", "team-a", "--profiles", profile, "-o", "json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["findings"].as_array().unwrap().iter().all(|f| f["finding"] != "certificate-requesters"));
    let notes = report["notes"].to_string();
    assert!(notes.contains("who may create PodCertificateRequests was not checked: forbidden to list clusterroles (deploy/audit/rbac.yaml grants it)"), "{report:#}");
}

#[test]
fn a_pod_keyward_injected_under_a_profile_that_now_conflicts_with_it_is_stale() {
    // healthy()'s pod "good" got the client certificate as a Secret; the profile now delivers
    // it as a pod certificate into the same volume name. With onConflict: skip (this profile)
    // or deny (the default), the decision is a conflict, not an injection: still stale.
    let fake = healthy();
    let dir = tempfile::tempdir().unwrap();
    let skip = "deploy/profiles/lmeval-pod-certificate.yaml";
    let yaml = std::fs::read_to_string(skip).unwrap();
    assert!(yaml.contains("  onConflict: skip\n"));
    let deny = dir.path().join("lmeval-deny.yaml");
    std::fs::write(&deny, yaml.replace("  onConflict: skip\n", "  onConflict: deny\n")).unwrap();
    for profile in [skip, deny.to_str().unwrap()] {
        let out = audit(&fake, &["-n", "team-a", "--profiles", profile, "-o", "json"]);
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let stale: Vec<(&str, &str)> = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["finding"] == "stale")
            .map(|f| (f["pod"].as_str().unwrap(), f["detail"].as_str().unwrap()))
            .collect();
        assert_eq!(stale.len(), 1, "{profile}: {report:#}");
        assert_eq!(stale[0].0, "good");
        assert!(
            stale[0].1.starts_with("injected differently from what profile \"lmeval\" injects now, which conflicts with what keyward injected then (")
                && stale[0].1.ends_with("): the profile changed since; recreate the pod"),
            "{}",
            stale[0].1
        );
        assert!(stale[0].1.contains("keyward-client-cert"), "{}", stale[0].1);
    }
    // Under the profile that injected it, nothing.
    let out = audit(&fake, &["-n", "team-a"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

/// What a tenant writes on her own pods is hostile input to an admin's terminal and to a daily
/// audit: an owner reference whose UID holds escape sequences (a window title, a clipboard
/// write, a fake "no findings" line) and one whose name holds a space. Each is a finding for its
/// pod; the table carries no control byte and one line per finding; the JSON is exact; and the
/// rest of the cluster is still audited.
#[test]
fn hostile_owner_references_are_findings_escaped_never_the_end_of_the_audit() {
    let fake = healthy();
    let hostile_uid =
        "x\u{1b}]0;pwned\u{7}\u{1b}]52;c;ZXZpbA==\u{7}\r\nno findings; 0 of 0 pods concern keyward\u{202e}";
    let mut escaping = injected("escaping", "good", "uid-good-job");
    escaping["metadata"]["ownerReferences"][0]["uid"] = json!(hostile_uid);
    fake.seed(escaping);
    let mut spaced = injected("spaced", "good", "uid-good-job");
    spaced["metadata"]["ownerReferences"][0]["name"] = json!("has space");
    fake.seed(spaced);
    fake.seed(injected("orphan", "gone", "uid-gone-job"));

    let out = audit(&fake, &["-n", "team-a"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let unsafe_chars: Vec<char> =
        table.chars().filter(|c| (c.is_control() && *c != '\n') || ('\u{2028}'..='\u{202e}').contains(c)).collect();
    assert!(unsafe_chars.is_empty(), "{unsafe_chars:?} in\n{table}");
    let rows = findings_in_table(&table);
    let found: Vec<(String, String)> =
        rows.iter().map(|r| (r["pod"].as_str().unwrap().into(), r["finding"].as_str().unwrap().into())).collect();
    assert!(found.contains(&("escaping".into(), "unreadable".into())), "{table}");
    assert!(found.contains(&("orphan".into(), "owner-gone".into())), "the rest is audited: {table}");
    assert!(found.iter().any(|(pod, _)| pod == "spaced"), "{table}");
    assert!(table.lines().last().unwrap().starts_with(&format!("{} findings", rows.len())), "{table}");
    let escaping_row = rows.iter().find(|r| r["pod"] == "escaping").unwrap();
    assert!(escaping_row["detail"].as_str().unwrap().contains(r"\u{1b}]0;pwned\u{7}"), "{escaping_row}");

    // The JSON keeps every byte, escaped as JSON escapes them.
    let out = audit(&fake, &["-n", "team-a", "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let raw = text(&out.stdout);
    assert!(!raw.chars().any(|c| c.is_control() && c != '\n'), "{raw}");
    let report: Value = serde_json::from_str(&raw).unwrap();
    let details: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["pod"] == "escaping")
        .map(|f| f["detail"].as_str().unwrap())
        .collect();
    assert_eq!(details.len(), 1, "{report:#}");
    assert!(
        details[0].starts_with("its controller owner reference cannot be looked up: the controller owner's uid "),
        "{}",
        details[0]
    );
}

/// A kubeconfig naming `server`, with a token.
fn kubeconfig_for(dir: &std::path::Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!("apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{server}\"}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u, namespace: team-a}}}}]\ncurrent-context: c\nusers: [{{name: u, user: {{token: t}}}}]\n"),
    )
    .unwrap();
    path
}

/// With no cluster, or one that answers what is not the Kubernetes API, every command that
/// reads one says in one line what it contacted, what failed and what to check, and exits 2.
#[test]
fn a_cluster_that_cannot_be_read_is_one_line_and_exit_2_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on a port just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let down = kubeconfig_for(dir.path(), &format!("https://127.0.0.1:{port}"));
    let fixture = format!("{}/tests/fixtures/lmeval-fms-driver-pod.json", env!("CARGO_MANIFEST_DIR"));
    let commands: [&[&str]; 2] = [&["audit", "-A"], &["explain", "--cluster", fixture.as_str()]];
    for args in commands {
        let out = Command::new(env!("CARGO_BIN_EXE_keyward")).args(args).env("KUBECONFIG", &down).output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&format!(" at https://127.0.0.1:{port}/: Connection refused")), "{err}");
        assert!(
            err.ends_with(
                "is the cluster up and reachable from here, and is this the right context? (kubectl cluster-info)\n"
            ),
            "{err}"
        );
        assert!(!err.contains("ServiceError"), "{err}");
    }
    // KUBECONFIG set, to a file that is not there: said so, not "set KUBECONFIG".
    let missing = dir.path().join("nope");
    let out =
        Command::new(env!("CARGO_BIN_EXE_keyward")).args(["audit", "-A"]).env("KUBECONFIG", &missing).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        format!("keyward: error: cannot configure a Kubernetes client from KUBECONFIG={}: No such file or directory (os error 2); check the file KUBECONFIG names, or give --kubeconfig FILE (and --context)\n", missing.display())
    );

    // A server that answers 404 in plain text (a proxy, or not an API server at all).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 10\r\nconnection: close\r\n\r\nnot found\n");
        }
    });
    let proxy = kubeconfig_for(dir.path(), &format!("http://{addr}"));
    let out =
        Command::new(env!("CARGO_BIN_EXE_keyward")).args(["audit", "-A"]).env("KUBECONFIG", &proxy).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        format!("keyward: error: get mutatingwebhookconfigurations/keyward at http://{addr}/: HTTP 404; not served there: is this the right cluster, and does its Kubernetes serve this API?\n")
    );

    // As kubectl's plugin, errors name the command as typed.
    let plugin = dir.path().join("kubectl-keyward");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_keyward"), &plugin).unwrap();
    let out = Command::new(&plugin).args(["audit", "-A"]).env("KUBECONFIG", &missing).output().unwrap();
    assert!(text(&out.stderr).starts_with("kubectl keyward: error: cannot configure"), "{}", text(&out.stderr));
}
