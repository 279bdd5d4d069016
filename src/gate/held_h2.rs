//! HTTP/2 to the upstream for a call whose whole body the gate already holds (a gRPC call whose
//! rule reads its message), spoken with the `h2` crate so that the call's HEADERS and its DATA
//! leave in one write.
//!
//! hyper's client sends a body only once its stream has send capacity, which h2 grants a new
//! stream when the connection task opens it, after writing its HEADERS: every such call cost a
//! second `writev`, a second wake-up of the gate's connection task and of the upstream
//! (BENCHMARKS.md, keyward gate). Here the held body is queued with the HEADERS before the
//! connection task runs (h2 buffers it for the stream), and both go out in one write. Bodies
//! that stream (the gate does not hold them) stay with hyper, which bounds what it buffers by
//! the upstream's flow control.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use h2::client::SendRequest;
use http::uri::Scheme;
use http::Uri;
use http_body::Frame;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::TokioIo;

use super::upstream::HeldMessage;
use std::time::Duration;

/// The most of a message queued with its HEADERS before the upstream grants a window: within
/// any HTTP/2 peer's initial 65,535 bytes, and so written with them in one write. The rest goes
/// as the upstream's window allows, so the gate gives its budget back once the message is with
/// the connection, not when the upstream answers.
const FIRST_PIECE: usize = 16 * 1024;
/// The longest a held call waits for the upstream's response headers.
const RESPONSE_WAIT: Duration = Duration::from_secs(60);
/// The most HTTP/2 connections the held calls open to the upstream. One caller's held calls
/// (at most `share::MAX_CALLS`) fill at most so many of an upstream's streams; when every
/// stream of the connections open is taken, another connection is opened, so another caller's
/// call does not wait behind them, up to this many.
pub const MAX_CONNECTIONS: usize = 8;

/// The HTTP/2 connections to the upstream that the held calls share, each opened again when it
/// ends.
pub struct HeldCalls {
    /// The upstream, as the connector takes it (`http://` or `https://`, host and port).
    address: Uri,
    /// The upstream's HTTP/2 connector (`Upstream`'s own: connect timeout, TCP_NODELAY, TLS with
    /// ALPN `h2` and the upstream's CA).
    connector: HttpsConnector<HttpConnector>,
    /// The connections open, each with its number and its calls in flight: a call whose
    /// connection failed removes that one only.
    connections: std::sync::Mutex<Vec<Link>>,
    /// The next connection's number.
    opened: std::sync::atomic::AtomicU64,
    /// Held while a connection is opened: a burst of calls on an empty list opens one, not one
    /// each (each call's wait is bounded by its own deadline).
    opening: tokio::sync::Mutex<()>,
    /// The longest a call waits for a stream and for the window to send its message in.
    wait: Duration,
}

/// One connection of the held calls.
#[derive(Clone)]
struct Link {
    number: u64,
    sender: SendRequest<Bytes>,
    /// Calls on it whose response has not ended.
    in_flight: Arc<AtomicUsize>,
}

/// A call in flight on a connection, until dropped (its response ended, or the call failed).
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a new call goes.
enum Pick {
    /// A connection with a stream free (or, all open and all full, the least busy).
    Use(Link),
    /// Every connection's streams are taken and there is room for another.
    Open,
}

impl Link {
    /// Whether the upstream allows this connection another stream now (its
    /// SETTINGS_MAX_CONCURRENT_STREAMS, as h2 knows it).
    fn has_room(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) < self.sender.current_max_send_streams()
    }

    fn begin(&self) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.in_flight.clone())
    }
}

// === impl HeldCalls ===

impl HeldCalls {
    pub fn new(address: Uri, connector: HttpsConnector<HttpConnector>, wait: Duration) -> Self {
        Self {
            address,
            connector,
            connections: std::sync::Mutex::default(),
            opened: Default::default(),
            opening: tokio::sync::Mutex::new(()),
            wait,
        }
    }

    /// Sends `head` (absolute URI, headers already the gate's, hop-by-hop ones removed) with
    /// `message`, and returns the upstream's response, its body streamed with its trailers.
    /// Every wait has a deadline: a stream of the upstream's, the window for the message (then
    /// the gate's memory is given back), the response's headers.
    pub async fn send(
        &self,
        head: http::Request<()>,
        mut message: HeldMessage,
    ) -> Result<http::Response<Received>, String> {
        let (opened, rest, in_flight) =
            tokio::time::timeout(self.wait, self.open(head, &message.bytes)).await.map_err(|_| {
                format!(
                    "the upstream opened no HTTP/2 stream for the call within {:?} (its streams are all in use, on the {MAX_CONNECTIONS} connections the gate opens to it)",
                    self.wait
                )
            })??;
        send_on(opened, rest, &mut message, self.wait, in_flight).await
    }

    /// The call's stream, opened, on a connection with a stream free (or a new one), once the
    /// upstream allows one more stream; its HEADERS and the message's first piece queued
    /// together, before the connection task writes either (one write, for a message of up to
    /// [`FIRST_PIECE`]). Returns the rest of the message.
    async fn open(&self, head: http::Request<()>, body: &Bytes) -> Result<(Opened, Bytes, InFlight), String> {
        let (mut sender, in_flight) = self.ready_sender().await?;
        let (opened, rest) = open_on(&mut sender, head, body).await?;
        Ok((opened, rest, in_flight))
    }

    /// A sender ready for a new stream, and the call counted on its connection: a connection
    /// with a stream free; else a new connection, while fewer than [`MAX_CONNECTIONS`] are
    /// open; else the least busy, whose next free stream the call waits for. A connection that
    /// has ended (the upstream restarted, or closed it idle) is dropped and another picked.
    /// Connections are opened without holding the list: with an upstream that does not answer,
    /// each call waits its own connect timeout, not those of every call queued before it.
    async fn ready_sender(&self) -> Result<(SendRequest<Bytes>, InFlight), String> {
        // Each failed connection is dropped from the list, so this ends: on a ready one, or on
        // one just opened that cannot take a stream either.
        loop {
            let (link, fresh) = match self.pick() {
                Pick::Use(link) => (link, false),
                Pick::Open => {
                    let _opening = self.opening.lock().await;
                    // Another call may have opened one meanwhile, with room for this one.
                    match self.pick() {
                        Pick::Use(link) => (link, false),
                        Pick::Open => {
                            let sender = self.connect().await?;
                            let number = self.opened.fetch_add(1, Ordering::Relaxed);
                            let link = Link { number, sender, in_flight: Arc::default() };
                            self.list().push(link.clone());
                            (link, true)
                        }
                    }
                }
            };
            let in_flight = link.begin();
            match link.sender.clone().ready().await {
                Ok(ready) => return Ok((ready, in_flight)),
                Err(e) => {
                    self.list().retain(|c| c.number != link.number);
                    if fresh {
                        return Err(describe("the upstream connection", &e));
                    }
                }
            }
        }
    }

    fn pick(&self) -> Pick {
        let connections = self.list();
        if let Some(free) = connections.iter().find(|c| c.has_room()) {
            return Pick::Use(free.clone());
        }
        if connections.len() < MAX_CONNECTIONS {
            return Pick::Open;
        }
        match connections.iter().min_by_key(|c| c.in_flight.load(Ordering::Relaxed)) {
            Some(least) => Pick::Use(least.clone()),
            None => Pick::Open,
        }
    }

    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Link>> {
        // Never held across an await: a poisoned lock still holds a whole list.
        self.connections.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn connect(&self) -> Result<SendRequest<Bytes>, String> {
        let stream = super::upstream::connect(&self.connector, &self.address).await?;
        if self.address.scheme() == Some(&Scheme::HTTPS) && !stream.connected().is_negotiated_h2() {
            let shown = self.address.authority().map_or("the upstream", |a| a.as_str());
            return Err(format!("TLS with {shown}: the upstream did not agree to HTTP/2 (ALPN h2)"));
        }
        handshake(TokioIo::new(stream)).await
    }
}

/// [`HeldCalls::open`] on `sender` (a clone of the connection's, the call's own).
async fn open_on(
    sender: &mut SendRequest<Bytes>,
    head: http::Request<()>,
    body: &Bytes,
) -> Result<(Opened, Bytes), String> {
    let mut rest = body.clone();
    let (response, mut stream) = sender.send_request(head, rest.is_empty()).map_err(|e| describe("the request", &e))?;
    if !rest.is_empty() {
        // Buffered by h2 for the stream: no capacity is needed to queue it.
        let first = rest.split_to(rest.len().min(FIRST_PIECE));
        stream.send_data(first, rest.is_empty()).map_err(|e| describe("the request body", &e))?;
    }
    // The stream is open, not queued past the upstream's MAX_CONCURRENT_STREAMS: h2 makes the
    // sender of a stream it queued wait, here, for the upstream to open it.
    std::future::poll_fn(|cx| sender.poll_ready(cx)).await.map_err(|e| describe("the upstream connection", &e))?;
    Ok(((response, stream), rest))
}

/// A stream opened for a call: its response to come, and its body to send.
type Opened = (h2::client::ResponseFuture, h2::SendStream<Bytes>);

/// The rest of a call's message, as the upstream's window allows, each wait within `wait`;
/// then the gate's memory is given back, and the upstream's answer awaited.
async fn send_on(
    (response, mut stream): Opened,
    mut rest: Bytes,
    message: &mut HeldMessage,
    wait: Duration,
    in_flight: InFlight,
) -> Result<http::Response<Received>, String> {
    while !rest.is_empty() {
        stream.reserve_capacity(rest.len());
        let granted = tokio::time::timeout(wait, std::future::poll_fn(|cx| stream.poll_capacity(cx)))
            .await
            .map_err(|_| format!("the upstream gave no window for the call's message within {wait:?}"))?
            .ok_or_else(|| "the upstream's stream ended before it took the call's message".to_string())?
            .map_err(|e| describe("the request body", &e))?;
        let piece = rest.split_to(granted.min(rest.len()));
        stream.send_data(piece, rest.is_empty()).map_err(|e| describe("the request body", &e))?;
    }
    message.written();
    let response = tokio::time::timeout(RESPONSE_WAIT, response)
        .await
        .map_err(|_| format!("the upstream did not answer the call within {RESPONSE_WAIT:?}"))?
        .map_err(|e| describe("the response", &e))?;
    Ok(response.map(|recv| Received { recv, state: State::Data, _in_flight: in_flight }))
}

/// The HTTP/2 handshake, and the connection driven by a task of its own until it ends.
async fn handshake<T>(io: T) -> Result<SendRequest<Bytes>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) =
        h2::client::Builder::new().handshake(io).await.map_err(|e| describe("the HTTP/2 handshake", &e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "the gate's HTTP/2 connection to the upstream ended");
        }
    });
    Ok(sender)
}

fn describe(what: &str, e: &h2::Error) -> String {
    format!("{what}: {e}")
}

/// The upstream's response body: its DATA, then its trailers (gRPC's status), each DATA's
/// flow-control window given back as it is passed on, so the upstream sends on only as fast
/// as the caller reads.
pub struct Received {
    recv: h2::RecvStream,
    state: State,
    /// The call counts on its connection until its response is dropped.
    _in_flight: InFlight,
}

enum State {
    Data,
    Trailers,
    Done,
}

impl http_body::Body for Received {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        loop {
            match self.state {
                State::Data => match ready!(self.recv.poll_data(cx)) {
                    Some(Ok(data)) => {
                        // Fails only for a stream already ended, whose window no longer matters.
                        let _ = self.recv.flow_control().release_capacity(data.len());
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Some(Err(e)) => {
                        self.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                    None => self.state = State::Trailers,
                },
                State::Trailers => {
                    let trailers = ready!(self.recv.poll_trailers(cx));
                    self.state = State::Done;
                    return match trailers {
                        Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
                        Ok(None) => Poll::Ready(None),
                        Err(e) => Poll::Ready(Some(Err(e))),
                    };
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio::net::TcpListener;

    /// An h2 upstream: each call answered with its path and body and gRPC-style trailers, for
    /// `per_connection` calls, then the connection shut down.
    async fn upstream<T>(io: T, per_connection: usize, max_streams: u32)
    where
        T: AsyncRead + AsyncWrite + Unpin,
    {
        let mut connection =
            h2::server::Builder::new().max_concurrent_streams(max_streams).handshake(io).await.unwrap();
        for _ in 0..per_connection {
            let Some(Ok((request, respond))) = connection.accept().await else { return };
            // Answered by a task of its own: the connection is polled meanwhile, or a body
            // that arrives after its headers would never be read.
            tokio::spawn(answer(request, respond));
        }
        // GOAWAY, as a server shutting down: the answers are written, then the connection ends.
        connection.graceful_shutdown();
        let _ = std::future::poll_fn(|cx| connection.poll_closed(cx)).await;
    }

    async fn answer(request: http::Request<h2::RecvStream>, mut respond: h2::server::SendResponse<Bytes>) {
        let path = request.uri().path().to_string();
        let mut recv = request.into_body();
        let mut body = Vec::new();
        while let Some(data) = recv.data().await {
            let data = data.unwrap();
            let _ = recv.flow_control().release_capacity(data.len());
            body.extend_from_slice(&data);
        }
        let mut send = respond.send_response(http::Response::new(()), false).unwrap();
        send.send_data(Bytes::from(format!("{path} {}", String::from_utf8_lossy(&body))), false).unwrap();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        send.send_trailers(trailers).unwrap();
    }

    /// An upstream on a loopback port, `per_connection` calls a connection; and how many
    /// connections it has accepted.
    async fn listening(per_connection: usize) -> (u16, Arc<Mutex<usize>>) {
        listening_with(per_connection, u32::MAX).await
    }

    /// [`listening`], allowing `max_streams` at once on a connection.
    async fn listening_with(per_connection: usize, max_streams: u32) -> (u16, Arc<Mutex<usize>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(Mutex::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                *counted.lock().unwrap() += 1;
                tokio::spawn(upstream(tcp, per_connection, max_streams));
            }
        });
        (port, accepted)
    }

    fn held_calls(port: u16) -> HeldCalls {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(
                rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            )
            .https_or_http()
            .enable_http2()
            .wrap_connector(http);
        HeldCalls::new(format!("http://127.0.0.1:{port}").parse().unwrap(), connector, WAIT)
    }

    const WAIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_call_whose_response_ended_gives_its_stream_back_and_no_connection_is_opened_for_the_next() {
        let (port, accepted) = listening_with(usize::MAX, 1).await;
        let calls = held_calls(port);
        for n in 0..3 {
            let response = calls.send(call(&format!("/S/M{n}")), msg(Bytes::from_static(b"x"))).await.unwrap();
            assert_eq!(read(response).await, (format!("/S/M{n} x"), Some("0".into())));
        }
        assert_eq!(*accepted.lock().unwrap(), 1, "one stream at a time, each given back: one connection");
        assert_eq!(calls.list().len(), 1);
        assert_eq!(calls.list()[0].in_flight.load(Ordering::Relaxed), 0);
    }

    /// A held message that holds nothing of a budget or a share.
    fn msg(bytes: Bytes) -> HeldMessage {
        HeldMessage { bytes, budget: None, share: None }
    }

    fn call(path: &str) -> http::Request<()> {
        http::Request::post(format!("http://upstream{path}"))
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
    }

    /// The body's text and its `grpc-status` trailer; the body says it has ended only once it has.
    async fn read(response: http::Response<Received>) -> (String, Option<String>) {
        use http_body::Body as _;
        let mut body = response.into_body();
        let (mut text, mut status) = (Vec::new(), None);
        while !body.is_end_stream() {
            let Some(frame) = body.frame().await else { panic!("the body ended without saying so") };
            match frame.unwrap().into_data() {
                Ok(data) => text.extend_from_slice(&data),
                Err(frame) => {
                    let trailers = frame.into_trailers().unwrap();
                    status = trailers.get("grpc-status").map(|v| v.to_str().unwrap().to_string());
                }
            }
        }
        assert!(body.frame().await.is_none());
        (String::from_utf8(text).unwrap(), status)
    }

    /// The gate's side of a connection, each write it makes kept.
    struct Recorded<T> {
        io: T,
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    impl<T: AsyncRead + Unpin> AsyncRead for Recorded<T> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.io).poll_read(cx, buf)
        }
    }

    impl<T: AsyncWrite + Unpin> AsyncWrite for Recorded<T> {
        fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
            let written = ready!(Pin::new(&mut self.io).poll_write(cx, buf))?;
            self.writes.lock().unwrap().push(buf[..written].to_vec());
            Poll::Ready(Ok(written))
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.io).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.io).poll_shutdown(cx)
        }
    }

    /// (type, flags, stream) of each HTTP/2 frame in `write`, after the connection preface.
    fn frames(mut write: &[u8]) -> Vec<(u8, u8, u32)> {
        const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        write = write.strip_prefix(PREFACE).unwrap_or(write);
        let mut out = Vec::new();
        while write.len() >= 9 {
            let length = usize::from(write[0]) << 16 | usize::from(write[1]) << 8 | usize::from(write[2]);
            let stream = u32::from_be_bytes([write[5], write[6], write[7], write[8]]) & 0x7fff_ffff;
            out.push((write[3], write[4], stream));
            write = &write[(9 + length).min(write.len())..];
        }
        out
    }

    #[tokio::test]
    async fn a_held_call_leaves_in_one_write_headers_and_data_together() {
        let (gate_side, upstream_side) = tokio::io::duplex(64 * 1024);
        tokio::spawn(upstream(upstream_side, 1, u32::MAX));
        let writes = Arc::new(Mutex::new(Vec::new()));
        let sender = handshake(Recorded { io: gate_side, writes: writes.clone() }).await.unwrap();
        let mut sender = sender.ready().await.unwrap();
        let mut message = msg(Bytes::from_static(b"job-a"));
        let (opened, rest) =
            open_on(&mut sender, call("/LMEvalJobUpdateService/UpdateStatus"), &message.bytes).await.unwrap();
        let response = send_on(opened, rest, &mut message, WAIT, InFlight(Arc::default())).await;
        assert_eq!(
            read(response.unwrap()).await,
            ("/LMEvalJobUpdateService/UpdateStatus job-a".into(), Some("0".into()))
        );
        // HEADERS (type 1, END_HEADERS) and DATA (type 0, END_STREAM) of stream 1, in one write.
        let writes = writes.lock().unwrap();
        let together = writes.iter().map(|w| frames(w)).find(|f| f.contains(&(1, 0x4, 1)));
        assert_eq!(
            together.map(|f| f.into_iter().filter(|(_, _, s)| *s == 1).collect::<Vec<_>>()),
            Some(vec![(1, 0x4, 1), (0, 0x1, 1)])
        );
    }

    /// A message of up to 16 KiB goes with its HEADERS: one write, the whole message in one
    /// DATA frame that ends the stream.
    #[tokio::test]
    async fn a_message_of_up_to_16_kib_leaves_with_its_headers() {
        let (gate_side, upstream_side) = tokio::io::duplex(256 * 1024);
        tokio::spawn(upstream(upstream_side, 1, u32::MAX));
        let writes = Arc::new(Mutex::new(Vec::new()));
        let sender = handshake(Recorded { io: gate_side, writes: writes.clone() }).await.unwrap();
        let mut sender = sender.ready().await.unwrap();
        // Written out, not FIRST_PIECE: the test is of that constant too.
        let mut message = msg(Bytes::from(vec![b'x'; 16 * 1024]));
        let (opened, rest) = open_on(&mut sender, call("/Big"), &message.bytes).await.unwrap();
        assert!(rest.is_empty());
        let response = send_on(opened, rest, &mut message, WAIT, InFlight(Arc::default())).await.unwrap();
        assert_eq!(read(response).await.0.len(), "/Big ".len() + 16 * 1024);
        let writes = writes.lock().unwrap();
        let together = writes.iter().map(|w| frames(w)).find(|f| f.contains(&(1, 0x4, 1)));
        assert_eq!(
            together.map(|f| f.into_iter().filter(|(_, _, s)| *s == 1).collect::<Vec<_>>()),
            Some(vec![(1, 0x4, 1), (0, 0x1, 1)])
        );
    }

    #[tokio::test]
    async fn an_empty_body_ends_the_stream_with_the_headers() {
        let (gate_side, upstream_side) = tokio::io::duplex(64 * 1024);
        tokio::spawn(upstream(upstream_side, 1, u32::MAX));
        let writes = Arc::new(Mutex::new(Vec::new()));
        let sender = handshake(Recorded { io: gate_side, writes: writes.clone() }).await.unwrap();
        let mut sender = sender.ready().await.unwrap();
        let mut message = msg(Bytes::new());
        let (opened, rest) = open_on(&mut sender, call("/Empty"), &message.bytes).await.unwrap();
        let response = send_on(opened, rest, &mut message, WAIT, InFlight(Arc::default())).await.unwrap();
        assert_eq!(read(response).await, ("/Empty ".into(), Some("0".into())));
        let sent: Vec<_> = writes.lock().unwrap().iter().flat_map(|w| frames(w)).filter(|(_, _, s)| *s == 1).collect();
        // HEADERS with END_STREAM and END_HEADERS, and no DATA.
        assert_eq!(sent, [(1, 0x5, 1)]);
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_opened_again() {
        // One call a connection: as an upstream that restarts between calls.
        let (port, accepted) = listening(1).await;
        let calls = held_calls(port);
        let first = calls.send(call("/One"), msg(Bytes::from_static(b"1"))).await.unwrap();
        assert_eq!(read(first).await.0, "/One 1");
        // A call may meet the old connection before the gate saw it close (an error, as
        // with any proxy); the one after it opens a new connection.
        let second = match calls.send(call("/Two"), msg(Bytes::from_static(b"2"))).await {
            Ok(answer) => answer,
            Err(_) => calls.send(call("/Two"), msg(Bytes::from_static(b"2"))).await.unwrap(),
        };
        assert_eq!(read(second).await.0, "/Two 2");
        assert_eq!(*accepted.lock().unwrap(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_that_find_no_connection_at_once_all_get_through_and_then_share_one() {
        let (port, accepted) = listening(usize::MAX).await;
        let calls = Arc::new(held_calls(port));
        let burst: Vec<_> = (0..8)
            .map(|i| {
                let calls = calls.clone();
                tokio::spawn(
                    async move { calls.send(call(&format!("/Call{i}")), msg(Bytes::from(i.to_string()))).await },
                )
            })
            .collect();
        for (i, call) in burst.into_iter().enumerate() {
            assert_eq!(read(call.await.unwrap().unwrap()).await.0, format!("/Call{i} {i}"));
        }
        // Each of the burst may have opened one; the slot keeps one, and the next call uses it.
        let opened = *accepted.lock().unwrap();
        assert!((1..=8).contains(&opened), "{opened}");
        assert_eq!(read(calls.send(call("/After"), msg(Bytes::from_static(b"x"))).await.unwrap()).await.0, "/After x");
        assert_eq!(*accepted.lock().unwrap(), opened);
    }

    #[tokio::test]
    async fn an_upstream_that_does_not_speak_http2_is_an_error_saying_where_it_failed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                use tokio::io::AsyncWriteExt;
                // An HTTP/1.1 server's answer to the preface, then the connection closed.
                let _ = tcp.write_all(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n").await;
            }
        });
        let calls = held_calls(port);
        let Err(err) = calls.send(call("/One"), msg(Bytes::from_static(b"1"))).await else { panic!("answered") };
        // Which step meets the failure depends on timing (here, the response: "stream closed
        // because of a broken pipe"); each names its step, then h2's reason.
        let said = ["the HTTP/2 handshake: ", "the upstream connection: ", "the request: ", "the response: "];
        assert!(said.iter().any(|s| err.starts_with(s) && err.len() > s.len()), "{err}");
    }

    #[tokio::test]
    async fn an_upstream_that_is_not_there_is_an_error_naming_it() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let calls = held_calls(port);
        let Err(err) = calls.send(call("/One"), msg(Bytes::from_static(b"1"))).await else {
            panic!("sent to a closed port")
        };
        assert_eq!(
            err,
            format!("connecting to 127.0.0.1:{port}: tcp connect error: Connection refused (os error 111)")
        );
    }
}
