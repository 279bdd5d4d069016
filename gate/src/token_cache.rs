//! TokenReview and SubjectAccessReview answers, cached so that a caller's every request does not cost the API server
//! a review: an accepted token until shortly before it expires (its `exp`, read once the API
//! server has vouched for it) and never past a ceiling; a rejected one briefly, so that a
//! client retrying a bad token cannot make the gate ask again each time. The cache is bounded
//! (the oldest entries go first) and keeps only a SHA-256 of each token: the tokens themselves
//! are never held or logged. Pure: the caller passes the time.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use sha2::{Digest, Sha256};

/// What the API server said of a token (for the gate's audience).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Review {
    Authenticated {
        username: String,
        groups: Vec<String>,
        /// The pod the token is bound to, if the API server names one.
        pod: Option<crate::identity::BoundPod>,
    },
    /// Why not, as the API server or the gate put it (never the token).
    Rejected(String),
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Accepted tokens kept.
    pub max_entries: usize,
    /// Rejected tokens kept, apart from the accepted: a flood of made-up tokens pushes out only
    /// other made-up tokens, never a caller's good one.
    pub max_rejected: usize,
    /// The longest an accepted token is trusted without asking again.
    pub max_age: Duration,
    /// How long before its expiry an accepted token is asked about again.
    pub early: Duration,
    /// How long a rejected token is remembered.
    pub rejected_for: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            max_rejected: 50_000,
            max_age: Duration::from_secs(120),
            early: Duration::from_secs(10),
            rejected_for: Duration::from_secs(10),
        }
    }
}

type Key = [u8; 32];

/// Values kept until a time, at most `max_entries`, the oldest written first to go. The
/// store behind [`TokenCache`] and [`ReviewCache`].
#[derive(Debug)]
pub struct TtlCache<K, V> {
    max_entries: usize,
    entries: HashMap<K, Entry<V>>,
    /// Keys in the order they were written, with the write's generation (a later write of the
    /// same key leaves a stale mark here, skipped when it comes up).
    order: VecDeque<(K, u64)>,
    generation: u64,
    hits: u64,
    misses: u64,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    until: SystemTime,
    generation: u64,
}

impl<K: std::hash::Hash + Eq + Clone, V> TtlCache<K, V> {
    pub fn new(max_entries: usize) -> Self {
        Self { max_entries, entries: HashMap::new(), order: VecDeque::new(), generation: 0, hits: 0, misses: 0 }
    }

    /// The value of `key`, if it is still good at `now`.
    pub fn get(&mut self, key: &K, now: SystemTime) -> Option<&V> {
        let fresh = self.entries.get(key).is_some_and(|e| now < e.until);
        if !fresh {
            self.entries.remove(key);
            self.misses += 1;
            return None;
        }
        self.hits += 1;
        self.entries.get(key).map(|e| &e.value)
    }

    /// Keeps `value` under `key` until `until` (nothing, if that is not after `now`).
    pub fn put(&mut self, key: K, value: V, until: SystemTime, now: SystemTime) {
        if until <= now || self.max_entries == 0 {
            return;
        }
        while self.entries.len() >= self.max_entries && !self.entries.contains_key(&key) {
            let Some((old, generation)) = self.order.pop_front() else { break };
            if self.entries.get(&old).is_some_and(|e| e.generation == generation) {
                self.entries.remove(&old);
            }
        }
        self.generation += 1;
        self.entries.insert(key.clone(), Entry { value, until, generation: self.generation });
        self.order.push_back((key, self.generation));
        // Stale marks can outnumber the entries only by so much before they are dropped.
        if self.order.len() > 2 * self.max_entries {
            let entries = &self.entries;
            self.order.retain(|(k, g)| entries.get(k).is_some_and(|e| e.generation == *g));
        }
    }

    /// Lookups answered from the cache, and not.
    pub fn stats(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// TokenReview answers, by the SHA-256 of their token: the accepted and the rejected apart.
#[derive(Debug)]
pub struct TokenCache {
    limits: Limits,
    accepted: TtlCache<Key, Review>,
    rejected: TtlCache<Key, Review>,
}

impl TokenCache {
    pub fn new(limits: Limits) -> Self {
        Self { limits, accepted: TtlCache::new(limits.max_entries), rejected: TtlCache::new(limits.max_rejected) }
    }

    /// The cached review of `token`, if it is still good at `now`.
    pub fn get(&mut self, token: &str, now: SystemTime) -> Option<&Review> {
        let key = key(token);
        match self.accepted.get(&key, now) {
            Some(review) => Some(review),
            None => self.rejected.get(&key, now),
        }
    }

    /// Remembers what the API server said of `token` at `now`.
    pub fn put(&mut self, token: &str, review: Review, now: SystemTime) {
        let until = match &review {
            Review::Authenticated { .. } => {
                let ceiling = now + self.limits.max_age;
                match expiry(token) {
                    Some(exp) => ceiling.min(exp.checked_sub(self.limits.early).unwrap_or(UNIX_EPOCH)),
                    None => ceiling,
                }
            }
            Review::Rejected(_) => {
                self.rejected.put(key(token), review, now + self.limits.rejected_for, now);
                return;
            }
        };
        self.accepted.put(key(token), review, until, now);
    }

    /// Lookups answered from the cache, and not (a lookup asks the accepted first).
    pub fn stats(&self) -> (u64, u64) {
        let (accepted, rejected) = (self.accepted.stats(), self.rejected.stats());
        (accepted.0 + rejected.0, rejected.1)
    }

    pub fn len(&self) -> usize {
        self.accepted.len() + self.rejected.len()
    }

    pub fn is_empty(&self) -> bool {
        self.accepted.is_empty() && self.rejected.is_empty()
    }
}

/// SubjectAccessReview answers: an allowed review for `allowed_for`, a denied one for
/// `denied_for` (as Kubernetes' delegating authorizer caches them), at most `max_entries`.
#[derive(Debug)]
pub struct ReviewCache {
    allowed_for: Duration,
    denied_for: Duration,
    cache: TtlCache<crate::rules::AccessReview, bool>,
}

impl ReviewCache {
    pub fn new(max_entries: usize, allowed_for: Duration, denied_for: Duration) -> Self {
        Self { allowed_for, denied_for, cache: TtlCache::new(max_entries) }
    }

    /// The cached answer, if still good at `now`.
    pub fn get(&mut self, review: &crate::rules::AccessReview, now: SystemTime) -> Option<bool> {
        self.cache.get(review, now).copied()
    }

    pub fn put(&mut self, review: crate::rules::AccessReview, allowed: bool, now: SystemTime) {
        let until = now + if allowed { self.allowed_for } else { self.denied_for };
        self.cache.put(review, allowed, until, now);
    }

    pub fn stats(&self) -> (u64, u64) {
        self.cache.stats()
    }
}

fn key(token: &str) -> Key {
    Sha256::digest(token.as_bytes()).into()
}

/// The key of one TokenReview in flight: the SHA-256 of the audiences it is asked for and the
/// token, so that a transport can share a review among requests without holding the token.
pub fn review_key(token: &str, audiences: &[String]) -> [u8; 32] {
    let mut digest = Sha256::new();
    for audience in audiences {
        digest.update(audience.as_bytes());
        digest.update([0]);
    }
    // 0xff never occurs in UTF-8: the audiences end here.
    digest.update([0xff]);
    digest.update(token.as_bytes());
    digest.finalize().into()
}

/// The `exp` of a JWT, read without checking its signature: only ever to cache a token the API
/// server accepted for less long, never to accept one. Bounded: a payload past 8 KiB is not read.
fn expiry(token: &str) -> Option<SystemTime> {
    let payload = token.split('.').nth(1)?;
    if payload.len() > 8 * 1024 {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(exp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_key_tells_apart_every_token_and_audience_list() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let keys = [
            review_key("t", &a(&["x"])),
            review_key("u", &a(&["x"])),
            review_key("t", &a(&["y"])),
            review_key("t", &a(&["x", "y"])),
            review_key("t", &a(&["xy"])),
            review_key("t", &a(&[])),
            review_key("x\0t", &a(&[])),
        ];
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len());
        assert_eq!(review_key("t", &a(&["x"])), keys[0]);
    }

    const T0: u64 = 1_800_000_000;

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    /// A JWT-shaped token expiring at `exp` (the signature is the API server's business).
    fn token(exp: u64, n: u32) -> String {
        let b64 = |s: String| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.sig{n}", b64(r#"{"alg":"RS256"}"#.into()), b64(format!(r#"{{"exp":{exp},"n":{n}}}"#)))
    }

    fn ok() -> Review {
        Review::Authenticated { username: "system:serviceaccount:kubeflow:runner".into(), groups: vec![], pod: None }
    }

    #[test]
    fn an_accepted_token_is_kept_until_shortly_before_it_expires_and_never_past_the_ceiling() {
        let mut cache = TokenCache::new(Limits::default());
        // Expires in 60 s: kept 50 s (10 s early).
        let soon = token(T0 + 60, 1);
        cache.put(&soon, ok(), at(T0));
        assert_eq!(cache.get(&soon, at(T0 + 49)), Some(&ok()));
        assert_eq!(cache.get(&soon, at(T0 + 50)), None);
        // Expires in an hour: kept for the 120 s ceiling.
        let later = token(T0 + 3600, 2);
        cache.put(&later, ok(), at(T0));
        assert!(cache.get(&later, at(T0 + 119)).is_some());
        assert!(cache.get(&later, at(T0 + 120)).is_none());
        // Expiring within the early margin, or not a JWT: not kept at all, or for the ceiling.
        let dying = token(T0 + 5, 3);
        cache.put(&dying, ok(), at(T0));
        assert!(cache.get(&dying, at(T0)).is_none());
        cache.put("opaque", ok(), at(T0));
        assert!(cache.get("opaque", at(T0 + 119)).is_some());
        assert_eq!(cache.stats(), (3, 3));
    }

    #[test]
    fn a_rejected_token_is_remembered_briefly() {
        let mut cache = TokenCache::new(Limits::default());
        let bad = token(T0 + 3600, 9);
        cache.put(&bad, Review::Rejected("token audiences do not match".into()), at(T0));
        assert_eq!(cache.get(&bad, at(T0 + 9)), Some(&Review::Rejected("token audiences do not match".into())));
        assert_eq!(cache.get(&bad, at(T0 + 10)), None);
    }

    #[test]
    fn the_cache_is_bounded_and_the_oldest_go_first() {
        let limits = Limits { max_entries: 3, ..Limits::default() };
        let mut cache = TokenCache::new(limits);
        let tokens: Vec<String> = (0..5).map(|n| token(T0 + 3600, n)).collect();
        for t in &tokens {
            cache.put(t, ok(), at(T0));
        }
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&tokens[0], at(T0)).is_none() && cache.get(&tokens[1], at(T0)).is_none());
        assert!(tokens[2..].iter().all(|t| cache.get(t, at(T0)).is_some()));
        // Writing one again many times leaves the bound and the others alone.
        for _ in 0..100 {
            cache.put(&tokens[4], ok(), at(T0));
        }
        assert_eq!(cache.len(), 3);
        assert!(cache.accepted.order.len() <= 6, "{}", cache.accepted.order.len());
        assert!(tokens[2..].iter().all(|t| cache.get(t, at(T0)).is_some()));
    }

    #[test]
    fn a_flood_of_made_up_tokens_pushes_out_only_made_up_tokens() {
        let limits = Limits { max_entries: 3, max_rejected: 4, ..Limits::default() };
        let mut cache = TokenCache::new(limits);
        let good = token(T0 + 3600, 1);
        cache.put(&good, ok(), at(T0));
        for n in 0..1000 {
            cache.put(&format!("made-up-{n}"), Review::Rejected("invalid bearer token".into()), at(T0));
        }
        assert_eq!(cache.get(&good, at(T0 + 1)), Some(&ok()), "the caller's good token is still known");
        assert_eq!(cache.len(), 5);
        assert!(cache.get("made-up-999", at(T0 + 1)).is_some() && cache.get("made-up-0", at(T0 + 1)).is_none());
    }

    #[test]
    fn review_answers_are_kept_as_long_as_their_verdict_earns() {
        let review = |name: &str| crate::rules::AccessReview {
            user: "system:serviceaccount:team-a:client".into(),
            verb: "get".into(),
            group: "serving.kserve.io".into(),
            resource: "inferencegraphs".into(),
            subresource: String::new(),
            namespace: "team-a".into(),
            name: name.into(),
        };
        let mut cache = ReviewCache::new(100, Duration::from_secs(60), Duration::from_secs(10));
        cache.put(review("mine"), true, at(T0));
        cache.put(review("theirs"), false, at(T0));
        assert_eq!(cache.get(&review("mine"), at(T0 + 59)), Some(true));
        assert_eq!(cache.get(&review("theirs"), at(T0 + 9)), Some(false));
        assert_eq!(cache.get(&review("theirs"), at(T0 + 10)), None, "a denial is asked again soon");
        assert_eq!(cache.get(&review("mine"), at(T0 + 60)), None);
        assert_eq!(cache.get(&review("unasked"), at(T0)), None);
        assert_eq!(cache.stats(), (2, 3));
    }

    #[test]
    fn the_cache_never_holds_a_token_and_a_hostile_one_is_only_not_cached_long() {
        let mut cache = TokenCache::new(Limits::default());
        let t = token(T0 + 3600, 1);
        cache.put(&t, ok(), at(T0));
        assert!(!format!("{cache:?}").contains(&t[..20]));
        // An exp in the distant future, an overflowing one, a huge payload: the ceiling.
        for hostile in [token(u64::MAX, 2), format!("a.{}.c", "A".repeat(20_000)), "..".into(), "a.!!!.c".into()] {
            cache.put(&hostile, ok(), at(T0));
            assert!(cache.get(&hostile, at(T0 + 119)).is_some());
            assert!(cache.get(&hostile, at(T0 + 120)).is_none());
        }
    }
}
