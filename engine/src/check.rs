//! The self-check: the apiserver's pod rules that an injection could break, run on the pod view
//! plus the planned changes before keyward answers. The plan is built not to break them; this
//! is the second pair of eyes, so that a bug in keyward refuses a pod instead of returning one
//! the apiserver would reject. Only what the patch changes is checked: a rule the pod already
//! broke is the apiserver's to report.

use crate::audit::TOTAL_ANNOTATION_SIZE_LIMIT;
use crate::inject::{Source, MIN_TOKEN_EXPIRATION_SECONDS};
use crate::names::{is_dns1123_label, relative_path_problem};
use crate::plan::Changes;
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
    for container in &changes.containers {
        let view = spec.all_containers().find(|c| c.list == container.list && c.index == container.index);
        let at = format!("spec.{}[{}]", container.list.field(), container.index);
        for (i, mount) in container.mounts_added.iter().enumerate() {
            let volume_exists =
                changes.volumes_added.iter().any(|v| v.name == mount.volume) || remaining(&mount.volume);
            if !volume_exists {
                out.push(format!("{at}.volumeMounts: {:?} is not a volume of the pod", mount.volume));
            }
            let path_taken = view.is_some_and(|c| {
                c.mount_hits.iter().any(|h| h.path == mount.path && !container.mounts_removed.contains(&h.index))
            }) || container.mounts_added[..i].iter().any(|m| m.path == mount.path);
            if path_taken {
                out.push(format!("{at}.volumeMounts: {:?} would be mounted twice", mount.path));
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
