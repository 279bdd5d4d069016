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
            tracing::warn!(status = rejection.status().as_u16(), reason = %rejection.body_text(), "admission request refused");
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
            tracing::warn!(reason = %e, bytes = body.len(), "admission request refused");
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
            tracing::error!(uid = %request.uid, error = %e, "cannot encode the admission response");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
        }
    }
}

/// One line per decision. Names only: never Secret data or tokens (the decision has none).
fn log_decision(request: &AdmissionRequest, decision: &Decision, took: Duration) {
    let meta = request.object.as_ref().and_then(|o| o.get("metadata"));
    let field = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str).filter(|s| !s.is_empty());
    let pod = field("name").map(str::to_string).or_else(|| field("generateName").map(|g| format!("{g}*")));
    tracing::info!(
        uid = %request.uid,
        operation = %request.operation,
        namespace = request.namespace.as_deref().unwrap_or_default(),
        pod = pod.as_deref().unwrap_or_default(),
        requester = request.user_info.username.as_deref().unwrap_or_default(),
        profile = decision.profile.as_deref().unwrap_or_default(),
        allowed = decision.allowed(),
        reason = decision.reason.as_str(),
        message = decision.message().unwrap_or_default(),
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
    async fn readyz_says_why_not() {
        let (status, body) = call(state(), "GET", "/readyz", Vec::new()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not ready: no serving certificate loaded yet\n");
        let (status, body) = call(state(), "GET", "/healthz", Vec::new()).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok\n"));
    }
}
