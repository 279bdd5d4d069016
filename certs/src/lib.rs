//! keyward's certificates: the PKI it mints with rcgen, the checks every PEM pair goes through
//! before it is served, and the hot-reloading store behind the rustls server.
//!
//! - [`pem`]: parse `tls.crt` + `tls.key`, check the key matches the leaf, the chain order and
//!   the validity window.
//! - [`attestation`]: the admission attestation's HMAC keys, hot-reloaded from a directory.
//! - [`inspect`]: what a certificate file or directory holds, and whether a TLS peer accepts it.
//! - [`keys`]: private keys in PKCS#8, SEC1 or PKCS#1, as the PKCS#8 that rcgen signs with.
//! - [`pki`]: mint a development CA and serving certificate (ECDSA P-256), and keep them in a
//!   directory, reusing them while they are valid.
//! - [`store`]: the certificate rustls serves, swapped atomically when the directory changes
//!   (watched and polled), never replaced by a bad one.

#![warn(unreachable_pub)]

pub mod attestation;
mod error;
pub mod inspect;
pub mod keys;
pub mod pem;
pub mod pki;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::{parse_rfc3339, rfc3339, Error};
pub use pem::{CertInfo, PemPair, ServingCert};
pub use rcgen::DnType;
pub use store::{watch, CertStore, ReloadEvent, ReloadOutcome, ReloadSource, Trigger};

/// The file names of a cert-manager (`kubernetes.io/tls`) Secret mounted as a volume.
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";
pub const CA_FILE: &str = "ca.crt";
