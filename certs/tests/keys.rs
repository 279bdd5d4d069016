//! Private keys in every encoding cert-manager and openssl write (PKCS#8, SEC1, PKCS#1), wherever
//! keyward reads one: a CA it issues with (the controller's client CA, the development CA),
//! and a serving pair. The fixtures are openssl's output (see `fixtures/README.md`): SEC1 is
//! what cert-manager writes for an ECDSA key unless a Certificate says `encoding: PKCS8`.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use keyward_certs::pem::load_pair;
use keyward_certs::pki::{can_issue, ensure_dev_dir, Ca, CA_KEY_FILE};
use keyward_certs::{CertStore, Error, ReloadOutcome, Trigger};
use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use support::*;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(fixture_path(name)).unwrap()
}

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Every CA fixture: (certificate, key file), in each encoding.
const CAS: &[(&str, &str)] = &[
    ("ca-ec256.crt", "ca-ec256-sec1.key"),
    ("ca-ec256.crt", "ca-ec256-pkcs8.key"),
    ("ca-ec384.crt", "ca-ec384-sec1.key"),
    ("ca-rsa.crt", "ca-rsa-pkcs1.key"),
    ("ca-rsa.crt", "ca-rsa-pkcs8.key"),
];

fn load_ca(cert: &str, key: &str) -> Result<Ca, Error> {
    Ca::from_pem(&fixture(cert), &fixture(key), Path::new(cert), Path::new(key))
}

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

fn roots(ca_pem: &str) -> Arc<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der(ca_pem)).unwrap();
    Arc::new(roots)
}

/// What an mTLS server does with a client certificate: chain to `ca_pem`, clientAuth usage.
fn verify_client(ca_pem: &str, leaf_pem: &str) -> Result<(), rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca_pem), provider).build().unwrap();
    verifier.verify_client_cert(&der(leaf_pem), &[], UnixTime::now()).map(|_| ())
}

/// What a TLS client does with a serving certificate: chain, serverAuth usage, the name.
fn verify_server(ca_pem: &str, leaf_pem: &str, name: &str) -> Result<(), rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots(ca_pem), provider).build().unwrap();
    let name = ServerName::try_from(name.to_string()).unwrap();
    verifier.verify_server_cert(&der(leaf_pem), &[], &name, &[], UnixTime::now()).map(|_| ())
}

#[test]
fn a_ca_key_in_every_encoding_issues_certificates_that_verify() {
    let now = SystemTime::now();
    for (cert, key) in CAS {
        let ca = load_ca(cert, key).unwrap_or_else(|e| panic!("{key}: {e}"));
        let client = ca.issue_client("job", now, DAY).unwrap();
        verify_client(ca.cert_pem(), &client.cert_pem).unwrap_or_else(|e| panic!("{key}: client: {e}"));
        let id = ca
            .issue_client_identity(&[], "spiffe://cluster.local/ns/a/lmevaljob/j", now, DAY)
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        verify_client(ca.cert_pem(), &id.cert_pem).unwrap_or_else(|e| panic!("{key}: identity: {e}"));
        let serving = ca.issue_serving(&["keyward.keyward-system.svc".into()], now, DAY).unwrap();
        verify_server(ca.cert_pem(), &serving.cert_pem, "keyward.keyward-system.svc")
            .unwrap_or_else(|e| panic!("{key}: serving: {e}"));
    }
}

#[test]
fn a_serving_pair_with_a_key_in_every_encoding_loads() {
    for (cert, key) in CAS {
        let pair = load_pair(fixture(cert).as_bytes(), fixture(key).as_bytes(), Path::new(cert), Path::new(key));
        pair.unwrap_or_else(|e| panic!("{key}: {e}"));
    }
}

#[test]
fn a_ca_load_says_what_is_wrong_with_the_key_or_the_certificate() {
    // Another CA's key.
    let err = load_ca("ca-ec256.crt", "ca-ec384-sec1.key").err().unwrap();
    assert_eq!(err.to_string(), "ca-ec384-sec1.key: the private key does not match the certificate in ca-ec256.crt");
    // A SEC1 key written without its public key (openssl ec -no_public).
    let err = load_ca("ca-ec256.crt", "ec256-sec1-no-public.key").err().unwrap();
    assert_eq!(
        err.to_string(),
        "ec256-sec1-no-public.key: unsupported private key: the EC PRIVATE KEY (SEC1) has no public key, which keyward needs; write it with one (openssl ec -in KEY -out KEY) or as PKCS#8 (openssl pkcs8 -topk8 -nocrypt -in KEY)"
    );
    // A leaf is not a CA.
    let ca = ca();
    let leaf = leaf(&ca);
    let err = Ca::from_pem(&leaf.cert_pem, &leaf.key_pem, Path::new("tls.crt"), Path::new("tls.key")).err().unwrap();
    assert_eq!(
        err.to_string(),
        "tls.crt: not a CA certificate (CN=keyward.keyward-system.svc lacks basicConstraints CA:TRUE); give the CA's certificate, not a leaf"
    );
    // No key at all.
    let err = Ca::from_pem(ca.cert_pem(), "", Path::new("tls.crt"), Path::new("tls.key")).err().unwrap();
    assert!(err.to_string().starts_with("tls.key: no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file"), "{err}");
}

#[test]
fn a_client_ca_store_loads_a_sec1_ca_and_refuses_one_that_cannot_issue() {
    let dir = tempfile::tempdir().unwrap();
    let store = CertStore::new(dir.path()).named("client CA").checked_with(can_issue);
    // A leaf where the CA should be: it is a valid serving pair, but cannot issue.
    let leaf = leaf(&ca());
    write_plain(dir.path(), &leaf);
    match store.reload(Trigger::Startup) {
        ReloadOutcome::Failed(e) => assert!(e.contains("not a CA certificate"), "{e}"),
        other => panic!("a leaf was accepted as the client CA: {other:?}"),
    }
    let reason = store.ready(SystemTime::now()).unwrap_err();
    assert!(
        reason.starts_with("no valid client CA loaded yet: ") && reason.contains("not a CA certificate"),
        "{reason}"
    );

    // The CA as cert-manager writes it by default: SEC1.
    std::fs::write(dir.path().join("tls.crt"), fixture("ca-ec256.crt")).unwrap();
    std::fs::write(dir.path().join("tls.key"), fixture("ca-ec256-sec1.key")).unwrap();
    assert!(matches!(store.reload(Trigger::Poll), ReloadOutcome::Loaded(_)));
    store.ready(SystemTime::now()).unwrap();
    let loaded = store.current().unwrap();
    let ca = Ca::from_pair(&loaded, dir.path()).unwrap();
    let issued = ca.issue_client("job", SystemTime::now(), DAY).unwrap();
    verify_client(&fixture("ca-ec256.crt"), &issued.cert_pem).unwrap();

    // A leaf written over it later is refused; the CA that can sign stays.
    write_plain(dir.path(), &leaf);
    assert!(matches!(store.reload(Trigger::Poll), ReloadOutcome::Failed(_)));
    assert_eq!(store.current().unwrap().info.sha256, loaded.info.sha256);
    store.ready(SystemTime::now()).unwrap();
}

#[test]
fn the_development_directory_keeps_a_ca_whose_key_is_sec1_or_pkcs1() {
    for (cert, key) in [("ca-ec256.crt", "ca-ec256-sec1.key"), ("ca-rsa.crt", "ca-rsa-pkcs1.key")] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), fixture(cert)).unwrap();
        std::fs::write(dir.path().join(CA_KEY_FILE), fixture(key)).unwrap();
        let dev = ensure_dev_dir(dir.path(), &[], SystemTime::now()).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(!dev.reused);
        // The leaf is issued by the CA that was there, which is left as it was.
        let serving = std::fs::read_to_string(dir.path().join("tls.crt")).unwrap();
        verify_server(&fixture(cert), &serving, "localhost").unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(std::fs::read_to_string(dir.path().join(CA_KEY_FILE)).unwrap(), fixture(key));
    }
}

#[test]
fn a_development_ca_that_cannot_be_used_is_an_error_and_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.crt"), fixture("ca-ec256.crt")).unwrap();
    std::fs::write(dir.path().join(CA_KEY_FILE), fixture("ca-rsa-pkcs1.key")).unwrap();
    let err = ensure_dev_dir(dir.path(), &[], SystemTime::now()).unwrap_err();
    let ca_key = dir.path().join(CA_KEY_FILE);
    assert_eq!(
        err.to_string(),
        format!(
            "{}: the private key does not match the certificate in {}; fix or remove ca.crt and ca.key to mint a new development CA (clients that trusted the old one must then trust the new ca.crt)",
            ca_key.display(),
            dir.path().join("ca.crt").display()
        )
    );
    assert_eq!(std::fs::read_to_string(&ca_key).unwrap(), fixture("ca-rsa-pkcs1.key"));
    assert!(!dir.path().join("tls.crt").exists());
}

#[test]
fn an_expiring_development_ca_is_replaced() {
    // The fixture CAs are valid for a century; a CA that ends before a new leaf would is
    // replaced (the one case where a development CA is minted over an existing one).
    let dir = tempfile::tempdir().unwrap();
    let now = SystemTime::now();
    let old = Ca::mint("keyward development CA", now, Duration::from_secs(3 * 86400)).unwrap();
    std::fs::write(dir.path().join("ca.crt"), old.cert_pem()).unwrap();
    std::fs::write(dir.path().join(CA_KEY_FILE), old.key_pem()).unwrap();
    ensure_dev_dir(dir.path(), &[], now).unwrap();
    assert_ne!(std::fs::read_to_string(dir.path().join("ca.crt")).unwrap(), old.cert_pem());
}

#[test]
fn a_ca_bundle_keeps_each_certificate_once() {
    // A source that repeats its CA (two cert-manager fields concatenated, say): the apiserver
    // refuses a ClusterTrustBundle that repeats a certificate, so the bundle holds it once.
    let (first, second) = (ca(), ca());
    let repeated = format!("{}{}{}", first.cert_pem(), second.cert_pem(), first.cert_pem());
    let bundle = keyward_certs::pem::ca_bundle(repeated.as_bytes(), "ca.crt").unwrap();
    assert_eq!(bundle, format!("{}{}", first.cert_pem(), second.cert_pem()));
}
