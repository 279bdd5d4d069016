//! What should exist, decided from the profiles alone: pure, no API calls.
//!
//! Per opted-in namespace: the server CAs and service accounts (with their role bindings) the
//! profiles provide. Per owner: the client certificates and generated tokens of the profile
//! that selects a live pod — re-evaluated here on the pod as it is, since a label or an
//! annotation on a pod proves nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use keyward_engine::attest;
use keyward_engine::binding::{self, Masks};
use keyward_engine::engine::decide_admitted;
use keyward_engine::inject::{CaSource, Provision, RoleBinding, RoleKind};
use keyward_engine::names::{is_dns1123_label, is_dns1123_subdomain, Labels, TemplateContext};
use keyward_engine::pod;
use keyward_engine::review::Object;
use keyward_engine::text::{clip, prefix};
use keyward_engine::{
    Profile, ProfileSet, Reason, RequestFacts, Requester, Requirement, ANNOTATION_ATTESTATION, ANNOTATION_INJECTED,
};
use serde_json::value::RawValue;

use crate::attestation::Evidence;
use crate::metrics::Refusal;

/// `app.kubernetes.io/managed-by: keyward` on everything the controller writes; it never
/// modifies or deletes an object without it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "keyward");
/// What an object was provisioned for: `namespace`, `owner` or `client-ca`.
pub const PROVISIONED_FOR: &str = "keyward.io/provisioned-for";
/// The profile an object was written for.
pub const PROFILE_ANNOTATION: &str = "keyward.io/profile";
/// The namespace label that opts a namespace in (the webhook's `namespaceSelector`).
pub const OPT_IN: (&str, &str) = ("keyward.io/inject", "enabled");
/// The pod label that opts a pod out (the webhook's `objectSelector`): keyward's webhook never
/// sees such a pod.
pub const OPT_OUT: (&str, &str) = ("keyward.io/inject", "disabled");

/// The pod's controller owner, as its ownerReference names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl Owner {
    /// The group of `apiVersion` (`""` for the core group).
    pub fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map_or("", |(group, _)| group)
    }

    pub fn version(&self) -> &str {
        self.api_version.rsplit_once('/').map_or(self.api_version.as_str(), |(_, version)| version)
    }
}

/// One object keyward should make exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub namespace: String,
    pub name: String,
    pub profile: String,
    pub want: Want,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// The server CA under `key`, copied from `source` (a key of a Secret or ConfigMap).
    ServerCa {
        config_map: bool,
        key: String,
        source: SourceKey,
    },
    ServiceAccount,
    /// A RoleBinding of `role` to the account `account` in the namespace.
    RoleBinding {
        account: String,
        role: RoleBinding,
    },
    /// A client certificate for `owner`, identified by `identity`.
    ClientCertificate {
        owner: Owner,
        identity: String,
    },
    /// A generated token under `key`, for `owner`.
    Token {
        owner: Owner,
        key: String,
    },
    /// Certificates for `owner`, identified by `identity`, signed as the signer named by the
    /// [`Desired`] for the pod's PodCertificateRequests (no object: see [`crate::signer`]).
    PodCertificate {
        owner: Owner,
        identity: String,
    },
}

impl Want {
    /// The kind of object, for metrics and messages.
    pub fn object_kind(&self) -> &'static str {
        match self {
            Self::ServerCa { config_map: true, .. } => "ConfigMap",
            Self::ServerCa { config_map: false, .. } | Self::ClientCertificate { .. } | Self::Token { .. } => "Secret",
            Self::ServiceAccount => "ServiceAccount",
            Self::RoleBinding { .. } => "RoleBinding",
            Self::PodCertificate { .. } => "PodCertificateRequest",
        }
    }

    /// What it is, for metrics: `server-ca`, `service-account`, `role-binding`,
    /// `client-certificate`, `token`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::ServerCa { .. } => "server-ca",
            Self::ServiceAccount => "service-account",
            Self::RoleBinding { .. } => "role-binding",
            Self::ClientCertificate { .. } => "client-certificate",
            Self::Token { .. } => "token",
            Self::PodCertificate { .. } => "pod-certificate",
        }
    }
}

/// Where a server CA is read from, its namespace resolved.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceKey {
    pub config_map: bool,
    pub namespace: String,
    pub name: String,
    pub key: String,
}

/// Why a namespace-scoped object could not be planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unplannable {
    pub profile: String,
    pub reason: String,
}

/// The objects the profiles provide in `namespace`. A CA source without a namespace is in the
/// profile's operator namespace, from `operator_namespaces` (`--operator-namespace`).
pub fn for_namespace(
    profiles: &ProfileSet,
    namespace: &str,
    operator_namespaces: &BTreeMap<String, String>,
) -> (Vec<Desired>, Vec<Unplannable>) {
    let labels = Labels::new();
    let ctx = TemplateContext { namespace, owner_name: None, labels: &labels };
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for profile in profiles.iter() {
        for (_, kind) in profile.spec.inject.kinds() {
            // Kinds issued per owner do not resolve without one: they are not per namespace.
            let Ok(injection) = kind.plan(&ctx) else { continue };
            for requirement in injection.requires {
                let desired = |want| Desired {
                    namespace: namespace.to_string(),
                    name: requirement.name.clone(),
                    profile: profile.name.clone(),
                    want,
                };
                match &requirement.provision {
                    Provision::ServerCa { source, key } => {
                        match source_key(source, operator_namespaces.get(&profile.name)) {
                            Ok(source) => out.push(desired(Want::ServerCa {
                                config_map: requirement.kind == keyward_engine::ObjectKind::ConfigMap,
                                key: key.clone(),
                                source,
                            })),
                            Err(reason) => problems.push(Unplannable { profile: profile.name.clone(), reason }),
                        }
                    }
                    Provision::ServiceAccount { bindings } => {
                        out.push(desired(Want::ServiceAccount));
                        for role in bindings {
                            out.push(Desired {
                                namespace: namespace.to_string(),
                                name: role_binding_name(&requirement.name, role),
                                profile: profile.name.clone(),
                                want: Want::RoleBinding { account: requirement.name.clone(), role: role.clone() },
                            });
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    (out, problems)
}

/// The profiles that provide service accounts (and role bindings): keyward creates them only
/// with `--provision-accounts`, which needs rights the default install does not grant. Their
/// names are fixed, so any namespace shows them.
pub fn provisioning_accounts(profiles: &ProfileSet) -> Vec<String> {
    let (desired, _) = for_namespace(profiles, "stand-in", &BTreeMap::new());
    let mut names: Vec<String> =
        desired.into_iter().filter(|d| matches!(d.want, Want::ServiceAccount)).map(|d| d.profile).collect();
    names.dedup();
    names
}

/// A server CA keyward publishes once for the cluster, as a ClusterTrustBundle (unlinked: no
/// signer) that pods mount with a `clusterTrustBundle` projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedBundle {
    pub name: String,
    pub profile: String,
    pub source: SourceKey,
}

/// Every server CA source the profiles name, for copies per namespace and for trust bundles,
/// with `--operator-namespace` applied.
pub fn ca_sources(profiles: &ProfileSet, operator_namespaces: &BTreeMap<String, String>) -> BTreeSet<SourceKey> {
    let (wanted, _) = for_namespace(profiles, "x", operator_namespaces);
    let (bundles, _) = trust_bundles(profiles, operator_namespaces);
    wanted
        .into_iter()
        .filter_map(|d| match d.want {
            Want::ServerCa { source, .. } => Some(source),
            _ => None,
        })
        .chain(bundles.into_iter().map(|b| b.source))
        .collect()
}

/// The server CA bundles the profiles want keyward to publish.
pub fn trust_bundles(
    profiles: &ProfileSet,
    operator_namespaces: &BTreeMap<String, String>,
) -> (Vec<WantedBundle>, Vec<Unplannable>) {
    let labels = Labels::new();
    // A bundle's name is not templated: any pod context plans it.
    let ctx = TemplateContext { namespace: "stand-in", owner_name: None, labels: &labels };
    let (mut out, mut problems) = (Vec::new(), Vec::new());
    for profile in profiles.iter() {
        for (_, kind) in profile.spec.inject.kinds() {
            let Ok(injection) = kind.plan(&ctx) else { continue };
            for requirement in injection.requires {
                let Provision::TrustBundle { source, .. } = &requirement.provision else { continue };
                match source_key(source, operator_namespaces.get(&profile.name)) {
                    Ok(source) => {
                        out.push(WantedBundle { name: requirement.name.clone(), profile: profile.name.clone(), source })
                    }
                    Err(reason) => problems.push(Unplannable { profile: profile.name.clone(), reason }),
                }
            }
        }
    }
    (out, problems)
}

fn source_key(source: &CaSource, operator_namespace: Option<&String>) -> Result<SourceKey, String> {
    let (config_map, object) = match (&source.secret, &source.config_map) {
        (Some(o), None) => (false, o),
        (None, Some(o)) => (true, o),
        _ => return Err("serverCA.source must name exactly one of secret or configMap".into()),
    };
    let namespace = match (&object.namespace, operator_namespace) {
        (Some(ns), _) => ns.clone(),
        (None, Some(ns)) => ns.clone(),
        (None, None) => {
            return Err(format!(
                "serverCA.source {:?} names no namespace, and the profile's operator namespace is not pinned; give source.namespace, or pass --operator-namespace",
                object.name
            ))
        }
    };
    Ok(SourceKey { config_map, namespace, name: object.name.clone(), key: object.key.clone() })
}

/// `keyward-<account>-<role>`, within the 253 characters of an object name. Role names may
/// hold `:` (`system:auth-delegator`), which RoleBinding names allow.
pub fn role_binding_name(account: &str, role: &RoleBinding) -> String {
    let kind = match role.kind {
        RoleKind::ClusterRole => "cr",
        RoleKind::Role => "r",
    };
    prefix(&format!("keyward-{account}-{kind}-{}", role.name), 253).to_string()
}

/// Whether `profile` provides, per owner, an object whose provision `wanted` accepts.
pub fn provides_per_owner(profile: &Profile, wanted: impl Fn(&Provision) -> bool) -> bool {
    profile.provides_per_owner(wanted)
}

/// What the controller does for one live pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodVerdict {
    /// The pod is one keyward injected, for this owner: issue, once the attestation and the
    /// owner check out.
    Claim(PodClaim),
    /// The pod is selected and carries the injection, but keyward must not serve it: refused,
    /// and why (reported).
    Refused(Refusal, String),
    /// Nothing, and why (for the debug log).
    Nothing(String),
}

/// What an injected pod claims: issue these for this owner. Nothing here is trusted until the
/// attestation verifies (or the objects exist already, issued by keyward) and the owner exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaim {
    pub profile: String,
    /// Checked by Kubernetes' name rules: every segment of its identity is one.
    pub owner: Owner,
    pub wants: Vec<Desired>,
    /// The pod's admission attestation, and what it must hold for (boxed: the index keeps a
    /// claim per pod, and most are small).
    pub evidence: Box<Evidence>,
}

impl PodClaim {
    /// Whether the pod's attestation holds, under the keys given.
    pub fn attested(&self, keys: &keyward_certs::attestation::Keys) -> attest::Verdict {
        let o = &self.owner;
        let owner = attest::OwnerRef { group: o.group(), kind: &o.kind, name: &o.name, uid: &o.uid };
        self.evidence.check(owner, &self.profile, keys)
    }
}

/// Re-evaluates the profiles on a live pod (as stored, in `namespace`): it must be one a
/// profile selects, and carry exactly what that profile injects (else keyward did not admit it
/// as such, and issues nothing). Returns the per-owner objects of that profile provided by
/// keyward, with the attestation to check.
pub fn for_pod(profiles: &ProfileSet, pod: &RawValue, namespace: &str, trust_domain: &str) -> PodVerdict {
    if namespace.is_empty() {
        return PodVerdict::Nothing("the pod has no namespace".into());
    }
    // Read once, as the webhook reads it: the owner from the same view the decision uses.
    let read = match pod::read(pod, profiles.annotations_read()) {
        Ok(read) => read,
        Err(e) => return PodVerdict::Nothing(format!("not a valid pod: {e}")),
    };
    let owner = read.metadata.controller_owner.as_ref().map(|o| Owner {
        api_version: o.api_version.to_string(),
        kind: o.kind.to_string(),
        name: o.name.to_string(),
        uid: o.uid.to_string(),
    });
    let annotation = |key: &str| read.metadata.annotations.kept.get(key).map(|v| v.as_ref());
    let attestation = annotation(ANNOTATION_ATTESTATION).map(str::to_string);
    let injected: Arc<str> = Arc::from(annotation(ANNOTATION_INJECTED).unwrap_or_default());
    let created = read
        .metadata
        .creation_timestamp
        .as_deref()
        .and_then(keyward_certs::parse_rfc3339)
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs());
    let opted_out = read.metadata.labels.get(OPT_OUT.0).is_some_and(|v| v.as_ref() == OPT_OUT.1);
    let spec = read.spec;
    let facts = RequestFacts::pod_create(namespace, Requester::Assumed);
    // Either resolution of `delivery: auto` is as keyward admits pods (the attestation,
    // checked next, says the webhook admitted it).
    let decision = decide_admitted(&facts, &Object::Read(read), profiles);
    let Some(profile) = decision.profile.clone() else {
        return PodVerdict::Nothing("no profile selects it".into());
    };
    if decision.reason != Reason::AlreadyInjected {
        return PodVerdict::Nothing(format!(
            "profile {profile:?} selects it, but it is not as keyward admits such pods ({})",
            decision.reason.as_str()
        ));
    }
    let Ok(mutation) = &decision.outcome else {
        return PodVerdict::Nothing("refused".into());
    };
    let wanted: Vec<&Requirement> = mutation
        .injections
        .iter()
        .flat_map(|(_, i)| &i.requires)
        .filter(|r| {
            matches!(
                r.provision,
                Provision::ClientCertificate | Provision::GeneratedToken { .. } | Provision::PodCertificate
            )
        })
        .collect();
    if wanted.is_empty() {
        return PodVerdict::Nothing(format!("profile {profile:?} issues nothing per owner"));
    }
    let Some(owner) = owner else {
        return PodVerdict::Nothing("it has no controller owner".into());
    };
    if let Some(problem) = identity_problem(namespace, &owner) {
        return PodVerdict::Refused(Refusal::UnverifiableOwner, problem);
    }
    // Whatever it carries: keyward's webhook never sees a pod with this label.
    if opted_out {
        return PodVerdict::Refused(
            Refusal::OptedOut,
            format!(
                "it is labelled {}={}, so keyward's webhook never admitted it; remove the label and recreate the pod",
                OPT_OUT.0, OPT_OUT.1
            ),
        );
    }
    let binding = match binding::of_raw(spec, &Masks::of(&mutation.injections)) {
        Ok(b) => b,
        Err(e) => return PodVerdict::Nothing(format!("its spec cannot be read: {e}")),
    };
    // Sized to fit: the index keeps every claim, and a `Vec` grown by `push` starts with room
    // for four (760 bytes a pod of one want, 5.7 MB at 10,000 owners).
    let mut wants = Vec::with_capacity(wanted.len());
    for requirement in wanted {
        let want = match &requirement.provision {
            Provision::ClientCertificate => Want::ClientCertificate {
                owner: owner.clone(),
                identity: spiffe_id(trust_domain, namespace, &owner.kind, &owner.name),
            },
            Provision::GeneratedToken { key } => Want::Token { owner: owner.clone(), key: key.clone() },
            Provision::PodCertificate => Want::PodCertificate {
                owner: owner.clone(),
                identity: spiffe_id(trust_domain, namespace, &owner.kind, &owner.name),
            },
            _ => continue,
        };
        wants.push(Desired {
            namespace: namespace.to_string(),
            name: requirement.name.clone(),
            profile: profile.clone(),
            want,
        });
    }
    let evidence =
        Box::new(Evidence { value: attestation, namespace: namespace.to_string(), injected, binding, created });
    PodVerdict::Claim(PodClaim { profile, owner, wants, evidence })
}

/// Why an identity cannot be made from this owner, if it cannot: each value that becomes part
/// of one must be what Kubernetes allows there (a `/` or a `..` in a name would make a SPIFFE
/// path that a verifier normalising it reads as someone else's).
pub fn identity_problem(namespace: &str, owner: &Owner) -> Option<String> {
    let group = owner.group();
    let version = owner.version();
    if !is_dns1123_label(namespace) {
        return Some(format!("namespace {:?} is not a DNS-1123 label", clip(namespace, 64)));
    }
    if !is_dns1123_subdomain(&owner.name) {
        return Some(format!(
            "the controller owner's name {:?} is not a Kubernetes object name (a DNS-1123 subdomain)",
            clip(&owner.name, 64)
        ));
    }
    if owner.kind.is_empty()
        || owner.kind.len() > 63
        || !owner.kind.starts_with(|c: char| c.is_ascii_alphabetic())
        || !owner.kind.chars().all(|c| c.is_ascii_alphanumeric())
    {
        return Some(format!("the controller owner's kind {:?} is not a Kubernetes kind", clip(&owner.kind, 64)));
    }
    if !(group.is_empty() || is_dns1123_subdomain(group)) || !is_dns1123_label(version) {
        return Some(format!(
            "the controller owner's apiVersion {:?} is not GROUP/VERSION",
            clip(&owner.api_version, 64)
        ));
    }
    let uid_ok = !owner.uid.is_empty()
        && owner.uid.len() <= 128
        && owner.uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if !uid_ok {
        return Some(format!("the controller owner's uid {:?} is not a Kubernetes UID", clip(&owner.uid, 64)));
    }
    None
}

/// `spiffe://<trust domain>/ns/<namespace>/<kind, lower case>/<name>`: every part is a
/// Kubernetes name, so every character is one SPIFFE allows in a path segment.
pub fn spiffe_id(trust_domain: &str, namespace: &str, kind: &str, name: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}/{}/{name}", kind.to_ascii_lowercase())
}

/// A SPIFFE trust domain: lower-case letters, digits, `.`, `-` and `_`, at most 255 (the rule
/// is the engine's, which the gate reads identities by), with the value in the message.
pub fn trust_domain_problem(td: &str) -> Option<String> {
    keyward_engine::names::trust_domain_problem(td).map(|problem| format!("{td:?} {problem}"))
}

/// A label selector string (`k=v,k in (a,b),!k`) equivalent to the profile's label selector,
/// for watching only the pods it could select.
pub fn label_selector(selector: &keyward_engine::profile::LabelSelector) -> String {
    use keyward_engine::profile::SelectorOperator;
    let mut terms: Vec<String> = selector.match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    for req in &selector.match_expressions {
        let values = req.values.join(",");
        terms.push(match req.operator {
            SelectorOperator::In => format!("{} in ({values})", req.key),
            SelectorOperator::NotIn => format!("{} notin ({values})", req.key),
            SelectorOperator::Exists => req.key.clone(),
            SelectorOperator::DoesNotExist => format!("!{}", req.key),
        });
    }
    terms.join(",")
}
