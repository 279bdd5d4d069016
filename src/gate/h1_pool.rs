//! HTTP/1.1 to the upstream, over connections kept for the next request.
//!
//! hyper-util's pooled client spawns a task for every request whose response has a body, to put
//! the connection back once that body is read, with a oneshot and a keyed pool lookup beside it
//! (BENCHMARKS.md, keyward gate). Here the response body puts its connection back itself when it
//! ends, so a request costs the connection task's own wake-ups and nothing more: one task per
//! upstream connection, as an nginx `keepalive` upstream has none at all.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::uri::PathAndQuery;
use http::Uri;
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;

/// How long an idle connection is kept (hyper-util's pooled client keeps one as long).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The upstream's HTTP/1.1 connections: each one's sender while it is idle, the newest last.
pub struct H1Pool {
    /// The upstream, as the connector takes it (`http://` or `https://`, host and port).
    address: Uri,
    /// `Upstream`'s HTTP/1.1 connector (connect timeout, TCP_NODELAY, TLS with ALPN
    /// `http/1.1` and the upstream's CA).
    connector: HttpsConnector<HttpConnector>,
    idle: Arc<Idle>,
}

struct Idle {
    senders: Mutex<Vec<(SendRequest<Body>, Instant)>>,
    /// The most kept: one more given back drops the oldest.
    most: usize,
}

// === impl H1Pool ===

impl H1Pool {
    pub fn new(address: Uri, connector: HttpsConnector<HttpConnector>, most_idle: usize) -> Self {
        Self { address, connector, idle: Arc::new(Idle { senders: Mutex::new(Vec::new()), most: most_idle }) }
    }

    /// Sends `request` (its URI the path and query, its headers the gate's) on an idle connection
    /// or a new one. A request that a kept connection did not take (the upstream had closed it,
    /// idle) goes on the next; one that a new connection fails is the caller's error.
    pub async fn send(&self, mut request: http::Request<Body>) -> Result<http::Response<Returning>, String> {
        if !request.headers().contains_key(http::header::HOST) {
            if let Some(authority) = self.address.authority() {
                if let Ok(host) = http::HeaderValue::from_str(authority.as_str()) {
                    request.headers_mut().insert(http::header::HOST, host);
                }
            }
        }
        // HTTP/1.1 to an origin server: the request line carries the path, not the URL.
        let path = request.uri().path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        *request.uri_mut() = Uri::from(path);
        while let Some(mut sender) = self.idle.take() {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.returning(response, sender)),
                Err(mut refused) => match refused.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(describe("the upstream", refused.error())),
                },
            }
        }
        let mut sender = self.connect().await?;
        let response = sender.send_request(request).await.map_err(|e| describe("the upstream", &e))?;
        Ok(self.returning(response, sender))
    }

    async fn connect(&self) -> Result<SendRequest<Body>, String> {
        let stream = super::upstream::connect(&self.connector, &self.address).await?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(stream).await.map_err(|e| describe("the HTTP/1.1 handshake", &e))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "the gate's HTTP/1.1 connection to the upstream ended");
            }
        });
        Ok(sender)
    }

    fn returning(&self, response: http::Response<Incoming>, sender: SendRequest<Body>) -> http::Response<Returning> {
        let mut home = Some((sender, self.idle.clone()));
        if response.body().is_end_stream() {
            give_back(&mut home);
        }
        response.map(|body| Returning { body, home })
    }

    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.lock().len()
    }
}

// === impl Idle ===

impl Idle {
    fn lock(&self) -> MutexGuard<'_, Vec<(SendRequest<Body>, Instant)>> {
        // Never held across an await: a poisoned lock still holds a whole list.
        self.senders.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The newest connection ready for a request. Closed and expired ones are dropped; one not
    /// ready yet (its connection task has not taken up the end of its last exchange, or is
    /// still sending that request's body) stays for later.
    fn take(&self) -> Option<SendRequest<Body>> {
        let mut senders = self.lock();
        let now = Instant::now();
        senders.retain(|(sender, since)| !sender.is_closed() && now.duration_since(*since) < IDLE_TIMEOUT);
        let ready = senders.iter().rposition(|(sender, _)| sender.is_ready())?;
        Some(senders.remove(ready).0)
    }

    fn put(&self, sender: SendRequest<Body>) {
        if sender.is_closed() {
            return;
        }
        let mut senders = self.lock();
        if senders.len() >= self.most {
            senders.remove(0);
        }
        senders.push((sender, Instant::now()));
    }
}

fn give_back(home: &mut Option<(SendRequest<Body>, Arc<Idle>)>) {
    if let Some((sender, idle)) = home.take() {
        idle.put(sender);
    }
}

/// The upstream's response body, which gives its connection back to the pool once it has been
/// read to its end. Dropped before that, it takes the connection with it: hyper closes a
/// connection whose response was not read whole.
pub struct Returning {
    body: Incoming,
    home: Option<(SendRequest<Body>, Arc<Idle>)>,
}

impl http_body::Body for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => give_back(&mut this.home),
            Poll::Ready(Some(Ok(_))) if this.body.is_end_stream() => give_back(&mut this.home),
            Poll::Ready(Some(Err(_))) => this.home = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

fn describe(what: &str, e: &hyper::Error) -> String {
    let mut out = format!("{what}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        out.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;

    use super::*;

    /// A plain HTTP/1.1 upstream on loopback that counts the connections it accepted and answers
    /// `GET /n` with `hello`, closing the connection after the answer when `close`.
    async fn upstream(close: bool) -> (Uri, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address: Uri = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let service = hyper::service::service_fn(move |request: http::Request<Incoming>| async move {
                    let mut response = http::Response::new(Full::new(Bytes::from("hello")));
                    if close {
                        response.headers_mut().insert(http::header::CONNECTION, "close".parse().unwrap());
                    }
                    assert_eq!(request.uri().to_string(), "/n?q=1", "the request line carries the path, not the URL");
                    assert!(request.headers().contains_key(http::header::HOST));
                    Ok::<_, Infallible>(response)
                });
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service));
            }
        });
        (address, accepted)
    }

    fn pool(address: &Uri, most_idle: usize) -> H1Pool {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(
                rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            )
            .https_or_http()
            .enable_http1()
            .build();
        H1Pool::new(address.clone(), connector, most_idle)
    }

    fn get(address: &Uri) -> http::Request<Body> {
        http::Request::get(format!("{address}n?q=1")).body(Body::empty()).unwrap()
    }

    async fn read(response: http::Response<Returning>) -> Bytes {
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_connection_read_to_the_end_carries_the_next_request() {
        let (address, accepted) = upstream(false).await;
        let pool = pool(&address, 4);
        for _ in 0..3 {
            let response = pool.send(get(&address)).await.unwrap();
            assert_eq!(pool.idle_count(), 0, "in use until its body is read");
            assert_eq!(read(response).await, "hello");
            assert_eq!(pool.idle_count(), 1);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_unread_takes_its_connection_with_it() {
        let (address, accepted) = upstream(false).await;
        let pool = pool(&address, 4);
        drop(pool.send(get(&address)).await.unwrap());
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(read(pool.send(get(&address)).await.unwrap()).await, "hello");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closes_is_not_used_again() {
        let (address, accepted) = upstream(true).await;
        let pool = pool(&address, 4);
        for _ in 0..3 {
            assert_eq!(read(pool.send(get(&address)).await.unwrap()).await, "hello");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3, "each request on a connection of its own");
    }

    #[tokio::test]
    async fn idle_connections_are_kept_up_to_the_most() {
        let (address, accepted) = upstream(false).await;
        let pool = pool(&address, 2);
        // Three at once: three connections; two kept once all are read.
        let responses = [
            pool.send(get(&address)).await.unwrap(),
            pool.send(get(&address)).await.unwrap(),
            pool.send(get(&address)).await.unwrap(),
        ];
        for response in responses {
            assert_eq!(read(response).await, "hello");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        assert_eq!(pool.idle_count(), 2);
    }

    #[tokio::test]
    async fn an_upstream_that_cannot_be_reached_is_named() {
        let address: Uri = "http://127.0.0.1:1".parse().unwrap();
        let Err(why) = pool(&address, 2).send(get(&address)).await else { panic!("nothing listens on port 1") };
        assert!(why.starts_with("connecting to 127.0.0.1:1: "), "{why}");
        assert!(why.to_lowercase().contains("connection refused"), "{why}");
    }
}
