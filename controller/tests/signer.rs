//! keyward as the signer of pod certificates (`delivery: podCertificate`), against the fake
//! API, which checks every status update as the apiserver does (`support::pcr`): the kubelet's
//! requests for an injected, attested pod get the owner's identity; every other request is
//! denied with a reason a person can act on, or, for another signer, never touched; only the
//! leader answers; the client CA is published as each signer's ClusterTrustBundle, both CAs
//! through a rotation; and the issued chain works for mutual TLS with that bundle as the only
//! trust anchors.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keyward_controller::signer::ApiVersion;
use keyward_controller::{LeaderElector, Leadership, LeaseConfig, Settings};
use keyward_engine::ProfileSet;
use serde_json::{json, Value};
use support::pcr::{self, KeyField};
use support::*;
use x509_parser::prelude::FromDer;

const SIGNER: &str = "keyward.io/lmeval";
const NODE: &str = "worker-1";

/// deploy/profiles/lmeval-pod-certificate.yaml: the built-in `lmeval`, delivering pod
/// certificates.
fn profiles() -> ProfileSet {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/profiles/lmeval-pod-certificate.yaml");
    ProfileSet::from_sources([(path.to_string(), std::fs::read_to_string(path).unwrap())]).unwrap()
}

fn signing(version: ApiVersion) -> Settings {
    Settings { pod_certificates: vec![version], trust_bundles: Some(version), ..settings() }
}

/// The fms driver pod of `owner`, as stored once keyward's webhook admitted it under the pod
/// certificate profile (attested with `keys`, when given) and the scheduler bound it to NODE.
fn pod(keys: Option<&keyward_certs::attestation::Keys>, namespace: &str, name: &str, owner: &str, uid: &str) -> Value {
    let mut pod = admitted_fms_pod(&profiles(), keys, namespace, name, owner, uid);
    pod["spec"]["nodeName"] = json!(NODE);
    pod
}

/// A tenant's copy of `original` (a stored pod: its labels, annotations, owner and volumes, as
/// `get pods` shows them) named `name`, created `later` seconds after it on her own node.
fn copy_of(original: &Value, name: &str, later: i64) -> Value {
    let mut copy = original.clone();
    copy["metadata"]["name"] = json!(name);
    copy["metadata"]["uid"] = json!(format!("uid-{name}"));
    let created = keyward_certs::parse_rfc3339(original["metadata"]["creationTimestamp"].as_str().unwrap()).unwrap();
    let at = if later >= 0 {
        created + Duration::from_secs(later.unsigned_abs())
    } else {
        created - Duration::from_secs(later.unsigned_abs())
    };
    copy["metadata"]["creationTimestamp"] = json!(keyward_certs::rfc3339(at));
    copy
}

/// A tenant's copy: its name, how many seconds after the original it is created, and what she
/// changes.
type TenantCopy = (&'static str, i64, fn(&mut Value));

/// A key the kubelet made, and its DER SubjectPublicKeyInfo.
fn kubelet_key() -> (rcgen::KeyPair, Vec<u8>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let spki = rcgen::PublicKeyData::subject_public_key_info(&key);
    (key, spki)
}

/// The kubelet's 1.36+ stub: a PKCS#10 request with nothing but the key.
fn stub_csr(key: &rcgen::KeyPair) -> Vec<u8> {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.serialize_request(key).unwrap().der().to_vec()
}

fn pcr_of(fake: &FakeApi, version: ApiVersion, namespace: &str, name: &str) -> Value {
    fake.get(&format!("certificates.k8s.io/{}", version.as_str()), "PodCertificateRequest", namespace, name)
        .unwrap_or_else(|| panic!("no request {namespace}/{name}"))
}

/// Waits until the request has a condition; returns it.
async fn answered(fake: &FakeApi, version: ApiVersion, namespace: &str, name: &str) -> Value {
    fake.until(LIMIT, |f| {
        let pcr = pcr_of(f, version, namespace, name);
        pcr["status"]["conditions"].get(0).is_some().then_some(pcr)
    })
    .await
}

struct Signer {
    fake: FakeApi,
    ca: ClientCa,
    reconciler: Arc<keyward_controller::Context>,
    keys: keyward_certs::attestation::Keys,
    _run: tokio::task::JoinHandle<()>,
}

async fn signer(version: ApiVersion) -> Signer {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(namespace("elsewhere"));
    fake.seed(owner());
    let ca = client_ca();
    let reconciler = reconciler_with(fake.client("keyward"), profiles(), &ca, Leadership::always(), signing(version));
    let keys = attestation_keys(&reconciler).await;
    let run = start(&fake, reconciler.clone(), Leadership::always(), &ca, "keyward");
    Signer { fake, ca, reconciler, keys, _run: run }
}

/// The issued leaf: its URIs, its key, its validity in seconds, and whether the CA signed it.
fn leaf_of(pcr: &Value, ca_pem: &str) -> (Vec<String>, Vec<u8>, i64, bool) {
    let chain = pcr["status"]["certificateChain"].as_str().unwrap();
    let der = x509_parser::pem::parse_x509_pem(chain.as_bytes()).unwrap().1.contents;
    let (_, leaf) = x509_parser::certificate::X509Certificate::from_der(&der).unwrap();
    let ca_der = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes()).unwrap().1.contents;
    let (_, ca) = x509_parser::certificate::X509Certificate::from_der(&ca_der).unwrap();
    let signed = leaf.verify_signature(Some(ca.public_key())).is_ok();
    let uris = cert_uris(chain);
    let life = leaf.validity().not_after.timestamp() - leaf.validity().not_before.timestamp();
    (uris, leaf.public_key().raw.to_vec(), life, signed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_request_for_an_injected_attested_pod_gets_the_owners_identity() {
    for version in [ApiVersion::V1beta1, ApiVersion::V1] {
        let s = signer(version).await;
        let pod = pod(Some(&s.keys), "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
        s.fake.seed(pod.clone());
        let (key, spki) = kubelet_key();
        // 1.35 sends the key itself; 1.36 on, a PKCS#10 stub.
        let field =
            if version == ApiVersion::V1beta1 { KeyField::Pkix(&spki) } else { KeyField::Stub(&stub_csr(&key)) };
        let api_version = format!("certificates.k8s.io/{}", version.as_str());
        s.fake.seed(pcr::request(&api_version, "req-7xk2p", &pod, SIGNER, field));

        let pcr = answered(&s.fake, version, "team-a", "req-7xk2p").await;
        let condition = &pcr["status"]["conditions"][0];
        assert_eq!(
            (condition["type"].as_str(), condition["reason"].as_str()),
            (Some("Issued"), Some("Issued")),
            "{pcr:#}"
        );
        let (uris, leaf_key, life, signed) = leaf_of(&pcr, s.ca.ca.cert_pem());
        assert_eq!(uris, [IDENTITY]);
        assert_eq!(leaf_key, spki, "the leaf certifies the kubelet's key");
        assert!(signed, "signed by the client CA");
        // keyward's validity (24 h), within the request's maximum (24 h).
        assert_eq!(life, 86_400);
        // An Event for whoever looks at the request.
        let event = s
            .fake
            .until(LIMIT, |f| {
                f.calls()
                    .into_iter()
                    .filter(|c| c.resource == "events.k8s.io/v1/events" && c.method == "POST")
                    .find_map(|c| {
                        c.body
                            .filter(|e| e["regarding"]["name"] == "req-7xk2p" && e["reason"] == "PodCertificateIssued")
                    })
            })
            .await;
        assert_eq!(event["type"], "Normal");
        assert!(
            event["note"]
                .as_str()
                .unwrap()
                .starts_with(&format!("issued {IDENTITY} for pod evaljob-sample, valid until ")),
            "{event:#}"
        );
        // No Secret: the key never left the node.
        assert!(s.fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").is_none());
        s.fake.until(LIMIT, |_| (s.reconciler.metrics().pod_certificate_count("issued") == 1).then_some(())).await;
        // The request is answered once: it is terminal now.
        let puts = s
            .fake
            .calls()
            .iter()
            .filter(|c| c.method == "PUT" && c.resource.ends_with("podcertificaterequests"))
            .count();
        assert_eq!(puts, 1, "{version:?}");

        // At beginRefreshAt the kubelet makes a new key and asks again: the same identity for it.
        let (key, refreshed_spki) = kubelet_key();
        let field = if version == ApiVersion::V1beta1 {
            KeyField::Pkix(&refreshed_spki)
        } else {
            KeyField::Stub(&stub_csr(&key))
        };
        s.fake.seed(pcr::request(&api_version, "req-9qm4t", &pod, SIGNER, field));
        let refreshed = answered(&s.fake, version, "team-a", "req-9qm4t").await;
        let (uris, leaf_key, _, signed) = leaf_of(&refreshed, s.ca.ca.cert_pem());
        assert_eq!((uris, signed), (vec![IDENTITY.to_string()], true));
        assert_eq!(leaf_key, refreshed_spki);
        assert_ne!(refreshed_spki, spki);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_other_request_is_denied_saying_why_and_another_signers_is_never_touched() {
    let version = ApiVersion::V1beta1;
    let s = signer(version).await;
    let api_version = "certificates.k8s.io/v1beta1";
    let (_, spki) = kubelet_key();
    let good = pod(Some(&s.keys), "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    s.fake.seed(good.clone());
    // An unattested pod (created while the webhook could not attest), one whose attestation
    // was copied from another pod, one whose owner is gone, one in a namespace that did not
    // opt in.
    let unattested = pod(None, "team-a", "unattested", "evaljob-sample", OWNER_UID);
    s.fake.seed(unattested.clone());
    let mut forged = pod(Some(&s.keys), "team-a", "forged", "other-job", "uid-other");
    forged["metadata"]["annotations"]["keyward.io/attestation"] =
        good["metadata"]["annotations"]["keyward.io/attestation"].clone();
    s.fake.seed(forged.clone());
    let orphan = pod(Some(&s.keys), "team-a", "orphan", "gone-job", "uid-gone");
    s.fake.seed(orphan.clone());
    let elsewhere = pod(Some(&s.keys), "elsewhere", "evaljob-sample", "evaljob-sample", OWNER_UID);
    s.fake.seed(elsewhere.clone());
    // A tenant's copies of the driver pod (its annotations, owner and volumes; read with `get
    // pods`): with her image, command, volume or account (`copied-…`); exactly alike but
    // labelled out of the webhook's reach; exactly alike a minute later (a second pod with one
    // attestation); exactly alike an hour later.
    let others: [TenantCopy; 3] = [
        ("opted-out", 30, |p| p["metadata"]["labels"]["keyward.io/inject"] = json!("disabled")),
        ("twin", 60, |_| {}),
        ("late", 3600, |_| {}),
    ];
    let copies = TENANT_CHANGES
        .iter()
        .map(|(what, change)| (format!("copied-{what}"), 30, *change))
        .chain(others.map(|(name, later, change)| (name.to_string(), later, change)));
    let mut created = BTreeMap::new();
    for (name, later, change) in copies {
        let mut copy = copy_of(&good, &name, later);
        change(&mut copy);
        created.insert(name, copy["metadata"]["creationTimestamp"].as_str().unwrap().to_string());
        s.fake.seed(copy);
    }
    let copy = |name: &str| s.fake.get("v1", "Pod", "team-a", name).unwrap();

    let mut requests: BTreeMap<&str, Value> = BTreeMap::new();
    let mut on = |name: &'static str, pod: &Value, signer: &str, edit: &dyn Fn(&mut Value)| {
        let mut r = pcr::request(api_version, name, pod, signer, KeyField::Pkix(&spki));
        edit(&mut r);
        requests.insert(name, r);
    };
    on("unknown-signer", &good, "keyward.io/other", &|_| {});
    on("no-pod", &good, SIGNER, &|r| r["spec"]["podName"] = json!("never-created"));
    on("recreated", &good, SIGNER, &|r| r["spec"]["podUID"] = json!("uid-of-an-earlier-pod"));
    on("other-node", &good, SIGNER, &|r| r["spec"]["nodeName"] = json!("worker-2"));
    on("unattested", &unattested, SIGNER, &|_| {});
    on("forged", &forged, SIGNER, &|_| {});
    on("orphan", &orphan, SIGNER, &|_| {});
    on("elsewhere", &elsewhere, SIGNER, &|_| {});
    on("not-ours", &good, "example.com/signer", &|_| {});
    on("annotated", &good, SIGNER, &|r| r["spec"]["unverifiedUserAnnotations"] = json!({"example.com/tier": "gold"}));
    on("no-key", &good, SIGNER, &|r| {
        r["spec"].as_object_mut().unwrap().retain(|k, _| k != "pkixPublicKey" && k != "proofOfPossession")
    });
    for name in ["copied-image", "copied-command", "copied-volume", "copied-account", "opted-out", "twin", "late"] {
        on(name, &copy(name), SIGNER, &|_| {});
    }
    for r in requests.values() {
        s.fake.seed(r.clone());
    }

    let late_at = created["late"].clone();
    let admitted_at = good["metadata"]["creationTimestamp"].as_str().unwrap().to_string();
    let late = format!("pod team-a/late: its admission attestation (keyward.io/attestation) was made at {admitted_at} but the pod was created at {late_at}, more than 300 s apart: it was copied from a pod admitted earlier (or the webhook's and the apiserver's clocks disagree that much); have the operator create it again");
    let expected = [
        ("annotated", "InvalidUnverifiedUserAnnotations", "keyward's signers recognise no userAnnotations, and the request carries example.com/tier; remove userAnnotations from the pod's podCertificate volume"),
        ("copied-image", "ReboundAttestation", "pod team-a/copied-image: its admission attestation (keyward.io/attestation) was made for a pod that runs or mounts something else (copied from another pod, or this pod was changed by another webhook after keyward's last look); have the operator create it again"),
        ("copied-account", "ReboundAttestation", "pod team-a/copied-account: its admission attestation (keyward.io/attestation) was made for a pod that runs or mounts something else (copied from another pod, or this pod was changed by another webhook after keyward's last look); have the operator create it again"),
        ("copied-command", "ReboundAttestation", "pod team-a/copied-command: its admission attestation (keyward.io/attestation) was made for a pod that runs or mounts something else (copied from another pod, or this pod was changed by another webhook after keyward's last look); have the operator create it again"),
        ("copied-volume", "ReboundAttestation", "pod team-a/copied-volume: its admission attestation (keyward.io/attestation) was made for a pod that runs or mounts something else (copied from another pod, or this pod was changed by another webhook after keyward's last look); have the operator create it again"),
        ("elsewhere", "NamespaceNotOptedIn", "namespace elsewhere is not labelled keyward.io/inject=enabled: keyward signs only for opted-in namespaces; label it and recreate the pod"),
        ("forged", "ForgedAttestation", "pod team-a/forged: its admission attestation (keyward.io/attestation) does not verify: keyward's webhook did not write it for this namespace, owner, profile and injection, or its key has been rotated out; have the operator create it again"),
        ("late", "UntimelyAttestation", late.as_str()),
        ("no-key", "UnsupportedKeyType", "the request's key cannot be read: neither spec.stubPKCS10Request nor spec.pkixPublicKey is set"),
        ("no-pod", "PodNotFound", "pod team-a/never-created does not exist (deleted, or never created)"),
        ("opted-out", "OptedOut", "pod team-a/opted-out is not one keyward serves: it is labelled keyward.io/inject=disabled, so keyward's webhook never admitted it; remove the label and recreate the pod"),
        ("orphan", "OwnerMissing", "its owner LMEvalJob gone-job does not exist with UID uid-gone: keyward issues only for a live owner"),
        ("other-node", "PodMismatch", "pod team-a/evaljob-sample runs as service account \"default\" on node \"worker-1\", not \"default\" on \"worker-2\" as requested"),
        ("recreated", "PodUIDMismatch", "pod team-a/evaljob-sample has UID pod-uid-team-a-evaljob-sample, not uid-of-an-earlier-pod as requested: the pod was recreated; its kubelet asks again"),
        ("twin", "DuplicateAttestation", "pod team-a/twin: pod evaljob-sample carries the same admission attestation and was created first: an attestation is for the one pod keyward's webhook admitted, and this one is a copy"),
        ("unattested", "NoAttestation", "pod team-a/unattested: it carries no admission attestation (keyward.io/attestation): keyward's webhook did not admit it as a pod of this profile (created before its namespace opted in, while the webhook was down, or selected only by labels added later); have the operator create it again"),
        ("unknown-signer", "UnknownSigner", "no keyward profile delivers pod certificates from signer \"keyward.io/other\"; the profiles name [\"keyward.io/lmeval\"]"),
    ];
    for (name, reason, message) in expected {
        let namespace = if name == "elsewhere" { "elsewhere" } else { "team-a" };
        let pcr = answered(&s.fake, version, namespace, name).await;
        assert_eq!(
            pcr["status"],
            json!({"conditions": [{"type": "Denied", "status": "True", "reason": reason, "message": message,
                   "lastTransitionTime": pcr["status"]["conditions"][0]["lastTransitionTime"], "observedGeneration": 1}]}),
            "{name}"
        );
    }
    s.fake.until(LIMIT, |_| (s.reconciler.metrics().pod_certificate_count("denied") == 17).then_some(())).await;
    // Each denial is an Event on the request, for the person who looks at it.
    let event = s
        .fake
        .until(LIMIT, |f| {
            f.calls().into_iter().filter(|c| c.resource == "events.k8s.io/v1/events" && c.method == "POST").find_map(
                |c| {
                    c.body.filter(|e| {
                        e["regarding"]["kind"] == "PodCertificateRequest" && e["regarding"]["name"] == "orphan"
                    })
                },
            )
        })
        .await;
    assert_eq!(
        (event["reason"].as_str(), event["note"].as_str(), event["type"].as_str()),
        (
            Some("PodCertificateDenied"),
            Some("its owner LMEvalJob gone-job does not exist with UID uid-gone: keyward issues only for a live owner"),
            Some("Warning")
        )
    );
    // Another signer's request: no status, no write.
    assert!(pcr_of(&s.fake, version, "team-a", "not-ours")["status"].is_null());
    assert!(!s.fake.attempted_writes().iter().any(|c| c.name == "not-ours"));
}

fn lease(id: &str) -> LeaseConfig {
    let mut lease = LeaseConfig::new("keyward-controller", "keyward-system", id);
    lease.lease_duration = Duration::from_secs(4);
    lease.renew_deadline = Duration::from_secs(3);
    lease.retry_period = Duration::from_millis(500);
    lease
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_replicas_only_the_leader_answers() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(owner());
    let ca = client_ca();
    let mut replicas = Vec::new();
    for id in ["replica-a", "replica-b"] {
        let client = fake.client(id);
        let elector = LeaderElector::new(client.clone(), lease(id));
        let leadership = elector.leadership();
        let election = tokio::spawn(elector.run(std::future::pending()));
        let r = reconciler_with(client.clone(), profiles(), &ca, leadership.clone(), signing(ApiVersion::V1));
        let run = start(&fake, r.clone(), leadership, &ca, id);
        replicas.push((id, r, election, run));
    }
    let leader = fake
        .until(LIMIT, |f| {
            f.get("coordination.k8s.io/v1", "Lease", "keyward-system", "keyward-controller")
                .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
        })
        .await;
    let keys = fake.until(LIMIT, |_| replicas.iter().find_map(|(_, r, _, _)| r.attestation_keys())).await;
    let pod = pod(Some(&keys), "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    fake.seed(pod.clone());
    let (key, _) = kubelet_key();
    fake.seed(pcr::request("certificates.k8s.io/v1", "req-1", &pod, SIGNER, KeyField::Stub(&stub_csr(&key))));
    let pcr = answered(&fake, ApiVersion::V1, "team-a", "req-1").await;
    assert_eq!(pcr["status"]["conditions"][0]["type"], "Issued");
    let writers: Vec<String> = fake
        .attempted_writes()
        .into_iter()
        .filter(|c| c.resource.ends_with("podcertificaterequests"))
        .map(|c| c.client)
        .collect();
    assert_eq!(writers, [leader]);
    for (_, _, election, run) in replicas {
        election.abort();
        run.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issued_chain_passes_mutual_tls_with_a_server_trusting_only_the_signers_trust_bundle() {
    let s = signer(ApiVersion::V1).await;
    let pod = pod(Some(&s.keys), "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    s.fake.seed(pod.clone());
    let (key, _) = kubelet_key();
    s.fake.seed(pcr::request("certificates.k8s.io/v1", "req-1", &pod, SIGNER, KeyField::Stub(&stub_csr(&key))));
    let pcr = answered(&s.fake, ApiVersion::V1, "team-a", "req-1").await;
    let chain = pcr["status"]["certificateChain"].as_str().unwrap().to_string();
    // What the kubelet writes into the pod: tls.key (PKCS#8) and tls.crt (the chain).
    let (client_key, client_chain) = (key.serialize_pem(), chain);

    // A server (the operator's gRPC endpoint) that trusts only what the signer's
    // ClusterTrustBundle holds (as a pod mounting it with a clusterTrustBundle projection).
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bundle = s
        .fake
        .until(LIMIT, |f| f.get("certificates.k8s.io/v1", "ClusterTrustBundle", "", "keyward.io:lmeval:client-ca"))
        .await;
    let anchors = bundle["spec"]["trustBundle"].as_str().unwrap().to_string();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for anchor in CertificateDer::pem_slice_iter(anchors.as_bytes()) {
        roots.add(anchor.unwrap()).unwrap();
    }
    assert_eq!(roots.len(), 1);
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().unwrap();
    let server_ca = keyward_certs::pki::Ca::mint("server CA", now(), Duration::from_secs(3600)).unwrap();
    let serving = server_ca.issue_serving(&["localhost".into()], now(), Duration::from_secs(3600)).unwrap();
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            CertificateDer::pem_slice_iter(serving.cert_pem.as_bytes()).map(Result::unwrap).collect(),
            PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let accepted = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = acceptor.accept(tcp).await.unwrap();
        let peer = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
        let pem = format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &peer)
        );
        cert_uris(&pem)
    });

    let mut server_roots = rustls::RootCertStore::empty();
    server_roots.add(CertificateDer::from_pem_slice(server_ca.cert_pem().as_bytes()).unwrap()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(server_roots)
        .with_client_auth_cert(
            CertificateDer::pem_slice_iter(client_chain.as_bytes()).map(Result::unwrap).collect(),
            PrivateKeyDer::from_pem_slice(client_key.as_bytes()).unwrap(),
        )
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let _tls = connector.connect(name, tcp).await.unwrap();
    assert_eq!(accepted.await.unwrap(), [IDENTITY], "the server reads the owner's SPIFFE ID");
}

fn bundle_of(fake: &FakeApi) -> Option<Value> {
    fake.get("certificates.k8s.io/v1beta1", "ClusterTrustBundle", "", "keyward.io:lmeval:client-ca")
}

/// The PEM certificates of a trust bundle, as DER.
fn ders(pem: &str) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()).map(|p| p.unwrap().contents).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_ca_is_each_signers_trust_bundle_with_both_cas_through_a_rotation() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(namespace("lm-eval"));
    let ca = client_ca();
    // Twenty-minute certificates: a pod certificate still lives the apiserver's hour.
    let settings = Settings {
        trust_bundles: Some(ApiVersion::V1beta1),
        client_cert_validity: Duration::from_secs(20 * 60),
        ..signing(ApiVersion::V1beta1)
    };
    let r = reconciler_with(fake.client("keyward"), profiles(), &ca, Leadership::always(), settings.clone());
    let (run, stop) = start_stoppable(&fake, r, Leadership::always(), &ca, "keyward");
    let bundle = fake.until(LIMIT, bundle_of).await;
    assert_eq!(bundle["spec"]["signerName"], SIGNER);
    assert_eq!(bundle["metadata"]["labels"]["app.kubernetes.io/managed-by"], "keyward");
    let old = ders(ca.ca.cert_pem());
    assert_eq!(ders(bundle["spec"]["trustBundle"].as_str().unwrap()), old);
    // The ConfigMap too, before the rotation (published after it, it would hold only the new
    // CA: it never trusted the old one).
    fake.until(LIMIT, |f| {
        f.get("v1", "ConfigMap", "lm-eval", "keyward-client-ca")
            .filter(|c| ders(c["data"]["ca.crt"].as_str().unwrap_or_default()) == old)
    })
    .await;

    // The client CA rotates (cert-manager wrote a new one into the mounted Secret): the new CA
    // first, the old one kept as long as a certificate it signed may live.
    let dir = ca.store.dir().to_path_buf();
    let (new_cert, new_key) = (certs_fixture("ca-ec384.crt"), certs_fixture("ca-ec384-sec1.key"));
    for (file, text) in [("tls.crt", &new_cert), ("tls.key", &new_key), ("ca.crt", &new_cert)] {
        std::fs::write(dir.join(file), text).unwrap();
    }
    let rotated = std::time::SystemTime::now();
    assert_eq!(ca.store.reload(keyward_certs::Trigger::Startup).as_str(), "loaded");
    let bundle = fake
        .until(LIMIT, |f| bundle_of(f).filter(|b| ders(b["spec"]["trustBundle"].as_str().unwrap()).len() == 2))
        .await;
    let expected: Vec<Vec<u8>> = ders(&new_cert).into_iter().chain(old.clone()).collect();
    assert_eq!(ders(bundle["spec"]["trustBundle"].as_str().unwrap()), expected);
    let until = keyward_certs::parse_rfc3339(
        bundle["metadata"]["annotations"]["keyward.io/previous-ca-until"].as_str().unwrap(),
    )
    .unwrap();
    let overlap = until.duration_since(rotated).unwrap_or_default().as_secs();
    // The longest a certificate the old CA signed lives (a pod certificate's hour, not the
    // 20 minutes of --client-cert-validity), backdated a minute: an hour and a minute.
    assert!((3658..=3661).contains(&overlap), "the old CA stays a certificate's life: {overlap}s");
    // The published ConfigMap trusts both for as long.
    let config_map = fake
        .until(LIMIT, |f| {
            f.get("v1", "ConfigMap", "lm-eval", "keyward-client-ca")
                .filter(|c| ders(c["data"]["ca.crt"].as_str().unwrap_or_default()).len() == 2)
        })
        .await;
    assert_eq!(ders(config_map["data"]["ca.crt"].as_str().unwrap()), expected);
    assert_eq!(
        config_map["metadata"]["annotations"]["keyward.io/previous-ca-until"],
        bundle["metadata"]["annotations"]["keyward.io/previous-ca-until"]
    );

    // Once that time has passed (the annotation says so), the old CA goes: the running loop sees
    // the changed bundle through its watch and rewrites it. (Calling `publish_client_ca` here
    // as well would race the loop's own write and lose it to a 409.)
    let mut passed = bundle.clone();
    passed["metadata"]["annotations"]["keyward.io/previous-ca-until"] = json!("2026-01-01T00:00:00Z");
    fake.seed(passed);
    let bundle = fake
        .until(LIMIT, |f| bundle_of(f).filter(|b| ders(b["spec"]["trustBundle"].as_str().unwrap()).len() == 1))
        .await;
    assert_eq!(ders(bundle["spec"]["trustBundle"].as_str().unwrap()), ders(&new_cert));
    assert!(bundle["metadata"]["annotations"]["keyward.io/previous-ca-until"].is_null(), "{bundle:#}");

    // No profile uses the signer any more (a reload ends the loop of the old set, whose watch
    // would write the bundle back): its bundle is removed; another's is never touched.
    let _ = stop.send(());
    run.await.unwrap();
    fake.seed(json!({"apiVersion": "certificates.k8s.io/v1beta1", "kind": "ClusterTrustBundle",
        "metadata": {"name": "example.com:other:ca"}, "spec": {"signerName": "example.com/other", "trustBundle": new_cert}}));
    let without =
        reconciler_with(fake.client("keyward"), ProfileSet::builtin().unwrap(), &ca, Leadership::always(), settings);
    keyward_controller::trust::publish_client_ca(&without).await.unwrap();
    assert!(bundle_of(&fake).is_none());
    assert!(fake.get("certificates.k8s.io/v1beta1", "ClusterTrustBundle", "", "example.com:other:ca").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_the_apiserver_refuses_is_counted_reported_and_retried() {
    let s = signer(ApiVersion::V1).await;
    let pod = pod(Some(&s.keys), "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    s.fake.seed(pod.clone());
    // The first status update fails (an apiserver restarting, say).
    s.fake.fail("PUT", "podcertificaterequests", 500, 1);
    let (key, _) = kubelet_key();
    s.fake.seed(pcr::request("certificates.k8s.io/v1", "req-1", &pod, SIGNER, KeyField::Stub(&stub_csr(&key))));
    let pcr = answered(&s.fake, ApiVersion::V1, "team-a", "req-1").await;
    assert_eq!(pcr["status"]["conditions"][0]["type"], "Issued");
    s.fake.until(LIMIT, |_| (s.reconciler.metrics().pod_certificate_count("issued") == 1).then_some(())).await;
    assert_eq!(s.reconciler.metrics().pod_certificate_count("failed"), 1);
    let failed = s
        .fake
        .calls()
        .into_iter()
        .filter(|c| c.resource == "events.k8s.io/v1/events" && c.method == "POST")
        .filter_map(|c| c.body)
        .find(|e| e["reason"] == "PodCertificateFailed")
        .expect("a Warning Event for the failed answer");
    assert_eq!(failed["type"], "Warning");
    assert!(
        failed["note"].as_str().unwrap().starts_with("keyward could not answer this request and retries: "),
        "{failed:#}"
    );
}

/// The pod certificate profile with `delivery: auto`: pod certificates where this controller
/// signs them, the built-in's Secret elsewhere.
fn auto_profiles() -> ProfileSet {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/profiles/lmeval-pod-certificate.yaml");
    let text = std::fs::read_to_string(path).unwrap().replace(
        "      delivery: podCertificate\n",
        "      delivery: auto\n      secretName: \"{owner.name}-lmeval-client\"\n",
    );
    assert!(text.contains("delivery: auto"));
    ProfileSet::from_sources([(format!("{path} (delivery: auto)"), text)]).unwrap()
}

fn facts_of(fake: &FakeApi) -> Option<Value> {
    fake.get("v1", "ConfigMap", "keyward-system", "keyward-cluster-facts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_auto_follows_what_the_controller_signs_and_the_webhook_is_told() {
    let version = ApiVersion::V1beta1;
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(owner());
    const OTHER_UID: &str = "5f0c2c1e-8a53-4c43-9a52-3d2b8e1f0a77";
    fake.seed(lmevaljob("team-a", "evaljob-other", OTHER_UID));
    let ca = client_ca();
    let reconciler =
        reconciler_with(fake.client("keyward"), auto_profiles(), &ca, Leadership::always(), signing(version));
    let keys = attestation_keys(&reconciler).await;
    let _run = start(&fake, reconciler.clone(), Leadership::always(), &ca, "keyward");

    // The facts the webhook mounts: this controller signs at v1beta1.
    let facts = fake.until(LIMIT, facts_of).await;
    assert_eq!(facts["data"], json!({"facts.json": "{\"podCertificates\":\"v1beta1\"}\n"}), "{facts:#}");
    assert_eq!(facts["metadata"]["labels"]["app.kubernetes.io/managed-by"], "keyward");
    let webhook_facts = keyward_engine::ClusterFacts::parse(facts["data"]["facts.json"].as_str().unwrap()).unwrap();

    // A webhook that read them injects a pod certificate, and the signer issues it.
    let informed = auto_profiles().resolved(webhook_facts);
    let mut pod = admitted_fms_pod(&informed, Some(&keys), "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    pod["spec"]["nodeName"] = json!(NODE);
    let volume =
        pod["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "keyward-client-cert").unwrap();
    assert_eq!(volume["projected"]["sources"][0]["podCertificate"]["signerName"], SIGNER, "{volume:#}");
    fake.seed(pod.clone());
    let (_, spki) = kubelet_key();
    fake.seed(pcr::request("certificates.k8s.io/v1beta1", "req-auto1", &pod, SIGNER, KeyField::Pkix(&spki)));
    let pcr = answered(&fake, version, "team-a", "req-auto1").await;
    assert_eq!(pcr["status"]["conditions"][0]["reason"], "Issued", "{pcr:#}");
    assert!(fake.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client").is_none());

    // A webhook that had not read them yet (its first minute after the ConfigMap appeared)
    // delivered a Secret: that pod is as keyward admits such pods too, and gets its Secret.
    let uninformed = auto_profiles();
    let pod = admitted_fms_pod(&uninformed, Some(&keys), "team-a", "evaljob-other-driver", "evaljob-other", OTHER_UID);
    let volume =
        pod["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "keyward-client-cert").unwrap();
    assert_eq!(volume["secret"]["secretName"], "evaljob-other-lmeval-client", "{volume:#}");
    fake.seed(pod);
    let secret = fake.until(LIMIT, |f| f.get("v1", "Secret", "team-a", "evaljob-other-lmeval-client")).await;
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(
        cert_uris(&secret_data(&secret, "tls.crt")),
        ["spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-other"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_does_not_sign_says_so_and_never_overwrites_a_foreign_facts_configmap() {
    let fake = FakeApi::default();
    let ca = client_ca();
    let r = reconciler_with(fake.client("keyward"), auto_profiles(), &ca, Leadership::always(), settings());
    keyward_controller::singletons::publish_cluster_facts(&r).await.unwrap();
    let facts = facts_of(&fake).unwrap();
    assert_eq!(facts["data"]["facts.json"], "{\"podCertificates\":\"off\"}\n");
    // Its own, as found, is left as it is: no write.
    let writes = |f: &FakeApi| f.calls().iter().filter(|c| c.method != "GET").count();
    let before = writes(&fake);
    keyward_controller::singletons::publish_cluster_facts(&r).await.unwrap();
    assert_eq!(writes(&fake), before);

    // Someone else's ConfigMap of that name: reported, never replaced.
    let fake = FakeApi::default();
    fake.seed(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keyward-cluster-facts", "namespace": "keyward-system"}, "data": {"facts.json": "{\"podCertificates\":\"v1\"}"}}));
    let r = reconciler_with(fake.client("keyward"), auto_profiles(), &ca, Leadership::always(), settings());
    keyward_controller::singletons::publish_cluster_facts(&r).await.unwrap();
    assert_eq!(facts_of(&fake).unwrap()["data"]["facts.json"], "{\"podCertificates\":\"v1\"}");
    assert_eq!(r.metrics().object_count("cluster-facts", keyward_controller::metrics::Action::Foreign, true), 1);
}

fn server_ca_bundle(fake: &FakeApi) -> Option<Value> {
    fake.get("certificates.k8s.io/v1beta1", "ClusterTrustBundle", "", "keyward-lmeval-server-ca")
}

fn grpc_server_cert(fake: &FakeApi, pem: &str) {
    fake.seed(json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "grpc-server-cert", "namespace": "lm-eval"},
        "data": {"ca.crt": b64(pem), "tls.crt": "", "tls.key": ""}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_ca_is_one_cluster_trust_bundle_kept_equal_to_its_source_and_removed_when_unwanted() {
    use keyward_controller::conditions::Condition;
    let version = ApiVersion::V1beta1;
    let fake = FakeApi::default();
    let first =
        keyward_certs::pki::Ca::mint("lm-eval gRPC", std::time::SystemTime::now(), Duration::from_secs(86400)).unwrap();
    grpc_server_cert(&fake, first.cert_pem());
    let ca = client_ca();
    // Through the loop: published once the controller runs (deploy/profiles/lmeval-pod-certificate.yaml).
    let r = reconciler_with(fake.client("keyward"), profiles(), &ca, Leadership::always(), signing(version));
    let (run, stop) = start_stoppable(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    let bundle = fake.until(LIMIT, server_ca_bundle).await;
    // Deleted by hand, it is back at once (watched), as are the cluster facts.
    fake.until(LIMIT, facts_of).await;
    fake.remove("certificates.k8s.io/v1beta1", "ClusterTrustBundle", "", "keyward-lmeval-server-ca");
    fake.remove("v1", "ConfigMap", "keyward-system", "keyward-cluster-facts");
    fake.until(LIMIT, |f| server_ca_bundle(f).and(facts_of(f))).await;
    // Stopped, and waited for with every task it started: a write of the loop still in flight
    // would race the calls below (an abort of `run` alone left one to land after `before`).
    let _ = stop.send(());
    run.await.unwrap();
    assert_eq!(bundle["spec"], json!({"trustBundle": first.cert_pem()}), "unlinked: no signerName, {bundle:#}");
    assert_eq!(bundle["metadata"]["labels"]["app.kubernetes.io/managed-by"], "keyward");
    assert_eq!(bundle["metadata"]["labels"]["keyward.io/provisioned-for"], "server-ca-bundle");
    assert_eq!(bundle["metadata"]["annotations"]["keyward.io/profile"], "lmeval");
    // Not copied into any namespace: no ConfigMap anywhere.
    assert!(fake.calls().iter().all(|c| !(c.method == "POST"
        && c.resource.ends_with("/configmaps")
        && c.body.as_ref().is_some_and(|b| b["metadata"]["name"] == "keyward-lmeval-server-ca"))));

    // Unchanged: no write.
    let writes = |f: &FakeApi| {
        f.calls().iter().filter(|c| c.method != "GET" && c.resource.ends_with("clustertrustbundles")).count()
    };
    let before = writes(&fake);
    keyward_controller::trust::publish_server_ca_bundles(&r).await.unwrap();
    assert_eq!(writes(&fake), before);

    // The operator's CA rotates: the resync reads the source again, and the bundle follows.
    let second =
        keyward_certs::pki::Ca::mint("lm-eval gRPC 2", std::time::SystemTime::now(), Duration::from_secs(86400))
            .unwrap();
    grpc_server_cert(&fake, second.cert_pem());
    assert!(r.refresh_sources(&keyward_controller::run::ca_sources(&r)).await.unwrap(), "the source changed");
    keyward_controller::trust::publish_server_ca_bundles(&r).await.unwrap();
    assert_eq!(server_ca_bundle(&fake).unwrap()["spec"]["trustBundle"], second.cert_pem());

    // The source gone: the bundle keeps what it holds, and the condition says why.
    fake.remove("v1", "Secret", "lm-eval", "grpc-server-cert");
    r.refresh_sources(&keyward_controller::run::ca_sources(&r)).await.unwrap();
    keyward_controller::trust::publish_server_ca_bundles(&r).await.unwrap();
    assert_eq!(server_ca_bundle(&fake).unwrap()["spec"]["trustBundle"], second.cert_pem());
    assert_eq!(r.metrics().conditions(Condition::ServerCaSourceUnusable), 1);

    // No profile delivers it any more (the built-ins copy a ConfigMap): deleted.
    let builtin = reconciler_with(
        fake.client("keyward"),
        ProfileSet::builtin().unwrap(),
        &ca,
        Leadership::always(),
        signing(version),
    );
    let listed = server_ca_bundle(&fake).unwrap()["metadata"]["uid"].clone();
    assert!(listed.is_string());
    keyward_controller::trust::publish_server_ca_bundles(&builtin).await.unwrap();
    assert!(server_ca_bundle(&fake).is_none());
    // Only the bundle it listed: the delete names its UID, so that one of that name made since
    // by someone else would be refused (the apiserver's 409), not deleted.
    let deletes = |f: &FakeApi| -> Vec<Call> {
        f.calls().into_iter().filter(|c| c.method == "DELETE" && c.resource.ends_with("clustertrustbundles")).collect()
    };
    let delete = deletes(&fake).pop().unwrap();
    assert_eq!(delete.body.unwrap()["preconditions"]["uid"], listed);
    // Replaced between the list and the delete (409), or gone already (404): nothing of
    // keyward's is left to remove, and the resync goes on.
    for code in [409, 404] {
        grpc_server_cert(&fake, first.cert_pem());
        let r = reconciler_with(fake.client("keyward"), profiles(), &ca, Leadership::always(), signing(version));
        keyward_controller::trust::publish_server_ca_bundles(&r).await.unwrap();
        assert!(server_ca_bundle(&fake).is_some());
        fake.fail("DELETE", "certificates.k8s.io/v1beta1/clustertrustbundles", code, 1);
        let before = deletes(&fake).len();
        keyward_controller::trust::publish_server_ca_bundles(&builtin).await.unwrap();
        assert_eq!(deletes(&fake).len(), before + 1, "{code}: one attempt");
        assert!(server_ca_bundle(&fake).is_some(), "{code}: the fake refused it, so it is still there");
        keyward_controller::trust::publish_server_ca_bundles(&builtin).await.unwrap();
        assert!(server_ca_bundle(&fake).is_none(), "{code}: the next resync removes it");
    }

    // A bundle of that name keyward did not make: never replaced, never deleted.
    fake.seed(json!({"apiVersion": "certificates.k8s.io/v1beta1", "kind": "ClusterTrustBundle",
        "metadata": {"name": "keyward-lmeval-server-ca"}, "spec": {"trustBundle": "theirs"}}));
    grpc_server_cert(&fake, first.cert_pem());
    let r = reconciler_with(fake.client("keyward"), profiles(), &ca, Leadership::always(), signing(version));
    keyward_controller::trust::publish_server_ca_bundles(&r).await.unwrap();
    keyward_controller::trust::publish_server_ca_bundles(&builtin).await.unwrap();
    assert_eq!(server_ca_bundle(&fake).unwrap()["spec"]["trustBundle"], "theirs");
    assert_eq!(r.metrics().object_count("server-ca-bundle", keyward_controller::metrics::Action::Foreign, true), 1);
}

/// A watch that is down (an apiserver restart, then 410 Gone) misses deletions: its new list
/// shows only what exists. What keyward publishes by name, deleted meanwhile, is written again
/// when that list ends, not at the next resync (an hour here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_keyward_publishes_deleted_while_its_watch_was_down_is_back_when_the_watch_lists_again() {
    let version = ApiVersion::V1beta1;
    let fake = FakeApi::default();
    let server_ca =
        keyward_certs::pki::Ca::mint("lm-eval gRPC", std::time::SystemTime::now(), Duration::from_secs(86400)).unwrap();
    grpc_server_cert(&fake, server_ca.cert_pem());
    let ca = client_ca();
    let r = reconciler_with(fake.client("keyward"), profiles(), &ca, Leadership::always(), signing(version));
    let _run = start(&fake, r, Leadership::always(), &ca, "keyward");
    let watching = |resource: &'static str| {
        move |f: &FakeApi| {
            f.calls().iter().any(|c| c.resource.ends_with(resource) && c.query.contains("watch=true")).then_some(())
        }
    };
    fake.until(LIMIT, |f| server_ca_bundle(f).and(bundle_of(f)).and(facts_of(f))).await;
    fake.until(LIMIT, watching("clustertrustbundles")).await;
    fake.until(LIMIT, watching("configmaps")).await;

    // The apiserver restarts; until it answers lists and watches again, all three are deleted.
    fake.hang("GET", "clustertrustbundles", Some(""));
    fake.hang("GET", "/v1/configmaps", Some(""));
    fake.restart();
    fake.remove("certificates.k8s.io/v1beta1", "ClusterTrustBundle", "", "keyward-lmeval-server-ca");
    fake.remove("certificates.k8s.io/v1beta1", "ClusterTrustBundle", "", "keyward.io:lmeval:client-ca");
    fake.remove("v1", "ConfigMap", "keyward-system", "keyward-cluster-facts");
    fake.unhang();
    // (Without the end of a list counting as a change, this waits for the resync and fails.)
    fake.until(LIMIT, |f| server_ca_bundle(f).and(bundle_of(f)).and(facts_of(f))).await;
}

/// On a cluster that serves the API at both versions (1.37, with kubelets of 1.35 still
/// creating v1beta1 requests), keyward watches and signs both: a v1beta1 request carrying
/// `pkixPublicKey` and a v1 request carrying a PKCS#10 stub are both issued, each for exactly
/// the life it asked for when that is shorter than keyward's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_served_versions_are_signed_each_for_the_life_it_asks() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(owner());
    let ca = client_ca();
    let settings = Settings {
        pod_certificates: vec![ApiVersion::V1, ApiVersion::V1beta1],
        trust_bundles: Some(ApiVersion::V1),
        ..settings()
    };
    let r = reconciler_with(fake.client("keyward"), profiles(), &ca, Leadership::always(), settings);
    let keys = attestation_keys(&r).await;
    let _run = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    let good = pod(Some(&keys), "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    fake.seed(good.clone());
    let (old_key, old_spki) = kubelet_key();
    drop(old_key);
    let (new_key, new_spki) = kubelet_key();
    // Guards the clamp to the request's maximum (mutation: `validity: facts.validity` for
    // `facts.validity.min(asked)`): two hours asked, under keyward's day, are two hours given.
    let mut from_old = pcr::request("certificates.k8s.io/v1beta1", "req-old", &good, SIGNER, KeyField::Pkix(&old_spki));
    from_old["spec"]["maxExpirationSeconds"] = json!(7200);
    fake.seed(from_old);
    fake.seed(pcr::request("certificates.k8s.io/v1", "req-new", &good, SIGNER, KeyField::Stub(&stub_csr(&new_key))));
    for (version, name, spki, life) in
        [(ApiVersion::V1beta1, "req-old", &old_spki, 7200), (ApiVersion::V1, "req-new", &new_spki, 86_400)]
    {
        let pcr = answered(&fake, version, "team-a", name).await;
        assert_eq!(pcr["status"]["conditions"][0]["type"], "Issued", "{pcr:#}");
        let (uris, leaf_key, got, signed) = leaf_of(&pcr, ca.ca.cert_pem());
        assert_eq!((uris, &leaf_key, got, signed), (vec![IDENTITY.to_string()], spki, life, true), "{name}");
    }
}

#[test]
fn at_v1_a_request_whose_key_only_v1beta1_shows_is_left_to_the_v1beta1_watch() {
    use keyward_controller::signer::{answered_elsewhere, Request};
    let good = pod(None, "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    let (_, spki) = kubelet_key();
    let read = |object: Value| Request::read(&serde_json::from_value(object).unwrap()).unwrap();
    // What v1 shows of a request a 1.35 kubelet made at v1beta1: no key at all.
    let mut keyless = pcr::request("certificates.k8s.io/v1", "req-a", &good, SIGNER, KeyField::Pkix(&spki));
    keyless["spec"].as_object_mut().unwrap().retain(|k, _| k != "pkixPublicKey" && k != "proofOfPossession");
    let keyless = read(keyless);
    let both = [ApiVersion::V1, ApiVersion::V1beta1];
    assert!(answered_elsewhere(&keyless, ApiVersion::V1, &both));
    // Only v1 served: nobody else will answer it; it is denied (UnsupportedKeyType).
    assert!(!answered_elsewhere(&keyless, ApiVersion::V1, &[ApiVersion::V1]));
    // At v1beta1 it is answered, whatever else is served.
    assert!(!answered_elsewhere(&keyless, ApiVersion::V1beta1, &both));
    // A request with its key readable is answered where it is seen.
    let with_key = read(pcr::request("certificates.k8s.io/v1", "req-b", &good, SIGNER, KeyField::Pkix(&spki)));
    assert!(!answered_elsewhere(&with_key, ApiVersion::V1, &both));
}

/// The fake judges a status update as the apiserver's `ValidatePodCertificateRequestStatusUpdate`
/// does: no stricter (an unchanged terminal status may be written again), no more lenient.
#[test]
fn the_fake_judges_status_updates_as_the_apiserver_does() {
    let now = std::time::SystemTime::now();
    let good = pod(None, "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    let (_, spki) = kubelet_key();
    let request = pcr::request("certificates.k8s.io/v1beta1", "req", &good, SIGNER, KeyField::Pkix(&spki));
    let denied = keyward_controller::signer::denied_status("PodNotFound", "gone", now, Some(1));
    assert_eq!(pcr::validate_status_update(&request, &denied, now), Ok(()));
    let mut terminal = request.clone();
    terminal["status"] = denied.clone();
    assert_eq!(pcr::validate_status_update(&terminal, &denied, now), Ok(()), "the same status, again");
    let other = keyward_controller::signer::denied_status("PodMismatch", "moved", now, Some(1));
    assert!(pcr::validate_status_update(&terminal, &other, now).unwrap_err().contains("immutable after"));
    // Nothing but a transition to a terminal condition; an unchanged empty status is fine.
    assert_eq!(pcr::validate_status_update(&request, &json!({}), now), Ok(()));
    assert!(pcr::validate_status_update(&request, &json!({"certificateChain": "x"}), now)
        .unwrap_err()
        .contains("immutable unless transitioning"));
    let mut two = denied.clone();
    two["conditions"].as_array_mut().unwrap().push(
        json!({"type": "Failed", "status": "True", "reason": "X", "lastTransitionTime": keyward_certs::rfc3339(now)}),
    );
    assert!(pcr::validate_status_update(&request, &two, now).unwrap_err().contains("at most one condition"));
    let mut unknown = denied.clone();
    unknown["conditions"][0]["type"] = json!("Approved");
    assert!(pcr::validate_status_update(&request, &unknown, now).unwrap_err().contains("Unsupported value"));
    let mut long = denied;
    long["conditions"][0]["message"] = json!("x".repeat(32_769));
    assert!(pcr::validate_status_update(&request, &long, now).unwrap_err().contains("Too long"));
}

/// Discovery, as `keyward controller` and `keyward audit` ask it: each version of
/// `certificates.k8s.io` that serves the resource, v1 first; a version that serves the group
/// without the resource, or does not exist (404), serves nothing; any other failure is an error,
/// never "not served" (mutations: `Ok(None)`, `Ok(vec![])`, either match guard forced, `!=`).
#[tokio::test]
async fn discovery_finds_every_version_that_serves_the_resource_and_fails_on_errors() {
    use keyward_controller::signer::{served_version, served_versions};
    let fake = FakeApi::default();
    let client = fake.client("keyward");
    let plural = ApiVersion::PLURAL;
    assert_eq!(served_versions(&client, plural).await.unwrap(), []);
    assert_eq!(served_version(&client, plural).await.unwrap(), None);
    // The group at v1 serves ClusterTrustBundles only.
    fake.seed(json!({"apiVersion": "certificates.k8s.io/v1", "kind": "ClusterTrustBundle",
                     "metadata": {"name": "keyward.io:lmeval:client-ca"}, "spec": {"trustBundle": ""}}));
    assert_eq!(served_versions(&client, plural).await.unwrap(), []);
    assert_eq!(served_versions(&client, ApiVersion::TRUST_BUNDLES).await.unwrap(), [ApiVersion::V1]);
    let request = |version: &str| {
        json!({"apiVersion": format!("certificates.k8s.io/{version}"), "kind": "PodCertificateRequest",
               "metadata": {"name": "req", "namespace": "team-a"}, "spec": {}})
    };
    fake.seed(request("v1beta1"));
    assert_eq!(served_versions(&client, plural).await.unwrap(), [ApiVersion::V1beta1]);
    assert_eq!(served_version(&client, plural).await.unwrap(), Some(ApiVersion::V1beta1));
    fake.seed(request("v1"));
    assert_eq!(served_versions(&client, plural).await.unwrap(), [ApiVersion::V1, ApiVersion::V1beta1]);
    assert_eq!(served_version(&client, plural).await.unwrap(), Some(ApiVersion::V1));
    // A failing discovery is an error to report, not a cluster without the API.
    fake.fail("GET", "certificates.k8s.io/v1beta1/", 503, 1);
    let err = served_versions(&client, plural).await.unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
}

/// Whether a ClusterTrustBundle exists, at whichever version serves it (`keyward explain
/// --cluster` and `keyward audit` ask): a 404 at one version is "not there", any other failure
/// an error (mutations: `Ok(true)`, `Ok(false)`, the 404 guard forced either way).
#[tokio::test]
async fn a_trust_bundle_is_found_at_either_version_and_a_failure_is_an_error() {
    use keyward_controller::signer::trust_bundle_exists;
    let fake = FakeApi::default();
    let client = fake.client("keyward");
    let name = "keyward-lmeval-server-ca";
    assert!(!trust_bundle_exists(&client, name).await.unwrap());
    let bundle = |version: &str| {
        json!({"apiVersion": format!("certificates.k8s.io/{version}"), "kind": "ClusterTrustBundle",
               "metadata": {"name": name}, "spec": {"trustBundle": ""}})
    };
    fake.seed(bundle("v1beta1"));
    assert!(trust_bundle_exists(&client, name).await.unwrap(), "found at v1beta1, after v1's 404");
    // A version the apiserver does not serve answers "404 page not found", not a NotFound
    // Status: kube reports it as an error with code 404, which means "not there" too.
    fake.fail("GET", "certificates.k8s.io/v1/clustertrustbundles", 404, 1);
    assert!(trust_bundle_exists(&client, name).await.unwrap(), "found at v1beta1, v1 not served");
    assert!(!trust_bundle_exists(&client, "another").await.unwrap());
    fake.seed(bundle("v1"));
    assert!(trust_bundle_exists(&client, name).await.unwrap());
    fake.fail("GET", "certificates.k8s.io/v1/clustertrustbundles", 503, 1);
    let err = trust_bundle_exists(&client, name).await.unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
}

/// A request is answered once: a terminal condition (Issued, Denied, Failed) that is `True`
/// makes it decided; a condition of another type, or a terminal one that is not `True`, does
/// not (mutation: `||` for `&&` in reading it).
#[test]
fn only_a_true_terminal_condition_makes_a_request_decided() {
    use keyward_controller::signer::Request;
    let good = pod(None, "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    let (_, spki) = kubelet_key();
    let with = |conditions: Value| {
        let mut object = pcr::request("certificates.k8s.io/v1", "req", &good, SIGNER, KeyField::Pkix(&spki));
        object["status"] = json!({"conditions": conditions});
        Request::read(&serde_json::from_value(object).unwrap()).unwrap().decided
    };
    assert!(!with(json!([])));
    assert!(with(json!([{"type": "Issued", "status": "True"}])));
    assert!(with(json!([{"type": "Denied", "status": "True"}])));
    assert!(with(json!([{"type": "Failed", "status": "True"}])));
    assert!(!with(json!([{"type": "Denied", "status": "False"}])), "a terminal condition not True");
    assert!(!with(json!([{"type": "SuggestedKeyType", "status": "True"}])), "another type, True");
}

/// A signer serves only the pods its own profile injected: a pod of `lmeval` that also asks
/// another keyward signer (a podCertificate volume of its own for `keyward.io/other`) gets a
/// denial naming both, never its lmeval identity under the other signer (mutation: the
/// signer-and-profile guard on the pod's wanted certificate forced true).
#[test]
fn a_pod_asking_another_keyward_signer_than_its_profiles_is_denied() {
    use keyward_controller::signer::{decide, Facts, Request, Verdict};
    let other = r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata: {name: other}
spec:
  selector: {matchLabels: {app.kubernetes.io/name: other-job}}
  controllerOwners: [{apiGroup: batch, kind: Job}]
  requesters: {usernames: ["system:serviceaccount:*:job-controller"]}
  inject:
    clientCertificate:
      delivery: podCertificate
      podCertificate: {signerName: keyward.io/other}
      mountPath: /var/run/secrets/other/client
"#;
    let lmeval = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/profiles/lmeval-pod-certificate.yaml");
    let both = ProfileSet::from_sources([
        (lmeval.to_string(), std::fs::read_to_string(lmeval).unwrap()),
        ("other.yaml".to_string(), other.to_string()),
    ])
    .unwrap();
    let key = keyward_certs::attestation::generate().unwrap();
    let current = keyward_certs::attestation::Key::from_bytes(&key, "current").unwrap();
    let keys = keyward_certs::attestation::Keys { current: Some(current), previous: None };
    let stored = pod(Some(&keys), "team-a", "evaljob-sample", "evaljob-sample", OWNER_UID);
    let (_, spki) = kubelet_key();
    let ask = |signer: &str| {
        let object = pcr::request("certificates.k8s.io/v1", "req", &stored, signer, KeyField::Pkix(&spki));
        let request = Request::read(&serde_json::from_value(object).unwrap()).unwrap();
        let raw = serde_json::value::to_raw_value(&stored).unwrap();
        let facts = Facts {
            pod: Some(&raw),
            opted_in: true,
            keys: &keys,
            trust_domain: "cluster.local",
            validity: Duration::from_secs(86_400),
        };
        decide(&request, &both, facts)
    };
    assert!(matches!(ask(SIGNER), Verdict::Issue { ref identity, .. } if identity == IDENTITY), "{:?}", ask(SIGNER));
    match ask("keyward.io/other") {
        Verdict::Deny { reason, message } => {
            assert_eq!(reason, "NotInjected");
            assert_eq!(
                message,
                "pod team-a/evaljob-sample is injected by profile \"lmeval\", which does not use signer \"keyward.io/other\""
            );
        }
        issued => panic!("issued under another profile's signer: {issued:?}"),
    }
}
