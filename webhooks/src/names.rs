//! Name rules the apiserver enforces, the glob patterns profiles use, and name templates.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The prefix the ServiceAccount admission plugin gives the API-token volume.
pub const KUBE_API_ACCESS_PREFIX: &str = "kube-api-access-";
/// Where the ServiceAccount admission plugin mounts the API token.
pub const SERVICE_ACCOUNT_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The longest DNS-1123 label (`IsDNS1123Label`): volume names, namespace names.
pub const DNS1123_LABEL_MAX: usize = 63;
/// The longest DNS-1123 subdomain (`IsDNS1123Subdomain`): Secret, ConfigMap and ServiceAccount
/// names, label and annotation key prefixes.
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// The longest label value, and the longest name part of a qualified name (`IsQualifiedName`).
pub const QUALIFIED_NAME_MAX: usize = 63;

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, any length: one dot-separated part of a DNS-1123 name.
fn is_dns1123_part(b: &[u8]) -> bool {
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            is_lower_alnum(first) && is_lower_alnum(last) && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// Kubernetes' `IsDNS1123Label`: volume names and namespaces. `[a-z0-9]([-a-z0-9]*[a-z0-9])?`,
/// at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= DNS1123_LABEL_MAX && is_dns1123_part(s.as_bytes())
}

/// Kubernetes' `IsDNS1123Subdomain`: Secret, ConfigMap and ServiceAccount names
/// (`NameIsDNSSubdomain`). Dot-separated parts of `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 253
/// characters in all. Unlike a DNS host name, a part may be longer than 63 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= DNS1123_SUBDOMAIN_MAX && s.split('.').all(|part| is_dns1123_part(part.as_bytes()))
}

/// What is wrong with a SPIFFE trust domain as keyward writes one (lower-case letters, digits,
/// `.`, `-` and `_`, 1 to 255), if anything. The controller checks its `--trust-domain` with it
/// and the gate the trust domain of every identity it reads: the two must agree.
pub fn trust_domain_problem(td: &str) -> Option<&'static str> {
    if td.is_empty() || td.len() > 255 {
        return Some("must have 1 to 255 characters");
    }
    if !td.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')) {
        return Some("may hold only lower-case letters, digits, '.', '-' and '_' (a SPIFFE trust domain)");
    }
    None
}

/// What a DNS-1123 subdomain is, for messages.
pub const DNS1123_SUBDOMAIN_RULE: &str =
    "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters";
/// What a DNS-1123 label is, for messages.
pub const DNS1123_LABEL_RULE: &str =
    "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 characters.
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            b.len() <= QUALIFIED_NAME_MAX
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Kubernetes' `IsQualifiedName`: label and annotation keys. An optional DNS-1123 subdomain
/// prefix and `/`, then a name of at most 63 characters.
pub fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => !prefix.is_empty() && is_dns1123_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(s),
    }
}

/// Kubernetes' `IsValidLabelValue`: empty, or a qualified name part (at most 63 characters).
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

/// Kubernetes' `IsEnvVarName`: `[-._a-zA-Z][-._a-zA-Z0-9]*`, and not `.`, `..` or starting
/// with `..`. Every Kubernetes version keyward supports accepts these; 1.32 and later accept
/// more (any printable ASCII but `=`), which keyward does not inject, so that a profile works
/// on every supported cluster.
pub fn is_env_var_name(s: &str) -> bool {
    let mut chars = s.bytes();
    let valid_chars = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || matches!(c, b'-' | b'.' | b'_'))
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'));
    valid_chars && s != "." && !s.starts_with("..")
}

/// What an env var name is, for messages.
pub const ENV_VAR_NAME_RULE: &str = "letters, digits, '_', '-' and '.', not starting with a digit or '..'";

/// Why an absolute mount path is unusable, if it is.
pub fn mount_path_problem(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        Some("must be an absolute path (start with /)")
    } else if path.split('/').any(|seg| seg == "..") {
        Some("must not contain a '..' segment")
    } else if path.contains(':') {
        Some("must not contain ':'")
    } else if path == "/" {
        Some("must not be the root directory")
    } else if path.ends_with('/') {
        Some("must not end with '/'")
    } else {
        None
    }
}

/// Why a file path inside a volume (`projected.sources[].serviceAccountToken.path`, `items[].path`)
/// is unusable, if it is. The apiserver wants it relative, without `..`.
pub fn relative_path_problem(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        Some("must not be empty")
    } else if path.starts_with('/') {
        Some("must be a relative path (no leading /)")
    } else if path.split('/').any(|seg| seg == "..") {
        Some("must not contain a '..' segment")
    } else if path.starts_with("..") {
        Some("must not start with '..'")
    } else {
        None
    }
}

/// Why `name` is not a signer name as the apiserver's `ValidateSignerName` has it
/// (kubernetes `pkg/apis/certificates/validation`), if it is not: `<domain>/<path>`, exactly one
/// `/`; the domain at most 253 characters, at least two DNS-1123 labels separated by dots; the
/// path `.`-separated DNS-1123 subdomains; the whole at most 571 characters. The first problem,
/// as the apiserver words it.
pub fn signer_name_problem(name: &str) -> Option<String> {
    const MAX_DOMAIN: usize = DNS1123_SUBDOMAIN_MAX;
    const MAX_NAME: usize = MAX_DOMAIN + (DNS1123_SUBDOMAIN_MAX + DNS1123_LABEL_MAX + 1) + 1;
    let quoted = crate::text::quoted(name, 128);
    if name.is_empty() {
        return Some("a signer name is required".into());
    }
    let Some((domain, path)) = name.split_once('/').filter(|(_, path)| !path.contains('/')) else {
        return Some(format!(
            "{quoted} must be a fully qualified domain and path of the form 'example.com/signer-name'"
        ));
    };
    if domain.len() > MAX_DOMAIN {
        return Some(format!("{quoted}: its domain may not be more than {MAX_DOMAIN} characters"));
    }
    if let Some(label) = domain.split('.').find(|l| !is_dns1123_label(l)) {
        return Some(format!("{quoted}: domain label {:?} is not {DNS1123_LABEL_RULE}", crate::text::clip(label, 64)));
    }
    if domain.split('.').count() < 2 {
        return Some(format!("{quoted}: its domain should be a domain with at least two segments separated by dots"));
    }
    if let Some(label) = path.split('.').find(|l| !is_dns1123_subdomain(l)) {
        return Some(format!(
            "{quoted}: path segment {:?} is not {DNS1123_SUBDOMAIN_RULE}",
            crate::text::clip(label, 64)
        ));
    }
    if name.len() > MAX_NAME {
        return Some(format!("{quoted} may not be more than {MAX_NAME} characters"));
    }
    None
}

/// Glob match with `*` (any run of characters, including none) and `?` (one character), for
/// namespace patterns.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    glob_chars(&p, &t)
}

/// Iterative matcher with one backtrack point: linear in practice, never exponential.
fn glob_chars(p: &[char], t: &[char]) -> bool {
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Matches a requester pattern against `request.userInfo.username`. Usernames are
/// `:`-separated (`system:serviceaccount:NAMESPACE:NAME`), and a wildcard never crosses a `:`
/// or matches nothing: `*` is one or more characters and `?` exactly one, within a segment, so
/// `system:serviceaccount:*:op` matches `system:serviceaccount:team-a:op` but neither
/// `system:serviceaccount::op` nor `system:serviceaccount:a:b:op`.
pub fn username_match(pattern: &str, username: &str) -> bool {
    let mut patterns = pattern.split(':');
    let mut segments = username.split(':');
    loop {
        match (patterns.next(), segments.next()) {
            (None, None) => return true,
            (Some(p), Some(s)) => {
                if !segment_match(p, s) {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

/// One segment: `*` is one or more characters (written as `?*`), `?` exactly one.
fn segment_match(pattern: &str, segment: &str) -> bool {
    // Most segments (`system`, `serviceaccount`, a namespace) have no wildcard: compared as
    // they are, without the two buffers below (ten allocations an admission, before).
    if !pattern.contains(['*', '?']) {
        return pattern == segment;
    }
    let mut p = Vec::with_capacity(pattern.len() * 2);
    for c in pattern.chars() {
        if c == '*' {
            p.extend(['?', '*']);
        } else {
            p.push(c);
        }
    }
    let t: Vec<char> = segment.chars().collect();
    glob_chars(&p, &t)
}

/// The namespace segment of a `system:serviceaccount:NAMESPACE:NAME` pattern.
pub fn service_account_pattern(pattern: &str) -> Option<(&str, &str)> {
    let rest = pattern.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    (!name.contains(':')).then_some((namespace, name))
}

// === impl NameTemplate ===

/// A name with placeholders, resolved per pod: `{owner.name}-keyward-client`,
/// `{label:serving.kserve.io/inferencegraph}-auth-verifier`, `{namespace}-ca`, or a plain name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameTemplate {
    source: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    OwnerName,
    Namespace,
    Label(String),
}

/// A pod's labels, borrowed from the request where the JSON allows.
pub type Labels<'a> = BTreeMap<Cow<'a, str>, Cow<'a, str>>;

/// What a template may draw on: facts from the AdmissionReview, never the pod's own name
/// (which may be empty under `generateName`).
#[derive(Debug, Clone, Copy)]
pub struct TemplateContext<'a> {
    pub namespace: &'a str,
    pub owner_name: Option<&'a str>,
    pub labels: &'a Labels<'a>,
}

impl NameTemplate {
    /// Parses a template; the error says which placeholder is wrong and what is allowed.
    pub fn parse(source: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = source;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Literal(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or_else(|| format!("unclosed '{{' in {source:?}"))?;
            let key = &after[..close];
            parts.push(match key {
                "owner.name" => Part::OwnerName,
                "namespace" => Part::Namespace,
                _ => match key.strip_prefix("label:") {
                    Some(label) if !label.is_empty() => Part::Label(label.to_string()),
                    _ => {
                        return Err(format!(
                            "unknown placeholder {{{key}}} in {source:?}; use {{owner.name}}, {{namespace}} or {{label:KEY}}"
                        ))
                    }
                },
            });
            rest = &after[close + 1..];
        }
        if rest.contains('}') {
            return Err(format!("unmatched '}}' in {source:?}"));
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_string()));
        }
        if parts.is_empty() {
            return Err("must not be empty".to_string());
        }
        let template = Self { source: source.to_string(), parts };
        if template.is_fixed() && !is_dns1123_subdomain(source) {
            return Err(format!("{source:?} is not a valid object name ({DNS1123_SUBDOMAIN_RULE})"));
        }
        Ok(template)
    }

    /// True when the template has no placeholders.
    pub fn is_fixed(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Literal(_)))
    }

    /// True when it names the pod's controller owner: one object per owner.
    pub fn uses_owner(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::OwnerName))
    }

    /// True when it depends on the pod itself (its owner or a label), not only the namespace.
    pub fn depends_on_pod(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::OwnerName | Part::Label(_)))
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Resolves the template for one pod. The result is checked to be a valid object name.
    pub fn resolve(&self, ctx: &TemplateContext<'_>) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Namespace => out.push_str(ctx.namespace),
                Part::OwnerName => out.push_str(ctx.owner_name.ok_or_else(|| {
                    format!(
                        "{:?} needs the pod's controller owner, and the pod has no ownerReference with controller: true",
                        self.source
                    )
                })?),
                Part::Label(key) => out.push_str(ctx.labels.get(key.as_str()).ok_or_else(|| {
                    format!("{:?} needs the pod label {key:?}, which the pod does not have", self.source)
                })?),
            }
        }
        if is_dns1123_subdomain(&out) {
            Ok(out)
        } else if out.len() > DNS1123_SUBDOMAIN_MAX {
            Err(format!(
                "{:?} resolves to a name of {} characters, over Kubernetes' limit of {DNS1123_SUBDOMAIN_MAX}",
                self.source,
                out.len()
            ))
        } else {
            Err(format!(
                "{:?} resolves to {out:?}, which is not a valid object name ({DNS1123_SUBDOMAIN_RULE})",
                self.source
            ))
        }
    }
}

/// Parsed when the profile is read, so an unparsable template is a load error.
impl<'de> Deserialize<'de> for NameTemplate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let source = String::deserialize(deserializer)?;
        NameTemplate::parse(&source).map_err(serde::de::Error::custom)
    }
}

impl Serialize for NameTemplate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1123_labels_at_every_boundary() {
        assert!(is_dns1123_label("keyward-client-cert"));
        assert!(is_dns1123_label("a"));
        assert!(is_dns1123_label("0"));
        assert!(is_dns1123_label(&"a".repeat(63)));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(!is_dns1123_label(""));
        assert!(!is_dns1123_label("-a"));
        assert!(!is_dns1123_label("a-"));
        assert!(!is_dns1123_label("Upper"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label("a_b"));
    }

    #[test]
    fn dns1123_subdomains_limit_the_whole_name_not_each_part() {
        // Kubernetes applies the pattern and 253 characters in all; a part may exceed 63.
        let long_part = format!("{}-keyward-client", "j".repeat(60));
        assert!(long_part.len() > 63);
        assert!(is_dns1123_subdomain(&long_part));
        assert!(is_dns1123_subdomain(&"a".repeat(253)));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(is_dns1123_subdomain(&format!("{}.{}", "a".repeat(200), "b".repeat(52))));
        assert!(!is_dns1123_subdomain(&format!("{}.{}", "a".repeat(200), "b".repeat(53))));
        assert!(is_dns1123_subdomain("a.b-c"));
        for bad in ["", "a..b", ".a", "a.", "-a", "a-", "a.-b", "A", "a_b", "a/b", "a%b"] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
    }

    #[test]
    fn qualified_names_and_label_values() {
        for good in ["app", "app.kubernetes.io/name", "ray.io/is-ray-node", "A_b.c-D", &"a".repeat(63)] {
            assert!(is_qualified_name(good), "{good:?}");
        }
        let long_prefix = format!("{}/name", "p".repeat(253));
        assert!(is_qualified_name(&long_prefix));
        for bad in [
            "",
            "/name",
            "a/",
            "-a",
            "a-",
            "a/b/c",
            "UPPER.io/name",
            &"a".repeat(64),
            &format!("{}/n", "p".repeat(254)),
        ] {
            assert!(!is_qualified_name(bad), "{bad:?}");
        }
        assert!(is_label_value(""));
        assert!(is_label_value("RayJob"));
        assert!(is_label_value(&"v".repeat(63)));
        assert!(!is_label_value(&"v".repeat(64)));
        assert!(!is_label_value("a b"));
        assert!(!is_label_value("-x"));
    }

    #[test]
    fn env_var_names_follow_kubernetes() {
        for good in ["GRPC_CLIENT_CERT", "_x", "my.env-name", "MY_ENV.NAME", "MyEnvName1", ".a", "-a"] {
            assert!(is_env_var_name(good), "{good:?}");
        }
        for bad in ["", "1BAD", ".", "..", "..a", "A=B", "A B", "Ä"] {
            assert!(!is_env_var_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("team-?", "team-a"));
        assert!(!glob_match("team-?", "team-ab"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
    }

    #[test]
    fn requester_wildcards_stay_inside_one_nonempty_segment() {
        let sa = "system:serviceaccount:*:trustyai-service-operator-controller-manager";
        assert!(username_match(sa, "system:serviceaccount:opendatahub:trustyai-service-operator-controller-manager"));
        assert!(!username_match(
            sa,
            "system:serviceaccount:opendatahub:trustyai-service-operator-controller-manager-x"
        ));
        assert!(!username_match(sa, "system:serviceaccount::trustyai-service-operator-controller-manager"), "empty");
        assert!(
            !username_match(sa, "system:serviceaccount:a:b:trustyai-service-operator-controller-manager"),
            "a wildcard does not cross ':'"
        );
        assert!(!username_match(sa, "alice"));
        assert!(username_match("system:serviceaccount:team-?:op", "system:serviceaccount:team-a:op"));
        assert!(!username_match("system:serviceaccount:team-?:op", "system:serviceaccount:team-:op"));
        assert!(username_match("system:serviceaccount:team-*:op", "system:serviceaccount:team-blue:op"));
        assert!(!username_match("system:serviceaccount:team-*:op", "system:serviceaccount:team-:op"));
        assert!(username_match("ci-bot", "ci-bot"));
        assert!(!username_match("ci-bot", "ci-bot:x"));
        assert!(username_match("system:kube-controller-manager", "system:kube-controller-manager"));
        assert_eq!(service_account_pattern("system:serviceaccount:*:op"), Some(("*", "op")));
        assert_eq!(service_account_pattern("system:serviceaccount:a:b:c"), None);
        assert_eq!(service_account_pattern("alice"), None);
    }

    #[test]
    fn paths() {
        assert_eq!(mount_path_problem("/var/run/keyward"), None);
        assert!(mount_path_problem("var/run").is_some());
        assert!(mount_path_problem("/a/../b").is_some());
        assert!(mount_path_problem("/").is_some());
        assert_eq!(relative_path_problem("token"), None);
        assert_eq!(relative_path_problem("a/..b"), None);
        assert!(relative_path_problem("/token").is_some());
        assert!(relative_path_problem("a/../../etc").is_some());
        assert!(relative_path_problem("..token").is_some());
    }

    #[test]
    fn templates_resolve_from_owner_labels_and_namespace() {
        let labels = Labels::from([("serving.kserve.io/inferencegraph".into(), "my-graph".into())]);
        let ctx = TemplateContext { namespace: "team-a", owner_name: Some("eval-7"), labels: &labels };
        let t = NameTemplate::parse("{owner.name}-keyward-client").unwrap();
        assert_eq!(t.resolve(&ctx).unwrap(), "eval-7-keyward-client");
        let t = NameTemplate::parse("{label:serving.kserve.io/inferencegraph}-auth-verifier").unwrap();
        assert_eq!(t.resolve(&ctx).unwrap(), "my-graph-auth-verifier");
        let t = NameTemplate::parse("{namespace}.ca").unwrap();
        assert_eq!(t.resolve(&ctx).unwrap(), "team-a.ca");
        let no_owner = TemplateContext { owner_name: None, ..ctx };
        let err = NameTemplate::parse("{owner.name}-x").unwrap().resolve(&no_owner).unwrap_err();
        assert!(err.contains("controller owner"), "{err}");
    }

    #[test]
    fn template_errors_name_the_problem() {
        assert!(NameTemplate::parse("{pod.name}").unwrap_err().contains("unknown placeholder {pod.name}"));
        assert!(NameTemplate::parse("{owner.name").unwrap_err().contains("unclosed"));
        assert!(NameTemplate::parse("Bad_Name").unwrap_err().contains("not a valid object name"));
        let labels = Labels::new();
        let owner = "o".repeat(240);
        let ctx = TemplateContext { namespace: "ns", owner_name: Some(&owner), labels: &labels };
        let err = NameTemplate::parse("{owner.name}-keyward-client").unwrap().resolve(&ctx).unwrap_err();
        assert_eq!(
            err,
            "\"{owner.name}-keyward-client\" resolves to a name of 255 characters, over Kubernetes' limit of 253"
        );
        // Long owner names within the limit resolve: Kubernetes accepts parts over 63 characters.
        let owner = "evaluation-job-with-a-long-descriptive-name-for-the-team";
        let ctx = TemplateContext { namespace: "ns", owner_name: Some(owner), labels: &labels };
        let name = NameTemplate::parse("{owner.name}-keyward-client").unwrap().resolve(&ctx).unwrap();
        assert_eq!(name.len(), owner.len() + 15);
        let labels = Labels::from([("app".into(), "Upper".into())]);
        let ctx = TemplateContext { namespace: "ns", owner_name: None, labels: &labels };
        let err = NameTemplate::parse("{label:app}").unwrap().resolve(&ctx).unwrap_err();
        assert!(err.contains("resolves to \"Upper\""), "{err}");
    }
}
