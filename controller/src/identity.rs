//! Client certificates and generated tokens: issuing them, and deciding when a certificate
//! must be renewed. No API calls.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use keyward_certs::pki::Ca;
use keyward_certs::DnType;
use keyward_engine::text::prefix;

use crate::desired::Owner;
use crate::error::Error;

/// The keys of a `kubernetes.io/tls` Secret, and the CA beside them.
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CA_CRT: &str = "ca.crt";

/// The store for the client CA mounted at `dir` (cert-manager's `tls.crt`, `tls.key`, with
/// the key in any encoding it writes). A pair that cannot issue (not a CA, a key that cannot
/// sign) is refused like a half-written file: the last good CA keeps signing, and until one
/// has loaded the controller is not ready.
pub fn client_ca_store(dir: &std::path::Path) -> keyward_certs::CertStore {
    keyward_certs::CertStore::new(dir).named("client CA").checked_with(keyward_certs::pki::can_issue)
}

/// A freshly issued client certificate: `tls.crt`, `tls.key`, and the client CA as `ca.crt`.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
    pub not_after: SystemTime,
}

/// Issues a client certificate for `owner` in `namespace`: an ECDSA P-256 key generated here,
/// the SPIFFE ID `identity` as its only URI SAN, and the subject O = namespace, OU = kind,
/// CN = name (each cut to the 64 characters X.509 allows; the URI is the identity to trust).
pub fn issue(
    ca: &Ca,
    namespace: &str,
    owner: &Owner,
    identity: &str,
    now: SystemTime,
    validity: Duration,
) -> Result<Issued, Error> {
    let minted = ca.issue_client_identity(&subject(namespace, owner), identity, now, validity)?;
    Ok(Issued {
        cert_pem: minted.cert_pem,
        key_pem: minted.key_pem,
        ca_pem: ca.cert_pem().to_string(),
        not_after: now + validity,
    })
}

/// A client certificate for `owner` for a key made on a node (a PodCertificateRequest's),
/// with the same subject and identity as [`issue`], valid over `window` exactly.
pub fn issue_for_key(
    ca: &Ca,
    namespace: &str,
    owner: &Owner,
    identity: &str,
    spki_der: &[u8],
    window: &crate::signer::Window,
) -> Result<String, Error> {
    Ok(ca.issue_for_key(spki_der, &subject(namespace, owner), identity, window.not_before, window.not_after)?)
}

/// O = namespace, OU = kind, CN = name, each cut to the 64 characters X.509 allows (the URI is
/// the identity to trust; the subject is for servers that read it).
fn subject<'a>(namespace: &'a str, owner: &'a Owner) -> [(DnType, &'a str); 3] {
    [
        (DnType::OrganizationName, prefix(namespace, 64)),
        (DnType::OrganizationalUnitName, prefix(&owner.kind, 64)),
        (DnType::CommonName, prefix(&owner.name, 64)),
    ]
}

/// Whether an existing certificate Secret's data is still good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// Keep it; it expires then.
    Fresh { not_after: SystemTime },
    /// Replace it, for this reason.
    Due(String),
}

/// Renew at two thirds of the certificate's life, when the client CA changed, when the
/// identity is not the owner's, or when the data is not a certificate and its key.
pub fn renewal(
    cert: Option<&[u8]>,
    key: Option<&[u8]>,
    ca: Option<&[u8]>,
    current_ca_pem: &str,
    identity: &str,
    now: SystemTime,
) -> Renewal {
    let (Some(cert), Some(key)) = (cert, key) else {
        return Renewal::Due("tls.crt or tls.key is missing".into());
    };
    let pair = match keyward_certs::pem::load_pair(cert, key, TLS_CRT.as_ref(), TLS_KEY.as_ref()) {
        Ok(pair) => pair,
        Err(e) => return Renewal::Due(format!("the certificate and key do not load: {e}")),
    };
    if ca.map(|c| String::from_utf8_lossy(c).trim().to_string()) != Some(current_ca_pem.trim().to_string()) {
        return Renewal::Due("the client CA changed".into());
    }
    if !pair.info.uris.iter().any(|u| u == identity) {
        return Renewal::Due(format!("it does not name {identity}"));
    }
    let info = &pair.info;
    if now >= renewal_time(info) {
        return Renewal::Due("two thirds of its life have passed".into());
    }
    Renewal::Fresh { not_after: info.not_after }
}

/// Whether the first certificate of `cert_pem` chains to `ca` for client authentication, as an
/// mTLS server checks it: keyward signed it (a Secret's own `ca.crt` proves nothing).
pub fn issued_by(cert_pem: &[u8], ca: &Ca) -> bool {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let (Ok(leaf), Ok(root)) =
        (CertificateDer::from_pem_slice(cert_pem), CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()))
    else {
        return false;
    };
    keyward_certs::inspect::accepted_as_client(&[leaf], &[root], SystemTime::now()).is_ok()
}

/// When a certificate is due for renewal: two thirds into its life.
pub fn renew_at(cert_pem: Option<&[u8]>) -> Option<SystemTime> {
    let info = keyward_certs::pem::cert_info(cert_pem?, TLS_CRT.as_ref()).ok()?;
    Some(renewal_time(&info))
}

/// The renewal rule, on a certificate already read (`keyward audit` reports one past it).
pub fn renewal_time(info: &keyward_certs::pem::CertInfo) -> SystemTime {
    let life = info.not_after.duration_since(info.not_before).unwrap_or_default();
    info.not_before + life * 2 / 3
}

/// 32 random bytes, base64url without padding (43 characters).
pub fn generate_token() -> Result<String, Error> {
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(|_| Error::Randomness)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            api_version: "foundation-model-stack.github.com.github.com/v1beta1".into(),
            kind: "LMEvalJob".into(),
            name: "evaljob-sample".into(),
            uid: "u-1".into(),
        }
    }

    #[test]
    fn a_certificate_names_its_owner_and_renews_at_two_thirds() {
        let now = SystemTime::now();
        let ca = Ca::mint("keyward client CA", now, Duration::from_secs(365 * 86400)).unwrap();
        let id = "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";
        let day = Duration::from_secs(86400);
        let issued = issue(&ca, "team-a", &owner(), id, now, day).unwrap();
        let info = keyward_certs::pem::cert_info(issued.cert_pem.as_bytes(), "tls.crt".as_ref()).unwrap();
        assert_eq!(info.uris, [id]);
        assert!(info.subject.contains("CN=evaljob-sample") && info.subject.contains("O=team-a"), "{}", info.subject);
        assert!(!info.is_ca);

        let check = |at: SystemTime, ca_pem: &str, id: &str| {
            renewal(
                Some(issued.cert_pem.as_bytes()),
                Some(issued.key_pem.as_bytes()),
                Some(issued.ca_pem.as_bytes()),
                ca_pem,
                id,
                at,
            )
        };
        assert!(matches!(check(now, ca.cert_pem(), id), Renewal::Fresh { .. }));
        // not_before is five minutes early, so two thirds of the life is a little before 16 h.
        assert!(matches!(check(now + Duration::from_secs(15 * 3600), ca.cert_pem(), id), Renewal::Fresh { .. }));
        assert_eq!(
            check(now + Duration::from_secs(16 * 3600), ca.cert_pem(), id),
            Renewal::Due("two thirds of its life have passed".into())
        );
        let other = Ca::mint("another CA", now, day).unwrap();
        assert_eq!(check(now, other.cert_pem(), id), Renewal::Due("the client CA changed".into()));
        assert!(
            matches!(check(now, ca.cert_pem(), "spiffe://cluster.local/ns/x/job/y"), Renewal::Due(r) if r.starts_with("it does not name"))
        );
        assert!(matches!(
            renewal(Some(issued.cert_pem.as_bytes()), Some(b"garbage"), Some(issued.ca_pem.as_bytes()), ca.cert_pem(), id, now),
            Renewal::Due(r) if r.starts_with("the certificate and key do not load")
        ));
        assert_eq!(
            renewal(None, None, None, ca.cert_pem(), id, now),
            Renewal::Due("tls.crt or tls.key is missing".into())
        );
    }

    #[test]
    fn tokens_are_32_random_bytes_in_base64url() {
        let a = generate_token().unwrap();
        let b = generate_token().unwrap();
        assert_eq!(a.len(), 43);
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'), "{a}");
    }
}
