//! Which profile selects a pod, and whether the requester may have its credentials.
//! Each check returns why it failed, so `keyward explain` can say it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::names::{glob_match, username_match};
use crate::profile::{LabelSelector, Profile, SelectorOperator};

/// The ownerReference with `controller: true`, if any. Only a controller owner counts: any
/// other owner reference is bookkeeping, not provenance.
pub fn controller_owner(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata.owner_references.as_deref().unwrap_or_default().iter().find(|o| o.controller == Some(true))
}

/// The API group of an `apiVersion` (`apps/v1` -> `apps`, `v1` -> ``).
pub fn api_group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// `Ok(())` when `profile` selects the pod in `namespace`; otherwise why not.
pub fn selects(profile: &Profile, pod: &Pod, namespace: &str) -> Result<(), String> {
    let spec = &profile.spec;
    if !spec.namespaces.is_empty() && !spec.namespaces.iter().any(|p| glob_match(p, namespace)) {
        return Err(format!("namespace {namespace:?} matches none of {:?}", spec.namespaces));
    }
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    label_selector_matches(&spec.selector, labels)?;
    if !spec.controller_owners.is_empty() {
        let Some(owner) = controller_owner(pod) else {
            return Err("the pod has no controller ownerReference".into());
        };
        let group = api_group(&owner.api_version);
        if !spec.controller_owners.iter().any(|k| k.api_group == group && k.kind == owner.kind) {
            return Err(format!(
                "controller owner {}/{} ({}) is not one of {}",
                if group.is_empty() { "core" } else { group },
                owner.kind,
                owner.name,
                spec.controller_owners
                    .iter()
                    .map(|k| format!("{}/{}", if k.api_group.is_empty() { "core" } else { &k.api_group }, k.kind))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    Ok(())
}

/// Kubernetes label-selector semantics: every term must hold; `NotIn` and `DoesNotExist`
/// hold when the label is absent.
pub fn label_selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> Result<(), String> {
    for (key, want) in &selector.match_labels {
        match labels.get(key) {
            Some(have) if have == want => {}
            Some(have) => return Err(format!("label {key}={have:?}, the profile wants {want:?}")),
            None => return Err(format!("label {key} is missing (the profile wants {key}={want:?})")),
        }
    }
    for req in &selector.match_expressions {
        let have = labels.get(&req.key);
        let ok = match req.operator {
            SelectorOperator::In => have.is_some_and(|v| req.values.contains(v)),
            SelectorOperator::NotIn => have.is_none_or(|v| !req.values.contains(v)),
            SelectorOperator::Exists => have.is_some(),
            SelectorOperator::DoesNotExist => have.is_none(),
        };
        if !ok {
            return Err(match have {
                Some(v) => format!("label {}={v:?} fails {:?} {:?}", req.key, req.operator, req.values),
                None => format!("label {} is missing (the profile wants {:?} {:?})", req.key, req.operator, req.values),
            });
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
    use crate::profile::{LabelSelectorRequirement, SelectorOperator::*};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn req(key: &str, operator: SelectorOperator, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement { key: key.into(), operator, values: values.iter().map(|v| v.to_string()).collect() }
    }

    #[test]
    fn selector_semantics_follow_kubernetes() {
        let sel = LabelSelector {
            match_labels: labels(&[("ray.io/originated-from-crd", "RayJob")]).into_iter().collect(),
            match_expressions: vec![req("ray.io/is-ray-node", DoesNotExist, &[]), req("tier", NotIn, &["gpu"])],
        };
        assert!(label_selector_matches(&sel, &labels(&[("ray.io/originated-from-crd", "RayJob")])).is_ok());
        let err = label_selector_matches(
            &sel,
            &labels(&[("ray.io/originated-from-crd", "RayJob"), ("ray.io/is-ray-node", "yes")]),
        )
        .unwrap_err();
        assert_eq!(err, "label ray.io/is-ray-node=\"yes\" fails DoesNotExist []");
        let err = label_selector_matches(&sel, &labels(&[("ray.io/originated-from-crd", "RayCluster")])).unwrap_err();
        assert_eq!(err, "label ray.io/originated-from-crd=\"RayCluster\", the profile wants \"RayJob\"");
        assert!(label_selector_matches(&sel, &labels(&[("ray.io/originated-from-crd", "RayJob"), ("tier", "gpu")]))
            .is_err());

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
