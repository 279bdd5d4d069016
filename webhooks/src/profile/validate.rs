//! Validation of a whole profile: what serde cannot check. The profile-level fields here; each
//! kind checks its own settings, and the names kinds claim are checked against each other.

use std::collections::BTreeSet;

use super::schema::{
    AnnotationSelector, LabelSelector, LabelSelectorRequirement, ProfileDocument, SelectorOperator, API_VERSION, KIND,
};
use super::Profile;
use crate::error::ProfileError;
use crate::inject::{Check, Provision};
use crate::kinds::Injections;
use crate::names::{
    is_dns1123_subdomain, is_label_value, is_qualified_name, service_account_pattern, DNS1123_SUBDOMAIN_RULE,
};

/// The longest profile name: a label value's limit.
pub(super) const MAX_PROFILE_NAME: usize = 63;

/// Checks one profile and returns it validated, or records every problem found.
pub(super) fn validate(source: &str, doc: ProfileDocument, errors: &mut Vec<ProfileError>) -> Option<Profile> {
    let before = errors.len();
    let name = doc.metadata.name.clone();
    let mut problem = |field: &str, reason: String| {
        errors.push(ProfileError {
            source: source.to_string(),
            profile: Some(name.clone()),
            field: field.to_string(),
            reason,
        })
    };

    if doc.api_version != API_VERSION {
        problem("apiVersion", format!("is {:?}; use {API_VERSION:?}", doc.api_version));
    }
    if doc.kind != KIND {
        problem("kind", format!("is {:?}; use {KIND:?}", doc.kind));
    }
    if !is_dns1123_subdomain(&name) {
        problem("metadata.name", format!("must be a DNS-1123 subdomain ({DNS1123_SUBDOMAIN_RULE})"));
    } else if name.len() > MAX_PROFILE_NAME {
        // The name is the value of the `keyward.io/profile` label on the pods it injects.
        problem(
            "metadata.name",
            format!(
                "is {} characters; at most {MAX_PROFILE_NAME}, since it becomes the value of the keyward.io/profile label on the pods it injects",
                name.len()
            ),
        );
    }

    let spec = &doc.spec;
    if spec.selector.is_empty() && spec.annotation_selector.is_empty() {
        problem(
            "spec.selector",
            "must not be empty (nor may spec.annotationSelector be, when this is): give matchLabels or matchExpressions so the profile never selects every pod".into(),
        );
    }
    validate_selector(&spec.selector, &mut problem);
    validate_annotation_selector(&spec.annotation_selector, &mut problem);
    for (i, owner) in spec.controller_owners.iter().enumerate() {
        if owner.kind.is_empty() {
            problem(&format!("spec.controllerOwners[{i}].kind"), "must not be empty".into());
        }
    }
    for (i, ns) in spec.namespaces.iter().enumerate() {
        if ns.is_empty() {
            problem(&format!("spec.namespaces[{i}]"), "must not be empty; use \"*\" for every namespace".into());
        }
    }
    if spec.requesters.usernames.is_empty() {
        problem(
            "spec.requesters.usernames",
            "must name at least one requester (e.g. system:serviceaccount:*:my-operator); a profile that hands out credentials says who may create its pods".into(),
        );
    }
    for (i, u) in spec.requesters.usernames.iter().enumerate() {
        if let Some(reason) = requester_problem(u) {
            problem(&format!("spec.requesters.usernames[{i}]"), reason);
        }
    }
    let mut seen_containers = BTreeSet::new();
    for (i, c) in spec.containers.iter().enumerate() {
        if !seen_containers.insert(c) {
            problem(&format!("spec.containers[{i}]"), format!("{c:?} is listed twice"));
        }
    }

    for (field, reason) in validate_injections(&spec.inject) {
        problem(&field, reason);
    }

    let mut profile =
        Profile { name: doc.metadata.name, source: source.to_string(), spec: doc.spec, issues_per_owner: false };
    profile.issues_per_owner = profile.provides_per_owner(|p| {
        matches!(p, Provision::ClientCertificate | Provision::GeneratedToken { .. } | Provision::PodCertificate)
    });
    if profile.issues_per_owner && profile.spec.controller_owners.is_empty() {
        // An identity is issued per owner: the controller checks that the owner exists with
        // the kind and API group named here before it issues anything.
        problem(
            "spec.controllerOwners",
            "must name the owner kinds (apiGroup, kind) keyward issues per-owner credentials for, since the profile issues a client certificate or token per owner; list the operator's job kind".into(),
        );
    }
    if errors.len() > before {
        return None;
    }
    Some(profile)
}

fn validate_annotation_selector(selector: &AnnotationSelector, problem: &mut impl FnMut(&str, String)) {
    for key in selector.match_annotations.keys() {
        if !is_qualified_name(key) {
            problem(&format!("spec.annotationSelector.matchAnnotations[{key:?}]"), annotation_key_reason(key));
        }
    }
    for (i, req) in selector.match_expressions.iter().enumerate() {
        if !is_qualified_name(&req.key) {
            problem(&format!("spec.annotationSelector.matchExpressions[{i}].key"), annotation_key_reason(&req.key));
        }
        operator_values(req, &format!("spec.annotationSelector.matchExpressions[{i}].values"), problem);
    }
}

fn annotation_key_reason(key: &str) -> String {
    format!("{key:?} is not a valid annotation key: an optional DNS-1123 subdomain and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
}

/// `In` and `NotIn` need values; `Exists` and `DoesNotExist` take none.
fn operator_values(req: &LabelSelectorRequirement, field: &str, problem: &mut impl FnMut(&str, String)) {
    match req.operator {
        SelectorOperator::In | SelectorOperator::NotIn if req.values.is_empty() => {
            problem(field, format!("must not be empty with operator {:?}", req.operator))
        }
        SelectorOperator::Exists | SelectorOperator::DoesNotExist if !req.values.is_empty() => {
            problem(field, format!("must be empty with operator {:?}", req.operator))
        }
        _ => {}
    }
}

fn validate_selector(selector: &LabelSelector, problem: &mut impl FnMut(&str, String)) {
    for (key, value) in &selector.match_labels {
        if !is_qualified_name(key) {
            problem(&format!("spec.selector.matchLabels[{key:?}]"), label_key_reason(key));
        }
        if !is_label_value(value) {
            problem(&format!("spec.selector.matchLabels[{key:?}]"), label_value_reason(value));
        }
    }
    for (i, req) in selector.match_expressions.iter().enumerate() {
        if !is_qualified_name(&req.key) {
            problem(&format!("spec.selector.matchExpressions[{i}].key"), label_key_reason(&req.key));
        }
        let field = format!("spec.selector.matchExpressions[{i}].values");
        operator_values(req, &field, problem);
        for (j, value) in req.values.iter().enumerate() {
            if !is_label_value(value) {
                problem(&format!("{field}[{j}]"), label_value_reason(value));
            }
        }
    }
}

fn label_key_reason(key: &str) -> String {
    format!("{key:?} is not a valid label key: an optional DNS-1123 subdomain and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
}

fn label_value_reason(value: &str) -> String {
    format!("{value:?} is not a valid label value: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
}

/// Why a requester pattern does not say who may create the pods, if it does not.
fn requester_problem(pattern: &str) -> Option<String> {
    let wild = |s: &str| !s.is_empty() && s.chars().all(|c| c == '*' || c == '?');
    if pattern.is_empty() || pattern.split(':').all(wild) {
        return Some(format!(
            "{pattern:?} would allow anyone; name the operator's service account, e.g. system:serviceaccount:*:my-operator"
        ));
    }
    if pattern.split(':').any(str::is_empty) {
        return Some(format!("{pattern:?} has an empty ':'-separated segment, which no username has"));
    }
    if let Some((_, name)) = service_account_pattern(pattern) {
        if wild(name) {
            return Some(format!(
                "{pattern:?} would allow every service account; name the operator's account, e.g. system:serviceaccount:*:my-operator"
            ));
        }
    }
    None
}

/// Every problem of the injections, as `(field, reason)`: each kind's own, then any volume
/// name, mount path or env var two kinds both claim.
fn validate_injections(inject: &Injections) -> Vec<(String, String)> {
    let mut check = Check::default();
    let mut any = false;
    for (key, kind) in inject.kinds() {
        any = true;
        kind.validate(check.scoped(&format!("spec.inject.{key}")));
    }
    let (mut problems, claims) = check.finish();
    if !any {
        problems
            .push(("spec.inject".into(), format!("must inject at least one thing: {}", Injections::KEYS.join(", "))));
    }
    for (i, claim) in claims.iter().enumerate() {
        if let Some(first) = claims[..i].iter().find(|c| c.what == claim.what && c.value == claim.value) {
            problems.push((
                claim.field.clone(),
                format!(
                    "{} {:?} is already used by {}; each injection needs its own",
                    claim.what, claim.value, first.field
                ),
            ));
        }
    }
    problems
}
