//! The flags that reach a cluster as kubectl does (`--kubeconfig`, `--context`), for the
//! commands that read one with the user's own credentials (`audit`, `explain --cluster`).

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

impl KubeconfigArgs {
    /// The client, and the context's namespace.
    pub async fn client(&self) -> anyhow::Result<(kube::Client, String)> {
        // kube's client builds its TLS from rustls' process-wide provider: ring, the only one
        // compiled in. Already installed is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let options = kube::config::KubeConfigOptions { context: self.context.clone(), ..Default::default() };
        let unusable = |e: &dyn std::fmt::Display| {
            anyhow::anyhow!("cannot configure the Kubernetes client ({e}); give --kubeconfig, or set KUBECONFIG")
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let file = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| anyhow::anyhow!("--kubeconfig {}: {e}", path.display()))?;
                kube::Config::from_custom_kubeconfig(file, &options).await.map_err(|e| unusable(&e))?
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&options).await.map_err(|e| unusable(&e))?,
            (None, None) => kube::Config::infer().await.map_err(|e| unusable(&e))?,
        };
        let namespace = config.default_namespace.clone();
        let client =
            kube::Client::try_from(config).map_err(|e| anyhow::anyhow!("cannot build the Kubernetes client: {e}"))?;
        Ok((client, namespace))
    }
}
