//! How keyward reaches a cluster: as kubectl does, with the user's own credentials
//! (`--kubeconfig`, `--context`, for `audit` and `explain --cluster`), or as a process in the
//! cluster does (its ServiceAccount, for `controller` and `gate`).

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct KubeconfigArgs {
    /// The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config; in a pod, its
    /// ServiceAccount).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: the current one).
    #[arg(long)]
    pub context: Option<String>,
}

/// A client of the cluster the user pointed at, and where it is.
pub struct Cluster {
    pub client: kube::Client,
    /// The context's namespace.
    pub namespace: String,
    /// The API server's address, named in every error.
    pub server: String,
}

/// The cluster could not be configured or read: `audit` and `explain --cluster` exit 2 (1 is
/// bad input, 3 a pod keyward would refuse).
#[derive(Debug)]
pub struct ClusterUnreadable(pub String);

impl std::fmt::Display for ClusterUnreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClusterUnreadable {}

impl KubeconfigArgs {
    /// The client, the context's namespace and the server's address.
    pub async fn client(&self) -> Result<Cluster, ClusterUnreadable> {
        // kube's client builds its TLS from rustls' process-wide provider: ring, the only one
        // compiled in. Already installed is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let options = kube::config::KubeConfigOptions { context: self.context.clone(), ..Default::default() };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let file = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| ClusterUnreadable(format!("--kubeconfig {}: {}", path.display(), innermost(&e))))?;
                kube::Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|e| unusable(&format!("--kubeconfig {}", path.display()), &e))?
            }
            (None, _) => {
                let from = match std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
                    Some(v) => format!("KUBECONFIG={}", v.to_string_lossy()),
                    None => "~/.kube/config (KUBECONFIG is not set)".into(),
                };
                match &self.context {
                    Some(_) => kube::Config::from_kubeconfig(&options).await.map_err(|e| unusable(&from, &e))?,
                    // A kubeconfig first, then a pod's ServiceAccount; the kubeconfig's failure
                    // is the one said (the error's source).
                    None => kube::Config::infer().await.map_err(|e| unusable(&from, &e))?,
                }
            }
        };
        let namespace = config.default_namespace.clone();
        let server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config)
            .map_err(|e| ClusterUnreadable(format!("cannot build a client for {server}: {}", innermost(&e))))?;
        Ok(Cluster { client, namespace, server })
    }
}

fn unusable(from: &str, e: &dyn std::error::Error) -> ClusterUnreadable {
    let fix = if from.starts_with("KUBECONFIG=") {
        "check the file KUBECONFIG names, or give --kubeconfig FILE (and --context)"
    } else if from.starts_with("--kubeconfig") {
        "check the file and its contexts (kubectl config get-contexts)"
    } else {
        "give --kubeconfig FILE (and --context), or set KUBECONFIG"
    };
    ClusterUnreadable(format!("cannot configure a Kubernetes client from {from}: {}; {fix}", innermost(e)))
}

/// One line for a request the cluster did not answer: what was asked of which server, the
/// cause said once (the innermost error; kube's chain repeats each layer's prefix), and what to
/// check.
pub fn request_failed(server: &str, what: &str, error: &kube::Error) -> ClusterUnreadable {
    let line = match error {
        kube::Error::Api(status) => {
            // kube's stand-in for an answer that is not a Kubernetes Status (a proxy's page, a
            // path no API serves): the body is in `message`.
            let answer = if status.reason == "Failed to parse error data" || status.message.is_empty() {
                format!("HTTP {}", status.code)
            } else {
                format!("HTTP {} {}: {}", status.code, status.reason, status.message)
            };
            let check = match status.code {
                401 => "the server refused the credentials: log in again (kubectl auth whoami)",
                403 => "not permitted: ask for the read-only ClusterRole in deploy/audit/rbac.yaml",
                404 => "not served there: is this the right cluster, and does its Kubernetes serve this API?",
                429 | 500..=599 => "the API server is overloaded or failing: try again",
                _ => "see the answer",
            };
            format!("{what} at {server}: {answer}; {check}")
        }
        other => format!(
            "{what} at {server}: {}; is the cluster up and reachable from here, and is this the right context? (kubectl cluster-info)",
            innermost(other)
        ),
    };
    ClusterUnreadable(line)
}

/// The innermost cause of an error chain: the one that says what happened.
pub fn innermost(error: &dyn std::error::Error) -> String {
    let mut error = error;
    while let Some(source) = error.source() {
        error = source;
    }
    error.to_string()
}

/// The Kubernetes client of a process that runs in the cluster (in a pod: its
/// ServiceAccount; elsewhere: KUBECONFIG), with every request bounded by `timeout` until its
/// answer starts. The controller's and the gate's.
pub async fn in_cluster_client(timeout: std::time::Duration) -> anyhow::Result<kube::Client> {
    let hint = "in a pod, its ServiceAccount token must be mounted; elsewhere, set KUBECONFIG";
    let config = kube::Config::infer()
        .await
        .map_err(|e| anyhow::anyhow!("cannot configure the Kubernetes client ({e}); {hint}"))?;
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| anyhow::anyhow!("cannot build the Kubernetes client ({e}); {hint}"))?;
    Ok(builder.with_layer(&keyward_controller::client::Deadline { limit: timeout }).build())
}
