//! `keyward gate` settings: the flags (each with a `KEYWARD_GATE_…` or the shared `KEYWARD_…`
//! env var) and the checked [`GateConfig`] the gate runs on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::Args;

use crate::serve::config::{parse_duration, parse_metrics_listen, parse_size, ListenerArgs};
use crate::serve::ListenerConfig;

pub use super::upstream::UpstreamProtocol;

#[derive(Debug, Args)]
pub struct GateArgs {
    /// The gate file (apiVersion keyward.io/v1alpha1, kind Gate): the rules. Reloaded when it
    /// changes; a file that is refused keeps the rules in force.
    #[arg(long, env = "KEYWARD_GATE_CONFIG", value_name = "FILE")]
    config: PathBuf,
    /// Where allowed requests go: `http://127.0.0.1:PORT` (the control plane in the same pod)
    /// or `https://HOST:PORT` with --upstream-ca.
    #[arg(long, env = "KEYWARD_GATE_UPSTREAM", value_name = "URL")]
    upstream: String,
    /// The CA that signed an https:// upstream's certificate (PEM).
    #[arg(long, env = "KEYWARD_GATE_UPSTREAM_CA", value_name = "FILE")]
    upstream_ca: Option<PathBuf>,
    /// The name an https:// upstream's certificate must be for, when it is not the URL's host:
    /// a server in the same pod reached on 127.0.0.1 whose certificate names its Service (as
    /// nginx's proxy_ssl_name).
    #[arg(long, env = "KEYWARD_GATE_UPSTREAM_SERVER_NAME", value_name = "NAME")]
    upstream_server_name: Option<String>,
    /// What the gate speaks to the upstream, gRPC aside (always HTTP/2): `auto`, HTTP/1.1 to an
    /// http:// upstream and what ALPN chooses with an https:// one; `http1`, HTTP/1.1 only
    /// (gRPC refused); `h2c`, HTTP/2 with prior knowledge to an http:// upstream.
    #[arg(long, env = "KEYWARD_GATE_UPSTREAM_PROTOCOL", value_enum, default_value_t = UpstreamProtocol::Auto)]
    upstream_protocol: UpstreamProtocol,
    /// The client CA bundle keyward's client certificates chain to (PEM): the ConfigMap
    /// keyward-client-ca's ca.crt, or a ClusterTrustBundle projected into a volume. Reloaded
    /// when it changes. Without it the gate accepts no client certificates (tokens only).
    #[arg(long, env = "KEYWARD_GATE_CLIENT_CA", value_name = "FILE")]
    client_ca: Option<PathBuf>,
    /// HTTPS address the gate listens on (HTTP/1.1 and HTTP/2, so gRPC too).
    #[arg(long, env = "KEYWARD_GATE_LISTEN", default_value = "[::]:8444")]
    listen: SocketAddr,
    /// A second address that serves the gate without TLS: HTTP/1.1, and HTTP/2 with prior
    /// knowledge (gRPC), for callers that authenticate with a bearer token (Kubeflow Pipelines'
    /// agents speak plaintext gRPC by default) or call routes open to anonymous callers. No
    /// client certificate can arrive there, so rules that admit only workloads never match.
    /// Off by default; keep the port inside the cluster (a NetworkPolicy, docs/gate.md).
    #[arg(long, env = "KEYWARD_GATE_LISTEN_PLAINTEXT", value_name = "ADDR")]
    listen_plaintext: Option<SocketAddr>,
    /// Plain-HTTP address for GET /metrics, /healthz, /readyz; `off` disables it.
    #[arg(long, env = "KEYWARD_GATE_METRICS_LISTEN", default_value = "[::]:9091")]
    metrics_listen: String,
    #[command(flatten)]
    listener: ListenerArgs,
    /// How long a TokenReview or SubjectAccessReview may take; past it the request is refused
    /// as unavailable (the gate fails closed).
    #[arg(long, env = "KEYWARD_GATE_REVIEW_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    review_timeout: Duration,
    /// Bytes of gRPC messages held to be read by a rule, all requests together. Accepts Ki, Mi,
    /// Gi; at least one message (4 MiB and its prefix).
    #[arg(long, env = "KEYWARD_GATE_MESSAGE_BYTES_IN_FLIGHT", default_value = "64Mi", value_parser = parse_size)]
    message_bytes_in_flight: usize,
    /// Threads that serve requests. One by default: a sidecar's every request crosses two
    /// sockets, and on one thread it costs about a fifth less CPU than spread over two
    /// (BENCHMARKS.md, "keyward gate"), and as a current-thread runtime 7-13% less again; raise
    /// it for a gate that must use more than one core.
    #[arg(long, env = "KEYWARD_GATE_WORKER_THREADS", default_value_t = 1)]
    worker_threads: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateConfig {
    pub config: PathBuf,
    pub upstream: String,
    pub upstream_ca: Option<PathBuf>,
    pub upstream_server_name: Option<String>,
    pub upstream_protocol: UpstreamProtocol,
    pub client_ca: Option<PathBuf>,
    pub listen: SocketAddr,
    pub listen_plaintext: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    pub listener: ListenerConfig,
    pub review_timeout: Duration,
    pub message_bytes_in_flight: usize,
    pub worker_threads: usize,
}

impl GateArgs {
    pub fn into_config(self) -> anyhow::Result<GateConfig> {
        let metrics_listen = parse_metrics_listen(&self.metrics_listen)?;
        let listener = self.listener.into_config()?;
        if metrics_listen.is_some_and(|m: SocketAddr| m == self.listen && m.port() != 0) {
            bail!("--metrics-listen {}: must differ from --listen", self.listen);
        }
        if let Some(plain) = self.listen_plaintext {
            let taken = [("--listen", Some(self.listen)), ("--metrics-listen", metrics_listen)];
            if let Some((flag, _)) = taken.iter().find(|(_, a)| *a == Some(plain) && plain.port() != 0) {
                bail!("--listen-plaintext {plain}: must differ from {flag}");
            }
        }
        if self.review_timeout.is_zero() {
            bail!("--review-timeout: must be more than 0s");
        }
        let one_message = keyward_gate::grpc::MAX_MESSAGE_BYTES + 5;
        if self.message_bytes_in_flight < one_message {
            bail!(
                "--message-bytes-in-flight {}: must be at least one gRPC message the gate reads ({one_message} bytes)",
                self.message_bytes_in_flight
            );
        }
        if self.worker_threads == 0 {
            bail!("--worker-threads: must be at least 1");
        }
        if u32::try_from(self.message_bytes_in_flight).is_err() {
            bail!("--message-bytes-in-flight {}: at most 4Gi", self.message_bytes_in_flight);
        }
        Ok(GateConfig {
            config: self.config,
            upstream: self.upstream,
            upstream_ca: self.upstream_ca,
            upstream_server_name: self.upstream_server_name,
            upstream_protocol: self.upstream_protocol,
            client_ca: self.client_ca,
            listen: self.listen,
            listen_plaintext: self.listen_plaintext,
            metrics_listen,
            listener,
            review_timeout: self.review_timeout,
            message_bytes_in_flight: self.message_bytes_in_flight,
            worker_threads: self.worker_threads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        gate: GateArgs,
    }

    fn config(args: &[&str]) -> anyhow::Result<GateConfig> {
        let mut argv = vec!["keyward", "--config", "gate.yaml", "--upstream", "http://127.0.0.1:8082"];
        argv.extend_from_slice(args);
        Wrapper::try_parse_from(argv)?.gate.into_config()
    }

    #[test]
    fn defaults_and_refusals() {
        let c = config(&[]).unwrap();
        assert_eq!(c.listen, "[::]:8444".parse().unwrap());
        assert_eq!(c.metrics_listen, Some("[::]:9091".parse().unwrap()));
        assert_eq!(c.review_timeout, Duration::from_secs(5));
        assert_eq!((c.client_ca, c.upstream_ca), (None, None));
        assert_eq!(c.upstream_protocol, UpstreamProtocol::Auto);
        assert_eq!(config(&["--upstream-protocol", "h2c"]).unwrap().upstream_protocol, UpstreamProtocol::H2c);
        let e = config(&["--upstream-protocol", "h2"]).unwrap_err().to_string();
        assert!(e.contains("possible values: auto, http1, h2c"), "{e}");
        assert_eq!((c.message_bytes_in_flight, c.worker_threads), (64 << 20, 1));
        assert_eq!(config(&["--worker-threads", "0"]).unwrap_err().to_string(), "--worker-threads: must be at least 1");
        assert_eq!(
            config(&["--review-timeout", "0s"]).unwrap_err().to_string(),
            "--review-timeout: must be more than 0s"
        );
        assert_eq!(
            config(&["--message-bytes-in-flight", "1Mi"]).unwrap_err().to_string(),
            "--message-bytes-in-flight 1048576: must be at least one gRPC message the gate reads (4194309 bytes)"
        );
        assert_eq!(
            config(&["--listen", "127.0.0.1:9", "--metrics-listen", "127.0.0.1:9"]).unwrap_err().to_string(),
            "--metrics-listen 127.0.0.1:9: must differ from --listen"
        );
        assert_eq!(c.listen_plaintext, None);
        assert_eq!(
            config(&["--listen-plaintext", "[::]:8444"]).unwrap_err().to_string(),
            "--listen-plaintext [::]:8444: must differ from --listen"
        );
        assert_eq!(
            config(&["--listen-plaintext", "[::]:9091"]).unwrap_err().to_string(),
            "--listen-plaintext [::]:9091: must differ from --metrics-listen"
        );
        assert_eq!(
            config(&["--listen-plaintext", "[::]:8887"]).unwrap().listen_plaintext,
            Some("[::]:8887".parse().unwrap())
        );
    }
}
