//! What `keyward audit` reads from the cluster, read-only: pods in pages (examined page by
//! page, so memory follows the findings, not the pods), the namespaces, the webhook
//! configuration, then each object the injected pods depend on, once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use keyward_engine::inject::ObjectKind;
use keyward_engine::ProfileSet;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::{Api, Client};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::Value;

use super::findings::{
    self, CertificateTimes, Dependency, Examined, Finding, Kind, Lookups, NamespaceFacts, OwnerRef, RequestState,
};

/// Pods per LIST page (the apiserver's default chunk size for kubectl).
pub const PAGE: u32 = 500;

/// Where to look.
#[derive(Debug, Clone)]
pub struct Scope {
    /// `None`: every namespace (`-A`).
    pub namespace: Option<String>,
    pub webhook_config: String,
    /// keyward's namespace and Service (for the configuration it generates).
    pub keyward_namespace: String,
    pub service: String,
    /// Read client certificates and the serving Secret (`--no-secrets` turns it off).
    pub secrets: bool,
    /// The Secret (in keyward's namespace) holding the webhook's serving certificate.
    pub serving_secret: String,
    /// The controller's Deployment and Lease (in keyward's namespace).
    pub controller: String,
}

/// What was read and found.
#[derive(Debug, Default)]
pub struct Gathered {
    pub findings: Vec<Finding>,
    pub pods_listed: usize,
    pub pods_audited: usize,
    pub namespaces: BTreeSet<String>,
    pub pages: usize,
    pub notes: Vec<String>,
}

/// Reading failed: which request, and the API's answer.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("forbidden: {what}; keyward audit needs the read-only ClusterRole in deploy/audit/rbac.yaml (bound to you), or at least that permission")]
    Forbidden { what: String },
    #[error("{what}: {source}")]
    Api { what: String, source: kube::Error },
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> AuditError {
    let what = what.into();
    move |source| match &source {
        kube::Error::Api(s) if s.code == 403 => AuditError::Forbidden { what },
        _ => AuditError::Api { what, source },
    }
}

pub async fn gather(
    client: &Client,
    scope: &Scope,
    profiles: &ProfileSet,
    now: SystemTime,
    warning: Option<std::time::Duration>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Gathered, AuditError> {
    let mut out = Gathered::default();
    let where_ = scope.namespace.as_deref().map_or("in any namespace".to_string(), |n| format!("in namespace {n}"));

    // The webhook configuration: compared with what the profiles generate, and its age.
    let configs = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let config = configs
        .get_opt(&scope.webhook_config)
        .await
        .map_err(api_error(format!("get mutatingwebhookconfigurations/{}", scope.webhook_config)))?;
    let installed = config.as_ref().and_then(|c| c.metadata.creation_timestamp.as_ref()).map(|t| t.0.to_string());
    out.findings.extend(check_config(config.as_ref(), scope, profiles));
    out.findings.extend(check_install(client, scope, config.as_ref(), now, &mut out.notes).await?);
    // Where keyward signs pod certificates: who else may ask for them.
    if !keyward_controller::signer::signers(profiles).is_empty() {
        out.findings.extend(check_requesters(client, &mut out.notes).await?);
    }

    // The namespaces (their opt-in label).
    let namespaces: BTreeMap<String, NamespaceFacts> = match &scope.namespace {
        Some(ns) => {
            let api = Api::<Namespace>::all(client.clone());
            let found = api.get_opt(ns).await.map_err(api_error(format!("get namespaces/{ns}")))?;
            found.into_iter().map(|n| (ns.clone(), facts_of(&n))).collect()
        }
        None => {
            let api = Api::<Namespace>::all(client.clone());
            let mut all = BTreeMap::new();
            let mut params = ListParams::default().limit(PAGE);
            loop {
                let page = api.list(&params).await.map_err(api_error("list namespaces"))?;
                for n in &page.items {
                    all.insert(n.metadata.name.clone().unwrap_or_default(), facts_of(n));
                }
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => break,
                }
            }
            all
        }
    };

    // The pods, a page at a time.
    // Untyped, as the apiserver sends them: a field newer than this build's Kubernetes types
    // (a `podCertificate` volume) must reach the engine, or the pod looks changed.
    let pod_resource = keyward_controller::objects::pod_resource();
    let pods = match &scope.namespace {
        Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &pod_resource),
        None => Api::<DynamicObject>::all_with(client.clone(), &pod_resource),
    };
    let mut examined: Vec<Examined> = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = pods.list(&params).await.map_err(api_error(format!("list pods {where_}")))?;
        out.pages += 1;
        for pod in &page.items {
            out.pods_listed += 1;
            let Ok(value) = serde_json::to_value(pod) else { continue };
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let e = findings::examine(&value, &ns, namespaces.get(&ns), profiles, installed.as_deref());
            if e.relevant {
                out.pods_audited += 1;
                out.namespaces.insert(ns);
                examined.push(e);
            }
        }
        progress(out.pods_listed, out.pages);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }

    // Each dependency, certificate and owner once, a few requests at a time (as kubectl
    // does not: a cluster of 100,000 pods has thousands of them).
    let mut lookups = Lookups::default();
    if scope.secrets {
        let certificates: BTreeSet<Dependency> = examined.iter().filter_map(|e| e.certificate.clone()).collect();
        let read: Vec<_> = futures::stream::iter(certificates)
            .map(|c| async move {
                let read = certificate(client, &c).await;
                (c, read)
            })
            .buffer_unordered(LOOKUPS_AT_ONCE)
            .collect()
            .await;
        for (c, read) in read {
            // Read once: it also says whether the Secret exists.
            let (exists, times) = read?;
            lookups.exists.insert(c.clone(), exists);
            lookups.certificates.insert(c, times);
        }
    }
    let dependencies: BTreeSet<Dependency> = examined
        .iter()
        .flat_map(|e| e.dependencies.iter().cloned())
        .filter(|d| !lookups.exists.contains_key(d) && (scope.secrets || d.kind != ObjectKind::Secret))
        .collect();
    let read: Vec<_> = futures::stream::iter(dependencies)
        .map(|d| async move {
            let read = exists(client, &d).await;
            (d, read)
        })
        .buffer_unordered(LOOKUPS_AT_ONCE)
        .collect()
        .await;
    for (d, read) in read {
        lookups.exists.insert(d, read?);
    }
    if !scope.secrets {
        out.notes.push(
            "--no-secrets: Secrets were not read, so missing Secrets and expiring client certificates are not reported"
                .into(),
        );
    }
    // The PodCertificateRequests of namespaces where pods wait for a pod certificate.
    let waiting: BTreeSet<String> =
        examined.iter().filter(|e| e.awaiting.is_some()).map(|e| e.namespace().to_string()).collect();
    if !waiting.is_empty() {
        read_requests(client, &waiting, &mut lookups, &mut out.notes).await?;
    }
    let owners: BTreeSet<OwnerRef> = examined.iter().filter_map(|e| e.owner.clone()).collect();
    // Each owner kind's resource, from discovery (a CRD names its plural as it likes).
    let mut resources: BTreeMap<(String, String), Option<ApiResource>> = BTreeMap::new();
    let kinds: BTreeSet<(String, String)> = owners.iter().map(|o| (o.api_version.clone(), o.kind.clone())).collect();
    for (api_version, kind) in kinds {
        let resource = owner_resource(client, &api_version, &kind).await?;
        resources.insert((api_version, kind), resource);
    }
    let resources = &resources;
    let read: Vec<_> = futures::stream::iter(owners)
        .map(|o| async move {
            let read = match resources.get(&(o.api_version.clone(), o.kind.clone())) {
                Some(Some(resource)) => owner_uid(client, &o, resource).await,
                // The kind is not served (its CRD is gone): no such owner can exist.
                _ => Ok(None),
            };
            (o, read)
        })
        .buffer_unordered(LOOKUPS_AT_ONCE)
        .collect()
        .await;
    for (o, read) in read {
        lookups.owners.insert(o, read?);
    }

    for e in examined {
        out.findings.extend(e.conclude(&lookups, now, warning));
    }
    out.findings.sort();
    Ok(out)
}

/// The latest PodCertificateRequest of each pod in `namespaces`, by pod UID, from the version
/// of the API the cluster serves (none: a note, and nothing to report per pod).
async fn read_requests(
    client: &Client,
    namespaces: &BTreeSet<String>,
    lookups: &mut Lookups,
    notes: &mut Vec<String>,
) -> Result<(), AuditError> {
    use keyward_controller::signer::{served_version, ApiVersion};
    let served = served_version(client, ApiVersion::PLURAL)
        .await
        .map_err(api_error(format!("get /apis/{}", ApiVersion::GROUP)))?;
    let Some(version) = served else {
        notes.push("pods wait for pod certificates, but the cluster serves no PodCertificateRequest API (Kubernetes 1.35 on; see the README, \"Pod certificates\")".into());
        return Ok(());
    };
    let resource = version.api_resource();
    let mut found = BTreeMap::new();
    for ns in namespaces {
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource);
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page =
                api.list(&params).await.map_err(api_error(format!("list podcertificaterequests in namespace {ns}")))?;
            for request in page.items {
                let uid = request.data["spec"]["podUID"].as_str().unwrap_or_default().to_string();
                let created = request.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
                let state = request_state(&request, &created);
                // The latest request of a pod tells (the kubelet asks again to refresh).
                let entry = found.entry((ns.clone(), uid)).or_insert((created.clone(), state.clone()));
                if created >= entry.0 {
                    *entry = (created, state);
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }
    lookups.requests = found.into_iter().map(|(k, (_, s))| (k, s)).collect();
    lookups.requests_read = true;
    Ok(())
}

fn request_state(request: &DynamicObject, created: &str) -> RequestState {
    let conditions = request.data["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let text = |c: &Value, f: &str| c[f].as_str().unwrap_or_default().to_string();
    match conditions.iter().find(|c| c["status"] == "True") {
        Some(c) if c["type"] == "Issued" => RequestState::Issued,
        Some(c) => RequestState::Denied { reason: text(c, "reason"), message: text(c, "message") },
        None => RequestState::Unanswered {
            name: request.metadata.name.clone().unwrap_or_default(),
            since: created.to_string(),
        },
    }
}

/// Lookups in flight at once: enough to hide round trips, few enough for any apiserver's
/// priority and fairness.
const LOOKUPS_AT_ONCE: usize = 8;

/// Who, besides the nodes, may create PodCertificateRequests (cluster findings). Without the
/// right to read RBAC: a note, and the rest of the audit goes on.
async fn check_requesters(client: &Client, notes: &mut Vec<String>) -> Result<Vec<Finding>, AuditError> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let read = async {
        Ok::<_, AuditError>(super::rbac::Rbac {
            cluster_roles: list_pages(Api::<ClusterRole>::all(client.clone()), "clusterroles").await?,
            roles: list_pages(Api::<Role>::all(client.clone()), "roles").await?,
            cluster_role_bindings: list_pages(Api::<ClusterRoleBinding>::all(client.clone()), "clusterrolebindings")
                .await?,
            role_bindings: list_pages(Api::<RoleBinding>::all(client.clone()), "rolebindings").await?,
        })
    };
    let rbac = match read.await {
        Ok(rbac) => rbac,
        Err(AuditError::Forbidden { what }) => {
            notes.push(format!("who may create PodCertificateRequests was not checked: forbidden to {what} (deploy/audit/rbac.yaml grants it)"));
            return Ok(Vec::new());
        }
        Err(e) => return Err(e),
    };
    Ok(super::rbac::pod_certificate_creators(&rbac)
        .into_iter()
        .map(|grant| Finding {
            namespace: String::new(),
            pod: String::new(),
            finding: Kind::CertificateRequesters,
            profile: None,
            detail: grant.detail(),
        })
        .collect())
}

/// Every object of `api`, a page at a time.
async fn list_pages<K>(api: Api<K>, plural: &str) -> Result<Vec<K>, AuditError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut all = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await.map_err(api_error(format!("list {plural}")))?;
        all.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(all),
        }
    }
}

/// Whether `d` exists now.
async fn exists(client: &Client, d: &Dependency) -> Result<bool, AuditError> {
    let what = match d.namespace.as_str() {
        "" => format!("get {}/{}", plural(d.kind), d.name),
        ns => format!("get {}/{} in namespace {ns}", plural(d.kind), d.name),
    };
    match d.kind {
        ObjectKind::Secret => {
            Api::<Secret>::namespaced(client.clone(), &d.namespace).get_opt(&d.name).await.map(|o| o.is_some())
        }
        ObjectKind::ConfigMap => {
            Api::<ConfigMap>::namespaced(client.clone(), &d.namespace).get_opt(&d.name).await.map(|o| o.is_some())
        }
        ObjectKind::ServiceAccount => {
            Api::<ServiceAccount>::namespaced(client.clone(), &d.namespace).get_opt(&d.name).await.map(|o| o.is_some())
        }
        // Cluster-wide, by name.
        ObjectKind::ClusterTrustBundle => keyward_controller::signer::trust_bundle_exists(client, &d.name).await,
        // Not an object (never made a dependency): nothing to look up.
        ObjectKind::Signer => Ok(true),
    }
    .map_err(api_error(what))
}

/// Whether the client certificate Secret `c` exists, and when its `tls.crt` is due for renewal
/// by the controller's rule and when it expires (`None`: unreadable).
async fn certificate(client: &Client, c: &Dependency) -> Result<(bool, Option<CertificateTimes>), AuditError> {
    let secret = Api::<Secret>::namespaced(client.clone(), &c.namespace)
        .get_opt(&c.name)
        .await
        .map_err(api_error(format!("get secrets/{} in namespace {}", c.name, c.namespace)))?;
    let exists = secret.is_some();
    let pem = secret.and_then(|s| s.data).and_then(|d| d.get("tls.crt").map(|b| b.0.clone()));
    let times = pem.and_then(|pem| keyward_certs::pem::cert_info(&pem, "tls.crt".as_ref()).ok()).map(|info| {
        CertificateTimes { renew_at: keyward_controller::identity::renewal_time(&info), not_after: info.not_after }
    });
    Ok((exists, times))
}

fn facts_of(n: &Namespace) -> NamespaceFacts {
    NamespaceFacts { labels: n.metadata.labels.clone().unwrap_or_default() }
}

fn plural(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::Secret => "secrets",
        ObjectKind::ConfigMap => "configmaps",
        ObjectKind::ServiceAccount => "serviceaccounts",
        ObjectKind::Signer => "signers",
        ObjectKind::ClusterTrustBundle => "clustertrustbundles",
    }
}

/// The resource of an owner's kind, from discovery; `None` when the cluster does not serve it.
async fn owner_resource(client: &Client, api_version: &str, kind: &str) -> Result<Option<ApiResource>, AuditError> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    match kube::discovery::pinned_kind(client, &gvk).await {
        Ok((resource, _)) => Ok(Some(resource)),
        Err(kube::Error::Discovery(_)) => Ok(None),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(api_error(format!("discover {kind} in {api_version}"))(e)),
    }
}

/// The owner's UID now, or `None` when it does not exist.
async fn owner_uid(client: &Client, o: &OwnerRef, resource: &ApiResource) -> Result<Option<String>, AuditError> {
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), &o.namespace, resource);
    let found = api
        .get_opt(&o.name)
        .await
        .map_err(api_error(format!("get {}/{} in namespace {}", resource.plural, o.name, o.namespace)))?;
    Ok(found.map(|d| d.metadata.uid.unwrap_or_default()))
}

/// The cluster's configuration against what the profiles generate: the fields that decide
/// which pods reach keyward and what happens when it is down.
fn check_config(config: Option<&MutatingWebhookConfiguration>, scope: &Scope, profiles: &ProfileSet) -> Vec<Finding> {
    let cluster = |detail: String| Finding {
        namespace: String::new(),
        pod: String::new(),
        finding: Kind::WebhookConfig,
        profile: None,
        detail,
    };
    let Some(config) = config else {
        return vec![cluster(format!(
            "the MutatingWebhookConfiguration {} does not exist: no pod is sent to keyward; apply the install (or keyward manifests webhook)",
            scope.webhook_config
        ))];
    };
    let options =
        crate::manifests::WebhookOptions { namespace: scope.keyward_namespace.clone(), service: scope.service.clone() };
    let wanted = crate::manifests::webhook(profiles, &options);
    let wanted = &wanted["webhooks"][0];
    let name = wanted["name"].as_str().unwrap_or_default();
    let Ok(actual) = serde_json::to_value(config) else { return Vec::new() };
    let Some(actual) = actual["webhooks"].as_array().and_then(|w| w.iter().find(|w| w["name"] == name)) else {
        return vec![cluster(format!(
            "the MutatingWebhookConfiguration {} has no webhook named {name}",
            scope.webhook_config
        ))];
    };
    let mut out = Vec::new();
    for field in ["rules", "namespaceSelector", "objectSelector", "failurePolicy", "sideEffects", "matchConditions"] {
        if normalized(&actual[field]) != normalized(&wanted[field]) {
            out.push(cluster(format!(
                "webhook {name} {field} differs from what the profiles generate: the cluster has {}, keyward manifests webhook gives {}",
                actual[field], wanted[field]
            )));
        }
    }
    out
}

/// keyward itself: both Deployments available, a controller leading, and a `caBundle` that
/// verifies the certificate the webhook serves (when the serving Secret can be read).
async fn check_install(
    client: &Client,
    scope: &Scope,
    config: Option<&MutatingWebhookConfiguration>,
    now: SystemTime,
    notes: &mut Vec<String>,
) -> Result<Vec<Finding>, AuditError> {
    let ns = &scope.keyward_namespace;
    let cluster = |finding: Kind, detail: String| Finding {
        namespace: String::new(),
        pod: String::new(),
        finding,
        profile: None,
        detail,
    };
    let mut out = Vec::new();
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
    for (role, name) in [("webhook", &scope.service), ("controller", &scope.controller)] {
        let found =
            deployments.get_opt(name).await.map_err(api_error(format!("get deployments/{name} in namespace {ns}")))?;
        let available =
            found.as_ref().and_then(|d| d.status.as_ref()).and_then(|s| s.conditions.as_ref()).and_then(|c| {
                c.iter()
                    .find(|c| c.type_ == "Available")
                    .map(|c| (c.status == "True", c.message.clone().unwrap_or_default()))
            });
        let problem = match (&found, available) {
            (None, _) => Some("does not exist".to_string()),
            (Some(_), None) => Some("reports no Available condition yet".to_string()),
            (Some(_), Some((false, message))) => Some(format!("is not available ({})", message.trim_end_matches('.'))),
            (Some(_), Some((true, _))) => None,
        };
        if let Some(problem) = problem {
            let what = if role == "webhook" {
                "with failurePolicy Fail, pods in opted-in namespaces that a profile selects cannot be created"
            } else {
                "nothing is issued or renewed"
            };
            out.push(cluster(
                Kind::DeploymentUnavailable,
                format!("keyward's {role} Deployment {ns}/{name} {problem}: {what}; kubectl -n {ns} describe deployment {name}"),
            ));
        }
    }

    let lease = Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(&scope.controller)
        .await
        .map_err(api_error(format!("get leases/{} in namespace {ns}", scope.controller)))?;
    let spec = lease.and_then(|l| l.spec);
    let holder = spec.as_ref().and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty());
    let until = spec.as_ref().and_then(|s| {
        let renewed: SystemTime = s.renew_time.as_ref()?.0.into();
        Some(renewed + std::time::Duration::from_secs(u64::try_from(s.lease_duration_seconds?).ok()?))
    });
    match (holder, until) {
        (Some(_), Some(until)) if until > now => {}
        (Some(holder), _) => out.push(cluster(
            Kind::NoLeader,
            format!("the controller's Lease {ns}/{} was last renewed by {holder:?} and has lapsed: no replica leads, nothing is issued or renewed; see the controller's logs", scope.controller),
        )),
        (None, _) => out.push(cluster(
            Kind::NoLeader,
            format!("no replica holds the controller's Lease {ns}/{}: nothing is issued or renewed; see the controller's logs", scope.controller),
        )),
    }

    let Some(config) = config else { return Ok(out) };
    if !scope.secrets {
        return Ok(out);
    }
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(&scope.serving_secret)
        .await
        .map_err(api_error(format!("get secrets/{} in namespace {ns}", scope.serving_secret)))?;
    let Some(leaf) = secret.and_then(|s| s.data).and_then(|d| d.get("tls.crt").map(|b| b.0.clone())) else {
        notes.push(format!("the serving Secret {ns}/{} has no tls.crt (or does not exist: give --serving-secret): caBundle was not checked", scope.serving_secret));
        return Ok(out);
    };
    let name = format!("{}.{ns}.svc", scope.service);
    for webhook in config.webhooks.iter().flatten() {
        let bundle = webhook.client_config.ca_bundle.as_ref().map(|b| b.0.clone()).unwrap_or_default();
        let roots: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(&bundle).filter_map(Result::ok).collect();
        let chain: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(&leaf).filter_map(Result::ok).collect();
        let problem = if roots.is_empty() {
            Some("is empty (or holds no certificate)".to_string())
        } else {
            keyward_certs::inspect::accepted_as_server(&chain, &roots, &name, now).err().map(|e| {
                format!("does not verify the certificate in Secret {ns}/{} as {name}: {e}", scope.serving_secret)
            })
        };
        if let Some(problem) = problem {
            out.push(cluster(
                Kind::CaBundle,
                format!("webhook {}'s caBundle {problem}: the apiserver cannot call keyward; with cert-manager, kubectl -n {ns} describe certificate; self-managed, the controller's logs", webhook.name),
            ));
        }
    }
    Ok(out)
}

/// Absent and empty are the same to the apiserver.
fn normalized(v: &Value) -> Value {
    match v {
        Value::Object(m) if m.is_empty() => Value::Null,
        other => other.clone(),
    }
}
