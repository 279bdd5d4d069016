//! Planning the patch: a profile's injections merged into the pod view, never clobbering what
//! the pod has. Identical things already there are left alone (so a second call is a no-op),
//! and anything that collides and differs is a conflict that names the field and the fix.
//!
//! Paths are computed against the pod as the apiserver holds it: removals go from the highest
//! index down, additions append (`/-`), and a missing or `null` array or map is added whole
//! (strict RFC 6902 fails an `add` under a missing parent).

use serde_json::Value;

use crate::inject::{
    same_env_value, without_nulls, ApiToken, EnvSpec, EnvValue, Injection, MountSpec, Source, VolumeSpec, DEFAULT_MODE,
    DEFAULT_TOKEN_EXPIRATION_SECONDS,
};
use crate::patch::{ContainerField, Item, OpValue, PatchOp, Path};
use crate::pod::{Container, ContainerList, Presence, Spec};
use crate::profile::{EnvConflictPolicy, Profile};
use crate::rotation::Rotation;
use crate::text::{clip, quoted};

/// The patch for one profile, or why it cannot be made.
#[derive(Debug, Default)]
pub(crate) struct Plan<'p> {
    pub ops: Vec<PatchOp>,
    pub conflicts: Vec<String>,
    pub warnings: Vec<String>,
    /// The patch would pass [`MAX_PATCH_OPERATIONS`]; planning stopped.
    pub too_large: bool,
    /// Per injection: whether the patch makes the pod refer to one of its objects that it did
    /// not refer to before (its volume's Secret or ConfigMap, a Secret through an env var, its
    /// service account).
    pub used: Vec<bool>,
    /// The account the pod asked for, when the patch swaps it.
    pub original_service_account: Option<String>,
    /// What the patch adds and removes, for the self-check.
    pub changes: Changes<'p>,
}

/// What a patch does to the pod's volumes, mounts and service account.
#[derive(Debug, Default)]
pub(crate) struct Changes<'p> {
    pub volumes_added: Vec<&'p VolumeSpec>,
    pub volumes_removed: Vec<usize>,
    pub containers: Vec<ContainerChanges<'p>>,
    /// `serviceAccountName` and `serviceAccount` after the patch, when either is set.
    pub service_account: Option<(Option<String>, Option<String>)>,
    /// Token volumes of the pod's whose lifetime the patch sets: name and new lifetime.
    pub token_lifetimes: Vec<(String, i64)>,
}

#[derive(Debug)]
pub(crate) struct ContainerChanges<'p> {
    pub list: ContainerList,
    pub index: usize,
    pub mounts_added: Vec<&'p MountSpec>,
    pub mounts_removed: Vec<usize>,
}

/// The most operations keyward puts in one patch: the apiserver's own limit on a JSON patch.
/// A legitimate pod needs a few dozen; more means thousands of containers.
pub(crate) const MAX_PATCH_OPERATIONS: usize = 10_000;

/// Merges `injections` (each kind's, in registry order) into the pod.
pub(crate) fn plan<'p>(profile: &Profile, spec: &Spec<'_>, injections: &'p [(&'static str, Injection)]) -> Plan<'p> {
    let mut plan = Plan { used: vec![false; injections.len()], ..Plan::default() };

    // 1. The service account, and the Kubernetes API token.
    if let Some((index, target)) =
        injections.iter().enumerate().find_map(|(n, (_, i))| i.service_account.as_deref().map(|t| (n, t)))
    {
        swap_service_account(spec, index, target, &mut plan);
    }
    let remove_token = injections.iter().any(|(_, i)| i.api_token == ApiToken::Remove);
    if remove_token {
        remove_api_token(spec, &mut plan);
    }

    // 2. Where each injection's volume stands, and, in each container the profile targets,
    // its mount.
    let listed = &profile.spec.containers;
    let targets: Vec<&Container<'_>> =
        spec.all_containers().filter(|c| listed.is_empty() || listed.iter().any(|n| *n == c.name)).collect();
    if !listed.is_empty() {
        refuse_unnamed_mounts(profile, spec, injections, &mut plan);
    }
    let (volume_there, mounts) = standing(profile, spec, &targets, injections, &mut plan);

    // 3. The volumes some container needs.
    add_volumes(spec, injections, &volume_there, &mounts, &mut plan);

    // 4. Mounts and env vars, in every container the profile targets.
    if !add_to_containers(profile, &targets, injections, &mounts, &mut plan) {
        plan.too_large = true;
        return plan;
    }

    warn_accepted(profile, spec, &targets, injections, &mounts, &mut plan);
    for name in listed {
        if !spec.all_containers().any(|c| c.name == name.as_str()) {
            plan.warnings.push(format!(
                "keyward: profile {:?} lists container {name:?}, which this pod does not have",
                profile.name
            ));
        }
    }
    plan
}

/// A container the profile does not name must not mount what keyward injects: it would read
/// the credential while the audit record says it went only to the named ones.
fn refuse_unnamed_mounts(
    profile: &Profile,
    spec: &Spec<'_>,
    injections: &[(&'static str, Injection)],
    plan: &mut Plan<'_>,
) {
    let listed = &profile.spec.containers;
    let injected: Vec<&str> =
        injections.iter().filter_map(|(_, i)| i.volume.as_ref().map(|(v, _)| v.name.as_str())).collect();
    for container in spec.all_containers().filter(|c| !listed.iter().any(|n| *n == c.name)) {
        for hit in container.mount_hits.iter().filter(|h| injected.contains(&h.volume.as_ref())) {
            plan.conflicts.push(format!(
                "container {:?} mounts volume {:?} at {:?} (spec.{}[{}].volumeMounts[{}]), but profile {:?} injects that volume only into {}; remove that mount, or add {:?} to the profile's spec.containers",
                container.name,
                hit.volume,
                hit.path,
                container.list.field(),
                container.index,
                hit.index,
                profile.name,
                listed.join(", "),
                container.name
            ));
        }
    }
}

/// For each injection: whether its volume is there already, and in each target container its
/// mount: already there, there in another form that delivers the same credential (accepted),
/// in the way (a conflict), or to add.
fn standing(
    profile: &Profile,
    spec: &Spec<'_>,
    targets: &[&Container<'_>],
    injections: &[(&'static str, Injection)],
    plan: &mut Plan<'_>,
) -> (Vec<bool>, Vec<Vec<MountState>>) {
    let removed = |index: usize| plan.changes.volumes_removed.contains(&index);
    let mut volume_there = vec![false; injections.len()];
    let mut mounts: Vec<Vec<MountState>> = vec![Vec::new(); injections.len()];
    let mut conflicts = Vec::new();
    let mut lifetimes = Vec::new();
    for (n, (_, injection)) in injections.iter().enumerate() {
        let Some((volume, mount)) = &injection.volume else { continue };
        if let Some(hit) = spec.volume_hits.iter().find(|h| h.name == volume.name && !removed(h.index)) {
            // Decoded and normalized once: for the comparison and, where the profile knows how
            // often the token's reader re-reads it, for the token's lifetime.
            let theirs = hit.raw.and_then(|raw| raw.value());
            let written = theirs.as_ref().and_then(|v| v.pointer(TOKEN_LIFETIME)).is_some_and(|l| !l.is_null());
            let theirs = theirs.map(normalized_volume);
            let ours = normalized_volume(volume.to_json());
            let relifed = |theirs: Option<Value>| {
                let (theirs, reader) = theirs.zip(injection.token_reader_seconds)?;
                Some((other_lifetime(theirs, &ours)?, reader))
            };
            match theirs {
                Some(theirs) if theirs == ours => volume_there[n] = true,
                theirs => match relifed(theirs) {
                    Some((lifetime, reader)) => {
                        lifetimes.push((hit, (written, lifetime), reader, volume));
                        volume_there[n] = true;
                    }
                    None => conflicts.push(format!(
                        "spec.volumes[{}] is a volume named {:?} that differs from the one profile {:?} injects; rename your volume (names starting with keyward- are reserved for keyward)",
                        hit.index, volume.name, profile.name
                    )),
                },
            }
        }
        // Many containers may mount the same other volume at the path: judge it once.
        let mut judged: Vec<(String, bool)> = Vec::new();
        let mut delivers_ours = |name: &str| match judged.iter().find(|(v, _)| *v == name) {
            Some((_, same)) => *same,
            None => {
                let same = delivers(spec, name, &volume.source, &removed);
                judged.push((name.to_string(), same));
                same
            }
        };
        for container in targets {
            let state = match container.mount_hits.iter().find(|h| h.path == mount.path) {
                None => MountState::Add,
                Some(hit)
                    if hit.volume == volume.name
                        && volume_there[n]
                        && hit.raw.and_then(|raw| raw.value()).is_some_and(|v| same_mount(v, mount)) =>
                {
                    MountState::There
                }
                Some(hit) if delivers_ours(&hit.volume) => MountState::Accepted(hit.volume.to_string()),
                Some(hit) => {
                    conflicts.push(format!(
                        "container {:?} already mounts volume {:?} at {:?} (spec.{}[{}].volumeMounts[{}]), where profile {:?} mounts {:?}; move that mount to another path{}",
                        container.name, hit.volume, mount.path, container.list.field(), container.index, hit.index,
                        profile.name, mount.volume, container_hint(profile)
                    ));
                    MountState::There
                }
            };
            mounts[n].push(state);
        }
    }
    plan.conflicts.extend(conflicts);
    for (hit, found, reader, volume) in lifetimes {
        set_lifetime(profile, hit, found, volume, reader, plan);
    }
    (volume_there, mounts)
}

/// Where a token volume's lifetime is, with the one projection keyward's token volumes have.
const TOKEN_LIFETIME: &str = "/projected/sources/0/serviceAccountToken/expirationSeconds";

/// Gives the pod's own volume named like the injected token the profile's lifetime: it is the
/// token keyward injects in all but that, and the profile knows how often its reader re-reads
/// it (the operator's lifetime may be one the reader outlives, as KFP's manifests' is).
/// `written`: whether the pod has the field (the apiserver's defaulting always writes it).
fn set_lifetime(
    profile: &Profile,
    hit: &crate::pod::VolumeHit<'_>,
    (written, theirs): (bool, i64),
    ours: &VolumeSpec,
    reader: i64,
    plan: &mut Plan<'_>,
) {
    let Source::ServiceAccountToken { expiration_seconds, .. } = &ours.source else { return };
    // The patch removes volumes (the API token's) before this operation applies: count them.
    let before_it = plan.changes.volumes_removed.iter().filter(|&&i| i < hit.index).count();
    let path = Path::TokenLifetime { volume: hit.index - before_it, source: 0 };
    let value = OpValue::Int(*expiration_seconds);
    plan.ops.push(if written { PatchOp::replace(path, value) } else { PatchOp::add(path, value) });
    plan.changes.token_lifetimes.push((ours.name.clone(), *expiration_seconds));
    let before = Rotation::new(theirs, reader);
    let why = if before.fits() { "" } else { ", which its reader outlives" };
    plan.warnings.push(format!(
        "keyward: profile {:?} serviceAccountToken: the pod's volume {:?} (spec.volumes[{}]) is the token keyward injects, with a lifetime of {theirs} s{why} ({before}); keyward set its expirationSeconds to {expiration_seconds}",
        profile.name, ours.name, hit.index
    ));
}

/// Where the pod's volume `theirs` is the token volume `ours` in all but the token's lifetime
/// (both normalized, so `theirs` has one): that lifetime.
fn other_lifetime(mut theirs: Value, ours: &Value) -> Option<i64> {
    let wanted = ours.pointer(TOKEN_LIFETIME)?.clone();
    let lifetime = theirs.pointer(TOKEN_LIFETIME)?.as_i64()?;
    *theirs.pointer_mut(TOKEN_LIFETIME)? = wanted;
    (theirs == *ours).then_some(lifetime)
}

/// Adds each injection's volume where it is not there and some target container will mount it.
fn add_volumes<'p>(
    spec: &Spec<'_>,
    injections: &'p [(&'static str, Injection)],
    volume_there: &[bool],
    mounts: &[Vec<MountState>],
    plan: &mut Plan<'p>,
) {
    let mut volumes = spec.volumes;
    for (n, (_, injection)) in injections.iter().enumerate() {
        let Some((volume, _)) = &injection.volume else { continue };
        if !volume_there[n] && mounts[n].contains(&MountState::Add) {
            let array = push(&mut volumes);
            let item = if array { Item::Whole } else { Item::End };
            plan.ops.push(PatchOp::add(Path::Volumes(item), OpValue::Volume { injection: n, array }));
            plan.changes.volumes_added.push(volume);
            plan.used[n] = true;
        }
    }
}

/// Adds the mounts and env vars to every target container; `false` when the patch passes
/// [`MAX_PATCH_OPERATIONS`] (then the rest is not planned).
fn add_to_containers<'p>(
    profile: &Profile,
    targets: &[&Container<'_>],
    injections: &'p [(&'static str, Injection)],
    mounts: &[Vec<MountState>],
    plan: &mut Plan<'p>,
) -> bool {
    for (t, container) in targets.iter().enumerate() {
        if plan.ops.len() > MAX_PATCH_OPERATIONS {
            return false;
        }
        let at = |field: ContainerField, array: bool| Path::Container {
            list: container.list,
            index: container.index,
            field,
            item: if array { Item::Whole } else { Item::End },
        };
        let mut mount_array = container.mounts;
        let mut env = container.env;
        let mut added = Vec::new();
        for (n, (_, injection)) in injections.iter().enumerate() {
            if let Some((_, mount)) = &injection.volume {
                if mounts[n].get(t) == Some(&MountState::Add) {
                    let array = push(&mut mount_array);
                    plan.ops.push(PatchOp::add(
                        at(ContainerField::VolumeMounts, array),
                        OpValue::Mount { injection: n, array },
                    ));
                    added.push(mount);
                }
            }
            for (v, var) in injection.env.iter().enumerate() {
                if merge_env(profile, container, var, plan) {
                    let array = push(&mut env);
                    plan.ops.push(PatchOp::add(
                        at(ContainerField::Env, array),
                        OpValue::Env { injection: n, var: v, array },
                    ));
                    plan.used[n] |= matches!(var.value, EnvValue::SecretKey { .. });
                }
            }
        }
        if let Some(changes) =
            plan.changes.containers.iter_mut().find(|c| c.list == container.list && c.index == container.index)
        {
            changes.mounts_added = added;
        } else if !added.is_empty() {
            plan.changes.containers.push(ContainerChanges {
                list: container.list,
                index: container.index,
                mounts_added: added,
                mounts_removed: Vec::new(),
            });
        }
    }
    true
}

/// What is already delivered in another form, said once per injection.
fn warn_accepted(
    profile: &Profile,
    spec: &Spec<'_>,
    targets: &[&Container<'_>],
    injections: &[(&'static str, Injection)],
    mounts: &[Vec<MountState>],
    plan: &mut Plan<'_>,
) {
    for (n, (key, injection)) in injections.iter().enumerate() {
        let Some((volume, mount)) = &injection.volume else { continue };
        let accepted: Vec<(String, &str)> = targets
            .iter()
            .zip(&mounts[n])
            .filter_map(|(c, m)| match m {
                MountState::Accepted(by) => Some((format!("{:?}", c.name), by.as_str())),
                _ => None,
            })
            .collect();
        if let Some((_, by)) = accepted.first() {
            let names: Vec<&str> = accepted.iter().map(|(c, _)| c.as_str()).collect();
            plan.warnings.push(format!(
                "keyward: profile {:?} {key}: container {} already gets {} at {:?} (volume {by:?}); keyward counts it as injected and adds no other",
                profile.name,
                names.join(", "),
                describe_source(&volume.source),
                mount.path
            ));
            // The volume named like keyward's has had its lifetime set, above.
            if let (Some(reader), Source::ServiceAccountToken { expiration_seconds, .. }, false) =
                (injection.token_reader_seconds, &volume.source, *by == volume.name)
            {
                let theirs = token_lifetime(spec, by, &volume.source).unwrap_or(DEFAULT_TOKEN_EXPIRATION_SECONDS);
                let rotation = Rotation::new(theirs, reader);
                if !rotation.fits() {
                    plan.warnings.push(format!(
                        "keyward: profile {:?} {key}: the token of volume {by:?} {rotation}; set its expirationSeconds to {expiration_seconds}, or name the volume {:?} so that keyward sets it",
                        profile.name, volume.name
                    ));
                }
            }
        }
    }
}

/// Whether `var` is to be added to `container`; a different value already there is a conflict,
/// or, where the profile says so, a warning that keeps the container's.
fn merge_env(profile: &Profile, container: &Container<'_>, var: &EnvSpec, plan: &mut Plan<'_>) -> bool {
    let Some(hit) = container.env_hits.iter().find(|h| h.name == var.name) else { return true };
    // Decoded once, for the comparison and the message (`None`: too large to be ours).
    let theirs = hit.raw.map_or_else(|| Some(Value::Object(Default::default())), |raw| raw.value());
    if hit.raw.is_some() && theirs.as_ref().is_some_and(|v| same_env(v, var)) {
        return false;
    }
    let what = format!(
        "container {:?} already sets {} (spec.{}[{}].env[{}]) to {}, profile {:?} sets it to {}",
        container.name,
        var.name,
        container.list.field(),
        container.index,
        hit.index,
        theirs.as_ref().map_or_else(
            || format!("a value of more than {} JSON values", crate::tree::MAX_COMPARED_VALUES),
            describe_env
        ),
        profile.name,
        describe_env(&var.to_json())
    );
    match profile.spec.on_env_conflict {
        EnvConflictPolicy::KeepUser => plan.warnings.push(format!("keyward: {what}; keeping the container's value")),
        EnvConflictPolicy::Deny => plan
            .conflicts
            .push(format!("{what}; remove it from the container, or set spec.onEnvConflict: keepUser in the profile")),
    }
    false
}

/// Counts one more item in an array; true when the array is absent or `null`, so the first
/// `add` must bring the whole array (strict RFC 6902 fails an `add` under a missing parent).
fn push(array: &mut Presence) -> bool {
    match *array {
        Presence::Present(n) => {
            *array = Presence::Present(n + 1);
            false
        }
        Presence::Absent | Presence::Null => {
            *array = Presence::Present(1);
            true
        }
    }
}

/// Sets a field of `spec`: `replace` when the key is there (even `null`), else `add`.
fn set(ops: &mut Vec<PatchOp>, present: bool, field: &'static str, value: OpValue) {
    let path = Path::SpecField(field);
    ops.push(if present { PatchOp::replace(path, value) } else { PatchOp::add(path, value) });
}

/// Runs the pod as `target`, setting the deprecated `serviceAccount` to agree.
fn swap_service_account(spec: &Spec<'_>, injection: usize, target: &str, plan: &mut Plan<'_>) {
    let value =
        |f: &Option<Option<std::borrow::Cow<'_, str>>>| f.as_ref().and_then(|v| v.as_deref()).map(str::to_string);
    let (name, deprecated) = (value(&spec.service_account_name), value(&spec.service_account));
    let current = name
        .as_deref()
        .filter(|s| !s.is_empty())
        .or(deprecated.as_deref().filter(|s| !s.is_empty()))
        .unwrap_or("default");
    if current != target {
        plan.used[injection] = true;
        plan.original_service_account = Some(current.to_string());
    }
    if name.as_deref() != Some(target) {
        set(
            &mut plan.ops,
            spec.service_account_name.is_some(),
            "serviceAccountName",
            OpValue::ServiceAccount(injection),
        );
    }
    if deprecated.as_deref() != Some(target) {
        set(&mut plan.ops, spec.service_account.is_some(), "serviceAccount", OpValue::ServiceAccount(injection));
    }
    plan.changes.service_account = Some((Some(target.to_string()), Some(target.to_string())));
}

/// Removes the API token the ServiceAccount admission plugin added: `automountServiceAccountToken:
/// false`, the `kube-api-access-*` volumes, and every mount of them or at the token's path.
fn remove_api_token(spec: &Spec<'_>, plan: &mut Plan<'_>) {
    if spec.automount_service_account_token != Some(Some(false)) {
        set(
            &mut plan.ops,
            spec.automount_service_account_token.is_some(),
            "automountServiceAccountToken",
            OpValue::Bool(false),
        );
    }
    // Every volume that carries an API token (kube-api-access-*, and any projected token for
    // the API server's audience), and every mount of one or at the token's path.
    let removed: Vec<&str> = spec.volume_hits.iter().filter(|h| h.api_token).map(|h| h.name.as_ref()).collect();
    // Mounts first, from the last container and the last index down.
    for container in spec.all_containers().rev() {
        let doomed: Vec<usize> = container
            .mount_hits
            .iter()
            .filter(|m| m.path == crate::names::SERVICE_ACCOUNT_MOUNT_PATH || removed.contains(&m.volume.as_ref()))
            .map(|m| m.index)
            .collect();
        for &index in doomed.iter().rev() {
            plan.ops.push(PatchOp::remove(Path::Container {
                list: container.list,
                index: container.index,
                field: ContainerField::VolumeMounts,
                item: Item::At(index),
            }));
        }
        if !doomed.is_empty() {
            plan.changes.containers.push(ContainerChanges {
                list: container.list,
                index: container.index,
                mounts_added: Vec::new(),
                mounts_removed: doomed,
            });
        }
    }
    let doomed: Vec<usize> = spec.volume_hits.iter().filter(|h| h.api_token).map(|h| h.index).collect();
    for &index in doomed.iter().rev() {
        plan.ops.push(PatchOp::remove(Path::Volumes(Item::At(index))));
    }
    plan.changes.volumes_removed = doomed;
}

/// Where a container's mount at an injection's path stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MountState {
    /// To add.
    Add,
    /// keyward's own, already there (or in conflict, already reported).
    There,
    /// Another volume (named here) that delivers the same credential, at the same path.
    Accepted(String),
}

/// Whether the pod's volume `name` delivers what `ours` does: the same Secret or ConfigMap with
/// the same keys at the same file names, a projected token for the same audience at the same
/// path, or a pod certificate from the same signer at the same file names.
fn delivers(spec: &Spec<'_>, name: &str, ours: &Source, removed: &dyn Fn(usize) -> bool) -> bool {
    let Some(raw) = spec.volume_hits.iter().find(|h| h.name == name && !removed(h.index)).and_then(|h| h.raw) else {
        return false;
    };
    let Some(theirs) = raw.value() else { return false };
    let files = |source: &Value, keys: &Option<Vec<String>>| match (keys, source.get("items").and_then(Value::as_array))
    {
        // Ours is the whole object: so must theirs be.
        (None, items) => items.is_none(),
        // Ours is some keys, each at its own name: theirs has them all, at the same names.
        (Some(keys), None) => !keys.is_empty(),
        (Some(keys), Some(items)) => keys.iter().all(|k| {
            items.iter().any(|i| {
                i.get("key").and_then(Value::as_str) == Some(k) && i.get("path").and_then(Value::as_str) == Some(k)
            })
        }),
    };
    match ours {
        Source::Secret { name, keys } => theirs
            .get("secret")
            .is_some_and(|s| s.get("secretName").and_then(Value::as_str) == Some(name) && files(s, keys)),
        Source::ConfigMap { name, keys } => theirs
            .get("configMap")
            .is_some_and(|c| c.get("name").and_then(Value::as_str) == Some(name) && files(c, keys)),
        Source::ServiceAccountToken { audience, path, .. } => token_source(&theirs, audience, path).is_some(),
        // The same signer, with the files at the same names (key type and lifetime aside).
        Source::PodCertificate(ours) => {
            theirs.pointer("/projected/sources").and_then(Value::as_array).is_some_and(|sources| {
                sources.iter().any(|s| {
                    let theirs = &s["podCertificate"];
                    let field = |f: &str| theirs.get(f).and_then(Value::as_str);
                    field("signerName") == Some(&ours.signer_name)
                        && field("keyPath") == Some(&ours.key_path)
                        && field("certificateChainPath") == Some(&ours.certificate_chain_path)
                        && field("credentialBundlePath") == ours.credential_bundle_path.as_deref()
                })
            })
        }
        // The same bundle, or the same signer's bundles picked by the same labels, at the path.
        Source::ClusterTrustBundle(ours) => {
            theirs.pointer("/projected/sources").and_then(Value::as_array).is_some_and(|sources| {
                sources.iter().any(|s| {
                    let theirs = &s["clusterTrustBundle"];
                    let field = |f: &str| theirs.get(f).and_then(Value::as_str);
                    let labels = |v: &Value| -> Option<std::collections::BTreeMap<String, String>> {
                        let selector = v.get("labelSelector").filter(|l| !l.is_null())?;
                        serde_json::from_value(selector.get("matchLabels").cloned().unwrap_or(Value::Null))
                            .ok()
                            .or_else(|| Some(Default::default()))
                    };
                    field("name") == ours.name.as_deref()
                        && field("signerName") == ours.signer_name.as_deref()
                        && field("path") == Some(&ours.path)
                        && theirs.pointer("/labelSelector/matchExpressions").is_none_or(Value::is_null)
                        && labels(theirs).as_ref() == ours.label_selector.as_ref().map(|l| &l.match_labels)
                })
            })
        }
    }
}

/// The `serviceAccountToken` projection of a volume for `audience` at `path`.
fn token_source<'v>(volume: &'v Value, audience: &str, path: &str) -> Option<&'v Value> {
    volume.pointer("/projected/sources")?.as_array()?.iter().map(|s| &s["serviceAccountToken"]).find(|token| {
        token.get("audience").and_then(Value::as_str) == Some(audience)
            && token.get("path").and_then(Value::as_str) == Some(path)
    })
}

/// The lifetime of the token the pod's volume `name` delivers for `ours` (its audience and path).
fn token_lifetime(spec: &Spec<'_>, name: &str, ours: &Source) -> Option<i64> {
    let Source::ServiceAccountToken { audience, path, .. } = ours else { return None };
    let theirs = spec.volume_hits.iter().find(|h| h.name == name)?.raw?.value()?;
    token_source(&theirs, audience, path)?.get("expirationSeconds").and_then(Value::as_i64)
}

fn describe_source(source: &Source) -> String {
    match source {
        Source::Secret { name, keys: None } => format!("Secret {name:?}"),
        Source::Secret { name, keys: Some(keys) } => format!("{} of Secret {name:?}", keys.join(", ")),
        Source::ConfigMap { name, keys: None } => format!("ConfigMap {name:?}"),
        Source::ConfigMap { name, keys: Some(keys) } => format!("{} of ConfigMap {name:?}", keys.join(", ")),
        Source::ServiceAccountToken { audience, path, .. } => format!("a token for audience {audience:?} as {path:?}"),
        Source::PodCertificate(p) => format!("a pod certificate from signer {:?}", p.signer_name),
        Source::ClusterTrustBundle(b) => match (&b.name, &b.signer_name) {
            (Some(name), _) => format!("ClusterTrustBundle {name:?}"),
            (None, signer) => format!("the ClusterTrustBundles of signer {:?}", signer.as_deref().unwrap_or_default()),
        },
    }
}

fn container_hint(profile: &Profile) -> &'static str {
    if profile.spec.containers.is_empty() {
        ", or list the containers that need credentials in the profile's spec.containers"
    } else {
        ""
    }
}

fn describe_env(e: &Value) -> String {
    match (e.get("value").and_then(Value::as_str), e.pointer("/valueFrom/secretKeyRef")) {
        (_, Some(secret)) => format!(
            "secretKeyRef {}/{}",
            clip(secret.get("name").and_then(Value::as_str).unwrap_or_default(), 64),
            clip(secret.get("key").and_then(Value::as_str).unwrap_or_default(), 64)
        ),
        (_, None) if e.get("valueFrom").is_some_and(|v| !v.is_null()) => "a valueFrom reference".into(),
        (Some(v), None) => quoted(v, 64),
        (None, None) => "\"\"".into(),
    }
}

// === comparing with what the pod has ===

/// Drops `null` members, which Kubernetes treats as absent.
/// A volume as the apiserver leaves it after defaulting, so that keyward's own output compares
/// equal on a reinvocation.
fn normalized_volume(mut v: Value) -> Value {
    without_nulls(&mut v);
    for source in ["secret", "configMap", "projected"] {
        if let Some(Value::Object(s)) = v.get_mut(source) {
            s.entry("defaultMode").or_insert(Value::from(DEFAULT_MODE));
        }
    }
    if let Some(Value::Array(sources)) = v.pointer_mut("/projected/sources") {
        for source in sources {
            if let Some(Value::Object(token)) = source.get_mut("serviceAccountToken") {
                token.entry("expirationSeconds").or_insert(Value::from(DEFAULT_TOKEN_EXPIRATION_SECONDS));
            }
        }
    }
    v
}

#[cfg(test)]
fn same_volume(theirs: Value, ours: &VolumeSpec) -> bool {
    normalized_volume(theirs) == normalized_volume(ours.to_json())
}

fn same_mount(theirs: Value, ours: &MountSpec) -> bool {
    let mut v = theirs;
    without_nulls(&mut v);
    if let Value::Object(m) = &mut v {
        if m.get("subPath").and_then(Value::as_str) == Some("") {
            m.remove("subPath");
        }
        if m.get("mountPropagation").and_then(Value::as_str) == Some("None") {
            m.remove("mountPropagation");
        }
    }
    v == ours.to_json()
}

fn same_env(theirs: &Value, ours: &EnvSpec) -> bool {
    same_env_value(theirs, ours)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::Source;
    use serde_json::json;

    fn json_of(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn a_defaulted_volume_compares_equal_to_ours() {
        let ours = VolumeSpec { name: "v".into(), source: Source::Secret { name: "s".into(), keys: None } };
        assert!(same_volume(json_of(r#"{"name":"v","secret":{"secretName":"s"}}"#), &ours));
        assert!(same_volume(
            json_of(r#"{"name":"v","secret":{"secretName":"s","defaultMode":420,"optional":null}}"#),
            &ours
        ));
        assert!(!same_volume(json_of(r#"{"name":"v","secret":{"secretName":"other"}}"#), &ours));
        let token = VolumeSpec {
            name: "t".into(),
            source: Source::ServiceAccountToken {
                audience: "a".into(),
                expiration_seconds: 3600,
                path: "token".into(),
            },
        };
        assert!(same_volume(
            json_of(
                r#"{"name":"t","projected":{"sources":[{"serviceAccountToken":{"audience":"a","path":"token"}}]}}"#
            ),
            &token
        ));
    }

    #[test]
    fn mounts_and_env_compare_as_kubernetes_defaults_them() {
        let mount = MountSpec { volume: "v".into(), path: "/p".into() };
        assert!(same_mount(json_of(r#"{"name":"v","mountPath":"/p","readOnly":true,"subPath":""}"#), &mount));
        assert!(!same_mount(json_of(r#"{"name":"v","mountPath":"/p"}"#), &mount));
        let env = EnvSpec { name: "A".into(), value: crate::inject::EnvValue::Value("1".into()) };
        assert!(same_env(&json_of(r#"{"name":"A","value":"1"}"#), &env));
        assert!(!same_env(&json_of(r#"{"name":"A","value":"2"}"#), &env));
        assert_eq!(describe_env(&json!({"name": "A", "value": "x\ny"})), "\"x\\ny\"");
        assert_eq!(
            describe_env(&json!({"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})),
            "secretKeyRef s/k"
        );
    }
}
