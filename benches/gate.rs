//! What `keyward gate` adds, against a floor in the same run: the client talking to the
//! upstream directly over TLS. The upstream (this binary in upstream mode, a separate process)
//! answers every request with a short body (a gRPC message and `grpc-status: 0` for gRPC) on a
//! TLS port (the floor) and a plain loopback port (behind the gate, as in a sidecar). The real
//! `keyward gate` runs as its own process with a client CA, a gate file and, for tokens, a
//! fake API server in this process that accepts one token (the gate caches the review).
//!
//! Measured at a fixed rate over 16 keep-alive connections (each request timed from when it
//! was sent, so the client's timer lag is left out): p50 and p99, and server CPU per request (the upstream's alone for the floor; the
//! gate's and the upstream's for the gated path), for HTTP/1.1 with a client certificate,
//! gRPC (HTTP/2, unary, a field rule) with a client certificate, and HTTP/1.1 with a bearer
//! token; then CPU per new TLS connection (one request each).
//!
//! Beside the gate, the proxies a platform engineer would put there instead, in front of the same
//! upstream with the same certificate, client CA and TLS 1.3 cipher (TLS_AES_128_GCM_SHA256, the
//! only one the client offers, as benches/peers pins it for the proxies; benches/peers: nginx and
//! HAProxy from Debian's packages, one worker each, in the foreground, client certificates
//! verified, keep-alive to the upstream): each measured at the fixed rate and at saturation (16
//! connections sending back to back), interleaved with the gate and the floor, and per new
//! connection. Latency is from each request's scheduled send time (the client's timer lag,
//! the same for every target, is printed beside it).
//!
//! Every target is measured in `KEYWARD_BENCH_ROUNDS` interleaved rounds (default 3), each round
//! starting one target further on; the tables give the median with the lowest and highest, and
//! the last one says in how many rounds the gate was at most both proxies: on a VM whose speed
//! moves by a third within an hour, one run's verdict near 1.0× is a coin toss.
//!
//! Run: `cargo bench --bench gate` (or `scripts/bench.sh`). Knobs: KEYWARD_BENCH_SECONDS (default
//! 10 per fixed-rate run), KEYWARD_BENCH_ROUNDS (default 3), KEYWARD_BENCH_RATE (default 1000 requests/s),
//! KEYWARD_BENCH_NEW_CONNECTIONS (default 1000), KEYWARD_BENCH_PEERS=0 (the gate and the floor
//! only, without nginx and HAProxy), KEYWARD_BENCH_ONLY=gate|nginx|haproxy:http|grpc|token|connect
//! with `:saturated` after http, grpc or token to saturate instead (after a warm-up, only that
//! proxy on that case at the fixed rate, saturated, or its new connections: what a profile of
//! one case records).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the benchmark failure report

#[path = "../tests/support/mod.rs"]
mod support;

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use keyward_certs::pki::{Ca, Minted};
use rustls::pki_types::ServerName;
use support::*;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

const CONNECTIONS: usize = 16;

const GATE_FILE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: bench}
spec:
  trustDomain: cluster.local
  tokenReview: {audiences: [pipelines.kubeflow.org]}
  rules:
    - name: a driver updates only its own job
      grpc: {service: LMEvalJobUpdateService, methods: [UpdateStatus]}
      callers: {workloads: {kinds: [lmevaljob]}}
      when:
        - {caller: name, equals: {grpcField: 1}}
        - {caller: namespace, equals: {grpcField: 2}}
    - name: runs in the caller's namespace
      http: {methods: [GET], path: "/apis/v1/namespaces/{namespace}/runs/{run}"}
      callers:
        workloads: {kinds: [lmevaljob]}
        serviceAccounts: [{namespace: team-a, name: pipeline-runner}]
      when:
        - {caller: namespace, equals: {pathSegment: namespace}}
"#;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// (utime + stime) in seconds of a process.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / 100.0
}

/// Resident memory of a process now, in KiB: all of it (VmRSS), and its anonymous part
/// (RssAnon: heap and stacks, what no other process shares; the rest is mapped files, the
/// binary's own pages first, which the page cache shares and can drop).
fn rss_kib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("RssAnon:"))
}

/// How often any thread of a process went to sleep or was put aside (voluntary and
/// involuntary context switches, summed over `/proc/PID/task/*/status`). Per request, this is
/// the wake-ups a server pays for, which CPU time alone does not show. (`/proc/PID/io`'s
/// syscr/syscw would count system calls, but not recv/send, which std and HAProxy use.)
fn context_switches(pid: u32) -> f64 {
    let field = |text: &str, name: &str| -> f64 {
        text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    };
    let mut switches = 0.0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        switches += field(&status, "voluntary_ctxt_switches:") + field(&status, "nonvoluntary_ctxt_switches:");
    }
    switches
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// One target's figures in one round: at the fixed rate, then at saturation.
struct Run {
    p50: Duration,
    p99: Duration,
    /// CPU seconds per request at the fixed rate, of each of the target's processes.
    cpu: Vec<f64>,
    switches: f64,
    throughput: f64,
    saturated_cpu: Vec<f64>,
}

/// The order of `targets` targets in round `round`: each round starts one further on.
fn rotated(targets: usize, round: usize) -> Vec<usize> {
    (0..targets).map(|i| (i + round) % targets).collect()
}

fn median(figures: impl Iterator<Item = f64>) -> f64 {
    let mut sorted: Vec<f64> = figures.collect();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `figures` scaled, as "median (lowest–highest)", or the one figure of a single round.
fn spread(figures: &[f64], scale: f64, unit: &str) -> String {
    let m = median(figures.iter().map(|f| f * scale));
    if figures.len() < 2 {
        return format!("{m:.1} {unit}");
    }
    let low = figures.iter().copied().fold(f64::INFINITY, f64::min) * scale;
    let high = figures.iter().copied().fold(f64::NEG_INFINITY, f64::max) * scale;
    format!("{m:.1} {unit} ({low:.1}–{high:.1})")
}

// === the upstream (a separate process) ===

async fn upstream_server() {
    let tls = TlsDir::new();
    let pair = keyward_certs::pem::read_pair(tls.tmp.path()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Fixed(pair.key)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let secure = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!(
        "{} {} {}",
        secure.local_addr().unwrap(),
        plain.local_addr().unwrap(),
        tls.ca.cert_pem().replace('\n', "|")
    );
    tokio::spawn(async move {
        loop {
            let (tcp, _) = plain.accept().await.unwrap();
            let _ = tcp.set_nodelay(true);
            tokio::spawn(serve_upstream(TokioIo::new(tcp)));
        }
    });
    loop {
        let (tcp, _) = secure.accept().await.unwrap();
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else { return };
            serve_upstream(TokioIo::new(tls)).await;
        });
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn serve_upstream<I>(io: TokioIo<I>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(|req: hyper::Request<Incoming>| async move {
        let grpc = req.headers().get("content-type").is_some_and(|t| t == "application/grpc");
        let _ = req.into_body().collect().await;
        let response = if grpc {
            let message = keyward_gate::grpc::encode_strings(&[(1, "ok")]);
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            let frames = vec![Ok(Frame::data(Bytes::from(message))), Ok(Frame::trailers(trailers))];
            let body: Body = http_body_util::StreamBody::new(futures::stream::iter(frames)).boxed();
            hyper::Response::builder().header("content-type", "application/grpc").body(body).unwrap()
        } else {
            hyper::Response::new(Full::new(Bytes::from_static(b"ok\n")).boxed())
        };
        Ok::<_, Infallible>(response)
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).serve_connection(io, service).await;
}

#[derive(Debug)]
struct Fixed(Arc<rustls::sign::CertifiedKey>);

impl rustls::server::ResolvesServerCert for Fixed {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}

struct Upstream {
    child: Child,
    secure: SocketAddr,
    plain: SocketAddr,
    ca_pem: String,
}

impl Upstream {
    fn start() -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("KEYWARD_BENCH_UPSTREAM", "1")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let mut parts = line.trim().splitn(3, ' ');
        let secure = parts.next().unwrap().parse().unwrap();
        let plain = parts.next().unwrap().parse().unwrap();
        let ca_pem = parts.next().unwrap().replace('|', "\n");
        Self { child, secure, plain, ca_pem }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// === the fake API server: one token, reviewed once (the gate caches it) ===

async fn fake_api() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: hyper::Request<Incoming>| async move {
                    assert_eq!(req.uri().path(), "/apis/authentication.k8s.io/v1/tokenreviews");
                    let body: serde_json::Value =
                        serde_json::from_slice(&req.into_body().collect().await.unwrap().to_bytes()).unwrap();
                    let authenticated = body["spec"]["token"] == "runner-token";
                    let answer = serde_json::json!({
                        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": body["spec"],
                        "status": {"authenticated": authenticated, "audiences": ["pipelines.kubeflow.org"],
                                   "user": {"username": "system:serviceaccount:team-a:pipeline-runner", "groups": ["system:serviceaccounts"]}}
                    });
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(answer.to_string()))))
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
            });
        }
    });
    addr
}

// === the peers: nginx and HAProxy (benches/peers), in front of the same upstream ===

struct Peer {
    name: &'static str,
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Peer {
    /// `name` (nginx or haproxy) with its config of benches/peers, serving `tls` (tls.crt,
    /// tls.key), verifying client certificates against `client_ca`, in front of `upstream`.
    fn start(name: &'static str, tls: &std::path::Path, client_ca: &std::path::Path, upstream: SocketAddr) -> Peer {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let cert_and_key = dir.path().join("tls.pem");
        let (cert, key) = (tls.join("tls.crt"), tls.join("tls.key"));
        std::fs::write(
            &cert_and_key,
            format!("{}{}", std::fs::read_to_string(&cert).unwrap(), std::fs::read_to_string(&key).unwrap()),
        )
        .unwrap();
        let file = if name == "nginx" { "nginx.conf" } else { "haproxy.cfg" };
        let template = std::fs::read_to_string(format!("{}/benches/peers/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let config = template
            .replace("@DIR@", dir.path().to_str().unwrap())
            .replace("@LISTEN@", &addr.to_string())
            .replace("@UPSTREAM@", &upstream.to_string())
            .replace("@CERT_AND_KEY@", cert_and_key.to_str().unwrap())
            .replace("@CERT@", cert.to_str().unwrap())
            .replace("@KEY@", key.to_str().unwrap())
            .replace("@CLIENT_CA@", client_ca.to_str().unwrap());
        let path = dir.path().join(file);
        std::fs::write(&path, config).unwrap();
        let mut command = Command::new(tool_path(name));
        if name == "nginx" {
            command.arg("-e").arg(dir.path().join("nginx-startup.log")).arg("-c").arg(&path);
        } else {
            command.arg("-db").arg("-f").arg(&path);
        }
        let child = command.stdout(Stdio::null()).spawn().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(std::time::Instant::now() < deadline, "{name} did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(5));
        }
        Peer { name, child, addr, _dir: dir }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name` from the PATH (nginx and HAProxy are in /usr/sbin, which a user's PATH may lack).
fn tool_path(name: &str) -> String {
    for dir in ["/usr/sbin", "/usr/local/sbin", "/usr/bin"] {
        let path = format!("{dir}/{name}");
        if std::path::Path::new(&path).exists() {
            return path;
        }
    }
    panic!("benches/gate.rs needs {name} (apt-get install nginx-light haproxy; scripts/bench.sh installs them)")
}

// === the client ===

#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
}

impl Target {
    fn new(addr: SocketAddr, ca_pem: &str, identity: Option<&Minted>, h2: bool) -> Self {
        // The one TLS 1.3 suite the peers are configured with (benches/peers), and the one Go's
        // crypto/tls clients pick first on AES hardware: rustls' default order would otherwise
        // put TLS_AES_256_GCM_SHA384 first, and the gate and the floor would be measured
        // running a SHA-384 key schedule (no SHA-512 instructions on x86) that nginx and HAProxy
        // are not.
        let provider = rustls::crypto::CryptoProvider {
            cipher_suites: vec![rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256],
            ..rustls::crypto::ring::default_provider()
        };
        let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
        let mut tls = client_config_with(provider, ca_pem.as_bytes(), identity, alpn);
        // Every new connection a full handshake, to the floor as to the gate: the gate resumes
        // no session (a resumed one would skip verifying its client certificate again), and a
        // floor that resumed would be measured doing less work than a new client's first one.
        tls.resumption = rustls::client::Resumption::disabled();
        Self { addr, tls: Arc::new(tls) }
    }

    async fn connect(&self) -> Conn {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp)
            .await
            .unwrap();
        let io = TokioIo::new(tls);
        if self.tls.alpn_protocols[0] == b"h2" {
            let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.unwrap();
            tokio::spawn(conn);
            Conn::H2(sender)
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            Conn::H1(sender)
        }
    }
}

enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// One request to be sent again and again.
#[derive(Clone)]
struct Call {
    grpc: bool,
    path: &'static str,
    token: Option<&'static str>,
    body: Bytes,
}

impl Call {
    fn request(&self) -> hyper::Request<Full<Bytes>> {
        let mut r = hyper::Request::builder().uri(format!("https://{SERVER_NAME}{}", self.path));
        r = if self.grpc {
            r.method("POST").header("content-type", "application/grpc").header("te", "trailers")
        } else {
            r.method("GET").header("host", SERVER_NAME)
        };
        if let Some(token) = self.token {
            r = r.header("authorization", format!("Bearer {token}"));
        }
        r.body(Full::new(self.body.clone())).unwrap()
    }
}

impl Conn {
    /// Sends `call`; what was wrong when it was not answered as the upstream answers.
    async fn check(&mut self, call: &Call) -> Result<(), String> {
        let response = match self {
            Conn::H1(s) => s.send_request(call.request()).await,
            Conn::H2(s) => s.send_request(call.request()).await,
        };
        let response = response.map_err(|e| format!("{e:?}"))?;
        let status = response.status();
        let collected = response.into_body().collect().await.map_err(|e| format!("{status}: body: {e:?}"))?;
        let trailers = format!("{:?}", collected.trailers());
        let body = collected.to_bytes();
        match self.send_ok(call, status, &body, &trailers) {
            true => Ok(()),
            false => Err(format!("{status} {trailers} {:?}", String::from_utf8_lossy(&body))),
        }
    }

    fn send_ok(&self, call: &Call, status: http::StatusCode, body: &Bytes, trailers: &str) -> bool {
        status == 200 && if call.grpc { trailers.contains("\"grpc-status\": \"0\"") } else { body == "ok\n" }
    }

    /// Sends `call`; true when it was allowed and answered as the upstream answers.
    async fn send(&mut self, call: &Call) -> bool {
        let response = match self {
            Conn::H1(s) => s.send_request(call.request()).await,
            Conn::H2(s) => s.send_request(call.request()).await,
        };
        let Ok(response) = response else { return false };
        let ok = response.status() == 200;
        match response.into_body().collect().await {
            Ok(c) if call.grpc => ok && c.trailers().is_some_and(|t| t.get("grpc-status").is_some_and(|v| v == "0")),
            Ok(c) => ok && c.to_bytes() == "ok\n",
            Err(_) => false,
        }
    }
}

/// `rate` requests a second over the connections for `seconds`, each timed from its scheduled
/// send time (a request that waits behind a slow one counts the wait). One thread of its own
/// paces them with `std::thread::sleep` (tens of microseconds late, where tokio's millisecond
/// timer would add up to a millisecond to every figure) and hands each to its connection's
/// task. Returns the sorted latencies, the sorted lags (sent − scheduled) and the failures.
async fn fixed_rate(target: &Target, call: &Call, rate: f64, seconds: usize) -> (Vec<Duration>, Vec<Duration>, usize) {
    let per_connection = Duration::from_secs_f64(CONNECTIONS as f64 / rate);
    let count = (rate as usize * seconds) / CONNECTIONS;
    let mut conns = Vec::new();
    for _ in 0..CONNECTIONS {
        conns.push(target.connect().await);
    }
    // Warm each connection (and the gate's review cache) first.
    for c in &mut conns {
        if let Err(why) = c.check(call).await {
            panic!("the warm-up request was not answered as expected: {why}");
        }
    }
    let start = std::time::Instant::now() + Duration::from_millis(50);
    let mut senders = Vec::new();
    let mut tasks = Vec::new();
    for mut conn in conns {
        let call = call.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<std::time::Instant>();
        senders.push(tx);
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut lags) = (Vec::with_capacity(count), Vec::with_capacity(count));
            let mut failures = 0;
            while let Some(due) = rx.recv().await {
                let sent = std::time::Instant::now();
                if !conn.send(&call).await {
                    failures += 1;
                }
                latencies.push(std::time::Instant::now() - due);
                lags.push(sent - due);
            }
            (latencies, lags, failures)
        }));
    }
    let pacer = std::thread::spawn(move || {
        for n in 0..count {
            for (i, tx) in senders.iter().enumerate() {
                let due = start + per_connection * n as u32 + per_connection.mul_f64(i as f64 / CONNECTIONS as f64);
                if let Some(wait) = due.checked_duration_since(std::time::Instant::now()) {
                    std::thread::sleep(wait);
                }
                let _ = tx.send(due);
            }
        }
    });
    tokio::task::spawn_blocking(move || pacer.join().unwrap()).await.unwrap();
    let (mut all, mut all_lags) = (Vec::new(), Vec::new());
    let mut failures = 0;
    for t in tasks {
        let (l, lag, f) = t.await.unwrap();
        all.extend(l);
        all_lags.extend(lag);
        failures += f;
    }
    all.sort();
    all_lags.sort();
    (all, all_lags, failures)
}

/// 16 connections sending back to back for `seconds`: requests a second, and CPU seconds per
/// request of each of `pids`.
async fn saturate(name: &'static str, target: &Target, call: &Call, pids: &[u32], seconds: usize) -> (f64, Vec<f64>) {
    let mut conns = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut conn = target.connect().await;
        assert!(conn.send(call).await, "the warm-up request was not answered as expected");
        conns.push(conn);
    }
    let before: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    let started = Instant::now();
    let end = started + Duration::from_secs(seconds as u64);
    let mut tasks = Vec::new();
    for mut conn in conns {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = 0usize;
            while Instant::now() < end {
                if let Err(why) = conn.check(&call).await {
                    panic!("{name}: request {done} on a saturated connection was not answered as expected: {why}");
                }
                done += 1;
            }
            done
        }));
    }
    let mut requests = 0;
    for t in tasks {
        requests += t.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    let per_request = before.iter().zip(&after).map(|(b, a)| (a - b) / requests as f64).collect();
    (requests as f64 / elapsed, per_request)
}

/// One measured run: latencies, server CPU seconds per request of each of `pids`, and the
/// first one's context switches per request.
async fn measure(
    target: &Target,
    call: &Call,
    pids: &[u32],
    rate: f64,
    seconds: usize,
) -> (Duration, Duration, Vec<f64>, f64) {
    let before: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    let switches_before = context_switches(pids[0]);
    let (latencies, lags, failures) = fixed_rate(target, call, rate, seconds).await;
    let after: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    assert_eq!(failures, 0, "requests not answered as expected");
    let requests = (latencies.len() + CONNECTIONS) as f64;
    let per_request = before.iter().zip(&after).map(|(b, a)| (a - b) / requests).collect();
    LAG_P50_NS.store(percentile(&lags, 0.5).as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
    let switches = (context_switches(pids[0]) - switches_before) / requests;
    (percentile(&latencies, 0.5), percentile(&latencies, 0.99), per_request, switches)
}

/// The client's timer lag (sent − scheduled) at the median, of the last fixed-rate run.
static LAG_P50_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `count` new TLS connections one after the other, one request each: CPU seconds per
/// connection over `pids`.
async fn new_connections(target: &Target, call: &Call, pids: &[u32], count: usize) -> f64 {
    let before: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    for _ in 0..count {
        let mut conn = target.connect().await;
        assert!(conn.send(call).await);
    }
    let after: f64 = pids.iter().map(|p| cpu_seconds(*p)).sum();
    (after - before) / count as f64
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    if std::env::var_os("KEYWARD_BENCH_UPSTREAM").is_some() {
        return runtime.block_on(upstream_server());
    }
    runtime.block_on(run());
}

async fn run() {
    let seconds = env_or("KEYWARD_BENCH_SECONDS", 10);
    let rate = env_or("KEYWARD_BENCH_RATE", 1000) as f64;
    let new = env_or("KEYWARD_BENCH_NEW_CONNECTIONS", 1000);
    let rounds = env_or("KEYWARD_BENCH_ROUNDS", 3).max(1);

    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let tls = TlsDir::new();
    let client_ca = Ca::mint("keyward client CA", SystemTime::now(), DAY).unwrap();
    let driver = client_ca
        .issue_client_identity(
            &[(keyward_certs::DnType::CommonName, "evaljob-sample")],
            "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample",
            SystemTime::now(),
            DAY,
        )
        .unwrap();
    let ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, client_ca.cert_pem()).unwrap();
    let gate_file = dir.path().join("gate.yaml");
    std::fs::write(&gate_file, GATE_FILE).unwrap();
    let api = fake_api().await;
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!("apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"http://{api}\"}}}}]\nusers: [{{name: u, user: {{token: gate}}}}]\ncontexts: [{{name: c, context: {{cluster: fake, user: u}}}}]\ncurrent-context: c\n"),
    )
    .unwrap();
    std::env::set_var("KUBECONFIG", &kubeconfig);
    let upstream_url = format!("http://{}", upstream.plain);
    let gate = Server::start_gate(
        &[
            "--config",
            gate_file.to_str().unwrap(),
            "--upstream",
            &upstream_url,
            "--client-ca",
            ca_file.to_str().unwrap(),
            "--tls-dir",
            tls.path(),
            // Room for the memory section's clients, as a sidecar for that many would be set
            // (nginx's worker_connections and HAProxy's maxconn allow them too).
            "--max-connections",
            "4096",
        ],
        tls.ca.cert_pem().as_bytes().to_vec(),
        true,
    );
    let gate_ca = tls.ca.cert_pem().to_string();
    let pids_floor = [upstream.child.id()];
    let pids_gate = [gate.pid(), upstream.child.id()];

    let http = Call { grpc: false, path: "/apis/v1/namespaces/team-a/runs/r1", token: None, body: Bytes::new() };
    let grpc = Call {
        grpc: true,
        path: "/LMEvalJobUpdateService/UpdateStatus",
        token: None,
        body: Bytes::from(keyward_gate::grpc::encode_strings(&[(1, "evaljob-sample"), (2, "team-a"), (3, "Running")])),
    };
    let token = Call { token: Some("runner-token"), ..http.clone() };

    let with_peers = env_or("KEYWARD_BENCH_PEERS", 1) == 1;
    let peers: Vec<Peer> = if with_peers {
        ["nginx", "haproxy"].map(|name| Peer::start(name, tls.tmp.path(), &ca_file, upstream.plain)).into()
    } else {
        Vec::new()
    };
    let us1 = |seconds: f64| format!("{:.1} µs", seconds * 1e6);

    // For `scripts/profile.sh gate|nginx|haproxy CASE`: one proxy, one case, nothing else.
    if let Ok(only) = std::env::var("KEYWARD_BENCH_ONLY") {
        let (through, case) = only.split_once(':').unwrap_or((only.as_str(), "http"));
        let (case, saturated) = match case.strip_suffix(":saturated") {
            Some(case) => (case, true),
            None => (case, false),
        };
        let (addr, pid) = match through {
            "gate" => (gate.endpoint.addr, gate.pid()),
            peer => {
                let peer = peers.iter().find(|p| p.name == peer);
                let peer = peer
                    .unwrap_or_else(|| panic!("KEYWARD_BENCH_ONLY={only}: gate, or nginx or haproxy with the peers"));
                (peer.addr, peer.child.id())
            }
        };
        let (call, h2, with_cert) = match case {
            "http" | "connect" => (&http, false, true),
            "grpc" => (&grpc, true, true),
            "token" if through == "gate" => (&token, false, false),
            _ => panic!("KEYWARD_BENCH_ONLY={only}: the case is http, grpc, token (the gate only) or connect"),
        };
        let target = Target::new(addr, &gate_ca, with_cert.then_some(&driver), h2);
        let _ = measure(&target, call, &[pid], rate, 1).await;
        // The line a profiler waits for: from here on, only the measured run.
        println!("measuring pid {pid}");
        if case == "connect" {
            let own = new_connections(&target, call, &[pid], new).await;
            println!("only {only}: {} CPU per new connection ({new})", us1(own));
        } else if saturated {
            let (throughput, cpu) = saturate("the profiled proxy", &target, call, &[pid], seconds).await;
            println!(
                "only {only}: {} CPU per request at saturation, {throughput:.0} req/s for {seconds} s",
                us1(cpu[0])
            );
        } else {
            let (_, _, cpu, switches) = measure(&target, call, &[pid], rate, seconds).await;
            println!(
                "only {only}: {} CPU per request at {rate} req/s for {seconds} s, {switches:.2} context switches",
                us1(cpu[0])
            );
        }
        return;
    }

    println!("keyward gate against its floor (the client to the upstream directly over TLS) and the proxies one would put there instead, {rate} req/s, {CONNECTIONS} connections, {seconds} s a run; latency from each request's scheduled send time");
    println!();
    println!("| path | through | p50 | p99 | added p99 | CPU/request at {rate} req/s: proxy + upstream | CPU/request at saturation: proxy + upstream | requests/s at saturation |");
    println!("|---|---|---|---|---|---|---|---|");
    let cases = [
        ("HTTP/1.1, client certificate", &http, false, true),
        ("gRPC unary (HTTP/2), client certificate, field rule", &grpc, true, true),
        ("HTTP/1.1, bearer token (TokenReview cached)", &token, false, false),
    ];
    let mut lags = Vec::new();
    let mut wakeups = Vec::new();
    let mut verdicts = Vec::new();
    for (name, call, h2, with_cert) in cases {
        // The floor, the gate, then each peer (certificate cases only: neither reviews tokens).
        let mut targets: Vec<(&str, Target, Vec<u32>)> = vec![
            ("direct (floor)", Target::new(upstream.secure, &upstream.ca_pem, None, h2), pids_floor.to_vec()),
            (
                "keyward gate",
                Target::new(gate.endpoint.addr, &gate_ca, with_cert.then_some(&driver), h2),
                pids_gate.to_vec(),
            ),
        ];
        if with_cert {
            for peer in &peers {
                let target = Target::new(peer.addr, &gate_ca, Some(&driver), h2);
                targets.push((peer.name, target, vec![peer.child.id(), upstream.child.id()]));
            }
        }
        // Warm each (allocators, caches), then measure them in turn at the fixed rate and at
        // saturation, `rounds` times, each round starting from the next target: a slow minute
        // of the machine falls on every target alike rather than on one.
        for (_, target, pids) in &targets {
            let _ = measure(target, call, pids, rate, 1).await;
        }
        let mut runs: Vec<Vec<Run>> = targets.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            let order = rotated(targets.len(), round);
            for &i in &order {
                let (_, target, pids) = &targets[i];
                let (p50, p99, cpu, switches) = measure(target, call, pids, rate, seconds).await;
                lags.push(LAG_P50_NS.load(std::sync::atomic::Ordering::Relaxed));
                runs[i].push(Run { p50, p99, cpu, switches, throughput: 0.0, saturated_cpu: Vec::new() });
            }
            for &i in &order {
                let (through, target, pids) = &targets[i];
                let (throughput, cpu) = saturate(through, target, call, pids, seconds).await;
                if let Some(run) = runs[i].last_mut() {
                    (run.throughput, run.saturated_cpu) = (throughput, cpu);
                }
            }
        }
        let floor = &runs[0];
        for ((through, _, _), runs) in targets.iter().zip(&runs) {
            wakeups.push((name, *through, median(runs.iter().map(|r| r.switches))));
            let own = |cpu: fn(&Run) -> &[f64], component: usize| {
                let figures: Vec<f64> = runs.iter().map(|r| cpu(r)[component]).collect();
                spread(&figures, 1e6, "µs")
            };
            let (at_rate, at_saturation) = if runs[0].cpu.len() == 1 {
                (format!("— + {}", own(|r| &r.cpu, 0)), format!("— + {}", own(|r| &r.saturated_cpu, 0)))
            } else {
                (
                    format!("{} + {}", own(|r| &r.cpu, 0), own(|r| &r.cpu, 1)),
                    format!("{} + {}", own(|r| &r.saturated_cpu, 0), own(|r| &r.saturated_cpu, 1)),
                )
            };
            let added = if runs[0].cpu.len() == 1 {
                "—".to_string()
            } else {
                let added: Vec<f64> = runs.iter().zip(floor).map(|(r, f)| us(r.p99) - us(f.p99)).collect();
                spread(&added, 1.0, "µs")
            };
            println!(
                "| {name} | {through} | {:.0} µs | {:.0} µs | {added} | {at_rate} | {at_saturation} | {:.0} |",
                median(runs.iter().map(|r| us(r.p50))),
                median(runs.iter().map(|r| us(r.p99))),
                median(runs.iter().map(|r| r.throughput)),
            );
        }
        if with_cert && peers.len() == 2 {
            // Issue 45's rows: the gate's own CPU and added p99 against the better proxy.
            let gate_row = &runs[1];
            let peer_rows = &runs[2..];
            let per_round = |figure: &dyn Fn(&Run, &Run) -> f64| -> (Vec<f64>, Vec<Vec<f64>>) {
                let gate: Vec<f64> = gate_row.iter().zip(floor).map(|(r, f)| figure(r, f)).collect();
                let peers =
                    peer_rows.iter().map(|p| p.iter().zip(floor).map(|(r, f)| figure(r, f)).collect()).collect();
                (gate, peers)
            };
            verdicts.push((name, "own CPU per request at the fixed rate", per_round(&|r, _| r.cpu[0] * 1e6)));
            verdicts.push((name, "own CPU per request at saturation", per_round(&|r, _| r.saturated_cpu[0] * 1e6)));
            verdicts.push((name, "added p99 at the fixed rate", per_round(&|r, f| us(r.p99) - us(f.p99))));
        }
    }
    println!();
    println!("Each figure is the median of {rounds} interleaved rounds, with the lowest and highest in brackets.");
    println!();
    println!("context switches per request at {rate} req/s, all threads of the proxy (for the floor: of the upstream's own TLS server), median of the rounds:");
    println!();
    println!("| path | through | context switches |");
    println!("|---|---|---|");
    for (name, through, switches) in wakeups {
        println!("| {name} | {through} | {switches:.2} |");
    }
    lags.sort();
    println!();
    println!(
        "client timer lag (sent − scheduled) at the median of each run's median: {:.0} µs (the same for every target)",
        lags[lags.len() / 2] as f64 / 1e3
    );
    if !verdicts.is_empty() {
        println!();
        println!("the gate against the better of nginx and HAProxy (medians of {rounds} rounds; a round is met when the gate's figure is at most both proxies' in that round):");
        println!();
        println!("| case | figure | gate | nginx | HAProxy | gate / better | rounds met |");
        println!("|---|---|---|---|---|---|---|");
        for (name, figure, (gate, peers)) in verdicts {
            let gate_median = median(gate.iter().copied());
            let peer_medians: Vec<f64> = peers.iter().map(|p| median(p.iter().copied())).collect();
            let better = peer_medians.iter().copied().fold(f64::INFINITY, f64::min);
            let met = (0..gate.len()).filter(|&r| peers.iter().all(|p| gate[r] <= p[r])).count();
            // A ratio of p99s near or below the floor's says nothing: then only the rounds count.
            let ratio = if better > 1.0 { format!("{:.2}×", gate_median / better) } else { "—".to_string() };
            println!(
                "| {name} | {figure} | {gate_median:.1} µs | {:.1} µs | {:.1} µs | {ratio} | {met}/{} |",
                peer_medians[0],
                peer_medians[1],
                gate.len()
            );
        }
    }

    // New connections: a full TLS handshake with the client certificate verified, one request;
    // each proxy's own CPU, and the upstream's.
    let mut targets: Vec<(&str, Target, Vec<u32>)> = vec![
        ("direct (floor)", Target::new(upstream.secure, &upstream.ca_pem, None, false), pids_floor.to_vec()),
        ("keyward gate", Target::new(gate.endpoint.addr, &gate_ca, Some(&driver), false), pids_gate.to_vec()),
    ];
    for peer in &peers {
        targets.push((
            peer.name,
            Target::new(peer.addr, &gate_ca, Some(&driver), false),
            vec![peer.child.id(), upstream.child.id()],
        ));
    }
    println!();
    println!("new TLS connection + one HTTP/1.1 request ({new} each, one after the other, in {rounds} interleaved rounds), CPU per connection, median (lowest–highest):");
    let mut per_connection: Vec<Vec<f64>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for i in rotated(targets.len(), round) {
            let (_, target, pids) = &targets[i];
            per_connection[i].push(new_connections(target, &http, &pids[..1], new).await);
        }
    }
    for ((through, _, pids), figures) in targets.iter().zip(&per_connection) {
        println!(
            "- {through}: {}{}",
            spread(figures, 1e6, "µs"),
            if pids.len() > 1 { " (the proxy alone)" } else { " (the upstream's TLS server)" }
        );
    }
    if per_connection.len() == 4 {
        let gate = median(per_connection[1].iter().copied());
        let better = median(per_connection[2].iter().copied()).min(median(per_connection[3].iter().copied()));
        println!("- the gate / the better proxy: {:.2}×", gate / better);
    }

    // Memory, as a sidecar's limit must allow: each proxy's resident set with no client
    // connected (after everything above), and with OPEN clients connected at once, each with its
    // certificate verified and one request answered.
    let open = env_or("KEYWARD_BENCH_OPEN_CONNECTIONS", 1000);
    let proxies: Vec<(&str, Target, u32)> = targets.into_iter().skip(1).map(|(n, t, p)| (n, t, p[0])).collect();
    // Per proxy: (RSS, anonymous) with no client, then with `open` clients. One pass: no
    // allocator gives all of it back when the clients leave, so a second round would start
    // from the first one's high-water mark, not from no client.
    let mut idle: Vec<Vec<(f64, f64)>> = proxies.iter().map(|_| Vec::new()).collect();
    let mut loaded: Vec<Vec<(f64, f64)>> = proxies.iter().map(|_| Vec::new()).collect();
    for (i, (_, target, pid)) in proxies.iter().enumerate() {
        idle[i].push(rss_kib(*pid));
        let mut connections = Vec::with_capacity(open);
        for _ in 0..open {
            let mut conn = target.connect().await;
            assert!(conn.send(&http).await);
            connections.push(conn);
        }
        loaded[i].push(rss_kib(*pid));
        drop(connections);
    }
    println!();
    println!("resident memory of each proxy, with no client connected (after the runs above) and with {open} TLS clients connected at once (each with its certificate verified and one HTTP/1.1 request answered): all of it (VmRSS) and its anonymous part (RssAnon: heap and stacks; the rest is mapped files, which the page cache shares and can drop); one pass:");
    println!();
    println!("| through | RSS, no client | RSS, {open} clients | anonymous, no client | anonymous, {open} clients | anonymous per client |");
    println!("|---|---|---|---|---|---|");
    let mib = |kib: &[f64]| spread(kib, 1.0 / 1024.0, "MiB");
    let part = |runs: &[(f64, f64)], anon: bool| -> Vec<f64> {
        runs.iter().map(|(rss, a)| if anon { *a } else { *rss }).collect()
    };
    for ((through, _, _), (idle, loaded)) in proxies.iter().zip(idle.iter().zip(&loaded)) {
        let per_client: Vec<f64> = idle.iter().zip(loaded).map(|(i, l)| (l.1 - i.1) / open as f64).collect();
        println!(
            "| {through} | {} | {} | {} | {} | {} |",
            mib(&part(idle, false)),
            mib(&part(loaded, false)),
            mib(&part(idle, true)),
            mib(&part(loaded, true)),
            spread(&per_client, 1.0, "KiB")
        );
    }
    if proxies.len() == 3 {
        let ratio = |figures: &[Vec<(f64, f64)>], anon: bool| {
            let m = |i: usize| median(part(&figures[i], anon).into_iter());
            m(0) / m(1).min(m(2))
        };
        println!();
        println!(
            "- the gate / the better proxy: RSS {:.2}× with no client, {:.2}× with {open} clients; anonymous {:.2}× with no client, {:.2}× with {open} clients",
            ratio(&idle, false),
            ratio(&loaded, false),
            ratio(&idle, true),
            ratio(&loaded, true)
        );
    }
}
