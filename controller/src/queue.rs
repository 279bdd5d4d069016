//! The work queue: pure, with no clock of its own (every call takes `now`).
//!
//! - Equal keys queued twice are done once; a key queued while it runs runs again after.
//! - A key runs on one worker at a time; different keys run concurrently.
//! - Fair across namespaces: each pick serves the next namespace in turn that has a key due,
//!   so a flood of work in one namespace delays another's by at most one key per namespace.
//! - A key that failed backs off (500 ms doubling to 5 minutes); events do not cut a backoff
//!   short (that made a hot loop under event storms), but a key may ask to run again at a time
//!   of its own (a certificate's renewal).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::Hash;
use std::ops::Bound;
use std::time::Duration;

use tokio::time::Instant;

/// A unit of work with the namespace it belongs to (`""` for cluster-wide work).
pub trait QueueKey: Clone + Ord + Hash + std::fmt::Debug {
    fn namespace(&self) -> &str;
}

/// Backoff for a key that failed `attempt` times before: 500 ms, doubling, at most 5 minutes.
pub fn backoff(attempt: u32) -> Duration {
    let ms = 500u64.saturating_mul(1u64 << attempt.min(20));
    Duration::from_millis(ms.min(300_000))
}

/// How a run of a key ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done; nothing to do until an event says otherwise.
    Done,
    /// Done; run again at this time (a renewal).
    At(Instant),
    /// Failed: retry with backoff.
    Failed,
}

#[derive(Debug)]
pub struct Queue<K: QueueKey> {
    /// Keys waiting, per namespace, by the time they are due.
    waiting: BTreeMap<String, BTreeSet<(Instant, K)>>,
    /// The due time of each waiting key.
    due: HashMap<K, Instant>,
    running: HashSet<K>,
    /// Keys queued while they ran: when they finish, they run again no later than this.
    again: HashMap<K, Instant>,
    /// Failures in a row, per key (a key backing off keeps its time).
    attempts: HashMap<K, u32>,
    /// The namespace served last.
    cursor: Option<String>,
}

impl<K: QueueKey> Default for Queue<K> {
    fn default() -> Self {
        Self {
            waiting: BTreeMap::new(),
            due: HashMap::new(),
            running: HashSet::new(),
            again: HashMap::new(),
            attempts: HashMap::new(),
            cursor: None,
        }
    }
}

impl<K: QueueKey> Queue<K> {
    /// Queues `key` to run at `at` (or earlier, if it is already queued earlier). A key
    /// backing off after a failure keeps its time.
    pub fn add(&mut self, key: K, at: Instant) {
        if self.running.contains(&key) {
            self.again.entry(key).and_modify(|t| *t = (*t).min(at)).or_insert(at);
            return;
        }
        match self.due.get(&key).copied() {
            Some(current) if current <= at || self.attempts.contains_key(&key) => {}
            Some(current) => {
                self.unqueue(&key, current);
                self.enqueue(key, at);
            }
            None => self.enqueue(key, at),
        }
    }

    fn enqueue(&mut self, key: K, at: Instant) {
        self.waiting.entry(key.namespace().to_string()).or_default().insert((at, key.clone()));
        self.due.insert(key, at);
    }

    fn unqueue(&mut self, key: &K, at: Instant) {
        let ns = key.namespace().to_string();
        if let Some(set) = self.waiting.get_mut(&ns) {
            set.remove(&(at, key.clone()));
            if set.is_empty() {
                self.waiting.remove(&ns);
            }
        }
        self.due.remove(key);
    }

    /// The next key due at `now`, from the namespace after the one served last that has one;
    /// it is running until [`Self::finish`].
    pub fn pop(&mut self, now: Instant) -> Option<K> {
        let ready = |(ns, set): (&String, &BTreeSet<(Instant, K)>)| {
            set.first().filter(|(at, _)| *at <= now).map(|(at, k)| (ns.clone(), *at, k.clone()))
        };
        let (ns, at, key) = match &self.cursor {
            Some(last) => self
                .waiting
                .range::<String, _>((Bound::Excluded(last), Bound::Unbounded))
                .chain(self.waiting.range::<String, _>(..=last))
                .find_map(ready)?,
            None => self.waiting.iter().find_map(ready)?,
        };
        self.unqueue(&key, at);
        self.running.insert(key.clone());
        self.cursor = Some(ns);
        Some(key)
    }

    /// Records how `key`'s run ended, and queues what follows from it.
    pub fn finish(&mut self, key: &K, outcome: Outcome, now: Instant) {
        self.running.remove(key);
        let next = match outcome {
            Outcome::Done => {
                self.attempts.remove(key);
                None
            }
            Outcome::At(at) => {
                self.attempts.remove(key);
                Some(at)
            }
            Outcome::Failed => {
                let n = self.attempts.entry(key.clone()).or_insert(0);
                let at = now + backoff(*n);
                *n = n.saturating_add(1);
                Some(at)
            }
        };
        let queued = self.again.remove(key);
        // A failing key keeps its backoff even if events came in while it ran.
        let at = match (next, queued, self.attempts.contains_key(key)) {
            (Some(at), _, true) => Some(at),
            (Some(a), Some(b), false) => Some(a.min(b)),
            (a, b, _) => a.or(b),
        };
        if let Some(at) = at {
            self.enqueue(key.clone(), at);
        }
    }

    /// When the earliest waiting key is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.values().min().copied()
    }

    /// Forgets everything (this replica stopped leading).
    pub fn clear(&mut self) {
        let running = std::mem::take(&mut self.running);
        *self = Self::default();
        // Keys still running finish into an empty queue.
        self.running = running;
    }

    /// How many keys wait (not counting those running).
    pub fn len(&self) -> usize {
        self.due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    pub fn is_running(&self, key: &K) -> bool {
        self.running.contains(key)
    }

    /// Failures in a row of `key`.
    pub fn attempts(&self, key: &K) -> u32 {
        self.attempts.get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
    struct Key(&'static str, u32);

    impl QueueKey for Key {
        fn namespace(&self) -> &str {
            self.0
        }
    }

    #[test]
    fn a_flood_in_one_namespace_takes_turns_with_the_others() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        for i in 0..1000 {
            q.add(Key("flood", i), t0);
        }
        q.add(Key("team-a", 1), t0);
        q.add(Key("team-b", 1), t0);
        let first: Vec<Key> = (0..4).filter_map(|_| q.pop(t0)).collect();
        // Every namespace is served within one round, whatever the flood.
        assert!(first[..3].contains(&Key("team-a", 1)) && first[..3].contains(&Key("team-b", 1)), "{first:?}");
        assert_eq!(first.iter().filter(|k| k.0 == "flood").count(), 2);
    }

    #[test]
    fn a_key_runs_once_at_a_time_and_again_if_queued_meanwhile() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        q.add(Key("a", 1), t0);
        q.add(Key("a", 1), t0);
        assert_eq!(q.len(), 1, "coalesced");
        assert_eq!(q.pop(t0), Some(Key("a", 1)));
        assert_eq!(q.pop(t0), None);
        q.add(Key("a", 1), t0); // an event while it runs
        assert_eq!(q.pop(t0), None, "never on two workers");
        q.finish(&Key("a", 1), Outcome::Done, t0);
        assert_eq!(q.pop(t0), Some(Key("a", 1)), "runs again after");
        q.finish(&Key("a", 1), Outcome::Done, t0);
        assert!(q.is_empty());
    }

    #[test]
    fn failures_back_off_and_events_do_not_cut_the_backoff_short() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        q.add(Key("a", 1), t0);
        let mut now = t0;
        for (n, wait) in [500u64, 1000, 2000, 4000].into_iter().enumerate() {
            assert_eq!(q.pop(now), Some(Key("a", 1)), "attempt {n}");
            q.finish(&Key("a", 1), Outcome::Failed, now);
            q.add(Key("a", 1), now); // an event right after
            assert_eq!(q.pop(now + Duration::from_millis(wait - 1)), None);
            now += Duration::from_millis(wait);
        }
        assert_eq!(q.attempts(&Key("a", 1)), 4);
        assert_eq!(q.pop(now), Some(Key("a", 1)));
        q.finish(&Key("a", 1), Outcome::Done, now);
        assert_eq!(q.attempts(&Key("a", 1)), 0);
        assert_eq!(backoff(30), Duration::from_secs(300));
    }

    #[test]
    fn a_key_may_ask_to_run_at_its_own_time() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        q.add(Key("a", 1), t0);
        let key = q.pop(t0).unwrap();
        let renew = t0 + Duration::from_secs(3600);
        q.finish(&key, Outcome::At(renew), t0);
        assert_eq!(q.next_due(), Some(renew));
        assert_eq!(q.pop(t0), None);
        // An event brings it forward.
        q.add(Key("a", 1), t0);
        assert_eq!(q.pop(t0), Some(Key("a", 1)));
    }
}
