//! What a caller may do: rules, each a route (an HTTP method and path pattern, or a gRPC
//! service and methods), the callers it admits, and conditions tying the caller to the request
//! (its namespace or name equals a path segment, a header, a gRPC field, or a fixed value).
//! Default deny: a request is allowed only by a rule whose route, callers and every condition
//! hold. [`Gate::decide`] says which rule allowed it, or why each rule did not, as
//! `keyward explain` does for profiles.

use std::cell::OnceCell;
use std::collections::BTreeMap;

use keyward_engine::names::{is_label_value, is_qualified_name, trust_domain_problem};
use keyward_engine::text::quoted;
use serde::Deserialize;

use crate::grpc;
use crate::json::{FieldPath, Value as JsonValue};
use crate::owners::{LiveOwner, LiveOwnerSpec};
use crate::route::{PathPattern, RequestPath};

// === the configuration, as written ===

/// `spec` of a gate file (`kind: Gate`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GateSpec {
    /// The trust domain of the workload identities the gate accepts (keyward's
    /// `--trust-domain`); identities of any other are refused.
    #[serde(default)]
    pub trust_domain: Option<String>,
    /// Headers the upstream reads as an identity, beyond those the gate always strips
    /// ([`crate::headers::claims_identity`]): KFP's API server trusts `kubeflow-userid` before
    /// any token, so a gate in front of it strips that (its name is the server's setting).
    #[serde(default)]
    pub strip_headers: Vec<String>,
    /// Headers the upstream reads as its caller's user name (EvalHub's `X-User`): every copy the
    /// client sent is removed, and the gate sets each to the verified user, as it sets
    /// `X-Remote-User`.
    #[serde(default)]
    pub user_headers: Vec<String>,
    /// Bearer tokens: accepted only when this is given, each checked with a TokenReview for
    /// these audiences (none: the API server's own, as the ODH router asks).
    #[serde(default)]
    pub token_review: Option<TokenReviewSpec>,
    /// Owner kinds the gate watches: an identity of one of these kinds is admitted only while
    /// its owner exists ([`crate::owners`]).
    #[serde(default)]
    pub live_owners: Vec<LiveOwnerSpec>,
    pub rules: Vec<RuleSpec>,
    /// A request whose path no rule's route names: refused (the default), or passed on for the
    /// upstream to decide (a gate in front of kube-rbac-proxy, which keeps its own checks).
    #[serde(default)]
    pub unmatched: Unmatched,
}

/// `spec.unmatched`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Unmatched {
    #[default]
    Refuse,
    Upstream,
}

/// What the gate does with a request before any rule is asked (see [`Gate::standing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// The rules decide.
    Judged,
    /// Passed on unjudged, for the upstream to decide.
    PassedOn,
    /// Refused before any rule: the reason.
    Refused(String),
}

/// The name a passed-on request is allowed by, in logs and metrics (no rule may be named so).
pub const PASSED_ON: &str = "(unmatched: upstream)";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TokenReviewSpec {
    #[serde(default)]
    pub audiences: Vec<String>,
    /// The pods the gate watches: a token bound to one of them names its pod, whose facts rules
    /// compare (`podLabel`, `podAnnotation`, `podOwner`, `podName`).
    #[serde(default)]
    pub pods: Option<PodsSpec>,
}

/// `spec.tokenReview.pods`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodsSpec {
    /// Which pods, cluster-wide: `KEY=VALUE`, `KEY!=VALUE`, `KEY` or `!KEY`, comma-separated,
    /// as `kubectl get pods -l` takes them. Required: the gate keeps what it watches in memory,
    /// so it watches the callers' pods, not every pod.
    pub label_selector: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuleSpec {
    pub name: String,
    #[serde(default)]
    pub http: Option<HttpRoute>,
    #[serde(default)]
    pub grpc: Option<GrpcRoute>,
    pub callers: Callers,
    #[serde(default)]
    pub when: Vec<Condition>,
    /// Asked of the API server once the conditions hold, as kube-rbac-proxy's
    /// `resourceAttributes` are: the rule allows only if it says yes.
    #[serde(default)]
    pub subject_access_review: Option<ReviewSpec>,
    /// A caller known by its client certificate has its `Authorization` header removed, so that
    /// an upstream that authenticates by token never acts on a token of someone else's; true
    /// passes it on (a token caller's always is: KFP's API server reviews it again).
    #[serde(default)]
    pub forward_authorization: bool,
}

/// A SubjectAccessReview's resource attributes. Each value is a literal or one whole
/// reference: `{caller.namespace}`, `{caller.name}`, `{path.NAME}`, `{header.NAME}`,
/// `{grpc.NUMBER}` (never text around one, so nothing a request sends can splice a value).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReviewSpec {
    pub verb: String,
    #[serde(default)]
    pub group: String,
    pub resource: String,
    #[serde(default)]
    pub subresource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
}

/// A SubjectAccessReview to ask: who (the caller's user, without groups, as the ODH router and
/// KFP ask it) and what.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AccessReview {
    pub user: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRoute {
    /// Upper case; none: any.
    #[serde(default)]
    pub methods: Vec<String>,
    pub path: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrpcRoute {
    /// As in the request's path: `package.Service` (or `Service` for a proto without a package).
    pub service: String,
    /// None: any method of the service.
    #[serde(default)]
    pub methods: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Callers {
    /// keyward workload identities (client certificates), by owner kind (lower case) and
    /// namespace; an empty list admits any.
    #[serde(default)]
    pub workloads: Option<WorkloadCallers>,
    /// Service accounts (bearer tokens checked with TokenReview).
    #[serde(default)]
    pub service_accounts: Vec<AccountRef>,
    /// Any service account whose token the TokenReview accepts: for a rule whose
    /// `subjectAccessReview` decides, as the ODH InferenceGraph router's does.
    #[serde(default)]
    pub any_service_account: bool,
    /// Any user whose token the TokenReview accepts, service account or person: for a rule
    /// whose `subjectAccessReview` decides, as the ODH InferenceGraph router admits callers.
    #[serde(default)]
    pub any_user: bool,
    /// Every caller, with no credential at all: for a route the upstream itself serves without
    /// authentication (KFP's v2 cache calls). Only on a named route (gRPC methods listed; HTTP
    /// methods listed and no `**`), alone: never with other callers, conditions or a review.
    #[serde(default)]
    pub anonymous: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadCallers {
    #[serde(default)]
    pub kinds: Vec<String>,
    #[serde(default)]
    pub namespaces: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AccountRef {
    pub namespace: String,
    pub name: String,
}

/// `caller`'s field, or the `request`'s value, equals `equals`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Condition {
    /// The caller's field to compare; or, instead,
    #[serde(default)]
    pub caller: Option<CallerField>,
    /// a value of the request (a path segment, a header, a gRPC or JSON field), compared with a
    /// fixed `equals: {value: …}` (the operator may post only `failed` events).
    #[serde(default)]
    pub request: Option<Operand>,
    pub equals: Operand,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CallerField {
    Namespace,
    /// The owner's name (a workload) or the account's (a service account).
    Name,
    /// The owner's kind, lower case (workloads only).
    Kind,
    /// The name of the pod a caller's token is bound to (`spec.tokenReview.pods`): set at
    /// creation, never changed.
    PodName,
    /// The name of that pod's controller (its Job, for a Job's pod).
    PodOwner,
    /// A label of that pod, by key.
    PodLabel(String),
    /// An annotation of that pod, by key.
    PodAnnotation(String),
}

impl Condition {
    /// The request values the condition reads.
    fn operands(&self) -> impl Iterator<Item = &Operand> {
        std::iter::once(&self.equals).chain(&self.request)
    }
}

impl CallerField {
    /// Whether the field is read from the caller's pod (the gate's watch of pods).
    pub fn of_pod(&self) -> bool {
        matches!(self, Self::PodName | Self::PodOwner | Self::PodLabel(_) | Self::PodAnnotation(_))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub enum Operand {
    /// A `{capture}` of the rule's path pattern.
    PathSegment(String),
    /// A request header (sent once; a header sent twice is refused).
    Header(String),
    /// A top-level string field of the gRPC request's first message, by number.
    GrpcField(u32),
    /// A string or whole-number field of a JSON request body, by a dotted path of keys
    /// (`status.benchmark_index`); see [`crate::json`].
    JsonField(String),
    /// A fixed value.
    Value(String),
}

// === the configuration, checked ===

/// A gate's rules, checked: every pattern parsed, every reference resolved.
#[derive(Debug, Clone)]
pub struct Gate {
    trust_domain: Option<String>,
    /// Compared ignoring case.
    strip_headers: Vec<String>,
    user_headers: Vec<String>,
    token_review: Option<TokenReviewSpec>,
    live_owners: Vec<LiveOwner>,
    rules: Vec<Rule>,
    /// Every JSON field a rule reads: a body is read once for all of them.
    json_fields: Vec<FieldPath>,
    unmatched: Unmatched,
}

#[derive(Debug, Clone)]
struct Rule {
    name: String,
    /// A condition or the review reads a gRPC or JSON field (known at load, asked on every
    /// request).
    reads_body: bool,
    route: Route,
    callers: Callers,
    when: Vec<Condition>,
    review: Option<ReviewSpec>,
    forward_authorization: bool,
}

#[derive(Debug, Clone)]
enum Route {
    Http { methods: Vec<String>, path: PathPattern },
    Grpc { service: String, methods: Vec<String> },
}

/// The largest field number protobuf allows.
const MAX_FIELD_NUMBER: u32 = (1 << 29) - 1;

impl Gate {
    /// Checks a gate's spec; every problem at once, each with the rule it is in.
    pub fn new(spec: GateSpec) -> Result<Self, Vec<String>> {
        let mut problems = Vec::new();
        if let Some(td) = &spec.trust_domain {
            if let Some(problem) = trust_domain_problem(td) {
                problems.push(format!("spec.trustDomain {td:?} {problem}"));
            }
        }
        if spec.rules.is_empty() {
            problems.push("spec.rules is empty: the gate would refuse every request".into());
        }
        if let Some(tr) = &spec.token_review {
            for a in tr.audiences.iter().filter(|a| a.is_empty() || a.len() > 253 || a.contains(char::is_whitespace)) {
                problems.push(format!("spec.tokenReview.audiences: {a:?} is not an audience (a non-empty word, as in a projected token's audience)"));
            }
        }
        let tokens = spec.token_review.is_some();
        let pods = spec.token_review.as_ref().and_then(|t| t.pods.as_ref());
        if let Some(pods) = pods {
            if let Err(e) = selector_problem(&pods.label_selector) {
                problems.push(format!("spec.tokenReview.pods.labelSelector: {e}"));
            }
        }
        let live_owners = crate::owners::check_all(spec.live_owners, &mut problems);
        if !live_owners.is_empty() && spec.trust_domain.is_none() {
            problems
                .push("spec.liveOwners watches the owners of workload identities, which need spec.trustDomain".into());
        }
        for h in spec.strip_headers.iter().chain(&spec.user_headers) {
            if h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
                problems.push(format!("spec.stripHeaders: {h:?} is not a header name"));
            }
        }
        let mut rules = Vec::new();
        let mut names = Vec::new();
        for (i, r) in spec.rules.into_iter().enumerate() {
            let at = format!("spec.rules[{i}] ({:?})", r.name);
            if r.name.is_empty() {
                problems.push(format!("spec.rules[{i}].name is empty: name each rule, for its log lines and metrics"));
            } else if names.contains(&r.name) {
                problems.push(format!("{at}: another rule has this name"));
            } else if r.name == PASSED_ON {
                problems.push(format!("{at}: the gate's name for requests no rule names; name the rule otherwise"));
            }
            names.push(r.name.clone());
            let route = match (r.http, r.grpc) {
                (Some(http), None) => {
                    for m in &http.methods {
                        if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                            problems.push(format!("{at}.http.methods: {m:?} is not an HTTP method in upper case"));
                        }
                    }
                    match PathPattern::parse(&http.path) {
                        Ok(path) => Some(Route::Http { methods: http.methods, path }),
                        Err(e) => {
                            problems.push(format!("{at}.http.path: {e}"));
                            None
                        }
                    }
                }
                (None, Some(grpc)) => {
                    let bad = |s: &str| s.is_empty() || s.contains(['/', '*', '{', '}', '%', '\\']);
                    if bad(&grpc.service) {
                        problems.push(format!(
                            "{at}.grpc.service {:?} is not a service name (package.Service)",
                            grpc.service
                        ));
                    }
                    for m in grpc.methods.iter().filter(|m| bad(m) || m.contains('.')) {
                        problems.push(format!("{at}.grpc.methods: {m:?} is not a method name"));
                    }
                    Some(Route::Grpc { service: grpc.service, methods: grpc.methods })
                }
                _ => {
                    problems.push(format!("{at}: give exactly one of http and grpc"));
                    None
                }
            };
            let workloads = r.callers.workloads.is_some();
            if r.callers.anonymous {
                anonymous_problems(
                    &at,
                    &r.callers,
                    &r.when,
                    r.subject_access_review.is_some(),
                    route.as_ref(),
                    &mut problems,
                );
            }
            if r.callers.any_service_account && r.subject_access_review.is_none() {
                problems.push(format!(
                    "{at}.callers.anyServiceAccount admits every account in the cluster; give the rule a subjectAccessReview, or list serviceAccounts"
                ));
            }
            if r.callers.any_user && r.subject_access_review.is_none() {
                problems.push(format!(
                    "{at}.callers.anyUser admits everyone the cluster authenticates; give the rule a subjectAccessReview"
                ));
            }
            let by_token =
                r.callers.any_service_account || r.callers.any_user || !r.callers.service_accounts.is_empty();
            if !tokens && by_token {
                problems.push(format!(
                    "{at}.callers admits service accounts, whose tokens the gate checks only with spec.tokenReview: add it (with the audiences the tokens are bound to)"
                ));
            }
            if !workloads && !by_token && !r.callers.anonymous {
                problems.push(format!(
                    "{at}.callers admits no one: list workloads (client certificates) or serviceAccounts (tokens)"
                ));
            }
            if workloads && spec.trust_domain.is_none() {
                problems.push(format!(
                    "{at}.callers.workloads needs spec.trustDomain: the gate accepts workload identities of one trust domain"
                ));
            }
            for (j, c) in r.when.iter().enumerate() {
                let at = format!("{at}.when[{j}]");
                match (&c.caller, &c.request, &c.equals) {
                    (Some(_), None, _) | (None, Some(_), Operand::Value(_)) => {}
                    (None, Some(_), _) => problems.push(format!(
                        "{at}: a request condition compares the request's value with a fixed one: equals {{value: …}}"
                    )),
                    _ => problems.push(format!("{at}: give exactly one of caller and request")),
                }
                for o in c.operands() {
                    if let Some(problem) = operand_problem(o, route.as_ref()) {
                        problems.push(format!("{at}: {problem}"));
                    }
                }
                let Some(field) = &c.caller else { continue };
                if *field == CallerField::Kind && !workloads {
                    problems.push(format!("{at}: caller kind is a workload's; this rule admits only service accounts"));
                }
                if field.of_pod() {
                    if pods.is_none() {
                        problems.push(format!(
                            "{at}: caller {} reads the caller's pod, which needs spec.tokenReview.pods (the pods the gate watches, by label selector)",
                            field_name(field)
                        ));
                    }
                    if !by_token {
                        problems.push(format!(
                            "{at}: caller {} is a pod's, known from a token bound to it; this rule admits no token callers",
                            field_name(field)
                        ));
                    }
                    if let CallerField::PodLabel(key) | CallerField::PodAnnotation(key) = field {
                        if !is_qualified_name(key) {
                            problems.push(format!(
                                "{at}: {key:?} is not a label or annotation key (as app.kubernetes.io/name)"
                            ));
                        }
                    }
                }
            }
            if let Some(review) = &r.subject_access_review {
                let values = [
                    ("verb", &review.verb),
                    ("group", &review.group),
                    ("resource", &review.resource),
                    ("subresource", &review.subresource),
                    ("namespace", &review.namespace),
                    ("name", &review.name),
                ];
                for (field, value) in values {
                    if let Err(e) = Reference::parse(value).and_then(|reference| reference.fits(route.as_ref())) {
                        problems.push(format!("{at}.subjectAccessReview.{field}: {e}"));
                    }
                }
                if review.verb.is_empty() || review.resource.is_empty() {
                    problems.push(format!("{at}.subjectAccessReview needs a verb and a resource"));
                }
            }
            if let Some(route) = route {
                // Kinds compare as `liveOwners` compares them: `LMEvalJob` is `lmevaljob`, the
                // spelling of the identity's path.
                let mut callers = r.callers;
                if let Some(w) = callers.workloads.as_mut() {
                    w.kinds.iter_mut().for_each(|k| k.make_ascii_lowercase());
                }
                let mut when = r.when;
                for c in when.iter_mut().filter(|c| c.caller == Some(CallerField::Kind)) {
                    if let Operand::Value(v) = &mut c.equals {
                        v.make_ascii_lowercase();
                    }
                }
                rules.push(Rule {
                    name: r.name,
                    reads_body: reads_body(&when, r.subject_access_review.as_ref()),
                    route,
                    callers,
                    when,
                    review: r.subject_access_review,
                    forward_authorization: r.forward_authorization,
                });
            }
        }
        let json_fields = json_fields(&rules);
        if problems.is_empty() {
            Ok(Self {
                json_fields,
                unmatched: spec.unmatched,
                trust_domain: spec.trust_domain,
                strip_headers: spec.strip_headers,
                user_headers: spec.user_headers,
                token_review: spec.token_review,
                live_owners,
                rules,
            })
        } else {
            Err(problems)
        }
    }
}

/// Why an operand cannot be read on `route`.
fn operand_problem(o: &Operand, route: Option<&Route>) -> Option<String> {
    match (o, route) {
        (Operand::PathSegment(name), Some(Route::Http { path, .. })) if !path.captures().any(|n| n == name) => {
            Some(format!("path {:?} has no {{{name}}} to compare with", path.as_str()))
        }
        (Operand::PathSegment(_), Some(Route::Http { .. })) => None,
        (Operand::PathSegment(_), _) => Some("pathSegment needs an http route with a path pattern".into()),
        (Operand::GrpcField(n), Some(Route::Http { .. })) => Some(format!("grpcField {n} needs a grpc route")),
        (Operand::GrpcField(n), _) if *n == 0 || *n > MAX_FIELD_NUMBER => {
            Some(format!("grpcField {n} is not a protobuf field number (1 to {MAX_FIELD_NUMBER})"))
        }
        (Operand::JsonField(f), Some(Route::Grpc { .. })) => {
            Some(format!("jsonField {f:?} needs an http route (a JSON body)"))
        }
        (Operand::JsonField(f), _) => FieldPath::parse(f).err(),
        (Operand::Header(h), _) if h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') => {
            Some(format!("header {h:?} is not a header name"))
        }
        _ => None,
    }
}

/// Why a label selector is not one the gate takes: equality terms only (`KEY=VALUE`,
/// `KEY==VALUE`, `KEY!=VALUE`, `KEY`, `!KEY`), each key and value by Kubernetes' rules.
fn selector_problem(selector: &str) -> Result<(), String> {
    if selector.trim().is_empty() {
        return Err(
            "is empty: name the callers' pods (as app=evalhub,component=evaluation-job), not every pod of the cluster"
                .into(),
        );
    }
    for term in selector.split(',').map(str::trim) {
        let (key, value) =
            match term.split_once("!=").or_else(|| term.split_once("==")).or_else(|| term.split_once('=')) {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (term.strip_prefix('!').unwrap_or(term).trim(), None),
            };
        if !is_qualified_name(key) || !value.is_none_or(is_label_value) {
            return Err(format!(
                "{term:?} is not KEY=VALUE, KEY!=VALUE, KEY or !KEY with a label key and value (set-based terms, `in` and `notin`, are not taken)"
            ));
        }
    }
    Ok(())
}

/// What makes an `anonymous` rule wrong: a route that is not named, or anything that reads an
/// identity an anonymous caller does not have.
fn anonymous_problems(
    at: &str,
    callers: &Callers,
    when: &[Condition],
    reviews: bool,
    route: Option<&Route>,
    problems: &mut Vec<String>,
) {
    if callers.workloads.is_some()
        || !callers.service_accounts.is_empty()
        || callers.any_service_account
        || callers.any_user
    {
        problems.push(format!(
            "{at}.callers.anonymous admits every caller, so listing workloads or serviceAccounts beside it means nothing: give them a rule of their own"
        ));
    }
    if !when.is_empty() {
        problems.push(format!(
            "{at}.when compares the caller's identity, which an anonymous caller does not have: an anonymous rule has no conditions"
        ));
    }
    if reviews {
        problems.push(format!(
            "{at}.subjectAccessReview asks about the caller, whom an anonymous caller does not name: an anonymous rule has no review"
        ));
    }
    match route {
        Some(Route::Grpc { methods, .. }) if methods.is_empty() => problems.push(format!(
            "{at}.callers.anonymous needs a named route: list the gRPC methods the upstream serves without authentication"
        )),
        Some(Route::Http { methods, path }) if methods.is_empty() || path.has_rest() => problems.push(format!(
            "{at}.callers.anonymous needs a named route: list the HTTP methods, and a path without '**'"
        )),
        _ => {}
    }
}

// === deciding ===

pub use crate::identity::Caller;
use crate::identity::PodCaller;

/// A request, as far as the rules read it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'r> {
    pub method: &'r str,
    /// The request target's path, without the query.
    pub path: &'r str,
    /// Every header as received (names in any case; one entry per occurrence).
    pub headers: &'r [(&'r str, &'r str)],
    /// The body, for a gRPC field condition (a gRPC request's length-prefixed messages).
    pub body: &'r [u8],
}

/// What the gate does with a request, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The rule that allowed it; `None`: refused, unless `pending` has reviews to ask.
    pub allowed_by: Option<String>,
    /// Why each rule did not allow it (or, for the one that did, that it did), in order.
    pub trace: Vec<(String, String)>,
    /// SubjectAccessReviews whose answers the decision awaits: ask them (or the cache), then
    /// decide again with the answers. Empty once the verdict is final.
    pub pending: Vec<AccessReview>,
}

impl Verdict {
    /// The refusal's reason for the caller: the rules that fit its route and why none held.
    pub fn reason(&self) -> String {
        let relevant: Vec<String> = self
            .trace
            .iter()
            .filter(|(_, why)| !why.starts_with("the route is"))
            .map(|(rule, why)| if rule == "*" { why.clone() } else { format!("rule {rule:?}: {why}") })
            .collect();
        if relevant.is_empty() {
            "no rule of this gate covers this method and path".into()
        } else {
            relevant.join("; ")
        }
    }
}

impl Gate {
    /// With `spec.unmatched: upstream`, a request whose path no rule's route names, whatever its
    /// method, goes on without the gate's judgement, for the upstream's own (kube-rbac-proxy's
    /// checks behind the gate); a path a rule names is the rules' alone, any method. Never a path
    /// holding a percent-encoding: the upstream may decode it into one a rule names (Go's
    /// ServeMux reads `/jobs/a/%65vents` as `/jobs/a/events`), so that one is refused.
    pub fn standing(&self, raw_path: &str, path: &RequestPath<'_>) -> Standing {
        if self.unmatched == Unmatched::Refuse || self.rules.iter().any(|r| r.route.names(path)) {
            return Standing::Judged;
        }
        if raw_path.contains('%') {
            return Standing::Refused(format!(
                "path {} holds a percent-encoding, which the upstream may decode into a path this gate's rules name, and no rule names it as sent; send it unencoded",
                quoted(raw_path, 96)
            ));
        }
        Standing::PassedOn
    }

    /// The audiences bearer tokens are reviewed for; `None`: the gate accepts no tokens.
    pub fn token_audiences(&self) -> Option<&[String]> {
        self.token_review.as_ref().map(|t| t.audiences.as_slice())
    }

    /// Whether deciding may need the API server: tokens to review, a rule's
    /// SubjectAccessReview, or owners to watch.
    pub fn asks_api_server(&self) -> bool {
        self.token_review.is_some() || self.rules.iter().any(|r| r.review.is_some()) || !self.live_owners.is_empty()
    }

    /// Whether a rule admits callers with no credential (`callers.anonymous`).
    pub fn admits_anonymous(&self) -> bool {
        self.rules.iter().any(|r| r.callers.anonymous)
    }

    /// Whether a rule admits workloads by client certificate (`callers.workloads`): only then
    /// does the gate need the client CA.
    pub fn admits_workloads(&self) -> bool {
        self.rules.iter().any(|r| r.callers.workloads.is_some())
    }

    /// Whether a caller with no client certificate can be admitted by any rule: one bringing a
    /// token, or none. Only such callers can use the gate's plaintext listener.
    pub fn admits_without_certificate(&self) -> bool {
        self.rules.iter().any(|r| r.without_certificate())
    }

    /// One line a rule: its name, route and callers, and whether a caller without a client
    /// certificate (over the plaintext listener, say) can reach it.
    pub fn summary(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|r| {
                let reach = if r.without_certificate() {
                    "over TLS and over --listen-plaintext"
                } else {
                    "over TLS only (a client certificate)"
                };
                format!("rule {:?}: {}; {}; {reach}", r.name, r.route.describe(), r.callers.describe())
            })
            .collect()
    }

    /// The pods the gate watches for the callers of pod-bound tokens (`spec.tokenReview.pods`).
    pub fn pods(&self) -> Option<&PodsSpec> {
        self.token_review.as_ref().and_then(|t| t.pods.as_ref())
    }

    /// The pod labels and annotations rules read: all the gate keeps of a watched pod's.
    pub fn pod_keys(&self) -> (Vec<String>, Vec<String>) {
        let (mut labels, mut annotations) = (Vec::new(), Vec::new());
        for c in self.rules.iter().flat_map(|r| &r.when) {
            match &c.caller {
                Some(CallerField::PodLabel(k)) if !labels.contains(k) => labels.push(k.clone()),
                Some(CallerField::PodAnnotation(k)) if !annotations.contains(k) => annotations.push(k.clone()),
                _ => {}
            }
        }
        (labels, annotations)
    }

    /// The owner kinds whose identities are admitted only while their owner exists.
    pub fn live_owners(&self) -> &[LiveOwner] {
        &self.live_owners
    }

    /// The watched owner kind of a workload identity of `kind` (lower case), if it is one.
    pub fn live_owner(&self, kind: &str) -> Option<&LiveOwner> {
        self.live_owners.iter().find(|o| o.kind.eq_ignore_ascii_case(kind))
    }

    /// Whether a rule that could decide `method` `path` for `caller` reads the gRPC request's
    /// message (a `grpcField` condition or `{grpc.N}` reference): only then does the transport
    /// hold the body back to read it. A caller no such rule admits is decided without it (the
    /// rules that read it refuse that caller first), so it never holds the gate's memory.
    pub fn reads_body(&self, caller: &Caller, method: &str, path: &RequestPath<'_>) -> bool {
        self.rules.iter().any(|rule| rule.reads_body && rule.admits(caller) && rule.route.fits(method, path).is_ok())
    }

    /// Whether a client-sent header must not reach the upstream: one that claims an identity
    /// ([`crate::headers::claims_identity`]) or one this gate's file lists, compared as the
    /// upstream reads names ([`crate::headers::same_name`]).
    pub fn strips(&self, name: &str) -> bool {
        crate::headers::claims_identity(name)
            || self.strip_headers.iter().chain(&self.user_headers).any(|h| crate::headers::same_name(h, name))
    }

    /// Whether a rule decides on header `name` (a `header` condition or `{header.…}`
    /// reference): a caller may not have it dropped as hop-by-hop after the decision.
    pub fn reads_header(&self, name: &str) -> bool {
        let reads = |o: &Operand| matches!(o, Operand::Header(h) if crate::headers::same_name(h, name));
        self.rules.iter().any(|rule| {
            rule.when.iter().any(|c| c.operands().any(reads))
                || rule.review.as_ref().is_some_and(|r| {
                    [&r.verb, &r.group, &r.resource, &r.subresource, &r.namespace, &r.name]
                        .into_iter()
                        .any(|t| matches!(Reference::parse(t), Ok(Reference::Operand(o)) if reads(&o)))
                })
        })
    }

    /// The headers the gate sets to the verified user (`spec.userHeaders`).
    pub fn user_headers(&self) -> &[String] {
        &self.user_headers
    }

    /// Whether the rule named `rule` passes a certificate caller's `Authorization` header on.
    pub fn forwards_authorization(&self, rule: &str) -> bool {
        self.rules.iter().any(|r| r.name == rule && r.forward_authorization)
    }

    /// Decides on a request from `caller`. Pure: the transport has verified the caller, a path
    /// the gate will not judge was refused before, and `reviews` answers the SubjectAccessReviews
    /// it knows (`None`: not asked yet; they come back in [`Verdict::pending`]). The trace says
    /// what every rule made of the request, as `keyward gate check` prints it.
    pub fn decide(
        &self,
        caller: &Caller,
        request: &Request<'_>,
        path: &RequestPath<'_>,
        reviews: &dyn Fn(&AccessReview) -> Option<bool>,
    ) -> Verdict {
        self.judge(caller, request, path, reviews, Trace::Every)
    }

    /// [`Gate::decide`] for the proxy: the same `allowed_by`, `pending` and
    /// [`Verdict::reason`], but the trace keeps only the lines a refusal's reason shows. Rules
    /// whose route the request is not on, and the rule that allows it, write nothing: the
    /// proxy would format and drop those lines on every request.
    pub fn decide_for_proxy(
        &self,
        caller: &Caller,
        request: &Request<'_>,
        path: &RequestPath<'_>,
        reviews: &dyn Fn(&AccessReview) -> Option<bool>,
    ) -> Verdict {
        self.judge(caller, request, path, reviews, Trace::Reasons)
    }

    fn judge(
        &self,
        caller: &Caller,
        request: &Request<'_>,
        path: &RequestPath<'_>,
        reviews: &dyn Fn(&AccessReview) -> Option<bool>,
        detail: Trace,
    ) -> Verdict {
        let every = detail == Trace::Every;
        let mut trace = Vec::new();
        if let (Caller::Workload(id), Some(td)) = (caller, &self.trust_domain) {
            if id.trust_domain != *td {
                trace.push(("*".into(), format!("the identity's trust domain is {:?}, not {td:?}", id.trust_domain)));
                return Verdict { allowed_by: None, trace, pending: Vec::new() };
            }
        }
        match self.standing(request.path, path) {
            Standing::Judged => {}
            Standing::PassedOn => {
                let why =
                    "no rule names this path, and spec.unmatched is upstream: passed on for the upstream to decide";
                trace.push(("*".into(), why.into()));
                return Verdict { allowed_by: Some(PASSED_ON.into()), trace, pending: Vec::new() };
            }
            Standing::Refused(why) => {
                trace.push(("*".into(), why));
                return Verdict { allowed_by: None, trace, pending: Vec::new() };
            }
        }
        let mut pending = Vec::new();
        let json = JsonBody { fields: &self.json_fields, read: OnceCell::new() };
        for rule in &self.rules {
            match rule.check(caller, request, path, reviews, &json) {
                Ok(()) => {
                    if every {
                        trace.push((rule.name.clone(), "allows it".into()));
                    }
                    return Verdict { allowed_by: Some(rule.name.clone()), trace, pending: Vec::new() };
                }
                Err(Failed::OffRoute) => {
                    if every {
                        trace.push((rule.name.clone(), rule.route.off_route(request.method)));
                    }
                }
                Err(Failed::Awaits(review)) => {
                    trace.push((rule.name.clone(), "awaits the API server's SubjectAccessReview".into()));
                    pending.push(*review);
                }
                Err(Failed::Because(why)) => trace.push((rule.name.clone(), why)),
            }
        }
        Verdict { allowed_by: None, trace, pending }
    }
}

impl Route {
    fn describe(&self) -> String {
        match self {
            Route::Http { methods, path } if methods.is_empty() => format!("any method {}", path.as_str()),
            Route::Http { methods, path } => format!("{} {}", methods.join("|"), path.as_str()),
            Route::Grpc { service, methods } if methods.is_empty() => format!("gRPC {service}/*"),
            Route::Grpc { service, methods } => format!("gRPC {service}/{}", methods.join("|")),
        }
    }

    /// The path's captures when `method` `path` is this route's; else `OffRoute`, whose words
    /// [`Route::off_route`] writes only when a trace wants them.
    fn fits<'p>(&self, method: &str, path: &RequestPath<'p>) -> Result<BTreeMap<&str, &'p str>, Failed> {
        match self {
            Route::Http { methods, path: pattern } => {
                if !takes(methods, method) {
                    return Err(Failed::OffRoute);
                }
                pattern.matches(path).ok_or(Failed::OffRoute)
            }
            Route::Grpc { service, methods } => {
                let fits = method == "POST"
                    && path.grpc_method().is_some_and(|m| {
                        m.service == service && (methods.is_empty() || methods.iter().any(|x| x == m.method))
                    });
                if fits {
                    Ok(BTreeMap::new())
                } else {
                    Err(Failed::OffRoute)
                }
            }
        }
    }

    /// Why a request with `method` is not on this route, for a trace. [`Verdict::reason`] leaves
    /// these lines out by their "the route is" start.
    /// Whether the route names `path`, whatever the method.
    fn names(&self, path: &RequestPath<'_>) -> bool {
        match self {
            Route::Http { path: pattern, .. } => pattern.matches(path).is_some(),
            Route::Grpc { service, .. } => path.grpc_method().is_some_and(|m| m.service == service),
        }
    }

    fn off_route(&self, method: &str) -> String {
        match self {
            Route::Http { methods, .. } if !takes(methods, method) => {
                format!("the route is {} only", methods.join(", "))
            }
            Route::Http { path, .. } => format!("the route is {}", path.as_str()),
            Route::Grpc { service, methods } => format!("the route is gRPC {service}/{}", methods.join("|")),
        }
    }
}

/// Whether an http route's `methods` take `method` (none listed: every method).
fn takes(methods: &[String], method: &str) -> bool {
    methods.is_empty() || methods.iter().any(|m| m == method)
}

/// How much of the rules' reasoning a verdict keeps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Trace {
    /// Every rule's line, as `keyward gate check` prints them.
    Every,
    /// Only the lines [`Verdict::reason`] shows.
    Reasons,
}

/// Why a rule did not allow a request.
enum Failed {
    /// The request is not on the rule's route.
    OffRoute,
    Because(String),
    Awaits(Box<AccessReview>),
}

impl From<String> for Failed {
    fn from(why: String) -> Self {
        Self::Because(why)
    }
}

impl Rule {
    fn check(
        &self,
        caller: &Caller,
        request: &Request<'_>,
        path: &RequestPath<'_>,
        reviews: &dyn Fn(&AccessReview) -> Option<bool>,
        json: &JsonBody<'_>,
    ) -> Result<(), Failed> {
        let captures = self.route.fits(request.method, path)?;
        if !self.admits(caller) {
            return Err(format!("it does not admit {}", describe(caller)).into());
        }
        for c in &self.when {
            let want = operand(&c.equals, request, &captures, json)?;
            let (have, what) = match (&c.caller, &c.request) {
                (Some(field), _) => {
                    let have = field_of(caller, field).ok_or_else(|| missing(caller, field))?;
                    (Some(have.to_string()), format!("the caller's {}", field_name(field)))
                }
                (None, Some(o)) => (operand(o, request, &captures, json)?, operand_name(o)),
                // Refused at load.
                (None, None) => return Err("a condition compares nothing".to_string().into()),
            };
            if want.is_none() || want != have {
                let show = |v: &Option<String>| v.as_ref().map_or("absent".into(), |v| quoted(v, 64));
                return Err(
                    format!("{what} is {}, and {} is {}", show(&have), operand_name(&c.equals), show(&want)).into()
                );
            }
        }
        let Some(spec) = &self.review else { return Ok(()) };
        let value = |template: &str| -> Result<String, String> {
            match Reference::parse(template)? {
                Reference::Literal(s) => Ok(s.to_string()),
                Reference::Caller(field) => Ok(field_of(caller, &field).unwrap_or_default().to_string()),
                Reference::Operand(o) => operand(&o, request, &captures, json)?
                    .ok_or_else(|| format!("{} is absent, and the SubjectAccessReview needs it", operand_name(&o))),
            }
        };
        let review = AccessReview {
            user: match caller {
                Caller::Workload(id) => id.to_string(),
                Caller::ServiceAccount(sa) => sa.to_string(),
                Caller::Pod(p) => p.account.to_string(),
                Caller::User(user) => user.to_string(),
                // Never reached: an anonymous rule has no review, and no other admits one.
                Caller::Anonymous => "system:anonymous".into(),
            },
            verb: value(&spec.verb)?,
            group: value(&spec.group)?,
            resource: value(&spec.resource)?,
            subresource: value(&spec.subresource)?,
            namespace: value(&spec.namespace)?,
            name: value(&spec.name)?,
        };
        match reviews(&review) {
            Some(true) => Ok(()),
            Some(false) => Err(Failed::Because(format!(
                "the API server does not allow {} to {} {}",
                review.user,
                review.verb,
                describe_review(&review)
            ))),
            None => Err(Failed::Awaits(Box::new(review))),
        }
    }

    /// Whether a caller without a client certificate can match: a token, or no credential.
    fn without_certificate(&self) -> bool {
        self.callers.anonymous
            || self.callers.any_service_account
            || self.callers.any_user
            || !self.callers.service_accounts.is_empty()
    }

    fn admits(&self, caller: &Caller) -> bool {
        if self.callers.anonymous {
            // A route the upstream serves to anyone: a credential adds nothing, and takes nothing.
            return true;
        }
        match caller {
            Caller::Workload(id) => self.callers.workloads.as_ref().is_some_and(|w| {
                (w.kinds.is_empty() || w.kinds.contains(&id.kind))
                    && (w.namespaces.is_empty() || w.namespaces.contains(&id.namespace))
            }),
            Caller::ServiceAccount(sa) | Caller::Pod(PodCaller { account: sa, .. }) => {
                self.callers.any_service_account
                    || self.callers.any_user
                    || self.callers.service_accounts.iter().any(|a| a.namespace == sa.namespace && a.name == sa.name)
            }
            Caller::User(_) => self.callers.any_user,
            Caller::Anonymous => false,
        }
    }
}

impl Callers {
    fn describe(&self) -> String {
        if self.anonymous {
            return "callers: anyone, with no credential (anonymous)".into();
        }
        let mut who = Vec::new();
        if let Some(w) = &self.workloads {
            let kinds = if w.kinds.is_empty() { "any kind".to_string() } else { w.kinds.join("|") };
            let namespaces = if w.namespaces.is_empty() { "any namespace".to_string() } else { w.namespaces.join("|") };
            who.push(format!("workloads ({kinds}, {namespaces}) by client certificate"));
        }
        if self.any_user {
            who.push("any user by token".into());
        } else if self.any_service_account {
            who.push("any service account by token".into());
        } else if !self.service_accounts.is_empty() {
            let names: Vec<String> =
                self.service_accounts.iter().map(|a| format!("{}/{}", a.namespace, a.name)).collect();
            who.push(format!("service accounts {} by token", names.join(", ")));
        }
        format!("callers: {}", who.join("; "))
    }
}

/// Whether an operand reads the request's body.
fn in_body(o: &Operand) -> bool {
    matches!(o, Operand::GrpcField(_) | Operand::JsonField(_))
}

/// The operands a rule's review reads.
fn review_operands(review: Option<&ReviewSpec>) -> impl Iterator<Item = Operand> + '_ {
    review.into_iter().flat_map(|r| {
        [&r.verb, &r.group, &r.resource, &r.subresource, &r.namespace, &r.name].into_iter().filter_map(|t| {
            match Reference::parse(t) {
                Ok(Reference::Operand(o)) => Some(o),
                _ => None,
            }
        })
    })
}

/// Whether a rule's conditions or review read a gRPC or JSON field of the request.
fn reads_body(when: &[Condition], review: Option<&ReviewSpec>) -> bool {
    when.iter().any(|c| c.operands().any(in_body)) || review_operands(review).any(|o| in_body(&o))
}

/// Every JSON field the rules read, each once.
fn json_fields(rules: &[Rule]) -> Vec<FieldPath> {
    let mut fields: Vec<FieldPath> = Vec::new();
    for rule in rules {
        let operands =
            rule.when.iter().flat_map(|c| c.operands().cloned()).chain(review_operands(rule.review.as_ref()));
        for o in operands {
            if let Operand::JsonField(f) = o {
                if let Ok(path) = FieldPath::parse(&f) {
                    if !fields.contains(&path) {
                        fields.push(path);
                    }
                }
            }
        }
    }
    fields
}

/// A request's JSON body, read at most once per decision and only if a rule on its route reads
/// it.
struct JsonBody<'g> {
    fields: &'g [FieldPath],
    read: OnceCell<Result<crate::json::Fields, String>>,
}

impl JsonBody<'_> {
    fn field(&self, request: &Request<'_>, path: &str) -> Result<Option<String>, String> {
        let fields = self.read.get_or_init(|| {
            json_content(request.headers)?;
            crate::json::read(request.body, self.fields).map_err(|e| e.to_string())
        });
        let fields = fields.as_ref().map_err(Clone::clone)?;
        // Checked at load: read by its text, with no parse on every request.
        match fields.get(path) {
            None => Ok(None),
            Some(JsonValue::Scalar(v)) => Ok(Some(v.clone())),
            Some(JsonValue::Other(kind)) => {
                Err(format!("JSON field {path} is {kind}; a rule compares strings and whole numbers"))
            }
        }
    }
}

/// The value of header `name`, sent at most once (twice, a server could read either).
fn single_header<'r>(headers: &[(&str, &'r str)], name: &str) -> Result<Option<&'r str>, String> {
    let mut values = headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| *v);
    match (values.next(), values.next()) {
        (Some(_), Some(_)) => Err(format!("header {name} is sent more than once")),
        (value, _) => Ok(value),
    }
}

/// Whether the request says its body is JSON, uncompressed: a rule reads a JSON field only of a
/// body the upstream will read as JSON too.
fn json_content(headers: &[(&str, &str)]) -> Result<(), String> {
    let one = |name: &str| single_header(headers, name);
    if let Some(encoding) = one("content-encoding")?.filter(|e| !e.trim().eq_ignore_ascii_case("identity")) {
        return Err(format!(
            "the request body is encoded ({}); the gate reads JSON fields only of an uncompressed body (send no Content-Encoding)",
            quoted(encoding, 32)
        ));
    }
    let content_type = one("content-type")?.unwrap_or_default();
    let media = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let json = media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"));
    if !json {
        return Err(format!(
            "a rule reads a JSON field of this request, and its Content-Type is {}: send application/json",
            if content_type.is_empty() { "absent".into() } else { quoted(content_type, 64) }
        ));
    }
    Ok(())
}

/// The value an operand names in this request (`None`: absent).
fn operand(
    o: &Operand,
    request: &Request<'_>,
    captures: &BTreeMap<&str, &str>,
    json: &JsonBody<'_>,
) -> Result<Option<String>, String> {
    Ok(match o {
        Operand::PathSegment(name) => captures.get(name.as_str()).map(|s| s.to_string()),
        Operand::Header(name) => single_header(request.headers, name)?.map(str::to_string),
        Operand::GrpcField(n) => {
            let message = grpc::first_message(request.body).map_err(|e| e.to_string())?;
            grpc::string_field(message, *n).map_err(|e| e.to_string())?.map(str::to_string)
        }
        Operand::JsonField(path) => json.field(request, path)?,
        Operand::Value(v) => Some(v.clone()),
    })
}

/// A SubjectAccessReview attribute as written: a literal, or one whole reference.
enum Reference<'t> {
    Literal(&'t str),
    Caller(CallerField),
    Operand(Operand),
}

impl<'t> Reference<'t> {
    fn parse(template: &'t str) -> Result<Self, String> {
        let Some(inner) = template.strip_prefix('{').and_then(|t| t.strip_suffix('}')) else {
            if template.contains(['{', '}']) {
                return Err(format!(
                    "{template:?} mixes text with a reference; a value is a literal or one whole {{reference}}"
                ));
            }
            return Ok(Self::Literal(template));
        };
        let (source, key) = inner.split_once('.').unwrap_or((inner, ""));
        Ok(match (source, key) {
            ("caller", "namespace") => Self::Caller(CallerField::Namespace),
            ("caller", "name") => Self::Caller(CallerField::Name),
            ("caller", "kind") => Self::Caller(CallerField::Kind),
            ("path", k) if !k.is_empty() => Self::Operand(Operand::PathSegment(k.to_string())),
            ("header", k) if !k.is_empty() => Self::Operand(Operand::Header(k.to_string())),
            ("grpc", k) => match k.parse::<u32>() {
                Ok(n) if n > 0 && n <= MAX_FIELD_NUMBER => Self::Operand(Operand::GrpcField(n)),
                _ => return Err(format!("{template:?}: {{grpc.N}} takes a protobuf field number")),
            },
            ("json", k) => match FieldPath::parse(k) {
                Ok(_) => Self::Operand(Operand::JsonField(k.to_string())),
                Err(e) => return Err(format!("{template:?}: {e}")),
            },
            _ => {
                return Err(format!(
                    "{template:?} is not a reference; use {{caller.namespace}}, {{caller.name}}, {{path.NAME}}, {{header.NAME}}, {{grpc.N}} or {{json.FIELD}}"
                ))
            }
        })
    }

    /// Whether the route can give what the reference names.
    fn fits(&self, route: Option<&Route>) -> Result<(), String> {
        match (self, route) {
            (Self::Operand(Operand::PathSegment(name)), Some(Route::Http { path, .. })) => {
                if path.captures().any(|n| n == name) {
                    Ok(())
                } else {
                    Err(format!("path {:?} has no {{{name}}}", path.as_str()))
                }
            }
            (Self::Operand(Operand::PathSegment(_)), _) => Err("{path.…} needs an http route".into()),
            (Self::Operand(Operand::GrpcField(_)), Some(Route::Http { .. })) => {
                Err("{grpc.…} needs a grpc route".into())
            }
            (Self::Operand(Operand::JsonField(_)), Some(Route::Grpc { .. })) => {
                Err("{json.…} needs an http route (a JSON body)".into())
            }
            _ => Ok(()),
        }
    }
}

fn describe_review(r: &AccessReview) -> String {
    let resource = match (r.group.as_str(), r.subresource.as_str()) {
        ("", "") => r.resource.clone(),
        ("", sub) => format!("{}/{sub}", r.resource),
        (group, "") => format!("{}.{group}", r.resource),
        (group, sub) => format!("{}.{group}/{sub}", r.resource),
    };
    let name = if r.name.is_empty() { String::new() } else { format!(" {}", quoted(&r.name, 64)) };
    let namespace =
        if r.namespace.is_empty() { String::new() } else { format!(" in namespace {}", quoted(&r.namespace, 64)) };
    format!("{resource}{name}{namespace}")
}

fn field_of<'c>(caller: &'c Caller, field: &CallerField) -> Option<&'c str> {
    match (caller, field) {
        (Caller::Pod(p), CallerField::Namespace) => Some(&p.account.namespace),
        (Caller::Pod(p), CallerField::Name) => Some(&p.account.name),
        (Caller::Pod(p), CallerField::PodName) => p.facts().map(|f| f.name.as_str()),
        (Caller::Pod(p), CallerField::PodOwner) => p.facts()?.owner.as_ref().map(|o| o.name.as_str()),
        (Caller::Pod(p), CallerField::PodLabel(key)) => p.facts()?.labels.get(key).map(String::as_str),
        (Caller::Pod(p), CallerField::PodAnnotation(key)) => p.facts()?.annotations.get(key).map(String::as_str),
        (Caller::Pod(_), CallerField::Kind) => None,
        (
            _,
            CallerField::PodName | CallerField::PodOwner | CallerField::PodLabel(_) | CallerField::PodAnnotation(_),
        ) => None,
        (Caller::Workload(id), CallerField::Namespace) => Some(&id.namespace),
        (Caller::Workload(id), CallerField::Name) => Some(&id.name),
        (Caller::Workload(id), CallerField::Kind) => Some(&id.kind),
        (Caller::ServiceAccount(sa), CallerField::Namespace) => Some(&sa.namespace),
        (Caller::ServiceAccount(sa), CallerField::Name) => Some(&sa.name),
        (Caller::ServiceAccount(_), _) => None,
        (Caller::User(user), CallerField::Name) => Some(user.as_str()),
        (Caller::User(_), _) => None,
        (Caller::Anonymous, _) => None,
    }
}

fn field_name(field: &CallerField) -> String {
    match field {
        CallerField::Namespace => "namespace".into(),
        CallerField::Name => "name".into(),
        CallerField::Kind => "kind".into(),
        CallerField::PodName => "pod's name".into(),
        CallerField::PodOwner => "pod's controller".into(),
        CallerField::PodLabel(key) => format!("pod's label {key}"),
        CallerField::PodAnnotation(key) => format!("pod's annotation {key}"),
    }
}

/// Why `caller` has no `field`: for a pod's field, whether the caller has a pod at all.
fn missing(caller: &Caller, field: &CallerField) -> String {
    match caller {
        Caller::ServiceAccount(sa) if field.of_pod() => format!(
            "the caller has no pod (service account {sa}: its token is bound to no pod, as a token from `kubectl create token` or a Secret is not), so no {}",
            field_name(field)
        ),
        Caller::Pod(PodCaller { pod: Err(why), .. }) if field.of_pod() => {
            format!("the gate knows nothing of the caller's pod, so no {}: {why}", field_name(field))
        }
        Caller::Pod(p) if field.of_pod() => {
            format!("the caller's pod {} has no {}", p.pod_ref(), field_name(field).trim_start_matches("pod's "))
        }
        other if field.of_pod() => format!("{} has no pod, so no {}", describe(other), field_name(field)),
        other => format!("the caller has no {} ({})", field_name(field), describe(other)),
    }
}

fn operand_name(operand: &Operand) -> String {
    match operand {
        Operand::PathSegment(name) => format!("path segment {{{name}}}"),
        Operand::Header(name) => format!("header {name}"),
        Operand::GrpcField(n) => format!("gRPC field {n}"),
        Operand::JsonField(path) => format!("JSON field {path}"),
        Operand::Value(_) => "the rule's value".into(),
    }
}

fn describe(caller: &Caller) -> String {
    match caller {
        Caller::Workload(id) => format!("workload {id}"),
        Caller::ServiceAccount(sa) => format!("service account {sa}"),
        Caller::Pod(p) => format!("service account {p}"),
        Caller::User(user) => format!("user {user}"),
        Caller::Anonymous => "an anonymous caller (no client certificate, no bearer token)".into(),
    }
}
