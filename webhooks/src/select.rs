//! Which profile selects a pod, and whether the requester may have its credentials. A check
//! that fails says why as a [`Mismatch`], which becomes text only when `keyward explain` asks.

use std::collections::BTreeMap;
use std::fmt;

use crate::names::{glob_match, username_match, Labels};
use crate::pod::Metadata;
use crate::profile::{LabelSelector, LabelSelectorRequirement, OwnerKind, Profile, SelectorOperator};

/// The API group of an `apiVersion` (`apps/v1` -> `apps`, `v1` -> ``).
pub fn api_group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// Why a profile does not select a pod.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mismatch<'x> {
    Namespace {
        namespace: &'x str,
        patterns: &'x [String],
    },
    /// `what` is `label` or `annotation`.
    Value {
        what: &'static str,
        key: &'x str,
        have: &'x str,
        want: &'x str,
    },
    Missing {
        what: &'static str,
        key: &'x str,
        want: &'x str,
    },
    Expression {
        what: &'static str,
        requirement: &'x LabelSelectorRequirement,
        have: Option<&'x str>,
    },
    NoController,
    OwnerKind {
        group: &'x str,
        kind: &'x str,
        name: &'x str,
        wanted: &'x [OwnerKind],
    },
}

impl fmt::Display for Mismatch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = |group: &str| if group.is_empty() { "core".to_string() } else { group.to_string() };
        match self {
            Self::Namespace { namespace, patterns } => {
                write!(f, "namespace {namespace:?} matches none of {patterns:?}")
            }
            Self::Value { what, key, have, want } => {
                write!(f, "{what} {key}={:?}, the profile wants {want:?}", crate::text::clip(have, 64))
            }
            Self::Missing { what, key, want } => {
                write!(f, "{what} {key} is missing (the profile wants {key}={want:?})")
            }
            Self::Expression { what, requirement: r, have: Some(v) } => {
                write!(f, "{what} {}={:?} fails {:?} {:?}", r.key, crate::text::clip(v, 64), r.operator, r.values)
            }
            Self::Expression { what, requirement: r, have: None } => {
                write!(f, "{what} {} is missing (the profile wants {:?} {:?})", r.key, r.operator, r.values)
            }
            Self::NoController => f.write_str("the pod has no controller ownerReference"),
            Self::OwnerKind { group, kind, name, wanted } => {
                let wanted: Vec<String> = wanted.iter().map(|k| format!("{}/{}", core(&k.api_group), k.kind)).collect();
                write!(f, "controller owner {}/{kind} ({name}) is not one of {}", core(group), wanted.join(", "))
            }
        }
    }
}

/// `Ok(())` when `profile` selects the pod in `namespace`; otherwise why not.
pub fn selects<'x>(profile: &'x Profile, meta: &'x Metadata<'_>, namespace: &'x str) -> Result<(), Mismatch<'x>> {
    let spec = &profile.spec;
    if !spec.namespaces.is_empty() && !spec.namespaces.iter().any(|p| glob_match(p, namespace)) {
        return Err(Mismatch::Namespace { namespace, patterns: &spec.namespaces });
    }
    label_selector_matches(&spec.selector, &meta.labels)?;
    let selector = &spec.annotation_selector;
    map_matches("annotation", &selector.match_annotations, &selector.match_expressions, &meta.annotations.kept)?;
    if !spec.controller_owners.is_empty() {
        let Some(owner) = &meta.controller_owner else { return Err(Mismatch::NoController) };
        let group = api_group(&owner.api_version);
        if !spec.controller_owners.iter().any(|k| k.api_group == group && k.kind == owner.kind) {
            return Err(Mismatch::OwnerKind {
                group,
                kind: &owner.kind,
                name: &owner.name,
                wanted: &spec.controller_owners,
            });
        }
    }
    Ok(())
}

/// Kubernetes label-selector semantics: every term must hold; `NotIn` and `DoesNotExist` hold
/// when the label is absent.
pub fn label_selector_matches<'x>(selector: &'x LabelSelector, labels: &'x Labels<'_>) -> Result<(), Mismatch<'x>> {
    map_matches("label", &selector.match_labels, &selector.match_expressions, labels)
}

/// A selector over a map of strings (labels or annotations).
fn map_matches<'x>(
    what: &'static str,
    match_map: &'x BTreeMap<String, String>,
    expressions: &'x [LabelSelectorRequirement],
    map: &'x Labels<'_>,
) -> Result<(), Mismatch<'x>> {
    for (key, want) in match_map {
        match map.get(key.as_str()) {
            Some(have) if have == want => {}
            Some(have) => return Err(Mismatch::Value { what, key, have, want }),
            None => return Err(Mismatch::Missing { what, key, want }),
        }
    }
    for requirement in expressions {
        let have = map.get(requirement.key.as_str()).map(|v| v.as_ref());
        let ok = match requirement.operator {
            SelectorOperator::In => have.is_some_and(|v| requirement.values.iter().any(|w| w == v)),
            SelectorOperator::NotIn => have.is_none_or(|v| !requirement.values.iter().any(|w| w == v)),
            SelectorOperator::Exists => have.is_some(),
            SelectorOperator::DoesNotExist => have.is_none(),
        };
        if !ok {
            return Err(Mismatch::Expression { what, requirement, have });
        }
    }
    Ok(())
}

/// Whether `username` (from `request.userInfo`) may create pods that receive this profile.
pub fn requester_allowed(profile: &Profile, username: &str) -> bool {
    profile.spec.requesters.usernames.iter().any(|p| username_match(p, username))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::SelectorOperator::*;

    fn labels<'a>(pairs: &[(&'a str, &'a str)]) -> Labels<'a> {
        pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
    }

    fn req(key: &str, operator: SelectorOperator, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement { key: key.into(), operator, values: values.iter().map(|v| v.to_string()).collect() }
    }

    #[test]
    fn selector_semantics_follow_kubernetes() {
        let sel = LabelSelector {
            match_labels: BTreeMap::from([("ray.io/originated-from-crd".to_string(), "RayJob".to_string())]),
            match_expressions: vec![req("ray.io/is-ray-node", DoesNotExist, &[]), req("tier", NotIn, &["gpu"])],
        };
        assert!(label_selector_matches(&sel, &labels(&[("ray.io/originated-from-crd", "RayJob")])).is_ok());
        let pod = labels(&[("ray.io/originated-from-crd", "RayJob"), ("ray.io/is-ray-node", "yes")]);
        let err = label_selector_matches(&sel, &pod).unwrap_err();
        assert_eq!(err.to_string(), "label ray.io/is-ray-node=\"yes\" fails DoesNotExist []");
        let pod = labels(&[("ray.io/originated-from-crd", "RayCluster")]);
        let err = label_selector_matches(&sel, &pod).unwrap_err();
        assert_eq!(err.to_string(), "label ray.io/originated-from-crd=\"RayCluster\", the profile wants \"RayJob\"");
        let pod = labels(&[("ray.io/originated-from-crd", "RayJob"), ("tier", "gpu")]);
        assert!(label_selector_matches(&sel, &pod).is_err());

        let sel = LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![req("app", In, &["a", "b"]), req("x", Exists, &[])],
        };
        assert!(label_selector_matches(&sel, &labels(&[("app", "b"), ("x", "")])).is_ok());
        assert!(label_selector_matches(&sel, &labels(&[("app", "c"), ("x", "")])).is_err());
        assert!(label_selector_matches(&sel, &labels(&[("app", "a")])).is_err());
    }

    #[test]
    fn api_groups() {
        assert_eq!(api_group("trustyai.opendatahub.io/v1alpha1"), "trustyai.opendatahub.io");
        assert_eq!(api_group("apps/v1"), "apps");
        assert_eq!(api_group("v1"), "");
    }
}
