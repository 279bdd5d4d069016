//! keyward's controller: it makes every object the profiles mark as provided by keyward exist,
//! stay valid, and go away with its owner or when its namespace opts out.
//!
//! - [`attestation`]: the admission attestation as the controller checks it (pure).
//! - [`conditions`]: states it reports and works around rather than fails on.
//! - [`desired`]: what should exist, from the profiles and a live pod (pure).
//! - [`identity`]: client certificates (issue, renew) and generated tokens.
//! - [`objects`]: the Kubernetes objects keyward writes (pure).
//! - [`reconcile`]: the writes, each behind the leadership check and the ownership check.
//! - [`leader`]: Lease-based leader election (client-go semantics).
//! - [`run`]: the watches, the work queue with backoff, and the periodic resync.
//! - [`self_managed`]: the same against the API: the leader writes the Secret and `caBundle`.
//! - [`serving`]: the webhook's serving certificate and `caBundle`, when keyward manages them (pure).
//! - [`signer`]: keyward as the signer of pod certificates: what a request says, what to answer (pure).
//! - [`webhook_config`]: the webhook configuration's `matchConditions`, kept equal to the profiles.

#![warn(unreachable_pub)]

pub mod attestation;
pub mod client;
pub mod conditions;
pub mod desired;
mod error;
pub mod identity;
pub mod index;
pub mod leader;
pub mod metrics;
pub mod objects;
pub mod queue;
pub mod reconcile;
pub mod run;
pub mod self_managed;
pub mod serving;
pub mod signer;
pub mod webhook_config;

pub use error::Error;
pub use leader::{LeaderElector, Leadership, LeaseConfig};
pub use metrics::Metrics;
pub use reconcile::{Reconciler, Settings};
