//! The parts of the apiserver's pod validation that an injection could break. The engine runs
//! them on its own output and refuses to return a pod that gained a violation; tests run them
//! on every pod they produce.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;

use crate::audit::TOTAL_ANNOTATION_SIZE_LIMIT;
use crate::names::{is_dns1123_label, relative_path_problem};
use crate::profile::MIN_TOKEN_EXPIRATION_SECONDS;

/// Every rule the pod breaks, as one line each.
pub fn violations(pod: &Pod) -> Vec<String> {
    let mut out = Vec::new();
    let annotations: usize = pod.metadata.annotations.iter().flatten().map(|(k, v)| k.len() + v.len()).sum();
    if annotations > TOTAL_ANNOTATION_SIZE_LIMIT {
        out.push(format!(
            "metadata.annotations: total size {annotations} bytes is over the limit of {TOTAL_ANNOTATION_SIZE_LIMIT}"
        ));
    }
    let Some(spec) = &pod.spec else {
        out.push("spec: required".to_string());
        return out;
    };
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    let mut names = BTreeSet::new();
    for (i, v) in volumes.iter().enumerate() {
        if !is_dns1123_label(&v.name) {
            out.push(format!("spec.volumes[{i}].name: {:?} is not a DNS-1123 label", v.name));
        }
        if !names.insert(v.name.as_str()) {
            out.push(format!("spec.volumes[{i}].name: {:?} is duplicated", v.name));
        }
        for (j, src) in v.projected.iter().flat_map(|p| p.sources.iter().flatten()).enumerate() {
            if let Some(t) = &src.service_account_token {
                let field = format!("spec.volumes[{i}].projected.sources[{j}].serviceAccountToken");
                if let Some(p) = relative_path_problem(&t.path) {
                    out.push(format!("{field}.path: {p}"));
                }
                if t.expiration_seconds.is_some_and(|s| s < MIN_TOKEN_EXPIRATION_SECONDS) {
                    out.push(format!("{field}.expirationSeconds: must be at least {MIN_TOKEN_EXPIRATION_SECONDS}"));
                }
            }
        }
    }
    let all = [
        ("initContainers", spec.init_containers.as_deref().unwrap_or_default()),
        ("containers", spec.containers.as_slice()),
    ];
    for (field, containers) in all {
        for (c, container) in containers.iter().enumerate() {
            let mut paths = BTreeSet::new();
            for (m, mount) in container.volume_mounts.iter().flatten().enumerate() {
                let at = format!("spec.{field}[{c}].volumeMounts[{m}]");
                if !names.contains(mount.name.as_str()) {
                    out.push(format!("{at}.name: {:?} is not a volume of the pod", mount.name));
                }
                if !paths.insert(mount.mount_path.as_str()) {
                    out.push(format!("{at}.mountPath: {:?} is already mounted in this container", mount.mount_path));
                }
            }
        }
    }
    if let (Some(a), Some(b)) = (&spec.service_account_name, &spec.service_account) {
        if !a.is_empty() && !b.is_empty() && a != b {
            out.push(format!("spec.serviceAccount: {b:?} differs from spec.serviceAccountName {a:?}"));
        }
    }
    out
}
