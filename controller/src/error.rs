//! The controller's one error type.

/// Everything that can go wrong while reconciling; each is logged with what it was about, and
/// retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Certs(#[from] keyward_certs::Error),
    #[error("no client CA loaded from {dir}: {reason}")]
    NoClientCa { dir: String, reason: String },
    #[error("the client CA in {dir} is not a CA certificate (basicConstraints CA:TRUE); mount the keyward-client-ca Secret, not a leaf")]
    NotACa { dir: String },
    #[error("no system randomness for a token")]
    Randomness,
    #[error("not the leader: nothing is written")]
    NotLeader,
    #[error("{0} did not finish in time")]
    Timeout(String),
    #[error("the attestation keys are not loaded yet (the Secret keyward-attestation is read when this replica starts leading)")]
    NoAttestationKeys,
    #[error("{what}: {reason}")]
    Source { what: String, reason: String },
    #[error("{0}: the watched copy was behind the API server; retrying when it catches up")]
    Stale(String),
    #[error("object {0} has no resourceVersion or name")]
    Malformed(String),
}
