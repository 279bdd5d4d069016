//! The admission attestation: proof on a pod that keyward's webhook admitted it under its
//! profile's requester rules, which the controller checks before it issues anything for the
//! pod's owner. Anyone who can create a pod can write its labels, annotations and owner
//! references; only the webhook holds the key this proof needs.
//!
//! The engine holds no key and does no cryptography: it builds the bytes to sign
//! ([`payload`]) and asks an [`Attestor`] (the binary's, keyed from a mounted Secret) for the
//! annotation value. The controller rebuilds the same bytes from the stored pod and checks
//! them with the same keys.

use std::fmt;

/// The annotation holding the attestation: `v1.<key id>.<base64url HMAC-SHA256>`.
pub const ANNOTATION_ATTESTATION: &str = "keyward.io/attestation";

/// Signs and checks attestations. Implemented where the key is (the binary, the controller).
pub trait Attestor: Send + Sync + fmt::Debug {
    /// The annotation value attesting `payload` with the current key, or `None` when no key
    /// is loaded.
    fn attest(&self, payload: &[u8]) -> Option<String>;
    /// Whether `value` attests `payload` under a key this attestor accepts.
    fn verifies(&self, payload: &[u8], value: &str) -> bool;
}

/// What an attestation binds, as the webhook sees it on admission and the controller on the
/// stored pod: the namespace, the controller owner (API group, kind, name, UID), the profile,
/// and keyward's audit record of what it injected. Each field is length-prefixed, so no two
/// different inputs give the same bytes.
pub fn payload(namespace: &str, owner: &OwnerRef<'_>, profile: &str, injected: &str) -> Vec<u8> {
    let fields = [namespace, owner.group, owner.kind, owner.name, owner.uid, profile, injected];
    let mut out = Vec::with_capacity(16 + fields.iter().map(|f| f.len() + 8).sum::<usize>());
    out.extend_from_slice(b"keyward-attestation-v1");
    for field in fields {
        out.extend_from_slice(&(field.len() as u64).to_be_bytes());
        out.extend_from_slice(field.as_bytes());
    }
    out
}

/// The controller owner an attestation names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerRef<'a> {
    /// The API group (`""` for the core group), not the version: an owner served at another
    /// version is the same object.
    pub group: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_cannot_run_into_each_other() {
        let owner = |name| OwnerRef { group: "g", kind: "Job", name, uid: "u" };
        let a = payload("ns", &owner("ab"), "p", "{}");
        let b = payload("nsa", &owner("b"), "p", "{}");
        assert_ne!(a, b);
        assert_eq!(a, payload("ns", &owner("ab"), "p", "{}"));
        assert!(a.starts_with(b"keyward-attestation-v1"));
    }
}
