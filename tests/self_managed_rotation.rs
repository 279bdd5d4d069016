//! The self-managed rotation end to end over real TLS: the controller's planner decides what
//! the Secret and `caBundle` hold; the Secret reaches the real `keyward serve` through a
//! kubelet-style volume (the overlay's items: never `ca.key`); a client that trusts exactly the
//! `caBundle` bytes, as the apiserver does, opens a new connection for every request throughout
//! a leaf renewal and a whole CA rotation. Not one request may fail.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use keyward_controller::serving::{self, Change, Observed, Plan, Settings};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the webhook's pod sees of the Secret (deploy/overlays/self-managed: `items`).
fn projected(files: &BTreeMap<String, Vec<u8>>) -> Vec<(&'static str, &[u8])> {
    ["tls.crt", "tls.key", "ca.crt"].iter().map(|f| (*f, files[*f].as_slice())).collect()
}

fn roots(pem: &[u8]) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(pem) {
        roots.add(der.unwrap()).unwrap();
    }
    roots
}

/// One request on a new connection, trusting exactly `bundle`, as the apiserver's client does.
async fn healthz(addr: std::net::SocketAddr, bundle: &[u8]) -> Result<(), String> {
    let config = rustls::ClientConfig::builder().with_root_certificates(roots(bundle)).with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let mut tls =
        connector.connect(ServerName::try_from(SERVER_NAME).unwrap(), tcp).await.map_err(|e| format!("TLS: {e}"))?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: keyward\r\nconnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await.map_err(|e| e.to_string())?;
    if answer.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&answer).into_owned())
    }
}

/// The SHA-256 of the first certificate of `pem`, as the server logs it.
fn leaf_sha_of(pem: &[u8]) -> String {
    sha256(CertificateDer::pem_slice_iter(pem).next().unwrap().unwrap().as_ref())
}

struct Cluster {
    observed: Observed,
    volume: KubeletVolume,
    /// The webhook configuration's caBundle, as the apiserver reads it.
    bundle: Arc<Mutex<Vec<u8>>>,
}

impl Cluster {
    /// Applies a plan in the order the controller writes it.
    fn apply(&mut self, plan: &Plan) {
        let write_bundle = |bundle: &Arc<Mutex<Vec<u8>>>| *bundle.lock().unwrap() = plan.bundle.clone().into_bytes();
        if plan.bundle_first {
            write_bundle(&self.bundle);
        }
        if let Some(files) = &plan.files {
            self.volume.rotate(&projected(files));
            self.observed.files = files.clone();
        }
        if !plan.bundle_first {
            write_bundle(&self.bundle);
        }
        self.observed.next_since = plan.next_since;
        self.observed.bundle = plan.bundle.clone().into_bytes();
        self.observed.renew_requested = false;
        self.observed.rotate_requested = false;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_only_ca_bundle_never_fails_through_a_renewal_and_a_ca_rotation() {
    // The apiserver needs no time to read caBundle here: switch as soon as it holds both.
    let settings = Settings { switch_after: Duration::ZERO, ..Settings::for_service("keyward", "keyward-system") };
    let now = SystemTime::now;
    let dir = tempfile::tempdir().unwrap();
    let first = serving::plan(&settings, &Observed::default(), now()).unwrap();
    let files = first.files.clone().unwrap();
    let mut cluster = Cluster {
        observed: Observed::default(),
        volume: KubeletVolume::new(dir.path(), &projected(&files)),
        bundle: Arc::new(Mutex::new(Vec::new())),
    };
    cluster.apply(&first);
    let mut server = Server::start(&["--tls-dir", dir.path().to_str().unwrap()], files["ca.crt"].clone());
    let addr = server.endpoint.addr;

    // The apiserver: a new connection per request, trusting caBundle as it is at that moment.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, counted) = tokio::sync::watch::channel(0usize);
    let ok = Arc::new(ok);
    let failures = Arc::new(Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (ok, stop, failures, bundle) = (ok.clone(), stop.clone(), failures.clone(), cluster.bundle.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let trusted = bundle.lock().unwrap().clone();
                match healthz(addr, &trusted).await {
                    Ok(()) => ok.send_modify(|n| *n += 1),
                    Err(e) => failures.lock().unwrap().push(e),
                }
            }
        }));
    }
    // Waits until `n` more requests have succeeded (each success is an event).
    let more_requests = |n: usize| {
        let mut counted = counted.clone();
        async move {
            let target = *counted.borrow() + n;
            tokio::time::timeout(EVENT_TIMEOUT, counted.wait_for(|c| *c >= target))
                .await
                .expect("the clients stopped making progress")
                .unwrap();
        }
    };
    more_requests(20).await;

    // A leaf renewal (asked for, as `kubectl annotate … keyward.io/renew-certificate=now`).
    cluster.observed.renew_requested = true;
    let renew = serving::plan(&settings, &cluster.observed, now()).unwrap();
    assert!(matches!(&renew.changes[..], [Change::LeafRenewed { .. }]), "{:?}", renew.changes);
    cluster.apply(&renew);
    let sha = leaf_sha_of(&cluster.observed.files["tls.crt"]);
    server.wait_log(|v| v["message"] == "serving certificate loaded" && v["sha256"] == sha.as_str());
    more_requests(20).await;

    // A CA rotation: introduce (caBundle gains the new CA first) ...
    cluster.observed.rotate_requested = true;
    let introduce = serving::plan(&settings, &cluster.observed, now()).unwrap();
    assert_eq!(introduce.changes, [Change::CaIntroduced]);
    cluster.apply(&introduce);
    more_requests(20).await;
    // ... switch (the leaf from the new CA, both trusted) ...
    let switch = serving::plan(&settings, &cluster.observed, now()).unwrap();
    assert_eq!(switch.changes[0], Change::CaSwitched);
    cluster.apply(&switch);
    let sha = leaf_sha_of(&cluster.observed.files["tls.crt"]);
    // ... retire, once the replica serves the new leaf: asked of it, as the controller does
    // (a handshake trusting only the new CA), after its reload.
    server.wait_log(|v| v["message"] == "serving certificate loaded" && v["sha256"] == sha.as_str());
    more_requests(20).await;
    let new_ca = cluster.observed.files["ca.crt"].clone();
    cluster.observed.replicas_serve_current = healthz(addr, &new_ca).await.is_ok();
    assert!(cluster.observed.replicas_serve_current);
    let retire = serving::plan(&settings, &cluster.observed, now()).unwrap();
    assert_eq!(retire.changes, [Change::CaRetired]);
    cluster.apply(&retire);
    assert_eq!(cluster.bundle.lock().unwrap().as_slice(), new_ca.as_slice(), "only the new CA is trusted now");
    more_requests(20).await;

    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "{} failed requests, e.g. {:?}", failures.len(), &failures[..failures.len().min(3)]);
    assert!(*counted.borrow() >= 120);
}
