//! `keyward serve`: the HTTPS webhook.
//!
//! Start-up: load and validate the profiles (a bad profile stops start-up), find or mint the
//! serving certificate, load it, watch its directory, then listen. Not ready until a valid
//! certificate is served. On SIGTERM or SIGINT, report not ready for `--shutdown-delay` while
//! still serving, then stop accepting and let in-flight requests finish.

mod config;
mod routes;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use keyward_certs::{pki, CertStore, Trigger};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

pub use config::{ServeArgs, ServeConfig, TlsSource};

use crate::metrics::Metrics;
use routes::AppState;

/// A TLS handshake must finish within this, or the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub fn run(config: ServeConfig) -> anyhow::Result<()> {
    crate::logging::init(config.log_format);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    runtime.block_on(serve(config))
}

async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    let profiles = Arc::new(config.profiles.load()?);
    tracing::info!(
        count = profiles.len(),
        source = %config.profiles.describe(),
        profiles = ?profiles.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        "profiles loaded"
    );

    let tls_dir = match &config.tls {
        TlsSource::Dir(dir) => {
            if !dir.is_dir() {
                anyhow::bail!(
                    "--tls-dir {}: no such directory; mount the serving certificate Secret there (tls.crt, tls.key)",
                    dir.display()
                );
            }
            dir.clone()
        }
        TlsSource::Dev { dir, extra_names } => {
            let dev = pki::ensure_dev_dir(dir, extra_names, SystemTime::now())?;
            tracing::info!(
                ca = %dev.ca_file.display(),
                reused = dev.reused,
                names = ?dev.info.dns_names,
                "development certificate: trust this CA to call keyward (not for production; use --tls-dir)"
            );
            let port = config.listen.port();
            tracing::info!(
                "try: curl --cacert {} -H 'Content-Type: application/json' --data @tests/fixtures/admissionreview-lmeval.json https://localhost:{port}/mutate",
                dev.ca_file.display()
            );
            dir.clone()
        }
    };

    let metrics = Arc::new(Metrics::default());
    let observer = metrics.clone();
    let certs = Arc::new(CertStore::new(&tls_dir).with_observer(move |o| observer.observe_reload(o)));
    certs.reload(Trigger::Startup);
    let _watch = keyward_certs::watch(certs.clone(), config.cert_poll_interval)?;

    // SIGTERM: first report not ready while still serving (endpoints drop this pod), then
    // stop accepting and let requests in flight finish.
    let draining = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = watch::channel(false);
    let delay = config.shutdown_delay;
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

    let state = AppState {
        profiles,
        certs: certs.clone(),
        metrics: metrics.clone(),
        draining,
        read_timeout: config.request_read_timeout,
        max_body_bytes: config.max_body_bytes,
    };
    let listener =
        TcpListener::bind(config.listen).await.with_context(|| format!("--listen {}: cannot bind", config.listen))?;
    let metrics_task = match config.metrics_listen {
        Some(addr) => Some(tokio::spawn(serve_metrics(addr, metrics, stop_rx.clone()).await?)),
        None => None,
    };
    serve_tls(listener, certs, routes::router(state), &config, stop_rx).await?;
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Binds the metrics port now (so a bad address fails start-up) and returns the server.
async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("--metrics-listen {addr}: cannot bind"))?;
    let local = listener.local_addr()?;
    tracing::info!(role = "metrics", addr = %local, "listening (plain HTTP, GET /metrics)");
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move { ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], metrics.encode()) }
        }),
    );
    Ok(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::error!(error = %e, "metrics server failed");
        }
    })
}

fn tls_config(certs: Arc<CertStore>) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS configuration")?
        .with_no_client_auth()
        .with_cert_resolver(certs);
    // The apiserver offers only http/1.1; h2 is for everyone else.
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tls)
}

async fn serve_tls(
    listener: TcpListener,
    certs: Arc<CertStore>,
    app: axum::Router,
    config: &ServeConfig,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(tls_config(certs)?));
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1().timer(TokioTimer::new()).header_read_timeout(config.request_read_timeout).keep_alive(true);
    let service = TowerToHyperService::new(app);
    let graceful = GracefulShutdown::new();
    tracing::info!(role = "webhook", addr = %listener.local_addr()?, "listening (HTTPS: POST /mutate, GET /healthz, GET /readyz)");

    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: log and keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let http = http.clone();
        let service = service.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let conn = http.serve_connection(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(config.shutdown_grace) => {
            tracing::warn!(grace = ?config.shutdown_grace, "shutdown grace period over; closing remaining connections");
        }
    }
    Ok(())
}

async fn wait_for_signal() {
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
