//! Parsing and checking PEM pairs; minting with rcgen; the development directory.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use std::path::Path;
use std::time::SystemTime;

use keyward_certs::pem::{load_pair, read_pair};
use keyward_certs::pki::{ensure_dev_dir, Ca, DEV_NAMES};
use keyward_certs::Error;
use rustls::pki_types::pem::PemObject;
use support::*;

fn load(cert: &str, key: &str) -> Result<keyward_certs::ServingCert, Error> {
    load_pair(cert.as_bytes(), key.as_bytes(), Path::new("tls.crt"), Path::new("tls.key"))
}

#[test]
fn a_minted_leaf_loads_with_its_names_and_chain() {
    let ca = ca();
    let leaf = leaf(&ca);
    let chain = format!("{}{}", leaf.cert_pem, ca.cert_pem());
    let pair = load(&chain, &leaf.key_pem).unwrap();
    assert_eq!(pair.info.chain_len, 2);
    assert_eq!(pair.info.dns_names, ["keyward.keyward-system.svc"]);
    assert_eq!(pair.info.ip_addresses, ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]);
    assert!(pair.info.covers("keyward.keyward-system.svc"));
    assert!(!pair.info.covers("other.svc"));
    assert_eq!(pair.info.issuer, "CN=test CA");
    assert_eq!(pair.info.sha256.len(), 64);
}

#[test]
fn a_key_that_does_not_match_is_refused() {
    let ca = ca();
    let (a, b) = (leaf(&ca), leaf(&ca));
    let err = load(&a.cert_pem, &b.key_pem).unwrap_err();
    assert_eq!(err.to_string(), "tls.key: the private key does not match the certificate in tls.crt");
}

#[test]
fn a_chain_out_of_order_is_refused() {
    let ca = ca();
    let leaf = leaf(&ca);
    let err = load(&format!("{}{}", ca.cert_pem(), leaf.cert_pem), &leaf.key_pem).unwrap_err();
    assert!(err.to_string().starts_with("tls.crt: the first certificate is a CA"), "{err}");
    let other = Ca::mint("other CA", SystemTime::now(), DAY).unwrap();
    let err = load(&format!("{}{}", leaf.cert_pem, other.cert_pem()), &leaf.key_pem).unwrap_err();
    assert!(
        err.to_string().contains("certificate 1 (issuer CN=test CA) is not issued by certificate 2 (CN=other CA)"),
        "{err}"
    );
}

#[test]
fn half_written_and_empty_files_are_refused() {
    let ca = ca();
    let leaf = leaf(&ca);
    let half = &leaf.cert_pem[..leaf.cert_pem.len() / 2];
    let err = load(half, &leaf.key_pem).unwrap_err();
    assert!(err.to_string().starts_with("tls.crt: "), "{err}");
    let err = load("", &leaf.key_pem).unwrap_err();
    assert_eq!(err.to_string(), "tls.crt: no PEM certificate in the file");
    let err = load(&leaf.cert_pem, "").unwrap_err();
    assert!(err.to_string().starts_with("tls.key: no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file"), "{err}");
}

#[test]
fn pkcs8_pkcs1_and_sec1_keys_all_load() {
    // RSA, PKCS#8 and PKCS#1 encodings of one test key; the certificate is minted for it.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let pkcs8 = std::fs::read_to_string(format!("{dir}/rsa-pkcs8.key")).unwrap();
    let pkcs1 = std::fs::read_to_string(format!("{dir}/rsa-pkcs1.key")).unwrap();
    let key = rcgen::KeyPair::from_pem_and_sign_algo(&pkcs8, &rcgen::PKCS_RSA_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().self_signed(&key).unwrap();
    load(&cert.pem(), &pkcs8).unwrap();
    load(&cert.pem(), &pkcs1).unwrap();

    // SEC1: the ECPrivateKey inside rcgen's PKCS#8 ECDSA key.
    let ca = ca();
    let leaf = leaf(&ca);
    let sec1 = sec1_from_pkcs8(&leaf.key_pem);
    assert!(sec1.starts_with("-----BEGIN EC PRIVATE KEY-----"));
    load(&leaf.cert_pem, &sec1).unwrap();
}

#[test]
fn a_small_rsa_key_is_refused_as_too_small() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let leaf = leaf(&ca());
    for file in ["rsa-1024-pkcs1.key", "rsa-1024-pkcs8.key"] {
        let key = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
        let err = load(&leaf.cert_pem, &key).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tls.key: unsupported private key: the RSA key has 1024 bits, too small: keyward needs at least 2048; issue an ECDSA P-256 key (cert-manager: privateKey.algorithm: ECDSA) or an RSA key of 2048 bits or more",
            "{file}"
        );
    }
}

#[test]
fn pem_errors_name_the_line_as_text() {
    let leaf = leaf(&ca());
    let cut = leaf.key_pem.trim_end().trim_end_matches("-----END PRIVATE KEY-----");
    let err = load(&leaf.cert_pem, cut).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tls.key: no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file: the \"PRIVATE KEY\" section has no end line (-----END PRIVATE KEY-----); is the file cut short?"
    );
}

/// PrivateKeyInfo ::= SEQUENCE { INTEGER, AlgorithmIdentifier, OCTET STRING (ECPrivateKey) }
fn sec1_from_pkcs8(pem: &str) -> String {
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes()).unwrap();
    let bytes = der.secret_pkcs8_der();
    let (_, any) = x509_parser::der_parser::parse_der(bytes).unwrap();
    let seq = any.as_sequence().unwrap();
    let inner = seq[2].as_slice().unwrap();
    let b64 = base64_encode(inner);
    let lines: Vec<&str> = b64.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap()).collect();
    format!("-----BEGIN EC PRIVATE KEY-----\n{}\n-----END EC PRIVATE KEY-----\n", lines.join("\n"))
}

fn base64_encode(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn validity_window_is_checked() {
    let now = SystemTime::now();
    let ca = Ca::mint("test CA", now - 10 * DAY, 30 * DAY).unwrap();
    let expired = ca.issue_serving(&["localhost".to_string()], now - 5 * DAY, DAY).unwrap();
    let pair = load(&expired.cert_pem, &expired.key_pem).unwrap();
    let err = pair.info.check_valid_at(Path::new("tls.crt"), now).unwrap_err();
    assert!(err.to_string().starts_with("tls.crt: the certificate expired at "), "{err}");
    let future = ca.issue_serving(&["localhost".to_string()], now + 5 * DAY, DAY).unwrap();
    let pair = load(&future.cert_pem, &future.key_pem).unwrap();
    let err = pair.info.check_valid_at(Path::new("tls.crt"), now).unwrap_err();
    assert!(err.to_string().starts_with("tls.crt: the certificate is not valid until "), "{err}");
}

#[test]
fn dev_dir_is_minted_once_then_reused_and_covers_extra_names() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("dev");
    let first = ensure_dev_dir(&dir, &["keyward.example.test".to_string()], SystemTime::now()).unwrap();
    assert!(!first.reused);
    for name in DEV_NAMES.iter().copied().chain(["keyward.example.test"]) {
        assert!(
            first.info.covers(name),
            "{name} missing from {:?} {:?}",
            first.info.dns_names,
            first.info.ip_addresses
        );
    }
    assert_eq!(first.ca_file, dir.join("ca.crt"));
    let again = ensure_dev_dir(&dir, &["keyward.example.test".to_string()], SystemTime::now()).unwrap();
    assert!(again.reused);
    assert_eq!(again.info.sha256, first.info.sha256);

    // A new name re-issues the leaf from the same CA, so a trusted ca.crt stays trusted.
    let ca_before = std::fs::read(dir.join("ca.crt")).unwrap();
    let more = ensure_dev_dir(&dir, &["other.example.test".to_string()], SystemTime::now()).unwrap();
    assert!(!more.reused);
    assert_ne!(more.info.sha256, first.info.sha256);
    assert_eq!(std::fs::read(dir.join("ca.crt")).unwrap(), ca_before);
    assert_eq!(read_pair(&dir).unwrap().info.issuer, "CN=keyward development CA");
    use std::os::unix::fs::PermissionsExt;
    for key in ["tls.key", "ca.key"] {
        let mode = std::fs::metadata(dir.join(key)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{key}");
    }
}

/// What a certificate may be used for, as a verifier reads it.
#[derive(Debug, PartialEq)]
struct Usages {
    /// A CA, with its path length constraint.
    ca: Option<Option<u32>>,
    key: Vec<&'static str>,
    extended: Vec<&'static str>,
    uris: Vec<String>,
}

fn usages(cert_pem: &str) -> Usages {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let der = rustls::pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let ca = cert.basic_constraints().unwrap().map(|b| b.value).filter(|b| b.ca).map(|b| b.path_len_constraint);
    let mut key_usage = Vec::new();
    if let Some(ku) = cert.key_usage().unwrap() {
        for (set, name) in [
            (ku.value.digital_signature(), "digitalSignature"),
            (ku.value.key_encipherment(), "keyEncipherment"),
            (ku.value.key_cert_sign(), "keyCertSign"),
            (ku.value.crl_sign(), "cRLSign"),
        ] {
            if set {
                key_usage.push(name);
            }
        }
    }
    let mut extended = Vec::new();
    if let Some(eku) = cert.extended_key_usage().unwrap() {
        let eku = eku.value;
        for (set, name) in [
            (eku.any, "any"),
            (eku.server_auth, "serverAuth"),
            (eku.client_auth, "clientAuth"),
            (eku.code_signing, "codeSigning"),
            (eku.email_protection, "emailProtection"),
            (eku.time_stamping, "timeStamping"),
            (eku.ocsp_signing, "OCSPSigning"),
            (!eku.other.is_empty(), "other"),
        ] {
            if set {
                extended.push(name);
            }
        }
    }
    let uris = cert
        .subject_alternative_name()
        .unwrap()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(u) => Some(u.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    Usages { ca, key: key_usage, extended, uris }
}

/// A certificate is an identity: a client certificate that also served TLS, or a serving one
/// that also authenticated a client, would let one stand in for the other.
#[test]
fn every_kind_of_certificate_is_for_its_one_use() {
    use rcgen::DnType;
    let now = SystemTime::now();
    let ca = ca();
    let leaf = |extended: &'static str, uris: &[&str]| Usages {
        ca: None,
        key: vec!["digitalSignature"],
        extended: vec![extended],
        uris: uris.iter().map(|u| u.to_string()).collect(),
    };
    let a_ca = Usages {
        ca: Some(Some(0)),
        key: vec!["digitalSignature", "keyCertSign", "cRLSign"],
        extended: vec![],
        uris: vec![],
    };
    assert_eq!(usages(ca.cert_pem()), a_ca);

    let serving = ca.issue_serving(&["keyward.keyward.svc".to_string()], now, DAY).unwrap();
    assert_eq!(usages(&serving.cert_pem), leaf("serverAuth", &[]));

    let client = ca.issue_client("system:serviceaccount:team-a:evaljob-sample", now, DAY).unwrap();
    assert_eq!(usages(&client.cert_pem), leaf("clientAuth", &[]));

    let uri = "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";
    let identity = ca.issue_client_identity(&[(DnType::CommonName, "evaljob-sample")], uri, now, DAY).unwrap();
    assert_eq!(usages(&identity.cert_pem), leaf("clientAuth", &[uri]));

    // The development directory: its CA and its serving certificate.
    let tmp = tempfile::tempdir().unwrap();
    ensure_dev_dir(tmp.path(), &[], now).unwrap();
    let read = |file: &str| std::fs::read_to_string(tmp.path().join(file)).unwrap();
    assert_eq!(usages(&read("ca.crt")), a_ca);
    assert_eq!(usages(&read("tls.crt")), leaf("serverAuth", &[]));
}

#[test]
fn a_client_certificate_is_for_client_auth() {
    let ca = ca();
    let client = ca.issue_client("system:serviceaccount:team-a:evaljob-sample", SystemTime::now(), DAY).unwrap();
    let pair = load(&client.cert_pem, &client.key_pem).unwrap();
    assert_eq!(pair.info.subject, "CN=system:serviceaccount:team-a:evaljob-sample");
    assert!(pair.info.dns_names.is_empty());
}
