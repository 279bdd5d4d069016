//! What a certificate file or a certificate directory holds, and whether it would work: the core
//! of `keyward certs inspect`. Reads certificates and keys; never returns key material.
//!
//! A directory is read as keyward reads `--tls-dir` and `--client-ca-dir`: `tls.crt`, and
//! `tls.key` and `ca.crt` when present. The chain is checked the way a TLS peer would check it
//! (rustls's WebPKI verifiers): as a server certificate for its first name when it is one, else
//! as a client certificate.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::Error;
use crate::pem::CertInfo;
use crate::{CA_FILE, CERT_FILE, KEY_FILE};

// === Inspection ===

/// Everything `inspect` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// The file the certificates came from.
    pub cert_file: PathBuf,
    /// Its certificates, in file order (leaf first).
    pub certificates: Vec<Certificate>,
    /// The private key beside them (`tls.key`), when there is one.
    pub key: Option<Check>,
    /// The chain against a CA bundle (`--ca`, or `ca.crt` beside them), when there is one.
    pub chain: Option<Check>,
    /// Whether the first certificate is valid at the time of the inspection.
    pub time: Check,
}

impl Inspection {
    /// Whether every check passed.
    pub fn ok(&self) -> bool {
        self.time.result.is_ok()
            && self.key.as_ref().is_none_or(|c| c.result.is_ok())
            && self.chain.as_ref().is_none_or(|c| c.result.is_ok())
    }
}

/// One certificate, as an admin wants to read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    /// Subject, issuer, serial, SHA-256, validity, names, CA or not (`chain_len` is 1).
    pub info: CertInfo,
    /// e.g. `ECDSA P-256`, `RSA 2048`, `Ed25519`.
    pub key_type: String,
    /// Extended key usages: `serverAuth`, `clientAuth`, … (empty: none stated).
    pub usages: Vec<String>,
    /// The first `spiffe://` URI name: the workload identity a keyward client certificate carries.
    pub spiffe_id: Option<String>,
}

/// A check's subject and outcome: what passed, or why it failed, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The file checked against (the key, the CA bundle); empty for the time check.
    pub against: PathBuf,
    pub result: Result<String, String>,
}

/// Inspects `path` (a PEM file, or a directory holding `tls.crt`), checking the chain against
/// `ca` when given (else `ca.crt` in the directory, when there), at `now`.
pub fn inspect(path: &Path, ca: Option<&Path>, now: SystemTime) -> Result<Inspection, Error> {
    let (cert_file, key_file, ca_file) = if path.is_dir() {
        if !path.join(CERT_FILE).exists() {
            let inside = directories_holding_a_certificate(path);
            if !inside.is_empty() {
                return Err(Error::CertificatesBelow { dir: path.to_path_buf(), inside });
            }
        }
        let key = path.join(KEY_FILE);
        let bundled = path.join(CA_FILE);
        (path.join(CERT_FILE), key.exists().then_some(key), bundled.exists().then_some(bundled))
    } else {
        (path.to_path_buf(), None, None)
    };
    let ca_file = ca.map(Path::to_path_buf).or(ca_file);
    let text = read(&cert_file)?;
    let ders = pem_certificates(&text, &cert_file)?;
    let certificates =
        ders.iter().enumerate().map(|(i, der)| describe(der, &cert_file, i)).collect::<Result<Vec<_>, _>>()?;
    let first = &certificates[0];
    let time = Check { against: PathBuf::new(), result: valid_at(&first.info, now) };
    let key = match key_file {
        Some(file) => Some(Check { result: key_matches(&text, &read(&file)?, &file), against: file }),
        None => None,
    };
    let chain = match ca_file {
        Some(file) => {
            let roots = pem_certificates(&read(&file)?, &file)?;
            Some(Check { result: verify(&ders, first, &roots, now), against: file })
        }
        None => None,
    };
    Ok(Inspection { cert_file, certificates, key, chain, time })
}

/// The directories right below `dir` that hold a tls.crt (`mint --out`'s serving/ and
/// client/), sorted; what cannot be listed is left out.
fn directories_holding_a_certificate(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<PathBuf> =
        entries.flatten().map(|e| e.path()).filter(|p| p.is_dir() && p.join(CERT_FILE).is_file()).collect();
    found.sort();
    found
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|error| Error::Read { path: path.to_path_buf(), error })
}

fn pem_certificates(text: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let ders: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(text).collect::<Result<_, _>>().map_err(|e| Error::BadCertificate {
            path: path.to_path_buf(),
            reason: format!("not valid PEM: {}", crate::pem::pem_error(&e)),
        })?;
    if ders.is_empty() {
        return Err(Error::NoCertificate { path: path.to_path_buf() });
    }
    Ok(ders)
}

// === One certificate ===

fn describe(der: &CertificateDer<'_>, path: &Path, index: usize) -> Result<Certificate, Error> {
    let (_, cert) = X509Certificate::from_der(der.as_ref()).map_err(|e| Error::BadCertificate {
        path: path.to_path_buf(),
        reason: format!("certificate {} is not valid X.509: {e}", index + 1),
    })?;
    let mut usages = Vec::new();
    if let Ok(Some(eku)) = cert.extended_key_usage() {
        let eku = eku.value;
        for (set, name) in [
            (eku.any, "any"),
            (eku.server_auth, "serverAuth"),
            (eku.client_auth, "clientAuth"),
            (eku.code_signing, "codeSigning"),
            (eku.email_protection, "emailProtection"),
            (eku.time_stamping, "timeStamping"),
            (eku.ocsp_signing, "OCSPSigning"),
        ] {
            if set {
                usages.push(name.to_string());
            }
        }
        usages.extend(eku.other.iter().map(|oid| oid.to_id_string()));
    }
    let info = crate::pem::info_of(&cert, der);
    Ok(Certificate {
        key_type: key_type(&cert),
        usages,
        spiffe_id: info.uris.iter().find(|u| u.starts_with("spiffe://")).cloned(),
        info,
    })
}

fn key_type(cert: &X509Certificate<'_>) -> String {
    use x509_parser::public_key::PublicKey;
    match cert.public_key().parsed() {
        Ok(PublicKey::EC(point)) => {
            let curve = cert
                .public_key()
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|oid| oid.to_id_string());
            match curve.as_deref() {
                Some("1.2.840.10045.3.1.7") => "ECDSA P-256".into(),
                Some("1.3.132.0.34") => "ECDSA P-384".into(),
                Some("1.3.132.0.35") => "ECDSA P-521".into(),
                Some(other) => format!("ECDSA (curve {other})"),
                None => format!("ECDSA ({} bits)", point.key_size()),
            }
        }
        Ok(PublicKey::RSA(rsa)) => format!("RSA {}", rsa.key_size()),
        Ok(PublicKey::Unknown(_)) if cert.public_key().algorithm.algorithm.to_id_string() == "1.3.101.112" => {
            "Ed25519".into()
        }
        _ => format!("other ({})", cert.public_key().algorithm.algorithm.to_id_string()),
    }
}

// === Checks ===

fn valid_at(cert: &CertInfo, now: SystemTime) -> Result<String, String> {
    let at = crate::error::rfc3339;
    if now < cert.not_before {
        Err(format!("not valid yet: valid from {}", at(cert.not_before)))
    } else if now >= cert.not_after {
        Err(format!("expired at {}", at(cert.not_after)))
    } else {
        let left = cert.not_after.duration_since(now).unwrap_or_default().as_secs();
        Ok(format!("valid now, until {} ({} days left)", at(cert.not_after), left / 86_400))
    }
}

/// Whether the private key in `key_pem` (PKCS#8, SEC1 or PKCS#1) is the first certificate's.
fn key_matches(cert_pem: &[u8], key_pem: &[u8], key_path: &Path) -> Result<String, String> {
    let pkcs8 = crate::keys::pkcs8_from_pem(key_pem, key_path).map_err(|e| e.to_string())?;
    let key = rcgen::KeyPair::try_from(&rustls::pki_types::PrivateKeyDer::Pkcs8(pkcs8))
        .map_err(|e| format!("{}: cannot read this key: {e}", key_path.display()))?;
    if Some(rcgen::PublicKeyData::der_bytes(&key)) == crate::pem::public_key_of_first(cert_pem).as_deref() {
        Ok("the key belongs to certificate 1".into())
    } else {
        Err("the key does not belong to certificate 1: the Secret's tls.key and tls.crt are from different issuances"
            .into())
    }
}

/// Whether a TLS peer that trusts `roots` accepts the chain: as a server for the first name when
/// the leaf is a server certificate, else as a client. A CA certificate passes when it is one of
/// `roots`.
fn verify(
    chain: &[CertificateDer<'static>],
    leaf: &Certificate,
    roots: &[CertificateDer<'static>],
    now: SystemTime,
) -> Result<String, String> {
    if leaf.info.is_ca {
        return if roots.contains(&chain[0]) {
            Ok("certificate 1 is one of the trusted CA certificates".into())
        } else {
            Err("certificate 1 is a CA certificate that is not among the trusted ones".into())
        };
    }
    let server_name =
        leaf.info.dns_names.first().cloned().or_else(|| leaf.info.ip_addresses.first().map(IpAddr::to_string));
    let server = leaf.usages.iter().any(|u| u == "serverAuth" || u == "any");
    match server_name.filter(|_| server || leaf.usages.is_empty()) {
        Some(name) => accepted_as_server(chain, roots, &name, now)
            .map(|()| format!("a TLS client that trusts the CA bundle accepts it as the server {name}"))
            .map_err(|e| {
                format!("a TLS client that trusts the CA bundle refuses it as the server {name}: {e}{}", hint(&e, leaf))
            }),
        None => accepted_as_client(chain, roots, now)
            .map(|()| "a TLS server that trusts the CA bundle accepts it as a client certificate".into())
            .map_err(|e| {
                format!(
                    "a TLS server that trusts the CA bundle refuses it as a client certificate: {e}{}",
                    hint(&e, leaf)
                )
            }),
    }
}

/// Whether a TLS client that trusts `roots` accepts `chain` (leaf first) as the server `name`
/// at `now`: rustls's WebPKI verifier, as keyward's own peers check it.
pub fn accepted_as_server(
    chain: &[CertificateDer<'_>],
    roots: &[CertificateDer<'_>],
    name: &str,
    now: SystemTime,
) -> Result<(), rustls::Error> {
    use rustls::client::danger::ServerCertVerifier;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(root_store(roots)?, provider())
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
    let server_name =
        ServerName::try_from(name.to_string()).map_err(|e| rustls::Error::General(format!("{name}: {e}")))?;
    let (leaf, intermediates) = chain.split_first().ok_or(rustls::Error::NoCertificatesPresented)?;
    verifier.verify_server_cert(leaf, intermediates, &server_name, &[], unix_time(now)).map(|_| ())
}

/// Whether a TLS server that trusts `roots` accepts `chain` (leaf first) as a client
/// certificate at `now`.
pub fn accepted_as_client(
    chain: &[CertificateDer<'_>],
    roots: &[CertificateDer<'_>],
    now: SystemTime,
) -> Result<(), rustls::Error> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(root_store(roots)?, provider())
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
    let (leaf, intermediates) = chain.split_first().ok_or(rustls::Error::NoCertificatesPresented)?;
    verifier.verify_client_cert(leaf, intermediates, unix_time(now)).map(|_| ())
}

fn root_store(roots: &[CertificateDer<'_>]) -> Result<Arc<rustls::RootCertStore>, rustls::Error> {
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store
            .add(root.clone().into_owned())
            .map_err(|e| rustls::Error::General(format!("cannot trust a certificate of the CA bundle: {e}")))?;
    }
    Ok(Arc::new(store))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn unix_time(now: SystemTime) -> UnixTime {
    UnixTime::since_unix_epoch(now.duration_since(UNIX_EPOCH).unwrap_or_default())
}

/// What the two refusals an admin meets most often mean.
fn hint(e: &rustls::Error, leaf: &Certificate) -> String {
    use rustls::{CertificateError, Error};
    match e {
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            format!(" (the bundle does not hold its issuer, {})", leaf.info.issuer)
        }
        Error::InvalidCertificate(CertificateError::BadSignature) => format!(
            " (the bundle holds a CA named {} but with another key: the CA was replaced after this certificate was issued)",
            leaf.info.issuer
        ),
        _ => String::new(),
    }
}
