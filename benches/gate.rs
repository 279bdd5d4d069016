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
//! Run: `cargo bench --bench gate` (or `scripts/bench.sh`). Knobs: KEYWARD_BENCH_SECONDS (default
//! 10 per fixed-rate run), KEYWARD_BENCH_RATE (default 1000 requests/s),
//! KEYWARD_BENCH_NEW_CONNECTIONS (default 1000).
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

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
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

// === the client ===

#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
}

impl Target {
    fn new(addr: SocketAddr, ca_pem: &str, identity: Option<&Minted>, h2: bool) -> Self {
        let mut tls = client_config(ca_pem.as_bytes(), identity, if h2 { b"h2" } else { b"http/1.1" });
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

/// `rate` requests a second over the connections for `seconds`, each timed from when it was
/// sent (a slow answer still delays the next request of its connection); returns the sorted
/// latencies and the failures.
async fn fixed_rate(target: &Target, call: &Call, rate: f64, seconds: usize) -> (Vec<Duration>, usize) {
    let per_connection = Duration::from_secs_f64(CONNECTIONS as f64 / rate);
    let count = (rate as usize * seconds) / CONNECTIONS;
    let mut conns = Vec::new();
    for _ in 0..CONNECTIONS {
        conns.push(target.connect().await);
    }
    // Warm each connection (and the gate's review cache) first.
    for c in &mut conns {
        assert!(c.send(call).await, "the warm-up request was not answered as expected");
    }
    let start = Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::new();
    for (i, mut conn) in conns.into_iter().enumerate() {
        let call = call.clone();
        let offset = per_connection.mul_f64(i as f64 / CONNECTIONS as f64);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(count);
            let mut failures = 0;
            for n in 0..count {
                let due = start + offset + per_connection * n as u32;
                tokio::time::sleep_until(due).await;
                let sent = Instant::now();
                if !conn.send(&call).await {
                    failures += 1;
                }
                // From when it was sent: tokio's timer wakes up to a millisecond after `due`,
                // the same for floor and gate, and that lag would swamp what the gate adds.
                latencies.push(Instant::now() - sent);
            }
            (latencies, failures)
        }));
    }
    let mut all = Vec::new();
    let mut failures = 0;
    for t in tasks {
        let (l, f) = t.await.unwrap();
        all.extend(l);
        failures += f;
    }
    all.sort();
    (all, failures)
}

/// One measured run: latencies, and server CPU seconds per request of each of `pids`.
async fn measure(
    target: &Target,
    call: &Call,
    pids: &[u32],
    rate: f64,
    seconds: usize,
) -> (Duration, Duration, Vec<f64>) {
    let before: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    let (latencies, failures) = fixed_rate(target, call, rate, seconds).await;
    let after: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    assert_eq!(failures, 0, "requests not answered as expected");
    let requests = (latencies.len() + CONNECTIONS) as f64;
    let per_request = before.iter().zip(&after).map(|(b, a)| (a - b) / requests).collect();
    (percentile(&latencies, 0.5), percentile(&latencies, 0.99), per_request)
}

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

    println!("keyward gate against its floor (the client to the upstream directly over TLS), {rate} req/s, {CONNECTIONS} connections, {seconds} s a run");
    println!("| path | p50 floor | p50 gate | p99 floor | p99 gate | added p99 | CPU/request floor | CPU/request gate + upstream | ratio |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let cases = [
        ("HTTP/1.1, client certificate", &http, false, true),
        ("gRPC unary (HTTP/2), client certificate, field rule", &grpc, true, true),
        ("HTTP/1.1, bearer token (TokenReview cached)", &token, false, false),
    ];
    for (name, call, h2, with_cert) in cases {
        let floor = Target::new(upstream.secure, &upstream.ca_pem, None, h2);
        let through = Target::new(gate.endpoint.addr, &gate_ca, with_cert.then_some(&driver), h2);
        // Warm both (allocators, caches), then measure the floor and the gate in turn.
        let _ = measure(&floor, call, &pids_floor, rate, 1).await;
        let _ = measure(&through, call, &pids_gate, rate, 1).await;
        let (fp50, fp99, fcpu) = measure(&floor, call, &pids_floor, rate, seconds).await;
        let (gp50, gp99, gcpu) = measure(&through, call, &pids_gate, rate, seconds).await;
        let (fcpu, gcpu) = (fcpu[0], (gcpu[0], gcpu[1]));
        println!(
            "| {name} | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.1} µs | {:.1} + {:.1} µs | {:.2}× |",
            us(fp50),
            us(gp50),
            us(fp99),
            us(gp99),
            us(gp99.saturating_sub(fp99)),
            fcpu * 1e6,
            gcpu.0 * 1e6,
            gcpu.1 * 1e6,
            (gcpu.0 + gcpu.1) / fcpu
        );
    }
    let floor = Target::new(upstream.secure, &upstream.ca_pem, None, false);
    let through = Target::new(gate.endpoint.addr, &gate_ca, Some(&driver), false);
    let f = new_connections(&floor, &http, &pids_floor, new).await;
    let g = new_connections(&through, &http, &pids_gate, new).await;
    println!();
    println!(
        "new TLS connection + one HTTP/1.1 request ({new} each): floor {:.0} µs CPU, gate+upstream {:.0} µs (client certificate verified), {:.2}×",
        f * 1e6,
        g * 1e6,
        g / f
    );
}
