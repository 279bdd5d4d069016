//! The client CA the gate verifies certificates against: a PEM bundle (the ConfigMap
//! `keyward-client-ca`'s `ca.crt`, or a ClusterTrustBundle projected into a volume), reloaded
//! when its directory changes. While keyward rotates its client CA it publishes the old CA and
//! the new one together, so a certificate signed by either verifies through the overlap; a
//! bundle that cannot be read keeps the last good one (and says so), as the serving
//! certificate does.
//!
//! A client certificate is optional at the TLS layer (a caller may present a token instead),
//! but one that is presented must verify: signed by a CA of the bundle, in its validity, for
//! client authentication. Anything else ends the handshake.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use keyward_certs::{ReloadSource, Trigger};

use super::Reload;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

/// The most CAs a bundle may hold: two during a rotation, a few more for merged bundles.
const MAX_CAS: usize = 64;
/// The largest bundle file read.
const MAX_BUNDLE_BYTES: u64 = 1024 * 1024;

struct Loaded {
    /// `None` while the bundle's file does not exist yet ([`ClientCa::load_or_await`]): every
    /// client certificate is refused until it appears.
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    /// The bundle's bytes, to tell a change from a poll that finds the same file.
    bundle: Vec<u8>,
    /// Counts the bundles loaded (from 1): a connection verified under an older one is verified
    /// again on its next request ([`ClientCa::still_trusts`]).
    generation: u64,
}

type Observer = Box<dyn Fn(&Reload) + Send + Sync>;

/// The client CA bundle, verified against on every handshake, reloaded in place.
pub struct ClientCa {
    file: PathBuf,
    dir: PathBuf,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<Loaded>,
    observer: Option<Observer>,
}

impl std::fmt::Debug for ClientCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCa").field("file", &self.file).finish_non_exhaustive()
    }
}

impl ClientCa {
    /// Reads `file`; at start-up a bundle that cannot be read stops the gate.
    pub fn load(file: &Path) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let bundle = read_bundle(file)?;
        let verifier = verifier(&bundle, &provider).map_err(|e| format!("--client-ca {}: {e}", file.display()))?;
        Ok(Self::with(file, provider, Loaded { verifier: Some(verifier), bundle, generation: 1 }))
    }

    fn with(file: &Path, provider: Arc<CryptoProvider>, loaded: Loaded) -> Self {
        Self {
            file: file.to_path_buf(),
            dir: watched_dir(file),
            provider,
            current: ArcSwap::from_pointee(loaded),
            observer: None,
        }
    }

    /// As [`ClientCa::load`], but a file that does not exist yet is awaited: until the ConfigMap
    /// is published (an optional volume's directory stays empty till then), no client
    /// certificate verifies, and the watch loads the bundle when it appears.
    pub fn load_or_await(file: &Path) -> Result<Self, String> {
        match std::fs::metadata(file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::with(
                file,
                Arc::new(rustls::crypto::ring::default_provider()),
                Loaded { verifier: None, bundle: Vec::new(), generation: 1 },
            )),
            _ => Self::load(file),
        }
    }

    /// Whether a bundle is loaded (`false` while [`ClientCa::load_or_await`] awaits the file).
    pub fn is_loaded(&self) -> bool {
        self.current.load().verifier.is_some()
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    pub fn with_observer(mut self, observer: impl Fn(&Reload) + Send + Sync + 'static) -> Self {
        self.observer = Some(Box::new(observer));
        self
    }

    /// Reads the bundle again; keeps the one it has when the new one is refused.
    pub fn reload_now(&self) -> Reload {
        let awaited = !self.is_loaded() && !self.file.exists();
        let outcome = match read_bundle(&self.file) {
            Err(_) if awaited => Reload::Unchanged,
            Ok(bundle) if bundle == self.current.load().bundle => Reload::Unchanged,
            Ok(bundle) => match verifier(&bundle, &self.provider) {
                Ok(verifier) => {
                    let count = count_certificates(&bundle);
                    let generation = self.current.load().generation + 1;
                    self.current.store(Arc::new(Loaded { verifier: Some(verifier), bundle, generation }));
                    Reload::Loaded(count)
                }
                Err(e) => Reload::Failed(e),
            },
            Err(e) => Reload::Failed(e),
        };
        match &outcome {
            Reload::Loaded(count) => {
                tracing::info!(file = %self.file.display(), cas = count, "client CA bundle loaded")
            }
            Reload::Failed(e) => tracing::warn!(
                file = %self.file.display(),
                error = %e,
                "client CA bundle refused; still verifying with the last good one"
            ),
            Reload::Unchanged => {}
        }
        if let Some(observe) = &self.observer {
            observe(&outcome);
        }
        outcome
    }

    /// The generation of the bundle in force.
    pub fn generation(&self) -> u64 {
        self.current.load().generation
    }

    /// Whether a connection's certificate (`chain`, end entity first, good until `not_after`,
    /// verified at its handshake under generation `under`) is still good at `now`: in its
    /// validity, and, when the bundle changed since, chaining to a CA of the bundle now in force
    /// (a CA rotated out is trusted no more on connections made under it). `Ok` gives the
    /// generation it is good under.
    pub fn still_trusts(
        &self,
        chain: &[CertificateDer<'_>],
        under: u64,
        not_after: Option<SystemTime>,
        now: SystemTime,
    ) -> Result<u64, String> {
        let current = self.current.load();
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err("no client certificate".into());
        };
        let at = UnixTime::since_unix_epoch(now.duration_since(UNIX_EPOCH).unwrap_or_default());
        if current.generation == under {
            // Verified in full at the handshake: only time has moved since.
            return match not_after {
                Some(not_after) if now <= not_after => Ok(under),
                _ => Err("the client certificate has expired: reconnect with the renewed one".into()),
            };
        }
        let Some(verifier) = &current.verifier else {
            return Err(format!("the gate has no client CA yet ({} does not exist)", self.file.display()));
        };
        verifier.verify_client_cert(leaf, intermediates, at).map(|_| current.generation).map_err(|e| {
            format!("the client certificate no longer verifies with the gate's client CAs ({e}): reconnect with a certificate of the CA in force")
        })
    }

    fn algorithms(&self) -> &WebPkiSupportedAlgorithms {
        &self.provider.signature_verification_algorithms
    }
}

/// The directory to watch for `file` (a ConfigMap's mount: the kubelet swaps its `..data`).
fn watched_dir(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn read_bundle(file: &Path) -> Result<Vec<u8>, String> {
    let size = std::fs::metadata(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?.len();
    if size > MAX_BUNDLE_BYTES {
        return Err(format!("{}: {size} bytes, more than a CA bundle's {MAX_BUNDLE_BYTES}", file.display()));
    }
    std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

fn count_certificates(bundle: &[u8]) -> usize {
    CertificateDer::pem_slice_iter(bundle).filter(Result::is_ok).count()
}

/// A verifier for the CAs of a PEM bundle: at least one, every one a certificate webpki
/// accepts as a trust anchor.
fn verifier(bundle: &[u8], provider: &Arc<CryptoProvider>) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let mut roots = RootCertStore::empty();
    for (i, cert) in CertificateDer::pem_slice_iter(bundle).enumerate() {
        let cert = cert.map_err(|e| format!("certificate {} of the bundle is not PEM: {e}", i + 1))?;
        if i >= MAX_CAS {
            return Err(format!("the bundle holds more than {MAX_CAS} certificates"));
        }
        roots.add(cert).map_err(|e| format!("certificate {} of the bundle is not a CA certificate: {e}", i + 1))?;
    }
    if roots.is_empty() {
        return Err(
            "the bundle holds no certificate (expected PEM CERTIFICATE blocks: the ConfigMap keyward-client-ca's ca.crt)"
                .into(),
        );
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| format!("cannot verify with this bundle: {e}"))
}

impl ReloadSource for ClientCa {
    fn dir(&self) -> &Path {
        &self.dir
    }

    fn reload(&self, _trigger: Trigger) {
        self.reload_now();
    }
}

// === impl ClientCertVerifier ===

impl ClientCertVerifier for ClientCa {
    fn offer_client_auth(&self) -> bool {
        true
    }

    /// A caller may present a token instead; the rules decide what each identity may do.
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    /// No hints: the bundle changes under the server, and a client with one certificate sends
    /// it whatever the hints (Go sends its only certificate when the list is empty).
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match &self.current.load().verifier {
            Some(verifier) => verifier.verify_client_cert(end_entity, intermediates, now),
            // Refused as a certificate of an unknown CA: there is none yet.
            None => Err(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, self.algorithms())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, self.algorithms())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms().supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_is_read_whole_and_a_bad_one_is_refused_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ca.crt");
        std::fs::write(&file, "").unwrap();
        let err = ClientCa::load(&file).unwrap_err();
        assert!(err.ends_with("the bundle holds no certificate (expected PEM CERTIFICATE blocks: the ConfigMap keyward-client-ca's ca.crt)"), "{err}");
        let missing = ClientCa::load(&dir.path().join("nope.crt")).unwrap_err();
        assert!(missing.starts_with("cannot read "), "{missing}");

        let now = std::time::SystemTime::now();
        let day = std::time::Duration::from_secs(86_400);
        let old = keyward_certs::pki::Ca::mint("old client CA", now, day).unwrap();
        let new = keyward_certs::pki::Ca::mint("new client CA", now, day).unwrap();
        std::fs::write(&file, old.cert_pem()).unwrap();
        let ca = ClientCa::load(&file).unwrap();
        assert_eq!(ca.reload_now(), Reload::Unchanged);
        // The rotation: both CAs, then a bundle that is not one (kept the last good).
        std::fs::write(&file, format!("{}{}", old.cert_pem(), new.cert_pem())).unwrap();
        assert_eq!(ca.reload_now(), Reload::Loaded(2));
        std::fs::write(&file, "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n").unwrap();
        assert!(matches!(ca.reload_now(), Reload::Failed(e) if e.contains("certificate 1 of the bundle")));
        assert_eq!(ca.current.load().bundle, format!("{}{}", old.cert_pem(), new.cert_pem()).into_bytes());
    }

    /// Only a file that does not exist is awaited; any other failure to read it stops the gate.
    #[test]
    fn only_a_missing_bundle_is_awaited() {
        let dir = tempfile::tempdir().unwrap();
        let missing = ClientCa::load_or_await(&dir.path().join("ca.crt")).unwrap();
        assert!(!missing.is_loaded());
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, "x").unwrap();
        let err = ClientCa::load_or_await(&not_a_dir.join("ca.crt")).unwrap_err();
        assert!(err.starts_with("cannot read "), "{err}");
        std::fs::write(dir.path().join("ca.crt"), "").unwrap();
        let empty = ClientCa::load_or_await(&dir.path().join("ca.crt")).unwrap_err();
        assert!(empty.contains("the bundle holds no certificate"), "{empty}");
        // Loaded, then gone: a failure (the last good bundle kept), not an awaited file.
        let ca = keyward_certs::pki::Ca::mint(
            "client CA",
            std::time::SystemTime::now(),
            std::time::Duration::from_secs(86_400),
        )
        .unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.cert_pem()).unwrap();
        let loaded = ClientCa::load_or_await(&dir.path().join("ca.crt")).unwrap();
        assert!(loaded.is_loaded());
        std::fs::remove_file(dir.path().join("ca.crt")).unwrap();
        assert!(matches!(loaded.reload_now(), Reload::Failed(e) if e.starts_with("cannot read ")));
        assert!(loaded.is_loaded());
    }

    #[test]
    fn the_bundle_is_read_within_its_bound_watched_in_its_directory_and_counted_in_generations() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ca.crt");
        let now = std::time::SystemTime::now();
        let ca = keyward_certs::pki::Ca::mint("client CA", now, std::time::Duration::from_secs(86_400)).unwrap();
        // Exactly the bound is read (and refused for what it holds); a byte more is not read.
        let padded = |len: usize| {
            let mut text = ca.cert_pem().to_string().into_bytes();
            text.resize(len, b'\n');
            text
        };
        std::fs::write(&file, padded(1024 * 1024)).unwrap();
        let loaded = ClientCa::load(&file).unwrap();
        std::fs::write(&file, padded(1024 * 1024 + 1)).unwrap();
        assert!(
            matches!(loaded.reload_now(), Reload::Failed(e) if e.ends_with("1048577 bytes, more than a CA bundle's 1048576"))
        );
        assert_eq!(loaded.generation(), 1);
        std::fs::write(&file, ca.cert_pem()).unwrap();
        // The watch's reload is the same reload.
        ReloadSource::reload(&loaded, Trigger::Poll);
        assert_eq!(loaded.generation(), 2, "a new bundle is a new generation");
        assert_eq!(loaded.reload_now(), Reload::Unchanged);
        assert_eq!(loaded.generation(), 2, "the same bundle is not");
        assert_eq!(ReloadSource::dir(&loaded), dir.path());
        assert_eq!(watched_dir(Path::new("ca.crt")), Path::new("."));
        assert!(format!("{loaded:?}").contains("ca.crt"));
    }

    #[test]
    fn expired_and_rotated_out_certificates_are_found_on_the_next_request() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ca.crt");
        let now = std::time::SystemTime::now();
        let day = std::time::Duration::from_secs(86_400);
        let old = keyward_certs::pki::Ca::mint("old client CA", now, day).unwrap();
        let new = keyward_certs::pki::Ca::mint("new client CA", now, day).unwrap();
        std::fs::write(&file, old.cert_pem()).unwrap();
        let ca = ClientCa::load(&file).unwrap();
        let leaf = old.issue_client_identity(&[], "spiffe://td/ns/a/job/j", now, day).unwrap();
        let chain = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()];
        let not_after = crate::serve::connections::not_after(&chain[0]);
        assert!(not_after.is_some_and(|t| t > now));
        // Verified at the handshake under generation 1: only its time is checked while it lasts.
        assert_eq!(ca.still_trusts(&chain, 1, not_after, now), Ok(1));
        let later = now + day + std::time::Duration::from_secs(1);
        assert_eq!(
            ca.still_trusts(&chain, 1, not_after, later),
            Err("the client certificate has expired: reconnect with the renewed one".into())
        );
        // A bundle with the old CA still: verified again, and good under the new generation.
        std::fs::write(&file, format!("{}{}", old.cert_pem(), new.cert_pem())).unwrap();
        ca.reload_now();
        assert_eq!(ca.still_trusts(&chain, 1, not_after, now), Ok(2));
        // The old CA rotated out: no longer good, whatever its validity.
        std::fs::write(&file, new.cert_pem()).unwrap();
        ca.reload_now();
        let e = ca.still_trusts(&chain, 2, not_after, now).unwrap_err();
        assert!(e.starts_with("the client certificate no longer verifies with the gate's client CAs"), "{e}");
        assert_eq!(ca.still_trusts(&[], 3, None, now), Err("no client certificate".into()));
    }
}
