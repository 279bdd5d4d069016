//! Issue 25's attack, made as a tenant makes it, against the real `keyward serve` (over TLS, with
//! its mounted attestation key) and keyward's controller and signer (in-process, against the
//! fake API, holding the same key, as the Secret `keyward-attestation` gives it both): a
//! namespace user of team-a who may create, get and list pods (not exec into them) reads the
//! operator's attested LMEvalJob driver pod and copies everything she can read (labels,
//! annotations, owner reference, keyward's volumes) onto pods of her own. None of them gets the
//! job's identity, by Secret or by pod certificate; the operator's own pod does.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

#[path = "../controller/tests/support/mod.rs"]
mod fake;
mod support;

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use keyward_controller::desired::{self, PodVerdict};
use keyward_controller::metrics::Refusal;
use keyward_controller::signer;
use keyward_controller::{Leadership, Settings};
use keyward_engine::attest::Verdict;
use keyward_engine::ProfileSet;
use serde_json::{json, Value};

const TENANT: &str = "alice@example.com";

/// deploy/profiles/lmeval-pod-certificate.yaml: the built-in `lmeval`, as pod certificates.
const POD_CERTIFICATE_PROFILE: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/profiles/lmeval-pod-certificate.yaml");

/// The review the apiserver sends for `pod`, created in team-a by `user`.
fn review(pod: &Value, user: &str, uid: &str) -> Vec<u8> {
    let mut r: Value =
        serde_json::from_slice(&support::review_of("lmeval-fms-driver-pod.json", "team-a", user, uid)).unwrap();
    r["request"]["object"] = pod.clone();
    serde_json::to_vec(&r).unwrap()
}

/// `pod` through the real webhook as `user`: the review's answer, and the pod as the apiserver
/// would store it (the patch applied; UID, name and creation time set).
async fn through_webhook(server: &support::Server, pod: &Value, user: &str, name: &str) -> (Value, Value) {
    let (mut client, _) = server.connect().await.unwrap();
    let answer = client.mutate(&review(pod, user, &format!("review-{name}"))).await.unwrap()["response"].clone();
    let mut stored = pod.clone();
    if let Some(patch) = answer["patch"].as_str() {
        let patch: json_patch::Patch =
            serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(patch).unwrap()).unwrap();
        json_patch::patch(&mut stored, &patch).unwrap();
    }
    created(&mut stored, name, SystemTime::now());
    (answer, stored)
}

/// What the apiserver sets on a pod it stores.
fn created(pod: &mut Value, name: &str, at: SystemTime) {
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]["namespace"] = json!("team-a");
    pod["metadata"]["uid"] = json!(format!("uid-{name}"));
    pod["metadata"]["creationTimestamp"] = json!(keyward_certs::rfc3339(at));
}

/// A tenant's pod carrying everything she read off `original`, changed by `change`.
fn copy_of(original: &Value, name: &str, change: impl Fn(&mut Value)) -> Value {
    let mut copy = original.clone();
    copy["metadata"]["name"] = json!(name);
    copy["metadata"]["uid"] = json!(format!("uid-{name}"));
    change(&mut copy);
    copy
}

fn verdict(profiles: &ProfileSet, pod: &Value) -> PodVerdict {
    desired::for_pod(profiles, &serde_json::value::to_raw_value(pod).unwrap(), "team-a", "cluster.local")
}

/// The controller's key: the webhook's (the Secret keyward-attestation, which the controller
/// makes and the webhook mounts), so that what one signs the other checks.
fn share_key(api: &fake::FakeApi, server: &support::Server) {
    let key = std::fs::read(server.attestation_dir.as_ref().unwrap().path().join("current")).unwrap();
    let secret = keyward_controller::objects::attestation_secret(
        "keyward-system",
        "keyward-attestation",
        &key,
        None,
        &keyward_certs::rfc3339(SystemTime::now()),
    );
    api.seed(serde_json::to_value(secret).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_copies_of_an_attested_pod_get_no_secret() {
    let tls = support::TlsDir::new();
    let server = tls.start(&[]);
    let api = fake::FakeApi::default();
    api.seed(fake::opted_in("team-a"));
    api.seed(fake::owner());
    share_key(&api, &server);
    let ca = fake::client_ca();
    let profiles = ProfileSet::builtin().unwrap();
    let r = fake::reconciler(&api, "keyward", profiles.clone(), &ca, Leadership::always());
    let keys = fake::attestation_keys(&r).await;

    // The operator's driver pod, admitted by the webhook: what the tenant reads with `get pods`.
    let submitted: Value = serde_json::from_slice(&support::fixture("lmeval-fms-driver-pod.json")).unwrap();
    let (answer, original) = through_webhook(&server, &submitted, fake::OPERATOR, "evaljob-sample").await;
    assert_eq!(answer["allowed"], true);
    assert!(original["metadata"]["annotations"]["keyward.io/attestation"].as_str().unwrap().starts_with("v2."));

    // 1. Copies stored without the webhook (labelled out of its reach, or labelled so only by
    //    an update): each refused, and the job's Secret never made for them.
    let mut refused = Vec::new();
    for (what, change) in fake::TENANT_CHANGES {
        let copy = copy_of(&original, &format!("copy-{what}"), change);
        let claim = fake::claims(&r, &copy).remove(0);
        assert_eq!(claim.2.attested(&keys), Verdict::Rebound, "{what}");
        refused.push(claim);
        let mut opted_out = copy.clone();
        opted_out["metadata"]["labels"]["keyward.io/inject"] = json!("disabled");
        assert!(matches!(verdict(&profiles, &opted_out), PodVerdict::Refused(Refusal::OptedOut, _)), "{what}");
    }
    let an_hour_later = copy_of(&original, "copy-late", |p| {
        created(p, "copy-late", SystemTime::now() + Duration::from_secs(3600));
    });
    refused.extend(fake::claims(&r, &an_hour_later));
    keyward_controller::owners::reconcile(&r, &fake::owner_key(), &refused).await.unwrap();
    assert!(api.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").is_none());
    assert_eq!(r.metrics().refused_count(Refusal::ReboundAttestation), 4);
    assert_eq!(r.metrics().refused_count(Refusal::UntimelyAttestation), 1);

    // 2. Her copy through the webhook, as herself: with the operator's labels refused; with
    //    labels no profile selects, admitted without the attestation and the record.
    let mine = copy_of(&original, "mine", fake::TENANT_CHANGES[0].1);
    let (answer, _) = through_webhook(&server, &mine, TENANT, "mine").await;
    assert_eq!(answer["allowed"], false, "{answer}");
    let mut unselected = mine.clone();
    unselected["metadata"]["labels"] = json!({"app": "alice"});
    let (answer, stored) = through_webhook(&server, &unselected, TENANT, "unselected").await;
    assert_eq!(answer["allowed"], true, "{answer}");
    assert!(stored["metadata"]["annotations"].get("keyward.io/attestation").is_none(), "{stored:#}");
    assert!(stored["metadata"]["annotations"].get("keyward.io/injected").is_none(), "{stored:#}");

    // 3. Her own attestation, asked of the webhook directly (its port is open to any pod) as
    //    if she were the operator: it is made, for her pod. It buys her nothing only because it
    //    cannot reach a stored pod: the webhook removes it when she creates the pod (2.), and
    //    the admission policy refuses a pod carrying one that the webhook does not see, and any
    //    update that adds one. Without the policy, such a pod would be served: which is why it
    //    ships in deploy/base and the README says to keep it.
    let (answer, forged) = through_webhook(&server, &mine, fake::OPERATOR, "oracle").await;
    assert_eq!(answer["allowed"], true);
    assert_eq!(fake::claims(&r, &forged)[0].2.attested(&keys), Verdict::Valid, "the policy is load-bearing");
    let policy = support::attestation_policy();
    let namespace = fake::opted_in("team-a");
    let mut opted_out = forged.clone();
    opted_out["metadata"]["labels"]["keyward.io/inject"] = json!("disabled");
    assert!(support::policy_admits(&policy, "CREATE", &opted_out, &Value::Null, &namespace).is_err());
    let mut before = forged.clone();
    before["metadata"]["annotations"].as_object_mut().unwrap().remove("keyward.io/attestation");
    assert!(support::policy_admits(&policy, "UPDATE", &forged, &before, &namespace).is_err());

    // 4. An exact copy while the operator's pod lives: reported, the operator's pod served.
    let twin = copy_of(&original, "twin", |p| {
        created(p, "twin", SystemTime::now() + Duration::from_secs(30));
    });
    let mut both = fake::claims(&r, &original);
    both.extend(fake::claims(&r, &twin));
    keyward_controller::owners::reconcile(&r, &fake::owner_key(), &both).await.unwrap();
    assert_eq!(r.metrics().refused_count(Refusal::DuplicateAttestation), 1);
    let secret =
        api.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").expect("the operator's pod is served");
    assert_eq!(
        fake::cert_uris(&fake::secret_data(&secret, "tls.crt")),
        ["spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_copy_of_an_attested_pod_gets_no_pod_certificate_for_her_kubelets_key() {
    let tls = support::TlsDir::new();
    let server = tls.start(&["--profiles", POD_CERTIFICATE_PROFILE]);
    let api = fake::FakeApi::default();
    share_key(&api, &server);
    let ca = fake::client_ca();
    let profiles = ProfileSet::from_sources([(
        POD_CERTIFICATE_PROFILE.to_string(),
        std::fs::read_to_string(POD_CERTIFICATE_PROFILE).unwrap(),
    )])
    .unwrap();
    let settings = Settings { pod_certificates: vec![signer::ApiVersion::V1beta1], ..fake::settings() };
    let r = fake::reconciler_with(api.client("keyward"), profiles.clone(), &ca, Leadership::always(), settings);
    let keys = fake::attestation_keys(&r).await;
    let submitted: Value = serde_json::from_slice(&support::fixture("lmeval-fms-driver-pod.json")).unwrap();
    let (_, mut original) = through_webhook(&server, &submitted, fake::OPERATOR, "evaljob-sample").await;
    original["spec"]["nodeName"] = json!("worker-1");
    // Her kubelet's request for her pod (on her node), as NodeRestriction lets it through.
    let decide = |pod: &Value| {
        // (The key itself is the apiserver's to check: any will do here.)
        let request = fake::pcr::request(
            "certificates.k8s.io/v1beta1",
            "req-1",
            pod,
            "keyward.io/lmeval",
            fake::pcr::KeyField::Pkix(b"her kubelet's key"),
        );
        let request = signer::Request::read(&serde_json::from_value(request).unwrap()).unwrap();
        let raw = serde_json::value::to_raw_value(pod).unwrap();
        let facts = signer::Facts {
            pod: Some(&raw),
            opted_in: true,
            keys: &keys,
            trust_domain: "cluster.local",
            validity: Duration::from_secs(86_400),
        };
        signer::decide(&request, &profiles, facts)
    };
    assert!(matches!(decide(&original), signer::Verdict::Issue { .. }), "the operator's pod is signed for");
    for (what, change) in fake::TENANT_CHANGES {
        let copy = copy_of(&original, &format!("copy-{what}"), |p| {
            change(p);
            p["spec"]["nodeName"] = json!("tenant-node");
        });
        match decide(&copy) {
            signer::Verdict::Deny { reason, .. } => assert_eq!(reason, "ReboundAttestation", "{what}"),
            other => panic!("{what}: {other:?}"),
        }
        let mut opted_out = copy.clone();
        opted_out["metadata"]["labels"]["keyward.io/inject"] = json!("disabled");
        assert!(matches!(decide(&opted_out), signer::Verdict::Deny { reason: "OptedOut", .. }), "{what}");
    }
}
