//! keyward against the client libraries of the systems it serves, each configured as its
//! upstream code configures it: grpc-go, Go's crypto/tls and net/http from Debian's packages,
//! built here in GOPATH mode (tests/interop/go: each mode of the client cites the upstream file
//! and commit it follows), calling `keyward gate` and `keyward serve`, the real binary, over
//! real TLS and plain text on loopback. Each case asserts what the upstream received (method,
//! path, protocol, identity headers, the message's fields) or the exact refusal the client saw.
//!
//! Needs Go and Debian's Go libraries: `apt-get install golang-go golang-google-grpc-dev
//! golang-google-protobuf-dev protoc-gen-go protoc-gen-go-grpc protobuf-compiler` (.ci/run
//! installs them; a test that misses one fails naming it).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

/// The controller tests' fake API server (lists and watches, for the gate's `liveOwners`).
#[path = "../controller/tests/support/mod.rs"]
mod kube_fake;
mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use keyward_certs::pki::Ca;
use serde_json::{json, Value};
use support::*;
use tokio::net::TcpListener;

const DAY: std::time::Duration = std::time::Duration::from_secs(86_400);

// === the Go client ===

/// The Debian packages the Go client is built from.
/// grpc-go 1.33 takes either golang/protobuf 1.3 or 1.5; only 1.5 decodes the messages
/// protoc-gen-go 1.28 writes (APIv2), so it is named.
const GO_PACKAGES: &str = "golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc protobuf-compiler";

/// The Go client, built once per run: its protos compiled by protoc into a GOPATH of its own,
/// beside tests/interop/go and Debian's /usr/share/gocode.
fn go_client() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BUILT.get_or_init(build_go_client) {
        Ok(path) => path,
        Err(why) => panic!("{why}"),
    }
}

fn build_go_client() -> Result<PathBuf, String> {
    let missing =
        |what: &str| format!("this test needs {what} (README, \"Prerequisites\"): apt-get install {GO_PACKAGES}");
    for tool in ["go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc"] {
        let on_path = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
        if !on_path {
            return Err(missing(&format!("`{tool}` on the PATH")));
        }
    }
    let gocode = Path::new("/usr/share/gocode/src");
    for library in ["google.golang.org/grpc", "google.golang.org/protobuf"] {
        if !gocode.join(library).is_dir() {
            return Err(missing(&format!("Debian's {library} in {}", gocode.display())));
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop");
    let gopath = Path::new(env!("CARGO_TARGET_TMPDIR")).join("interop-go");
    let generated = gopath.join("src");
    std::fs::create_dir_all(&generated).map_err(|e| e.to_string())?;
    let run = |command: &mut Command, what: &str| -> Result<(), String> {
        let out = command.output().map_err(|e| format!("{what}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{what} failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    for proto in ["lmeval.proto", "kfp_v1beta1.proto", "kfp_v2beta1.proto"] {
        run(
            Command::new("protoc")
                .current_dir(root.join("proto"))
                .args(["-I", ".", "-I", "/usr/include"])
                .arg(format!("--go_out={}", generated.display()))
                .arg(format!("--go-grpc_out={}", generated.display()))
                .arg(proto),
            &format!("protoc {proto}"),
        )?;
    }
    let binary = gopath.join("bin/interop");
    let search = std::env::join_paths([gopath.as_path(), &root.join("go"), Path::new("/usr/share/gocode")])
        .map_err(|e| e.to_string())?;
    run(
        Command::new("go")
            .args(["build", "-o"])
            .arg(&binary)
            .arg("keyward.test/interop")
            .env("GO111MODULE", "off")
            .env("GOPATH", search)
            .env("GOCACHE", gopath.join("cache"))
            .env("GOFLAGS", "")
            .env("CGO_ENABLED", "0"),
        "go build (GOPATH mode)",
    )?;
    Ok(binary)
}

/// Runs the Go client with `args`; what the caller saw.
fn go(args: &[&str]) -> Value {
    let out = Command::new(go_client()).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the Go client failed: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

// === the upstream ===

/// What the upstream received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    version: String,
    headers: HeaderMap,
    /// The top-level string fields of a gRPC request's message, by number.
    fields: BTreeMap<u32, String>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<String> {
        let values: Vec<&str> = self.headers.get_all(name).iter().map(|v| v.to_str().unwrap()).collect();
        (!values.is_empty()).then(|| values.join(","))
    }
}

#[derive(Clone, Default)]
struct Upstream {
    seen: Arc<Mutex<Vec<Seen>>>,
}

type UpBody = BoxBody<Bytes, Infallible>;

impl Upstream {
    /// Listens on loopback, plain text: HTTP/1.1 and HTTP/2 with prior knowledge, or (`http1`)
    /// HTTP/1.1 only, as many upstreams are.
    async fn spawn(&self, http1: bool) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let this = self.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let this = this.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| this.clone().answer(req));
                    let io = TokioIo::new(tcp);
                    if http1 {
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                    } else {
                        let auto = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                        let _ = auto.serve_connection(io, service).await;
                    }
                });
            }
        });
        addr
    }

    /// Listens on loopback over TLS with `minted`'s certificate (ALPN h2 and http/1.1): a
    /// stand-in for kube-rbac-proxy behind the gate in EvalHub's pod, which serves the same
    /// certificate as the gate there (the operator's `<instance>-tls`).
    async fn spawn_tls(&self, minted: &keyward_certs::pki::Minted) -> SocketAddr {
        use rustls::pki_types::pem::PemObject as _;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![rustls::pki_types::CertificateDer::from_pem_slice(minted.cert_pem.as_bytes()).unwrap()],
                rustls::pki_types::PrivateKeyDer::from_pem_slice(minted.key_pem.as_bytes()).unwrap(),
            )
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let this = self.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (this, acceptor) = (this.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(move |req| this.clone().answer(req));
                    let auto = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let _ = auto.serve_connection(TokioIo::new(tls), service).await;
                });
            }
        });
        addr
    }

    /// Records the request; a gRPC call gets one empty message (every response these clients
    /// expect decodes from one) and `grpc-status: 0`, anything else a 200 with a line.
    async fn answer(self, req: Request<Incoming>) -> Result<Response<UpBody>, Infallible> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        let grpc = parts.headers.get("content-type").is_some_and(|t| t.as_bytes().starts_with(b"application/grpc"));
        let mut fields = BTreeMap::new();
        if grpc {
            if let Ok(message) = keyward_gate::grpc::first_message(&body) {
                for n in 1..=8 {
                    if let Ok(Some(value)) = keyward_gate::grpc::string_field(message, n) {
                        fields.insert(n, value.to_string());
                    }
                }
            }
        }
        self.seen.lock().unwrap().push(Seen {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            version: format!("{:?}", parts.version),
            headers: parts.headers,
            fields,
        });
        if grpc {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", "0".parse().unwrap());
            let frames: Vec<Result<Frame<Bytes>, Infallible>> =
                vec![Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))), Ok(Frame::trailers(trailers))];
            let body = StreamBody::new(futures::stream::iter(frames)).boxed();
            return Ok(Response::builder().header("content-type", "application/grpc").body(body).unwrap());
        }
        Ok(Response::new(Full::new(Bytes::from_static(b"upstream says hello\n")).boxed()))
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

// === the API server ===

/// The API server the gate asks: TokenReviews (`tokens`: token → username, for
/// `pipelines.kubeflow.org`) and SubjectAccessReviews (`allowed`: users who may), answered here;
/// lists and watches (LMEvalJobs, pods) by the controller tests' fake. Writes a kubeconfig to
/// `dir`.
async fn api_server(dir: &Path, kube: kube_fake::FakeApi, tokens: &[(&str, &str)], allowed: &[&str]) -> PathBuf {
    api_server_bound(dir, kube, tokens, &[], allowed).await
}

/// [`api_server`], with tokens bound to pods (`bound`: token → namespace, pod name and the UID
/// it had when the kubelet asked for the token). Their review answers as the API server's
/// (`pkg/serviceaccount/claims.go`, 1.30+): the pod must still exist with that UID, and the
/// answer names it in `user.extra`, beside the node and the credential id.
async fn api_server_bound(
    dir: &Path,
    kube: kube_fake::FakeApi,
    tokens: &[(&str, &str)],
    bound: &[(&str, &str, &str, &str)],
    allowed: &[&str],
) -> PathBuf {
    let tokens: BTreeMap<String, String> = tokens.iter().map(|(t, u)| (t.to_string(), u.to_string())).collect();
    let bound: BTreeMap<String, (String, String, String)> = bound
        .iter()
        .map(|(t, ns, pod, uid)| (t.to_string(), (ns.to_string(), pod.to_string(), uid.to_string())))
        .collect();
    let allowed: Vec<String> = allowed.iter().map(|u| u.to_string()).collect();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (kube, tokens, bound, allowed) = (kube.clone(), tokens.clone(), bound.clone(), allowed.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (kube, tokens, bound, allowed) = (kube.clone(), tokens.clone(), bound.clone(), allowed.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                        let review = |answer: Value| {
                            let body = Full::new(Bytes::from(answer.to_string())).boxed_unsync();
                            Ok::<_, Infallible>(
                                Response::builder().header("content-type", "application/json").body(body).unwrap(),
                            )
                        };
                        match parts.uri.path() {
                            "/apis/authentication.k8s.io/v1/tokenreviews" => {
                                let mut asked: Value = serde_json::from_slice(&bytes).unwrap();
                                let token = asked["spec"]["token"].as_str().unwrap_or_default();
                                let audiences = asked["spec"]["audiences"].clone();
                                let pod = bound.get(token).map(|(ns, name, uid)| {
                                    let now = kube.get("v1", "Pod", ns, name);
                                    (
                                        name.clone(),
                                        uid.clone(),
                                        now.map(|p| p["metadata"]["uid"].as_str().unwrap_or_default().to_string()),
                                    )
                                });
                                asked["status"] = match (tokens.get(token), pod) {
                                    (Some(_), Some((_, _, None))) => json!({"authenticated": false,
                                        "error": "[invalid bearer token, service account token has been invalidated]"}),
                                    (Some(_), Some((_, uid, Some(now)))) if now != uid => {
                                        json!({"authenticated": false,
                                        "error": format!("[invalid bearer token, pod UID ({now}) does not match service account pod ref claim ({uid})]")})
                                    }
                                    (Some(user), Some((name, uid, _))) => {
                                        json!({"authenticated": true, "audiences": audiences,
                                        "user": {"username": user, "uid": "sa-uid-1",
                                            "groups": ["system:serviceaccounts", "system:authenticated"],
                                            "extra": {"authentication.kubernetes.io/pod-name": [name],
                                                      "authentication.kubernetes.io/pod-uid": [uid],
                                                      "authentication.kubernetes.io/node-name": ["worker-1"],
                                                      "authentication.kubernetes.io/node-uid": ["node-uid-1"],
                                                      "authentication.kubernetes.io/credential-id": [format!("JTI={token}-jti")]}}})
                                    }
                                    (Some(user), None) => json!({"authenticated": true, "audiences": audiences,
                                        "user": {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]}}),
                                    (None, _) => json!({"authenticated": false, "error": "invalid bearer token"}),
                                };
                                review(asked)
                            }
                            "/apis/authorization.k8s.io/v1/subjectaccessreviews" => {
                                let mut asked: Value = serde_json::from_slice(&bytes).unwrap();
                                let user = asked["spec"]["user"].as_str().unwrap_or_default().to_string();
                                asked["status"] = json!({"allowed": allowed.contains(&user)});
                                review(asked)
                            }
                            _ => Ok(kube
                                .serve("keyward", Request::from_parts(parts, kube::client::Body::from(bytes.to_vec())))
                                .await),
                        }
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
            });
        }
    });
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!("apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"http://{addr}\"}}}}]\nusers: [{{name: u, user: {{}}}}]\ncontexts: [{{name: c, context: {{cluster: fake, user: u, namespace: default}}}}]\ncurrent-context: c\n"),
    )
    .unwrap();
    path
}

// === the gate ===

struct Gate {
    server: Server,
    dir: tempfile::TempDir,
    client_ca: Ca,
    /// The plaintext listener, when started with one.
    plain: Option<SocketAddr>,
    /// The CA a client verifies the gate with.
    server_ca: PathBuf,
}

/// The gate's serving certificate.
enum Serving<'a> {
    /// A development certificate for these names (`--dns-name`).
    Dev(&'a [&'a str]),
    /// `tls.crt` and `tls.key` in this directory (`--tls-dir`), which a client verifies with its
    /// `ca.crt`.
    Dir(&'a Path),
}

impl Gate {
    /// `keyward gate` with `recipe` (a file of gate/recipes), in front of `upstream`, serving
    /// `serving`, asking the API server of `kubeconfig`.
    fn start(recipe: &str, upstream: SocketAddr, serving: Serving, kubeconfig: &Path, extra: &[&str]) -> Gate {
        let dir = tempfile::tempdir().unwrap();
        let client_ca = Ca::mint("keyward client CA", SystemTime::now(), DAY).unwrap();
        let ca_file = dir.path().join("client-ca.crt");
        std::fs::write(&ca_file, client_ca.cert_pem()).unwrap();
        let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("gate/recipes").join(recipe);
        let upstream = format!("http://{upstream}");
        let mut args = vec!["--config", config.to_str().unwrap(), "--upstream", &upstream];
        args.extend(["--client-ca", ca_file.to_str().unwrap()]);
        let dev = dir.path().join("dev");
        let (names, server_ca) = match serving {
            Serving::Dev(names) => (names.join(","), dev.join("ca.crt")),
            Serving::Dir(tls) => (String::new(), tls.join("ca.crt")),
        };
        match serving {
            Serving::Dev(_) => args.extend(["--dev-cert-dir", dev.to_str().unwrap(), "--dns-name", &names]),
            Serving::Dir(tls) => args.extend(["--tls-dir", tls.to_str().unwrap()]),
        }
        args.extend_from_slice(extra);
        let env = [("KUBECONFIG", kubeconfig.as_os_str())];
        let mut server = Server::start_gate_env(&args, &env, Vec::new());
        let plain = extra.contains(&"--listen-plaintext").then(|| {
            let line = server.wait_log(|v| v["role"] == "gate-plaintext" && v["addr"].is_string());
            line["addr"].as_str().unwrap().parse().unwrap()
        });
        Gate { server, dir, client_ca, plain, server_ca }
    }

    fn addr(&self) -> String {
        self.server.endpoint.addr.to_string()
    }

    fn plain(&self) -> String {
        self.plain.unwrap().to_string()
    }

    /// The CA of the gate's development certificate, as a client is given it.
    fn server_ca(&self) -> String {
        self.server_ca.to_str().unwrap().to_string()
    }

    /// A keyward client certificate for `spiffe_id`, written as `tls.crt` and `tls.key` in a
    /// directory of its own: (certificate, key).
    fn client_certificate(&self, spiffe_id: &str) -> (String, String) {
        let minted = self
            .client_ca
            .issue_client_identity(&[(keyward_certs::DnType::CommonName, "job")], spiffe_id, SystemTime::now(), DAY)
            .unwrap();
        let dir = self.dir.path().join(spiffe_id.rsplit('/').next().unwrap());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tls.crt"), &minted.cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), &minted.key_pem).unwrap();
        let path = |f: &str| dir.join(f).to_str().unwrap().to_string();
        (path("tls.crt"), path("tls.key"))
    }

    /// A token file, as the kubelet projects one.
    fn token_file(&self, name: &str, token: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, token).unwrap();
        path.to_str().unwrap().to_string()
    }

    /// `keyward gate` exactly as keyward's `gate` injection runs it in EvalHub's pod
    /// (deploy/gate/evalhub/profile.yaml on tests/fixtures/evalhub-api-pod.json): the container's
    /// arguments as the webhook's patch has them, each mount path mapped to a directory here
    /// holding what the pod's volume would (the gate file, the operator's certificate, the
    /// service CA), the ports to free ones (`127.0.0.1:8442`, kube-rbac-proxy moved, to
    /// `kube_rbac_proxy`), and `--metrics-listen` and `--log-format` as the harness sets them.
    fn placed_in_evalhubs_pod(
        service_ca: &Ca,
        operator_cert: &keyward_certs::pki::Minted,
        kube_rbac_proxy: SocketAddr,
        kubeconfig: &Path,
    ) -> Gate {
        let container = placed_gate_container();
        let dir = tempfile::tempdir().unwrap();
        let mut mapped: Vec<(String, PathBuf)> = Vec::new();
        for mount in container["volumeMounts"].as_array().unwrap() {
            let (volume, at) = (mount["name"].as_str().unwrap(), mount["mountPath"].as_str().unwrap());
            let here = dir.path().join(volume);
            std::fs::create_dir_all(&here).unwrap();
            let files: Vec<(&str, Vec<u8>)> = match volume {
                "keyward-gate-config" => vec![(
                    "gate.yaml",
                    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/gate/evalhub/gate.yaml")).unwrap(),
                )],
                "evalhub-tls" => vec![
                    ("tls.crt", operator_cert.cert_pem.clone().into_bytes()),
                    ("tls.key", operator_cert.key_pem.clone().into_bytes()),
                ],
                "service-ca" => vec![("service-ca.crt", service_ca.cert_pem().as_bytes().to_vec())],
                // The API token: this gate asks the API server of KUBECONFIG instead.
                other if other.starts_with("kube-api-access-") => vec![],
                other => panic!("the placed gate mounts a volume this test does not know: {other}"),
            };
            for (file, bytes) in files {
                std::fs::write(here.join(file), bytes).unwrap();
            }
            mapped.push((at.to_string(), here));
        }
        let mut args: Vec<String> = Vec::new();
        let given: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(given[0], "gate");
        for arg in &given[1..] {
            let (flag, value) = arg.split_once('=').unwrap();
            let value = match flag {
                "--metrics-listen" | "--log-format" => continue,
                "--listen" => "127.0.0.1:0".to_string(),
                "--upstream" => {
                    assert_eq!(value, "https://127.0.0.1:8442", "kube-rbac-proxy, moved");
                    format!("https://{kube_rbac_proxy}")
                }
                _ => match mapped.iter().find(|(at, _)| value.starts_with(at.as_str())) {
                    Some((at, here)) => format!("{}{}", here.display(), &value[at.len()..]),
                    None => value.to_string(),
                },
            };
            args.push(format!("{flag}={value}"));
        }
        let ca_file = dir.path().join("service-ca/service-ca.crt");
        let env = [("KUBECONFIG", kubeconfig.as_os_str())];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = Server::start_gate_env(&args, &env, Vec::new());
        let client_ca = Ca::mint("unused client CA", SystemTime::now(), DAY).unwrap();
        Gate { server, dir, client_ca, plain: None, server_ca: ca_file }
    }

    /// Waits until the gate is ready (its owner kinds listed).
    async fn ready(&mut self) {
        let listed = |v: &Value| v["message"] == "owners listed";
        if self.server.seen(listed).is_none() {
            self.server.wait_log(listed);
        }
    }
}

fn lmevaljob(namespace: &str, name: &str) -> Value {
    json!({"apiVersion": "foundation-model-stack.github.com.github.com/v1beta1", "kind": "LMEvalJob",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")}})
}

// === the cases ===

/// fms-lm-eval-service's LMEvalJob driver (backend/driver/driver.go @ 38689a3): mutual TLS
/// with `ServerName` set to `lm-eval-grpc.lm-eval.svc:8082`, port included, which Go sends as
/// the SNI and verifies against the gate's certificate's name `host:8082` (the name upstream's
/// grpc-server-cert carries). Through the lmeval-status recipe as it ships, `liveOwners`
/// included: its own job's status passes, another job's is refused, a job that is gone buys
/// nothing, and the TLS-only branch (no client certificate) is told what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fms_driver_updates_its_own_job_through_the_gate_as_upstream_dials_it() {
    let upstream = Upstream::default();
    let upstream_addr = upstream.spawn(false).await;
    let kube = kube_fake::FakeApi::default();
    kube.seed(lmevaljob("team-a", "evaljob-sample"));
    let api_dir = tempfile::tempdir().unwrap();
    let kubeconfig = api_server(api_dir.path(), kube, &[], &[]).await;
    let server_addr = "lm-eval-grpc.lm-eval.svc:8082";
    let mut gate = Gate::start("lmeval-status.yaml", upstream_addr, Serving::Dev(&[server_addr]), &kubeconfig, &[]);
    gate.ready().await;
    let (addr, ca) = (gate.addr(), gate.server_ca());
    let driver = |job: &str, cert: Option<&(String, String)>| {
        let mut args = vec!["-mode", "fms-driver", "-target", server_addr, "-connect", &addr, "-ca", &ca];
        if let Some((crt, key)) = cert {
            args.extend(["-cert", crt.as_str(), "-key", key.as_str()]);
        }
        args.extend(["-job-name", job, "-job-namespace", "team-a"]);
        go(&args)
    };
    let own = gate.client_certificate("spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample");
    let answer = driver("evaljob-sample", Some(&own));
    assert_eq!(answer, json!({"ok": true, "code": "OK", "alpn": "h2"}));
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    let call = &seen[0];
    let id = "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";
    assert_eq!(
        (call.method.as_str(), call.path.as_str(), call.version.as_str()),
        ("POST", "/LMEvalJobUpdateService/UpdateStatus", "HTTP/2.0")
    );
    assert_eq!(call.header("x-remote-user").as_deref(), Some(id));
    assert_eq!(call.header("x-keyward-identity").as_deref(), Some(id));
    assert_eq!(
        call.fields,
        BTreeMap::from([
            (1, "evaljob-sample".to_string()),
            (2, "team-a".to_string()),
            (3, "Running".to_string()),
            (4, "NoReason".to_string()),
            (5, "update status from the driver: running".to_string()),
        ])
    );
    assert!(call.header("user-agent").unwrap().starts_with("grpc-go/1.33"), "{:?}", call.header("user-agent"));

    let other = driver("another-job", Some(&own));
    assert_eq!(
        other,
        json!({"ok": false, "code": "PermissionDenied", "alpn": "h2",
            "message": "keyward gate: rule \"a driver updates only its own job\": the caller's name is \"evaljob-sample\", and gRPC field 1 is \"another-job\""})
    );
    let gone = gate.client_certificate("spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-gone");
    let answer = driver("evaljob-gone", Some(&gone));
    assert_eq!(answer["code"], "Unauthenticated", "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("team-a/evaljob-gone"), "{answer}");
    // The driver's TLS-only branch, credentials.NewClientTLSFromFile(ca, serverAddr).
    let answer = driver("evaljob-sample", None);
    assert_eq!(
        answer,
        json!({"ok": false, "code": "Unauthenticated", "alpn": "h2",
            "message": "keyward gate: no client certificate: present the keyward client certificate of your workload (this gate takes no bearer tokens)"})
    );
    assert_eq!(upstream.seen().len(), 1, "refused calls never reach the upstream");
}

/// The certificate the lmeval recipe's gate serves (deploy/gate/example/certificate.yaml):
/// fms-lm-eval-service's own grpc-server-cert, issued by cert-manager's selfSigned issuer
/// (config/certmanager/certificate.yaml @ 38689a3: no isCA, the default usages, names with the
/// port), whose Secret's `ca.crt` is the certificate itself, and which keyward's lmeval profile
/// gives the driver as GRPC_SERVER_CA. Made here as that issuer makes it (openssl), the driver
/// verifies the gate with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fms_driver_verifies_the_gate_serving_the_operators_self_signed_certificate() {
    let upstream = Upstream::default();
    let upstream_addr = upstream.spawn(false).await;
    let kube = kube_fake::FakeApi::default();
    kube.seed(lmevaljob("team-a", "evaljob-sample"));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api_server(dir.path(), kube, &[], &[]).await;
    let tls = dir.path().join("grpc-server-cert");
    std::fs::create_dir(&tls).unwrap();
    let out = tool("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "90"])
        .args([
            "-subj",
            "/",
            "-addext",
            "subjectAltName=DNS:lm-eval-grpc.lm-eval.svc:8082,DNS:lm-eval-grpc.lm-eval.svc.cluster.local:8082",
        ])
        .args([
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "keyUsage=critical,digitalSignature,keyEncipherment",
        ])
        .arg("-keyout")
        .arg(tls.join("tls.key"))
        .arg("-out")
        .arg(tls.join("tls.crt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::copy(tls.join("tls.crt"), tls.join("ca.crt")).unwrap();
    let mut gate = Gate::start("lmeval-status.yaml", upstream_addr, Serving::Dir(&tls), &kubeconfig, &[]);
    gate.ready().await;
    let (crt, key) = gate.client_certificate("spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample");
    let (addr, ca) = (gate.addr(), gate.server_ca());
    let answer = go(&[
        "-mode",
        "fms-driver",
        "-target",
        "lm-eval-grpc.lm-eval.svc:8082",
        "-connect",
        &addr,
        "-ca",
        &ca,
        "-cert",
        &crt,
        "-key",
        &key,
        "-job-name",
        "evaljob-sample",
        "-job-namespace",
        "team-a",
    ]);
    assert_eq!(answer, json!({"ok": true, "code": "OK", "alpn": "h2"}));
    // The same certificate for any other name (the Service without the port, as this recipe's
    // example once named it) is refused by the driver itself.
    let answer = go(&[
        "-mode",
        "fms-driver",
        "-target",
        "lm-eval-grpc.lm-eval.svc",
        "-connect",
        &addr,
        "-ca",
        &ca,
        "-cert",
        &crt,
        "-key",
        &key,
        "-job-name",
        "evaljob-sample",
        "-job-namespace",
        "team-a",
    ]);
    assert_eq!(answer["code"], "Unavailable", "{answer}");
    assert!(
        answer["message"].as_str().unwrap().contains("certificate is valid for lm-eval-grpc.lm-eval.svc:8082"),
        "{answer}"
    );
    assert_eq!(upstream.seen().len(), 1);
}

const KFP_AGENT: &str = "system:serviceaccount:kubeflow:ml-pipeline-persistenceagent";
const KFP_SCHEDULER: &str = "system:serviceaccount:kubeflow:ml-pipeline-scheduledworkflow";

/// The gate with the kfp-api recipe in front of a recording upstream, the API server knowing
/// the agents' tokens (`agent-token`, `scheduler-token`); the API server lives as long as the
/// directory returned.
async fn kfp_gate(serving: Serving<'_>, extra: &[&str]) -> (Upstream, Gate, tempfile::TempDir) {
    let upstream = Upstream::default();
    let upstream_addr = upstream.spawn(false).await;
    let api_dir = tempfile::tempdir().unwrap();
    let tokens = [("agent-token", KFP_AGENT), ("scheduler-token", KFP_SCHEDULER)];
    let kubeconfig = api_server(api_dir.path(), kube_fake::FakeApi::default(), &tokens, &[]).await;
    let gate = Gate::start("kfp-api.yaml", upstream_addr, serving, &kubeconfig, extra);
    (upstream, gate, api_dir)
}

/// Kubeflow Pipelines' agents as the default manifests run them (kubeflow/pipelines 7b70c7b:
/// no TLS flags, so plaintext gRPC to ml-pipeline:8887, a projected token in `authorization`)
/// and the v2 driver's and launcher's cache calls (no credential at all), through the kfp-api
/// recipe on the gate's plaintext listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kfp_agents_and_cache_calls_pass_over_plaintext_as_the_default_manifests_run_them() {
    let (upstream, gate, _api) = kfp_gate(Serving::Dev(&["ml-pipeline"]), &["--listen-plaintext", "127.0.0.1:0"]).await;
    let (agent, scheduler) = (KFP_AGENT, KFP_SCHEDULER);
    let plain = gate.plain();
    let agent_token = gate.token_file("persistenceagent-sa-token", "agent-token");
    let scheduler_token = gate.token_file("scheduledworkflow-sa-token", "scheduler-token");
    let grpc = |mode: &str, extra: &[&str]| {
        let mut args = vec!["-mode", mode, "-connect", &plain, "-target", "ml-pipeline:8887"];
        args.extend_from_slice(extra);
        go(&args)
    };
    let ok = json!({"ok": true, "code": "OK"});
    assert_eq!(grpc("kfp-persistence-agent", &["-token-file", &agent_token, "-method", "ReportWorkflowV1"]), ok);
    assert_eq!(grpc("kfp-persistence-agent", &["-token-file", &agent_token, "-method", "ReportRunMetricsV1"]), ok);
    // A multi-user install's scheduled workflow also sends kubeflow-userid, which KFP trusts
    // before any token: the gate strips it, and the upstream reviews the token it forwards.
    let multi_user = ["-user-identity-header", "kubeflow-userid", "-user-identity-value", scheduler];
    let mut args = vec!["-token-file", scheduler_token.as_str()];
    args.extend(multi_user);
    assert_eq!(grpc("kfp-scheduled-workflow", &args), ok);
    let cache = "ml-pipeline.kubeflow.svc.cluster.local:8887";
    for method in ["ListTasksV1", "CreateTaskV1"] {
        let answer = go(&["-mode", "kfp-cache", "-connect", &plain, "-target", cache, "-method", method]);
        assert_eq!(answer, ok, "{method}");
    }

    let seen = upstream.seen();
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/api.ReportService/ReportWorkflowV1",
            "/api.RunService/ReportRunMetricsV1",
            "/kubeflow.pipelines.backend.api.v2beta1.RunService/CreateRun",
            "/api.TaskService/ListTasksV1",
            "/api.TaskService/CreateTaskV1",
        ]
    );
    assert!(seen.iter().all(|s| s.version == "HTTP/2.0" && s.method == "POST"));
    let users: Vec<Option<String>> = seen.iter().map(|s| s.header("x-remote-user")).collect();
    assert_eq!(users, [Some(agent.into()), Some(agent.into()), Some(scheduler.into()), None, None]);
    assert!(seen.iter().all(|s| s.header("kubeflow-userid").is_none()), "stripped");
    // KFP's API server reviews the token again: it is forwarded.
    assert_eq!(seen[0].header("authorization").as_deref(), Some("Bearer agent-token"));
    assert_eq!(seen[0].fields[&1], r#"{"kind":"Workflow","metadata":{"name":"run-1","namespace":"team-a"}}"#);
    assert_eq!(seen[1].fields[&1], "run-1");
    assert_eq!(seen[2].fields[&1], "experiment-1");
    assert_eq!(seen[3].fields[&3], "created_at desc");
    assert!(seen[3].fields[&5].contains("fingerprint"));
    assert!(seen[3].header("authorization").is_none() && seen[3].header("x-remote-groups").is_none());

    // Each agent only what its ClusterRole names; a call with no token where one is needed is
    // told so.
    let answer = grpc("kfp-scheduled-workflow", &["-token-file", &agent_token]);
    assert_eq!(answer["code"], "PermissionDenied", "{answer}");
    let answer = grpc("kfp-persistence-agent", &["-method", "ReportWorkflowV1"]);
    assert_eq!(answer["code"], "Unauthenticated", "{answer}");
    assert_eq!(upstream.seen().len(), 5);
}

/// The same agents with TLS turned on as KFP's standalone-TLS overlay does
/// (--mlPipelineServiceTLSEnabled=true --caCertPath=…; the cache client's
/// --metadata_tls_enabled): grpc-go verifies the dialled host's name and negotiates h2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kfp_agents_and_cache_calls_pass_over_tls_with_the_upstream_flags() {
    let names = ["ml-pipeline", "ml-pipeline.kubeflow.svc.cluster.local"];
    let (upstream, gate, _api) = kfp_gate(Serving::Dev(&names), &[]).await;
    let (agent, scheduler) = (KFP_AGENT, KFP_SCHEDULER);
    let (addr, ca) = (gate.addr(), gate.server_ca());
    let token = gate.token_file("persistenceagent-sa-token", "agent-token");
    let tls = ["-tls", "-ca", ca.as_str()];
    let mut args =
        vec!["-mode", "kfp-persistence-agent", "-connect", &addr, "-target", "ml-pipeline:8887", "-token-file", &token];
    args.extend(tls);
    assert_eq!(go(&args), json!({"ok": true, "code": "OK", "alpn": "h2"}));
    let scheduler_token = gate.token_file("scheduledworkflow-sa-token", "scheduler-token");
    let mut args = vec![
        "-mode",
        "kfp-scheduled-workflow",
        "-connect",
        &addr,
        "-target",
        "ml-pipeline:8887",
        "-token-file",
        &scheduler_token,
    ];
    args.extend(tls);
    assert_eq!(go(&args), json!({"ok": true, "code": "OK", "alpn": "h2"}));
    let cache = "ml-pipeline.kubeflow.svc.cluster.local:8887";
    let mut args = vec!["-mode", "kfp-cache", "-connect", &addr, "-target", cache, "-method", "ListTasksV1"];
    args.extend(tls);
    assert_eq!(go(&args), json!({"ok": true, "code": "OK", "alpn": "h2"}));
    let seen = upstream.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0].header("x-remote-user").as_deref(), Some(agent));
    assert_eq!(seen[1].header("x-remote-user").as_deref(), Some(scheduler));
    assert_eq!(seen[1].path, "/kubeflow.pipelines.backend.api.v2beta1.RunService/CreateRun");
    assert_eq!(seen[2].path, "/api.TaskService/ListTasksV1");
}

/// Go's net/http with its defaults negotiates h2 with the gate; the upstream here speaks
/// HTTP/1.1 only and gets HTTP/1.1 (--upstream-protocol auto). With HTTP/2 turned off in the
/// client, the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_net_http_over_h2_and_http1_reaches_an_http1_only_upstream() {
    let upstream = Upstream::default();
    let upstream_addr = upstream.spawn(true).await;
    let api_dir = tempfile::tempdir().unwrap();
    let kubeconfig = api_server(api_dir.path(), kube_fake::FakeApi::default(), &[], &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("runs.yaml");
    std::fs::write(&recipe, "apiVersion: keyward.io/v1alpha1\nkind: Gate\nmetadata: {name: runs}\nspec:\n  trustDomain: cluster.local\n  rules:\n    - name: a job reads its own namespace's runs\n      http: {methods: [GET], path: \"/namespaces/{namespace}/runs\"}\n      callers: {workloads: {kinds: [lmevaljob]}}\n      when: [{caller: namespace, equals: {pathSegment: namespace}}]\n").unwrap();
    let gate =
        Gate::start(recipe.to_str().unwrap(), upstream_addr, Serving::Dev(&["runs.team-a.svc"]), &kubeconfig, &[]);
    let (addr, ca) = (gate.addr(), gate.server_ca());
    let (crt, key) = gate.client_certificate("spiffe://cluster.local/ns/team-a/lmevaljob/job");
    let url = "https://runs.team-a.svc/namespaces/team-a/runs";
    let get = |extra: &[&str]| {
        let mut args = vec!["-mode", "http", "-connect", &addr, "-url", url, "-ca", &ca, "-cert", &crt, "-key", &key];
        args.extend_from_slice(extra);
        go(&args)
    };
    let h2 = get(&[]);
    assert_eq!(
        h2,
        json!({"ok": true, "status": 200, "proto": "HTTP/2.0", "alpn": "h2", "body": "upstream says hello\n"})
    );
    // With TLSNextProto emptied Go offers no ALPN at all, and the gate speaks HTTP/1.1.
    let http1 = get(&["-http1"]);
    assert_eq!(http1, json!({"ok": true, "status": 200, "proto": "HTTP/1.1", "body": "upstream says hello\n"}));
    let seen = upstream.seen();
    let versions: Vec<&str> = seen.iter().map(|s| s.version.as_str()).collect();
    assert_eq!(versions, ["HTTP/1.1", "HTTP/1.1"]);
    assert!(seen
        .iter()
        .all(|s| s.header("x-remote-user").as_deref() == Some("spiffe://cluster.local/ns/team-a/lmevaljob/job")));
    // The h2 request's authority reaches the HTTP/1.1 upstream as its Host.
    assert_eq!(seen[0].header("host").as_deref(), Some("runs.team-a.svc"));
}

/// The kube-apiserver's webhook client (Go TLS with the Service's name as the server name, ALPN
/// http/1.1 only, POST /mutate?timeout=10s) against `keyward serve` with its development
/// certificate: the LMEvalJob driver pod's review is answered with its patch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_servers_webhook_client_gets_the_patch_from_keyward_serve() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev");
    let server = Server::start(&["--dev-cert-dir", dev.to_str().unwrap()], Vec::new());
    let review = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admissionreview-lmeval.json");
    let answer = go(&[
        "-mode",
        "webhook",
        "-connect",
        &server.endpoint.addr.to_string(),
        "-target",
        SERVER_NAME,
        "-ca",
        dev.join("ca.crt").to_str().unwrap(),
        "-url",
        &format!("https://{SERVER_NAME}:443/mutate?timeout=10s"),
        "-body",
        review.to_str().unwrap(),
    ]);
    assert_eq!(
        (answer["status"].as_u64(), answer["proto"].as_str(), answer["alpn"].as_str()),
        (Some(200), Some("HTTP/1.1"), Some("http/1.1"))
    );
    let response: Value = serde_json::from_str(answer["body"].as_str().unwrap()).unwrap();
    let r = &response["response"];
    assert_eq!(
        (r["uid"].as_str(), r["allowed"].as_bool(), r["patchType"].as_str()),
        (Some("705ab4f5-6393-11e8-b7cc-42010a800002"), Some(true), Some("JSONPatch"))
    );
    let patch: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD.decode(r["patch"].as_str().unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(patch[0], json!({"op": "add", "path": "/spec/automountServiceAccountToken", "value": false}));
    let request: Value = serde_json::from_slice(&std::fs::read(&review).unwrap()).unwrap();
    let mut pod = request["request"]["object"].clone();
    json_patch::patch(&mut pod, &serde_json::from_value::<json_patch::Patch>(patch).unwrap()).unwrap();
    let env: Vec<&str> =
        pod["spec"]["containers"][0]["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    for name in ["GRPC_CLIENT_CERT", "GRPC_CLIENT_KEY", "GRPC_SERVER_CA"] {
        assert!(env.contains(&name), "{name} in {env:?}");
    }
}

// === deploy/e2e's gate check, offline ===

/// nginx with deploy/e2e/gate/default.conf (the stand-in for the operator in kind.sh's gate
/// step) on a free port of 127.0.0.1, in the foreground; killed with the guard.
struct Nginx {
    child: std::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Nginx {
    async fn start() -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let server =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/e2e/gate/default.conf"))
                .unwrap();
        assert!(server.contains("listen 8082 http2;") && server.contains("access_log /dev/stdout;"));
        let server = server
            .replace("listen 8082 http2;", &format!("listen 127.0.0.1:{port} http2;"))
            .replace("access_log /dev/stdout;", &format!("access_log {}/access.log;", dir.path().display()));
        std::fs::write(dir.path().join("default.conf"), server).unwrap();
        let d = dir.path().display();
        std::fs::write(
            dir.path().join("nginx.conf"),
            format!("daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\nevents {{}}\nhttp {{\n  client_body_temp_path {d}/body;\n  include {d}/default.conf;\n}}\n"),
        )
        .unwrap();
        let child = tool("nginx").arg("-c").arg(dir.path().join("nginx.conf")).spawn().unwrap();
        // Listening once it accepts a connection.
        let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(std::time::Instant::now() < deadline, "nginx did not listen on {port}");
            tokio::task::yield_now().await;
        }
        Nginx { child, port, dir }
    }

    fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// kind.sh's gate step, without the cluster: the lmeval recipe as it ships (its `liveOwners`
/// from a fake API server), in front of deploy/e2e/gate's nginx stand-in, called by
/// deploy/e2e/gate-check.sh with messages from lib.sh's grpc_job_status, its output read by
/// lib.sh's gate_check_verdict: what kind.sh runs, checked here so that a broken piece fails on
/// this machine and not only on a cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kind_sh_s_gate_check_passes_through_the_gate_and_its_stand_in() {
    let nginx = Nginx::start().await;
    let kube = kube_fake::FakeApi::default();
    kube.seed(lmevaljob("keyward-e2e-jobs", "e2e-gate"));
    let api_dir = tempfile::tempdir().unwrap();
    let kubeconfig = api_server(api_dir.path(), kube, &[], &[]).await;
    let upstream: SocketAddr = format!("127.0.0.1:{}", nginx.port).parse().unwrap();
    let mut gate = Gate::start("lmeval-status.yaml", upstream, Serving::Dev(&["localhost"]), &kubeconfig, &[]);
    gate.ready().await;
    let (cert, key) = gate.client_certificate("spiffe://cluster.local/ns/keyward-e2e-jobs/lmevaljob/e2e-gate");
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/e2e/lib.sh");
    let messages = gate.dir.path().join("grpc");
    std::fs::create_dir(&messages).unwrap();
    let made = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {lib:?} && grpc_job_status e2e-gate keyward-e2e-jobs > own.bin && grpc_job_status e2e-eval keyward-e2e-jobs > other.bin"
        ))
        .current_dir(&messages)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let url = format!("https://localhost:{}/LMEvalJobUpdateService/UpdateStatus", gate.server.endpoint.addr.port());
    let check = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/e2e/gate-check.sh");
    require("curl");
    let out = Command::new("sh")
        .arg(&check)
        .arg(&url)
        .arg(&messages)
        .env("GRPC_CLIENT_CERT", &cert)
        .env("GRPC_CLIENT_KEY", &key)
        .env("GRPC_SERVER_CA", gate.server_ca())
        .output()
        .unwrap();
    let output = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && output.ends_with("CALLS-DONE\n"),
        "{output}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdict = Command::new("bash")
        .arg("-c")
        .arg(format!("source {lib:?} && gate_check_verdict \"$1\""))
        .arg("verdict")
        .arg(&output)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&verdict.stdout),
        "ok: the gate lets a job update its own status has grpc-status: 0\nok: the gate refuses another job's update has grpc-status: 7\n",
        "{output}"
    );
    // The one call allowed is the one that reached the operator's stand-in, as HTTP/2.
    let log = nginx.access_log();
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(log.contains("\"POST /LMEvalJobUpdateService/UpdateStatus HTTP/2.0\" 200"), "{log}");
    // The verdict fails when the gate lets the other job's call through (the stand-in alone).
    let direct = output.replace("grpc-status: 7", "grpc-status: 0");
    let verdict = Command::new("bash")
        .arg("-c")
        .arg(format!("source {lib:?} && gate_check_verdict \"$1\""))
        .arg("verdict")
        .arg(&direct)
        .output()
        .unwrap();
    assert_eq!(verdict.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&verdict.stderr).contains("FAIL: the gate refuses another job's update"));
}

// === EvalHub: an evaluation pod posts its own job's events (gate/recipes/evalhub-status.yaml) ===

/// Where the sidecar sends events (eval-hub ba127125 sidecar_config_json.go): instance
/// `evalhub` in `evalhub-system`, as deploy/gate/evalhub installs it.
const EVALHUB_URL: &str = "https://evalhub.evalhub-system.svc.cluster.local:8443";
const JOB_ACCOUNT: &str = "system:serviceaccount:tenant-a:evalhub-evalhub-job";

/// An evaluation pod as the API server stores it: eval-hub/eval-hub ba127125,
/// internal/eval_hub/runtimes/k8s (job_builders.go: the labels, sanitized, and the raw values in
/// annotations; job_config.go: account `<instance>-<instance namespace>-job`; job_volumes.go:
/// the sidecar's projected token, no audience, 3600 s, and the service CA), created by the Job
/// controller (`generateName: <job>-`, its controller reference) and defaulted.
fn evaluation_pod(namespace: &str, job_id: &str, benchmark: &str, index: u32) -> Value {
    let job = format!("{job_id}-5f0c2a7e-3b1d-4c8e-9a6f-0d2e4b6c8a1f");
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": format!("{job}-x2x9q"),
            "generateName": format!("{job}-"),
            "labels": {
                "app": "evalhub", "component": "evaluation-job", "job_id": job_id,
                "provider_id": "lm_evaluation_harness", "benchmark_id": benchmark,
                "benchmark_index": index.to_string(), "trustyai.opendatahub.io/evaluation-phase": "Pending",
                "batch.kubernetes.io/job-name": job, "job-name": job,
                "batch.kubernetes.io/controller-uid": "c0ffee00-0000-4000-8000-000000000001",
            },
            "annotations": {
                "eval-hub.github.io/job_id": job_id,
                "eval-hub.github.io/provider_id": "lm_evaluation_harness",
                "eval-hub.github.io/benchmark_id": benchmark,
            },
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                "uid": "c0ffee00-0000-4000-8000-000000000001", "controller": true, "blockOwnerDeletion": true}],
            "finalizers": ["batch.kubernetes.io/job-tracking"],
        },
        "spec": {
            "serviceAccountName": "evalhub-evalhub-job",
            "serviceAccount": "evalhub-evalhub-job",
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "initContainers": [{
                "name": "sidecar", "image": "quay.io/eval-hub/eval-hub:latest", "restartPolicy": "Always",
                "command": ["/app/eval-runtime-sidecar"], "imagePullPolicy": "IfNotPresent",
                "volumeMounts": [
                    {"name": "evalhub-token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true},
                    {"name": "evalhub-service-ca", "mountPath": "/etc/pki/ca-trust/source/anchors", "readOnly": true},
                ],
                "terminationMessagePath": "/data/termination-log", "terminationMessagePolicy": "File",
            }],
            "containers": [{
                "name": "adapter", "image": "quay.io/eval-hub/lm-eval-adapter:latest", "imagePullPolicy": "IfNotPresent",
                "env": [{"name": "EVALHUB_MODE", "value": "k8s"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            }],
            "volumes": [
                {"name": "evalhub-token", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}]}},
                {"name": "evalhub-service-ca", "configMap": {"name": "evalhub-service-ca", "defaultMode": 420}},
            ],
            "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler", "securityContext": {},
            "terminationGracePeriodSeconds": 30, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0, "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
        },
    })
}

/// The `keyward-gate` container keyward's webhook adds to EvalHub's pod: the profile
/// deploy/gate/evalhub/profile.yaml on the pod the ReplicaSet controller creates
/// (tests/fixtures/evalhub-api-pod.json, trustyai-service-operator 11c335b deployment.go).
fn placed_gate_container() -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let profile = std::fs::read_to_string(root.join("deploy/gate/evalhub/profile.yaml")).unwrap();
    let profiles = keyward_engine::ProfileSet::from_sources([("profile.yaml".to_string(), profile)]).unwrap();
    let pod = std::fs::read_to_string(root.join("tests/fixtures/evalhub-api-pod.json")).unwrap();
    let pod = serde_json::value::RawValue::from_string(pod).unwrap();
    let requester = keyward_engine::Requester::User("system:serviceaccount:kube-system:replicaset-controller");
    let decision =
        keyward_engine::decide(&keyward_engine::RequestFacts::pod_create("evalhub-system", requester), &pod, &profiles);
    let patch = serde_json::to_value(decision.patch()).unwrap();
    let added = patch.as_array().unwrap().iter().find(|op| op["path"] == "/spec/initContainers").unwrap();
    added["value"][0].clone()
}

/// A `StatusEvent` as EvalHub's SDK posts it (pkg/api/evaluations.go, ba127125).
fn status_event(benchmark: &str, index: u32, status: &str) -> String {
    json!({"benchmark_status_event": {"provider_id": "lm_evaluation_harness", "id": benchmark,
        "benchmark_index": index, "status": status, "phase": "running",
        "metrics": {"acc": 0.41}, "started_at": "2026-12-07T10:00:00Z"}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evaluation_pod_posts_its_own_jobs_events_through_the_gate_and_nothing_else() {
    let kube = kube_fake::FakeApi::default();
    let pod_a = kube.seed(evaluation_pod("tenant-a", "job-a", "arc_easy", 0));
    let pod_b = kube.seed(evaluation_pod("tenant-a", "job-b", "hellaswag", 1));
    let name = |pod: &Value| pod["metadata"]["name"].as_str().unwrap().to_string();
    let uid = |pod: &Value| pod["metadata"]["uid"].as_str().unwrap().to_string();
    let (a, b) = (name(&pod_a), name(&pod_b));
    let (uid_a, uid_b) = (uid(&pod_a), uid(&pod_b));
    // The operator's certificate for the Service, from the service CA: the gate serves it on
    // 8443, and kube-rbac-proxy, behind the gate on 127.0.0.1:8442, too.
    let service_ca = Ca::mint("openshift-service-serving-signer", SystemTime::now(), DAY).unwrap();
    let names = ["evalhub.evalhub-system.svc".to_string(), "evalhub.evalhub-system.svc.cluster.local".to_string()];
    let operator_cert = service_ca.issue_serving(&names, SystemTime::now(), DAY).unwrap();
    let upstream = Upstream::default();
    let kube_rbac_proxy = upstream.spawn_tls(&operator_cert).await;
    let api_dir = tempfile::tempdir().unwrap();
    let kubeconfig = api_server_bound(
        api_dir.path(),
        kube.clone(),
        &[("token-a", JOB_ACCOUNT), ("token-b", JOB_ACCOUNT)],
        &[("token-a", "tenant-a", &a, &uid_a), ("token-b", "tenant-a", &b, &uid_b)],
        &[JOB_ACCOUNT],
    )
    .await;
    let mut gate = Gate::placed_in_evalhubs_pod(&service_ca, &operator_cert, kube_rbac_proxy, &kubeconfig);
    gate.server.wait_log(|v| v["message"] == "callers' pods listed");
    let token_a = gate.token_file("token-a", "token-a");
    let post = |job: &str, tenant: &str, event: &str, x_user: &str| {
        let body = gate.dir.path().join("event.json");
        std::fs::write(&body, event).unwrap();
        let path = format!("/api/v1/evaluations/jobs/{job}/events");
        let mut args = vec!["-mode", "evalhub-sidecar", "-url", EVALHUB_URL, "-token-file", &token_a, "-path", &path];
        let (connect, ca, body) = (gate.addr(), gate.server_ca(), body.to_str().unwrap().to_string());
        args.extend(["-connect", &connect, "-ca", &ca, "-tenant", tenant, "-body", &body]);
        if !x_user.is_empty() {
            args.extend(["-x-user", x_user]);
        }
        go(&args)
    };

    // Job A's pod posts A's events; the upstream sees the verified user, and the token for
    // kube-rbac-proxy behind the gate to review again.
    let own = post("job-a", "tenant-a", &status_event("arc_easy", 0, "running"), "");
    assert_eq!((own["status"].as_u64(), own["body"].as_str()), (Some(200), Some("upstream says hello\n")), "{own}");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!((seen[0].method.as_str(), seen[0].path.as_str()), ("POST", "/api/v1/evaluations/jobs/job-a/events"));
    assert_eq!(seen[0].header("x-user").as_deref(), Some(JOB_ACCOUNT));
    assert_eq!(seen[0].header("x-keyward-pod"), Some(format!("tenant-a/{a}")));
    assert_eq!(seen[0].header("authorization").as_deref(), Some("Bearer token-a"));
    assert_eq!(seen[0].header("x-tenant").as_deref(), Some("tenant-a"));
    // A forged X-User is replaced by the verified one.
    let forged = post("job-a", "tenant-a", &status_event("arc_easy", 0, "completed"), "admin");
    assert_eq!(forged["status"].as_u64(), Some(200), "{forged}");
    assert_eq!(upstream.seen()[1].header("x-user").as_deref(), Some(JOB_ACCOUNT));
    // The kubelet's probe of EvalHub's health (deployment.go: HTTPS on 8443, /api/v1/health) and
    // EvalHub's API for people: no rule names them, so they go on to kube-rbac-proxy as sent,
    // for its own checks; a path the rules name, sent encoded, does not.
    let get = |path: &str| {
        let url = format!("{EVALHUB_URL}{path}");
        go(&["-mode", "http", "-url", &url, "-connect", &gate.addr(), "-ca", &gate.server_ca()])
    };
    let health = get("/api/v1/health");
    assert_eq!(
        (health["status"].as_u64(), health["body"].as_str()),
        (Some(200), Some("upstream says hello\n")),
        "{health}"
    );
    let seen = upstream.seen();
    assert_eq!((seen[2].path.as_str(), seen[2].header("authorization")), ("/api/v1/health", None));
    let encoded = get("/api/v1/evaluations/jobs/job-a/%65vents");
    assert_eq!(encoded["status"].as_u64(), Some(403), "{encoded}");
    assert!(encoded["body"].as_str().unwrap().contains("holds a percent-encoding"), "{encoded}");

    let refused = |outcome: Value, words: &str| {
        assert_eq!(outcome["status"].as_u64(), Some(403), "{outcome}");
        let body = outcome["body"].as_str().unwrap();
        assert!(body.contains(words), "{body}\nwanted: {words}");
    };
    // A's pod posting B's events, with B's event as B would send it.
    refused(
        post("job-b", "tenant-a", &status_event("hellaswag", 1, "completed"), ""),
        "rule \"an evaluation pod posts its own job's events\": the caller's pod's annotation eval-hub.github.io/job_id is \"job-a\", and path segment {id} is \"job-b\"",
    );
    // Another tenant's job store.
    refused(
        post("job-a", "tenant-b", &status_event("arc_easy", 0, "running"), ""),
        "the caller's namespace is \"tenant-a\", and header X-Tenant is \"tenant-b\"",
    );
    // Its own job, another benchmark's event.
    refused(
        post("job-a", "tenant-a", &status_event("hellaswag", 0, "completed"), ""),
        "the caller's pod's annotation eval-hub.github.io/benchmark_id is \"arc_easy\", and JSON field benchmark_status_event.id is \"hellaswag\"",
    );
    refused(
        post("job-a", "tenant-a", &status_event("arc_easy", 1, "completed"), ""),
        "the caller's pod's label benchmark_index is \"0\", and JSON field benchmark_status_event.benchmark_index is \"1\"",
    );
    // A body its server would read another way.
    let twice = r#"{"benchmark_status_event": {"provider_id": "lm_evaluation_harness", "id": "arc_easy", "benchmark_index": 0, "status": "running", "ID": "hellaswag"}}"#;
    refused(post("job-a", "tenant-a", twice, ""), "names field \"benchmark_status_event.ID\" twice");

    // A's pod is replaced by one of the same name: the old token is not the new pod's (401).
    kube.remove("v1", "Pod", "tenant-a", &a);
    let mut replacement = evaluation_pod("tenant-a", "job-a", "arc_easy", 0);
    replacement["metadata"]["uid"] = json!("uid-replacement");
    kube.seed(replacement);
    // Until the gate's watch has seen it, the old pod's token is still the old pod's.
    let mut allowed = 3;
    let outcome = loop {
        let outcome = post("job-a", "tenant-a", &status_event("arc_easy", 0, "running"), "");
        if outcome["status"].as_u64() != Some(200) {
            break outcome;
        }
        allowed += 1;
    };
    assert_eq!(outcome["status"].as_u64(), Some(401), "{outcome}");
    assert!(outcome["body"].as_str().unwrap().contains(&format!("the token is bound to pod tenant-a/{a} with UID {uid_a}, and the pod of that name now has UID uid-replacement")), "{outcome}");
    // Deleted: its token (still accepted from the gate's cache) buys nothing a pod's facts would.
    kube.remove("v1", "Pod", "tenant-a", &a);
    let outcome = loop {
        let outcome = post("job-a", "tenant-a", &status_event("arc_easy", 0, "running"), "");
        if outcome["status"].as_u64() != Some(401) {
            break outcome;
        }
    };
    refused(outcome, &format!("the gate knows nothing of the caller's pod, so no pod's annotation eval-hub.github.io/job_id: the token is bound to pod tenant-a/{a}, which does not exist"));

    assert_eq!(upstream.seen().len(), allowed, "nothing refused reached the upstream");
}
