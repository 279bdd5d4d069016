use std::path::PathBuf;
use std::time::SystemTime;

/// Everything that can go wrong with a certificate. Each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // `error`, not `source`: the message says it already, and a source would print it twice.
    #[error("{}: cannot read: {error}{}", path.display(), permission_hint(error))]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{}: cannot write: {error}", path.display())]
    Write { path: PathBuf, error: std::io::Error },
    #[error("{}: no PEM certificate in the file", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file: {reason}", path.display())]
    NoKey { path: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    #[error("{}: unsupported private key: {reason}", path.display())]
    UnsupportedKey { path: PathBuf, reason: String },
    #[error("{}: the private key does not match the certificate in {}", key.display(), cert.display())]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("{}: the certificate is not valid until {}", path.display(), rfc3339(*not_before))]
    NotYetValid { path: PathBuf, not_before: SystemTime },
    #[error("{}: the certificate expired at {}", path.display(), rfc3339(*not_after))]
    Expired { path: PathBuf, not_after: SystemTime },
    #[error("{}: not a CA certificate ({subject} lacks basicConstraints CA:TRUE); give the CA's certificate, not a leaf", path.display())]
    NotACa { path: PathBuf, subject: String },
    #[error("{0}; fix or remove ca.crt and ca.key to mint a new development CA (clients that trusted the old one must then trust the new ca.crt)")]
    DevCa(Box<Error>),
    #[error("{what}: {reason}")]
    BadKey { what: String, reason: String },
    #[error("cannot mint a certificate: {0}")]
    Mint(String),
    #[error("cannot watch {}: {reason}", path.display())]
    Watch { path: PathBuf, reason: String },
    #[error("{}: no tls.crt here, but in {}: inspect one of those (as `keyward certs mint --out` writes them)", dir.display(), inside.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    CertificatesBelow { dir: PathBuf, inside: Vec<PathBuf> },
}

/// What to do when a mounted file is not readable by this process: a Secret mounted 0440 is
/// readable through the pod's fsGroup only.
fn permission_hint(error: &std::io::Error) -> &'static str {
    if error.kind() == std::io::ErrorKind::PermissionDenied {
        " (a Secret volume mounted 0440 is readable through the pod's group only: set the pod's securityContext.fsGroup, to 65532 say, as OpenShift does for every pod)"
    } else {
        ""
    }
}

/// Parses an RFC 3339 time (what [`rfc3339`] writes); `None` when it is not one.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    Some(SystemTime::from(t))
}

/// RFC 3339 in UTC, for messages.
pub fn rfc3339(t: SystemTime) -> String {
    let dt = time::OffsetDateTime::from(t);
    dt.format(&time::format_description::well_known::Rfc3339).unwrap_or_else(|_| format!("{dt}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_file_says_how_a_pod_reads_a_0440_secret() {
        let path = PathBuf::from("/var/run/keyward/gate-tls/tls.key");
        let denied =
            Error::Read { path: path.clone(), error: std::io::Error::from(std::io::ErrorKind::PermissionDenied) };
        assert_eq!(
            denied.to_string(),
            "/var/run/keyward/gate-tls/tls.key: cannot read: permission denied (a Secret volume mounted 0440 is readable through the pod's group only: set the pod's securityContext.fsGroup, to 65532 say, as OpenShift does for every pod)"
        );
        let missing = Error::Read { path, error: std::io::Error::from(std::io::ErrorKind::NotFound) };
        assert_eq!(missing.to_string(), "/var/run/keyward/gate-tls/tls.key: cannot read: entity not found");
    }
}
