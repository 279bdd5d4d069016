//! The controller against an in-process fake of the Kubernetes API (`support/mod.rs`): what it
//! writes, and does not write, for pods, owners, namespaces and CA sources; retries; leader
//! election; and the time from a pod's creation to its Secret.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use keyward_certs::pki::Ca;
use keyward_certs::{CertStore, Trigger};
use keyward_controller::conditions::Condition;
use keyward_controller::identity::{self, Renewal};
use keyward_controller::metrics::Action;
use keyward_controller::{run, LeaderElector, Leadership, LeaseConfig, Metrics, Reconciler, Settings};
use keyward_engine::{ProfileSet, RequestFacts, Requester};
use serde_json::{json, Value};
use support::FakeApi;

const OWNER_API: &str = "foundation-model-stack.github.com.github.com/v1beta1";
const OWNER_UID: &str = "bd735d6e-a9ec-4cdc-84eb-135ae77796f6";
const IDENTITY: &str = "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";
const LIMIT: Duration = Duration::from_secs(20);

fn fixture(name: &str) -> Value {
    let path = format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A client CA as cert-manager writes its Secret by default (an ECDSA key in SEC1, `EC PRIVATE
/// KEY`: the shipped Certificate asks for PKCS#8, but a user's may not), mounted as the kubelet
/// does, and loaded as `keyward controller` loads it.
struct ClientCa {
    _dir: tempfile::TempDir,
    store: Arc<CertStore>,
    ca: Ca,
}

fn certs_fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../certs/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn client_ca() -> ClientCa {
    let (cert, key) = (certs_fixture("ca-ec256.crt"), certs_fixture("ca-ec256-sec1.key"));
    assert!(key.starts_with("-----BEGIN EC PRIVATE KEY-----"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), &cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), &key).unwrap();
    std::fs::write(dir.path().join("ca.crt"), &cert).unwrap();
    let store = Arc::new(identity::client_ca_store(dir.path()));
    assert_eq!(store.reload(Trigger::Startup).as_str(), "loaded");
    let ca = Ca::from_pem(&cert, &key, "tls.crt".as_ref(), "tls.key".as_ref()).unwrap();
    ClientCa { _dir: dir, store, ca }
}

#[test]
fn readiness_needs_a_client_ca_that_can_sign() {
    let status = run::Status::default();
    status.namespaces_synced.store(true, std::sync::atomic::Ordering::Relaxed);
    // A leaf where the client CA should be: a valid pair, but it cannot sign certificates.
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::mint("some CA", SystemTime::now(), Duration::from_secs(86400)).unwrap();
    let leaf = ca.issue_serving(&["x.example".into()], SystemTime::now(), Duration::from_secs(3600)).unwrap();
    std::fs::write(dir.path().join("tls.crt"), &leaf.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &leaf.key_pem).unwrap();
    let store = identity::client_ca_store(dir.path());
    assert_eq!(store.reload(Trigger::Startup).as_str(), "failed");
    let reason = run::readiness(&status, Some(&store)).unwrap_err();
    assert!(
        reason.starts_with("client CA: no valid client CA loaded yet: ")
            && reason.ends_with("not a CA certificate (CN=x.example lacks basicConstraints CA:TRUE); give the CA's certificate, not a leaf"),
        "{reason}"
    );
    // Profiles that issue nothing need no client CA.
    run::readiness(&status, None).unwrap();
    // The CA as cert-manager writes it (SEC1): ready.
    let good = client_ca();
    run::readiness(&status, Some(&good.store)).unwrap();
    // And nothing is ready before the namespace watch has listed.
    let fresh = run::Status::default();
    assert_eq!(run::readiness(&fresh, Some(&good.store)).unwrap_err(), "the namespace watch has not listed yet");
}

fn reconciler(
    fake: &FakeApi,
    client_id: &str,
    profiles: ProfileSet,
    ca: &ClientCa,
    leader: Leadership,
) -> Arc<Reconciler> {
    Arc::new(Reconciler::new(
        fake.client(client_id),
        Arc::new(profiles),
        Settings { publish_client_ca_to: vec!["lm-eval".into()], ..Settings::default() },
        ca.store.clone(),
        leader,
        Arc::new(Metrics::default()),
        client_id.to_string(),
    ))
}

/// The fms driver pod as the apiserver stores it after keyward's webhook admitted it.
fn injected_fms_pod() -> Value {
    let mut pod = fixture("lmeval-fms-driver-pod.json");
    let facts =
        RequestFacts::pod_create("team-a", Requester::User("system:serviceaccount:lm-eval:lm-eval-controller-manager"));
    let decision = keyward_engine::decide(
        &facts,
        &serde_json::value::to_raw_value(&pod).unwrap(),
        &ProfileSet::builtin().unwrap(),
    );
    assert!(decision.allowed(), "{:?}", decision.message());
    let patch: json_patch::Patch = serde_json::from_value(serde_json::to_value(decision.patch()).unwrap()).unwrap();
    json_patch::patch(&mut pod, &patch).unwrap();
    pod["metadata"]["uid"] = json!("pod-uid-1");
    pod["status"] = json!({"phase": "Pending"});
    pod
}

fn owner() -> Value {
    json!({"apiVersion": OWNER_API, "kind": "LMEvalJob", "metadata": {"name": "evaljob-sample", "namespace": "team-a", "uid": OWNER_UID}, "spec": {}})
}

fn as_pod(v: &Value) -> Pod {
    serde_json::from_value(v.clone()).unwrap()
}

fn secret_data(secret: &Value, key: &str) -> String {
    use base64::Engine as _;
    let b64 = secret["data"][key].as_str().unwrap_or_else(|| panic!("no {key} in {secret}"));
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap()
}

fn cert_uris(pem: &str) -> Vec<String> {
    keyward_certs::pem::cert_info(pem.as_bytes(), "tls.crt".as_ref()).unwrap().uris
}

// === per owner ===

#[tokio::test]
async fn first_sight_of_a_pod_issues_its_client_certificate_owned_by_the_job() {
    let fake = FakeApi::default();
    fake.seed(owner());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    r.pod(&as_pod(&injected_fms_pod())).await.unwrap();

    let writes = fake.writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(
        (writes[0].method.as_str(), writes[0].resource.as_str(), writes[0].namespace.as_str()),
        ("POST", "/v1/secrets", "team-a")
    );
    let secret = fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").unwrap();
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(
        secret["metadata"]["labels"],
        json!({"app.kubernetes.io/managed-by": "keyward", "keyward.io/provisioned-for": "owner"})
    );
    assert_eq!(secret["metadata"]["annotations"], json!({"keyward.io/profile": "lmeval"}));
    assert_eq!(
        secret["metadata"]["ownerReferences"],
        json!([{"apiVersion": OWNER_API, "kind": "LMEvalJob", "name": "evaljob-sample", "uid": OWNER_UID, "controller": true}])
    );
    let cert = secret_data(&secret, "tls.crt");
    assert_eq!(cert_uris(&cert), [IDENTITY]);
    assert_eq!(secret_data(&secret, "ca.crt"), ca.ca.cert_pem());
    assert!(secret_data(&secret, "tls.key").starts_with("-----BEGIN PRIVATE KEY-----"));
    assert_eq!(r.metrics().object_count("client-certificate", Action::Issued, true), 1);
}

#[tokio::test]
async fn a_missing_or_foreign_owner_gets_nothing() {
    let fake = FakeApi::default();
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    // No owner at all.
    r.pod(&as_pod(&injected_fms_pod())).await.unwrap();
    // An owner of that name with another UID: a new job of the same name, not this pod's.
    let mut other = owner();
    other["metadata"]["uid"] = json!("another-uid");
    fake.seed(other);
    r.pod(&as_pod(&injected_fms_pod())).await.unwrap();
    assert_eq!(fake.writes().len(), 0, "{:#?}", fake.writes());
    // The owner was looked up where the pod names it.
    assert!(fake
        .calls()
        .iter()
        .any(|c| c.method == "GET" && c.resource == format!("{OWNER_API}/lmevaljobs") && c.name == "evaljob-sample"));
}

#[tokio::test]
async fn a_pod_that_only_looks_selected_gets_nothing() {
    // The labels and owner of an fms driver, but not the injection: keyward did not admit it
    // as such (a label proves nothing).
    let fake = FakeApi::default();
    fake.seed(owner());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let mut pod = fixture("lmeval-fms-driver-pod.json");
    pod["metadata"]["annotations"] = json!({"keyward.io/injected": "{\"profile\":\"lmeval\"}"});
    r.pod(&as_pod(&pod)).await.unwrap();
    assert_eq!(fake.writes().len(), 0);
}

#[tokio::test]
async fn an_existing_valid_secret_is_not_touched_and_a_restart_changes_nothing() {
    let fake = FakeApi::default();
    fake.seed(owner());
    let ca = client_ca();
    let pod = as_pod(&injected_fms_pod());
    reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always()).pod(&pod).await.unwrap();
    fake.clear_calls();
    // Another replica, or this one after a restart: the same state, nothing to write.
    let again = reconciler(&fake, "keyward-2", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    again.pod(&pod).await.unwrap();
    again.renew_all().await.unwrap();
    assert_eq!(fake.writes().len(), 0, "{:#?}", fake.writes());
    assert_eq!(again.metrics().object_count("client-certificate", Action::Unchanged, true), 1);
}

#[tokio::test]
async fn a_certificate_near_expiry_is_renewed_in_one_update_of_both_files() {
    let fake = FakeApi::default();
    fake.seed(owner());
    let ca = client_ca();
    let owner_ref = keyward_controller::desired::Owner {
        api_version: OWNER_API.into(),
        kind: "LMEvalJob".into(),
        name: "evaljob-sample".into(),
        uid: OWNER_UID.into(),
    };
    // Issued 17 hours ago for 24: past two thirds.
    let old = identity::issue(
        &ca.ca,
        "team-a",
        &owner_ref,
        IDENTITY,
        SystemTime::now() - Duration::from_secs(17 * 3600),
        Duration::from_secs(24 * 3600),
    )
    .unwrap();
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    fake.seed(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "evaljob-sample-lmeval-client", "namespace": "team-a",
            "labels": {"app.kubernetes.io/managed-by": "keyward", "keyward.io/provisioned-for": "owner"},
            "annotations": {"keyward.io/profile": "lmeval"},
            "ownerReferences": [{"apiVersion": OWNER_API, "kind": "LMEvalJob", "name": "evaljob-sample", "uid": OWNER_UID, "controller": true}]},
        "data": {"tls.crt": b64(&old.cert_pem), "tls.key": b64(&old.key_pem), "ca.crt": b64(&old.ca_pem)}
    }));
    let before = fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").unwrap();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    r.renew_all().await.unwrap();

    let writes = fake.writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(writes[0].method, "PUT");
    let body = writes[0].body.as_ref().unwrap();
    assert_eq!(
        body["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"],
        "a precondition on what was read"
    );
    let after = fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").unwrap();
    let (cert, key) = (secret_data(&after, "tls.crt"), secret_data(&after, "tls.key"));
    assert_ne!(cert, old.cert_pem);
    assert_ne!(key, old.key_pem);
    // The new pair belongs together, names the owner, and is fresh.
    assert!(matches!(
        identity::renewal(
            Some(cert.as_bytes()),
            Some(key.as_bytes()),
            Some(secret_data(&after, "ca.crt").as_bytes()),
            ca.ca.cert_pem(),
            IDENTITY,
            SystemTime::now()
        ),
        Renewal::Fresh { .. }
    ));
    assert_eq!(r.metrics().object_count("client-certificate", Action::Renewed, true), 1);
    assert!(
        r.metrics().render().contains("keyward_controller_next_certificate_expiry_seconds 86"),
        "{}",
        r.metrics().render()
    );
}

const TOKEN_PROFILE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata: {name: job-token}
spec:
  selector: {matchLabels: {app: token-job}}
  controllerOwners: [{apiGroup: batch, kind: Job}]
  requesters: {usernames: ["system:serviceaccount:kube-system:job-controller"]}
  inject:
    token: {secretName: "{owner.name}-token", provider: keyward, mountPath: /var/run/secrets/example/token}
"#;

fn token_pod() -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train-x7k2p", "namespace": "team-a", "uid": "pod-uid-2", "labels": {"app": "token-job"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid-1", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    });
    let profiles = ProfileSet::from_sources([("t.yaml".to_string(), TOKEN_PROFILE.to_string())]).unwrap();
    let facts = RequestFacts::pod_create("team-a", Requester::User("system:serviceaccount:kube-system:job-controller"));
    let d = keyward_engine::decide(&facts, &serde_json::value::to_raw_value(&pod).unwrap(), &profiles);
    let patch: json_patch::Patch = serde_json::from_value(serde_json::to_value(d.patch()).unwrap()).unwrap();
    json_patch::patch(&mut pod, &patch).unwrap();
    pod
}

#[tokio::test]
async fn a_generated_token_is_created_once_and_never_regenerated() {
    let fake = FakeApi::default();
    fake.seed(json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "team-a", "uid": "job-uid-1"}}));
    let ca = client_ca();
    let profiles = ProfileSet::from_sources([("t.yaml".to_string(), TOKEN_PROFILE.to_string())]).unwrap();
    let r = reconciler(&fake, "keyward", profiles, &ca, Leadership::always());
    let pod = as_pod(&token_pod());
    r.pod(&pod).await.unwrap();
    let secret = fake.get("v1", "Secret", "team-a", "train-token").unwrap();
    let token = secret_data(&secret, "token");
    assert_eq!(token.len(), 43);
    assert_eq!(secret["type"], "Opaque");
    assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], "job-uid-1");
    fake.clear_calls();
    // Another pod of the job, a resync: the token stays.
    r.pod(&pod).await.unwrap();
    r.renew_all().await.unwrap();
    assert_eq!(fake.writes().len(), 0, "{:#?}", fake.writes());
    assert_eq!(secret_data(&fake.get("v1", "Secret", "team-a", "train-token").unwrap(), "token"), token);
}

#[tokio::test]
async fn a_foreign_object_of_the_same_name_is_left_alone_and_reported() {
    let fake = FakeApi::default();
    fake.seed(owner());
    fake.seed(json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "evaljob-sample-lmeval-client", "namespace": "team-a"}, "data": {"mine": "eA=="}}));
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    r.pod(&as_pod(&injected_fms_pod())).await.unwrap();
    assert_eq!(fake.writes().len(), 0, "{:#?}", fake.writes());
    assert_eq!(
        fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").unwrap()["data"],
        json!({"mine": "eA=="})
    );
    let events: Vec<_> =
        fake.calls().into_iter().filter(|c| c.resource == "events.k8s.io/v1/events" && c.method == "POST").collect();
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = events[0].body.as_ref().unwrap();
    assert_eq!(event["reason"], "NameTaken");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["regarding"]["kind"], "LMEvalJob");
    assert_eq!(event["regarding"]["uid"], OWNER_UID);
    assert!(event["note"]
        .as_str()
        .unwrap()
        .starts_with("Secret team-a/evaljob-sample-lmeval-client exists and is not managed by keyward"));
    assert_eq!(r.metrics().object_count("client-certificate", Action::Foreign, true), 1);
}

// === per namespace ===

const ACCOUNT_PROFILE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata: {name: router}
spec:
  selector: {matchLabels: {app: router}}
  requesters: {usernames: ["system:serviceaccount:kube-system:replicaset-controller"]}
  inject:
    serviceAccount:
      name: keyward-router
      provider: keyward
      bindings: [{kind: ClusterRole, name: "system:auth-delegator"}]
"#;

fn server_ca_source(fake: &FakeApi, pem: &str) {
    use base64::Engine as _;
    fake.seed(json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "grpc-server-cert", "namespace": "lm-eval"},
        "data": {"ca.crt": base64::engine::general_purpose::STANDARD.encode(pem), "tls.crt": "", "tls.key": ""}}));
}

fn builtins_and_account() -> ProfileSet {
    ProfileSet::builtin()
        .unwrap()
        .overlay(ProfileSet::from_sources([("r.yaml".to_string(), ACCOUNT_PROFILE.to_string())]).unwrap())
}

#[tokio::test]
async fn a_namespace_that_opts_in_gets_the_ca_accounts_and_bindings_and_loses_them_on_opt_out() {
    let fake = FakeApi::default();
    let server_ca = Ca::mint("lm-eval gRPC", SystemTime::now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, server_ca.cert_pem());
    // Someone else's ConfigMap of the CA's name, in a namespace that also opts in.
    fake.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keyward-lmeval-server-ca", "namespace": "team-b"}, "data": {"ca.crt": "theirs"}}));
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", builtins_and_account(), &ca, Leadership::always());
    r.namespace("team-a").await.unwrap();
    r.namespace("team-b").await.unwrap();

    let cm = fake.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca").unwrap();
    assert_eq!(cm["data"], json!({"ca.crt": server_ca.cert_pem()}));
    assert_eq!(cm["metadata"]["labels"]["keyward.io/provisioned-for"], "namespace");
    let sa = fake.get("v1", "ServiceAccount", "team-a", "keyward-router").unwrap();
    assert_eq!(sa["metadata"]["annotations"], json!({"keyward.io/profile": "router"}));
    let rb = fake
        .get("rbac.authorization.k8s.io/v1", "RoleBinding", "team-a", "keyward-keyward-router-cr-system:auth-delegator")
        .unwrap();
    assert_eq!(
        rb["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"})
    );
    assert_eq!(rb["subjects"], json!([{"kind": "ServiceAccount", "name": "keyward-router", "namespace": "team-a"}]));
    assert_eq!(
        fake.get("v1", "ConfigMap", "team-b", "keyward-lmeval-server-ca").unwrap()["data"],
        json!({"ca.crt": "theirs"})
    );

    // team-a opts out; team-b stays.
    r.sweep_namespaces(&BTreeSet::from(["team-b".to_string()])).await.unwrap();
    assert!(fake.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca").is_none());
    assert!(fake.get("v1", "ServiceAccount", "team-a", "keyward-router").is_none());
    assert!(fake
        .get("rbac.authorization.k8s.io/v1", "RoleBinding", "team-a", "keyward-keyward-router-cr-system:auth-delegator")
        .is_none());
    assert!(fake.get("v1", "ServiceAccount", "team-b", "keyward-router").is_some());
    assert_eq!(
        fake.get("v1", "ConfigMap", "team-b", "keyward-lmeval-server-ca").unwrap()["data"],
        json!({"ca.crt": "theirs"}),
        "never someone else's"
    );
    // The source itself is never touched.
    assert!(fake.writes().iter().all(|c| c.namespace != "lm-eval"));
}

#[tokio::test]
async fn a_changed_ca_source_updates_every_copy() {
    let fake = FakeApi::default();
    let first = Ca::mint("gRPC 1", SystemTime::now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, first.cert_pem());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    r.namespace("team-a").await.unwrap();
    fake.clear_calls();
    r.namespace("team-a").await.unwrap();
    assert_eq!(fake.writes().len(), 0, "unchanged source, nothing written");

    let second = Ca::mint("gRPC 2", SystemTime::now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, second.cert_pem());
    r.namespace("team-a").await.unwrap();
    let writes = fake.writes();
    assert_eq!(writes.len(), 1);
    assert_eq!((writes[0].method.as_str(), writes[0].resource.as_str()), ("PUT", "/v1/configmaps"));
    assert_eq!(
        fake.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca").unwrap()["data"]["ca.crt"],
        second.cert_pem()
    );

    // A source that is not a certificate is refused, and the copy kept; it is a condition
    // reported, not a failure retried.
    server_ca_source(&fake, "not a certificate");
    r.namespace("team-a").await.unwrap();
    let note =
        r.conditions().message(Condition::ServerCaSourceUnusable, "ConfigMap team-a/keyward-lmeval-server-ca").unwrap();
    assert!(
        note.contains("serverCA source Secret lm-eval/grpc-server-cert key ca.crt: not a PEM certificate"),
        "{note}"
    );
    assert_eq!(
        fake.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca").unwrap()["data"]["ca.crt"],
        second.cert_pem()
    );
}

#[tokio::test]
async fn a_missing_ca_source_is_a_condition_reported_once_and_everything_else_is_provisioned() {
    let fake = FakeApi::default();
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", builtins_and_account(), &ca, Leadership::always());
    // No lm-eval namespace, no grpc-server-cert: this cluster runs no fms-lm-eval-service.
    r.namespace("team-a").await.unwrap();
    r.namespace("team-a").await.unwrap();
    assert!(fake.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca").is_none());
    assert!(fake.get("v1", "ServiceAccount", "team-a", "keyward-router").is_some(), "the rest is provisioned");
    let subject = "ConfigMap team-a/keyward-lmeval-server-ca";
    assert_eq!(
        r.conditions().message(Condition::ServerCaSourceUnusable, subject).unwrap(),
        "ConfigMap team-a/keyward-lmeval-server-ca for profile \"lmeval\" is not provisioned: serverCA source Secret lm-eval/grpc-server-cert key ca.crt: missing; pods that need it wait until the source holds a CA certificate"
    );
    assert_eq!(r.metrics().conditions(Condition::ServerCaSourceUnusable), 1);
    assert_eq!(r.metrics().object_count("server-ca", Action::Provisioned, false), 0, "not counted as a failure");
    // One Event on the namespace, however often it is reconciled.
    let events: Vec<_> =
        fake.calls().into_iter().filter(|c| c.method == "POST" && c.resource.starts_with("events.k8s.io")).collect();
    assert_eq!(events.len(), 1, "{events:#?}");
    let body = events[0].body.clone().unwrap();
    assert_eq!(body["reason"], "ServerCaSourceUnusable");
    assert_eq!(body["regarding"], json!({"apiVersion": "v1", "kind": "Namespace", "name": "team-a"}));

    // The source appears: provisioned, and the condition ends.
    server_ca_source(&fake, Ca::mint("gRPC", SystemTime::now(), Duration::from_secs(86400)).unwrap().cert_pem());
    r.namespace("team-a").await.unwrap();
    assert!(fake.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca").is_some());
    assert_eq!(r.conditions().message(Condition::ServerCaSourceUnusable, subject), None);
    assert_eq!(r.metrics().conditions(Condition::ServerCaSourceUnusable), 0);
}

#[tokio::test]
async fn the_client_ca_is_not_published_to_a_namespace_that_does_not_exist() {
    let fake = FakeApi::default();
    fake.require_namespaces();
    fake.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "control-plane"}}));
    let ca = client_ca();
    let r = Arc::new(Reconciler::new(
        fake.client("keyward"),
        Arc::new(ProfileSet::builtin().unwrap()),
        Settings { publish_client_ca_to: vec!["lm-eval".into(), "control-plane".into()], ..Settings::default() },
        ca.store.clone(),
        Leadership::always(),
        Arc::new(Metrics::default()),
        "keyward".into(),
    ));
    r.publish_client_ca().await.unwrap();
    r.publish_client_ca().await.unwrap();
    assert!(fake.get("v1", "ConfigMap", "control-plane", "keyward-client-ca").is_some());
    assert!(fake.writes().iter().all(|c| c.namespace != "lm-eval"), "{:#?}", fake.writes());
    assert_eq!(
        r.conditions().message(Condition::ClientCaNamespaceMissing, "lm-eval").unwrap(),
        "--publish-client-ca-to names namespace \"lm-eval\", which does not exist; the client CA is published there when it is created"
    );
    assert_eq!(r.metrics().conditions(Condition::ClientCaNamespaceMissing), 1);
    fake.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "lm-eval"}}));
    r.publish_client_ca().await.unwrap();
    assert!(fake.get("v1", "ConfigMap", "lm-eval", "keyward-client-ca").is_some());
    assert_eq!(r.metrics().conditions(Condition::ClientCaNamespaceMissing), 0);
}

#[tokio::test]
async fn the_client_ca_certificate_is_published_and_never_its_key() {
    let fake = FakeApi::default();
    fake.require_namespaces();
    fake.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "lm-eval"}}));
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    r.publish_client_ca().await.unwrap();
    let cm = fake.get("v1", "ConfigMap", "lm-eval", "keyward-client-ca").unwrap();
    assert_eq!(cm["data"], json!({"ca.crt": ca.ca.cert_pem()}));
    assert!(!serde_json::to_string(&cm).unwrap().contains("PRIVATE KEY"));
}

// === the loop: watches, retries, leadership ===

fn opted_in(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"keyward.io/inject": "enabled", "kubernetes.io/metadata.name": name}}})
}

fn start(
    fake: &FakeApi,
    r: Arc<Reconciler>,
    leadership: Leadership,
    ca: &ClientCa,
    id: &str,
) -> tokio::task::JoinHandle<()> {
    let client = fake.client(id);
    let status = Arc::new(run::Status::default());
    let reloads = ca.store.subscribe();
    tokio::spawn(async move {
        run::run(client, r, leadership, Duration::from_secs(3600), status, reloads, std::future::pending()).await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_pods_secret_exists_well_within_two_seconds() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(owner());
    server_ca_source(&fake, Ca::mint("gRPC", SystemTime::now(), Duration::from_secs(86400)).unwrap().cert_pem());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let task = start(&fake, r, Leadership::always(), &ca, "keyward");
    // The namespace's CA appears from the namespace watch.
    fake.until(LIMIT, |f| f.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca")).await;

    let created = std::time::Instant::now();
    fake.seed(injected_fms_pod());
    fake.until(LIMIT, |f| f.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client")).await;
    let elapsed = created.elapsed();
    println!("pod created → client certificate Secret written: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_retried_with_backoff_not_in_a_hot_loop() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(owner());
    fake.fail("POST", "/v1/secrets", 500, 3);
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    fake.seed(injected_fms_pod());
    fake.until(Duration::from_secs(30), |f| f.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client")).await;
    let posts: Vec<_> =
        fake.calls().into_iter().filter(|c| c.method == "POST" && c.resource == "/v1/secrets").collect();
    assert_eq!(posts.iter().map(|c| c.status).collect::<Vec<_>>(), [500, 500, 500, 201]);
    // 500 ms, 1 s, 2 s between attempts (less a little for scheduling).
    for (pair, min) in posts.windows(2).zip([450u64, 950, 1950]) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(gap >= Duration::from_millis(min), "retried after {gap:?}, expected at least {min} ms");
    }
    assert!(
        r.metrics().render().contains("keyward_controller_reconcile_errors_total{result=\"pod\"} 3"),
        "{}",
        r.metrics().render()
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_operators_namespace_keeps_reconciling_everything_else() {
    // The shipped manifests publish the client CA to lm-eval, and the lmeval built-in copies
    // its server CA from there; on a cluster without fms-lm-eval-service neither exists.
    let fake = FakeApi::default();
    fake.require_namespaces();
    fake.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}}));
    fake.seed(opted_in("team-a"));
    fake.seed(owner());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", builtins_and_account(), &ca, Leadership::always());
    let task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    fake.until(LIMIT, |f| f.get("v1", "ServiceAccount", "team-a", "keyward-router")).await;
    fake.seed(injected_fms_pod());
    fake.until(LIMIT, |f| f.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client")).await;
    // Opting out is acted on at once, not behind a backoff.
    let mut ns = fake.get("v1", "Namespace", "", "team-a").unwrap();
    ns["metadata"]["labels"] = json!({"kubernetes.io/metadata.name": "team-a"});
    fake.seed(ns);
    fake.until(LIMIT, |f| f.get("v1", "ServiceAccount", "team-a", "keyward-router").is_none().then_some(())).await;
    // The operator's namespace appears: the client CA is published there, by the watch.
    fake.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "lm-eval"}}));
    fake.until(LIMIT, |f| f.get("v1", "ConfigMap", "lm-eval", "keyward-client-ca")).await;
    let metrics = r.metrics().render();
    assert!(!metrics.contains("keyward_controller_reconcile_errors_total{"), "{metrics}");
    assert!(fake.calls().iter().all(|c| c.status < 400 || c.method == "GET"), "{:#?}", fake.calls());
    task.abort();
}

fn fast_lease(identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
        ..LeaseConfig::new("keyward-controller", "keyward-system", identity)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_replicas_only_the_leader_writes_and_losing_the_lease_stops_it() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(owner());
    let ca = client_ca();
    let mut replicas = Vec::new();
    for id in ["replica-a", "replica-b"] {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let elector = LeaderElector::new(fake.client(id), fast_lease(id));
        tokio::spawn(elector.run(tx));
        let leadership = Leadership::from_receiver(rx);
        let r = reconciler(&fake, id, ProfileSet::builtin().unwrap(), &ca, leadership.clone());
        let task = start(&fake, r.clone(), leadership.clone(), &ca, id);
        replicas.push((id, leadership, r, task));
    }
    let leader = fake
        .until(LIMIT, |f| {
            f.get("coordination.k8s.io/v1", "Lease", "keyward-system", "keyward-controller")
                .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
        })
        .await;
    fake.seed(injected_fms_pod());
    fake.until(LIMIT, |f| f.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client")).await;
    let writers: BTreeSet<String> =
        fake.writes().into_iter().filter(|c| c.resource != "coordination.k8s.io/v1/leases").map(|c| c.client).collect();
    assert_eq!(writers, BTreeSet::from([leader.clone()]));

    // Another holder takes the Lease: the leader sees it at its next renewal and stops.
    let (_, leadership, r, _) = replicas.iter().find(|(id, ..)| *id == leader).unwrap();
    let mut lease = fake.get("coordination.k8s.io/v1", "Lease", "keyward-system", "keyward-controller").unwrap();
    lease["spec"]["holderIdentity"] = json!("replica-c");
    lease["spec"]["leaseDurationSeconds"] = json!(3600);
    fake.seed(lease);
    let mut watch = leadership.clone();
    while watch.is_leader() {
        assert!(tokio::time::timeout(LIMIT, watch.changed()).await.unwrap());
    }
    fake.clear_calls();
    // A pod whose Secret is missing would need a write: the former leader refuses to make it.
    fake.remove("v1", "Secret", "team-a", "evaljob-sample-lmeval-client");
    let refused = r.pod(&as_pod(&injected_fms_pod())).await;
    assert_eq!(refused.unwrap_err().to_string(), "not the leader: nothing is written");
    assert!(fake.writes().iter().all(|c| c.resource == "coordination.k8s.io/v1/leases"), "{:#?}", fake.writes());
    assert!(r.metrics().render().contains("keyward_controller_leader 0"), "{}", r.metrics().render());
    for (_, _, _, task) in replicas {
        task.abort();
    }
}
