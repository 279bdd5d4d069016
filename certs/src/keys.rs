//! Private keys in every encoding that cert-manager, openssl and Go write, as PKCS#8.
//!
//! rustls reads PKCS#8, SEC1 (`EC PRIVATE KEY`) and PKCS#1 (`RSA PRIVATE KEY`) for serving,
//! but rcgen, built on ring, signs only with PKCS#8. cert-manager writes SEC1 for ECDSA and
//! PKCS#1 for RSA unless a Certificate says `privateKey.encoding: PKCS8`, so a CA key is
//! re-wrapped here: PKCS#8 is a header (the algorithm and, for EC, the curve) around the same
//! SEC1 or PKCS#1 structure (RFC 5208, RFC 5915 §3, RFC 8017 A.1.2).

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use yasna::models::ObjectIdentifier;
use yasna::Tag;

use crate::error::Error;

const EC_PUBLIC_KEY: &[u64] = &[1, 2, 840, 10045, 2, 1];
const RSA_ENCRYPTION: &[u64] = &[1, 2, 840, 113549, 1, 1, 1];
const P256: &[u64] = &[1, 2, 840, 10045, 3, 1, 7];
const P384: &[u64] = &[1, 3, 132, 0, 34];

/// The first private key in `pem` (PKCS#8, SEC1 or PKCS#1), as PKCS#8. `path` is for messages.
pub fn pkcs8_from_pem(pem: &[u8], path: &Path) -> Result<PrivatePkcs8KeyDer<'static>, Error> {
    let key = PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| Error::NoKey { path: path.to_path_buf(), reason: crate::pem::pem_error(&e) })?;
    to_pkcs8(&key, path)
}

/// `key` as PKCS#8.
pub fn to_pkcs8(key: &PrivateKeyDer<'_>, path: &Path) -> Result<PrivatePkcs8KeyDer<'static>, Error> {
    match key {
        PrivateKeyDer::Pkcs8(k) => Ok(k.clone_key()),
        PrivateKeyDer::Pkcs1(k) => Ok(wrap(RSA_ENCRYPTION, None, k.secret_pkcs1_der())),
        PrivateKeyDer::Sec1(k) => {
            let der = k.secret_sec1_der();
            let unsupported = |reason: &str| Error::UnsupportedKey { path: path.to_path_buf(), reason: reason.into() };
            let sec1 = read_sec1(der).ok_or_else(|| unsupported("the EC PRIVATE KEY (SEC1) is not valid DER"))?;
            let curve = sec1.curve.ok_or_else(|| {
                unsupported(
                    "the EC PRIVATE KEY (SEC1) names no curve keyward knows (P-256 or P-384); issue an ECDSA P-256 key",
                )
            })?;
            if !sec1.has_public_key {
                // ring needs the public key beside the private one, as Go and openssl write it.
                return Err(unsupported(
                    "the EC PRIVATE KEY (SEC1) has no public key, which keyward needs; write it with one (openssl ec -in KEY -out KEY) or as PKCS#8 (openssl pkcs8 -topk8 -nocrypt -in KEY)",
                ));
            }
            Ok(wrap(EC_PUBLIC_KEY, Some(curve), der))
        }
        _ => Err(Error::UnsupportedKey {
            path: path.to_path_buf(),
            reason: "not a PKCS#8, SEC1 or PKCS#1 private key".into(),
        }),
    }
}

/// PrivateKeyInfo ::= SEQUENCE { version 0, AlgorithmIdentifier, privateKey OCTET STRING }
fn wrap(algorithm: &[u64], curve: Option<&[u64]>, inner: &[u8]) -> PrivatePkcs8KeyDer<'static> {
    let der = yasna::construct_der(|w| {
        w.write_sequence(|w| {
            w.next().write_u8(0);
            w.next().write_sequence(|w| {
                w.next().write_oid(&ObjectIdentifier::from_slice(algorithm));
                match curve {
                    Some(curve) => w.next().write_oid(&ObjectIdentifier::from_slice(curve)),
                    // RSA's parameters are an explicit NULL.
                    None => w.next().write_null(),
                }
            });
            w.next().write_bytes(inner);
        })
    });
    PrivatePkcs8KeyDer::from(der)
}

/// What keyward needs to know of a SEC1 ECPrivateKey.
struct Sec1 {
    /// Its `parameters` when present (Go and openssl always write them), else guessed from
    /// the private key's length.
    curve: Option<&'static [u64]>,
    has_public_key: bool,
}

/// ECPrivateKey ::= SEQUENCE { version 1, privateKey OCTET STRING,
///   parameters [0] ECParameters OPTIONAL, publicKey [1] BIT STRING OPTIONAL }
fn read_sec1(der: &[u8]) -> Option<Sec1> {
    let (private_len, named, public) = yasna::parse_der(der, |r| {
        r.read_sequence(|r| {
            let _version = r.next().read_u8()?;
            let private = r.next().read_bytes()?;
            let named = r.read_optional(|r| r.read_tagged(Tag::context(0), |r| r.read_oid()))?;
            let public = r.read_optional(|r| r.read_tagged(Tag::context(1), |r| r.read_bitvec_bytes()))?;
            Ok((private.len(), named, public))
        })
    })
    .ok()?;
    let curve = match named {
        Some(oid) => [P256, P384].into_iter().find(|c| oid.components().as_slice() == *c),
        None => match private_len {
            32 => Some(P256),
            48 => Some(P384),
            _ => None,
        },
    };
    Some(Sec1 { curve, has_public_key: public.is_some() })
}
