//! A request's headers and trailers on their way to the upstream, in the order that makes each
//! step hold whatever the caller wrote:
//!
//! 1. before the decision, the caller's connection-level headers go (those its `Connection`
//!    names among them), so that nothing the decision read can be dropped after it; a
//!    `Connection` that names a header the gate decides on or sets is refused outright;
//! 2. every header the upstream could read as an identity, as a route of its own, or as where
//!    the request came from goes, and every name with an underscore (nginx's default), which an
//!    upstream reading CGI-style cannot tell from the same name with dashes;
//! 3. after the decision, a certificate caller's `Authorization` goes unless its rule passes it
//!    on (an upstream that authenticates by token must not act on someone else's);
//! 4. then the gate's own `X-Forwarded-For`, `-Proto`, `-Host`, and its identity headers last.
//!
//! Trailers go through step 2 as well: a chunked HTTP/1.1 body and an HTTP/2 stream can end with
//! header fields of their own.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::Frame;
use keyward_gate::headers::{
    forwarded_headers, has_underscore, identity_headers, overrides_route, same_name, says_where_from,
};
use keyward_gate::rules::{Caller, Gate};

/// The headers of one connection, not of the request (RFC 9110 7.6.1). `TE: trailers` is kept:
/// gRPC needs it end to end.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
];

/// Step 1 and 2, before the decision. `Err`: the caller's `Connection` names a header the gate
/// decides on or sets (the reason, for a refusal).
pub fn before_decision(headers: &mut HeaderMap, gate: &Gate) -> Result<(), String> {
    let named: Vec<HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    if let Some(name) = named.iter().find(|n| decided_or_set(n.as_str(), gate)) {
        return Err(format!(
            "the Connection header names {name}, a header the gate decides on or sets: a caller may not have it dropped on the way; send the request without it in Connection"
        ));
    }
    for name in named {
        if name != http::header::TE {
            headers.remove(name);
        }
    }
    strip_hop_by_hop(headers);
    let dropped: Vec<HeaderName> = headers.keys().filter(|n| never_forwarded(n.as_str(), gate)).cloned().collect();
    for name in dropped {
        headers.remove(name);
    }
    Ok(())
}

/// Whether the decision reads `name`, or the gate writes it (a caller naming it in `Connection`
/// would have it dropped after the decision, or the gate's own value dropped).
fn decided_or_set(name: &str, gate: &Gate) -> bool {
    gate.strips(name) || gate.reads_header(name) || says_where_from(name) || same_name(name, "authorization")
}

/// Whether a caller's header never reaches the upstream: an identity claim or a header the
/// gate file lists, a route override, where-from, or a name with an underscore.
fn never_forwarded(name: &str, gate: &Gate) -> bool {
    has_underscore(name) || gate.strips(name) || overrides_route(name) || says_where_from(name)
}

/// The fixed hop-by-hop headers, and `TE` unless it is `trailers` alone. Used on responses too.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    let trailers_only =
        headers.get_all(http::header::TE).iter().all(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    if !trailers_only {
        headers.remove(http::header::TE);
    }
}

/// How the request reached the gate, for its `X-Forwarded-*`.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    pub peer: Option<IpAddr>,
    pub tls: bool,
    /// The host the caller asked for: its `Host`, or its HTTP/2 `:authority`.
    pub host: Option<&'a str>,
}

/// Steps 3 and 4, once `caller` is allowed (`forward_authorization`: its rule passes a
/// certificate caller's token on).
pub fn after_decision(
    headers: &mut HeaderMap,
    caller: &Caller,
    groups: &[String],
    forward_authorization: bool,
    user_headers: &[String],
    arrival: Arrival<'_>,
) {
    if matches!(caller, Caller::Workload(_)) && !forward_authorization {
        headers.remove(http::header::AUTHORIZATION);
    }
    let mut set = |name: &str, value: &str| {
        // Printable ASCII by construction (each value is checked where it is made).
        if let (Some(name), Ok(value)) = (header_name(name), HeaderValue::from_str(value)) {
            headers.insert(name, value);
        }
    };
    if let Some(peer) = arrival.peer {
        for (name, value) in forwarded_headers(peer, arrival.tls, arrival.host) {
            set(name, &value);
        }
    }
    let identity = identity_headers(caller, groups);
    for (name, value) in &identity {
        set(name, value);
    }
    // The upstream's own user headers say the same (the client's copies went before the decision).
    if let Some((_, user)) = identity.iter().find(|(name, _)| *name == keyward_gate::headers::REMOTE_USER) {
        for name in user_headers {
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::from_str(user)) {
                headers.insert(name, value);
            }
        }
    }
}

/// The headers the gate sets, as names made at compile time. `HeaderMap::insert` by `&str`
/// copies a name that is not a standard header into a new allocation, on every request.
const SET_NAMES: [HeaderName; 7] = [
    HeaderName::from_static(keyward_gate::headers::FORWARDED_FOR),
    HeaderName::from_static(keyward_gate::headers::FORWARDED_PROTO),
    HeaderName::from_static(keyward_gate::headers::FORWARDED_HOST),
    HeaderName::from_static(keyward_gate::headers::REMOTE_USER),
    HeaderName::from_static(keyward_gate::headers::REMOTE_GROUPS),
    HeaderName::from_static(keyward_gate::headers::KEYWARD_IDENTITY),
    HeaderName::from_static(keyward_gate::headers::KEYWARD_POD),
];

fn header_name(name: &str) -> Option<HeaderName> {
    match SET_NAMES.iter().find(|n| n.as_str() == name) {
        Some(known) => Some(known.clone()),
        // A name added to keyward_gate::headers and not above: right, at an allocation's cost.
        None => HeaderName::from_bytes(name.as_bytes()).ok(),
    }
}

/// A request body whose trailers lose what the header block lost (step 2, and hop-by-hop).
pub fn strip_trailers(body: Body, gate: Arc<keyward_gate::config::Loaded>) -> Body {
    Body::new(StrippedTrailers { body, gate })
}

struct StrippedTrailers {
    body: Body,
    gate: Arc<keyward_gate::config::Loaded>,
}

impl http_body::Body for StrippedTrailers {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match polled {
            Poll::Ready(Some(Ok(frame))) => match frame.into_trailers() {
                Ok(mut trailers) => {
                    strip_hop_by_hop(&mut trailers);
                    let gate = &self.gate.gate;
                    let dropped: Vec<HeaderName> =
                        trailers.keys().filter(|n| never_forwarded(n.as_str(), gate)).cloned().collect();
                    for name in dropped {
                        trailers.remove(name);
                    }
                    Poll::Ready(Some(Ok(Frame::trailers(trailers))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATE: &str = "apiVersion: keyward.io/v1alpha1\nkind: Gate\nmetadata: {name: g}\nspec:\n  trustDomain: cluster.local\n  stripHeaders: [kubeflow-userid]\n  rules:\n    - name: r\n      http: {path: /**}\n      callers: {workloads: {}}\n      when: [{caller: namespace, equals: {header: x-tenant}}]\n";

    fn gate() -> Gate {
        keyward_gate::config::load("g.yaml", GATE).unwrap().gate
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(HeaderName::from_bytes(n.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    fn names(h: &HeaderMap) -> Vec<&str> {
        let mut n: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        n.sort();
        n
    }

    #[test]
    fn a_body_with_its_trailers_filtered_says_its_size_and_end_as_the_body_does() {
        use http_body::Body as _;
        let loaded = Arc::new(keyward_gate::config::load("g.yaml", GATE).unwrap());
        let body = strip_trailers(Body::from("abc"), loaded.clone());
        assert_eq!(body.size_hint().exact(), Some(3), "a Content-Length, not chunks, to an HTTP/1.1 upstream");
        assert!(!body.is_end_stream());
        assert!(strip_trailers(Body::empty(), loaded).is_end_stream());
    }

    #[test]
    fn a_connection_header_may_drop_what_no_one_reads_and_nothing_else() {
        let mut h = headers(&[
            ("connection", "keep-alive, x-debug"),
            ("x-debug", "1"),
            ("keep-alive", "5"),
            ("te", "trailers"),
            ("x-tenant", "team-a"),
        ]);
        before_decision(&mut h, &gate()).unwrap();
        assert_eq!(names(&h), ["te", "x-tenant"]);
        for named in [
            "X-Remote-User",
            "x_remote_groups",
            "X-Keyward-Identity",
            "kubeflow-userid",
            "x-tenant",
            "X-Forwarded-For",
            "authorization",
        ] {
            let mut h = headers(&[("connection", &format!("close, {named}")), ("x-tenant", "team-a")]);
            let e = before_decision(&mut h, &gate()).unwrap_err();
            assert!(
                e.starts_with(&format!("the Connection header names {}", named.to_ascii_lowercase())),
                "{named}: {e}"
            );
        }
    }

    #[test]
    fn identity_route_where_from_and_underscore_headers_never_pass() {
        let mut h = headers(&[
            ("x-remote-user", "system:admin"),
            ("kubeflow_userid", "admin"),
            ("x-original-url", "/admin"),
            ("x-http-method-override", "DELETE"),
            ("x-forwarded-for", "1.2.3.4"),
            ("forwarded", "for=1.2.3.4"),
            ("x_custom", "1"),
            ("x-request-id", "7"),
            ("authorization", "Bearer t"),
        ]);
        before_decision(&mut h, &gate()).unwrap();
        assert_eq!(names(&h), ["authorization", "x-request-id"]);
    }

    #[test]
    fn every_header_the_gate_sets_has_its_name_made_at_compile_time() {
        let id =
            keyward_gate::identity::WorkloadIdentity::parse("spiffe://cluster.local/ns/team-a/lmevaljob/j").unwrap();
        let sa = keyward_gate::identity::ServiceAccount::parse("system:serviceaccount:kubeflow:agent").unwrap();
        let groups = ["system:serviceaccounts".to_string()];
        let mut set: Vec<&str> =
            forwarded_headers("10.1.2.3".parse().unwrap(), true, Some("api:8443")).iter().map(|(n, _)| *n).collect();
        for caller in [Caller::Workload(id), Caller::ServiceAccount(sa)] {
            set.extend(identity_headers(&caller, &groups).iter().map(|(n, _)| *n));
        }
        assert_eq!(set.len(), 8, "{set:?}");
        for name in set {
            assert!(SET_NAMES.iter().any(|known| known.as_str() == name), "{name} is not in SET_NAMES");
            assert_eq!(header_name(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn a_certificate_callers_token_goes_unless_its_rule_forwards_it_and_the_gates_headers_come_last() {
        let id =
            keyward_gate::identity::WorkloadIdentity::parse("spiffe://cluster.local/ns/team-a/lmevaljob/j").unwrap();
        let arrival = Arrival { peer: Some("10.1.2.3".parse().unwrap()), tls: true, host: Some("api:8443") };
        let mut h = headers(&[("authorization", "Bearer someone-elses")]);
        after_decision(&mut h, &Caller::Workload(id.clone()), &[], false, &[], arrival);
        assert!(h.get("authorization").is_none());
        assert_eq!(h.get("x-remote-user").unwrap(), "spiffe://cluster.local/ns/team-a/lmevaljob/j");
        let get = |n: &str| h.get(n).unwrap().to_str().unwrap();
        assert_eq!(
            (get("x-forwarded-for"), get("x-forwarded-proto"), get("x-forwarded-host")),
            ("10.1.2.3", "https", "api:8443")
        );
        let mut h = headers(&[("authorization", "Bearer mine")]);
        after_decision(&mut h, &Caller::Workload(id), &[], true, &[], arrival);
        assert_eq!(h.get("authorization").unwrap(), "Bearer mine");
        let sa = keyward_gate::identity::ServiceAccount::parse("system:serviceaccount:kubeflow:agent").unwrap();
        let mut h = headers(&[("authorization", "Bearer mine")]);
        after_decision(&mut h, &Caller::ServiceAccount(sa.clone()), &[], false, &[], arrival);
        assert_eq!(
            h.get("authorization").unwrap(),
            "Bearer mine",
            "a token caller's token is its credential: KFP reviews it again"
        );
        // The upstream's own user header (EvalHub's X-User) says the verified user, not a group.
        let mut h = headers(&[]);
        let groups = ["system:serviceaccounts".to_string()];
        after_decision(&mut h, &Caller::ServiceAccount(sa), &groups, false, &["X-User".into()], arrival);
        assert_eq!(h.get("x-user").unwrap(), "system:serviceaccount:kubeflow:agent");
        assert_eq!(h.get("x-remote-groups").unwrap(), "system:serviceaccounts");
        let mut h = headers(&[]);
        after_decision(&mut h, &Caller::Anonymous, &[], false, &["X-User".into()], arrival);
        assert!(h.get("x-user").is_none(), "no user, no user header");
    }
}
