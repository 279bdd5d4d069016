//! The controller's reconciler against an in-process fake of the Kubernetes API
//! (`support/mod.rs`): what it writes, and does not write, for owners, namespaces, the client
//! CA and CA sources. The loop (watches, faults, leadership) is in `faults.rs`; what it refuses
//! to vouch for, in `trust.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use keyward_certs::pki::Ca;
use keyward_certs::Trigger;
use keyward_controller::conditions::Condition;
use keyward_controller::desired::Owner;
use keyward_controller::identity::{self, Renewal};
use keyward_controller::metrics::Action;
use keyward_controller::queue::Outcome;
use keyward_controller::{run, Context, Leadership, Metrics, Settings};
use keyward_engine::{ProfileSet, RequestFacts, Requester};
use serde_json::{json, Value};
use support::*;

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

fn owner_ref() -> Owner {
    Owner {
        api_version: OWNER_API.into(),
        kind: "LMEvalJob".into(),
        name: "evaljob-sample".into(),
        uid: OWNER_UID.into(),
    }
}

fn owner_reference() -> Value {
    json!({"apiVersion": OWNER_API, "kind": "LMEvalJob", "name": "evaljob-sample", "uid": OWNER_UID, "controller": true})
}

// === per owner ===

#[tokio::test]
async fn a_new_owner_costs_two_requests_and_gets_its_certificate_owned_by_the_job() {
    let fake = FakeApi::default();
    fake.seed(owner());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    fake.clear_calls();
    let outcome =
        keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &attested_fms_pod(&keys))).await.unwrap();

    // Verify the owner, create the Secret: nothing else.
    let calls: Vec<(String, String)> = fake.calls().iter().map(|c| (c.method.clone(), c.resource.clone())).collect();
    assert_eq!(
        calls,
        [("GET".to_string(), format!("{OWNER_API}/lmevaljobs")), ("POST".to_string(), "/v1/secrets".to_string())]
    );
    let secret = fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").unwrap();
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(
        secret["metadata"]["labels"],
        json!({"app.kubernetes.io/managed-by": "keyward", "keyward.io/provisioned-for": "owner"})
    );
    assert_eq!(secret["metadata"]["annotations"], json!({"keyward.io/profile": "lmeval"}));
    assert_eq!(secret["metadata"]["ownerReferences"], json!([owner_reference()]));
    let cert = secret_data(&secret, "tls.crt");
    assert_eq!(cert_uris(&cert), [IDENTITY]);
    assert!(identity::issued_by(cert.as_bytes(), &ca.ca), "signed by the client CA");
    assert_eq!(secret_data(&secret, "ca.crt"), ca.ca.cert_pem());
    assert!(secret_data(&secret, "tls.key").starts_with("-----BEGIN PRIVATE KEY-----"));
    assert_eq!(r.metrics().object_count("client-certificate", Action::Issued, true), 1);
    // It comes back at the certificate's renewal, two thirds into its 24 hours.
    let Outcome::At(at) = outcome else { panic!("{outcome:?}") };
    let wait = at.duration_since(tokio::time::Instant::now());
    assert!(wait > Duration::from_secs(15 * 3600) && wait < Duration::from_secs(16 * 3600), "{wait:?}");
    r.report_expiry();
    assert!(
        r.metrics().render().contains("keyward_controller_next_certificate_expiry_seconds 86"),
        "{}",
        r.metrics().render()
    );
    // Asked again (another pod event): nothing, not even a read.
    fake.clear_calls();
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &attested_fms_pod(&keys))).await.unwrap();
    assert_eq!(fake.calls().len(), 0, "{:#?}", fake.calls());
}

#[tokio::test]
async fn a_missing_owner_or_one_with_another_uid_gets_nothing() {
    let fake = FakeApi::default();
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    fake.clear_calls();
    // No owner at all.
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &attested_fms_pod(&keys))).await.unwrap();
    // An owner of that name with another UID: a new job of the same name, not this pod's.
    fake.seed(lmevaljob("team-a", "evaljob-sample", "another-uid"));
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &attested_fms_pod(&keys))).await.unwrap();
    assert_eq!(fake.writes().len(), 0, "{:#?}", fake.writes());
    assert!(fake
        .calls()
        .iter()
        .any(|c| c.method == "GET" && c.resource == format!("{OWNER_API}/lmevaljobs") && c.name == "evaljob-sample"));
    assert_eq!(r.metrics().refused_count(keyward_controller::metrics::Refusal::OwnerMissing), 1, "reported once");
}

#[tokio::test]
async fn an_existing_valid_secret_is_not_touched_and_a_restart_changes_nothing() {
    let fake = FakeApi::default();
    fake.seed(owner());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    let pod = attested_fms_pod(&keys);
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &pod)).await.unwrap();
    fake.clear_calls();
    // Another replica, or this one after a restart: the same state, nothing to write.
    let again = reconciler(&fake, "keyward-2", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    keyward_controller::singletons::attestation_key(&again).await.unwrap();
    keyward_controller::owners::reconcile(&again, &owner_key(), &claims(&again, &pod)).await.unwrap();
    assert_eq!(fake.writes().len(), 0, "{:#?}", fake.writes());
    assert_eq!(again.metrics().object_count("client-certificate", Action::Unchanged, true), 1);
}

#[tokio::test]
async fn a_certificate_near_expiry_is_renewed_in_place_and_others_labels_stay() {
    let fake = FakeApi::default();
    fake.seed(owner());
    let ca = client_ca();
    // Issued 17 hours ago for 24: past two thirds.
    let old = identity::issue(
        &ca.ca,
        "team-a",
        &owner_ref(),
        IDENTITY,
        SystemTime::now() - Duration::from_secs(17 * 3600),
        Duration::from_secs(24 * 3600),
    )
    .unwrap();
    let mut seeded = managed_secret(
        "team-a",
        "evaljob-sample-lmeval-client",
        owner_reference(),
        json!({"tls.crt": b64(&old.cert_pem), "tls.key": b64(&old.key_pem), "ca.crt": b64(&old.ca_pem)}),
    );
    // Someone else's label and annotation on keyward's Secret (a backup tool's, say).
    seeded["metadata"]["labels"]["backup.example/include"] = json!("true");
    seeded["metadata"]["annotations"]["backup.example/policy"] = json!("daily");
    let before = fake.seed(seeded);
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    fake.clear_calls();
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &attested_fms_pod(&keys))).await.unwrap();

    let writes = fake.writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(writes[0].method, "PATCH", "updated in place");
    let body = writes[0].body.as_ref().unwrap();
    assert_eq!(
        body["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"],
        "a precondition on what was read"
    );
    let after = fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").unwrap();
    assert_eq!(after["metadata"]["labels"]["backup.example/include"], "true");
    assert_eq!(after["metadata"]["annotations"]["backup.example/policy"], "daily");
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
}

#[tokio::test]
async fn a_secret_that_names_an_earlier_owner_of_that_name_is_reissued_for_the_new_one() {
    let fake = FakeApi::default();
    fake.seed(owner());
    let ca = client_ca();
    // The job was deleted and made again with the same name; its old Secret lingers.
    let earlier = Owner { uid: "earlier-uid".into(), ..owner_ref() };
    let old = identity::issue(&ca.ca, "team-a", &earlier, IDENTITY, SystemTime::now(), Duration::from_secs(24 * 3600))
        .unwrap();
    let mut reference = owner_reference();
    reference["uid"] = json!("earlier-uid");
    fake.seed(managed_secret(
        "team-a",
        "evaljob-sample-lmeval-client",
        reference,
        json!({"tls.crt": b64(&old.cert_pem), "tls.key": b64(&old.key_pem), "ca.crt": b64(&old.ca_pem)}),
    ));
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    fake.clear_calls();
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &attested_fms_pod(&keys))).await.unwrap();
    let after = fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").unwrap();
    assert_eq!(after["metadata"]["ownerReferences"], json!([owner_reference()]));
    assert_ne!(secret_data(&after, "tls.crt"), old.cert_pem, "a new certificate, for the new owner");
    assert_eq!(fake.writes().iter().map(|c| c.method.as_str()).collect::<Vec<_>>(), ["PATCH"]);
}

fn token_profiles() -> ProfileSet {
    ProfileSet::from_sources([("t.yaml".to_string(), TOKEN_PROFILE.to_string())]).unwrap()
}

fn token_pod(keys: &keyward_certs::attestation::Keys, name: &str) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"), "labels": {"app": "token-job"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid-1", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}
    });
    let attestor = KeysAttestor(keys.clone());
    let facts = RequestFacts::pod_create("team-a", Requester::User("system:serviceaccount:kube-system:job-controller"))
        .attested_by(&attestor);
    let d = keyward_engine::decide(&facts, &serde_json::value::to_raw_value(&pod).unwrap(), &token_profiles());
    stored(&mut pod, &d, "team-a", &format!("uid-{name}"));
    pod
}

#[tokio::test]
async fn a_generated_token_is_created_once_and_never_regenerated() {
    let fake = FakeApi::default();
    fake.seed(json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "team-a", "uid": "job-uid-1"}}));
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", token_profiles(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    let job = keyward_controller::index::OwnerKey { namespace: "team-a".into(), uid: "job-uid-1".into() };
    keyward_controller::owners::reconcile(&r, &job, &claims(&r, &token_pod(&keys, "train-x7k2p"))).await.unwrap();
    let secret = fake.get("v1", "Secret", "team-a", "train-token").unwrap();
    let token = secret_data(&secret, "token");
    assert_eq!(token.len(), 43);
    assert_eq!(secret["type"], "Opaque");
    assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], "job-uid-1");
    fake.clear_calls();
    // Another pod of the job (its Secret is read once), and a restart: the token stays.
    let second = claims(&r, &token_pod(&keys, "train-9q8zt"));
    r.recheck(&second[0].2);
    keyward_controller::owners::reconcile(&r, &job, &second).await.unwrap();
    let restarted = reconciler(&fake, "keyward", token_profiles(), &ca, Leadership::always());
    keyward_controller::singletons::attestation_key(&restarted).await.unwrap();
    keyward_controller::owners::reconcile(&restarted, &job, &second).await.unwrap();
    assert_eq!(fake.writes().len(), 0, "{:#?}", fake.writes());
    assert_eq!(secret_data(&fake.get("v1", "Secret", "team-a", "train-token").unwrap(), "token"), token);
}

#[tokio::test]
async fn a_deleted_secret_is_made_again_for_the_next_pod() {
    let fake = FakeApi::default();
    fake.seed(owner());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &attested_fms_pod(&keys))).await.unwrap();
    fake.remove("v1", "Secret", "team-a", "evaljob-sample-lmeval-client");
    // The operator makes a new driver pod for the job: what keyward remembers is read again.
    let next = claims(&r, &fms_pod(Some(&keys), "team-a", "evaljob-sample-retry", "evaljob-sample", OWNER_UID));
    r.recheck(&next[0].2);
    keyward_controller::owners::reconcile(&r, &owner_key(), &next).await.unwrap();
    assert!(fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").is_some());
}

#[tokio::test]
async fn a_foreign_object_of_the_same_name_is_left_alone_and_reported() {
    let fake = FakeApi::default();
    fake.seed(owner());
    fake.seed(json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "evaljob-sample-lmeval-client", "namespace": "team-a"}, "data": {"mine": "eA=="}}));
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    fake.clear_calls();
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &attested_fms_pod(&keys))).await.unwrap();
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
    // The owner, named whole (mutation: a field of the reference deleted).
    assert_eq!(
        event["regarding"],
        json!({"apiVersion": "foundation-model-stack.github.com.github.com/v1beta1", "kind": "LMEvalJob",
               "name": "evaljob-sample", "namespace": "team-a", "uid": OWNER_UID})
    );
    assert!(event["note"]
        .as_str()
        .unwrap()
        .starts_with("Secret team-a/evaljob-sample-lmeval-client exists and is not managed by keyward"));
    assert_eq!(r.metrics().object_count("client-certificate", Action::Foreign, true), 1);
}

#[tokio::test]
async fn the_attestation_key_is_created_kept_and_rotated_with_the_previous_one_still_valid() {
    let fake = FakeApi::default();
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let first = attestation_keys(&r).await;
    let secret = fake.get("v1", "Secret", "keyward-system", "keyward-attestation").unwrap();
    assert_eq!(secret["metadata"]["labels"]["app.kubernetes.io/managed-by"], "keyward");
    assert_eq!(secret["data"].as_object().unwrap().keys().collect::<Vec<_>>(), ["current"]);
    // A restart reads the same key, writing nothing.
    fake.clear_calls();
    let again = reconciler(&fake, "keyward-2", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    assert_eq!(attestation_keys(&again).await.current.unwrap().id(), first.current.as_ref().unwrap().id());
    assert_eq!(fake.writes().len(), 0);
    // Due for rotation: the current key becomes the previous, and both verify.
    let mut due = fake.get("v1", "Secret", "keyward-system", "keyward-attestation").unwrap();
    due["metadata"]["annotations"]["keyward.io/rotated-at"] = json!("2020-01-01T00:00:00Z");
    fake.seed(due);
    let rotated = attestation_keys(&r).await;
    assert_eq!(rotated.previous.as_ref().unwrap().id(), first.current.as_ref().unwrap().id());
    assert_ne!(rotated.current.as_ref().unwrap().id(), first.current.as_ref().unwrap().id());
    let (key_id, tag) = first.sign(b"payload").unwrap();
    assert!(rotated.verify(b"payload", &key_id, &tag), "an attestation made just before the rotation still verifies");
    let secret = fake.get("v1", "Secret", "keyward-system", "keyward-attestation").unwrap();
    assert_eq!(secret["data"].as_object().unwrap().keys().collect::<Vec<_>>(), ["current", "previous"]);
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

fn builtins_and_account() -> ProfileSet {
    ProfileSet::builtin()
        .unwrap()
        .overlay(ProfileSet::from_sources([("r.yaml".to_string(), ACCOUNT_PROFILE.to_string())]).unwrap())
        .unwrap()
}

const CONFIG_MAP_SOURCE_PROFILE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata: {name: router}
spec:
  selector: {matchLabels: {app: router}}
  requesters: {usernames: ["system:serviceaccount:*:router-operator"]}
  inject:
    serverCA:
      configMapName: keyward-router-server-ca
      provider: keyward
      source:
        configMap: {namespace: router-system, name: router-ca, key: ca.crt}
      mountPath: /var/run/secrets/router/ca
"#;

/// A server CA copied from a ConfigMap, not a Secret: what the profile's `source.configMap`
/// names is what lands in each opted-in namespace (mutation: the ConfigMap arm of the source
/// refused).
#[tokio::test]
async fn a_server_ca_source_may_be_a_config_map() {
    let fake = FakeApi::default();
    let server_ca = Ca::mint("router CA", SystemTime::now(), Duration::from_secs(86400)).unwrap();
    fake.seed(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "router-ca", "namespace": "router-system"}, "data": {"ca.crt": server_ca.cert_pem()}}));
    let profiles = ProfileSet::from_sources([("r.yaml".to_string(), CONFIG_MAP_SOURCE_PROFILE.to_string())]).unwrap();
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", profiles, &ca, Leadership::always());
    keyward_controller::namespaces::provision(&r, "team-a").await.unwrap();
    let copy = fake.get("v1", "ConfigMap", "team-a", "keyward-router-server-ca").expect("copied");
    assert_eq!(copy["data"], json!({"ca.crt": server_ca.cert_pem()}));
}

/// Which profiles issue per owner, for the client CA `keyward controller` then requires: the
/// built-in lmeval does (a client certificate), the Kubeflow ones do not (mutations: `true` or
/// `false` whatever the profile).
#[test]
fn a_profile_issues_per_owner_only_when_keyward_provides_an_owners_object() {
    use keyward_controller::desired::provides_per_owner;
    use keyward_engine::Provision;
    let builtin = ProfileSet::builtin().unwrap();
    let issuing = |name: &str| {
        let profile = builtin.iter().find(|p| p.name == name).unwrap();
        provides_per_owner(profile, |p| matches!(p, Provision::ClientCertificate | Provision::PodCertificate))
    };
    assert!(issuing("lmeval"));
    assert!(!issuing("kfp-persistence-agent"));
}

/// Which profiles provide accounts, for the refusal `keyward controller` gives without
/// `--provision-accounts`: none of the built-ins, and a profile that does, named once
/// (mutations: an empty, blank or made-up list).
#[test]
fn the_profiles_that_provide_accounts_are_named_once_each() {
    use keyward_controller::desired::provisioning_accounts;
    assert_eq!(provisioning_accounts(&ProfileSet::builtin().unwrap()), Vec::<String>::new());
    assert_eq!(provisioning_accounts(&builtins_and_account()), ["router"]);
}

/// Without `--provision-accounts` (the default install, whose ClusterRole has no rights on
/// ServiceAccounts or RoleBindings) the loop never lists, watches or writes either, and a
/// namespace that opts in and out still gets and loses its server CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_install_never_touches_service_accounts_or_role_bindings() {
    let fake = FakeApi::default();
    let server_ca = Ca::mint("lm-eval gRPC", SystemTime::now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, server_ca.cert_pem());
    // One keyward made earlier (with the flag): left alone, as keyward may not delete it now.
    fake.seed(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "keyward-router", "namespace": "team-a",
        "labels": {"app.kubernetes.io/managed-by": "keyward", "keyward.io/provisioned-for": "namespace"}}}));
    fake.seed(opted_in("team-a"));
    let ca = client_ca();
    let settings = Settings { provision_accounts: false, ..settings() };
    let r =
        reconciler_with(fake.client("keyward"), ProfileSet::builtin().unwrap(), &ca, Leadership::always(), settings);
    let _task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    fake.until(LIMIT, |f| f.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca")).await;
    fake.seed(namespace("team-a"));
    fake.until(LIMIT, |f| f.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca").is_none().then_some(())).await;
    let touched: Vec<Call> = fake
        .calls()
        .into_iter()
        .filter(|c| c.resource.ends_with("/serviceaccounts") || c.resource.ends_with("/rolebindings"))
        .collect();
    assert!(touched.is_empty(), "{touched:#?}");
    assert!(fake.get("v1", "ServiceAccount", "team-a", "keyward-router").is_some());
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
    keyward_controller::namespaces::provision(&r, "team-a").await.unwrap();
    keyward_controller::namespaces::provision(&r, "team-b").await.unwrap();

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
    keyward_controller::namespaces::sweep(&r, &BTreeSet::from(["team-b".to_string()])).await.unwrap();
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

/// A delete names the object keyward saw (its UID as a precondition): when the watched copy is
/// behind and the name now holds someone else's object, the delete is refused and theirs stays
/// (mutation: the precondition removed from the delete).
#[tokio::test]
async fn a_delete_from_a_stale_store_never_removes_the_object_that_replaced_keyward_s() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{reflector, watcher};
    let fake = FakeApi::default();
    let server_ca = Ca::mint("lm-eval gRPC", SystemTime::now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, server_ca.cert_pem());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    keyward_controller::namespaces::provision(&r, "team-a").await.unwrap();
    let ours = fake.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca").unwrap();
    // The watch delivered keyward's ConfigMap, and has not yet seen what came after.
    let (config_maps, mut writer) = reflector::store::<ConfigMap>();
    writer.apply_watcher_event(&watcher::Event::InitApply(serde_json::from_value(ours.clone()).unwrap()));
    writer.apply_watcher_event(&watcher::Event::InitDone);
    r.use_stores(keyward_controller::context::Stores {
        config_maps,
        service_accounts: reflector::store().0,
        role_bindings: reflector::store().0,
    });
    // Meanwhile the name was taken by someone else's ConfigMap.
    fake.remove("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca");
    let theirs = fake.seed(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "keyward-lmeval-server-ca", "namespace": "team-a", "uid": "theirs"},
        "data": {"ca.crt": "theirs"}}));
    keyward_controller::namespaces::opt_out(&r, "team-a").await.unwrap();
    assert_eq!(fake.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca"), Some(theirs));
    let delete = fake.calls().into_iter().find(|c| c.method == "DELETE").expect("keyward tried to delete its copy");
    assert_eq!(delete.status, 409);
    assert_eq!(delete.body.unwrap()["preconditions"]["uid"], ours["metadata"]["uid"]);
}

#[tokio::test]
async fn a_changed_ca_source_updates_every_copy() {
    let fake = FakeApi::default();
    let first = Ca::mint("gRPC 1", SystemTime::now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, first.cert_pem());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    keyward_controller::namespaces::provision(&r, "team-a").await.unwrap();
    fake.clear_calls();
    keyward_controller::namespaces::provision(&r, "team-a").await.unwrap();
    assert_eq!(fake.writes().len(), 0, "unchanged source, nothing written");

    let second = Ca::mint("gRPC 2", SystemTime::now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, second.cert_pem());
    assert!(r.refresh_sources(&run::ca_sources(&r)).await.unwrap(), "the change is seen");
    keyward_controller::namespaces::provision(&r, "team-a").await.unwrap();
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
    r.refresh_sources(&run::ca_sources(&r)).await.unwrap();
    keyward_controller::namespaces::provision(&r, "team-a").await.unwrap();
    let note =
        r.conditions().message(Condition::ServerCaSourceUnusable, "ConfigMap team-a/keyward-lmeval-server-ca").unwrap();
    assert!(
        note.contains("serverCA source Secret lm-eval/grpc-server-cert key ca.crt: holds no PEM certificate; give the CA certificate"),
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
    keyward_controller::namespaces::provision(&r, "team-a").await.unwrap();
    keyward_controller::namespaces::provision(&r, "team-a").await.unwrap();
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

    // The source appears (read at the next resync): provisioned, and the condition ends.
    server_ca_source(&fake, Ca::mint("gRPC", SystemTime::now(), Duration::from_secs(86400)).unwrap().cert_pem());
    r.refresh_sources(&run::ca_sources(&r)).await.unwrap();
    keyward_controller::namespaces::provision(&r, "team-a").await.unwrap();
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
    let r = Arc::new(Context::new(
        fake.client("keyward"),
        Arc::new(ProfileSet::builtin().unwrap()),
        Settings { publish_client_ca_to: vec!["lm-eval".into(), "control-plane".into()], ..Settings::default() },
        ca.store.clone(),
        Leadership::always(),
        Arc::new(Metrics::default()),
        "keyward".into(),
    ));
    keyward_controller::trust::publish_client_ca(&r).await.unwrap();
    keyward_controller::trust::publish_client_ca(&r).await.unwrap();
    assert!(fake.get("v1", "ConfigMap", "control-plane", "keyward-client-ca").is_some());
    assert!(fake.writes().iter().all(|c| c.namespace != "lm-eval"), "{:#?}", fake.writes());
    assert_eq!(
        r.conditions().message(Condition::ClientCaNamespaceMissing, "lm-eval").unwrap(),
        "--publish-client-ca-to names namespace \"lm-eval\", which does not exist; the client CA is published there when it is created"
    );
    assert_eq!(r.metrics().conditions(Condition::ClientCaNamespaceMissing), 1);
    fake.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "lm-eval"}}));
    keyward_controller::trust::publish_client_ca(&r).await.unwrap();
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
    keyward_controller::trust::publish_client_ca(&r).await.unwrap();
    let cm = fake.get("v1", "ConfigMap", "lm-eval", "keyward-client-ca").unwrap();
    assert_eq!(cm["data"], json!({"ca.crt": ca.ca.cert_pem()}));
    assert!(!serde_json::to_string(&cm).unwrap().contains("PRIVATE KEY"));
}

/// The source's text as a namespace's copy shows it, or the condition's note.
async fn copy_of(source: &str) -> Result<String, String> {
    let fake = FakeApi::default();
    server_ca_source(&fake, source);
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    keyward_controller::namespaces::provision(&r, "team-a").await.unwrap();
    match fake.get("v1", "ConfigMap", "team-a", "keyward-lmeval-server-ca") {
        Some(cm) => Ok(cm["data"]["ca.crt"].as_str().unwrap().to_string()),
        None => Err(r
            .conditions()
            .message(Condition::ServerCaSourceUnusable, "ConfigMap team-a/keyward-lmeval-server-ca")
            .unwrap()),
    }
}

#[tokio::test]
async fn only_ca_certificates_are_ever_copied_from_a_source() {
    let now = SystemTime::now();
    let day = Duration::from_secs(86400);
    let (old, new) = (Ca::mint("gRPC CA 1", now, day).unwrap(), Ca::mint("gRPC CA 2", now, day).unwrap());
    // A bundle of two CAs, as during a rotation: copied, both.
    let bundle = format!("{}{}", old.cert_pem(), new.cert_pem());
    assert_eq!(copy_of(&bundle).await.unwrap(), bundle);
    // Text around the certificates is not copied; the certificates are, re-encoded.
    let commented = format!("# the gRPC server's CA\n{}", old.cert_pem());
    assert_eq!(copy_of(&commented).await.unwrap(), old.cert_pem());
    // A certificate followed by its private key: refused, nothing copied.
    let with_key = format!("{}{}", old.cert_pem(), old.key_pem());
    let note = copy_of(&with_key).await.unwrap_err();
    assert!(note.ends_with("serverCA source Secret lm-eval/grpc-server-cert key ca.crt: holds a private key; keyward copies only CA certificates: point the source at a key that holds just the CA certificate (cert-manager: ca.crt, never tls.key); pods that need it wait until the source holds a CA certificate"), "{note}");
    // A leaf (the server's own certificate): refused.
    let leaf = old.issue_serving(&["grpc.lm-eval.svc".into()], now, day).unwrap();
    let note = copy_of(&leaf.cert_pem).await.unwrap_err();
    assert!(note.contains("certificate 1 (CN=grpc.lm-eval.svc) is not a CA (no basicConstraints CA:TRUE)"), "{note}");
    // A certificate given twice: copied once (a ClusterTrustBundle may not repeat one).
    assert_eq!(copy_of(&old.cert_pem().repeat(2)).await.unwrap(), old.cert_pem());
    // More certificates than a trust bundle may hold.
    let many: String =
        (0..17).map(|i| Ca::mint(&format!("gRPC CA {i}"), now, day).unwrap().cert_pem().to_string()).collect();
    let note = copy_of(&many).await.unwrap_err();
    assert!(note.contains("holds 17 certificates, more than the 16 a trust bundle may have"), "{note}");
}

#[tokio::test]
async fn a_pod_injected_before_the_profile_label_existed_is_still_claimed() {
    let fake = FakeApi::default();
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    let mut pod = attested_fms_pod(&keys);
    assert_eq!(pod["metadata"]["labels"]["keyward.io/profile"], "lmeval");
    pod["metadata"]["labels"].as_object_mut().unwrap().remove("keyward.io/profile");
    // The re-plan adds only the label: not a change to the injection, so the owner is claimed.
    let claimed = claims(&r, &pod);
    assert_eq!(claimed[0].0.name, "evaljob-sample");
}
