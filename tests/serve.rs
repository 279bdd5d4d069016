//! `keyward serve` end to end: the real binary on loopback, real TLS with a verified CA and
//! the in-cluster server name, AdmissionReviews shaped like the apiserver's.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use base64::Engine as _;
use rustls::pki_types::pem::PemObject;
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn decode_patch(response: &Value) -> Value {
    let patch = response["response"]["patch"].as_str().unwrap();
    serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(patch).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matching_pod_gets_the_patch_and_others_pass_untouched() {
    let tls = TlsDir::new();
    let server = tls.start(&[]);
    let (mut client, peer) = server.connect().await.unwrap();
    assert_eq!(peer, leaf_sha(&tls.first));

    let review = fixture("admissionreview-lmeval.json");
    let response = client.mutate(&review).await.unwrap();
    assert_eq!(response["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(response["kind"], "AdmissionReview");
    let r = &response["response"];
    assert_eq!(r["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(r["allowed"], true);
    assert_eq!(r["patchType"], "JSONPatch");
    assert_eq!(r["auditAnnotations"]["profile"], "lmeval");
    // The patch applies to the pod the apiserver sent, and gives the pod the fms driver reads
    // (backend/driver/driver.go: GRPC_CLIENT_CERT, GRPC_CLIENT_KEY, GRPC_SERVER_CA), written
    // out here by hand rather than taken from the engine under test.
    let patch = decode_patch(&response);
    assert_eq!(patch[0], json!({"op": "add", "path": "/spec/automountServiceAccountToken", "value": false}));
    let request: Value = serde_json::from_slice(&review).unwrap();
    let mut pod = request["request"]["object"].clone();
    json_patch::patch(&mut pod, &serde_json::from_value::<json_patch::Patch>(patch).unwrap()).unwrap();
    let mut expected = request["request"]["object"].clone();
    let spec = &mut expected["spec"];
    spec["automountServiceAccountToken"] = json!(false);
    let volumes = spec["volumes"].as_array_mut().unwrap();
    volumes.retain(|v| v["name"] != "kube-api-access-2wfbn");
    volumes.extend([
        json!({"name": "keyward-client-cert", "secret": {"secretName": "evaljob-sample-lmeval-client", "defaultMode": 420}}),
        json!({"name": "keyward-server-ca", "configMap": {"name": "keyward-lmeval-server-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}], "defaultMode": 420}}),
    ]);
    for list in ["initContainers", "containers"] {
        let mounts = spec[list][0]["volumeMounts"].as_array_mut().unwrap();
        mounts.retain(|m| m["name"] != "kube-api-access-2wfbn");
    }
    let main = &mut spec["containers"][0];
    main["volumeMounts"].as_array_mut().unwrap().extend([
        json!({"name": "keyward-client-cert", "mountPath": "/var/run/secrets/keyward/lmeval-client", "readOnly": true}),
        json!({"name": "keyward-server-ca", "mountPath": "/var/run/secrets/keyward/lmeval-server-ca", "readOnly": true}),
    ]);
    main["env"].as_array_mut().unwrap().extend([
        json!({"name": "GRPC_CLIENT_CERT", "value": "/var/run/secrets/keyward/lmeval-client/tls.crt"}),
        json!({"name": "GRPC_CLIENT_KEY", "value": "/var/run/secrets/keyward/lmeval-client/tls.key"}),
        json!({"name": "GRPC_SERVER_CA", "value": "/var/run/secrets/keyward/lmeval-server-ca/ca.crt"}),
    ]);
    expected["metadata"]["annotations"]["keyward.io/injected"] = json!(
        r#"{"profile":"lmeval","injected":[{"kind":"clientCertificate","secret":"evaljob-sample-lmeval-client","volume":"keyward-client-cert","mountPath":"/var/run/secrets/keyward/lmeval-client"},{"kind":"serverCA","configMap":"keyward-lmeval-server-ca","volume":"keyward-server-ca","mountPath":"/var/run/secrets/keyward/lmeval-server-ca"},{"kind":"apiToken","apiToken":"remove"}],"containers":["main"]}"#
    );
    expected["metadata"]["labels"]["keyward.io/profile"] = json!("lmeval");
    let mut without_attestation = pod.clone();
    let attestation =
        without_attestation["metadata"]["annotations"].as_object_mut().unwrap().remove("keyward.io/attestation");
    assert!(attestation.is_some(), "{pod}");
    assert_eq!(without_attestation, expected);
    // The admission attestation, signed with the mounted key, as keyward's controller checks
    // it on the pod as stored (created a moment after admission): it holds.
    let attestor = DirAttestor::load(server.attestation_dir.as_ref().unwrap().path());
    let mut stored = pod.clone();
    stored["metadata"]["namespace"] = json!("team-a");
    stored["metadata"]["uid"] = json!("3c0d6f8e-2b1a-4c5d-9e8f-7a6b5c4d3e2f");
    stored["metadata"]["creationTimestamp"] = json!(keyward_certs::rfc3339(std::time::SystemTime::now()));
    let verdict = keyward_controller::desired::for_pod(
        &keyward_engine::ProfileSet::builtin().unwrap(),
        &serde_json::value::to_raw_value(&stored).unwrap(),
        "team-a",
        "cluster.local",
    );
    let keyward_controller::desired::PodVerdict::Claim(claim) = verdict else { panic!("no claim: {verdict:?}") };
    assert_eq!(claim.attested(&attestor.0), keyward_engine::attest::Verdict::Valid);

    // Selected, but not created by the operator: refused with 403 and the reason.
    let response = client
        .mutate(&review_of("lmeval-fms-driver-pod.json", "team-a", "system:serviceaccount:team-a:someone", "u-2"))
        .await
        .unwrap();
    let r = &response["response"];
    assert_eq!(r["uid"], "u-2");
    assert_eq!(r["allowed"], false, "lmeval denies other requesters: {r}");
    assert_eq!(r["status"]["code"], 403);
    assert!(r["status"]["message"].as_str().unwrap().contains("not \"system:serviceaccount:team-a:someone\""), "{r}");
    // Selected, by another requester, with otherwise: skip: allowed unchanged with a warning.
    let response =
        client.mutate(&review_of("kfp-persistenceagent-pod-no-token.json", "kubeflow", "alice", "u-3")).await.unwrap();
    let r = &response["response"];
    assert_eq!(r["allowed"], true);
    assert!(r.get("patch").is_none() && r.get("patchType").is_none(), "{r}");
    assert_eq!(r["warnings"].as_array().unwrap().len(), 1, "{r}");

    let mut unselected: Value = serde_json::from_slice(&review).unwrap();
    unselected["request"]["object"]["metadata"]["labels"] = json!({"app": "web"});
    unselected["request"]["uid"] = json!("u-4");
    let response = client.mutate(&serde_json::to_vec(&unselected).unwrap()).await.unwrap();
    assert_eq!(response["response"], json!({"uid": "u-4", "allowed": true}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_clear_errors() {
    let tls = TlsDir::new();
    let server = tls.start(&[]);
    let (mut client, _) = server.connect().await.unwrap();

    let (status, body) = client.request("POST", "/mutate", b"{\"kind\": 42".to_vec()).await.unwrap();
    assert_eq!(status, 400);
    let body = String::from_utf8(body).unwrap();
    assert!(body.starts_with("body is not an AdmissionReview: ") && body.lines().count() == 1, "{body}");

    let (status, body) = client
        .request("POST", "/mutate", br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#.to_vec())
        .await
        .unwrap();
    assert_eq!(status, 400);
    assert!(String::from_utf8(body).unwrap().contains("set admissionReviewVersions: [v1]"));

    // The envelope parses but the object is not a valid Pod: allowed: false with the reason.
    let mut review: Value = serde_json::from_slice(&fixture("admissionreview-lmeval.json")).unwrap();
    review["request"]["object"]["spec"]["containers"] = json!("nope");
    let response = client.mutate(&serde_json::to_vec(&review).unwrap()).await.unwrap();
    assert_eq!(response["response"]["allowed"], false);
    let message = response["response"]["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("keyward: request.object is not a valid Pod: "), "{message}");

    let (status, _) = client.request("GET", "/mutate", Vec::new()).await.unwrap();
    assert_eq!(status, 405);
    let (status, _) = client.request("POST", "/validate", Vec::new()).await.unwrap();
    assert_eq!(status, 404);
    // Bodies over the limit: tests/connections.rs (a declared length) and the router's tests
    // (a streamed body).
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_serves_many_requests_on_one_connection() {
    let tls = TlsDir::new();
    let server = tls.start(&[]);
    let (mut client, _) = server.connect().await.unwrap();
    let review = fixture("admissionreview-lmeval.json");
    for _ in 0..200 {
        let response = client.mutate(&review).await.unwrap();
        assert_eq!(response["response"]["allowed"], true);
    }
    let (status, body) = client.request("GET", "/readyz", Vec::new()).await.unwrap();
    assert_eq!((status, body.as_slice()), (200, &b"ok\n"[..]));

    let metrics = server.metrics_text().await;
    assert!(
        metrics.contains(
            "keyward_admission_requests_total{profile=\"lmeval\",decision=\"allowed\",reason=\"injected\"} 200"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("keyward_certificate_reloads_total{result=\"loaded\"} 1"), "{metrics}");
    assert!(metrics.contains("keyward_certificate_not_after_timestamp_seconds "), "{metrics}");
    // Which keyward this is: the same as `keyward version` says.
    let version = std::process::Command::new(env!("CARGO_BIN_EXE_keyward")).arg("version").output().unwrap();
    let version = String::from_utf8(version.stdout).unwrap();
    let commit = version.lines().nth(1).unwrap().strip_prefix("commit: ").unwrap();
    let info = format!("keyward_build_info{{version=\"{}\",commit=\"{commit}\"}} 1", env!("CARGO_PKG_VERSION"));
    assert!(metrics.contains(&info), "{info} not in {metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpn_offers_h2_and_http11_with_http2_on() {
    let tls = TlsDir::new();
    let server = tls.start(&["--http2"]);
    for (offer, expected) in
        [(vec![&b"h2"[..], &b"http/1.1"[..]], &b"h2"[..]), (vec![&b"http/1.1"[..]], &b"http/1.1"[..])]
    {
        let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let stream = server
            .connector(&offer)
            .connect(rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap(), tcp)
            .await
            .unwrap();
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(expected));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_2_and_1_3_both_work() {
    let tls = TlsDir::new();
    let server = tls.start(&[]);
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(
            rustls::pki_types::CertificateDer::pem_slice_iter(&server.ca_pem).map(|c| c.unwrap()),
        );
        let config =
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(&[version])
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
            .connect(rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap(), tcp)
            .await
            .unwrap();
        assert_eq!(stream.get_ref().1.protocol_version(), Some(version.version));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_is_cut_off_after_the_header_timeout() {
    let tls = TlsDir::new();
    let server = tls.start(&["--request-read-timeout", "1s"]);
    let mut stream = server.raw_tls().await;
    stream.write_all(b"POST /mutate HTTP/1.1\r\nhost: keyward\r\n").await.unwrap();
    // Never finish the headers. The server must close the connection by itself.
    let mut buf = Vec::new();
    let read = tokio::time::timeout(EVENT_TIMEOUT, stream.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the server kept a stalled connection open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_kubelet_rotations_under_load_fail_no_request() {
    let mut tls = TlsDir::new();
    let mut server = tls.start(&[]);
    let load = Load::start(&server.endpoint, fixture("admissionreview-lmeval.json"), |r| {
        if r["response"]["allowed"] == true {
            Ok(0)
        } else {
            Err(format!("unexpected response {r}"))
        }
    });

    for round in 0..20 {
        let next = mint_leaf(&tls.ca);
        let sha = leaf_sha(&next);
        tls.volume.rotate(&secret_files(&next, &tls.ca));
        server.wait_log(|v| v["message"] == "serving certificate loaded" && v["sha256"] == sha.as_str());
        // New connections see the new certificate from now on.
        let (_, peer) = server.connect().await.unwrap();
        assert_eq!(peer, sha, "round {round}: a new connection got an old certificate");
    }
    load.stop_and_check(20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_certificate_keeps_the_old_one_serving() {
    let tls = TlsDir::new();
    let mut server = tls.start(&[]);
    let good = leaf_sha(&tls.first);
    // Replace the kubelet's symlinks with plain files we can break in place, as `cp` would.
    let dir = tls.tmp.path();
    for f in ["tls.crt", "tls.key"] {
        let content = std::fs::read(dir.join(f)).unwrap();
        std::fs::remove_file(dir.join(f)).unwrap();
        std::fs::write(dir.join(f), content).unwrap();
    }
    let other = mint_leaf(&tls.ca);
    let now = std::time::SystemTime::now();
    let old_ca = keyward_certs::pki::Ca::mint("old CA", now - 10 * DAY, 30 * DAY).unwrap();
    let expired = old_ca.issue_serving(&[SERVER_NAME.to_string()], now - 5 * DAY, DAY).unwrap();

    // Each case writes tls.key before tls.crt, chosen so that no state in between is a valid
    // pair: a reload that lands between the two writes must be refused too.
    type Break<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Break, &str)> = vec![
        ("missing key", Box::new(|| std::fs::remove_file(dir.join("tls.key")).unwrap()), "tls.key: cannot read"),
        (
            "half-written certificate",
            Box::new(|| {
                std::fs::write(dir.join("tls.key"), &other.key_pem).unwrap();
                std::fs::write(dir.join("tls.crt"), &other.cert_pem[..200]).unwrap();
            }),
            "tls.crt: not valid PEM",
        ),
        (
            "key that does not match",
            Box::new(|| {
                std::fs::write(dir.join("tls.key"), &tls.first.key_pem).unwrap();
                std::fs::write(dir.join("tls.crt"), &other.cert_pem).unwrap();
            }),
            "the private key does not match the certificate",
        ),
        (
            "expired leaf",
            Box::new(|| {
                std::fs::write(dir.join("tls.key"), &expired.key_pem).unwrap();
                std::fs::write(dir.join("tls.crt"), &expired.cert_pem).unwrap();
            }),
            "the certificate expired at",
        ),
    ];
    for (what, break_it, expected) in cases {
        break_it();
        let line = server.wait_log(|v| {
            v["message"] == "serving certificate refused; keeping the last good one"
                && v["error"].as_str().is_some_and(|e| e.contains(expected))
        });
        assert_eq!(line["still_serving"], good.as_str(), "{what}");
        assert_eq!(line["level"], "ERROR", "{what}");
        let (mut client, peer) = server.connect().await.unwrap();
        assert_eq!(peer, good, "{what}: the old certificate must keep serving");
        let (status, _) = client.request("GET", "/readyz", Vec::new()).await.unwrap();
        assert_eq!(status, 200, "{what}: still ready on the good certificate");
        assert_eq!(client.mutate(&fixture("admissionreview-lmeval.json")).await.unwrap()["response"]["allowed"], true);
    }
    // Repaired in place, as `cp` would: the new pair is picked up.
    std::fs::write(dir.join("tls.key"), &other.key_pem).unwrap();
    std::fs::write(dir.join("tls.crt"), &other.cert_pem).unwrap();
    let sha = leaf_sha(&other);
    server.wait_log(|v| v["message"] == "serving certificate loaded" && v["sha256"] == sha.as_str());
    assert_eq!(server.connect().await.unwrap().1, sha);
    let metrics = server.metrics_text().await;
    let failed: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("keyward_certificate_reloads_total{result=\"failed\"} "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(failed >= 4, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_on_an_empty_tls_dir_it_is_live_not_ready_until_the_certificate_arrives() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = mint_ca();
    let mut server = Server::start(&["--tls-dir", tmp.path().to_str().unwrap()], ca.cert_pem().as_bytes().to_vec());
    // Started without a certificate (cert-manager has not issued it yet): no handshake succeeds.
    assert!(server.connect().await.is_err());
    // But it is live, where the Deployment's liveness probe asks (the metrics port), so the
    // kubelet waits for the Secret instead of restarting it; and says why it is not ready.
    let (status, live) = server.metrics_get("/healthz").await;
    assert_eq!((status, live.ends_with("\r\n\r\nok\n")), (200, true), "{live}");
    let (status, ready) = server.metrics_get("/readyz").await;
    assert_eq!(status, 503, "{ready}");
    assert!(ready.contains("\r\n\r\nnot ready: "), "{ready}");
    let leaf = mint_leaf(&ca);
    let _volume = KubeletVolume::new(tmp.path(), &secret_files(&leaf, &ca));
    let sha = leaf_sha(&leaf);
    server.wait_log(|v| v["message"] == "serving certificate loaded" && v["sha256"] == sha.as_str());
    let (mut client, peer) = server.connect().await.unwrap();
    assert_eq!(peer, sha);
    assert_eq!(client.request("GET", "/readyz", Vec::new()).await.unwrap().0, 200);
    assert_eq!(server.metrics_get("/readyz").await.0, 200);
    assert_eq!(server.metrics_get("/healthz").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_default_mints_a_dev_ca_and_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    let server =
        Server::start(&["--dev-cert-dir", dev.to_str().unwrap(), "--dns-name", "keyward.example.test"], Vec::new());
    let line = server.seen(|v| v["message"].as_str().is_some_and(|m| m.starts_with("try: curl --cacert "))).unwrap();
    assert!(line["message"].as_str().unwrap().contains("https://localhost:"), "{line}");
    let mut endpoint = server.endpoint.clone();
    endpoint.ca_pem = std::fs::read(dev.join("ca.crt")).unwrap();
    let (mut client, _) = endpoint.connect().await.unwrap();
    let response = client.mutate(&fixture("admissionreview-lmeval.json")).await.unwrap();
    assert_eq!(response["response"]["allowed"], true);
    let info = keyward_certs::pem::read_pair(&dev).unwrap().info;
    assert!(info.covers("keyward.example.test") && info.covers("127.0.0.1") && info.covers(SERVER_NAME));
    assert!(info.covers("::1"));
}

/// Go's crypto/tls sends `tls.Config.ServerName` as the SNI as it is, a port included where a
/// program sets `host:port` (fms-lm-eval-service's driver does): such a handshake completes, as
/// do an IP literal and a valid name, with the one certificate keyward serves (vendor/README.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_server_name_is_not_a_dns_name_completes_the_handshake() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    let server = Server::start(&["--dev-cert-dir", dev.to_str().unwrap()], Vec::new());
    for sni in [SERVER_NAME, "keyward.keyward-system.svc:443", "127.0.0.1", "[::1]:8443", "under_score.svc"] {
        let said = openssl_handshake(server.endpoint.addr, &dev.join("ca.crt"), sni);
        assert!(said.is_ok(), "SNI {sni:?}: {said:?}");
    }
}

/// The default address, `[::]`, answers on IPv6 and IPv4 loopback alike (`localhost` may
/// resolve to either), as the development certificate names both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_address_answers_ipv6_and_ipv4_loopback() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    let server = Server::start(&["--listen", "[::]:0", "--dev-cert-dir", dev.to_str().unwrap()], Vec::new());
    let port = server.endpoint.addr.port();
    assert_eq!(server.endpoint.addr, std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)));
    for ip in [std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST), std::net::IpAddr::from([127, 0, 0, 1])] {
        let mut endpoint = server.endpoint.clone();
        endpoint.addr = std::net::SocketAddr::new(ip, port);
        endpoint.ca_pem = std::fs::read(dev.join("ca.crt")).unwrap();
        let (mut client, _) = endpoint.connect().await.unwrap_or_else(|e| panic!("{ip}: {e}"));
        let response = client.mutate(&fixture("admissionreview-lmeval.json")).await.unwrap();
        assert_eq!(response["response"]["allowed"], true, "{ip}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_request_in_flight() {
    let tls = TlsDir::new();
    let mut server = tls.start(&["--shutdown-delay", "0s"]);
    let review = fixture("admissionreview-lmeval.json");
    let mut stream = server.raw_tls().await;
    // Headers and half the body, then SIGTERM, then the rest.
    let head = format!(
        "POST /mutate?timeout=10s HTTP/1.1\r\nhost: {SERVER_NAME}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        review.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&review[..review.len() / 2]).await.unwrap();
    stream.flush().await.unwrap();
    // The request has begun (a connection with no request yet is idle, and closed at shutdown).
    server.wait_metric("keyward_requests_in_flight{listener=\"webhook\"}", 1.0).await;
    std::process::Command::new("kill").args(["-TERM", &server.pid().to_string()]).status().unwrap();
    server.wait_log(|v| v["message"] == "shutting down: no new connections; finishing requests in flight");
    stream.write_all(&review[review.len() / 2..]).await.unwrap();
    stream.flush().await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("\"allowed\":true"), "{text}");
    let status = server.terminate();
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_h2_are_served_too_with_http2_on() {
    let tls = TlsDir::new();
    let server = tls.start(&["--http2"]);
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let stream = server
        .connector(&[b"h2"])
        .connect(rustls::pki_types::ServerName::try_from(SERVER_NAME).unwrap(), tcp)
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    for _ in 0..3 {
        let req = hyper::Request::post(format!("https://{SERVER_NAME}/mutate?timeout=10s"))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(hyper::body::Bytes::from(fixture("admissionreview-lmeval.json"))))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.version(), hyper::Version::HTTP_2);
        let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["response"]["allowed"], true);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_gets_408() {
    let tls = TlsDir::new();
    let server = tls.start(&["--request-read-timeout", "1s"]);
    let mut stream = server.raw_tls().await;
    stream
        .write_all(b"POST /mutate HTTP/1.1\r\nhost: keyward\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"apiV")
        .await
        .unwrap();
    stream.flush().await.unwrap();
    // The rest never comes; the server answers 408 by itself.
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(EVENT_TIMEOUT, stream.read(&mut buf)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_first_reports_not_ready_while_still_serving() {
    let tls = TlsDir::new();
    let mut server = tls.start(&["--shutdown-delay", "60s"]);
    std::process::Command::new("kill").args(["-TERM", &server.pid().to_string()]).status().unwrap();
    server
        .wait_log(|v| v["message"] == "shutting down: reporting not ready; still accepting connections for the delay");
    // New connections are still accepted and served; only readiness fails.
    let (mut client, _) = server.connect().await.unwrap();
    let (status, body) = client.request("GET", "/readyz", Vec::new()).await.unwrap();
    assert_eq!((status, body.as_slice()), (503, &b"not ready: shutting down\n"[..]));
    assert_eq!(client.mutate(&fixture("admissionreview-lmeval.json")).await.unwrap()["response"]["allowed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_pods_being_decided_do_not_hold_up_the_health_endpoints() {
    let tls = TlsDir::new();
    // A profile that injects an env var into every container of the fms driver pods: their
    // spec is scanned whole. (The built-in lmeval profile attests its pods, and refuses one
    // this large as soon as its binding's budget is spent: too soon for this test.)
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("profile.yaml"), numbered_profile(0)).unwrap();
    let server = tls.start(&[
        "--max-concurrent-decisions",
        "2",
        "--no-default-profiles",
        "--profiles",
        dir.path().to_str().unwrap(),
    ]);
    // A 5 MB LMEvalJob pod: 100,000 volumes and 10,000 containers (most of a second to decide
    // in a test build). Two at once would take both async workers if they decided there.
    let mut review: Value = serde_json::from_slice(&fixture("admissionreview-lmeval.json")).unwrap();
    review["request"]["userInfo"]["username"] =
        json!("system:serviceaccount:lm-eval:trustyai-service-operator-controller-manager");
    let pod = &mut review["request"]["object"];
    let mut volumes: Vec<Value> = (0..100_000).map(|i| json!({"name": format!("v{i}"), "emptyDir": {}})).collect();
    volumes.extend(pod["spec"]["volumes"].as_array().unwrap().iter().cloned());
    pod["spec"]["volumes"] = Value::Array(volumes);
    pod["spec"]["containers"] = Value::Array(
        (0..10_000)
            .map(|i| json!({"name": format!("c{i}"), "image": "busybox",
                "volumeMounts": [{"name": "kube-api-access-7xq2m", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]}))
            .collect(),
    );
    let big = Arc::new(serde_json::to_vec(&review).unwrap());
    assert!(big.len() > 4_000_000 && big.len() < 7 * 1024 * 1024, "{}", big.len());
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (endpoint, big, done) = (server.endpoint.clone(), big.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let (mut client, _) = endpoint.connect().await.unwrap();
            let response = client.mutate(&big).await.unwrap();
            done.fetch_add(1, Ordering::SeqCst);
            response
        }));
    }
    // Both bodies read, both decisions running...
    server.wait_metric("keyward_admission_decisions_running", 2.0).await;
    // ...and the health endpoints answer all the while.
    let (mut client, _) = server.connect().await.unwrap();
    for path in ["/healthz", "/readyz", "/healthz"] {
        let (status, _) = client.request("GET", path, Vec::new()).await.unwrap();
        assert_eq!(status, 200, "{path}");
    }
    assert_eq!(done.load(Ordering::SeqCst), 0, "the health checks were answered while both decisions ran");
    for task in tasks {
        // More containers than keyward injects into: answered with the reason, after the scan.
        let response = task.await.unwrap();
        assert_eq!(response["response"]["allowed"], false);
        let message = response["response"]["status"]["message"].as_str().unwrap();
        assert!(message.ends_with("keyward refuses rather than build a patch that large"), "{message}");
    }
}

/// A profile for the fms driver pods that the operator's account creates, numbered so each
/// reload is told apart: its name and the value it injects.
fn numbered_profile(n: u32) -> String {
    format!(
        "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {{name: gen-{n}}}\nspec:\n  selector: {{matchLabels: {{app.kubernetes.io/name: fms-lm-eval-service}}}}\n  requesters: {{usernames: [\"system:serviceaccount:lm-eval:trustyai-service-operator-controller-manager\"]}}\n  inject:\n    env:\n      - {{name: GENERATION, value: \"{n}\"}}\n"
    )
}

/// The generation a response injected: its profile's number, checked against the env var.
fn generation_of(response: &Value) -> Result<u32, String> {
    let r = &response["response"];
    let profile = r["auditAnnotations"]["profile"].as_str().ok_or_else(|| format!("not injected: {r}"))?;
    let n: u32 =
        profile.strip_prefix("gen-").and_then(|n| n.parse().ok()).ok_or_else(|| format!("profile {profile}"))?;
    let patch = decode_patch(response);
    let env = patch.as_array().unwrap().iter().find(|op| op["value"]["name"] == "GENERATION");
    match env {
        Some(op) if op["value"]["value"].as_str() == Some(n.to_string().as_str()) => Ok(n),
        _ => Err(format!("profile gen-{n} with another GENERATION: {patch}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_changes_take_effect_on_the_next_admission_and_fail_no_request_under_load() {
    let tls = TlsDir::new();
    let dir = tempfile::tempdir().unwrap();
    let mut volume = KubeletVolume::new(dir.path(), &[("profile.yaml", numbered_profile(0).as_bytes())]);
    let mut server =
        tls.start(&["--no-default-profiles", "--profiles", dir.path().to_str().unwrap(), "--cert-poll-interval", "1h"]);
    let review = review_of(
        "lmeval-fms-driver-pod.json",
        "team-a",
        "system:serviceaccount:lm-eval:trustyai-service-operator-controller-manager",
        "u-1",
    );
    // Each client sees generations that never go back: a set is swapped whole, never mixed.
    let load = Load::start(&server.endpoint, review.clone(), generation_of);

    let (mut client, _) = server.connect().await.unwrap();
    assert_eq!(generation_of(&client.mutate(&review).await.unwrap()), Ok(0));
    for n in 1..=10 {
        volume.rotate(&[("profile.yaml", numbered_profile(n).as_bytes())]);
        let name = format!("gen-{n}");
        server.wait_log(|v| {
            v["message"] == "profiles reloaded" && v["profiles"].as_str() == Some(&format!("[{name:?}]"))
        });
        // The next admission, on a connection opened before the change, has the new set.
        assert_eq!(generation_of(&client.mutate(&review).await.unwrap()), Ok(n));
    }

    // A bad set (a profile with an empty selector, next to a good one): refused whole, said
    // once with every problem, counted; the last good set serves and the webhook stays ready.
    let bad =
        numbered_profile(11).replace("  selector: {matchLabels: {app.kubernetes.io/name: fms-lm-eval-service}}\n", "");
    volume.rotate(&[("good.yaml", numbered_profile(12).as_bytes()), ("profile.yaml", bad.as_bytes())]);
    let refused = server.wait_log(|v| v["message"].as_str().is_some_and(|m| m.starts_with("profiles refused")));
    let error = refused["error"].as_str().unwrap();
    assert!(error.contains("profile.yaml") && error.contains("spec.selector: must not be empty"), "{error}");
    assert_eq!(refused["still_serving"], "[\"gen-10\"]");
    assert_eq!(generation_of(&client.mutate(&review).await.unwrap()), Ok(10));
    assert_eq!(client.request("GET", "/readyz", Vec::new()).await.unwrap().0, 200);
    server.wait_metric("keyward_profile_reloads_total{result=\"failed\"}", 1.0).await;
    assert_eq!(server.metric("keyward_profile_reloads_total{result=\"loaded\"}").await, 10.0);

    load.stop_and_check(10).await;
}

/// Load on the server while something changes under it: one client on a kept-alive
/// connection, one opening a new connection per request, each answer put through `check`, whose
/// number (a generation) must never go back on a client.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    clients: Vec<tokio::task::JoinHandle<(usize, Vec<String>)>>,
}

impl Load {
    fn start(target: &Endpoint, review: Vec<u8>, check: fn(&Value) -> Result<u32, String>) -> Load {
        let (stop, ok, review) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(review));
        let clients = [false, true]
            .into_iter()
            .map(|fresh_connections| {
                let (review, stop, ok, target) = (review.clone(), stop.clone(), ok.clone(), target.clone());
                tokio::spawn(async move {
                    // The first failures and how many in all; a broken connection is dropped, so
                    // a failure never turns into a loop that only fails (and fills memory).
                    let (mut failures, mut failed) = (Vec::new(), 0usize);
                    let (mut conn, mut last) = (None, 0);
                    while !stop.load(Ordering::Relaxed) && failed < 1000 {
                        if conn.is_none() || fresh_connections {
                            match target.connect().await {
                                Ok((c, _)) => conn = Some(c),
                                Err(e) => {
                                    failed += 1;
                                    failures.push(format!("connect: {e}"));
                                    continue;
                                }
                            }
                        }
                        let Some(client) = conn.as_mut() else { continue };
                        match client.mutate(&review).await.and_then(|r| check(&r)) {
                            Ok(n) if n >= last => {
                                last = n;
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(n) => {
                                failed += 1;
                                failures.push(format!("generation {n} after {last}"));
                            }
                            Err(e) => {
                                failed += 1;
                                failures.push(e);
                                conn = None;
                            }
                        }
                        failures.truncate(20);
                    }
                    (failed, failures)
                })
            })
            .collect();
        Load { stop, ok, clients }
    }

    /// Stops the clients; not one request may have failed, and at least `min` succeeded.
    async fn stop_and_check(self, min: u64) {
        self.stop.store(true, Ordering::Relaxed);
        let (mut failed, mut failures) = (0, Vec::new());
        for c in self.clients {
            let (n, some) = c.await.unwrap();
            failed += n;
            failures.extend(some);
        }
        assert!(failed == 0, "{failed} failed requests, e.g. {:?}", &failures[..failures.len().min(5)]);
        assert!(self.ok.load(Ordering::Relaxed) >= min, "too few requests ran meanwhile");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_auto_delivers_pod_certificates_once_the_controllers_facts_say_it_signs_them() {
    // The lmeval profile with delivery: auto, mounted as the operator would.
    let pod_certificate =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/profiles/lmeval-pod-certificate.yaml"))
            .unwrap()
            .replace(
                "      delivery: podCertificate\n",
                "      delivery: auto\n      secretName: \"{owner.name}-lmeval-client\"\n",
            );
    let (profiles, facts) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let _profiles = KubeletVolume::new(profiles.path(), &[("lmeval.yaml", pod_certificate.as_bytes())]);
    let facts_file = facts.path().join("facts.json");
    let tls = TlsDir::new();
    let mut server = tls.start(&[
        "--profiles",
        profiles.path().to_str().unwrap(),
        "--cluster-facts",
        facts_file.to_str().unwrap(),
        "--cert-poll-interval",
        "1h",
    ]);
    let loaded = server.seen(|v| v["message"] == "profiles loaded").unwrap();
    assert_eq!(loaded["cluster"], "pod certificates not signed (delivery: auto delivers Secrets)");
    assert_eq!(loaded["cluster_facts"], facts_file.to_str().unwrap());
    let review = fixture("admissionreview-lmeval.json");
    let client_cert_volume = |response: &Value| {
        let patch = decode_patch(response);
        patch.as_array().unwrap().iter().find(|op| op["value"]["name"] == "keyward-client-cert").unwrap()["value"]
            .clone()
    };
    let (mut client, _) = server.connect().await.unwrap();
    // No facts yet (the optional ConfigMap is not written): a Secret, as on every cluster.
    assert_eq!(
        client_cert_volume(&client.mutate(&review).await.unwrap()),
        json!({"name": "keyward-client-cert", "secret": {"secretName": "evaljob-sample-lmeval-client", "defaultMode": 420}})
    );
    // The controller found the API and signs: the kubelet writes the ConfigMap's file.
    let _facts = KubeletVolume::new(facts.path(), &[("facts.json", b"{\"podCertificates\":\"v1beta1\"}\n")]);
    let reloaded = server.wait_log(|v| v["message"] == "profiles reloaded");
    assert_eq!(
        reloaded["cluster"],
        "pod certificates signed at certificates.k8s.io/v1beta1 (delivery: auto delivers them)"
    );
    assert_eq!(
        client_cert_volume(&client.mutate(&review).await.unwrap()),
        json!({"name": "keyward-client-cert", "projected": {"defaultMode": 420, "sources": [{"podCertificate": {
            "signerName": "keyward.io/lmeval", "keyType": "ECDSAP256", "maxExpirationSeconds": 86400,
            "keyPath": "tls.key", "certificateChainPath": "tls.crt"}}]}})
    );
}

/// `explain` makes the webhook's decision: on the same review, the webhook's patch is explain's
/// plus the one operation explain shows apart (the attestation, which needs the webhook's key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_is_the_webhooks_patch_but_the_attestation_it_shows_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    let server = Server::start(&["--dev-cert-dir", dev.to_str().unwrap()], Vec::new());
    let mut endpoint = server.endpoint.clone();
    endpoint.ca_pem = std::fs::read(dev.join("ca.crt")).unwrap();
    let (mut client, _) = endpoint.connect().await.unwrap();
    let review = fixture("admissionreview-lmeval.json");
    let answer = client.mutate(&review).await.unwrap();
    let patch =
        base64::engine::general_purpose::STANDARD.decode(answer["response"]["patch"].as_str().unwrap()).unwrap();
    let mut webhook: Vec<Value> = serde_json::from_slice(&patch).unwrap();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keyward"))
        .args(["explain", "-o", "json", "tests/fixtures/admissionreview-lmeval.json"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let explained: Value = serde_json::from_slice(&out.stdout).unwrap();
    let at = webhook.iter().position(|op| op["path"] == explained["attestation"]["path"]).unwrap();
    let signed = webhook.remove(at);
    assert_eq!(signed["op"], "add");
    assert!(signed["value"].as_str().unwrap().starts_with("v2."), "{signed}");
    assert_eq!(Value::Array(webhook), explained["patch"]);
}
