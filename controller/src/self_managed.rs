//! The self-managed serving certificate, against the API: reads the Secret and the webhook
//! configuration, asks [`crate::serving::plan`] what they should hold, and writes it, only as
//! the leader, in the order that never leaves the apiserver distrusting a served leaf.
//!
//! Whether every replica serves the current leaf (before the previous CA leaves `caBundle`) is
//! asked of the replicas themselves: a TLS handshake with each ready endpoint of the webhook's
//! Service, trusting only the current CA.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::ByteString;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;

use crate::error::Error;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::objects::{self, is_managed, Scope};
use crate::queue::Outcome;
use crate::serving::{self, Change, Observed, Plan};

/// When `ca-next` was introduced (RFC 3339), on the Secret.
pub const NEXT_SINCE: &str = "keyward.io/ca-next-since";

/// `--serving-cert self-managed`: where the certificate lives and who trusts it.
#[derive(Debug, Clone)]
pub struct SelfManaged {
    /// The Secret in keyward's namespace (`ca.crt`, `ca.key`, `tls.crt`, `tls.key`).
    pub secret: String,
    /// The MutatingWebhookConfiguration whose `caBundle` trusts it.
    pub webhook_config: String,
    /// The webhook's Service in keyward's namespace (its names are the leaf's; its endpoints
    /// are the replicas asked what they serve).
    pub service: String,
    pub certs: serving::Settings,
}

impl SelfManaged {
    pub fn new(secret: &str, webhook_config: &str, service: &str, namespace: &str) -> Self {
        Self {
            secret: secret.into(),
            webhook_config: webhook_config.into(),
            service: service.into(),
            certs: serving::Settings::for_service(service, namespace),
        }
    }
}

/// One pass: read, plan, write. Returns when to look again.
pub async fn reconcile(
    client: &Client,
    leader: &Leadership,
    metrics: &Metrics,
    namespace: &str,
    settings: &SelfManaged,
) -> Result<Outcome, Error> {
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let configs = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let what = format!("Secret {namespace}/{}", settings.secret);
    let existing = secrets.get_opt(&settings.secret).await?;
    if let Some(secret) = &existing {
        if !is_managed(&secret.metadata) {
            return Err(Error::Source {
                what,
                reason: "exists and is not managed by keyward (no label app.kubernetes.io/managed-by=keyward); remove it, label it to hand it to keyward, or name another with --serving-secret".into(),
            });
        }
    }
    let Some(config) = configs.get_opt(&settings.webhook_config).await? else {
        return Err(Error::Source {
            what: format!("MutatingWebhookConfiguration {}", settings.webhook_config),
            reason: "not found: install keyward's webhook configuration, or name it with --webhook-config".into(),
        });
    };
    let webhooks = config.webhooks.as_deref().unwrap_or_default();
    let bundle =
        webhooks.first().and_then(|w| w.client_config.ca_bundle.as_ref()).map(|b| b.0.clone()).unwrap_or_default();

    let files = existing.as_ref().map(files_of).unwrap_or_default();
    let next_since = existing
        .as_ref()
        .and_then(|s| s.metadata.annotations.as_ref()?.get(NEXT_SINCE).cloned())
        .and_then(|t| time::OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339).ok())
        .map(SystemTime::from);
    let replicas_serve_current = match (files.contains_key(serving::CA_PREVIOUS_CRT), files.get(serving::CA_CRT)) {
        (true, Some(ca)) => replicas_serve(client, namespace, settings, ca).await,
        _ => false,
    };
    let annotated = |key: &str| {
        existing.as_ref().and_then(|s| s.metadata.annotations.as_ref()).is_some_and(|a| a.contains_key(key))
    };
    let observed = Observed {
        files,
        next_since,
        bundle,
        replicas_serve_current,
        renew_requested: annotated(serving::RENEW),
        rotate_requested: annotated(serving::ROTATE_CA),
    };
    let now = SystemTime::now();
    let plan = serving::plan(&settings.certs, &observed, now)?;
    for change in &plan.changes {
        match change {
            Change::Created { replaced: Some(_) } | Change::Dropped { .. } => {
                tracing::warn!(secret = %what, "{}", change.describe());
            }
            _ => tracing::info!(secret = %what, "{}", change.describe()),
        }
        metrics.serving_change(change.as_str());
    }

    let bundle_ok =
        webhooks.iter().all(|w| w.client_config.ca_bundle.as_ref().map(|b| &b.0[..]) == Some(plan.bundle.as_bytes()));
    if plan.bundle_first && !bundle_ok {
        patch_bundle(&configs, leader, &config, &plan).await?;
    }
    if let Some(files) = &plan.files {
        leader.check()?;
        match write_secret(&secrets, namespace, &settings.secret, existing.as_ref(), files, &plan).await {
            Ok(()) => {}
            // Someone wrote it meanwhile: decide again on what is there now.
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => {
                return Ok(Outcome::At(tokio::time::Instant::now()));
            }
            Err(e) => return Err(e.into()),
        }
    }
    if !plan.bundle_first && !bundle_ok {
        patch_bundle(&configs, leader, &config, &plan).await?;
    }
    if plan.files.is_none() && !bundle_ok {
        tracing::warn!(
            config = %settings.webhook_config,
            "the webhook's caBundle was missing or not the serving CA (re-applied by GitOps or by hand?); restored"
        );
        metrics.serving_change("ca-bundle-repaired");
    }

    let current = plan.files.as_ref().unwrap_or(&observed.files);
    for (label, file) in [("leaf", serving::TLS_CRT), ("ca", serving::CA_CRT)] {
        if let Some(info) = current.get(file).and_then(|pem| keyward_certs::pem::cert_info(pem, file.as_ref()).ok()) {
            let at = info.not_after.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
            metrics.set_serving_expiry(label, i64::try_from(at).unwrap_or(i64::MAX));
        }
    }
    let wait = plan.next.duration_since(now).unwrap_or_default().max(Duration::from_secs(1));
    Ok(Outcome::At(tokio::time::Instant::now() + wait))
}

async fn write_secret(
    api: &Api<Secret>,
    namespace: &str,
    name: &str,
    existing: Option<&Secret>,
    files: &BTreeMap<String, Vec<u8>>,
    plan: &Plan,
) -> Result<(), kube::Error> {
    let annotations = plan.next_since.map(|t| {
        let t = time::OffsetDateTime::from(t);
        BTreeMap::from([(
            NEXT_SINCE.to_string(),
            t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
        )])
    });
    put(api, name, existing, tls_secret(namespace, name, annotations, files)).await
}

/// A Secret's data, as files.
fn files_of(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    secret.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect()
}

/// A `kubernetes.io/tls` Secret keyward manages, holding `files`.
fn tls_secret(
    namespace: &str,
    name: &str,
    annotations: Option<BTreeMap<String, String>>,
    files: &BTreeMap<String, Vec<u8>>,
) -> Secret {
    let mut metadata = objects::meta(namespace, name, None, Scope::Serving, None);
    metadata.annotations = annotations;
    let data = files.iter().map(|(k, v)| (k.clone(), ByteString(v.clone()))).collect();
    Secret { metadata, type_: Some("kubernetes.io/tls".into()), data: Some(data), ..Secret::default() }
}

/// Creates `secret`, or replaces `existing` with it whole, at the version read: keys no longer
/// wanted go, and a write by anyone else in between is a conflict, never overwritten.
async fn put(api: &Api<Secret>, name: &str, existing: Option<&Secret>, mut secret: Secret) -> Result<(), kube::Error> {
    match existing {
        None => api.create(&PostParams::default(), &secret).await.map(|_| ()),
        Some(current) => {
            secret.metadata.resource_version = current.metadata.resource_version.clone();
            api.replace(name, &PostParams::default(), &secret).await.map(|_| ())
        }
    }
}

/// The client CA's Secret (`tls.crt`, `tls.key`, `ca.crt`), when keyward makes it: made when
/// missing, made again when it cannot sign. One keyward does not manage (an admin's,
/// cert-manager's) is used as it is. Not rotated: a client CA is trusted by control planes
/// outside keyward's reach (see docs/install.md).
pub async fn client_ca(
    client: &Client,
    leader: &Leadership,
    metrics: &Metrics,
    namespace: &str,
    name: &str,
    validity: Duration,
) -> Result<(), Error> {
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    let existing = api.get_opt(name).await?;
    let problem = match &existing {
        None => None,
        Some(secret) if !is_managed(&secret.metadata) => return Ok(()),
        Some(secret) => {
            match serving::ca_pair(&files_of(secret), serving::TLS_CRT, serving::TLS_KEY, SystemTime::now()) {
                Ok(_) => return Ok(()),
                Err(why) => Some(why),
            }
        }
    };
    let ca = keyward_certs::pki::Ca::mint(&format!("keyward client CA ({namespace})"), SystemTime::now(), validity)?;
    let files = BTreeMap::from([
        (serving::TLS_CRT.to_string(), ca.cert_pem().as_bytes().to_vec()),
        (serving::TLS_KEY.to_string(), ca.key_pem().into_bytes()),
        (serving::CA_CRT.to_string(), ca.cert_pem().as_bytes().to_vec()),
    ]);
    leader.check()?;
    match put(&api, name, existing.as_ref(), tls_secret(namespace, name, None, &files)).await {
        Ok(()) => {}
        // Written by someone else meanwhile: read again at the next pass.
        Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    match problem {
        None => tracing::info!(secret = %format!("{namespace}/{name}"), "client CA created"),
        Some(why) => {
            tracing::warn!(secret = %format!("{namespace}/{name}"), reason = %why, "client CA replaced: it could not sign; client certificates it issued are renewed with the new one")
        }
    }
    metrics.serving_change("client-ca-created");
    Ok(())
}

/// Sets `caBundle` on every webhook of the configuration: a JSON patch that tests each
/// webhook's name at its index, so a configuration reordered meanwhile is refused, not
/// mis-patched.
async fn patch_bundle(
    api: &Api<MutatingWebhookConfiguration>,
    leader: &Leadership,
    config: &MutatingWebhookConfiguration,
    plan: &Plan,
) -> Result<(), Error> {
    let encoded = base64::engine::general_purpose::STANDARD.encode(plan.bundle.as_bytes());
    let mut ops = Vec::new();
    for (i, webhook) in config.webhooks.iter().flatten().enumerate() {
        ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": webhook.name}));
        ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": encoded}));
    }
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|e| Error::Malformed(format!("a caBundle patch: {e}")))?;
    leader.check()?;
    let name = config.metadata.name.clone().unwrap_or_default();
    api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch)).await?;
    Ok(())
}

/// Whether every ready endpoint of the webhook's Service serves a leaf that a client trusting
/// only `ca_pem` accepts. No endpoint at all: nothing is served, so nothing old is.
async fn replicas_serve(client: &Client, namespace: &str, settings: &SelfManaged, ca_pem: &[u8]) -> bool {
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), namespace);
    let selector = format!("kubernetes.io/service-name={}", settings.service);
    let Ok(list) = slices.list(&ListParams::default().labels(&selector)).await else {
        return false;
    };
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(ca_pem).filter_map(Result::ok) {
        if roots.add(der).is_err() {
            return false;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let Ok(config) = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth())
    else {
        return false;
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let Some(name) = settings.certs.names.first().and_then(|n| ServerName::try_from(n.clone()).ok()) else {
        return false;
    };
    for slice in list.items {
        let port = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("https"))
            .or_else(|| slice.ports.iter().flatten().next())
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok());
        let Some(port) = port else { continue };
        for endpoint in &slice.endpoints {
            if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            for address in &endpoint.addresses {
                let Ok(ip) = address.parse::<std::net::IpAddr>() else { return false };
                let addr = SocketAddr::new(ip, port);
                let handshake = async {
                    let tcp = tokio::net::TcpStream::connect(addr).await?;
                    connector.connect(name.clone(), tcp).await
                };
                match tokio::time::timeout(Duration::from_secs(5), handshake).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        tracing::info!(endpoint = %addr, error = %e, "a webhook replica does not serve a certificate of the current serving CA yet");
                        return false;
                    }
                    Err(_) => {
                        tracing::info!(endpoint = %addr, "a webhook replica did not complete a TLS handshake in 5 s");
                        return false;
                    }
                }
            }
        }
    }
    true
}
