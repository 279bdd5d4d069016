//! What the upstream learns: the verified caller, in the headers kube-rbac-proxy sends
//! (`X-Remote-User`, `X-Remote-Groups`) and in keyward's own (`X-Keyward-Identity`), after
//! every copy the client sent of any identity header is removed. kube-rbac-proxy overwrites
//! only the two it sets, so a client's `X-Remote-Extra-*` or `X-Forwarded-Client-Cert` would
//! reach an upstream that trusts them; the gate removes those too.

use crate::rules::Caller;
use crate::starts_with_ignore_case;

pub const REMOTE_USER: &str = "x-remote-user";
pub const REMOTE_GROUPS: &str = "x-remote-groups";
pub const KEYWARD_IDENTITY: &str = "x-keyward-identity";

/// Whether a client-sent header claims an identity, and so must not reach the upstream: the
/// headers the gate sets, their variants (`X-Remote-Group`, `X-Remote-Extra-*`), anything
/// `X-Keyward-*`, and the client-certificate headers proxies forward (Envoy's
/// `X-Forwarded-Client-Cert`, nginx's `Ssl-Client-*`).
pub fn claims_identity(name: &str) -> bool {
    ["x-remote-", "x-keyward-", "ssl-client"].iter().any(|p| starts_with_ignore_case(name, p))
        || ["x-forwarded-client-cert", "x-forwarded-user", "x-auth-request-user"]
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n))
}

/// The headers the gate adds for `caller`. `groups` are a service account's groups as its
/// TokenReview returned them; a workload's are keyward's own. Every value is checked to be
/// printable ASCII (an identity is built of Kubernetes names; a group from the API server is
/// checked all the same, and one that is not printable, or holds the `|` that joins them, is
/// left out), so no header can be split.
pub fn identity_headers(caller: &Caller, groups: &[String]) -> Vec<(&'static str, String)> {
    let (user, groups): (String, Vec<String>) = match caller {
        Caller::Workload(id) => (
            id.to_string(),
            vec![
                "keyward:workloads".into(),
                format!("keyward:workloads:{}", id.namespace),
                "system:authenticated".into(),
            ],
        ),
        Caller::ServiceAccount(sa) => (sa.to_string(), groups.to_vec()),
        Caller::User(user) => (user.to_string(), groups.to_vec()),
        // An upstream that reads these learns of no one: none are sent.
        Caller::Anonymous => return Vec::new(),
    };
    let printable = |s: &str| s.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'|');
    let groups: Vec<String> = groups.into_iter().filter(|g| !g.is_empty() && printable(g)).collect();
    let mut out = vec![(REMOTE_USER, user.clone())];
    if !groups.is_empty() {
        // One header, '|'-joined, as kube-rbac-proxy sends it.
        out.push((REMOTE_GROUPS, groups.join("|")));
    }
    if let Caller::Workload(_) = caller {
        out.push((KEYWARD_IDENTITY, user));
    }
    // The user is an identity built of checked Kubernetes names: printable by construction.
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{ServiceAccount, WorkloadIdentity};

    #[test]
    fn every_identity_header_a_client_could_send_is_recognised_in_any_case() {
        for name in [
            "X-Remote-User",
            "x-remote-user",
            "X-REMOTE-GROUPS",
            "X-Remote-Group",
            "X-Remote-Extra-Scopes",
            "X-Keyward-Identity",
            "x-keyward-anything",
            "X-Forwarded-Client-Cert",
            "SSL-Client-Cert",
            "X-Forwarded-User",
            "X-Auth-Request-User",
        ] {
            assert!(claims_identity(name), "{name}");
        }
        for name in ["Authorization", "Content-Type", "X-Request-Id", "grpc-timeout", "te", "X-Remote"] {
            assert!(!claims_identity(name), "{name}");
        }
    }

    #[test]
    fn a_workload_is_named_as_kube_rbac_proxy_and_keyward_name_it() {
        let id = WorkloadIdentity::parse("spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample").unwrap();
        assert_eq!(
            identity_headers(&Caller::Workload(id), &["ignored".into()]),
            [
                (REMOTE_USER, "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample".to_string()),
                (REMOTE_GROUPS, "keyward:workloads|keyward:workloads:team-a|system:authenticated".to_string()),
                (KEYWARD_IDENTITY, "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample".to_string()),
            ]
        );
    }

    #[test]
    fn a_service_account_carries_its_tokenreview_groups_and_nothing_that_could_split_a_header() {
        let sa = ServiceAccount::parse("system:serviceaccount:kubeflow:runner").unwrap();
        let groups = ["system:serviceaccounts".into(), "bad\r\nX-Remote-User: admin".into(), "a|b".into(), "".into()];
        assert_eq!(
            identity_headers(&Caller::ServiceAccount(sa), &groups),
            [
                (REMOTE_USER, "system:serviceaccount:kubeflow:runner".to_string()),
                (REMOTE_GROUPS, "system:serviceaccounts".to_string()),
            ]
        );
    }
}
