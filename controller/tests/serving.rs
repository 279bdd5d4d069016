//! `--serving-cert self-managed` against the in-process fake API: the first start, a valid
//! Secret left alone, a wiped caBundle repaired by the running controller, garbage replaced, a
//! Secret keyward does not manage left alone, API errors retried, and only the leader writing.
//! The rotation protocol itself is tested on the pure planner (`serving.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use keyward_controller::self_managed::SelfManaged;
use keyward_controller::Settings;
use keyward_controller::{LeaderElector, Leadership, LeaseConfig};
use keyward_engine::ProfileSet;
use serde_json::{json, Value};
use support::*;

const LIMIT: Duration = Duration::from_secs(20);
const MWC: &str = "admissionregistration.k8s.io/v1";

fn self_managed() -> Settings {
    Settings {
        serving: Some(SelfManaged::new("keyward-serving", "keyward", "keyward", "keyward-system")),
        client_ca_secret: Some("keyward-client-ca".into()),
        ..settings()
    }
}

/// A replica that leads, as the one that writes.
fn leader(fake: &FakeApi, ca: &ClientCa, settings: Settings) -> Arc<keyward_controller::Context> {
    reconciler_with(fake.client("keyward"), ProfileSet::builtin().unwrap(), ca, Leadership::always(), settings)
}

fn client_ca_secret(fake: &FakeApi) -> Option<Value> {
    fake.get("v1", "Secret", "keyward-system", "keyward-client-ca")
}

/// The webhook configuration as `deploy/base/webhook.yaml` installs it: no caBundle yet.
fn webhook_config() -> Value {
    json!({
        "apiVersion": MWC, "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "keyward"},
        "webhooks": [{
            "name": "pods.keyward.io",
            "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
            "clientConfig": {"service": {"name": "keyward", "namespace": "keyward-system", "path": "/mutate", "port": 443}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}]
        }]
    })
}

fn ca_bundle(fake: &FakeApi) -> Option<String> {
    let config = fake.get(MWC, "MutatingWebhookConfiguration", "", "keyward")?;
    let b64 = config["webhooks"][0]["clientConfig"]["caBundle"].as_str()?;
    Some(String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap())
}

fn serving_secret(fake: &FakeApi) -> Option<Value> {
    fake.get("v1", "Secret", "keyward-system", "keyward-serving")
}

fn writes_to(fake: &FakeApi, resource: &str) -> Vec<String> {
    fake.writes().into_iter().filter(|c| c.resource.ends_with(resource)).map(|c| c.method).collect()
}

#[tokio::test]
async fn the_first_start_makes_the_secret_after_the_bundle_trusts_its_ca_and_then_leaves_them_alone() {
    let fake = FakeApi::default();
    fake.seed(webhook_config());
    let ca = client_ca();
    let r = leader(&fake, &ca, self_managed());
    keyward_controller::singletons::serving_cert(&r).await.unwrap();

    let secret = serving_secret(&fake).unwrap();
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(secret["metadata"]["labels"]["app.kubernetes.io/managed-by"], "keyward");
    assert_eq!(secret["metadata"]["labels"]["keyward.io/provisioned-for"], "serving");
    let keys: Vec<&str> = secret["data"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["ca.crt", "ca.key", "tls.crt", "tls.key"]);
    let ca_pem = secret_data(&secret, "ca.crt");
    assert_eq!(ca_bundle(&fake).unwrap(), ca_pem);
    keyward_controller::serving::served_as(
        secret_data(&secret, "tls.crt").as_bytes(),
        ca_pem.as_bytes(),
        "keyward.keyward-system.svc",
        now(),
    )
    .unwrap();
    // The client CA first, then caBundle before the serving Secret: the apiserver trusts the
    // CA before any replica can serve its leaf.
    let order: Vec<(String, String, String)> = fake
        .writes()
        .into_iter()
        .map(|c| {
            let name =
                c.body.as_ref().and_then(|b| b["metadata"]["name"].as_str().map(str::to_string)).unwrap_or(c.name);
            (c.method, c.resource.rsplit('/').next().unwrap().to_string(), name)
        })
        .collect();
    let row = |m: &str, r: &str, n: &str| (m.to_string(), r.to_string(), n.to_string());
    assert_eq!(
        order,
        [
            row("POST", "secrets", "keyward-client-ca"),
            row("PATCH", "mutatingwebhookconfigurations", "keyward"),
            row("POST", "secrets", "keyward-serving")
        ]
    );
    // The client CA can sign, as the controller's client CA store checks it.
    let client = client_ca_secret(&fake).unwrap();
    assert_eq!(secret_data(&client, "tls.crt"), secret_data(&client, "ca.crt"));
    keyward_certs::pki::Ca::from_pem(
        &secret_data(&client, "tls.crt"),
        &secret_data(&client, "tls.key"),
        "tls.crt".as_ref(),
        "tls.key".as_ref(),
    )
    .unwrap();
    assert_eq!(r.metrics().serving_change_count("client-ca-created"), 1);
    r.metrics().set_build_info("1.2.3", "v1.2.3-4-gabcdef0");
    assert!(r
        .metrics()
        .render()
        .contains("keyward_controller_build_info{version=\"1.2.3\",commit=\"v1.2.3-4-gabcdef0\"} 1"));
    assert_eq!(r.metrics().serving_change_count("created"), 1);

    // Again: valid, so nothing is written.
    fake.clear_calls();
    keyward_controller::singletons::serving_cert(&r).await.unwrap();
    assert_eq!(fake.writes().len(), 0, "{:#?}", fake.writes());
    assert_eq!(r.metrics().serving_change_count("ca-bundle-repaired"), 0);

    // keyward's client CA damaged: made again.
    let mut damaged = client_ca_secret(&fake).unwrap();
    damaged["data"]["tls.key"] = json!(b64("junk"));
    fake.seed(damaged);
    fake.clear_calls();
    keyward_controller::singletons::serving_cert(&r).await.unwrap();
    assert_eq!(writes_to(&fake, "secrets"), ["PUT"]);
    let remade = client_ca_secret(&fake).unwrap();
    assert!(secret_data(&remade, "tls.key").starts_with("-----BEGIN PRIVATE KEY-----"));
    assert_eq!(r.metrics().serving_change_count("client-ca-created"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_ca_bundle_is_repaired_by_the_running_controller() {
    let fake = FakeApi::default();
    fake.seed(webhook_config());
    let ca = client_ca();
    let r = leader(&fake, &ca, self_managed());
    let _task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    let ca_pem = fake.until(LIMIT, |f| serving_secret(f).map(|s| secret_data(&s, "ca.crt"))).await;
    fake.until(LIMIT, |f| (ca_bundle(f).as_deref() == Some(ca_pem.as_str())).then_some(())).await;
    let secret_version = serving_secret(&fake).unwrap()["metadata"]["resourceVersion"].clone();

    // A GitOps tool applies the configuration from Git again: caBundle is gone.
    fake.seed(webhook_config());
    fake.until(LIMIT, |f| (ca_bundle(f).as_deref() == Some(ca_pem.as_str())).then_some(())).await;
    assert_eq!(
        serving_secret(&fake).unwrap()["metadata"]["resourceVersion"],
        secret_version,
        "the Secret is untouched"
    );
    fake.until(LIMIT, |_| (r.metrics().serving_change_count("ca-bundle-repaired") == 1).then_some(())).await;
}

#[tokio::test]
async fn a_secret_holding_garbage_is_replaced_and_one_keyward_does_not_manage_is_left_alone() {
    let fake = FakeApi::default();
    fake.seed(webhook_config());
    let ca = client_ca();
    let r = leader(&fake, &ca, self_managed());
    let garbage = |labels: Value| {
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "keyward-serving", "namespace": "keyward-system", "labels": labels},
            "data": {"ca.crt": b64("junk"), "ca.key": b64("junk"), "tls.crt": b64("junk"), "tls.key": b64("junk")}
        })
    };

    // The admin's own client CA (no keyward label) is used as it is, even unreadable here.
    fake.seed(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "keyward-client-ca", "namespace": "keyward-system"},
        "data": {"tls.crt": b64("admin's"), "tls.key": b64("admin's")}
    }));
    fake.seed(garbage(json!({"app": "someone-else"})));
    let refused = keyward_controller::singletons::serving_cert(&r).await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        "Secret keyward-system/keyward-serving: exists and is not managed by keyward (no label app.kubernetes.io/managed-by=keyward); remove it, label it to hand it to keyward, or name another with --serving-secret"
    );
    assert!(fake.writes().is_empty());

    fake.seed(garbage(json!({"app.kubernetes.io/managed-by": "keyward", "keyward.io/provisioned-for": "serving"})));
    fake.clear_calls();
    keyward_controller::singletons::serving_cert(&r).await.unwrap();
    let secret = serving_secret(&fake).unwrap();
    let ca_pem = secret_data(&secret, "ca.crt");
    assert!(ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(secret["data"]["ca-previous.crt"].is_null(), "junk is never trusted");
    assert_eq!(ca_bundle(&fake).unwrap(), ca_pem);
    assert_eq!(writes_to(&fake, "secrets"), ["PUT"], "replaced at the version read; the admin's client CA untouched");
    assert_eq!(secret_data(&client_ca_secret(&fake).unwrap(), "tls.crt"), "admin's");
    assert_eq!(r.metrics().serving_change_count("created"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_retried_with_backoff() {
    let fake = FakeApi::default();
    fake.seed(webhook_config());
    fake.fail("PATCH", "mutatingwebhookconfigurations", 500, 2);
    fake.fail("POST", "secrets", 429, 1);
    let ca = client_ca();
    let r = leader(&fake, &ca, self_managed());
    let _task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    let ca_pem = fake.until(LIMIT, |f| serving_secret(f).map(|s| secret_data(&s, "ca.crt"))).await;
    fake.until(LIMIT, |f| (ca_bundle(f).as_deref() == Some(ca_pem.as_str())).then_some(())).await;
    let statuses: Vec<u16> = fake
        .calls()
        .into_iter()
        .filter(|c| c.resource.ends_with("mutatingwebhookconfigurations") && c.method == "PATCH")
        .map(|c| c.status)
        .collect();
    assert_eq!(statuses[..2], [500, 500]);
    assert!(fake.calls().iter().any(|c| c.resource.ends_with("secrets") && c.method == "POST" && c.status == 429));
}

#[tokio::test]
async fn a_replica_that_does_not_lead_writes_nothing() {
    let fake = FakeApi::default();
    fake.seed(webhook_config());
    let ca = client_ca();
    let client = fake.client("follower");
    // An elector that never ran: this replica does not hold the Lease.
    let leadership =
        LeaderElector::new(client.clone(), LeaseConfig::new("keyward-controller", "keyward-system", "follower"))
            .leadership();
    let r = reconciler_with(client, ProfileSet::builtin().unwrap(), &ca, leadership, self_managed());
    let err = keyward_controller::singletons::serving_cert(&r).await.unwrap_err();
    assert_eq!(err.to_string(), "not the leader: nothing is written");
    assert!(fake.attempted_writes().is_empty(), "{:#?}", fake.attempted_writes());
    assert!(serving_secret(&fake).is_none());
}

/// A webhook replica for the controller to ask: serves whichever pair it was last given.
struct Replica {
    addr: std::net::SocketAddr,
    pair: Arc<Mutex<Arc<rustls::sign::CertifiedKey>>>,
    _task: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct Current(Arc<Mutex<Arc<rustls::sign::CertifiedKey>>>);

impl rustls::server::ResolvesServerCert for Current {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.lock().unwrap().clone())
    }
}

fn certified(secret: &Value) -> Arc<rustls::sign::CertifiedKey> {
    let crt = secret_data(secret, "tls.crt");
    let key = secret_data(secret, "tls.key");
    keyward_certs::pem::load_pair(crt.as_bytes(), key.as_bytes(), "tls.crt".as_ref(), "tls.key".as_ref()).unwrap().key
}

impl Replica {
    async fn serving(secret: &Value) -> Self {
        let pair = Arc::new(Mutex::new(certified(secret)));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Current(pair.clone())));
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let _ = acceptor.accept(tcp).await;
                });
            }
        });
        Self { addr, pair, _task: task }
    }

    /// The EndpointSlice the Service's controller keeps for it.
    fn endpoint_slice(&self) -> Value {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "keyward-abcde", "namespace": "keyward-system", "labels": {"kubernetes.io/service-name": "keyward"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.addr.ip().to_string()], "conditions": {"ready": true}}],
            "ports": [{"name": "metrics", "port": 9090, "protocol": "TCP"}, {"name": "https", "port": self.addr.port(), "protocol": "TCP"}]
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotation_keeps_both_cas_in_ca_bundle_until_the_replica_serves_the_new_leaf() {
    let fake = FakeApi::default();
    fake.seed(webhook_config());
    let ca = client_ca();
    let mut settings = self_managed();
    settings.serving.as_mut().unwrap().certs.switch_after = Duration::ZERO;
    let r = leader(&fake, &ca, settings);
    keyward_controller::singletons::serving_cert(&r).await.unwrap();
    let first = serving_secret(&fake).unwrap();
    let old_ca = secret_data(&first, "ca.crt");
    let replica = Replica::serving(&first).await;
    fake.seed(replica.endpoint_slice());
    let bundle_count = |f: &FakeApi| ca_bundle(f).unwrap().matches("BEGIN CERTIFICATE").count();

    // An admin asks for a rotation: the new CA joins caBundle, and signs nothing yet.
    let mut annotated = first.clone();
    annotated["metadata"]["annotations"] = json!({"keyward.io/rotate-ca": "now"});
    fake.seed(annotated);
    keyward_controller::singletons::serving_cert(&r).await.unwrap();
    let introduced = serving_secret(&fake).unwrap();
    assert!(introduced["metadata"]["annotations"].get("keyward.io/rotate-ca").is_none(), "the request is answered");
    assert!(introduced["data"]["ca-next.crt"].is_string());
    assert_eq!(secret_data(&introduced, "tls.crt"), secret_data(&first, "tls.crt"));
    assert_eq!(bundle_count(&fake), 2);

    // Switch: the leaf from the new CA; both still trusted.
    keyward_controller::singletons::serving_cert(&r).await.unwrap();
    let switched = serving_secret(&fake).unwrap();
    assert_eq!(secret_data(&switched, "ca-previous.crt"), old_ca);
    assert_ne!(secret_data(&switched, "ca.crt"), old_ca);
    assert_eq!(bundle_count(&fake), 2);

    // The replica still serves the old leaf: the old CA stays.
    keyward_controller::singletons::serving_cert(&r).await.unwrap();
    assert_eq!(bundle_count(&fake), 2);
    assert!(serving_secret(&fake).unwrap()["data"]["ca-previous.crt"].is_string());

    // It reloads: asked again, it passes, and the old CA leaves the Secret, then caBundle.
    *replica.pair.lock().unwrap() = certified(&switched);
    keyward_controller::singletons::serving_cert(&r).await.unwrap();
    let retired = serving_secret(&fake).unwrap();
    assert!(retired["data"]["ca-previous.crt"].is_null());
    assert_eq!(ca_bundle(&fake).unwrap(), secret_data(&retired, "ca.crt"));
    for change in ["ca-introduced", "ca-switched", "ca-retired"] {
        assert_eq!(r.metrics().serving_change_count(change), 1, "{change}");
    }
}

#[tokio::test]
async fn a_leaf_renewal_keeps_the_ca_and_ca_bundle() {
    let fake = FakeApi::default();
    fake.seed(webhook_config());
    let ca = client_ca();
    let r = leader(&fake, &ca, self_managed());
    keyward_controller::singletons::serving_cert(&r).await.unwrap();
    let first = serving_secret(&fake).unwrap();
    let mut annotated = first.clone();
    annotated["metadata"]["annotations"] = json!({"keyward.io/renew-certificate": "now"});
    fake.seed(annotated);
    fake.clear_calls();
    keyward_controller::singletons::serving_cert(&r).await.unwrap();
    let renewed = serving_secret(&fake).unwrap();
    assert_ne!(secret_data(&renewed, "tls.crt"), secret_data(&first, "tls.crt"));
    assert_ne!(secret_data(&renewed, "tls.key"), secret_data(&first, "tls.key"));
    assert_eq!(secret_data(&renewed, "ca.crt"), secret_data(&first, "ca.crt"));
    assert!(renewed["metadata"]["annotations"].get("keyward.io/renew-certificate").is_none());
    assert_eq!(writes_to(&fake, "secrets"), ["PUT"]);
    assert!(writes_to(&fake, "mutatingwebhookconfigurations").is_empty(), "caBundle unchanged");
    assert_eq!(r.metrics().serving_change_count("leaf-renewed"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_replicas_only_the_lease_holder_makes_the_certificates() {
    let fake = FakeApi::default();
    fake.seed(webhook_config());
    let ca = client_ca();
    let mut tasks = Vec::new();
    for id in ["replica-a", "replica-b"] {
        let client = fake.client(id);
        let lease = LeaseConfig {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(200),
            ..LeaseConfig::new("keyward-controller", "keyward-system", id)
        };
        let elector = LeaderElector::new(client.clone(), lease);
        let leadership = elector.leadership();
        tasks.push(tokio::spawn(elector.run(std::future::pending())));
        let r =
            reconciler_with(client.clone(), ProfileSet::builtin().unwrap(), &ca, leadership.clone(), self_managed());
        tasks.push(start_with(
            client,
            r,
            leadership,
            &ca,
            keyward_controller::run::LoopSettings { resync: Duration::from_secs(3600), workers: 4 },
        ));
    }
    let ca_pem = fake.until(LIMIT, |f| serving_secret(f).map(|s| secret_data(&s, "ca.crt"))).await;
    fake.until(LIMIT, |f| (ca_bundle(f).as_deref() == Some(ca_pem.as_str())).then_some(())).await;
    fake.until(LIMIT, client_ca_secret).await;
    let leader = fake
        .get("coordination.k8s.io/v1", "Lease", "keyward-system", "keyward-controller")
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
        .unwrap();
    let writers: std::collections::BTreeSet<String> =
        fake.attempted_writes().into_iter().filter(|c| !c.resource.ends_with("leases")).map(|c| c.client).collect();
    assert_eq!(writers, std::collections::BTreeSet::from([leader]));
    for t in tasks {
        t.abort();
    }
}
