//! The self-check: the apiserver's pod rules that an injection could break, run on the pod view
//! plus the planned changes before keyward answers. The plan is built not to break them; this
//! is the second pair of eyes, so that a bug in keyward refuses a pod instead of returning one
//! the apiserver would reject. Only what the patch changes is checked: a rule the pod already
//! broke is the apiserver's to report.

use crate::audit::TOTAL_ANNOTATION_SIZE_LIMIT;
use crate::inject::{Source, MIN_TOKEN_EXPIRATION_SECONDS};
use crate::names::{is_dns1123_label, relative_path_problem};
use crate::plan::Changes;

/// The apiserver refuses a projected token that lives longer than 2^32 seconds.
const MAX_PROJECTED_TOKEN_SECONDS: i64 = 1 << 32;
use crate::pod::Spec;

/// Every rule the patched pod would break, one line each.
pub(crate) fn violations(spec: &Spec<'_>, changes: &Changes<'_>, annotation_bytes: usize) -> Vec<String> {
    let mut out = Vec::new();
    let remaining =
        |name: &str| spec.volume_hits.iter().any(|h| h.name == name && !changes.volumes_removed.contains(&h.index));
    for (i, volume) in changes.volumes_added.iter().enumerate() {
        if !is_dns1123_label(&volume.name) {
            out.push(format!("spec.volumes: {:?} is not a DNS-1123 label", volume.name));
        }
        if remaining(&volume.name) || changes.volumes_added[..i].iter().any(|v| v.name == volume.name) {
            out.push(format!("spec.volumes: {:?} would be duplicated", volume.name));
        }
        if let Source::ServiceAccountToken { expiration_seconds, path, .. } = &volume.source {
            if *expiration_seconds < MIN_TOKEN_EXPIRATION_SECONDS {
                out.push(format!(
                    "spec.volumes {:?}: expirationSeconds must be at least {MIN_TOKEN_EXPIRATION_SECONDS}",
                    volume.name
                ));
            }
            if let Some(p) = relative_path_problem(path) {
                out.push(format!("spec.volumes {:?}: path {p}", volume.name));
            }
        }
    }
    for (volume, lifetime) in &changes.token_lifetimes {
        if *lifetime < MIN_TOKEN_EXPIRATION_SECONDS || *lifetime > MAX_PROJECTED_TOKEN_SECONDS {
            out.push(format!(
                "spec.volumes {volume:?}: expirationSeconds must be between {MIN_TOKEN_EXPIRATION_SECONDS} and 2^32"
            ));
        }
    }
    for container in &changes.containers {
        let view = spec.all_containers().find(|c| c.list == container.list && c.index == container.index);
        // Written only for a violation: the path costs an allocation a container otherwise.
        let at = || format!("spec.{}[{}]", container.list.field(), container.index);
        for (i, mount) in container.mounts_added.iter().enumerate() {
            let volume_exists =
                changes.volumes_added.iter().any(|v| v.name == mount.volume) || remaining(&mount.volume);
            if !volume_exists {
                out.push(format!("{}.volumeMounts: {:?} is not a volume of the pod", at(), mount.volume));
            }
            let path_taken = view.is_some_and(|c| {
                c.mount_hits.iter().any(|h| h.path == mount.path && !container.mounts_removed.contains(&h.index))
            }) || container.mounts_added[..i].iter().any(|m| m.path == mount.path);
            if path_taken {
                out.push(format!("{}.volumeMounts: {:?} would be mounted twice", at(), mount.path));
            }
        }
    }
    // Mounts of the volumes the patch removes must go too.
    for container in spec.all_containers() {
        let removed_here = changes
            .containers
            .iter()
            .find(|c| c.list == container.list && c.index == container.index)
            .map(|c| c.mounts_removed.as_slice())
            .unwrap_or_default();
        for hit in &container.mount_hits {
            let volume_removed =
                spec.volume_hits.iter().any(|v| v.name == hit.volume && changes.volumes_removed.contains(&v.index));
            if volume_removed && !removed_here.contains(&hit.index) {
                out.push(format!(
                    "spec.{}[{}].volumeMounts[{}]: {:?} would no longer be a volume of the pod",
                    container.list.field(),
                    container.index,
                    hit.index,
                    hit.volume
                ));
            }
        }
    }
    if let Some((Some(a), Some(b))) = &changes.service_account {
        if !a.is_empty() && !b.is_empty() && a != b {
            out.push(format!("spec.serviceAccount: {b:?} would differ from spec.serviceAccountName {a:?}"));
        }
    }
    if annotation_bytes > TOTAL_ANNOTATION_SIZE_LIMIT {
        out.push(format!(
            "metadata.annotations: {annotation_bytes} bytes would be over the limit of {TOTAL_ANNOTATION_SIZE_LIMIT}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{decide, Reason, RequestFacts, Requester};
    use crate::inject::{MountSpec, VolumeSpec};
    use crate::plan::ContainerChanges;
    use crate::pod::{Container, ContainerList, MountHit, Presence, VolumeHit};
    use crate::profile::ProfileSet;
    use std::borrow::Cow;

    fn volume(name: &str, source: Source) -> VolumeSpec {
        VolumeSpec { name: name.into(), source }
    }

    fn mount(volume: &str, path: &str) -> MountSpec {
        MountSpec { volume: volume.into(), path: path.into() }
    }

    /// A pod with volumes `data` (0) and `cache` (1), and a container `main` mounting `data` at
    /// /data (mount 0) and `cache` at /cache (mount 1).
    fn pod() -> Spec<'static> {
        let hit =
            |index, name: &'static str| VolumeHit { index, name: Cow::Borrowed(name), raw: None, api_token: false };
        let mount_hit = |index, volume: &'static str, path: &'static str| MountHit {
            index,
            volume: Cow::Borrowed(volume),
            path: Cow::Borrowed(path),
            raw: None,
        };
        Spec {
            volumes: Presence::Present(2),
            volume_hits: vec![hit(0, "data"), hit(1, "cache")],
            containers: vec![Container {
                list: ContainerList::Main,
                index: 0,
                name: Cow::Borrowed("main"),
                mounts: Presence::Present(2),
                env: Presence::Absent,
                mount_hits: vec![mount_hit(0, "data", "/data"), mount_hit(1, "cache", "/cache")],
                env_hits: Vec::new(),
            }],
            container_count: 1,
            ..Spec::default()
        }
    }

    #[test]
    fn a_patch_that_keeps_the_pod_valid_has_no_violations() {
        let token = volume(
            "keyward-token",
            Source::ServiceAccountToken { audience: "a".into(), expiration_seconds: 600, path: "token".into() },
        );
        let at = mount("keyward-token", "/var/run/secrets/keyward");
        let changes = Changes {
            volumes_added: vec![&token],
            containers: vec![ContainerChanges {
                list: ContainerList::Main,
                index: 0,
                mounts_added: vec![&at],
                mounts_removed: Vec::new(),
            }],
            // A token lifetime set to the apiserver's bounds exactly.
            token_lifetimes: vec![("shortest".into(), 600), ("longest".into(), 1 << 32)],
            ..Changes::default()
        };
        assert_eq!(violations(&pod(), &changes, TOTAL_ANNOTATION_SIZE_LIMIT), Vec::<String>::new());
    }

    #[test]
    fn every_rule_a_patch_would_break_is_named() {
        let bad_name = volume("Bad_Name", Source::Secret { name: "s".into(), keys: None });
        let duplicate = volume("data", Source::Secret { name: "s".into(), keys: None });
        let token = volume(
            "keyward-token",
            Source::ServiceAccountToken { audience: "a".into(), expiration_seconds: 599, path: "../token".into() },
        );
        let twice = volume("keyward-token", Source::ConfigMap { name: "c".into(), keys: None });
        let (ghost, taken) = (mount("ghost", "/ghost"), mount("keyward-token", "/data"));
        let changes = Changes {
            volumes_added: vec![&bad_name, &duplicate, &token, &twice],
            // `cache` goes, but its mount stays.
            volumes_removed: vec![1],
            containers: vec![ContainerChanges {
                list: ContainerList::Main,
                index: 0,
                mounts_added: vec![&ghost, &taken],
                mounts_removed: Vec::new(),
            }],
            service_account: Some((Some("a".into()), Some("b".into()))),
            token_lifetimes: vec![("persistenceagent-sa-token".into(), 599), ("t".into(), (1 << 32) + 1)],
        };
        assert_eq!(
            violations(&pod(), &changes, TOTAL_ANNOTATION_SIZE_LIMIT + 1),
            [
                "spec.volumes: \"Bad_Name\" is not a DNS-1123 label",
                "spec.volumes: \"data\" would be duplicated",
                "spec.volumes \"keyward-token\": expirationSeconds must be at least 600",
                "spec.volumes \"keyward-token\": path must not contain a '..' segment",
                "spec.volumes: \"keyward-token\" would be duplicated",
                "spec.volumes \"persistenceagent-sa-token\": expirationSeconds must be between 600 and 2^32",
                "spec.volumes \"t\": expirationSeconds must be between 600 and 2^32",
                "spec.containers[0].volumeMounts: \"ghost\" is not a volume of the pod",
                "spec.containers[0].volumeMounts: \"/data\" would be mounted twice",
                "spec.containers[0].volumeMounts[1]: \"cache\" would no longer be a volume of the pod",
                "spec.serviceAccount: \"b\" would differ from spec.serviceAccountName \"a\"",
                "metadata.annotations: 262145 bytes would be over the limit of 262144",
            ]
        );
    }

    /// The self-check is the last line: a profile that slipped past validation (here, a token
    /// shorter than the apiserver allows) gets the pod refused, not a pod the apiserver rejects.
    #[test]
    fn a_plan_that_breaks_a_rule_refuses_the_pod_as_an_internal_error() {
        let yaml = "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {name: t}\nspec:\n  selector: {matchLabels: {app: t}}\n  requesters: {usernames: [bot]}\n  inject:\n    serviceAccountToken: {audience: a, mountPath: /var/run/secrets/t}\n";
        let set = ProfileSet::from_sources([("t.yaml".to_string(), yaml.to_string())]).unwrap();
        let mut profile = set.get("t").unwrap().clone();
        if let Some(token) = profile.spec.inject.service_account_token.as_mut() {
            token.expiration_seconds = 60;
        }
        let set = ProfileSet::new(vec![profile]);
        let pod = serde_json::value::RawValue::from_string(
            r#"{"metadata":{"name":"p","labels":{"app":"t"}},"spec":{"containers":[{"name":"main","image":"x"}]}}"#
                .to_string(),
        )
        .unwrap();
        let d = decide(&RequestFacts::pod_create("ns", Requester::User("bot")), &pod, &set);
        assert_eq!(d.reason, Reason::Internal);
        assert_eq!(
            d.message(),
            Some("keyward: internal error: the patched pod would fail validation: spec.volumes \"keyward-sa-token\": expirationSeconds must be at least 600; the pod was refused rather than risk a wrong one")
        );
    }
}
