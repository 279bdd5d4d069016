//! Conditions: states of the cluster the controller cannot fix and must not fail on, such as a
//! namespace to publish the client CA to that does not exist, or a server CA source that is
//! missing or holds no certificate. Work that meets one carries on with everything else (no
//! error, no backoff); the condition is reported once when it starts and once when it ends,
//! and the watch on what is missing brings the work back when it appears.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// What kind of condition; the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Condition {
    /// `--publish-client-ca-to` names a namespace that does not exist.
    ClientCaNamespaceMissing,
    /// A profile's server CA source is missing, or holds no usable certificate.
    ServerCaSourceUnusable,
    /// The controller may not watch a server CA source (403): a change reaches namespaces
    /// only at the next resync.
    ServerCaSourceUnwatched,
}

impl Condition {
    pub const ALL: [Condition; 3] =
        [Self::ClientCaNamespaceMissing, Self::ServerCaSourceUnusable, Self::ServerCaSourceUnwatched];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClientCaNamespaceMissing => "client-ca-namespace-missing",
            Self::ServerCaSourceUnusable => "server-ca-source-unusable",
            Self::ServerCaSourceUnwatched => "server-ca-source-unwatched",
        }
    }
}

/// What changed when a condition was raised or cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// It is new, or says something new: report it.
    Raised,
    /// Already reported as it is.
    Unchanged,
    /// It held and no longer does: say so.
    Cleared,
}

/// The conditions in force, each on a subject (a namespace, an object) with its message.
#[derive(Debug, Default)]
pub struct Conditions {
    active: Mutex<BTreeMap<(Condition, String), String>>,
}

impl Conditions {
    pub fn raise(&self, condition: Condition, subject: &str, message: &str) -> Change {
        let mut active = self.active.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match active.insert((condition, subject.to_string()), message.to_string()) {
            Some(previous) if previous == message => Change::Unchanged,
            _ => Change::Raised,
        }
    }

    pub fn clear(&self, condition: Condition, subject: &str) -> Change {
        let mut active = self.active.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match active.remove(&(condition, subject.to_string())) {
            Some(_) => Change::Cleared,
            None => Change::Unchanged,
        }
    }

    /// How many of `condition` are in force.
    pub fn count(&self, condition: Condition) -> usize {
        let active = self.active.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        active.keys().filter(|(c, _)| *c == condition).count()
    }

    /// The message of `condition` on `subject`, if in force.
    pub fn message(&self, condition: Condition, subject: &str) -> Option<String> {
        let active = self.active.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        active.get(&(condition, subject.to_string())).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_is_reported_when_it_starts_changes_and_ends() {
        let c = Conditions::default();
        let missing = Condition::ClientCaNamespaceMissing;
        assert_eq!(c.raise(missing, "lm-eval", "no such namespace"), Change::Raised);
        assert_eq!(c.raise(missing, "lm-eval", "no such namespace"), Change::Unchanged);
        assert_eq!(c.raise(missing, "other", "no such namespace"), Change::Raised);
        assert_eq!(c.count(missing), 2);
        assert_eq!(c.count(Condition::ServerCaSourceUnusable), 0);
        assert_eq!(c.raise(missing, "lm-eval", "something else"), Change::Raised);
        assert_eq!(c.clear(missing, "lm-eval"), Change::Cleared);
        assert_eq!(c.clear(missing, "lm-eval"), Change::Unchanged);
        assert_eq!(c.message(missing, "other").as_deref(), Some("no such namespace"));
        assert_eq!(c.count(missing), 1);
    }
}
