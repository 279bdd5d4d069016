//! `keyward serve` settings: the flags (each with a `KEYWARD_…` env var), and the one
//! validated [`ServeConfig`] the server runs on, which tests build directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use crate::logging::LogFormat;
use crate::profiles::{ProfileArgs, ProfileSource};

/// Bodies above this get HTTP 413. The apiserver caps request bodies at 3 MiB, and a pod
/// in an AdmissionReview is well under that; 7 MiB leaves room for `oldObject` on UPDATE.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// HTTPS address for /mutate, /healthz and /readyz. The default, `[::]`, takes IPv6 and
    /// IPv4 (`localhost` resolves to either); where IPv6 is off, keyward listens on 0.0.0.0.
    #[arg(long, env = "KEYWARD_LISTEN", default_value = "[::]:8443")]
    listen: SocketAddr,
    /// Plain-HTTP address for GET /metrics (Prometheus text format); `off` disables it.
    #[arg(long, env = "KEYWARD_METRICS_LISTEN", default_value = "[::]:9090")]
    metrics_listen: String,
    #[command(flatten)]
    listener: ListenerArgs,
    /// The admission attestation's keys (files `current` and `previous`): the Secret
    /// keyward-attestation, which `keyward controller` creates and rotates, mounted as a
    /// directory; reloaded when it changes. Needed when a profile issues per-owner credentials;
    /// without --tls-dir, a development key is kept in --dev-cert-dir instead.
    #[arg(long, env = "KEYWARD_ATTESTATION_KEY_DIR", value_name = "DIR")]
    attestation_key_dir: Option<PathBuf>,
    #[command(flatten)]
    profiles: ProfileArgs,
    /// Bytes of admission request bodies held at once, all requests together (read, or being
    /// decided on): the bound on memory. Accepts Ki, Mi, Gi. At least the 7 MiB body limit.
    #[arg(long, env = "KEYWARD_REQUEST_BYTES_IN_FLIGHT", default_value = "32Mi", value_parser = parse_size)]
    request_bytes_in_flight: usize,
    /// Admission decisions running at once (default: the number of CPUs).
    #[arg(long, env = "KEYWARD_MAX_CONCURRENT_DECISIONS")]
    max_concurrent_decisions: Option<usize>,
    /// Also offer HTTP/2 (ALPN h2) on the webhook port. Off by default: the kube-apiserver
    /// speaks only HTTP/1.1 to webhooks, and HTTP/2's many streams per connection give other
    /// clients more ways to hold connections.
    #[arg(long, env = "KEYWARD_HTTP2")]
    http2: bool,
    /// Threads that serve connections. One by default: an admission takes tens of
    /// microseconds, and on one thread it costs a sixth to a third less CPU than spread over two,
    /// which wake each other for every request (BENCHMARKS.md, "CPU per admission"); one thread
    /// is a current-thread runtime, 11-13% cheaper again than one worker of a multi-thread one. Pods over
    /// 64 KiB are decided on separate threads either way. Raise it for a webhook that must use
    /// more than one core.
    #[arg(long, env = "KEYWARD_WORKER_THREADS", default_value_t = 1)]
    worker_threads: usize,
}

/// The flags of an HTTPS server of keyward's (`serve`, `gate`): its certificate, its log, and
/// the rules its connections follow (see `connections`).
#[derive(Debug, Args)]
pub struct ListenerArgs {
    /// A directory holding tls.crt (leaf first, chain allowed) and tls.key (PKCS#8, PKCS#1 or
    /// SEC1): a cert-manager Secret mounted as a volume. Without it, keyward mints a
    /// development CA and certificate into --dev-cert-dir.
    #[arg(long, env = "KEYWARD_TLS_DIR", value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// Where the development CA and certificate live when --tls-dir is not given.
    #[arg(long, env = "KEYWARD_DEV_CERT_DIR", default_value = ".keyward-dev", value_name = "DIR")]
    dev_cert_dir: PathBuf,
    /// Extra DNS names (or IPs) for the development certificate; repeat or comma-separate.
    #[arg(long = "dns-name", env = "KEYWARD_DNS_NAMES", value_delimiter = ',', value_name = "NAME")]
    dns_names: Vec<String>,
    /// Log format.
    #[arg(long, env = "KEYWARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// How often to re-read the certificate directory besides watching it (e.g. 10s, 1m).
    #[arg(long, env = "KEYWARD_CERT_POLL_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    cert_poll_interval: Duration,
    /// How long a client may take to start its first request after the TLS handshake, to send
    /// a request's headers once they start, and to send its body.
    #[arg(long, env = "KEYWARD_REQUEST_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    request_read_timeout: Duration,
    /// How long a keep-alive connection (HTTP/1.1 or HTTP/2) may sit idle between requests.
    /// Keep it above the apiserver's 90 s, so the apiserver closes idle connections first and
    /// never sends a request on a connection keyward is closing.
    #[arg(long, env = "KEYWARD_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    idle_timeout: Duration,
    /// How long a TLS handshake may take.
    #[arg(long, env = "KEYWARD_TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    tls_handshake_timeout: Duration,
    /// Most connections open at once on the HTTPS port. At the cap a new connection closes
    /// the longest-idle one; it is refused only when every connection has a request in flight.
    /// Lowered at start-up to fit the open-files limit.
    #[arg(long, env = "KEYWARD_MAX_CONNECTIONS", default_value_t = 256)]
    max_connections: usize,
    /// Most connections open at once on the metrics port (same rules).
    #[arg(long, env = "KEYWARD_METRICS_MAX_CONNECTIONS", default_value_t = 16)]
    metrics_max_connections: usize,
    /// On SIGTERM, how long to keep accepting connections while reporting not ready, so that
    /// the Service stops routing here before the port closes (the apiserver would otherwise
    /// see refused connections and, with failurePolicy: Fail, refuse pods).
    #[arg(long, env = "KEYWARD_SHUTDOWN_DELAY", default_value = "5s", value_parser = parse_duration)]
    shutdown_delay: Duration,
    /// Then, how long to let in-flight requests finish. Keep delay + grace under the pod's
    /// terminationGracePeriodSeconds.
    #[arg(long, env = "KEYWARD_SHUTDOWN_GRACE", default_value = "20s", value_parser = parse_duration)]
    shutdown_grace: Duration,
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    /// A directory kept up to date by someone else (cert-manager via the kubelet).
    Dir(PathBuf),
    /// keyward's own development PKI, minted into this directory.
    Dev { dir: PathBuf, extra_names: Vec<String> },
}

/// An HTTPS server's settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    pub tls: TlsSource,
    pub log_format: LogFormat,
    pub cert_poll_interval: Duration,
    pub request_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    pub max_connections: usize,
    pub metrics_max_connections: usize,
    pub shutdown_delay: Duration,
    pub shutdown_grace: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub listener: ListenerConfig,
    /// Where the attestation keys are mounted (`None`: a development key beside the dev
    /// certificate, or none when no profile needs one).
    pub attestation_key_dir: Option<PathBuf>,
    pub profiles: ProfileSource,
    /// Offer HTTP/2 on the webhook port as well as HTTP/1.1.
    pub http2: bool,
    pub request_bytes_in_flight: usize,
    pub max_concurrent_decisions: usize,
    pub max_body_bytes: usize,
    pub worker_threads: usize,
}

impl ServeArgs {
    pub fn into_config(self) -> anyhow::Result<ServeConfig> {
        let metrics_listen = parse_metrics_listen(&self.metrics_listen)?;
        let listener = self.listener.into_config()?;
        if metrics_listen.is_some_and(|m: SocketAddr| m == self.listen && m.port() != 0) {
            bail!("--metrics-listen {}: must differ from --listen", self.listen);
        }
        if self.request_bytes_in_flight < MAX_BODY_BYTES {
            bail!(
                "--request-bytes-in-flight {}: must be at least the {MAX_BODY_BYTES}-byte body limit, or a large pod could never be read",
                self.request_bytes_in_flight
            );
        }
        let max_concurrent_decisions = match self.max_concurrent_decisions {
            Some(0) => bail!("--max-concurrent-decisions: must be at least 1"),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(2, usize::from),
        };
        if self.worker_threads == 0 {
            bail!("--worker-threads: must be at least 1");
        }
        Ok(ServeConfig {
            listen: self.listen,
            metrics_listen,
            listener,
            attestation_key_dir: self.attestation_key_dir,
            profiles: self.profiles.source(),
            http2: self.http2,
            request_bytes_in_flight: self.request_bytes_in_flight,
            max_concurrent_decisions,
            max_body_bytes: MAX_BODY_BYTES,
            worker_threads: self.worker_threads,
        })
    }
}

/// `--metrics-listen`: an address, or `off`.
pub fn parse_metrics_listen(value: &str) -> anyhow::Result<Option<SocketAddr>> {
    match value {
        "off" | "" => Ok(None),
        addr => Ok(Some(
            addr.parse()
                .with_context(|| format!("--metrics-listen {addr:?}: not an address like 0.0.0.0:9090 (or `off`)"))?,
        )),
    }
}

impl ListenerArgs {
    pub fn into_config(self) -> anyhow::Result<ListenerConfig> {
        if self.cert_poll_interval < Duration::from_secs(1) {
            bail!("--cert-poll-interval {:?}: must be at least 1s", self.cert_poll_interval);
        }
        for (flag, value) in [
            ("--request-read-timeout", self.request_read_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--tls-handshake-timeout", self.tls_handshake_timeout),
        ] {
            if value.is_zero() {
                bail!("{flag}: must be more than 0s");
            }
        }
        for (flag, value) in
            [("--max-connections", self.max_connections), ("--metrics-max-connections", self.metrics_max_connections)]
        {
            if value == 0 {
                bail!("{flag}: must be at least 1");
            }
        }
        let tls = match self.tls_dir {
            Some(dir) => {
                if !self.dns_names.is_empty() {
                    bail!("--dns-name: only for the development certificate; with --tls-dir the certificate's names are the issuer's");
                }
                TlsSource::Dir(dir)
            }
            None => TlsSource::Dev { dir: self.dev_cert_dir, extra_names: self.dns_names },
        };
        Ok(ListenerConfig {
            tls,
            log_format: self.log_format,
            cert_poll_interval: self.cert_poll_interval,
            request_read_timeout: self.request_read_timeout,
            idle_timeout: self.idle_timeout,
            tls_handshake_timeout: self.tls_handshake_timeout,
            max_connections: self.max_connections,
            metrics_max_connections: self.metrics_max_connections,
            shutdown_delay: self.shutdown_delay,
            shutdown_grace: self.shutdown_grace,
        })
    }
}

/// A duration in Go's syntax, as every Kubernetes user writes them: `500ms`, `10s`, `1m30s`,
/// `1.5h` (kube-core's parser).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let parsed: kube::core::Duration =
        s.parse().map_err(|e| format!("{s:?}: {e} (Go's duration syntax: 500ms, 10s, 1m30s, 1.5h)"))?;
    if parsed.is_negative() {
        return Err(format!("{s:?}: must not be negative"));
    }
    Ok(parsed.into())
}

/// `4096`, `512Ki`, `32Mi`, `1Gi`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: usize = number.parse().map_err(|_| format!("{s:?}: expected a number of bytes, like 32Mi or 1048576"))?;
    let scale: usize = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return Err(format!("{s:?}: unknown unit {unit:?}; use Ki, Mi or Gi")),
    };
    n.checked_mul(scale).ok_or_else(|| format!("{s:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn config(args: &[&str]) -> anyhow::Result<ServeConfig> {
        let mut argv = vec!["keyward"];
        argv.extend_from_slice(args);
        Wrapper::try_parse_from(argv)?.serve.into_config()
    }

    #[test]
    fn defaults_are_the_embedded_dev_setup() {
        let c = config(&[]).unwrap();
        assert_eq!(c.listen, "[::]:8443".parse().unwrap());
        assert_eq!(c.metrics_listen, Some("[::]:9090".parse().unwrap()));
        assert_eq!(c.listener.tls, TlsSource::Dev { dir: ".keyward-dev".into(), extra_names: vec![] });
        assert_eq!(c.listener.cert_poll_interval, Duration::from_secs(10));
        assert_eq!(
            (c.listener.shutdown_delay, c.listener.shutdown_grace),
            (Duration::from_secs(5), Duration::from_secs(20))
        );
        assert_eq!(c.max_body_bytes, 7 * 1024 * 1024);
        assert_eq!(
            (c.listener.request_read_timeout, c.listener.idle_timeout),
            (Duration::from_secs(10), Duration::from_secs(120))
        );
        assert_eq!((c.listener.max_connections, c.listener.metrics_max_connections), (256, 16));
        assert_eq!(c.request_bytes_in_flight, 32 * 1024 * 1024);
        assert!(c.max_concurrent_decisions >= 1);
        assert_eq!(c.worker_threads, 1);
        assert_eq!(
            c.profiles,
            ProfileSource {
                dir: None,
                with_builtin: true,
                builtins: vec![],
                operator_namespaces: vec![],
                facts: crate::profiles::FactsSource::Known(Default::default())
            }
        );
    }

    #[test]
    fn flags_are_validated_with_clear_errors() {
        let c = config(&["--tls-dir", "/tls", "--metrics-listen", "off", "--cert-poll-interval", "30s"]).unwrap();
        assert_eq!(c.listener.tls, TlsSource::Dir("/tls".into()));
        assert_eq!(c.metrics_listen, None);
        assert_eq!(c.listener.cert_poll_interval, Duration::from_secs(30));
        let err = config(&["--metrics-listen", "nine"]).unwrap_err().to_string();
        assert_eq!(err, "--metrics-listen \"nine\": not an address like 0.0.0.0:9090 (or `off`)");
        let err = config(&["--tls-dir", "/tls", "--dns-name", "x"]).unwrap_err().to_string();
        assert!(err.starts_with("--dns-name: only for the development certificate"), "{err}");
        let err = config(&["--cert-poll-interval", "10"]).unwrap_err().to_string();
        assert!(err.contains("\"10\": missing a unit"), "{err}");
        let err =
            config(&["--listen", "127.0.0.1:9090", "--metrics-listen", "127.0.0.1:9090"]).unwrap_err().to_string();
        assert_eq!(err, "--metrics-listen 127.0.0.1:9090: must differ from --listen");
        assert_eq!(config(&["--worker-threads", "3"]).unwrap().worker_threads, 3);
        let err = config(&["--worker-threads", "0"]).unwrap_err().to_string();
        assert_eq!(err, "--worker-threads: must be at least 1");
        let err = config(&["--idle-timeout", "0s"]).unwrap_err().to_string();
        assert_eq!(err, "--idle-timeout: must be more than 0s");
        let c = config(&["--operator-namespace", "lmeval-job=opendatahub,kuberay-node=ray-system"]).unwrap();
        assert_eq!(
            c.profiles.operator_namespaces,
            [("lmeval-job".to_string(), "opendatahub".to_string()), ("kuberay-node".into(), "ray-system".into())]
        );
        let err = config(&["--operator-namespace", "lmeval-job"]).unwrap_err().to_string();
        assert!(err.contains("\"lmeval-job\": expected PROFILE=NAMESPACE, e.g. lmeval=lm-eval"), "{err}");
        let err = config(&["--max-connections", "0"]).unwrap_err().to_string();
        assert_eq!(err, "--max-connections: must be at least 1");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("32Mi"), Ok(32 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("3MB").is_err());
        let err = config(&["--request-bytes-in-flight", "1Mi"]).unwrap_err().to_string();
        assert!(
            err.starts_with("--request-bytes-in-flight 1048576: must be at least the 7340032-byte body limit"),
            "{err}"
        );
    }

    #[test]
    fn durations_are_written_as_in_go() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h0m0s"), Ok(Duration::from_secs(3600)));
        assert_eq!(
            parse_duration("10").unwrap_err(),
            "\"10\": missing a unit: expected one of 'ns', 'us', '\u{00b5}s', 'ms', 's', 'm', or 'h' (Go's duration syntax: 500ms, 10s, 1m30s, 1.5h)"
        );
        assert!(parse_duration("5d").unwrap_err().starts_with("\"5d\": invalid unit"));
        assert_eq!(parse_duration("-1s").unwrap_err(), "\"-1s\": must not be negative");
    }
}
