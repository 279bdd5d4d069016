//! Who is calling: a keyward workload identity, read from the SPIFFE URI of a client
//! certificate keyward issued, or a service account, read from the username a TokenReview
//! returns.
//!
//! Both are read strictly, by the rules keyward writes them with (`controller/src/desired.rs`,
//! `spiffe_id` and `identity_problem`): every part is a Kubernetes name, so nothing here needs
//! decoding or normalising, and anything that would (`%2e`, `..`, `//`, a trailing `/`, a query)
//! is refused rather than read as someone else.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use keyward_engine::names::{is_dns1123_label, is_dns1123_subdomain, trust_domain_problem};
use keyward_engine::text::quoted;

use crate::Error;

/// Who is calling, as the transport verified it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Workload(WorkloadIdentity),
    ServiceAccount(ServiceAccount),
    /// A service account whose token is bound to a pod the gate watches, and is that pod's
    /// (`spec.tokenReview.pods`): admitted wherever its account is, and rules can read its pod.
    Pod(PodCaller),
    /// Any other user a token names (a person, a node): admitted only by `anyUser`.
    User(UserName),
    /// No client certificate and no bearer token.
    Anonymous,
}

/// A keyward workload identity: `spiffe://TRUST-DOMAIN/ns/NAMESPACE/KIND/NAME`, the job (an
/// owner, such as an LMEvalJob) a certificate was issued for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkloadIdentity {
    pub trust_domain: String,
    pub namespace: String,
    /// The owner's kind, lower case (`lmevaljob`).
    pub kind: String,
    pub name: String,
}

/// A service account, as a TokenReview names it: `system:serviceaccount:NAMESPACE:NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceAccount {
    pub namespace: String,
    pub name: String,
}

/// The pod a token is bound to, as the API server's TokenReview names it in `status.user.extra`
/// (`authentication.kubernetes.io/pod-name` and `pod-uid`, one value each; every Kubernetes
/// version keyward supports returns both for a pod-bound token, and neither for a token that
/// `kubectl create token` or a Secret holds).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BoundPod {
    pub name: String,
    pub uid: String,
}

/// The extra keys of a TokenReview's user that name the pod a token is bound to.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

/// A pod-bound token's caller: its account, the pod its token names, and what the gate's watch
/// of the pods says of that pod (checked to be that pod: same name, same UID), or why it knows
/// nothing of it (no such pod among those it watches). Without the facts the caller is its
/// account alone: no rule that reads a pod admits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCaller {
    pub account: ServiceAccount,
    pub pod_name: String,
    pub pod: Result<Arc<PodFacts>, String>,
}

/// What the gate keeps of a watched pod: the facts rules compare, and only the labels and
/// annotations some rule reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub name: String,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The controller among its owners (a Job, for a Job's pod).
    pub owner: Option<PodOwner>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodOwner {
    pub kind: String,
    pub name: String,
}

/// Any other user a TokenReview authenticates: a person (`alice`, `oidc:bob`, `kube:admin`), a
/// node. Kept as the API server gives it, checked only so that it cannot split a header or a
/// log line: printable ASCII, at most [`MAX_USERNAME_BYTES`], and not a malformed service
/// account's name (which would be mistaken for one).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserName(String);

/// The longest username the gate accepts from a TokenReview.
pub const MAX_USERNAME_BYTES: usize = 512;

/// The longest SPIFFE ID the SPIFFE specification lets a verifier accept.
pub const MAX_SPIFFE_ID_BYTES: usize = 2048;

const SCHEME: &str = "spiffe://";

// === impl WorkloadIdentity ===

impl WorkloadIdentity {
    /// Reads a SPIFFE URI as keyward writes it. The error says which part is wrong, with at
    /// most the first 64 characters of what was given (a certificate is the caller's input).
    pub fn parse(uri: &str) -> Result<Self, Error> {
        let refuse = |why: &str| Error::Identity(format!("SPIFFE ID {}: {why}", quoted(uri, 64)));
        if uri.len() > MAX_SPIFFE_ID_BYTES {
            return Err(refuse(&format!("longer than {MAX_SPIFFE_ID_BYTES} bytes")));
        }
        let Some(rest) = uri.strip_prefix(SCHEME) else {
            return Err(refuse("does not start with spiffe:// (lower case)"));
        };
        if let Some(c) = rest.chars().find(|c| matches!(c, '%' | '?' | '#' | '@' | ':' | '\\')) {
            return Err(refuse(&format!(
                "holds {c:?}: keyward's identities are plain Kubernetes names, never encoded, with no port, query or fragment"
            )));
        }
        let (trust_domain, path) = rest.split_once('/').unwrap_or((rest, ""));
        if let Some(problem) = trust_domain_problem(trust_domain) {
            return Err(refuse(&format!("trust domain {problem}")));
        }
        let segments: Vec<&str> = path.split('/').collect();
        let [ns, namespace, kind, name] = segments.as_slice() else {
            return Err(refuse("the path is not ns/NAMESPACE/KIND/NAME"));
        };
        if *ns != "ns" {
            return Err(refuse("the path does not start with ns/"));
        }
        if !is_dns1123_label(namespace) {
            return Err(refuse("the namespace is not a DNS-1123 label"));
        }
        if !is_lower_kind(kind) {
            return Err(refuse("the kind is not a Kubernetes kind in lower case"));
        }
        if !is_dns1123_subdomain(name) {
            return Err(refuse("the name is not a Kubernetes object name (a DNS-1123 subdomain)"));
        }
        Ok(Self {
            trust_domain: trust_domain.to_string(),
            namespace: namespace.to_string(),
            kind: kind.to_string(),
            name: name.to_string(),
        })
    }
}

impl fmt::Display for WorkloadIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/ns/{}/{}/{}", self.trust_domain, self.namespace, self.kind, self.name)
    }
}

// === impl ServiceAccount ===

impl ServiceAccount {
    /// Reads a TokenReview's `status.user.username`. Any other user (a person, a node, a
    /// username with more or fewer parts) is not a service account.
    pub fn parse(username: &str) -> Result<Self, Error> {
        let refuse = |why: &str| Error::Identity(format!("username {}: {why}", quoted(username, 64)));
        let Some(rest) = username.strip_prefix("system:serviceaccount:") else {
            return Err(refuse("is not a service account's (system:serviceaccount:NAMESPACE:NAME)"));
        };
        let Some((namespace, name)) = rest.split_once(':') else {
            return Err(refuse("has no NAMESPACE:NAME"));
        };
        if !is_dns1123_label(namespace) {
            return Err(refuse("the namespace is not a DNS-1123 label"));
        }
        if !is_dns1123_subdomain(name) {
            return Err(refuse("the account's name is not a DNS-1123 subdomain"));
        }
        Ok(Self { namespace: namespace.to_string(), name: name.to_string() })
    }
}

// === impl BoundPod ===

impl BoundPod {
    /// Reads the pod claims of a TokenReview's `status.user.extra`: `None` when it names no pod.
    /// Claims that are not one Kubernetes name and one UID are refused, never half read.
    pub fn from_extra(extra: &BTreeMap<String, Vec<String>>) -> Result<Option<Self>, Error> {
        let refuse = |why: String| Error::Identity(format!("the token's pod claims: {why}"));
        let one = |key: &str| -> Result<Option<&str>, Error> {
            match extra.get(key).map(Vec::as_slice) {
                None | Some([]) => Ok(None),
                Some([value]) => Ok(Some(value.as_str())),
                Some(more) => Err(refuse(format!("{key} has {} values; a token is bound to one pod", more.len()))),
            }
        };
        match (one(POD_NAME_EXTRA)?, one(POD_UID_EXTRA)?) {
            (None, None) => Ok(None),
            (Some(name), Some(uid)) => {
                if !is_dns1123_subdomain(name) {
                    return Err(refuse(format!("{POD_NAME_EXTRA} {} is not a pod name", quoted(name, 64))));
                }
                let uid_ok =
                    !uid.is_empty() && uid.len() <= 64 && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
                if !uid_ok {
                    return Err(refuse(format!("{POD_UID_EXTRA} {} is not a UID", quoted(uid, 64))));
                }
                Ok(Some(Self { name: name.to_string(), uid: uid.to_string() }))
            }
            _ => Err(refuse(format!("one of {POD_NAME_EXTRA} and {POD_UID_EXTRA} without the other"))),
        }
    }
}

impl PodCaller {
    /// `NAMESPACE/NAME` of the pod.
    pub fn pod_ref(&self) -> String {
        format!("{}/{}", self.account.namespace, self.pod_name)
    }

    /// The pod's facts, when the gate knows the pod.
    pub fn facts(&self) -> Option<&PodFacts> {
        self.pod.as_deref().ok()
    }
}

impl fmt::Display for PodCaller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (pod {}/{})", self.account, self.account.namespace, self.pod_name)
    }
}

// === impl UserName ===

impl UserName {
    /// Reads a TokenReview's `status.user.username` that is not a service account's.
    pub fn parse(username: &str) -> Result<Self, Error> {
        let refuse = |why: &str| Error::Identity(format!("username {}: {why}", quoted(username, 64)));
        if username.is_empty() {
            return Err(refuse("is empty"));
        }
        if username.len() > MAX_USERNAME_BYTES {
            return Err(refuse(&format!("is longer than {MAX_USERNAME_BYTES} bytes")));
        }
        if !username.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(refuse("holds a byte that is not printable ASCII, which no header can carry as it is"));
        }
        if username.starts_with("system:serviceaccount:") {
            return Err(refuse("looks like a service account's but is not one (system:serviceaccount:NAMESPACE:NAME)"));
        }
        Ok(Self(username.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UserName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for ServiceAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

// === rules ===

/// A Kubernetes kind, lower-cased as keyward writes it in an identity: a letter, then letters
/// and digits, at most 63.
fn is_lower_kind(kind: &str) -> bool {
    !kind.is_empty()
        && kind.len() <= 63
        && kind.starts_with(|c: char| c.is_ascii_lowercase())
        && kind.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GOOD: &str = "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";

    #[test]
    fn a_keyward_identity_reads_into_its_parts_and_writes_back_the_same() {
        let id = WorkloadIdentity::parse(GOOD).unwrap();
        assert_eq!(
            id,
            WorkloadIdentity {
                trust_domain: "cluster.local".into(),
                namespace: "team-a".into(),
                kind: "lmevaljob".into(),
                name: "evaljob-sample".into(),
            }
        );
        assert_eq!(id.to_string(), GOOD);
        // A name may be a subdomain (dots inside, never a whole segment of dots).
        assert_eq!(WorkloadIdentity::parse("spiffe://td/ns/a/job/run.v2").unwrap().name, "run.v2");
    }

    #[test]
    fn anything_a_normalising_verifier_could_read_as_someone_else_is_refused() {
        let cases = [
            ("spiffe://cluster.local/ns/team-a/lmevaljob/..", "the name is not"),
            ("spiffe://cluster.local/ns/team-a/lmevaljob/.", "the name is not"),
            ("spiffe://cluster.local/ns/team-b/../team-a/lmevaljob/x", "the path is not"),
            ("spiffe://cluster.local/ns/team-a/lmevaljob/%2e%2e", "holds '%'"),
            ("spiffe://cluster.local/ns/team-a/lmevaljob/a%2Fb", "holds '%'"),
            ("spiffe://cluster.local/ns/team-a//lmevaljob/x", "the path is not"),
            ("spiffe://cluster.local/ns/team-a/lmevaljob/x/", "the path is not"),
            ("spiffe://cluster.local//ns/team-a/lmevaljob/x", "the path is not"),
            ("spiffe://cluster.local/ns/team-a/lmevaljob/x?y=1", "holds '?'"),
            ("spiffe://cluster.local/ns/team-a/lmevaljob/x#f", "holds '#'"),
            ("spiffe://cluster.local:443/ns/team-a/lmevaljob/x", "holds ':'"),
            ("spiffe://user@cluster.local/ns/team-a/lmevaljob/x", "holds '@'"),
            ("spiffe://cluster.local/ns/team-a/lmevaljob\\x", "holds '\\\\'"),
            ("SPIFFE://cluster.local/ns/team-a/lmevaljob/x", "does not start with spiffe://"),
            ("spiffe://Cluster.local/ns/team-a/lmevaljob/x", "trust domain may hold only"),
            ("spiffe:///ns/team-a/lmevaljob/x", "trust domain must have"),
            ("spiffe://cluster.local", "the path is not"),
            ("spiffe://cluster.local/ns/Team-A/lmevaljob/x", "the namespace is not"),
            ("spiffe://cluster.local/ns/team-a/LMEvalJob/x", "the kind is not"),
            ("spiffe://cluster.local/ns/team-a/lm-eval/x", "the kind is not"),
            ("spiffe://cluster.local/namespaces/team-a/lmevaljob/x", "does not start with ns/"),
            ("spiffe://cluster.local/ns/team-a/lmevaljob/X", "the name is not"),
        ];
        for (uri, why) in cases {
            let e = WorkloadIdentity::parse(uri).unwrap_err().to_string();
            assert!(e.starts_with("SPIFFE ID \""), "{uri}: {e}");
            assert!(e.contains(why), "{uri}: {e} (wanted {why:?})");
        }
    }

    #[test]
    fn a_long_uri_is_refused_and_shown_clipped() {
        let long = format!("spiffe://td/ns/a/job/{}", "a".repeat(3000));
        let e = WorkloadIdentity::parse(&long).unwrap_err().to_string();
        assert!(e.contains("longer than 2048 bytes"), "{e}");
        assert!(e.len() < 200, "{e}");
        // The bound itself: 2,048 bytes pass it (and are refused for what they hold), 2,049 not.
        let at = |n: usize| format!("spiffe://td/ns/a/job/{}", "a".repeat(n - "spiffe://td/ns/a/job/".len()));
        let e = WorkloadIdentity::parse(&at(2048)).unwrap_err().to_string();
        assert!(!e.contains("longer than"), "{e}");
        assert!(WorkloadIdentity::parse(&at(2049)).unwrap_err().to_string().contains("longer than 2048 bytes"));
        // A control character is escaped, never written raw into a log line.
        let e = WorkloadIdentity::parse("spiffe://td/ns/a/job/x\nforged").unwrap_err().to_string();
        assert!(e.contains("\\n") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn a_service_account_reads_from_a_tokenreview_username() {
        let sa = ServiceAccount::parse("system:serviceaccount:kubeflow:ml-pipeline-persistenceagent").unwrap();
        assert_eq!((sa.namespace.as_str(), sa.name.as_str()), ("kubeflow", "ml-pipeline-persistenceagent"));
        assert_eq!(sa.to_string(), "system:serviceaccount:kubeflow:ml-pipeline-persistenceagent");
        for (username, why) in [
            ("alice", "is not a service account's"),
            ("system:node:worker-1", "is not a service account's"),
            ("system:serviceaccount:kubeflow", "has no NAMESPACE:NAME"),
            ("system:serviceaccount:kubeflow:a:b", "the account's name is not"),
            ("system:serviceaccount::runner", "the namespace is not"),
            ("system:serviceaccount:KF:runner", "the namespace is not"),
        ] {
            let e = ServiceAccount::parse(username).unwrap_err().to_string();
            assert!(e.contains(why), "{username}: {e}");
        }
    }

    #[test]
    fn a_tokens_pod_is_one_name_and_one_uid_or_none() {
        let extra = |pairs: &[(&str, &[&str])]| -> BTreeMap<String, Vec<String>> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect())).collect()
        };
        // As the API server returns a pod-bound token's user (1.30+: node and credential too).
        let bound = extra(&[
            (POD_NAME_EXTRA, &["job-a-x7k2p"]),
            (POD_UID_EXTRA, &["8c0b3a4e-6f1d-4a55-9d1e-2f7f8c1b9a10"]),
            ("authentication.kubernetes.io/node-name", &["worker-1"]),
            ("authentication.kubernetes.io/credential-id", &["JTI=1f2e"]),
        ]);
        assert_eq!(
            BoundPod::from_extra(&bound).unwrap(),
            Some(BoundPod { name: "job-a-x7k2p".into(), uid: "8c0b3a4e-6f1d-4a55-9d1e-2f7f8c1b9a10".into() })
        );
        // `kubectl create token`: only a credential id.
        assert_eq!(
            BoundPod::from_extra(&extra(&[("authentication.kubernetes.io/credential-id", &["JTI=1"])])).unwrap(),
            None
        );
        assert_eq!(BoundPod::from_extra(&BTreeMap::new()).unwrap(), None);
        let caller = PodCaller {
            account: ServiceAccount::parse("system:serviceaccount:tenant-a:runner").unwrap(),
            pod_name: "job-a-x7k2p".into(),
            pod: Err("not watched".into()),
        };
        assert_eq!(caller.pod_ref(), "tenant-a/job-a-x7k2p");
        assert_eq!(caller.to_string(), "system:serviceaccount:tenant-a:runner (pod tenant-a/job-a-x7k2p)");
        assert_eq!(caller.facts(), None);
        for (claims, says) in [
            (extra(&[(POD_NAME_EXTRA, &["a"])]), "one of authentication.kubernetes.io/pod-name and authentication.kubernetes.io/pod-uid without the other"),
            (extra(&[(POD_NAME_EXTRA, &["a", "b"]), (POD_UID_EXTRA, &["u"])]), "pod-name has 2 values"),
            (extra(&[(POD_NAME_EXTRA, &["A_b"]), (POD_UID_EXTRA, &["u"])]), "\"A_b\" is not a pod name"),
            (extra(&[(POD_NAME_EXTRA, &["a"]), (POD_UID_EXTRA, &["u\nforged"])]), "is not a UID"),
        ] {
            let e = BoundPod::from_extra(&claims).unwrap_err().to_string();
            assert!(e.starts_with("the token's pod claims: ") && e.contains(says) && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn any_other_user_is_kept_as_given_unless_it_could_split_a_header() {
        for name in ["alice", "oidc:bob@example.com", "kube:admin", "system:node:worker-1", "https://issuer#sub"] {
            assert_eq!(UserName::parse(name).unwrap().as_str(), name);
        }
        for (username, why) in [
            ("", "is empty"),
            ("alice\r\nx-remote-user: admin", "not printable ASCII"),
            ("zoë", "not printable ASCII"),
            ("system:serviceaccount:KF:runner", "looks like a service account's"),
        ] {
            let e = UserName::parse(username).unwrap_err().to_string();
            assert!(e.contains(why) && !e.contains('\n'), "{username}: {e}");
        }
        assert!(UserName::parse(&"a".repeat(512)).is_ok());
        assert!(UserName::parse(&"a".repeat(513)).unwrap_err().to_string().contains("longer than 512 bytes"));
    }

    proptest! {
        /// Whatever a certificate carries: no panic, and an identity only when writing it back
        /// gives exactly what was read (nothing was decoded, dropped or normalised).
        #[test]
        fn any_uri_is_read_back_exactly_or_refused(uri in "spiffe://[a-z.%:/@?#\\-]{0,12}/ns/[a-z0-9.%/\\-]{0,12}/[a-zA-Z0-9.%/]{0,8}/[a-z0-9.%/\\-]{0,12}") {
            if let Ok(id) = WorkloadIdentity::parse(&uri) {
                prop_assert_eq!(id.to_string(), uri);
            }
        }
    }
}
