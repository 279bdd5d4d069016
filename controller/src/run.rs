//! The controller's loop: watches that say what changed, kept in small stores; a work queue
//! that coalesces keys, runs a bounded number at once (one worker per key, namespaces taking
//! turns) and retries with backoff; and a slow resync that repairs what a missed event left.
//!
//! Steady state is watches plus Lease renewals: an owner's certificate costs a request only
//! when it is issued or renewed, a namespace's objects are compared with their watched copies,
//! and pods in namespaces that did not opt in are dropped as they arrive. Only the leader works
//! the queue; a replica that becomes leader reconciles everything once.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::attestation::Sibling;
use crate::desired::{self, PodVerdict, SourceKey, OPT_IN};
use crate::index::{OwnerKey, PodIndex, PodKey};
use crate::leader::Leadership;
use crate::queue::{Outcome, Queue, QueueKey};
use crate::reconcile::{Reconciler, Stores};
use keyward_engine::ProfileSet;

/// One unit of work; equal keys queued twice are done once.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// The per-namespace objects of an opted-in namespace.
    Namespace(String),
    /// A namespace opted out: remove what keyward provisioned there.
    OptOut(String),
    /// A namespace opted in: find the pods already there.
    ListPods(String),
    /// An owner's per-owner objects.
    Owner(OwnerKey),
    AllNamespaces,
    /// Removing what no profile wants any more, and what a missed opt-out left.
    Sweep,
    /// Publishing the client CA to `--publish-client-ca-to`.
    PublishClientCa,
    /// Writing the cluster facts for the webhook.
    ClusterFacts,
    /// Publishing server CAs as ClusterTrustBundles.
    ServerCaBundles,
    /// Reading the server CA sources again.
    Sources,
    /// The attestation key Secret: created, rotated, read.
    AttestationKey,
    /// The self-managed serving certificate Secret and the webhook's `caBundle`.
    ServingCert,
    /// The webhook configuration's `matchConditions`.
    MatchConditions,
    /// A PodCertificateRequest for one of keyward's signers, at the version it was seen at.
    CertificateRequest {
        version: crate::signer::ApiVersion,
        namespace: String,
        name: String,
    },
}

impl Key {
    /// What the periodic resync, and a replica that becomes leader, queue.
    pub const EVERYTHING: [Key; 9] = [
        Key::ServingCert,
        Key::MatchConditions,
        Key::AttestationKey,
        Key::Sources,
        Key::AllNamespaces,
        Key::Sweep,
        Key::PublishClientCa,
        Key::ClusterFacts,
        Key::ServerCaBundles,
    ];
}

impl QueueKey for Key {
    fn namespace(&self) -> &str {
        match self {
            Key::Namespace(ns) | Key::OptOut(ns) | Key::ListPods(ns) => ns,
            Key::Owner(o) => &o.namespace,
            Key::CertificateRequest { namespace, .. } => namespace,
            _ => "",
        }
    }
}

/// Readiness: the namespace watch has listed once.
#[derive(Debug, Default)]
pub struct Status {
    pub namespaces_synced: AtomicBool,
}

impl Status {
    pub fn ready(&self) -> Result<(), String> {
        if self.namespaces_synced.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("the namespace watch has not listed yet".into())
        }
    }
}

/// Readiness: the namespace watch has listed, and, when profiles issue client certificates,
/// a client CA that can sign is loaded.
pub fn readiness(status: &Status, client_ca: Option<&keyward_certs::CertStore>) -> Result<(), String> {
    status.ready()?;
    match client_ca {
        Some(store) => store.ready(std::time::SystemTime::now()).map_err(|e| format!("client CA: {e}")),
        None => Ok(()),
    }
}

/// How the loop runs.
#[derive(Debug, Clone)]
pub struct LoopSettings {
    /// How often everything but owners is reconciled even without a change (owners come back
    /// at their renewal).
    pub resync: Duration,
    /// Keys worked on at once.
    pub workers: usize,
}

impl Default for LoopSettings {
    fn default() -> Self {
        Self { resync: Duration::from_secs(300), workers: 8 }
    }
}

type Index = Arc<Mutex<PodIndex>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs the loop with the profile set of the moment until `shutdown` resolves. A new set (one
/// the caller validated whole) ends the loop and starts it again with the reconciler
/// `reconciler_for` makes for it: the watches, the pod selectors and every desired object
/// derive from the profiles, so starting over is how none is left stale. The Lease, the
/// metrics and readiness carry across; a leader reconciles everything again at once.
pub async fn run_reloading(
    client: Client,
    mut profiles: tokio::sync::watch::Receiver<Arc<ProfileSet>>,
    reconciler_for: impl Fn(Arc<ProfileSet>) -> Arc<Reconciler>,
    leadership: Leadership,
    settings: LoopSettings,
    status: Arc<Status>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    futures::pin_mut!(shutdown);
    loop {
        let set = profiles.borrow_and_update().clone();
        let reconciler = reconciler_for(set);
        let reloads = reconciler.client_ca().subscribe();
        let mut changed = false;
        let stop = async {
            tokio::select! {
                () = &mut shutdown => {}
                // A dropped sender means no more reloads: wait for shutdown alone.
                Ok(()) = profiles.changed() => changed = true,
            }
        };
        run(client.clone(), reconciler, leadership.clone(), settings.clone(), status.clone(), reloads, stop).await;
        if !changed {
            return;
        }
        tracing::info!("profiles changed: the controller's loop starts again with the new set");
    }
}

/// Runs until `shutdown` resolves.
pub async fn run(
    client: Client,
    reconciler: Arc<Reconciler>,
    mut leadership: Leadership,
    settings: LoopSettings,
    status: Arc<Status>,
    mut ca_reloaded: tokio::sync::broadcast::Receiver<keyward_certs::ReloadEvent>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Key>();
    let index: Index = Arc::default();
    let mut tasks = JoinSet::new();

    // Opted-in namespaces: a store the pod events are filtered with.
    let (namespaces, writer) = reflector::store::<Namespace>();
    let opt_in = format!("{}={}", OPT_IN.0, OPT_IN.1);
    let stream = watcher(Api::<Namespace>::all(client.clone()), watcher::Config::default().labels(&opt_in))
        .default_backoff()
        .reflect(writer);
    tasks.spawn(namespace_events(stream, tx.clone(), index.clone(), reconciler.clone()));
    // One waiter on the store's readiness, fanned out: kube-runtime's `wait_until_ready` wakes
    // only the task that polled it last (a oneshot underneath), so with several waiters the
    // others would wait for ever (readiness never reported, pod watches never started).
    let (listed_tx, listed) = tokio::sync::watch::channel(false);
    let ready = namespaces.clone();
    let ns_status = status.clone();
    tasks.spawn(async move {
        if ready.wait_until_ready().await.is_ok() {
            ns_status.namespaces_synced.store(true, Ordering::Relaxed);
            let _ = listed_tx.send(true);
            // Held, so the waiters never see a closed channel.
            std::future::pending::<()>().await;
        }
    });

    // Pods, only those a profile with per-owner objects could select; each watch waits for
    // the namespace store, since its events are filtered with it.
    let selectors: Vec<String> = pod_selectors(&reconciler).into_iter().collect();
    for (stream_id, selector) in selectors.iter().enumerate() {
        let api = Api::<DynamicObject>::all_with(client.clone(), &pod_resource());
        let stream =
            watcher::watcher(api, watcher::Config::default().labels(selector).page_size(500)).default_backoff();
        let (tx, index, namespaces, reconciler) = (tx.clone(), index.clone(), namespaces.clone(), reconciler.clone());
        let mut listed = listed.clone();
        tasks.spawn(async move {
            if listed.wait_for(|done| *done).await.is_ok() {
                pod_events(stream_id, stream, tx, index, namespaces, reconciler).await;
            }
        });
    }

    // PodCertificateRequests of keyward's signers, not answered yet: each is signed or denied,
    // at every version keyward signs (a request is one object, whichever version shows it: a
    // request already answered is left alone).
    for version in reconciler.settings().pod_certificates.clone() {
        let api = Api::<kube::api::DynamicObject>::all_with(client.clone(), &version.api_resource());
        let stream = watcher::watcher(api, watcher::Config::default().page_size(500)).default_backoff();
        let tx = tx.clone();
        tasks.spawn(async move {
            let stream = stream.touched_objects();
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(object) => {
                        if let Ok(request) = crate::signer::Request::read(&object) {
                            if !request.decided && crate::signer::is_keyward_signer(&request.signer_name) {
                                let _ = tx.send(Key::CertificateRequest {
                                    version,
                                    namespace: request.namespace,
                                    name: request.name,
                                });
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "PodCertificateRequest watch failed; retrying with backoff"),
                }
            }
        });
    }

    // What keyward manages per namespace: watched, so a namespace is reconciled from memory
    // and a change by someone else is seen and repaired.
    let managed = format!("{}={}", desired::MANAGED_BY.0, desired::MANAGED_BY.1);
    let provision_accounts = reconciler.settings().provision_accounts;
    let stores = Stores {
        config_maps: watch_managed::<ConfigMap>(&client, &managed, &tx, &namespaces, &mut tasks),
        service_accounts: match provision_accounts {
            true => watch_managed::<ServiceAccount>(&client, &managed, &tx, &namespaces, &mut tasks),
            false => unwatched(),
        },
        role_bindings: match provision_accounts {
            true => watch_managed::<RoleBinding>(&client, &managed, &tx, &namespaces, &mut tasks),
            false => unwatched(),
        },
    };
    let ready_stores = stores.clone();
    let store_reconciler = reconciler.clone();
    let store_tx = tx.clone();
    tasks.spawn(async move {
        let ok = ready_stores.config_maps.wait_until_ready().await.is_ok()
            && ready_stores.service_accounts.wait_until_ready().await.is_ok()
            && ready_stores.role_bindings.wait_until_ready().await.is_ok();
        if ok {
            store_reconciler.use_stores(ready_stores);
            let _ = store_tx.send(Key::AllNamespaces);
        }
    });

    // The namespaces the client CA is published to: one that is created gets it at once.
    for ns in reconciler.settings().publish_client_ca_to.clone() {
        let fields = format!("metadata.name={ns}");
        let stream = watcher(Api::<Namespace>::all(client.clone()), watcher::Config::default().fields(&fields));
        touch(stream, &[Key::PublishClientCa], &tx, &mut tasks);
    }

    // keyward's ClusterTrustBundles (the client CA of each signer, the server CAs): one changed
    // or deleted by someone else is written again at once, not at the next resync.
    if let Some(version) = reconciler.settings().trust_bundles {
        let api = Api::<DynamicObject>::all_with(client.clone(), &version.trust_bundles());
        let stream = watcher::watcher(api, watcher::Config::default().labels(&managed).page_size(500));
        touch(stream, &[Key::PublishClientCa, Key::ServerCaBundles], &tx, &mut tasks);
    }
    // The cluster facts the webhook reads, by name: likewise.
    let fields = format!("metadata.name={}", keyward_engine::cluster::CONFIG_MAP);
    let api = Api::<ConfigMap>::namespaced(client.clone(), &reconciler.settings().namespace);
    touch(watcher(api, watcher::Config::default().fields(&fields)), &[Key::ClusterFacts], &tx, &mut tasks);

    // The self-managed serving certificate and client CA: their Secrets and the webhook
    // configuration, each watched by name, so a wiped caBundle or a damaged Secret is repaired
    // at once.
    let own = reconciler.settings();
    let secrets = own.serving.iter().map(|s| s.secret.clone()).chain(own.client_ca_secret.clone());
    for name in secrets {
        let fields = format!("metadata.name={name}");
        let api = Api::<Secret>::namespaced(client.clone(), &own.namespace);
        touch(watcher(api, watcher::Config::default().fields(&fields)), &[Key::ServingCert], &tx, &mut tasks);
    }
    // The webhook configuration, by name: a wiped caBundle or drifted matchConditions is
    // repaired at once. (Both name the same configuration, --webhook-config.)
    let config_keys: Vec<Key> =
        [(own.serving.is_some(), Key::ServingCert), (own.match_conditions_of.is_some(), Key::MatchConditions)]
            .into_iter()
            .filter_map(|(on, key)| on.then_some(key))
            .collect();
    let config_name =
        own.serving.as_ref().map(|s| s.webhook_config.clone()).or_else(|| own.match_conditions_of.clone());
    if let Some(name) = config_name {
        let fields = format!("metadata.name={name}");
        let api = Api::<MutatingWebhookConfiguration>::all(client.clone());
        touch(watcher(api, watcher::Config::default().fields(&fields)), &config_keys, &tx, &mut tasks);
    }

    // The periodic resync.
    let tick_tx = tx.clone();
    let resync = settings.resync;
    tasks.spawn(async move {
        let mut ticker = tokio::time::interval(resync);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            for key in Key::EVERYTHING {
                let _ = tick_tx.send(key);
            }
        }
    });
    // A new client CA: every owner's certificate is renewed, and the CA republished.
    let ca_tx = tx.clone();
    let ca_index = index.clone();
    tasks.spawn(async move {
        while let Ok(event) = ca_reloaded.recv().await {
            if matches!(event.outcome, keyward_certs::ReloadOutcome::Loaded(_)) {
                let owners = lock(&ca_index).owners();
                for owner in owners {
                    let _ = ca_tx.send(Key::Owner(owner));
                }
                let _ = ca_tx.send(Key::PublishClientCa);
            }
        }
    });

    let mut queue: Queue<Key> = Queue::default();
    let mut workers: JoinSet<(Key, Outcome)> = JoinSet::new();
    let workers_max = settings.workers.max(1);
    reconciler.metrics().set_leader(leadership.is_leader());
    let mut leading = leadership.is_leader();
    if leading {
        queue_everything(&mut queue, &index);
    }
    futures::pin_mut!(shutdown);
    loop {
        // Start what is due, up to the worker limit, namespaces taking turns.
        let now = Instant::now();
        while leading && workers.len() < workers_max {
            let Some(key) = queue.pop(now) else { break };
            let (client, reconciler, namespaces, index) =
                (client.clone(), reconciler.clone(), namespaces.clone(), index.clone());
            let tx = tx.clone();
            workers.spawn(async move {
                let outcome = work(&client, &reconciler, &namespaces, &index, &key, &tx).await;
                (key, outcome)
            });
        }
        let next = if workers.len() < workers_max { queue.next_due() } else { None };
        tokio::select! {
            () = &mut shutdown => break,
            changed = leadership.changed() => {
                if !changed {
                    break;
                }
                let now_leading = leadership.is_leader();
                if now_leading != leading {
                    leading = now_leading;
                    reconciler.metrics().set_leader(leading);
                    if leading {
                        queue_everything(&mut queue, &index);
                    } else {
                        // Whatever runs still checks leadership before each write.
                        queue.clear();
                        reconciler.forget();
                    }
                }
            }
            Some(key) = rx.recv() => {
                if leading {
                    queue.add(key, Instant::now());
                }
            }
            Some(done) = workers.join_next(), if !workers.is_empty() => {
                match done {
                    Ok((key, outcome)) => {
                        if outcome == Outcome::Failed {
                            reconciler.metrics().reconcile_error(key_label(&key));
                        }
                        queue.finish(&key, outcome, Instant::now());
                    }
                    Err(e) => tracing::error!(error = %e, "a reconcile task panicked"),
                }
            }
            () = sleep_until(next) => {}
        }
    }
    workers.abort_all();
    tasks.abort_all();
}

/// Queues `keys` whenever the watch sees a change.
fn touch<K>(
    stream: impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
    keys: &[Key],
    tx: &mpsc::UnboundedSender<Key>,
    tasks: &mut JoinSet<()>,
) where
    K: Resource + Clone + std::fmt::Debug + Send + 'static,
{
    let (tx, keys) = (tx.clone(), keys.to_vec());
    tasks.spawn(async move {
        let stream = stream.default_backoff();
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                // A list reports what exists, never what went: an object deleted while the
                // watch was down (before it first listed, or across a 410 Gone) shows only as
                // a list that ends without it. So the end of every list counts as a change.
                Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone) => {
                    for key in &keys {
                        let _ = tx.send(key.clone());
                    }
                }
                Ok(Event::Init | Event::InitApply(_)) => {}
                Err(e) => tracing::warn!(error = %e, ?keys, "watch failed; retrying with backoff"),
            }
        }
    });
}

fn queue_everything(queue: &mut Queue<Key>, index: &Index) {
    let now = Instant::now();
    for key in Key::EVERYTHING {
        queue.add(key, now);
    }
    for owner in lock(index).owners() {
        queue.add(Key::Owner(owner), now);
    }
}

fn watcher<K>(api: Api<K>, config: watcher::Config) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    // LISTs in pages of 500 (the watcher's default), and a watch after.
    watcher::watcher(api, config.page_size(500))
}

/// Namespaces opting in and out.
async fn namespace_events(
    stream: impl Stream<Item = watcher::Result<Event<Namespace>>>,
    tx: mpsc::UnboundedSender<Key>,
    index: Index,
    reconciler: Arc<Reconciler>,
) {
    futures::pin_mut!(stream);
    let mut known: HashSet<String> = HashSet::new();
    let mut listing: Option<HashSet<String>> = None;
    let mut synced = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => listing = Some(HashSet::new()),
            // The store takes a list's namespaces only when the list is done: work queued now
            // would find them not opted in, and be dropped. They are queued at InitDone.
            Ok(Event::InitApply(ns)) => {
                if let Some(seen) = listing.as_mut() {
                    seen.insert(ns.name_any());
                }
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = listing.take() {
                    // Gone from a re-list (410 Gone, a restart): opted out meanwhile.
                    for gone in known.difference(&seen).cloned().collect::<Vec<_>>() {
                        opted_out(&gone, &tx, &index, &reconciler);
                    }
                    for name in &seen {
                        // After the first list, a namespace new to this list opted in meanwhile.
                        if synced && !known.contains(name) {
                            let _ = tx.send(Key::ListPods(name.clone()));
                        }
                        let _ = tx.send(Key::Namespace(name.clone()));
                    }
                    known = seen;
                }
                synced = true;
            }
            Ok(Event::Apply(ns)) => {
                let name = ns.name_any();
                if known.insert(name.clone()) {
                    let _ = tx.send(Key::ListPods(name.clone()));
                }
                let _ = tx.send(Key::Namespace(name));
            }
            // Deleted, or its label removed (it left the selection): opted out.
            Ok(Event::Delete(ns)) => {
                let name = ns.name_any();
                known.remove(&name);
                opted_out(&name, &tx, &index, &reconciler);
            }
            Err(e) => tracing::warn!(error = %e, "namespace watch failed; retrying with backoff"),
        }
    }
}

fn opted_out(ns: &str, tx: &mpsc::UnboundedSender<Key>, index: &Index, _reconciler: &Reconciler) {
    // Its pods are no longer kept; their owners' Secrets stay until the owners are deleted
    // (ownerReferences), as a pod still running may use them.
    let _ = lock(index).remove_namespace(ns);
    let _ = tx.send(Key::OptOut(ns.to_string()));
}

/// The pods of one profile's selector: each, first thing, dropped unless its namespace opted in.
async fn pod_events(
    stream_id: usize,
    stream: impl Stream<Item = watcher::Result<Event<DynamicObject>>>,
    tx: mpsc::UnboundedSender<Key>,
    index: Index,
    namespaces: Store<Namespace>,
    reconciler: Arc<Reconciler>,
) {
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => lock(&index).begin_relist(stream_id),
            Ok(Event::InitApply(pod) | Event::Apply(pod)) => {
                observe_pod(stream_id, &pod, &tx, &index, &namespaces, &reconciler).await;
            }
            Ok(Event::InitDone) => {
                let owners = lock(&index).end_relist(stream_id);
                for owner in owners {
                    let _ = tx.send(Key::Owner(owner));
                }
            }
            Ok(Event::Delete(pod)) => {
                let key =
                    PodKey { stream: stream_id, namespace: pod.namespace().unwrap_or_default(), name: pod.name_any() };
                if let Some(owner) = lock(&index).remove(&key) {
                    let _ = tx.send(Key::Owner(owner));
                }
                reconciler.forget_reports(pod.uid().as_deref().unwrap_or_default());
            }
            Err(e) => tracing::warn!(error = %e, stream = stream_id, "pod watch failed; retrying with backoff"),
        }
    }
}

/// Works out what a pod claims, if its namespace opted in, and queues its owner.
async fn observe_pod(
    stream_id: usize,
    pod: &DynamicObject,
    tx: &mpsc::UnboundedSender<Key>,
    index: &Index,
    namespaces: &Store<Namespace>,
    reconciler: &Reconciler,
) {
    let ns = pod.namespace().unwrap_or_default();
    let key = PodKey { stream: stream_id, namespace: ns.clone(), name: pod.name_any() };
    if namespaces.get(&reflector::ObjectRef::new(&ns)).is_none() {
        // Not opted in: nothing to do, nothing kept; a pod carrying an attestation here is
        // reported (keyward's webhook never admits pods in such a namespace).
        lock(index).remove(&key);
        if pod.annotations().contains_key(keyward_engine::ANNOTATION_ATTESTATION) {
            let why = format!(
                "namespace {ns} is not labelled {}={}, so keyward's webhook never admitted this pod, whatever it carries",
                OPT_IN.0, OPT_IN.1
            );
            let uid = pod.uid().unwrap_or_default();
            reconciler.report_pod(&key, &uid, crate::metrics::Refusal::NamespaceNotOptedIn, &why).await;
        }
        return;
    }
    let verdict = match serde_json::value::to_raw_value(pod) {
        Ok(raw) => desired::for_pod(reconciler.profiles(), &raw, &ns, &reconciler.settings().trust_domain),
        Err(e) => PodVerdict::Nothing(format!("cannot re-encode the pod: {e}")),
    };
    let uid = pod.uid().unwrap_or_default();
    let changed = lock(index).apply(key, uid, verdict);
    if let Some(claim) = &changed.arrived {
        reconciler.recheck(claim);
    }
    for (pod, uid, refusal, why) in &changed.refused {
        reconciler.report_pod(pod, uid, *refusal, why).await;
    }
    for owner in changed.owners {
        let _ = tx.send(Key::Owner(owner));
    }
}

/// Service accounts and role bindings are watched only with `--provision-accounts`; without
/// it keyward has no rights on them and provides none: an empty store, ready at once.
fn unwatched<K>() -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let (store, mut writer) = reflector::store::<K>();
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitDone);
    store
}

/// Watches the objects keyward manages of one kind into a store; a change in an opted-in
/// namespace queues it (to repair it), anywhere else a sweep.
fn watch_managed<K>(
    client: &Client,
    selector: &str,
    tx: &mpsc::UnboundedSender<Key>,
    namespaces: &Store<Namespace>,
    tasks: &mut JoinSet<()>,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let stream = watcher(Api::<K>::all(client.clone()), watcher::Config::default().labels(selector))
        .default_backoff()
        .reflect(writer);
    let (tx, namespaces) = (tx.clone(), namespaces.clone());
    tasks.spawn(async move {
        futures::pin_mut!(stream);
        let mut listed = false;
        while let Some(event) = stream.next().await {
            match event {
                // The first list ends in the readiness task's `AllNamespaces`; a later one (after
                // a 410 Gone) may lack objects deleted while the watch was down, which no event
                // reports: everything is reconciled again, from the store the list refreshed.
                Ok(Event::InitDone) => {
                    if std::mem::replace(&mut listed, true) {
                        let _ = tx.send(Key::AllNamespaces);
                        let _ = tx.send(Key::PublishClientCa);
                    }
                }
                Ok(Event::Init) => {}
                Ok(Event::Apply(object) | Event::Delete(object) | Event::InitApply(object)) => {
                    let ns = object.namespace().unwrap_or_default();
                    let for_client_ca =
                        object.labels().get(desired::PROVISIONED_FOR).map(String::as_str) == Some("client-ca");
                    let key = if for_client_ca {
                        Key::PublishClientCa
                    } else if namespaces.get(&reflector::ObjectRef::new(&ns)).is_some() {
                        Key::Namespace(ns)
                    } else {
                        Key::Sweep
                    };
                    let _ = tx.send(key);
                }
                Err(e) => tracing::warn!(error = %e, kind = %K::kind(&()), "watch failed; retrying with backoff"),
            }
        }
    });
    store
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn key_label(key: &Key) -> &'static str {
    match key {
        Key::Namespace(_) | Key::AllNamespaces => "namespace",
        Key::OptOut(_) | Key::Sweep => "sweep",
        Key::ListPods(_) | Key::Owner(_) => "owner",
        Key::PublishClientCa => "client-ca",
        Key::ClusterFacts => "cluster-facts",
        Key::ServerCaBundles => "server-ca-bundle",
        Key::Sources => "sources",
        Key::AttestationKey => "attestation-key",
        Key::ServingCert => "serving-cert",
        Key::MatchConditions => "match-conditions",
        Key::CertificateRequest { .. } => "pod-certificate",
    }
}

fn opted_in(namespaces: &Store<Namespace>) -> BTreeSet<String> {
    namespaces.state().iter().map(|n| n.name_any()).collect()
}

async fn work(
    client: &Client,
    reconciler: &Reconciler,
    namespaces: &Store<Namespace>,
    index: &Index,
    key: &Key,
    tx: &mpsc::UnboundedSender<Key>,
) -> Outcome {
    let result = match key {
        Key::Namespace(ns) => {
            if opted_in(namespaces).contains(ns) {
                reconciler.namespace(ns).await.map(|()| Outcome::Done)
            } else {
                Ok(Outcome::Done)
            }
        }
        Key::OptOut(ns) => {
            if opted_in(namespaces).contains(ns) {
                Ok(Outcome::Done)
            } else {
                reconciler.opt_out(ns).await.map(|()| Outcome::Done)
            }
        }
        Key::ListPods(ns) => list_pods(client, reconciler, namespaces, index, ns, tx).await.map(|()| Outcome::Done),
        Key::Owner(owner) => {
            let claims: Vec<_> = lock(index)
                .claims(owner)
                .into_iter()
                .map(|(k, uid, c)| (k.clone(), uid.to_string(), c.clone()))
                .collect();
            reconciler.owner(owner, &claims).await
        }
        Key::AllNamespaces => {
            for ns in opted_in(namespaces) {
                let _ = tx.send(Key::Namespace(ns));
            }
            Ok(Outcome::Done)
        }
        Key::Sweep => {
            reconciler.report_expiry();
            reconciler.sweep_namespaces(&opted_in(namespaces)).await.map(|()| Outcome::Done)
        }
        Key::PublishClientCa => reconciler.publish_client_ca().await.map(|()| Outcome::Done),
        Key::ClusterFacts => reconciler.publish_cluster_facts().await.map(|()| Outcome::Done),
        Key::ServerCaBundles => reconciler.publish_server_ca_bundles().await.map(|()| Outcome::Done),
        Key::Sources => match reconciler.refresh_sources(&ca_sources(reconciler)).await {
            Ok(changed) => {
                if changed {
                    let _ = tx.send(Key::AllNamespaces);
                    let _ = tx.send(Key::ServerCaBundles);
                }
                Ok(Outcome::Done)
            }
            Err(e) => Err(e),
        },
        Key::AttestationKey => reconciler.attestation_key().await,
        Key::ServingCert => reconciler.serving_cert().await,
        Key::MatchConditions => reconciler.match_conditions().await,
        Key::CertificateRequest { version, namespace, name } => {
            // Another pod with the request's attestation is looked for among the pods watched:
            // only once every pod watch has listed.
            let streams = pod_selectors(reconciler).len();
            let siblings = |owner: &OwnerKey, keys: &keyward_certs::attestation::Keys| {
                let index = lock(index);
                index.has_listed(streams).then(|| {
                    let holds = |c: &desired::PodClaim| c.attested(keys) == keyward_engine::attest::Verdict::Valid;
                    index.claims(owner).into_iter().map(|(k, uid, c)| Sibling::of(&k.name, uid, c, holds(c))).collect()
                })
            };
            reconciler.sign(*version, namespace, name, &siblings).await
        }
    };
    match result {
        Ok(outcome) => outcome,
        Err(crate::Error::NotLeader) => Outcome::Done,
        Err(e) => {
            tracing::warn!(error = %e, ?key, "reconcile failed; retrying with backoff");
            Outcome::Failed
        }
    }
}

/// The pods already in a namespace that just opted in (the watch dropped them while it had
/// not), a page at a time.
async fn list_pods(
    client: &Client,
    reconciler: &Reconciler,
    namespaces: &Store<Namespace>,
    index: &Index,
    ns: &str,
    tx: &mpsc::UnboundedSender<Key>,
) -> Result<(), crate::Error> {
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &pod_resource());
    for (stream_id, selector) in pod_selectors(reconciler).iter().enumerate() {
        let mut params = ListParams::default().labels(selector).limit(500);
        loop {
            let page = api.list(&params).await?;
            for pod in &page.items {
                observe_pod(stream_id, pod, tx, index, namespaces, reconciler).await;
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }
    Ok(())
}

/// Pods, read as the apiserver sends them: untyped, so that a field newer than this build's
/// Kubernetes types (a `podCertificate` volume, say) is kept when a pod is re-evaluated.
pub fn pod_resource() -> ApiResource {
    ApiResource::erase::<Pod>(&())
}

/// The label selectors of the profiles that provide per-owner objects (their pods are the
/// only ones watched).
pub fn pod_selectors(reconciler: &Reconciler) -> BTreeSet<String> {
    reconciler
        .profiles()
        .iter()
        .filter(|p| p.issues_per_owner)
        .map(|p| desired::label_selector(&p.spec.selector))
        .collect()
}

/// Every server CA source the profiles name.
pub fn ca_sources(reconciler: &Reconciler) -> BTreeSet<SourceKey> {
    let pins = &reconciler.settings().operator_namespaces;
    let (wanted, _) = desired::for_namespace(reconciler.profiles(), "x", pins);
    let (bundles, _) = desired::trust_bundles(reconciler.profiles(), pins);
    wanted
        .into_iter()
        .filter_map(|d| match d.want {
            desired::Want::ServerCa { source, .. } => Some(source),
            _ => None,
        })
        .chain(bundles.into_iter().map(|b| b.source))
        .collect()
}
