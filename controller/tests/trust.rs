//! What the controller refuses to vouch for. A client certificate from keyward is an identity:
//! it is issued only for an owner that exists now with the UID, kind and group its pod names,
//! in an opted-in namespace, for a pod keyward's webhook attested, or (for owners issued before
//! attestations) where keyward itself signed the certificate being renewed. Labels,
//! annotations, ownerReferences and a Secret's own contents are anyone's to write.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod support;

use std::time::Duration;

use keyward_certs::pki::Ca;
use keyward_controller::desired::{self, identity_problem, Owner, PodVerdict};
use keyward_controller::identity;
use keyward_controller::metrics::Refusal;
use keyward_controller::{run, Leadership};
use keyward_engine::ProfileSet;
use serde_json::{json, Value};
use support::*;

fn events(fake: &FakeApi) -> Vec<Value> {
    fake.calls()
        .into_iter()
        .filter(|c| c.resource == "events.k8s.io/v1/events" && c.method == "POST")
        .filter_map(|c| c.body)
        .collect()
}

/// A Secret a user made to look like keyward's, for `owner_name` (uid `owner_uid`).
fn forged_secret(ns: &str, name: &str, owner_api: &str, owner_name: &str, owner_uid: &str) -> Value {
    managed_secret(
        ns,
        name,
        json!({"apiVersion": owner_api, "kind": "LMEvalJob", "name": owner_name, "uid": owner_uid, "controller": true}),
        json!({"tls.crt": b64("junk"), "tls.key": b64("junk")}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_secret_gets_no_certificate_whatever_it_claims() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(namespace("elsewhere"));
    fake.seed(lmevaljob("team-a", "real-job", "real-uid"));
    let forged = [
        // A job that does not exist, at an API version nobody serves.
        forged_secret(
            "team-a",
            "victim-job-lmeval-client",
            &OWNER_API.replace("v1beta1", "v9"),
            "victim-job",
            "made-up",
        ),
        // The same in a namespace that did not opt in.
        forged_secret("elsewhere", "victim-job-lmeval-client", OWNER_API, "victim-job", "made-up"),
        // A real job, with no pod of keyward's.
        forged_secret("team-a", "real-job-lmeval-client", OWNER_API, "real-job", "real-uid"),
        // A name that would walk up a normalised SPIFFE path into another namespace.
        forged_secret(
            "team-a",
            "hostile-lmeval-client",
            OWNER_API,
            "x/../../../../ns/victim-ns/lmevaljob/victim-job",
            "made-up",
        ),
    ];
    let before: Vec<Value> = forged.iter().map(|s| fake.seed(s.clone())).collect();
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let settings = run::LoopSettings { resync: Duration::from_millis(100), workers: 4 };
    let task = start_with(fake.client("keyward"), r.clone(), Leadership::always(), &ca, settings);
    // A real job's attested pod, issued: the loop is at work.
    fake.seed(owner());
    let keys = fake.until(LIMIT, |_| r.attestation_keys()).await;
    fake.seed(attested_fms_pod(&keys));
    fake.until(LIMIT, |f| f.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client")).await;
    // Several resyncs later (each reads the CA source once)...
    fake.until(LIMIT, |f| (f.calls().iter().filter(|c| c.name == "grpc-server-cert").count() >= 5).then_some(())).await;
    task.abort();
    // ...no forged Secret was written, or even read.
    for secret in &before {
        let (ns, name) =
            (secret["metadata"]["namespace"].as_str().unwrap(), secret["metadata"]["name"].as_str().unwrap());
        assert_eq!(&fake.get("v1", "Secret", ns, name).unwrap(), secret, "{ns}/{name} changed");
        assert!(fake.calls().iter().all(|c| c.name != name), "{ns}/{name} was touched: {:#?}", fake.calls());
    }
    let written: Vec<String> =
        fake.writes().iter().filter(|c| c.resource == "/v1/secrets").map(|c| c.namespace.clone()).collect();
    assert_eq!(written, ["keyward-system", "team-a"], "the attestation key and the real job's certificate, only");
}

#[tokio::test]
async fn a_pod_without_an_attestation_or_with_a_forged_one_gets_nothing_and_is_reported() {
    let fake = FakeApi::default();
    fake.seed(owner());
    fake.seed(lmevaljob("team-a", "other-job", "other-uid"));
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    fake.clear_calls();

    // The injected shape written by hand (or by a webhook that refused or skipped it, or a
    // pod created unlabelled and labelled by an update the webhook never sees): no attestation.
    let unattested = fms_pod(None, "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    assert!(unattested["metadata"]["annotations"].get("keyward.io/attestation").is_none());
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &unattested)).await.unwrap();
    // An attestation made up, and one copied from another job's pod.
    let mut made_up = unattested.clone();
    made_up["metadata"]["annotations"]["keyward.io/attestation"] = json!("v1.0011223344556677.AAAA");
    made_up["metadata"]["uid"] = json!("pod-uid-2");
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &made_up)).await.unwrap();
    let other = fms_pod(Some(&keys), "team-a", "other-job", "other-job", "other-uid");
    let mut copied = unattested.clone();
    copied["metadata"]["annotations"]["keyward.io/attestation"] =
        other["metadata"]["annotations"]["keyward.io/attestation"].clone();
    copied["metadata"]["uid"] = json!("pod-uid-3");
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &copied)).await.unwrap();
    // An attestation under a key that is not keyward's (another cluster's webhook).
    let foreign_keys = {
        let bytes = keyward_certs::attestation::generate().unwrap();
        keyward_certs::attestation::Keys {
            current: Some(keyward_certs::attestation::Key::from_bytes(&bytes, "k").unwrap()),
            previous: None,
        }
    };
    let mut elsewhere = fms_pod(Some(&foreign_keys), "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    elsewhere["metadata"]["uid"] = json!("pod-uid-4");
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &elsewhere)).await.unwrap();

    assert_eq!(fake.attempted_writes().len(), 0, "{:#?}", fake.attempted_writes());
    assert!(fake.calls().iter().all(|c| c.resource.starts_with("events") || c.method == "GET"), "{:#?}", fake.calls());
    let reasons: Vec<(String, String)> = events(&fake)
        .iter()
        .map(|e| (e["reason"].as_str().unwrap().to_string(), e["regarding"]["uid"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("NoAdmissionAttestation".to_string(), "pod-uid-team-a-evaljob-sample".to_string()),
            ("ForgedAdmissionAttestation".into(), "pod-uid-2".into()),
            ("ForgedAdmissionAttestation".into(), "pod-uid-3".into()),
            ("ForgedAdmissionAttestation".into(), "pod-uid-4".into()),
        ]
    );
    assert!(events(&fake)[0]["note"]
        .as_str()
        .unwrap()
        .starts_with("keyward issues nothing for this pod's owner: it carries no admission attestation"));
    assert_eq!(r.metrics().refused_count(Refusal::NoAttestation), 1);
    assert_eq!(r.metrics().refused_count(Refusal::ForgedAttestation), 3);
    // Reported once: asked again, no new Event.
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &unattested)).await.unwrap();
    assert_eq!(events(&fake).len(), 4);
    // The genuine pod of the same owner is issued, whatever its siblings.
    let mut all = claims(&r, &unattested);
    all.extend(claims(&r, &attested_fms_pod(&keys)));
    keyward_controller::owners::reconcile(&r, &owner_key(), &all).await.unwrap();
    assert!(fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_in_a_namespace_that_did_not_opt_in_or_labelled_after_creation_get_nothing() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(namespace("elsewhere"));
    fake.seed(lmevaljob("elsewhere", "evaljob-sample", OWNER_UID));
    fake.seed(owner());
    fake.seed(lmevaljob("team-a", "late-labels", "late-uid"));
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    let keys = fake.until(LIMIT, |_| r.attestation_keys()).await;
    // Even with a valid attestation (signed for that namespace), a namespace that did not opt
    // in gets nothing: the webhook is not called there, so it cannot have judged the pod.
    fake.seed(fms_pod(Some(&keys), "elsewhere", "evaljob-sample", "evaljob-sample", OWNER_UID));
    // A pod created without the selecting labels (the webhook saw no profile's pod), its
    // injected shape written by hand, and the labels added by an update.
    let mut late = fms_pod(None, "team-a", "late-labels", "late-labels", "late-uid");
    let labels = late["metadata"]["labels"].take();
    late["metadata"]["labels"] = json!({});
    fake.seed(late.clone());
    late["metadata"]["labels"] = labels;
    fake.seed(late);
    // The canary: a genuine pod, issued; by then the others were seen.
    fake.seed(attested_fms_pod(&keys));
    fake.until(LIMIT, |f| f.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client")).await;
    fake.until(LIMIT, |_| (r.metrics().refused_count(Refusal::NoAttestation) == 1).then_some(())).await;
    // The Event is written after the refusal is counted: waited for, not assumed.
    let pod_events = |f: &FakeApi| {
        let found: Vec<Value> = events(f).into_iter().filter(|e| e["regarding"]["kind"] == "Pod").collect();
        (!found.is_empty()).then_some(found)
    };
    fake.until(LIMIT, pod_events).await;
    task.abort();
    let _ = task.await;
    assert!(
        fake.calls().iter().all(|c| c.namespace != "elsewhere" || c.resource == "/v1/namespaces"),
        "{:#?}",
        fake.calls()
    );
    assert!(fake.get("v1", "Secret", "team-a", "late-labels-lmeval-client").is_none());
    let reasons: Vec<String> = pod_events(&fake)
        .unwrap_or_default()
        .iter()
        .map(|e| format!("{} {}", e["reason"], e["regarding"]["name"]))
        .collect();
    assert_eq!(reasons, ["\"NoAdmissionAttestation\" \"late-labels\""]);
    // The Event names the pod whole, so `kubectl describe pod` shows it (mutation: a field of
    // the reference deleted).
    let uid = fake.get("v1", "Pod", "team-a", "late-labels").unwrap()["metadata"]["uid"].clone();
    assert_eq!(
        pod_events(&fake).unwrap()[0]["regarding"],
        json!({"apiVersion": "v1", "kind": "Pod", "name": "late-labels", "namespace": "team-a", "uid": uid})
    );
}

#[tokio::test]
async fn an_identity_is_made_only_from_names_kubernetes_allows() {
    let owner = |api: &str, kind: &str, name: &str, uid: &str| Owner {
        api_version: api.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
    };
    assert_eq!(identity_problem("team-a", &owner(OWNER_API, "LMEvalJob", "evaljob-sample", OWNER_UID)), None);
    let hostile = [
        ("team-a", owner(OWNER_API, "LMEvalJob", "x/../../../../ns/victim-ns/lmevaljob/victim-job", "u"), "the controller owner's name \"x/../../../../ns/victim-ns/lmevaljob/victim-job\" is not a Kubernetes object name (a DNS-1123 subdomain)"),
        ("team-a", owner(OWNER_API, "LMEvalJob", "..", "u"), "the controller owner's name \"..\" is not a Kubernetes object name (a DNS-1123 subdomain)"),
        ("team-a", owner(OWNER_API, "LMEval/Job", "j", "u"), "the controller owner's kind \"LMEval/Job\" is not a Kubernetes kind"),
        ("team-a", owner("a/b/v1", "LMEvalJob", "j", "u"), "the controller owner's apiVersion \"a/b/v1\" is not GROUP/VERSION"),
        ("team-a", owner(OWNER_API, "LMEvalJob", "j", "u/../v"), "the controller owner's uid \"u/../v\" is not a Kubernetes UID"),
        ("Team_A", owner(OWNER_API, "LMEvalJob", "j", "u"), "namespace \"Team_A\" is not a DNS-1123 label"),
    ];
    for (ns, o, why) in hostile {
        assert_eq!(identity_problem(ns, &o).as_deref(), Some(why));
    }
    // A kind is a letter then letters and digits, at most 63 of them (mutations: each `||` of
    // that check turned `&&`, the length bound moved).
    let long = "K".repeat(64);
    for kind in ["", "1Job", long.as_str()] {
        let o = owner(OWNER_API, kind, "j", "u");
        let why =
            format!("the controller owner's kind {:?} is not a Kubernetes kind", keyward_engine::text::clip(kind, 64));
        assert_eq!(identity_problem("team-a", &o), Some(why), "{kind:?}");
    }
    assert_eq!(identity_problem("team-a", &owner(OWNER_API, &"K".repeat(63), "j", "u")), None, "63 characters");
    // The trust domain, the identity's first segment: what SPIFFE allows, 1 to 255 characters
    // (mutations: no problem ever, or an empty one).
    use keyward_controller::desired::trust_domain_problem;
    assert_eq!(trust_domain_problem("cluster.local"), None);
    assert_eq!(trust_domain_problem(&"a".repeat(255)), None);
    let long = "a".repeat(256);
    assert_eq!(trust_domain_problem(&long), Some(format!("{long:?} must have 1 to 255 characters")));
    assert_eq!(trust_domain_problem(""), Some("\"\" must have 1 to 255 characters".to_string()));
    for bad in ["Cluster.local", "td/ns", "td:1"] {
        assert_eq!(
            trust_domain_problem(bad),
            Some(format!("{bad:?} may hold only lower-case letters, digits, '.', '-' and '_' (a SPIFFE trust domain)"))
        );
    }
    // On a pod: an injected pod whose owner's UID is not one gets nothing, and is reported.
    let ca = client_ca();
    let fake = FakeApi::default();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let mut pod = fms_pod(None, "team-a", "p", "evaljob-sample", OWNER_UID);
    pod["metadata"]["ownerReferences"][0]["uid"] = json!("u/../v");
    let verdict =
        desired::for_pod(r.profiles(), &serde_json::value::to_raw_value(&pod).unwrap(), "team-a", "cluster.local");
    assert_eq!(
        verdict,
        PodVerdict::Refused(
            keyward_controller::metrics::Refusal::UnverifiableOwner,
            "the controller owner's uid \"u/../v\" is not a Kubernetes UID".into()
        )
    );
    // A hostile owner name never becomes a claim either (its Secret name is no object name).
    let mut pod = fms_pod(None, "team-a", "p", "evaljob-sample", OWNER_UID);
    pod["metadata"]["ownerReferences"][0]["name"] = json!("x/../y");
    let verdict =
        desired::for_pod(r.profiles(), &serde_json::value::to_raw_value(&pod).unwrap(), "team-a", "cluster.local");
    assert!(!matches!(verdict, PodVerdict::Claim(_)), "{verdict:?}");
}

#[tokio::test]
async fn an_owner_issued_before_attestations_is_renewed_only_if_keyward_signed_its_certificate() {
    let fake = FakeApi::default();
    fake.seed(owner());
    fake.seed(lmevaljob("team-a", "other-job", "other-uid"));
    let ca = client_ca();
    let old_owner = Owner {
        api_version: OWNER_API.into(),
        kind: "LMEvalJob".into(),
        name: "evaljob-sample".into(),
        uid: OWNER_UID.into(),
    };
    // keyward's own certificate, 17 hours into 24: renewed, though the pod predates attestations.
    let ours = identity::issue(
        &ca.ca,
        "team-a",
        &old_owner,
        IDENTITY,
        now() - Duration::from_secs(17 * 3600),
        Duration::from_secs(24 * 3600),
    )
    .unwrap();
    let reference = |name: &str, uid: &str| json!({"apiVersion": OWNER_API, "kind": "LMEvalJob", "name": name, "uid": uid, "controller": true});
    fake.seed(managed_secret(
        "team-a",
        "evaljob-sample-lmeval-client",
        reference("evaljob-sample", OWNER_UID),
        json!({"tls.crt": b64(&ours.cert_pem), "tls.key": b64(&ours.key_pem), "ca.crt": b64(&ours.ca_pem)}),
    ));
    // The same shape for another job, signed by a CA that is not keyward's (same name, even),
    // with keyward's CA in ca.crt: left alone, and reported.
    let rogue = Ca::mint("keyward client CA", now(), Duration::from_secs(86400)).unwrap();
    let other_owner = Owner { name: "other-job".into(), uid: "other-uid".into(), ..old_owner.clone() };
    let stranger = identity::issue(
        &rogue,
        "team-a",
        &other_owner,
        "spiffe://cluster.local/ns/team-a/lmevaljob/other-job",
        now() - Duration::from_secs(17 * 3600),
        Duration::from_secs(24 * 3600),
    )
    .unwrap();
    let stranger_secret = fake.seed(managed_secret(
        "team-a",
        "other-job-lmeval-client",
        reference("other-job", "other-uid"),
        json!({"tls.crt": b64(&stranger.cert_pem), "tls.key": b64(&stranger.key_pem), "ca.crt": b64(ca.ca.cert_pem())}),
    ));
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    attestation_keys(&r).await;

    keyward_controller::owners::reconcile(
        &r,
        &owner_key(),
        &claims(&r, &fms_pod(None, "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID)),
    )
    .await
    .unwrap();
    let renewed = fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").unwrap();
    assert_ne!(secret_data(&renewed, "tls.crt"), ours.cert_pem, "keyward's own certificate is renewed");

    let other_key = keyward_controller::index::OwnerKey { namespace: "team-a".into(), uid: "other-uid".into() };
    keyward_controller::owners::reconcile(
        &r,
        &other_key,
        &claims(&r, &fms_pod(None, "team-a", "other-pod", "other-job", "other-uid")),
    )
    .await
    .unwrap();
    assert_eq!(fake.get("v1", "Secret", "team-a", "other-job-lmeval-client").unwrap(), stranger_secret, "left alone");
    assert_eq!(r.metrics().refused_count(Refusal::UnverifiedSecret), 1);
    assert!(events(&fake).iter().any(|e| e["reason"] == "UnverifiedSecret"));
}

/// A tenant who may create, get and list pods in team-a (not exec into them) copies the
/// operator's attested driver pod (its annotations, labels, owner reference and keyward's
/// volumes) onto pods of her own. With Secret delivery, none of them makes keyward issue the
/// job's certificate, even with the operator's pod gone: each names what it changed.
#[tokio::test]
async fn a_tenants_copy_of_an_attested_pod_gets_no_secret_whatever_it_changes() {
    let fake = FakeApi::default();
    fake.seed(owner());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    let original = attested_fms_pod(&keys);
    fake.clear_calls();
    let copy = |name: &str, change: &dyn Fn(&mut Value)| {
        let mut p = original.clone();
        p["metadata"]["name"] = json!(name);
        p["metadata"]["uid"] = json!(format!("uid-{name}"));
        change(&mut p);
        p
    };
    for (what, change) in TENANT_CHANGES {
        keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &copy(what, &change))).await.unwrap();
    }
    // The very same pod, an hour after the operator's was admitted (and gone).
    let late = copy("late", &|p| {
        let created = keyward_certs::parse_rfc3339(p["metadata"]["creationTimestamp"].as_str().unwrap()).unwrap();
        p["metadata"]["creationTimestamp"] = json!(keyward_certs::rfc3339(created + Duration::from_secs(3600)));
    });
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &late)).await.unwrap();
    assert_eq!(fake.attempted_writes().iter().filter(|c| c.resource == "/v1/secrets").count(), 0);
    assert!(fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").is_none());
    assert_eq!(r.metrics().refused_count(Refusal::ReboundAttestation), 4);
    assert_eq!(r.metrics().refused_count(Refusal::UntimelyAttestation), 1);
    let notes: Vec<(String, String)> = events(&fake)
        .iter()
        .map(|e| (e["reason"].as_str().unwrap().into(), e["regarding"]["name"].as_str().unwrap().into()))
        .collect();
    assert_eq!(
        notes,
        [
            ("ReboundAdmissionAttestation".to_string(), "image".to_string()),
            ("ReboundAdmissionAttestation".into(), "command".into()),
            ("ReboundAdmissionAttestation".into(), "volume".into()),
            ("ReboundAdmissionAttestation".into(), "account".into()),
            ("UntimelyAdmissionAttestation".into(), "late".into()),
        ]
    );
    assert_eq!(
        events(&fake)[0]["note"],
        "keyward issues nothing for this pod's owner: its admission attestation (keyward.io/attestation) was made for a pod that runs or mounts something else (copied from another pod, or this pod was changed by another webhook after keyward's last look); have the operator create the pod again"
    );
    // The operator's own pod still is.
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &original)).await.unwrap();
    assert!(fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").is_some());
}

/// An exact copy labelled `keyward.io/inject=disabled` (so the webhook never sees it), and a
/// second live pod with the operator's attestation: neither is served, both are reported,
/// and the operator's pod is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opted_out_copy_and_a_second_pod_with_one_attestation_are_reported_not_served() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(owner());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    let original = attested_fms_pod(&keys);
    let created = keyward_certs::parse_rfc3339(original["metadata"]["creationTimestamp"].as_str().unwrap()).unwrap();
    let copy = |name: &str, later: u64| {
        let mut p = original.clone();
        p["metadata"]["name"] = json!(name);
        p["metadata"]["uid"] = json!(format!("uid-{name}"));
        p["metadata"]["creationTimestamp"] = json!(keyward_certs::rfc3339(created + Duration::from_secs(later)));
        p
    };
    let mut opted_out = copy("opted-out", 20);
    opted_out["metadata"]["labels"]["keyward.io/inject"] = json!("disabled");
    // Pure: the verdict names the label.
    let verdict = desired::for_pod(
        r.profiles(),
        &serde_json::value::to_raw_value(&opted_out).unwrap(),
        "team-a",
        "cluster.local",
    );
    assert_eq!(
        verdict,
        PodVerdict::Refused(
            Refusal::OptedOut,
            "it is labelled keyward.io/inject=disabled, so keyward's webhook never admitted it; remove the label and recreate the pod".into()
        )
    );
    // The copy first, alone: nothing.
    let task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    fake.seed(opted_out);
    fake.until(LIMIT, |_| (r.metrics().refused_count(Refusal::OptedOut) == 1).then_some(())).await;
    // A second pod with the attestation, a minute after the operator's: the operator's is
    // served, the second reported.
    fake.seed(copy("twin", 60));
    fake.seed(original.clone());
    fake.until(LIMIT, |f| f.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client")).await;
    fake.until(LIMIT, |_| (r.metrics().refused_count(Refusal::DuplicateAttestation) == 1).then_some(())).await;
    let twin_event = |f: &FakeApi| {
        events(f)
            .into_iter()
            .find(|e| e["reason"] == "DuplicateAdmissionAttestation" && e["regarding"]["name"] == "twin")
    };
    let event = fake.until(LIMIT, twin_event).await;
    assert_eq!(
        event["note"],
        "keyward issues nothing for this pod's owner: pod evaljob-sample carries the same admission attestation and was created first: an attestation is for the one pod keyward's webhook admitted, and this one is a copy; have the operator create the pod again"
    );
    let opted_out_event = fake.until(LIMIT, |f| events(f).into_iter().find(|e| e["reason"] == "OptedOut")).await;
    assert_eq!(opted_out_event["regarding"]["name"], "opted-out");
    task.abort();
    let _ = task.await;
    assert_eq!(r.metrics().refused_count(Refusal::DuplicateAttestation), 1, "the operator's pod is not the copy");
}

/// A mesh's injector runs after keyward and adds an init container, a sidecar and their volume;
/// the apiserver calls keyward again (reinvocationPolicy: IfNeeded) and keyward attests the pod
/// as it now is: that pod, as stored, gets its owner's certificate.
#[tokio::test]
async fn a_pod_another_webhook_changed_before_keyward_was_reinvoked_still_gets_its_identity() {
    let fake = FakeApi::default();
    fake.seed(owner());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    let attestor = KeysAttestor(keys.clone());
    let facts = keyward_engine::RequestFacts::pod_create("team-a", keyward_engine::Requester::User(OPERATOR))
        .attested_by(&attestor);
    let profiles = ProfileSet::builtin().unwrap();
    let decide =
        |pod: &Value| keyward_engine::decide(&facts, &serde_json::value::to_raw_value(pod).unwrap(), &profiles);
    let mut pod = fixture("lmeval-fms-driver-pod.json");
    let first = decide(&pod);
    let patch: json_patch::Patch = serde_json::from_value(serde_json::to_value(first.patch()).unwrap()).unwrap();
    json_patch::patch(&mut pod, &patch).unwrap();
    let admitted_first = pod["metadata"]["annotations"]["keyward.io/attestation"].clone();
    // The mesh's webhook.
    pod["spec"]["initContainers"].as_array_mut().unwrap().push(json!({"name": "mesh-init", "image": "mesh/proxy:1", "args": ["iptables"], "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}));
    pod["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "mesh-proxy", "image": "mesh/proxy:1", "volumeMounts": [{"name": "mesh-certs", "mountPath": "/etc/mesh"}], "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}));
    pod["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "mesh-certs", "emptyDir": {"medium": "Memory"}}));
    // Had keyward not been called again, the pod would get nothing.
    let mut unreinvoked = pod.clone();
    stored(
        &mut unreinvoked,
        &keyward_engine::decide(
            &keyward_engine::RequestFacts::pod_create("team-a", keyward_engine::Requester::User(OPERATOR)),
            &serde_json::value::to_raw_value(&pod).unwrap(),
            &profiles,
        ),
        "team-a",
        "pod-uid-unreinvoked",
    );
    let claim = claims(&r, &unreinvoked).remove(0).2;
    assert_eq!(claim.attested(&keys), keyward_engine::attest::Verdict::Rebound);
    // Reinvoked: a new attestation, for the pod as the mesh left it.
    let again = decide(&pod);
    stored(&mut pod, &again, "team-a", "pod-uid-meshed");
    assert_ne!(pod["metadata"]["annotations"]["keyward.io/attestation"], admitted_first);
    keyward_controller::owners::reconcile(&r, &owner_key(), &claims(&r, &pod)).await.unwrap();
    let secret = fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").expect("issued");
    assert_eq!(cert_uris(&secret_data(&secret, "tls.crt")), [IDENTITY]);
}

/// Guards the owner's UID in the attestation's payload (mutation: the UID left out of
/// `attest::payload`'s fields): the job deleted and created again under the same name is
/// another owner, and the old pod's attestation, its owner reference pointed at the new UID,
/// buys nothing for it.
#[tokio::test]
async fn an_attestation_for_an_owner_deleted_and_created_again_under_its_name_is_refused() {
    let fake = FakeApi::default();
    fake.seed(lmevaljob("team-a", "evaljob-sample", "uid-of-the-new-job"));
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    let mut old = attested_fms_pod(&keys);
    old["metadata"]["ownerReferences"][0]["uid"] = json!("uid-of-the-new-job");
    let claim = claims(&r, &old);
    assert_eq!(claim[0].2.attested(&keys), keyward_engine::attest::Verdict::Forged);
    let new_owner =
        keyward_controller::index::OwnerKey { namespace: "team-a".into(), uid: "uid-of-the-new-job".into() };
    keyward_controller::owners::reconcile(&r, &new_owner, &claim).await.unwrap();
    assert!(fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").is_none());
    assert_eq!(r.metrics().refused_count(Refusal::ForgedAttestation), 1);
}
