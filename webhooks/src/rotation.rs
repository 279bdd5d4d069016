//! How the kubelet rotates a projected service-account token, and whether a program that
//! re-reads the token file every so often can be left holding an expired one.
//!
//! The kubelet asks for a new token once the one it holds is older than 80% of its life or
//! older than 24 hours, whichever comes first (`requiresRefresh` in
//! kubernetes `pkg/kubelet/token/token_manager.go`: `maxTTL = 24h`, up to `maxJitter = 10s`
//! earlier). It checks only when it sets the pod's projected volumes up again, on the pod
//! worker's resync: every `syncFrequency` (1 minute by default,
//! `pkg/kubelet/apis/config/v1beta1/defaults.go`) stretched by a jitter factor of 0.5
//! (`workerResyncIntervalJitterFactor`, `pkg/kubelet/pod_workers.go`), so up to 90 seconds
//! late, plus the 1-second sync ticker and the TokenRequest's round trip. [`REWRITE_LAG_SECONDS`]
//! bounds that with room to spare.
//!
//! A reader that re-reads every `R` seconds, reading just before the rewrite, holds the old
//! token until `R` seconds later. The old token was issued at `t0` and expires at `t0 + L`; it
//! is replaced on disk by `t0 + min(0.8 L, 24 h) + lag`. So the reader never holds an expired
//! token exactly when `min(0.8 L, 24 h) + lag + R <= L`.

use std::fmt;

/// The kubelet asks for a new token at this share of the old one's life (`requiresRefresh`).
pub const REFRESH_PERCENT: i64 = 80;
/// ... or once the old one is this old, whichever comes first (`maxTTL`).
pub const REFRESH_MAX_AGE_SECONDS: i64 = 24 * 3600;
/// The longest the kubelet takes to rewrite the file once a new token is due: up to 90 s
/// until the pod's next resync at the default `syncFrequency` (1 minute, jitter factor 0.5),
/// the sync ticker's second, and the TokenRequest; 120 s bounds all of it.
pub const REWRITE_LAG_SECONDS: i64 = 120;

/// A token's lifetime against the interval at which its reader re-reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// The token's `expirationSeconds`.
    pub lifetime: i64,
    /// How often its reader re-reads the file.
    pub reader_seconds: i64,
}

impl Rotation {
    pub fn new(lifetime: i64, reader_seconds: i64) -> Self {
        Self { lifetime, reader_seconds }
    }

    /// When the kubelet asks for a new token, in seconds after the old one was issued.
    pub fn refresh_after(&self) -> i64 {
        // As the kubelet computes it: `exp - (expirationSeconds*20)/100`, in whole seconds.
        let early = self.lifetime.saturating_mul(100 - REFRESH_PERCENT) / 100;
        self.lifetime.saturating_sub(early).min(REFRESH_MAX_AGE_SECONDS)
    }

    /// The latest the file holds the new token, in seconds after the old one was issued.
    pub fn rewritten_by(&self) -> i64 {
        self.refresh_after().saturating_add(REWRITE_LAG_SECONDS)
    }

    /// The longest the reader can hold an expired token, in each rotation: 0 when it never
    /// does.
    pub fn stale_seconds(&self) -> i64 {
        self.rewritten_by().saturating_add(self.reader_seconds).saturating_sub(self.lifetime).max(0)
    }

    /// Whether the reader always holds a valid token.
    pub fn fits(&self) -> bool {
        self.stale_seconds() == 0
    }

    /// The longest re-read interval under which this lifetime never goes stale (≤ 0: none
    /// does, the lifetime is too short to outlast even the kubelet's rewrite).
    pub fn longest_reader(&self) -> i64 {
        self.lifetime.saturating_sub(self.rewritten_by())
    }

    /// The shortest lifetime that never goes stale for this reader, in whole minutes.
    pub fn shortest_lifetime(&self) -> i64 {
        let needed = REWRITE_LAG_SECONDS.saturating_add(self.reader_seconds);
        // Under 24 h of refresh age: 0.2 L >= needed. Past it, L - 24 h >= needed.
        let share = 100 - REFRESH_PERCENT;
        let by_share = needed.saturating_mul(100).saturating_add(share - 1) / share;
        let lifetime = if by_share.saturating_sub(by_share.saturating_mul(share) / 100) <= REFRESH_MAX_AGE_SECONDS {
            by_share
        } else {
            REFRESH_MAX_AGE_SECONDS.saturating_add(needed)
        };
        lifetime.saturating_add(59) / 60 * 60
    }
}

/// The arithmetic in one line, for `check-profiles`, `explain` and refusals.
impl fmt::Display for Rotation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { lifetime, reader_seconds } = *self;
        write!(
            f,
            "lives {lifetime} s; the kubelet asks for the next at {} s ({REFRESH_PERCENT}% of its life, at most 24 h) and the file has it by {} s (+{REWRITE_LAG_SECONDS} s); the reader re-reads every {reader_seconds} s, ",
            self.refresh_after(),
            self.rewritten_by()
        )?;
        match self.stale_seconds() {
            0 => {
                write!(f, "so it never holds an expired token ({} s to spare)", self.longest_reader() - reader_seconds)
            }
            stale => write!(f, "so it can hold an expired token for up to {stale} s of every {lifetime} s"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kubeflow/pipelines #13290: the persistence agent re-reads every 3600 s a token that
    /// lives 3600 s.
    #[test]
    fn an_hourly_reader_of_an_hour_long_token_holds_an_expired_one() {
        let r = Rotation::new(3600, 3600);
        assert_eq!((r.refresh_after(), r.rewritten_by()), (2880, 3000));
        assert_eq!(r.stale_seconds(), 3000);
        assert!(!r.fits());
        assert_eq!(r.longest_reader(), 600);
        assert_eq!(r.shortest_lifetime(), 18600);
        assert!(Rotation::new(r.shortest_lifetime(), 3600).fits());
        assert!(!Rotation::new(r.shortest_lifetime() - 1, 3600).fits());
        assert_eq!(
            r.to_string(),
            "lives 3600 s; the kubelet asks for the next at 2880 s (80% of its life, at most 24 h) and the file has it by 3000 s (+120 s); the reader re-reads every 3600 s, so it can hold an expired token for up to 3000 s of every 3600 s"
        );
    }

    #[test]
    fn the_kfp_built_ins_never_go_stale() {
        // The persistence agent: 6 h for an hourly reader.
        let agent = Rotation::new(21600, 3600);
        assert!(agent.fits());
        assert_eq!(agent.rewritten_by(), 17400);
        assert!(agent.to_string().ends_with("so it never holds an expired token (600 s to spare)"), "{agent}");
        // The scheduled-workflow controller: client-go's file token source, every minute.
        assert!(Rotation::new(3600, 60).fits());
    }

    #[test]
    fn past_a_day_the_kubelet_refreshes_at_24_hours() {
        // 48 h: refreshed at 24 h, not at 38.4 h.
        let r = Rotation::new(172_800, 3600);
        assert_eq!(r.refresh_after(), 86_400);
        assert!(r.fits());
        // A reader slower than 24 h needs a lifetime past the share rule's reach.
        let slow = Rotation::new(3600, 100_000);
        assert_eq!(slow.shortest_lifetime(), 186_540);
        assert!(Rotation::new(slow.shortest_lifetime(), 100_000).fits());
    }

    #[test]
    fn absurd_numbers_do_not_overflow() {
        let r = Rotation::new(i64::MAX, i64::MAX);
        let _ = (r.stale_seconds(), r.shortest_lifetime(), r.to_string());
        // The shortest lifetime the apiserver allows fits no reader: the rewrite alone takes it.
        assert_eq!(Rotation::new(600, 1).longest_reader(), 0);
        assert_eq!(Rotation::new(600, 1).stale_seconds(), 1);
    }
}
