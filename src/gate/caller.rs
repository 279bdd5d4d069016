//! Who is calling, from what the transport verified: the client certificate's one SPIFFE URI,
//! or a bearer token's account as the API server's TokenReview names it.

use keyward_gate::identity::WorkloadIdentity;
use x509_parser::extensions::GeneralName;

/// The workload identity a verified client certificate names. An X509-SVID carries exactly
/// one URI SAN, and only keyward's own form of it is read (`WorkloadIdentity::parse`); a
/// certificate with none, with more than one, or with two SAN extensions names no one.
pub fn workload_of(der: &[u8]) -> Result<WorkloadIdentity, String> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| format!("the client certificate cannot be read: {e}"))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("the client certificate's subject alternative names cannot be read: {e}"))?;
    let uris: Vec<&str> = san
        .iter()
        .flat_map(|s| s.value.general_names.iter())
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(*u),
            _ => None,
        })
        .collect();
    match uris.as_slice() {
        [uri] => WorkloadIdentity::parse(uri).map_err(|e| format!("the client certificate's URI: {e}")),
        [] => Err("the client certificate has no URI SAN: a keyward certificate names its workload in one (spiffe://TRUST-DOMAIN/ns/NAMESPACE/KIND/NAME)".into()),
        more => Err(format!(
            "the client certificate has {} URI SANs; a workload certificate (an X509-SVID) has exactly one",
            more.len()
        )),
    }
}

/// The token of an `Authorization: Bearer` header: `None` when there is none, an error when
/// the header is there but is not one bearer token.
pub fn bearer_token(headers: &http::HeaderMap) -> Result<Option<&str>, String> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err("the request has more than one Authorization header".into());
    }
    let value = value.to_str().map_err(|_| "the Authorization header is not ASCII".to_string())?;
    let token = match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
        _ => return Err("the Authorization header is not `Bearer TOKEN`".into()),
    };
    if token.is_empty() || token.contains(' ') {
        return Err("the Authorization header is not `Bearer TOKEN`".into());
    }
    Ok(Some(token))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    use keyward_certs::pki::Ca;
    use keyward_certs::DnType;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    fn der(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
    }

    #[test]
    fn the_one_spiffe_uri_names_the_caller_and_anything_else_names_no_one() {
        let ca = Ca::mint("client CA", SystemTime::now(), Duration::from_secs(86_400)).unwrap();
        let issue = |uri: &str| {
            der(&ca
                .issue_client_identity(&[(DnType::CommonName, "x")], uri, SystemTime::now(), Duration::from_secs(3600))
                .unwrap()
                .cert_pem)
        };
        let id = workload_of(&issue("spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample")).unwrap();
        assert_eq!(
            (id.namespace.as_str(), id.kind.as_str(), id.name.as_str()),
            ("team-a", "lmevaljob", "evaljob-sample")
        );
        for (uri, says) in [
            ("spiffe://cluster.local/ns/team-a/lmevaljob/../team-b", "the client certificate's URI: "),
            ("spiffe://cluster.local/ns/team-a/lmevaljob/a%2Fb", "the client certificate's URI: "),
        ] {
            let err = workload_of(&issue(uri)).unwrap_err();
            assert!(err.starts_with(says), "{uri}: {err}");
        }
        let plain = der(&ca.issue_client("no uri", SystemTime::now(), Duration::from_secs(3600)).unwrap().cert_pem);
        assert!(workload_of(&plain).unwrap_err().starts_with("the client certificate has no URI SAN"));
        assert!(workload_of(b"not DER").unwrap_err().starts_with("the client certificate cannot be read"));
    }

    #[test]
    fn a_bearer_token_is_one_word_after_bearer() {
        let mut h = http::HeaderMap::new();
        assert_eq!(bearer_token(&h), Ok(None));
        h.insert(http::header::AUTHORIZATION, "Bearer abc.def".parse().unwrap());
        assert_eq!(bearer_token(&h), Ok(Some("abc.def")));
        h.insert(http::header::AUTHORIZATION, "bearer  abc".parse().unwrap());
        assert_eq!(bearer_token(&h), Ok(Some("abc")));
        h.insert(http::header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer_token(&h).unwrap_err(), "the Authorization header is not `Bearer TOKEN`");
        h.insert(http::header::AUTHORIZATION, "Bearer a b".parse().unwrap());
        assert!(bearer_token(&h).is_err());
        h.append(http::header::AUTHORIZATION, "Bearer c".parse().unwrap());
        assert_eq!(bearer_token(&h).unwrap_err(), "the request has more than one Authorization header");
    }
}
