//! `keyward serve`: the HTTPS webhook.
//!
//! Start-up: find or mint the serving certificate, load and validate the profiles (a bad set
//! stops start-up), load the certificate, watch its directory and the profiles', then listen.
//! Not ready until a valid certificate is served; a refused profile reload changes nothing,
//! readiness included. On SIGTERM or SIGINT, report not ready for `--shutdown-delay` while
//! still serving, then stop accepting and let in-flight requests finish.

pub(crate) mod config;
pub(crate) mod connections;
mod routes;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::Context;
use keyward_certs::attestation::KeyStore;
use keyward_certs::{pki, CertStore, Trigger};
use keyward_engine::ProfileSet;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

pub use config::{ListenerConfig, ServeArgs, ServeConfig, TlsSource};

use crate::metrics::Metrics;
use crate::profiles::ProfileStore;
use connections::{ConnectionLimits, Connections, Transport};
use routes::AppState;

pub fn run(config: ServeConfig) -> anyhow::Result<()> {
    crate::logging::init(config.listener.log_format);
    let result = runtime(config.worker_threads)?.block_on(serve(config));
    crate::logging::flush();
    result
}

/// The runtime of a server of keyward's, on `workers` threads (`--worker-threads`). One is a
/// current-thread runtime: every task on the thread that started it, none handed to another
/// (a multi-thread runtime with one worker still wakes that worker from the main thread and
/// pays for work stealing it cannot do).
pub(crate) fn runtime(workers: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = match workers {
        1 => tokio::runtime::Builder::new_current_thread(),
        _ => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(workers);
            builder
        }
    };
    builder.enable_all().build().context("cannot start the runtime")
}

async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    if let TlsSource::Dir(dir) = &config.listener.tls {
        if !dir.is_dir() {
            anyhow::bail!(
                "--tls-dir {}: no such directory; mount the serving certificate Secret there (tls.crt, tls.key)",
                dir.display()
            );
        }
    }
    // The profiles next: a set that is refused stops start-up before anything is written
    // (no development certificate minted for a server that will not run).
    let metrics = Arc::new(Metrics::default());
    // What every set must allow here, at start and on each reload: a profile that issues
    // per-owner credentials needs the attestation key this process was started with.
    let attests = config.attestation_key_dir.is_some() || matches!(config.listener.tls, TlsSource::Dev { .. });
    let observer = metrics.clone();
    let store = ProfileStore::load(config.profiles.clone(), move |set| attestable(set, attests))?
        .with_observer(move |outcome| observer.observe_profile_reload(outcome));
    let store = Arc::new(store);
    let profiles = store.profiles().current();
    tracing::info!(
        count = profiles.len(),
        source = %config.profiles.describe(),
        profiles = ?profiles.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        cluster = %profiles.facts().describe(),
        cluster_facts = %config.profiles.describe_facts(),
        reloads = store.reloads(),
        "profiles loaded"
    );

    let tls_dir = serving_dir(&config.listener.tls)?;
    if let TlsSource::Dev { dir, .. } = &config.listener.tls {
        tracing::info!(
            "try: curl --cacert {} -H 'Content-Type: application/json' --data @tests/fixtures/admissionreview-lmeval.json https://localhost:{}/mutate",
            dir.join("ca.crt").display(),
            config.listen.port()
        );
    }

    let attestation_keys = attestation(&config)?;
    let _attestation_watch = match &attestation_keys {
        Some(keys) => Some(keyward_certs::watch(keys.clone(), config.listener.cert_poll_interval)?),
        None => None,
    };

    let _profile_watches = store.watch(config.listener.cert_poll_interval)?;
    let observer = metrics.clone();
    let certs = Arc::new(CertStore::new(&tls_dir).with_observer(move |o| observer.observe_reload(o)));
    certs.reload(Trigger::Startup);
    let _watch = keyward_certs::watch(certs.clone(), config.listener.cert_poll_interval)?;

    let (draining, stop_rx) = shutdown_on_signal(config.listener.shutdown_delay);

    let state = AppState {
        profiles: store.profiles(),
        certs: certs.clone(),
        metrics: metrics.clone(),
        draining,
        read_timeout: config.listener.request_read_timeout,
        max_body_bytes: config.max_body_bytes,
        body_budget: Arc::new(tokio::sync::Semaphore::new(config.request_bytes_in_flight)),
        decisions: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent_decisions)),
        attestation_keys,
    };
    let listener = bind(config.listen, "--listen").await?;
    let (webhook_limits, metrics_limits) = connection_limits(&config.listener);
    let metrics_task = match config.metrics_listen {
        Some(addr) => Some(tokio::spawn(serve_metrics(addr, state.clone(), metrics_limits, stop_rx.clone()).await?)),
        None => None,
    };
    let acceptor = TlsAcceptor::from(Arc::new(tls_config(certs, config.http2, None)?));
    tracing::info!(
        role = "webhook",
        addr = %listener.local_addr()?,
        max_connections = webhook_limits.max_connections,
        "listening (HTTPS: POST /mutate, GET /healthz, GET /readyz)"
    );
    let connections = Connections::new("webhook", webhook_limits, metrics);
    connections::serve(listener, Transport::Tls(acceptor), routes::router(state), connections, stop_rx).await;
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// The directory the serving certificate is read from: `--tls-dir`, or the development
/// certificate minted (or reused) in `--dev-cert-dir`.
pub(crate) fn serving_dir(tls: &TlsSource) -> anyhow::Result<std::path::PathBuf> {
    Ok(match tls {
        TlsSource::Dir(dir) => dir.clone(),
        TlsSource::Dev { dir, extra_names } => {
            // Said first, and again in any error: in a container, a missing --tls-dir is the
            // usual reason to land here.
            tracing::warn!(
                dir = %dir.display(),
                "no --tls-dir: serving a development certificate minted into --dev-cert-dir; in a cluster, give --tls-dir (the serving certificate Secret mounted as a directory)"
            );
            let dev = pki::ensure_dev_dir(dir, extra_names, SystemTime::now()).map_err(|e| {
                anyhow::anyhow!(
                    "{e}; without --tls-dir keyward mints a development certificate into --dev-cert-dir {}: in a cluster, give --tls-dir DIR (the serving certificate Secret mounted as a directory); elsewhere, a writable --dev-cert-dir",
                    dir.display()
                )
            })?;
            tracing::info!(
                ca = %dev.ca_file.display(),
                reused = dev.reused,
                names = ?dev.info.dns_names,
                "development certificate: trust this CA to call keyward (not for production; use --tls-dir)"
            );
            dir.clone()
        }
    })
}

/// Whether `set` can be served: its profiles that issue per-owner credentials need the
/// attestation key (`attests`: one is loaded). A reload cannot add the key: that needs
/// `--attestation-key-dir` and a restart.
fn attestable(set: &ProfileSet, attests: bool) -> Result<(), String> {
    let issuing: Vec<&str> = set.iter().filter(|p| p.issues_per_owner).map(|p| p.name.as_str()).collect();
    if issuing.is_empty() || attests {
        return Ok(());
    }
    Err(format!(
        "profiles {} issue per-owner credentials, so their pods carry keyward's admission attestation: give --attestation-key-dir, where the Secret keyward-attestation (which keyward controller creates) is mounted",
        issuing.join(", ")
    ))
}

/// The attestation keys the webhook signs with: from `--attestation-key-dir`, or, in
/// development, a key kept beside the development certificate (made whatever the profiles, so
/// that a reload may add one that issues per-owner credentials). Without either, a set that
/// needs them is refused (`attestable`).
fn attestation(config: &ServeConfig) -> anyhow::Result<Option<Arc<KeyStore>>> {
    let dir = match (&config.attestation_key_dir, &config.listener.tls) {
        (Some(dir), _) => {
            if !dir.is_dir() {
                anyhow::bail!(
                    "--attestation-key-dir {}: no such directory; mount the Secret keyward-attestation there (keyward controller creates it)",
                    dir.display()
                );
            }
            dir.clone()
        }
        (None, TlsSource::Dev { dir, .. }) => {
            let dir = dir.join("attestation");
            keyward_certs::attestation::ensure_dev_key(&dir)?;
            dir
        }
        (None, TlsSource::Dir(_)) => return Ok(None),
    };
    let store = Arc::new(KeyStore::new(&dir));
    keyward_certs::ReloadSource::reload(&*store, Trigger::Startup);
    Ok(Some(store))
}

/// The limits of both listeners. The connection caps are lowered, if need be, so that every
/// connection fits in the open-files limit with room for everything else.
pub(crate) fn connection_limits(config: &ListenerConfig) -> (ConnectionLimits, ConnectionLimits) {
    let open_files = connections::raise_open_files_limit();
    let wanted = config.max_connections + config.metrics_max_connections;
    let fits = connections::cap_for_open_files(wanted, open_files);
    let (mut webhook, mut metrics) = (config.max_connections, config.metrics_max_connections);
    if fits < wanted {
        // Keep the metrics share small and give the rest to the webhook.
        metrics = metrics.min(fits / 8).max(1);
        webhook = fits.saturating_sub(metrics).max(1);
        tracing::warn!(
            open_files = open_files.unwrap_or_default(),
            max_connections = webhook,
            metrics_max_connections = metrics,
            "the open-files limit is too low for --max-connections and --metrics-max-connections; lowered them"
        );
    }
    let limits = |max_connections| ConnectionLimits {
        max_connections,
        handshake_timeout: config.tls_handshake_timeout,
        request_read_timeout: config.request_read_timeout,
        idle_timeout: config.idle_timeout,
        shutdown_grace: config.shutdown_grace,
    };
    (limits(webhook), limits(metrics))
}

/// Binds the metrics port now (so a bad address fails start-up) and returns the server.
async fn serve_metrics(
    addr: SocketAddr,
    state: AppState,
    limits: ConnectionLimits,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let listener = bind(addr, "--metrics-listen").await?;
    let local = listener.local_addr()?;
    tracing::info!(role = "metrics", addr = %local, "listening (plain HTTP: GET /metrics, /healthz, /readyz)");
    let connections = Connections::new("metrics", limits, state.metrics.clone());
    Ok(connections::serve(listener, Transport::Plain, routes::metrics_router(state), connections, stop))
}

/// Binds `addr`. `[::]` (the default) takes IPv6 and IPv4 alike; on a host or pod with IPv6
/// turned off it cannot be bound, and 0.0.0.0 (IPv4) is, with a warning.
pub(crate) async fn bind(addr: SocketAddr, flag: &str) -> anyhow::Result<TcpListener> {
    match TcpListener::bind(addr).await {
        Ok(listener) => Ok(listener),
        Err(e) if addr.ip() == std::net::Ipv6Addr::UNSPECIFIED => {
            let v4 = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, addr.port()));
            let listener =
                TcpListener::bind(v4).await.with_context(|| format!("{flag} {addr}: cannot bind ({e}), nor {v4}"))?;
            tracing::warn!(error = %e, addr = %v4, "{flag} {addr}: IPv6 is not available here; listening on IPv4 only");
            Ok(listener)
        }
        Err(e) => Err(anyhow::anyhow!("{flag} {addr}: cannot bind ({e})")),
    }
}

/// Serves `app` over plain HTTP on `listener` with the same connection rules as the metrics
/// port (a cap, timeouts for slow and idle clients), until `stop`.
pub(crate) fn serve_plain(
    listener: TcpListener,
    app: axum::Router,
    stop: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> {
    let limits = ConnectionLimits {
        max_connections: 16,
        handshake_timeout: std::time::Duration::from_secs(10),
        request_read_timeout: std::time::Duration::from_secs(10),
        idle_timeout: std::time::Duration::from_secs(120),
        shutdown_grace: std::time::Duration::from_secs(5),
    };
    let connections = Connections::new("metrics", limits, Arc::new(Metrics::default()));
    connections::serve(listener, Transport::Plain, app, connections, stop)
}

/// The TLS server configuration of a listener: its certificate from `certs`, client
/// certificates verified by `clients` when given (the gate), else none asked for.
pub(crate) fn tls_config(
    certs: Arc<CertStore>,
    http2: bool,
    clients: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS configuration")?;
    let mut tls = match clients {
        Some(verifier) => {
            let mut tls = builder.with_client_cert_verifier(verifier).with_cert_resolver(certs);
            // A resumed session brings its client certificate back from the session cache
            // without verifying it again: one expired since, or of a client CA rotated out,
            // would be admitted, and each resumption would issue the next ticket. No session
            // cache and no TLS 1.3 tickets: every connection's certificate is verified in full.
            // (TLS 1.2 tickets: rustls' default ticketer makes none.)
            tls.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            tls.send_tls13_tickets = 0;
            tls
        }
        None => builder.with_no_client_auth().with_cert_resolver(certs),
    };
    // Go's crypto/tls sends tls.Config.ServerName as the SNI, as it is: fms-lm-eval-service's
    // driver sets it to `host:port` (backend/driver/driver.go @ 38689a3). Such a name is read as
    // no SNI, so the certificate is chosen, and verified by the client, as for any other.
    tls.invalid_sni_policy = rustls::server::InvalidSniPolicy::IgnoreAll;
    // The apiserver offers only http/1.1; h2 only when asked for (--http2).
    tls.alpn_protocols = if http2 { vec![b"h2".to_vec(), b"http/1.1".to_vec()] } else { vec![b"http/1.1".to_vec()] };
    Ok(tls)
}

/// On SIGTERM or SIGINT: first report not ready (the flag) while still serving, so endpoints
/// drop this pod, then, after `delay`, stop accepting (the channel) and let requests in flight
/// finish.
pub(crate) fn shutdown_on_signal(delay: std::time::Duration) -> (Arc<AtomicBool>, watch::Receiver<bool>) {
    let draining = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = watch::channel(false);
    let flag = draining.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        flag.store(true, Ordering::Relaxed);
        tracing::info!(delay = ?delay, "shutting down: reporting not ready; still accepting connections for the delay");
        // A second signal (a developer pressing Ctrl-C again) skips the wait.
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = wait_for_signal() => {}
        }
        tracing::info!("shutting down: no new connections; finishing requests in flight");
        let _ = stop_tx.send(true);
    });
    (draining, stop_rx)
}

pub(crate) async fn wait_for_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
