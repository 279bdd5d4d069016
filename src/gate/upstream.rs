//! The upstream the gate forwards allowed requests to: plain text over loopback (a sidecar in
//! the control plane's pod) or TLS, in the protocol the caller spoke: HTTP/2 (gRPC) as HTTP/2
//! (prior knowledge over plain text, ALPN over TLS), HTTP/1.1 as HTTP/1.1.

use std::path::Path;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, Uri, Version};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::held_h2::HeldCalls;

/// How long connecting to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle upstream connections kept per protocol.
const POOL_IDLE: usize = 64;

pub struct Upstream {
    scheme: Scheme,
    authority: Authority,
    h1: Client<HttpsConnector<HttpConnector>, Body>,
    h2: Client<HttpsConnector<HttpConnector>, Body>,
    /// HTTP/2 calls whose body the gate holds: HEADERS and DATA in one write.
    held_h2: HeldCalls,
}

/// The body of a request to forward.
pub enum Outgoing {
    /// Read whole by the gate (a gRPC message a rule read).
    Held(Bytes),
    /// Passed on as it arrives.
    Streamed(Body),
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority)
    }
}

impl Upstream {
    /// `url`: `http://127.0.0.1:8082` or `https://HOST:PORT` (then `ca` verifies it); no path.
    pub fn new(url: &str, ca: Option<&Path>) -> Result<Self, String> {
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
        let h1 = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls()?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http());
        let h2 = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls()?)
            .https_or_http()
            .enable_http2()
            .wrap_connector(http());
        let held_h2 = HeldCalls::new(uri.clone(), h2.clone());
        Ok(Self {
            scheme,
            authority,
            held_h2,
            h1: Client::builder(TokioExecutor::new()).pool_max_idle_per_host(POOL_IDLE).build(h1),
            h2: Client::builder(TokioExecutor::new()).http2_only(true).pool_max_idle_per_host(POOL_IDLE).build(h2),
        })
    }

    /// Sends the request (`parts`, its headers already the gate's, and `body`) to the
    /// upstream, in the protocol it came in, and returns the upstream's response with its
    /// hop-by-hop headers removed.
    pub async fn send(&self, mut parts: http::request::Parts, body: Outgoing) -> Result<http::Response<Body>, String> {
        let path = parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        parts.uri = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|e| format!("cannot address the upstream: {e}"))?;
        strip_hop_by_hop(&mut parts.headers);
        let h2 = parts.version == Version::HTTP_2;
        let mut response = match (h2, body) {
            (true, Outgoing::Held(bytes)) => {
                self.held_h2.send(http::Request::from_parts(parts, ()), bytes).await?.map(Body::new)
            }
            (true, Outgoing::Streamed(body)) => {
                self.h2.request(http::Request::from_parts(parts, body)).await.map_err(|e| describe(&e))?.map(Body::new)
            }
            (false, body) => {
                parts.version = Version::HTTP_11;
                let body = match body {
                    Outgoing::Held(bytes) => Body::from(bytes),
                    Outgoing::Streamed(body) => body,
                };
                self.h1.request(http::Request::from_parts(parts, body)).await.map_err(|e| describe(&e))?.map(Body::new)
            }
        };
        strip_hop_by_hop(response.headers_mut());
        Ok(response)
    }
}

/// The headers of one connection, not of the request (RFC 9110 7.6.1), and those the
/// `Connection` header names. `TE: trailers` is kept: gRPC needs it end to end.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        if name != http::header::TE {
            headers.remove(name);
        }
    }
    for name in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
    ] {
        headers.remove(name);
    }
    let trailers_only =
        headers.get_all(http::header::TE).iter().all(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    if !trailers_only {
        headers.remove(http::header::TE);
    }
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

    #[test]
    fn the_upstream_is_a_scheme_host_and_port_and_nothing_else() {
        assert!(Upstream::new("http://127.0.0.1:8082", None).is_ok());
        assert_eq!(
            Upstream::new("http://127.0.0.1:8082/api", None).unwrap_err(),
            "--upstream \"http://127.0.0.1:8082/api\": no path; requests are forwarded with their own path, unchanged"
        );
        assert_eq!(
            Upstream::new("127.0.0.1:8082", None).unwrap_err(),
            "--upstream \"127.0.0.1:8082\": give scheme, host and port, as http://127.0.0.1:8082"
        );
        assert_eq!(
            Upstream::new("http://localhost", None).unwrap_err(),
            "--upstream \"http://localhost\": give the port, as http://127.0.0.1:8082"
        );
        assert_eq!(
            Upstream::new("https://api:8443", None).unwrap_err(),
            "--upstream https://…: give --upstream-ca, the CA that signed the upstream's certificate"
        );
        assert!(Upstream::new("ftp://x:1", None).unwrap_err().contains("scheme \"ftp\""));
    }

    #[test]
    fn hop_by_hop_headers_go_and_te_trailers_stays() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive, x-secret".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("te", "trailers".parse().unwrap());
        h.insert("content-type", "application/grpc".parse().unwrap());
        strip_hop_by_hop(&mut h);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "te"]);
        h.insert("te", "gzip".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert!(h.get("te").is_none());
    }
}
