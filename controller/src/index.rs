//! What the pod watches have delivered, kept small: per pod, only its claim (the owner and the
//! objects keyward would issue for it, and its attestation), worked out once when the pod
//! arrives; never the pod itself. Only pods in opted-in namespaces are kept: work for the
//! others costs nothing beyond reading the event.
//!
//! A watch that re-lists (after 410 Gone, or an API server restart) replaces what its stream
//! had: pods missing from the new list are forgotten.

use std::collections::{BTreeSet, HashMap, HashSet};

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
    Claim(PodClaim),
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
    owners: HashMap<OwnerKey, BTreeSet<PodKey>>,
    /// Per stream being re-listed: the pods seen so far in the new list.
    relisting: HashMap<usize, HashSet<PodKey>>,
    /// The streams that have listed once: until every one has, a pod missing here may only
    /// not have arrived yet.
    listed: HashSet<usize>,
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
            PodVerdict::Claim(claim) => Some(Entry::Claim(claim)),
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
            changed.arrived = Some(claim.clone());
        }
        if let Some(old) = self.forget(&key) {
            changed.owners.push(old);
        }
        if let Some(verdict) = entry {
            let indexed = Indexed { uid, verdict };
            if let Some(owner) = indexed.owner() {
                self.owners.entry(owner.clone()).or_default().insert(key.clone());
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

    fn forget(&mut self, key: &PodKey) -> Option<OwnerKey> {
        let old = self.pods.remove(key)?;
        let owner = old.owner()?;
        if let Some(pods) = self.owners.get_mut(&owner) {
            pods.remove(key);
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
                Some(Indexed { uid, verdict: Entry::Claim(c) }) => Some((k, uid.as_str(), c)),
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
