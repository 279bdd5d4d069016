//! The HTTP surface: `POST /mutate`, `GET /healthz`, `GET /readyz`. Tested in-process.
//!
//! An admission holds a share of a byte budget for its body from the first byte read to the
//! response, and decides on a blocking thread, at most `decisions` at once: memory stays bounded
//! whatever arrives, and a large pod never stalls the health endpoints on the async workers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http_body_util::BodyExt;
use keyward_certs::attestation::KeyStore;
use keyward_certs::CertStore;
use keyward_controller::attestation::KeysAttestor;
use keyward_engine::engine::decide_object;
use keyward_engine::review::{self, AdmissionRequest};
use keyward_engine::text::clip;
use keyward_engine::{Attestor, Decision};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;
use crate::profiles::Profiles;
use crate::serve::connections::RequestProgress;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The profile set of the moment (reloaded when `--profiles` changes).
    pub profiles: Profiles,
    pub certs: Arc<CertStore>,
    pub metrics: Arc<Metrics>,
    /// Set on SIGTERM: /readyz fails so endpoints drop this pod, while it still serves.
    pub draining: Arc<AtomicBool>,
    pub read_timeout: Duration,
    pub max_body_bytes: usize,
    /// Bytes of request bodies being read or decided on, all requests together.
    pub body_budget: Arc<Semaphore>,
    /// Decisions running at once.
    pub decisions: Arc<Semaphore>,
    /// The keys that sign the admission attestation (hot-reloaded), when a profile issues
    /// per-owner credentials.
    pub attestation_keys: Option<Arc<KeyStore>>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(|| async {
            (StatusCode::NOT_FOUND, "not found: keyward serves POST /mutate, GET /healthz and GET /readyz\n")
        })
        .with_state(state)
}

/// The metrics port (plain HTTP): `GET /metrics`, and `/healthz` and `/readyz` as on the
/// webhook port. Its `/healthz` answers before a serving certificate exists, so a liveness
/// probe on it lets a pod wait for its certificate (a self-managed or service-ca install's
/// optional Secret) instead of being restarted for the handshake it cannot yet complete.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(state): State<AppState>| async move {
                ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], state.metrics.encode())
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(|| async {
            (StatusCode::NOT_FOUND, "not found: the metrics port serves GET /metrics, /healthz and /readyz\n")
        })
        .with_state(state)
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready: shutting down\n").into_response();
    }
    let attestation = state.attestation_keys.as_ref().map_or(Ok(()), |keys| keys.ready());
    match state.certs.ready(SystemTime::now()).and(attestation) {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")).into_response(),
    }
}

/// A refusal before any decision: counted, logged, answered with a one-line reason.
fn refuse(state: &AppState, status: StatusCode, reason: String) -> Response {
    state.metrics.observe_bad_request();
    tracing::warn!(
        status = status.as_u16(),
        reason = clip(&reason, LOG_DENIAL_MAX).as_ref(),
        "admission request refused"
    );
    (status, format!("{reason}\n")).into_response()
}

async fn mutate(State(state): State<AppState>, request: Request) -> Response {
    let progress = request.extensions().get::<RequestProgress>().cloned();
    // A declared length over the limit is refused before waiting for a body that may never come.
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(declared) = declared.filter(|n| *n > state.max_body_bytes as u64) {
        let reason = format!("body of {declared} bytes is over the {}-byte limit", state.max_body_bytes);
        return refuse(&state, StatusCode::PAYLOAD_TOO_LARGE, reason);
    }
    // A slow client cannot hold a worker: the body must arrive within the read timeout.
    let (body, budget) =
        match tokio::time::timeout(state.read_timeout, read_body(&state, declared, request.into_body())).await {
            Ok(Ok(read)) => read,
            Ok(Err((status, reason))) => return refuse(&state, status, reason),
            Err(_) => return refuse(&state, StatusCode::REQUEST_TIMEOUT, "request body not received in time".into()),
        };
    // Read whole: from now on its connection is spared eviction until it is answered.
    let answering = progress.map(|p| p.read_whole());
    let Ok(decision) = state.decisions.clone().acquire_owned().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response();
    };
    let running = Running::start(&state.metrics);
    let decision = (decision, running);
    // A typical pod is decided in tens of microseconds, cheaper than a hand-off to another
    // thread; a large one goes to a blocking thread so that it never holds up an async worker
    // (and with it /healthz and /readyz).
    if body.len() <= INLINE_DECISION_BYTES {
        let response = answer(&state, &body);
        drop((budget, decision, answering));
        return response;
    }
    let worker = state.clone();
    let answered = tokio::task::spawn_blocking(move || {
        let response = answer(&worker, &body);
        drop((budget, decision, answering));
        response
    });
    match answered.await {
        Ok(response) => response,
        Err(e) => {
            tracing::error!(error = %e, "an admission decision failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "internal error\n").into_response()
        }
    }
}

/// Counts a decision in `keyward_admission_decisions_running` while it lives.
struct Running(prometheus_client::metrics::gauge::Gauge);

impl Running {
    fn start(metrics: &Metrics) -> Self {
        let gauge = metrics.decisions_running();
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Bodies up to this size are decided on the async worker that read them (well under a
/// millisecond); larger ones on a blocking thread.
const INLINE_DECISION_BYTES: usize = 64 * 1024;

/// Reads the body, taking its bytes from the budget as they arrive, past the first
/// [`INLINE_DECISION_BYTES`]: those cost nothing from the budget (they are bounded by the
/// connection cap), so bodies that stall holding the budget can never keep an ordinary pod,
/// which the apiserver sends in one go and in a few kilobytes, waiting for it.
async fn read_body(
    state: &AppState,
    declared: Option<u64>,
    mut body: Body,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), (StatusCode, String)> {
    // Bodies usually arrive in one frame, kept as is; several are joined as they arrive, into
    // room for the declared length (never past the limit), so that a body is held about once.
    let mut first: Option<Bytes> = None;
    let mut joined: Option<Vec<u8>> = None;
    let mut total = 0;
    let mut held: Option<OwnedSemaphorePermit> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| (StatusCode::BAD_REQUEST, format!("cannot read the body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        total += data.len();
        if total > state.max_body_bytes {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("body is over the {}-byte limit", state.max_body_bytes),
            ));
        }
        let charged = total.saturating_sub(INLINE_DECISION_BYTES).min(data.len());
        let n = u32::try_from(charged).unwrap_or(u32::MAX);
        if n > 0 {
            let permit = state
                .body_budget
                .clone()
                .acquire_many_owned(n)
                .await
                .map_err(|_| (StatusCode::SERVICE_UNAVAILABLE, "shutting down".to_string()))?;
            match &mut held {
                Some(h) => h.merge(permit),
                None => held = Some(permit),
            }
        }
        match (&mut joined, first.take()) {
            (Some(buf), _) => buf.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(earlier)) => {
                let room = declared.and_then(|d| usize::try_from(d).ok()).unwrap_or(total).max(total);
                let mut buf = Vec::with_capacity(room.min(state.max_body_bytes));
                buf.extend_from_slice(&earlier);
                buf.extend_from_slice(&data);
                joined = Some(buf);
            }
        }
    }
    let body = match (joined, first) {
        (Some(buf), _) => Bytes::from(buf),
        (None, Some(data)) => data,
        (None, None) => Bytes::new(),
    };
    Ok((body, held))
}

/// Parses, decides and answers one admission (on a blocking thread).
fn answer(state: &AppState, body: &[u8]) -> Response {
    let started = Instant::now();
    // One set for the whole decision, whatever a reload does meanwhile.
    let profiles = state.profiles.current();
    let request = match review::read_request(body, profiles.annotations_read()) {
        Ok(r) => r,
        Err(e) => return refuse(state, StatusCode::BAD_REQUEST, e.to_string()),
    };
    // The webhook's own admission: keyward's annotations on the pod are only those it vouches for.
    let attestor = state.attestation_keys.as_ref().map(|store| KeysAttestor(store.keys()));
    let facts = request.facts().admitting(attestor.as_ref().map(|a| a as &dyn Attestor));
    let decision = decide_object(&facts, &request.object, &profiles);
    let took = started.elapsed();
    state.metrics.observe_decision(decision.profile.as_deref(), decision.allowed(), decision.reason.as_str(), took);
    log_decision(&request, &decision, took);
    ([(CONTENT_TYPE, "application/json")], review::respond(&request.uid, &decision)).into_response()
}

/// The longest request-supplied string a log line carries.
const LOG_FIELD_MAX: usize = 256;
/// The longest denial a log line carries (the response has it whole).
const LOG_DENIAL_MAX: usize = 1024;

/// One line per decision. Names only: never Secret data or tokens (the decision has none).
/// Every request-supplied value is a clipped string field (see [`crate::logging`]).
fn log_decision(request: &AdmissionRequest<'_>, decision: &Decision, took: Duration) {
    tracing::info!(
        uid = clip(&request.uid, LOG_FIELD_MAX).as_ref(),
        operation = clip(&request.operation, LOG_FIELD_MAX).as_ref(),
        namespace = clip(request.namespace.as_deref().unwrap_or_default(), LOG_FIELD_MAX).as_ref(),
        pod = decision.pod.as_deref().unwrap_or_default(),
        requester = clip(request.user_info.username.as_deref().unwrap_or_default(), LOG_FIELD_MAX).as_ref(),
        profile = decision.profile.as_deref().unwrap_or_default(),
        allowed = decision.allowed(),
        reason = decision.reason.as_str(),
        denial = clip(decision.message().unwrap_or_default(), LOG_DENIAL_MAX).as_ref(),
        patch_ops = decision.patch().len(),
        warnings = decision.warnings.len(),
        dry_run = request.dry_run.unwrap_or(false),
        duration_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        "admission decision"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use http_body_util::BodyExt;
    use keyward_engine::ProfileSet;
    use serde_json::Value;
    use tower::ServiceExt;

    fn state() -> AppState {
        AppState {
            profiles: Profiles::fixed(ProfileSet::builtin().unwrap()),
            certs: Arc::new(CertStore::new("/nonexistent")),
            metrics: Arc::new(Metrics::default()),
            draining: Arc::new(AtomicBool::new(false)),
            read_timeout: Duration::from_secs(5),
            max_body_bytes: 1024 * 1024,
            body_budget: Arc::new(Semaphore::new(8 * 1024 * 1024)),
            decisions: Arc::new(Semaphore::new(2)),
            attestation_keys: None,
        }
    }

    async fn call(state: AppState, method: &str, uri: &str, body: Vec<u8>) -> (StatusCode, String) {
        let request = Request::builder().method(method).uri(uri).body(Body::from(body)).unwrap();
        let response = router(state).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    fn review() -> Vec<u8> {
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/admissionreview-lmeval.json")).unwrap()
    }

    #[tokio::test]
    async fn mutate_answers_with_the_request_uid_and_a_json_patch() {
        let (status, body) = call(state(), "POST", "/mutate?timeout=10s", review()).await;
        assert_eq!(status, StatusCode::OK);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(v["kind"], "AdmissionReview");
        assert_eq!(v["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(v["response"]["allowed"], true);
        assert_eq!(v["response"]["patchType"], "JSONPatch");
        assert!(v["response"]["patch"].as_str().is_some_and(|p| !p.is_empty()));
        assert_eq!(v["response"]["auditAnnotations"]["profile"], "lmeval");
    }

    #[tokio::test]
    async fn bad_bodies_get_400_413_and_wrong_routes_404_405() {
        let (status, body) = call(state(), "POST", "/mutate", b"{not json".to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.starts_with("body is not an AdmissionReview: "), "{body}");
        assert_eq!(body.lines().count(), 1);
        let mut small = state();
        small.max_body_bytes = 64;
        let (status, _) = call(small, "POST", "/mutate", review()).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        let (status, _) = call(state(), "GET", "/mutate", Vec::new()).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        let (status, body) = call(state(), "POST", "/validate", review()).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("POST /mutate"), "{body}");
    }

    #[tokio::test]
    async fn an_oversized_uid_is_refused_not_echoed() {
        let mut review: Value = serde_json::from_slice(&review()).unwrap();
        review["request"]["uid"] = Value::from("u".repeat(6 * 1024 * 1024));
        let mut roomy = state();
        roomy.max_body_bytes = 7 * 1024 * 1024;
        let (status, body) = call(roomy, "POST", "/mutate", serde_json::to_vec(&review).unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            body,
            "request.uid is 6291456 bytes; the apiserver sends a UID of 36 characters, and keyward accepts up to 128\n"
        );
        review["request"]["uid"] = Value::from("u-1");
        review["apiVersion"] = Value::from("admission.k8s.io/v1\nINFO forged");
        let (status, body) = call(state(), "POST", "/mutate", serde_json::to_vec(&review).unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body.lines().count(), 1, "{body}");
        assert!(
            body.starts_with("body is apiVersion \"admission.k8s.io/v1\\nINFO forged\" kind \"AdmissionReview\""),
            "{body}"
        );
    }

    /// A writer the tests read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    /// The decision log line for a request whose every string is hostile.
    fn hostile_decision_log(format: crate::logging::LogFormat) -> String {
        let forged = "\n2026-11-30T15:00:00.000000Z  INFO admission decision uid=\"x\" allowed=true";
        let mut review: Value = serde_json::from_slice(&review()).unwrap();
        review["request"]["uid"] = Value::from(format!("u-1{forged}"));
        review["request"]["operation"] = Value::from(format!("CREATE{forged}"));
        review["request"]["namespace"] = Value::from(format!("team-a{forged}"));
        review["request"]["userInfo"]["username"] = Value::from(format!("mallory allowed=true{forged}"));
        let body = serde_json::to_vec(&review).unwrap();
        let request = review::parse_request(&body).unwrap();
        let profiles = ProfileSet::builtin().unwrap();
        let mut facts = request.facts();
        facts.operation = "CREATE";
        let decision = keyward_engine::decide(&facts, request.object.raw().unwrap(), &profiles);
        assert!(!decision.allowed(), "the requester is not the operator: a denial that quotes the username");
        let out = Captured::default();
        let dispatch = crate::logging::dispatch(format, tracing_subscriber::EnvFilter::new("info"), out.clone(), false);
        tracing::dispatcher::with_default(&dispatch, || log_decision(&request, &decision, Duration::from_micros(7)));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        text
    }

    #[test]
    fn text_logs_quote_and_escape_everything_from_the_request() {
        let line = hostile_decision_log(crate::logging::LogFormat::Text);
        assert_eq!(line.lines().count(), 1, "one event, one line:\n{line}");
        assert!(line.contains(" INFO admission decision uid=\"u-1\\n2026-11-30T15:00:00.000000Z  INFO admission decision uid=\\\"x\\\" allowed=true\" "), "{line}");
        assert!(line.contains(" requester=\"mallory allowed=true\\n"), "{line}");
        assert!(line.contains(" allowed=false "), "{line}");
        assert!(line.contains(" denial=\"keyward: profile \\\"lmeval\\\" selects this pod"), "{line}");
        assert!(!line.contains(" message="), "the denial is not tracing's message field: {line}");
    }

    #[test]
    fn json_logs_have_one_message_and_the_denial_in_its_own_field() {
        let line = hostile_decision_log(crate::logging::LogFormat::Json);
        assert_eq!(line.lines().count(), 1, "{line}");
        assert_eq!(line.matches("\"message\":").count(), 1, "{line}");
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["message"], "admission decision");
        assert_eq!(v["allowed"], false);
        assert!(v["requester"].as_str().unwrap().starts_with("mallory allowed=true\n2026"));
        assert!(v["denial"].as_str().unwrap().starts_with("keyward: profile \"lmeval\" selects this pod"), "{v}");
    }

    #[tokio::test]
    async fn readyz_says_why_not() {
        let (status, body) = call(state(), "GET", "/readyz", Vec::new()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not ready: no serving certificate loaded yet\n");
        let (status, body) = call(state(), "GET", "/healthz", Vec::new()).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok\n"));
    }
}
