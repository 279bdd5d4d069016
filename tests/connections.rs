//! Connection limits, against the real binary over real TLS: clients that connect and say
//! nothing, keep-alive connections left idle, the connection cap, a process with few file
//! descriptors, and the metrics port. Each test waits on the server's own action (a close, a
//! response, a metric, a log line). Durations are checked only as lower bounds (a loaded
//! machine makes an action late, never early); which timeout fired is told by the server's
//! close-reason metric, not by the clock.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// The HTTP/2 client preface followed by an empty SETTINGS frame.
const H2_PREFACE_AND_SETTINGS: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Reads until the server closes the connection; returns when that was and what arrived.
async fn until_closed<S: AsyncRead + Unpin>(stream: &mut S) -> (Duration, Vec<u8>) {
    let started = Instant::now();
    let mut buf = Vec::new();
    // A TLS stream closed without close_notify reads as an error: closed all the same.
    let read = tokio::time::timeout(EVENT_TIMEOUT, stream.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the server kept the connection open for {EVENT_TIMEOUT:?}");
    (started.elapsed(), buf)
}

async fn until_closed_owned(mut stream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> (Duration, Vec<u8>) {
    until_closed(&mut stream).await
}

/// The HTTP/2 frame types in `bytes` (after the server's preface-less start).
fn h2_frame_types(mut bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    while bytes.len() >= 9 {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        types.push(bytes[3]);
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    types
}

const GOAWAY: u8 = 0x7;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_say_nothing_after_the_handshake_are_closed_at_the_first_request_deadline() {
    let tls = TlsDir::new();
    let server = tls.start(&["--request-read-timeout", "1s", "--http2"]);
    let mut h1 = server.raw_tls_alpn(b"http/1.1").await;
    let mut h2 = server.raw_tls_alpn(b"h2").await;
    h2.write_all(H2_PREFACE_AND_SETTINGS).await.unwrap();
    let ((h1_took, h1_bytes), (h2_took, h2_bytes)) = tokio::join!(until_closed(&mut h1), until_closed(&mut h2));
    for (what, took) in [("http/1.1", h1_took), ("h2", h2_took)] {
        assert!(took >= Duration::from_millis(900), "{what}: closed after {took:?}, before the 1s deadline");
    }
    assert!(h1_bytes.is_empty(), "{}", String::from_utf8_lossy(&h1_bytes));
    assert!(h2_frame_types(&h2_bytes).contains(&GOAWAY), "h2 is told to go away first: {h2_bytes:?}");
    let sample = "keyward_connections_closed_by_server_total{listener=\"webhook\",reason=\"first-request-timeout\"}";
    server.wait_metric(sample, 2.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_connections_get_the_idle_timeout_and_started_requests_the_header_timeout() {
    let tls = TlsDir::new();
    let server = tls.start(&["--request-read-timeout", "1s", "--idle-timeout", "3s"]);
    let request = format!("GET /healthz HTTP/1.1\r\nhost: {SERVER_NAME}\r\n\r\n");

    // One request, then silence: the connection lives for the idle timeout, not the 1 s that a
    // connection which never sent a request gets.
    let mut stream = server.raw_tls().await;
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = vec![0u8; 512];
    let n = stream.read(&mut response).await.unwrap();
    assert!(String::from_utf8_lossy(&response[..n]).ends_with("\r\n\r\nok\n"));
    let (took, rest) = until_closed(&mut stream).await;
    assert!(took >= Duration::from_millis(2900), "closed after {took:?}, before the 3s idle timeout");
    assert!(rest.is_empty());

    // One request, then half of the next one's headers: the header timeout applies from the
    // first byte, whatever the idle timeout.
    let mut stream = server.raw_tls().await;
    stream.write_all(request.as_bytes()).await.unwrap();
    let n = stream.read(&mut response).await.unwrap();
    assert!(String::from_utf8_lossy(&response[..n]).starts_with("HTTP/1.1 200"));
    stream.write_all(b"POST /mutate HTTP/1.1\r\nhost: keyward\r\n").await.unwrap();
    let (took, _) = until_closed(&mut stream).await;
    assert!(took >= Duration::from_millis(900), "closed after {took:?}, before the 1s header timeout");
    // The first was closed as idle, the second for its headers (not as idle, though its
    // connection had been idle before).
    let closed = |reason: &str| {
        format!("keyward_connections_closed_by_server_total{{listener=\"webhook\",reason=\"{reason}\"}}")
    };
    server.wait_metric(&closed("idle"), 1.0).await;
    server.wait_metric(&closed("header-timeout"), 1.0).await;
    assert_eq!(server.metric(&closed("idle")).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_an_idle_connection_makes_room_for_a_real_client() {
    let tls = TlsDir::new();
    // Long timeouts: only the cap can close these connections.
    let server = tls.start(&["--max-connections", "4", "--request-read-timeout", "60s"]);
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(server.raw_tls().await);
    }
    let (mut client, _) = server.connect().await.unwrap();
    let response = client.mutate(&fixture("admissionreview-lmeval.json")).await.unwrap();
    assert_eq!(response["response"]["allowed"], true);
    // The connection idle the longest (the first) made room.
    let (_, bytes) = until_closed(&mut idle[0]).await;
    assert!(bytes.is_empty());
    server
        .wait_metric("keyward_connections_closed_by_server_total{listener=\"webhook\",reason=\"evicted\"}", 1.0)
        .await;
    server.wait_metric("keyward_open_connections{listener=\"webhook\"}", 4.0).await;
    // The others are still open: a request on one of them is served.
    let stream = idle.pop().unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("/readyz")
        .header("host", SERVER_NAME)
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())
        .unwrap();
    assert_eq!(send.send_request(req).await.unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_half_sent_request_makes_room_and_the_newcomer_is_answered() {
    let tls = TlsDir::new();
    let server = tls.start(&["--max-connections", "2", "--request-read-timeout", "60s"]);
    let review = fixture("admissionreview-lmeval.json");
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: {SERVER_NAME}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        review.len()
    );
    // Two requests whose bodies are half sent: both connections are reading, none answering.
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut stream = server.raw_tls().await;
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&review[..review.len() / 2]).await.unwrap();
        stream.flush().await.unwrap();
        slow.push(stream);
    }
    server.wait_metric("keyward_requests_in_flight{listener=\"webhook\"}", 2.0).await;
    // A third client, as the apiserver: the slower of the two is dropped for it.
    let (mut client, _) = server.connect().await.unwrap();
    assert_eq!(client.mutate(&review).await.unwrap()["response"]["allowed"], true);
    server
        .wait_metric("keyward_connections_closed_by_server_total{listener=\"webhook\",reason=\"evicted\"}", 1.0)
        .await;
    assert_eq!(server.metric("keyward_connections_refused_total{listener=\"webhook\"}").await, 0.0);
    // The first one was the one waiting longest: it was cut; the other may still finish.
    let (first, second) = (slow.remove(0), slow.remove(0));
    let (_, cut) = until_closed_owned(first).await;
    assert!(cut.is_empty(), "the evicted connection got an answer: {}", String::from_utf8_lossy(&cut));
    let mut second = second;
    second.write_all(&review[review.len() / 2..]).await.unwrap();
    let mut response = vec![0u8; 16];
    second.read_exact(&mut response).await.unwrap();
    assert_eq!(&response, b"HTTP/1.1 200 OK\r");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_few_file_descriptors_idle_floods_neither_spin_nor_flood_the_log_nor_stop_service() {
    let tls = TlsDir::new();
    let mut server =
        Server::start_with_open_files(256, &["--tls-dir", tls.path()], tls.ca.cert_pem().as_bytes().to_vec());
    let lowered = server
        .seen(|v| v["message"].as_str().is_some_and(|m| m.starts_with("the open-files limit is too low")))
        .cloned()
        .unwrap();
    let (webhook_cap, metrics_cap) =
        (lowered["max_connections"].as_u64().unwrap(), lowered["metrics_max_connections"].as_u64().unwrap());
    assert_eq!(webhook_cap + metrics_cap, 256 - 64 - 16, "{lowered}");
    let logged_before = server.all_logs().len();

    // Far more idle clients than descriptors: each completes its handshake and says nothing.
    let mut idle = Vec::new();
    for i in 0..400 {
        let stream = server.try_raw_tls_alpn(b"http/1.1").await.unwrap_or_else(|e| panic!("client {i}: {e}"));
        idle.push(stream);
    }
    // A real client is served in the middle of the flood.
    let (mut client, _) = server.connect().await.unwrap();
    assert_eq!(client.mutate(&fixture("admissionreview-lmeval.json")).await.unwrap()["response"]["allowed"], true);
    let open = server.metric("keyward_open_connections{listener=\"webhook\"}").await;
    assert!(open <= webhook_cap as f64 + 16.0, "{open} connections open, cap {webhook_cap}");
    // Room is made before a descriptor runs out: no accept ever failed, so none was retried in
    // a loop (the spin this test once measured in CPU time).
    assert_eq!(server.metric("keyward_accept_errors_total{listener=\"webhook\"}").await, 0.0);

    // The load goes; service goes on.
    drop(idle);
    drop(client);
    let (mut client, _) = server.connect().await.unwrap();
    assert_eq!(client.mutate(&fixture("admissionreview-lmeval.json")).await.unwrap()["response"]["allowed"], true);
    let logged = server.all_logs().len() - logged_before;
    // Two decisions, and nothing per connection (evictions are counted, not logged).
    assert!(logged <= 10, "{logged} log lines: {:?}", &server.all_logs()[logged_before..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_port_times_out_silent_and_slow_clients_too() {
    let tls = TlsDir::new();
    let server = tls.start(&["--request-read-timeout", "1s"]);
    let mut silent = tokio::net::TcpStream::connect(server.metrics).await.unwrap();
    let mut slow = tokio::net::TcpStream::connect(server.metrics).await.unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nhost: metrics\r\n").await.unwrap();
    let ((silent_took, _), (slow_took, _)) = tokio::join!(until_closed(&mut silent), until_closed(&mut slow));
    for (what, took) in [("silent", silent_took), ("slow", slow_took)] {
        assert!(took >= Duration::from_millis(900), "{what}: closed after {took:?}");
    }
    // Neither sent a whole request: both had the first-request deadline.
    let sample = "keyward_connections_closed_by_server_total{listener=\"metrics\",reason=\"first-request-timeout\"}";
    server.wait_metric(sample, 2.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_over_the_limit_gets_413_at_once() {
    let tls = TlsDir::new();
    // A long read timeout: a 413 that waited for the body would not come within EVENT_TIMEOUT.
    let server = tls.start(&["--request-read-timeout", "300s"]);
    let mut stream = server.raw_tls().await;
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: {SERVER_NAME}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        8 * 1024 * 1024
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(EVENT_TIMEOUT, stream.read(&mut buf)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.ends_with("body of 8388608 bytes is over the 7340032-byte limit\n"), "{text}");
}
