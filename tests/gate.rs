//! `keyward gate` as a process, over real TLS with a real upstream: what the README's "Try it"
//! runs (a development certificate, the client CA, a gate file), its reloads, its metrics port,
//! its shutdown, and the connection attacks the webhook resists. The rules themselves and the
//! API server's reviews are tested in process (`src/gate/tests.rs`). Each wait is on an event:
//! a response, a log line, a closed socket.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use keyward_certs::pki::{Ca, Minted};
use rustls::pki_types::ServerName;
use support::*;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

const GATE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: jobs}
spec:
  trustDomain: cluster.local
  rules:
    - name: a job reads its own namespace's runs
      http: {methods: [GET], path: "/namespaces/{namespace}/runs"}
      callers: {workloads: {kinds: [lmevaljob]}}
      when:
        - {caller: namespace, equals: {pathSegment: namespace}}
"#;

/// An upstream that answers with the identity the gate told it.
async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: hyper::Request<Incoming>| async move {
                    let user = req.headers().get("x-remote-user").map(|v| v.to_str().unwrap().to_string());
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(format!(
                        "upstream saw {} {} as {}",
                        req.method(),
                        req.uri().path(),
                        user.unwrap_or_default()
                    )))))
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
            });
        }
    });
    addr
}

struct Setup {
    dir: tempfile::TempDir,
    client_ca: Ca,
    upstream: SocketAddr,
}

impl Setup {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let client_ca = Ca::mint("keyward client CA", SystemTime::now(), DAY).unwrap();
        std::fs::create_dir(dir.path().join("gate")).unwrap();
        std::fs::write(dir.path().join("gate/gate.yaml"), GATE).unwrap();
        std::fs::write(dir.path().join("client-ca.crt"), client_ca.cert_pem()).unwrap();
        Self { dir, client_ca, upstream: upstream().await }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }

    fn start(&self, extra: &[&str]) -> Server {
        let upstream = format!("http://{}", self.upstream);
        let (config, ca, dev) = (self.path("gate/gate.yaml"), self.path("client-ca.crt"), self.path("dev"));
        let mut args = vec!["--config", &config, "--upstream", &upstream, "--client-ca", &ca, "--dev-cert-dir", &dev];
        args.extend_from_slice(extra);
        let mut server = Server::start_gate(&args, Vec::new(), false);
        server.endpoint.ca_pem = std::fs::read(self.dir.path().join("dev/ca.crt")).unwrap();
        server
    }

    fn driver(&self, namespace: &str) -> Minted {
        self.client_ca
            .issue_client_identity(
                &[(keyward_certs::DnType::CommonName, "job")],
                &format!("spiffe://cluster.local/ns/{namespace}/lmevaljob/job"),
                SystemTime::now(),
                DAY,
            )
            .unwrap()
    }
}

/// One GET over a new TLS connection, with `identity`'s certificate if given.
async fn get(server: &Server, identity: Option<&Minted>, path: &str) -> (u16, String) {
    let tls = client_config(&server.endpoint.ca_pem, identity, b"http/1.1");
    let tcp = TcpStream::connect(server.endpoint.addr).await.unwrap();
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::get(path).header("host", SERVER_NAME).body(Full::new(Bytes::new())).unwrap();
    let response = tokio::time::timeout(EVENT_TIMEOUT, sender.send_request(request)).await.unwrap().unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn write(path: &Path, text: &str) {
    // As the kubelet updates a mounted ConfigMap: a new file renamed into place.
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(next, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_serves_a_dev_certificate_allows_by_its_file_and_reloads_it() {
    let setup = Setup::new().await;
    let mut gate = setup.start(&[]);
    let team_a = setup.driver("team-a");
    assert_eq!(
        get(&gate, Some(&team_a), "/namespaces/team-a/runs").await,
        (200, "upstream saw GET /namespaces/team-a/runs as spiffe://cluster.local/ns/team-a/lmevaljob/job".into())
    );
    let (status, body) = get(&gate, Some(&team_a), "/namespaces/team-b/runs").await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = get(&gate, None, "/namespaces/team-a/runs").await;
    assert_eq!((status, body.as_str()), (401, "keyward gate: no client certificate: present the keyward client certificate of your workload (this gate takes no bearer tokens)\n"));
    let refused = gate.wait_log(|v| v["message"] == "gate refused a request" && v["decision"] == "unauthenticated");
    assert_eq!(refused["path"], "\"/namespaces/team-a/runs\"", "request values are quoted in the log");

    // A good file replaces the rules; a bad one changes nothing.
    let file = setup.dir.path().join("gate/gate.yaml");
    write(&file, &GATE.replace("methods: [GET]", "methods: [POST]"));
    gate.wait_log(|v| v["message"] == "gate file reloaded");
    assert_eq!(get(&gate, Some(&team_a), "/namespaces/team-a/runs").await.0, 403);
    write(&file, "kind: Gate\n");
    gate.wait_log(|v| v["message"] == "gate file refused; the rules in force are unchanged");
    assert_eq!(get(&gate, Some(&team_a), "/namespaces/team-a/runs").await.0, 403);
    write(&file, GATE);
    gate.wait_log(|v| v["message"] == "gate file reloaded");
    assert_eq!(get(&gate, Some(&team_a), "/namespaces/team-a/runs").await.0, 200);

    let (status, ready) = gate.metrics_get("/readyz").await;
    assert!(status == 200 && ready.ends_with("\r\n\r\nok\n"), "{ready}");
    let (_, metrics) = gate.metrics_get("/metrics").await;
    for line in [
        "keyward_gate_requests_total{rule=\"a job reads its own namespace's runs\",decision=\"allowed\"} 2",
        "keyward_gate_requests_total{rule=\"\",decision=\"unauthenticated\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    // The bad file, refused at least once: every look at it while it stays (its change, and
    // each poll that comes before the good file is back) counts again, which is what keeps
    // KeywardGateReloadFailing firing while a bad file stays; how many polls fell in between
    // depends on the machine.
    let failed = metrics
        .lines()
        .find_map(|l| l.strip_prefix("keyward_gate_reloads_total{file=\"gate\",result=\"failed\"} "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(failed.is_some_and(|n| n >= 1), "failed reloads: {failed:?} in\n{metrics}");
    assert!(gate.terminate().success());
}

/// The commands of docs/gate.md's "Try it", each line as a list of words (continuations
/// joined), from the block's `cargo run --` and `curl` lines.
fn try_it_commands() -> Vec<Vec<String>> {
    let docs = std::fs::read_to_string(format!("{}/docs/gate.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let section = docs.split("\n## Try it\n").nth(1).unwrap().split("\n## ").next().unwrap();
    let mut commands = Vec::new();
    let mut line = String::new();
    for block in section.split("```sh\n").skip(1) {
        for text in block.split("```").next().unwrap().lines() {
            line.push_str(text.trim_end_matches('\\'));
            line.push(' ');
            if !text.ends_with('\\') {
                let words = shell_words(&line);
                if words.first().is_some_and(|w| w == "cargo" || w == "curl") {
                    commands.push(words);
                }
                line.clear();
            }
        }
    }
    commands
}

/// A command line's words, as a shell splits them: on spaces, outside single quotes.
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted) = (Vec::new(), String::new(), false);
    for c in line.chars() {
        match c {
            '\'' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// docs/gate.md's "Try it", as written: the certificates `certs mint` makes, the example gate
/// file, the flags; a job's own status passes, another job's is refused, no certificate is not
/// authenticated. (The upstream here stands in for the block's `python3 -m http.server`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_docs_try_it_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap().to_string();
    let upstream = format!("http://{}", upstream().await);
    let local = |words: &[String]| -> Vec<String> {
        words
            .iter()
            .filter(|w| *w != "&")
            .map(|w| w.replace("/tmp/try-gate", &out).replace("http://127.0.0.1:8082", &upstream))
            .collect()
    };
    let commands = try_it_commands();
    let cargo: Vec<Vec<String>> = commands.iter().filter(|c| c[0] == "cargo").map(|c| local(&c[3..])).collect();
    assert_eq!(cargo.iter().map(|c| c[0].as_str()).collect::<Vec<_>>(), ["certs", "gate", "check-gate"]);
    let minted = std::process::Command::new(env!("CARGO_BIN_EXE_keyward"))
        .args(&cargo[0])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(minted.status.success(), "{}", String::from_utf8_lossy(&minted.stderr));
    // issue 58: the laptop's gate listens on loopback only, both ports. The harness gives it
    // free ports of its own (the metrics port always, so the block's goes).
    let flag = |name: &str| cargo[1].iter().position(|w| w == name).map(|i| cargo[1][i + 1].as_str());
    assert_eq!((flag("--listen"), flag("--metrics-listen")), (Some("127.0.0.1:8444"), Some("127.0.0.1:9091")));
    let mut gate_args: Vec<&str> = Vec::new();
    let mut words = cargo[1][1..].iter().map(String::as_str);
    while let Some(word) = words.next() {
        match word {
            "--metrics-listen" => {
                words.next();
            }
            "127.0.0.1:8444" => gate_args.push("127.0.0.1:0"),
            other => gate_args.push(other),
        }
    }
    let mut gate = Server::start_gate(&gate_args, std::fs::read(dir.path().join("serving/ca.crt")).unwrap(), false);
    let client = Minted {
        cert_pem: std::fs::read_to_string(dir.path().join("client/tls.crt")).unwrap(),
        key_pem: std::fs::read_to_string(dir.path().join("client/tls.key")).unwrap(),
    };
    let mut answers = Vec::new();
    for curl in commands.iter().filter(|c| c[0] == "curl") {
        let url = curl.last().unwrap();
        let path = url.strip_prefix("https://localhost:8444").unwrap();
        let identity = curl.iter().any(|w| w == "--cert").then_some(&client);
        let tls = client_config(&gate.endpoint.ca_pem, identity, b"http/1.1");
        let tcp = TcpStream::connect(gate.endpoint.addr).await.unwrap();
        let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let request = hyper::Request::get(path).header("host", "localhost").body(Full::new(Bytes::new())).unwrap();
        let response = tokio::time::timeout(EVENT_TIMEOUT, sender.send_request(request)).await.unwrap().unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        answers.push((status, String::from_utf8_lossy(&body).into_owned()));
    }
    assert_eq!(
        answers,
        [
            (200, "upstream saw GET /jobs/team-a/evaljob-sample/status as spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample".to_string()),
            (403, "keyward gate: rule \"a job reads only its own status\": the caller's name is \"evaljob-sample\", and path segment {name} is \"other-job\"\n".to_string()),
            // issue 58: the try-it gate takes no tokens, and its refusal offers none.
            (401, "keyward gate: no client certificate: present the keyward client certificate of your workload (this gate takes no bearer tokens)\n".to_string()),
        ]
    );
    assert!(gate.terminate().success());
    // The recipe's offline decision.
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_keyward"))
        .args(&cargo[2])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert_eq!(checked.status.code(), Some(0), "{}", String::from_utf8_lossy(&checked.stdout));
}

/// fms-lm-eval-service's driver sets `ServerName` to `<service>.<namespace>.svc:8082`
/// (backend/driver/driver.go @ 38689a3, l.161-167), and Go sends it as the SNI: the gate's
/// handshake completes with the certificate it serves (the driver verifies that certificate's
/// `host:port` name itself; tests/interop.rs runs the driver's Go client). A client the gate
/// refuses at the handshake is said at info, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_name_with_a_port_is_served_and_a_refused_handshake_is_logged_with_its_reason() {
    let setup = Setup::new().await;
    let mut gate = setup.start(&["--dns-name", "lm-eval-grpc.lm-eval.svc:8082"]);
    let said =
        openssl_handshake(gate.endpoint.addr, &setup.dir.path().join("dev/ca.crt"), "lm-eval-grpc.lm-eval.svc:8082");
    assert!(said.is_ok(), "{said:?}");
    assert!(gate.all_logs().iter().all(|v| v["message"] != "TLS handshake refused"));

    let stranger = Ca::mint("another CA", SystemTime::now(), DAY).unwrap();
    let foreign = stranger
        .issue_client_identity(&[], "spiffe://cluster.local/ns/team-a/lmevaljob/job", SystemTime::now(), DAY)
        .unwrap();
    let tls = client_config(&gate.endpoint.ca_pem, Some(&foreign), b"http/1.1");
    let tcp = TcpStream::connect(gate.endpoint.addr).await.unwrap();
    let mut stream =
        tokio_rustls::TlsConnector::from(Arc::new(tls)).connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp).await;
    if let Ok(stream) = &mut stream {
        // TLS 1.3: the client learns of the refusal on its first read.
        let _ = tokio::time::timeout(EVENT_TIMEOUT, stream.read(&mut [0u8; 1])).await.unwrap();
    }
    let refused = gate.wait_log(|v| v["message"].as_str().is_some_and(|m| m.starts_with("TLS handshake refused")));
    assert_eq!(refused["level"], "INFO", "{refused}");
    assert_eq!(refused["role"], "gate");
    assert_eq!(refused["not_logged"], 0);
    let error = refused["error"].as_str().unwrap();
    assert!(error.contains("UnknownIssuer"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_resists_the_webhooks_connection_attacks() {
    let setup = Setup::new().await;
    let gate =
        setup.start(&["--request-read-timeout", "1s", "--tls-handshake-timeout", "1s", "--max-connections", "2"]);
    // Silent after the handshake: closed at the first request's deadline.
    let mut silent = gate.endpoint.raw_tls().await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(EVENT_TIMEOUT, silent.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the gate kept a silent connection open");
    // At the cap, idle connections make room for a client with a request.
    let _idle = [gate.endpoint.raw_tls().await, gate.endpoint.raw_tls().await];
    let team_a = setup.driver("team-a");
    assert_eq!(get(&gate, Some(&team_a), "/namespaces/team-a/runs").await.0, 200);
    let (_, metrics) = gate.metrics_get("/metrics").await;
    for line in [
        "keyward_connections_closed_by_server_total{listener=\"gate\",reason=\"first-request-timeout\"}",
        "keyward_connections_closed_by_server_total{listener=\"gate\",reason=\"evicted\"}",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    // A handshake that never finishes is cut too.
    let mut stalled = TcpStream::connect(gate.endpoint.addr).await.unwrap();
    let read = tokio::time::timeout(EVENT_TIMEOUT, stalled.read_to_end(&mut Vec::new())).await;
    assert!(read.is_ok(), "the gate kept a connection without a handshake open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_connections_get_the_idle_timeout_and_started_requests_the_header_timeout() {
    use tokio::io::AsyncWriteExt;
    let setup = Setup::new().await;
    let gate = setup.start(&["--request-read-timeout", "1s", "--idle-timeout", "3s"]);
    let request = format!("GET /namespaces/team-a/runs HTTP/1.1\r\nhost: {SERVER_NAME}\r\n\r\n");
    let closed =
        |reason: &str| format!("keyward_connections_closed_by_server_total{{listener=\"gate\",reason=\"{reason}\"}}");

    // A refused request, then silence: the connection lives for the idle timeout.
    let mut stream = gate.endpoint.raw_tls().await;
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = vec![0u8; 512];
    let n = stream.read(&mut response).await.unwrap();
    assert!(String::from_utf8_lossy(&response[..n]).starts_with("HTTP/1.1 401"));
    let started = std::time::Instant::now();
    let read = tokio::time::timeout(EVENT_TIMEOUT, stream.read_to_end(&mut Vec::new())).await;
    assert!(read.is_ok(), "the gate kept an idle connection open");
    assert!(started.elapsed() >= std::time::Duration::from_millis(2900), "closed before the idle timeout");
    gate.wait_metric(&closed("idle"), 1.0).await;

    // Half of a request's headers: cut at the header timeout.
    let mut stream = gate.endpoint.raw_tls().await;
    stream.write_all(request.as_bytes()).await.unwrap();
    let _ = stream.read(&mut response).await.unwrap();
    stream.write_all(b"GET /namespaces/team-a/runs HTTP/1.1\r\nhost: gate\r\n").await.unwrap();
    let read = tokio::time::timeout(EVENT_TIMEOUT, stream.read_to_end(&mut Vec::new())).await;
    assert!(read.is_ok(), "the gate kept a connection with half a request open");
    gate.wait_metric(&closed("header-timeout"), 1.0).await;
}
