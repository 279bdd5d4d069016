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
    verifier: Arc<dyn ClientCertVerifier>,
    /// The bundle's bytes, to tell a change from a poll that finds the same file.
    bundle: Vec<u8>,
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
        let dir = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok(Self {
            file: file.to_path_buf(),
            dir,
            provider,
            current: ArcSwap::from_pointee(Loaded { verifier, bundle }),
            observer: None,
        })
    }

    pub fn with_observer(mut self, observer: impl Fn(&Reload) + Send + Sync + 'static) -> Self {
        self.observer = Some(Box::new(observer));
        self
    }

    /// Reads the bundle again; keeps the one it has when the new one is refused.
    pub fn reload_now(&self) -> Reload {
        let outcome = match read_bundle(&self.file) {
            Ok(bundle) if bundle == self.current.load().bundle => Reload::Unchanged,
            Ok(bundle) => match verifier(&bundle, &self.provider) {
                Ok(verifier) => {
                    let count = count_certificates(&bundle);
                    self.current.store(Arc::new(Loaded { verifier, bundle }));
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

    fn algorithms(&self) -> &WebPkiSupportedAlgorithms {
        &self.provider.signature_verification_algorithms
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
        self.current.load().verifier.verify_client_cert(end_entity, intermediates, now)
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
}
