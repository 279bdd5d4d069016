//! Name rules the apiserver enforces, the glob patterns profiles use, and name templates.

use std::collections::BTreeMap;

/// The prefix the ServiceAccount admission plugin gives the API-token volume.
pub const KUBE_API_ACCESS_PREFIX: &str = "kube-api-access-";
/// Where the ServiceAccount admission plugin mounts the API token.
pub const SERVICE_ACCOUNT_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A DNS-1123 label: volume names. `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A DNS-1123 subdomain: Secret, ConfigMap and ServiceAccount names. At most 253 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && !s.is_empty() && s.split('.').all(is_dns1123_label)
}

/// An environment variable name keyward will inject. Deliberately the classic C identifier,
/// which every shell and runtime accepts, rather than the apiserver's looser rule.
pub fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

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

/// Glob match with `*` (any run of characters, including none) and `?` (one character).
/// Used for requester usernames and namespace names, where `:` and `-` are ordinary characters.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matcher with one backtrack point: linear in practice, never exponential.
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

/// What a template may draw on: facts from the AdmissionReview, never the pod's own name
/// (which may be empty under `generateName`).
#[derive(Debug, Clone, Copy)]
pub struct TemplateContext<'a> {
    pub namespace: &'a str,
    pub owner_name: Option<&'a str>,
    pub labels: &'a BTreeMap<String, String>,
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
            return Err(format!(
                "{source:?} is not a valid object name (lowercase letters, digits, '-' and '.', at most 253 characters)"
            ));
        }
        Ok(template)
    }

    /// True when the template has no placeholders.
    pub fn is_fixed(&self) -> bool {
        self.parts.iter().all(|p| matches!(p, Part::Literal(_)))
    }

    /// True when resolving needs the pod's controller owner.
    pub fn needs_owner(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::OwnerName))
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
                Part::Label(key) => out.push_str(ctx.labels.get(key).ok_or_else(|| {
                    format!("{:?} needs the pod label {key:?}, which the pod does not have", self.source)
                })?),
            }
        }
        if is_dns1123_subdomain(&out) {
            Ok(out)
        } else {
            Err(format!(
                "{:?} resolves to {out:?}, which is not a valid object name (lowercase letters, digits, '-' and '.', at most 253 characters)",
                self.source
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(is_dns1123_label("keyward-client-cert"));
        assert!(is_dns1123_label("a"));
        assert!(!is_dns1123_label(""));
        assert!(!is_dns1123_label("-a"));
        assert!(!is_dns1123_label("a-"));
        assert!(!is_dns1123_label("Upper"));
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("a.b-c"));
        assert!(!is_dns1123_subdomain("a..b"));
    }

    #[test]
    fn globs() {
        let sa = "system:serviceaccount:*:trustyai-service-operator-controller-manager";
        assert!(glob_match(sa, "system:serviceaccount:opendatahub:trustyai-service-operator-controller-manager"));
        assert!(!glob_match(sa, "system:serviceaccount:opendatahub:trustyai-service-operator-controller-manager-x"));
        assert!(!glob_match(sa, "alice"));
        assert!(glob_match("*", ""));
        assert!(glob_match("team-?", "team-a"));
        assert!(!glob_match("team-?", "team-ab"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
    }

    #[test]
    fn paths() {
        assert_eq!(mount_path_problem("/var/run/keyward"), None);
        assert!(mount_path_problem("var/run").is_some());
        assert!(mount_path_problem("/a/../b").is_some());
        assert!(mount_path_problem("/").is_some());
        assert_eq!(relative_path_problem("token"), None);
        assert!(relative_path_problem("/token").is_some());
        assert!(relative_path_problem("a/../../etc").is_some());
        assert!(relative_path_problem("..token").is_some());
    }

    #[test]
    fn templates_resolve_from_owner_labels_and_namespace() {
        let labels = BTreeMap::from([("serving.kserve.io/inferencegraph".to_string(), "my-graph".to_string())]);
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
        let labels = BTreeMap::from([("app".to_string(), "Upper".to_string())]);
        let ctx = TemplateContext { namespace: "ns", owner_name: None, labels: &labels };
        let err = NameTemplate::parse("{label:app}").unwrap().resolve(&ctx).unwrap_err();
        assert!(err.contains("resolves to \"Upper\""), "{err}");
    }
}
