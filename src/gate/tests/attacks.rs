//! The gate against a caller who knows HTTP and TLS (issue 43): the bytes such a caller sends,
//! raw HTTP/1.1 over TLS or HTTP/2 frames, a second handshake that asks to resume, a certificate
//! that expires or whose CA is rotated out under a live connection, calls that never end or
//! that the upstream never answers, a flood of made-up tokens. Each test asserts what the
//! upstream received, or that it received nothing.

use std::time::{Duration, Instant, SystemTime};

use rustls::HandshakeKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;

use super::*;

const DRIVER: &str = "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";

/// A TLS connection to the gate with `identity`'s certificate, ALPN http/1.1.
async fn tls(f: &Fixture, identity: Option<&Minted>) -> TlsStream<TcpStream> {
    let config = f.client_tls(identity, false, &[&rustls::version::TLS13]);
    let tcp = TcpStream::connect(f.addr).await.unwrap();
    TlsConnector::from(Arc::new(config)).connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap()
}

/// `raw`, an HTTP/1.1 request written byte for byte, over a new TLS connection; the answer as
/// read until the gate closes the connection.
async fn raw_http1(f: &Fixture, identity: Option<&Minted>, raw: &str) -> String {
    let mut stream = tls(f, identity).await;
    stream.write_all(raw.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(EVENT_TIMEOUT, stream.read_to_end(&mut answer)).await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// The values of `name` the upstream received in request `i`'s headers.
fn received(f: &Fixture, i: usize, name: &str) -> Vec<String> {
    f.upstream_seen()[i].headers.get_all(name).iter().map(|v| v.to_str().unwrap().to_string()).collect()
}

// === 1. Connection cannot drop the gate's headers, or what a rule read ===

#[tokio::test]
async fn a_connection_header_cannot_drop_the_gates_identity_headers_or_a_header_a_rule_reads() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    let attack = "GET /apis/v1/namespaces/team-a/runs/r1 HTTP/1.1\r\nHost: localhost\r\nConnection: close, X-Remote-User, X-Remote-Groups, X-Keyward-Identity\r\n\r\n";
    let answer = raw_http1(&f, Some(&driver), attack).await;
    assert!(answer.starts_with("HTTP/1.1 403 "), "{answer}");
    assert!(
        answer
            .contains("keyward gate: the Connection header names x-remote-user, a header the gate decides on or sets"),
        "{answer}"
    );
    assert!(f.upstream_calls().is_empty(), "refused before anything is sent");

    // A header no one reads may be named: it goes, and the gate's own arrive.
    let fine = "GET /apis/v1/namespaces/team-a/runs/r1 HTTP/1.1\r\nHost: localhost\r\nConnection: close, X-Debug\r\nX-Debug: 1\r\n\r\n";
    let answer = raw_http1(&f, Some(&driver), fine).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert_eq!(received(&f, 0, "x-remote-user"), [DRIVER]);
    assert_eq!(received(&f, 0, "x-keyward-identity"), [DRIVER]);
    assert!(received(&f, 0, "x-debug").is_empty() && received(&f, 0, "connection").is_empty());
}

#[tokio::test]
async fn a_connection_header_cannot_drop_a_header_a_condition_decided_on() {
    let gate = GATE.replace(
        "      when:\n        - {caller: namespace, equals: {pathSegment: namespace}}\n    - name: graph callers",
        "      when:\n        - {caller: namespace, equals: {pathSegment: namespace}}\n        - {caller: namespace, equals: {header: x-tenant}}\n    - name: graph callers",
    );
    let f = Fixture::start_with(&gate).await;
    let driver = f.driver("team-a", "evaljob-sample");
    let attack = "GET /apis/v1/namespaces/team-a/runs/r1 HTTP/1.1\r\nHost: localhost\r\nX-Tenant: team-a\r\nConnection: close, X-Tenant\r\n\r\n";
    let answer = raw_http1(&f, Some(&driver), attack).await;
    assert!(answer.contains("the Connection header names x-tenant"), "{answer}");
    assert!(f.upstream_calls().is_empty());
}

// === 2. Underscores spell dashes to the upstream ===

#[tokio::test]
async fn headers_with_underscores_never_reach_the_upstream() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    let attack = "GET /apis/v1/namespaces/team-a/runs/r1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nX_Remote_User: system:admin\r\nX_Remote_Groups: system:masters\r\nX_Keyward_Identity: spiffe://cluster.local/ns/team-a/lmevaljob/other\r\nkubeflow_userid: admin@example.com\r\nX_Custom: 1\r\n\r\n";
    let answer = raw_http1(&f, Some(&driver), attack).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    let seen = &f.upstream_seen()[0];
    let underscored: Vec<&str> = seen.headers.keys().map(|k| k.as_str()).filter(|k| k.contains('_')).collect();
    assert!(underscored.is_empty(), "{underscored:?}");
    assert_eq!(received(&f, 0, "x-remote-user"), [DRIVER]);
    assert_eq!(received(&f, 0, "x-remote-groups"), ["keyward:workloads|keyward:workloads:team-a|system:authenticated"]);
}

// === 3. No resumed session, and a certificate checked again on every request ===

/// Two handshakes with one client configuration, which keeps what a server gives it to resume:
/// the second is a full handshake, whatever the version.
#[tokio::test]
async fn no_session_is_resumed_in_tls_1_3_or_1_2() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let config = Arc::new(f.client_tls(Some(&driver), false, &[version]));
        let mut kinds = Vec::new();
        for _ in 0..2 {
            let tcp = TcpStream::connect(f.addr).await.unwrap();
            let mut stream = TlsConnector::from(config.clone())
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .unwrap();
            // A whole exchange, so that a ticket sent after the handshake would be read.
            let request =
                "GET /apis/v1/namespaces/team-a/runs/r1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(EVENT_TIMEOUT, stream.read_to_end(&mut answer)).await.unwrap();
            assert!(answer.starts_with(b"HTTP/1.1 200 "), "{}", String::from_utf8_lossy(&answer));
            kinds.push(stream.get_ref().1.handshake_kind());
        }
        assert_eq!(kinds, [Some(HandshakeKind::Full); 2], "{version:?}");
    }
}

/// One HTTP/1.1 connection, kept: its requests in turn, and whether it has ended.
struct Kept {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    ended: tokio::task::JoinHandle<()>,
}

impl Kept {
    async fn open(f: &Fixture, identity: &Minted) -> Kept {
        let stream = tls(f, Some(identity)).await;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        let ended = tokio::spawn(async move {
            let _ = conn.await;
        });
        Kept { sender, ended }
    }

    async fn get(&mut self, path: &str) -> (u16, String) {
        let request = Request::get(path).header("host", "localhost").body(Full::new(Bytes::new())).unwrap();
        let response = tokio::time::timeout(EVENT_TIMEOUT, self.sender.send_request(request)).await.unwrap().unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Waits for the gate to close the connection.
    async fn closed(self) {
        tokio::time::timeout(EVENT_TIMEOUT, self.ended).await.unwrap().unwrap();
    }
}

/// Waits until the clock is past `t`: the event a certificate's expiry is.
async fn clock_past(t: SystemTime) {
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while SystemTime::now() <= t {
        assert!(Instant::now() < deadline, "the clock never passed {t:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A connection whose certificate expires is closed then, idle or not (the per-request check,
/// for a request that arrives first, is `client_ca`'s `expired_and_rotated_out_certificates_
/// are_found_on_the_next_request`), and the same certificate cannot connect again.
#[tokio::test]
async fn a_connection_is_closed_when_its_certificate_expires_and_cannot_be_made_again() {
    let f = Fixture::start().await;
    // Valid for the next 2 s (notAfter is whole seconds: up to a second less).
    let issued = SystemTime::now() - DAY + Duration::from_secs(2);
    let driver = issue(&f.client_ca, DRIVER, issued);
    let mut kept = Kept::open(&f, &driver).await;
    assert_eq!(kept.get("/apis/v1/namespaces/team-a/runs/r1").await.0, 200);
    kept.closed().await;
    let closed = "keyward_connections_closed_by_server_total{listener=\"gate\",reason=\"credential-ended\"} 1";
    assert!(f.gate.shared.encode().contains(closed), "{}", f.gate.shared.encode());
    clock_past(issued + DAY).await;
    let again = f.send(false, Some(&driver), http_get("/apis/v1/namespaces/team-a/runs/r1")).await;
    assert!(again.is_err(), "{again:?}");
    assert_eq!(f.upstream_calls().len(), 1);
}

#[tokio::test]
async fn a_client_ca_rotated_out_ends_the_connections_it_verified() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    let mut kept = Kept::open(&f, &driver).await;
    assert_eq!(kept.get("/apis/v1/namespaces/team-a/runs/r1").await.0, 200);
    let next = Ca::mint("next keyward client CA", SystemTime::now(), DAY).unwrap();
    std::fs::write(&f.ca_file, next.cert_pem()).unwrap();
    assert_eq!(f.gate.client_ca.as_ref().unwrap().reload_now(), Reload::Loaded(1));
    let (status, body) = kept.get("/apis/v1/namespaces/team-a/runs/r1").await;
    assert_eq!(status, 401);
    assert!(
        body.starts_with("keyward gate: the client certificate no longer verifies with the gate's client CAs"),
        "{body}"
    );
    kept.closed().await;
    // Through an overlap, a connection verified under the old bundle goes on.
    std::fs::write(&f.ca_file, format!("{}{}", f.client_ca.cert_pem(), next.cert_pem())).unwrap();
    f.gate.client_ca.as_ref().unwrap().reload_now();
    let mut kept = Kept::open(&f, &driver).await;
    std::fs::write(&f.ca_file, format!("{}{}", next.cert_pem(), f.client_ca.cert_pem())).unwrap();
    f.gate.client_ca.as_ref().unwrap().reload_now();
    assert_eq!(kept.get("/apis/v1/namespaces/team-a/runs/r1").await.0, 200);
    assert_eq!(f.upstream_calls().len(), 2);
}

// === 4. Trailers ===

#[tokio::test]
async fn request_trailers_lose_what_the_header_block_loses() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    let attack = "POST /apis/v1/namespaces/team-a/runs/r1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nTE: trailers\r\nTransfer-Encoding: chunked\r\nTrailer: X-Remote-User, X-Keyward-Identity, kubeflow-userid, X-Ok\r\n\r\n5\r\nhello\r\n0\r\nX-Remote-User: system:admin\r\nX-Keyward-Identity: spiffe://cluster.local/ns/team-a/lmevaljob/other\r\nkubeflow-userid: admin\r\nX_Remote_Groups: system:masters\r\nX-Ok: 1\r\n\r\n";
    let answer = raw_http1(&f, Some(&driver), attack).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    let trailers = f.upstream_seen()[0].trailers.clone().expect("the upstream got the trailers");
    let names: Vec<&str> = trailers.keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["x-ok"]);
}

#[tokio::test]
async fn http2_trailing_headers_lose_what_the_header_block_loses() {
    let f = Fixture::start_with(KFP_GATE).await;
    let agent = "system:serviceaccount:kubeflow:ml-pipeline-persistenceagent";
    f.api
        .state
        .lock()
        .unwrap()
        .tokens
        .insert("agent-token".into(), (agent.into(), vec!["pipelines.kubeflow.org".into()]));
    let mut trailers = HeaderMap::new();
    for (name, value) in
        [("x-remote-user", "system:admin"), ("kubeflow-userid", "admin"), ("x-forwarded-for", "1.2.3.4"), ("x-ok", "1")]
    {
        trailers.insert(name, value.parse().unwrap());
    }
    let frames: Vec<Result<Frame<Bytes>, Infallible>> =
        vec![Ok(Frame::data(Bytes::from(encode_strings(&[(1, "{}")])))), Ok(Frame::trailers(trailers))];
    let request = Request::post("https://localhost/api.ReportService/ReportWorkflowV1")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", "Bearer agent-token")
        .body(StreamBody::new(futures::stream::iter(frames)))
        .unwrap();
    let answer = tokio::time::timeout(EVENT_TIMEOUT, f.send(true, None, request)).await.unwrap().unwrap();
    assert_eq!(answer.grpc().0, "0");
    let trailers = f.upstream_seen()[0].trailers.clone().expect("the upstream got the trailers");
    let names: Vec<&str> = trailers.keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["x-ok"]);
}

// === 5. Path parameters ===

#[tokio::test]
async fn a_path_parameter_is_refused_before_any_rule() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    for path in [
        "/apis/v1/namespaces/team-a/..;/team-b/runs/r1",
        "/apis/v1/namespaces/team-a/runs/r1;x=1",
        "/apis/v1/namespaces/team-a/runs/r1%3b",
    ] {
        let answer = raw_http1(
            &f,
            Some(&driver),
            &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 403 "), "{path}: {answer}");
        assert!(answer.contains("';'"), "{path}: {answer}");
    }
    assert!(f.upstream_calls().is_empty());
}

// === 6. One caller cannot hold the others' turn ===

/// A gRPC call whose body never ends (the channel stays open while the returned sender lives).
fn endless_update() -> (Request<UnsyncBody>, FrameSender) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
    let frames = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|frame| (frame, rx)) });
    let request = Request::post("https://localhost/LMEvalJobUpdateService/UpdateStatus")
        .header("content-type", "application/grpc")
        .body(StreamBody::new(Box::pin(frames)).boxed_unsync())
        .unwrap();
    (request, tx)
}

type UnsyncBody = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;
type FrameSender = tokio::sync::mpsc::Sender<Result<Frame<Bytes>, Infallible>>;

#[tokio::test]
async fn a_caller_no_rule_admits_is_refused_before_its_message_is_held() {
    let f = Fixture::start().await;
    let stranger = issue(&f.client_ca, "spiffe://cluster.local/ns/team-a/rayjob/not-a-driver", SystemTime::now());
    let (request, tx) = endless_update();
    tx.send(Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 40, 0x0a])))).await.unwrap();
    let answer = tokio::time::timeout(EVENT_TIMEOUT, f.send(true, Some(&stranger), request)).await.unwrap().unwrap();
    // Answered while its body is still open: nothing was held for it.
    assert!(!tx.is_closed() || answer.grpc().0 == "7");
    assert_eq!(answer.grpc().0, "7");
    assert!(percent_decode(&answer.grpc().1)
        .contains("it does not admit workload spiffe://cluster.local/ns/team-a/rayjob/not-a-driver"));
    assert_eq!(f.gate.state.body_budget.available_permits(), 64 << 20);
    drop(tx);
}

/// An upstream speaking HTTP/2 that answers a call only once told to (`release`), and takes at
/// most `streams` at once on a connection; `arrived` counts the calls it has.
struct SlowUpstream {
    addr: SocketAddr,
    release: Arc<Notify>,
    arrived: Arc<Mutex<usize>>,
    changed: Arc<Notify>,
}

async fn slow_upstream(streams: u32) -> SlowUpstream {
    slow_upstream_holding(streams, b"").await
}

/// [`slow_upstream`], holding only the calls whose message holds `held` (the job a greedy
/// caller names): the others are answered at once.
async fn slow_upstream_holding(streams: u32, held: &'static [u8]) -> SlowUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (release, arrived, changed) = (Arc::new(Notify::new()), Arc::new(Mutex::new(0)), Arc::new(Notify::new()));
    let (r, a, c) = (release.clone(), arrived.clone(), changed.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (r, a, c) = (r.clone(), a.clone(), c.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let (r, a, c) = (r.clone(), a.clone(), c.clone());
                    async move {
                        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let released = r.notified();
                        *a.lock().unwrap() += 1;
                        c.notify_waiters();
                        if body.windows(held.len().max(1)).any(|w| held.is_empty() || w == held) {
                            released.await;
                        }
                        let mut trailers = HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![Ok(Frame::trailers(trailers))];
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "application/grpc")
                                .body(StreamBody::new(futures::stream::iter(frames)))
                                .unwrap(),
                        )
                    }
                });
                let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                builder.max_concurrent_streams(streams);
                let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
            });
        }
    });
    SlowUpstream { addr, release, arrived, changed }
}

impl SlowUpstream {
    async fn wait_arrived(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            let changed = self.changed.notified();
            if *self.arrived.lock().unwrap() >= n {
                return;
            }
            assert!(tokio::time::timeout_at(deadline, changed).await.is_ok(), "{n} calls never arrived");
        }
    }
}

#[tokio::test]
async fn the_budget_comes_back_once_the_message_is_with_the_upstream_not_when_it_answers() {
    let f = Fixture::start().await;
    let slow = slow_upstream(100).await;
    let upstream = Upstream::new(
        &format!("http://{}", slow.addr),
        upstream::UpstreamTls::default(),
        upstream::UpstreamProtocol::Auto,
        READ_TIMEOUT,
    )
    .unwrap();
    let gate = serve_with_upstream(&f, upstream).await;
    let driver = f.driver("team-a", "evaljob-sample");
    let waiting = tokio::spawn({
        let request = update_status("evaljob-sample", "team-a");
        let (addr, client_tls) = (gate, f.client_tls(Some(&driver), true, &[&rustls::version::TLS13]));
        async move { send_with(addr, client_tls, request).await }
    });
    slow.wait_arrived(1).await;
    // The call waits on the upstream's answer, and holds none of the gate's budget.
    assert_eq!(f.gate.state.body_budget.available_permits(), 64 << 20);
    slow.release.notify_waiters();
    let answer = tokio::time::timeout(EVENT_TIMEOUT, waiting).await.unwrap().unwrap();
    assert_eq!(answer.grpc().0, "0");
}

#[tokio::test]
async fn one_caller_holds_at_most_its_share_of_unanswered_calls_and_the_others_go_on() {
    let f = Fixture::start().await;
    let slow = slow_upstream(1000).await;
    let upstream = Upstream::new(
        &format!("http://{}", slow.addr),
        upstream::UpstreamTls::default(),
        upstream::UpstreamProtocol::Auto,
        READ_TIMEOUT,
    )
    .unwrap();
    let gate = serve_with_upstream(&f, upstream).await;
    let greedy = f.driver("team-a", "greedy");
    let config = f.client_tls(Some(&greedy), true, &[&rustls::version::TLS13]);
    // Its calls on one HTTP/2 connection, as grpc-go sends them.
    let tcp = TcpStream::connect(gate).await.unwrap();
    let stream =
        TlsConnector::from(Arc::new(config)).connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut pending = Vec::new();
    for _ in 0..super::super::share::MAX_CALLS {
        let mut sender = sender.clone();
        pending.push(tokio::spawn(async move { sender.send_request(update_status("greedy", "team-a")).await }));
    }
    slow.wait_arrived(super::super::share::MAX_CALLS).await;
    let one_more = sender.clone().send_request(update_status("greedy", "team-a")).await.unwrap();
    let (parts, body) = one_more.into_parts();
    let collected = body.collect().await.unwrap();
    let one_more = Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        trailers: collected.trailers().cloned(),
        body: collected.to_bytes(),
    };
    let (status, message) = one_more.grpc();
    assert_eq!(status, "14");
    assert!(percent_decode(&message).contains("has 16 calls whose message the gate holds already"), "{message}");
    // Another driver's call is taken.
    let other = f.driver("team-a", "evaljob-sample");
    let theirs = tokio::spawn({
        let config = f.client_tls(Some(&other), true, &[&rustls::version::TLS13]);
        async move { send_with(gate, config, update_status("evaljob-sample", "team-a")).await }
    });
    slow.wait_arrived(super::super::share::MAX_CALLS + 1).await;
    slow.release.notify_waiters();
    assert_eq!(tokio::time::timeout(EVENT_TIMEOUT, theirs).await.unwrap().unwrap().grpc().0, "0");
    for call in pending {
        let _ = tokio::time::timeout(EVENT_TIMEOUT, call).await;
    }
}

/// `count` held calls of `job`'s driver on one HTTP/2 connection, as grpc-go sends them, left
/// waiting on `slow`, each sent once the one before has arrived (so the gate has the upstream's
/// SETTINGS, its streams a connection, by the second).
async fn hold_calls(
    f: &Fixture,
    gate: SocketAddr,
    slow: &SlowUpstream,
    job: &str,
    count: usize,
) -> Vec<tokio::task::JoinHandle<()>> {
    let greedy = f.driver("team-a", job);
    let config = f.client_tls(Some(&greedy), true, &[&rustls::version::TLS13]);
    let tcp = TcpStream::connect(gate).await.unwrap();
    let stream =
        TlsConnector::from(Arc::new(config)).connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let already = *slow.arrived.lock().unwrap();
    let mut calls = Vec::new();
    for n in 1..=count {
        let (mut sender, job) = (sender.clone(), job.to_string());
        calls.push(tokio::spawn(async move {
            let _ = sender.send_request(update_status(&job, "team-a")).await;
        }));
        slow.wait_arrived(already + n).await;
    }
    calls
}

/// The attack issue 56 names: an upstream that takes 8 streams a connection, and one caller's 8
/// unanswered calls. Another caller's call is answered at once, on a connection of its own,
/// not after the read timeout.
#[tokio::test]
async fn one_callers_unanswered_calls_do_not_take_the_upstreams_streams_from_another() {
    let f = Fixture::start().await;
    let slow = slow_upstream_holding(8, b"greedy").await;
    let upstream = Upstream::new(
        &format!("http://{}", slow.addr),
        upstream::UpstreamTls::default(),
        upstream::UpstreamProtocol::Auto,
        READ_TIMEOUT,
    )
    .unwrap();
    let gate = serve_with_upstream(&f, upstream).await;
    let greedy = hold_calls(&f, gate, &slow, "greedy", 8).await;
    let other = f.driver("team-a", "evaljob-sample");
    let started = Instant::now();
    let answer = send_with(
        gate,
        f.client_tls(Some(&other), true, &[&rustls::version::TLS13]),
        update_status("evaljob-sample", "team-a"),
    )
    .await;
    assert_eq!(answer.grpc().0, "0", "{:?}", answer.grpc());
    assert!(started.elapsed() < READ_TIMEOUT, "answered in {:?}, not after waiting for a stream", started.elapsed());
    slow.release.notify_waiters();
    for call in greedy {
        let _ = tokio::time::timeout(EVENT_TIMEOUT, call).await;
    }
}

#[tokio::test]
async fn a_held_call_waits_for_a_stream_of_the_upstream_only_so_long() {
    let f = Fixture::start().await;
    let slow = slow_upstream(1).await;
    let upstream = Upstream::new(
        &format!("http://{}", slow.addr),
        upstream::UpstreamTls::default(),
        upstream::UpstreamProtocol::Auto,
        READ_TIMEOUT,
    )
    .unwrap();
    let gate = serve_with_upstream(&f, upstream).await;
    // One stream on each of the connections the gate opens: every one taken.
    let connections = super::super::held_h2::MAX_CONNECTIONS;
    let holding = hold_calls(&f, gate, &slow, "evaljob-sample", connections).await;
    let second = f.driver("team-a", "other-job");
    let started = Instant::now();
    let answer = send_with(
        gate,
        f.client_tls(Some(&second), true, &[&rustls::version::TLS13]),
        update_status("other-job", "team-a"),
    )
    .await;
    let (status, message) = answer.grpc();
    assert_eq!(status, "14", "{message}");
    assert!(started.elapsed() >= READ_TIMEOUT && started.elapsed() < EVENT_TIMEOUT);
    assert!(f.gate.shared.encode().contains("keyward_gate_upstream_errors_total 1"));
    slow.release.notify_waiters();
    for call in holding {
        let _ = tokio::time::timeout(EVENT_TIMEOUT, call).await;
    }
}

/// One request over a new connection with `config` (h2 when its ALPN says so).
async fn send_with(addr: SocketAddr, config: rustls::ClientConfig, request: Request<Full<Bytes>>) -> Answer {
    let h2 = config.alpn_protocols.first().is_some_and(|p| p == b"h2");
    let tcp = TcpStream::connect(addr).await.unwrap();
    let stream =
        TlsConnector::from(Arc::new(config)).connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
    exchange(stream, h2, request).await.unwrap()
}

// === 7. A certificate caller's token, route overrides, where-from ===

#[tokio::test]
async fn a_certificate_callers_token_and_the_callers_route_and_where_from_headers_never_pass() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    let attack = "GET /apis/v1/namespaces/team-a/runs/r1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: Bearer someone-elses-token\r\nX-Original-URL: /apis/v1/namespaces/team-b/runs/r1\r\nX-Rewrite-URL: /admin\r\nX-HTTP-Method-Override: DELETE\r\nX-Forwarded-For: 10.9.9.9\r\nX-Forwarded-Host: evil.example\r\nX-Forwarded-Proto: http\r\nForwarded: for=10.9.9.9\r\nX-Real-IP: 10.9.9.9\r\n\r\n";
    let answer = raw_http1(&f, Some(&driver), attack).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    for gone in ["authorization", "x-original-url", "x-rewrite-url", "x-http-method-override", "forwarded", "x-real-ip"]
    {
        assert!(received(&f, 0, gone).is_empty(), "{gone}");
    }
    assert_eq!(received(&f, 0, "x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(received(&f, 0, "x-forwarded-proto"), ["https"]);
    assert_eq!(received(&f, 0, "x-forwarded-host"), ["localhost"]);

    // A rule may pass a certificate caller's token on.
    let forwarding = GATE.replace(
        "    - name: runs in the caller's namespace\n",
        "    - name: runs in the caller's namespace\n      forwardAuthorization: true\n",
    );
    let f = Fixture::start_with(&forwarding).await;
    let driver = f.driver("team-a", "evaljob-sample");
    let answer = raw_http1(&f, Some(&driver), attack).await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert_eq!(received(&f, 0, "authorization"), ["Bearer someone-elses-token"]);
}

// === 8. Reviews of made-up tokens are bounded ===

#[tokio::test]
async fn one_source_has_at_most_a_few_token_reviews_in_flight() {
    let api = FakeApi::new();
    api.set_mode(Mode::Hang);
    let shared = Arc::new(crate::metrics::Metrics::default());
    let reviews = Arc::new(reviews::Reviews::new(
        api.client(),
        Duration::from_secs(30),
        Arc::new(GateMetrics::new(shared.clone())),
    ));
    let audiences = ["pipelines.kubeflow.org".to_string()];
    let limit = reviews::MAX_TOKEN_REVIEWS_PER_SOURCE;
    let source: std::net::IpAddr = "10.0.0.1".parse().unwrap();
    let mut hung = Vec::new();
    for i in 0..limit {
        let (reviews, audiences) = (reviews.clone(), audiences.clone());
        hung.push(tokio::spawn(async move { reviews.token(&format!("made-up-{i}"), &audiences, Some(source)).await }));
    }
    while api.counts().0 < limit {
        tokio::task::yield_now().await;
    }
    // A made-up token more from the same source is refused without asking; another source asks.
    let refused = reviews.token("made-up-more", &audiences, Some(source)).await;
    assert_eq!(
        refused.unwrap_err(),
        reviews::TokenRefused::Unavailable(format!(
            "{limit} TokenReviews for tokens from 10.0.0.1 are in flight already: retry once they are answered"
        ))
    );
    let other = tokio::spawn({
        let (reviews, audiences) = (reviews.clone(), audiences.clone());
        async move { reviews.token("made-up-elsewhere", &audiences, Some("10.0.0.2".parse().unwrap())).await }
    });
    while api.counts().0 < limit + 1 {
        tokio::task::yield_now().await;
    }
    api.set_mode(Mode::Answer);
    for call in hung {
        assert!(matches!(call.await.unwrap(), Err(reviews::TokenRefused::Rejected(_))));
    }
    assert!(matches!(other.await.unwrap(), Err(reviews::TokenRefused::Rejected(_))));
    // Answered, the source may ask again.
    assert!(matches!(
        reviews.token("made-up-later", &audiences, Some(source)).await,
        Err(reviews::TokenRefused::Rejected(_))
    ));
    assert_eq!(api.counts().0, limit + 2);
    assert!(shared.encode().contains("keyward_gate_reviews_total{review=\"token\",result=\"throttled\"} 1"));
}
