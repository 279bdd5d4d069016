//! The admission attestation: proof on a pod that keyward's webhook admitted *this* pod under
//! its profile's requester rules, which the controller checks before it issues anything for the
//! pod's owner. Anyone who can create a pod can write its labels, annotations and owner
//! references, and anyone who can read a pod can copy them; only the webhook holds the key this
//! proof needs, and the proof is bound to what the pod runs and mounts ([`crate::binding`]),
//! to when it was admitted, and to a nonce no other admission has.
//!
//! The engine holds no key and does no cryptography beyond the binding's digest: it builds the
//! bytes to sign ([`payload`]) and writes and reads the annotation's value ([`format`],
//! [`parse`]); an [`Attestor`] (the binary's, keyed from a mounted Secret) computes and checks
//! the MAC. The controller rebuilds the same bytes from the stored pod and checks them with the
//! same keys ([`check`]).
//!
//! The value: `v2.<key id>.<admitted at>.<nonce>.<binding>.<tag>`: the key id (hex), the
//! webhook's clock at admission (Unix seconds), a nonce (base64url), the binding (base64url
//! SHA-256) and the HMAC-SHA256 tag (base64url) over the payload, which holds all of them.

use std::fmt;

use base64::Engine as _;

use crate::binding::Digest32;

pub use crate::audit::ANNOTATION_ATTESTATION;

/// The version of the value this build writes and accepts.
const VERSION: &str = "v2";

/// How far apart the webhook's clock at admission and the pod's `creationTimestamp` (the
/// apiserver's clock, set right after mutating admission) may be: clock skew plus a slow
/// admission chain. A copy of an attestation onto a pod created later than this is refused.
pub const WINDOW_SECONDS: u64 = 300;

/// When and as what an attestation was made: the webhook's clock, and a nonce no other
/// attestation has (so that two pods admitted alike in the same second still differ, and two
/// pods carrying one attestation are one pod and a copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// Unix seconds.
    pub at: u64,
    /// 1 to 64 of `A-Z a-z 0-9 - _`.
    pub nonce: String,
}

/// A MAC made by an [`Attestor`]: the key's id and the tag, both as they go into the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// Lower-case hex.
    pub key_id: String,
    /// base64url, no padding.
    pub tag: String,
}

/// Signs and checks attestations. Implemented where the key is (the binary, the controller).
pub trait Attestor: Send + Sync + fmt::Debug {
    /// The clock, Unix seconds: an attestation made now is stamped with it, and one a pod
    /// carries is checked against it.
    fn now(&self) -> u64;
    /// A nonce no other attestation has (random), drawn only for a new attestation.
    fn nonce(&self) -> String;
    /// The MAC of `payload` with the current key, or `None` when no key is loaded.
    fn sign(&self, payload: &[u8]) -> Option<Signature>;
    /// Whether `tag` is the MAC of `payload` under the key `key_id`, if that is a key this
    /// attestor accepts (compared in constant time).
    fn verifies(&self, payload: &[u8], key_id: &str, tag: &str) -> bool;
}

/// What an attestation is about, besides the pod's binding: the namespace, the controller
/// owner, the profile, and keyward's audit record of what it injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subject<'a> {
    pub namespace: &'a str,
    pub owner: OwnerRef<'a>,
    pub profile: &'a str,
    pub injected: &'a str,
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

/// The bytes an attestation's tag is the MAC of. Each field is length-prefixed, so no two
/// different inputs give the same bytes.
pub fn payload(subject: &Subject<'_>, at: u64, nonce: &str, binding: &Digest32) -> Vec<u8> {
    let at = at.to_string();
    let o = &subject.owner;
    let fields: [&[u8]; 10] = [
        subject.namespace.as_bytes(),
        o.group.as_bytes(),
        o.kind.as_bytes(),
        o.name.as_bytes(),
        o.uid.as_bytes(),
        subject.profile.as_bytes(),
        subject.injected.as_bytes(),
        at.as_bytes(),
        nonce.as_bytes(),
        binding,
    ];
    let mut out = Vec::with_capacity(32 + fields.iter().map(|f| f.len() + 8).sum::<usize>());
    out.extend_from_slice(b"keyward-attestation-v2");
    for field in fields {
        out.extend_from_slice(&(field.len() as u64).to_be_bytes());
        out.extend_from_slice(field);
    }
    out
}

/// The annotation's value.
pub fn format(signature: &Signature, stamp: &Stamp, binding: &Digest32) -> String {
    format!(
        "{VERSION}.{}.{}.{}.{}.{}",
        signature.key_id,
        stamp.at,
        stamp.nonce,
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(binding),
        signature.tag
    )
}

/// An attestation's value, read (not yet checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a> {
    pub key_id: &'a str,
    pub at: u64,
    pub nonce: &'a str,
    pub binding: Digest32,
    pub tag: &'a str,
}

/// Reads a value; `Err` says what is wrong with it (for the refusal's message).
pub fn parse(value: &str) -> Result<Parsed<'_>, String> {
    let parts: Vec<&str> = value.split('.').collect();
    if parts.first() == Some(&"v1") {
        return Err("it is a v1 attestation, made before attestations were bound to the pod they are on".into());
    }
    let [VERSION, key_id, at, nonce, binding, tag] = parts.as_slice() else {
        return Err(format!("it is not {VERSION}.<key id>.<time>.<nonce>.<binding>.<tag>"));
    };
    let hex = |s: &str| !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let b64 = |s: &str| {
        !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if !hex(key_id) || !b64(nonce) || nonce.len() > 64 || !b64(tag) {
        return Err("its key id, nonce or tag is malformed".into());
    }
    let at = at.parse::<u64>().map_err(|_| "its time is not a number of seconds".to_string())?;
    let binding: Digest32 = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(binding)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| "its binding is not a SHA-256 digest".to_string())?;
    Ok(Parsed { key_id, at, nonce, binding, tag })
}

/// Whether an attestation holds for a pod, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Valid,
    /// The pod carries none.
    Missing,
    /// It carries one this build cannot read (malformed, or a v1 one), and why.
    Malformed(String),
    /// The tag does not verify: not made by keyward's webhook for this namespace, owner,
    /// profile and injection, or its key has been rotated out.
    Forged,
    /// keyward's webhook made it, for a pod that runs or mounts something else: copied onto
    /// this pod, or the pod changed after keyward's last look (another webhook, say).
    Rebound,
    /// keyward's webhook made it at `at`, but this pod was created at `created` (Unix
    /// seconds; `None`: the pod has no creation time), further apart than [`WINDOW_SECONDS`].
    Untimely {
        at: u64,
        created: Option<u64>,
    },
}

/// Checks `value` (the pod's attestation) for `subject`: the tag with `verifies`, then the
/// binding against `binding` (the pod's, computed now), then the time against `created` (the
/// pod's `creationTimestamp`, Unix seconds).
pub fn check(
    value: Option<&str>,
    subject: &Subject<'_>,
    binding: &Digest32,
    created: Option<u64>,
    verifies: impl Fn(&[u8], &str, &str) -> bool,
) -> Verdict {
    let Some(value) = value else { return Verdict::Missing };
    let parsed = match parse(value) {
        Ok(p) => p,
        Err(why) => return Verdict::Malformed(why),
    };
    if !verifies(&payload(subject, parsed.at, parsed.nonce, &parsed.binding), parsed.key_id, parsed.tag) {
        return Verdict::Forged;
    }
    if parsed.binding != *binding {
        return Verdict::Rebound;
    }
    match created {
        Some(c) if c.abs_diff(parsed.at) <= WINDOW_SECONDS => Verdict::Valid,
        _ => Verdict::Untimely { at: parsed.at, created },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(name: &str) -> Subject<'_> {
        Subject {
            namespace: "ns",
            owner: OwnerRef { group: "g", kind: "Job", name, uid: "u" },
            profile: "p",
            injected: "{}",
        }
    }

    #[test]
    fn fields_cannot_run_into_each_other() {
        let a = payload(&Subject { namespace: "ns", ..subject("ab") }, 1, "n", &[0; 32]);
        let b = payload(&Subject { namespace: "nsa", ..subject("b") }, 1, "n", &[0; 32]);
        assert_ne!(a, b);
        assert_eq!(a, payload(&subject("ab"), 1, "n", &[0; 32]));
        assert_ne!(a, payload(&subject("ab"), 11, "n", &[0; 32]));
        assert_ne!(payload(&subject("ab"), 1, "n1", &[0; 32]), payload(&subject("ab"), 11, "n", &[0; 32]));
        assert!(a.starts_with(b"keyward-attestation-v2"));
    }

    #[test]
    fn a_value_reads_back_as_it_was_written() {
        let stamp = Stamp { at: 1_796_000_000, nonce: "AbC-_9".into() };
        let signature = Signature { key_id: "00aabbccddeeff11".into(), tag: "dGFn".into() };
        let value = format(&signature, &stamp, &[7; 32]);
        assert_eq!(value, "v2.00aabbccddeeff11.1796000000.AbC-_9.BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc.dGFn");
        assert_eq!(
            parse(&value),
            Ok(Parsed {
                key_id: "00aabbccddeeff11",
                at: 1_796_000_000,
                nonce: "AbC-_9",
                binding: [7; 32],
                tag: "dGFn"
            })
        );
        let v1 = "v1.0011223344556677.AAAA";
        assert_eq!(
            parse(v1),
            Err("it is a v1 attestation, made before attestations were bound to the pod they are on".into())
        );
        for junk in ["", "v2", "v3.00.1.n.b.t", "v2.00.1.n.b.t.extra"] {
            assert_eq!(parse(junk), Err("it is not v2.<key id>.<time>.<nonce>.<binding>.<tag>".into()), "{junk:?}");
        }
        // Each malformed in one field only, the rest well formed, so that each check is the
        // one that refuses it (issue 27: a mutant that loosened the key id's or the tag's
        // check survived when every junk value was also malformed elsewhere).
        let b = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc";
        let malformed = Err("its key id, nonce or tag is malformed".to_string());
        let long_hex = "a".repeat(65);
        let long_nonce = "n".repeat(65);
        let long_tag = "t".repeat(129);
        for (junk, why) in [
            (format!("v2.zz.1.n.{b}.t"), malformed.clone()),
            (format!("v2.{long_hex}.1.n.{b}.t"), malformed.clone()),
            (format!("v2..1.n.{b}.t"), malformed.clone()),
            (format!("v2.00.1.n!.{b}.t"), malformed.clone()),
            (format!("v2.00.1..{b}.t"), malformed.clone()),
            (format!("v2.00.1.{long_nonce}.{b}.t"), malformed.clone()),
            (format!("v2.00.1.n.{b}.t!"), malformed.clone()),
            (format!("v2.00.1.n.{b}."), malformed.clone()),
            (format!("v2.00.1.n.{b}.{long_tag}"), malformed.clone()),
            (format!("v2.00.x.n.{b}.t"), Err("its time is not a number of seconds".into())),
            ("v2.00.1.n.BwcH.t".to_string(), Err("its binding is not a SHA-256 digest".into())),
        ] {
            assert_eq!(parse(&junk), why, "{junk:?}");
        }
        // At the bounds: a 64-character key id and nonce, a 128-character tag, are read.
        let longest = format!("v2.{}.1.{}.{b}.{}", "a".repeat(64), "n".repeat(64), "t".repeat(128));
        assert!(parse(&longest).is_ok());
    }

    #[test]
    fn check_says_which_property_fails() {
        let s = subject("job1");
        let (at, nonce, binding) = (1_796_000_000, "n0nce", [1u8; 32]);
        let good = payload(&s, at, nonce, &binding);
        let verifies = |p: &[u8], id: &str, tag: &str| p == good.as_slice() && id == "0a" && tag == "T";
        let value =
            format(&Signature { key_id: "0a".into(), tag: "T".into() }, &Stamp { at, nonce: nonce.into() }, &binding);
        assert_eq!(check(Some(&value), &s, &binding, Some(at + 2), verifies), Verdict::Valid);
        assert_eq!(check(None, &s, &binding, Some(at), verifies), Verdict::Missing);
        assert_eq!(check(Some(&value), &subject("job2"), &binding, Some(at), verifies), Verdict::Forged);
        assert_eq!(check(Some(&value), &s, &[2; 32], Some(at), verifies), Verdict::Rebound);
        assert_eq!(check(Some(&value), &s, &binding, Some(at + WINDOW_SECONDS), verifies), Verdict::Valid);
        assert_eq!(check(Some(&value), &s, &binding, Some(at - WINDOW_SECONDS), verifies), Verdict::Valid);
        assert_eq!(
            check(Some(&value), &s, &binding, Some(at + WINDOW_SECONDS + 1), verifies),
            Verdict::Untimely { at, created: Some(at + WINDOW_SECONDS + 1) }
        );
        assert_eq!(check(Some(&value), &s, &binding, None, verifies), Verdict::Untimely { at, created: None });
        assert!(matches!(check(Some("v1.aa.bb"), &s, &binding, Some(at), verifies), Verdict::Malformed(_)));
    }
}
