//! Which rule a request falls under: an HTTP method and path pattern, or a gRPC service and
//! method, matched against the request's path exactly as sent.
//!
//! The gate never normalises a path, because the upstream may normalise it differently: a path
//! that could read two ways (a `.` or `..` segment, an empty one, an encoded `/`, `\` or `.`,
//! a raw `\`, a `;`, which servlet containers take as the start of a segment's parameters, so
//! that `/a/..;/b` is `/b` to Tomcat) is refused before any rule is tried. Everything else is compared byte for byte,
//! so a segment the upstream would decode (`j%6fbs`) matches no literal and captures a value
//! no caller's name equals: a refusal, never a wider grant.

use std::collections::BTreeMap;

use keyward_engine::text::quoted;

use crate::Error;

/// The most segments a pattern or a checked path may have.
pub const MAX_SEGMENTS: usize = 64;

/// A path as the gate reads it: checked, split into segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPath<'p> {
    segments: Vec<&'p str>,
}

/// An HTTP path pattern: `/apis/v1/namespaces/{namespace}/jobs/{name}`. A `{var}` segment
/// matches one segment and captures it; `*` matches one segment; a final `**` matches the rest
/// (none or more segments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    source: String,
    parts: Vec<Part>,
    rest: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Capture(String),
    Any,
}

/// A gRPC method: `/package.Service/Method` (the path of a gRPC request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcMethod<'p> {
    pub service: &'p str,
    pub method: &'p str,
}

// === impl RequestPath ===

impl<'p> RequestPath<'p> {
    /// Checks a request's path (the request target without its query). The error is for the
    /// caller: what is wrong, and that the path must be sent as the upstream reads it.
    pub fn parse(path: &'p str) -> Result<Self, Error> {
        let refuse = |why: &str| Error::Path(format!("path {}: {why}; send the path without it", quoted(path, 96)));
        let Some(rest) = path.strip_prefix('/') else {
            return Err(refuse("does not start with '/'"));
        };
        if path.contains('\\') {
            return Err(refuse("holds a '\\'"));
        }
        if path.contains(';') {
            return Err(refuse(
                "holds a ';', which servlet containers read as the start of path parameters (`/a/..;/b` is `/b` to them)",
            ));
        }
        let holds = |e: &str| path.as_bytes().windows(3).any(|w| w.eq_ignore_ascii_case(e.as_bytes()));
        if let Some(encoded) = ["%2f", "%5c", "%2e", "%00", "%3b"].into_iter().find(|e| holds(e)) {
            return Err(refuse(&format!("holds {encoded}, an encoded separator, dot, ';' or NUL")));
        }
        let segments: Vec<&str> = if rest.is_empty() { Vec::new() } else { rest.split('/').collect() };
        if segments.len() > MAX_SEGMENTS {
            return Err(refuse(&format!("has more than {MAX_SEGMENTS} segments")));
        }
        for segment in &segments {
            match *segment {
                "" => return Err(refuse("has an empty segment ('//' or a trailing '/')")),
                "." | ".." => return Err(refuse("has a '.' or '..' segment")),
                _ => {}
            }
        }
        Ok(Self { segments })
    }

    /// The gRPC method this path names, if it has the shape `/Service/Method`.
    pub fn grpc_method(&self) -> Option<GrpcMethod<'p>> {
        match self.segments.as_slice() {
            [service, method] => Some(GrpcMethod { service, method }),
            _ => None,
        }
    }
}

// === impl PathPattern ===

impl PathPattern {
    /// Parses a pattern from a gate's configuration; the error says which segment is wrong.
    pub fn parse(source: &str) -> Result<Self, String> {
        let Some(rest) = source.strip_prefix('/') else {
            return Err(format!("path pattern {source:?} must start with '/'"));
        };
        let segments: Vec<&str> = if rest.is_empty() { Vec::new() } else { rest.split('/').collect() };
        if segments.len() > MAX_SEGMENTS {
            return Err(format!("path pattern {source:?} has more than {MAX_SEGMENTS} segments"));
        }
        let mut parts = Vec::new();
        let mut rest = false;
        for (i, segment) in segments.iter().enumerate() {
            let last = i + 1 == segments.len();
            let part = match *segment {
                "**" if last => {
                    rest = true;
                    continue;
                }
                "**" => return Err(format!("path pattern {source:?}: '**' may only be the last segment")),
                "*" => Part::Any,
                "" | "." | ".." => {
                    return Err(format!("path pattern {source:?} has an empty, '.' or '..' segment, which no request the gate accepts has"))
                }
                s if s.starts_with('{') && s.ends_with('}') => {
                    let name = &s[1..s.len() - 1];
                    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                        return Err(format!(
                            "path pattern {source:?}: {s:?} is not a capture; write {{name}} with letters, digits and '_'"
                        ));
                    }
                    if parts.iter().any(|p| matches!(p, Part::Capture(n) if n == name)) {
                        return Err(format!("path pattern {source:?} captures {{{name}}} twice"));
                    }
                    Part::Capture(name.to_string())
                }
                s if s.contains(['{', '}', '*', '%', '\\']) => {
                    return Err(format!(
                        "path pattern {source:?}: segment {s:?} mixes literal text with '{{', '}}', '*', '%' or '\\'; a segment is a literal, {{name}}, '*' or a final '**'"
                    ))
                }
                s => Part::Literal(s.to_string()),
            };
            parts.push(part);
        }
        Ok(Self { source: source.to_string(), parts, rest })
    }

    /// The captures, if `path` matches.
    pub fn matches<'p>(&self, path: &RequestPath<'p>) -> Option<BTreeMap<&str, &'p str>> {
        let segments = &path.segments;
        let fits = if self.rest { segments.len() >= self.parts.len() } else { segments.len() == self.parts.len() };
        if !fits {
            return None;
        }
        let mut captures = BTreeMap::new();
        for (part, segment) in self.parts.iter().zip(segments.iter()) {
            match part {
                Part::Literal(literal) if literal != segment => return None,
                Part::Literal(_) | Part::Any => {}
                Part::Capture(name) => {
                    captures.insert(name.as_str(), *segment);
                }
            }
        }
        Some(captures)
    }

    /// The names this pattern captures, in order.
    pub fn captures(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Capture(name) => Some(name.as_str()),
            _ => None,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether it ends in `**` (matches any number of further segments).
    pub fn has_rest(&self) -> bool {
        self.rest
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sixty_four_segments_are_read_and_sixty_five_are_not() {
        let path = |n: usize| "/s".repeat(n);
        assert!(RequestPath::parse(&path(64)).is_ok());
        assert!(RequestPath::parse(&path(65)).unwrap_err().to_string().contains("more than 64 segments"));
        assert!(PathPattern::parse(&path(64)).is_ok());
        assert!(PathPattern::parse(&path(65)).unwrap_err().contains("more than 64 segments"));
    }

    use super::*;
    use proptest::prelude::*;

    fn captures<'p>(pattern: &str, path: &'p str) -> Option<Vec<(String, &'p str)>> {
        let pattern = PathPattern::parse(pattern).unwrap();
        let path = RequestPath::parse(path).unwrap();
        pattern.matches(&path).map(|c| c.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    #[test]
    fn a_pattern_matches_literals_exactly_and_captures_its_variables() {
        let p = "/apis/v1/namespaces/{namespace}/jobs/{name}";
        assert_eq!(
            captures(p, "/apis/v1/namespaces/team-a/jobs/evaljob"),
            Some(vec![("name".into(), "evaljob"), ("namespace".into(), "team-a")])
        );
        assert_eq!(captures(p, "/apis/v1/namespaces/team-a/jobs"), None, "one segment short");
        assert_eq!(captures(p, "/apis/v1/namespaces/team-a/jobs/evaljob/status"), None, "one too many");
        assert_eq!(captures(p, "/apis/v1/namespaces/team-a/Jobs/evaljob"), None, "case matters");
        assert_eq!(captures(p, "/apis/v1/namespaces/team-a/j%6fbs/evaljob"), None, "nothing is decoded");
        assert_eq!(captures("/apis/*/runs/{id}", "/apis/v2beta1/runs/r1"), Some(vec![("id".into(), "r1")]));
        assert_eq!(captures("/apis/v1/**", "/apis/v1"), Some(vec![]));
        assert_eq!(captures("/apis/v1/**", "/apis/v1/a/b/c"), Some(vec![]));
        assert_eq!(captures("/apis/v1/**", "/apis/v2/a"), None);
        assert_eq!(captures("/", "/"), Some(vec![]));
        assert_eq!(captures("/**", "/anything/at/all"), Some(vec![]));
    }

    #[test]
    fn a_path_that_could_read_two_ways_is_refused_before_any_rule() {
        for (path, why) in [
            ("/a/../b", "has a '.' or '..' segment"),
            ("/a/./b", "has a '.' or '..' segment"),
            ("/a//b", "has an empty segment"),
            ("/a/b/", "has an empty segment"),
            ("/a/%2e%2e/b", "holds %2e"),
            ("/a/%2E/b", "holds %2e"),
            ("/a%2Fb", "holds %2f"),
            ("/a%5cb", "holds %5c"),
            ("/a\\b", "holds a '\\'"),
            ("/a%00", "holds %00"),
            ("/apis/v1/namespaces/team-a/..;/team-b/jobs/x", "holds a ';'"),
            ("/a;jsessionid=1/b", "holds a ';'"),
            ("/a/b;", "holds a ';'"),
            ("/a/%3Bb", "holds %3b"),
            ("a/b", "does not start with '/'"),
        ] {
            let e = RequestPath::parse(path).unwrap_err().to_string();
            assert!(e.starts_with(&format!("path {path:?}: ")), "{path}: {e}");
            assert!(e.contains(why), "{path}: {e} (wanted {why:?})");
            assert!(e.ends_with("; send the path without it"), "{e}");
        }
        let deep = "/a".repeat(65);
        assert!(RequestPath::parse(&deep).unwrap_err().to_string().contains("more than 64 segments"));
    }

    #[test]
    fn a_grpc_path_names_its_service_and_method() {
        let path = RequestPath::parse("/LMEvalJobUpdateService/UpdateStatus").unwrap();
        assert_eq!(path.grpc_method(), Some(GrpcMethod { service: "LMEvalJobUpdateService", method: "UpdateStatus" }));
        let path = RequestPath::parse("/ml_pipelines.RunService/GetRun").unwrap();
        assert_eq!(path.grpc_method().map(|m| m.service), Some("ml_pipelines.RunService"));
        assert_eq!(RequestPath::parse("/a/b/c").unwrap().grpc_method(), None);
    }

    #[test]
    fn a_bad_pattern_is_refused_saying_how_to_write_it() {
        for (pattern, why) in [
            ("apis", "must start with '/'"),
            ("/a/**/b", "'**' may only be the last segment"),
            ("/a//b", "has an empty, '.' or '..' segment"),
            ("/a/{}", "is not a capture"),
            ("/a/{na-me}", "is not a capture"),
            ("/a/{x}/{x}", "captures {x} twice"),
            ("/a/job-{name}", "mixes literal text"),
            ("/a/%2e", "mixes literal text"),
        ] {
            let e = PathPattern::parse(pattern).unwrap_err();
            assert!(e.contains(why), "{pattern}: {e}");
        }
        let p = PathPattern::parse("/n/{namespace}/j/{name}/**").unwrap();
        assert_eq!(p.captures().collect::<Vec<_>>(), ["namespace", "name"]);
        assert_eq!(p.as_str(), "/n/{namespace}/j/{name}/**");
    }

    proptest! {
        /// Any path: checked or refused without a panic; a captured value is always one whole
        /// segment of the path as sent, never a '.' or '..' or empty one.
        #[test]
        fn captures_are_whole_segments_as_sent(path in "/[a-z.%/\\\\{}]{0,30}") {
            if let Ok(checked) = RequestPath::parse(&path) {
                let pattern = PathPattern::parse("/{a}/**").unwrap();
                if let Some(c) = pattern.matches(&checked) {
                    let a = c["a"];
                    prop_assert!(path[1..].split('/').next() == Some(a));
                    prop_assert!(!a.is_empty() && a != "." && a != "..");
                }
            }
        }
    }
}
