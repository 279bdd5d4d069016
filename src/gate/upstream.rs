//! The upstream the gate forwards allowed requests to: plain text over loopback (a sidecar in
//! the control plane's pod) or TLS. gRPC goes as HTTP/2 (prior knowledge over plain text, ALPN
//! `h2` over TLS); everything else as `--upstream-protocol` says: by default HTTP/1.1 over
//! plain text, and over TLS what the upstream's ALPN chooses. A caller's HTTP/2 is not
//! forwarded as HTTP/2 to an upstream that may not speak it: curl's and Go's defaults negotiate
//! h2 with the gate, and an HTTP/1.1-only upstream would answer the HTTP/2 preface with nothing
//! (kube-rbac-proxy makes h2c to its upstream opt-in too, `--upstream-force-h2c`).

use std::path::Path;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Uri, Version};
use hyper_rustls::HttpsConnector;
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tower::ServiceExt;

use super::h1_pool::H1Pool;
use super::held_h2::HeldCalls;

/// How long connecting to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle upstream connections kept per protocol.
const POOL_IDLE: usize = 64;

pub struct Upstream {
    scheme: Scheme,
    authority: Authority,
    protocol: UpstreamProtocol,
    h1: H1Pool,
    h2: Client<HttpsConnector<HttpConnector>, Body>,
    /// An `https://` upstream in `auto`: ALPN offers h2 and http/1.1, and the upstream chooses.
    negotiated: Client<HttpsConnector<HttpConnector>, Body>,
    /// HTTP/2 calls whose body the gate holds: HEADERS and DATA in one write.
    held_h2: HeldCalls,
}

/// How the gate verifies an `https://` upstream.
#[derive(Debug, Clone, Copy, Default)]
pub struct UpstreamTls<'a> {
    /// The CA that signed the upstream's certificate (`--upstream-ca`).
    pub ca: Option<&'a Path>,
    /// The name its certificate must be for, when not the URL's host (`--upstream-server-name`).
    pub server_name: Option<&'a str>,
}

/// What the gate speaks to the upstream for requests that are not gRPC (`--upstream-protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 to an `http://` upstream; to an `https://` one, what its ALPN chooses.
    #[default]
    Auto,
    /// HTTP/1.1 only; gRPC, which needs HTTP/2, is refused.
    Http1,
    /// HTTP/2 with prior knowledge to an `http://` upstream, for every request.
    H2c,
}

/// Why a request could not be sent.
#[derive(Debug)]
pub enum SendError {
    /// The upstream could not be reached, or failed mid-request (the detail is for the log).
    Unreachable(String),
    /// The gate was told the upstream cannot take this request: said to the caller.
    Unsupported(&'static str),
}

/// The body of a request to forward.
pub enum Outgoing {
    /// Read whole by the gate (a gRPC message a rule read).
    Held(HeldMessage),
    /// Passed on as it arrives.
    Streamed(Body),
}

/// A message the gate read whole, with what it holds of the gate's memory and of its caller's
/// share: both given back once the message is with the upstream ([`HeldMessage::written`]), the
/// caller's held call when the upstream has answered (dropped).
pub struct HeldMessage {
    pub bytes: Bytes,
    pub budget: Option<tokio::sync::OwnedSemaphorePermit>,
    pub share: Option<super::share::Share>,
}

impl HeldMessage {
    /// The message is with the upstream connection, within the window the upstream gave it.
    pub fn written(&mut self) {
        self.budget = None;
        if let Some(share) = &mut self.share {
            share.release_bytes();
        }
    }
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority)
    }
}

impl Upstream {
    /// `url`: `http://127.0.0.1:8082` or `https://HOST:PORT` (then `tls.ca` verifies it, for
    /// `tls.server_name` when given, else for HOST); no path.
    /// `wait`: the longest a held call waits for the upstream to take its message (a stream, the
    /// window to send it in).
    pub fn new(url: &str, tls: UpstreamTls<'_>, protocol: UpstreamProtocol, wait: Duration) -> Result<Self, String> {
        let UpstreamTls { ca, server_name } = tls;
        let uri: Uri = url.parse().map_err(|e| format!("--upstream {url:?}: not a URL ({e})"))?;
        let (Some(scheme), Some(authority)) = (uri.scheme().cloned(), uri.authority().cloned()) else {
            return Err(format!("--upstream {url:?}: give scheme, host and port, as http://127.0.0.1:8082"));
        };
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty()) {
            return Err(format!("--upstream {url:?}: no path; requests are forwarded with their own path, unchanged"));
        }
        if authority.port_u16().is_none() {
            return Err(format!("--upstream {url:?}: give the port, as http://127.0.0.1:8082"));
        }
        let mut roots = rustls::RootCertStore::empty();
        match (scheme.as_str(), ca) {
            ("http", None) => {}
            ("http", Some(_)) => return Err("--upstream-ca: only for an https:// upstream".into()),
            ("https", Some(file)) => {
                let pem = std::fs::read(file).map_err(|e| format!("--upstream-ca {}: {e}", file.display()))?;
                for cert in CertificateDer::pem_slice_iter(&pem) {
                    let cert = cert.map_err(|e| format!("--upstream-ca {}: {e}", file.display()))?;
                    roots.add(cert).map_err(|e| format!("--upstream-ca {}: {e}", file.display()))?;
                }
                if roots.is_empty() {
                    return Err(format!("--upstream-ca {}: holds no certificate", file.display()));
                }
            }
            ("https", None) => {
                return Err(
                    "--upstream https://…: give --upstream-ca, the CA that signed the upstream's certificate".into()
                )
            }
            (other, _) => return Err(format!("--upstream {url:?}: scheme {other:?}; use http or https")),
        }
        let server_name = match (scheme.as_str(), server_name) {
            (_, None) => None,
            ("http", Some(_)) => return Err("--upstream-server-name: only for an https:// upstream".into()),
            (_, Some(name)) => Some(rustls::pki_types::ServerName::try_from(name.to_string()).map_err(|_| {
                format!("--upstream-server-name {name:?}: not a DNS name or IP address the certificate could be for")
            })?),
        };
        if scheme == Scheme::HTTPS && protocol == UpstreamProtocol::H2c {
            return Err(
                "--upstream-protocol h2c: HTTP/2 over plain text, for an http:// upstream; an https:// upstream's protocol is chosen by ALPN (auto), or is HTTP/1.1 (http1)".into(),
            );
        }
        let tls = || -> Result<rustls::ClientConfig, String> {
            Ok(rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| format!("TLS configuration: {e}"))?
            .with_root_certificates(roots.clone())
            .with_no_client_auth())
        };
        let http = || {
            let mut http = HttpConnector::new();
            http.enforce_http(false);
            http.set_connect_timeout(Some(CONNECT_TIMEOUT));
            http.set_nodelay(true);
            http
        };
        // The name the upstream's certificate is checked for: the URL's host, or the one given
        // (a sidecar reached on 127.0.0.1 whose certificate names its Service).
        let builder = || -> Result<_, String> {
            let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls()?);
            let builder = builder.https_or_http();
            Ok(match &server_name {
                Some(name) => {
                    builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name.clone()))
                }
                None => builder,
            })
        };
        let h1 = builder()?.enable_http1().wrap_connector(http());
        let h2 = builder()?.enable_http2().wrap_connector(http());
        let negotiated = builder()?.enable_all_versions().wrap_connector(http());
        let held_h2 = HeldCalls::new(uri.clone(), h2.clone(), wait);
        Ok(Self {
            scheme,
            authority,
            protocol,
            held_h2,
            h1: H1Pool::new(uri, h1, POOL_IDLE),
            h2: Client::builder(TokioExecutor::new()).http2_only(true).pool_max_idle_per_host(POOL_IDLE).build(h2),
            negotiated: Client::builder(TokioExecutor::new()).pool_max_idle_per_host(POOL_IDLE).build(negotiated),
        })
    }

    /// How a request goes (`h2`: the caller spoke HTTP/2; `grpc`: with a gRPC content type):
    /// gRPC as HTTP/2, HTTP/1.1 as HTTP/1.1, other HTTP/2 as `--upstream-protocol` says.
    fn route(&self, h2: bool, grpc: bool) -> Result<Route, SendError> {
        Ok(match (h2, grpc, self.protocol) {
            (true, true, UpstreamProtocol::Http1) => return Err(SendError::Unsupported(
                "gRPC needs HTTP/2, and this gate was told its upstream speaks HTTP/1.1 only (--upstream-protocol http1)",
            )),
            (true, true, _) | (true, false, UpstreamProtocol::H2c) => Route::Http2,
            (true, false, UpstreamProtocol::Auto) if self.scheme == Scheme::HTTPS => Route::Negotiated,
            _ => Route::Http1,
        })
    }

    /// Sends the request (`parts`, its headers already the gate's: `forward` made them, and
    /// nothing here removes one) and `body` to the upstream (`grpc`: with a gRPC content type),
    /// and returns the upstream's response with its hop-by-hop headers removed.
    pub async fn send(
        &self,
        mut parts: http::request::Parts,
        body: Outgoing,
        grpc: bool,
    ) -> Result<http::Response<Body>, SendError> {
        let route = self.route(parts.version == Version::HTTP_2, grpc)?;
        let path = parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        // An HTTP/2 request's authority is in its URI, not a Host header: one going on as
        // HTTP/1.1 carries it as its Host, as the caller's HTTP/1.1 requests do.
        if let (None, Some(authority)) = (parts.headers.get(http::header::HOST), parts.uri.authority()) {
            if let Ok(host) = http::HeaderValue::from_str(authority.as_str()) {
                parts.headers.insert(http::header::HOST, host);
            }
        }
        parts.uri = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|e| SendError::Unreachable(format!("cannot address the upstream: {e}")))?;
        let unreachable = |e: hyper_util::client::legacy::Error| SendError::Unreachable(describe(&e));
        let mut response = match (route, body) {
            (Route::Http2, Outgoing::Held(message)) => {
                // HTTP/2 names its authority itself.
                parts.headers.remove(http::header::HOST);
                parts.version = Version::HTTP_2;
                let head = http::Request::from_parts(parts, ());
                self.held_h2.send(head, message).await.map_err(SendError::Unreachable)?.map(Body::new)
            }
            (Route::Http2, Outgoing::Streamed(body)) => {
                parts.headers.remove(http::header::HOST);
                parts.version = Version::HTTP_2;
                self.h2.request(http::Request::from_parts(parts, body)).await.map_err(unreachable)?.map(Body::new)
            }
            (route, body) => {
                parts.version = Version::HTTP_11;
                let body = match body {
                    // Handed to hyper whole: its memory is hyper's from here.
                    Outgoing::Held(message) => Body::from(message.bytes),
                    Outgoing::Streamed(body) => body,
                };
                let request = http::Request::from_parts(parts, body);
                if route == Route::Negotiated {
                    self.negotiated.request(request).await.map_err(unreachable)?.map(Body::new)
                } else {
                    self.h1.send(request).await.map_err(SendError::Unreachable)?.map(Body::new)
                }
            }
        };
        super::forward::strip_hop_by_hop(response.headers_mut());
        Ok(response)
    }
}

/// The client a request goes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Http1,
    Http2,
    /// TLS with ALPN h2 and http/1.1: the upstream chooses.
    Negotiated,
}

/// A connection to the upstream at `address` (`http://` or `https://`, host and port), by
/// `connector`; its error names the upstream and every cause.
pub(super) async fn connect(
    connector: &HttpsConnector<HttpConnector>,
    address: &Uri,
) -> Result<MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>, String> {
    let shown = address.authority().map_or("the upstream", |a| a.as_str());
    connector.clone().oneshot(address.clone()).await.map_err(|e| {
        let mut out = format!("connecting to {shown}: {e}");
        let mut source = e.source();
        while let Some(cause) = source {
            out.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        out
    })
}

/// The upstream error, with its cause (hyper's own message is only "client error").
fn describe(e: &hyper_util::client::legacy::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(1);

    #[test]
    fn the_upstream_is_a_scheme_host_and_port_and_nothing_else() {
        assert!(Upstream::new("http://127.0.0.1:8082", UpstreamTls::default(), UpstreamProtocol::Auto, WAIT).is_ok());
        assert_eq!(
            Upstream::new("http://127.0.0.1:8082/api", UpstreamTls::default(), UpstreamProtocol::Auto, WAIT)
                .unwrap_err(),
            "--upstream \"http://127.0.0.1:8082/api\": no path; requests are forwarded with their own path, unchanged"
        );
        assert_eq!(
            Upstream::new("127.0.0.1:8082", UpstreamTls::default(), UpstreamProtocol::Auto, WAIT).unwrap_err(),
            "--upstream \"127.0.0.1:8082\": give scheme, host and port, as http://127.0.0.1:8082"
        );
        assert_eq!(
            Upstream::new("http://localhost", UpstreamTls::default(), UpstreamProtocol::Auto, WAIT).unwrap_err(),
            "--upstream \"http://localhost\": give the port, as http://127.0.0.1:8082"
        );
        assert_eq!(
            Upstream::new("https://api:8443", UpstreamTls::default(), UpstreamProtocol::Auto, WAIT).unwrap_err(),
            "--upstream https://…: give --upstream-ca, the CA that signed the upstream's certificate"
        );
        assert!(Upstream::new("ftp://x:1", UpstreamTls::default(), UpstreamProtocol::Auto, WAIT)
            .unwrap_err()
            .contains("scheme \"ftp\""));
    }

    /// An upstream that cannot be reached is named in the log line, with the error and its
    /// causes.
    #[tokio::test]
    async fn an_unreachable_upstream_is_named_and_said_why() {
        let upstream =
            Upstream::new("http://127.0.0.1:1", UpstreamTls::default(), UpstreamProtocol::Auto, WAIT).unwrap();
        assert_eq!(format!("{upstream:?}"), "http://127.0.0.1:1");
        let (parts, _) = http::Request::get("/x").body(()).unwrap().into_parts();
        let Err(SendError::Unreachable(why)) = upstream.send(parts, Outgoing::Streamed(Body::empty()), false).await
        else {
            panic!("sent to a port nothing listens on");
        };
        assert!(why.starts_with("connecting to 127.0.0.1:1: tcp connect error: "), "{why}");
        assert!(why.to_lowercase().contains("connection refused"), "{why}");
    }

    #[test]
    fn grpc_goes_as_http2_and_the_rest_as_the_upstream_protocol_says() {
        let at = |url: &str, protocol| Upstream::new(url, UpstreamTls::default(), protocol, WAIT).unwrap();
        // (gRPC over HTTP/2, other HTTP/2, HTTP/1.1 with either content type)
        let routes =
            |u: &Upstream| [u.route(true, false), u.route(false, false), u.route(false, true)].map(|r| r.ok().unwrap());
        let plain = at("http://127.0.0.1:8082", UpstreamProtocol::Auto);
        assert_eq!(plain.route(true, true).unwrap(), Route::Http2);
        assert_eq!(routes(&plain), [Route::Http1; 3]);
        let h2c = at("http://127.0.0.1:8082", UpstreamProtocol::H2c);
        assert_eq!(h2c.route(true, true).unwrap(), Route::Http2);
        assert_eq!(routes(&h2c), [Route::Http2, Route::Http1, Route::Http1]);
        let http1 = at("http://127.0.0.1:8082", UpstreamProtocol::Http1);
        assert_eq!(routes(&http1), [Route::Http1; 3]);
        let Err(SendError::Unsupported(why)) = http1.route(true, true) else { panic!("gRPC over HTTP/1.1") };
        assert!(why.contains("--upstream-protocol http1"), "{why}");
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.crt");
        let now = std::time::SystemTime::now();
        let minted = keyward_certs::pki::Ca::mint("upstream CA", now, std::time::Duration::from_secs(3600)).unwrap();
        std::fs::write(&ca, minted.cert_pem()).unwrap();
        let tls = Upstream::new(
            "https://api:8443",
            UpstreamTls { ca: Some(&ca), server_name: None },
            UpstreamProtocol::Auto,
            WAIT,
        )
        .unwrap();
        assert_eq!(tls.route(true, true).unwrap(), Route::Http2);
        assert_eq!(routes(&tls), [Route::Negotiated, Route::Http1, Route::Http1]);
        assert_eq!(
            Upstream::new("https://api:8443", UpstreamTls { ca: Some(&ca), server_name: None }, UpstreamProtocol::H2c, WAIT).err().unwrap(),
            "--upstream-protocol h2c: HTTP/2 over plain text, for an http:// upstream; an https:// upstream's protocol is chosen by ALPN (auto), or is HTTP/1.1 (http1)"
        );
    }
}
