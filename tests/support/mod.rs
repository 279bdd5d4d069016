//! Black-box harness: start the real `keyward serve` on loopback with certificates in a temp
//! dir, talk to it over real TLS, and wait on its log lines (never on fixed sleeps).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is the failure report

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use keyward_certs::pki::{Ca, Minted};
pub use keyward_certs::testing::KubeletVolume;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

pub const SERVER_NAME: &str = "keyward.keyward-system.svc";
pub const DAY: Duration = Duration::from_secs(24 * 3600);
/// Only turns a hang into a failure; tests proceed the moment the event arrives.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(60);

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)).unwrap()
}

pub fn mint_ca() -> Ca {
    Ca::mint("keyward test CA", SystemTime::now(), 30 * DAY).unwrap()
}

pub fn mint_leaf(ca: &Ca) -> Minted {
    ca.issue_serving(&[SERVER_NAME.to_string(), "localhost".to_string()], SystemTime::now(), DAY).unwrap()
}

pub fn sha256(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, der).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

pub fn leaf_sha(minted: &Minted) -> String {
    sha256(CertificateDer::from_pem_slice(minted.cert_pem.as_bytes()).unwrap().as_ref())
}

/// tls.crt, tls.key and ca.crt, as in a cert-manager Secret.
pub fn secret_files<'a>(minted: &'a Minted, ca: &'a Ca) -> [(&'static str, &'a [u8]); 3] {
    [
        ("tls.crt", minted.cert_pem.as_bytes()),
        ("tls.key", minted.key_pem.as_bytes()),
        ("ca.crt", ca.cert_pem().as_bytes()),
    ]
}

/// A running `keyward serve`, killed on drop.
pub struct Server {
    child: Child,
    logs: mpsc::Receiver<Value>,
    history: Vec<Value>,
    pub endpoint: Endpoint,
    /// The attestation key directory given when the test gave none (the built-in `lmeval`
    /// profile issues per-owner credentials, so its pods are attested).
    pub attestation_dir: Option<tempfile::TempDir>,
}

/// The engine's attestor over the keys in a directory (what `keyward serve` signs with).
pub struct DirAttestor;

impl DirAttestor {
    pub fn load(dir: &std::path::Path) -> keyward_controller::attestation::KeysAttestor {
        let store = keyward_certs::attestation::KeyStore::new(dir);
        store.load().unwrap();
        keyward_controller::attestation::KeysAttestor((*store.keys()).clone())
    }
}

/// A directory holding an attestation key, laid out as the mounted Secret keyward-attestation.
pub fn attestation_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("current"), keyward_certs::attestation::generate().unwrap()).unwrap();
    dir
}

/// How to reach a running server; cheap to clone into client tasks.
#[derive(Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    pub ca_pem: Vec<u8>,
}

impl Server {
    /// Starts keyward with `args` added to the loopback listeners and JSON logs, and waits
    /// until both listeners are up.
    pub fn start(args: &[&str], ca_pem: Vec<u8>) -> Server {
        Self::spawn(Command::new(keyward_bin()), args, ca_pem, false)
    }

    /// Starts `keyward gate` with `args` added to the loopback listeners and JSON logs, and
    /// waits until both listeners are up; `quiet` as in [`Server::start_quiet`].
    pub fn start_gate(args: &[&str], ca_pem: Vec<u8>, quiet: bool) -> Server {
        let mut command = Command::new(keyward_bin());
        command.arg("gate");
        Self::spawn(command, args, ca_pem, quiet)
    }

    /// Like [`Server::start_gate`], with `env` set for the process (`KUBECONFIG`, say).
    pub fn start_gate_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)], ca_pem: Vec<u8>) -> Server {
        let mut command = Command::new(keyward_bin());
        command.arg("gate").envs(env.iter().copied());
        Self::spawn(command, args, ca_pem, false)
    }

    /// Like [`Server::start`], but once it listens its log lines are discarded unread (for
    /// benchmarks: parsing them would load the machine being measured).
    pub fn start_quiet(args: &[&str], ca_pem: Vec<u8>) -> Server {
        Self::spawn(Command::new(keyward_bin()), args, ca_pem, true)
    }

    /// Like [`Server::start`], with the process's open-files limit (soft and hard) set to
    /// `nofile`, as `ulimit -n` or a container runtime would.
    pub fn start_with_open_files(nofile: u32, args: &[&str], ca_pem: Vec<u8>) -> Server {
        let mut command = Command::new("bash");
        command.args(["-c", &format!("ulimit -n {nofile} && exec \"$0\" \"$@\"")]).arg(keyward_bin());
        Self::spawn(command, args, ca_pem, false)
    }

    fn spawn(mut command: Command, args: &[&str], ca_pem: Vec<u8>, quiet: bool) -> Server {
        let given = |flag: &str| args.iter().any(|a| a.starts_with(flag));
        let gate = command.get_args().next().is_some_and(|a| a == "gate");
        let role = if gate { "gate" } else { "webhook" };
        let attestation_dir = (!gate && given("--tls-dir") && !given("--attestation-key-dir")).then(attestation_dir);
        match (&attestation_dir, gate) {
            (_, true) => {}
            (Some(dir), false) => {
                command.arg("serve").arg("--attestation-key-dir").arg(dir.path());
            }
            (None, false) => {
                command.arg("serve");
            }
        }
        if !given("--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        let mut child = command
            .args(["--metrics-listen", "127.0.0.1:0", "--log-format", "json"])
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("RUST_LOG", std::env::var("KEYWARD_TEST_RUST_LOG").unwrap_or_else(|_| "info".into()))
            .env_remove("KEYWARD_PROFILES")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, logs) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) => {
                        let listening = v["role"] == role && v["addr"].is_string();
                        if tx.send(v).is_err() {
                            return;
                        }
                        if quiet && listening {
                            let _ = std::io::copy(&mut reader, &mut std::io::sink());
                            return;
                        }
                    }
                    Err(_) => eprintln!("keyward (not JSON): {line}"),
                }
                line.clear();
            }
        });
        let unbound: SocketAddr = ([0, 0, 0, 0], 0).into();
        let mut server = Server {
            child,
            logs,
            history: Vec::new(),
            endpoint: Endpoint { addr: unbound, metrics: unbound, ca_pem },
            attestation_dir,
        };
        let webhook =
            server.wait_log(|v| v["message"].as_str().is_some_and(|m| m.starts_with("listening")) && v["role"] == role);
        server.endpoint.addr = webhook["addr"].as_str().unwrap().parse().unwrap();
        server
    }

    /// Waits for a log line matching `pred`, returning it; earlier lines are consumed.
    pub fn wait_log(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.logs.recv_timeout(left) {
                Ok(v) => {
                    if v["role"] == "metrics" && v["addr"].is_string() {
                        self.endpoint.metrics = v["addr"].as_str().unwrap().parse().unwrap();
                    }
                    self.history.push(v.clone());
                    if pred(&v) {
                        return v;
                    }
                }
                Err(e) => panic!("no matching log line from keyward: {e}"),
            }
        }
    }

    /// Every log line received so far, including those not yet read by a wait.
    pub fn all_logs(&mut self) -> &[Value] {
        while let Ok(v) = self.logs.try_recv() {
            self.history.push(v);
        }
        &self.history
    }

    /// A log line already received (by any earlier wait) that matches `pred`.
    pub fn seen(&self, pred: impl Fn(&Value) -> bool) -> Option<&Value> {
        self.history.iter().find(|v| pred(v))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        self.child.wait().unwrap()
    }
}

/// A client TLS configuration that trusts `ca_pem`, presents `identity`'s certificate when
/// The keyward binary the tests and benchmarks run: `KEYWARD_BIN` when set (another build of
/// it, to compare), else the one cargo built for this test.
pub fn keyward_bin() -> std::ffi::OsString {
    std::env::var_os("KEYWARD_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_keyward").into())
}

/// given (a keyward workload's, to `keyward gate`), and offers `alpn`.
pub fn client_config(ca_pem: &[u8], identity: Option<&Minted>, alpn: &[u8]) -> rustls::ClientConfig {
    client_config_with(go_client_provider(), ca_pem, identity, alpn)
}

/// ring's suites in the order Go's crypto/tls client offers them on AES hardware (the
/// apiserver's webhook client, the served systems' drivers; `defaultCipherSuitesTLS13` and
/// `cipherSuitesPreferenceOrder` in Go 1.19's crypto/tls/cipher_suites.go, Debian's golang-go):
/// TLS_AES_128_GCM_SHA256 first, where rustls' default puts TLS_AES_256_GCM_SHA384 first. A
/// test or benchmark then negotiates what keyward's real clients do.
pub fn go_client_provider() -> rustls::crypto::CryptoProvider {
    use rustls::crypto::ring::cipher_suite::*;
    rustls::crypto::CryptoProvider {
        cipher_suites: vec![
            TLS13_AES_128_GCM_SHA256,
            TLS13_AES_256_GCM_SHA384,
            TLS13_CHACHA20_POLY1305_SHA256,
            TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::ring::default_provider()
    }
}

/// As [`client_config`], offering what `provider` holds (the benchmarks: one cipher suite).
pub fn client_config_with(
    provider: rustls::crypto::CryptoProvider,
    ca_pem: &[u8],
    identity: Option<&Minted>,
    alpn: &[u8],
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(provider);
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(m) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(m.cert_pem.as_bytes()).unwrap()],
                rustls::pki_types::PrivateKeyDer::from_pem_slice(m.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    config
}

impl Endpoint {
    pub fn connector(&self, alpn: &[&[u8]]) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.ca_pem) {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = Arc::new(go_client_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        TlsConnector::from(Arc::new(config))
    }

    /// A TLS stream with nothing on top (ALPN http/1.1), for hand-written HTTP.
    pub async fn raw_tls(&self) -> tokio_rustls::client::TlsStream<TcpStream> {
        self.raw_tls_alpn(b"http/1.1").await
    }

    /// A TLS stream that offered only `alpn`, with nothing on top.
    pub async fn raw_tls_alpn(&self, alpn: &[u8]) -> tokio_rustls::client::TlsStream<TcpStream> {
        self.try_raw_tls_alpn(alpn).await.unwrap()
    }

    pub async fn try_raw_tls_alpn(&self, alpn: &[u8]) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
        let tcp = TcpStream::connect(self.addr).await.map_err(|e| format!("connect: {e}"))?;
        self.connector(&[alpn])
            .connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))
    }

    /// A new TLS connection (verifying the CA, SNI keyward.keyward-system.svc, ALPN http/1.1,
    /// as the apiserver does) with an HTTP/1.1 client on it. Returns the client and the
    /// SHA-256 of the certificate the server presented.
    pub async fn connect(&self) -> Result<(Http1, String), String> {
        self.connect_nagle(false).await
    }

    /// As [`Self::connect`], with Nagle's algorithm on the client's socket when `nagle` (the
    /// apiserver's client never has it: Go sets TCP_NODELAY on every TCP connection). For the
    /// benchmark that shows what it costs a large body (`git show be0eae7:BENCHMARKS.md`, "The
    /// 200 KB pod's tail").
    pub async fn connect_nagle(&self, nagle: bool) -> Result<(Http1, String), String> {
        let tcp = TcpStream::connect(self.addr).await.map_err(|e| format!("connect: {e}"))?;
        tcp.set_nodelay(!nagle).map_err(|e| format!("TCP_NODELAY: {e}"))?;
        self.http1_over(tcp).await
    }

    /// As [`Self::connect`], from the loopback address `source` (127.0.0.2, say): another
    /// client than one on 127.0.0.1, as the apiserver is another host than an attacking pod.
    pub async fn connect_from(&self, source: std::net::Ipv4Addr) -> Result<(Http1, String), String> {
        let socket = tokio::net::TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
        socket.bind((source, 0).into()).map_err(|e| format!("bind {source}: {e}"))?;
        let tcp = socket.connect(self.addr).await.map_err(|e| format!("connect from {source}: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| format!("TCP_NODELAY: {e}"))?;
        self.http1_over(tcp).await
    }

    async fn http1_over(&self, tcp: TcpStream) -> Result<(Http1, String), String> {
        let tls = self
            .connector(&[b"http/1.1"])
            .connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (_, session) = tls.get_ref();
        let peer = sha256(session.peer_certificates().and_then(|c| c.first()).map(|c| c.as_ref()).unwrap_or_default());
        assert_eq!(session.alpn_protocol(), Some(&b"http/1.1"[..]));
        let (send, conn) = http1::handshake(TokioIo::new(tls)).await.map_err(|e| format!("HTTP: {e}"))?;
        tokio::spawn(conn);
        Ok((Http1 { send }, peer))
    }
}

impl Endpoint {
    /// GET /metrics over plain HTTP/1.1.
    pub async fn metrics_text(&self) -> String {
        let (status, out) = self.metrics_get("/metrics").await;
        assert_eq!(status, 200, "{out}");
        out
    }

    /// GET `path` on the metrics port (plain HTTP/1.1): the status and the whole response.
    pub async fn metrics_get(&self, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = TcpStream::connect(self.metrics).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nhost: metrics\r\nconnection: close\r\n\r\n");
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        tcp.read_to_string(&mut out).await.unwrap();
        let status = out.get(9..12).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not HTTP: {out}"));
        (status, out)
    }

    /// Waits until a sample in /metrics reads `value` (the server may record an event just
    /// after the client sees it), and fails with the last reading if it never does.
    pub async fn wait_metric(&self, sample: &str, value: f64) {
        let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
        loop {
            let now = self.metric(sample).await;
            if now == value {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{sample} is {now}, never {value}");
            tokio::task::yield_now().await;
        }
    }

    /// The value of one sample (`name{labels}`) in /metrics, 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|l| l.strip_prefix(sample).and_then(|rest| rest.strip_prefix(' ')))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }
}

impl std::ops::Deref for Server {
    type Target = Endpoint;
    fn deref(&self) -> &Endpoint {
        &self.endpoint
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Http1 {
    send: http1::SendRequest<Full<Bytes>>,
}

impl Http1 {
    pub async fn request(&mut self, method: &str, path: &str, body: Vec<u8>) -> Result<(u16, Vec<u8>), String> {
        self.send.ready().await.map_err(|e| format!("not ready: {e}"))?;
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", SERVER_NAME)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let resp = self.send.send_request(req).await.map_err(|e| format!("request: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| format!("body: {e}"))?.to_bytes().to_vec();
        Ok((status, body))
    }

    /// POSTs an AdmissionReview and says whether it was allowed, without parsing the answer
    /// (for load generators, which should cost the machine as little as they can).
    pub async fn mutate_allowed(&mut self, review: &[u8]) -> Result<bool, String> {
        let (status, body) = self.request("POST", "/mutate?timeout=10s", review.to_vec()).await?;
        if status != 200 {
            return Err(format!("status {status}: {}", String::from_utf8_lossy(&body)));
        }
        Ok(body.windows(14).any(|w| w == b"\"allowed\":true"))
    }

    /// POSTs an AdmissionReview to /mutate?timeout=10s, as the apiserver does.
    pub async fn mutate(&mut self, review: &[u8]) -> Result<Value, String> {
        let (status, body) = self.request("POST", "/mutate?timeout=10s", review.to_vec()).await?;
        if status != 200 {
            return Err(format!("status {status}: {}", String::from_utf8_lossy(&body)));
        }
        serde_json::from_slice(&body).map_err(|e| format!("response is not JSON: {e}"))
    }
}

/// A review of `pod` (a fixture name) from `user` in `namespace`.
pub fn review_of(pod: &str, namespace: &str, user: &str, uid: &str) -> Vec<u8> {
    let object: Value = serde_json::from_slice(&fixture(pod)).unwrap();
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    }))
    .unwrap()
}

/// A TLS directory with a fresh CA and leaf, laid out by the kubelet.
pub struct TlsDir {
    pub tmp: tempfile::TempDir,
    pub ca: Ca,
    pub volume: KubeletVolume,
    pub first: Minted,
}

impl TlsDir {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let ca = mint_ca();
        let first = mint_leaf(&ca);
        let volume = KubeletVolume::new(tmp.path(), &secret_files(&first, &ca));
        Self { tmp, ca, volume, first }
    }

    pub fn path(&self) -> &str {
        self.tmp.path().to_str().unwrap()
    }

    pub fn start(&self, extra: &[&str]) -> Server {
        let mut args = vec!["--tls-dir", self.path()];
        args.extend_from_slice(extra);
        Server::start(&args, self.ca.cert_pem().as_bytes().to_vec())
    }

    pub fn start_quiet(&self, extra: &[&str]) -> Server {
        let mut args = vec!["--tls-dir", self.path()];
        args.extend_from_slice(extra);
        Server::start_quiet(&args, self.ca.cert_pem().as_bytes().to_vec())
    }
}

// === the admission policy, as the apiserver evaluates it ===

/// What the apiserver decides on a pod request under a ValidatingAdmissionPolicy: its match
/// conditions, then each validation, evaluated as CEL with the variables the apiserver binds
/// (`object`, `oldObject` null on CREATE, `request`, `namespaceObject`). `Ok` when admitted,
/// else the refusing validation's message.
pub fn policy_admits(
    policy: &Value,
    operation: &str,
    object: &Value,
    old: &Value,
    namespace: &Value,
) -> Result<(), String> {
    let mut context = cel::Context::default();
    context.add_variable("object", cel::to_value(object).unwrap()).unwrap();
    context.add_variable("oldObject", cel::to_value(old).unwrap()).unwrap();
    context.add_variable("request", cel::to_value(serde_json::json!({"operation": operation})).unwrap()).unwrap();
    context.add_variable("namespaceObject", cel::to_value(namespace).unwrap()).unwrap();
    let holds = |expression: &str| {
        let program = cel::Program::compile(expression).unwrap_or_else(|e| panic!("{expression}: {e}"));
        match program.execute(&context) {
            Ok(cel::Value::Bool(b)) => b,
            // An error would be failurePolicy: Fail, a refusal: never what a pod should meet.
            other => panic!("{expression} on {object}: {other:?}"),
        }
    };
    let spec = &policy["spec"];
    if !spec["matchConditions"].as_array().unwrap().iter().all(|c| holds(c["expression"].as_str().unwrap())) {
        return Ok(());
    }
    for v in spec["validations"].as_array().unwrap() {
        if !holds(v["expression"].as_str().unwrap()) {
            return Err(v["message"].as_str().unwrap().to_string());
        }
    }
    Ok(())
}

/// The ValidatingAdmissionPolicy keyward ships (`deploy/base/attestation-policy.yaml`).
pub fn attestation_policy() -> Value {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/base/attestation-policy.yaml")).unwrap();
    let docs = keyward_engine::yaml::documents(&text).unwrap();
    docs.into_iter().map(|d| d.value).find(|d| d["kind"] == "ValidatingAdmissionPolicy").unwrap()
}

/// A command some tests run besides cargo's own: `kubectl` (1.27 or later, with kustomize built
/// in), `openssl` or `bash`. One missing from the PATH fails the test with one line that names
/// it, not a `No such file or directory` from deep inside the test (README, "Prerequisites").
pub fn tool(name: &str) -> Command {
    require(name);
    Command::new(name)
}

/// Fails the test with one line when `name` is not on the PATH (see [`tool`]).
pub fn require(name: &str) {
    let on_path =
        std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()));
    if !on_path {
        let what = match name {
            "kubectl" => "kubectl 1.27 or later (it has kustomize built in), which renders deploy/",
            "openssl" => "the openssl command line tool, which the e2e's mTLS check runs",
            _ => name,
        };
        panic!("this test needs {what}: `{name}` is not on the PATH (README, \"Prerequisites\")");
    }
}

/// A TLS handshake by `openssl s_client` to `addr`, sending `sni` as the server name (any
/// bytes: openssl, as Go's crypto/tls, does not check that it is a DNS name) and verifying the
/// server's certificate against `ca_file`. `Ok`: it completed and verified; `Err`: what openssl
/// said.
pub fn openssl_handshake(addr: SocketAddr, ca_file: &Path, sni: &str) -> Result<String, String> {
    let output = tool("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-servername", sni, "-brief", "-verify_return_error"])
        .arg("-CAfile")
        .arg(ca_file)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if output.status.success() && said.contains("CONNECTION ESTABLISHED") && said.contains("Verification: OK") {
        Ok(said)
    } else {
        Err(said)
    }
}
