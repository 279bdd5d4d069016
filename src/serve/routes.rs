//! The HTTP surface: `POST /mutate`, `GET /healthz`, `GET /readyz`. Tested in-process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::header::CONTENT_LENGTH;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use keyward_certs::CertStore;
use keyward_webhooks::review::{AdmissionRequest, AdmissionReview};
use keyward_webhooks::text::clip;
use keyward_webhooks::{decide, Decision, ProfileSet};
use serde_json::Value;

use crate::metrics::Metrics;

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    pub profiles: Arc<ProfileSet>,
    pub certs: Arc<CertStore>,
    pub metrics: Arc<Metrics>,
    /// Set on SIGTERM: /readyz fails so endpoints drop this pod, while it still serves.
    pub draining: Arc<AtomicBool>,
    pub read_timeout: Duration,
    pub max_body_bytes: usize,
}

pub fn router(state: AppState) -> Router {
    let limit = state.max_body_bytes;
    Router::new()
        .route("/mutate", post(mutate))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(|| async {
            (StatusCode::NOT_FOUND, "not found: keyward serves POST /mutate, GET /healthz and GET /readyz\n")
        })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn readyz(State(state): State<AppState>) -> Response {
    if state.draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready: shutting down\n").into_response();
    }
    match state.certs.ready(SystemTime::now()) {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")).into_response(),
    }
}

async fn mutate(State(state): State<AppState>, request: Request) -> Response {
    // A declared length over the limit is refused before waiting for a body that may never come.
    let declared = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(declared) = declared.filter(|n| *n > state.max_body_bytes as u64) {
        state.metrics.observe_bad_request();
        let message = format!("body of {declared} bytes is over the {}-byte limit\n", state.max_body_bytes);
        return (StatusCode::PAYLOAD_TOO_LARGE, message).into_response();
    }
    // A slow client cannot hold a worker: the body must arrive within the read timeout.
    let body = match tokio::time::timeout(state.read_timeout, Bytes::from_request(request, &state)).await {
        Ok(Ok(body)) => body,
        Ok(Err(rejection)) => {
            state.metrics.observe_bad_request();
            tracing::warn!(
                status = rejection.status().as_u16(),
                reason = clip(&rejection.body_text(), LOG_DENIAL_MAX).as_ref(),
                "admission request refused"
            );
            return rejection.into_response();
        }
        Err(_) => {
            state.metrics.observe_bad_request();
            return (StatusCode::REQUEST_TIMEOUT, "request body not received in time\n").into_response();
        }
    };
    let started = Instant::now();
    let request = match AdmissionReview::parse_request(&body) {
        Ok(r) => r,
        Err(e) => {
            state.metrics.observe_bad_request();
            tracing::warn!(
                reason = clip(&e.to_string(), LOG_DENIAL_MAX).as_ref(),
                bytes = body.len(),
                "admission request refused"
            );
            return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response();
        }
    };
    let decision = decide(&request.facts(), request.object.as_ref().unwrap_or(&Value::Null), &state.profiles);
    let took = started.elapsed();
    state.metrics.observe_decision(decision.profile.as_deref(), decision.allowed(), decision.reason.as_str(), took);
    log_decision(&request, &decision, took);
    match AdmissionReview::respond(&request.uid, &decision) {
        Ok(review) => Json(review).into_response(),
        Err(e) => {
            tracing::error!(
                uid = clip(&request.uid, LOG_FIELD_MAX).as_ref(),
                error = clip(&e.to_string(), LOG_DENIAL_MAX).as_ref(),
                "cannot encode the admission response"
            );
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
        }
    }
}

/// The longest request-supplied string a log line carries.
const LOG_FIELD_MAX: usize = 256;
/// The longest denial a log line carries (the response has it whole).
const LOG_DENIAL_MAX: usize = 1024;

/// One line per decision. Names only: never Secret data or tokens (the decision has none).
/// Every request-supplied value is a clipped string field (see [`crate::logging`]).
fn log_decision(request: &AdmissionRequest, decision: &Decision, took: Duration) {
    let meta = request.object.as_ref().and_then(|o| o.get("metadata"));
    let field = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str).filter(|s| !s.is_empty());
    let pod = field("name").map(str::to_string).or_else(|| field("generateName").map(|g| format!("{g}*")));
    tracing::info!(
        uid = clip(&request.uid, LOG_FIELD_MAX).as_ref(),
        operation = clip(&request.operation, LOG_FIELD_MAX).as_ref(),
        namespace = clip(request.namespace.as_deref().unwrap_or_default(), LOG_FIELD_MAX).as_ref(),
        pod = clip(pod.as_deref().unwrap_or_default(), LOG_FIELD_MAX).as_ref(),
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
    use keyward_webhooks::review::AdmissionReview;
    use tower::ServiceExt;

    fn state() -> AppState {
        AppState {
            profiles: Arc::new(ProfileSet::builtin().unwrap()),
            certs: Arc::new(CertStore::new("/nonexistent")),
            metrics: Arc::new(Metrics::default()),
            draining: Arc::new(AtomicBool::new(false)),
            read_timeout: Duration::from_secs(5),
            max_body_bytes: 1024 * 1024,
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
        assert_eq!(v["response"]["auditAnnotations"]["profile"], "lmeval-job");
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
        let request = AdmissionReview::parse_request(&serde_json::to_vec(&review).unwrap()).unwrap();
        let profiles = ProfileSet::builtin().unwrap();
        let mut facts = request.facts();
        facts.operation = "CREATE".into();
        let decision = decide(&facts, request.object.as_ref().unwrap(), &profiles);
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
        assert!(line.contains(" denial=\"keyward: profile \\\"lmeval-job\\\" selects this pod"), "{line}");
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
        assert!(v["denial"].as_str().unwrap().starts_with("keyward: profile \"lmeval-job\" selects this pod"), "{v}");
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
