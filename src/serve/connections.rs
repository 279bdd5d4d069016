//! Connections: how many may be open, how long each may sit idle, and what the accept loop does
//! when the process runs out of file descriptors. The webhook (TLS) and the metrics port (plain
//! HTTP) follow the same rules:
//!
//! - a TLS handshake must finish within `handshake_timeout`;
//! - after the handshake, the first request must start within `request_read_timeout`, and once
//!   a request's first bytes arrive its headers must be complete within it too;
//! - between requests a connection may stay idle for `idle_timeout`, longer than the apiserver's
//!   90 s, so that the client closes an idle keep-alive connection first and no request races
//!   keyward's close;
//! - a request must be read whole (headers and body) within `request_read_timeout` of its
//!   first bytes, on every protocol (an HTTP/2 stream without its body included);
//! - at most `max_connections` are open: at the cap a new connection evicts, from the source
//!   address holding the most connections, the one that has gone longest without completing a
//!   request (idle, dripping headers or a body, or silent since its handshake), and is refused
//!   only when every connection is answering a request it has read whole. A client that answers
//!   its requests in milliseconds, as the apiserver does, is always the youngest by that
//!   measure; and however fast one source reconnects, it only ever evicts its own connections
//!   while it holds the most, so a burst from one pod cannot age the apiserver's new connection
//!   out before its handshake ends. An evicted connection with a request half-read is dropped at
//!   once (there is no answer to wait for); when the evicted still hold the places past the cap
//!   (a burst evicting faster than they go), the newcomer waits up to a second for them instead
//!   of being reset;
//! - a failing `accept` (out of file descriptors) backs off exponentially, evicts an idle
//!   connection to free a descriptor, and is logged once per burst, not once per attempt.
//!
//! Over TLS the protocol comes from ALPN (`h2`, else HTTP/1.1), never from sniffing the first
//! bytes, so a client that says nothing is timed from the end of its handshake. Over plain TCP
//! (the gate's plaintext listener) it comes from the first bytes: the HTTP/2 preface, read
//! within the first-request timeout, or HTTP/1.1.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::{service_fn, Service};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::metrics::Metrics;

/// After keyward decides to close a connection (idle, evicted), how long the protocol's own
/// goodbye may take (HTTP/2 waits for a PING answer) before the socket is simply dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// Concurrent streams per HTTP/2 connection: an admission takes microseconds, so more buys
/// nothing but memory.
const H2_MAX_STREAMS: u32 = 32;
/// Descriptors kept for everything that is not a connection: listeners, the certificate watch
/// and the files it reads, logging, the runtime.
pub const RESERVED_FDS: u64 = 64;
/// Connections being closed (evicted, timed out) may briefly push the count over the cap by
/// this much; past it, new connections are refused until they are gone.
const CLOSING_HEADROOM: usize = 16;
/// Accept back-off: from the first failure up to the longest pause.
const BACKOFF_FIRST: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one info line per this long about refused TLS handshakes, per listener.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

/// The limits of one listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub request_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// On shutdown, how long requests in flight may take before their connections are dropped.
    pub shutdown_grace: Duration,
}

/// How a listener's connections start: TLS (the webhook, the gate), plain TCP with HTTP/1.1
/// (metrics), or plain TCP with HTTP/1.1 or HTTP/2 (the gate's plaintext listener).
#[derive(Clone)]
pub enum Transport {
    Tls(TlsAcceptor),
    Plain,
    /// HTTP/1.1, or HTTP/2 with prior knowledge (gRPC without TLS), told apart by the HTTP/2
    /// connection preface, the one case where there is no ALPN to ask.
    PlainOrH2c,
}

/// Why keyward closed a connection (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    HandshakeTimeout,
    HandshakeFailed,
    FirstRequestTimeout,
    HeaderTimeout,
    /// A request (headers or body) not read whole in time.
    SlowRequest,
    Idle,
    Evicted,
    Shutdown,
    /// Its client certificate expired, or is no longer trusted.
    CredentialEnded,
}

impl CloseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HandshakeTimeout => "handshake-timeout",
            Self::HandshakeFailed => "handshake-failed",
            Self::FirstRequestTimeout => "first-request-timeout",
            Self::HeaderTimeout => "header-timeout",
            Self::SlowRequest => "slow-request",
            Self::Idle => "idle",
            Self::Evicted => "evicted",
            Self::Shutdown => "shutdown",
            Self::CredentialEnded => "credential-ended",
        }
    }
}

// === impl ConnState ===

/// What the registry and the watchdog know about one open connection. Times are milliseconds
/// since the registry's epoch, so they fit in atomics.
#[derive(Debug)]
struct ConnState {
    /// Requests whose headers have arrived and whose response is not yet handed to hyper.
    in_flight: AtomicUsize,
    /// Requests started on this connection.
    requests: AtomicU64,
    /// When the connection last became idle (or finished its handshake).
    idle_since: AtomicU64,
    /// When bytes of the next request started to arrive (0: none yet). Set only while idle.
    reading_since: AtomicU64,
    /// When the oldest request in flight started (its headers arrived).
    request_since: AtomicU64,
    /// Requests read whole and being answered: the only work eviction spares.
    answering: AtomicUsize,
    /// When the connection last completed a request, or was accepted: eviction takes the
    /// connection that has gone longest without one.
    progress_at: AtomicU64,
    /// Asked to close (evicted, or out of descriptors).
    evict: Notify,
    evicted: AtomicBool,
    /// When the connection's client certificate stops being good (its notAfter, or now when a
    /// request found it no longer trusted); 0: no certificate. Past it the connection closes,
    /// finishing what it is answering.
    credential_until: AtomicU64,
    /// Wakes the watchdog to look at the deadlines again (one was brought forward).
    recheck: Notify,
    /// The peer's address: eviction takes from the source holding the most connections.
    source: IpAddr,
}

impl ConnState {
    fn new(now: u64, source: IpAddr) -> Self {
        Self {
            source: source.to_canonical(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            idle_since: AtomicU64::new(now),
            reading_since: AtomicU64::new(0),
            request_since: AtomicU64::new(0),
            answering: AtomicUsize::new(0),
            progress_at: AtomicU64::new(now),
            evict: Notify::new(),
            evicted: AtomicBool::new(false),
            credential_until: AtomicU64::new(0),
            recheck: Notify::new(),
        }
    }

    /// When this connection must be closed unless something happens first, and why: the
    /// phase's deadline ([`ConnState::phase_deadline`]), or its client certificate's end if that
    /// comes first (whatever it is doing).
    fn deadline(&self, limits: &ConnectionLimits) -> Option<(u64, CloseReason)> {
        let phase = self.phase_deadline(limits);
        match self.credential_until.load(Ordering::Acquire) {
            0 => phase,
            until => match phase {
                Some((at, reason)) if at <= until => Some((at, reason)),
                _ => Some((until, CloseReason::CredentialEnded)),
            },
        }
    }

    /// When this connection must be closed for what it is doing, and why. `None` while a
    /// request read whole is being answered.
    fn phase_deadline(&self, limits: &ConnectionLimits) -> Option<(u64, CloseReason)> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        if self.in_flight.load(Ordering::Acquire) > 0 {
            if self.answering.load(Ordering::Acquire) > 0 {
                return None;
            }
            // Still being read: the handler answers 408 at the read timeout; the connection
            // goes a moment later if it has not (an HTTP/2 stream that never sends its body).
            let since = self.request_since.load(Ordering::Acquire);
            let at = since.saturating_add(ms(limits.request_read_timeout)).saturating_add(ms(CLOSE_GRACE));
            return Some((at, CloseReason::SlowRequest));
        }
        let idle = self.idle_since.load(Ordering::Acquire);
        // No request yet: timed from the end of the handshake, whatever bytes trickle in (an
        // HTTP/2 preface is not a request).
        if self.requests.load(Ordering::Acquire) == 0 {
            return Some((idle.saturating_add(ms(limits.request_read_timeout)), CloseReason::FirstRequestTimeout));
        }
        let reading = self.reading_since.load(Ordering::Acquire);
        if reading > 0 {
            Some((reading.saturating_add(ms(limits.request_read_timeout)), CloseReason::HeaderTimeout))
        } else {
            Some((idle.saturating_add(ms(limits.idle_timeout)), CloseReason::Idle))
        }
    }

    fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Whether a request is half-read (headers or body on their way): closing it loses no
    /// answer.
    fn is_reading(&self) -> bool {
        let in_flight = self.in_flight.load(Ordering::Acquire);
        (in_flight > 0 && self.answering.load(Ordering::Acquire) == 0)
            || (in_flight == 0 && self.reading_since.load(Ordering::Acquire) > 0)
    }
}

/// Where a request came from (a request extension): the connection's peer, and whether it
/// arrived over TLS.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    pub addr: SocketAddr,
    pub tls: bool,
}

/// Handed to the handler with each request (a request extension): it says when the request
/// has been read whole, after which its connection is spared eviction until it is answered.
#[derive(Clone)]
pub struct RequestProgress {
    state: Arc<ConnState>,
}

impl RequestProgress {
    /// Closes the connection once what it is answering is answered (its client certificate
    /// is no longer good): HTTP/1.1 ends after this response, HTTP/2 says GOAWAY.
    pub fn close_when_answered(&self) {
        // The clock's first millisecond: a deadline already passed.
        self.state.credential_until.store(1, Ordering::Release);
        self.state.recheck.notify_one();
    }

    /// The request is read whole; until the returned guard drops, it is being answered.
    pub fn read_whole(&self) -> Answering {
        self.state.answering.fetch_add(1, Ordering::AcqRel);
        Answering { state: self.state.clone() }
    }
}

/// A request being answered (see [`RequestProgress::read_whole`]).
pub struct Answering {
    state: Arc<ConnState>,
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.state.answering.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The certificate the client presented in the TLS handshake (its end entity), verified by
/// the listener's client verifier: a request extension on every request of the connection.
/// Absent when the client sent none (and on listeners that ask for none).
#[derive(Clone)]
pub struct PeerCertificate {
    /// The chain as presented, end entity first.
    chain: Arc<Vec<rustls::pki_types::CertificateDer<'static>>>,
    /// What the handler read from it, kept for the connection's later requests: a certificate
    /// cannot change within a connection, so it is read once (the gate: its identity).
    read: Arc<std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>>,
    /// The generation of the listener's client CAs the chain was last verified under
    /// ([`Connections::with_trust_generation`]): taken before the handshake, so a reload during
    /// it counts as after.
    trusted_under: Arc<AtomicU64>,
    /// When the end entity stops being valid, read once with the connection: `None` when it
    /// cannot be read.
    not_after: Option<std::time::SystemTime>,
}

impl PeerCertificate {
    fn new(chain: Vec<rustls::pki_types::CertificateDer<'static>>, trusted_under: u64) -> Option<Self> {
        let leaf = chain.first()?;
        let not_after = not_after(leaf);
        Some(Self {
            chain: Arc::new(chain),
            read: Arc::default(),
            trusted_under: Arc::new(AtomicU64::new(trusted_under)),
            not_after,
        })
    }

    /// When the end entity stops being valid: `None` when it cannot be read.
    pub fn not_after(&self) -> Option<std::time::SystemTime> {
        self.not_after
    }

    /// The end entity's DER.
    pub fn leaf(&self) -> &[u8] {
        self.chain.first().map_or(&[], |c| c.as_ref())
    }

    /// The chain as presented, end entity first.
    pub fn chain(&self) -> &[rustls::pki_types::CertificateDer<'static>] {
        &self.chain
    }

    /// The client-CA generation the chain was last verified under.
    pub fn trusted_under(&self) -> u64 {
        self.trusted_under.load(Ordering::Acquire)
    }

    /// Records that the chain verified under `generation` too.
    pub fn trusted_again(&self, generation: u64) {
        self.trusted_under.store(generation, Ordering::Release);
    }

    /// `read` of the certificate, run on the connection's first request and kept. Returns a
    /// fresh reading if this connection's certificate was kept as another type.
    pub fn read_once<T: Clone + Send + Sync + 'static>(&self, read: impl Fn(&[u8]) -> T) -> T {
        let kept = self.read.get_or_init(|| Box::new(read(self.leaf())));
        match kept.downcast_ref::<T>() {
            Some(value) => value.clone(),
            None => read(self.leaf()),
        }
    }
}

impl std::fmt::Debug for PeerCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerCertificate").field("certificates", &self.chain.len()).finish_non_exhaustive()
    }
}

/// A response body that holds `guard` until the body is written whole (or dropped): a request
/// stays in flight, and an answer being streamed stays spared eviction, for as long as its
/// response is being sent, not only until its headers are.
pub struct Guarded<G> {
    body: axum::body::Body,
    _guard: G,
}

impl<G: Send + Unpin + 'static> Guarded<G> {
    pub fn wrap(body: axum::body::Body, guard: G) -> axum::body::Body {
        axum::body::Body::new(Self { body, _guard: guard })
    }
}

impl<G: Unpin> http_body::Body for Guarded<G> {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Marks a request in flight for as long as it lives.
struct InFlight {
    state: Arc<ConnState>,
    clock: Clock,
    gauge: Option<Gauge>,
}

impl InFlight {
    fn begin(state: &Arc<ConnState>, clock: Clock, gauge: Option<Gauge>) -> Self {
        state.requests.fetch_add(1, Ordering::AcqRel);
        if state.in_flight.fetch_add(1, Ordering::AcqRel) == 0 {
            // Timed from its first bytes when they came while idle, else from its headers.
            let reading = state.reading_since.load(Ordering::Acquire);
            state.request_since.store(if reading > 0 { reading } else { clock.now_ms() }, Ordering::Release);
        }
        state.reading_since.store(0, Ordering::Release);
        if let Some(g) = &gauge {
            g.inc();
        }
        Self { state: state.clone(), clock, gauge }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(g) = &self.gauge {
            g.dec();
        }
        let now = self.clock.now_ms();
        self.state.progress_at.store(now, Ordering::Release);
        if self.state.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.state.idle_since.store(now, Ordering::Release);
            self.state.reading_since.store(0, Ordering::Release);
        }
    }
}

/// Milliseconds since the registry started (never 0, so 0 can mean "not set").
#[derive(Debug, Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now_ms(self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX).saturating_add(1)
    }

    fn instant(self, ms: u64) -> Instant {
        self.0 + Duration::from_millis(ms.saturating_sub(1))
    }
}

// === impl Watched ===

/// The connection's socket, noting when bytes of a new request start to arrive while idle.
struct Watched<I> {
    io: I,
    state: Arc<ConnState>,
    clock: Clock,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before && self.state.is_idle() && self.state.reading_since.load(Ordering::Acquire) == 0
        {
            self.state.reading_since.store(self.clock.now_ms(), Ordering::Release);
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

// === impl Connections ===

/// The open connections of one listener.
pub struct Connections {
    role: &'static str,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    clock: Clock,
    live: Mutex<Registry>,
    /// Notified whenever a connection ends, for the shutdown drain.
    ended: Notify,
    /// Refused handshakes are logged at info, at most one line per [`REFUSED_LOG_EVERY`].
    refused_log: Mutex<LogLimit>,
    /// The generation of the client CAs the listener verifies certificates with (the gate's),
    /// read before each handshake: see [`PeerCertificate::trusted_under`].
    trust: Option<TrustGeneration>,
}

/// Reads the generation of a listener's client CAs.
pub type TrustGeneration = Arc<dyn Fn() -> u64 + Send + Sync>;

#[derive(Default)]
struct Registry {
    next_id: u64,
    open: HashMap<u64, Arc<ConnState>>,
}

/// What [`Connections::admit`] decided for a new connection.
enum Admission {
    Admitted(u64, Arc<ConnState>),
    /// Every connection has a request in flight (or is already closing): refuse this one.
    Full,
    /// Connections being closed hold the places past the cap: wait for them to go.
    Closing,
}

impl Connections {
    pub fn new(role: &'static str, limits: ConnectionLimits, metrics: Arc<Metrics>) -> Arc<Self> {
        Self::with_trust(role, limits, metrics, None)
    }

    /// A listener that verifies client certificates with CAs that change (`trust` reads their
    /// generation): each connection's certificate records the generation it was verified under.
    pub fn with_trust(
        role: &'static str,
        limits: ConnectionLimits,
        metrics: Arc<Metrics>,
        trust: Option<TrustGeneration>,
    ) -> Arc<Self> {
        Arc::new(Self {
            trust,
            role,
            limits,
            metrics,
            clock: Clock(Instant::now()),
            live: Mutex::new(Registry::default()),
            ended: Notify::new(),
            refused_log: Mutex::new(LogLimit::default()),
        })
    }

    /// A client whose handshake failed: said at info, so an operator sees why a client cannot
    /// connect (a certificate from another CA, no shared protocol version), but at most once per
    /// [`REFUSED_LOG_EVERY`] (a scanner must not flood the log); the rest at debug, counted in
    /// the next info line.
    fn handshake_refused(&self, peer: SocketAddr, error: &io::Error) {
        let now = Instant::now();
        let allowed = self.refused_log.lock().unwrap_or_else(|p| p.into_inner()).allow(now, REFUSED_LOG_EVERY);
        // The error is rustls' (a fixed text per cause), quoted all the same.
        let error = error.to_string();
        match allowed {
            Some(not_logged) => tracing::info!(
                role = self.role,
                %peer,
                error = ?error,
                not_logged,
                "TLS handshake refused (logged at most once per 10 s; not_logged: refusals since the last line)"
            ),
            None => tracing::debug!(role = self.role, %peer, error = ?error, "TLS handshake refused"),
        }
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn open_count(&self) -> usize {
        self.registry().open.len()
    }

    /// Registers a new connection from `source`, evicting at the cap, from the source holding
    /// the most connections, the one that has gone longest without completing a request.
    fn admit(&self, source: IpAddr) -> Admission {
        let mut reg = self.registry();
        let open = reg.open.len();
        if open >= self.limits.max_connections {
            let closing = reg.open.values().filter(|s| s.evicted.load(Ordering::Acquire)).count();
            if open >= self.limits.max_connections + CLOSING_HEADROOM {
                return if closing > 0 { Admission::Closing } else { Admission::Full };
            }
            // Connections already closing will free their places; otherwise make one.
            if open - closing >= self.limits.max_connections {
                match Self::least_progress(&reg) {
                    Some(victim) => {
                        victim.evicted.store(true, Ordering::Release);
                        victim.evict.notify_one();
                    }
                    None => return Admission::Full,
                }
            }
        }
        reg.next_id += 1;
        let id = reg.next_id;
        let state = Arc::new(ConnState::new(self.clock.now_ms(), source));
        reg.open.insert(id, state.clone());
        self.metrics.set_open_connections(self.role, reg.open.len());
        Admission::Admitted(id, state)
    }

    /// The connection (not answering a request it read whole, not already closing) that has
    /// gone longest without completing a request (idle, slow, or silent since its handshake),
    /// from the source address holding the most such connections; between sources holding as
    /// many, the one whose connection has gone longest. With one connection per source this is
    /// the least progress overall; a source that reconnects in a burst only displaces itself.
    fn least_progress(reg: &Registry) -> Option<Arc<ConnState>> {
        let mut by_source: HashMap<IpAddr, (usize, &Arc<ConnState>)> = HashMap::new();
        let evictable = reg
            .open
            .values()
            .filter(|s| s.answering.load(Ordering::Acquire) == 0 && !s.evicted.load(Ordering::Acquire));
        for state in evictable {
            let progress = state.progress_at.load(Ordering::Acquire);
            by_source
                .entry(state.source)
                .and_modify(|(count, oldest)| {
                    *count += 1;
                    if progress < oldest.progress_at.load(Ordering::Acquire) {
                        *oldest = state;
                    }
                })
                .or_insert((1, state));
        }
        by_source
            .into_values()
            .max_by_key(|(count, oldest)| (*count, std::cmp::Reverse(oldest.progress_at.load(Ordering::Acquire))))
            .map(|(_, oldest)| oldest.clone())
    }

    /// Asks the connection that has made the least progress to close, to free its descriptor.
    fn evict_one(&self) -> bool {
        let reg = self.registry();
        match Self::least_progress(&reg) {
            Some(state) => {
                state.evicted.store(true, Ordering::Release);
                state.evict.notify_one();
                true
            }
            None => false,
        }
    }

    /// Admits a connection from `source`; while connections being closed hold the places past
    /// the cap (a burst of newcomers evicting faster than the evicted can go), waits for them,
    /// up to [`CLOSE_GRACE`], rather than refusing: the newcomer waits here and those after it
    /// in the kernel's backlog, where a refusal would reset it.
    async fn admit_waiting(&self, source: IpAddr) -> Admission {
        let deadline = Instant::now() + CLOSE_GRACE;
        loop {
            let ended = self.ended.notified();
            match self.admit(source) {
                Admission::Closing => {
                    if tokio::time::timeout_at(deadline, ended).await.is_err() {
                        return Admission::Full;
                    }
                }
                decided => return decided,
            }
        }
    }

    fn release(&self, id: u64, reason: Option<CloseReason>) {
        let mut reg = self.registry();
        reg.open.remove(&id);
        self.metrics.set_open_connections(self.role, reg.open.len());
        drop(reg);
        if let Some(reason) = reason {
            self.metrics.observe_connection_closed(self.role, reason.as_str());
        }
        self.ended.notify_waiters();
    }

    /// Waits until every connection has ended, or `grace` has passed.
    async fn drain(&self, grace: Duration) -> bool {
        let deadline = Instant::now() + grace;
        loop {
            let ended = self.ended.notified();
            if self.open_count() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return self.open_count() == 0;
            }
        }
    }
}

// === serving ===

/// Accepts connections on `listener` until `stop`, serves `app` on each, then drains.
pub async fn serve(
    listener: TcpListener,
    transport: Transport,
    app: axum::Router,
    connections: Arc<Connections>,
    mut stop: watch::Receiver<bool>,
) {
    let mut errors = AcceptErrors::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((tcp, peer)) => {
                if let Some(burst) = errors.recovered() {
                    tracing::info!(
                        role = connections.role,
                        failures = burst.failures,
                        lasted_ms = u64::try_from(burst.lasted.as_millis()).unwrap_or(u64::MAX),
                        "accepting connections again"
                    );
                }
                match connections.admit_waiting(peer.ip()).await {
                    Admission::Admitted(id, state) => {
                        let (transport, app, connections, stop) =
                            (transport.clone(), app.clone(), connections.clone(), stop.clone());
                        tokio::spawn(async move {
                            let reason = connection(tcp, peer, transport, app, &connections, &state, stop).await;
                            connections.release(id, reason);
                        });
                    }
                    Admission::Full | Admission::Closing => {
                        connections.metrics.observe_connection_refused(connections.role);
                        tracing::debug!(role = connections.role, %peer, "connection refused: every connection is busy");
                        drop(tcp);
                    }
                }
            }
            Err(e) => {
                connections.metrics.observe_accept_error(connections.role);
                let freed = is_out_of_descriptors(&e) && connections.evict_one();
                let pause = errors.failed();
                if errors.failures() == 1 {
                    tracing::warn!(
                        role = connections.role,
                        error = %e,
                        evicted_idle_connection = freed,
                        "accept failed; backing off (logged once until accepting works again)"
                    );
                }
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        }
    }
    drop(listener);
    let grace = connections.limits.shutdown_grace + CLOSE_GRACE;
    if connections.drain(grace).await {
        tracing::info!(role = connections.role, "all connections closed");
    } else {
        tracing::warn!(
            role = connections.role,
            open = connections.open_count(),
            grace = ?connections.limits.shutdown_grace,
            "shutdown grace period over; closing remaining connections"
        );
    }
}

fn is_out_of_descriptors(e: &io::Error) -> bool {
    // EMFILE (the process) and ENFILE (the system).
    matches!(e.raw_os_error(), Some(24) | Some(23))
}

/// One connection, from handshake to close. Returns why keyward closed it, if it did.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    transport: Transport,
    app: axum::Router,
    connections: &Connections,
    state: &Arc<ConnState>,
    stop: watch::Receiver<bool>,
) -> Option<CloseReason> {
    let _ = tcp.set_nodelay(true);
    let limits = &connections.limits;
    let clock = connections.clock;
    match transport {
        Transport::Plain => {
            state.idle_since.store(clock.now_ms(), Ordering::Release);
            let client = Client { addr: peer, tls: false };
            http1(tcp, app, connections, state, stop, None, client).await
        }
        Transport::PlainOrH2c => {
            state.idle_since.store(clock.now_ms(), Ordering::Release);
            let mut tcp = tcp;
            let mut stopping = stop.clone();
            let sniffed = tokio::select! {
                read = tokio::time::timeout(limits.request_read_timeout, sniff_h2(&mut tcp, state, clock)) => read,
                _ = state.evict.notified() => return Some(CloseReason::Evicted),
                _ = stopping.wait_for(|s| *s) => return Some(CloseReason::Shutdown),
            };
            let client = Client { addr: peer, tls: false };
            match sniffed {
                Ok(Ok((first, true))) => http2(prefixed(first, tcp), app, connections, state, stop, None, client).await,
                Ok(Ok((first, false))) => {
                    http1(prefixed(first, tcp), app, connections, state, stop, None, client).await
                }
                Ok(Err(_)) => None,
                Err(_) => Some(CloseReason::FirstRequestTimeout),
            }
        }
        Transport::Tls(acceptor) => {
            let trusted_under = connections.trust.as_ref().map_or(0, |generation| generation());
            let handshake = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp));
            let tls = tokio::select! {
                done = handshake => match done {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        connections.handshake_refused(peer, &e);
                        return Some(CloseReason::HandshakeFailed);
                    }
                    Err(_) => {
                        tracing::debug!(role = connections.role, %peer, "TLS handshake timed out");
                        return Some(CloseReason::HandshakeTimeout);
                    }
                },
                _ = state.evict.notified() => return Some(CloseReason::Evicted),
            };
            // The first request is timed from the end of the handshake.
            state.idle_since.store(clock.now_ms(), Ordering::Release);
            let session = tls.get_ref().1;
            let h2 = session.alpn_protocol() == Some(b"h2");
            let peer_addr = peer;
            let chain: Vec<_> =
                session.peer_certificates().unwrap_or_default().iter().map(|c| c.clone().into_owned()).collect();
            let peer = PeerCertificate::new(chain, trusted_under);
            if let Some(peer) = &peer {
                // Closed when the certificate stops being good, whatever the connection is doing.
                state
                    .credential_until
                    .store(credential_until(clock, peer.not_after(), std::time::SystemTime::now()), Ordering::Release);
            }
            let client = Client { addr: peer_addr, tls: true };
            if h2 {
                http2(tls, app, connections, state, stop, peer, client).await
            } else {
                http1(tls, app, connections, state, stop, peer, client).await
            }
        }
    }
}

/// When a certificate (DER) stops being valid: `None` when it cannot be read (or says a time
/// before 1970).
pub fn not_after(der: &[u8]) -> Option<std::time::SystemTime> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let seconds = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    std::time::UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// The clock's time at which a client certificate valid until `not_after` stops being valid,
/// seen from `now`. 0 (none) when its end is unknown: the handler refuses it then.
fn credential_until(clock: Clock, not_after: Option<std::time::SystemTime>, now: std::time::SystemTime) -> u64 {
    let Some(not_after) = not_after else { return 0 };
    let left = not_after.duration_since(now).unwrap_or_default();
    let left_ms = left.as_secs().saturating_mul(1000);
    clock.now_ms().saturating_add(left_ms).max(1)
}

/// The HTTP/2 connection preface (RFC 9113, 3.4): what a client that knows the server speaks
/// HTTP/2 sends first (gRPC without TLS); no HTTP/1.1 request starts with it.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads a plain connection's first bytes until they are the HTTP/2 preface or cannot be, never
/// past its length; returns them, to be read again, and whether they were. Their first byte
/// starts the request's header deadline, as it does on a connection read by hyper.
async fn sniff_h2(tcp: &mut TcpStream, state: &ConnState, clock: Clock) -> io::Result<(Vec<u8>, bool)> {
    use tokio::io::AsyncReadExt;
    let mut first = vec![0; H2_PREFACE.len()];
    let mut filled = 0;
    loop {
        let n = tcp.read(&mut first[filled..]).await?;
        if n == 0 {
            first.truncate(filled);
            return Ok((first, false));
        }
        if filled == 0 {
            state.reading_since.store(clock.now_ms(), Ordering::Release);
        }
        filled += n;
        if !H2_PREFACE.starts_with(&first[..filled]) {
            first.truncate(filled);
            return Ok((first, false));
        }
        if filled == H2_PREFACE.len() {
            return Ok((first, true));
        }
    }
}

/// A connection whose first bytes were already read: they are read again first, then the
/// socket; writes go to the socket.
type Prefixed = tokio::io::Join<
    tokio::io::Chain<std::io::Cursor<Vec<u8>>, tokio::net::tcp::OwnedReadHalf>,
    tokio::net::tcp::OwnedWriteHalf,
>;

fn prefixed(first: Vec<u8>, tcp: TcpStream) -> Prefixed {
    use tokio::io::AsyncReadExt;
    let (read, write) = tcp.into_split();
    tokio::io::join(std::io::Cursor::new(first).chain(read), write)
}

/// The service for one connection: the router, with each request marked in flight.
fn tracked_service(
    app: axum::Router,
    state: &Arc<ConnState>,
    clock: Clock,
    gauge: Gauge,
    peer: Option<PeerCertificate>,
    client: Client,
) -> impl Service<
    hyper::Request<Incoming>,
    Response = hyper::Response<axum::body::Body>,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<hyper::Response<axum::body::Body>, std::convert::Infallible>> + Send,
> + Clone {
    let inner = TowerToHyperService::new(app);
    let state = state.clone();
    service_fn(move |mut req: hyper::Request<Incoming>| {
        let guard = InFlight::begin(&state, clock, Some(gauge.clone()));
        req.extensions_mut().insert(RequestProgress { state: state.clone() });
        req.extensions_mut().insert(client);
        if let Some(peer) = &peer {
            req.extensions_mut().insert(peer.clone());
        }
        let response = inner.call(req);
        async move {
            // In flight until the response is written whole.
            response.await.map(|r| r.map(|body| Guarded::wrap(body, guard)))
        }
    })
}

async fn http1<I>(
    io: I,
    app: axum::Router,
    connections: &Connections,
    state: &Arc<ConnState>,
    stop: watch::Receiver<bool>,
    peer: Option<PeerCertificate>,
    client: Client,
) -> Option<CloseReason>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let clock = connections.clock;
    let io = TokioIo::new(Watched { io, state: state.clone(), clock });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // keyward's watchdog times headers (and idle keep-alive) itself; hyper's header timer
    // would also run while a keep-alive connection is idle, cutting it at the header timeout.
    builder.timer(TokioTimer::new()).header_read_timeout(None).keep_alive(true);
    let conn = builder.serve_connection(
        io,
        tracked_service(app, state, clock, connections.metrics.requests_in_flight(connections.role), peer, client),
    );
    let conn = std::pin::pin!(conn);
    watch_connection(conn, |c| c.graceful_shutdown(), connections, state, stop).await
}

async fn http2<I>(
    io: I,
    app: axum::Router,
    connections: &Connections,
    state: &Arc<ConnState>,
    stop: watch::Receiver<bool>,
    peer: Option<PeerCertificate>,
    client: Client,
) -> Option<CloseReason>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let clock = connections.clock;
    let io = TokioIo::new(Watched { io, state: state.clone(), clock });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder.timer(TokioTimer::new()).max_concurrent_streams(H2_MAX_STREAMS);
    let conn = builder.serve_connection(
        io,
        tracked_service(app, state, clock, connections.metrics.requests_in_flight(connections.role), peer, client),
    );
    let conn = std::pin::pin!(conn);
    watch_connection(conn, |c| c.graceful_shutdown(), connections, state, stop).await
}

/// Drives a connection, closing it when its deadline passes, when it is evicted, or on
/// shutdown: first the protocol's graceful close, then, if that does not finish in time, by
/// dropping the socket.
async fn watch_connection<C>(
    mut conn: Pin<&mut C>,
    graceful: impl Fn(Pin<&mut C>),
    connections: &Connections,
    state: &ConnState,
    mut stop: watch::Receiver<bool>,
) -> Option<CloseReason>
where
    C: Future<Output = Result<(), hyper::Error>>,
{
    let limits = &connections.limits;
    let clock = connections.clock;
    let mut closing: Option<(CloseReason, Instant)> = None;
    loop {
        let wake = match closing {
            Some((_, hard)) => hard,
            None => match state.deadline(limits) {
                Some((at, _)) => clock.instant(at),
                // A request is being answered: look again once it could have finished.
                None => Instant::now() + limits.request_read_timeout,
            },
        };
        tokio::select! {
            ended = conn.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(role = connections.role, error = %e, "connection ended with an error");
                }
                return closing.map(|(reason, _)| reason);
            }
            _ = tokio::time::sleep_until(wake) => match closing {
                Some((reason, _)) => return Some(reason),
                // The deadline may have moved since it was computed: decide on the state now.
                None => {
                    if let Some((at, reason)) = state.deadline(limits) {
                        if clock.instant(at) <= Instant::now() {
                            if reason == CloseReason::SlowRequest {
                                return Some(reason);
                            }
                            graceful(conn.as_mut());
                            closing = Some((reason, Instant::now() + CLOSE_GRACE));
                        }
                    }
                }
            },
            _ = state.evict.notified(), if closing.is_none() => {
                // A half-read request has no answer to wait for: its place is needed now.
                if state.is_reading() || state.requests.load(Ordering::Acquire) == 0 {
                    return Some(CloseReason::Evicted);
                }
                graceful(conn.as_mut());
                closing = Some((CloseReason::Evicted, Instant::now() + CLOSE_GRACE));
            }
            _ = stop.wait_for(|s| *s), if closing.is_none() => {
                graceful(conn.as_mut());
                closing = Some((CloseReason::Shutdown, Instant::now() + limits.shutdown_grace));
            }
            // A deadline was brought forward: the loop computes them again.
            _ = state.recheck.notified(), if closing.is_none() => {}
        }
    }
}

// === impl LogLimit ===

/// One log line per period: the rest are counted, and the next line says how many.
#[derive(Debug, Default)]
struct LogLimit {
    last: Option<Instant>,
    held_back: u64,
}

impl LogLimit {
    /// `Some(n)`: log now; `n` lines were held back since the last one. `None`: hold this back.
    fn allow(&mut self, now: Instant, every: Duration) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < every => {
                self.held_back += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held_back))
            }
        }
    }
}

// === impl AcceptErrors ===

/// A run of accept failures: how long to pause before the next attempt, and whether to log.
#[derive(Debug, Default)]
pub struct AcceptErrors {
    burst: Option<(Instant, u64)>,
}

/// A burst of accept failures that has ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Burst {
    pub failures: u64,
    pub lasted: Duration,
}

impl AcceptErrors {
    /// Records a failure; returns how long to pause (doubling from 5 ms up to 1 s).
    pub fn failed(&mut self) -> Duration {
        let (_, n) = self.burst.get_or_insert((Instant::now(), 0));
        *n += 1;
        let doublings = u32::try_from((*n - 1).min(16)).unwrap_or(16);
        BACKOFF_FIRST.saturating_mul(1 << doublings).min(BACKOFF_MAX)
    }

    /// Failures in the current burst.
    pub fn failures(&self) -> u64 {
        self.burst.map_or(0, |(_, n)| n)
    }

    /// An accept worked: ends the burst, if there was one.
    pub fn recovered(&mut self) -> Option<Burst> {
        self.burst.take().map(|(since, failures)| Burst { failures, lasted: since.elapsed() })
    }
}

/// Raises the soft limit on open files to the hard limit (as Go programs do at start-up), and
/// returns the soft limit now in force, if it can be read.
pub fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    if let (Some(current), Some(maximum)) = (limit.current, limit.maximum) {
        if current < maximum
            && setrlimit(Resource::Nofile, rustix::process::Rlimit { current: Some(maximum), maximum: Some(maximum) })
                .is_ok()
        {
            return Some(maximum);
        }
    }
    limit.current
}

/// The connection cap that fits in `open_files` descriptors, with room for everything else.
pub fn cap_for_open_files(wanted: usize, open_files: Option<u64>) -> usize {
    match open_files {
        None => wanted,
        Some(n) => {
            let room = n.saturating_sub(RESERVED_FDS + CLOSING_HEADROOM as u64);
            wanted.min(usize::try_from(room).unwrap_or(usize::MAX)).max(1)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_peer_certificate_is_read_once_per_connection() {
        let peer = PeerCertificate::new(vec![rustls::pki_types::CertificateDer::from(vec![1, 2, 3])], 0).unwrap();
        let reads = AtomicUsize::new(0);
        let read = |der: &[u8]| {
            reads.fetch_add(1, Ordering::Relaxed);
            der.len()
        };
        let again = peer.clone();
        assert_eq!((peer.read_once(read), again.read_once(read)), (3, 3));
        assert_eq!(reads.load(Ordering::Relaxed), 1, "the second request of the connection reuses the first reading");
    }

    use super::*;
    use keyward_certs::pki::Ca;

    const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: 2,
            handshake_timeout: Duration::from_secs(10),
            request_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(20),
        }
    }

    #[test]
    fn refused_handshakes_are_logged_once_a_period_and_the_next_line_counts_the_rest() {
        let mut limit = LogLimit::default();
        let start = Instant::now();
        let every = Duration::from_secs(10);
        assert_eq!(limit.allow(start, every), Some(0));
        assert_eq!(limit.allow(start + Duration::from_secs(1), every), None);
        assert_eq!(limit.allow(start + Duration::from_secs(9), every), None);
        assert_eq!(limit.allow(start + every, every), Some(2));
        assert_eq!(limit.allow(start + every + Duration::from_secs(1), every), None);
        assert_eq!(limit.allow(start + every * 3, every), Some(1));
    }

    #[test]
    fn backoff_doubles_to_a_ceiling_and_a_burst_is_reported_once_over() {
        let mut errors = AcceptErrors::default();
        let pauses: Vec<Duration> = (0..10).map(|_| errors.failed()).collect();
        assert_eq!(pauses[0], Duration::from_millis(5));
        assert_eq!(pauses[1], Duration::from_millis(10));
        assert_eq!(pauses[7], Duration::from_millis(640));
        assert_eq!(pauses[8], Duration::from_secs(1));
        assert_eq!(pauses[9], Duration::from_secs(1));
        assert_eq!(errors.failures(), 10);
        // A thousand failures in a row cost at most ~17 minutes of pauses, never a busy loop.
        for _ in 0..1000 {
            assert!(errors.failed() >= Duration::from_millis(5));
        }
        let burst = errors.recovered().unwrap();
        assert_eq!(burst.failures, 1010);
        assert_eq!(errors.recovered(), None);
        assert_eq!(errors.failed(), Duration::from_millis(5), "a new burst starts over");
    }

    #[test]
    fn the_cap_leaves_room_for_other_descriptors() {
        assert_eq!(cap_for_open_files(1024, Some(256)), 256 - 64 - 16);
        assert_eq!(cap_for_open_files(100, Some(1_048_576)), 100);
        assert_eq!(cap_for_open_files(100, None), 100);
        assert_eq!(cap_for_open_files(100, Some(10)), 1);
    }

    #[tokio::test]
    async fn deadlines_follow_the_connection_phase() {
        let state = ConnState::new(1000, HERE);
        let l = limits();
        assert_eq!(state.deadline(&l), Some((11_000, CloseReason::FirstRequestTimeout)));
        state.reading_since.store(1500, Ordering::Release);
        assert_eq!(
            state.deadline(&l),
            Some((11_000, CloseReason::FirstRequestTimeout)),
            "bytes before the first request do not move its deadline"
        );
        let clock = Clock(Instant::now());
        let state = Arc::new(state);
        let guard = InFlight::begin(&state, clock, None);
        let since = state.request_since.load(Ordering::Acquire);
        assert_eq!(
            state.deadline(&l),
            Some((since + 10_000 + 1_000, CloseReason::SlowRequest)),
            "a request being read is timed, whatever the protocol"
        );
        let answering = RequestProgress { state: state.clone() }.read_whole();
        assert_eq!(state.deadline(&l), None, "a request read whole is answered without a deadline");
        drop(answering);
        drop(guard);
        let (at, reason) = state.deadline(&l).unwrap();
        assert_eq!(reason, CloseReason::Idle);
        assert_eq!(at, state.idle_since.load(Ordering::Acquire) + 120_000);
        state.reading_since.store(at, Ordering::Release);
        assert_eq!(state.deadline(&l), Some((at + 10_000, CloseReason::HeaderTimeout)));
    }

    #[tokio::test]
    async fn a_client_certificate_ends_the_connection_at_its_end_unless_a_phase_ends_it_first() {
        let l = limits();
        let state = Arc::new(ConnState::new(1000, HERE));
        // Good for a day: the first request's deadline comes first, as without a certificate.
        state.credential_until.store(86_400_000, Ordering::Release);
        assert_eq!(state.deadline(&l), Some((11_000, CloseReason::FirstRequestTimeout)));
        // Ending before it: the certificate's end.
        state.credential_until.store(5_000, Ordering::Release);
        assert_eq!(state.deadline(&l), Some((5_000, CloseReason::CredentialEnded)));
        // While a request is answered (no phase deadline) too.
        let clock = Clock(Instant::now());
        let _guard = InFlight::begin(&state, clock, None);
        let _answering = RequestProgress { state: state.clone() }.read_whole();
        assert_eq!(state.deadline(&l), Some((5_000, CloseReason::CredentialEnded)));
        // Found no longer good by a request: at once.
        RequestProgress { state: state.clone() }.close_when_answered();
        assert_eq!(state.deadline(&l), Some((1, CloseReason::CredentialEnded)));
        let leaf = Ca::mint("x", std::time::SystemTime::now(), Duration::from_secs(3600)).unwrap();
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(leaf.cert_pem().as_bytes())
            .map(|c: rustls::pki_types::CertificateDer<'static>| c.to_vec())
            .unwrap();
        let until = credential_until(clock, not_after(&der), std::time::SystemTime::now());
        let left = until.saturating_sub(clock.now_ms());
        assert!((3_590_000..=3_600_000).contains(&left), "{left}");
        assert_eq!(not_after(b"not DER"), None);
        assert_eq!(credential_until(clock, None, std::time::SystemTime::now()), 0);
    }

    #[tokio::test]
    async fn at_the_cap_the_least_progress_is_evicted_and_only_answering_ones_are_kept() {
        let connections = Connections::new("test", limits(), Arc::new(Metrics::default()));
        let clock = connections.clock;
        let Admission::Admitted(_, slow) = connections.admit(HERE) else { panic!("first") };
        let Admission::Admitted(_, fast) = connections.admit(HERE) else { panic!("second") };
        // The first has a request half-read since long ago (a slow body); the second completed
        // a request a moment ago.
        slow.progress_at.store(1, Ordering::Release);
        let _reading = InFlight::begin(&slow, clock, None);
        fast.progress_at.store(5, Ordering::Release);
        assert!(matches!(connections.admit(HERE), Admission::Admitted(..)));
        assert!(slow.evicted.load(Ordering::Acquire), "a request in flight is no shield");
        assert!(!fast.evicted.load(Ordering::Acquire));

        // Only connections answering requests they read whole are spared; with all of them
        // answering, a newcomer is refused.
        let connections = Connections::new("test", limits(), Arc::new(Metrics::default()));
        let Admission::Admitted(_, a) = connections.admit(HERE) else { panic!("a") };
        let Admission::Admitted(_, b) = connections.admit(HERE) else { panic!("b") };
        let _busy = (InFlight::begin(&a, clock, None), InFlight::begin(&b, clock, None));
        let _answering =
            (RequestProgress { state: a.clone() }.read_whole(), RequestProgress { state: b.clone() }.read_whole());
        assert!(matches!(connections.admit(HERE), Admission::Full));
    }

    #[tokio::test]
    async fn at_the_cap_the_source_holding_the_most_connections_loses_one() {
        let l = ConnectionLimits { max_connections: 4, ..limits() };
        let connections = Connections::new("test", l, Arc::new(Metrics::default()));
        let (pod, apiserver): (IpAddr, IpAddr) = ([10, 0, 0, 7].into(), [10, 0, 0, 1].into());
        // The apiserver's connection is the oldest; the pod's three came after it.
        let Admission::Admitted(_, theirs) = connections.admit(apiserver) else { panic!("apiserver") };
        theirs.progress_at.store(1, Ordering::Release);
        let mut pods = Vec::new();
        for at in [5, 3, 4] {
            let Admission::Admitted(_, state) = connections.admit(pod) else { panic!("pod") };
            state.progress_at.store(at, Ordering::Release);
            pods.push(state);
        }
        assert!(matches!(connections.admit(pod), Admission::Admitted(..)));
        assert!(!theirs.evicted.load(Ordering::Acquire), "the oldest, but its source holds one connection");
        let evicted: Vec<bool> = pods.iter().map(|s| s.evicted.load(Ordering::Acquire)).collect();
        assert_eq!(evicted, [false, true, false], "the pod's own connection that has gone longest");

        // Sources holding as many: the connection that has gone longest, whatever its source
        // (an IPv4-mapped IPv6 address is the IPv4 source).
        let l = ConnectionLimits { max_connections: 2, ..limits() };
        let connections = Connections::new("test", l, Arc::new(Metrics::default()));
        let mapped: IpAddr = std::net::Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x0a00, 0x0007]).into();
        let Admission::Admitted(_, a) = connections.admit(mapped) else { panic!("a") };
        let Admission::Admitted(_, b) = connections.admit(apiserver) else { panic!("b") };
        a.progress_at.store(9, Ordering::Release);
        b.progress_at.store(2, Ordering::Release);
        let Admission::Admitted(_, c) = connections.admit(pod) else { panic!("c") };
        c.progress_at.store(20, Ordering::Release);
        assert_eq!((a.evicted.load(Ordering::Acquire), b.evicted.load(Ordering::Acquire)), (false, true));
        // Now the pod (10.0.0.7, and its mapped form) holds two: one of those goes next.
        assert!(matches!(connections.admit(apiserver), Admission::Admitted(..)));
        assert!(a.evicted.load(Ordering::Acquire), "the mapped address counts as 10.0.0.7");
    }

    #[tokio::test]
    async fn past_the_headroom_a_newcomer_waits_for_the_evicted_to_go_then_is_refused() {
        let connections = Connections::new("test", limits(), Arc::new(Metrics::default()));
        // A burst: each newcomer evicts one, and none of the evicted has gone yet.
        let mut ids = Vec::new();
        for _ in 0..limits().max_connections + CLOSING_HEADROOM {
            let Admission::Admitted(id, _) = connections.admit(HERE) else { panic!("in the burst") };
            ids.push(id);
        }
        assert!(matches!(connections.admit(HERE), Admission::Closing));
        let waiting = tokio::spawn({
            let connections = connections.clone();
            async move { connections.admit_waiting(HERE).await }
        });
        connections.release(ids[0], Some(CloseReason::Evicted));
        assert!(matches!(waiting.await.unwrap(), Admission::Admitted(..)), "admitted once an evicted one went");
        // None goes: refused at the close grace, not held forever.
        let started = Instant::now();
        assert!(matches!(connections.admit_waiting(HERE).await, Admission::Full));
        assert!(started.elapsed() >= CLOSE_GRACE);
    }
}
