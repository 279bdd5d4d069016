//! Reconciling: the thin layer between what is desired and the API. Every write is preceded by
//! the leadership check, and no object without keyward's `managed-by` label is ever changed
//! or deleted: a name taken by someone else is reported (an Event, a log line, a metric) and
//! left alone.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::NamespaceResourceScope;
use keyward_certs::pki::Ca;
use keyward_certs::CertStore;
use keyward_engine::ProfileSet;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::conditions::{Change, Condition, Conditions};
use crate::desired::{self, Desired, Owner, PodVerdict, Want};
use crate::error::Error;
use crate::identity::{self, Renewal, CA_CRT, TLS_CRT, TLS_KEY};
use crate::leader::Leadership;
use crate::metrics::{Action, Metrics};
use crate::objects::{self, is_managed, Scope};

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
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            trust_domain: "cluster.local".into(),
            client_cert_validity: Duration::from_secs(24 * 3600),
            operator_namespaces: BTreeMap::new(),
            client_ca_config_map: "keyward-client-ca".into(),
            publish_client_ca_to: Vec::new(),
        }
    }
}

pub struct Reconciler {
    client: Client,
    profiles: Arc<ProfileSet>,
    settings: Settings,
    client_ca: Arc<CertStore>,
    leader: Leadership,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    conditions: Conditions,
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
        Self { client, profiles, settings, client_ca, leader, metrics, recorder, conditions: Conditions::default() }
    }

    pub fn profiles(&self) -> &ProfileSet {
        &self.profiles
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
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
                // A source that is missing or holds no certificate is not this namespace's
                // failure: the copy already there (if any) stays, the condition is reported,
                // and the source's watch brings this back when it changes.
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
        match &d.want {
            Want::ServerCa { config_map, key, source } => {
                let pem = self.read_source(source).await?;
                if *config_map {
                    let object = objects::server_ca_config_map(d, key, &pem);
                    self.ensure(Api::<ConfigMap>::namespaced(self.client.clone(), ns), object, |a, b| a.data == b.data)
                        .await
                } else {
                    let object = objects::server_ca_secret(d, key, &pem);
                    self.ensure(Api::<Secret>::namespaced(self.client.clone(), ns), object, |a, b| a.data == b.data)
                        .await
                }
            }
            Want::ServiceAccount => {
                let object = objects::service_account(d);
                self.ensure(Api::<ServiceAccount>::namespaced(self.client.clone(), ns), object, |_, _| true).await
            }
            Want::RoleBinding { account, role } => {
                let object = objects::role_binding(d, account, role);
                let same: Same<RoleBinding> = |a, b| a.role_ref == b.role_ref && a.subjects == b.subjects;
                self.ensure(Api::<RoleBinding>::namespaced(self.client.clone(), ns), object, same).await
            }
            Want::ClientCertificate { .. } | Want::Token { .. } => Ok(Action::Unchanged),
        }
    }

    /// The CA text from a source key, checked to be PEM certificates.
    async fn read_source(&self, source: &desired::SourceKey) -> Result<String, Error> {
        let what = format!(
            "serverCA source {} {}/{} key {}",
            if source.config_map { "ConfigMap" } else { "Secret" },
            source.namespace,
            source.name,
            source.key
        );
        let text = if source.config_map {
            let api = Api::<ConfigMap>::namespaced(self.client.clone(), &source.namespace);
            let object = api.get_opt(&source.name).await?;
            object.and_then(|o| o.data).and_then(|mut d| d.remove(&source.key))
        } else {
            let api = Api::<Secret>::namespaced(self.client.clone(), &source.namespace);
            let object = api.get_opt(&source.name).await?;
            object
                .and_then(|o| o.data)
                .and_then(|mut d| d.remove(&source.key))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        };
        let text = text.ok_or_else(|| Error::Source { what: what.clone(), reason: "missing".into() })?;
        keyward_certs::pem::cert_info(text.as_bytes(), source.key.as_ref())
            .map_err(|e| Error::Source { what, reason: format!("not a PEM certificate: {e}") })?;
        Ok(text)
    }

    /// Removes what keyward provisioned per namespace where no longer wanted: namespaces that
    /// opted out, and objects no profile wants any more.
    pub async fn sweep_namespaces(&self, opted_in: &BTreeSet<String>) -> Result<(), Error> {
        let mut wanted: BTreeMap<String, BTreeSet<(&'static str, String)>> = BTreeMap::new();
        for ns in opted_in {
            let (desired, _) = desired::for_namespace(&self.profiles, ns, &self.settings.operator_namespaces);
            wanted.insert(ns.clone(), desired.into_iter().map(|d| (d.want.object_kind(), d.name)).collect());
        }
        let keep = |kind: &'static str, ns: &str, name: &str| {
            wanted.get(ns).is_some_and(|set| set.contains(&(kind, name.to_string())))
        };
        let selector = objects::managed_selector(Scope::Namespace);
        self.sweep::<ConfigMap>("ConfigMap", &selector, &keep).await?;
        self.sweep::<Secret>("Secret", &selector, &keep).await?;
        self.sweep::<ServiceAccount>("ServiceAccount", &selector, &keep).await?;
        self.sweep::<RoleBinding>("RoleBinding", &selector, &keep).await?;
        Ok(())
    }

    async fn sweep<K>(
        &self,
        kind: &'static str,
        selector: &str,
        keep: &(dyn Fn(&'static str, &str, &str) -> bool + Sync),
    ) -> Result<(), Error>
    where
        K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
    {
        let list = Api::<K>::all(self.client.clone()).list(&ListParams::default().labels(selector)).await?;
        for object in list.items {
            let (ns, name) = (object.namespace().unwrap_or_default(), object.name_any());
            if keep(kind, &ns, &name) || !is_managed(object.meta()) {
                continue;
            }
            self.leader.check()?;
            let api = Api::<K>::namespaced(self.client.clone(), &ns);
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(namespace = %ns, name = %name, kind, "removed: the namespace opted out, or no profile provides it any more");
                    self.metrics.object(kind_label(kind), Action::Deleted, true);
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => {
                    self.metrics.object(kind_label(kind), Action::Deleted, false);
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    // === per owner ===

    /// Issues what a live pod's owner needs, after re-evaluating the profile on the pod and
    /// checking that the owner exists with the UID the pod names.
    pub async fn pod(&self, pod: &Pod) -> Result<(), Error> {
        let raw = serde_json::value::to_raw_value(pod).map_err(|e| Error::Malformed(e.to_string()))?;
        let ns = pod.namespace().unwrap_or_default();
        let (profile, owner, wants) = match desired::for_pod(&self.profiles, &raw, &ns, &self.settings.trust_domain) {
            PodVerdict::Issue { profile, owner, wants } => (profile, owner, wants),
            PodVerdict::Nothing(why) => {
                tracing::debug!(namespace = %pod.namespace().unwrap_or_default(), pod = %pod.name_any(), %why, "nothing to issue");
                return Ok(());
            }
        };
        if wants.is_empty() {
            return Ok(());
        }
        if !self.owner_exists(&ns, &owner).await? {
            tracing::warn!(namespace = %ns, pod = %pod.name_any(), profile, owner_kind = %owner.kind, owner = %owner.name, uid = %owner.uid,
                "the pod's controller owner does not exist with the UID the pod names; nothing issued");
            return Ok(());
        }
        let mut first_error = None;
        for d in &wants {
            let result = match &d.want {
                Want::ClientCertificate { owner, identity } => self.ensure_client_certificate(d, owner, identity).await,
                Want::Token { owner, key } => self.ensure_token(d, owner, key).await,
                _ => Ok(Action::Unchanged),
            };
            self.record(d, Some(&owner), result, Action::Issued, &mut first_error).await;
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn owner_exists(&self, namespace: &str, owner: &Owner) -> Result<bool, Error> {
        let gvk = GroupVersionKind::gvk(owner.group(), owner.version(), &owner.kind);
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &ApiResource::from_gvk(&gvk));
        let found = api.get_opt(&owner.name).await?;
        Ok(found.is_some_and(|o| o.metadata.uid.as_deref() == Some(owner.uid.as_str())))
    }

    async fn ensure_client_certificate(&self, d: &Desired, owner: &Owner, identity: &str) -> Result<Action, Error> {
        let existing = Api::<Secret>::namespaced(self.client.clone(), &d.namespace).get_opt(&d.name).await?;
        let (action, _) = self.certificate(d, owner, identity, existing, &self.ca()?).await?;
        Ok(action)
    }

    /// The client certificate for `owner`, given its Secret as read (if any): issued, renewed,
    /// or left as it is. Returns what was done, and when the certificate now there expires.
    async fn certificate(
        &self,
        d: &Desired,
        owner: &Owner,
        identity: &str,
        existing: Option<Secret>,
        ca: &Ca,
    ) -> Result<(Action, Option<SystemTime>), Error> {
        let why = match &existing {
            None => None,
            Some(s) if !is_managed(&s.metadata) => return Ok((Action::Foreign, None)),
            Some(s) if !owned_by(&s.metadata, owner) => Some("it belongs to an earlier owner of that name".to_string()),
            Some(s) => {
                let data = s.data.as_ref();
                let get = |k: &str| data.and_then(|d| d.get(k)).map(|b| b.0.as_slice());
                match identity::renewal(
                    get(TLS_CRT),
                    get(TLS_KEY),
                    get(CA_CRT),
                    ca.cert_pem(),
                    identity,
                    SystemTime::now(),
                ) {
                    Renewal::Fresh { not_after } => return Ok((Action::Unchanged, Some(not_after))),
                    Renewal::Due(reason) => Some(reason),
                }
            }
        };
        let issued =
            identity::issue(ca, &d.namespace, owner, identity, SystemTime::now(), self.settings.client_cert_validity)?;
        let mut secret =
            objects::client_certificate_secret(d, owner, &issued.cert_pem, &issued.key_pem, &issued.ca_pem);
        let api = Api::<Secret>::namespaced(self.client.clone(), &d.namespace);
        self.leader.check()?;
        let action = match existing {
            None => {
                api.create(&PostParams::default(), &secret).await?;
                tracing::info!(namespace = %d.namespace, name = %d.name, %identity, profile = %d.profile, "client certificate issued");
                Action::Issued
            }
            Some(old) => {
                // One update replaces tls.crt and tls.key together.
                secret.metadata.resource_version = old.metadata.resource_version;
                api.replace(&d.name, &PostParams::default(), &secret).await?;
                tracing::info!(namespace = %d.namespace, name = %d.name, %identity, reason = why.unwrap_or_default(), "client certificate renewed");
                Action::Renewed
            }
        };
        Ok((action, Some(issued.not_after)))
    }

    async fn ensure_token(&self, d: &Desired, owner: &Owner, key: &str) -> Result<Action, Error> {
        let api = Api::<Secret>::namespaced(self.client.clone(), &d.namespace);
        match api.get_opt(&d.name).await? {
            None => {
                let secret = objects::token_secret(d, owner, key, &identity::generate_token()?);
                self.leader.check()?;
                api.create(&PostParams::default(), &secret).await?;
                tracing::info!(namespace = %d.namespace, name = %d.name, profile = %d.profile, "token generated");
                Ok(Action::Issued)
            }
            Some(s) if !is_managed(&s.metadata) => Ok(Action::Foreign),
            Some(mut s) => {
                // A token is never replaced: a new one would lock out whoever holds the old.
                let has_key = s.data.as_ref().is_some_and(|d| d.contains_key(key));
                let owned = owned_by(&s.metadata, owner);
                if has_key && owned {
                    return Ok(Action::Unchanged);
                }
                if !has_key {
                    tracing::warn!(namespace = %d.namespace, name = %d.name, key, "the token Secret lacks its key; adding a new token under it (the Secret's other keys are kept)");
                    s.data
                        .get_or_insert_with(BTreeMap::new)
                        .insert(key.to_string(), k8s_openapi::ByteString(identity::generate_token()?.into_bytes()));
                }
                s.metadata.owner_references =
                    objects::meta(&d.namespace, &d.name, None, Scope::Owner, Some(owner)).owner_references;
                self.leader.check()?;
                api.replace(&d.name, &PostParams::default(), &s).await?;
                Ok(Action::Issued)
            }
        }
    }

    /// Renews every client certificate keyward issued that is due, and sets the time to the
    /// next expiry.
    pub async fn renew_all(&self) -> Result<(), Error> {
        let api = Api::<Secret>::all(self.client.clone());
        let list = api.list(&ListParams::default().labels(&objects::managed_selector(Scope::Owner))).await?;
        let now = SystemTime::now();
        let mut soonest: Option<SystemTime> = None;
        let mut first_error = None;
        // Loaded once, and only if there is a certificate to look at.
        let mut ca: Option<Ca> = None;
        for secret in list.items {
            if secret.type_.as_deref() != Some("kubernetes.io/tls") || !is_managed(&secret.metadata) {
                continue;
            }
            let Some(reference) =
                secret.metadata.owner_references.as_ref().and_then(|r| r.iter().find(|o| o.controller == Some(true)))
            else {
                continue;
            };
            let ns = secret.namespace().unwrap_or_default();
            let owner = Owner {
                api_version: reference.api_version.clone(),
                kind: reference.kind.clone(),
                name: reference.name.clone(),
                uid: reference.uid.clone(),
            };
            let identity = desired::spiffe_id(&self.settings.trust_domain, &ns, &owner.kind, &owner.name);
            let d = Desired {
                namespace: ns,
                name: secret.name_any(),
                profile: secret.annotations().get(desired::PROFILE_ANNOTATION).cloned().unwrap_or_default(),
                want: Want::ClientCertificate { owner: owner.clone(), identity: identity.clone() },
            };
            let ca = match &mut ca {
                Some(ca) => ca,
                None => ca.insert(self.ca()?),
            };
            match self.certificate(&d, &owner, &identity, Some(secret), ca).await {
                Ok((action, not_after)) => {
                    if action == Action::Renewed {
                        self.metrics.object("client-certificate", Action::Renewed, true);
                    }
                    if let Some(not_after) = not_after {
                        soonest = Some(soonest.map_or(not_after, |s| s.min(not_after)));
                    }
                }
                Err(e) => {
                    self.metrics.object("client-certificate", Action::Renewed, false);
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(at) = soonest {
            let seconds = at.duration_since(now).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
            self.metrics.set_next_expiry(seconds);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Publishes the client CA's certificate to the namespaces named, and removes it from
    /// those no longer named.
    pub async fn publish_client_ca(&self) -> Result<(), Error> {
        if self.settings.publish_client_ca_to.is_empty() {
            return Ok(());
        }
        let ca = self.ca()?;
        let mut first_error = None;
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
            let object = objects::client_ca_config_map(ns, &self.settings.client_ca_config_map, ca.cert_pem());
            let api = Api::<ConfigMap>::namespaced(self.client.clone(), ns);
            match self.ensure(api, object, |a, b| a.data == b.data).await {
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
        let named: BTreeSet<String> = self.settings.publish_client_ca_to.iter().cloned().collect();
        let name = self.settings.client_ca_config_map.clone();
        let keep = move |_: &'static str, ns: &str, n: &str| named.contains(ns) && n == name;
        self.sweep::<ConfigMap>("ConfigMap", &objects::managed_selector(Scope::ClientCa), &keep).await?;
        first_error.map_or(Ok(()), Err)
    }

    // === conditions ===

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

    // === shared ===

    /// Creates `desired`, or replaces a managed object whose content differs; never touches
    /// an object keyward does not manage.
    async fn ensure<K>(&self, api: Api<K>, mut desired: K, same: Same<K>) -> Result<Action, Error>
    where
        K: Resource + Clone + Serialize + DeserializeOwned + Debug,
    {
        let name = desired.meta().name.clone().ok_or_else(|| Error::Malformed("a desired object".into()))?;
        match api.get_opt(&name).await? {
            None => {
                self.leader.check()?;
                api.create(&PostParams::default(), &desired).await?;
                Ok(Action::Provisioned)
            }
            Some(existing) if !is_managed(existing.meta()) => Ok(Action::Foreign),
            Some(existing) if same(&existing, &desired) && metadata_holds(existing.meta(), desired.meta()) => {
                Ok(Action::Unchanged)
            }
            Some(existing) => {
                desired.meta_mut().resource_version = existing.meta().resource_version.clone();
                self.leader.check()?;
                api.replace(&name, &PostParams::default(), &desired).await?;
                Ok(Action::Provisioned)
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

    /// A Warning Event on `regarding`, written by the leader only.
    async fn event(&self, reason: &str, note: &str, action: &str, regarding: &ObjectReference) {
        if !self.leader.is_leader() {
            return;
        }
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note.into()),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            tracing::debug!(error = %e, "could not record the event");
        }
    }
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
