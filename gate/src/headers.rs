//! What the upstream learns: the verified caller, in the headers kube-rbac-proxy sends
//! (`X-Remote-User`, `X-Remote-Groups`) and in keyward's own (`X-Keyward-Identity`), after
//! every copy the client sent of any identity header is removed. kube-rbac-proxy overwrites
//! only the two it sets, so a client's `X-Remote-Extra-*` or `X-Forwarded-Client-Cert` would
//! reach an upstream that trusts them; the gate removes those too.
//!
//! Names are compared as the upstream frameworks read them: case aside, and `_` as `-` (CGI,
//! WSGI and some Go and Java frameworks turn `X_Remote_User` into `HTTP_X_REMOTE_USER`, the
//! same variable as `X-Remote-User`'s). A caller's header with an `_` in its name never
//! reaches the upstream at all ([`has_underscore`]).

use crate::identity::Caller;

pub const REMOTE_USER: &str = "x-remote-user";
pub const REMOTE_GROUPS: &str = "x-remote-groups";
pub const KEYWARD_IDENTITY: &str = "x-keyward-identity";
/// `NAMESPACE/NAME` of the pod a caller's token is bound to, once the gate has checked it.
pub const KEYWARD_POD: &str = "x-keyward-pod";

/// Whether a client-sent header claims an identity, and so must not reach the upstream: the
/// headers the gate sets, their variants (`X-Remote-Group`, `X-Remote-Extra-*`), anything
/// `X-Keyward-*`, and the client-certificate headers proxies forward (Envoy's
/// `X-Forwarded-Client-Cert`, nginx's `Ssl-Client-*`).
pub fn claims_identity(name: &str) -> bool {
    ["x-remote-", "x-keyward-", "ssl-client"].iter().any(|p| name_starts_with(name, p))
        || ["x-forwarded-client-cert", "x-forwarded-user", "x-auth-request-user"].iter().any(|n| same_name(name, n))
}

/// Whether two header names are one to the upstream: ASCII case aside, and `_` equal to `-`.
pub fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len() && same_bytes(a.as_bytes(), b.as_bytes())
}

/// Whether `name` starts with `prefix`, compared as [`same_name`] compares.
fn name_starts_with(name: &str, prefix: &str) -> bool {
    name.len() >= prefix.len() && same_bytes(&name.as_bytes()[..prefix.len()], prefix.as_bytes())
}

fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let fold = |c: u8| if c == b'_' { b'-' } else { c.to_ascii_lowercase() };
    a.iter().zip(b).all(|(x, y)| fold(*x) == fold(*y))
}

/// A header name with an underscore: dropped from every request, as nginx does by default
/// (`underscores_in_headers off`). An upstream that reads headers as CGI variables cannot tell
/// `X_Remote_User` from `X-Remote-User`, so no such name is passed on; none of the systems the
/// gate fronts sends one. Dropping rather than refusing keeps a client that sends a harmless one
/// working.
pub fn has_underscore(name: &str) -> bool {
    name.contains('_')
}

/// Headers some frameworks and proxies let override the request's method or path, which the
/// gate decided on (Symfony, Laravel and IIS read `X-Original-URL` and `X-Rewrite-URL`; many
/// frameworks `X-HTTP-Method-Override`): never passed on.
pub fn overrides_route(name: &str) -> bool {
    [
        "x-original-url",
        "x-original-uri",
        "x-rewrite-url",
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
    ]
    .iter()
    .any(|n| same_name(name, n))
}

/// Headers that say where the request came from: the caller's are dropped, and the gate sets
/// `X-Forwarded-For`, `-Proto` and `-Host` itself ([`forwarded_headers`]).
pub fn says_where_from(name: &str) -> bool {
    name_starts_with(name, "x-forwarded-")
        || ["forwarded", "x-real-ip", "x-client-ip", "true-client-ip"].iter().any(|n| same_name(name, n))
}

pub const FORWARDED_FOR: &str = "x-forwarded-for";
pub const FORWARDED_PROTO: &str = "x-forwarded-proto";
pub const FORWARDED_HOST: &str = "x-forwarded-host";

/// The gate's own `X-Forwarded-*`: the address the connection came from, `https` or `http` as
/// it arrived, and the host the caller asked for (left out when it is not printable ASCII).
pub fn forwarded_headers(peer: std::net::IpAddr, tls: bool, host: Option<&str>) -> Vec<(&'static str, String)> {
    let mut out = vec![(FORWARDED_FOR, peer.to_string()), (FORWARDED_PROTO, if tls { "https" } else { "http" }.into())];
    if let Some(host) = host.filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic())) {
        out.push((FORWARDED_HOST, host.to_string()));
    }
    out
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
        Caller::Pod(p) => (p.account.to_string(), groups.to_vec()),
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
    match caller {
        Caller::Workload(_) => out.push((KEYWARD_IDENTITY, user)),
        // The pod the gate verified the token is bound to: built of checked names.
        Caller::Pod(p) if p.facts().is_some() => out.push((KEYWARD_POD, p.pod_ref())),
        _ => {}
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
    fn an_underscore_spells_a_dash_to_the_upstream_so_it_claims_the_same() {
        for name in [
            "X_Remote_User",
            "x-remote_groups",
            "X_KEYWARD_IDENTITY",
            "x_forwarded_client_cert",
            "SSL_CLIENT_CERT",
            "X_Auth_Request_User",
        ] {
            assert!(claims_identity(name), "{name}");
            assert!(has_underscore(name), "{name}");
        }
        assert!(same_name("kubeflow_userid", "Kubeflow-UserId"));
        assert!(!same_name("kubeflow-userid", "kubeflow-useri") && !same_name("a-b", "a.b"));
        assert!(!has_underscore("x-remote-user"));
    }

    #[test]
    fn route_overrides_and_where_from_are_recognised_in_any_spelling() {
        for name in [
            "X-Original-URL",
            "x_rewrite_url",
            "X-HTTP-Method-Override",
            "X-Method-Override",
            "x-http-method",
            "X-Original-URI",
        ] {
            assert!(overrides_route(name), "{name}");
        }
        for name in [
            "X-Forwarded-For",
            "x_forwarded_host",
            "X-Forwarded-Proto",
            "X-Forwarded-Port",
            "Forwarded",
            "X-Real-IP",
            "True-Client-IP",
        ] {
            assert!(says_where_from(name), "{name}");
        }
        for name in ["X-Original", "Forwarded-For", "x-request-id", "content-type"] {
            assert!(!overrides_route(name) && !says_where_from(name), "{name}");
        }
        assert_eq!(
            forwarded_headers("10.0.0.7".parse().unwrap(), true, Some("ml-pipeline:8887")),
            [
                (FORWARDED_FOR, "10.0.0.7".to_string()),
                (FORWARDED_PROTO, "https".into()),
                (FORWARDED_HOST, "ml-pipeline:8887".into())
            ]
        );
        assert_eq!(
            forwarded_headers("::1".parse().unwrap(), false, Some("bad host\r\n")),
            [(FORWARDED_FOR, "::1".to_string()), (FORWARDED_PROTO, "http".into())]
        );
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

    #[test]
    fn a_pod_the_gate_found_is_named_and_one_it_did_not_is_not() {
        use crate::identity::{PodCaller, PodFacts};
        let account = ServiceAccount::parse("system:serviceaccount:tenant-a:job").unwrap();
        let found = PodCaller {
            account: account.clone(),
            pod_name: "job-a-x2x9q".into(),
            pod: Ok(std::sync::Arc::new(PodFacts { name: "job-a-x2x9q".into(), ..PodFacts::default() })),
        };
        let groups = ["system:serviceaccounts".to_string()];
        assert_eq!(
            identity_headers(&Caller::Pod(found), &groups),
            [
                (REMOTE_USER, "system:serviceaccount:tenant-a:job".to_string()),
                (REMOTE_GROUPS, "system:serviceaccounts".to_string()),
                (KEYWARD_POD, "tenant-a/job-a-x2x9q".to_string()),
            ]
        );
        let unknown = PodCaller { account, pod_name: "gone".into(), pod: Err("deleted".into()) };
        assert_eq!(
            identity_headers(&Caller::Pod(unknown), &groups),
            [
                (REMOTE_USER, "system:serviceaccount:tenant-a:job".to_string()),
                (REMOTE_GROUPS, "system:serviceaccounts".to_string()),
            ]
        );
    }
}
