//! One request through the gate: who is calling, whether the path can be judged, the gRPC
//! message when a rule reads it, the rules (and the API server's answers they await), then the
//! request forwarded with the client's identity headers replaced by the gate's. Each refusal
//! is answered in the caller's protocol (`keyward_gate::refusal`), logged and counted.
//!
//! Time: the request's headers have arrived (the connection layer timed them); a held gRPC
//! message must arrive whole within the read timeout; reviews have their own deadline. Once
//! allowed, the request is being answered: its body and the response stream for as long as
//! the upstream keeps them (a gRPC stream may last), spared eviction.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http::HeaderValue;
use http_body_util::BodyExt;
use keyward_engine::text::clip;
use keyward_gate::grpc;
use keyward_gate::identity::WorkloadIdentity;
use keyward_gate::refusal::{self, Refusal};
use keyward_gate::route::RequestPath;
use keyward_gate::rules::{AccessReview, Caller, Standing, PASSED_ON};
use tokio::sync::Semaphore;

use super::caller::{bearer_token, workload_of};
use super::client_ca::ClientCa;
use super::forward;
use super::metrics::{Decision, GateMetrics};
use super::owners::{LiveOwners, OwnerRefusal};
use super::pods::{PodRefusal, Pods};
use super::reviews::{Reviews, TokenRefused};
use super::share::Shares;
use super::store::GateStore;
use super::upstream::{HeldMessage, Outgoing, SendError, Upstream};
use crate::serve::connections::{Client, Guarded, PeerCertificate, RequestProgress};

/// Why a caller with no credential is refused where no rule is open to anonymous callers: the
/// credentials this gate takes, and no other (a gate without `tokenReview` takes no token).
fn no_credential(gate: &keyward_gate::rules::Gate) -> &'static str {
    if gate.token_audiences().is_some() {
        "no client certificate and no bearer token: present the keyward client certificate of your workload, or a service account token"
    } else {
        "no client certificate: present the keyward client certificate of your workload (this gate takes no bearer tokens)"
    }
}

/// The most of a request path written into a log line.
const LOG_PATH_MAX: usize = 256;

#[derive(Clone)]
pub struct GateState {
    pub gate: Arc<GateStore>,
    /// `None`: no API server to ask (the gate file accepts no tokens and asks no reviews).
    pub reviews: Option<Arc<Reviews>>,
    /// The owner kinds watched (`spec.liveOwners`); `None`: none.
    pub owners: Option<Arc<LiveOwners>>,
    /// The callers' pods watched (`spec.tokenReview.pods`); `None`: none.
    pub pods: Option<Arc<Pods>>,
    pub upstream: Arc<Upstream>,
    /// The client CAs, checked again on each request of a connection (`None`: no certificates).
    pub client_ca: Option<Arc<ClientCa>>,
    pub metrics: Arc<GateMetrics>,
    pub read_timeout: Duration,
    /// Bytes of held gRPC messages, all requests together: the bound on the gate's memory.
    pub body_budget: Arc<Semaphore>,
    /// Each caller's share of the budget and of the held calls.
    pub shares: Arc<Shares>,
}

/// Why a request is not forwarded.
struct Stop {
    decision: Decision,
    refusal: Refusal,
    /// For the log line: the reason in full (the answer's is clipped).
    reason: String,
}

impl Stop {
    fn new(decision: Decision, grpc: bool, reason: String) -> Self {
        let refusal = match decision {
            Decision::Unauthenticated => refusal::unauthenticated(grpc, &reason),
            Decision::Unavailable => refusal::unavailable(grpc, 503, &reason),
            Decision::Refused | Decision::Allowed => refusal::forbidden(grpc, &reason),
        };
        Self { decision, refusal, reason }
    }
}

pub async fn handle(State(state): State<GateState>, request: Request) -> Response {
    let started = Instant::now();
    let (mut parts, body) = request.into_parts();
    let grpc = refusal::is_grpc(parts.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()));
    let loaded = state.gate.current();
    let gate = &loaded.gate;

    // What the decision reads is what the upstream gets: the caller's connection-level and
    // never-forwarded headers go first.
    let decided = match forward::before_decision(&mut parts.headers, gate) {
        Ok(()) => decide(&state, gate, &parts, body, grpc).await,
        Err(why) => Err((Stop::new(Decision::Refused, grpc, why), None)),
    };
    let (caller, groups, rule, body) = match decided {
        Ok(allowed) => allowed,
        Err((stop, caller)) => {
            state.metrics.observe_request(None, stop.decision, started.elapsed());
            tracing::warn!(
                decision = stop.decision.as_str(),
                caller = caller.as_deref().unwrap_or(""),
                method = %parts.method,
                path = ?clip(parts.uri.path(), LOG_PATH_MAX),
                reason = ?stop.reason,
                "gate refused a request"
            );
            return into_response(stop.refusal);
        }
    };
    state.metrics.observe_request(Some(&rule), Decision::Allowed, started.elapsed());
    tracing::debug!(caller = %describe(&caller), rule = %rule, method = %parts.method, path = ?clip(parts.uri.path(), LOG_PATH_MAX), "gate allowed a request");

    // The upstream learns the caller, and where the request came from, from the gate alone.
    let client = parts.extensions.get::<Client>().copied();
    let host = match parts.headers.get(http::header::HOST).and_then(|h| h.to_str().ok()) {
        Some(host) => Some(host.to_string()),
        None => parts.uri.authority().map(|a| a.to_string()),
    };
    let arrival = forward::Arrival {
        peer: client.map(|c| c.addr.ip()),
        tls: client.is_some_and(|c| c.tls),
        host: host.as_deref(),
    };
    forward::after_decision(
        &mut parts.headers,
        &caller,
        &groups,
        gate.forwards_authorization(&rule),
        gate.user_headers(),
        arrival,
    );
    let body = match body {
        Outgoing::Streamed(body) => Outgoing::Streamed(forward::strip_trailers(body, loaded.clone())),
        held => held,
    };
    let answering = parts.extensions.get::<RequestProgress>().map(RequestProgress::read_whole);
    let sent = state.upstream.send(parts, body, grpc).await;
    match sent {
        Ok(response) => response.map(|body| Guarded::wrap(body, answering)),
        Err(SendError::Unreachable(e)) => {
            state.metrics.observe_upstream_error();
            tracing::warn!(upstream = ?state.upstream, error = %e, "gate could not reach the upstream");
            into_response(refusal::unavailable(grpc, 502, "the upstream could not be reached"))
        }
        Err(SendError::Unsupported(why)) => {
            state.metrics.observe_upstream_error();
            tracing::warn!(upstream = ?state.upstream, error = why, "gate could not send a request to the upstream");
            into_response(refusal::unavailable(grpc, 502, why))
        }
    }
}

type Allowed = (Caller, Vec<String>, String, Outgoing);

/// Everything before forwarding: the caller, the path, the held message, the rules.
async fn decide(
    state: &GateState,
    gate: &keyward_gate::rules::Gate,
    parts: &http::request::Parts,
    body: Body,
    grpc: bool,
) -> Result<Allowed, (Stop, Option<String>)> {
    // Read once, refused only after the caller is known (as before `unmatched`).
    let path = parts.uri.path();
    let parsed = RequestPath::parse(path);
    // A path no rule names, with `unmatched: upstream`: the upstream authenticates, not the gate.
    if let Ok(checked) = &parsed {
        match gate.standing(path, checked) {
            Standing::Judged => {}
            Standing::PassedOn => {
                return Ok((Caller::Anonymous, Vec::new(), PASSED_ON.into(), Outgoing::Streamed(body)))
            }
            Standing::Refused(why) => return Err((Stop::new(Decision::Refused, grpc, why), None)),
        }
    }
    let (caller, groups) = authenticate(state, gate, parts, grpc).await.map_err(|stop| (stop, None))?;
    // The caller is written out only for a refusal's log line, not on every request.
    let fail = |decision, reason: String| (Stop::new(decision, grpc, reason), Some(describe(&caller)));
    if let (Caller::Workload(id), Some(owners)) = (&caller, &state.owners) {
        owners.check(id).map_err(|refusal| match refusal {
            // The credential no longer names a live workload: as a revoked one.
            OwnerRefusal::Gone(why) => fail(Decision::Unauthenticated, why),
            OwnerRefusal::NotListed(why) => fail(Decision::Unavailable, why),
        })?;
    }
    let checked = parsed.map_err(|e| fail(Decision::Refused, e.to_string()))?;
    let method = parts.method.as_str();
    let (message, body) = if gate.reads_body(&caller, method, &checked) {
        let held =
            hold_message(state, body, &describe(&caller), grpc).await.map_err(|(decision, why)| fail(decision, why))?;
        let bytes = held.bytes.clone();
        if grpc {
            grpc::only_message(&bytes).map_err(|e| fail(Decision::Refused, e.to_string()))?;
        }
        (bytes, Outgoing::Held(held))
    } else {
        (Bytes::new(), Outgoing::Streamed(body))
    };
    let headers: Vec<(&str, &str)> =
        parts.headers.iter().filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?))).collect();
    let request = keyward_gate::rules::Request { method, path, headers: &headers, body: &message };
    let mut verdict = gate.decide_for_proxy(&caller, &request, &checked, &|_| None);
    if verdict.allowed_by.is_none() && !verdict.pending.is_empty() {
        let Some(reviews) = &state.reviews else {
            return Err(fail(Decision::Unavailable, "the gate has no API server to ask".into()));
        };
        let mut answers: Vec<(AccessReview, bool)> = Vec::with_capacity(verdict.pending.len());
        for review in &verdict.pending {
            let allowed = reviews.access(review).await.map_err(|e| fail(Decision::Unavailable, e))?;
            answers.push((review.clone(), allowed));
            if allowed {
                // The first rule that awaited it and now holds decides; later ones need no asking.
                break;
            }
        }
        verdict = gate.decide_for_proxy(&caller, &request, &checked, &|r| {
            answers.iter().find(|(a, _)| a == r).map(|(_, ok)| *ok)
        });
    }
    match verdict.allowed_by {
        Some(rule) => Ok((caller, groups, rule, body)),
        // No rule is open to a caller without a credential here: asking for one is the answer.
        None if caller == Caller::Anonymous => Err(fail(Decision::Unauthenticated, no_credential(gate).into())),
        None => Err(fail(Decision::Refused, verdict.reason())),
    }
}

/// What a connection's client certificate says, read on its first request.
struct PeerReading {
    identity: Result<WorkloadIdentity, String>,
}

/// The caller: the client certificate's workload identity, else a bearer token's account.
async fn authenticate(
    state: &GateState,
    gate: &keyward_gate::rules::Gate,
    parts: &http::request::Parts,
    grpc: bool,
) -> Result<(Caller, Vec<String>), Stop> {
    let unauthenticated = |why: String| Stop::new(Decision::Unauthenticated, grpc, why);
    if let Some(peer) = parts.extensions.get::<PeerCertificate>() {
        // Read on the connection's first request, kept for the rest.
        let reading = peer.read_once(|der| Arc::new(PeerReading { identity: workload_of(der) }));
        // Good at the handshake is not good for ever: on every request the certificate must
        // still be in its validity and, after a reload, chain to a client CA in force (no TLS
        // session is resumed, so no connection skips its handshake's verification either).
        if let Some(ca) = &state.client_ca {
            match ca.still_trusts(peer.chain(), peer.trusted_under(), peer.not_after(), SystemTime::now()) {
                Ok(generation) => peer.trusted_again(generation),
                Err(why) => {
                    if let Some(progress) = parts.extensions.get::<RequestProgress>() {
                        progress.close_when_answered();
                    }
                    return Err(unauthenticated(why));
                }
            }
        }
        return match &reading.identity {
            Ok(id) => Ok((Caller::Workload(id.clone()), Vec::new())),
            Err(why) => Err(unauthenticated(why.clone())),
        };
    }
    let token = bearer_token(&parts.headers).map_err(unauthenticated)?;
    let Some(token) = token else {
        // Admitted only by a rule open to anonymous callers (`callers.anonymous`).
        return Ok((Caller::Anonymous, Vec::new()));
    };
    let (Some(audiences), Some(reviews)) = (gate.token_audiences(), &state.reviews) else {
        return Err(unauthenticated("this gate accepts client certificates only, not bearer tokens".into()));
    };
    let source = parts.extensions.get::<Client>().map(|c| c.addr.ip());
    match reviews.token(token, audiences, source).await {
        Ok(account) => match (account.caller, &account.pod, &state.pods) {
            // A pod-bound token of a gate that watches pods: the caller is that pod, or no one.
            (Caller::ServiceAccount(sa), Some(bound), Some(pods)) => match pods.caller(sa, bound) {
                Ok(pod) => Ok((Caller::Pod(pod), account.groups)),
                Err(PodRefusal::Gone(why)) => Err(unauthenticated(why)),
                Err(PodRefusal::NotListed(why)) => Err(Stop::new(Decision::Unavailable, grpc, why)),
            },
            (caller, _, _) => Ok((caller, account.groups)),
        },
        Err(TokenRefused::Rejected(why)) => Err(unauthenticated(why)),
        Err(TokenRefused::Unavailable(why)) => Err(Stop::new(Decision::Unavailable, grpc, why)),
    }
}

/// Reads the whole request body (a call whose one message a rule reads, or a JSON body), within
/// the read timeout, the budget of all callers and this caller's share of it: at most a gRPC
/// message's 5-byte prefix and `MAX_MESSAGE_BYTES`, or a JSON body of `json::MAX_BODY_BYTES`.
async fn hold_message(state: &GateState, mut body: Body, caller: &str, grpc: bool) -> Result<HeldMessage, Stop0> {
    let limit = if grpc { grpc::MAX_MESSAGE_BYTES + 5 } else { keyward_gate::json::MAX_BODY_BYTES };
    let share = state.shares.begin(caller).map_err(|why| (Decision::Unavailable, why))?;
    let read = async {
        let mut held = BytesMut::new();
        let mut message = HeldMessage { bytes: Bytes::new(), budget: None, share: Some(share) };
        let shutting_down = || (Decision::Unavailable, "the gate is shutting down".to_string());
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| (Decision::Refused, format!("the request body could not be read: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            if held.len() + data.len() > limit {
                let why = if grpc {
                    format!(
                        "the request body is more than {limit} bytes: a gRPC message the gate reads is at most {} bytes, and a call whose rule reads a field carries one",
                        grpc::MAX_MESSAGE_BYTES
                    )
                } else {
                    format!("the request body is more than {limit} bytes, the most of a JSON body the gate reads")
                };
                return Err((Decision::Refused, why));
            }
            if let Some(share) = &mut message.share {
                share.add(data.len()).map_err(|why| (Decision::Unavailable, why))?;
            }
            let more = u32::try_from(data.len()).unwrap_or(u32::MAX);
            let got = state.body_budget.clone().acquire_many_owned(more).await.map_err(|_| shutting_down())?;
            match &mut message.budget {
                Some(p) => p.merge(got),
                None => message.budget = Some(got),
            }
            held.extend_from_slice(&data);
        }
        message.bytes = held.freeze();
        Ok(message)
    };
    match tokio::time::timeout(state.read_timeout, read).await {
        Ok(result) => result,
        Err(_) if grpc => Err((Decision::Refused, format!(
            "the request's message did not arrive whole within {:?}: a call whose rule reads a field must send one message and end its stream (unary or server-streaming)",
            state.read_timeout
        ))),
        Err(_) => Err((Decision::Refused, format!(
            "the request's body did not arrive whole within {:?}: a rule reads a JSON field of it",
            state.read_timeout
        ))),
    }
}

/// Why a held message was not read: the decision to count, and the reason.
type Stop0 = (Decision, String);

fn describe(caller: &Caller) -> String {
    match caller {
        Caller::Workload(id) => id.to_string(),
        Caller::ServiceAccount(sa) => sa.to_string(),
        Caller::Pod(p) => p.to_string(),
        Caller::User(user) => user.to_string(),
        Caller::Anonymous => "anonymous".into(),
    }
}

fn into_response(refusal: Refusal) -> Response {
    let mut response = Response::new(Body::from(refusal.body));
    *response.status_mut() = http::StatusCode::from_u16(refusal.status).unwrap_or(http::StatusCode::FORBIDDEN);
    for (name, value) in refusal.headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}
