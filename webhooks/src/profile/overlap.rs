//! Whether two profiles select a common pod. Such a pod is refused at admission (keyward will
//! not guess which credentials it gets), and with `failurePolicy: Fail` that means it is never
//! created: so the overlap is refused when the profiles load, with a pod that both would select.
//!
//! The question is decided exactly, not guessed: a profile selects on four independent things
//! (namespace, labels, annotations, controller owner), so two profiles share a pod when they
//! share each. Label (and annotation) selectors are conjunctions of per-key terms, so each key
//! is solved on its own; namespace patterns are globs, intersected as automata together with
//! the rule that a namespace is a DNS-1123 label.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;

use super::schema::{LabelSelectorRequirement, OwnerKind, ProfileSpec, SelectorOperator};
use super::Profile;
use crate::error::ProfileError;
use crate::names::glob_match;

/// A pod that two profiles both select, as an example in the refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Witness {
    /// `None`: any namespace.
    pub namespace: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `None`: any controller, or none.
    pub owner: Option<OwnerKind>,
}

impl fmt::Display for Witness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "a pod in namespace {ns:?}")?,
            None => f.write_str("a pod in any namespace")?,
        }
        let pairs = |map: &BTreeMap<String, String>| {
            map.iter().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>().join(", ")
        };
        if !self.labels.is_empty() {
            write!(f, " with labels {{{}}}", pairs(&self.labels))?;
        }
        if !self.annotations.is_empty() {
            write!(f, " with annotations {{{}}}", pairs(&self.annotations))?;
        }
        if let Some(owner) = &self.owner {
            let group = if owner.api_group.is_empty() { "core" } else { &owner.api_group };
            write!(f, " owned by a {group}/{}", owner.kind)?;
        }
        Ok(())
    }
}

/// Every pair of profiles that [`clash`], each refused on the later one, naming the earlier and
/// a pod both select.
pub(super) fn overlaps(profiles: &[Profile]) -> Vec<ProfileError> {
    let mut errors = Vec::new();
    for (i, later) in profiles.iter().enumerate() {
        for earlier in &profiles[..i] {
            let Some(pod) = clash(&earlier.spec, &later.spec) else { continue };
            let replace = if earlier.source.starts_with("builtin:") {
                format!(" (to replace the built-in instead, name yours {:?})", earlier.name)
            } else {
                String::new()
            };
            errors.push(ProfileError {
                source: later.source.clone(),
                profile: Some(later.name.clone()),
                field: "spec.selector".into(),
                reason: format!(
                    "selects pods that profile {:?} ({}) selects too, for example {pod}; keyward would refuse every such pod rather than guess which credentials it gets. Narrow spec.selector, spec.annotationSelector, spec.controllerOwners or spec.namespaces of one of them so that no pod matches both{replace}",
                    earlier.name, earlier.source
                ),
            });
        }
    }
    errors
}

/// A label (or annotation) selector: its equalities and its expressions.
type Selector<'a> = (&'a BTreeMap<String, String>, &'a [LabelSelectorRequirement]);

fn selectors(spec: &ProfileSpec) -> [Selector<'_>; 2] {
    let (labels, annotations) = (&spec.selector, &spec.annotation_selector);
    [
        (&labels.match_labels, &labels.match_expressions),
        (&annotations.match_annotations, &annotations.match_expressions),
    ]
}

/// Whether two profiles clash, with a pod that both select. They clash when they compete for
/// the same pods: when some pod both select carries no label or annotation that only one of
/// them names, or when one selects only pods the other selects too (then it is never used).
/// Profiles that meet only on pods carrying both systems' labels (`app: a` and `tier: b`) do
/// not clash: such a pod is refused at admission, naming both.
pub(super) fn clash(a: &ProfileSpec, b: &ProfileSpec) -> Option<Witness> {
    common_pod(a, b, true).or_else(|| common_pod(a, b, false).filter(|_| contains(a, b) || contains(b, a)))
}

/// A pod both profiles select, if there is one; with `shared`, one whose labels and
/// annotations are only keys that both name.
fn common_pod(a: &ProfileSpec, b: &ProfileSpec, shared: bool) -> Option<Witness> {
    let owner = common_owner(&a.controller_owners, &b.controller_owners)?;
    let [a_labels, a_annotations] = selectors(a);
    let [b_labels, b_annotations] = selectors(b);
    let labels = common_map(a_labels, b_labels, shared)?;
    let annotations = common_map(a_annotations, b_annotations, shared)?;
    let namespace = common_namespace(&a.namespaces, &b.namespaces)?;
    Some(Witness { namespace, labels, annotations, owner })
}

/// Whether every pod `inner` selects, `outer` selects too. Decided exactly for labels,
/// annotations and owners; for namespaces, when each of inner's patterns is one of outer's,
/// a name outer's match, or outer has `*` (glob inclusion beyond that is not worth its code:
/// missing a clash here only defers the refusal to admission).
fn contains(outer: &ProfileSpec, inner: &ProfileSpec) -> bool {
    let namespaces = outer.namespaces.is_empty()
        || outer.namespaces.iter().any(|q| q == "*")
        || (!inner.namespaces.is_empty()
            && inner
                .namespaces
                .iter()
                .all(|p| outer.namespaces.iter().any(|q| q == p || (!p.contains(['*', '?']) && glob_match(q, p)))));
    let owners = outer.controller_owners.is_empty()
        || (!inner.controller_owners.is_empty()
            && inner.controller_owners.iter().all(|k| outer.controller_owners.contains(k)));
    let [outer_labels, outer_annotations] = selectors(outer);
    let [inner_labels, inner_annotations] = selectors(inner);
    namespaces
        && owners
        && map_contains(outer_labels, inner_labels)
        && map_contains(outer_annotations, inner_annotations)
}

/// `Some(None)`: any owner will do (a list that is empty selects on no owner).
fn common_owner(a: &[OwnerKind], b: &[OwnerKind]) -> Option<Option<OwnerKind>> {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => Some(None),
        (true, false) => Some(b.first().cloned()),
        (false, true) => Some(a.first().cloned()),
        (false, false) => a.iter().find(|k| b.contains(k)).map(|k| Some(k.clone())),
    }
}

/// What the terms on one key demand of its value.
#[derive(Default)]
struct KeyTerms<'a> {
    /// The values it may have, when some term lists them (`matchLabels`, `In`).
    allowed: Option<BTreeSet<&'a str>>,
    forbidden: BTreeSet<&'a str>,
    present: bool,
    absent: bool,
}

impl<'a> KeyTerms<'a> {
    fn add(&mut self, operator: SelectorOperator, values: impl Iterator<Item = &'a str>) {
        match operator {
            SelectorOperator::In => {
                self.present = true;
                let values: BTreeSet<&str> = values.collect();
                self.allowed = Some(match self.allowed.take() {
                    Some(allowed) => allowed.intersection(&values).copied().collect(),
                    None => values,
                });
            }
            SelectorOperator::NotIn => self.forbidden.extend(values),
            SelectorOperator::Exists => self.present = true,
            SelectorOperator::DoesNotExist => self.absent = true,
        }
    }

    /// The values it may have, when they are listed.
    fn possible(&self) -> Option<impl Iterator<Item = &&'a str>> {
        self.allowed.as_ref().map(|a| a.iter().filter(|v| !self.forbidden.contains(*v)))
    }

    /// Whether every value (or absence) these terms allow also satisfies `operator values`.
    fn imply(&self, operator: SelectorOperator, values: &BTreeSet<&str>) -> bool {
        match operator {
            SelectorOperator::In => !self.absent && self.possible().is_some_and(|mut p| p.all(|v| values.contains(v))),
            SelectorOperator::NotIn => {
                self.absent
                    || values.is_subset(&self.forbidden)
                    || self.possible().is_some_and(|mut p| p.all(|v| !values.contains(v)))
            }
            SelectorOperator::Exists => self.present,
            SelectorOperator::DoesNotExist => self.absent,
        }
    }
}

/// The terms of some selectors, by key.
fn terms<'a>(selectors: &[Selector<'a>]) -> BTreeMap<&'a str, KeyTerms<'a>> {
    let mut keys: BTreeMap<&str, KeyTerms<'_>> = BTreeMap::new();
    for (equal, expressions) in selectors {
        for (key, value) in *equal {
            keys.entry(key).or_default().add(SelectorOperator::In, std::iter::once(value.as_str()));
        }
        for r in *expressions {
            keys.entry(&r.key).or_default().add(r.operator, r.values.iter().map(String::as_str));
        }
    }
    keys
}

/// A map (labels or annotations) that both selectors match, if there is one; with `shared`,
/// one whose keys both selectors name.
fn common_map<'a>(a: Selector<'a>, b: Selector<'a>, shared: bool) -> Option<BTreeMap<String, String>> {
    let (named_a, named_b) = (terms(&[a]), terms(&[b]));
    let both: BTreeSet<&str> = named_a.keys().filter(|k| named_b.contains_key(*k)).copied().collect();
    let mut map = BTreeMap::new();
    for (key, terms) in terms(&[a, b]) {
        if terms.absent {
            if terms.present {
                return None;
            }
            continue;
        }
        if !terms.present {
            continue;
        }
        if shared && !both.contains(key) {
            return None;
        }
        let value = match terms.possible() {
            Some(mut possible) => possible.next()?.to_string(),
            // Any value but the forbidden ones: there are always more values than those.
            None => (0..).map(|n| format!("x{n}")).find(|v| !terms.forbidden.contains(v.as_str()))?,
        };
        map.insert(key.to_string(), value);
    }
    Some(map)
}

/// Whether every map that `inner` matches, `outer` matches too (`inner` is satisfiable).
fn map_contains(outer: Selector<'_>, inner: Selector<'_>) -> bool {
    let inner = terms(&[inner]);
    let unconstrained = KeyTerms::default();
    let (equal, expressions) = outer;
    equal.iter().all(|(k, v)| {
        inner.get(k.as_str()).unwrap_or(&unconstrained).imply(SelectorOperator::In, &BTreeSet::from([v.as_str()]))
    }) && expressions.iter().all(|r| {
        let values = r.values.iter().map(String::as_str).collect();
        inner.get(r.key.as_str()).unwrap_or(&unconstrained).imply(r.operator, &values)
    })
}

/// `Some(None)`: any namespace (neither profile names any).
fn common_namespace(a: &[String], b: &[String]) -> Option<Option<String>> {
    if a.is_empty() && b.is_empty() {
        return Some(None);
    }
    let any = ["*".to_string()];
    let a = if a.is_empty() { &any[..] } else { a };
    let b = if b.is_empty() { &any[..] } else { b };
    a.iter().flat_map(|p| b.iter().map(move |q| (p, q))).find_map(|(p, q)| common_name(p, q)).map(Some)
}

/// The suffix of a name read so far, as far as DNS-1123 label syntax cares.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Tail {
    Empty,
    Alphanumeric,
    Dash,
}

impl Tail {
    fn then(self, c: char) -> Option<Tail> {
        match (self, c) {
            (_, 'a'..='z' | '0'..='9') => Some(Tail::Alphanumeric),
            (Tail::Alphanumeric | Tail::Dash, '-') => Some(Tail::Dash),
            _ => None,
        }
    }
}

/// A namespace name that both glob patterns match: a DNS-1123 label (its 63-character limit
/// aside: a pattern that long names no namespace at all).
/// `*` and `?` match any character, so one character that neither pattern names stands for all
/// the others: the product of the two patterns and the label syntax is finite and searched
/// breadth first, which also makes the example the shortest.
fn common_name(p: &str, q: &str) -> Option<String> {
    let (p, q): (Vec<char>, Vec<char>) = (p.chars().collect(), q.chars().collect());
    let mut alphabet: BTreeSet<char> = p.iter().chain(&q).copied().filter(|c| !matches!(c, '*' | '?')).collect();
    alphabet.insert('-');
    if let Some(other) = ('a'..='z').chain('0'..='9').find(|c| !alphabet.contains(c)) {
        alphabet.insert(other);
    }
    // After `c` at position `i` of a pattern, where it may be: `*` stays, `?` or `c` moves on.
    let step = |pattern: &[char], i: usize, c: char| match pattern.get(i) {
        Some('*') => Some(i),
        Some(&x) if x == '?' || x == c => Some(i + 1),
        _ => None,
    };
    type State = (usize, usize, Tail);
    let start: State = (0, 0, Tail::Empty);
    let mut came_from: HashMap<State, Option<(State, Option<char>)>> = HashMap::from([(start, None)]);
    let mut queue = VecDeque::from([start]);
    while let Some(state @ (i, j, tail)) = queue.pop_front() {
        if i == p.len() && j == q.len() && tail == Tail::Alphanumeric {
            let mut name: Vec<char> = Vec::new();
            let mut at = state;
            while let Some(Some((before, c))) = came_from.get(&at) {
                name.extend(c);
                at = *before;
            }
            return Some(name.into_iter().rev().collect());
        }
        // A `*` may also match nothing.
        let mut next: Vec<(State, Option<char>)> = Vec::new();
        if p.get(i) == Some(&'*') {
            next.push(((i + 1, j, tail), None));
        }
        if q.get(j) == Some(&'*') {
            next.push(((i, j + 1, tail), None));
        }
        for &c in &alphabet {
            if let (Some(i), Some(j), Some(tail)) = (step(&p, i, c), step(&q, j, c), tail.then(c)) {
                next.push(((i, j, tail), Some(c)));
            }
        }
        for (to, c) in next {
            if let std::collections::hash_map::Entry::Vacant(e) = came_from.entry(to) {
                e.insert(Some((state, c)));
                queue.push_back(to);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::schema::LabelSelector;

    fn req(key: &str, operator: SelectorOperator, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement { key: key.into(), operator, values: values.iter().map(|v| v.to_string()).collect() }
    }

    fn labels(selector: &LabelSelector, other: &LabelSelector) -> Option<BTreeMap<String, String>> {
        common_map(
            (&selector.match_labels, &selector.match_expressions),
            (&other.match_labels, &other.match_expressions),
            false,
        )
    }

    fn sel(equal: &[(&str, &str)], expressions: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_labels: equal.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            match_expressions: expressions,
        }
    }

    #[test]
    fn label_terms_are_solved_per_key() {
        use SelectorOperator::*;
        let app_a = sel(&[("app", "a")], vec![]);
        // Same selector; a wider one; a disjoint value; a key one wants and one forbids.
        assert_eq!(labels(&app_a, &app_a), Some(BTreeMap::from([("app".into(), "a".into())])));
        let wider = sel(&[], vec![req("app", In, &["b", "a"])]);
        assert_eq!(labels(&app_a, &wider), Some(BTreeMap::from([("app".into(), "a".into())])));
        assert_eq!(labels(&app_a, &sel(&[("app", "b")], vec![])), None);
        assert_eq!(labels(&app_a, &sel(&[], vec![req("app", DoesNotExist, &[])])), None);
        assert_eq!(labels(&app_a, &sel(&[], vec![req("app", NotIn, &["a"])])), None);
        // Different keys: a pod carries both.
        let tier = sel(&[], vec![req("tier", Exists, &[]), req("tier", NotIn, &["x0", "x1"])]);
        assert_eq!(
            labels(&app_a, &tier),
            Some(BTreeMap::from([("app".into(), "a".into()), ("tier".into(), "x2".into())]))
        );
        // NotIn and DoesNotExist hold on a pod without the label.
        let without = sel(&[("app", "a")], vec![req("gpu", DoesNotExist, &[])]);
        assert_eq!(
            labels(&without, &sel(&[], vec![req("gpu", NotIn, &["yes"])])),
            Some(BTreeMap::from([("app".into(), "a".into())]))
        );
        assert_eq!(labels(&without, &sel(&[], vec![req("gpu", In, &["no"])])), None);
        assert_eq!(
            labels(&sel(&[], vec![req("a", In, &["1", "2"])]), &sel(&[], vec![req("a", In, &["2", "3"])])).unwrap()
                ["a"],
            "2"
        );
    }

    #[test]
    fn containment_is_implication_term_by_term() {
        use SelectorOperator::*;
        let contains = |outer: &LabelSelector, inner: &LabelSelector| {
            map_contains(
                (&outer.match_labels, &outer.match_expressions),
                (&inner.match_labels, &inner.match_expressions),
            )
        };
        let app_a = sel(&[("app", "a")], vec![]);
        let app_a_gpu = sel(&[("app", "a")], vec![req("gpu", Exists, &[])]);
        assert!(contains(&app_a, &app_a_gpu));
        assert!(!contains(&app_a_gpu, &app_a));
        assert!(contains(&sel(&[], vec![req("app", In, &["a", "b"])]), &app_a));
        assert!(!contains(&app_a, &sel(&[], vec![req("app", In, &["a", "b"])])));
        // In [a, b] without b is a.
        assert!(contains(&app_a, &sel(&[], vec![req("app", In, &["a", "b"]), req("app", NotIn, &["b"])])));
        assert!(contains(&sel(&[], vec![req("app", Exists, &[])]), &app_a));
        assert!(contains(&sel(&[], vec![req("app", NotIn, &["b"])]), &app_a));
        assert!(contains(&sel(&[], vec![req("x", NotIn, &["b"])]), &sel(&[], vec![req("x", DoesNotExist, &[])])));
        assert!(contains(&sel(&[], vec![req("x", NotIn, &["b"])]), &sel(&[], vec![req("x", NotIn, &["b", "c"])])));
        assert!(!contains(&sel(&[], vec![req("x", NotIn, &["b"])]), &sel(&[], vec![req("x", Exists, &[])])));
        assert!(!contains(&sel(&[], vec![req("x", DoesNotExist, &[])]), &app_a));
    }

    #[test]
    fn namespace_patterns_meet_on_a_valid_name() {
        assert_eq!(common_name("team-a", "team-*").as_deref(), Some("team-a"));
        assert_eq!(common_name("team-*", "*-prod").as_deref(), Some("team-prod"));
        assert_eq!(common_name("t?", "*").as_deref().map(str::len), Some(2));
        assert_eq!(common_name("team-a", "team-b"), None);
        assert_eq!(common_name("a*", "b*"), None);
        // Both match "a-", which no namespace can be called.
        assert_eq!(common_name("a-*", "*-"), None);
        assert_eq!(common_name("*", "*").as_deref().map(str::len), Some(1));
        assert_eq!(common_namespace(&[], &[]), Some(None));
        assert_eq!(common_namespace(&["a*".into()], &[]), Some(Some("a".into())));
        assert_eq!(common_namespace(&["a*".into(), "lm-eval".into()], &["lm-*".into()]), Some(Some("lm-eval".into())));
    }

    #[test]
    fn owners_meet_when_either_names_none_or_both_name_one() {
        let job = OwnerKind { api_group: "batch".into(), kind: "Job".into() };
        let rs = OwnerKind { api_group: "apps".into(), kind: "ReplicaSet".into() };
        assert_eq!(common_owner(&[], &[]), Some(None));
        assert_eq!(common_owner(std::slice::from_ref(&job), &[]), Some(Some(job.clone())));
        assert_eq!(common_owner(&[rs.clone(), job.clone()], std::slice::from_ref(&job)), Some(Some(job.clone())));
        assert_eq!(common_owner(&[rs], &[job]), None);
    }
}
