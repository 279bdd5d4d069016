//! The decision: `(request facts, pod, profiles) -> Decision`. Pure and synchronous.

use std::collections::BTreeMap;

use json_patch::PatchOperation;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::audit::{
    AuditRecord, ContainerScope, InjectedItem, ANNOTATION_INJECTED, ANNOTATION_ORIGINAL_SA, TOTAL_ANNOTATION_SIZE_LIMIT,
};
use crate::error::Error;
use crate::inject::{self, Injection};
use crate::names::TemplateContext;
use crate::patch::{PatchBuilder, Seg};
use crate::profile::{Otherwise, Profile, ProfileSet};
use crate::select;
use crate::validate::violations;

/// What the engine needs from an AdmissionReview request besides the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFacts {
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: String,
    /// `request.resource.group` (`""` for core).
    pub group: String,
    /// `request.resource.resource` (`pods`).
    pub resource: String,
    /// `request.subResource` (`""` when none).
    pub sub_resource: String,
    /// `request.namespace`: the pod's own `metadata.namespace` may be empty on CREATE.
    pub namespace: String,
    pub requester: Requester,
    pub dry_run: bool,
}

/// Who is creating the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requester {
    /// `request.userInfo.username`.
    User(String),
    /// Not known (`keyward explain` on a bare Pod without `--user`): assume the profile's
    /// requesters, and say so in the trace.
    Assumed,
}

impl RequestFacts {
    /// A pod CREATE in `namespace` by `requester`: what the apiserver sends for a new pod.
    pub fn pod_create(namespace: impl Into<String>, requester: Requester) -> Self {
        Self {
            operation: "CREATE".into(),
            group: String::new(),
            resource: "pods".into(),
            sub_resource: String::new(),
            namespace: namespace.into(),
            requester,
            dry_run: false,
        }
    }

    fn is_pod_create(&self) -> bool {
        self.operation == "CREATE" && self.group.is_empty() && self.resource == "pods" && self.sub_resource.is_empty()
    }
}

/// Why the decision came out the way it did: short, stable, fit for a metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// Not a CREATE of a pod: never mutated.
    NotPodCreate,
    /// No profile selects the pod.
    NoProfile,
    /// Credentials were injected.
    Injected,
    /// Everything was already there (a reinvocation on our own output).
    AlreadyInjected,
    /// A profile selects the pod but the requester is not allowed; admitted unchanged.
    RequesterSkipped,
    /// A profile selects the pod but the requester is not allowed; denied.
    RequesterDenied,
    /// More than one profile selects the pod.
    Ambiguous,
    /// The pod already has something that collides with the injection.
    Conflict,
    /// A name template could not be resolved for this pod.
    Unresolvable,
    /// The object is not a valid Pod.
    InvalidPod,
    /// keyward would have produced an invalid pod (a bug); denied instead.
    Internal,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotPodCreate => "not-pod-create",
            Self::NoProfile => "no-profile",
            Self::Injected => "injected",
            Self::AlreadyInjected => "already-injected",
            Self::RequesterSkipped => "requester-skipped",
            Self::RequesterDenied => "requester-denied",
            Self::Ambiguous => "ambiguous",
            Self::Conflict => "conflict",
            Self::Unresolvable => "unresolvable",
            Self::InvalidPod => "invalid-pod",
            Self::Internal => "internal",
        }
    }
}

/// How one profile fared against the pod, for `keyward explain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProfileTrace {
    pub profile: String,
    pub selected: bool,
    pub why: String,
}

/// A refusal: the message names the field, the profile and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    pub message: String,
}

/// An admission: the patch (maybe empty) and what goes with it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mutation {
    pub patch: Vec<PatchOperation>,
    /// The pod after the patch.
    #[serde(skip)]
    pub pod: Option<Value>,
    pub audit: Option<AuditRecord>,
}

/// The engine's answer for one request.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub reason: Reason,
    pub profile: Option<String>,
    /// `Ok` to admit (with a patch, maybe empty), `Err` to refuse.
    #[serde(skip)]
    pub outcome: Result<Mutation, Denial>,
    pub warnings: Vec<String>,
    /// For the apiserver's audit log (the apiserver prefixes keys with the webhook name).
    pub audit_annotations: BTreeMap<String, String>,
    pub trace: Vec<ProfileTrace>,
}

impl Decision {
    fn new(reason: Reason, outcome: Result<Mutation, Denial>) -> Self {
        Self {
            reason,
            profile: None,
            outcome,
            warnings: Vec::new(),
            audit_annotations: BTreeMap::new(),
            trace: Vec::new(),
        }
    }

    fn unchanged(reason: Reason) -> Self {
        Self::new(reason, Ok(Mutation { patch: Vec::new(), pod: None, audit: None }))
    }

    fn deny(reason: Reason, message: String) -> Self {
        Self::new(reason, Err(Denial { message }))
    }

    pub fn allowed(&self) -> bool {
        self.outcome.is_ok()
    }

    /// The JSON patch, empty when there is nothing to change or the pod is refused.
    pub fn patch(&self) -> &[PatchOperation] {
        self.outcome.as_ref().map(|m| m.patch.as_slice()).unwrap_or_default()
    }

    /// The denial message, when refused.
    pub fn message(&self) -> Option<&str> {
        self.outcome.as_ref().err().map(|d| d.message.as_str())
    }
}

/// Decides what to do with one admission request.
pub fn decide(facts: &RequestFacts, object: &Value, profiles: &ProfileSet) -> Decision {
    if !facts.is_pod_create() {
        return Decision::unchanged(Reason::NotPodCreate);
    }
    let pod = match Pod::deserialize(object) {
        Ok(pod) => pod,
        Err(e) => {
            return Decision::deny(
                Reason::InvalidPod,
                format!("keyward: request.object is not a valid Pod: {}", crate::text::clip(&e.to_string(), 512)),
            )
        }
    };

    let trace: Vec<ProfileTrace> = profiles
        .iter()
        .map(|p| {
            let result = select::selects(p, &pod, &facts.namespace);
            ProfileTrace {
                profile: p.name.clone(),
                selected: result.is_ok(),
                why: result.err().unwrap_or_else(|| "selects this pod".into()),
            }
        })
        .collect();
    let selected: Vec<&Profile> =
        trace.iter().filter(|t| t.selected).filter_map(|t| profiles.get(&t.profile)).collect();
    let mut decision = match selected.as_slice() {
        [] => Decision::unchanged(Reason::NoProfile),
        [profile] => decide_for(facts, &pod, object, profile),
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
    };
    if let [profile] = selected.as_slice() {
        decision.profile = Some(profile.name.clone());
    }
    decision.trace = trace;
    decision
}

fn decide_for(facts: &RequestFacts, pod: &Pod, object: &Value, profile: &Profile) -> Decision {
    let mut notes = Vec::new();
    match &facts.requester {
        Requester::User(user) if !select::requester_allowed(profile, user) => {
            let allowed = profile.spec.requesters.usernames.join(", ");
            let user = crate::text::quoted(user, 256);
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

    let mut d = match inject_profile(facts, pod, object, profile) {
        Ok(d) => d,
        Err(e) => {
            Decision::deny(Reason::Internal, format!("keyward: {e}; the pod was refused rather than risk a wrong one"))
        }
    };
    d.warnings.extend(notes);
    d
}

fn inject_profile(facts: &RequestFacts, pod: &Pod, object: &Value, profile: &Profile) -> Result<Decision, Error> {
    let empty = BTreeMap::new();
    let ctx = TemplateContext {
        namespace: &facts.namespace,
        owner_name: select::controller_owner(pod).map(|o| o.name.as_str()),
        labels: pod.metadata.labels.as_ref().unwrap_or(&empty),
    };
    let inject = &profile.spec.inject;
    let t = &profile.templates;
    let resolve = |field: &str, template: Option<&crate::names::NameTemplate>| -> Result<String, String> {
        template.ok_or_else(|| format!("{field}: no template"))?.resolve(&ctx).map_err(|e| format!("{field}: {e}"))
    };

    let mut injections: Vec<Injection> = Vec::new();
    let mut unresolved = Vec::new();
    let mut push = |r: Result<Injection, String>| match r {
        Ok(i) => injections.push(i),
        Err(e) => unresolved.push(e),
    };
    if let Some(c) = &inject.client_certificate {
        push(
            resolve("spec.inject.clientCertificate.secretName", t.client_secret.as_ref())
                .map(|n| inject::client_certificate(c, &n)),
        );
    }
    if let Some(c) = &inject.server_ca {
        let field = if c.config_map_name.is_some() {
            "spec.inject.serverCA.configMapName"
        } else {
            "spec.inject.serverCA.secretName"
        };
        push(resolve(field, t.server_ca.as_ref()).map(|n| inject::server_ca(c, &n)));
    }
    if let Some(c) = &inject.token {
        push(resolve("spec.inject.token.secretName", t.token_secret.as_ref()).map(|n| inject::token(c, &n)));
    }
    if let Some(c) = &inject.service_account_token {
        push(Ok(inject::service_account_token(c)));
    }
    let swap_target = inject
        .service_account
        .as_ref()
        .map(|s| resolve("spec.inject.serviceAccount.name", t.service_account.as_ref()).map(|n| (n, s.api_token)));
    if let Some(Err(e)) = &swap_target {
        unresolved.push(e.clone());
    }
    if !unresolved.is_empty() {
        return Ok(Decision::deny(
            Reason::Unresolvable,
            format!(
                "keyward: profile {:?} cannot name this pod's credentials: {}; give the pod what the profile needs, or fix the profile",
                profile.name,
                unresolved.join("; ")
            ),
        ));
    }

    let mut b = PatchBuilder::new(object.clone());
    let mut items: Vec<InjectedItem> = injections.iter().map(|i| i.item.clone()).collect();
    let mut original_sa = None;
    if let Some(Ok((target, api_token))) = &swap_target {
        original_sa = inject::swap_service_account(pod, target, *api_token, &mut b)?.original;
        items.push(InjectedItem::ServiceAccount { name: target.clone(), api_token: *api_token });
    }
    let merge = inject::apply(profile, pod, &injections, &mut b)?;
    if !merge.conflicts.is_empty() {
        let mut d = Decision::deny(
            Reason::Conflict,
            format!("keyward: profile {:?} cannot inject into this pod: {}", profile.name, merge.conflicts.join("; ")),
        );
        d.warnings = merge.warnings;
        return Ok(d);
    }

    let containers = if profile.spec.containers.is_empty() {
        ContainerScope::all()
    } else {
        ContainerScope::Named(
            profile.spec.containers.iter().filter(|name| merge.containers.contains(name)).cloned().collect(),
        )
    };
    let record = AuditRecord { profile: profile.name.clone(), injected: items, containers };
    let annotation = record.to_annotation();
    let annotations: [Seg<'_>; 2] = ["metadata".into(), "annotations".into()];
    let existing = |key: &str| pod.metadata.annotations.as_ref().and_then(|a| a.get(key));
    let mut added: Vec<(&str, String)> = Vec::new();
    if existing(ANNOTATION_INJECTED) != Some(&annotation) {
        added.push((ANNOTATION_INJECTED, annotation));
    }
    if let Some(original) = &original_sa {
        if existing(ANNOTATION_ORIGINAL_SA).is_none() {
            added.push((ANNOTATION_ORIGINAL_SA, original.clone()));
        }
    }
    let total = annotations_size(pod, &added);
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        return Ok(Decision::deny(
            Reason::Conflict,
            format!(
                "keyward: profile {:?} cannot inject into this pod: metadata.annotations would take {total} bytes with keyward's audit record, over the apiserver's limit of {TOTAL_ANNOTATION_SIZE_LIMIT}; shorten the pod's annotations",
                profile.name
            ),
        ));
    }
    for (key, value) in added {
        b.insert(&annotations, key, Value::from(value))?;
    }

    let (patch, patched) = b.finish();
    if !patch.is_empty() {
        check_still_valid(pod, &patched)?;
    }

    let mut audit_annotations = BTreeMap::from([
        ("profile".to_string(), profile.name.clone()),
        ("injected".to_string(), record.injected.iter().map(InjectedItem::kind).collect::<Vec<_>>().join(",")),
    ]);
    if let Some(original) = original_sa {
        audit_annotations.insert("original-service-account".into(), original);
    }
    let reason = if patch.is_empty() { Reason::AlreadyInjected } else { Reason::Injected };
    let mut d = Decision::new(reason, Ok(Mutation { patch, pod: Some(patched), audit: Some(record) }));
    d.warnings = merge.warnings;
    d.audit_annotations = audit_annotations;
    Ok(d)
}

/// The size the apiserver counts (keys and values) of the pod's annotations once `added`
/// replace or join them.
fn annotations_size(pod: &Pod, added: &[(&str, String)]) -> usize {
    let existing = pod.metadata.annotations.iter().flatten();
    let kept: usize =
        existing.filter(|(k, _)| !added.iter().any(|(a, _)| a == k)).map(|(k, v)| k.len() + v.len()).sum();
    kept + added.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
}

/// Refuses to hand back a pod that breaks a validation rule the input did not already break.
fn check_still_valid(before: &Pod, after: &Value) -> Result<(), Error> {
    let after =
        Pod::deserialize(after).map_err(|e| Error::Internal(format!("the patched object is not a Pod: {e}")))?;
    let old = violations(before);
    let new: Vec<String> = violations(&after).into_iter().filter(|v| !old.contains(v)).collect();
    if new.is_empty() {
        Ok(())
    } else {
        Err(Error::Internal(format!("the patched pod would fail validation: {}", new.join("; "))))
    }
}
