//! Leader election on a `coordination.k8s.io` Lease, with client-go's semantics: only the
//! leader writes; a Lease held by another is respected until it has not changed for its whole
//! duration *as observed on this replica's clock* (remote timestamps are never compared with
//! the local clock, so clock skew cannot elect two leaders); a leader that cannot renew within
//! the renew deadline, or finds the Lease taken, stops writing at once.

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
}

/// Whether this replica may write now. Cheap to clone; checked before every write.
#[derive(Debug, Clone)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    /// For [`Leadership::always`]: the sender, kept so the value never closes.
    _fixed: Option<std::sync::Arc<watch::Sender<bool>>>,
}

impl Leadership {
    /// Always the leader (a single replica without election, and tests).
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self { rx, _fixed: Some(std::sync::Arc::new(tx)) }
    }

    pub fn from_receiver(rx: watch::Receiver<bool>) -> Self {
        Self { rx, _fixed: None }
    }

    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// `Err(NotLeader)` unless this replica leads: the check before every write.
    pub fn check(&self) -> Result<(), Error> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// Waits until leadership changes.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
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
    /// The last (holder, renewTime, duration) seen, and when it was seen to change, locally.
    observed: Option<(Option<String>, Option<MicroTime>, i32)>,
    observed_at: Instant,
}

impl LeaderElector {
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        Self { api: Api::namespaced(client, &config.namespace), config, observed: None, observed_at: Instant::now() }
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

    /// Acquires, leads, renews; `leading` says which, until every receiver is gone (then the
    /// Lease is released).
    pub async fn run(mut self, leading: watch::Sender<bool>) {
        loop {
            loop {
                match self.try_acquire_or_renew().await {
                    Ok(Attempt::Held) => break,
                    Ok(Attempt::Taken) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, lease = %self.config.name, "leader election: cannot read or write the Lease; retrying")
                    }
                }
                if leading.is_closed() {
                    return;
                }
                tokio::time::sleep(jitter(self.config.retry_period)).await;
            }
            tracing::info!(identity = %self.config.identity, lease = %self.config.name, "leader election: leading");
            leading.send_replace(true);
            let mut renewed = Instant::now();
            loop {
                tokio::time::sleep(self.config.retry_period).await;
                if leading.is_closed() {
                    if let Err(e) = self.release().await {
                        tracing::warn!(error = %e, "leader election: could not release the Lease");
                    }
                    return;
                }
                match self.try_acquire_or_renew().await {
                    Ok(Attempt::Held) => renewed = Instant::now(),
                    // Someone else holds it: stop writing now, not at the deadline.
                    Ok(Attempt::Taken) => break,
                    Err(e) if renewed.elapsed() < self.config.renew_deadline => {
                        tracing::warn!(error = %e, "leader election: renewal failed; retrying within the renew deadline");
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "leader election: no renewal within the renew deadline");
                        break;
                    }
                }
            }
            leading.send_replace(false);
            tracing::warn!(identity = %self.config.identity, "leader election: lost the Lease; writes stopped");
        }
    }
}

/// `base` to `base × 2.2`, spread by the clock's nanoseconds (client-go's JitterFactor 1.2).
fn jitter(base: Duration) -> Duration {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    base + base.mul_f64(1.2 * f64::from(nanos % 1000) / 1000.0)
}
