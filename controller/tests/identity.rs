//! The client certificate keyward issues, in a real mTLS handshake on loopback; and the
//! agreement between what `keyward explain` says a pod requires and what the controller
//! provides.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use keyward_certs::pki::Ca;
use keyward_controller::desired::{self, Owner, PodVerdict};
use keyward_controller::identity;
use keyward_engine::{ProfileSet, Provider, RequestFacts, Requester};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<_, _>>().unwrap()
}

/// A TLS server on loopback that requires a client certificate from `client_ca`, and answers
/// each connection with the URI SAN of the certificate it was shown.
async fn server(client_ca: &str) -> (std::net::SocketAddr, Ca) {
    let serving_ca = Ca::mint("control plane CA", SystemTime::now(), Duration::from_secs(86400)).unwrap();
    let leaf = serving_ca.issue_serving(&["localhost".into()], SystemTime::now(), Duration::from_secs(3600)).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(client_ca) {
        roots.add(c).unwrap();
    }
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider()).build().unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs(&leaf.cert_pem), PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let peer = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
                let pem = format!(
                    "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                    base64_lines(peer.as_ref())
                );
                let info = keyward_certs::pem::cert_info(pem.as_bytes(), "peer".as_ref()).unwrap();
                let _ = tls.write_all(info.uris.join(",").as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, serving_ca)
}

fn base64_lines(der: &[u8]) -> String {
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    text.as_bytes().chunks(64).map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>().join("\n")
}

async fn call(addr: std::net::SocketAddr, serving_ca: &Ca, cert: &str, key: &str) -> Result<String, std::io::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certs(serving_ca.cert_pem()).remove(0)).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(certs(cert), PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap())
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await?;
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await?;
    Ok(answer)
}

fn owner() -> Owner {
    Owner {
        api_version: "foundation-model-stack.github.com.github.com/v1beta1".into(),
        kind: "LMEvalJob".into(),
        name: "evaljob-sample".into(),
        uid: "u-1".into(),
    }
}

#[tokio::test]
async fn an_issued_certificate_passes_mtls_and_names_its_job() {
    let client_ca = Ca::mint("keyward client CA", SystemTime::now(), Duration::from_secs(86400)).unwrap();
    let id = desired::spiffe_id("cluster.local", "team-a", "LMEvalJob", "evaljob-sample");
    assert_eq!(id, "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample");
    let issued =
        identity::issue(&client_ca, "team-a", &owner(), &id, SystemTime::now(), Duration::from_secs(3600)).unwrap();

    let (addr, serving_ca) = server(client_ca.cert_pem()).await;
    let answer = call(addr, &serving_ca, &issued.cert_pem, &issued.key_pem).await.unwrap();
    assert_eq!(answer, id, "the server read the job's identity from the certificate");

    // A certificate with the same identity from another CA is refused: one whose CA even has
    // the same name (its signature does not verify), and one from a CA of another name.
    for (ca_name, alert) in [("keyward client CA", "DecryptError"), ("someone else's CA", "UnknownCA")] {
        let rogue_ca = Ca::mint(ca_name, SystemTime::now(), Duration::from_secs(86400)).unwrap();
        let rogue =
            identity::issue(&rogue_ca, "team-a", &owner(), &id, SystemTime::now(), Duration::from_secs(3600)).unwrap();
        let error = call(addr, &serving_ca, &rogue.cert_pem, &rogue.key_pem).await.expect_err("refused");
        assert_eq!(error.to_string(), format!("received fatal alert: {alert}"));
    }
}

fn fixture(name: &str) -> Value {
    let path = format!("{}/../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every pod fixture a built-in injects into: each object `explain` says it requires from
/// keyward is one the controller provides, per namespace or for the pod's owner.
#[test]
fn what_explain_requires_from_keyward_the_controller_provides() {
    let profiles = ProfileSet::builtin().unwrap();
    let dir = format!("{}/../tests/fixtures", env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(mut pod) = name.ends_with(".json").then(|| fixture(&name)).filter(|v| v["kind"] == "Pod") else {
            continue;
        };
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
        let facts = RequestFacts::pod_create(&ns, Requester::Assumed);
        let decision = keyward_engine::decide(&facts, &serde_json::value::to_raw_value(&pod).unwrap(), &profiles);
        let Ok(mutation) = &decision.outcome else { continue };
        let from_keyward: Vec<(String, String)> = mutation
            .requires()
            .filter(|r| r.provided_by == Provider::Keyward)
            .map(|r| (format!("{:?}", r.kind), r.name.clone()))
            .collect();
        if from_keyward.is_empty() {
            continue;
        }
        // The pod as stored, after the patch; the controller sees that.
        let patch: json_patch::Patch = serde_json::from_value(serde_json::to_value(decision.patch()).unwrap()).unwrap();
        json_patch::patch(&mut pod, &patch).unwrap();
        pod["metadata"]["namespace"] = Value::from(ns.clone());
        let mut provided: Vec<(String, String)> = Vec::new();
        let (per_namespace, problems) = desired::for_namespace(&profiles, &ns, &Default::default());
        assert!(problems.is_empty(), "{name}: {problems:?}");
        provided.extend(per_namespace.iter().map(|d| (d.want.object_kind().to_string(), d.name.clone())));
        match desired::for_pod(&profiles, &serde_json::value::to_raw_value(&pod).unwrap(), &ns, "cluster.local") {
            PodVerdict::Claim(claim) => {
                provided.extend(claim.wants.iter().map(|d| (d.want.object_kind().to_string(), d.name.clone())))
            }
            other => panic!("{name}: the controller would issue nothing: {other:?}"),
        }
        for required in &from_keyward {
            assert!(
                provided.contains(required),
                "{name}: {required:?} is required from keyward, but the controller provides only {provided:?}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 1, "no fixture exercised a keyward-provided object");
}
