//! The callers' pods (`spec.tokenReview.pods`): one metadata-only watch of the pods the label
//! selector names, cluster-wide, kept as what rules read of each (its UID, controller, and the
//! labels and annotations some rule compares; nothing else, so memory is bounded by the pods
//! selected, not by what their creators put in them).
//!
//! A pod-bound token's TokenReview names its pod (name and UID). The gate admits it as that pod
//! only while a pod of that namespace and name exists with that UID: a token of a deleted pod,
//! or of one deleted and replaced by another of the same name, names no pod the gate knows and
//! is refused, though the API server's review (cached, by it and by the gate) may still accept
//! it for a while. A pod being deleted is still itself: it may report its end while it stops,
//! and the API server accepts its token until a minute past its deletion time too.
//!
//! Until the first list completes nothing is known, and pod-bound callers are refused as
//! unavailable (the gate is not ready meanwhile); after that, as the owners' watch: a failed
//! or expired watch lists again with backoff, and the new list replaces the old at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use keyward_gate::identity::{BoundPod, PodCaller, PodFacts, PodOwner, ServiceAccount};
use kube::api::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::task::JoinSet;

use super::metrics::GateMetrics;

type Meta = PartialObjectMeta<Pod>;

/// The watched pods, and what to keep of each.
pub struct Pods {
    selector: String,
    labels: Vec<String>,
    annotations: Vec<String>,
    known: RwLock<Known>,
}

#[derive(Debug, Default)]
struct Known {
    listed: bool,
    /// Namespace → name → the pod.
    live: HashMap<String, HashMap<String, Arc<PodFacts>>>,
    relisting: Option<HashMap<String, HashMap<String, Arc<PodFacts>>>>,
}

/// Why a token's pod does not make its caller that pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodRefusal {
    /// Another pod now has the token's pod's name: the token's pod was deleted. 401.
    Gone(String),
    /// Not listed yet: nothing is known (fail closed), 503.
    NotListed(String),
}

// === impl Pods ===

impl Pods {
    pub fn new(selector: &str, (labels, annotations): (Vec<String>, Vec<String>)) -> Self {
        Self { selector: selector.to_string(), labels, annotations, known: RwLock::default() }
    }

    /// Starts the watch on `client`'s API server, in `tasks`.
    pub fn watch(self: &Arc<Self>, client: &kube::Client, metrics: &Arc<GateMetrics>, tasks: &mut JoinSet<()>) {
        let api = Api::<Meta>::all(client.clone());
        let config = watcher::Config::default().labels(&self.selector);
        let (pods, metrics) = (self.clone(), metrics.clone());
        tasks.spawn(async move {
            let kind = metrics.intern("pod");
            let stream = watcher::watcher(api, config).default_backoff();
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        let (listed, count) = pods.apply(event);
                        metrics.observe_owners(kind, count);
                        if listed {
                            tracing::info!(selector = %pods.selector, count, "callers' pods listed");
                        }
                    }
                    Err(e) => {
                        metrics.observe_owner_watch_error(kind);
                        tracing::warn!(selector = %pods.selector, error = %e, "pod watch failed; the pods known still decide; retrying with backoff");
                    }
                }
            }
        });
    }

    /// The caller `account`'s token names `bound`: that pod, if the watch knows it by that UID.
    pub fn caller(&self, account: ServiceAccount, bound: &BoundPod) -> Result<PodCaller, PodRefusal> {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        let at = format!("{}/{}", account.namespace, bound.name);
        if !known.listed {
            return Err(PodRefusal::NotListed(format!(
                "the gate has not yet listed the pods ({}) from the API server, so it cannot tell whether pod {at}, which the token is bound to, exists; retry shortly",
                self.selector
            )));
        }
        let pod_name = bound.name.clone();
        match known.live.get(&account.namespace).and_then(|pods| pods.get(&bound.name)) {
            Some(pod) if pod.uid == bound.uid => Ok(PodCaller { account, pod_name, pod: Ok(pod.clone()) }),
            Some(pod) => Err(PodRefusal::Gone(format!(
                "the token is bound to pod {at} with UID {}, and the pod of that name now has UID {}: the token's pod was deleted, and a token buys nothing once its pod is gone",
                bound.uid, pod.uid
            ))),
            // Not a pod the gate watches (an operator's, say), or one deleted: the caller is its
            // account, and no rule that reads a pod admits it.
            None => Ok(PodCaller {
                account,
                pod_name,
                pod: Err(format!(
                    "the token is bound to pod {at}, which does not exist (deleted: its token buys nothing a pod's facts would) or is not one this gate watches (spec.tokenReview.pods.labelSelector {:?})",
                    self.selector
                )),
            }),
        }
    }

    /// Whether the first list is still to complete, for readiness.
    pub fn unlisted(&self) -> bool {
        !self.known.read().unwrap_or_else(|p| p.into_inner()).listed
    }

    fn apply(&self, event: Event<Meta>) -> (bool, usize) {
        let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
        let listed = match event {
            Event::Init => {
                known.relisting = Some(HashMap::new());
                false
            }
            Event::InitApply(pod) => {
                if let Some((namespace, facts)) = self.facts(&pod) {
                    if let Some(listing) = &mut known.relisting {
                        listing.entry(namespace).or_default().insert(facts.name.clone(), Arc::new(facts));
                    }
                }
                false
            }
            Event::InitDone => {
                known.live = known.relisting.take().unwrap_or_default();
                known.listed = true;
                true
            }
            Event::Apply(pod) => {
                if let Some((namespace, facts)) = self.facts(&pod) {
                    known.live.entry(namespace).or_default().insert(facts.name.clone(), Arc::new(facts));
                }
                false
            }
            Event::Delete(pod) => {
                if let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) {
                    if let Some(pods) = known.live.get_mut(namespace) {
                        // Only the pod deleted: a newer one of that name may be known already.
                        if pods.get(name).is_some_and(|p| Some(&p.uid) == pod.metadata.uid.as_ref()) {
                            pods.remove(name);
                        }
                        if pods.is_empty() {
                            known.live.remove(namespace);
                        }
                    }
                }
                false
            }
        };
        (listed, known.live.values().map(HashMap::len).sum())
    }

    /// What the gate keeps of a pod: its namespace, and the facts rules read.
    fn facts(&self, pod: &Meta) -> Option<(String, PodFacts)> {
        let m = &pod.metadata;
        let (namespace, name, uid) = (m.namespace.clone()?, m.name.clone()?, m.uid.clone()?);
        let keep = |all: &Option<BTreeMap<String, String>>, keys: &[String]| -> BTreeMap<String, String> {
            let Some(all) = all else { return BTreeMap::new() };
            keys.iter().filter_map(|k| all.get(k).map(|v| (k.clone(), v.clone()))).collect()
        };
        let owner = m.owner_references.iter().flatten().find(|o| o.controller == Some(true));
        Some((
            namespace,
            PodFacts {
                name,
                uid,
                labels: keep(&m.labels, &self.labels),
                annotations: keep(&m.annotations, &self.annotations),
                owner: owner.map(|o| PodOwner { kind: o.kind.clone(), name: o.name.clone() }),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// An evaluation pod as the API server sends it in a PartialObjectMetadataList: labels and
    /// annotations as eval-hub's `job_builders.go` writes them (eval-hub ba127125), owned by its
    /// Job as the Job controller owns its pods.
    fn pod(name: &str, uid: &str, job_id: &str) -> Meta {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {
                "namespace": "tenant-a", "name": name, "uid": uid, "resourceVersion": "9",
                "generateName": format!("{job_id}-5f0c-"),
                "labels": {"app": "evalhub", "component": "evaluation-job", "job_id": job_id, "benchmark_index": "0", "batch.kubernetes.io/job-name": format!("{job_id}-5f0c")},
                "annotations": {"eval-hub.github.io/job_id": job_id, "eval-hub.github.io/benchmark_id": "arc_easy", "kubectl.kubernetes.io/huge": "x".repeat(4096)},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": format!("{job_id}-5f0c"), "uid": "j-1", "controller": true, "blockOwnerDeletion": true}],
            },
        }))
        .unwrap()
    }

    fn pods() -> Pods {
        Pods::new(
            "app=evalhub,component=evaluation-job",
            (vec!["job_id".into(), "benchmark_index".into()], vec!["eval-hub.github.io/job_id".into()]),
        )
    }

    fn account() -> ServiceAccount {
        ServiceAccount::parse("system:serviceaccount:tenant-a:evalhub-evalhub-job").unwrap()
    }

    fn bound(name: &str, uid: &str) -> BoundPod {
        BoundPod { name: name.into(), uid: uid.into() }
    }

    #[test]
    fn a_token_names_its_pod_only_while_that_pod_exists_by_its_uid() {
        let pods = pods();
        assert!(pods.unlisted());
        assert!(matches!(pods.caller(account(), &bound("job-a-1", "u-1")), Err(PodRefusal::NotListed(_))));
        pods.apply(Event::Init);
        pods.apply(Event::InitApply(pod("job-a-1", "u-1", "job-a")));
        assert_eq!(pods.apply(Event::InitDone), (true, 1));
        let caller = pods.caller(account(), &bound("job-a-1", "u-1")).unwrap();
        assert_eq!(caller.pod_ref(), "tenant-a/job-a-1");
        let facts = caller.facts().unwrap();
        // Only what rules read is kept.
        assert_eq!(
            facts.labels,
            BTreeMap::from([("benchmark_index".into(), "0".into()), ("job_id".into(), "job-a".into())])
        );
        assert_eq!(facts.annotations, BTreeMap::from([("eval-hub.github.io/job_id".into(), "job-a".into())]));
        assert_eq!(facts.owner, Some(PodOwner { kind: "Job".into(), name: "job-a-5f0c".into() }));
        // Deleted and replaced by a pod of the same name: the old token is not the new pod's.
        pods.apply(Event::Apply(pod("job-a-1", "u-2", "job-a")));
        assert_eq!(
            pods.caller(account(), &bound("job-a-1", "u-1")).unwrap_err(),
            PodRefusal::Gone("the token is bound to pod tenant-a/job-a-1 with UID u-1, and the pod of that name now has UID u-2: the token's pod was deleted, and a token buys nothing once its pod is gone".into())
        );
        // A late delete of the old pod does not remove the new one.
        pods.apply(Event::Delete(pod("job-a-1", "u-1", "job-a")));
        assert!(pods.caller(account(), &bound("job-a-1", "u-2")).unwrap().facts().is_some());
        assert_eq!(pods.apply(Event::Delete(pod("job-a-1", "u-2", "job-a"))), (false, 0));
        // Deleted: the caller is its account, with no pod a rule could read.
        let gone = pods.caller(account(), &bound("job-a-1", "u-2")).unwrap();
        assert_eq!(
            gone.pod,
            Err("the token is bound to pod tenant-a/job-a-1, which does not exist (deleted: its token buys nothing a pod's facts would) or is not one this gate watches (spec.tokenReview.pods.labelSelector \"app=evalhub,component=evaluation-job\")".into())
        );
        assert_eq!(gone.account, account());
        // Another namespace's account never finds this namespace's pod.
        pods.apply(Event::Apply(pod("job-a-1", "u-3", "job-a")));
        let other = ServiceAccount::parse("system:serviceaccount:tenant-b:evalhub-evalhub-job").unwrap();
        assert!(pods.caller(other, &bound("job-a-1", "u-3")).unwrap().facts().is_none());
    }

    #[test]
    fn a_relist_replaces_what_was_known_at_once() {
        let pods = pods();
        pods.apply(Event::Init);
        pods.apply(Event::InitApply(pod("a", "u-a", "job-a")));
        pods.apply(Event::InitDone);
        pods.apply(Event::Init);
        let known = |name: &str, uid: &str| pods.caller(account(), &bound(name, uid)).unwrap().facts().is_some();
        assert!(known("a", "u-a"), "known until the new list completes");
        pods.apply(Event::InitApply(pod("b", "u-b", "job-b")));
        assert!(!known("b", "u-b"), "the list in progress is not in force");
        assert_eq!(pods.apply(Event::InitDone), (true, 1));
        assert!(!known("a", "u-a"), "deleted while the watch was down");
        assert!(known("b", "u-b"));
    }
}
