//! The controller's loop: watches that say what changed, kept in small stores; a work queue
//! that coalesces keys, runs a bounded number at once (one worker per key, namespaces taking
//! turns) and retries with backoff; and a slow resync that repairs what a missed event left.
//!
//! Steady state is watches plus Lease renewals: an owner's certificate costs a request only
//! when it is issued or renewed, a namespace's objects are compared with their watched copies,
//! and pods in namespaces that did not opt in are dropped as they arrive. Only the leader works
//! the queue; a replica that becomes leader reconciles everything once.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::DynamicObject;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::attestation::Sibling;
use crate::context::{lock, Context, Stores};
use crate::desired::{self, SourceKey, OPT_IN};
use crate::index::OwnerKey;
use crate::keys::{key_label, Key};
use crate::leader::Leadership;
use crate::queue::{Outcome, Queue};
pub use crate::watches::pod_selectors;
use crate::watches::{list_pods, namespace_events, pod_events, touch, unwatched, watch_managed, watch_sources, Index};
use crate::{namespaces, owners, signing, singletons, trust};
use keyward_engine::ProfileSet;

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

/// Runs the loop with the profile set of the moment until `shutdown` resolves. A new set (one
/// the caller validated whole) ends the loop and starts it again with the reconciler
/// `reconciler_for` makes for it: the watches, the pod selectors and every desired object
/// derive from the profiles, so starting over is how none is left stale. The Lease, the
/// metrics and readiness carry across; a leader reconciles everything again at once.
pub async fn run_reloading(
    client: Client,
    mut profiles: tokio::sync::watch::Receiver<Arc<ProfileSet>>,
    reconciler_for: impl Fn(Arc<ProfileSet>) -> Arc<Context>,
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
    reconciler: Arc<Context>,
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
    let stream =
        crate::watches::watcher(Api::<Namespace>::all(client.clone()), watcher::Config::default().labels(&opt_in))
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
        let api = Api::<crate::watched_pod::WatchedPod>::all(client.clone());
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
        let stream =
            crate::watches::watcher(Api::<Namespace>::all(client.clone()), watcher::Config::default().fields(&fields));
        touch(stream, &[Key::PublishClientCa], &tx, &mut tasks);
    }

    // keyward's ClusterTrustBundles (the client CA of each signer, the server CAs): one changed
    // or deleted by someone else is written again at once, not at the next resync.
    if let Some(version) = reconciler.settings().trust_bundles {
        let api = Api::<DynamicObject>::all_with(client.clone(), &version.trust_bundles());
        let stream = watcher::watcher(api, watcher::Config::default().labels(&managed).page_size(500));
        touch(stream, &[Key::PublishClientCa, Key::ServerCaBundles], &tx, &mut tasks);
    }
    // The server CA sources, each by name: one that appears or rotates reaches every opted-in
    // namespace (and its ClusterTrustBundle) at once, not at the next resync.
    watch_sources(&client, &ca_sources(&reconciler), &reconciler, &tx, &mut tasks);
    // The cluster facts the webhook reads, by name: likewise.
    let fields = format!("metadata.name={}", keyward_engine::cluster::CONFIG_MAP);
    let api = Api::<ConfigMap>::namespaced(client.clone(), &reconciler.settings().namespace);
    touch(
        crate::watches::watcher(api, watcher::Config::default().fields(&fields)),
        &[Key::ClusterFacts],
        &tx,
        &mut tasks,
    );

    // The self-managed serving certificate and client CA: their Secrets and the webhook
    // configuration, each watched by name, so a wiped caBundle or a damaged Secret is repaired
    // at once.
    let own = reconciler.settings();
    let secrets = own.serving.iter().map(|s| s.secret.clone()).chain(own.client_ca_secret.clone());
    for name in secrets {
        let fields = format!("metadata.name={name}");
        let api = Api::<Secret>::namespaced(client.clone(), &own.namespace);
        touch(
            crate::watches::watcher(api, watcher::Config::default().fields(&fields)),
            &[Key::ServingCert],
            &tx,
            &mut tasks,
        );
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
        touch(crate::watches::watcher(api, watcher::Config::default().fields(&fields)), &config_keys, &tx, &mut tasks);
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
    // Waited for, not only aborted: a task on another thread finishes the poll it is in, and a
    // write it makes then must not land after the next loop (a reload's, with other profiles)
    // or another leader has started.
    workers.shutdown().await;
    tasks.shutdown().await;
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

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn opted_in(namespaces: &Store<Namespace>) -> BTreeSet<String> {
    namespaces.state().iter().map(|n| n.name_any()).collect()
}

async fn work(
    client: &Client,
    reconciler: &Context,
    namespaces: &Store<Namespace>,
    index: &Index,
    key: &Key,
    tx: &mpsc::UnboundedSender<Key>,
) -> Outcome {
    let result = match key {
        Key::Namespace(ns) => {
            if opted_in(namespaces).contains(ns) {
                namespaces::provision(reconciler, ns).await.map(|()| Outcome::Done)
            } else {
                Ok(Outcome::Done)
            }
        }
        Key::OptOut(ns) => {
            if opted_in(namespaces).contains(ns) {
                Ok(Outcome::Done)
            } else {
                namespaces::opt_out(reconciler, ns).await.map(|()| Outcome::Done)
            }
        }
        Key::ListPods(ns) => list_pods(client, reconciler, namespaces, index, ns, tx).await.map(|()| Outcome::Done),
        Key::Owner(owner) => {
            let claims: Vec<_> = lock(index)
                .claims(owner)
                .into_iter()
                .map(|(k, uid, c)| (k.clone(), uid.to_string(), c.clone()))
                .collect();
            owners::reconcile(reconciler, owner, &claims).await
        }
        Key::AllNamespaces => {
            for ns in opted_in(namespaces) {
                let _ = tx.send(Key::Namespace(ns));
            }
            Ok(Outcome::Done)
        }
        Key::Sweep => {
            reconciler.report_expiry();
            namespaces::sweep(reconciler, &opted_in(namespaces)).await.map(|()| Outcome::Done)
        }
        Key::PublishClientCa => trust::publish_client_ca(reconciler).await.map(|()| Outcome::Done),
        Key::ClusterFacts => singletons::publish_cluster_facts(reconciler).await.map(|()| Outcome::Done),
        Key::ServerCaBundles => trust::publish_server_ca_bundles(reconciler).await.map(|()| Outcome::Done),
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
        Key::AttestationKey => singletons::attestation_key(reconciler).await,
        Key::ServingCert => singletons::serving_cert(reconciler).await,
        Key::MatchConditions => singletons::match_conditions(reconciler).await,
        Key::CertificateRequest { version, namespace, name } => {
            // Another pod with the request's attestation is looked for among the pods watched:
            // only once every pod watch has listed.
            let streams = pod_selectors(reconciler).len();
            let siblings = |owner: &OwnerKey, keys: &keyward_certs::attestation::Keys| {
                let index = lock(index);
                index.has_listed(streams).then(|| {
                    let holds = |c: &desired::PodClaim| c.attested(keys) == keyward_engine::attest::Verdict::Valid;
                    index
                        .claims(owner)
                        .into_iter()
                        .map(|(k, uid, c)| Sibling::of(&k.name, uid, &c.evidence, holds(c)))
                        .collect()
                })
            };
            signing::sign(reconciler, *version, namespace, name, &siblings).await
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

/// Every server CA source the profiles name.
pub fn ca_sources(reconciler: &Context) -> BTreeSet<SourceKey> {
    desired::ca_sources(reconciler.profiles(), &reconciler.settings().operator_namespaces)
}
