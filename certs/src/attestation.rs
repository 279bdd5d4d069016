//! The admission attestation's keys: HMAC-SHA256 keys the controller generates and keeps in the
//! Secret `keyward-attestation` (`current`, `previous`: 32 random bytes each), which the webhook
//! reads from a mounted directory, hot-reloaded like its certificate. The webhook signs with
//! `current`; a signature under `current` or `previous` verifies, so a rotation never
//! invalidates a pod attested a moment before it.
//!
//! The attestation's value and payload are the engine's (`keyward_engine::attest`): this module
//! makes and checks the HMAC in it, named by a key id (the first 8 bytes of the key's SHA-256,
//! hex) that picks the key to check with and says nothing about the key itself, and draws the
//! nonce each attestation carries.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use base64::Engine as _;
use ring::hmac;

use crate::error::Error;
use crate::store::{ReloadSource, Trigger};

/// The files of the mounted Secret.
pub const CURRENT_FILE: &str = "current";
pub const PREVIOUS_FILE: &str = "previous";
/// The size of a key, in bytes.
pub const KEY_BYTES: usize = 32;

/// One key and its id.
#[derive(Clone)]
pub struct Key {
    id: String,
    key: hmac::Key,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key").field("id", &self.id).finish_non_exhaustive()
    }
}

impl Key {
    /// A key from its 32 bytes. `what` names it in messages.
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<Self, Error> {
        if bytes.len() != KEY_BYTES {
            return Err(Error::BadKey {
                what: what.into(),
                reason: format!("{} bytes; an attestation key is {KEY_BYTES} random bytes", bytes.len()),
            });
        }
        Ok(Self { id: key_id(bytes), key: hmac::Key::new(hmac::HMAC_SHA256, bytes) })
    }

    pub fn id(&self) -> &str {
        &self.id
    }
}

/// The id of a key: the first 8 bytes of its SHA-256, hex.
pub fn key_id(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// 32 bytes from the system's secure random source: a new key.
pub fn generate() -> Result<[u8; KEY_BYTES], Error> {
    let mut bytes = [0u8; KEY_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| Error::Mint("no system randomness for an attestation key".into()))?;
    Ok(bytes)
}

/// A nonce for one attestation: 12 bytes, base64url (16 characters), never repeated in a
/// process and unpredictable: the HMAC-SHA256 of a process-wide counter under a key drawn from
/// the system's secure random source once (a pseudorandom function of distinct inputs), so that
/// an admission costs no system call for randomness. Should the system refuse randomness (ring
/// documents it as possible, Linux does not do it once booted), a key from the clock and the
/// process id stands in: still never repeated, as the counter is not.
pub fn nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static KEY: OnceLock<hmac::Key> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let key = KEY.get_or_init(|| {
        let mut seed = [0u8; KEY_BYTES];
        if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed).is_err() {
            let nanos =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
            let mixed =
                ring::digest::digest(&ring::digest::SHA256, format!("{nanos}.{}", std::process::id()).as_bytes());
            seed.copy_from_slice(mixed.as_ref());
        }
        hmac::Key::new(hmac::HMAC_SHA256, &seed)
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tag = hmac::sign(key, &n.to_le_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&tag.as_ref()[..12])
}

/// Makes sure `dir/current` holds a key, for development (`keyward serve` without
/// `--tls-dir`): a new random key the first time, kept after that (`0600`).
pub fn ensure_dev_key(dir: &Path) -> Result<(), Error> {
    let path = dir.join(CURRENT_FILE);
    if let Ok(bytes) = std::fs::read(&path) {
        return Key::from_bytes(&bytes, &path.display().to_string()).map(|_| ());
    }
    std::fs::create_dir_all(dir).map_err(|error| Error::Write { path: dir.to_path_buf(), error })?;
    crate::pki::write_file(&path, &generate()?, true)
}

/// The keys in force: the one that signs, and the one before it.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    pub current: Option<Key>,
    pub previous: Option<Key>,
}

impl Keys {
    /// The HMAC of `payload` with the current key: its id, and the tag (base64url).
    pub fn sign(&self, payload: &[u8]) -> Option<(String, String)> {
        let key = self.current.as_ref()?;
        let tag = hmac::sign(&key.key, payload);
        Some((key.id.clone(), base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref())))
    }

    /// Whether `tag` (base64url) is the HMAC of `payload` under the key `key_id`, when that is
    /// the current or the previous key (the whole tag compared, in constant time).
    pub fn verify(&self, payload: &[u8], key_id: &str, tag: &str) -> bool {
        let Ok(tag) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(tag) else {
            return false;
        };
        [&self.current, &self.previous]
            .into_iter()
            .flatten()
            .find(|k| k.id == key_id)
            .is_some_and(|k| hmac::verify(&k.key, payload, &tag).is_ok())
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_none()
    }
}

/// The keys mounted at a directory, reloaded when it changes (see [`crate::watch`]). A file
/// that is not a 32-byte key is refused and the last good keys stay.
pub struct KeyStore {
    dir: PathBuf,
    keys: ArcSwap<Keys>,
    last_error: Mutex<Option<String>>,
}

impl fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyStore").field("dir", &self.dir).field("keys", &self.keys.load()).finish()
    }
}

impl KeyStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), keys: ArcSwap::from_pointee(Keys::default()), last_error: Mutex::new(None) }
    }

    /// The keys in force now.
    pub fn keys(&self) -> Arc<Keys> {
        self.keys.load_full()
    }

    /// `Ok` once a current key is loaded; otherwise why not.
    pub fn ready(&self) -> Result<(), String> {
        if !self.keys.load().is_empty() {
            return Ok(());
        }
        match self.last_error.lock().ok().and_then(|e| e.clone()) {
            Some(e) => Err(format!("no attestation key loaded yet: {e}")),
            None => Err(format!(
                "no attestation key loaded yet from {} (keyward's controller creates the Secret keyward-attestation)",
                self.dir.display()
            )),
        }
    }

    /// Reads the directory; swaps the keys in when they load and differ. Returns whether they
    /// changed, or why they were refused.
    pub fn load(&self) -> Result<bool, Error> {
        let read = |name: &str| -> Result<Option<Key>, Error> {
            let path = self.dir.join(name);
            match std::fs::read(&path) {
                Ok(bytes) => Key::from_bytes(&bytes, &path.display().to_string()).map(Some),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(error) => Err(Error::Read { path, error }),
            }
        };
        let keys = Keys { current: read(CURRENT_FILE)?, previous: read(PREVIOUS_FILE)? };
        if keys.current.is_none() {
            return Err(Error::BadKey {
                what: self.dir.join(CURRENT_FILE).display().to_string(),
                reason: "missing (keyward's controller creates the Secret keyward-attestation; mount it here)".into(),
            });
        }
        let ids = |k: &Keys| (k.current.as_ref().map(|k| k.id.clone()), k.previous.as_ref().map(|k| k.id.clone()));
        let changed = ids(&self.keys.load()) != ids(&keys);
        if changed {
            self.keys.store(Arc::new(keys));
        }
        Ok(changed)
    }
}

impl ReloadSource for KeyStore {
    fn dir(&self) -> &Path {
        &self.dir
    }

    fn reload(&self, trigger: Trigger) {
        let outcome = self.load();
        let mut last = self.last_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match outcome {
            Ok(true) => {
                *last = None;
                let keys = self.keys.load();
                tracing::info!(
                    ?trigger,
                    dir = %self.dir.display(),
                    current = keys.current.as_ref().map(Key::id).unwrap_or_default(),
                    previous = keys.previous.as_ref().map(Key::id).unwrap_or_default(),
                    "attestation keys loaded"
                );
            }
            Ok(false) => *last = None,
            Err(e) => {
                let error = e.to_string();
                if last.as_deref() != Some(error.as_str()) {
                    let keeping = self.keys.load().current.as_ref().map(|k| k.id.clone());
                    tracing::error!(?trigger, %error, keeping = keeping.as_deref().unwrap_or("none"), "attestation keys refused; keeping the last good ones");
                }
                *last = Some(error);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_under_the_current_and_the_previous_key_only() {
        let (a, b, c) = (generate().unwrap(), generate().unwrap(), generate().unwrap());
        let key = |bytes: &[u8]| Key::from_bytes(bytes, "k").unwrap();
        let first = Keys { current: Some(key(&a)), previous: None };
        let (id, tag) = first.sign(b"payload").unwrap();
        assert_eq!(id, key_id(&a));
        assert!(first.verify(b"payload", &id, &tag));
        assert!(!first.verify(b"payload2", &id, &tag));
        // Rotated once: still verifies; rotated twice: no longer.
        let second = Keys { current: Some(key(&b)), previous: Some(key(&a)) };
        assert!(second.verify(b"payload", &id, &tag));
        assert_ne!(second.sign(b"payload").unwrap(), (id.clone(), tag.clone()));
        let third = Keys { current: Some(key(&c)), previous: Some(key(&b)) };
        assert!(!third.verify(b"payload", &id, &tag));
        // Forgeries: another key's id, a cut tag, junk.
        assert!(!second.verify(b"payload", &key_id(&b), &tag));
        assert!(!first.verify(b"payload", &id, &tag[..tag.len() - 2]));
        for junk in ["", "!!!", "AAAA"] {
            assert!(!first.verify(b"payload", &id, junk), "{junk:?}");
        }
        assert_eq!(Keys::default().sign(b"payload"), None);
    }

    /// Guards against a comparison of only part of the tag: a full-length tag whose last bytes
    /// differ is refused (mutation: `hmac::verify` replaced by a comparison of the first bytes).
    #[test]
    fn a_full_length_tag_with_its_last_bytes_changed_is_refused() {
        let keys = Keys { current: Some(Key::from_bytes(&generate().unwrap(), "k").unwrap()), previous: None };
        let (id, tag) = keys.sign(b"payload").unwrap();
        let mut raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(&tag).unwrap();
        assert_eq!(raw.len(), 32);
        for i in [31, 24, 16, 8] {
            raw[i] ^= 0x01;
            let changed = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&raw);
            assert_eq!(changed.len(), tag.len());
            assert!(!keys.verify(b"payload", &id, &changed), "byte {i} changed");
            raw[i] ^= 0x01;
        }
    }

    #[test]
    fn nonces_do_not_repeat() {
        // From four threads at once, as the webhook's decisions draw them.
        let threads: Vec<_> =
            (0..4).map(|_| std::thread::spawn(|| (0..1000).map(|_| nonce()).collect::<Vec<_>>())).collect();
        let nonces: std::collections::HashSet<String> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        assert_eq!(nonces.len(), 4000);
        assert!(nonces
            .iter()
            .all(|n| n.len() == 16 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')));
    }

    #[test]
    fn a_key_is_32_bytes() {
        let err = Key::from_bytes(b"short", "current").unwrap_err();
        assert_eq!(err.to_string(), "current: 5 bytes; an attestation key is 32 random bytes");
    }

    /// The key store as the webhook uses it, tested here rather than only through the webhook
    /// and the controller (issue 27: with this crate's tests alone, cargo-mutants found its
    /// loading, readiness and reload unguarded).
    #[test]
    fn the_store_loads_current_and_previous_keeps_the_last_good_and_says_why_not_ready() {
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::new(dir.path());
        assert!(store.keys().is_empty());
        assert_eq!(
            format!("{store:?}"),
            format!("KeyStore {{ dir: {:?}, keys: Keys {{ current: None, previous: None }} }}", dir.path())
        );
        let not_yet = store.ready().unwrap_err();
        assert!(not_yet.starts_with("no attestation key loaded yet from "), "{not_yet}");
        assert!(not_yet.ends_with("(keyward's controller creates the Secret keyward-attestation)"), "{not_yet}");

        // No current key: refused, and the reason is what ready() says after a reload.
        store.reload(Trigger::Startup);
        let missing = store.ready().unwrap_err();
        assert!(
            missing.ends_with(
                "current: missing (keyward's controller creates the Secret keyward-attestation; mount it here)"
            ),
            "{missing}"
        );

        let (a, b) = (generate().unwrap(), generate().unwrap());
        std::fs::write(dir.path().join(CURRENT_FILE), a).unwrap();
        assert!(store.load().unwrap(), "a first key is a change");
        assert!(!store.load().unwrap(), "the same key again is not");
        assert_eq!(store.keys().current.as_ref().unwrap().id(), key_id(&a));
        assert!(store.keys().previous.is_none());
        store.reload(Trigger::Startup);
        assert_eq!(store.ready(), Ok(()));

        // A rotation: b signs, a still verifies.
        std::fs::write(dir.path().join(PREVIOUS_FILE), a).unwrap();
        std::fs::write(dir.path().join(CURRENT_FILE), b).unwrap();
        store.reload(Trigger::Startup);
        let keys = store.keys();
        assert_eq!(keys.current.as_ref().unwrap().id(), key_id(&b));
        assert_eq!(keys.previous.as_ref().unwrap().id(), key_id(&a));
        let (id, tag) = Keys { current: Some(Key::from_bytes(&a, "a").unwrap()), previous: None }.sign(b"p").unwrap();
        assert!(keys.verify(b"p", &id, &tag));

        // A bad file: refused, the last good keys kept, still ready.
        std::fs::write(dir.path().join(CURRENT_FILE), b"short").unwrap();
        assert!(store.load().is_err());
        store.reload(Trigger::Startup);
        assert_eq!(store.keys().current.as_ref().unwrap().id(), key_id(&b));
        assert_eq!(store.ready(), Ok(()));

        // A file that cannot be read is an error, not a missing key.
        std::fs::remove_file(dir.path().join(CURRENT_FILE)).unwrap();
        std::fs::create_dir(dir.path().join(CURRENT_FILE)).unwrap();
        let unreadable = store.load().unwrap_err().to_string();
        assert!(unreadable.contains("current: cannot read"), "{unreadable}");
    }

    #[test]
    fn a_development_key_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("attestation");
        ensure_dev_key(&keys).unwrap();
        let first = std::fs::read(keys.join(CURRENT_FILE)).unwrap();
        assert_eq!(first.len(), KEY_BYTES);
        ensure_dev_key(&keys).unwrap();
        assert_eq!(std::fs::read(keys.join(CURRENT_FILE)).unwrap(), first, "kept, not replaced");
        std::fs::write(keys.join(CURRENT_FILE), b"short").unwrap();
        assert!(ensure_dev_key(&keys)
            .unwrap_err()
            .to_string()
            .ends_with("5 bytes; an attestation key is 32 random bytes"));
        // Its id names it, and its Debug form never shows the key.
        let key = Key::from_bytes(&first, "k").unwrap();
        assert_eq!(key.id(), key_id(&first));
        assert_eq!(format!("{key:?}"), format!("Key {{ id: {:?}, .. }}", key_id(&first)));
    }
}
