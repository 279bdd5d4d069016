//! keyward's injection engine.
//!
//! Everything here is pure: `(request facts, pod, profiles) -> Decision`. No async, no clock,
//! no I/O. The binary reads files and sockets; this crate only decides.
//!
//! - [`profile`]: the `InjectionProfile` format, its validation, and the built-in profiles.
//! - [`select`]: which profile selects a pod, and whether the requester may have it.
//! - [`engine`]: the decision, built by one small injector per kind of credential.
//! - [`review`]: the AdmissionReview v1 envelope, as the apiserver sends and expects it.

mod audit;
pub mod engine;
mod error;
mod inject;
pub mod names;
mod patch;
pub mod profile;
pub mod review;
pub mod select;
pub mod text;
pub mod validate;

pub use audit::{
    AuditRecord, ContainerScope, InjectedItem, ANNOTATION_INJECTED, ANNOTATION_ORIGINAL_SA, TOTAL_ANNOTATION_SIZE_LIMIT,
};
pub use engine::{decide, Decision, Denial, Mutation, ProfileTrace, RequestFacts, Requester};
pub use error::{Error, ProfileError};
pub use profile::{Profile, ProfileSet};
