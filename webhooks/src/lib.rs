//! keyward's injection engine (the `webhooks/` directory): what the webhook decides.
//!
//! Everything here is pure: `(request facts, pod, profiles) -> Decision`. No async, no clock,
//! no I/O. The binary reads files and sockets; this crate only decides.
//!
//! Layers, each using only those above it in this list:
//! - [`text`], [`names`]: clipping and quoting, Kubernetes' name rules, globs, name templates;
//!   [`rotation`]: the kubelet's token rotation against a token's reader.
//! - [`inject`]: the building blocks of an injection (volume, mount, env, audit entry, checks).
//! - [`kinds`]: one module per kind of injection, and the registry that lists them.
//! - [`profile`]: the `InjectionProfile` schema (listing the kinds), loading and validation;
//!   [`cluster`]: the cluster facts `delivery: auto` resolves against.
//! - [`pod`]: the narrow view of the pod, decoded from the raw request.
//! - [`select`], `plan`, `placement`, `check`, [`audit`], [`binding`], [`attest`]: selection, the
//!   patch (and keyward gate's placement in the pod), the self-check, the record, what an
//!   attestation binds of the pod, and the attestation itself.
//! - [`decision`]: the request facts, the object as read, the decision's types.
//! - [`engine`]: makes the decision; [`review`]: the AdmissionReview envelope in and out.
//!   Neither imports the other.
//! - [`match_conditions`]: the webhook configuration's CEL, from the profiles.

#![warn(unreachable_pub)]

pub mod attest;
pub mod audit;
pub mod binding;
mod check;
pub mod cluster;
pub mod decision;
pub mod engine;
mod error;
pub mod inject;
pub mod kinds;
pub mod match_conditions;
pub mod names;
pub mod patch;
mod placement;
mod plan;
pub mod pod;
pub mod profile;
pub mod review;
pub mod rotation;
pub mod select;
pub mod text;
pub mod tree;
pub mod yaml;

pub use attest::{Attestor, ANNOTATION_ATTESTATION};
pub use audit::{
    AuditRecord, ContainerScope, ANNOTATION_INJECTED, ANNOTATION_ORIGINAL_SA, LABEL_PROFILE,
    TOTAL_ANNOTATION_SIZE_LIMIT,
};
pub use cluster::ClusterFacts;
pub use engine::{
    decide, explain, Decision, Denial, Explanation, Mutation, ProfileTrace, Reason, RequestFacts, Requester,
};
pub use error::{Error, ProfileError};
pub use inject::{ObjectKind, Provider, Provision, Requirement};
pub use profile::{Profile, ProfileSet};
