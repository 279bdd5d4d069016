//! What a decision is about and what it says: the facts of an admission request, the object as
//! read, and the [`Decision`]. Below both the engine (which makes decisions) and the review
//! (which reads requests into these types and writes decisions out), so neither imports the
//! other.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;

use crate::attest::Attestor;
use crate::audit::{AuditRecord, ContainerScope};
use crate::inject::{Injection, Requirement};
use crate::patch::{Patch, PatchOp};
use crate::pod::Read;

/// `request.object`: raw, or already read (metadata decoded, spec raw) on the way through.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per request, on the stack: boxing would only add an allocation
pub enum Object<'a> {
    Missing,
    Raw(&'a RawValue),
    Read(Read<'a>),
}

impl<'a> Object<'a> {
    /// The object raw, when it was kept raw.
    pub fn raw(&self) -> Option<&'a RawValue> {
        match self {
            Self::Raw(raw) => Some(raw),
            _ => None,
        }
    }
}

/// What the engine needs from an AdmissionReview request besides the object.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: &'a str,
    /// `request.resource.group` (`""` for core).
    pub group: &'a str,
    /// `request.resource.resource` (`pods`).
    pub resource: &'a str,
    /// `request.subResource` (`""` when none).
    pub sub_resource: &'a str,
    /// `request.namespace`: the pod's own `metadata.namespace` may be empty on CREATE.
    pub namespace: &'a str,
    pub requester: Requester<'a>,
    /// The webhook's own admission: what it answers is what the pod gets, so keyward's
    /// annotations that it did not write or check itself are removed. `false` (explain, the
    /// controller's and the audit's re-evaluation of a stored pod): they are left as they are.
    pub admitting: bool,
    /// Signs the admission attestation of pods whose profile issues per-owner credentials
    /// (the webhook's key). `None`: no attestation is written or compared.
    pub attestor: Option<&'a dyn Attestor>,
}

/// Who is creating the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requester<'a> {
    /// `request.userInfo.username`.
    User(&'a str),
    /// Not known (`keyward explain` on a bare Pod without `--user`): assume the profile's
    /// requesters, and say so.
    Assumed,
}

impl<'a> RequestFacts<'a> {
    /// A pod CREATE in `namespace` by `requester`: what the apiserver sends for a new pod.
    pub fn pod_create(namespace: &'a str, requester: Requester<'a>) -> Self {
        Self {
            operation: "CREATE",
            group: "",
            resource: "pods",
            sub_resource: "",
            namespace,
            requester,
            admitting: false,
            attestor: None,
        }
    }

    /// The same facts, as the webhook's own admission of the pod, attesting with `attestor`
    /// (if it has a key).
    pub fn admitting(self, attestor: Option<&'a dyn Attestor>) -> Self {
        Self { admitting: true, attestor, ..self }
    }

    /// The same facts, as the webhook's admission, attested with `attestor`.
    pub fn attested_by(self, attestor: &'a dyn Attestor) -> Self {
        self.admitting(Some(attestor))
    }

    pub(crate) fn is_pod_create(&self) -> bool {
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
    /// The same, and the profile says `onConflict: skip`: admitted unchanged.
    ConflictSkipped,
    /// A name template could not be resolved for this pod.
    Unresolvable,
    /// The pod is too large to inject into (containers, or patch operations, past keyward's
    /// limits).
    TooLarge,
    /// The object is not a valid Pod.
    InvalidPod,
    /// keyward would have produced an invalid pod (a bug); denied instead.
    Internal,
    /// The profile issues per-owner credentials, which need the admission attestation, and
    /// the webhook has no attestation key loaded yet.
    Unattestable,
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
            Self::ConflictSkipped => "conflict-skipped",
            Self::Unresolvable => "unresolvable",
            Self::TooLarge => "too-large",
            Self::InvalidPod => "invalid-pod",
            Self::Internal => "internal",
            Self::Unattestable => "unattestable",
        }
    }
}

/// A refusal: the message names the field, the profile and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    pub message: String,
}

/// An admission: the patch (maybe empty) and what goes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mutation {
    /// The operations; they refer to `injections` for what they add.
    pub ops: Vec<PatchOp>,
    /// Each kind's injection, in registry order, with its key.
    pub injections: Vec<(&'static str, Injection)>,
    /// The profile and the containers, when a profile injected (even if nothing changed).
    pub audit: Option<(String, ContainerScope)>,
    /// Per injection: whether the patch makes the pod refer to its objects anew.
    pub new_dependencies: Vec<bool>,
    /// The admission attestation keyward wrote on the pod, or found there and checked: the
    /// only one the pod may leave the webhook with.
    pub attestation: Option<String>,
    /// The audit record (`keyward.io/injected`) the pod leaves with, when a profile injected.
    pub record: Option<String>,
}

impl Mutation {
    /// The patch, ready to serialise as RFC 6902 JSON.
    pub fn patch(&self) -> Patch<'_> {
        Patch { ops: &self.ops, injections: &self.injections }
    }

    /// The objects the patch makes the pod depend on in its namespace (that it did not refer to
    /// before), and who provides each: what must exist before the kubelet can start it.
    pub fn requires(&self) -> impl Iterator<Item = &Requirement> {
        self.injections.iter().zip(&self.new_dependencies).filter(|(_, new)| **new).flat_map(|((_, i), _)| &i.requires)
    }

    /// The audit record (the `keyward.io/injected` annotation).
    pub fn audit(&self) -> Option<AuditRecord<'_>> {
        self.audit.as_ref().map(|(profile, containers)| AuditRecord {
            profile,
            injected: self.injections.iter().map(|(_, i)| &i.item).collect(),
            containers,
        })
    }
}

/// The engine's answer for one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub reason: Reason,
    pub profile: Option<String>,
    /// The pod's `metadata.name`, else its `generateName` followed by `*` (for logs).
    pub pod: Option<String>,
    /// `Ok` to admit (with a patch, maybe empty), `Err` to refuse.
    #[serde(skip)]
    pub outcome: Result<Mutation, Denial>,
    pub warnings: Vec<String>,
    /// For the apiserver's audit log (the apiserver prefixes keys with the webhook name).
    pub audit_annotations: BTreeMap<String, String>,
}

/// How one profile fared against the pod, for `keyward explain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProfileTrace {
    pub profile: String,
    pub selected: bool,
    pub why: String,
}

/// A decision with what `keyward explain` shows besides: why each profile did or did not select
/// the pod, and each injection in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    pub decision: Decision,
    pub trace: Vec<ProfileTrace>,
    pub injects: Vec<String>,
}

impl Decision {
    pub(crate) fn new(reason: Reason, outcome: Result<Mutation, Denial>) -> Self {
        Self { reason, profile: None, pod: None, outcome, warnings: Vec::new(), audit_annotations: BTreeMap::new() }
    }

    pub(crate) fn unchanged(reason: Reason) -> Self {
        Self::new(
            reason,
            Ok(Mutation {
                ops: Vec::new(),
                injections: Vec::new(),
                audit: None,
                new_dependencies: Vec::new(),
                attestation: None,
                record: None,
            }),
        )
    }

    pub(crate) fn deny(reason: Reason, message: String) -> Self {
        Self::new(reason, Err(Denial { message }))
    }

    pub fn allowed(&self) -> bool {
        self.outcome.is_ok()
    }

    /// The JSON patch, empty when there is nothing to change or the pod is refused.
    pub fn patch(&self) -> Patch<'_> {
        self.outcome.as_ref().map_or(Patch::empty(), Mutation::patch)
    }

    /// The denial message, when refused.
    pub fn message(&self) -> Option<&str> {
        self.outcome.as_ref().err().map(|d| d.message.as_str())
    }
}
