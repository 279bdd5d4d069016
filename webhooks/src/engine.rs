//! The decision: `(request facts, pod, profiles) -> Decision`. Pure and synchronous.
//!
//! The pod arrives raw. Its metadata is decoded first and every profile matched against it; a
//! pod no profile selects is answered then, without its spec ever being read. For the one
//! profile that selects it, each kind plans its injection, the spec is scanned for exactly what
//! those injections touch, the patch is planned and self-checked, and the audit record written.

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use crate::attest::{self, ANNOTATION_ATTESTATION};
use crate::audit::{
    AuditRecord, ContainerScope, ANNOTATION_INJECTED, ANNOTATION_ORIGINAL_SA, LABEL_PROFILE,
    TOTAL_ANNOTATION_SIZE_LIMIT,
};
use crate::binding::{self, Masks};
use crate::check::violations;
use crate::decision::Object;
pub use crate::decision::{Decision, Denial, Explanation, Mutation, ProfileTrace, Reason, RequestFacts, Requester};
use crate::inject::{ApiToken, Injection};
use crate::names::TemplateContext;
use crate::patch::{Op, OpValue, PatchOp, Path};
use crate::plan::{plan, MAX_PATCH_OPERATIONS};
use crate::pod::{self, Metadata, Wanted};
use crate::profile::{ConflictPolicy, Otherwise, Profile, ProfileSet};
use crate::select;
use crate::text::{clip, quoted};
use crate::tree::{self, Node};

/// Decides what to do with one admission request.
pub fn decide(facts: &RequestFacts<'_>, object: &RawValue, profiles: &ProfileSet) -> Decision {
    run(facts, object, profiles, None)
}

/// Decides, and explains: the trace and the injections in words are built only here.
pub fn explain(facts: &RequestFacts<'_>, object: &RawValue, profiles: &ProfileSet) -> Explanation {
    let mut explanation =
        Explanation { decision: Decision::unchanged(Reason::NoProfile), trace: Vec::new(), injects: Vec::new() };
    explanation.decision = run(facts, object, profiles, Some(&mut explanation));
    explanation
}

fn invalid_pod(reason: &str) -> Decision {
    Decision::deny(Reason::InvalidPod, format!("keyward: request.object is not a valid Pod: {}", clip(reason, 512)))
}

fn run(
    facts: &RequestFacts<'_>,
    object: &RawValue,
    profiles: &ProfileSet,
    explain: Option<&mut Explanation>,
) -> Decision {
    if !facts.is_pod_create() {
        return Decision::unchanged(Reason::NotPodCreate);
    }
    match pod::read(object, profiles.annotations_read()) {
        Ok(read) => decide_read(facts, &read, profiles, explain),
        Err(e) => invalid_pod(&e),
    }
}

/// Decides on a pod already read (see [`crate::review::read_request`], which must keep the
/// annotations in [`ProfileSet::annotations_read`]).
pub fn decide_object(facts: &RequestFacts<'_>, object: &Object<'_>, profiles: &ProfileSet) -> Decision {
    match object {
        Object::Read(read) => {
            if !facts.is_pod_create() {
                return Decision::unchanged(Reason::NotPodCreate);
            }
            decide_read(facts, read, profiles, None)
        }
        Object::Raw(raw) => decide(facts, raw, profiles),
        Object::Missing => decide(facts, RawValue::NULL, profiles),
    }
}

/// Decides on a pod as stored, after admission: as [`decide_object`], except that a pod the
/// webhook admitted under the other resolution of `delivery: auto` counts as injected too. The
/// webhook resolves `auto` from the cluster facts it last read, which lag the controller's
/// discovery, so either resolution is keyward's own.
pub fn decide_admitted(facts: &RequestFacts<'_>, object: &Object<'_>, profiles: &ProfileSet) -> Decision {
    let decision = decide_object(facts, object, profiles);
    // Selection does not depend on the delivery: a pod no profile selects is decided.
    if decision.reason == Reason::AlreadyInjected || decision.profile.is_none() {
        return decision;
    }
    match profiles.other_resolution() {
        Some(other) => {
            let again = decide_object(facts, object, other);
            if again.reason == Reason::AlreadyInjected {
                again
            } else {
                decision
            }
        }
        None => decision,
    }
}

fn decide_read(
    facts: &RequestFacts<'_>,
    read: &pod::Read<'_>,
    profiles: &ProfileSet,
    explain: Option<&mut Explanation>,
) -> Decision {
    let meta = &read.metadata;
    let mut d = decide_pod(facts, meta, read.spec, profiles, explain);
    if facts.admitting {
        d = only_keywards_own(d, meta);
    }
    d.pod = match (&meta.name, &meta.generate_name) {
        (Some(name), _) if !name.is_empty() => Some(clip(name, 253).into_owned()),
        (_, Some(prefix)) if !prefix.is_empty() => Some(format!("{}*", clip(prefix, 253))),
        _ => None,
    };
    d
}

/// The pod leaves the webhook with keyward's attestation and audit record only if keyward wrote
/// or checked them in this decision: anything a pod's author put there (copied from another
/// pod, say) is removed, whichever way the pod was decided, and a patch that would let one
/// through is refused (the self-check's rule for keyward's own annotations).
fn only_keywards_own(mut d: Decision, meta: &Metadata<'_>) -> Decision {
    let Ok(mutation) = &mut d.outcome else { return d };
    let existing = |key: &str| meta.annotations.kept.get(key).map(|v| v.as_ref());
    let vouched =
        [(ANNOTATION_ATTESTATION, mutation.attestation.as_deref()), (ANNOTATION_INJECTED, mutation.record.as_deref())];
    let mut removed = Vec::new();
    for (key, vouched) in vouched {
        if vouched.is_none() && existing(key).is_some() {
            mutation.ops.push(PatchOp::remove(Path::Annotations(Some(key))));
            removed.push(key);
        }
    }
    let wrong: Vec<&str> = vouched
        .into_iter()
        .filter(|(key, vouched)| annotation_after(existing(key), &mutation.ops, key) != *vouched)
        .map(|(key, _)| key)
        .collect();
    if !removed.is_empty() {
        d.warnings.push(format!(
            "keyward: removed {} from this pod: only keyward's webhook writes them, for pods it injects",
            removed.join(" and ")
        ));
    }
    if wrong.is_empty() {
        return d;
    }
    Decision::deny(
        Reason::Internal,
        format!(
            "keyward: internal error: the patched pod would carry {} that keyward did not write for it; the pod was refused rather than let it through",
            wrong.join(" and ")
        ),
    )
}

/// The value of annotation `key` after `ops`, given its value before.
fn annotation_after<'a>(before: Option<&'a str>, ops: &'a [PatchOp], key: &str) -> Option<&'a str> {
    ops.iter().fold(before, |value, op| match (&op.path, op.op, &op.value) {
        (Path::Annotations(Some(k)), Op::Remove, _) if *k == key => None,
        (Path::Annotations(Some(k)), Op::Add | Op::Replace, OpValue::Str(v)) if *k == key => Some(v.as_str()),
        (Path::Annotations(None), Op::Add | Op::Replace, OpValue::Map(k, v)) => (*k == key).then_some(v.as_str()),
        (Path::Annotations(None), Op::Remove, _) => None,
        _ => value,
    })
}

fn decide_pod(
    facts: &RequestFacts<'_>,
    meta: &Metadata<'_>,
    spec: Option<&RawValue>,
    profiles: &ProfileSet,
    mut explain: Option<&mut Explanation>,
) -> Decision {
    let mut selected: Vec<&Profile> = Vec::new();
    for profile in profiles.iter() {
        let result = select::selects(profile, meta, facts.namespace);
        if result.is_ok() {
            selected.push(profile);
        }
        if let Some(explain) = explain.as_deref_mut() {
            explain.trace.push(ProfileTrace {
                profile: profile.name.clone(),
                selected: result.is_ok(),
                why: result.err().map_or_else(|| "selects this pod".to_string(), |m| m.to_string()),
            });
        }
    }
    match selected.as_slice() {
        [] => Decision::unchanged(Reason::NoProfile),
        [profile] => {
            let mut d = decide_for(facts, spec, meta, profile, explain);
            d.profile = Some(profile.name.clone());
            d
        }
        several => {
            let names: Vec<String> = several.iter().map(|p| format!("{:?} ({})", p.name, p.source)).collect();
            Decision::deny(
                Reason::Ambiguous,
                format!(
                    "keyward: profiles {} all select this pod, and keyward will not guess which credentials it should get; narrow their selectors (spec.selector, spec.controllerOwners, spec.namespaces) so that one profile selects it",
                    names.join(" and ")
                ),
            )
        }
    }
}

fn decide_for(
    facts: &RequestFacts<'_>,
    spec: Option<&RawValue>,
    meta: &Metadata<'_>,
    profile: &Profile,
    explain: Option<&mut Explanation>,
) -> Decision {
    let mut notes = Vec::new();
    match facts.requester {
        Requester::User(user) if !select::requester_allowed(profile, user) => {
            let allowed = profile.spec.requesters.usernames.join(", ");
            let user = quoted(user, 256);
            return match profile.spec.requesters.otherwise {
                Otherwise::Skip => {
                    let mut d = Decision::unchanged(Reason::RequesterSkipped);
                    d.warnings.push(format!(
                        "keyward: profile {:?} selects this pod, but {user} may not receive its credentials (allowed: {allowed}); nothing was injected",
                        profile.name
                    ));
                    d
                }
                Otherwise::Deny => Decision::deny(
                    Reason::RequesterDenied,
                    format!(
                        "keyward: profile {:?} selects this pod, and only {allowed} may create such pods, not {user}; let the operator create it, or change the pod's labels so the profile does not select it",
                        profile.name
                    ),
                ),
            };
        }
        Requester::User(_) => {}
        Requester::Assumed => notes.push(format!(
            "requester not given: assumed to be one of {}",
            profile.spec.requesters.usernames.join(", ")
        )),
    }
    let mut d = inject(facts, spec, meta, profile, explain);
    d.warnings.extend(notes);
    d
}

/// What the selected profile does to the pod: each kind plans its injection, the spec is read
/// for what they touch, the patch is planned, annotated, labelled and self-checked.
fn inject(
    facts: &RequestFacts<'_>,
    raw_spec: Option<&RawValue>,
    meta: &Metadata<'_>,
    profile: &Profile,
    explain: Option<&mut Explanation>,
) -> Decision {
    let injections = match plan_injections(facts, meta, profile) {
        Ok(injections) => injections,
        Err(message) => return Decision::deny(Reason::Unresolvable, message),
    };
    if let Some(explain) = explain {
        for (key, kind) in profile.spec.inject.kinds() {
            if let Some((_, injection)) = injections.iter().find(|(k, _)| *k == key) {
                explain.injects.push(kind.describe(injection));
            }
        }
    }
    // A spec the attestation binds is read once, into a tree that the scan and the binding
    // share; one that is not what the tree reads is scanned from its JSON, for the scan's exact
    // refusal. One too large for a tree is refused: its binding would need the tree.
    // keyward gate's placement reads the containers it changes from the same tree.
    let places = injections.iter().find_map(|(_, i)| i.placement.as_ref());
    let tree = match (raw_spec, attests(facts, meta, profile) || places.is_some()) {
        (Some(raw), true) => match tree::read_spec(raw, tree::MAX_SPEC_VALUES) {
            Ok(tree) => Some(tree),
            Err(tree::ReadError::Json(_)) => None,
            Err(tree::ReadError::TooLarge) => {
                return Decision::deny(
                    Reason::TooLarge,
                    format!(
                        "keyward: profile {:?} selects this pod and {}, but its {}; keyward refuses rather than hold that much per admission: keep data out of the pod spec (a ConfigMap mounted as a volume, say)",
                        profile.name,
                        if places.is_some() { "places keyward gate in it" } else { "binds its credentials to what the pod runs" },
                        tree::too_large_message()
                    ),
                )
            }
        },
        _ => None,
    };
    let wanted = wanted_by(&injections);
    let spec = match &tree {
        Some(tree) => pod::spec_of_tree(tree, &wanted),
        None => pod::spec(raw_spec, &wanted),
    };
    let spec = match spec {
        Ok(spec) => spec,
        Err(e) => return invalid_pod(&e),
    };
    if let Some(refused) = too_large(profile, &spec) {
        return refused;
    }
    let mut planned = plan(profile, &spec, &injections);
    if planned.too_large {
        return Decision::deny(
            Reason::TooLarge,
            format!(
                "keyward: profile {:?} would need more than {MAX_PATCH_OPERATIONS} patch operations for this pod (every container it targets gets the profile's mounts and env vars), more than a JSON patch may have; list the containers that need credentials in the profile's spec.containers",
                profile.name
            ),
        );
    }
    if let Some(placement) = places {
        match (&tree, raw_spec) {
            (Some(tree), Some(raw)) => match crate::placement::plan(raw, tree, placement) {
                Ok(ops) => planned.ops.extend(ops),
                Err(conflicts) => planned.conflicts.extend(conflicts),
            },
            // Not JSON the tree reads: the scan above refused it already.
            _ => return invalid_pod("the pod's spec could not be read"),
        }
    }
    if !planned.conflicts.is_empty() {
        return conflicted(profile, planned);
    }

    // The audit record, on the pod and for the apiserver's audit log.
    let containers = container_scope(profile, &spec);
    let record = AuditRecord {
        profile: &profile.name,
        injected: injections.iter().map(|(_, i)| &i.item).collect(),
        containers: &containers,
    };
    let annotation = record.to_annotation();
    let kinds = record.kinds();
    let bindable = match &tree {
        Some(tree) => Bindable::Tree(tree),
        None => Bindable::Json(raw_spec),
    };
    let (attestation, vouched) = match attestation(facts, meta, profile, &annotation, bindable, &injections) {
        Attestation::NotNeeded => (None, None),
        Attestation::Keep(value) => (None, Some(value)),
        Attestation::Write(value) => (Some(value.clone()), Some(value)),
        Attestation::Unbindable(e) => return invalid_pod(&e),
        Attestation::NoKey => {
            return Decision::deny(
                Reason::Unattestable,
                format!(
                    "keyward: profile {:?} issues credentials for this pod's owner, which needs keyward's admission attestation, and this webhook has no attestation key loaded yet (keyward's controller creates the Secret keyward-attestation; the kubelet delivers it within a minute or two); retry then",
                    profile.name
                ),
            )
        }
    };
    let annotation_bytes = match annotate(meta, profile, &mut planned, &annotation, attestation) {
        Ok(bytes) => bytes,
        Err(message) => return Decision::deny(Reason::Conflict, message),
    };
    let label_op = label(meta, profile, &mut planned.ops);

    if !planned.ops.is_empty() {
        let broken = violations(&spec, &planned.changes, annotation_bytes);
        if !broken.is_empty() {
            return Decision::deny(
                Reason::Internal,
                format!(
                    "keyward: internal error: the patched pod would fail validation: {}; the pod was refused rather than risk a wrong one",
                    broken.join("; ")
                ),
            );
        }
    }

    let mut audit_annotations =
        BTreeMap::from([("profile".to_string(), profile.name.clone()), ("injected".to_string(), kinds)]);
    let crate::plan::Plan { ops, warnings, original_service_account, used, .. } = planned;
    if let Some(original) = original_service_account {
        audit_annotations.insert("original-service-account".into(), original);
    }
    // Pods admitted before keyward set the listing label lack it and are otherwise whole: that
    // alone is not a change to their injection.
    let reason = if ops.len() == usize::from(label_op) { Reason::AlreadyInjected } else { Reason::Injected };
    let mutation = Mutation {
        ops,
        injections,
        audit: Some((profile.name.clone(), containers)),
        new_dependencies: used,
        attestation: vouched,
        record: Some(annotation),
    };
    let mut d = Decision::new(reason, Ok(mutation));
    d.warnings = warnings;
    d.audit_annotations = audit_annotations;
    d
}

/// Each kind's injection for this pod, in registry order; or the refusal (`unresolvable`)
/// naming every template the pod cannot resolve.
fn plan_injections(
    facts: &RequestFacts<'_>,
    meta: &Metadata<'_>,
    profile: &Profile,
) -> Result<Vec<(&'static str, Injection)>, String> {
    let ctx = TemplateContext {
        namespace: facts.namespace,
        owner_name: meta.controller_owner.as_ref().map(|o| o.name.as_ref()),
        labels: &meta.labels,
    };
    let mut injections: Vec<(&'static str, Injection)> = Vec::new();
    let mut unresolved = Vec::new();
    for (key, kind) in profile.spec.inject.kinds() {
        match kind.plan(&ctx) {
            Ok(injection) => injections.push((key, injection)),
            Err(e) => unresolved.push(format!("spec.inject.{key}.{}: {}", e.field, e.reason)),
        }
    }
    if !unresolved.is_empty() {
        return Err(format!(
            "keyward: profile {:?} cannot name this pod's credentials: {}; give the pod what the profile needs, or fix the profile",
            profile.name,
            unresolved.join("; ")
        ));
    }
    Ok(injections)
}

/// What the spec is scanned for: exactly the volumes, mounts and env vars the injections touch.
fn wanted_by<'i>(injections: &'i [(&'static str, Injection)]) -> Wanted<'i> {
    let mut wanted = Wanted::default();
    for (_, injection) in injections {
        if let Some((volume, mount)) = &injection.volume {
            wanted.volume_names.push(&volume.name);
            wanted.mount_paths.push(&mount.path);
        }
        wanted.env_names.extend(injection.env.iter().map(|e| e.name.as_str()));
        wanted.api_token |= injection.api_token == ApiToken::Remove;
    }
    wanted
}

/// A refusal when the pod is past what keyward holds of a spec (the rest was counted, not kept).
fn too_large(profile: &Profile, spec: &pod::Spec<'_>) -> Option<Decision> {
    if spec.hits_truncated {
        return Some(Decision::deny(
            Reason::TooLarge,
            format!(
                "keyward: profile {:?} selects this pod, but it has more than {} volumes, mounts and env vars named like the profile's or the API token's; keyward refuses rather than build a patch that large",
                profile.name,
                pod::MAX_HITS - 1
            ),
        ));
    }
    if spec.container_count > pod::MAX_CONTAINERS {
        return Some(Decision::deny(
            Reason::TooLarge,
            format!(
                "keyward: profile {:?} selects this pod, but it has {} init containers and containers, more than keyward injects into ({}); keyward refuses rather than build a patch that large",
                profile.name,
                spec.container_count,
                pod::MAX_CONTAINERS
            ),
        ));
    }
    None
}

/// A pod whose spec collides with the injection: refused, or admitted unchanged with a warning
/// (`onConflict: skip`).
fn conflicted(profile: &Profile, planned: crate::plan::Plan<'_>) -> Decision {
    let conflicts = planned.conflicts.join("; ");
    let mut d = match profile.spec.on_conflict {
        ConflictPolicy::Deny => Decision::deny(
            Reason::Conflict,
            format!("keyward: profile {:?} cannot inject into this pod: {conflicts}", profile.name),
        ),
        ConflictPolicy::Skip => {
            let mut d = Decision::unchanged(Reason::ConflictSkipped);
            d.warnings.push(format!(
                "keyward: profile {:?} injected nothing into this pod (onConflict: skip): {conflicts}",
                profile.name
            ));
            d
        }
    };
    d.warnings.extend(planned.warnings);
    d
}

/// The containers the audit record names: all, or those of the profile's list the pod has.
fn container_scope(profile: &Profile, spec: &pod::Spec<'_>) -> ContainerScope {
    if profile.spec.containers.is_empty() {
        return ContainerScope::all();
    }
    ContainerScope::Named(
        profile
            .spec
            .containers
            .iter()
            .filter(|name| spec.all_containers().any(|c| c.name == name.as_str()))
            .cloned()
            .collect(),
    )
}

/// Adds keyward's annotations to the patch (the audit record, the attestation written now, the
/// original service account), unless the pod's annotations would pass the apiserver's limit
/// (then the refusal, a `conflict`). Returns their size after the patch.
fn annotate(
    meta: &Metadata<'_>,
    profile: &Profile,
    planned: &mut crate::plan::Plan<'_>,
    annotation: &str,
    attestation: Option<String>,
) -> Result<usize, String> {
    let existing = |key: &str| meta.annotations.kept.get(key).map(|v| v.as_ref());
    let mut added: Vec<(&'static str, String)> = Vec::new();
    if existing(ANNOTATION_INJECTED) != Some(annotation) {
        added.push((ANNOTATION_INJECTED, annotation.to_string()));
    }
    if let Some(value) = attestation {
        added.push((ANNOTATION_ATTESTATION, value));
    }
    if let Some(original) = &planned.original_service_account {
        if existing(ANNOTATION_ORIGINAL_SA).is_none() {
            added.push((ANNOTATION_ORIGINAL_SA, original.clone()));
        }
    }
    let replaced: usize = added.iter().filter_map(|(k, _)| existing(k).map(|v| k.len() + v.len())).sum();
    let annotation_bytes =
        meta.annotations.total_bytes - replaced + added.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    if annotation_bytes > TOTAL_ANNOTATION_SIZE_LIMIT {
        return Err(format!(
            "keyward: profile {:?} cannot inject into this pod: metadata.annotations would take {annotation_bytes} bytes with keyward's audit record, over the apiserver's limit of {TOTAL_ANNOTATION_SIZE_LIMIT}; shorten the pod's annotations",
            profile.name
        ));
    }
    let mut annotations_there = meta.annotations.state.is_there();
    for (key, value) in added {
        if annotations_there {
            let path = Path::Annotations(Some(key));
            planned.ops.push(if existing(key).is_some() {
                PatchOp::replace(path, OpValue::Str(value))
            } else {
                PatchOp::add(path, OpValue::Str(value))
            });
        } else {
            planned.ops.push(PatchOp::add(Path::Annotations(None), OpValue::Map(key, value)));
            annotations_there = true;
        }
    }
    Ok(annotation_bytes)
}

/// Adds the listing label `keyward.io/profile` when the pod lacks it; returns whether it did.
fn label(meta: &Metadata<'_>, profile: &Profile, ops: &mut Vec<PatchOp>) -> bool {
    if meta.labels.get(LABEL_PROFILE).is_some_and(|v| v.as_ref() == profile.name.as_str()) {
        return false;
    }
    // `add` replaces a key that is there; with no labels at all, the whole map is added.
    ops.push(if meta.labels.is_empty() {
        PatchOp::add(Path::Labels(None), OpValue::Map(LABEL_PROFILE, profile.name.clone()))
    } else {
        PatchOp::add(Path::Labels(Some(LABEL_PROFILE)), OpValue::Str(profile.name.clone()))
    });
    true
}

/// What to do about the admission attestation.
enum Attestation {
    /// None is needed: the profile issues nothing per owner, the pod has no owner, or this is
    /// not the webhook (no key).
    NotNeeded,
    /// The pod's own is valid for it (a reinvocation): kept.
    Keep(String),
    Write(String),
    /// One is needed and no key is loaded.
    NoKey,
    /// The spec cannot be bound (not JSON: never for a pod the apiserver sent).
    Unbindable(String),
}

/// Whether the pod gets an admission attestation: the profile issues per-owner credentials,
/// the pod has a controller owner, and this webhook attests.
fn attests(facts: &RequestFacts<'_>, meta: &Metadata<'_>, profile: &Profile) -> bool {
    facts.attestor.is_some() && meta.controller_owner.is_some() && profile.issues_per_owner
}

/// The spec an attestation binds: its JSON, or the tree it was read into.
#[derive(Clone, Copy)]
enum Bindable<'s> {
    Json(Option<&'s RawValue>),
    Tree(&'s Node<'s>),
}

/// The admission attestation, if the profile issues per-owner credentials: it binds the owner,
/// the record of what was injected, and what the pod runs and mounts ([`binding`]), so the
/// controller issues per-owner credentials only for pods this webhook admitted as such, and
/// never for a copy of one. One the pod carries is kept only if it is valid for this very pod
/// and recent (the webhook's reinvocation); anything else is replaced.
fn attestation(
    facts: &RequestFacts<'_>,
    meta: &Metadata<'_>,
    profile: &Profile,
    injected: &str,
    spec: Bindable<'_>,
    injections: &[(&'static str, Injection)],
) -> Attestation {
    let (Some(attestor), Some(owner), true) = (facts.attestor, &meta.controller_owner, profile.issues_per_owner) else {
        return Attestation::NotNeeded;
    };
    let masks = Masks::of(injections);
    let bound = match spec {
        Bindable::Tree(tree) => binding::of_tree(tree, &masks),
        Bindable::Json(raw) => match binding::of_raw(raw, &masks) {
            Ok(b) => b,
            Err(e) => return Attestation::Unbindable(e),
        },
    };
    let subject = attest::Subject {
        namespace: facts.namespace,
        owner: attest::OwnerRef {
            group: select::api_group(&owner.api_version),
            kind: &owner.kind,
            name: &owner.name,
            uid: &owner.uid,
        },
        profile: &profile.name,
        injected,
    };
    let now = attestor.now();
    if let Some(value) = meta.annotations.kept.get(ANNOTATION_ATTESTATION) {
        // Made for this pod, and lately: its time is checked against now as the controller
        // checks it against the pod's creation.
        let verdict =
            attest::check(Some(value), &subject, &bound, Some(now), |p, id, tag| attestor.verifies(p, id, tag));
        if verdict == attest::Verdict::Valid {
            return Attestation::Keep(value.to_string());
        }
    }
    let stamp = attest::Stamp { at: now, nonce: attestor.nonce() };
    match attestor.sign(&attest::payload(&subject, stamp.at, &stamp.nonce, &bound)) {
        Some(signature) => Attestation::Write(attest::format(&signature, &stamp, &bound)),
        None => Attestation::NoKey,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::Labels;
    use std::borrow::Cow;

    fn meta_with(annotations: &[(&'static str, &'static str)]) -> Metadata<'static> {
        let mut kept = Labels::new();
        for (k, v) in annotations {
            kept.insert(Cow::Borrowed(*k), Cow::Borrowed(*v));
        }
        let mut meta = Metadata::default();
        meta.annotations.kept = kept;
        meta.annotations.state = pod::Presence::Present(annotations.len());
        meta
    }

    fn admitted(ops: Vec<PatchOp>, attestation: Option<&str>) -> Decision {
        Decision::new(
            Reason::Injected,
            Ok(Mutation {
                ops,
                injections: Vec::new(),
                audit: None,
                new_dependencies: Vec::new(),
                attestation: attestation.map(str::to_string),
                record: None,
            }),
        )
    }

    /// The self-check of keyward's own annotations: a plan that would let through an
    /// attestation keyward did not vouch for is refused, whatever path made it.
    #[test]
    fn a_patch_that_would_leave_an_unvouched_attestation_is_refused() {
        let written = |v: &str| PatchOp::add(Path::Annotations(Some(ANNOTATION_ATTESTATION)), OpValue::Str(v.into()));
        // Written, and vouched for: fine.
        let d = only_keywards_own(admitted(vec![written("v2.a")], Some("v2.a")), &meta_with(&[]));
        assert_eq!(d.reason, Reason::Injected);
        // Written, but not the one vouched for (a bug): refused.
        let d = only_keywards_own(admitted(vec![written("v2.b")], Some("v2.a")), &meta_with(&[]));
        assert_eq!(d.reason, Reason::Internal);
        assert_eq!(
            d.message().unwrap(),
            "keyward: internal error: the patched pod would carry keyward.io/attestation that keyward did not write for it; the pod was refused rather than let it through"
        );
        // Written with nothing vouched for: refused too.
        let d = only_keywards_own(admitted(vec![written("v2.b")], None), &meta_with(&[]));
        assert_eq!(d.reason, Reason::Internal);
        // The pod's own, not vouched for: removed, with a warning.
        let d = only_keywards_own(admitted(Vec::new(), None), &meta_with(&[(ANNOTATION_ATTESTATION, "v2.x")]));
        assert_eq!(d.reason, Reason::Injected);
        assert_eq!(d.patch().ops, [PatchOp::remove(Path::Annotations(Some(ANNOTATION_ATTESTATION)))]);
        // The pod's own, checked and kept: stays.
        let d = only_keywards_own(admitted(Vec::new(), Some("v2.x")), &meta_with(&[(ANNOTATION_ATTESTATION, "v2.x")]));
        assert!(d.patch().is_empty());
        // A whole new annotations map replaces what was there.
        let whole = PatchOp::add(Path::Annotations(None), OpValue::Map(ANNOTATION_INJECTED, "{}".into()));
        assert_eq!(annotation_after(Some("v2.x"), std::slice::from_ref(&whole), ANNOTATION_ATTESTATION), None);
    }
}
