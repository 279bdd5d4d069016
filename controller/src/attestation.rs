//! The admission attestation as the controller checks it (pure): what a stored pod's
//! attestation must hold for ([`Evidence`]), and which of several pods carrying one
//! attestation is the pod the webhook admitted ([`first_of_its_attestation`]).
//!
//! The value and the payload are the engine's (`keyward_engine::attest`), the HMAC keys
//! keyward-certs'. What no pod creator can forge: the tag (only the webhook and the controller
//! hold the key), the pod's binding (recomputed here from what the pod runs and mounts), and the
//! pod's `creationTimestamp` (set by the apiserver after admission; a client's is wiped).

use keyward_certs::attestation::{nonce, Keys};
use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use keyward_engine::attest::{self, Signature, Verdict};

use keyward_engine::binding::Digest32;

/// The engine's attestor over keyward-certs' keys: signs with the current key, accepts the
/// current and the previous one, stamps with the system clock and a random nonce. `K` is the
/// keys or a handle on them (the webhook's `Arc<Keys>` of the moment, from its hot-reloaded
/// store).
#[derive(Debug, Clone)]
pub struct KeysAttestor<K = Keys>(pub K);

impl<K: Borrow<Keys> + Send + Sync + fmt::Debug> keyward_engine::Attestor for KeysAttestor<K> {
    fn now(&self) -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs()
    }

    fn nonce(&self) -> String {
        nonce()
    }

    fn sign(&self, payload: &[u8]) -> Option<Signature> {
        self.0.borrow().sign(payload).map(|(key_id, tag)| Signature { key_id, tag })
    }

    fn verifies(&self, payload: &[u8], key_id: &str, tag: &str) -> bool {
        self.0.borrow().verify(payload, key_id, tag)
    }
}

/// What a stored pod's attestation is checked against: everything but the keys, worked out
/// when the pod arrives (the keys may rotate before it is checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// The pod's `keyward.io/attestation`.
    pub value: Option<String>,
    pub namespace: String,
    /// The pod's `keyward.io/injected` record (shared: the pods of one profile mostly carry
    /// the same record, and the index keeps one copy of each; see `PodIndex`).
    pub injected: Arc<str>,
    /// What the pod runs and mounts, bound as the webhook binds it.
    pub binding: Digest32,
    /// The pod's `creationTimestamp`, Unix seconds.
    pub created: Option<u64>,
}

impl Evidence {
    /// Whether the attestation holds for this pod of `owner` under `profile`, with `keys`.
    pub fn check(&self, owner: attest::OwnerRef<'_>, profile: &str, keys: &Keys) -> Verdict {
        let subject = attest::Subject { namespace: &self.namespace, owner, profile, injected: &self.injected };
        attest::check(self.value.as_deref(), &subject, &self.binding, self.created, |p, id, tag| {
            keys.verify(p, id, tag)
        })
    }
}

/// Says why a verdict other than `Valid` refuses the pod, for an Event or a denial.
pub fn refusal_note(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Valid => "its admission attestation holds".into(),
        Verdict::Missing => "it carries no admission attestation (keyward.io/attestation): keyward's webhook did not admit it as a pod of this profile (created before its namespace opted in, while the webhook was down, or selected only by labels added later)".into(),
        Verdict::Malformed(why) => format!("its admission attestation (keyward.io/attestation) cannot be read: {why}"),
        Verdict::Forged => "its admission attestation (keyward.io/attestation) does not verify: keyward's webhook did not write it for this namespace, owner, profile and injection, or its key has been rotated out".into(),
        Verdict::Rebound => "its admission attestation (keyward.io/attestation) was made for a pod that runs or mounts something else (copied from another pod, or this pod was changed by another webhook after keyward's last look)".into(),
        Verdict::Untimely { at, created: Some(created) } => format!(
            "its admission attestation (keyward.io/attestation) was made at {} but the pod was created at {}, more than {} s apart: it was copied from a pod admitted earlier (or the webhook's and the apiserver's clocks disagree that much)",
            keyward_certs::rfc3339(unix(*at)),
            keyward_certs::rfc3339(unix(*created)),
            attest::WINDOW_SECONDS
        ),
        Verdict::Untimely { .. } => "the pod has no creationTimestamp to check its admission attestation's time against".into(),
    }
}

fn unix(seconds: u64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_secs(seconds)
}

/// A pod as far as telling copies apart needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sibling {
    pub name: String,
    pub uid: String,
    pub attestation: Option<String>,
    pub created: Option<u64>,
    /// Its attestation holds for it: a pod whose does not (a copy onto another pod, say) is
    /// served to no one, so it can take nothing from the pod it was copied from.
    pub holds: bool,
}

impl Sibling {
    /// The pod `name` (`uid`) with `evidence`, whose attestation `holds` or not.
    pub fn of(name: &str, uid: &str, evidence: &Evidence, holds: bool) -> Self {
        Self {
            name: name.to_string(),
            uid: uid.to_string(),
            attestation: evidence.value.clone(),
            created: evidence.created,
            holds,
        }
    }
}

/// Whether `me` is the pod its attestation was made for, among `others` (pods of its owner):
/// an attestation is for one pod, so of the live pods carrying it (and for which it holds) only
/// the one created first is served. `Err` says which pod came first, or that two came in the same second (then keyward
/// cannot tell the copy and serves neither). A pod with no attestation, or the only one with
/// its attestation, is `Ok`.
pub fn first_of_its_attestation<'a>(me: &Sibling, others: impl IntoIterator<Item = &'a Sibling>) -> Result<(), String> {
    let Some(value) = &me.attestation else { return Ok(()) };
    let mut tie = None;
    for other in others {
        if other.uid == me.uid || !other.holds || other.attestation.as_ref() != Some(value) {
            continue;
        }
        match (other.created, me.created) {
            // A pod without a creation time (never one the apiserver stored) is served to no
            // one, and first to no one.
            (None, Some(_)) => {}
            (Some(theirs), Some(mine)) if theirs > mine => {}
            (Some(theirs), Some(mine)) if theirs == mine => tie = Some(other),
            _ => {
                return Err(format!(
                    "pod {} carries the same admission attestation and was created first: an attestation is for the one pod keyward's webhook admitted, and this one is a copy",
                    other.name
                ))
            }
        }
    }
    match tie {
        Some(other) => Err(format!(
            "pod {} carries the same admission attestation and was created in the same second: an attestation is for one pod, and keyward cannot tell which is the copy, so it serves neither",
            other.name
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, value: Option<&str>, created: Option<u64>) -> Sibling {
        Sibling {
            name: name.into(),
            uid: format!("uid-{name}"),
            attestation: value.map(Into::into),
            created,
            holds: true,
        }
    }

    #[test]
    fn of_two_pods_with_one_attestation_only_the_first_is_served() {
        let original = pod("driver", Some("v2.a"), Some(100));
        let copy = pod("copy", Some("v2.a"), Some(160));
        let sibling = pod("driver-retry", Some("v2.b"), Some(90));
        let all = [original.clone(), copy.clone(), sibling.clone()];
        assert_eq!(first_of_its_attestation(&original, &all), Ok(()));
        assert_eq!(
            first_of_its_attestation(&copy, &all),
            Err("pod driver carries the same admission attestation and was created first: an attestation is for the one pod keyward's webhook admitted, and this one is a copy".into())
        );
        assert_eq!(first_of_its_attestation(&sibling, &all), Ok(()), "another attestation is another pod");
        // The same second: neither.
        let twin = pod("twin", Some("v2.a"), Some(100));
        let both = [original.clone(), twin.clone()];
        // (The message says so: it is not "created first". Guards the mutant that drops the tie.)
        let same_second = "carries the same admission attestation and was created in the same second";
        assert!(first_of_its_attestation(&original, &both)
            .unwrap_err()
            .starts_with(&format!("pod twin {same_second}")));
        assert!(first_of_its_attestation(&twin, &both).unwrap_err().starts_with(&format!("pod driver {same_second}")));
        // A pod with no creation time is first to no one.
        let timeless = pod("timeless", Some("v2.a"), None);
        assert!(first_of_its_attestation(&timeless, std::slice::from_ref(&original)).is_err());
        assert_eq!(first_of_its_attestation(&original, &[timeless]), Ok(()));
        // A copy its attestation does not hold for (another image, say) takes nothing, even
        // created in the same second as the original.
        let rebound = Sibling { holds: false, ..pod("rebound", Some("v2.a"), Some(100)) };
        assert_eq!(first_of_its_attestation(&original, &[rebound.clone(), original.clone()]), Ok(()));
        assert_eq!(first_of_its_attestation(&copy, &[rebound]), Ok(()), "only pods it holds for count");
        // No attestation: nothing to compare.
        assert_eq!(first_of_its_attestation(&pod("bare", None, Some(1)), &all), Ok(()));
    }

    /// The webhook's clock at admission is the system's (Unix seconds): the controller's time
    /// window is measured from it. Guards the mutants that replace `now`, `nonce` or
    /// `verifies` by a constant, which the controller's own tests (stamping pods from the
    /// attestation they make, verifying with `Keys` directly) could not notice.
    #[test]
    fn the_attestor_stamps_with_the_system_clock_and_fresh_nonces() {
        use keyward_engine::Attestor as _;
        let attestor = KeysAttestor(Keys::default());
        let system = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let (before, now, after) = (system(), attestor.now(), system());
        assert!(before <= now && now <= after, "{before} <= {now} <= {after}");
        assert_ne!(attestor.nonce(), attestor.nonce());
        // No key, nothing signed, nothing verifies.
        assert_eq!(attestor.sign(b"payload"), None);
        assert!(!attestor.verifies(b"payload", "00", "dGFn"));
        // With one, what it signs verifies, and only for that payload (the webhook checks a
        // pod's attestation with it on reinvocation).
        let key = keyward_certs::attestation::Key::from_bytes(&[9; 32], "k").unwrap();
        let keyed = KeysAttestor(Keys { current: Some(key), previous: None });
        let signature = keyed.sign(b"payload").unwrap();
        assert!(keyed.verifies(b"payload", &signature.key_id, &signature.tag));
        assert!(!keyed.verifies(b"another", &signature.key_id, &signature.tag));
    }
}
