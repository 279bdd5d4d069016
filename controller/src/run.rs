//! The controller's loop: watches that say what changed, one work queue that coalesces and
//! retries with backoff, and a periodic resync that repairs whatever a missed event or a
//! failed write left behind. Only the leader works the queue; a replica that becomes leader
//! reconciles everything once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::ListParams;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::desired::{self, SourceKey, OPT_IN};
use crate::leader::Leadership;
use crate::reconcile::Reconciler;

/// One unit of work; equal keys queued twice are done once.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Namespace(String),
    AllNamespaces,
    Pod {
        namespace: String,
        name: String,
    },
    AllPods,
    /// Removing what keyward provisioned in namespaces that opted out.
    Sweep,
    /// Renewing the client certificates that are due.
    Renew,
    /// Publishing the client CA to `--publish-client-ca-to`.
    PublishClientCa,
}

impl Key {
    /// What the periodic resync, and a replica that becomes leader, queue.
    pub const EVERYTHING: [Key; 5] = [Key::AllNamespaces, Key::AllPods, Key::Sweep, Key::Renew, Key::PublishClientCa];
}

/// Backoff for a key that failed: 500 ms, doubling, at most 5 minutes.
pub fn backoff(attempt: u32) -> Duration {
    let ms = 500u64.saturating_mul(1u64 << attempt.min(20));
    Duration::from_millis(ms.min(300_000))
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

/// Runs until `shutdown` resolves.
pub async fn run(
    client: Client,
    reconciler: Arc<Reconciler>,
    mut leadership: Leadership,
    resync: Duration,
    status: Arc<Status>,
    mut ca_reloaded: tokio::sync::broadcast::Receiver<keyward_certs::ReloadEvent>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Key>();

    // Opted-in namespaces: a reflector, so the queue can ask which are opted in.
    let (namespaces, writer) = reflector::store::<Namespace>();
    let selector = format!("{}={}", OPT_IN.0, OPT_IN.1);
    let ns_stream = watcher(Api::<Namespace>::all(client.clone()), watcher::Config::default().labels(&selector))
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    let ns_tx = tx.clone();
    let ns_status = status.clone();
    let ns_store = namespaces.clone();
    tokio::spawn(async move {
        let ready = ns_store.clone();
        tokio::spawn(async move {
            if ready.wait_until_ready().await.is_ok() {
                ns_status.namespaces_synced.store(true, Ordering::Relaxed);
            }
        });
        futures::pin_mut!(ns_stream);
        while let Some(event) = ns_stream.next().await {
            match event {
                Ok(ns) => {
                    let _ = ns_tx.send(Key::Namespace(ns.name_any()));
                    // A namespace that left the selection is gone from the store: sweep.
                    let _ = ns_tx.send(Key::Sweep);
                }
                Err(e) => tracing::warn!(error = %e, "namespace watch failed; retrying with backoff"),
            }
        }
    });

    // Pods, only those a profile with per-owner objects could select.
    for selector in pod_selectors(&reconciler) {
        let pod_tx = tx.clone();
        let stream = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default().labels(&selector))
            .default_backoff()
            .applied_objects();
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(pod) => {
                        let key = Key::Pod { namespace: pod.namespace().unwrap_or_default(), name: pod.name_any() };
                        let _ = pod_tx.send(key);
                    }
                    Err(e) => tracing::warn!(error = %e, %selector, "pod watch failed; retrying with backoff"),
                }
            }
        });
    }

    // The namespaces the client CA is published to: one that is created gets it at once.
    for ns in reconciler.settings().publish_client_ca_to.clone() {
        let ns_tx = tx.clone();
        let fields = format!("metadata.name={ns}");
        let stream = watcher(Api::<Namespace>::all(client.clone()), watcher::Config::default().fields(&fields))
            .default_backoff()
            .touched_objects();
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(_) => {
                        let _ = ns_tx.send(Key::PublishClientCa);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, namespace = %ns, "namespace watch failed; retrying with backoff")
                    }
                }
            }
        });
    }

    // The server CAs' sources: a change is copied to every opted-in namespace.
    for source in ca_sources(&reconciler) {
        let src_tx = tx.clone();
        let src_client = client.clone();
        let fields = format!("metadata.name={}", source.name);
        let config = watcher::Config::default().fields(&fields);
        tokio::spawn(async move {
            if source.config_map {
                watch_one::<ConfigMap>(Api::namespaced(src_client, &source.namespace), config, src_tx).await;
            } else {
                watch_one::<Secret>(Api::namespaced(src_client, &source.namespace), config, src_tx).await;
            }
        });
    }

    // The periodic resync, and leadership changes.
    let tick_tx = tx.clone();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(resync);
        loop {
            ticker.tick().await;
            for key in Key::EVERYTHING {
                let _ = tick_tx.send(key);
            }
        }
    });
    let ca_tx = tx.clone();
    tokio::spawn(async move {
        while let Ok(event) = ca_reloaded.recv().await {
            if matches!(event.outcome, keyward_certs::ReloadOutcome::Loaded(_)) {
                let _ = ca_tx.send(Key::Renew);
                let _ = ca_tx.send(Key::PublishClientCa);
            }
        }
    });

    let mut pending: BTreeMap<Key, Instant> = BTreeMap::new();
    let mut attempts: HashMap<Key, u32> = HashMap::new();
    reconciler.metrics().set_leader(leadership.is_leader());
    futures::pin_mut!(shutdown);
    loop {
        let next = pending.values().min().copied();
        tokio::select! {
            () = &mut shutdown => break,
            changed = leadership.changed() => {
                if !changed {
                    break;
                }
                let leading = leadership.is_leader();
                reconciler.metrics().set_leader(leading);
                if leading {
                    for key in Key::EVERYTHING {
                        pending.insert(key, Instant::now());
                    }
                } else {
                    pending.clear();
                    attempts.clear();
                }
            }
            Some(key) = rx.recv() => {
                if leadership.is_leader() {
                    // A key backing off after a failure keeps its time: events do not turn a
                    // failing API into a hot loop.
                    let now = Instant::now();
                    let backing_off = attempts.contains_key(&key);
                    pending.entry(key).and_modify(|due| if !backing_off { *due = (*due).min(now) }).or_insert(now);
                }
            }
            () = sleep_until(next) => {
                let now = Instant::now();
                let due: Vec<Key> = pending.iter().filter(|(_, at)| **at <= now).map(|(k, _)| k.clone()).collect();
                for key in due {
                    pending.remove(&key);
                    if !leadership.is_leader() {
                        continue;
                    }
                    match work(&client, &reconciler, &namespaces, &key, &tx).await {
                        Ok(()) => {
                            attempts.remove(&key);
                        }
                        Err(e) => {
                            let n = attempts.entry(key.clone()).or_insert(0);
                            let delay = backoff(*n);
                            *n = n.saturating_add(1);
                            reconciler.metrics().reconcile_error(key_label(&key));
                            tracing::warn!(error = %e, ?key, retry_in = ?delay, "reconcile failed; retrying with backoff");
                            pending.insert(key, Instant::now() + delay);
                        }
                    }
                }
            }
        }
    }
}

async fn watch_one<K>(api: Api<K>, config: watcher::Config, tx: mpsc::UnboundedSender<Key>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let stream = watcher(api, config).default_backoff().touched_objects();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(_) => {
                let _ = tx.send(Key::AllNamespaces);
            }
            Err(e) => tracing::warn!(error = %e, "server CA source watch failed; retrying with backoff"),
        }
    }
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
        Key::Pod { .. } | Key::AllPods => "pod",
        Key::Sweep => "sweep",
        Key::Renew => "renew",
        Key::PublishClientCa => "client-ca",
    }
}

async fn work(
    client: &Client,
    reconciler: &Reconciler,
    namespaces: &Store<Namespace>,
    key: &Key,
    tx: &mpsc::UnboundedSender<Key>,
) -> Result<(), crate::Error> {
    let opted_in = || -> BTreeSet<String> { namespaces.state().iter().map(|n| n.name_any()).collect() };
    match key {
        Key::Namespace(ns) => {
            if opted_in().contains(ns) {
                reconciler.namespace(ns).await?;
            }
        }
        Key::AllNamespaces => {
            for ns in opted_in() {
                let _ = tx.send(Key::Namespace(ns));
            }
        }
        Key::Pod { namespace, name } => {
            if let Some(pod) = Api::<Pod>::namespaced(client.clone(), namespace).get_opt(name).await? {
                reconciler.pod(&pod).await?;
            }
        }
        Key::AllPods => {
            for selector in pod_selectors(reconciler) {
                let pods = Api::<Pod>::all(client.clone()).list(&ListParams::default().labels(&selector)).await?;
                for pod in pods {
                    let _ = tx.send(Key::Pod { namespace: pod.namespace().unwrap_or_default(), name: pod.name_any() });
                }
            }
        }
        // Three keys, not one: a failure in one (and its backoff) never delays the others.
        Key::Sweep => reconciler.sweep_namespaces(&opted_in()).await?,
        Key::Renew => reconciler.renew_all().await?,
        Key::PublishClientCa => reconciler.publish_client_ca().await?,
    }
    Ok(())
}

/// The label selectors of the profiles that provide per-owner objects (their pods are the
/// only ones watched).
pub fn pod_selectors(reconciler: &Reconciler) -> BTreeSet<String> {
    use keyward_engine::inject::Provision;
    reconciler
        .profiles()
        .iter()
        .filter(|p| {
            desired::provides_per_owner(p, |provision| {
                matches!(provision, Provision::ClientCertificate | Provision::GeneratedToken { .. })
            })
        })
        .map(|p| desired::label_selector(&p.spec.selector))
        .collect()
}

/// Every server CA source the profiles name.
pub fn ca_sources(reconciler: &Reconciler) -> BTreeSet<SourceKey> {
    let (wanted, _) = desired::for_namespace(reconciler.profiles(), "x", &reconciler.settings().operator_namespaces);
    wanted
        .into_iter()
        .filter_map(|d| match d.want {
            desired::Want::ServerCa { source, .. } => Some(source),
            _ => None,
        })
        .collect()
}
