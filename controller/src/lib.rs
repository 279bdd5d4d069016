//! keyward's controller: it makes every object the profiles mark as provided by keyward exist,
//! stay valid, and go away with its owner or when its namespace opts out.
//!
//! [`run`] wires the watches ([`watches`]) to one work queue of [`keys`] and dispatches each key to the controller of its
//! kind of work; each controller is a module of reconcile functions over the shared
//! [`context::Context`] (the write helpers, leadership checks and reporting live there and in
//! [`report`]), and none imports another:
//!
//! - [`namespaces`]: per opted-in namespace, the server CA copies and provisioned accounts.
//! - [`owners`]: per owner, its client certificate and generated token.
//! - [`trust`]: the client CA published (ConfigMaps, ClusterTrustBundles), server CA bundles.
//! - [`singletons`]: the cluster facts, the attestation keys, the self-managed certificates,
//!   the webhook configuration's `matchConditions`.
//! - [`signing`]: PodCertificateRequests of keyward's signers.
//!
//! Below them, pure or nearly so:
//!
//! - [`attestation`]: the admission attestation as the controller checks it (pure).
//! - [`conditions`]: states it reports and works around rather than fails on.
//! - [`desired`]: what should exist, from the profiles and a live pod (pure).
//! - [`identity`]: client certificates (issue, renew) and generated tokens.
//! - [`objects`]: the Kubernetes objects keyward writes (pure).
//! - [`leader`]: Lease-based leader election (client-go semantics).
//! - [`self_managed`]: the same against the API: the leader writes the Secret and `caBundle`.
//! - [`serving`]: the webhook's serving certificate and `caBundle`, when keyward manages them (pure).
//! - [`signer`]: keyward as the signer of pod certificates: what a request says, what to answer (pure).
//! - [`webhook_config`]: the webhook configuration's `matchConditions`, kept equal to the profiles.

#![warn(unreachable_pub)]

pub mod attestation;
pub mod client;
pub mod conditions;
pub mod context;
pub mod desired;
mod error;
pub mod identity;
pub mod index;
pub mod keys;
pub mod leader;
pub mod metrics;
pub mod namespaces;
pub mod objects;
pub mod owners;
pub mod queue;
mod report;
pub mod run;
pub mod self_managed;
pub mod serving;
pub mod signer;
pub mod signing;
pub mod singletons;
pub mod trust;
mod watched_pod;
mod watches;
pub mod webhook_config;

pub use context::{Context, Settings};
pub use error::Error;
pub use leader::{LeaderElector, Leadership, LeaseConfig};
pub use metrics::Metrics;
