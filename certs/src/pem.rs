//! A serving certificate pair, parsed and checked before it may be served.

use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::error::Error;

/// What an admin (and the metrics) want to know about a certificate. Never key material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    pub subject: String,
    pub issuer: String,
    pub serial: String,
    /// SHA-256 of the leaf's DER, hex: what `openssl x509 -fingerprint -sha256` prints.
    pub sha256: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    /// URI names (a SPIFFE ID, for keyward's client certificates).
    pub uris: Vec<String>,
    /// The leaf is a CA (basicConstraints CA:TRUE).
    pub is_ca: bool,
    /// Certificates in `tls.crt`, leaf included.
    pub chain_len: usize,
}

/// A checked pair, ready for rustls, and as PEM (for a CA that issues with it).
#[derive(Clone)]
pub struct ServingCert {
    pub key: Arc<CertifiedKey>,
    pub info: CertInfo,
    pub pem: Arc<PemPair>,
}

impl fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServingCert").field("info", &self.info).finish_non_exhaustive()
    }
}

/// The pair's text as read. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct PemPair {
    pub cert: String,
    pub key: String,
}

impl fmt::Debug for PemPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PemPair").field("cert", &self.cert).field("key", &"<redacted>").finish()
    }
}

impl CertInfo {
    /// Whether the certificate is valid at `now`, and if not, why (naming `path`).
    pub fn check_valid_at(&self, path: &Path, now: SystemTime) -> Result<(), Error> {
        if now < self.not_before {
            Err(Error::NotYetValid { path: path.to_path_buf(), not_before: self.not_before })
        } else if now >= self.not_after {
            Err(Error::Expired { path: path.to_path_buf(), not_after: self.not_after })
        } else {
            Ok(())
        }
    }

    /// Whether the certificate names `host` (a DNS name or an IP address), exactly.
    pub fn covers(&self, host: &str) -> bool {
        match host.parse::<IpAddr>() {
            Ok(ip) => self.ip_addresses.contains(&ip),
            Err(_) => self.dns_names.iter().any(|d| d.eq_ignore_ascii_case(host)),
        }
    }
}

/// Parses `tls.crt` (leaf first, then any intermediates) and `tls.key` (PKCS#8, PKCS#1 or
/// SEC1), and checks that the key belongs to the leaf and that the chain is in order. The
/// paths are only for messages.
pub fn load_pair(cert_pem: &[u8], key_pem: &[u8], cert_path: &Path, key_path: &Path) -> Result<ServingCert, Error> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem).collect::<Result<_, _>>().map_err(|e| Error::BadCertificate {
            path: cert_path.to_path_buf(),
            reason: format!("not valid PEM: {}", pem_error(&e)),
        })?;
    if chain.is_empty() {
        return Err(Error::NoCertificate { path: cert_path.to_path_buf() });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| Error::NoKey { path: key_path.to_path_buf(), reason: pem_error(&e) })?;

    let info = inspect_chain(&chain, cert_path)?;
    let signing_key = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| {
        let reason = match rsa_modulus_bits(&key) {
            Some(bits) if bits < MIN_RSA_BITS => format!(
                "the RSA key has {bits} bits, too small: keyward needs at least {MIN_RSA_BITS}; issue an ECDSA P-256 key (cert-manager: privateKey.algorithm: ECDSA) or an RSA key of 2048 bits or more"
            ),
            Some(bits) if bits > MAX_RSA_BITS => {
                format!("the RSA key has {bits} bits; keyward supports RSA keys of {MIN_RSA_BITS} to {MAX_RSA_BITS} bits")
            }
            _ => e.to_string(),
        };
        Error::UnsupportedKey { path: key_path.to_path_buf(), reason }
    })?;
    let certified = CertifiedKey::new(chain, signing_key);
    certified.keys_match().map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            Error::KeyMismatch { cert: cert_path.to_path_buf(), key: key_path.to_path_buf() }
        }
        other => Error::BadCertificate { path: cert_path.to_path_buf(), reason: other.to_string() },
    })?;
    let pem = PemPair {
        cert: String::from_utf8_lossy(cert_pem).into_owned(),
        key: String::from_utf8_lossy(key_pem).into_owned(),
    };
    Ok(ServingCert { key: Arc::new(certified), info, pem: Arc::new(pem) })
}

/// The RSA key sizes ring signs with.
const MIN_RSA_BITS: u64 = 2048;
const MAX_RSA_BITS: u64 = 8192;

/// A PEM parse error in words (pki-types prints the offending line as a list of bytes).
pub(crate) fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error as Pem;
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).trim_end().to_string();
    match e {
        Pem::MissingSectionEnd { end_marker } => {
            let label = text(end_marker);
            format!("the {label:?} section has no end line (-----END {label}-----); is the file cut short?")
        }
        Pem::IllegalSectionStart { line } => format!("malformed section start line {:?}", text(line)),
        Pem::NoItemsFound => "no PEM section (-----BEGIN …-----) in it".into(),
        other => other.to_string(),
    }
}

/// The size of an RSA private key's modulus, in bits, when `key` is RSA (PKCS#1 or PKCS#8).
fn rsa_modulus_bits(key: &PrivateKeyDer<'_>) -> Option<u64> {
    use x509_parser::asn1_rs::{Integer, OctetString, Sequence};
    use x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION;
    use x509_parser::x509::AlgorithmIdentifier;
    // RSAPrivateKey ::= SEQUENCE { version INTEGER, modulus INTEGER, ... } (RFC 8017)
    fn pkcs1(der: &[u8]) -> Option<u64> {
        let (_, key) = Sequence::from_der(der).ok()?;
        let (rest, _version) = Integer::from_der(&key.content).ok()?;
        let (_, modulus) = Integer::from_der(rest).ok()?;
        // Unsigned, big-endian: the bits from the first one set.
        let bytes: &[u8] = modulus.as_ref();
        let first = bytes.iter().position(|b| *b != 0)?;
        Some((bytes.len() - first) as u64 * 8 - u64::from(bytes[first].leading_zeros()))
    }
    match key {
        PrivateKeyDer::Pkcs1(k) => pkcs1(k.secret_pkcs1_der()),
        PrivateKeyDer::Pkcs8(k) => {
            // PrivateKeyInfo ::= SEQUENCE { version, AlgorithmIdentifier, OCTET STRING } (RFC 5208)
            let (_, info) = Sequence::from_der(k.secret_pkcs8_der()).ok()?;
            let (rest, _version) = Integer::from_der(&info.content).ok()?;
            let (rest, algorithm) = AlgorithmIdentifier::from_der(rest).ok()?;
            let (_, inner) = OctetString::from_der(rest).ok()?;
            (algorithm.algorithm == OID_PKCS1_RSAENCRYPTION).then(|| pkcs1(inner.as_cow())).flatten()
        }
        _ => None,
    }
}

/// Parses a PEM certificate chain (no key), e.g. a `ca.crt`.
pub fn cert_info(cert_pem: &[u8], path: &Path) -> Result<CertInfo, Error> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem).collect::<Result<_, _>>().map_err(|e| Error::BadCertificate {
            path: path.to_path_buf(),
            reason: format!("not valid PEM: {}", pem_error(&e)),
        })?;
    if chain.is_empty() {
        return Err(Error::NoCertificate { path: path.to_path_buf() });
    }
    inspect_chain(&chain, path)
}

/// The raw public key (subjectPublicKey's bits) of the first certificate in `cert_pem`.
pub(crate) fn public_key_of_first(cert_pem: &[u8]) -> Option<Vec<u8>> {
    let der = CertificateDer::pem_slice_iter(cert_pem).next()?.ok()?;
    let (_, cert) = X509Certificate::from_der(der.as_ref()).ok()?;
    Some(cert.public_key().subject_public_key.data.to_vec())
}

/// The most certificates a copied trust bundle may hold, and its largest size: a CA rotation
/// needs two or three; a ConfigMap holds at most 1 MiB.
pub const MAX_BUNDLE_CERTIFICATES: usize = 16;
pub const MAX_BUNDLE_BYTES: usize = 128 * 1024;

/// A trust bundle to copy: only CA certificates, re-encoded from their DER so that nothing else
/// in the source (a private key, comments, other sections) can come along. Refuses a source
/// with a private key (in any PEM form), a certificate that is not a CA, none at all, or more
/// than [`MAX_BUNDLE_CERTIFICATES`] or [`MAX_BUNDLE_BYTES`]. `what` names the source.
pub fn ca_bundle(text: &[u8], what: &str) -> Result<String, Error> {
    use rustls::pki_types::pem::SectionKind;
    let refuse = |reason: String| Error::BadCertificate { path: what.into(), reason };
    if text.len() > MAX_BUNDLE_BYTES {
        return Err(refuse(format!(
            "{} bytes, more than the {MAX_BUNDLE_BYTES} a trust bundle may have; give only the CA certificates",
            text.len()
        )));
    }
    // Any private key, whatever its label (pki-types skips labels it does not know, such as
    // ENCRYPTED PRIVATE KEY): a CA source must never hold one, and keyward never copies one.
    if text.windows(b"PRIVATE KEY-----".len()).any(|w| w == b"PRIVATE KEY-----") {
        return Err(refuse(
            "holds a private key; keyward copies only CA certificates: point the source at a key that holds just the CA certificate (cert-manager: ca.crt, never tls.key)".into(),
        ));
    }
    let mut certificates = Vec::new();
    for section in <(SectionKind, Vec<u8>) as PemObject>::pem_slice_iter(text) {
        let (kind, der) = section.map_err(|e| refuse(format!("not valid PEM: {}", pem_error(&e))))?;
        // Once each: the apiserver refuses a ClusterTrustBundle that repeats a certificate.
        if kind == SectionKind::Certificate && !certificates.contains(&der) {
            certificates.push(der);
        }
    }
    if certificates.is_empty() {
        return Err(refuse("holds no PEM certificate; give the CA certificate (-----BEGIN CERTIFICATE-----)".into()));
    }
    if certificates.len() > MAX_BUNDLE_CERTIFICATES {
        return Err(refuse(format!(
            "holds {} certificates, more than the {MAX_BUNDLE_CERTIFICATES} a trust bundle may have",
            certificates.len()
        )));
    }
    let mut out = String::new();
    for (i, der) in certificates.iter().enumerate() {
        let (_, cert) = X509Certificate::from_der(der)
            .map_err(|e| refuse(format!("certificate {} is not valid X.509: {e}", i + 1)))?;
        if !cert.is_ca() {
            return Err(refuse(format!(
                "certificate {} ({}) is not a CA (no basicConstraints CA:TRUE): a trust bundle holds CA certificates, not a server's own certificate; use ca.crt",
                i + 1,
                cert.subject()
            )));
        }
        out.push_str(&certificate_pem(der));
    }
    Ok(out)
}

/// A DER certificate as a PEM block (64-column base64, no headers).
pub fn certificate_pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Reads and checks `dir/tls.crt` and `dir/tls.key`.
pub fn read_pair(dir: &Path) -> Result<ServingCert, Error> {
    let cert_path = dir.join(crate::CERT_FILE);
    let key_path = dir.join(crate::KEY_FILE);
    let cert = std::fs::read(&cert_path).map_err(|error| Error::Read { path: cert_path.clone(), error })?;
    let key = std::fs::read(&key_path).map_err(|error| Error::Read { path: key_path.clone(), error })?;
    load_pair(&cert, &key, &cert_path, &key_path)
}

fn parse<'a>(der: &'a CertificateDer<'_>, path: &Path, index: usize) -> Result<X509Certificate<'a>, Error> {
    X509Certificate::from_der(der.as_ref()).map(|(_, c)| c).map_err(|e| Error::BadCertificate {
        path: path.to_path_buf(),
        reason: format!("certificate {} in the file is not valid X.509: {e}", index + 1),
    })
}

fn inspect_chain(chain: &[CertificateDer<'_>], path: &Path) -> Result<CertInfo, Error> {
    let leaf = parse(&chain[0], path, 0)?;
    if leaf.is_ca() && chain.len() > 1 {
        return Err(Error::BadCertificate {
            path: path.to_path_buf(),
            reason: "the first certificate is a CA; put the leaf (serving) certificate first, then its chain".into(),
        });
    }
    // Each certificate must be issued by the next one: a shuffled chain fails in clients.
    for i in 0..chain.len() - 1 {
        let child = parse(&chain[i], path, i)?;
        let parent = parse(&chain[i + 1], path, i + 1)?;
        if child.issuer().as_raw() != parent.subject().as_raw() {
            return Err(Error::BadCertificate {
                path: path.to_path_buf(),
                reason: format!(
                    "certificate {} (issuer {}) is not issued by certificate {} ({}); order the chain leaf first, each followed by its issuer",
                    i + 1,
                    child.issuer(),
                    i + 2,
                    parent.subject()
                ),
            });
        }
    }
    Ok(CertInfo { chain_len: chain.len(), ..info_of(&leaf, &chain[0]) })
}

/// What one certificate says (`chain_len` 1), from its parsed form and its DER.
pub(crate) fn info_of(cert: &X509Certificate<'_>, der: &CertificateDer<'_>) -> CertInfo {
    let (dns_names, ip_addresses, uris) = alt_names(cert);
    let validity = cert.validity();
    CertInfo {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        serial: cert.raw_serial_as_string(),
        sha256: hex(ring::digest::digest(&ring::digest::SHA256, der.as_ref()).as_ref()),
        not_before: to_system_time(validity.not_before.timestamp()),
        not_after: to_system_time(validity.not_after.timestamp()),
        dns_names,
        ip_addresses,
        uris,
        is_ca: cert.is_ca(),
        chain_len: 1,
    }
}

/// A certificate's subject alternative names: DNS names, IP addresses, URIs.
fn alt_names(cert: &X509Certificate<'_>) -> (Vec<String>, Vec<IpAddr>, Vec<String>) {
    let (mut dns_names, mut ip_addresses, mut uris) = (Vec::new(), Vec::new(), Vec::new());
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns_names.push(d.to_string()),
                GeneralName::URI(u) => uris.push(u.to_string()),
                GeneralName::IPAddress(bytes) => {
                    if let Ok(b) = <[u8; 4]>::try_from(*bytes) {
                        ip_addresses.push(IpAddr::from(b));
                    } else if let Ok(b) = <[u8; 16]>::try_from(*bytes) {
                        ip_addresses.push(IpAddr::from(b));
                    }
                }
                _ => {}
            }
        }
    }
    (dns_names, ip_addresses, uris)
}

fn to_system_time(unix: i64) -> SystemTime {
    if unix >= 0 {
        UNIX_EPOCH + Duration::from_secs(unix.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(unix.unsigned_abs())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
