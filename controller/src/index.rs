//! What the pod watches have delivered, kept small: per pod, only its claim (the owner and the
//! objects keyward would issue for it, and its attestation), worked out once when the pod
//! arrives; never the pod itself. Only pods in opted-in namespaces are kept: work for the
//! others costs nothing beyond reading the event.
//!
//! A watch that re-lists (after 410 Gone, or an API server restart) replaces what its stream
//! had: pods missing from the new list are forgotten.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::desired::{PodClaim, PodVerdict};
use crate::metrics::Refusal;

/// A pod, as seen by one watch (a profile's selector).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    pub stream: usize,
    pub namespace: String,
    pub name: String,
}

/// An owner: its namespace and UID.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerKey {
    pub namespace: String,
    pub uid: String,
}

/// One pod's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Indexed {
    pub uid: String,
    pub verdict: Entry,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Boxed: the map's every slot, used or not, is as large as its largest entry.
    Claim(Box<PodClaim>),
    /// Injected, but not to be served (its owner cannot be an identity, it is opted out):
    /// refused, and why.
    Refused(Refusal, String),
}

impl Indexed {
    pub fn owner(&self) -> Option<OwnerKey> {
        match &self.verdict {
            Entry::Claim(c) => {
                c.wants.first().map(|d| OwnerKey { namespace: d.namespace.clone(), uid: c.owner.uid.clone() })
            }
            Entry::Refused(..) => None,
        }
    }
}

#[derive(Debug, Default)]
pub struct PodIndex {
    pods: HashMap<PodKey, Indexed>,
    /// Each owner's pods, sorted. A sorted `Vec`, not a `BTreeSet`: an owner has one pod or a
    /// few, and a B-tree's first node has room for eleven (650 bytes an owner, 6 MB at 10,000).
    owners: HashMap<OwnerKey, Vec<PodKey>>,
    /// Per stream being re-listed: the pods seen so far in the new list.
    relisting: HashMap<usize, HashSet<PodKey>>,
    /// The streams that have listed once: until every one has, a pod missing here may only
    /// not have arrived yet.
    listed: HashSet<usize>,
    /// One copy of each `keyward.io/injected` record the claims hold: the pods of a profile
    /// mostly carry the same one (350 bytes a pod otherwise, 3.5 MB at 10,000). A record no
    /// claim holds is dropped when its last claim goes, or by the sweep that bounds the set.
    records: HashSet<Arc<str>>,
}

/// What changed: the owners to reconcile, and pods newly refused (with their UID).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changed {
    pub owners: Vec<OwnerKey>,
    pub refused: Vec<(PodKey, String, Refusal, String)>,
    /// A pod new to its owner (not an update of one already seen): what keyward remembers of
    /// the owner's Secrets is checked again (someone may have deleted them).
    pub arrived: Option<PodClaim>,
}

impl PodIndex {
    /// Records a pod as a watch delivered it, with the verdict worked out for it.
    pub fn apply(&mut self, key: PodKey, uid: String, verdict: PodVerdict) -> Changed {
        if let Some(seen) = self.relisting.get_mut(&key.stream) {
            seen.insert(key.clone());
        }
        let mut changed = Changed::default();
        let entry = match verdict {
            PodVerdict::Claim(mut claim) => {
                claim.evidence.injected = self.share(&claim.evidence.injected);
                Some(Entry::Claim(Box::new(claim)))
            }
            PodVerdict::Refused(refusal, why) => {
                let new = !matches!(self.pods.get(&key), Some(Indexed { verdict: Entry::Refused(r, _), uid: u }) if *u == uid && *r == refusal);
                if new {
                    changed.refused.push((key.clone(), uid.clone(), refusal, why.clone()));
                }
                Some(Entry::Refused(refusal, why))
            }
            PodVerdict::Nothing(_) => None,
        };
        let known = self.pods.get(&key).is_some_and(|p| p.uid == uid);
        if let (false, Some(Entry::Claim(claim))) = (known, &entry) {
            changed.arrived = Some(PodClaim::clone(claim));
        }
        if let Some(old) = self.forget(&key) {
            changed.owners.push(old);
        }
        if let Some(verdict) = entry {
            let indexed = Indexed { uid, verdict };
            if let Some(owner) = indexed.owner() {
                let pods = self.owners.entry(owner.clone()).or_default();
                if pods.capacity() == 0 {
                    // Room for the one pod most owners have (a `Vec` would start with four).
                    pods.reserve_exact(1);
                }
                if let Err(at) = pods.binary_search(&key) {
                    pods.insert(at, key.clone());
                }
                if !changed.owners.contains(&owner) {
                    changed.owners.push(owner);
                }
            }
            self.pods.insert(key, indexed);
        }
        changed
    }

    /// Forgets a pod (deleted, or its namespace opted out); returns its owner.
    pub fn remove(&mut self, key: &PodKey) -> Option<OwnerKey> {
        self.forget(key)
    }

    /// The index's copy of `record`.
    fn share(&mut self, record: &Arc<str>) -> Arc<str> {
        if let Some(shared) = self.records.get(record) {
            return shared.clone();
        }
        // Copies held elsewhere for a while (a claim being reconciled) can keep a record from
        // being dropped with its last pod: sweep, so that the set stays within twice the pods.
        if self.records.len() >= 2 * self.pods.len() + 64 {
            self.records.retain(|r| Arc::strong_count(r) > 1);
        }
        self.records.insert(record.clone());
        record.clone()
    }

    fn forget(&mut self, key: &PodKey) -> Option<OwnerKey> {
        let old = self.pods.remove(key)?;
        if let Entry::Claim(claim) = &old.verdict {
            // Held by the set and this claim only: the last pod with this record.
            if Arc::strong_count(&claim.evidence.injected) <= 2 {
                self.records.remove(&claim.evidence.injected);
            }
        }
        let owner = old.owner()?;
        if let Some(pods) = self.owners.get_mut(&owner) {
            if let Ok(at) = pods.binary_search(key) {
                pods.remove(at);
            }
            if pods.is_empty() {
                self.owners.remove(&owner);
            }
        }
        Some(owner)
    }

    /// Forgets every pod of a namespace (it opted out); returns their owners.
    pub fn remove_namespace(&mut self, namespace: &str) -> Vec<OwnerKey> {
        let keys: Vec<PodKey> = self.pods.keys().filter(|k| k.namespace == namespace).cloned().collect();
        let mut owners: Vec<OwnerKey> = keys.iter().filter_map(|k| self.forget(k)).collect();
        owners.sort();
        owners.dedup();
        owners
    }

    /// A watch of `stream` starts a new list (its first, or after 410 Gone or a restart).
    pub fn begin_relist(&mut self, stream: usize) {
        self.relisting.insert(stream, HashSet::new());
    }

    /// The list is complete: pods of `stream` it did not hold are gone; returns their owners.
    pub fn end_relist(&mut self, stream: usize) -> Vec<OwnerKey> {
        self.listed.insert(stream);
        let Some(seen) = self.relisting.remove(&stream) else { return Vec::new() };
        let gone: Vec<PodKey> = self.pods.keys().filter(|k| k.stream == stream && !seen.contains(k)).cloned().collect();
        let mut owners: Vec<OwnerKey> = gone.iter().filter_map(|k| self.forget(k)).collect();
        owners.sort();
        owners.dedup();
        owners
    }

    /// The pods of an owner, with their claims.
    pub fn claims(&self, owner: &OwnerKey) -> Vec<(&PodKey, &str, &PodClaim)> {
        self.owners
            .get(owner)
            .into_iter()
            .flatten()
            .filter_map(|k| match self.pods.get(k) {
                Some(Indexed { uid, verdict: Entry::Claim(c) }) => Some((k, uid.as_str(), &**c)),
                _ => None,
            })
            .collect()
    }

    /// Whether streams `0..streams` have each listed once.
    pub fn has_listed(&self, streams: usize) -> bool {
        (0..streams).all(|s| self.listed.contains(&s))
    }

    /// Every owner with a pod.
    pub fn owners(&self) -> Vec<OwnerKey> {
        let mut owners: Vec<OwnerKey> = self.owners.keys().cloned().collect();
        owners.sort();
        owners
    }

    pub fn pods(&self) -> usize {
        self.pods.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attestation::Evidence;
    use crate::desired::{Desired, Owner, Want};

    fn claim(namespace: &str, owner_uid: &str) -> PodVerdict {
        claim_with(namespace, owner_uid, r#"{"profile":"p"}"#)
    }

    fn claim_with(namespace: &str, owner_uid: &str, record: &str) -> PodVerdict {
        let owner = Owner {
            api_version: "trustyai.opendatahub.io/v1alpha1".into(),
            kind: "LMEvalJob".into(),
            name: "job".into(),
            uid: owner_uid.into(),
        };
        let want = Want::ClientCertificate { owner: owner.clone(), identity: "spiffe://x/ns/a/lmevaljob/job".into() };
        let wants = vec![Desired { namespace: namespace.into(), name: "job-client".into(), profile: "p".into(), want }];
        let evidence = Box::new(Evidence {
            value: None,
            namespace: namespace.into(),
            injected: record.into(),
            binding: Default::default(),
            created: None,
        });
        PodVerdict::Claim(PodClaim { profile: "p".into(), owner, wants, evidence })
    }

    fn key(name: &str) -> PodKey {
        PodKey { stream: 0, namespace: "a".into(), name: name.into() }
    }

    fn names<'a>(index: &'a PodIndex, owner: &OwnerKey) -> Vec<&'a str> {
        index.claims(owner).iter().map(|(k, _, _)| k.name.as_str()).collect()
    }

    #[test]
    fn an_owners_pods_stay_sorted_and_unique_as_they_come_and_go() {
        let mut index = PodIndex::default();
        let owner = OwnerKey { namespace: "a".into(), uid: "o-1".into() };
        for name in ["c", "a", "b", "a"] {
            let changed = index.apply(key(name), format!("uid-{name}"), claim("a", "o-1"));
            assert_eq!(changed.owners, vec![owner.clone()]);
        }
        assert_eq!(names(&index, &owner), ["a", "b", "c"]);
        assert_eq!(index.pods(), 3);
        // A pod that moves to another owner leaves the first.
        let other = OwnerKey { namespace: "a".into(), uid: "o-2".into() };
        let changed = index.apply(key("b"), "uid-b".into(), claim("a", "o-2"));
        assert_eq!(changed.owners, vec![owner.clone(), other.clone()]);
        assert_eq!(names(&index, &owner), ["a", "c"]);
        assert_eq!(names(&index, &other), ["b"]);
        assert_eq!(index.remove(&key("a")), Some(owner.clone()));
        assert_eq!(index.remove(&key("c")), Some(owner.clone()));
        assert_eq!(index.remove(&key("c")), None);
        assert!(index.claims(&owner).is_empty());
        assert_eq!(index.owners(), vec![other]);
    }

    fn record_of<'a>(index: &'a PodIndex, owner: &OwnerKey) -> &'a Arc<str> {
        &index.claims(owner)[0].2.evidence.injected
    }

    #[test]
    fn pods_with_the_same_record_share_one_copy_until_the_last_goes() {
        let mut index = PodIndex::default();
        let (o1, o2, o3) = ["o-1", "o-2", "o-3"].map(|uid| OwnerKey { namespace: "a".into(), uid: uid.into() }).into();
        index.apply(key("p1"), "u1".into(), claim_with("a", "o-1", "same"));
        index.apply(key("p2"), "u2".into(), claim_with("a", "o-2", "same"));
        index.apply(key("p3"), "u3".into(), claim_with("a", "o-3", "other"));
        assert!(Arc::ptr_eq(record_of(&index, &o1), record_of(&index, &o2)));
        assert_eq!(&**record_of(&index, &o3), "other");
        assert_eq!(index.records.len(), 2);
        index.remove(&key("p1"));
        assert_eq!(index.records.len(), 2, "p2 still holds \"same\"");
        index.remove(&key("p2"));
        index.remove(&key("p3"));
        assert!(index.records.is_empty());
    }

    #[test]
    fn records_held_elsewhere_when_their_pods_go_are_swept() {
        let mut index = PodIndex::default();
        let owner = OwnerKey { namespace: "a".into(), uid: "o-1".into() };
        // One pod, replaced 200 times, each time while a reconcile holds its claim's record.
        let mut held = Vec::new();
        for i in 0..200 {
            index.apply(key("p"), format!("u{i}"), claim_with("a", "o-1", &format!("record {i}")));
            held.push(record_of(&index, &owner).clone());
        }
        assert_eq!(index.records.len(), 200, "all still held");
        drop(held);
        index.apply(key("p"), "u-last".into(), claim_with("a", "o-1", "last"));
        assert_eq!(index.records.len(), 1, "swept, and the replaced pod's record dropped with it");
        assert_eq!(&**record_of(&index, &owner), "last");
    }
}
