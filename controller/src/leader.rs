//! Leader election on a `coordination.k8s.io` Lease, with client-go's semantics.
//!
//! - A Lease held by another is respected until it has not changed for its whole duration *as
//!   observed on this replica's clock*: remote timestamps are never compared with the local
//!   clock, so clock skew cannot elect two leaders.
//! - Leadership is a deadline on the local clock, not a flag: each successful renewal extends
//!   it to the moment the renewal was *sent* plus the renew deadline. [`Leadership::check`],
//!   before every write, compares the clock with that deadline, so a leader whose Lease
//!   requests hang (a half-open connection to one apiserver) stops writing at the deadline
//!   whatever the elector's task is doing. The renew deadline is shorter than the Lease's
//!   duration, so the old leader's writes end before another replica may take the Lease.
//! - Every Lease request is bounded by the time left before the renew deadline.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::Error;

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    /// client-go's defaults: 15 s, 10 s, 2 s. lease > renew deadline > retry period × 1.2.
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseConfig {
    pub fn new(name: &str, namespace: &str, identity: &str) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Whether the durations keep client-go's order, without which two replicas could write at
    /// once: lease duration > renew deadline > retry period × 1.2 (the jitter).
    pub fn problem(&self) -> Option<String> {
        if self.lease_duration <= self.renew_deadline {
            return Some(format!(
                "the lease duration ({:?}) must be longer than the renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline <= self.retry_period.mul_f64(1.2) {
            return Some(format!(
                "the renew deadline ({:?}) must be longer than 1.2 × the retry period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        None
    }
}

#[derive(Debug)]
struct Shared {
    /// Until when this replica may write, on the local clock; `None` when not leading.
    until: Mutex<Option<Instant>>,
    /// Told whenever leadership is gained or given up (a lapse is seen by the clock).
    changes: watch::Sender<bool>,
}

/// Whether this replica may write now. Cheap to clone; checked before every write.
#[derive(Debug, Clone)]
pub struct Leadership {
    shared: Arc<Shared>,
    changes: watch::Receiver<bool>,
    always: bool,
}

impl Leadership {
    fn new(always: bool) -> Self {
        let (tx, rx) = watch::channel(always);
        Self { shared: Arc::new(Shared { until: Mutex::new(None), changes: tx }), changes: rx, always }
    }

    /// Always the leader (a single replica without election, and tests).
    pub fn always() -> Self {
        Self::new(true)
    }

    /// Leads until the local clock reaches the deadline the elector last set.
    pub fn is_leader(&self) -> bool {
        self.always || self.until().is_some_and(|until| Instant::now() < until)
    }

    /// When leadership lapses unless renewed (`None`: not leading, or leading for ever).
    pub fn until(&self) -> Option<Instant> {
        *self.shared.until.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `Err(NotLeader)` unless this replica leads now: the check before every write.
    pub fn check(&self) -> Result<(), Error> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// Waits until leadership is gained or given up, or lapses on the clock. `false` when the
    /// elector is gone.
    pub async fn changed(&mut self) -> bool {
        let until = self.until().filter(|_| !self.always);
        let lapse = async move {
            match until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = self.changes.changed() => changed.is_ok(),
            () = lapse => true,
        }
    }

    fn extend(&self, until: Instant) {
        *self.shared.until.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(until);
        self.shared.changes.send_if_modified(|leading| !std::mem::replace(leading, true));
    }

    fn give_up(&self) {
        *self.shared.until.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
        self.shared.changes.send_replace(false);
    }
}

/// What one attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// This replica holds the Lease now.
    Held,
    /// Another replica holds it, and it has not expired.
    Taken,
}

pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    leadership: Leadership,
    /// The last (holder, renewTime, duration) seen, and when it was seen to change, locally.
    observed: Option<(Option<String>, Option<MicroTime>, i32)>,
    observed_at: Instant,
}

impl LeaderElector {
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            leadership: Leadership::new(false),
            observed: None,
            observed_at: Instant::now(),
        }
    }

    /// The handle the reconciler checks before every write.
    pub fn leadership(&self) -> Leadership {
        self.leadership.clone()
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX)),
            acquire_time: acquired.or(Some(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One step of client-go's `tryAcquireOrRenew`.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Attempt, Error> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Held),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(Attempt::Taken),
                Err(e) => Err(e.into()),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = (spec.holder_identity.clone(), spec.renew_time.clone(), spec.lease_duration_seconds.unwrap_or(0));
        if self.observed.as_ref() != Some(&record) {
            self.observed = Some(record);
            self.observed_at = Instant::now();
        }
        let holder = spec.holder_identity.as_deref().unwrap_or("");
        let ours = holder == self.config.identity;
        let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0));
        if !holder.is_empty() && !ours && self.observed_at + duration > Instant::now() {
            return Ok(Attempt::Taken);
        }
        let transitions = spec.lease_transitions.unwrap_or(0);
        lease.spec = Some(if ours {
            self.spec(now, spec.acquire_time, transitions)
        } else {
            self.spec(now, None, transitions.saturating_add(1))
        });
        // A PUT with the GET's resourceVersion: if anyone wrote in between, 409.
        match self.api.replace(&self.config.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(Attempt::Held),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(Attempt::Taken),
            Err(e) => Err(e.into()),
        }
    }

    /// One attempt, given up at `deadline` whatever the API server is doing.
    async fn attempt_until(&mut self, deadline: Instant) -> Result<Attempt, Error> {
        match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout("a Lease request".into())),
        }
    }

    /// Gives the Lease up (client-go's ReleaseOnCancel), so another replica takes over at
    /// once rather than after the Lease expires.
    pub async fn release(&mut self) -> Result<(), Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else { return Ok(()) };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
        lease.spec = Some(spec);
        self.api.replace(&self.config.name, &PostParams::default(), &lease).await?;
        Ok(())
    }

    /// Acquires, leads, renews, until `stop` resolves; then releases the Lease if held.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) {
        futures::pin_mut!(stop);
        let renew_deadline = self.config.renew_deadline;
        loop {
            // Acquire: one bounded attempt every retry period (jittered).
            let acquired = loop {
                let sent = Instant::now();
                match self.attempt_until(sent + renew_deadline).await {
                    Ok(Attempt::Held) => break sent,
                    Ok(Attempt::Taken) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, lease = %self.config.name, "leader election: cannot read or write the Lease; retrying")
                    }
                }
                tokio::select! {
                    () = &mut stop => return,
                    () = tokio::time::sleep(jitter(self.config.retry_period)) => {}
                }
            };
            self.leadership.extend(acquired + renew_deadline);
            tracing::info!(identity = %self.config.identity, lease = %self.config.name, "leader election: leading");
            let mut renewed = acquired;
            // Renew every retry period; each attempt ends by the renew deadline of the last
            // success, and so does leadership (its clock ran from the same instant).
            let lost = loop {
                tokio::select! {
                    () = &mut stop => {
                        self.leadership.give_up();
                        let deadline = Instant::now() + renew_deadline;
                        match tokio::time::timeout_at(deadline, self.release()).await {
                            Ok(Ok(())) => tracing::info!("leader election: released the Lease"),
                            Ok(Err(e)) => tracing::warn!(error = %e, "leader election: could not release the Lease"),
                            Err(_) => tracing::warn!("leader election: releasing the Lease timed out"),
                        }
                        return;
                    }
                    () = tokio::time::sleep(self.config.retry_period) => {}
                }
                let sent = Instant::now();
                let deadline = renewed + renew_deadline;
                if sent >= deadline {
                    break "no renewal within the renew deadline";
                }
                match self.attempt_until(deadline).await {
                    Ok(Attempt::Held) => {
                        renewed = sent;
                        self.leadership.extend(sent + renew_deadline);
                    }
                    // Someone else holds it: stop writing now, not at the deadline.
                    Ok(Attempt::Taken) => break "another replica holds the Lease",
                    Err(e) if Instant::now() < deadline => {
                        tracing::warn!(error = %e, "leader election: renewal failed; retrying within the renew deadline");
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "leader election: no renewal within the renew deadline");
                        break "no renewal within the renew deadline";
                    }
                }
            };
            self.leadership.give_up();
            tracing::warn!(identity = %self.config.identity, reason = lost, "leader election: lost the Lease; writes stopped");
        }
    }
}

/// `base` to `base × 2.2`, spread by the clock's nanoseconds (client-go's JitterFactor 1.2).
fn jitter(base: Duration) -> Duration {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    base + base.mul_f64(1.2 * f64::from(nanos % 1000) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// client-go's order of the durations, checked where the flags are read: the lease outlives
    /// the renew deadline, which outlives the retry period with its jitter; each bound is
    /// strict, and a refusal says which (mutations: `None` or an empty message for any config).
    #[test]
    fn the_lease_durations_must_keep_client_gos_order() {
        let ms = Duration::from_millis;
        let config = |lease: u64, renew: u64, retry: u64| LeaseConfig {
            lease_duration: ms(lease),
            renew_deadline: ms(renew),
            retry_period: ms(retry),
            ..LeaseConfig::new("keyward-controller", "keyward-system", "pod-a")
        };
        assert_eq!(LeaseConfig::new("l", "ns", "id").problem(), None, "the defaults: 15 s, 10 s, 2 s");
        assert_eq!(config(10_001, 10_000, 2_000).problem(), None);
        assert_eq!(
            config(10_000, 10_000, 2_000).problem().as_deref(),
            Some("the lease duration (10s) must be longer than the renew deadline (10s)")
        );
        assert_eq!(config(10_000, 2_401, 2_000).problem(), None);
        assert_eq!(
            config(10_000, 2_400, 2_000).problem().as_deref(),
            Some("the renew deadline (2.4s) must be longer than 1.2 × the retry period (2s)")
        );
    }

    /// Guards the mutation "`is_leader` no longer compares the clock with the deadline" (issue
    /// 27: it survived because the elector's own timeout gives up at the same instant, so the
    /// clock check was never what stopped a write). Here no elector runs at all: with the
    /// clock paused, leadership set to lapse at the renew deadline answers `NotLeader` the
    /// moment the clock reaches it, though nothing gave it up.
    #[tokio::test(start_paused = true)]
    async fn a_leader_past_its_renew_deadline_stops_writing_before_its_elector_notices() {
        let leadership = Leadership::new(false);
        assert!(matches!(leadership.check(), Err(Error::NotLeader)), "not leading before it is extended");
        let renew_deadline = Duration::from_secs(10);
        let until = Instant::now() + renew_deadline;
        leadership.extend(until);
        assert!(leadership.check().is_ok());
        tokio::time::advance(renew_deadline - Duration::from_millis(1)).await;
        assert!(leadership.check().is_ok(), "still inside the renew deadline");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(matches!(leadership.check(), Err(Error::NotLeader)), "at the deadline, writes stop");
        // Nothing gave it up: the deadline alone stopped the writes.
        assert_eq!(leadership.until(), Some(until));
    }

    /// What the loop waits on: `changed()` returns when leadership is gained, given up, or
    /// lapses on the clock, and not before (mutations: `changed` always `true`, the lapse
    /// ignored, a first gain not announced, `give_up` doing nothing).
    #[tokio::test(start_paused = true)]
    async fn a_change_of_leadership_is_seen_when_gained_given_up_or_lapsed() {
        use tokio::time::timeout;
        let elector = Leadership::new(false);
        let mut watcher = elector.clone();
        // Nothing happens: nothing is seen.
        assert!(timeout(Duration::from_secs(60), watcher.changed()).await.is_err(), "no change, no wake-up");
        // Gained: seen at once.
        let waiting = tokio::spawn(async move {
            let seen = watcher.changed().await;
            (seen, watcher)
        });
        tokio::task::yield_now().await;
        elector.extend(Instant::now() + Duration::from_secs(10));
        let (seen, mut watcher) = timeout(Duration::from_millis(1), waiting).await.unwrap().unwrap();
        assert!(seen && watcher.is_leader(), "gained");
        // Renewed while leading: no wake-up; the lapse at the deadline is one.
        elector.extend(Instant::now() + Duration::from_secs(10));
        let started = Instant::now();
        assert!(timeout(Duration::from_secs(30), watcher.changed()).await.unwrap());
        assert_eq!(started.elapsed(), Duration::from_secs(10), "woken at the deadline, not before");
        assert!(!watcher.is_leader(), "lapsed");
        // The elector, noticing, gives up: seen at once. Then it leads again: seen at once.
        elector.give_up();
        assert!(timeout(Duration::from_millis(1), watcher.changed()).await.unwrap(), "given up after the lapse");
        elector.extend(Instant::now() + Duration::from_secs(3600));
        assert!(timeout(Duration::from_millis(1), watcher.changed()).await.unwrap(), "gained again");
        assert!(watcher.is_leader());
        // Given up while leading: no more writes, and seen.
        elector.give_up();
        assert!(!elector.is_leader() && matches!(elector.check(), Err(Error::NotLeader)));
        assert!(timeout(Duration::from_millis(1), watcher.changed()).await.unwrap(), "given up");
        assert_eq!(watcher.until(), None);
    }

    /// A standby's attempts are spaced by the retry period plus up to 1.2 times it (client-go's
    /// jitter), never closer: a zero wait would poll the API server in a loop (mutation: `jitter`
    /// returning zero).
    #[test]
    fn the_jitter_waits_between_one_and_two_point_two_retry_periods() {
        let base = Duration::from_secs(2);
        for _ in 0..100 {
            let wait = jitter(base);
            assert!(wait >= base && wait <= base.mul_f64(2.2), "{wait:?}");
        }
    }
}
