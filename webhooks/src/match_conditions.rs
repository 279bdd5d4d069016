//! The webhook configuration's `matchConditions`: a CEL expression, generated from the
//! profiles, that is true for exactly the pods some profile's label and annotation selectors
//! select, and for pods that carry keyward's own annotations (which the webhook removes unless
//! it wrote them), so the apiserver sends keyward only those. `keyward manifests webhook`
//! renders it, and the controller keeps the live configuration equal to it.

use std::collections::BTreeMap;

use crate::profile::{LabelSelectorRequirement, SelectorOperator};
use crate::ProfileSet;

/// The name of keyward's webhook in the MutatingWebhookConfiguration.
pub const WEBHOOK_NAME: &str = "pods.keyward.io";
/// The name of its one match condition.
pub const CONDITION_NAME: &str = "selected-by-a-keyward-profile";

/// A CEL term true for a pod that carries keyward's attestation or audit record: such a pod
/// reaches the webhook whatever its labels, so that one copied from another pod is removed
/// (a pod the webhook never sees would keep it).
pub const CARRIES_KEYWARDS_ANNOTATIONS: &str = "(has(object.metadata.annotations) && (\"keyward.io/attestation\" in object.metadata.annotations || \"keyward.io/injected\" in object.metadata.annotations))";

/// A CEL expression true for every pod some profile's label and annotation selectors select
/// (owners and namespaces are checked by keyward itself), and every pod that carries keyward's
/// own annotations. It never errors: labels and annotations may be absent, and then each
/// selector is decided here, statically.
pub fn match_expression(profiles: &ProfileSet) -> String {
    format!("{} || {CARRIES_KEYWARDS_ANNOTATIONS}", selected_expression(profiles))
}

/// The part of [`match_expression`] the profiles' selectors make.
fn selected_expression(profiles: &ProfileSet) -> String {
    let terms: Vec<String> = profiles
        .iter()
        .map(|p| {
            let labels = map_cel("labels", &p.spec.selector.match_labels, &p.spec.selector.match_expressions);
            let annotations = map_cel(
                "annotations",
                &p.spec.annotation_selector.match_annotations,
                &p.spec.annotation_selector.match_expressions,
            );
            match (labels, annotations) {
                (Some(l), Some(a)) => format!("({l} && {a})"),
                (Some(one), None) | (None, Some(one)) => one,
                (None, None) => "true".into(),
            }
        })
        .collect();
    if terms.is_empty() {
        return "false".into();
    }
    terms.join(" || ")
}

/// The CEL for one selector over `object.metadata.<field>`, or `None` when it is empty (it
/// selects everything).
fn map_cel(field: &str, exact: &BTreeMap<String, String>, expressions: &[LabelSelectorRequirement]) -> Option<String> {
    if exact.is_empty() && expressions.is_empty() {
        return None;
    }
    let without = selects_nothing_set(exact, expressions);
    Some(format!("(has(object.metadata.{field}) ? ({}) : {without})", selector_cel(field, exact, expressions)))
}

fn selector_cel(field: &str, exact: &BTreeMap<String, String>, expressions: &[LabelSelectorRequirement]) -> String {
    let l = format!("object.metadata.{field}");
    let l = l.as_str();
    let mut terms = Vec::new();
    for (k, v) in exact {
        terms.push(format!("{} in {l} && {l}[{}] == {}", cel_str(k), cel_str(k), cel_str(v)));
    }
    for req in expressions {
        let k = cel_str(&req.key);
        let values = format!("[{}]", req.values.iter().map(|v| cel_str(v)).collect::<Vec<_>>().join(", "));
        terms.push(match req.operator {
            SelectorOperator::In => format!("{k} in {l} && {l}[{k}] in {values}"),
            SelectorOperator::NotIn => format!("!({k} in {l}) || !({l}[{k}] in {values})"),
            SelectorOperator::Exists => format!("{k} in {l}"),
            SelectorOperator::DoesNotExist => format!("!({k} in {l})"),
        });
    }
    terms.iter().map(|t| format!("({t})")).collect::<Vec<_>>().join(" && ")
}

/// Whether the selector selects a pod with none of the labels (or annotations) at all: only
/// negative terms.
fn selects_nothing_set(exact: &BTreeMap<String, String>, expressions: &[LabelSelectorRequirement]) -> bool {
    exact.is_empty()
        && expressions.iter().all(|r| matches!(r.operator, SelectorOperator::NotIn | SelectorOperator::DoesNotExist))
}

/// A double-quoted CEL string literal (double quotes keep the YAML readable).
fn cel_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_match_expression() {
        let set = ProfileSet::builtin().unwrap();
        let l = "object.metadata.labels";
        let expected = format!(
            "(has({l}) ? ((\"app.kubernetes.io/name\" in {l} && {l}[\"app.kubernetes.io/name\"] == \"fms-lm-eval-service\")) : false) || \
(has({l}) ? ((\"app\" in {l} && {l}[\"app\"] == \"ml-pipeline-persistenceagent\")) : false) || \
(has({l}) ? ((\"app\" in {l} && {l}[\"app\"] == \"ml-pipeline-scheduledworkflow\")) : false) || \
{CARRIES_KEYWARDS_ANNOTATIONS}"
        );
        assert_eq!(match_expression(&set), expected);
    }

    #[test]
    fn a_selector_of_only_negative_terms_selects_unlabelled_pods() {
        let set = ProfileSet::from_sources([(
            "t.yaml".to_string(),
            "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {name: t}\nspec:\n  selector:\n    matchExpressions: [{key: tier, operator: NotIn, values: [gpu]}]\n  requesters: {usernames: [bot]}\n  inject: {serviceAccount: {name: sa}}\n".to_string(),
        )])
        .unwrap();
        let l = "object.metadata.labels";
        assert_eq!(
            match_expression(&set),
            format!("(has({l}) ? ((!(\"tier\" in {l}) || !({l}[\"tier\"] in [\"gpu\"]))) : true) || {CARRIES_KEYWARDS_ANNOTATIONS}")
        );
    }

    #[test]
    fn annotation_selectors_narrow_the_labels_or_stand_alone() {
        let profile = |name: &str, selectors: &str| {
            format!("apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {{name: {name}}}\nspec:\n{selectors}  requesters: {{usernames: [bot]}}\n  inject: {{apiToken: remove}}\n")
        };
        let both = profile("both", "  selector: {matchLabels: {app: x}}\n  annotationSelector: {matchAnnotations: {example.com/auth: \"true\"}}\n");
        let alone =
            profile("alone", "  annotationSelector: {matchExpressions: [{key: example.com/mode, operator: Exists}]}\n");
        let set = ProfileSet::from_sources([("t.yaml".to_string(), format!("{both}---\n{alone}"))]).unwrap();
        let (l, a) = ("object.metadata.labels", "object.metadata.annotations");
        assert_eq!(
            match_expression(&set),
            format!(
                "((has({l}) ? ((\"app\" in {l} && {l}[\"app\"] == \"x\")) : false) && (has({a}) ? ((\"example.com/auth\" in {a} && {a}[\"example.com/auth\"] == \"true\")) : false)) || \
(has({a}) ? ((\"example.com/mode\" in {a})) : false) || {CARRIES_KEYWARDS_ANNOTATIONS}"
            )
        );
    }

    // === the conditions' meaning, evaluated as CEL ===

    use crate::names::Labels;
    use crate::profile::LabelSelector;
    use crate::select::label_selector_matches;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    /// What the apiserver would decide: `expression` evaluated on the pod, as CEL.
    fn cel_selects(expression: &str, pod: &Value) -> bool {
        let program = cel::Program::compile(expression).unwrap_or_else(|e| panic!("{expression}: {e}"));
        let mut context = cel::Context::default();
        context.add_variable("object", cel::to_value(pod).unwrap()).unwrap();
        match program.execute(&context) {
            Ok(cel::Value::Bool(b)) => b,
            // An error or a non-boolean: the apiserver then applies failurePolicy.
            other => panic!("{expression} on {pod}: {other:?}"),
        }
    }

    fn map_of(pod: &Value, field: &str) -> Labels<'static> {
        pod["metadata"][field]
            .as_object()
            .map(|m| {
                m.iter().map(|(k, v)| (k.clone().into(), v.as_str().unwrap_or_default().to_string().into())).collect()
            })
            .unwrap_or_default()
    }

    /// What keyward's own selection decides on labels and annotations (the part the
    /// conditions stand for: owners and namespaces are checked by keyward), and whether the pod
    /// carries keyward's annotations (which the webhook must see to remove).
    fn engine_selects(set: &ProfileSet, pod: &Value) -> bool {
        let (labels, annotations) = (map_of(pod, "labels"), map_of(pod, "annotations"));
        let carries = ["keyward.io/attestation", "keyward.io/injected"].iter().any(|k| annotations.contains_key(*k));
        carries
            || set.iter().any(|p| {
                let a = &p.spec.annotation_selector;
                let a = LabelSelector {
                    match_labels: a.match_annotations.clone(),
                    match_expressions: a.match_expressions.clone(),
                };
                label_selector_matches(&p.spec.selector, &labels).is_ok()
                    && label_selector_matches(&a, &annotations).is_ok()
            })
    }

    /// Every pod fixture (bare, or the object of a review), with its file.
    fn fixture_pods() -> Vec<(String, Value)> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
        let mut pods = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                let pod = if v["kind"] == "AdmissionReview" { v["request"]["object"].clone() } else { v };
                if pod["kind"] == "Pod" {
                    pods.push((path.display().to_string(), pod));
                }
            }
        }
        pods
    }

    #[test]
    fn the_conditions_send_keyward_exactly_the_fixture_pods_a_profile_selects() {
        let examples = ["lmeval-job.yaml", "kuberay.yaml", "kserve-inferencegraph.yaml"].map(|name| {
            let path = format!("{}/tests/profiles/{name}", env!("CARGO_MANIFEST_DIR"));
            (path.clone(), std::fs::read_to_string(path).unwrap())
        });
        let builtin = ProfileSet::builtin().unwrap();
        let with_examples = builtin.clone().overlay(ProfileSet::from_sources(examples).unwrap()).unwrap();
        let mut pods = fixture_pods();
        assert!(pods.len() >= 10, "{} fixtures", pods.len());
        // And each with its labels gone, and with every label's value changed.
        for (file, pod) in pods.clone() {
            let mut bare = pod.clone();
            bare["metadata"].as_object_mut().unwrap().remove("labels");
            pods.push((format!("{file} without labels"), bare));
            let mut other = pod;
            for value in other["metadata"]["labels"].as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
                *value = json!(format!("{}-other", value.as_str().unwrap_or_default()));
            }
            pods.push((format!("{file} with other label values"), other));
        }
        for set in [builtin, with_examples] {
            let expression = match_expression(&set);
            let mut selected = 0;
            for (file, pod) in &pods {
                let want = engine_selects(&set, pod);
                assert_eq!(cel_selects(&expression, pod), want, "{file}");
                selected += usize::from(want);
            }
            // Both outcomes occur, so the comparison means something.
            assert!(selected > 0 && selected < pods.len(), "{selected} of {}", pods.len());
        }
    }

    fn requirement() -> impl Strategy<Value = Value> {
        let keys = prop::sample::select(vec!["app", "tier", "example.com/team"]);
        let values = prop::collection::vec(prop::sample::select(vec!["a", "b", "c"]), 1..3);
        prop_oneof![
            (keys.clone(), values.clone()).prop_map(|(k, v)| json!({"key": k, "operator": "In", "values": v})),
            (keys.clone(), values).prop_map(|(k, v)| json!({"key": k, "operator": "NotIn", "values": v})),
            keys.clone().prop_map(|k| json!({"key": k, "operator": "Exists"})),
            keys.prop_map(|k| json!({"key": k, "operator": "DoesNotExist"})),
        ]
    }

    fn selector() -> impl Strategy<Value = (BTreeMap<String, String>, Vec<Value>)> {
        let exact = prop::collection::btree_map(
            prop::sample::select(vec!["app".to_string(), "tier".to_string(), "example.com/team".to_string()]),
            prop::sample::select(vec!["a".to_string(), "b".to_string()]),
            0..2,
        );
        (exact, prop::collection::vec(requirement(), 0..3))
    }

    /// Absent, empty, or some of the keys with some of the values.
    fn string_map() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
        prop::option::of(prop::collection::btree_map(
            prop::sample::select(vec![
                "app".to_string(),
                "tier".to_string(),
                "example.com/team".to_string(),
                "other".to_string(),
            ]),
            prop::sample::select(vec!["a".to_string(), "b".to_string(), "c".to_string(), "".to_string()]),
            0..4,
        ))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Any profile's label and annotation selectors: the condition holds on a pod exactly
        /// when the profile selects it. A condition that skips a selected pod would leave it
        /// without credentials; one that sends others only costs a call.
        #[test]
        fn the_condition_holds_exactly_when_the_selectors_match(
            (labels_exact, labels_expr) in selector(),
            (annotations_exact, annotations_expr) in selector(),
            pod_labels in string_map(),
            pod_annotations in string_map(),
        ) {
            let profile = json!({
                "apiVersion": "keyward.io/v1alpha1", "kind": "InjectionProfile", "metadata": {"name": "gen"},
                "spec": {
                    "selector": {"matchLabels": labels_exact, "matchExpressions": labels_expr},
                    "annotationSelector": {"matchAnnotations": annotations_exact, "matchExpressions": annotations_expr},
                    "requesters": {"usernames": ["bot"]},
                    "inject": {"apiToken": "remove"}
                }
            });
            // A selector that validation refuses (an empty one) is not a case.
            let set = ProfileSet::from_sources([("gen.yaml".to_string(), profile.to_string())]);
            prop_assume!(set.is_ok());
            let set = set.unwrap();
            let mut metadata = json!({"name": "p"});
            if let Some(labels) = pod_labels {
                metadata["labels"] = json!(labels);
            }
            if let Some(annotations) = pod_annotations {
                metadata["annotations"] = json!(annotations);
            }
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata});
            prop_assert_eq!(cel_selects(&match_expression(&set), &pod), engine_selects(&set, &pod));
        }
    }

    #[test]
    fn a_pod_carrying_keywards_annotations_reaches_the_webhook_whatever_its_labels() {
        let expression = match_expression(&ProfileSet::builtin().unwrap());
        for key in ["keyward.io/attestation", "keyward.io/injected"] {
            let pod = json!({"metadata": {"name": "p", "labels": {"app": "tenant"}, "annotations": {key: "copied"}}});
            assert!(cel_selects(&expression, &pod), "{key}");
        }
        let plain = json!({"metadata": {"name": "p", "labels": {"app": "tenant"}, "annotations": {"a": "b"}}});
        assert!(!cel_selects(&expression, &plain));
        assert!(!cel_selects(&expression, &json!({"metadata": {"name": "p"}})));
    }

    #[test]
    fn quotes_are_escaped() {
        assert_eq!(cel_str("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }
}
