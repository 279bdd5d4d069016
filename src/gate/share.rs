//! Each caller's share of what the gate holds for it: the bytes of gRPC messages held to be
//! read (at most a quarter of `--message-bytes-in-flight`, and always room for one message), and
//! the held calls on their way to the upstream or waiting for its answer (at most
//! [`MAX_CALLS`]). The budget bounds the gate's memory; the share keeps one caller's unfinished
//! or unanswered calls from taking every other caller's turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Held calls of one caller at once.
pub const MAX_CALLS: usize = 16;

pub struct Shares {
    max_bytes: usize,
    callers: Mutex<HashMap<String, Usage>>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Usage {
    bytes: usize,
    calls: usize,
}

/// One held call of a caller: released when dropped.
pub struct Share {
    shares: Arc<Shares>,
    caller: String,
    bytes: usize,
}

// === impl Shares ===

impl Shares {
    /// For a budget of `budget` bytes, each message at most `message` bytes.
    pub fn new(budget: usize, message: usize) -> Arc<Self> {
        Arc::new(Self { max_bytes: (budget / 4).max(message), callers: Mutex::new(HashMap::new()) })
    }

    fn callers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Usage>> {
        self.callers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new held call of `caller`, unless it has [`MAX_CALLS`] already.
    pub fn begin(self: &Arc<Self>, caller: &str) -> Result<Share, String> {
        let mut callers = self.callers();
        let usage = callers.entry(caller.to_string()).or_default();
        if usage.calls >= MAX_CALLS {
            return Err(format!(
                "{caller} has {MAX_CALLS} calls whose message the gate holds already, on their way to the upstream or awaiting its answer: wait for them"
            ));
        }
        usage.calls += 1;
        Ok(Share { shares: self.clone(), caller: caller.to_string(), bytes: 0 })
    }

    /// What `caller` holds now (bytes, calls).
    #[cfg(test)]
    fn usage(&self, caller: &str) -> (usize, usize) {
        self.callers().get(caller).map_or((0, 0), |u| (u.bytes, u.calls))
    }
}

// === impl Share ===

impl Share {
    /// `more` bytes of this call's message held, unless the caller's share is full.
    pub fn add(&mut self, more: usize) -> Result<(), String> {
        let mut callers = self.shares.callers();
        let usage = callers.entry(self.caller.clone()).or_default();
        if usage.bytes + more > self.shares.max_bytes {
            return Err(format!(
                "{} holds {} bytes of messages in the gate already, its share of --message-bytes-in-flight ({} bytes): wait for its other calls",
                self.caller, usage.bytes, self.shares.max_bytes
            ));
        }
        usage.bytes += more;
        self.bytes += more;
        Ok(())
    }

    /// The message is with the upstream: its bytes no longer count (the call still does).
    pub fn release_bytes(&mut self) {
        let mut callers = self.shares.callers();
        if let Some(usage) = callers.get_mut(&self.caller) {
            usage.bytes = usage.bytes.saturating_sub(self.bytes);
        }
        self.bytes = 0;
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut callers = self.shares.callers();
        if let Some(usage) = callers.get_mut(&self.caller) {
            usage.bytes = usage.bytes.saturating_sub(self.bytes);
            usage.calls = usage.calls.saturating_sub(1);
            if *usage == Usage::default() {
                callers.remove(&self.caller);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_holds_at_most_its_share_and_gives_it_back() {
        let shares = Shares::new(64, 10);
        let mut first = shares.begin("a").unwrap();
        first.add(10).unwrap();
        first.add(6).unwrap();
        let e = first.add(1).unwrap_err();
        assert!(
            e.contains(
                "holds 16 bytes of messages in the gate already, its share of --message-bytes-in-flight (16 bytes)"
            ),
            "{e}"
        );
        let mut other = shares.begin("b").unwrap();
        other.add(16).unwrap();
        first.release_bytes();
        assert_eq!(shares.usage("a"), (0, 1));
        first.add(16).unwrap();
        drop(first);
        assert_eq!(shares.usage("a"), (0, 0));
        assert!(shares.callers().get("a").is_none(), "a caller with nothing held is forgotten");
        drop(other);
        let calls: Vec<Share> = (0..MAX_CALLS).map(|_| shares.begin("a").unwrap()).collect();
        assert!(shares.begin("a").err().unwrap().contains(&format!("has {MAX_CALLS} calls")));
        assert!(shares.begin("b").is_ok(), "another caller's turn is its own");
        drop(calls);
        assert!(shares.begin("a").is_ok());
        // A budget of one message still lets each caller hold one.
        assert_eq!(Shares::new(10, 10).max_bytes, 10);
    }
}
