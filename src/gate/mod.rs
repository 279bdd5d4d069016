//! `keyward gate`: the control plane's side. An HTTPS reverse proxy in front of a control
//! plane's endpoint that lets each caller act only as itself: a keyward client certificate
//! (its workload identity) or a service account token (TokenReview), the gate file's rules,
//! the API server's SubjectAccessReviews where a rule asks one; then the request, with the
//! verified identity in headers, to the upstream. The rules are `keyward-gate`'s (pure); this
//! module is the transport, on the webhook's certificate store and connection rules.
//!
//! Start-up: the gate file (refused: the gate does not start), the serving certificate, the
//! client CA, the upstream's address, the API client when the file needs one; then listen.
//! Reloads: the gate file and the client CA bundle, each keeping the last good.

mod caller;
mod check;
mod client_ca;
pub(crate) mod config;
mod forward;
mod h1_pool;
mod held_h2;
mod metrics;
mod owners;
mod pods;
mod proxy;
mod reviews;
mod share;
mod store;
#[cfg(test)]
mod tests;
mod upstream;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::Context as _;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use keyward_certs::{CertStore, Trigger};
use tokio_rustls::TlsAcceptor;

pub use check::{check, CheckGateArgs};
pub use config::{GateArgs, GateConfig};

use crate::metrics::Metrics;
use crate::serve::connections::{self, Connections, Transport};
use client_ca::ClientCa;
use metrics::GateMetrics;
use owners::LiveOwners;
use proxy::GateState;
use store::GateStore;
use upstream::{Upstream, UpstreamTls};

/// What a reload of the gate file or the client CA bundle did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// Read and in force (the number of CAs, for the bundle).
    Loaded(usize),
    Unchanged,
    /// Refused; the last good one stays.
    Failed(String),
}

impl Reload {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Loaded(_) => "loaded",
            Self::Unchanged => "unchanged",
            Self::Failed(_) => "failed",
        }
    }
}

pub fn run(config: GateConfig) -> anyhow::Result<()> {
    crate::logging::init(config.listener.log_format);
    let result = crate::serve::runtime(config.worker_threads)?.block_on(gate(config));
    crate::logging::flush();
    result
}

/// Everything the gate serves with, built from its configuration (the tests build it too).
struct Gate {
    state: GateState,
    certs: Arc<CertStore>,
    client_ca: Option<Arc<ClientCa>>,
    shared: Arc<Metrics>,
    /// The watches of `spec.liveOwners`, ended with the gate.
    _owner_watches: tokio::task::JoinSet<()>,
}

impl Gate {
    async fn build(config: &GateConfig, reviews_client: Option<kube::Client>) -> anyhow::Result<Self> {
        let shared = Arc::new(Metrics::default());
        let metrics = Arc::new(GateMetrics::new(shared.clone()));
        let observer = metrics.clone();
        let store = GateStore::load(&config.config)?
            .with_observer(move |outcome| observer.observe_reload("gate", outcome.as_str()));
        let store = Arc::new(store);
        let loaded = store.current();
        let client = match reviews_client {
            Some(client) => Some(client),
            None if loaded.gate.asks_api_server() => {
                Some(crate::kubeconfig::in_cluster_client(config.review_timeout).await.context(
                    "the gate file reviews tokens, asks SubjectAccessReviews or watches owners, so the gate needs the API server",
                )?)
            }
            None => None,
        };
        let mut owner_watches = tokio::task::JoinSet::new();
        let owners = match (&client, loaded.gate.live_owners()) {
            (Some(client), kinds) if !kinds.is_empty() => {
                Some(LiveOwners::watch(client, kinds, &metrics, &mut owner_watches))
            }
            _ => None,
        };
        let pods = match (&client, loaded.gate.pods()) {
            (Some(client), Some(spec)) => {
                let pods = Arc::new(pods::Pods::new(&spec.label_selector, loaded.gate.pod_keys()));
                pods.watch(client, &metrics, &mut owner_watches);
                Some(pods)
            }
            _ => None,
        };
        let reviews = client.map(|c| Arc::new(reviews::Reviews::new(c, config.review_timeout, metrics.clone())));
        let client_ca = match &config.client_ca {
            Some(file) => {
                let observer = metrics.clone();
                let ca = ClientCa::load_or_await(file)
                    .map_err(anyhow::Error::msg)?
                    .with_observer(move |outcome| observer.observe_reload("client-ca", outcome.as_str()));
                Some(Arc::new(ca))
            }
            None => None,
        };
        if let Some(ca) = client_ca.as_ref().filter(|ca| !ca.is_loaded()) {
            if loaded.gate.admits_workloads() {
                tracing::warn!(file = %ca.file().display(), "{}", awaited_client_ca(ca));
            } else {
                tracing::info!(file = %ca.file().display(), "no client CA bundle yet; the gate file admits no workloads by client certificate, so none is needed (one that appears is loaded)");
            }
        }
        let upstream = Upstream::new(
            &config.upstream,
            UpstreamTls { ca: config.upstream_ca.as_deref(), server_name: config.upstream_server_name.as_deref() },
            config.upstream_protocol,
            config.listener.request_read_timeout,
        )
        .map_err(anyhow::Error::msg)?;
        let tls_dir = crate::serve::serving_dir(&config.listener.tls)?;
        let observer = shared.clone();
        let certs = Arc::new(CertStore::new(&tls_dir).with_observer(move |o| observer.observe_reload(o)));
        certs.reload(Trigger::Startup);
        tracing::info!(
            gate = %loaded.name,
            file = %config.config.display(),
            upstream = ?upstream,
            client_ca = config.client_ca.as_ref().map(|f| f.display().to_string()),
            tokens = loaded.gate.token_audiences().is_some(),
            "gate file loaded"
        );
        let state = GateState {
            gate: store,
            reviews,
            owners,
            pods,
            upstream: Arc::new(upstream),
            client_ca: client_ca.clone(),
            metrics,
            read_timeout: config.listener.request_read_timeout,
            body_budget: Arc::new(tokio::sync::Semaphore::new(config.message_bytes_in_flight)),
            shares: share::Shares::new(config.message_bytes_in_flight, keyward_gate::grpc::MAX_MESSAGE_BYTES + 5),
        };
        Ok(Self { state, certs, client_ca, shared, _owner_watches: owner_watches })
    }

    fn acceptor(&self) -> anyhow::Result<TlsAcceptor> {
        let clients = self.client_ca.clone().map(|ca| ca as Arc<dyn rustls::server::danger::ClientCertVerifier>);
        // HTTP/2 always: gRPC needs it.
        Ok(TlsAcceptor::from(Arc::new(crate::serve::tls_config(self.certs.clone(), true, clients)?)))
    }

    /// The plaintext listener carries no client certificate: refused when no rule of the gate
    /// file admits a caller without one (a token's, or an anonymous one).
    fn plaintext_admits_someone(&self) -> anyhow::Result<()> {
        let loaded = self.state.gate.current();
        if loaded.gate.admits_without_certificate() {
            return Ok(());
        }
        anyhow::bail!(
            "--listen-plaintext: every rule of gate {:?} admits only client certificates, which a plaintext connection cannot carry; give a rule that admits serviceAccounts (with spec.tokenReview) or anonymous callers, or drop --listen-plaintext",
            loaded.name
        )
    }

    /// The client CAs' generation, for each connection to record what it was verified under.
    fn trust_generation(&self) -> Option<connections::TrustGeneration> {
        self.client_ca.clone().map(|ca| Arc::new(move || ca.generation()) as connections::TrustGeneration)
    }

    fn health(&self, draining: Arc<AtomicBool>) -> Health {
        Health {
            certs: self.certs.clone(),
            metrics: self.shared.clone(),
            draining,
            owners: self.state.owners.clone(),
            pods: self.state.pods.clone(),
            gate: self.state.gate.clone(),
            client_ca: self.client_ca.clone(),
        }
    }

    fn app(&self) -> Router {
        Router::new().fallback(proxy::handle).with_state(self.state.clone())
    }
}

async fn gate(config: GateConfig) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let gate = Gate::build(&config, None).await?;
    let poll = config.listener.cert_poll_interval;
    let _cert_watch = keyward_certs::watch(gate.certs.clone(), poll)?;
    let _gate_watch = keyward_certs::watch(gate.state.gate.clone(), poll)?;
    let _ca_watch = match &gate.client_ca {
        Some(ca) => Some(keyward_certs::watch(ca.clone(), poll)?),
        None => None,
    };
    let (draining, stop) = crate::serve::shutdown_on_signal(config.listener.shutdown_delay);
    let (limits, metrics_limits) = crate::serve::connection_limits(&config.listener);
    let listener = crate::serve::bind(config.listen, "--listen").await?;
    let metrics_task = match config.metrics_listen {
        Some(addr) => {
            let health = gate.health(draining);
            let listener = crate::serve::bind(addr, "--metrics-listen").await?;
            tracing::info!(role = "metrics", addr = %listener.local_addr()?, "listening (plain HTTP: GET /metrics, /healthz, /readyz)");
            let connections = Connections::new("metrics", metrics_limits, gate.shared.clone());
            Some(tokio::spawn(connections::serve(
                listener,
                Transport::Plain,
                health.router(),
                connections,
                stop.clone(),
            )))
        }
        None => None,
    };
    tracing::info!(
        role = "gate",
        addr = %listener.local_addr()?,
        max_connections = limits.max_connections,
        "listening (HTTPS, HTTP/1.1 and HTTP/2: every request is decided by the gate file, then forwarded)"
    );
    let plaintext_task = match config.listen_plaintext {
        Some(addr) => {
            gate.plaintext_admits_someone()?;
            let listener = crate::serve::bind(addr, "--listen-plaintext").await?;
            tracing::info!(
                role = "gate-plaintext",
                addr = %listener.local_addr()?,
                max_connections = limits.max_connections,
                "listening (plain HTTP/1.1 and HTTP/2 with prior knowledge: for callers with a bearer token or none; keep this port inside the cluster)"
            );
            let connections = Connections::new("gate-plaintext", limits.clone(), gate.shared.clone());
            Some(tokio::spawn(connections::serve(
                listener,
                Transport::PlainOrH2c,
                gate.app(),
                connections,
                stop.clone(),
            )))
        }
        None => None,
    };
    let connections = Connections::with_trust("gate", limits, gate.shared.clone(), gate.trust_generation());
    connections::serve(listener, Transport::Tls(gate.acceptor()?), gate.app(), connections, stop).await;
    for task in [plaintext_task, metrics_task].into_iter().flatten() {
        let _ = task.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// The gate's metrics port: /metrics, /healthz, /readyz (ready while a valid serving
/// certificate is served, every owner kind it watches has been listed, and the gate is not
/// shutting down).
#[derive(Clone)]
struct Health {
    certs: Arc<CertStore>,
    metrics: Arc<Metrics>,
    draining: Arc<AtomicBool>,
    owners: Option<Arc<LiveOwners>>,
    pods: Option<Arc<pods::Pods>>,
    gate: Arc<GateStore>,
    client_ca: Option<Arc<ClientCa>>,
}

impl Health {
    fn router(self) -> Router {
        Router::new()
            .route(
                "/metrics",
                get(|State(h): State<Health>| async move {
                    ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], h.metrics.encode())
                }),
            )
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(ready))
            .fallback(|| async {
                (StatusCode::NOT_FOUND, "not found: the metrics port serves GET /metrics, /healthz and /readyz\n")
            })
            .with_state(self)
    }
}

/// Why a gate that admits workloads waits for its client CA, and what publishes it.
fn awaited_client_ca(ca: &ClientCa) -> String {
    format!(
        "no client CA bundle at {} yet, and the gate file admits workloads by client certificate: `keyward controller --publish-client-ca-to=<this namespace>` publishes the ConfigMap keyward-client-ca (the gate loads it when it appears)",
        ca.file().display()
    )
}

async fn ready(State(h): State<Health>) -> Response {
    if h.draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready: shutting down\n").into_response();
    }
    let unlisted = h.owners.as_ref().map(|o| o.unlisted()).unwrap_or_default();
    if !unlisted.is_empty() {
        let reason = format!(
            "not ready: the gate has not yet listed {} (spec.liveOwners) from the API server\n",
            unlisted.join(", ")
        );
        return (StatusCode::SERVICE_UNAVAILABLE, reason).into_response();
    }
    if h.pods.as_ref().is_some_and(|p| p.unlisted()) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the gate has not yet listed the callers' pods (spec.tokenReview.pods) from the API server\n",
        )
            .into_response();
    }
    if let Some(ca) = h.client_ca.as_ref().filter(|ca| !ca.is_loaded()) {
        if h.gate.current().gate.admits_workloads() {
            return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", awaited_client_ca(ca)))
                .into_response();
        }
    }
    match h.certs.ready(SystemTime::now()) {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")).into_response(),
    }
}
