//! The pure core of `keyward gate`, the control plane's side of keyward: who is calling and
//! what a request names, read strictly, so that a rule can let each job act only as itself.
//! No I/O here: the gate's transport (TLS, HTTP/1.1 and HTTP/2, the upstream) lives in the
//! binary, as `keyward serve` does; this crate is what it decides with, tested on its own.

pub mod config;
pub mod grpc;
pub mod headers;
pub mod identity;
pub mod json;
pub mod owners;
pub mod refusal;
pub mod route;
pub mod rules;
pub mod token_cache;

/// Why a caller or a request cannot be read. Each message names what was wrong and, where the
/// caller can fix it, how.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Not an identity the gate accepts (a SPIFFE ID or a TokenReview username).
    #[error("{0}")]
    Identity(String),
    /// A gRPC request the gate cannot read as the rule needs.
    #[error("gRPC request: {0}")]
    Grpc(String),
    /// A JSON request body the gate cannot read as the rule needs.
    #[error("JSON request: {0}")]
    Json(String),
    /// A request path the gate will not judge: one the upstream could read another way.
    #[error("{0}")]
    Path(String),
}

/// Whether `s` starts with `prefix`, ASCII case ignored, without a lower-cased copy (header
/// names and content types are read on every request).
pub(crate) fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}
