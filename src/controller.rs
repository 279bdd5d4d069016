//! `keyward controller`: issues and provisions what the profiles mark as provided by keyward.
//!
//! Start-up: load the profiles (the same flags and built-ins as `serve`), load the client CA
//! and watch its directory, connect to the API (in a pod: its ServiceAccount; elsewhere:
//! KUBECONFIG), then elect a leader on a Lease and reconcile. `/metrics`, `/healthz` and
//! `/readyz` are served on --metrics-listen. On SIGTERM the Lease is released, so another
//! replica takes over at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use axum::http::StatusCode;
use clap::Args;
use keyward_certs::{CertStore, Trigger};
use keyward_controller::{run, LeaderElector, LeaseConfig, Metrics, Settings};
use keyward_engine::inject::Provision;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::logging::LogFormat;
use crate::profiles::{ProfileArgs, ProfileStore};
use crate::serve::config::parse_duration;

#[derive(Debug, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    profiles: ProfileArgs,
    /// The namespace keyward runs in (its Lease lives there).
    #[arg(long, env = "KEYWARD_NAMESPACE", default_value = "keyward-system")]
    namespace: String,
    /// This replica's name in the Lease (the pod's name).
    #[arg(long, env = "KEYWARD_IDENTITY")]
    identity: Option<String>,
    /// The client CA, as cert-manager writes its Secret (tls.crt, tls.key), mounted as a
    /// directory; reloaded when it changes. Needed when a profile issues client certificates.
    #[arg(long, env = "KEYWARD_CLIENT_CA_DIR", value_name = "DIR")]
    client_ca_dir: Option<PathBuf>,
    /// The SPIFFE trust domain of client certificate identities.
    #[arg(long, env = "KEYWARD_TRUST_DOMAIN", default_value = "cluster.local")]
    trust_domain: String,
    /// How long a client certificate is valid; it is renewed at two thirds of that.
    #[arg(long, env = "KEYWARD_CLIENT_CERT_VALIDITY", default_value = "24h", value_parser = parse_duration)]
    client_cert_validity: Duration,
    /// Namespaces to publish the client CA's certificate to, as a ConfigMap (control planes
    /// that verify client certificates mount it).
    #[arg(long, env = "KEYWARD_PUBLISH_CLIENT_CA_TO", value_delimiter = ',', value_name = "NAMESPACE")]
    publish_client_ca_to: Vec<String>,
    /// The name of that ConfigMap.
    #[arg(long, env = "KEYWARD_CLIENT_CA_CONFIG_MAP", default_value = "keyward-client-ca")]
    client_ca_config_map: String,
    /// GET /metrics, /healthz and /readyz (plain HTTP), or `off`.
    #[arg(long, env = "KEYWARD_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    metrics_listen: String,
    #[arg(long, env = "KEYWARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// How often everything is reconciled even without a change.
    #[arg(long, env = "KEYWARD_RESYNC_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    resync_interval: Duration,
    /// How often the client CA's directory is read even without a change event.
    #[arg(long, env = "KEYWARD_CERT_POLL_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    cert_poll_interval: Duration,
    /// The Lease that elects the one replica that writes.
    #[arg(long, env = "KEYWARD_LEASE_NAME", default_value = "keyward-controller")]
    lease_name: String,
    /// How long any request to the API server may take to start answering before it is
    /// abandoned and retried (watches: until their stream starts).
    #[arg(long, env = "KEYWARD_API_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    api_timeout: Duration,
    /// Keys (an owner, a namespace) reconciled at once; one key never runs twice at once.
    #[arg(long, env = "KEYWARD_WORKERS", default_value_t = 8)]
    workers: usize,
    /// The Secret in --namespace that holds the admission attestation's keys; keyward creates
    /// and rotates it, and the webhook mounts it (--attestation-key-dir).
    #[arg(long, env = "KEYWARD_ATTESTATION_SECRET", default_value = "keyward-attestation")]
    attestation_secret: String,
    /// How often the attestation key is replaced; the previous key stays valid one period more.
    #[arg(long, env = "KEYWARD_ATTESTATION_KEY_ROTATION", default_value = "168h", value_parser = parse_duration)]
    attestation_key_rotation: Duration,
    /// Where the webhook's serving certificate comes from: `external` (cert-manager, OpenShift's
    /// service CA, or an admin) or `self-managed` (keyward's leader makes it in
    /// --serving-secret and keeps the webhook's caBundle trusting it).
    #[arg(long, env = "KEYWARD_SERVING_CERT", value_enum, default_value_t = Source::External)]
    serving_cert: Source,
    /// The Secret in --namespace holding the self-managed CA and serving certificate.
    #[arg(long, env = "KEYWARD_SERVING_SECRET", default_value = "keyward-serving")]
    serving_secret: String,
    /// The MutatingWebhookConfiguration whose matchConditions (and, self-managed, caBundle)
    /// keyward keeps.
    #[arg(long, env = "KEYWARD_WEBHOOK_CONFIG", default_value = "keyward")]
    webhook_config: String,
    /// Who keeps the webhook configuration's matchConditions equal to the profiles: `managed`
    /// (keyward's leader patches them, and only them, when they differ) or `external` (you
    /// apply `keyward manifests webhook` yourself, e.g. from GitOps).
    #[arg(long, env = "KEYWARD_WEBHOOK_MATCH_CONDITIONS", value_enum, default_value_t = Keeper::Managed)]
    webhook_match_conditions: Keeper,
    /// Which certificates.k8s.io version serves PodCertificateRequests, for profiles that
    /// deliver pod certificates: `auto` (asked of the API server's discovery at start; where it
    /// serves both, keyward signs at both, for kubelets still on v1beta1), `v1` (Kubernetes 1.37
    /// on; v1 only), `v1beta1` (1.35 and 1.36, with the PodCertificateRequest feature gate and
    /// runtime config), or `off` (keyward signs nothing). Written, as the cluster
    /// facts, to the ConfigMap keyward-cluster-facts in --namespace for the webhook: it decides
    /// `delivery: auto`.
    #[arg(long, env = "KEYWARD_POD_CERTIFICATES", value_enum, default_value_t = PodCertificates::Auto)]
    pod_certificates: PodCertificates,
    /// The webhook's Service in --namespace: its DNS names go into the serving certificate,
    /// and its endpoints are asked which certificate they serve (self-managed).
    #[arg(long, env = "KEYWARD_SERVICE", default_value = "keyward")]
    service: String,
    /// How long a self-managed serving CA is valid; replaced at two thirds of that.
    #[arg(long, env = "KEYWARD_SERVING_CA_VALIDITY", default_value = "87600h", value_parser = parse_duration)]
    serving_ca_validity: Duration,
    /// How long a self-managed serving certificate is valid; renewed at two thirds of that.
    #[arg(long, env = "KEYWARD_SERVING_CERT_VALIDITY", default_value = "8760h", value_parser = parse_duration)]
    serving_cert_validity: Duration,
    /// Where the client CA comes from: `external` (cert-manager or an admin) or `self-managed`
    /// (keyward's leader makes it in --client-ca-secret when missing or unusable; mount that
    /// Secret as --client-ca-dir).
    #[arg(long, env = "KEYWARD_CLIENT_CA", value_enum, default_value_t = Source::External)]
    client_ca: Source,
    /// The Secret in --namespace holding the self-managed client CA.
    #[arg(long, env = "KEYWARD_CLIENT_CA_SECRET", default_value = "keyward-client-ca")]
    client_ca_secret: String,
    /// Create the ServiceAccounts (and RoleBindings) that profiles provide
    /// (`serviceAccount: {provider: keyward}`) in opted-in namespaces. Needs the rights of
    /// deploy/components/account-provisioning; no built-in profile provides one, so the default
    /// install has neither the flag nor the rights.
    #[arg(long, env = "KEYWARD_PROVISION_ACCOUNTS")]
    provision_accounts: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Source {
    External,
    SelfManaged,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PodCertificates {
    Auto,
    V1,
    V1beta1,
    Off,
}

impl PodCertificates {
    /// The version this choice names without asking the cluster (`None` for `auto`): `Some(None)`
    /// is `off`.
    pub fn fixed(self) -> Option<Option<keyward_controller::signer::ApiVersion>> {
        use keyward_controller::signer::ApiVersion;
        match self {
            Self::Off => Some(None),
            Self::V1 => Some(Some(ApiVersion::V1)),
            Self::V1beta1 => Some(Some(ApiVersion::V1beta1)),
            Self::Auto => None,
        }
    }
}

/// The versions of `certificates.k8s.io` keyward signs PodCertificateRequests at, the one the
/// cluster facts name first: as `choice` says or, for `auto`, every one discovery finds (v1
/// first; both where a cluster serves both, for kubelets that still create v1beta1 requests).
pub async fn pod_certificate_api(
    client: &kube::Client,
    choice: PodCertificates,
) -> anyhow::Result<Vec<keyward_controller::signer::ApiVersion>> {
    match choice.fixed() {
        Some(version) => Ok(version.into_iter().collect()),
        None => keyward_controller::signer::served_versions(client, keyward_controller::signer::ApiVersion::PLURAL)
            .await
            .map_err(|e| discovery_error(keyward_controller::signer::ApiVersion::PLURAL, &e))
            .context("--pod-certificates auto"),
    }
}

/// The version of `certificates.k8s.io` that serves `plural`, by discovery (v1 preferred).
async fn served(client: &kube::Client, plural: &str) -> anyhow::Result<Option<keyward_controller::signer::ApiVersion>> {
    keyward_controller::signer::served_version(client, plural).await.map_err(|e| discovery_error(plural, &e))
}

fn discovery_error(plural: &str, e: &kube::Error) -> anyhow::Error {
    let fix = if plural == keyward_controller::signer::ApiVersion::PLURAL {
        "; give --pod-certificates v1, v1beta1 or off"
    } else {
        ""
    };
    anyhow::anyhow!("cannot read the API server's discovery of certificates.k8s.io for {plural} ({e}){fix}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Keeper {
    Managed,
    External,
}

pub fn run(args: ControllerArgs) -> anyhow::Result<()> {
    crate::logging::init(args.log_format);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    let result = runtime.block_on(controller(args));
    crate::logging::flush();
    result
}

async fn controller(args: ControllerArgs) -> anyhow::Result<()> {
    // kube's client builds its TLS from rustls' process-wide provider: ring, the only one
    // compiled in. Already installed is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(problem) = keyward_controller::desired::trust_domain_problem(&args.trust_domain) {
        bail!("--trust-domain {problem}");
    }
    if args.workers == 0 {
        bail!("--workers: must be at least 1");
    }
    for (flag, value) in
        [("--api-timeout", args.api_timeout), ("--attestation-key-rotation", args.attestation_key_rotation)]
    {
        if value.is_zero() {
            bail!("{flag}: must be more than 0s");
        }
    }
    if args.client_cert_validity < Duration::from_secs(600) {
        bail!(
            "--client-cert-validity {:?}: must be at least 10m (a certificate is renewed at two thirds of its life)",
            args.client_cert_validity
        );
    }
    let serving = match args.serving_cert {
        Source::External => None,
        Source::SelfManaged => {
            let mut serving = keyward_controller::self_managed::SelfManaged::new(
                &args.serving_secret,
                &args.webhook_config,
                &args.service,
                &args.namespace,
            );
            serving.certs.ca_validity = args.serving_ca_validity;
            serving.certs.leaf_validity = args.serving_cert_validity;
            if let Err(problem) = serving.certs.check() {
                bail!("--serving-ca-validity, --serving-cert-validity: {problem}");
            }
            Some(serving)
        }
    };
    let metrics = Arc::new(Metrics::default());
    metrics.set_build_info(crate::build::VERSION, crate::build::COMMIT);
    // What every set must allow here, at start and on each reload: a profile that issues
    // client certificates needs the client CA this process was started with.
    let has_client_ca = args.client_ca_dir.is_some();
    let provision_accounts = args.provision_accounts;
    let observer = metrics.clone();
    let store = ProfileStore::load(args.profiles.source(), move |set| {
        let issuing = issuing_profiles(set);
        if !issuing.is_empty() && !has_client_ca {
            return Err(format!(
                "profiles {} issue client certificates: give --client-ca-dir, the directory where the keyward-client-ca Secret is mounted (tls.crt, tls.key)",
                issuing.join(", ")
            ));
        }
        let accounts = keyward_controller::desired::provisioning_accounts(set);
        if !accounts.is_empty() && !provision_accounts {
            return Err(format!(
                "profiles {} provide service accounts (provider: keyward): give --provision-accounts, with the rights it needs (kustomize component deploy/components/account-provisioning)",
                accounts.join(", ")
            ));
        }
        Ok(())
    })?
    .with_observer(move |outcome| observer.profile_reload(outcome.as_str()));
    let identity = match args.identity.clone() {
        Some(id) if !id.is_empty() => id,
        _ => std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .context("--identity: give this replica's name (the pod's name), or set HOSTNAME")?,
    };
    let lease = LeaseConfig::new(&args.lease_name, &args.namespace, &identity);
    if let Some(problem) = lease.problem() {
        bail!("leader election: {problem}");
    }
    let client = crate::kubeconfig::in_cluster_client(args.api_timeout).await?;
    // `delivery: auto` is decided by what this controller signs, from its own discovery (and
    // written as the cluster facts for the webhook, which makes no API call).
    let pod_certificates = pod_certificate_api(&client, args.pod_certificates).await?;
    let store =
        Arc::new(store.with_facts(keyward_controller::signer::cluster_facts(pod_certificates.first().copied())));
    let profiles = store.profiles().current_arc();
    let issuing = issuing_profiles(&profiles);
    // Without --client-ca-dir no set that issues is accepted (above), so nothing reads this.
    let ca_dir = args.client_ca_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("keyward-no-client-ca"));
    let observer = metrics.clone();
    let client_ca = Arc::new(keyward_controller::identity::client_ca_store(&ca_dir).with_observer(move |o| {
        observer.client_ca_reload(o.as_str());
        if let keyward_certs::ReloadOutcome::Loaded(info) = o {
            let at = info.not_after.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
            observer.set_client_ca_not_after(i64::try_from(at).unwrap_or(i64::MAX));
        }
    }));
    if args.client_ca_dir.is_some() {
        client_ca.reload(Trigger::Startup);
    }
    let _watch = match &args.client_ca_dir {
        Some(_) => Some(keyward_certs::watch(client_ca.clone(), args.cert_poll_interval)?),
        None => None,
    };
    let _profile_watches = store.watch(args.cert_poll_interval)?;

    let elector = LeaderElector::new(client.clone(), lease);
    let leadership = elector.leadership();
    let (stop_election, election_stopped) = tokio::sync::oneshot::channel::<()>();
    let election = tokio::spawn(elector.run(async {
        let _ = election_stopped.await;
    }));

    // Where the cluster serves ClusterTrustBundles: the client CA as one linked to each signer,
    // and the server CAs profiles deliver by `clusterTrustBundle` projection.
    let trust_bundles = served(&client, keyward_controller::signer::ApiVersion::TRUST_BUNDLES).await?;
    let signers = keyward_controller::signer::signers(&profiles);
    match pod_certificates.first() {
        Some(_) => {
            let apis: Vec<String> = pod_certificates
                .iter()
                .map(|v| format!("{}/{}", keyward_controller::signer::ApiVersion::GROUP, v.as_str()))
                .collect();
            tracing::info!(api = %apis.join(", "), signers = ?signers.iter().map(|(s, _)| s).collect::<Vec<_>>(), "signing PodCertificateRequests of keyward's signers")
        }
        None if !signers.is_empty() => tracing::error!(
            signers = ?signers.iter().map(|(s, _)| s).collect::<Vec<_>>(),
            "profiles deliver pod certificates, but this cluster serves no PodCertificateRequest API (or --pod-certificates off): their pods wait for certificates that never come; enable the API (Kubernetes 1.35+) or use delivery: secret"
        ),
        None => {}
    }
    let settings = Settings {
        trust_domain: args.trust_domain.clone(),
        client_cert_validity: args.client_cert_validity,
        operator_namespaces: args.profiles.operator_namespaces.iter().cloned().collect::<BTreeMap<_, _>>(),
        client_ca_config_map: args.client_ca_config_map.clone(),
        publish_client_ca_to: args.publish_client_ca_to.clone(),
        namespace: args.namespace.clone(),
        attestation_secret: args.attestation_secret.clone(),
        attestation_rotation: args.attestation_key_rotation,
        serving,
        client_ca_secret: (args.client_ca == Source::SelfManaged).then(|| args.client_ca_secret.clone()),
        match_conditions_of: (args.webhook_match_conditions == Keeper::Managed).then(|| args.webhook_config.clone()),
        pod_certificates,
        trust_bundles,
        provision_accounts,
    };
    let reconciler_for = {
        let (client, client_ca, leadership, metrics, identity) =
            (client.clone(), client_ca.clone(), leadership.clone(), metrics.clone(), identity.clone());
        move |profiles| {
            Arc::new(keyward_controller::Context::new(
                client.clone(),
                profiles,
                settings.clone(),
                client_ca.clone(),
                leadership.clone(),
                metrics.clone(),
                identity.clone(),
            ))
        }
    };
    tracing::info!(
        %identity,
        namespace = %args.namespace,
        profiles = ?profiles.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        issuing = ?issuing,
        client_ca_dir = ?args.client_ca_dir,
        trust_domain = %args.trust_domain,
        "controller starting; waiting for the Lease"
    );

    let status = Arc::new(run::Status::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    if args.metrics_listen != "off" {
        let addr: SocketAddr = args
            .metrics_listen
            .parse()
            .with_context(|| format!("--metrics-listen {}: not HOST:PORT or off", args.metrics_listen))?;
        // A set that issues may arrive by reload, and only with a client CA given.
        let needs_ca = has_client_ca;
        let server = health_server(addr, metrics.clone(), status.clone(), client_ca.clone(), needs_ca, stop_rx).await?;
        tokio::spawn(server);
    }
    let shutdown = async {
        crate::serve::wait_for_signal().await;
        tracing::info!("shutting down: releasing the Lease");
    };
    let loop_settings = run::LoopSettings { resync: args.resync_interval, workers: args.workers };
    run::run_reloading(client, store.subscribe(), reconciler_for, leadership, loop_settings, status, shutdown).await;
    let _ = stop_tx.send(true);
    // The elector releases the Lease (bounded by the renew deadline) and ends.
    let _ = stop_election.send(());
    let _ = tokio::time::timeout(Duration::from_secs(12), election).await;
    Ok(())
}

/// The profiles that issue client certificates, in Secrets or as a signer (they need the
/// client CA).
fn issuing_profiles(profiles: &keyward_engine::ProfileSet) -> Vec<String> {
    profiles
        .iter()
        .filter(|p| {
            keyward_controller::desired::provides_per_owner(p, |r| {
                matches!(r, Provision::ClientCertificate | Provision::PodCertificate)
            })
        })
        .map(|p| p.name.clone())
        .collect()
}

async fn health_server(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    status: Arc<run::Status>,
    client_ca: Arc<CertStore>,
    needs_ca: bool,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("--metrics-listen {addr}: cannot bind"))?;
    tracing::info!(role = "metrics", addr = %listener.local_addr()?, "listening (plain HTTP: /metrics, /healthz, /readyz)");
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let metrics = metrics.clone();
                async move { ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], metrics.render()) }
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route(
            "/readyz",
            axum::routing::get(move || {
                let (status, client_ca) = (status.clone(), client_ca.clone());
                async move {
                    match run::readiness(&status, needs_ca.then_some(&*client_ca)) {
                        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
                        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n")),
                    }
                }
            }),
        );
    Ok(crate::serve::serve_plain(listener, app, stop))
}
