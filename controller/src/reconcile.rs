//! Reconciling: the thin layer between what is desired and the API.
//!
//! - Every write is preceded by the leadership check (a deadline on the local clock).
//! - No object without keyward's `managed-by` label is ever changed or deleted: a name taken by
//!   someone else's object is reported (an Event, a log line, a metric) and left alone.
//! - An identity is issued only on verified facts: the pod's admission attestation (or, for an
//!   owner issued before attestations existed, a certificate keyward itself signed), and the
//!   owner existing *now* with the UID the pod names. Renewal is driven from those owners,
//!   never from what a Secret's own labels and ownerReferences claim.
//! - What keyward wrote is remembered, so an owner whose certificate is fresh costs no request.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::NamespaceResourceScope;
use keyward_certs::attestation::{self, Keys};
use keyward_certs::pki::Ca;
use keyward_certs::CertStore;
use keyward_engine::text::clip;
use keyward_engine::ProfileSet;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::attestation::{first_of_its_attestation, refusal_note, Sibling};
use crate::conditions::{Change, Condition, Conditions};
use crate::desired::{self, Desired, Owner, PodClaim, SourceKey, Want};
use crate::error::Error;
use crate::identity::{self, Renewal, CA_CRT, TLS_CRT, TLS_KEY};
use crate::index::{OwnerKey, PodKey};
use crate::leader::Leadership;
use crate::metrics::{Action, Metrics, Refusal};
use crate::objects::{self, is_managed, Scope};
use crate::queue::Outcome;
use crate::signer;
use keyward_engine::attest::Verdict;

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
struct Memo {
    resource_version: String,
    owner_uid: String,
    /// For a certificate: when to renew, and the client CA it was issued with.
    renew_at: Option<SystemTime>,
    ca_sha: String,
    /// A new pod of the owner arrived: read the Secret before trusting this again.
    stale: bool,
    /// When the certificate expires.
    not_after: Option<SystemTime>,
}

/// The pods of an owner as the pod watches hold them, each with whether its attestation holds
/// under the keys given; `None` until every pod watch has listed once (a pod missing then may
/// only not have arrived yet).
pub type OwnerPods<'a> = dyn Fn(&OwnerKey, &Keys) -> Option<Vec<Sibling>> + Sync + 'a;

/// How one owner's reconcile ended, for the queue.
type OwnerResult = Result<Outcome, Error>;

pub struct Reconciler {
    client: Client,
    profiles: Arc<ProfileSet>,
    settings: Settings,
    client_ca: Arc<CertStore>,
    leader: Leadership,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    conditions: Conditions,
    stores: Mutex<Option<Stores>>,
    memo: Mutex<HashMap<(String, String), Memo>>,
    keys: ArcSwap<Option<Keys>>,
    /// The server CA sources, as last read and checked (only CA certificates).
    sources: Mutex<HashMap<SourceKey, Result<String, String>>>,
    /// Pods (by UID) and owners already reported as refused, so each is reported once.
    reported: Mutex<HashSet<(String, Refusal)>>,
}

impl Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// Whether two objects of a kind hold the same content (metadata aside).
type Same<K> = fn(&K, &K) -> bool;

impl Reconciler {
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
    fn ca(&self) -> Result<Ca, Error> {
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

    fn ca_sha(&self) -> String {
        self.client_ca.current().map(|c| c.info.sha256.clone()).unwrap_or_default()
    }

    // === per namespace ===

    /// Makes the per-namespace objects of every profile exist in `namespace` (opted in).
    pub async fn namespace(&self, namespace: &str) -> Result<(), Error> {
        let (wanted, problems) = desired::for_namespace(&self.profiles, namespace, &self.settings.operator_namespaces);
        for p in problems {
            tracing::error!(profile = %p.profile, namespace, reason = %p.reason, "cannot provision the server CA");
        }
        let mut first_error = None;
        for d in &wanted {
            let subject = format!("{} {}/{}", d.want.object_kind(), d.namespace, d.name);
            let result = match self.ensure_namespace_object(d).await {
                // A source that is missing or holds no CA certificate is not this namespace's
                // failure: the copy already there (if any) stays, the condition is reported,
                // and the source is read again at the next resync.
                Err(Error::Source { what, reason }) => {
                    let note = format!(
                        "{subject} for profile {:?} is not provisioned: {what}: {reason}; pods that need it wait until the source holds a CA certificate",
                        d.profile
                    );
                    self.raise(Condition::ServerCaSourceUnusable, &subject, &note, Some(namespace_ref(&d.namespace)))
                        .await;
                    continue;
                }
                other => other,
            };
            if matches!(d.want, Want::ServerCa { .. }) && result.is_ok() {
                self.resolve(Condition::ServerCaSourceUnusable, &subject);
            }
            self.record(d, None, result, Action::Provisioned, &mut first_error).await;
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn ensure_namespace_object(&self, d: &Desired) -> Result<Action, Error> {
        let ns = d.namespace.as_str();
        let stores = lock(&self.stores).clone();
        match &d.want {
            Want::ServerCa { config_map, key, source } => {
                let pem = self.source(source).await?;
                if *config_map {
                    let object = objects::server_ca_config_map(d, key, &pem);
                    let store = stores.as_ref().map(|s| &s.config_maps);
                    self.ensure(ns, store, object, |a, b| a.data == b.data).await
                } else {
                    let object = objects::server_ca_secret(d, key, &pem);
                    self.ensure::<Secret>(ns, None, object, |a, b| a.data == b.data).await
                }
            }
            Want::ServiceAccount => {
                let object = objects::service_account(d);
                self.ensure(ns, stores.as_ref().map(|s| &s.service_accounts), object, |_, _| true).await
            }
            Want::RoleBinding { account, role } => {
                let object = objects::role_binding(d, account, role);
                let same: Same<RoleBinding> = |a, b| a.role_ref == b.role_ref && a.subjects == b.subjects;
                self.ensure(ns, stores.as_ref().map(|s| &s.role_bindings), object, same).await
            }
            Want::ClientCertificate { .. } | Want::Token { .. } | Want::PodCertificate { .. } => Ok(Action::Unchanged),
        }
    }

    /// The CA bundle of a source, as last read (each source is read once per
    /// [`Self::refresh_sources`], not once per namespace).
    async fn source(&self, source: &SourceKey) -> Result<String, Error> {
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
    async fn read_source(&self, source: &SourceKey) -> Result<Result<String, String>, Error> {
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

    /// Removes what keyward provisioned in `namespace`, which opted out.
    pub async fn opt_out(&self, namespace: &str) -> Result<(), Error> {
        let opted_in = BTreeSet::new();
        self.sweep_in(Some(namespace), &opted_in).await
    }

    /// Removes what keyward provisioned per namespace where no longer wanted: namespaces that
    /// opted out, and objects no profile wants any more.
    pub async fn sweep_namespaces(&self, opted_in: &BTreeSet<String>) -> Result<(), Error> {
        self.sweep_in(None, opted_in).await
    }

    async fn sweep_in(&self, only: Option<&str>, opted_in: &BTreeSet<String>) -> Result<(), Error> {
        let mut wanted: BTreeMap<String, BTreeSet<(&'static str, String)>> = BTreeMap::new();
        for ns in opted_in {
            let (desired, _) = desired::for_namespace(&self.profiles, ns, &self.settings.operator_namespaces);
            wanted.insert(ns.clone(), desired.into_iter().map(|d| (d.want.object_kind(), d.name)).collect());
        }
        let keep = |kind: &'static str, ns: &str, name: &str| {
            only.is_some_and(|o| o != ns) || wanted.get(ns).is_some_and(|set| set.contains(&(kind, name.to_string())))
        };
        let stores = lock(&self.stores).clone();
        let selector = objects::managed_selector(Scope::Namespace);
        self.sweep("ConfigMap", stores.as_ref().map(|s| &s.config_maps), &selector, only, &keep).await?;
        // Without --provision-accounts keyward may not list them (and made none).
        if self.settings.provision_accounts {
            self.sweep("ServiceAccount", stores.as_ref().map(|s| &s.service_accounts), &selector, only, &keep).await?;
            self.sweep("RoleBinding", stores.as_ref().map(|s| &s.role_bindings), &selector, only, &keep).await?;
        }
        // Secrets are not watched (keyward may not list them): a namespace's server CA Secrets
        // are found by the names the profiles give them.
        if let Some(ns) = only {
            let (desired, _) = desired::for_namespace(&self.profiles, ns, &self.settings.operator_namespaces);
            for d in desired.iter().filter(|d| matches!(d.want, Want::ServerCa { config_map: false, .. })) {
                let api = Api::<Secret>::namespaced(self.client.clone(), ns);
                if let Some(secret) = api.get_opt(&d.name).await? {
                    if is_managed(&secret.metadata)
                        && label(&secret.metadata, desired::PROVISIONED_FOR) == Some("namespace")
                    {
                        self.delete(&api, "Secret", ns, &d.name, secret.metadata.uid.clone()).await?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn sweep<K>(
        &self,
        kind: &'static str,
        store: Option<&Store<K>>,
        selector: &str,
        only: Option<&str>,
        keep: &(dyn Fn(&'static str, &str, &str) -> bool + Sync),
    ) -> Result<(), Error>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        let objects: Vec<Arc<K>> = match (store, only) {
            (Some(store), _) => store.state(),
            (None, Some(ns)) => list_all(Api::<K>::namespaced(self.client.clone(), ns), selector).await?,
            (None, None) => list_all(Api::<K>::all(self.client.clone()), selector).await?,
        };
        for object in objects {
            let (ns, name) = (object.namespace().unwrap_or_default(), object.name_any());
            let ours = is_managed(object.meta()) && label(object.meta(), desired::PROVISIONED_FOR) == Some("namespace");
            if !ours || only.is_some_and(|o| o != ns) || keep(kind, &ns, &name) {
                continue;
            }
            let api = Api::<K>::namespaced(self.client.clone(), &ns);
            self.delete(&api, kind, &ns, &name, object.meta().uid.clone()).await?;
        }
        Ok(())
    }

    /// Deletes an object keyward manages, only the one it saw (a UID precondition).
    async fn delete<K>(
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

    // === per owner ===

    /// Issues what an owner's pods need: `pods` are its live pods in opted-in namespaces, with
    /// their claims. Returns when to come back (the next renewal).
    pub async fn owner(&self, owner: &OwnerKey, pods: &[(PodKey, String, PodClaim)]) -> OwnerResult {
        let Some((_, _, first)) = pods.first() else {
            return Ok(Outcome::Done);
        };
        let keys = self.attestation_keys().ok_or(Error::NoAttestationKeys)?;
        // Serve the pod whose attestation holds and which is not a copy of another's; report
        // the others once each.
        let verdicts: Vec<Verdict> = pods.iter().map(|(_, _, c)| c.attested(&keys)).collect();
        let siblings: Vec<Sibling> = pods
            .iter()
            .zip(&verdicts)
            .map(|((key, uid, c), v)| Sibling::of(&key.name, uid, c, *v == Verdict::Valid))
            .collect();
        let mut served = None;
        for (((key, uid, c), me), verdict) in pods.iter().zip(&siblings).zip(&verdicts) {
            let refused = match Refusal::of(verdict) {
                Some(refusal) => Some((refusal, refusal_note(verdict))),
                None => first_of_its_attestation(me, &siblings).err().map(|why| (Refusal::DuplicateAttestation, why)),
            };
            match refused {
                None => served = served.or(Some(c)),
                Some((refusal, why)) => self.report_pod(key, uid, refusal, &why).await,
            }
        }
        let attested = served.is_some();
        let claim = served.unwrap_or(first);
        let mut check = OwnerCheck::default();
        let mut next: Option<SystemTime> = None;
        let mut first_error = None;
        // Pod certificates are signed when the kubelet asks (`sign`), not per owner here.
        for d in claim.wants.iter().filter(|d| !matches!(d.want, Want::PodCertificate { .. })) {
            let result = match &d.want {
                Want::ClientCertificate { owner: o, identity } => {
                    self.client_certificate(d, o, identity, attested, &mut check).await
                }
                Want::Token { owner: o, key } => self.token(d, o, key, attested, &mut check).await,
                _ => Ok((Action::Unchanged, None)),
            };
            let result = match result {
                Ok((action, renew_at)) => {
                    if let Some(at) = renew_at {
                        next = Some(next.map_or(at, |n| n.min(at)));
                    }
                    Ok(action)
                }
                Err(e) => Err(e),
            };
            self.record(d, Some(&claim.owner), result, Action::Issued, &mut first_error).await;
        }
        if check.missing {
            self.report_owner(owner, &claim.owner).await;
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(match next {
            Some(at) => {
                Outcome::At(tokio::time::Instant::now() + at.duration_since(SystemTime::now()).unwrap_or_default())
            }
            None => Outcome::Done,
        })
    }

    /// Whether the owner exists now, in the pod's namespace, with the UID, kind and API group
    /// the pod names (asked once per reconcile of the owner, and only before a write).
    async fn owner_verified(&self, namespace: &str, owner: &Owner, check: &mut OwnerCheck) -> Result<bool, Error> {
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

    /// The client certificate for `owner`: issued, renewed, or left as it is. Returns what was
    /// done and when to renew.
    async fn client_certificate(
        &self,
        d: &Desired,
        owner: &Owner,
        identity: &str,
        attested: bool,
        check: &mut OwnerCheck,
    ) -> Result<(Action, Option<SystemTime>), Error> {
        let now = SystemTime::now();
        let ca_sha = self.ca_sha();
        let memo = lock(&self.memo).get(&(d.namespace.clone(), d.name.clone())).cloned();
        // The common cases, from memory: fresh (no request), or due (renew in place).
        if let Some(m) = memo.as_ref().filter(|m| m.owner_uid == owner.uid && !m.stale) {
            match m.renew_at {
                Some(at) if now < at && m.ca_sha == ca_sha => return Ok((Action::Unchanged, Some(at))),
                _ if attested || m.renew_at.is_some() => {
                    if !self.owner_verified(&d.namespace, owner, check).await? {
                        return Ok((Action::Unchanged, None));
                    }
                    match self.write_certificate(d, owner, identity, Some(&m.resource_version)).await {
                        Ok(done) => return Ok(done),
                        // Changed or gone since: look again.
                        Err(Error::Kube(kube::Error::Api(s))) if s.is_conflict() || s.is_not_found() => {
                            lock(&self.memo).remove(&(d.namespace.clone(), d.name.clone()));
                        }
                        Err(e) => return Err(e),
                    }
                }
                _ => {}
            }
        }
        let api = Api::<Secret>::namespaced(self.client.clone(), &d.namespace);
        let existing = if attested && memo.is_none() {
            // A new owner, the common case: verify it and create; read only on a conflict.
            if !self.owner_verified(&d.namespace, owner, check).await? {
                return Ok((Action::Unchanged, None));
            }
            match self.write_certificate(d, owner, identity, None).await {
                Ok(done) => return Ok(done),
                Err(Error::Kube(kube::Error::Api(s))) if s.is_already_exists() => api.get_opt(&d.name).await?,
                Err(e) => return Err(e),
            }
        } else {
            api.get_opt(&d.name).await?
        };
        let Some(existing) = existing else {
            if !attested || !self.owner_verified(&d.namespace, owner, check).await? {
                return Ok((Action::Unchanged, None));
            }
            // Gone (deleted by someone, or between a create's conflict and this read).
            return self.write_certificate(d, owner, identity, None).await;
        };
        if !is_managed(&existing.metadata) {
            return Ok((Action::Foreign, None));
        }
        let rv = existing.metadata.resource_version.clone().unwrap_or_default();
        let owned = owned_by(&existing.metadata, owner);
        let data = existing.data.as_ref();
        let get = |k: &str| data.and_then(|d| d.get(k)).map(|b| b.0.as_slice());
        let ca = self.ca()?;
        if !attested {
            // No attestation: renew only a certificate keyward itself issued for this very
            // owner (an owner issued before attestations existed). Anything else is left
            // alone and reported: a Secret's labels and ownerReferences are anyone's to write.
            let ours = owned && get(TLS_CRT).is_some_and(|c| identity::issued_by(c, &ca));
            if !ours {
                self.report_secret(d, owner).await;
                return Ok((Action::Unchanged, None));
            }
        }
        let why = if owned {
            match identity::renewal(get(TLS_CRT), get(TLS_KEY), get(CA_CRT), ca.cert_pem(), identity, now) {
                Renewal::Fresh { not_after } => {
                    let renew_at = identity::renew_at(get(TLS_CRT)).unwrap_or(not_after);
                    self.remember(d, owner, &rv, Some((renew_at, not_after)), &ca_sha);
                    return Ok((Action::Unchanged, Some(renew_at)));
                }
                Renewal::Due(reason) => reason,
            }
        } else {
            "it belongs to an earlier owner of that name".to_string()
        };
        if !self.owner_verified(&d.namespace, owner, check).await? {
            return Ok((Action::Unchanged, None));
        }
        tracing::debug!(namespace = %d.namespace, name = %d.name, reason = %why, "renewing the client certificate");
        self.write_certificate(d, owner, identity, Some(&rv)).await
    }

    /// Issues a certificate and writes it: a create, or an in-place update of the Secret at
    /// `resource_version` (only data, keyward's labels and annotation, and the owner change).
    async fn write_certificate(
        &self,
        d: &Desired,
        owner: &Owner,
        identity: &str,
        resource_version: Option<&str>,
    ) -> Result<(Action, Option<SystemTime>), Error> {
        let ca = self.ca()?;
        let ca_sha = self.ca_sha();
        let issued =
            identity::issue(&ca, &d.namespace, owner, identity, SystemTime::now(), self.settings.client_cert_validity)?;
        let secret = objects::client_certificate_secret(d, owner, &issued.cert_pem, &issued.key_pem, &issued.ca_pem);
        let api = Api::<Secret>::namespaced(self.client.clone(), &d.namespace);
        self.leader.check()?;
        let (written, action) = match resource_version {
            None => (api.create(&PostParams::default(), &secret).await?, Action::Issued),
            Some(rv) => {
                let patch = objects::merge_patch(&secret, rv);
                (api.patch(&d.name, &PatchParams::default(), &Patch::Merge(&patch)).await?, Action::Renewed)
            }
        };
        let renew_at = identity::renew_at(Some(issued.cert_pem.as_bytes())).unwrap_or(issued.not_after);
        self.remember(
            d,
            owner,
            written.metadata.resource_version.as_deref().unwrap_or_default(),
            Some((renew_at, issued.not_after)),
            &ca_sha,
        );
        tracing::info!(namespace = %d.namespace, name = %d.name, %identity, profile = %d.profile, action = action.as_str(), "client certificate written");
        Ok((action, Some(renew_at)))
    }

    fn remember(&self, d: &Desired, owner: &Owner, rv: &str, cert: Option<(SystemTime, SystemTime)>, ca_sha: &str) {
        let (renew_at, not_after) = (cert.map(|c| c.0), cert.map(|c| c.1));
        let memo = Memo {
            resource_version: rv.to_string(),
            owner_uid: owner.uid.clone(),
            renew_at,
            ca_sha: ca_sha.to_string(),
            stale: false,
            not_after,
        };
        lock(&self.memo).insert((d.namespace.clone(), d.name.clone()), memo);
    }

    /// A generated token for `owner`: created once, never replaced (a new one would lock out
    /// whoever holds the old).
    async fn token(
        &self,
        d: &Desired,
        owner: &Owner,
        key: &str,
        attested: bool,
        check: &mut OwnerCheck,
    ) -> Result<(Action, Option<SystemTime>), Error> {
        let memo = lock(&self.memo).get(&(d.namespace.clone(), d.name.clone())).cloned();
        if memo.as_ref().is_some_and(|m| m.owner_uid == owner.uid && !m.stale) {
            return Ok((Action::Unchanged, None));
        }
        let api = Api::<Secret>::namespaced(self.client.clone(), &d.namespace);
        let existing = if attested && memo.is_none() { None } else { api.get_opt(&d.name).await? };
        let existing = match existing {
            Some(existing) => existing,
            None if !attested => return Ok((Action::Unchanged, None)),
            None => {
                if !self.owner_verified(&d.namespace, owner, check).await? {
                    return Ok((Action::Unchanged, None));
                }
                let secret = objects::token_secret(d, owner, key, &identity::generate_token()?);
                self.leader.check()?;
                match api.create(&PostParams::default(), &secret).await {
                    Ok(created) => {
                        tracing::info!(namespace = %d.namespace, name = %d.name, profile = %d.profile, "token generated");
                        self.remember(
                            d,
                            owner,
                            created.metadata.resource_version.as_deref().unwrap_or_default(),
                            None,
                            "",
                        );
                        return Ok((Action::Issued, None));
                    }
                    Err(kube::Error::Api(s)) if s.is_already_exists() => match api.get_opt(&d.name).await? {
                        Some(existing) => existing,
                        None => return Err(Error::Stale(format!("{}/{}", d.namespace, d.name))),
                    },
                    Err(e) => return Err(e.into()),
                }
            }
        };
        if !is_managed(&existing.metadata) {
            return Ok((Action::Foreign, None));
        }
        let rv = existing.metadata.resource_version.clone().unwrap_or_default();
        let has_key = existing.data.as_ref().is_some_and(|data| data.contains_key(key));
        if has_key && owned_by(&existing.metadata, owner) {
            self.remember(d, owner, &rv, None, "");
            return Ok((Action::Unchanged, None));
        }
        if !attested {
            self.report_secret(d, owner).await;
            return Ok((Action::Unchanged, None));
        }
        // Keyward's Secret, for an earlier owner or without its key: take it over for this
        // owner, keeping its token (and any other keys) when it has one.
        let mut data = BTreeMap::new();
        if !has_key {
            tracing::warn!(namespace = %d.namespace, name = %d.name, key, "the token Secret lacks its key; adding a new token under it (the Secret's other keys are kept)");
            data.insert(key.to_string(), k8s_openapi::ByteString(identity::generate_token()?.into_bytes()));
        }
        let mut secret = objects::token_secret(d, owner, key, "");
        secret.data = Some(data);
        let patch = objects::merge_patch(&secret, &rv);
        self.leader.check()?;
        let written = api.patch(&d.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        self.remember(d, owner, written.metadata.resource_version.as_deref().unwrap_or_default(), None, "");
        Ok((Action::Issued, None))
    }

    // === the client CA and the attestation keys ===

    /// Publishes the client CA's certificate to the namespaces named, and removes it from
    /// those no longer named.
    pub async fn publish_client_ca(&self) -> Result<(), Error> {
        // The trust bundles and the ConfigMaps are independent: one failing does not hold up
        // the other (the first error is returned, and the key retried).
        let bundles = self.publish_trust_bundles().await;
        if self.settings.publish_client_ca_to.is_empty() {
            return bundles;
        }
        let ca = self.ca()?;
        let mut first_error = None;
        let stores = lock(&self.stores).clone();
        for ns in &self.settings.publish_client_ca_to {
            // Nothing is published into a namespace that does not exist (creating the ConfigMap
            // would fail, every time): reported, and published when the namespace appears.
            match Api::<Namespace>::all(self.client.clone()).get_opt(ns).await {
                Ok(Some(_)) => self.resolve(Condition::ClientCaNamespaceMissing, ns),
                Ok(None) => {
                    let note = format!(
                        "--publish-client-ca-to names namespace {ns:?}, which does not exist; the client CA is published there when it is created"
                    );
                    self.raise(Condition::ClientCaNamespaceMissing, ns, &note, None).await;
                    continue;
                }
                Err(e) => {
                    first_error.get_or_insert(e.into());
                    continue;
                }
            }
            // The CA it replaced stays beside it as long as a certificate it signed can be
            // presented, as in the trust bundles.
            let name = &self.settings.client_ca_config_map;
            let existing = match &stores {
                Some(s) => s.config_maps.get(&ObjectRef::new(name).within(ns)).map(|o| (*o).clone()),
                None => Api::<ConfigMap>::namespaced(self.client.clone(), ns).get_opt(name).await?,
            };
            let there = existing.as_ref().filter(|cm| is_managed(&cm.metadata)).map(|cm| {
                (cm.data.as_ref().and_then(|d| d.get(identity::CA_CRT)).map_or("", String::as_str), &cm.metadata)
            });
            let (bundle, until) = self.client_ca_bundle(&ca, there);
            let object = objects::client_ca_config_map(ns, name, &bundle, until);
            let same = |a: &ConfigMap, b: &ConfigMap| {
                a.data == b.data && previous_until(&a.metadata) == previous_until(&b.metadata)
            };
            match self.ensure(ns, stores.as_ref().map(|s| &s.config_maps), object, same).await {
                Ok(Action::Foreign) => {
                    self.metrics.object("client-ca", Action::Foreign, true);
                    tracing::warn!(namespace = %ns, name = %self.settings.client_ca_config_map, "a ConfigMap keyward does not manage has the client CA's name; left alone");
                }
                Ok(action) => self.metrics.object("client-ca", action, true),
                Err(e) => {
                    self.metrics.object("client-ca", Action::Provisioned, false);
                    first_error.get_or_insert(e);
                }
            }
        }
        // Published where no longer named: removed (found in the watched ConfigMaps).
        let named: BTreeSet<&String> = self.settings.publish_client_ca_to.iter().collect();
        let published: Vec<Arc<ConfigMap>> = match &stores {
            Some(s) => s.config_maps.state(),
            None => {
                list_all(Api::<ConfigMap>::all(self.client.clone()), &objects::managed_selector(Scope::ClientCa))
                    .await?
            }
        };
        for cm in published {
            let ns = cm.namespace().unwrap_or_default();
            let ours = is_managed(&cm.metadata) && label(&cm.metadata, desired::PROVISIONED_FOR) == Some("client-ca");
            if ours && cm.name_any() == self.settings.client_ca_config_map && !named.contains(&ns) {
                let api = Api::<ConfigMap>::namespaced(self.client.clone(), &ns);
                self.delete(&api, "ConfigMap", &ns, &cm.name_any(), cm.metadata.uid.clone()).await?;
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => bundles,
        }
    }

    /// What a published client CA holds now, given what it held (its PEM and metadata): the
    /// current CA, and the one it replaced while a certificate that one signed can still be
    /// presented. With until when.
    fn client_ca_bundle(&self, ca: &Ca, there: Option<(&str, &kube::api::ObjectMeta)>) -> (String, Option<SystemTime>) {
        signer::trust_bundle(
            ca.cert_pem(),
            there.map(|(pem, meta)| (pem, previous_until(meta))),
            SystemTime::now(),
            signer::trust_overlap(self.settings.client_cert_validity),
        )
    }

    /// One ClusterTrustBundle per signer the profiles use, linked to it, holding the client CA
    /// (and, after a rotation, the CA it replaced, until everything that one signed expired);
    /// bundles of signers no profile uses any more are deleted. Only keyward's own are touched.
    async fn publish_trust_bundles(&self) -> Result<(), Error> {
        let Some(version) = self.settings.trust_bundles else {
            return Ok(());
        };
        let resource = version.trust_bundles();
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &resource);
        let signers = signer::signers(&self.profiles);
        let wanted: BTreeSet<String> = signers.iter().map(|(s, _)| signer::trust_bundle_name(s)).collect();
        if !signers.is_empty() {
            let ca = self.ca()?;
            for (signer_name, profile) in &signers {
                let name = signer::trust_bundle_name(signer_name);
                let existing = api.get_opt(&name).await?;
                if let Some(e) = &existing {
                    if !is_managed(&e.metadata) {
                        self.metrics.object("trust-bundle", Action::Foreign, true);
                        tracing::warn!(%name, "a ClusterTrustBundle keyward does not manage has its name; left alone");
                        continue;
                    }
                }
                let there = existing
                    .as_ref()
                    .map(|e| (e.data["spec"]["trustBundle"].as_str().unwrap_or_default(), &e.metadata));
                let (bundle, until) = self.client_ca_bundle(&ca, there);
                if there.is_some_and(|(b, meta)| b == bundle && previous_until(meta) == until) {
                    self.metrics.object("trust-bundle", Action::Unchanged, true);
                    continue;
                }
                let mut meta = objects::meta("", &name, Some(profile), Scope::ClientCa, None);
                let annotations = meta.annotations.get_or_insert_with(Default::default);
                if let Some(t) = until {
                    annotations.insert(signer::PREVIOUS_UNTIL.into(), keyward_certs::rfc3339(t));
                }
                let spec = serde_json::json!({"signerName": signer_name, "trustBundle": bundle});
                let action = self.put_trust_bundle(&api, &resource, meta, spec, existing.as_ref()).await?;
                self.metrics.object("trust-bundle", action, true);
                tracing::info!(%name, signer = %signer_name, certificates = if until.is_some() { 2 } else { 1 }, "client CA trust bundle written");
            }
        }
        let unwanted = |name: &str| !wanted.contains(name);
        self.remove_trust_bundles(
            &api,
            Scope::ClientCa,
            unwanted,
            "trust-bundle",
            "client CA trust bundle of a signer no profile uses",
        )
        .await
    }

    /// The server CAs the profiles deliver by `clusterTrustBundle` projection, each published
    /// once for the cluster as an unlinked ClusterTrustBundle of the name the profile gives,
    /// from its source (read again at each resync, so a rotated CA follows); keyward's bundles
    /// no profile wants any more are deleted. One whose source is unusable keeps what it holds.
    pub async fn publish_server_ca_bundles(&self) -> Result<(), Error> {
        let (wanted, problems) = desired::trust_bundles(&self.profiles, &self.settings.operator_namespaces);
        for p in &problems {
            tracing::warn!(profile = %p.profile, reason = %p.reason, "a server CA trust bundle cannot be planned");
        }
        let Some(version) = self.settings.trust_bundles else {
            if !wanted.is_empty() {
                tracing::error!(
                    bundles = ?wanted.iter().map(|w| &w.name).collect::<Vec<_>>(),
                    "profiles deliver a server CA by clusterTrustBundle projection, but this cluster serves no ClusterTrustBundle API: their pods do not start; enable it (see the README, \"Pod certificates\") or use configMapName"
                );
            }
            return Ok(());
        };
        let resource = version.trust_bundles();
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &resource);
        let mut first_error = None;
        for w in &wanted {
            let subject = format!("ClusterTrustBundle {}", w.name);
            let pem = match self.source(&w.source).await {
                Ok(pem) => pem,
                Err(Error::Source { what, reason }) => {
                    let note = format!(
                        "{subject} for profile {:?} is not published: {what}: {reason}; pods that need it wait until the source holds a CA certificate",
                        w.profile
                    );
                    self.raise(Condition::ServerCaSourceUnusable, &subject, &note, None).await;
                    continue;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            self.resolve(Condition::ServerCaSourceUnusable, &subject);
            match self.write_bundle(&api, &resource, w, &pem).await {
                Ok(action) => self.metrics.object("server-ca-bundle", action, true),
                Err(e) => {
                    self.metrics.object("server-ca-bundle", Action::Provisioned, false);
                    tracing::warn!(error = %e, name = %w.name, "publishing the server CA trust bundle failed; will retry");
                    first_error.get_or_insert(e);
                }
            }
        }
        let names: BTreeSet<&str> = wanted.iter().map(|w| w.name.as_str()).collect();
        let unwanted = |name: &str| !names.contains(name);
        self.remove_trust_bundles(
            &api,
            Scope::ServerCaBundle,
            unwanted,
            "server-ca-bundle",
            "server CA trust bundle no profile delivers",
        )
        .await?;
        first_error.map_or(Ok(()), Err)
    }

    /// Creates or replaces one server CA bundle; another's of that name is left alone.
    async fn write_bundle(
        &self,
        api: &Api<DynamicObject>,
        resource: &kube::api::ApiResource,
        w: &desired::WantedBundle,
        pem: &str,
    ) -> Result<Action, Error> {
        let existing = api.get_opt(&w.name).await?;
        if let Some(e) = &existing {
            if !is_managed(&e.metadata) {
                tracing::warn!(name = %w.name, profile = %w.profile, "a ClusterTrustBundle keyward does not manage has the server CA bundle's name; left alone");
                return Ok(Action::Foreign);
            }
            if e.data["spec"]["trustBundle"].as_str() == Some(pem) && e.data["spec"]["signerName"].is_null() {
                return Ok(Action::Unchanged);
            }
        }
        let meta = objects::meta("", &w.name, Some(&w.profile), Scope::ServerCaBundle, None);
        let spec = serde_json::json!({"trustBundle": pem});
        let action = self.put_trust_bundle(api, resource, meta, spec, existing.as_ref()).await?;
        match action {
            Action::Provisioned => {
                tracing::info!(name = %w.name, profile = %w.profile, "server CA trust bundle published")
            }
            _ => tracing::info!(name = %w.name, profile = %w.profile, "server CA trust bundle updated from its source"),
        }
        Ok(action)
    }

    /// Creates the ClusterTrustBundle `meta` names with `spec`, or replaces `existing` at the
    /// version read (changed since: a 409, and the key is retried).
    async fn put_trust_bundle(
        &self,
        api: &Api<DynamicObject>,
        resource: &kube::api::ApiResource,
        mut meta: kube::api::ObjectMeta,
        spec: serde_json::Value,
        existing: Option<&DynamicObject>,
    ) -> Result<Action, Error> {
        let name = meta.name.clone().unwrap_or_default();
        // Cluster-scoped.
        meta.namespace = None;
        meta.resource_version = existing.and_then(|e| e.metadata.resource_version.clone());
        let mut object = DynamicObject::new(&name, resource);
        object.metadata = meta;
        object.data = serde_json::json!({ "spec": spec });
        self.leader.check()?;
        if existing.is_some() {
            api.replace(&name, &PostParams::default(), &object).await?;
            Ok(Action::Renewed)
        } else {
            api.create(&PostParams::default(), &object).await?;
            Ok(Action::Provisioned)
        }
    }

    /// Deletes keyward's ClusterTrustBundles of `scope` whose names are `unwanted`.
    async fn remove_trust_bundles(
        &self,
        api: &Api<DynamicObject>,
        scope: Scope,
        unwanted: impl Fn(&str) -> bool,
        metric: &'static str,
        what: &str,
    ) -> Result<(), Error> {
        for bundle in list_all(api.clone(), &objects::managed_selector(scope)).await? {
            let name = bundle.name_any();
            if is_managed(&bundle.metadata) && unwanted(&name) {
                self.leader.check()?;
                api.delete(&name, &DeleteParams::default()).await?;
                self.metrics.object(metric, Action::Deleted, true);
                tracing::info!(%name, "{what} removed");
            }
        }
        Ok(())
    }

    /// Writes the cluster facts (whether this controller signs pod certificates, from its
    /// discovery) where the webhook reads them: `delivery: auto` resolves the same in both.
    pub async fn publish_cluster_facts(&self) -> Result<(), Error> {
        let ns = &self.settings.namespace;
        let object = objects::cluster_facts_config_map(ns, &self.profiles.facts());
        // Read fresh, not from the watched store: its own watch calls this the moment the
        // ConfigMap is deleted, when the store may not have seen the deletion yet.
        match self.ensure::<ConfigMap>(ns, None, object, |a, b| a.data == b.data).await {
            Ok(Action::Foreign) => {
                self.metrics.object("cluster-facts", Action::Foreign, true);
                tracing::warn!(namespace = %ns, name = keyward_engine::cluster::CONFIG_MAP, "a ConfigMap keyward does not manage has the cluster facts' name; left alone (the webhook reads it: delete it, or make it say what this controller found)");
                Ok(())
            }
            Ok(action) => {
                self.metrics.object("cluster-facts", action, true);
                Ok(())
            }
            Err(e) => {
                self.metrics.object("cluster-facts", Action::Provisioned, false);
                Err(e)
            }
        }
    }

    /// Makes the attestation key Secret exist, rotates it when due, and loads its keys. Returns
    /// when the next rotation is due.
    pub async fn attestation_key(&self) -> Result<Outcome, Error> {
        let (ns, name) = (&self.settings.namespace, &self.settings.attestation_secret);
        let api = Api::<Secret>::namespaced(self.client.clone(), ns);
        let now = time::OffsetDateTime::now_utc();
        let rfc3339 =
            |t: time::OffsetDateTime| t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
        let rotation = time::Duration::try_from(self.settings.attestation_rotation).unwrap_or(time::Duration::WEEK);
        let existing = api.get_opt(name).await?;
        let read = |secret: &Secret, file: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(file))
                .and_then(|b| attestation::Key::from_bytes(&b.0, file).ok().map(|k| (k, b.0.clone())))
        };
        let (keys, rotated_at) = match existing {
            None => {
                let current = attestation::generate()?;
                let secret = objects::attestation_secret(ns, name, &current, None, &rfc3339(now));
                self.leader.check()?;
                match api.create(&PostParams::default(), &secret).await {
                    Ok(_) => tracing::info!(namespace = %ns, name = %name, "attestation key created"),
                    // Another replica made it a moment ago: read it next time.
                    Err(kube::Error::Api(s)) if s.is_already_exists() => {
                        return Ok(Outcome::At(tokio::time::Instant::now()))
                    }
                    Err(e) => return Err(e.into()),
                }
                (Keys { current: Some(attestation::Key::from_bytes(&current, "current")?), previous: None }, now)
            }
            Some(secret) if !is_managed(&secret.metadata) => {
                return Err(Error::Source {
                    what: format!("Secret {ns}/{name}"),
                    reason: "exists and is not managed by keyward (no label app.kubernetes.io/managed-by=keyward); remove it, or name another with --attestation-secret".into(),
                });
            }
            Some(secret) => {
                let rotated_at = secret
                    .annotations()
                    .get(objects::ROTATED_AT)
                    .and_then(|t| time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok());
                let current = read(&secret, attestation::CURRENT_FILE);
                let due = rotated_at.is_none_or(|t| now >= t + rotation) || current.is_none();
                if due {
                    // Rotate: the current key becomes the previous one, which still verifies.
                    let fresh = attestation::generate()?;
                    let previous = current.as_ref().map(|(_, bytes)| bytes.clone());
                    let desired = objects::attestation_secret(ns, name, &fresh, previous.as_deref(), &rfc3339(now));
                    let mut patch =
                        objects::merge_patch(&desired, secret.metadata.resource_version.as_deref().unwrap_or_default());
                    if previous.is_none() {
                        patch["data"][attestation::PREVIOUS_FILE] = serde_json::Value::Null;
                    }
                    self.leader.check()?;
                    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                    tracing::info!(namespace = %ns, name = %name, "attestation key rotated; the previous key stays valid for one more period");
                    let previous = current.map(|(k, _)| k);
                    (Keys { current: Some(attestation::Key::from_bytes(&fresh, "current")?), previous }, now)
                } else {
                    let keys = Keys {
                        current: current.map(|(k, _)| k),
                        previous: read(&secret, attestation::PREVIOUS_FILE).map(|(k, _)| k),
                    };
                    (keys, rotated_at.unwrap_or(now))
                }
            }
        };
        self.keys.store(Arc::new(Some(keys)));
        let next = rotated_at + rotation - now;
        let wait = Duration::try_from(next).unwrap_or_default().max(Duration::from_secs(1));
        Ok(Outcome::At(tokio::time::Instant::now() + wait))
    }

    /// The self-managed serving certificate and `caBundle`, and the self-managed client CA,
    /// when keyward manages them.
    pub async fn serving_cert(&self) -> Result<Outcome, Error> {
        let ns = &self.settings.namespace;
        if let Some(name) = &self.settings.client_ca_secret {
            let validity = Duration::from_secs(10 * 365 * 86_400);
            crate::self_managed::client_ca(&self.client, &self.leader, &self.metrics, ns, name, validity).await?;
        }
        match &self.settings.serving {
            Some(serving) => {
                crate::self_managed::reconcile(&self.client, &self.leader, &self.metrics, ns, serving).await
            }
            None => Ok(Outcome::Done),
        }
    }

    /// The webhook configuration's `matchConditions`, when keyward keeps them.
    pub async fn match_conditions(&self) -> Result<Outcome, Error> {
        match &self.settings.match_conditions_of {
            Some(name) => {
                crate::webhook_config::reconcile(&self.client, &self.leader, &self.metrics, name, &self.profiles).await
            }
            None => Ok(Outcome::Done),
        }
    }

    // === shared ===

    /// Creates `desired`, or replaces a managed object whose content differs; never touches
    /// an object keyward does not manage. Reads the current object from `store` when given;
    /// when the store is behind the API server (a write refused as AlreadyExists or Conflict),
    /// reads it from the API once and decides again.
    async fn ensure<K>(&self, ns: &str, store: Option<&Store<K>>, desired: K, same: Same<K>) -> Result<Action, Error>
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

    async fn write_if_needed<K>(
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
    async fn record(
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

    // === reports ===

    /// Reports a pod keyward issues nothing for, once per pod and reason: a log line, the
    /// metric, and a Warning Event on the pod saying `why` (none in a namespace that did not
    /// opt in: keyward writes nothing there, so pods there cost it no API call).
    pub async fn report_pod(&self, pod: &PodKey, uid: &str, refusal: Refusal, why: &str) {
        if !lock(&self.reported).insert((uid.to_string(), refusal)) {
            return;
        }
        self.metrics.refused(refusal);
        let advice = match refusal {
            Refusal::OptedOut | Refusal::NamespaceNotOptedIn | Refusal::UnverifiableOwner => "",
            _ => "; have the operator create the pod again",
        };
        let note = format!("keyward issues nothing for this pod's owner: {why}{advice}");
        tracing::warn!(namespace = %pod.namespace, pod = %pod.name, reason = refusal.as_str(), why = %clip(why, 1024), "pod refused: nothing issued");
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(uid.to_string()),
            ..ObjectReference::default()
        };
        if refusal != Refusal::NamespaceNotOptedIn {
            self.event(refusal.event_reason(), &clip(&note, 1024), "Issue", &regarding).await;
        }
    }

    /// Forgets the reports about a pod (deleted), so a new pod of that name is reported anew.
    pub fn forget_reports(&self, uid: &str) {
        lock(&self.reported).retain(|(who, _)| who != uid);
    }

    async fn report_owner(&self, key: &OwnerKey, owner: &Owner) {
        if !lock(&self.reported).insert((key.uid.clone(), Refusal::OwnerMissing)) {
            return;
        }
        self.metrics.refused(Refusal::OwnerMissing);
        tracing::warn!(namespace = %key.namespace, owner_kind = %owner.kind, owner = %owner.name, uid = %owner.uid,
            "the pod's controller owner does not exist with the UID the pod names; nothing issued");
    }

    /// A Secret with keyward's labels that keyward cannot vouch for: left alone, reported.
    async fn report_secret(&self, d: &Desired, owner: &Owner) {
        if !lock(&self.reported).insert((format!("{}/{}", d.namespace, d.name), Refusal::UnverifiedSecret)) {
            return;
        }
        self.metrics.refused(Refusal::UnverifiedSecret);
        let note = format!(
            "Secret {}/{} carries keyward's labels but holds nothing keyward issued for {} {} (uid {}), and the pod has no admission attestation; keyward leaves it alone. Delete it, and have the operator create the pod again",
            d.namespace, d.name, owner.kind, owner.name, owner.uid
        );
        tracing::warn!(namespace = %d.namespace, name = %d.name, "a Secret with keyward's labels that keyward did not issue; left alone");
        self.event("UnverifiedSecret", &note, "Issue", &namespace_ref(&d.namespace)).await;
    }

    /// Reports `condition` on `subject` when it starts or its message changes: a log line, the
    /// metric, and an Event on `regarding` when there is an object to attach it to.
    async fn raise(&self, condition: Condition, subject: &str, note: &str, regarding: Option<ObjectReference>) {
        if self.conditions.raise(condition, subject, note) != Change::Raised {
            return;
        }
        self.metrics.set_conditions(condition, self.conditions.count(condition));
        tracing::warn!(
            condition = condition.as_str(),
            subject,
            note,
            "condition: keyward carries on with everything else"
        );
        if let Some(regarding) = regarding {
            let reason = match condition {
                Condition::ClientCaNamespaceMissing => "ClientCaNamespaceMissing",
                Condition::ServerCaSourceUnusable => "ServerCaSourceUnusable",
            };
            self.event(reason, note, "Provision", &regarding).await;
        }
    }

    /// Says that `condition` on `subject` no longer holds, if it did.
    fn resolve(&self, condition: Condition, subject: &str) {
        if self.conditions.clear(condition, subject) == Change::Cleared {
            self.metrics.set_conditions(condition, self.conditions.count(condition));
            tracing::info!(condition = condition.as_str(), subject, "condition resolved");
        }
    }

    /// Reports an object keyward would write whose name someone else's object has: a log line
    /// and an Event (on the owner when there is one, else on the namespace).
    async fn report_foreign(&self, d: &Desired, owner: Option<&Owner>) {
        let note = format!(
            "{} {}/{} exists and is not managed by keyward (no label app.kubernetes.io/managed-by=keyward); keyward leaves it alone, and pods of profile {:?} get its content, not keyward's. Rename or remove it",
            d.want.object_kind(), d.namespace, d.name, d.profile
        );
        tracing::warn!(namespace = %d.namespace, name = %d.name, kind = d.want.object_kind(), profile = %d.profile, "name taken by an object keyward does not manage; left alone");
        let regarding = match owner {
            Some(o) => ObjectReference {
                api_version: Some(o.api_version.clone()),
                kind: Some(o.kind.clone()),
                name: Some(o.name.clone()),
                namespace: Some(d.namespace.clone()),
                uid: Some(o.uid.clone()),
                ..ObjectReference::default()
            },
            None => namespace_ref(&d.namespace),
        };
        self.event("NameTaken", &note, "Provision", &regarding).await;
    }

    // === pod certificates ===

    /// Answers the PodCertificateRequest `namespace/name` if it is for one of keyward's signers
    /// and not answered yet: the owner's certificate for the kubelet's key, or a denial that
    /// says why (and an Event on the request). Every fact is read fresh from the API: a denial
    /// is final for the pod.
    pub async fn sign(
        &self,
        version: signer::ApiVersion,
        namespace: &str,
        name: &str,
        siblings: &OwnerPods<'_>,
    ) -> Result<Outcome, Error> {
        if self.settings.pod_certificates.is_empty() {
            return Ok(Outcome::Done);
        }
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &version.api_resource());
        let Some(object) = api.get_opt(name).await? else {
            return Ok(Outcome::Done);
        };
        let request = match signer::Request::read(&object) {
            Ok(r) if !r.decided && signer::is_keyward_signer(&r.signer_name) => r,
            Ok(_) => return Ok(Outcome::Done),
            Err(why) => {
                tracing::warn!(%namespace, %name, %why, "a PodCertificateRequest keyward cannot read; left alone");
                return Ok(Outcome::Done);
            }
        };
        if signer::answered_elsewhere(&request, version, &self.settings.pod_certificates) {
            tracing::debug!(%namespace, %name, "no key readable at v1: answered at v1beta1");
            return Ok(Outcome::Done);
        }
        let keys = self.attestation_keys().ok_or(Error::NoAttestationKeys)?;
        let opted_in = Api::<Namespace>::all(self.client.clone())
            .get_opt(namespace)
            .await?
            .is_some_and(|n| label(&n.metadata, desired::OPT_IN.0) == Some(desired::OPT_IN.1));
        let pod = Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &crate::run::pod_resource())
            .get_opt(&request.pod_name)
            .await?
            .and_then(|p| serde_json::value::to_raw_value(&p).ok());
        let facts = signer::Facts {
            pod: pod.as_deref(),
            opted_in,
            keys: &keys,
            trust_domain: &self.settings.trust_domain,
            validity: self.settings.client_cert_validity,
        };
        let now = SystemTime::now();
        let generation = object.metadata.generation;
        let verdict = match signer::decide(&request, &self.profiles, facts) {
            signer::Verdict::Issue { owner, identity, profile, validity, pod } => {
                let mut check = OwnerCheck::default();
                let owner_key = OwnerKey { namespace: namespace.to_string(), uid: owner.uid.clone() };
                let Some(others) = siblings(&owner_key, &keys) else {
                    tracing::debug!(%namespace, %name, "the pod watches have not listed yet; the request waits a second");
                    return Ok(Outcome::At(tokio::time::Instant::now() + Duration::from_secs(1)));
                };
                if let Err(why) = first_of_its_attestation(&pod, &others) {
                    let reason = Refusal::DuplicateAttestation.denial_reason();
                    Err((reason, format!("pod {namespace}/{}: {why}", request.pod_name)))
                } else if self.owner_verified(namespace, &owner, &mut check).await? {
                    Ok((owner, identity, profile, validity))
                } else {
                    Err((
                        "OwnerMissing",
                        format!(
                            "its owner {} {} does not exist with UID {}: keyward issues only for a live owner",
                            owner.kind, owner.name, owner.uid
                        ),
                    ))
                }
            }
            signer::Verdict::Deny { reason, message } => Err((reason, message)),
        };
        let regarding = object.object_ref(&version.api_resource());
        let (status, result, note) = match verdict {
            Ok((owner, identity, profile, validity)) => {
                let window = signer::window(now, validity);
                let issued = request
                    .public_key
                    .as_deref()
                    .map_err(|reason| Error::Source { what: "the requested public key".into(), reason: reason.clone() })
                    .and_then(|spki| identity::issue_for_key(&self.ca()?, namespace, &owner, &identity, spki, &window));
                let chain = match issued {
                    Ok(chain) => chain,
                    Err(e) => return Err(self.sign_failed(&regarding, e).await),
                };
                let not_after = keyward_certs::rfc3339(window.not_after);
                tracing::info!(%namespace, %name, pod = %request.pod_name, %identity, %profile, %not_after, "pod certificate issued");
                let note = format!("issued {identity} for pod {}, valid until {not_after}", request.pod_name);
                (signer::issued_status(&chain, &window, &identity, now, generation), "issued", note)
            }
            Err((reason, message)) => {
                tracing::warn!(%namespace, %name, pod = %request.pod_name, %reason, %message, "pod certificate request denied");
                (signer::denied_status(reason, &message, now, generation), "denied", message)
            }
        };
        let mut answered = object.clone();
        answered.data["status"] = status;
        self.leader.check()?;
        if let Err(e) = api.replace_status(name, &PostParams::default(), &answered).await {
            return Err(self.sign_failed(&regarding, e.into()).await);
        }
        self.metrics.pod_certificate(result);
        match result {
            "issued" => self.publish(EventType::Normal, "PodCertificateIssued", &note, "Sign", &regarding).await,
            _ => self.event("PodCertificateDenied", &note, "Sign", &regarding).await,
        }
        Ok(Outcome::Done)
    }

    /// A request that could not be answered (retried with backoff): counted, and a Warning
    /// Event on it saying why.
    async fn sign_failed(&self, regarding: &ObjectReference, e: Error) -> Error {
        self.metrics.pod_certificate("failed");
        let note = format!("keyward could not answer this request and retries: {e}");
        self.event("PodCertificateFailed", &note, "Sign", regarding).await;
        e
    }

    /// A Warning Event on `regarding`, written by the leader only.
    async fn event(&self, reason: &str, note: &str, action: &str, regarding: &ObjectReference) {
        self.publish(EventType::Warning, reason, note, action, regarding).await;
    }

    /// An Event of `type_` on `regarding`, written by the leader only.
    async fn publish(&self, type_: EventType, reason: &str, note: &str, action: &str, regarding: &ObjectReference) {
        if !self.leader.is_leader() {
            return;
        }
        let event =
            Event { type_, reason: reason.into(), note: Some(note.into()), action: action.into(), secondary: None };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            tracing::debug!(error = %e, "could not record the event");
        }
    }
}

/// What is known of an owner during one reconcile.
#[derive(Debug, Default)]
struct OwnerCheck {
    /// Whether it exists with the pod's UID, once asked.
    exists: Option<bool>,
    /// It was asked, and does not.
    missing: bool,
}

/// Every object matching `selector`, a page of 500 at a time.
async fn list_all<K>(api: Api<K>, selector: &str) -> Result<Vec<Arc<K>>, Error>
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

fn source_name(source: &SourceKey) -> String {
    format!(
        "serverCA source {} {}/{} key {}",
        if source.config_map { "ConfigMap" } else { "Secret" },
        source.namespace,
        source.name,
        source.key
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Until when a published client CA bundle keeps the CA it replaced (its annotation).
fn previous_until(meta: &kube::api::ObjectMeta) -> Option<SystemTime> {
    meta.annotations.as_ref()?.get(signer::PREVIOUS_UNTIL).and_then(|t| keyward_certs::parse_rfc3339(t))
}

fn label<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref().and_then(|l| l.get(key)).map(String::as_str)
}

fn namespace_ref(namespace: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Namespace".into()),
        name: Some(namespace.into()),
        ..ObjectReference::default()
    }
}

/// Whether the existing object carries everything keyward's metadata says (labels,
/// annotations, owner), so that a content match means nothing to write.
fn metadata_holds(existing: &kube::api::ObjectMeta, desired: &kube::api::ObjectMeta) -> bool {
    let subset = |want: &Option<BTreeMap<String, String>>, have: &Option<BTreeMap<String, String>>| {
        want.iter().flatten().all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    subset(&desired.labels, &existing.labels) && subset(&desired.annotations, &existing.annotations)
}

fn owned_by(meta: &kube::api::ObjectMeta, owner: &Owner) -> bool {
    meta.owner_references.iter().flatten().any(|r| r.uid == owner.uid && r.controller == Some(true))
}

fn kind_label(kind: &'static str) -> &'static str {
    match kind {
        "ConfigMap" => "config-map",
        "Secret" => "secret",
        "ServiceAccount" => "service-account",
        "RoleBinding" => "role-binding",
        _ => "object",
    }
}
