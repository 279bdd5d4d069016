//! The shared layer under the controllers: the [`Context`] each reconcile function gets (the
//! client, the settings, the profiles, the metrics, the leadership, the watched stores and what
//! was remembered), and what every controller writes through.
//!
//! - Every write is preceded by the leadership check (a deadline on the local clock).
//! - No object without keyward's `managed-by` label is ever changed or deleted: a name taken by
//!   someone else's object is reported (an Event, a log line, a metric) and left alone.
//! - An identity is issued only on verified facts: the pod's admission attestation (or, for an
//!   owner issued before attestations existed, a certificate keyward itself signed), and the
//!   owner existing *now* with the UID the pod names ([`Context::owner_verified`]).
//! - What keyward wrote is remembered, so an owner whose certificate is fresh costs no request.
//!
//! The controllers ([`crate::namespaces`], [`crate::owners`], [`crate::trust`],
//! [`crate::singletons`], [`crate::signing`]) use this layer and never each other, but for the
//! trust publication reading the server CA sources this layer keeps.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::NamespaceResourceScope;
use keyward_certs::attestation::Keys;
use keyward_certs::pki::Ca;
use keyward_certs::CertStore;
use keyward_engine::ProfileSet;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::attestation::Sibling;
use crate::conditions::Conditions;
use crate::desired::{Desired, Owner, PodClaim, SourceKey};
use crate::error::Error;
use crate::index::OwnerKey;
use crate::leader::Leadership;
use crate::metrics::{Action, Metrics, Refusal};
use crate::objects::is_managed;
use crate::queue::Outcome;

/// The controller's settings (from `keyward controller`'s flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// SPIFFE trust domain of client certificate identities.
    pub trust_domain: String,
    /// How long a client certificate is valid; renewed at two thirds.
    pub client_cert_validity: Duration,
    /// `--operator-namespace PROFILE=NS`: where a CA source without a namespace lives.
    pub operator_namespaces: BTreeMap<String, String>,
    /// The ConfigMap the client CA certificate is published as.
    pub client_ca_config_map: String,
    /// The namespaces it is published to.
    pub publish_client_ca_to: Vec<String>,
    /// keyward's own namespace: the attestation key Secret lives there.
    pub namespace: String,
    /// The Secret holding the attestation keys.
    pub attestation_secret: String,
    /// How often the attestation key is replaced (the previous one stays valid a period more).
    pub attestation_rotation: Duration,
    /// `--serving-cert self-managed`: keyward makes the webhook's serving certificate and
    /// keeps `caBundle` trusting it.
    pub serving: Option<crate::self_managed::SelfManaged>,
    /// `--client-ca self-managed`: keyward makes the client CA in this Secret (in `namespace`).
    pub client_ca_secret: Option<String>,
    /// The MutatingWebhookConfiguration whose `matchConditions` keyward keeps equal to the
    /// profiles (`None`: `--webhook-match-conditions external`).
    pub match_conditions_of: Option<String>,
    /// The versions of `certificates.k8s.io` keyward watches and signs PodCertificateRequests
    /// at, the one the cluster facts name first: v1, v1beta1, or (where a cluster serves both,
    /// and `--pod-certificates auto`) both. Empty: the cluster serves none, and keyward signs
    /// nothing.
    pub pod_certificates: Vec<crate::signer::ApiVersion>,
    /// The version that serves ClusterTrustBundles (`None`: none is published).
    pub trust_bundles: Option<crate::signer::ApiVersion>,
    /// `--provision-accounts`: keyward creates the ServiceAccounts (and their RoleBindings)
    /// that profiles provide. Off, it neither watches nor sweeps them, and needs no rights on
    /// them (a set that provides one is refused at load).
    pub provision_accounts: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            trust_domain: "cluster.local".into(),
            client_cert_validity: Duration::from_secs(24 * 3600),
            operator_namespaces: BTreeMap::new(),
            client_ca_config_map: "keyward-client-ca".into(),
            publish_client_ca_to: Vec::new(),
            namespace: "keyward-system".into(),
            attestation_secret: "keyward-attestation".into(),
            attestation_rotation: Duration::from_secs(7 * 24 * 3600),
            serving: None,
            client_ca_secret: None,
            match_conditions_of: None,
            pod_certificates: Vec::new(),
            trust_bundles: None,
            provision_accounts: false,
        }
    }
}

/// The watched objects keyward manages per namespace (label `managed-by=keyward`), so that
/// reconciling a namespace reads memory, not the API.
#[derive(Clone)]
pub struct Stores {
    pub config_maps: Store<ConfigMap>,
    pub service_accounts: Store<ServiceAccount>,
    pub role_bindings: Store<RoleBinding>,
}

/// What keyward last wrote (or read) of a per-owner Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Memo {
    pub(crate) resource_version: String,
    pub(crate) owner_uid: String,
    /// For a certificate: when to renew, and the client CA it was issued with.
    pub(crate) renew_at: Option<SystemTime>,
    pub(crate) ca_sha: String,
    /// A new pod of the owner arrived: read the Secret before trusting this again.
    pub(crate) stale: bool,
    /// When the certificate expires.
    pub(crate) not_after: Option<SystemTime>,
}

/// The pods of an owner as the pod watches hold them, each with whether its attestation holds
/// under the keys given; `None` until every pod watch has listed once (a pod missing then may
/// only not have arrived yet).
pub type OwnerPods<'a> = dyn Fn(&OwnerKey, &Keys) -> Option<Vec<Sibling>> + Sync + 'a;

/// How one owner's reconcile ended, for the queue.
pub(crate) type OwnerResult = Result<Outcome, Error>;

pub struct Context {
    pub(crate) client: Client,
    pub(crate) profiles: Arc<ProfileSet>,
    pub(crate) settings: Settings,
    pub(crate) client_ca: Arc<CertStore>,
    pub(crate) leader: Leadership,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) recorder: Recorder,
    pub(crate) conditions: Conditions,
    pub(crate) stores: Mutex<Option<Stores>>,
    pub(crate) memo: Mutex<HashMap<(String, String), Memo>>,
    pub(crate) keys: ArcSwap<Option<Keys>>,
    /// The server CA sources, as last read and checked (only CA certificates).
    pub(crate) sources: Mutex<HashMap<SourceKey, Result<String, String>>>,
    /// Pods (by UID) and owners already reported as refused, so each is reported once.
    pub(crate) reported: Mutex<HashSet<(String, Refusal)>>,
}

impl Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// Whether two objects of a kind hold the same content (metadata aside).
pub(crate) type Same<K> = fn(&K, &K) -> bool;

impl Context {
    pub fn new(
        client: Client,
        profiles: Arc<ProfileSet>,
        settings: Settings,
        client_ca: Arc<CertStore>,
        leader: Leadership,
        metrics: Arc<Metrics>,
        instance: String,
    ) -> Self {
        let reporter = kube::runtime::events::Reporter { controller: "keyward".into(), instance: Some(instance) };
        let recorder = Recorder::new(client.clone(), reporter);
        // `delivery: auto` is what this controller signs, whatever the set was resolved with.
        let facts = crate::signer::cluster_facts(settings.pod_certificates.first().copied());
        let profiles =
            if profiles.facts() == facts { profiles } else { Arc::new(ProfileSet::clone(&profiles).resolved(facts)) };
        Self {
            client,
            profiles,
            settings,
            client_ca,
            leader,
            metrics,
            recorder,
            conditions: Conditions::default(),
            stores: Mutex::new(None),
            memo: Mutex::new(HashMap::new()),
            keys: ArcSwap::from_pointee(None),
            sources: Mutex::new(HashMap::new()),
            reported: Mutex::new(HashSet::new()),
        }
    }

    pub fn profiles(&self) -> &ProfileSet {
        &self.profiles
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The client CA it issues with (hot-reloaded).
    pub fn client_ca(&self) -> &Arc<CertStore> {
        &self.client_ca
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn leader(&self) -> &Leadership {
        &self.leader
    }

    /// The conditions in force (see [`crate::conditions`]).
    pub fn conditions(&self) -> &Conditions {
        &self.conditions
    }

    /// From now on, per-namespace objects are read from these watched stores.
    pub fn use_stores(&self, stores: Stores) {
        *lock(&self.stores) = Some(stores);
    }

    /// Forgets what it remembers of the Secrets it wrote (it stopped leading: another replica
    /// may write them meanwhile).
    pub fn forget(&self) {
        lock(&self.memo).clear();
        lock(&self.sources).clear();
    }

    /// A new pod of an owner arrived: what is remembered of its Secrets is read again before
    /// it is trusted (a deleted Secret is made again for the new pod; one request).
    pub fn recheck(&self, claim: &PodClaim) {
        let mut memo = lock(&self.memo);
        for d in &claim.wants {
            if let Some(m) = memo.get_mut(&(d.namespace.clone(), d.name.clone())) {
                m.stale = true;
            }
        }
    }

    /// Sets the time to the soonest expiry among the certificates keyward wrote or read (once
    /// per resync: it walks them all).
    pub fn report_expiry(&self) {
        let soonest = lock(&self.memo).values().filter_map(|m| m.not_after).min();
        if let Some(at) = soonest {
            let seconds =
                at.duration_since(SystemTime::now()).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
            self.metrics.set_next_expiry(seconds);
        }
    }

    /// The attestation keys, when loaded (the leader reads and rotates them).
    pub fn attestation_keys(&self) -> Option<Keys> {
        (**self.keys.load()).clone()
    }

    /// The client CA, as loaded from `--client-ca-dir`.
    pub(crate) fn ca(&self) -> Result<Ca, Error> {
        let dir = self.client_ca.dir().display().to_string();
        let Some(current) = self.client_ca.current() else {
            let reason = self.client_ca.ready(SystemTime::now()).err().unwrap_or_default();
            return Err(Error::NoClientCa { dir, reason });
        };
        if !current.info.is_ca {
            return Err(Error::NotACa { dir });
        }
        Ok(Ca::from_pair(&current, self.client_ca.dir())?)
    }

    pub(crate) fn ca_sha(&self) -> String {
        self.client_ca.current().map(|c| c.info.sha256.clone()).unwrap_or_default()
    }

    /// The CA bundle of a source, as last read (each source is read once per
    /// [`Context::refresh_sources`], not once per namespace).
    pub(crate) async fn source(&self, source: &SourceKey) -> Result<String, Error> {
        let known = lock(&self.sources).get(source).cloned();
        let result = match known {
            Some(result) => result,
            None => {
                let result = self.read_source(source).await?;
                lock(&self.sources).insert(source.clone(), result.clone());
                result
            }
        };
        result.map_err(|reason| Error::Source { what: source_name(source), reason })
    }

    /// Reads every server CA source again; returns whether any changed since last read.
    pub async fn refresh_sources(&self, sources: &BTreeSet<SourceKey>) -> Result<bool, Error> {
        let mut changed = false;
        for source in sources {
            let now = self.read_source(source).await?;
            let before = lock(&self.sources).insert(source.clone(), now.clone());
            changed |= before.as_ref() != Some(&now);
        }
        Ok(changed)
    }

    /// A source's text, checked to be a bundle of CA certificates and nothing else: `Err` with
    /// the reason when it is missing or not that (an API failure is the outer error).
    pub(crate) async fn read_source(&self, source: &SourceKey) -> Result<Result<String, String>, Error> {
        let text = if source.config_map {
            let api = Api::<ConfigMap>::namespaced(self.client.clone(), &source.namespace);
            api.get_opt(&source.name)
                .await?
                .and_then(|o| o.data)
                .and_then(|mut d| d.remove(&source.key))
                .map(String::into_bytes)
        } else {
            let api = Api::<Secret>::namespaced(self.client.clone(), &source.namespace);
            api.get_opt(&source.name).await?.and_then(|o| o.data).and_then(|mut d| d.remove(&source.key)).map(|b| b.0)
        };
        let Some(text) = text else {
            return Ok(Err("missing".into()));
        };
        Ok(keyward_certs::pem::ca_bundle(&text, &source_name(source)).map_err(|e| {
            // The message names the source already; keep only the reason.
            let text = e.to_string();
            text.split_once(": ").map_or(text.clone(), |(_, reason)| reason.to_string())
        }))
    }

    /// Deletes an object keyward manages, only the one it saw (a UID precondition).
    pub(crate) async fn delete<K>(
        &self,
        api: &Api<K>,
        kind: &'static str,
        ns: &str,
        name: &str,
        uid: Option<String>,
    ) -> Result<(), Error>
    where
        K: Resource + Clone + DeserializeOwned + Debug,
    {
        self.leader.check()?;
        let params = DeleteParams {
            preconditions: uid.map(|uid| kube::api::Preconditions { uid: Some(uid), resource_version: None }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(namespace = %ns, name = %name, kind, "removed: the namespace opted out, or no profile provides it any more");
                self.metrics.object(kind_label(kind), Action::Deleted, true);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(()),
            Err(e) => {
                self.metrics.object(kind_label(kind), Action::Deleted, false);
                Err(e.into())
            }
        }
    }

    /// Whether the owner exists now, in the pod's namespace, with the UID, kind and API group
    /// the pod names (asked once per reconcile of the owner, and only before a write).
    pub(crate) async fn owner_verified(
        &self,
        namespace: &str,
        owner: &Owner,
        check: &mut OwnerCheck,
    ) -> Result<bool, Error> {
        if let Some(known) = check.exists {
            return Ok(known);
        }
        let gvk = GroupVersionKind::gvk(owner.group(), owner.version(), &owner.kind);
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &ApiResource::from_gvk(&gvk));
        let exists =
            api.get_opt(&owner.name).await?.is_some_and(|o| o.metadata.uid.as_deref() == Some(owner.uid.as_str()));
        check.exists = Some(exists);
        check.missing |= !exists;
        Ok(exists)
    }

    /// Creates `desired`, or replaces a managed object whose content differs; never touches
    /// an object keyward does not manage. Reads the current object from `store` when given;
    /// when the store is behind the API server (a write refused as AlreadyExists or Conflict),
    /// reads it from the API once and decides again.
    pub(crate) async fn ensure<K>(
        &self,
        ns: &str,
        store: Option<&Store<K>>,
        desired: K,
        same: Same<K>,
    ) -> Result<Action, Error>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
    {
        let name = desired.meta().name.clone().ok_or_else(|| Error::Malformed("a desired object".into()))?;
        let api = Api::<K>::namespaced(self.client.clone(), ns);
        let current = match store {
            Some(store) => store.get(&ObjectRef::new(&name).within(ns)).map(|o| (*o).clone()),
            None => api.get_opt(&name).await?,
        };
        match self.write_if_needed(&api, &name, current, desired.clone(), same).await {
            Err(Error::Kube(kube::Error::Api(s))) if store.is_some() && (s.is_already_exists() || s.is_conflict()) => {
                let current = api.get_opt(&name).await?;
                self.write_if_needed(&api, &name, current, desired, same).await
            }
            other => other,
        }
    }

    pub(crate) async fn write_if_needed<K>(
        &self,
        api: &Api<K>,
        name: &str,
        current: Option<K>,
        mut desired: K,
        same: Same<K>,
    ) -> Result<Action, Error>
    where
        K: Resource + Clone + Serialize + DeserializeOwned + Debug,
    {
        match current {
            None => {
                self.leader.check()?;
                Ok(api.create(&PostParams::default(), &desired).await.map(|_| Action::Provisioned)?)
            }
            Some(existing) if !is_managed(existing.meta()) => Ok(Action::Foreign),
            Some(existing) if same(&existing, &desired) && metadata_holds(existing.meta(), desired.meta()) => {
                Ok(Action::Unchanged)
            }
            Some(existing) => {
                desired.meta_mut().resource_version = existing.meta().resource_version.clone();
                self.leader.check()?;
                Ok(api.replace(name, &PostParams::default(), &desired).await.map(|_| Action::Provisioned)?)
            }
        }
    }

    /// Counts what was done to `d` (as `failed` when it failed), reports a name taken by
    /// someone else's object, and keeps the first error for the caller's retry.
    pub(crate) async fn record(
        &self,
        d: &Desired,
        owner: Option<&Owner>,
        result: Result<Action, Error>,
        failed: Action,
        first_error: &mut Option<Error>,
    ) {
        let kind = d.want.label();
        match result {
            Ok(Action::Foreign) => {
                self.metrics.object(kind, Action::Foreign, true);
                self.report_foreign(d, owner).await;
            }
            Ok(action) => self.metrics.object(kind, action, true),
            Err(e) => {
                self.metrics.object(kind, failed, false);
                tracing::warn!(error = %e, namespace = %d.namespace, name = %d.name, kind = d.want.object_kind(), "reconciling failed; will retry");
                first_error.get_or_insert(e);
            }
        }
    }
}

/// What is known of an owner during one reconcile.
#[derive(Debug, Default)]
pub(crate) struct OwnerCheck {
    /// Whether it exists with the pod's UID, once asked.
    pub(crate) exists: Option<bool>,
    /// It was asked, and does not.
    pub(crate) missing: bool,
}

/// Every object matching `selector`, a page of 500 at a time.
pub(crate) async fn list_all<K>(api: Api<K>, selector: &str) -> Result<Vec<Arc<K>>, Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().labels(selector).limit(500);
    loop {
        let page = api.list(&params).await?;
        out.extend(page.items.into_iter().map(Arc::new));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

pub(crate) fn source_name(source: &SourceKey) -> String {
    format!(
        "serverCA source {} {}/{} key {}",
        if source.config_map { "ConfigMap" } else { "Secret" },
        source.namespace,
        source.name,
        source.key
    )
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn label<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str)
}

pub(crate) fn namespace_ref(namespace: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Namespace".into()),
        name: Some(namespace.into()),
        ..ObjectReference::default()
    }
}

/// Whether the existing object carries everything keyward's metadata says (labels,
/// annotations, owner), so that a content match means nothing to write.
pub(crate) fn metadata_holds(existing: &kube::api::ObjectMeta, desired: &kube::api::ObjectMeta) -> bool {
    let subset = |want: &Option<BTreeMap<String, String>>, have: &Option<BTreeMap<String, String>>| {
        want.iter().flatten().all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    subset(&desired.labels, &existing.labels) && subset(&desired.annotations, &existing.annotations)
}

pub(crate) fn kind_label(kind: &'static str) -> &'static str {
    match kind {
        "ConfigMap" => "config-map",
        "Secret" => "secret",
        "ServiceAccount" => "service-account",
        "RoleBinding" => "role-binding",
        _ => "object",
    }
}
