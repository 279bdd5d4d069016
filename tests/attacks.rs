//! The webhook stays up for the apiserver whatever other clients do. Every pod creation in an
//! opted-in namespace waits on keyward (`failurePolicy: Fail`) and its port is reachable from
//! every pod, so under each attack below, run against the real binary, apiserver-like requests
//! (a fresh TLS connection, ALPN http/1.1, the whole AdmissionReview sent at once) must be
//! answered: at least 99 of 100 within a second, and `/healthz` too. The probes come from
//! 127.0.0.2 and the attacks from 127.0.0.1, as the apiserver's host and a pod are different
//! sources. Each attack runs only while its probes do, and stops with them.
//!
//! - HTTP/2 streams that never send their bodies, on as many connections as the cap allows
//!   (with `--http2`: the apiserver never offers h2, and without the flag it is not served);
//! - HTTP/1.1 bodies dripped a byte at a time by more clients than the cap, reconnecting when
//!   cut;
//! - large bodies sent up to 6 MiB and stalled, holding more than the 32 MiB body budget.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::StreamBody;
use hyper::body::Frame;
use support::*;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinSet;

/// The cap for these tests: small, so that the attacks fill it on a 2-core machine.
const CAP: &str = "48";
const CAP_N: usize = 48;

/// The apiserver's address in these tests: the attacks come from 127.0.0.1, as a pod's come
/// from the pod's address and the apiserver's from its own host.
const APISERVER: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 2);

/// Sends `n` apiserver-like admissions, each on a fresh connection, one after another; returns
/// how many were answered (200, allowed) within a second of starting to connect.
async fn probe(server: &Endpoint, n: usize) -> (usize, Vec<String>) {
    let review = fixture("admissionreview-lmeval.json");
    let mut answered = 0;
    let mut failures = Vec::new();
    for i in 0..n {
        let started = Instant::now();
        let attempt = tokio::time::timeout(Duration::from_secs(1), async {
            let (mut client, _) = server.connect_from(APISERVER).await?;
            client.mutate_allowed(&review).await
        })
        .await;
        match attempt {
            Ok(Ok(true)) => answered += 1,
            Ok(Ok(false)) => failures.push(format!("{i}: not allowed")),
            Ok(Err(e)) => failures.push(format!("{i}: {e} after {:?}", started.elapsed())),
            Err(_) => failures.push(format!("{i}: no answer within 1 s")),
        }
    }
    (answered, failures)
}

/// `/healthz` on a fresh connection, answered within a second.
async fn healthz(server: &Endpoint) -> bool {
    let check = async {
        let (mut client, _) = server.connect_from(APISERVER).await?;
        client.request("GET", "/healthz", Vec::new()).await
    };
    matches!(tokio::time::timeout(Duration::from_secs(1), check).await, Ok(Ok((200, _))))
}

/// Runs the probes while `attack` holds the server, and checks the outcome.
async fn under_attack(server: &Endpoint, attackers: Arc<AtomicUsize>, attack: JoinSet<()>) {
    // Wait until the attack has the connections it means to hold.
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while attackers.load(Ordering::Relaxed) < CAP_N * 3 / 4 {
        assert!(Instant::now() < deadline, "the attack never got going");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (answered, failures) = probe(server, 100).await;
    let health = healthz(server).await;
    drop(attack);
    assert!(answered >= 99, "{answered}/100 apiserver-like requests answered within 1 s: {failures:?}");
    assert!(health, "/healthz did not answer within 1 s");
}

/// Forever: connect, open HTTP/2 streams whose bodies never come (one more every 100 ms), and
/// reconnect when the server cuts the connection.
async fn h2_streams_without_bodies(server: Endpoint, connected: Arc<AtomicUsize>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(tcp) = tokio::net::TcpStream::connect(server.addr).await else { continue };
        let Ok(tls) = server
            .connector(&[b"h2"])
            .connect(rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap(), tcp)
            .await
        else {
            continue;
        };
        let Ok((mut send, conn)) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        else {
            continue;
        };
        let mut driver = tokio::spawn(conn);
        connected.fetch_add(1, Ordering::Relaxed);
        loop {
            let body = StreamBody::new(futures::stream::pending::<Result<Frame<Bytes>, Infallible>>());
            let request = hyper::Request::post("/mutate")
                .header("content-type", "application/json")
                .header("content-length", "4000")
                .body(body)
                .unwrap();
            if send.ready().await.is_err() {
                break;
            }
            let response = send.send_request(request);
            tokio::spawn(async move {
                let _ = response.await;
            });
            tokio::select! {
                _ = &mut driver => break,
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        connected.fetch_sub(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Forever: send a request's headers, then its body a byte every 200 ms; reconnect when cut.
async fn drip_body(server: Endpoint, connected: Arc<AtomicUsize>, stop: Arc<AtomicBool>) {
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: {SERVER_NAME}\r\ncontent-type: application/json\r\ncontent-length: 4000\r\n\r\n"
    );
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = server.try_raw_tls_alpn(b"http/1.1").await else { continue };
        if stream.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        connected.fetch_add(1, Ordering::Relaxed);
        for _ in 0..4000 {
            if stream.write_all(b" ").await.is_err() || stream.flush().await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        connected.fetch_sub(1, Ordering::Relaxed);
        // Cut: back in a moment (a client that reconnects in a tight loop attacks the CPU
        // with handshakes, which no connection policy can answer).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Forever: send 6 MiB of a 7 MiB body, stall; reconnect when cut.
async fn stalled_large_body(server: Endpoint, connected: Arc<AtomicUsize>, stop: Arc<AtomicBool>) {
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: {SERVER_NAME}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        7 * 1024 * 1024
    );
    let chunk = vec![b' '; 6 * 1024 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = server.try_raw_tls_alpn(b"http/1.1").await else { continue };
        if stream.write_all(head.as_bytes()).await.is_err() || stream.write_all(&chunk).await.is_err() {
            continue;
        }
        let _ = stream.flush().await;
        connected.fetch_add(1, Ordering::Relaxed);
        // Stalled: wait to be cut.
        let mut buf = [0u8; 1024];
        let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await;
        connected.fetch_sub(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn launch<F, Fut>(server: &Endpoint, clients: usize, attack: F) -> (Arc<AtomicUsize>, JoinSet<()>)
where
    F: Fn(Endpoint, Arc<AtomicUsize>, Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let connected = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    for _ in 0..clients {
        set.spawn(attack(server.clone(), connected.clone(), stop.clone()));
    }
    (connected, set)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_without_bodies_on_every_connection_keep_no_one_out() {
    let tls = TlsDir::new();
    let server = tls.start(&["--http2", "--max-connections", CAP]);
    let (connected, attack) = launch(&server, CAP_N, h2_streams_without_bodies);
    under_attack(&server, connected, attack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_http2_enabled_an_h2_client_is_not_served_it() {
    let tls = TlsDir::new();
    let server = tls.start(&[]);
    // Offering h2 and http/1.1, a client gets http/1.1; offering only h2, it is refused.
    let stream = server.try_raw_tls_alpn(b"http/1.1").await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let both = server
        .connector(&[b"h2", b"http/1.1"])
        .connect(rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(both.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let only_h2 = server.try_raw_tls_alpn(b"h2").await;
    assert!(only_h2.is_err(), "h2 was negotiated without --http2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_dripped_by_more_clients_than_the_cap_keep_no_one_out() {
    let tls = TlsDir::new();
    let server = tls.start(&["--max-connections", CAP]);
    let (connected, attack) = launch(&server, CAP_N + 24, drip_body);
    under_attack(&server, connected, attack).await;
    // The drippers made room by being evicted, not by the apiserver's requests being refused.
    let evicted =
        server.metric("keyward_connections_closed_by_server_total{listener=\"webhook\",reason=\"evicted\"}").await;
    assert!(evicted >= 1.0, "{evicted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_stalled_past_the_budget_keep_no_one_out() {
    let tls = TlsDir::new();
    let server = tls.start(&["--max-connections", CAP]);
    // Eight 6 MiB bodies: 48 MiB, more than the 32 MiB budget.
    let (connected, attack) = launch(&server, 8, stalled_large_body);
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while connected.load(Ordering::Relaxed) < 6 {
        assert!(Instant::now() < deadline, "the stalled bodies never got in");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (answered, failures) = probe(&server, 100).await;
    let health = healthz(&server).await;
    drop(attack);
    assert!(answered >= 99, "{answered}/100 apiserver-like requests answered within 1 s: {failures:?}");
    assert!(health, "/healthz did not answer within 1 s");
}
