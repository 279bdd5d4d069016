//! The Kubernetes client's request deadline. kube's client sets no read timeout (watches are
//! long-lived), so a request to an apiserver that accepted it and never answers would wait for
//! ever, holding whatever waits on it. [`Deadline`] bounds every request until its response
//! *starts*: a watch's stream, once begun, is kube-runtime's to bound (its idle timeout).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tower::{Layer, Service};

/// The layer that gives every request `limit` to start answering.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    pub limit: Duration,
}

impl<S> Layer<S> for Deadline {
    type Service = DeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService { inner, limit: self.limit }
    }
}

#[derive(Debug, Clone)]
pub struct DeadlineService<S> {
    inner: S,
    limit: Duration,
}

/// The error a request gets when its deadline passes.
#[derive(Debug, thiserror::Error)]
#[error("the API server did not answer within {0:?}")]
pub struct TimedOut(pub Duration);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, R> Service<R> for DeadlineService<S>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let limit = self.limit;
        let response = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout(limit, response).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => Err(Box::new(TimedOut(limit)) as BoxError),
            }
        })
    }
}

/// Whether `e` is a request that ran out of time (rather than an answer).
pub fn timed_out(e: &kube::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<TimedOut>() {
            return true;
        }
        source = err.source();
    }
    false
}
