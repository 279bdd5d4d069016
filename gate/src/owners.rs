//! Owners that must still exist: a gate file's `spec.liveOwners`. A keyward certificate names
//! its job (an owner, such as an LMEvalJob) and stays valid for its whole validity, also after
//! the job is deleted. A gate that watches an owner kind admits an identity of that kind only
//! while an object of that name exists in that namespace, closing that window. Checked here;
//! the watch is the binary's.

use keyward_engine::names::{is_dns1123_label, is_dns1123_subdomain};
use serde::Deserialize;

/// One entry of `spec.liveOwners`, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LiveOwnerSpec {
    /// `GROUP/VERSION` (`trustyai.opendatahub.io/v1alpha1`), or `VERSION` for the core group.
    pub api_version: String,
    /// As the API names it (`LMEvalJob`); the identity names it in lower case.
    pub kind: String,
    /// The resource's plural, when the API's is not the one Kubernetes clients guess from the
    /// kind (`lmevaljobs`); keyward controller reads owners by the guessed one.
    #[serde(default)]
    pub plural: Option<String>,
}

/// An owner kind the gate watches, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveOwner {
    /// Empty for the core group.
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: Option<String>,
}

// === impl LiveOwner ===

impl LiveOwner {
    /// Checks `spec` (entry `index`); every problem at once.
    pub fn new(index: usize, spec: LiveOwnerSpec) -> Result<Self, Vec<String>> {
        let at = format!("spec.liveOwners[{index}]");
        let mut problems = Vec::new();
        let (group, version) = match spec.api_version.split_once('/') {
            Some((group, version)) => (Some(group), version),
            None => (None, spec.api_version.as_str()),
        };
        if !group.is_none_or(is_dns1123_subdomain) || !is_dns1123_label(version) {
            problems.push(format!(
                "{at}.apiVersion {:?} is not GROUP/VERSION (as trustyai.opendatahub.io/v1alpha1) or a core VERSION",
                spec.api_version
            ));
        }
        let kind_ok = spec.kind.len() <= 63
            && spec.kind.starts_with(|c: char| c.is_ascii_uppercase())
            && spec.kind.bytes().all(|b| b.is_ascii_alphanumeric());
        if !kind_ok {
            problems
                .push(format!("{at}.kind {:?} is not a Kubernetes kind (as the API names it: LMEvalJob)", spec.kind));
        }
        if let Some(plural) = &spec.plural {
            if !is_dns1123_label(plural) {
                problems.push(format!("{at}.plural {plural:?} is not a resource name (lower case, as lmevaljobs)"));
            }
        }
        if problems.is_empty() {
            Ok(Self {
                group: group.unwrap_or_default().to_string(),
                version: version.to_string(),
                kind: spec.kind,
                plural: spec.plural,
            })
        } else {
            Err(problems)
        }
    }

    /// The kind as a workload identity names it (`lmevaljob`).
    pub fn identity_kind(&self) -> String {
        self.kind.to_ascii_lowercase()
    }

    /// `KIND (GROUP/VERSION)`, for messages.
    pub fn describe(&self) -> String {
        if self.group.is_empty() {
            format!("{} ({})", self.kind, self.version)
        } else {
            format!("{} ({}/{})", self.kind, self.group, self.version)
        }
    }
}

/// Checks `spec.liveOwners`: each entry, and no two for one identity kind (a SPIFFE ID names
/// the kind in lower case and no group, so two such entries could not be told apart).
pub fn check_all(specs: Vec<LiveOwnerSpec>, problems: &mut Vec<String>) -> Vec<LiveOwner> {
    let mut owners: Vec<LiveOwner> = Vec::new();
    for (i, spec) in specs.into_iter().enumerate() {
        match LiveOwner::new(i, spec) {
            Ok(owner) if owners.iter().any(|o| o.identity_kind() == owner.identity_kind()) => problems.push(format!(
                "spec.liveOwners[{i}]: another entry watches kind {:?}; an identity names its owner's kind in lower case, without a group, so give each kind once",
                owner.identity_kind()
            )),
            Ok(owner) => owners.push(owner),
            Err(more) => problems.extend(more),
        }
    }
    owners
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(api_version: &str, kind: &str, plural: Option<&str>) -> LiveOwnerSpec {
        LiveOwnerSpec { api_version: api_version.into(), kind: kind.into(), plural: plural.map(str::to_string) }
    }

    #[test]
    fn an_owner_kind_is_a_group_version_and_a_kind() {
        let owner = LiveOwner::new(0, spec("trustyai.opendatahub.io/v1alpha1", "LMEvalJob", None)).unwrap();
        assert_eq!((owner.group.as_str(), owner.version.as_str()), ("trustyai.opendatahub.io", "v1alpha1"));
        assert_eq!(owner.identity_kind(), "lmevaljob");
        assert_eq!(owner.describe(), "LMEvalJob (trustyai.opendatahub.io/v1alpha1)");
        let core = LiveOwner::new(0, spec("v1", "Pod", Some("pods"))).unwrap();
        assert_eq!((core.group.as_str(), core.describe()), ("", "Pod (v1)".to_string()));
    }

    #[test]
    fn every_problem_is_named_with_its_field() {
        let problems = LiveOwner::new(2, spec("Trusty/v1", "lmevaljob", Some("LMEvalJobs"))).unwrap_err();
        assert_eq!(
            problems,
            [
                "spec.liveOwners[2].apiVersion \"Trusty/v1\" is not GROUP/VERSION (as trustyai.opendatahub.io/v1alpha1) or a core VERSION",
                "spec.liveOwners[2].kind \"lmevaljob\" is not a Kubernetes kind (as the API names it: LMEvalJob)",
                "spec.liveOwners[2].plural \"LMEvalJobs\" is not a resource name (lower case, as lmevaljobs)",
            ]
        );
        for bad in ["", "a/b/c", "/v1", "g.io/", "g.io/V1"] {
            assert!(LiveOwner::new(0, spec(bad, "Job", None)).is_err(), "{bad:?}");
        }
        for bad in ["", "Job/x", "Jöb", &format!("J{}", "o".repeat(63))] {
            assert!(LiveOwner::new(0, spec("batch/v1", bad, None)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn one_entry_per_identity_kind() {
        let mut problems = Vec::new();
        let owners = check_all(
            vec![spec("a.io/v1", "Job", None), spec("batch/v1", "Job", None), spec("b.io/v1", "Graph", None)],
            &mut problems,
        );
        assert_eq!(owners.iter().map(LiveOwner::identity_kind).collect::<Vec<_>>(), ["job", "graph"]);
        assert_eq!(
            problems,
            ["spec.liveOwners[1]: another entry watches kind \"job\"; an identity names its owner's kind in lower case, without a group, so give each kind once"]
        );
    }
}
