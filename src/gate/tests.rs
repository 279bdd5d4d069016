//! The gate end to end, in process: its own TLS listener and connection rules on loopback, a
//! real upstream speaking HTTP/1.1 and HTTP/2 on one port (gRPC unary and server streaming,
//! with trailers), and a fake API server behind a real `kube::Client` that checks each
//! TokenReview's and SubjectAccessReview's method, path and body. Every wait is on an event
//! (a response, a closed socket) bounded only to turn a hang into a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use keyward_certs::pki::{Ca, Minted};
use keyward_certs::DnType;
use keyward_gate::grpc::encode_strings;
use keyward_gate::identity::ServiceAccount;
use keyward_gate::rules::Caller;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio_rustls::TlsConnector;

use super::*;
use crate::logging::LogFormat;

/// What a caller who knows HTTP and TLS sends the gate (issue 43).
mod attacks;

/// The controller tests' fake API server (lists, watches, 410 Gone, restarts, hangs, failures).
#[path = "../../controller/tests/support/mod.rs"]
mod kube_fake;
use crate::serve::{ListenerConfig, TlsSource};

const DAY: Duration = Duration::from_secs(86_400);
/// Only turns a hang into a failure.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);
/// The API server's own audience: a token asked about with no audience is checked for it.
const API_AUDIENCE: &str = "https://kubernetes.default.svc";
const REVIEW_TIMEOUT: Duration = Duration::from_millis(500);
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// LMEvalJob drivers (fms-lm-eval-service 38689a3, docs/research/lmeval-grpc-status.md: unary
/// `/LMEvalJobUpdateService/UpdateStatus`, JobStatus field 1 job_name, 2 job_namespace), a
/// KFP-style HTTP API with tokens for `pipelines.kubeflow.org`, an InferenceGraph-style route
/// decided by a SubjectAccessReview.
const GATE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: test}
spec:
  trustDomain: cluster.local
  stripHeaders: [kubeflow-userid]
  tokenReview: {audiences: [pipelines.kubeflow.org]}
  rules:
    - name: a driver updates only its own job
      grpc: {service: LMEvalJobUpdateService, methods: [UpdateStatus]}
      callers: {workloads: {kinds: [lmevaljob]}}
      when:
        - {caller: name, equals: {grpcField: 1}}
        - {caller: namespace, equals: {grpcField: 2}}
    - name: a driver watches its own job
      grpc: {service: LMEvalJobUpdateService, methods: [WatchStatus]}
      callers: {workloads: {kinds: [lmevaljob]}}
      when:
        - {caller: name, equals: {grpcField: 1}}
    - name: runs in the caller's namespace
      http: {methods: [GET, HEAD, POST], path: "/apis/v1/namespaces/{namespace}/runs/{run}"}
      callers:
        workloads: {kinds: [lmevaljob]}
        serviceAccounts: [{namespace: team-a, name: pipeline-runner}]
      when:
        - {caller: namespace, equals: {pathSegment: namespace}}
    - name: graph callers
      http: {path: "/graphs/{graph}/**"}
      callers: {anyServiceAccount: true}
      subjectAccessReview:
        verb: get
        group: serving.kserve.io
        resource: inferencegraphs
        namespace: "{caller.namespace}"
        name: "{path.graph}"
"#;

// === the fake API server ===

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Answer,
    Hang,
    Fail,
}

struct ApiState {
    /// token → (username, the audiences it is good for)
    tokens: HashMap<String, (String, Vec<String>)>,
    /// (user, namespace, name) allowed to get an inferencegraph
    graphs: Vec<(String, String, String)>,
    token_reviews: usize,
    access_reviews: usize,
    mode: Mode,
}

#[derive(Clone)]
struct FakeApi {
    state: Arc<Mutex<ApiState>>,
    changed: Arc<Notify>,
}

impl FakeApi {
    fn new() -> Self {
        let state = ApiState {
            tokens: HashMap::new(),
            graphs: Vec::new(),
            token_reviews: 0,
            access_reviews: 0,
            mode: Mode::Answer,
        };
        Self { state: Arc::new(Mutex::new(state)), changed: Arc::new(Notify::new()) }
    }

    fn client(&self) -> kube::Client {
        let api = self.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let api = api.clone();
            async move { Ok::<_, Infallible>(api.handle(req).await) }
        });
        kube::client::ClientBuilder::new(service, "default").build()
    }

    fn set_mode(&self, mode: Mode) {
        self.state.lock().unwrap().mode = mode;
        self.changed.notify_waiters();
    }

    fn counts(&self) -> (usize, usize) {
        let s = self.state.lock().unwrap();
        (s.token_reviews, s.access_reviews)
    }

    async fn handle(&self, req: Request<kube::client::Body>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let body: Value = serde_json::from_slice(&body.collect_bytes().await.unwrap()).unwrap();
        assert_eq!(parts.method, http::Method::POST, "reviews are created");
        let path = parts.uri.path().to_string();
        {
            let mut s = self.state.lock().unwrap();
            match path.as_str() {
                "/apis/authentication.k8s.io/v1/tokenreviews" => s.token_reviews += 1,
                "/apis/authorization.k8s.io/v1/subjectaccessreviews" => s.access_reviews += 1,
                other => panic!("the gate asked the API server for {other}"),
            }
        }
        loop {
            let changed = self.changed.notified();
            match self.state.lock().unwrap().mode {
                Mode::Answer => break,
                Mode::Fail => {
                    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500});
                    return Response::builder().status(500).body(Full::new(Bytes::from(status.to_string()))).unwrap();
                }
                Mode::Hang => {}
            }
            changed.await;
        }
        let s = self.state.lock().unwrap();
        let answer = if path.ends_with("tokenreviews") {
            assert_eq!(body["kind"], "TokenReview");
            let token = body["spec"]["token"].as_str().unwrap();
            let asked: Vec<String> = serde_json::from_value(body["spec"]["audiences"].clone()).unwrap_or_default();
            // The gate file's audiences: the KFP-style file's, or none (the API server's own, as
            // the inference-graph recipe asks).
            assert!(asked == ["pipelines.kubeflow.org"] || asked == ["ray.io"] || asked.is_empty(), "{asked:?}");
            match s.tokens.get(token) {
                // As the apiserver answers: the audiences asked for that the token is good for
                // (none asked: the API server's, API_AUDIENCE here).
                Some((user, good_for)) => {
                    let asked = if asked.is_empty() { vec![API_AUDIENCE.to_string()] } else { asked };
                    let both: Vec<&String> = good_for.iter().filter(|a| asked.contains(a)).collect();
                    if both.is_empty() {
                        json!({"status": {"authenticated": false, "error": "token audiences [\"other\"] is invalid for the target audiences"}})
                    } else {
                        json!({"status": {"authenticated": true, "audiences": both, "user": {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]}}})
                    }
                }
                None => json!({"status": {"authenticated": false, "error": "invalid bearer token"}}),
            }
        } else {
            assert_eq!(body["kind"], "SubjectAccessReview");
            let spec = &body["spec"];
            let attrs = &spec["resourceAttributes"];
            assert_eq!(
                (attrs["verb"].as_str(), attrs["group"].as_str(), attrs["resource"].as_str()),
                (Some("get"), Some("serving.kserve.io"), Some("inferencegraphs"))
            );
            assert!(spec["groups"].is_null(), "the user only, as the ODH router asks");
            let key = (
                spec["user"].as_str().unwrap().to_string(),
                attrs["namespace"].as_str().unwrap().to_string(),
                attrs["name"].as_str().unwrap().to_string(),
            );
            json!({"status": {"allowed": s.graphs.contains(&key)}})
        };
        let mut answer = answer;
        answer["apiVersion"] = body["apiVersion"].clone();
        answer["kind"] = body["kind"].clone();
        answer["spec"] = body["spec"].clone();
        Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(answer.to_string())))
            .unwrap()
    }
}

// === the upstream ===

type UpBody = BoxBody<Bytes, Infallible>;

/// Says what it saw: method, path, protocol, the identity headers, the body; gRPC calls get
/// that as their message (three messages for WatchStatus) and `grpc-status: 0` in trailers.
async fn upstream(req: Request<Incoming>, recorder: Recorder) -> Result<Response<UpBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let collected = body.collect().await.ok();
    let trailers = collected.as_ref().and_then(|c| c.trailers().cloned());
    let body = collected.map(|c| c.to_bytes()).unwrap_or_default();
    let header = |name: &str| {
        parts.headers.get_all(name).iter().map(|v| v.to_str().unwrap_or("?").to_string()).collect::<Vec<_>>().join(",")
    };
    let seen = format!(
        "{} {} {:?} user={} groups={} identity={} kubeflow-userid={} xfcc={} body={}",
        parts.method,
        parts.uri.path(),
        parts.version,
        header("x-remote-user"),
        header("x-remote-groups"),
        header("x-keyward-identity"),
        header("kubeflow-userid"),
        header("x-forwarded-client-cert"),
        body.len()
    );
    recorder.calls.lock().unwrap().push(seen.clone());
    recorder.seen.lock().unwrap().push(Seen { headers: parts.headers.clone(), trailers });
    if parts.headers.get("content-type").is_some_and(|t| t == "application/grpc") {
        let copies = if parts.uri.path().ends_with("/WatchStatus") { 3 } else { 1 };
        let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = Vec::new();
        for i in 0..copies {
            let message = encode_strings(&[(1, &format!("{i}: {seen}"))]);
            frames.push(Ok(Frame::data(Bytes::from(message))));
        }
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        frames.push(Ok(Frame::trailers(trailers)));
        let body = StreamBody::new(futures::stream::iter(frames)).boxed();
        return Ok(Response::builder().header("content-type", "application/grpc").body(body).unwrap());
    }
    Ok(Response::new(Full::new(Bytes::from(seen)).boxed()))
}

/// What the upstream received: a line a request ([`upstream`]'s), and each request's headers and
/// trailers whole.
#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<String>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

#[derive(Debug, Clone)]
struct Seen {
    headers: HeaderMap,
    trailers: Option<HeaderMap>,
}

/// The upstream on loopback: plain text, or TLS with `tls` (ALPN h2 and http/1.1).
async fn spawn_upstream(calls: Recorder, tls: Option<tokio_rustls::TlsAcceptor>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (calls, tls) = (calls.clone(), tls.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req| upstream(req, calls.clone()));
                let server = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = match tls {
                    Some(acceptor) => match acceptor.accept(tcp).await {
                        Ok(stream) => server.serve_connection(TokioIo::new(stream), service).await,
                        Err(_) => Ok(()),
                    },
                    None => server.serve_connection(TokioIo::new(tcp), service).await,
                };
            });
        }
    });
    addr
}

/// A TLS acceptor for `minted` (a serving certificate), offering h2 and http/1.1.
fn acceptor(minted: &Minted) -> tokio_rustls::TlsAcceptor {
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(minted.cert_pem.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(minted.key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

// === the gate under test ===

struct Fixture {
    addr: SocketAddr,
    /// The same gate without TLS (`--listen-plaintext`).
    plain: SocketAddr,
    server_ca: Ca,
    client_ca: Ca,
    api: FakeApi,
    calls: Recorder,
    gate_file: PathBuf,
    ca_file: PathBuf,
    gate: Gate,
    _dir: tempfile::TempDir,
    _stop: watch::Sender<bool>,
}

/// What came back: status, headers, body, trailers.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// `grpc-status` and `grpc-message`, from the trailers or (trailers-only) the headers.
    fn grpc(&self) -> (String, String) {
        let from = self.trailers.as_ref().filter(|t| t.contains_key("grpc-status")).unwrap_or(&self.headers);
        let get = |n: &str| from.get(n).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        (get("grpc-status"), get("grpc-message"))
    }

    /// The gRPC messages of the body, each as its field 1.
    fn messages(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = &self.body[..];
        while !rest.is_empty() {
            let message = keyward_gate::grpc::first_message(rest).unwrap();
            out.push(keyward_gate::grpc::string_field(message, 1).unwrap().unwrap_or_default().to_string());
            rest = &rest[5 + message.len()..];
        }
        out
    }
}

impl Fixture {
    async fn start() -> Self {
        Self::start_with(GATE).await
    }

    async fn start_with(gate_yaml: &str) -> Self {
        Self::start_full(gate_yaml, false, None).await
    }

    /// With `tls_upstream`, the upstream serves TLS (a certificate for `localhost` from the
    /// server CA) and the gate verifies it with `--upstream-ca`. With `kube`, the gate asks that
    /// API server instead of the review fake's.
    async fn start_full(gate_yaml: &str, tls_upstream: bool, kube: Option<kube::Client>) -> Self {
        Self::start_inner(gate_yaml, tls_upstream, kube, true).await
    }

    /// A gate whose `--client-ca` file is not there yet (an optional ConfigMap not published).
    async fn start_without_client_ca(gate_yaml: &str) -> Self {
        Self::start_inner(gate_yaml, false, None, false).await
    }

    async fn start_inner(gate_yaml: &str, tls_upstream: bool, kube: Option<kube::Client>, ca_published: bool) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let server_ca = Ca::mint("gate test server CA", now, DAY).unwrap();
        let leaf = server_ca.issue_serving(&["localhost".to_string()], now, DAY).unwrap();
        let tls = dir.path().join("tls");
        std::fs::create_dir(&tls).unwrap();
        std::fs::write(tls.join("tls.crt"), &leaf.cert_pem).unwrap();
        std::fs::write(tls.join("tls.key"), &leaf.key_pem).unwrap();
        let client_ca = Ca::mint("keyward client CA", now, DAY).unwrap();
        std::fs::create_dir(dir.path().join("client-ca")).unwrap();
        let ca_file = dir.path().join("client-ca/ca.crt");
        if ca_published {
            std::fs::write(&ca_file, client_ca.cert_pem()).unwrap();
        }
        std::fs::create_dir(dir.path().join("gate")).unwrap();
        let gate_file = dir.path().join("gate/gate.yaml");
        std::fs::write(&gate_file, gate_yaml).unwrap();
        let calls = Recorder::default();
        let upstream_tls =
            tls_upstream.then(|| acceptor(&server_ca.issue_serving(&["localhost".to_string()], now, DAY).unwrap()));
        let upstream = spawn_upstream(calls.clone(), upstream_tls).await;
        let upstream_ca = dir.path().join("upstream-ca.crt");
        std::fs::write(&upstream_ca, server_ca.cert_pem()).unwrap();
        let api = FakeApi::new();
        let config = GateConfig {
            config: gate_file.clone(),
            upstream: if tls_upstream {
                format!("https://localhost:{}", upstream.port())
            } else {
                format!("http://{upstream}")
            },
            upstream_ca: tls_upstream.then_some(upstream_ca),
            upstream_server_name: None,
            upstream_protocol: upstream::UpstreamProtocol::Auto,
            client_ca: Some(ca_file.clone()),
            listen: "127.0.0.1:0".parse().unwrap(),
            listen_plaintext: None,
            metrics_listen: None,
            listener: ListenerConfig {
                tls: TlsSource::Dir(tls),
                log_format: LogFormat::Text,
                cert_poll_interval: Duration::from_secs(10),
                request_read_timeout: READ_TIMEOUT,
                idle_timeout: Duration::from_secs(120),
                tls_handshake_timeout: READ_TIMEOUT,
                max_connections: 64,
                metrics_max_connections: 4,
                shutdown_delay: Duration::ZERO,
                shutdown_grace: Duration::from_secs(1),
            },
            review_timeout: REVIEW_TIMEOUT,
            message_bytes_in_flight: 64 << 20,
            worker_threads: 1,
        };
        let gate = Gate::build(&config, Some(kube.unwrap_or_else(|| api.client()))).await.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (limits, _) = crate::serve::connection_limits(&config.listener);
        let (stop, stop_rx) = watch::channel(false);
        let connections = Connections::with_trust("gate", limits.clone(), gate.shared.clone(), gate.trust_generation());
        tokio::spawn(connections::serve(
            listener,
            Transport::Tls(gate.acceptor().unwrap()),
            gate.app(),
            connections,
            stop_rx.clone(),
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let plain = listener.local_addr().unwrap();
        let connections = Connections::new("gate-plaintext", limits, gate.shared.clone());
        tokio::spawn(connections::serve(listener, Transport::PlainOrH2c, gate.app(), connections, stop_rx));
        Self { addr, plain, server_ca, client_ca, api, calls, gate_file, ca_file, gate, _dir: dir, _stop: stop }
    }

    fn driver(&self, namespace: &str, name: &str) -> Minted {
        issue(&self.client_ca, &format!("spiffe://cluster.local/ns/{namespace}/lmevaljob/{name}"), SystemTime::now())
    }

    fn upstream_calls(&self) -> Vec<String> {
        self.calls.calls.lock().unwrap().clone()
    }

    /// Each request's headers and trailers, as the upstream received them.
    fn upstream_seen(&self) -> Vec<Seen> {
        self.calls.seen.lock().unwrap().clone()
    }

    /// Connects (TLS, ALPN h2 or http/1.1, with `identity`'s certificate if given) and sends
    /// one request. `Err`: the connection failed (a handshake refused, say).
    async fn send<B>(&self, h2: bool, identity: Option<&Minted>, request: Request<B>) -> Result<Answer, String>
    where
        B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.send_at(self.addr, h2, identity, request).await
    }

    async fn send_at<B>(
        &self,
        addr: SocketAddr,
        h2: bool,
        identity: Option<&Minted>,
        request: Request<B>,
    ) -> Result<Answer, String>
    where
        B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let tls = self.client_tls(identity, h2, &[&rustls::version::TLS13, &rustls::version::TLS12]);
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let stream = TlsConnector::from(Arc::new(tls))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        exchange(stream, h2, request).await
    }

    /// A client's TLS configuration: the gate's server CA, `identity`'s certificate if given,
    /// ALPN h2 or http/1.1, `versions`.
    fn client_tls(
        &self,
        identity: Option<&Minted>,
        h2: bool,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> rustls::ClientConfig {
        let roots = {
            let mut r = rustls::RootCertStore::empty();
            r.add(CertificateDer::from_pem_slice(self.server_ca.cert_pem().as_bytes()).unwrap()).unwrap();
            r
        };
        let builder = rustls::ClientConfig::builder_with_protocol_versions(versions).with_root_certificates(roots);
        let mut tls = match identity {
            Some(m) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(m.cert_pem.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(m.key_pem.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        tls.alpn_protocols = vec![if h2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
        tls
    }

    async fn call(&self, h2: bool, identity: Option<&Minted>, request: Request<Full<Bytes>>) -> Answer {
        tokio::time::timeout(EVENT_TIMEOUT, self.send(h2, identity, request)).await.unwrap().unwrap()
    }

    /// One request over the plaintext listener: HTTP/1.1, or HTTP/2 with prior knowledge.
    async fn call_plain(&self, h2: bool, request: Request<Full<Bytes>>) -> Answer {
        let exchanged = async { exchange(TcpStream::connect(self.plain).await.unwrap(), h2, request).await.unwrap() };
        tokio::time::timeout(EVENT_TIMEOUT, exchanged).await.unwrap()
    }
}

/// One request on a new connection `io` (HTTP/2 with `h2`, else HTTP/1.1), and its whole answer.
async fn exchange<I, B>(io: I, h2: bool, request: Request<B>) -> Result<Answer, String>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let io = TokioIo::new(io);
    let response = if h2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(request).await
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(request).await
    };
    let response = response.map_err(|e| format!("request: {e}"))?;
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.map_err(|e| format!("body: {e}"))?;
    let trailers = collected.trailers().cloned();
    Ok(Answer { status: parts.status.as_u16(), headers: parts.headers, body: collected.to_bytes(), trailers })
}

/// gRPC's percent-decoding of `grpc-message`.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn issue(ca: &Ca, uri: &str, now: SystemTime) -> Minted {
    ca.issue_client_identity(&[(DnType::CommonName, "driver")], uri, now, DAY).unwrap()
}

/// A unary gRPC call of the LMEvalJob driver: JobStatus for `name` in `namespace`.
fn update_status(name: &str, namespace: &str) -> Request<Full<Bytes>> {
    grpc_call("UpdateStatus", encode_strings(&[(1, name), (2, namespace), (3, "Running")]))
}

fn grpc_call(method: &str, body: Vec<u8>) -> Request<Full<Bytes>> {
    Request::post(format!("https://localhost/LMEvalJobUpdateService/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

fn http_get(path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("https://localhost{path}")).body(Full::new(Bytes::new())).unwrap()
}

fn bearer(mut request: Request<Full<Bytes>>, token: &str) -> Request<Full<Bytes>> {
    request.headers_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

// === the tests ===

#[tokio::test]
async fn a_driver_updates_its_own_job_over_grpc_and_is_refused_another_by_field_number() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    // With every identity header a caller could forge: the held call (its message read for the
    // rule, sent upstream apart from hyper's client) carries the gate's alone.
    let mut own = update_status("evaljob-sample", "team-a");
    for (name, value) in [
        ("x-remote-user", "system:admin"),
        ("x-remote-group", "system:masters"),
        ("x-remote-groups", "system:masters"),
        ("x-keyward-identity", "spiffe://cluster.local/ns/team-a/lmevaljob/other-job"),
        ("kubeflow-userid", "admin@example.com"),
        ("x-forwarded-client-cert", "URI=spiffe://cluster.local/ns/team-a/lmevaljob/other-job"),
    ] {
        own.headers_mut().append(name, value.parse().unwrap());
    }
    let own = f.call(true, Some(&driver), own).await;
    assert_eq!((own.status, own.grpc()), (200, ("0".to_string(), String::new())));
    let identity = "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";
    assert_eq!(
        own.messages(),
        [format!("0: POST /LMEvalJobUpdateService/UpdateStatus HTTP/2.0 user={identity} groups=keyward:workloads|keyward:workloads:team-a|system:authenticated identity={identity} kubeflow-userid= xfcc= body=38")]
    );

    for (name, namespace, says) in [
        ("other-job", "team-a", "the caller's name is \"evaljob-sample\", and gRPC field 1 is \"other-job\""),
        ("evaljob-sample", "team-b", "the caller's namespace is \"team-a\", and gRPC field 2 is \"team-b\""),
    ] {
        let other = f.call(true, Some(&driver), update_status(name, namespace)).await;
        let (status, message) = other.grpc();
        assert_eq!((other.status, status.as_str(), other.trailers.is_none()), (200, "7", true), "trailers-only");
        let message = percent_decode(&message);
        assert!(message.contains(says), "{message}");
    }
    assert_eq!(f.upstream_calls().len(), 1, "refused calls never reach the upstream");
}

/// A message past what goes with the HEADERS (16 KiB) goes as the upstream's window allows, and
/// arrives whole: the final status update carries the whole results file (field 6).
#[tokio::test]
async fn a_held_message_larger_than_one_write_reaches_the_upstream_whole() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    let results = "r".repeat(300 * 1024);
    let body = encode_strings(&[(1, "evaljob-sample"), (2, "team-a"), (3, "Complete"), (6, &results)]);
    let answer = f.call(true, Some(&driver), grpc_call("UpdateStatus", body.clone())).await;
    assert_eq!(answer.grpc().0, "0");
    let calls = f.upstream_calls();
    assert!(calls[0].ends_with(&format!(" body={}", body.len())), "{calls:?}");
    assert_eq!(f.gate.state.body_budget.available_permits(), 64 << 20, "given back");
}

/// The largest message a rule reads (4 MiB and its prefix) is held and passed on; a byte more
/// is refused, saying the bound.
#[tokio::test]
async fn a_held_message_is_read_up_to_its_bound_and_no_further() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    let largest = |extra: usize| {
        let fields = encode_strings(&[(1, "evaljob-sample"), (2, "team-a")]);
        // Field 6 (results) pads the message to the bound: a tag, a 4-byte length, the string.
        let pad = keyward_gate::grpc::MAX_MESSAGE_BYTES - (fields.len() - 5) - 5;
        let mut message = fields[5..].to_vec();
        message.push(0x32);
        let mut len = pad;
        while len >= 0x80 {
            message.push((len as u8 & 0x7f) | 0x80);
            len >>= 7;
        }
        message.push(len as u8);
        message.resize(message.len() + pad, b'r');
        let mut body = vec![0];
        body.extend_from_slice(&u32::try_from(message.len() + extra).unwrap().to_be_bytes());
        body.extend_from_slice(&message);
        body.resize(body.len() + extra, b'r');
        body
    };
    let body = largest(0);
    assert_eq!(body.len(), keyward_gate::grpc::MAX_MESSAGE_BYTES + 5);
    let answer = f.call(true, Some(&driver), grpc_call("UpdateStatus", body)).await;
    assert_eq!(answer.grpc().0, "0", "{:?}", answer.grpc());
    let answer = f.call(true, Some(&driver), grpc_call("UpdateStatus", largest(1))).await;
    let (status, message) = answer.grpc();
    assert_eq!(status, "7");
    assert!(percent_decode(&message).contains("the request body is more than 4194309 bytes"), "{message}");
}

/// A gate with no API server to ask (no tokens, no reviews, no owners) refuses with the rules'
/// reason, not as unavailable.
#[tokio::test]
async fn without_an_api_server_a_refusal_gives_the_rules_reason() {
    let f = Fixture::start().await;
    let mut state = f.gate.state.clone();
    state.reviews = None;
    let gate = serve_with_state(&f, state).await;
    let driver = f.driver("team-a", "evaljob-sample");
    let answer = f.send_at(gate, false, Some(&driver), http_get("/apis/v1/namespaces/team-b/runs/r1")).await.unwrap();
    assert_eq!(
        (answer.status, answer.text().as_str()),
        (403, "keyward gate: rule \"runs in the caller's namespace\": the caller's namespace is \"team-a\", and path segment {namespace} is \"team-b\"\n")
    );
}

#[tokio::test]
async fn a_streaming_call_passes_whole_and_a_body_of_two_messages_is_refused() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    let watch = f.call(true, Some(&driver), grpc_call("WatchStatus", encode_strings(&[(1, "evaljob-sample")]))).await;
    assert_eq!(watch.grpc().0, "0");
    assert_eq!(watch.messages().len(), 3, "every message of the server's stream, then its trailers");

    let mut two = encode_strings(&[(1, "evaljob-sample"), (2, "team-a")]);
    two.extend(encode_strings(&[(1, "other-job"), (2, "team-a")]));
    let answer = f.call(true, Some(&driver), grpc_call("UpdateStatus", two)).await;
    let (status, message) = answer.grpc();
    assert_eq!(status, "7");
    assert!(percent_decode(&message).contains("more than one message"), "{message}");
    assert!(f.upstream_calls().len() == 1);
}

#[tokio::test]
async fn http_rules_hold_over_http1_and_http2_and_spoofed_identity_headers_are_stripped() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    for h2 in [false, true] {
        let mut own = http_get("/apis/v1/namespaces/team-a/runs/r1");
        for (name, value) in [
            ("x-remote-user", "system:admin"),
            ("X-Remote-Group", "system:masters"),
            ("x-keyward-identity", "spiffe://cluster.local/ns/kube-system/lmevaljob/x"),
            ("kubeflow-userid", "admin@example.com"),
            ("x-forwarded-client-cert", "By=spiffe://x;URI=spiffe://cluster.local/ns/kube-system/lmevaljob/x"),
        ] {
            own.headers_mut().append(name, value.parse().unwrap());
        }
        let answer = f.call(h2, Some(&driver), own).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let id = "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";
        // Not gRPC: HTTP/1.1 to the upstream, whatever the caller spoke (--upstream-protocol auto).
        assert_eq!(
            answer.text(),
            format!("GET /apis/v1/namespaces/team-a/runs/r1 HTTP/1.1 user={id} groups=keyward:workloads|keyward:workloads:team-a|system:authenticated identity={id} kubeflow-userid= xfcc= body=0")
        );
        let other = f.call(h2, Some(&driver), http_get("/apis/v1/namespaces/team-b/runs/r1")).await;
        assert_eq!(other.status, 403);
        assert_eq!(
            other.text(),
            "keyward gate: rule \"runs in the caller's namespace\": the caller's namespace is \"team-a\", and path segment {namespace} is \"team-b\"\n"
        );
        let sneaky =
            f.call(h2, Some(&driver), http_get("/apis/v1/namespaces/team-a/runs/r1/../../team-b/runs/r1")).await;
        assert_eq!(sneaky.status, 403, "a path the upstream could read another way is not judged");
    }
    assert_eq!(f.upstream_calls().len(), 2);
}

/// A HEAD request's answer has no body on either protocol, a refusal's included (HTTP/2 would
/// otherwise carry the refusal's text as DATA a client must reject), and says how long the
/// refusal's text is, the same on both.
#[tokio::test]
async fn a_head_request_is_answered_without_a_body_whether_allowed_or_refused() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    let head = |path: &str| {
        let mut request = http_get(path);
        *request.method_mut() = http::Method::HEAD;
        request
    };
    let mut lengths = Vec::new();
    for h2 in [false, true] {
        let refused = f.call(h2, Some(&driver), head("/apis/v1/namespaces/team-b/runs/r1")).await;
        assert_eq!((refused.status, refused.body.len()), (403, 0), "h2={h2}");
        lengths.push(refused.headers.get(http::header::CONTENT_LENGTH).map(|v| v.to_str().unwrap().to_string()));
        let allowed = f.call(h2, Some(&driver), head("/apis/v1/namespaces/team-a/runs/r1")).await;
        assert_eq!((allowed.status, allowed.body.len()), (200, 0), "h2={h2}");
    }
    assert!(lengths[0].as_ref().is_some_and(|l| l != "0") && lengths[0] == lengths[1], "{lengths:?}");
    assert_eq!(f.upstream_calls().len(), 2, "only the allowed HEADs reached the upstream");
}

#[tokio::test]
async fn certificates_that_name_no_one_are_refused_at_the_handshake_or_with_401() {
    let f = Fixture::start().await;
    let request = || update_status("evaljob-sample", "team-a");
    // Another CA, and an expired certificate of the right one: the handshake fails.
    let stranger = Ca::mint("someone else's CA", SystemTime::now(), DAY).unwrap();
    let foreign = issue(&stranger, "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample", SystemTime::now());
    let expired =
        issue(&f.client_ca, "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample", SystemTime::now() - 3 * DAY);
    for (what, cert) in [("another CA", &foreign), ("expired", &expired)] {
        let outcome = tokio::time::timeout(EVENT_TIMEOUT, f.send(true, Some(cert), request())).await.unwrap();
        assert!(outcome.is_err(), "{what}: {outcome:?}");
    }
    // The right CA, a URI that is not keyward's form: no identity, UNAUTHENTICATED.
    for uri in [
        "spiffe://cluster.local/ns/team-a/lmevaljob/../team-b",
        "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob%2Dsample",
        "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample/",
    ] {
        let cert = issue(&f.client_ca, uri, SystemTime::now());
        let answer = f.call(true, Some(&cert), request()).await;
        assert_eq!(answer.grpc().0, "16", "{uri}");
        let answer = f.call(false, Some(&cert), http_get("/apis/v1/namespaces/team-a/runs/r1")).await;
        assert_eq!(answer.status, 401, "{uri}");
        assert!(answer.text().starts_with("keyward gate: the client certificate's URI: "), "{}", answer.text());
    }
    let nobody = f.call(false, None, http_get("/apis/v1/namespaces/team-a/runs/r1")).await;
    assert_eq!(
        (nobody.status, nobody.text().as_str()),
        (401, "keyward gate: no client certificate and no bearer token: present the keyward client certificate of your workload, or a service account token\n")
    );
    assert!(f.upstream_calls().is_empty());
}

#[tokio::test]
async fn tokens_are_reviewed_for_the_audience_and_answers_are_cached() {
    let f = Fixture::start().await;
    {
        let mut s = f.api.state.lock().unwrap();
        s.tokens.insert(
            "runner-token".into(),
            ("system:serviceaccount:team-a:pipeline-runner".into(), vec!["pipelines.kubeflow.org".into()]),
        );
        s.tokens.insert(
            "other-audience".into(),
            ("system:serviceaccount:team-a:pipeline-runner".into(), vec!["other".into()]),
        );
    }
    let path = "/apis/v1/namespaces/team-a/runs/r1";
    for _ in 0..3 {
        let answer = f.call(false, None, bearer(http_get(path), "runner-token")).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert!(answer.text().contains("user=system:serviceaccount:team-a:pipeline-runner groups=system:serviceaccounts|system:authenticated identity= "), "{}", answer.text());
    }
    assert_eq!(f.api.counts(), (1, 0), "one TokenReview, then the cache");
    let answer = f.call(false, None, bearer(http_get("/apis/v1/namespaces/team-b/runs/r1"), "runner-token")).await;
    assert_eq!(answer.status, 403, "the account is known; the rule holds it to its namespace");

    for _ in 0..2 {
        let other = f.call(false, None, bearer(http_get(path), "other-audience")).await;
        assert_eq!(other.status, 401);
        assert!(other.text().contains("invalid for the target audiences"), "{}", other.text());
        let unknown = f.call(true, None, bearer(update_status("x", "y"), "forged")).await;
        assert_eq!(unknown.grpc().0, "16");
    }
    assert_eq!(f.api.counts(), (3, 0), "a rejected token is remembered briefly too");
    let text = f.gate.shared.encode();
    assert!(text.contains("keyward_gate_reviews_total{review=\"token\",result=\"cached\"} 5"), "{text}");
    assert!(
        text.contains("keyward_gate_requests_total{rule=\"runs in the caller's namespace\",decision=\"allowed\"} 3"),
        "{text}"
    );
}

#[tokio::test]
async fn a_subject_access_review_decides_and_is_cached() {
    let f = Fixture::start().await;
    {
        let mut s = f.api.state.lock().unwrap();
        s.tokens.insert(
            "client".into(),
            ("system:serviceaccount:team-a:client".into(), vec!["pipelines.kubeflow.org".into()]),
        );
        s.graphs.push(("system:serviceaccount:team-a:client".into(), "team-a".into(), "mine".into()));
    }
    for _ in 0..2 {
        assert_eq!(f.call(false, None, bearer(http_get("/graphs/mine/v1/predict"), "client")).await.status, 200);
        let theirs = f.call(false, None, bearer(http_get("/graphs/theirs/v1/predict"), "client")).await;
        assert_eq!(theirs.status, 403);
        assert!(theirs.text().contains("the API server does not allow system:serviceaccount:team-a:client to get inferencegraphs.serving.kserve.io \"theirs\" in namespace \"team-a\""), "{}", theirs.text());
    }
    assert_eq!(f.api.counts(), (1, 2), "one review each, then the cache");
}

#[tokio::test]
async fn with_the_api_server_slow_or_failing_the_gate_fails_closed_in_time_and_recovers() {
    let f = Fixture::start().await;
    f.api.state.lock().unwrap().tokens.insert(
        "runner-token".into(),
        ("system:serviceaccount:team-a:pipeline-runner".into(), vec!["pipelines.kubeflow.org".into()]),
    );
    let path = "/apis/v1/namespaces/team-a/runs/r1";
    f.api.set_mode(Mode::Hang);
    let started = Instant::now();
    let hung = f.call(false, None, bearer(http_get(path), "runner-token")).await;
    assert_eq!(hung.status, 503);
    assert_eq!(hung.text(), "keyward gate: the API server did not answer the TokenReview within 500ms\n");
    assert!(started.elapsed() < REVIEW_TIMEOUT * 4, "refused at the deadline: {:?}", started.elapsed());
    let grpc = f.call(true, None, bearer(update_status("x", "y"), "runner-token")).await;
    assert_eq!(grpc.grpc().0, "14", "UNAVAILABLE, which clients retry");

    f.api.set_mode(Mode::Fail);
    let failed = f.call(false, None, bearer(http_get(path), "runner-token")).await;
    assert_eq!(failed.status, 503);
    assert!(failed.text().contains("500 etcdserver: request timed out"), "{}", failed.text());

    f.api.set_mode(Mode::Answer);
    assert_eq!(f.call(false, None, bearer(http_get(path), "runner-token")).await.status, 200, "nothing was cached");
    assert!(f.upstream_calls().len() == 1);
}

#[tokio::test]
async fn a_good_gate_file_replaces_the_rules_and_a_bad_one_changes_nothing() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    let path = "/apis/v1/namespaces/team-a/runs/r1";
    assert_eq!(f.call(false, Some(&driver), http_get(path)).await.status, 200);
    let without_runs = GATE.split("    - name: runs in the caller's namespace").next().unwrap();
    std::fs::write(&f.gate_file, without_runs).unwrap();
    assert_eq!(f.gate.state.gate.reload_now(), Reload::Loaded(1));
    let refused = f.call(false, Some(&driver), http_get(path)).await;
    assert_eq!(
        (refused.status, refused.text().as_str()),
        (403, "keyward gate: no rule of this gate covers this method and path\n")
    );

    std::fs::write(&f.gate_file, GATE.replace("kind: Gate", "kind: Gates")).unwrap();
    assert!(
        matches!(f.gate.state.gate.reload_now(), Reload::Failed(e) if e.contains("a gate file is apiVersion keyward.io/v1alpha1 kind Gate"))
    );
    assert_eq!(f.call(false, Some(&driver), http_get(path)).await.status, 403, "the last good rules stay");
    assert!(matches!(f.gate.state.gate.reload_now(), Reload::Failed(_)), "still refused on the next look");
    let text = f.gate.shared.encode();
    assert!(text.contains("keyward_gate_reloads_total{file=\"gate\",result=\"failed\"} 2"), "{text}");
}

#[tokio::test]
async fn a_rotated_client_ca_is_trusted_after_reload_and_the_old_one_through_the_overlap() {
    let f = Fixture::start().await;
    let next = Ca::mint("keyward client CA, next", SystemTime::now(), DAY).unwrap();
    let new_driver = issue(&next, "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample", SystemTime::now());
    let old_driver = f.driver("team-a", "evaljob-sample");
    let request = || update_status("evaljob-sample", "team-a");
    assert!(f.send(true, Some(&new_driver), request()).await.is_err(), "not trusted yet");
    std::fs::write(&f.ca_file, format!("{}{}", f.client_ca.cert_pem(), next.cert_pem())).unwrap();
    assert_eq!(f.gate.client_ca.as_ref().unwrap().reload_now(), Reload::Loaded(2));
    for cert in [&new_driver, &old_driver] {
        assert_eq!(f.call(true, Some(cert), request()).await.grpc().0, "0");
    }
    std::fs::write(&f.ca_file, next.cert_pem()).unwrap();
    f.gate.client_ca.as_ref().unwrap().reload_now();
    assert!(f.send(true, Some(&old_driver), request()).await.is_err(), "the old CA is gone after the overlap");
}

async fn readiness(health: Health) -> (u16, String) {
    let response = ready(State(health)).await;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The sidecar's client CA volume is optional (deploy/gate/sidecar): the ConfigMap exists only
/// where the controller publishes it. A gate that admits workloads waits for it, not ready and
/// refusing every certificate, and loads it when it appears; one that admits none needs none.
#[tokio::test]
async fn a_client_ca_not_yet_published_is_awaited_only_by_a_gate_that_admits_workloads() {
    let f = Fixture::start_without_client_ca(GATE).await;
    let health = f.gate.health(Arc::new(AtomicBool::new(false)));
    let (status, reason) = readiness(health.clone()).await;
    assert_eq!(status, 503);
    assert_eq!(
        reason,
        format!("not ready: no client CA bundle at {} yet, and the gate file admits workloads by client certificate: `keyward controller --publish-client-ca-to=<this namespace>` publishes the ConfigMap keyward-client-ca (the gate loads it when it appears)\n", f.ca_file.display())
    );
    let driver = f.driver("team-a", "evaljob-sample");
    let request = || update_status("evaljob-sample", "team-a");
    assert!(f.send(true, Some(&driver), request()).await.is_err(), "no CA: the certificate is refused");
    assert!(f.upstream_calls().is_empty());
    let ca = f.gate.client_ca.as_ref().unwrap();
    assert_eq!(ca.reload_now(), Reload::Unchanged, "still absent: nothing to say");
    std::fs::write(&f.ca_file, f.client_ca.cert_pem()).unwrap();
    assert_eq!(ca.reload_now(), Reload::Loaded(1));
    assert_eq!(readiness(health).await, (200, "ok\n".into()));
    assert_eq!(f.call(true, Some(&driver), request()).await.grpc().0, "0");
    assert!(f.upstream_calls().len() == 1, "{:?}", f.upstream_calls());

    // Tokens and anonymous callers only: ready without it.
    let tokens_only = KFP_GATE.split("    - name: drivers only").next().unwrap();
    let kfp = Fixture::start_without_client_ca(tokens_only).await;
    assert_eq!(readiness(kfp.gate.health(Arc::new(AtomicBool::new(false)))).await, (200, "ok\n".into()));
    let health = kfp
        .call_plain(
            true,
            Request::get("http://ml-pipeline:8888/apis/v1beta1/healthz").body(Full::new(Bytes::new())).unwrap(),
        )
        .await;
    assert_eq!(health.status, 200);
}

#[tokio::test]
async fn a_silent_client_and_a_message_that_never_ends_are_cut_off() {
    let f = Fixture::start().await;
    // No handshake at all: closed at the handshake deadline.
    let mut silent = TcpStream::connect(f.addr).await.unwrap();
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(EVENT_TIMEOUT, silent.read(&mut buf)).await.unwrap();
    assert!(matches!(read, Ok(0) | Err(_)), "closed: {read:?}");

    // A gRPC call whose message never finishes: refused at the read deadline, upstream untouched.
    let driver = f.driver("team-a", "evaljob-sample");
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
    tx.send(Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 40, 0x0a])))).await.unwrap();
    let frames = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|frame| (frame, rx)) });
    let body = StreamBody::new(Box::pin(frames));
    let request = Request::post("https://localhost/LMEvalJobUpdateService/UpdateStatus")
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap();
    let started = Instant::now();
    let answer = tokio::time::timeout(EVENT_TIMEOUT, f.send(true, Some(&driver), request)).await.unwrap().unwrap();
    assert_eq!(answer.grpc().0, "7");
    assert!(started.elapsed() >= READ_TIMEOUT, "held until the deadline");
    assert!(percent_decode(&answer.grpc().1).contains(
        "the request's message did not arrive whole within 2s: a call whose rule reads a field must send one message"
    ));
    drop(tx);
    assert!(f.upstream_calls().is_empty());
}

/// A rule on a JSON field, for a certificate caller: a job posts only its own events.
const JSON_GATE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: json}
spec:
  trustDomain: cluster.local
  rules:
    - name: a job posts its own events
      http: {methods: [POST], path: "/jobs/{job}/events"}
      callers: {workloads: {kinds: [lmevaljob]}}
      when:
        - {caller: name, equals: {jsonField: job.name}}
        - {caller: name, equals: {pathSegment: job}}
"#;

#[tokio::test]
async fn a_json_body_is_read_whole_before_the_decision_and_forwarded_as_read() {
    let f = Fixture::start_with(JSON_GATE).await;
    let driver = f.driver("team-a", "evaljob-sample");
    let post = |body: &'static str| {
        Request::post("https://localhost/jobs/evaljob-sample/events")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    let own = f
        .send(false, Some(&driver), post(r#"{"job": {"name": "evaljob-sample"}, "status": "running"}"#))
        .await
        .unwrap();
    assert_eq!(own.status, 200, "{}", own.text());
    let other = f.send(true, Some(&driver), post(r#"{"job": {"name": "other-job"}}"#)).await.unwrap();
    assert_eq!(other.status, 403);
    assert!(
        other.text().contains("the caller's name is \"evaljob-sample\", and JSON field job.name is \"other-job\""),
        "{}",
        other.text()
    );
    let calls = f.upstream_calls();
    assert_eq!(calls.len(), 1, "the refused body never reached the upstream");

    // A body that never ends: refused at the read deadline, in HTTP's words.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
    tx.send(Ok(Frame::data(Bytes::from_static(b"{\"job\": ")))).await.unwrap();
    let frames = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|frame| (frame, rx)) });
    let request = Request::post("https://localhost/jobs/evaljob-sample/events")
        .header("content-type", "application/json")
        .body(StreamBody::new(Box::pin(frames)))
        .unwrap();
    let answer = tokio::time::timeout(EVENT_TIMEOUT, f.send(true, Some(&driver), request)).await.unwrap().unwrap();
    assert_eq!(answer.status, 403);
    assert!(
        answer.text().contains("the request's body did not arrive whole within 2s: a rule reads a JSON field of it"),
        "{}",
        answer.text()
    );
    drop(tx);
    assert_eq!(f.upstream_calls().len(), 1);
}

#[tokio::test]
async fn an_upstream_over_tls_is_verified_and_spoken_to_in_the_callers_protocol() {
    let f = Fixture::start_full(GATE, true, None).await;
    let driver = f.driver("team-a", "evaljob-sample");
    let grpc = f.call(true, Some(&driver), update_status("evaljob-sample", "team-a")).await;
    assert_eq!(grpc.grpc().0, "0");
    let http = f.call(false, Some(&driver), http_get("/apis/v1/namespaces/team-a/runs/r1")).await;
    assert_eq!(http.status, 200, "{}", http.text());
    let calls = f.upstream_calls();
    assert!(calls[0].starts_with("POST /LMEvalJobUpdateService/UpdateStatus HTTP/2.0 "), "{calls:?}");
    assert!(calls[1].starts_with("GET /apis/v1/namespaces/team-a/runs/r1 HTTP/1.1 "), "{calls:?}");
}

/// The fixture's gate with another upstream, on a listener of its own.
async fn serve_with_upstream(f: &Fixture, upstream: Upstream) -> SocketAddr {
    let mut state = f.gate.state.clone();
    state.upstream = Arc::new(upstream);
    serve_with_state(f, state).await
}

/// The fixture's gate with `state`, on a listener of its own.
async fn serve_with_state(f: &Fixture, state: GateState) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = crate::serve::connections::ConnectionLimits {
        max_connections: 4,
        handshake_timeout: READ_TIMEOUT,
        request_read_timeout: READ_TIMEOUT,
        idle_timeout: READ_TIMEOUT,
        shutdown_grace: READ_TIMEOUT,
    };
    let connections = Connections::with_trust("gate", limits, f.gate.shared.clone(), f.gate.trust_generation());
    let app = Router::new().fallback(proxy::handle).with_state(state);
    tokio::spawn(connections::serve(
        listener,
        Transport::Tls(f.gate.acceptor().unwrap()),
        app,
        connections,
        f._stop.subscribe(),
    ));
    addr
}

#[tokio::test]
async fn an_upstream_that_cannot_be_reached_is_a_502_and_unavailable() {
    let f = Fixture::start().await;
    // The same gate, its upstream a port nothing listens on.
    let unreachable = Upstream::new(
        "http://127.0.0.1:1",
        upstream::UpstreamTls::default(),
        upstream::UpstreamProtocol::Auto,
        READ_TIMEOUT,
    )
    .unwrap();
    let addr = serve_with_upstream(&f, unreachable).await;
    let driver = f.driver("team-a", "evaljob-sample");
    let http = f.send_at(addr, false, Some(&driver), http_get("/apis/v1/namespaces/team-a/runs/r1")).await.unwrap();
    assert_eq!((http.status, http.text().as_str()), (502, "keyward gate: the upstream could not be reached\n"));
    let grpc = f.send_at(addr, true, Some(&driver), update_status("evaljob-sample", "team-a")).await.unwrap();
    assert_eq!(grpc.grpc().0, "14");
    assert!(f.gate.shared.encode().contains("keyward_gate_upstream_errors_total 2"));
}

/// Why keyward sets no `ray.io` audience on KubeRay's token (docs/profiles.md, the Ray row).
/// The kubelet requests a projected token for the volume's `audience`, or, with none, for the
/// API server's own (TokenRequest's default). Ray >= 2.55 reviews the token it receives with no
/// `spec.audiences` (ray `src/ray/rpc/authentication/k8s_util.cc` `ValidateToken`; ray#60583,
/// which asked for `ray.io`, was reverted by ray#60590). Through keyward's own TokenReview
/// client, against a fake API server that intersects audiences as the API server does:
/// KubeRay's token passes Ray's review, and the same volume with `ray.io` would not.
#[tokio::test]
async fn a_ray_io_token_fails_the_review_ray_sends_and_kuberays_own_passes_it() {
    let pod: Value =
        serde_json::from_str(&std::fs::read_to_string("tests/fixtures/kuberay-worker-k8s-auth.json").unwrap()).unwrap();
    let volume = pod["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "ray-token").unwrap();
    let minted_for = |volume: &Value| -> Vec<String> {
        match volume["projected"]["sources"][0]["serviceAccountToken"]["audience"].as_str() {
            Some(audience) if !audience.is_empty() => vec![audience.to_string()],
            _ => vec![API_AUDIENCE.to_string()],
        }
    };
    let mut with_ray_io = volume.clone();
    with_ray_io["projected"]["sources"][0]["serviceAccountToken"]["audience"] = json!("ray.io");
    let api = FakeApi::new();
    let worker = "system:serviceaccount:team-a:ray-cluster-with-k8s-auth";
    {
        let mut state = api.state.lock().unwrap();
        state.tokens.insert("kuberay-token".into(), (worker.into(), minted_for(volume)));
        state.tokens.insert("ray-io-token".into(), (worker.into(), minted_for(&with_ray_io)));
    }
    let metrics = Arc::new(GateMetrics::new(Arc::new(crate::metrics::Metrics::default())));
    let reviews = reviews::Reviews::new(api.client(), Duration::from_secs(30), metrics);
    // As Ray asks: no audiences.
    let as_ray_asks = reviews.token("kuberay-token", &[], None).await.unwrap();
    assert_eq!(as_ray_asks.caller, Caller::ServiceAccount(ServiceAccount::parse(worker).unwrap()));
    let refused = reviews.token("ray-io-token", &[], None).await.unwrap_err();
    assert!(
        matches!(&refused, reviews::TokenRefused::Rejected(e) if e.contains("invalid for the target audiences")),
        "{refused:?}"
    );
    // Only a review that names `ray.io` would take the `ray.io` token, and then not KubeRay's.
    let reviews = reviews::Reviews::new(
        api.client(),
        Duration::from_secs(30),
        Arc::new(GateMetrics::new(Arc::new(crate::metrics::Metrics::default()))),
    );
    let ray_io = ["ray.io".to_string()];
    assert!(reviews.token("ray-io-token", &ray_io, None).await.is_ok());
    assert!(reviews.token("kuberay-token", &ray_io, None).await.is_err());
    assert_eq!(api.counts(), (4, 0));
}

#[tokio::test]
async fn requests_with_the_same_new_token_share_one_token_review() {
    let api = FakeApi::new();
    api.state.lock().unwrap().tokens.insert(
        "runner-token".into(),
        ("system:serviceaccount:team-a:pipeline-runner".into(), vec!["pipelines.kubeflow.org".into()]),
    );
    api.set_mode(Mode::Hang);
    let shared = Arc::new(crate::metrics::Metrics::default());
    let metrics = Arc::new(GateMetrics::new(shared.clone()));
    let reviews = reviews::Reviews::new(api.client(), Duration::from_secs(30), metrics);
    let audiences = ["pipelines.kubeflow.org".to_string()];
    // join_all polls each of the eight once before `release` runs: all are waiting by then.
    let all = futures::future::join_all((0..8).map(|_| reviews.token("runner-token", &audiences, None)));
    let release = async {
        while api.counts().0 == 0 {
            tokio::task::yield_now().await;
        }
        api.set_mode(Mode::Answer);
    };
    let (answers, ()) = tokio::join!(all, release);
    for answer in answers {
        assert_eq!(
            answer.unwrap().caller,
            Caller::ServiceAccount(ServiceAccount::parse("system:serviceaccount:team-a:pipeline-runner").unwrap())
        );
    }
    assert_eq!(api.counts(), (1, 0), "one TokenReview for eight requests");
    assert!(reviews.token("runner-token", &audiences, None).await.is_ok());
    assert_eq!(api.counts(), (1, 0), "then the cache");
    let text = shared.encode();
    for line in [
        "keyward_gate_reviews_total{review=\"token\",result=\"allowed\"} 1",
        "keyward_gate_reviews_total{review=\"token\",result=\"shared\"} 7",
        "keyward_gate_reviews_total{review=\"token\",result=\"cached\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

#[tokio::test]
async fn requests_needing_the_same_new_access_review_share_one() {
    let api = FakeApi::new();
    let user = "system:serviceaccount:team-a:client";
    api.state.lock().unwrap().graphs.push((user.into(), "team-a".into(), "mine".into()));
    api.set_mode(Mode::Hang);
    let shared = Arc::new(crate::metrics::Metrics::default());
    let metrics = Arc::new(GateMetrics::new(shared.clone()));
    let reviews = reviews::Reviews::new(api.client(), Duration::from_secs(30), metrics);
    let review = |name: &str| keyward_gate::rules::AccessReview {
        user: user.into(),
        verb: "get".into(),
        group: "serving.kserve.io".into(),
        resource: "inferencegraphs".into(),
        subresource: String::new(),
        namespace: "team-a".into(),
        name: name.into(),
    };
    let (mine, theirs) = (review("mine"), review("theirs"));
    // join_all polls each once before `release` runs: all ten are waiting by then, eight on
    // one review and two on another.
    let asked = (0..10).map(|i| if i < 8 { &mine } else { &theirs });
    let all = futures::future::join_all(asked.map(|r| reviews.access(r)));
    let release = async {
        while api.counts().1 < 2 {
            tokio::task::yield_now().await;
        }
        api.set_mode(Mode::Answer);
    };
    let (answers, ()) = tokio::join!(all, release);
    let answers: Vec<bool> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(answers, [[true; 8].as_slice(), &[false; 2]].concat());
    assert_eq!(api.counts(), (0, 2), "one SubjectAccessReview for each distinct question");
    assert_eq!(reviews.access(&mine).await, Ok(true));
    assert_eq!(api.counts(), (0, 2), "then the cache");
    let text = shared.encode();
    for line in [
        "keyward_gate_reviews_total{review=\"access\",result=\"allowed\"} 1",
        "keyward_gate_reviews_total{review=\"access\",result=\"denied\"} 1",
        "keyward_gate_reviews_total{review=\"access\",result=\"shared\"} 8",
        "keyward_gate_reviews_total{review=\"access\",result=\"cached\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

// === spec.liveOwners: a certificate buys nothing once its job is gone ===

/// The LMEvalJob status route, with the owners watched.
const LIVE_OWNERS_GATE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: live-owners}
spec:
  trustDomain: cluster.local
  liveOwners:
    - {apiVersion: foundation-model-stack.github.com.github.com/v1beta1, kind: LMEvalJob}
  rules:
    - name: a driver updates only its own job
      grpc: {service: LMEvalJobUpdateService, methods: [UpdateStatus]}
      callers: {workloads: {kinds: [lmevaljob]}}
      when:
        - {caller: name, equals: {grpcField: 1}}
        - {caller: namespace, equals: {grpcField: 2}}
"#;

const LMEVAL: &str = "foundation-model-stack.github.com.github.com/v1beta1";
const LMEVALJOBS: &str = "foundation-model-stack.github.com.github.com/v1beta1/lmevaljobs";

/// An LMEvalJob of fms-lm-eval-service (api/v1beta1/groupversion_info.go, 757bb44f: group
/// foundation-model-stack.github.com.github.com, version v1beta1), as the API server stores it;
/// the gate reads its metadata only.
fn lmevaljob(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": LMEVAL,
        "kind": "LMEvalJob",
        "metadata": {"namespace": namespace, "name": name, "generation": 1},
        "spec": {"model": "hf", "taskList": {"taskNames": ["unfair_tos"]}, "logSamples": true},
    })
}

/// The gate, its owner watch on `kube` (as client "gate", whose requests give up after 500 ms).
async fn live_owners_gate(kube: &kube_fake::FakeApi) -> Fixture {
    Fixture::start_full(LIVE_OWNERS_GATE, false, Some(kube.client_with_deadline("gate", REVIEW_TIMEOUT))).await
}

impl Fixture {
    fn owners(&self) -> &LiveOwners {
        self.gate.state.owners.as_deref().expect("the gate file watches owners")
    }

    /// The gRPC status (and message) of `driver`'s update of its own job.
    async fn own_update(&self, driver: &Minted, namespace: &str, name: &str) -> (String, String) {
        let (status, message) = self.call(true, Some(driver), update_status(name, namespace)).await.grpc();
        (status, percent_decode(&message))
    }
}

/// The identity of the driver of `namespace/name`.
fn driver_id(namespace: &str, name: &str) -> keyward_gate::identity::WorkloadIdentity {
    keyward_gate::identity::WorkloadIdentity::parse(&format!("spiffe://cluster.local/ns/{namespace}/lmevaljob/{name}"))
        .unwrap()
}

#[tokio::test]
async fn a_drivers_certificate_buys_nothing_once_its_job_is_gone() {
    let kube = kube_fake::FakeApi::default();
    kube.seed(lmevaljob("team-a", "evaljob-sample"));
    let f = live_owners_gate(&kube).await;
    kube.until(EVENT_TIMEOUT, |_| f.owners().unlisted().is_empty().then_some(())).await;
    let driver = f.driver("team-a", "evaljob-sample");
    assert_eq!(f.own_update(&driver, "team-a", "evaljob-sample").await, ("0".into(), String::new()));

    // A certificate of the same CA for a job that does not exist: refused as a revoked one.
    let stranger = f.driver("team-a", "never-created");
    let (status, message) = f.own_update(&stranger, "team-a", "never-created").await;
    assert_eq!(status, "16", "UNAUTHENTICATED");
    assert_eq!(message, "keyward gate: LMEvalJob (foundation-model-stack.github.com.github.com/v1beta1) team-a/never-created does not exist (or is being deleted): this gate admits a LMEvalJob identity only while its owner exists (spec.liveOwners); a job's certificate does not outlive its job");

    // The job is deleted: its still-valid certificate is refused as soon as the watch says so.
    kube.remove(LMEVAL, "LMEvalJob", "team-a", "evaljob-sample");
    kube.until(EVENT_TIMEOUT, |_| f.owners().check(&driver_id("team-a", "evaljob-sample")).is_err().then_some(()))
        .await;
    assert_eq!(f.own_update(&driver, "team-a", "evaljob-sample").await.0, "16");

    // Over HTTP/1.1 (a REST control plane) the same refusal is a 401.
    let http = f.call(false, Some(&driver), http_get("/anything")).await;
    assert_eq!(http.status, 401);
    assert!(http.text().contains("team-a/evaljob-sample does not exist"), "{}", http.text());

    // Marked for deletion (finalizers pending) counts as gone.
    kube.seed(lmevaljob("team-a", "finalizing"));
    kube.until(EVENT_TIMEOUT, |_| f.owners().check(&driver_id("team-a", "finalizing")).is_ok().then_some(())).await;
    let mut deleting = lmevaljob("team-a", "finalizing");
    deleting["metadata"]["deletionTimestamp"] = json!("2026-12-04T02:00:00Z");
    deleting["metadata"]["finalizers"] = json!(["lm-eval-job.foundation-model-stack.github.com.github.com/finalizer"]);
    kube.seed(deleting);
    kube.until(EVENT_TIMEOUT, |_| f.owners().check(&driver_id("team-a", "finalizing")).is_err().then_some(())).await;
    let finalizing = f.driver("team-a", "finalizing");
    assert_eq!(f.own_update(&finalizing, "team-a", "finalizing").await.0, "16");

    assert_eq!(f.upstream_calls().len(), 1, "only the live job's update reached the upstream");
    let watches: Vec<_> = kube.calls().into_iter().filter(|c| c.resource == LMEVALJOBS).collect();
    assert!(watches.iter().all(|c| c.method == "GET" && c.namespace.is_empty()), "cluster-wide list and watch only");
    let text = f.gate.shared.encode();
    assert!(text.contains("keyward_gate_live_owners{kind=\"lmevaljob\"} 0"), "{text}");
    assert!(text.contains("keyward_gate_requests_total{rule=\"\",decision=\"unauthenticated\"} 4"), "{text}");
}

#[tokio::test]
async fn until_the_owners_are_listed_their_identities_wait_and_the_gate_is_not_ready() {
    let kube = kube_fake::FakeApi::default();
    kube.seed(lmevaljob("team-a", "evaljob-sample"));
    // The first list is refused (a loaded API server), then hangs past the client's deadline.
    kube.fail("GET", LMEVALJOBS, 429, 1);
    kube.hang("GET", "lmevaljobs", None);
    let f = live_owners_gate(&kube).await;
    let health = f.gate.health(Arc::new(AtomicBool::new(false)));
    assert_eq!(
        readiness(health.clone()).await,
        (503, "not ready: the gate has not yet listed lmevaljobs (spec.liveOwners) from the API server\n".into())
    );
    let driver = f.driver("team-a", "evaljob-sample");
    let (status, message) = f.own_update(&driver, "team-a", "evaljob-sample").await;
    assert_eq!(status, "14", "UNAVAILABLE, which a gRPC client retries");
    assert!(message.contains("has not yet listed the lmevaljobs"), "{message}");
    // The refused list and the hung one were both asked, and the hung one given up on.
    kube.until(EVENT_TIMEOUT, |k| {
        let asked = k.calls().iter().filter(|c| c.resource == LMEVALJOBS).count();
        let text = f.gate.shared.encode();
        let errors = text
            .lines()
            .find_map(|l| l.strip_prefix("keyward_gate_owner_watch_errors_total{kind=\"lmevaljob\"} "))
            .and_then(|n| n.parse::<u64>().ok());
        let failed = errors.is_some_and(|n| n >= 2);
        (asked >= 2 && failed).then_some(())
    })
    .await;
    assert!(f.owners().check(&driver_id("team-a", "evaljob-sample")).is_err(), "still nothing known");

    kube.unhang();
    kube.until(EVENT_TIMEOUT, |_| f.owners().unlisted().is_empty().then_some(())).await;
    assert_eq!(readiness(health).await, (200, "ok\n".into()));
    assert_eq!(f.own_update(&driver, "team-a", "evaljob-sample").await, ("0".into(), String::new()));
}

#[tokio::test]
async fn a_job_deleted_while_the_watch_is_down_is_gone_after_the_relist() {
    let kube = kube_fake::FakeApi::default();
    kube.seed(lmevaljob("team-a", "kept"));
    kube.seed(lmevaljob("team-a", "deleted-meanwhile"));
    let f = live_owners_gate(&kube).await;
    kube.until(EVENT_TIMEOUT, |_| f.owners().unlisted().is_empty().then_some(())).await;
    let (kept, deleted) = (driver_id("team-a", "kept"), driver_id("team-a", "deleted-meanwhile"));
    assert_eq!((f.owners().check(&kept), f.owners().check(&deleted)), (Ok(()), Ok(())));

    // The watch ends and cannot come back (the API server hangs); meanwhile the job goes and the
    // history is compacted, so no DELETED event will ever say so.
    kube.hang("GET", "lmevaljobs", None);
    kube.expire_watches(LMEVALJOBS);
    kube.until(EVENT_TIMEOUT, |k| {
        k.calls()
            .iter()
            .any(|c| c.resource == LMEVALJOBS && c.status == 0 && c.query.contains("watch=true"))
            .then_some(())
    })
    .await;
    kube.remove(LMEVAL, "LMEvalJob", "team-a", "deleted-meanwhile");
    kube.expire_watches(LMEVALJOBS);
    assert_eq!(f.owners().check(&deleted), Ok(()), "what was known still answers while the API server is away");

    // Back: the resumed watch is told 410 Gone, lists again, and the list has no such job.
    kube.unhang();
    kube.until(EVENT_TIMEOUT, |_| f.owners().check(&deleted).is_err().then_some(())).await;
    assert_eq!(f.owners().check(&kept), Ok(()), "the relist never showed a gap");
    let gone = kube.calls().iter().filter(|c| c.resource == LMEVALJOBS && !c.query.contains("watch=true")).count();
    assert_eq!(gone, 2, "listed again after the 410");

    // An API server restart: every watch ends; the watch comes back and sees what changes next.
    kube.restart();
    kube.seed(lmevaljob("team-b", "after-restart"));
    kube.until(EVENT_TIMEOUT, |_| f.owners().check(&driver_id("team-b", "after-restart")).is_ok().then_some(())).await;
}

#[tokio::test]
async fn a_reload_cannot_change_the_owners_watched() {
    let kube = kube_fake::FakeApi::default();
    let f = live_owners_gate(&kube).await;
    let without = LIVE_OWNERS_GATE.replace(
        "  liveOwners:\n    - {apiVersion: foundation-model-stack.github.com.github.com/v1beta1, kind: LMEvalJob}\n",
        "",
    );
    std::fs::write(&f.gate_file, &without).unwrap();
    let Reload::Failed(why) = f.gate.state.gate.reload_now() else { panic!("a reload that drops liveOwners") };
    assert!(why.ends_with("spec.liveOwners is not the one the gate started with (LMEvalJob (foundation-model-stack.github.com.github.com/v1beta1)): the gate watches the owner kinds it started with; restart it to watch others"), "{why}");
    assert_eq!(f.gate.state.gate.current().gate.live_owners().len(), 1, "the rules in force are unchanged");
    // Any other change reloads.
    std::fs::write(&f.gate_file, LIVE_OWNERS_GATE.replace("name: live-owners", "name: renamed")).unwrap();
    assert_eq!(f.gate.state.gate.reload_now(), Reload::Loaded(1));
    assert_eq!(f.gate.state.gate.current().name, "renamed");
    assert_eq!(f.gate.state.gate.reload_now(), Reload::Unchanged, "a poll that finds the same text reloads nothing");
}

/// An evaluation pod of EvalHub (eval-hub ba127125 job_builders.go: its labels and raw values in
/// annotations), as the API server stores it, owned by its Job.
fn evaluation_pod(namespace: &str, name: &str, job_id: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace, "name": name, "generateName": format!("{job_id}-5f0c-"),
            "labels": {"app": "evalhub", "component": "evaluation-job", "job_id": job_id, "benchmark_index": "0"},
            "annotations": {"eval-hub.github.io/job_id": job_id, "eval-hub.github.io/provider_id": "lm_evaluation_harness",
                            "eval-hub.github.io/benchmark_id": "arc_easy"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": format!("{job_id}-5f0c"), "uid": "j-1",
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {"serviceAccountName": "evalhub-evalhub-job", "containers": [{"name": "adapter", "image": "adapter"}]},
    })
}

#[tokio::test]
async fn the_callers_pods_are_watched_by_their_selector_and_the_gate_is_ready_once_they_are_listed() {
    let recipe =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gate/recipes/evalhub-status.yaml")).unwrap();
    let kube = kube_fake::FakeApi::default();
    let pod = kube.seed(evaluation_pod("tenant-a", "job-a-5f0c-x2x9q", "job-a"));
    let mut other = evaluation_pod("tenant-a", "not-an-evaluation", "job-b");
    other["metadata"]["labels"] = json!({"app": "something-else"});
    let other = kube.seed(other);
    kube.hang("GET", "pods", None);
    let f = Fixture::start_full(&recipe, false, Some(kube.client_with_deadline("gate", REVIEW_TIMEOUT))).await;
    let health = f.gate.health(Arc::new(AtomicBool::new(false)));
    assert_eq!(
        readiness(health.clone()).await,
        (
            503,
            "not ready: the gate has not yet listed the callers' pods (spec.tokenReview.pods) from the API server\n"
                .into()
        )
    );
    let pods = f.gate.state.pods.clone().expect("the recipe watches pods");
    assert!(pods.unlisted());
    kube.unhang();
    kube.until(EVENT_TIMEOUT, |_| (!pods.unlisted()).then_some(())).await;
    assert_eq!(readiness(health).await, (200, "ok\n".into()));
    let account =
        keyward_gate::identity::ServiceAccount::parse("system:serviceaccount:tenant-a:evalhub-evalhub-job").unwrap();
    let bound = |p: &Value| keyward_gate::identity::BoundPod {
        name: p["metadata"]["name"].as_str().unwrap().into(),
        uid: p["metadata"]["uid"].as_str().unwrap().into(),
    };
    let caller = pods.caller(account.clone(), &bound(&pod)).unwrap();
    let facts = caller.facts().expect("the evaluation pod is watched");
    assert_eq!(facts.annotations.get("eval-hub.github.io/job_id").map(String::as_str), Some("job-a"));
    assert_eq!(facts.labels.get("benchmark_index").map(String::as_str), Some("0"));
    assert!(
        pods.caller(account, &bound(&other)).unwrap().facts().is_none(),
        "a pod the selector leaves out is not known"
    );
    // Cluster-wide, by the selector: never every pod of the cluster.
    let lists: Vec<_> = kube.calls().into_iter().filter(|c| c.resource.ends_with("pods")).collect();
    assert!(!lists.is_empty());
    assert!(
        lists.iter().all(|c| c.method == "GET"
            && c.namespace.is_empty()
            && c.query.contains("labelSelector=app%3Devalhub%2Ccomponent%3Devaluation-job")),
        "{:?}",
        lists.iter().map(|c| &c.query).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_reload_cannot_change_the_pods_watched_or_what_is_kept_of_them() {
    let recipe =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gate/recipes/evalhub-status.yaml")).unwrap();
    let kube = kube_fake::FakeApi::default();
    let f = Fixture::start_full(&recipe, false, Some(kube.client_with_deadline("gate", REVIEW_TIMEOUT))).await;
    for changed in [
        recipe.replace("labelSelector: app=evalhub,component=evaluation-job", "labelSelector: app=evalhub"),
        recipe.replace("{caller: {podLabel: benchmark_index}", "{caller: {podLabel: benchmark_id}"),
    ] {
        std::fs::write(&f.gate_file, &changed).unwrap();
        let Reload::Failed(why) = f.gate.state.gate.reload_now() else { panic!("a reload that changes the pods kept") };
        assert!(why.ends_with("spec.tokenReview.pods, or the pod labels and annotations the rules read, are not those the gate started with (the gate watches the pods it started with, keeping what its rules then read); restart it"), "{why}");
    }
    std::fs::write(&f.gate_file, recipe.replace("name: evalhub-status", "name: renamed")).unwrap();
    assert_eq!(f.gate.state.gate.reload_now(), Reload::Loaded(1));
}

// === plaintext, anonymous callers, the upstream's protocol (issue 42) ===

/// Kubeflow Pipelines' API server as the agents and the v2 driver call it (docs/gate.md,
/// "kfp-api"): a token for the reports, nothing for the cache calls and the health check; and
/// one rule that only a client certificate can meet.
const KFP_GATE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: kfp}
spec:
  trustDomain: cluster.local
  stripHeaders: [kubeflow-userid]
  tokenReview: {audiences: [pipelines.kubeflow.org]}
  rules:
    - name: the agent reports workflows
      grpc: {service: api.ReportService, methods: [ReportWorkflowV1]}
      callers: {serviceAccounts: [{namespace: kubeflow, name: ml-pipeline-persistenceagent}]}
    - name: cache lookups
      grpc: {service: api.TaskService, methods: [ListTasksV1, CreateTaskV1]}
      callers: {anonymous: true}
    - name: health
      http: {methods: [GET], path: /apis/v1beta1/healthz}
      callers: {anonymous: true}
    - name: drivers only
      grpc: {service: LMEvalJobUpdateService, methods: [UpdateStatus]}
      callers: {workloads: {kinds: [lmevaljob]}}
"#;

fn grpc_to(path: &str, body: Vec<u8>) -> Request<Full<Bytes>> {
    Request::post(format!("http://ml-pipeline:8887{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

fn forged(mut request: Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    for (name, value) in [("x-remote-user", "system:admin"), ("kubeflow-userid", "admin@example.com")] {
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    request
}

#[tokio::test]
async fn plaintext_callers_bring_a_token_or_nothing_over_http1_and_h2c() {
    let f = Fixture::start_with(KFP_GATE).await;
    let agent = "system:serviceaccount:kubeflow:ml-pipeline-persistenceagent";
    f.api
        .state
        .lock()
        .unwrap()
        .tokens
        .insert("agent-token".into(), (agent.into(), vec!["pipelines.kubeflow.org".into()]));
    let report = || grpc_to("/api.ReportService/ReportWorkflowV1", encode_strings(&[(1, "{\"kind\":\"Workflow\"}")]));

    let reported = f.call_plain(true, forged(bearer(report(), "agent-token"))).await;
    assert_eq!(reported.grpc(), ("0".to_string(), String::new()));
    let lookup = f.call_plain(true, forged(grpc_to("/api.TaskService/ListTasksV1", Vec::new()))).await;
    assert_eq!(lookup.grpc(), ("0".to_string(), String::new()));
    let health = f.call_plain(false, forged(http_get("/apis/v1beta1/healthz"))).await;
    assert_eq!(health.status, 200, "{}", health.text());
    assert_eq!(
        f.upstream_calls(),
        [
            format!("POST /api.ReportService/ReportWorkflowV1 HTTP/2.0 user={agent} groups=system:serviceaccounts|system:authenticated identity= kubeflow-userid= xfcc= body=26"),
            // Anonymous: the upstream learns of no one, whatever the caller wrote.
            "POST /api.TaskService/ListTasksV1 HTTP/2.0 user= groups= identity= kubeflow-userid= xfcc= body=0".to_string(),
            "GET /apis/v1beta1/healthz HTTP/1.1 user= groups= identity= kubeflow-userid= xfcc= body=0".to_string(),
        ]
    );

    // A route that is not open to anyone: no credential is a 401, and a certificate rule can
    // never match here.
    let no_token = f.call_plain(true, report()).await;
    let (status, message) = no_token.grpc();
    assert_eq!(status, "16");
    assert_eq!(
        percent_decode(&message),
        "keyward gate: no client certificate and no bearer token: present the keyward client certificate of your workload, or a service account token"
    );
    let driver = f.call_plain(true, update_status("evaljob-sample", "team-a")).await;
    assert_eq!(driver.grpc().0, "16");
    let other_method = f.call_plain(true, grpc_to("/api.TaskService/DeleteTaskV1", Vec::new())).await;
    assert_eq!(other_method.grpc().0, "16", "only the named methods are open");
    assert_eq!(f.upstream_calls().len(), 3, "refused calls never reach the upstream");
}

#[tokio::test]
async fn an_anonymous_route_takes_a_caller_with_a_credential_as_itself() {
    let f = Fixture::start_with(KFP_GATE).await;
    let driver = f.driver("team-a", "evaljob-sample");
    let lookup = f.call(true, Some(&driver), grpc_to("/api.TaskService/ListTasksV1", Vec::new())).await;
    assert_eq!(lookup.grpc().0, "0");
    let id = "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";
    assert_eq!(
        f.upstream_calls(),
        [format!("POST /api.TaskService/ListTasksV1 HTTP/2.0 user={id} groups=keyward:workloads|keyward:workloads:team-a|system:authenticated identity={id} kubeflow-userid= xfcc= body=0")]
    );
    // A token the API server rejects is refused even there, as the API server itself does.
    let forged = f.call(true, None, bearer(grpc_to("/api.TaskService/ListTasksV1", Vec::new()), "forged")).await;
    assert_eq!(forged.grpc().0, "16");
    assert_eq!(f.upstream_calls().len(), 1);
}

#[tokio::test]
async fn a_plaintext_connection_that_says_nothing_or_stalls_in_its_preface_is_closed() {
    let f = Fixture::start_with(KFP_GATE).await;
    for first in [&b""[..], b"PRI * HTTP/2.0\r\n", b"GET /apis/v1beta1/heal"] {
        let mut client = TcpStream::connect(f.plain).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut client, first).await.unwrap();
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(EVENT_TIMEOUT, client.read(&mut buf)).await.unwrap();
        // Closed without an answer, at the first request's deadline (timed from the connection's
        // start, whatever trickles in).
        assert!(matches!(read, Ok(0) | Err(_)), "{:?}: {read:?}", String::from_utf8_lossy(first));
    }
    let metrics = f.gate.shared.encode();
    let closed =
        "keyward_connections_closed_by_server_total{listener=\"gate-plaintext\",reason=\"first-request-timeout\"} 3";
    assert!(metrics.lines().any(|l| l == closed), "{metrics}");
}

/// An upstream that speaks HTTP/1.1 only, as many do: it answers an HTTP/2 preface with
/// nothing.
async fn spawn_http1_upstream(calls: Recorder) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let calls = calls.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| upstream(req, calls.clone()));
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_http2_caller_reaches_an_http1_only_upstream_unless_told_it_speaks_h2c() {
    let f = Fixture::start().await;
    let calls = Recorder::default();
    let http1_only = spawn_http1_upstream(calls.clone()).await;
    let driver = f.driver("team-a", "evaljob-sample");
    let path = "/apis/v1/namespaces/team-a/runs/r1";

    let auto = Upstream::new(
        &format!("http://{http1_only}"),
        upstream::UpstreamTls::default(),
        upstream::UpstreamProtocol::Auto,
        READ_TIMEOUT,
    )
    .unwrap();
    let gate = serve_with_upstream(&f, auto).await;
    let answer = f.send_at(gate, true, Some(&driver), http_get(path)).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.text().starts_with(&format!("GET {path} HTTP/1.1 user=spiffe://")), "{}", answer.text());

    // Told the upstream speaks HTTP/2 without TLS, the gate says it; this one cannot answer.
    let h2c = Upstream::new(
        &format!("http://{http1_only}"),
        upstream::UpstreamTls::default(),
        upstream::UpstreamProtocol::H2c,
        READ_TIMEOUT,
    )
    .unwrap();
    let gate = serve_with_upstream(&f, h2c).await;
    let answer = f.send_at(gate, true, Some(&driver), http_get(path)).await.unwrap();
    assert_eq!((answer.status, answer.text().as_str()), (502, "keyward gate: the upstream could not be reached\n"));
    // An upstream told to be HTTP/1.1 only refuses gRPC with the reason, not a failed connection.
    let http1 = Upstream::new(
        &format!("http://{http1_only}"),
        upstream::UpstreamTls::default(),
        upstream::UpstreamProtocol::Http1,
        READ_TIMEOUT,
    )
    .unwrap();
    let gate = serve_with_upstream(&f, http1).await;
    let answer = f.send_at(gate, true, Some(&driver), update_status("evaljob-sample", "team-a")).await.unwrap();
    let (status, message) = answer.grpc();
    assert_eq!(
        (status.as_str(), percent_decode(&message).as_str()),
        ("14", "keyward gate: gRPC needs HTTP/2, and this gate was told its upstream speaks HTTP/1.1 only (--upstream-protocol http1)")
    );
    assert_eq!(calls.calls.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn with_h2c_an_http2_caller_goes_on_as_http2_and_http1_stays_http1() {
    let f = Fixture::start().await;
    let driver = f.driver("team-a", "evaljob-sample");
    let path = "/apis/v1/namespaces/team-a/runs/r1";
    let upstream_addr = spawn_upstream(f.calls.clone(), None).await;
    let h2c = Upstream::new(
        &format!("http://{upstream_addr}"),
        upstream::UpstreamTls::default(),
        upstream::UpstreamProtocol::H2c,
        READ_TIMEOUT,
    )
    .unwrap();
    let gate = serve_with_upstream(&f, h2c).await;
    for h2 in [true, false] {
        let answer = f.send_at(gate, h2, Some(&driver), http_get(path)).await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let versions: Vec<String> = f.upstream_calls().iter().map(|c| c.split(' ').nth(2).unwrap().to_string()).collect();
    assert_eq!(versions, ["HTTP/2.0", "HTTP/1.1"]);
}

/// The inference-graph recipe, as ODH's router decides (opendatahub-io/kserve 3cf0a04,
/// cmd/router/main.go l.497-644): any user the API server authenticates, a person as well as a
/// service account, whom the SubjectAccessReview (the user alone) allows.
#[tokio::test]
async fn any_user_the_cluster_authenticates_reaches_the_graph_when_the_review_allows() {
    let recipe =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gate/recipes/inference-graph.yaml")).unwrap();
    let f = Fixture::start_with(&recipe).await;
    let runner = "system:serviceaccount:team-a:client";
    {
        let mut s = f.api.state.lock().unwrap();
        for (token, user) in [("alice-token", "alice"), ("bob-token", "bob"), ("runner-token", runner)] {
            s.tokens.insert(token.into(), (user.into(), vec![API_AUDIENCE.into()]));
        }
        s.tokens.insert("kfp-token".into(), ("carol".into(), vec!["pipelines.kubeflow.org".into()]));
        for user in ["alice", runner] {
            s.graphs.push((user.into(), "team-a".into(), "my-graph".into()));
        }
    }
    let predict = |token: &str| {
        bearer(
            Request::post("https://localhost/v1/models/x:predict").body(Full::new(Bytes::from_static(b"{}"))).unwrap(),
            token,
        )
    };
    for (token, user) in [("alice-token", "alice"), ("runner-token", runner)] {
        let answer = f.call(false, None, predict(token)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.text(),
            format!("POST /v1/models/x:predict HTTP/1.1 user={user} groups=system:serviceaccounts|system:authenticated identity= kubeflow-userid= xfcc= body=2")
        );
    }
    let bob = f.call(false, None, predict("bob-token")).await;
    assert_eq!(
        (bob.status, bob.text().as_str()),
        (403, "keyward gate: rule \"callers who may get the graph\": the API server does not allow bob to get inferencegraphs.serving.kserve.io \"my-graph\" in namespace \"team-a\"\n")
    );
    // A token bound to another audience is not the API server's: rejected, as the router's
    // TokenReview rejects it.
    let carol = f.call(false, None, predict("kfp-token")).await;
    assert_eq!(carol.status, 401, "{}", carol.text());
    assert_eq!(f.upstream_calls().len(), 2);
}

/// A server in the gate's own pod, reached on 127.0.0.1, whose certificate names its Service
/// (kube-rbac-proxy behind the gate in EvalHub's pod, with the operator's `<instance>-tls`):
/// verified for the name given, and refused for any other.
#[tokio::test]
async fn an_upstream_on_loopback_is_verified_for_the_name_its_certificate_holds() {
    let f = Fixture::start().await;
    let now = SystemTime::now();
    let service = "evalhub.evalhub-system.svc";
    let calls = Recorder::default();
    let krp =
        spawn_upstream(calls.clone(), Some(acceptor(&f.server_ca.issue_serving(&[service.into()], now, DAY).unwrap())))
            .await;
    let ca = f._dir.path().join("service-ca.crt");
    std::fs::write(&ca, f.server_ca.cert_pem()).unwrap();
    let driver = f.driver("team-a", "evaljob-sample");
    let path = "/apis/v1/namespaces/team-a/runs/r1";
    let url = format!("https://127.0.0.1:{}", krp.port());
    let named = |name| upstream::UpstreamTls { ca: Some(&ca), server_name: name };

    let right = Upstream::new(&url, named(Some(service)), upstream::UpstreamProtocol::Auto, READ_TIMEOUT).unwrap();
    let gate = serve_with_upstream(&f, right).await;
    let answer = f.send_at(gate, false, Some(&driver), http_get(path)).await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());

    // For the URL's host (127.0.0.1), or another Service's name, the certificate does not do.
    for name in [None, Some("other.evalhub-system.svc")] {
        let wrong = Upstream::new(&url, named(name), upstream::UpstreamProtocol::Auto, READ_TIMEOUT).unwrap();
        let gate = serve_with_upstream(&f, wrong).await;
        let answer = f.send_at(gate, false, Some(&driver), http_get(path)).await.unwrap();
        assert_eq!((answer.status, answer.text().as_str()), (502, "keyward gate: the upstream could not be reached\n"));
    }
    assert_eq!(calls.calls.lock().unwrap().len(), 1, "only the verified connection carried the request");

    let plain =
        Upstream::new("http://127.0.0.1:1", named(Some(service)), upstream::UpstreamProtocol::Auto, READ_TIMEOUT);
    assert_eq!(plain.unwrap_err(), "--upstream-ca: only for an https:// upstream");
    let none = upstream::UpstreamTls { ca: None, server_name: Some(service) };
    let plain = Upstream::new("http://127.0.0.1:1", none, upstream::UpstreamProtocol::Auto, READ_TIMEOUT);
    assert_eq!(plain.unwrap_err(), "--upstream-server-name: only for an https:// upstream");
    let bad = upstream::UpstreamTls { ca: Some(&ca), server_name: Some("not a name") };
    let bad = Upstream::new(&url, bad, upstream::UpstreamProtocol::Auto, READ_TIMEOUT);
    assert_eq!(
        bad.unwrap_err(),
        "--upstream-server-name \"not a name\": not a DNS name or IP address the certificate could be for"
    );
}

/// In front of kube-rbac-proxy (deploy/gate/evalhub): the paths a rule names are the rules'
/// alone, whatever the method; every other request goes on as sent, its token with it, for
/// kube-rbac-proxy to check, and the gate asks the API server nothing about it. What the
/// upstream would read as the caller (`X-User`, `X-Remote-User`) never passes.
#[tokio::test]
async fn with_unmatched_upstream_the_paths_no_rule_names_go_on_for_the_upstream_to_decide() {
    const PASS_ON: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: in-front-of-kube-rbac-proxy}
spec:
  unmatched: upstream
  userHeaders: [X-User]
  tokenReview: {audiences: []}
  rules:
    - name: a job account posts its namespace's events
      http: {methods: [POST], path: "/api/v1/evaluations/jobs/{id}/events"}
      callers: {serviceAccounts: [{namespace: tenant-a, name: evalhub-evalhub-job}]}
      when:
        - {caller: namespace, equals: {header: X-Tenant}}
"#;
    let f = Fixture::start_with(PASS_ON).await;
    let job = "system:serviceaccount:tenant-a:evalhub-evalhub-job";
    f.api.state.lock().unwrap().tokens.insert("job-token".into(), (job.into(), vec![API_AUDIENCE.into()]));
    let user_forged = |mut request: Request<Full<Bytes>>| {
        request.headers_mut().insert("x-user", "admin".parse().unwrap());
        forged(request)
    };

    // Not named by a rule: on to the upstream, as sent, with the token, and no review asked.
    let health = f.call(false, None, user_forged(http_get("/api/v1/health"))).await;
    assert_eq!(health.status, 200, "{}", health.text());
    let list = f.call(true, None, user_forged(bearer(http_get("/api/v1/evaluations/jobs?limit=5"), "job-token"))).await;
    assert_eq!(list.status, 200, "{}", list.text());
    assert_eq!(f.api.counts(), (0, 0), "the upstream authenticates what no rule names");
    let seen = f.upstream_seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].headers.get("authorization").unwrap(), "Bearer job-token");
    for call in &seen {
        for name in ["x-user", "x-remote-user"] {
            assert!(call.headers.get(name).is_none(), "{name} passed: {:?}", call.headers);
        }
    }
    assert_eq!(
        f.upstream_calls()[0],
        "GET /api/v1/health HTTP/1.1 user= groups= identity= kubeflow-userid=admin@example.com xfcc= body=0"
    );

    // Named by a rule: the rule decides, for every method; its caller is the verified one.
    let post = |tenant: &str| {
        let request = Request::post("https://localhost/api/v1/evaluations/jobs/job-a/events")
            .header("x-tenant", tenant)
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        user_forged(bearer(request, "job-token"))
    };
    let own = f.call(false, None, post("tenant-a")).await;
    assert_eq!(own.status, 200, "{}", own.text());
    assert_eq!(f.upstream_seen()[2].headers.get("x-user").unwrap(), job);
    let other = f.call(false, None, post("tenant-b")).await;
    assert_eq!(other.status, 403, "{}", other.text());
    let get = f.call(false, None, bearer(http_get("/api/v1/evaluations/jobs/job-a/events"), "job-token")).await;
    assert_eq!(get.status, 403, "{}", get.text());
    assert!(get.text().contains("no rule of this gate covers this method and path"), "{}", get.text());
    let anonymous = f.call(false, None, http_get("/api/v1/evaluations/jobs/job-a/events")).await;
    assert_eq!(anonymous.status, 401, "{}", anonymous.text());

    // A path the upstream could decode into a named one is refused, never passed on.
    // Refused before any token is looked at: this one the API server would not know.
    let reviews = f.api.counts();
    let encoded = f.call(false, None, bearer(http_get("/api/v1/evaluations/jobs/job-a/%65vents"), "made-up")).await;
    assert_eq!(f.api.counts(), reviews);
    assert_eq!(
        (encoded.status, encoded.text().as_str()),
        (403, "keyward gate: path \"/api/v1/evaluations/jobs/job-a/%65vents\" holds a percent-encoding, which the upstream may decode into a path this gate's rules name, and no rule names it as sent; send it unencoded\n")
    );
    assert_eq!(f.upstream_seen().len(), 3, "nothing refused reached the upstream");
}
