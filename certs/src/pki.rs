//! keyward's own PKI, with rcgen: a CA, serving leaves and client leaves, all ECDSA P-256.
//!
//! The development default (`keyward serve` with no `--tls-dir`) keeps a CA and a serving
//! certificate in a directory, laid out like a cert-manager Secret, and reuses them while they
//! are valid, so a developer trusts `ca.crt` once.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SanType, SerialNumber, PKCS_ECDSA_P256_SHA256,
};

use crate::error::Error;
use crate::pem::{cert_info, read_pair, CertInfo, ServingCert};
use crate::{CA_FILE, CERT_FILE, KEY_FILE};

/// The CA's private key, kept beside `ca.crt` in the development directory only.
pub const CA_KEY_FILE: &str = "ca.key";

/// The names every development serving certificate carries: loopback, and the in-cluster
/// Service `keyward` in `keyward-system`.
pub const DEV_NAMES: &[&str] =
    &["localhost", "127.0.0.1", "::1", "keyward.keyward-system.svc", "keyward.keyward-system.svc.cluster.local"];

const SKEW: Duration = Duration::from_secs(5 * 60);
const DAY: Duration = Duration::from_secs(24 * 3600);
/// A development CA lives a year; its serving leaves 90 days.
pub const DEV_CA_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
pub const DEV_LEAF_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);
/// A development certificate this close to expiry is replaced at start-up.
const RENEW_BEFORE: Duration = Duration::from_secs(7 * 24 * 3600);

/// A PEM certificate and its PEM (PKCS#8) key.
#[derive(Debug, Clone)]
pub struct Minted {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A CA that can issue leaves.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

fn mint_err(e: rcgen::Error) -> Error {
    Error::Mint(e.to_string())
}

fn window(params: &mut CertificateParams, now: SystemTime, validity: Duration) {
    params.not_before = (now - SKEW).into();
    params.not_after = (now + validity).into();
}

fn random_serial() -> Result<SerialNumber, Error> {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| Error::Mint("no system randomness for a serial number".into()))?;
    bytes[0] &= 0x7f; // a positive INTEGER
    Ok(SerialNumber::from_slice(&bytes))
}

impl Ca {
    /// A new self-signed CA, valid from `now` (less a little clock skew) for `validity`.
    pub fn mint(common_name: &str, now: SystemTime, validity: Duration) -> Result<Self, Error> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(mint_err)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(mint_err)?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.serial_number = Some(random_serial()?);
        window(&mut params, now, validity);
        let cert = params.self_signed(&key).map_err(mint_err)?;
        Ok(Self { cert_pem: cert.pem(), issuer: Issuer::new(params, key) })
    }

    /// Loads a CA from its PEM certificate (the CA first) and its private key in any
    /// encoding cert-manager or openssl writes (PKCS#8, SEC1, PKCS#1), and checks that the
    /// certificate is a CA and the key is its key. The paths are only for messages.
    pub fn from_pem(cert_pem: &str, key_pem: &str, cert_path: &Path, key_path: &Path) -> Result<Self, Error> {
        let info = cert_info(cert_pem.as_bytes(), cert_path)?;
        if !info.is_ca {
            return Err(Error::NotACa { path: cert_path.to_path_buf(), subject: info.subject });
        }
        let pkcs8 = crate::keys::pkcs8_from_pem(key_pem.as_bytes(), key_path)?;
        let key =
            KeyPair::try_from(&rustls::pki_types::PrivateKeyDer::Pkcs8(pkcs8)).map_err(|e| Error::UnsupportedKey {
                path: key_path.to_path_buf(),
                reason: format!(
                    "keyward cannot sign with it ({e}); use an ECDSA P-256 or P-384 key, or RSA of 2048 bits or more"
                ),
            })?;
        if Some(key.der_bytes()) != crate::pem::public_key_of_first(cert_pem.as_bytes()).as_deref() {
            return Err(Error::KeyMismatch { cert: cert_path.to_path_buf(), key: key_path.to_path_buf() });
        }
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(|e| Error::BadCertificate {
            path: cert_path.to_path_buf(),
            reason: format!("cannot issue with this CA certificate: {e}"),
        })?;
        Ok(Self { issuer, cert_pem: cert_pem.to_string() })
    }

    /// A CA from a pair loaded from `dir` (a cert-manager CA Secret: `tls.crt`, `tls.key`).
    pub fn from_pair(pair: &ServingCert, dir: &Path) -> Result<Self, Error> {
        Self::from_pem(&pair.pem.cert, &pair.pem.key, &dir.join(CERT_FILE), &dir.join(KEY_FILE))
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A serving certificate for `names` (DNS names or IP addresses).
    pub fn issue_serving(&self, names: &[String], now: SystemTime, validity: Duration) -> Result<Minted, Error> {
        let first = names.first().cloned().unwrap_or_else(|| "keyward".into());
        self.issue(names.to_vec(), &[(DnType::CommonName, &first)], ExtendedKeyUsagePurpose::ServerAuth, now, validity)
    }

    /// A client certificate for mTLS, identified by `common_name`.
    pub fn issue_client(&self, common_name: &str, now: SystemTime, validity: Duration) -> Result<Minted, Error> {
        self.issue(Vec::new(), &[(DnType::CommonName, common_name)], ExtendedKeyUsagePurpose::ClientAuth, now, validity)
    }

    /// A client certificate for a workload identity: `uri` (a SPIFFE ID) as its only
    /// subject alternative name, and `subject` (e.g. O = namespace, OU = kind, CN = name) for
    /// servers that read the subject.
    pub fn issue_client_identity(
        &self,
        subject: &[(DnType, &str)],
        uri: &str,
        now: SystemTime,
        validity: Duration,
    ) -> Result<Minted, Error> {
        let uri = rcgen::string::Ia5String::try_from(uri.to_string()).map_err(mint_err)?;
        self.issue_with(vec![SanType::URI(uri)], subject, ExtendedKeyUsagePurpose::ClientAuth, now, validity)
    }

    /// A client certificate for a key made elsewhere (the kubelet's, from a
    /// PodCertificateRequest): `spki_der` its DER SubjectPublicKeyInfo, the SPIFFE ID `uri` as
    /// its only subject alternative name, valid from `not_before` to `not_after` exactly (whole
    /// seconds, as X.509 keeps them: the signer reports the same times beside it).
    pub fn issue_for_key(
        &self,
        spki_der: &[u8],
        subject: &[(DnType, &str)],
        uri: &str,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<String, Error> {
        let key = rcgen::SubjectPublicKeyInfo::from_der(spki_der).map_err(|e| Error::BadKey {
            what: "the requested public key".into(),
            reason: format!("{e} (keyward signs ECDSA P-256 and P-384, Ed25519 and RSA keys)"),
        })?;
        let uri = rcgen::string::Ia5String::try_from(uri.to_string()).map_err(mint_err)?;
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![SanType::URI(uri)];
        params.distinguished_name = DistinguishedName::new();
        for (kind, value) in subject {
            params.distinguished_name.push(kind.clone(), *value);
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial()?);
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let cert = params.signed_by(&key, &self.issuer).map_err(mint_err)?;
        Ok(cert.pem())
    }

    fn issue(
        &self,
        names: Vec<String>,
        subject: &[(DnType, &str)],
        usage: ExtendedKeyUsagePurpose,
        now: SystemTime,
        validity: Duration,
    ) -> Result<Minted, Error> {
        let params = CertificateParams::new(names).map_err(mint_err)?;
        self.issue_with(params.subject_alt_names, subject, usage, now, validity)
    }

    fn issue_with(
        &self,
        names: Vec<SanType>,
        subject: &[(DnType, &str)],
        usage: ExtendedKeyUsagePurpose,
        now: SystemTime,
        validity: Duration,
    ) -> Result<Minted, Error> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(mint_err)?;
        let mut params = CertificateParams::default();
        params.subject_alt_names = names;
        params.distinguished_name = DistinguishedName::new();
        for (kind, value) in subject {
            params.distinguished_name.push(kind.clone(), *value);
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial()?);
        window(&mut params, now, validity);
        let cert = params.signed_by(&key, &self.issuer).map_err(mint_err)?;
        Ok(Minted { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

/// Whether the pair loaded from `dir` can issue client certificates: it loads as a [`Ca`]
/// and signs one. The check a client CA store runs before it swaps a pair in.
pub fn can_issue(pair: &ServingCert, dir: &Path) -> Result<(), Error> {
    let ca = Ca::from_pair(pair, dir)?;
    let now = SystemTime::now();
    ca.issue_client("keyward signing check", now, SKEW).map_err(|e| Error::BadCertificate {
        path: dir.join(CERT_FILE),
        reason: format!("this CA cannot issue: {e}"),
    })?;
    Ok(())
}

/// What [`ensure_dev_dir`] did.
#[derive(Debug, Clone)]
pub struct DevCertificates {
    pub dir: PathBuf,
    pub ca_file: PathBuf,
    /// True when the files already there were valid and kept.
    pub reused: bool,
    pub info: CertInfo,
}

/// Makes sure `dir` holds a development CA (`ca.crt`, `ca.key`) and a serving certificate
/// (`tls.crt`, `tls.key`) for [`DEV_NAMES`] plus `extra_names`, valid for at least a week.
/// Valid files are reused; a serving certificate is re-issued from the same CA when the CA is
/// still good, so a CA the developer already trusts stays trusted.
pub fn ensure_dev_dir(dir: &Path, extra_names: &[String], now: SystemTime) -> Result<DevCertificates, Error> {
    let mut names: Vec<String> = DEV_NAMES.iter().map(|s| s.to_string()).collect();
    for n in extra_names {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    let ca_file = dir.join(CA_FILE);
    let done = |reused: bool, info: CertInfo| DevCertificates {
        dir: dir.to_path_buf(),
        ca_file: ca_file.clone(),
        reused,
        info,
    };

    if let Ok(current) = read_pair(dir) {
        let fresh = current.info.check_valid_at(dir, now + RENEW_BEFORE).is_ok() && now >= current.info.not_before;
        if fresh && names.iter().all(|n| current.info.covers(n)) && ca_file.is_file() {
            return Ok(done(true, current.info));
        }
    }
    std::fs::create_dir_all(dir).map_err(|error| Error::Write { path: dir.to_path_buf(), error })?;
    let ca = match load_dev_ca(dir, now).map_err(|e| Error::DevCa(Box::new(e)))? {
        Some(ca) => ca,
        None => {
            let ca = Ca::mint("keyward development CA", now, DEV_CA_VALIDITY)?;
            write_file(&dir.join(CA_KEY_FILE), ca.key_pem().as_bytes(), true)?;
            write_file(&ca_file, ca.cert_pem().as_bytes(), false)?;
            ca
        }
    };
    let leaf = ca.issue_serving(&names, now, DEV_LEAF_VALIDITY.min(DEV_CA_VALIDITY))?;
    // Key first: a watcher that sees the new key with the old certificate rejects the pair
    // and keeps serving; it then sees the certificate and loads both.
    write_file(&dir.join(KEY_FILE), leaf.key_pem.as_bytes(), true)?;
    write_file(&dir.join(CERT_FILE), format!("{}{}", leaf.cert_pem, ca.cert_pem()).as_bytes(), false)?;
    let info = read_pair(dir)?.info;
    Ok(done(false, info))
}

/// The development CA in `dir`: `None` when there is none, or when it expires before a new
/// leaf would (a new CA is minted then). A CA that is there but cannot be used is an error,
/// never silently replaced: the developer may trust it, or have put their own there.
fn load_dev_ca(dir: &Path, now: SystemTime) -> Result<Option<Ca>, Error> {
    let (cert_path, key_path) = (dir.join(CA_FILE), dir.join(CA_KEY_FILE));
    if !cert_path.exists() && !key_path.exists() {
        return Ok(None);
    }
    let read = |path: &Path| std::fs::read_to_string(path).map_err(|error| Error::Read { path: path.into(), error });
    let (cert, key) = (read(&cert_path)?, read(&key_path)?);
    let info = cert_info(cert.as_bytes(), &cert_path)?;
    if info.not_after < now + DEV_LEAF_VALIDITY + DAY {
        return Ok(None);
    }
    Ca::from_pem(&cert, &key, &cert_path, &key_path).map(Some)
}

/// Writes a file atomically (a temporary file, then a rename), private when it holds a key.
pub fn write_file(path: &Path, contents: &[u8], private: bool) -> Result<(), Error> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp"));
    let err = |error| Error::Write { path: path.to_path_buf(), error };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if private { 0o600 } else { 0o644 });
    }
    let mut file = options.open(&tmp).map_err(err)?;
    file.write_all(contents).map_err(err)?;
    file.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
