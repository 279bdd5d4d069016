//! The watches: what changed in the cluster, turned into [`Key`]s for the queue and kept in
//! small stores (namespaces that opted in, the pods of profiles that issue per owner, the
//! objects keyward manages), and the pods already in a namespace that just opted in.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::ListParams;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::conditions::Condition;
use crate::context::{lock, Context};
use crate::desired::{self, SourceKey, OPT_IN};
use crate::index::{PodIndex, PodKey};
use crate::keys::Key;
use crate::watched_pod::WatchedPod;

/// The pods watched, by owner.
pub(crate) type Index = Arc<Mutex<PodIndex>>;

/// Queues `keys` whenever the watch sees a change.
pub(crate) fn touch<K>(
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
                Ok(event) if is_change(&event) => {
                    for key in &keys {
                        let _ = tx.send(key.clone());
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, ?keys, "watch failed; retrying with backoff"),
            }
        }
    });
}

/// The server CA sources, each watched by name in its own namespace (a `metadata.name` field
/// selector, which RBAC authorizes against `resourceNames`): a source that appears, rotates or
/// goes is read again at once (`Key::Sources`), not at the next resync. A source the
/// controller may not watch (403) is still read at every resync, and a condition says which
/// rule is missing; it ends when the watch lists.
pub(crate) fn watch_sources(
    client: &Client,
    sources: &BTreeSet<SourceKey>,
    reconciler: &Arc<Context>,
    tx: &mpsc::UnboundedSender<Key>,
    tasks: &mut JoinSet<()>,
) {
    // One watch per object: two keys of one Secret are one source to watch.
    let objects: BTreeSet<(bool, &str, &str)> =
        sources.iter().map(|s| (s.config_map, s.namespace.as_str(), s.name.as_str())).collect();
    for (config_map, namespace, name) in objects {
        let fields = format!("metadata.name={name}");
        let config = watcher::Config::default().fields(&fields);
        let stream = if config_map {
            changes(Api::<ConfigMap>::namespaced(client.clone(), namespace), config)
        } else {
            changes(Api::<Secret>::namespaced(client.clone(), namespace), config)
        };
        let kind = if config_map { "ConfigMap" } else { "Secret" };
        let subject = format!("{kind} {namespace}/{name}");
        let note = format!(
            "keyward may not watch the serverCA source {subject}, so a change to it reaches opted-in namespaces only at the next resync; grant list and watch on it by name: add {name:?} to the resourceNames of the ClusterRole keyward-controller-ca-sources (deploy/base/controller.yaml)"
        );
        let (tx, reconciler) = (tx.clone(), reconciler.clone());
        tasks.spawn(source_events(stream, subject, note, tx, reconciler));
    }
}

/// Whether a watch event may mean a change: an object applied or deleted, or the end of a
/// list. A list reports what exists, never what went: an object deleted while the watch was
/// down (before it first listed, or across a 410 Gone) shows only as a list that ends without
/// it, and one changed meanwhile only as its new contents. So the end of every list counts.
fn is_change<K>(event: &Event<K>) -> bool {
    matches!(event, Event::Apply(_) | Event::Delete(_) | Event::InitDone)
}

/// A watch of `api` as a stream of "may have changed", with the watches' backoff.
fn changes<K>(api: Api<K>, config: watcher::Config) -> BoxStream<'static, watcher::Result<bool>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    watcher(api, config).default_backoff().map(|e| e.map(|e| is_change(&e))).boxed()
}

/// One source's watch: a change queues `Key::Sources`; a 403 raises the condition, and the
/// watch retries with backoff (the right may be granted later).
async fn source_events(
    stream: impl Stream<Item = watcher::Result<bool>>,
    subject: String,
    forbidden: String,
    tx: mpsc::UnboundedSender<Key>,
    reconciler: Arc<Context>,
) {
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(true) => {
                reconciler.resolve(Condition::ServerCaSourceUnwatched, &subject);
                let _ = tx.send(Key::Sources);
            }
            Ok(false) => {}
            Err(e) if is_forbidden(&e) => {
                reconciler.raise(Condition::ServerCaSourceUnwatched, &subject, &forbidden, None).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, source = %subject, "serverCA source watch failed; retrying with backoff")
            }
        }
    }
}

fn is_forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.is_forbidden(),
        watcher::Error::WatchError(status) => status.is_forbidden(),
        _ => false,
    }
}

pub(crate) fn watcher<K>(api: Api<K>, config: watcher::Config) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    // LISTs in pages of 500 (the watcher's default), and a watch after.
    watcher::watcher(api, config.page_size(500))
}

/// Namespaces opting in and out.
pub(crate) async fn namespace_events(
    stream: impl Stream<Item = watcher::Result<Event<Namespace>>>,
    tx: mpsc::UnboundedSender<Key>,
    index: Index,
    reconciler: Arc<Context>,
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

pub(crate) fn opted_out(ns: &str, tx: &mpsc::UnboundedSender<Key>, index: &Index, _reconciler: &Context) {
    // Its pods are no longer kept; their owners' Secrets stay until the owners are deleted
    // (ownerReferences), as a pod still running may use them.
    let _ = lock(index).remove_namespace(ns);
    let _ = tx.send(Key::OptOut(ns.to_string()));
}

/// The pods of one profile's selector: each, first thing, dropped unless its namespace opted in.
pub(crate) async fn pod_events(
    stream_id: usize,
    stream: impl Stream<Item = watcher::Result<Event<WatchedPod>>>,
    tx: mpsc::UnboundedSender<Key>,
    index: Index,
    namespaces: Store<Namespace>,
    reconciler: Arc<Context>,
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
pub(crate) async fn observe_pod(
    stream_id: usize,
    pod: &WatchedPod,
    tx: &mpsc::UnboundedSender<Key>,
    index: &Index,
    namespaces: &Store<Namespace>,
    reconciler: &Context,
) {
    let ns = pod.namespace().unwrap_or_default();
    let key = PodKey { stream: stream_id, namespace: ns.clone(), name: pod.name_any() };
    if namespaces.get(&reflector::ObjectRef::new(&ns)).is_none() {
        // Not opted in: nothing to do, nothing kept; a pod carrying an attestation here is
        // reported (keyward's webhook never admits pods in such a namespace).
        lock(index).remove(&key);
        if pod.carries_attestation() {
            let why = format!(
                "namespace {ns} is not labelled {}={}, so keyward's webhook never admitted this pod, whatever it carries",
                OPT_IN.0, OPT_IN.1
            );
            let uid = pod.uid().unwrap_or_default();
            reconciler.report_pod(&key, &uid, crate::metrics::Refusal::NamespaceNotOptedIn, &why).await;
        }
        return;
    }
    let verdict = desired::for_pod(reconciler.profiles(), pod.json(), &ns, &reconciler.settings().trust_domain);
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
pub(crate) fn unwatched<K>() -> Store<K>
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
pub(crate) fn watch_managed<K>(
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

/// The pods already in a namespace that just opted in (the watch dropped them while it had
/// not), a page at a time.
pub(crate) async fn list_pods(
    client: &Client,
    reconciler: &Context,
    namespaces: &Store<Namespace>,
    index: &Index,
    ns: &str,
    tx: &mpsc::UnboundedSender<Key>,
) -> Result<(), crate::Error> {
    let api = Api::<WatchedPod>::namespaced(client.clone(), ns);
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

/// The label selectors of the profiles that provide per-owner objects (their pods are the
/// only ones watched).
pub fn pod_selectors(reconciler: &Context) -> BTreeSet<String> {
    reconciler
        .profiles()
        .iter()
        .filter(|p| p.issues_per_owner)
        .map(|p| desired::label_selector(&p.spec.selector))
        .collect()
}
