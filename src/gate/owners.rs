//! The owners the gate watches (`spec.liveOwners`): one metadata-only watch per kind, kept as
//! the names that exist, by namespace. A workload identity of a watched kind is admitted only
//! while its owner is there: a certificate that outlives its job buys nothing once the job is
//! gone (within the watch's delay, usually well under a second).
//!
//! Until a kind's first list completes nothing is known, and its identities are refused as
//! unavailable (fail closed; the gate is not ready meanwhile). After that, a watch that fails
//! or is told 410 Gone lists again (kube-runtime's watcher, with backoff); the names known keep
//! answering until the new list is whole and replaces them at once, so an owner deleted while
//! the watch was down goes with that list, and a relist never shows a gap.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use keyward_gate::identity::WorkloadIdentity;
use keyward_gate::owners::LiveOwner;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::task::JoinSet;

use super::metrics::GateMetrics;

type Meta = PartialObjectMeta<DynamicObject>;

/// Every watched owner kind, and what each watch has seen.
pub struct LiveOwners {
    kinds: Vec<Arc<Watched>>,
}

struct Watched {
    owner: LiveOwner,
    resource: ApiResource,
    known: RwLock<Known>,
}

/// The owners of one kind that exist, as the watch has seen them.
#[derive(Debug, Default)]
struct Known {
    /// The first list is complete.
    listed: bool,
    /// Namespace → names (looked up without building a key).
    live: HashMap<String, HashSet<String>>,
    /// A list in progress: it replaces `live` when complete.
    relisting: Option<HashMap<String, HashSet<String>>>,
}

/// Why an identity's owner does not admit it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerRefusal {
    /// The owner is not there (deleted, or being deleted).
    Gone(String),
    /// The kind has not been listed yet: nothing is known (fail closed).
    NotListed(String),
}

// === impl LiveOwners ===

impl LiveOwners {
    /// Starts a watch per kind on `client`'s API server, each in `tasks`.
    pub fn watch(
        client: &kube::Client,
        owners: &[LiveOwner],
        metrics: &Arc<GateMetrics>,
        tasks: &mut JoinSet<()>,
    ) -> Arc<Self> {
        let kinds: Vec<Arc<Watched>> = owners.iter().map(|o| Arc::new(Watched::new(o.clone()))).collect();
        for watched in &kinds {
            // Metadata only: the names are all the gate reads, and a job's spec can be large.
            let api = Api::<Meta>::all_with(client.clone(), &watched.resource);
            let (watched, metrics) = (watched.clone(), metrics.clone());
            tasks.spawn(async move {
                let kind = metrics.intern(&watched.owner.identity_kind());
                let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
                futures::pin_mut!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(event) => {
                            let (listed, count) = watched.apply(event);
                            metrics.observe_owners(kind, count);
                            if listed {
                                tracing::info!(owners = %watched.owner.describe(), resource = %watched.resource.plural, count, "owners listed");
                            }
                        }
                        Err(e) => {
                            metrics.observe_owner_watch_error(kind);
                            tracing::warn!(owners = %watched.owner.describe(), resource = %watched.resource.plural, error = %e, "owner watch failed; the owners known still decide; retrying with backoff");
                        }
                    }
                }
            });
        }
        Arc::new(Self { kinds })
    }

    /// Whether `id`'s owner admits it: always, for a kind the gate does not watch.
    pub fn check(&self, id: &WorkloadIdentity) -> Result<(), OwnerRefusal> {
        let Some(watched) = self.kinds.iter().find(|w| w.owner.kind.eq_ignore_ascii_case(&id.kind)) else {
            return Ok(());
        };
        let known = watched.known.read().unwrap_or_else(|p| p.into_inner());
        if !known.listed {
            return Err(OwnerRefusal::NotListed(format!(
                "the gate has not yet listed the {} from the API server, so it cannot tell whether {} {}/{} exists; retry shortly",
                watched.resource.plural, watched.owner.kind, id.namespace, id.name
            )));
        }
        if known.live.get(&id.namespace).is_some_and(|names| names.contains(&id.name)) {
            return Ok(());
        }
        Err(OwnerRefusal::Gone(format!(
            "{} {}/{} does not exist (or is being deleted): this gate admits a {} identity only while its owner exists (spec.liveOwners); a job's certificate does not outlive its job",
            watched.owner.describe(),
            id.namespace,
            id.name,
            watched.owner.kind
        )))
    }

    /// The kinds not listed yet, for readiness (empty: every watch has listed once).
    pub fn unlisted(&self) -> Vec<String> {
        self.kinds
            .iter()
            .filter(|w| !w.known.read().unwrap_or_else(|p| p.into_inner()).listed)
            .map(|w| w.resource.plural.clone())
            .collect()
    }
}

// === impl Watched ===

impl Watched {
    fn new(owner: LiveOwner) -> Self {
        let gvk = GroupVersionKind::gvk(&owner.group, &owner.version, &owner.kind);
        // The plural kube guesses from the kind, as keyward controller reads owners by.
        let mut resource = ApiResource::from_gvk(&gvk);
        if let Some(plural) = &owner.plural {
            resource.plural.clone_from(plural);
        }
        Self { owner, resource, known: RwLock::default() }
    }

    /// Applies one watch event: whether it completed a list, and how many owners exist now.
    fn apply(&self, event: Event<Meta>) -> (bool, usize) {
        let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
        let listed = known.apply(event);
        (listed, known.live.values().map(HashSet::len).sum())
    }
}

// === impl Known ===

impl Known {
    /// Applies one watch event; true when it completed a list.
    fn apply(&mut self, event: Event<Meta>) -> bool {
        match event {
            Event::Init => self.relisting = Some(HashMap::new()),
            Event::InitApply(object) => {
                if let (Some(listing), Some((namespace, name))) = (&mut self.relisting, live_name(&object)) {
                    listing.entry(namespace.to_string()).or_default().insert(name.to_string());
                }
            }
            Event::InitDone => {
                self.live = self.relisting.take().unwrap_or_default();
                self.listed = true;
                return true;
            }
            Event::Apply(object) => match live_name(&object) {
                Some((namespace, name)) => {
                    self.live.entry(namespace.to_string()).or_default().insert(name.to_string());
                }
                // Being deleted: gone for the gate from the first sign of it.
                None => self.forget(&object),
            },
            Event::Delete(object) => self.forget(&object),
        }
        false
    }

    fn forget(&mut self, object: &Meta) {
        let (Some(namespace), Some(name)) = (&object.metadata.namespace, &object.metadata.name) else { return };
        if let Some(names) = self.live.get_mut(namespace) {
            names.remove(name);
            if names.is_empty() {
                self.live.remove(namespace);
            }
        }
    }
}

/// The namespace and name of an owner that exists and is not being deleted.
fn live_name(object: &Meta) -> Option<(&str, &str)> {
    if object.metadata.deletion_timestamp.is_some() {
        return None;
    }
    Some((object.metadata.namespace.as_deref()?, object.metadata.name.as_deref()?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn owner(namespace: &str, name: &str, deleting: bool) -> Meta {
        let deleting = deleting.then_some("2026-12-04T01:00:00Z");
        // As the API server sends an item of a PartialObjectMetadataList.
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {"namespace": namespace, "name": name, "uid": "u-1", "resourceVersion": "7", "deletionTimestamp": deleting},
        }))
        .unwrap()
    }

    fn lmeval() -> LiveOwner {
        LiveOwner {
            group: "foundation-model-stack.github.com.github.com".into(),
            version: "v1beta1".into(),
            kind: "LMEvalJob".into(),
            plural: None,
        }
    }

    fn owners(watched: Watched) -> LiveOwners {
        LiveOwners { kinds: vec![Arc::new(watched)] }
    }

    fn id(namespace: &str, kind: &str, name: &str) -> WorkloadIdentity {
        WorkloadIdentity::parse(&format!("spiffe://cluster.local/ns/{namespace}/{kind}/{name}")).unwrap()
    }

    #[test]
    fn nothing_is_admitted_before_the_first_list_and_only_the_listed_after_it() {
        let gate = owners(Watched::new(lmeval()));
        let job = id("team-a", "lmevaljob", "evaljob-sample");
        assert_eq!(gate.unlisted(), ["lmevaljobs"], "the plural kube guesses, as keyward controller reads owners by");
        assert_eq!(
            gate.check(&job),
            Err(OwnerRefusal::NotListed("the gate has not yet listed the lmevaljobs from the API server, so it cannot tell whether LMEvalJob team-a/evaljob-sample exists; retry shortly".into()))
        );
        assert_eq!(gate.check(&id("team-a", "raycluster", "x")), Ok(()), "a kind not watched is not checked");
        let watched = &gate.kinds[0];
        assert_eq!(watched.apply(Event::Init), (false, 0));
        assert_eq!(watched.apply(Event::InitApply(owner("team-a", "evaljob-sample", false))), (false, 0));
        assert!(gate.check(&job).is_err(), "a list in progress decides nothing");
        assert_eq!(watched.apply(Event::InitApply(owner("team-b", "evaljob-sample", false))), (false, 0));
        assert_eq!(watched.apply(Event::InitApply(owner("team-a", "being-deleted", true))), (false, 0));
        assert_eq!(watched.apply(Event::InitDone), (true, 2));
        assert!(gate.unlisted().is_empty());
        assert_eq!(gate.check(&job), Ok(()));
        assert_eq!(gate.check(&id("team-b", "lmevaljob", "evaljob-sample")), Ok(()));
        for other in [id("team-a", "lmevaljob", "being-deleted"), id("team-c", "lmevaljob", "evaljob-sample")] {
            assert_eq!(
                gate.check(&other),
                Err(OwnerRefusal::Gone(format!("LMEvalJob (foundation-model-stack.github.com.github.com/v1beta1) {}/{} does not exist (or is being deleted): this gate admits a LMEvalJob identity only while its owner exists (spec.liveOwners); a job's certificate does not outlive its job", other.namespace, other.name)))
            );
        }
    }

    #[test]
    fn a_delete_or_a_deletion_timestamp_ends_an_owner_and_a_relist_replaces_what_was_known_at_once() {
        let gate = owners(Watched::new(lmeval()));
        let watched = &gate.kinds[0];
        let (a, b) = (id("team-a", "lmevaljob", "a"), id("team-a", "lmevaljob", "b"));
        watched.apply(Event::Init);
        watched.apply(Event::InitApply(owner("team-a", "a", false)));
        watched.apply(Event::InitDone);
        assert_eq!(watched.apply(Event::Apply(owner("team-a", "b", false))), (false, 2));
        assert_eq!(gate.check(&b), Ok(()));
        assert_eq!(watched.apply(Event::Apply(owner("team-a", "b", true))), (false, 1), "being deleted");
        assert!(matches!(gate.check(&b), Err(OwnerRefusal::Gone(_))));
        assert_eq!(watched.apply(Event::Delete(owner("team-a", "a", false))), (false, 0));
        assert!(matches!(gate.check(&a), Err(OwnerRefusal::Gone(_))));
        assert!(watched.known.read().unwrap().live.is_empty(), "no empty namespace left behind");
        // A relist (after 410 Gone): what was known answers until the new list is whole.
        watched.apply(Event::Apply(owner("team-a", "a", false)));
        watched.apply(Event::Init);
        assert_eq!(gate.check(&a), Ok(()), "known until the new list completes");
        watched.apply(Event::InitApply(owner("team-a", "b", false)));
        assert!(gate.check(&b).is_err(), "the list in progress is not yet in force");
        assert_eq!(watched.apply(Event::InitDone), (true, 1));
        assert!(matches!(gate.check(&a), Err(OwnerRefusal::Gone(_))), "deleted while the watch was down");
        assert_eq!(gate.check(&b), Ok(()));
    }

    #[test]
    fn a_plural_given_is_the_one_watched() {
        let mut owner = lmeval();
        owner.plural = Some("lmevaljobz".into());
        assert_eq!(owners(Watched::new(owner)).unlisted(), ["lmevaljobz"]);
    }
}
