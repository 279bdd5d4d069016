//! The gate's rules on the requests of the systems keyward serves: the LMEvalJob driver's gRPC
//! status call (docs/research/lmeval-grpc-status.md: `/LMEvalJobUpdateService/UpdateStatus`,
//! `JobStatus` field 1 `job_name`, field 2 `job_namespace`, fms-lm-eval-service 38689a3) and a
//! KFP-style agent calling the API server with a token.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

use keyward_gate::config::load;
use keyward_gate::grpc::encode_strings;
use keyward_gate::identity::{ServiceAccount, WorkloadIdentity};
use keyward_gate::route::RequestPath;
use keyward_gate::rules::{AccessReview, Caller, Gate, Request, Verdict};

const LMEVAL: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata:
  name: lmeval-status
spec:
  trustDomain: cluster.local
  stripHeaders: [kubeflow-userid]
  tokenReview: {audiences: [pipelines.kubeflow.org]}
  rules:
    - name: a driver updates only its own job
      grpc:
        service: LMEvalJobUpdateService
        methods: [UpdateStatus]
      callers:
        workloads:
          kinds: [lmevaljob]
      when:
        - caller: name
          equals: {grpcField: 1}
        - caller: namespace
          equals: {grpcField: 2}
    - name: agents report runs in their namespace
      http:
        methods: [POST]
        path: /apis/v1/namespaces/{namespace}/runs/{run}/report
      callers:
        serviceAccounts:
          - {namespace: kubeflow, name: ml-pipeline-persistenceagent}
      when:
        - caller: namespace
          equals: {pathSegment: namespace}
"#;

/// `JobStatus` as the driver encodes it: fields 1 to 5, strings.
fn job_status(name: &str, namespace: &str) -> Vec<u8> {
    encode_strings(&[(1, name), (2, namespace), (3, "Running"), (4, "NoReason"), (5, "step 2 of 4")])
}

fn driver(namespace: &str, name: &str) -> Caller {
    Caller::Workload(
        WorkloadIdentity::parse(&format!("spiffe://cluster.local/ns/{namespace}/lmevaljob/{name}")).unwrap(),
    )
}

fn decide(caller: &Caller, method: &str, path: &str, body: &[u8]) -> Verdict {
    let gate = load("lmeval.yaml", LMEVAL).unwrap().gate;
    let request = Request { method, path, headers: &[], body };
    decided(&gate, caller, &request, &RequestPath::parse(path).unwrap(), &|_| None)
}

/// `Gate::decide`, and the proxy's `decide_for_proxy` beside it: every test's request must get
/// the same verdict and, refused, the same reason from both; the proxy's trace a part of the full one.
fn decided(
    gate: &Gate,
    caller: &Caller,
    request: &Request<'_>,
    path: &RequestPath<'_>,
    reviews: &dyn Fn(&AccessReview) -> Option<bool>,
) -> Verdict {
    let every = gate.decide(caller, request, path, reviews);
    let proxy = gate.decide_for_proxy(caller, request, path, reviews);
    // A reason is asked of a refusal only.
    let reason = |v: &Verdict| v.allowed_by.is_none().then(|| v.reason());
    assert_eq!(
        (&proxy.allowed_by, &proxy.pending, reason(&proxy)),
        (&every.allowed_by, &every.pending, reason(&every)),
        "the proxy's verdict differs: {proxy:?} against {every:?}"
    );
    assert!(proxy.trace.iter().all(|line| every.trace.contains(line)), "{proxy:?} against {every:?}");
    every
}

#[test]
fn the_proxy_formats_no_line_for_a_rule_off_the_route_or_the_rule_that_allows() {
    let gate = load("lmeval.yaml", LMEVAL).unwrap().gate;
    let path = "/apis/v1/namespaces/kubeflow/runs/r-1/report";
    let request = Request { method: "POST", path, headers: &[], body: &[] };
    let agent = Caller::ServiceAccount(
        ServiceAccount::parse("system:serviceaccount:kubeflow:ml-pipeline-persistenceagent").unwrap(),
    );
    let every = decided(&gate, &agent, &request, &RequestPath::parse(path).unwrap(), &|_| None);
    assert_eq!(
        every.trace,
        [
            (
                "a driver updates only its own job".to_string(),
                "the route is gRPC LMEvalJobUpdateService/UpdateStatus".to_string()
            ),
            ("agents report runs in their namespace".to_string(), "allows it".to_string()),
        ]
    );
    let proxy = gate.decide_for_proxy(&agent, &request, &RequestPath::parse(path).unwrap(), &|_| None);
    assert_eq!(proxy.allowed_by.as_deref(), Some("agents report runs in their namespace"));
    assert!(proxy.trace.is_empty(), "{proxy:?}");

    // Refused on the route that fits: the reason, and only its line, in both.
    let get = Request { method: "GET", path, headers: &[], body: &[] };
    let every = decided(&gate, &agent, &get, &RequestPath::parse(path).unwrap(), &|_| None);
    assert_eq!(every.trace[1].1, "the route is POST only");
    assert_eq!(every.reason(), "no rule of this gate covers this method and path");
    let elsewhere = "/apis/v1/namespaces/kubeflow/runs/r-1";
    let post = Request { method: "POST", path: elsewhere, headers: &[], body: &[] };
    let every = decided(&gate, &agent, &post, &RequestPath::parse(elsewhere).unwrap(), &|_| None);
    assert_eq!(every.trace[1].1, "the route is /apis/v1/namespaces/{namespace}/runs/{run}/report");
    let other = Caller::ServiceAccount(ServiceAccount::parse("system:serviceaccount:team-a:mallory").unwrap());
    let proxy = gate.decide_for_proxy(&other, &request, &RequestPath::parse(path).unwrap(), &|_| None);
    assert_eq!(
        proxy.trace,
        [(
            "agents report runs in their namespace".to_string(),
            "it does not admit service account system:serviceaccount:team-a:mallory".to_string()
        )]
    );
}

const UPDATE: &str = "/LMEvalJobUpdateService/UpdateStatus";

#[test]
fn a_driver_updates_its_own_job_and_no_other() {
    let mine = decide(&driver("team-a", "evaljob-sample"), "POST", UPDATE, &job_status("evaljob-sample", "team-a"));
    assert_eq!(mine.allowed_by.as_deref(), Some("a driver updates only its own job"), "{mine:?}");

    let other = decide(&driver("team-a", "evaljob-sample"), "POST", UPDATE, &job_status("someone-else", "team-a"));
    assert_eq!(other.allowed_by, None);
    assert_eq!(
        other.reason(),
        "rule \"a driver updates only its own job\": the caller's name is \"evaljob-sample\", and gRPC field 1 is \"someone-else\""
    );
    let other_ns = decide(&driver("team-a", "evaljob-sample"), "POST", UPDATE, &job_status("evaljob-sample", "team-b"));
    assert!(
        other_ns.reason().contains("the caller's namespace is \"team-a\", and gRPC field 2 is \"team-b\""),
        "{}",
        other_ns.reason()
    );
}

#[test]
fn a_job_named_twice_in_one_message_is_refused() {
    let mut body = job_status("evaljob-sample", "team-a");
    // A second job_name after the driver's own: the server would take it.
    body.extend_from_slice(&[1 << 3 | 2, 3, b'v', b'i', b'c']);
    let len = u32::try_from(body.len() - 5).unwrap().to_be_bytes();
    body[1..5].copy_from_slice(&len);
    let v = decide(&driver("team-a", "evaljob-sample"), "POST", UPDATE, &body);
    assert_eq!(v.allowed_by, None);
    assert!(v.reason().contains("field 1 appears more than once"), "{}", v.reason());
}

#[test]
fn another_owner_kind_or_trust_domain_is_not_admitted() {
    let job = Caller::Workload(WorkloadIdentity::parse("spiffe://cluster.local/ns/team-a/job/evaljob-sample").unwrap());
    let v = decide(&job, "POST", UPDATE, &job_status("evaljob-sample", "team-a"));
    assert!(
        v.reason().contains("it does not admit workload spiffe://cluster.local/ns/team-a/job/evaljob-sample"),
        "{}",
        v.reason()
    );
    let foreign =
        Caller::Workload(WorkloadIdentity::parse("spiffe://other.org/ns/team-a/lmevaljob/evaljob-sample").unwrap());
    let v = decide(&foreign, "POST", UPDATE, &job_status("evaljob-sample", "team-a"));
    assert_eq!(
        v.trace,
        [("*".to_string(), "the identity's trust domain is \"other.org\", not \"cluster.local\"".to_string())]
    );
    assert_eq!(v.reason(), "the identity's trust domain is \"other.org\", not \"cluster.local\"");
}

/// `kinds` and a `caller: kind` value are spelled as the owner's Kind or in lower case, as
/// `liveOwners` takes them: both match the identity's lower-case kind.
#[test]
fn an_owner_kind_matches_whatever_its_case() {
    let kind_spelled = LMEVAL.replace("kinds: [lmevaljob]", "kinds: [LMEvalJob]").replace(
        "        - caller: name\n          equals: {grpcField: 1}\n",
        "        - caller: name\n          equals: {grpcField: 1}\n        - caller: kind\n          equals: {value: LMEvalJob}\n",
    );
    assert_ne!(kind_spelled, LMEVAL);
    assert!(kind_spelled.contains("equals: {value: LMEvalJob}"));
    let gate = load("kind.yaml", &kind_spelled).unwrap().gate;
    let body = job_status("evaljob-sample", "team-a");
    let request = Request { method: "POST", path: UPDATE, headers: &[], body: &body };
    let v =
        decided(&gate, &driver("team-a", "evaljob-sample"), &request, &RequestPath::parse(UPDATE).unwrap(), &|_| None);
    assert_eq!(v.allowed_by.as_deref(), Some("a driver updates only its own job"), "{}", v.reason());
    assert!(gate.summary()[0].contains("workloads (lmevaljob, any namespace)"), "{}", gate.summary()[0]);
}

#[test]
fn a_service_account_acts_in_its_own_namespace_only() {
    let agent = Caller::ServiceAccount(
        ServiceAccount::parse("system:serviceaccount:kubeflow:ml-pipeline-persistenceagent").unwrap(),
    );
    let path = "/apis/v1/namespaces/kubeflow/runs/r-1/report";
    assert_eq!(
        decide(&agent, "POST", path, b"{}").allowed_by.as_deref(),
        Some("agents report runs in their namespace")
    );
    let v = decide(&agent, "POST", "/apis/v1/namespaces/team-a/runs/r-1/report", b"{}");
    assert!(
        v.reason().contains("the caller's namespace is \"kubeflow\", and path segment {namespace} is \"team-a\""),
        "{}",
        v.reason()
    );
    let v = decide(&agent, "GET", path, b"");
    assert_eq!(v.reason(), "no rule of this gate covers this method and path");
    // Not a rule's route at all, for anyone: default deny.
    let v =
        decide(&driver("team-a", "x"), "POST", "/LMEvalJobUpdateService/DeleteEverything", &job_status("x", "team-a"));
    assert_eq!(
        (v.allowed_by.clone(), v.reason()),
        (None, "no rule of this gate covers this method and path".to_string())
    );
}

#[test]
fn a_gate_file_reports_every_problem_at_once() {
    let bad = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: broken}
spec:
  tokenReview: {}
  liveOwners:
    - {apiVersion: trustyai.opendatahub.io/v1alpha1, kind: lmevaljob}
    - {apiVersion: batch/v1, kind: Job}
    - {apiVersion: example.io/v1, kind: JOB}
  rules:
    - name: both routes
      http: {path: /a}
      grpc: {service: S}
      callers: {serviceAccounts: [{namespace: a, name: b}]}
    - name: nobody
      http: {methods: [get], path: "/a/{x}/{x}"}
      callers: {}
      when:
        - {caller: kind, equals: {grpcField: 0}}
    - name: certificates without a trust domain
      grpc: {service: S}
      callers: {workloads: {}}
      when:
        - {caller: name, equals: {pathSegment: job}}
        - {caller: name, equals: {grpcField: 0}}
    - name: wrong operands
      http: {path: "/jobs/{name}"}
      callers: {serviceAccounts: [{namespace: a, name: b}]}
      when:
        - {caller: name, equals: {pathSegment: job}}
        - {caller: name, equals: {pathSegment: name}}
        - {caller: name, equals: {grpcField: 1}}
        - {caller: name, equals: {header: "x job"}}
"#;
    let problems = load("bad.yaml", bad).unwrap_err();
    assert_eq!(
        problems,
        [
            "bad.yaml: spec.liveOwners[0].kind \"lmevaljob\" is not a Kubernetes kind (as the API names it: LMEvalJob)",
            "bad.yaml: spec.liveOwners[2]: another entry watches kind \"job\"; an identity names its owner's kind in lower case, without a group, so give each kind once",
            "bad.yaml: spec.liveOwners watches the owners of workload identities, which need spec.trustDomain",
            "bad.yaml: spec.rules[0] (\"both routes\"): give exactly one of http and grpc",
            "bad.yaml: spec.rules[1] (\"nobody\").http.methods: \"get\" is not an HTTP method in upper case",
            "bad.yaml: spec.rules[1] (\"nobody\").http.path: path pattern \"/a/{x}/{x}\" captures {x} twice",
            "bad.yaml: spec.rules[1] (\"nobody\").callers admits no one: list workloads (client certificates) or serviceAccounts (tokens)",
            "bad.yaml: spec.rules[1] (\"nobody\").when[0]: grpcField 0 is not a protobuf field number (1 to 536870911)",
            "bad.yaml: spec.rules[1] (\"nobody\").when[0]: caller kind is a workload's; this rule admits only service accounts",
            "bad.yaml: spec.rules[2] (\"certificates without a trust domain\").callers.workloads needs spec.trustDomain: the gate accepts workload identities of one trust domain",
            "bad.yaml: spec.rules[2] (\"certificates without a trust domain\").when[0]: pathSegment needs an http route with a path pattern",
            "bad.yaml: spec.rules[2] (\"certificates without a trust domain\").when[1]: grpcField 0 is not a protobuf field number (1 to 536870911)",
            "bad.yaml: spec.rules[3] (\"wrong operands\").when[0]: path \"/jobs/{name}\" has no {job} to compare with",
            "bad.yaml: spec.rules[3] (\"wrong operands\").when[2]: grpcField 1 needs a grpc route",
            "bad.yaml: spec.rules[3] (\"wrong operands\").when[3]: header \"x job\" is not a header name",
        ]
    );
    let typo = LMEVAL.replace("callers:\n        workloads", "callers:\n        workload");
    let problems = load("typo.yaml", &typo).unwrap_err();
    assert!(
        problems[0]
            .starts_with("typo.yaml (line 16 column 9): spec.rules[0].callers.workload: unknown field `workload`"),
        "{problems:?}"
    );
    assert_eq!(
        load("two.yaml", &format!("{LMEVAL}---\n{LMEVAL}")).unwrap_err(),
        ["two.yaml: holds 2 documents; a gate file holds one (kind: Gate)"]
    );
}

/// The ODH InferenceGraph router's check (docs/research/token-endpoints.md: opendatahub-io/kserve
/// 3cf0a04, cmd/router/main.go): any token the TokenReview accepts, then a SubjectAccessReview
/// for `get` on the graph in its namespace, the caller's user only.
const ROUTER: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: inference-graph}
spec:
  # The router's TokenReview names no audience: the API server's own.
  tokenReview: {}
  rules:
    - name: callers who may get the graph
      http: {path: "/graphs/{graph}/**"}
      callers: {anyServiceAccount: true}
      subjectAccessReview:
        verb: get
        group: serving.kserve.io
        resource: inferencegraphs
        namespace: "{caller.namespace}"
        name: "{path.graph}"
"#;

#[test]
fn a_subject_access_review_is_asked_then_decides() {
    let gate = load("router.yaml", ROUTER).unwrap().gate;
    let client = Caller::ServiceAccount(ServiceAccount::parse("system:serviceaccount:team-a:client").unwrap());
    let path = "/graphs/my-graph/v1/predict";
    let request = Request { method: "POST", path, headers: &[], body: b"{}" };
    let checked = RequestPath::parse(path).unwrap();
    let review = AccessReview {
        user: "system:serviceaccount:team-a:client".into(),
        verb: "get".into(),
        group: "serving.kserve.io".into(),
        resource: "inferencegraphs".into(),
        subresource: String::new(),
        namespace: "team-a".into(),
        name: "my-graph".into(),
    };
    // Not asked yet: the verdict says what to ask.
    let v = decided(&gate, &client, &request, &checked, &|_| None);
    assert_eq!((v.allowed_by.as_deref(), v.pending.clone()), (None, vec![review.clone()]));
    // Asked: yes allows, no refuses saying what the API server would not allow.
    let v = decided(&gate, &client, &request, &checked, &|r| Some(*r == review));
    assert_eq!(v.allowed_by.as_deref(), Some("callers who may get the graph"));
    let v = decided(&gate, &client, &request, &checked, &|_| Some(false));
    assert!(v.pending.is_empty());
    assert_eq!(
        v.reason(),
        "rule \"callers who may get the graph\": the API server does not allow system:serviceaccount:team-a:client to get inferencegraphs.serving.kserve.io \"my-graph\" in namespace \"team-a\""
    );
}

#[test]
fn a_review_is_written_of_whole_references_only() {
    let bad = ROUTER
        .replace("\"{caller.namespace}\"", "\"ns-{caller.namespace}\"")
        .replace("\"{path.graph}\"", "\"{path.grpah}\"")
        .replace("verb: get", "verb: \"{nope}\"");
    assert_eq!(
        load("bad.yaml", &bad).unwrap_err(),
        [
            "bad.yaml: spec.rules[0] (\"callers who may get the graph\").subjectAccessReview.verb: \"{nope}\" is not a reference; use {caller.namespace}, {caller.name}, {path.NAME}, {header.NAME}, {grpc.N} or {json.FIELD}",
            "bad.yaml: spec.rules[0] (\"callers who may get the graph\").subjectAccessReview.namespace: \"ns-{caller.namespace}\" mixes text with a reference; a value is a literal or one whole {reference}",
            "bad.yaml: spec.rules[0] (\"callers who may get the graph\").subjectAccessReview.name: path \"/graphs/{graph}/**\" has no {grpah}",
        ]
    );
    let open = ROUTER.replace("      subjectAccessReview:", "      x-subjectAccessReview:");
    assert!(load("open.yaml", &open).unwrap_err().iter().any(|p| p.contains("unknown field `x-subjectAccessReview`")));
    let no_review = ROUTER.split("      subjectAccessReview:").next().unwrap().to_string();
    assert_eq!(
        load("open.yaml", &no_review).unwrap_err(),
        ["open.yaml: spec.rules[0] (\"callers who may get the graph\").callers.anyServiceAccount admits every account in the cluster; give the rule a subjectAccessReview, or list serviceAccounts"]
    );
}

#[test]
fn the_headers_the_upstream_trusts_are_stripped_with_those_the_gate_always_strips() {
    let gate = load("lmeval.yaml", LMEVAL).unwrap().gate;
    for name in ["kubeflow-userid", "Kubeflow-UserID", "X-Remote-User", "x-forwarded-client-cert"] {
        assert!(gate.strips(name), "{name}");
    }
    assert!(!gate.strips("authorization") && !gate.strips("content-type"));
    let bad = LMEVAL.replace("stripHeaders: [kubeflow-userid]", "stripHeaders: [\"bad header\"]");
    assert_eq!(
        load("bad.yaml", &bad).unwrap_err(),
        ["bad.yaml: spec.stripHeaders: \"bad header\" is not a header name"]
    );
}

#[test]
fn tokens_are_accepted_only_with_a_token_review_and_its_audiences_are_words() {
    let gate = load("lmeval.yaml", LMEVAL).unwrap().gate;
    assert_eq!(gate.token_audiences(), Some(&["pipelines.kubeflow.org".to_string()][..]));
    assert_eq!(load("router.yaml", ROUTER).unwrap().gate.token_audiences(), Some(&[][..]));
    let without = LMEVAL.replace("  tokenReview: {audiences: [pipelines.kubeflow.org]}\n", "");
    assert_eq!(
        load("lmeval.yaml", &without).unwrap_err(),
        ["lmeval.yaml: spec.rules[1] (\"agents report runs in their namespace\").callers admits service accounts, whose tokens the gate checks only with spec.tokenReview: add it (with the audiences the tokens are bound to)"]
    );
    let bad = LMEVAL.replace("[pipelines.kubeflow.org]", "[\"\", \"two words\"]");
    assert_eq!(
        load("lmeval.yaml", &bad).unwrap_err(),
        [
            "lmeval.yaml: spec.tokenReview.audiences: \"\" is not an audience (a non-empty word, as in a projected token's audience)",
            "lmeval.yaml: spec.tokenReview.audiences: \"two words\" is not an audience (a non-empty word, as in a projected token's audience)",
        ]
    );
}

#[test]
fn live_owners_are_found_by_the_kind_an_identity_names_and_need_the_api_server() {
    let file = |owners: &str| {
        format!(
            "apiVersion: keyward.io/v1alpha1\nkind: Gate\nmetadata: {{name: g}}\nspec:\n  trustDomain: cluster.local\n{owners}  rules:\n    - name: drivers\n      grpc: {{service: LMEvalJobUpdateService}}\n      callers: {{workloads: {{kinds: [lmevaljob]}}}}\n"
        )
    };
    let plain = load("plain.yaml", &file("")).unwrap().gate;
    assert!(plain.live_owners().is_empty());
    assert_eq!(plain.live_owner("lmevaljob"), None);
    assert!(!plain.asks_api_server(), "certificates and plain rules need no API server");

    let owners = "  liveOwners:\n    - {apiVersion: foundation-model-stack.github.com.github.com/v1beta1, kind: LMEvalJob}\n    - {apiVersion: ray.io/v1, kind: RayJob, plural: rayjobs}\n";
    let gate = load("owners.yaml", &file(owners)).unwrap().gate;
    assert!(gate.asks_api_server(), "the owners are watched through the API server");
    let kinds: Vec<String> = gate.live_owners().iter().map(|o| o.describe()).collect();
    assert_eq!(kinds, ["LMEvalJob (foundation-model-stack.github.com.github.com/v1beta1)", "RayJob (ray.io/v1)"]);
    assert_eq!(gate.live_owner("lmevaljob").map(|o| o.kind.as_str()), Some("LMEvalJob"));
    assert_eq!(gate.live_owner("rayjob").and_then(|o| o.plural.as_deref()), Some("rayjobs"));
    assert_eq!(gate.live_owner("raycluster"), None, "a kind not listed is not watched");
}

#[test]
fn the_body_is_held_back_only_for_a_route_whose_rule_reads_a_grpc_field() {
    let gate = load("lmeval.yaml", LMEVAL).unwrap().gate;
    let job = driver("team-a", "evaljob-sample");
    let reads = |method: &str, path: &str| gate.reads_body(&job, method, &RequestPath::parse(path).unwrap());
    assert!(reads("POST", "/LMEvalJobUpdateService/UpdateStatus"));
    // A caller no rule that reads the message admits is decided without it: it never holds the
    // gate's memory with a message that cannot be allowed.
    let update = RequestPath::parse("/LMEvalJobUpdateService/UpdateStatus").unwrap();
    let agent = Caller::ServiceAccount(
        ServiceAccount::parse("system:serviceaccount:kubeflow:ml-pipeline-persistenceagent").unwrap(),
    );
    assert!(!gate.reads_body(&agent, "POST", &update));
    assert!(!gate.reads_body(&Caller::Anonymous, "POST", &update));
    assert!(!reads("GET", "/LMEvalJobUpdateService/UpdateStatus"), "gRPC is POST");
    assert!(!reads("POST", "/LMEvalJobUpdateService/Other"));
    assert!(!reads("POST", "/apis/v1/namespaces/team-a/runs/r1/report"), "an HTTP rule without a field");
    let by_review = ROUTER.replace("\"{path.graph}\"", "\"{header.x-graph}\"");
    let gate = load("router.yaml", &by_review).unwrap().gate;
    let user = Caller::ServiceAccount(ServiceAccount::parse("system:serviceaccount:team-a:client").unwrap());
    assert!(!gate.reads_body(&user, "POST", &RequestPath::parse("/graphs/g/x").unwrap()));
}

/// A workload's review, filled from every kind of reference: the caller's fields, a header and
/// a gRPC field of the message.
const REVIEWED_GRPC: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: reviewed}
spec:
  trustDomain: cluster.local
  rules:
    - name: drivers the API server lets update their job
      grpc: {service: LMEvalJobUpdateService, methods: [UpdateStatus]}
      callers: {workloads: {kinds: [lmevaljob]}}
      subjectAccessReview:
        verb: "{caller.kind}"
        group: trustyai.opendatahub.io
        resource: "{header.x-resource}"
        subresource: status
        namespace: "{grpc.2}"
        name: "{caller.name}"
"#;

#[test]
fn a_review_is_filled_from_the_caller_a_header_and_the_message() {
    let gate = load("reviewed.yaml", REVIEWED_GRPC).unwrap().gate;
    let headers = [("X-Resource", "lmevaljobs")];
    let body = job_status("job-1", "team-a");
    let request = Request { method: "POST", path: UPDATE, headers: &headers, body: &body };
    let v = decided(&gate, &driver("team-b", "job-1"), &request, &RequestPath::parse(UPDATE).unwrap(), &|_| None);
    assert_eq!(
        v.pending,
        [AccessReview {
            user: "spiffe://cluster.local/ns/team-b/lmevaljob/job-1".into(),
            verb: "lmevaljob".into(),
            group: "trustyai.opendatahub.io".into(),
            resource: "lmevaljobs".into(),
            subresource: "status".into(),
            namespace: "team-a".into(),
            name: "job-1".into(),
        }]
    );
    assert!(gate.asks_api_server(), "a rule's review asks the API server, with no tokenReview");
    let caller = driver("team-a", "job-1");
    assert!(gate.reads_body(&caller, "POST", &RequestPath::parse(UPDATE).unwrap()), "{{grpc.2}} reads the message");
}

#[test]
fn a_reference_names_a_source_the_route_has_and_a_field_number_protobuf_allows() {
    let with =
        |field: &str, value: &str| REVIEWED_GRPC.replace("name: \"{caller.name}\"", &format!("{field}: \"{value}\""));
    let problem = |value: &str| load("r.yaml", &with("name", value)).err().map(|e| e.join("\n"));
    let prefix = "r.yaml: spec.rules[0] (\"drivers the API server lets update their job\").subjectAccessReview.name: ";
    // The highest field number protobuf allows, and one past it; zero; not a number.
    assert_eq!(problem("{grpc.536870911}"), None);
    for bad in ["{grpc.536870912}", "{grpc.0}", "{grpc.x}", "{grpc}"] {
        assert_eq!(problem(bad), Some(format!("{prefix}\"{bad}\": {{grpc.N}} takes a protobuf field number")), "{bad}");
    }
    for bad in ["{path.}", "{header.}", "{caller.uid}"] {
        assert_eq!(
            problem(bad),
            Some(format!("{prefix}\"{bad}\" is not a reference; use {{caller.namespace}}, {{caller.name}}, {{path.NAME}}, {{header.NAME}}, {{grpc.N}} or {{json.FIELD}}")),
            "{bad}"
        );
    }
    // A path segment on a gRPC route, a gRPC field on an HTTP one.
    assert_eq!(problem("{path.job}"), Some(format!("{prefix}{{path.…}} needs an http route")));
    let on_http = ROUTER.replace("\"{path.graph}\"", "\"{grpc.1}\"");
    assert_eq!(
        load("h.yaml", &on_http).unwrap_err(),
        ["h.yaml: spec.rules[0] (\"callers who may get the graph\").subjectAccessReview.name: {grpc.…} needs a grpc route"]
    );
}

#[test]
fn a_listed_service_account_is_matched_by_namespace_and_name_together() {
    let path = "/apis/v1/namespaces/kubeflow/runs/r-1/report";
    for other in ["kubeflow:someone-else", "team-a:ml-pipeline-persistenceagent"] {
        let account = Caller::ServiceAccount(ServiceAccount::parse(&format!("system:serviceaccount:{other}")).unwrap());
        let v = decide(&account, "POST", &path.replace("kubeflow", other.split(':').next().unwrap()), b"{}");
        assert_eq!(v.allowed_by, None, "{other}");
    }
    let gate = load("lmeval.yaml", LMEVAL).unwrap().gate;
    assert!(gate.asks_api_server(), "tokens to review");
    // The driver's rule alone: workloads only, no tokens, no review.
    let without_tokens = LMEVAL.replace("  tokenReview: {audiences: [pipelines.kubeflow.org]}\n", "");
    let workloads_only = without_tokens.split("    - name: agents").next().unwrap();
    let no_tokens = load("w.yaml", workloads_only).unwrap().gate;
    assert!(!no_tokens.asks_api_server(), "workloads only, no review");
}

/// KFP's v2 driver and launcher call the cache methods with no credential, and KFP serves them
/// without authentication (kubeflow/pipelines 7b70c7b, backend/src/v2/cacheutils/cache.go and
/// backend/src/apiserver/server/task_server.go): a rule may be open to anonymous callers, on
/// those named methods only.
const KFP: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: kfp-api}
spec:
  tokenReview: {audiences: [pipelines.kubeflow.org]}
  rules:
    - name: the agent reports workflows
      grpc: {service: api.ReportService, methods: [ReportWorkflowV1]}
      callers: {serviceAccounts: [{namespace: kubeflow, name: ml-pipeline-persistenceagent}]}
    - name: cache lookups
      grpc: {service: api.TaskService, methods: [ListTasksV1, CreateTaskV1]}
      callers: {anonymous: true}
"#;

#[test]
fn an_anonymous_rule_admits_every_caller_on_its_named_methods_only() {
    let gate = load("kfp.yaml", KFP).unwrap().gate;
    assert!(gate.admits_anonymous() && gate.admits_without_certificate());
    let ask = |caller: &Caller, path: &str| {
        let request = Request { method: "POST", path, headers: &[], body: &[] };
        decided(&gate, caller, &request, &RequestPath::parse(path).unwrap(), &|_| None)
    };
    let agent = Caller::ServiceAccount(
        ServiceAccount::parse("system:serviceaccount:kubeflow:ml-pipeline-persistenceagent").unwrap(),
    );
    for caller in [Caller::Anonymous, agent.clone(), driver("team-a", "job")] {
        let verdict = ask(&caller, "/api.TaskService/ListTasksV1");
        assert_eq!(verdict.allowed_by.as_deref(), Some("cache lookups"), "{caller:?}");
    }
    let verdict = ask(&Caller::Anonymous, "/api.TaskService/DeleteTaskV1");
    assert_eq!(verdict.reason(), "no rule of this gate covers this method and path");
    let verdict = ask(&Caller::Anonymous, "/api.ReportService/ReportWorkflowV1");
    assert_eq!(
        verdict.reason(),
        "rule \"the agent reports workflows\": it does not admit an anonymous caller (no client certificate, no bearer token)"
    );
    assert_eq!(
        ask(&agent, "/api.ReportService/ReportWorkflowV1").allowed_by.as_deref(),
        Some("the agent reports workflows")
    );
}

#[test]
fn an_anonymous_rule_is_alone_on_a_named_route_and_never_reads_an_identity() {
    let file = |rule: &str| {
        format!("apiVersion: keyward.io/v1alpha1\nkind: Gate\nmetadata: {{name: g}}\nspec:\n  trustDomain: cluster.local\n  tokenReview: {{}}\n  rules:\n    - name: r\n{rule}")
    };
    let problems = |rule: &str| load("g.yaml", &file(rule)).unwrap_err();
    assert_eq!(
        problems("      grpc: {service: api.TaskService}\n      callers: {anonymous: true, serviceAccounts: [{namespace: a, name: b}]}\n      when: [{caller: namespace, equals: {value: a}}]\n"),
        [
            "g.yaml: spec.rules[0] (\"r\").callers.anonymous admits every caller, so listing workloads or serviceAccounts beside it means nothing: give them a rule of their own",
            "g.yaml: spec.rules[0] (\"r\").when compares the caller's identity, which an anonymous caller does not have: an anonymous rule has no conditions",
            "g.yaml: spec.rules[0] (\"r\").callers.anonymous needs a named route: list the gRPC methods the upstream serves without authentication",
        ]
    );
    assert_eq!(
        problems("      http: {methods: [GET], path: /apis/**}\n      callers: {anonymous: true}\n      subjectAccessReview: {verb: get, resource: runs}\n"),
        [
            "g.yaml: spec.rules[0] (\"r\").subjectAccessReview asks about the caller, whom an anonymous caller does not name: an anonymous rule has no review",
            "g.yaml: spec.rules[0] (\"r\").callers.anonymous needs a named route: list the HTTP methods, and a path without '**'",
        ]
    );
    assert_eq!(
        problems("      http: {path: /apis/v1beta1/healthz}\n      callers: {anonymous: true}\n"),
        ["g.yaml: spec.rules[0] (\"r\").callers.anonymous needs a named route: list the HTTP methods, and a path without '**'"]
    );
    assert!(load(
        "g.yaml",
        &file("      http: {methods: [GET], path: /apis/v1beta1/healthz}\n      callers: {anonymous: true}\n")
    )
    .is_ok());
    // anyUser beside it too, as each of the other callers.
    for callers in ["anyUser: true", "anyServiceAccount: true", "workloads: {}"] {
        let rule = format!("      grpc: {{service: api.TaskService, methods: [ListTasksV1]}}\n      callers: {{anonymous: true, {callers}}}\n");
        let problems = problems(&rule);
        assert!(problems[0].contains("callers.anonymous admits every caller, so listing"), "{callers}: {problems:?}");
    }
}

#[test]
fn the_summary_says_which_rules_a_caller_without_a_certificate_can_reach() {
    let lmeval = load("lmeval.yaml", LMEVAL).unwrap().gate;
    assert_eq!(
        lmeval.summary(),
        [
            "rule \"a driver updates only its own job\": gRPC LMEvalJobUpdateService/UpdateStatus; callers: workloads (lmevaljob, any namespace) by client certificate; over TLS only (a client certificate)",
            "rule \"agents report runs in their namespace\": POST /apis/v1/namespaces/{namespace}/runs/{run}/report; callers: service accounts kubeflow/ml-pipeline-persistenceagent by token; over TLS and over --listen-plaintext",
        ]
    );
    let any_method = KFP
        .replace("methods: [ListTasksV1, CreateTaskV1]", "methods: []")
        .replace("anonymous: true", "serviceAccounts: [{namespace: a, name: b}]");
    assert_eq!(
        load("any.yaml", &any_method).unwrap().gate.summary()[1],
        "rule \"cache lookups\": gRPC api.TaskService/*; callers: service accounts a/b by token; over TLS and over --listen-plaintext"
    );
    let kfp = load("kfp.yaml", KFP).unwrap().gate;
    assert_eq!(
        kfp.summary()[1],
        "rule \"cache lookups\": gRPC api.TaskService/ListTasksV1|CreateTaskV1; callers: anyone, with no credential (anonymous); over TLS and over --listen-plaintext"
    );
    assert!(!lmeval.admits_anonymous());
    let certificates_only = LMEVAL.split("    - name: agents").next().unwrap();
    assert!(!load("only.yaml", certificates_only).unwrap().gate.admits_without_certificate());
    // Only a gate that admits workloads needs the client CA (the sidecar's is optional).
    assert!(lmeval.admits_workloads());
    assert!(!kfp.admits_workloads(), "tokens and anonymous callers only");
}

#[test]
fn any_user_means_every_authenticated_caller_and_needs_a_review_and_tokens() {
    let file = |extra: &str, review: bool| {
        let review = if review {
            "      subjectAccessReview: {verb: get, group: serving.kserve.io, resource: inferencegraphs, namespace: team-a, name: g}\n"
        } else {
            ""
        };
        format!("apiVersion: keyward.io/v1alpha1\nkind: Gate\nmetadata: {{name: g}}\nspec:\n{extra}  rules:\n    - name: r\n      http: {{path: /**}}\n      callers: {{anyUser: true}}\n{review}")
    };
    assert_eq!(
        load("g.yaml", &file("", false)).unwrap_err(),
        [
            "g.yaml: spec.rules[0] (\"r\").callers.anyUser admits everyone the cluster authenticates; give the rule a subjectAccessReview",
            "g.yaml: spec.rules[0] (\"r\").callers admits service accounts, whose tokens the gate checks only with spec.tokenReview: add it (with the audiences the tokens are bound to)",
        ]
    );
    let gate = load("g.yaml", &file("  tokenReview: {}\n", true)).unwrap().gate;
    let request = Request { method: "POST", path: "/v1/models/x:predict", headers: &[], body: &[] };
    let path = RequestPath::parse(request.path).unwrap();
    let alice = Caller::User(keyward_gate::identity::UserName::parse("alice").unwrap());
    let runner = Caller::ServiceAccount(ServiceAccount::parse("system:serviceaccount:team-a:runner").unwrap());
    for (caller, user) in [(&alice, "alice"), (&runner, "system:serviceaccount:team-a:runner")] {
        let verdict = decided(&gate, caller, &request, &path, &|_| None);
        assert_eq!(verdict.pending.len(), 1, "{caller:?}");
        assert_eq!(verdict.pending[0].user, user);
        let allowed = decided(&gate, caller, &request, &path, &|r| Some(r.user == "alice"));
        assert_eq!(allowed.allowed_by.is_some(), user == "alice");
    }
    let verdict = decided(&gate, &driver("team-a", "j"), &request, &path, &|_| Some(true));
    assert_eq!(verdict.reason(), "rule \"r\": it does not admit workload spiffe://cluster.local/ns/team-a/lmevaljob/j");
    assert_eq!(
        gate.summary(),
        ["rule \"r\": any method /**; callers: any user by token; over TLS and over --listen-plaintext"]
    );
}

#[test]
fn the_headers_a_rule_reads_and_the_callers_whose_token_passes_are_known() {
    let reviewed = load("reviewed.yaml", REVIEWED_GRPC).unwrap().gate;
    assert!(reviewed.reads_header("x-resource") && reviewed.reads_header("X_Resource"), "{{header.x-resource}}");
    assert!(!reviewed.reads_header("x-other"));
    let gate = load("lmeval.yaml", LMEVAL).unwrap().gate;
    assert!(!gate.reads_header("x-resource"));
    assert!(gate.strips("kubeflow_userid") && gate.strips("X_Remote_User"), "compared as the upstream reads names");
    let by_header = LMEVAL
        .replace("equals: {pathSegment: namespace}", "equals: {header: x-tenant}")
        .replace("path: /apis/v1/namespaces/{namespace}/runs/{run}/report", "path: /apis/v1/runs/{run}/report");
    let gate = load("by-header.yaml", &by_header).unwrap().gate;
    assert!(gate.reads_header("X-Tenant"));
    assert!(!gate.forwards_authorization("a driver updates only its own job"));
    let forwarding = LMEVAL.replace(
        "    - name: a driver updates only its own job\n",
        "    - name: a driver updates only its own job\n      forwardAuthorization: true\n",
    );
    let gate = load("forwarding.yaml", &forwarding).unwrap().gate;
    assert!(gate.forwards_authorization("a driver updates only its own job"));
    assert!(!gate.forwards_authorization("agents report runs in their namespace"));
    assert!(!gate.forwards_authorization("no such rule"));
}

// === EvalHub's status events: a pod-bound token's pod, a JSON body, a request condition ===

fn evalhub() -> Gate {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/recipes/evalhub-status.yaml")).unwrap();
    load("evalhub-status.yaml", &text).unwrap().gate
}

/// The evaluation pod of `job` as the gate's watch keeps it (eval-hub ba127125 job_builders.go).
fn evaluation_pod(namespace: &str, job: &str, benchmark: &str, index: &str) -> Caller {
    use keyward_gate::identity::{PodCaller, PodFacts};
    let pod = PodFacts {
        name: format!("{job}-5f0c-x2x9q"),
        uid: "u-1".into(),
        labels: [("benchmark_index".to_string(), index.to_string())].into(),
        annotations: [
            ("eval-hub.github.io/job_id".to_string(), job.to_string()),
            ("eval-hub.github.io/provider_id".to_string(), "lm_evaluation_harness".to_string()),
            ("eval-hub.github.io/benchmark_id".to_string(), benchmark.to_string()),
        ]
        .into(),
        owner: None,
    };
    let account = ServiceAccount::parse(&format!("system:serviceaccount:{namespace}:evalhub-evalhub-job")).unwrap();
    Caller::Pod(PodCaller { account, pod_name: pod.name.clone(), pod: Ok(std::sync::Arc::new(pod)) })
}

fn post_event(gate: &Gate, caller: &Caller, job: &str, headers: &[(&str, &str)], body: &str) -> Verdict {
    let path = format!("/api/v1/evaluations/jobs/{job}/events");
    let request = Request { method: "POST", path: &path, headers, body: body.as_bytes() };
    // The API server allows every job account to create status-events in its own namespace.
    gate.decide(caller, &request, &RequestPath::parse(&path).unwrap(), &|r| Some(r.resource == "status-events"))
}

const JSON_TENANT_A: &[(&str, &str)] = &[("Content-Type", "application/json"), ("X-Tenant", "tenant-a")];

fn event(benchmark: &str, index: &str, status: &str) -> String {
    format!(
        r#"{{"benchmark_status_event": {{"provider_id": "lm_evaluation_harness", "id": "{benchmark}", "benchmark_index": {index}, "status": "{status}"}}}}"#
    )
}

#[test]
fn an_evaluation_pod_posts_events_of_its_own_job_and_benchmark_only() {
    let gate = evalhub();
    let pod = evaluation_pod("tenant-a", "job-a", "arc_easy", "0");
    let own = post_event(&gate, &pod, "job-a", JSON_TENANT_A, &event("arc_easy", "0", "running"));
    assert_eq!(own.allowed_by.as_deref(), Some("an evaluation pod posts its own job's events"), "{own:?}");
    let refused = |v: Verdict, why: &str| {
        assert_eq!(v.allowed_by, None);
        let reason = v.reason();
        assert!(
            reason.starts_with(&format!("rule \"an evaluation pod posts its own job's events\": {why}")),
            "{reason}"
        );
    };
    refused(
        post_event(&gate, &pod, "job-b", JSON_TENANT_A, &event("arc_easy", "0", "running")),
        "the caller's pod's annotation eval-hub.github.io/job_id is \"job-a\", and path segment {id} is \"job-b\"",
    );
    refused(
        post_event(
            &gate,
            &pod,
            "job-a",
            &[("Content-Type", "application/json"), ("X-Tenant", "tenant-b")],
            &event("arc_easy", "0", "running"),
        ),
        "the caller's namespace is \"tenant-a\", and header X-Tenant is \"tenant-b\"",
    );
    refused(
        post_event(&gate, &pod, "job-a", &[("Content-Type", "application/json")], &event("arc_easy", "0", "running")),
        "the caller's namespace is \"tenant-a\", and header X-Tenant is absent",
    );
    refused(
        post_event(&gate, &pod, "job-a", JSON_TENANT_A, &event("hellaswag", "0", "running")),
        "the caller's pod's annotation eval-hub.github.io/benchmark_id is \"arc_easy\", and JSON field benchmark_status_event.id is \"hellaswag\"",
    );
    refused(
        post_event(&gate, &pod, "job-a", JSON_TENANT_A, &event("arc_easy", "0.0", "running")),
        "JSON field benchmark_status_event.benchmark_index is a number with a fraction or an exponent; a rule compares strings and whole numbers",
    );
    refused(
        post_event(
            &gate,
            &pod,
            "job-a",
            &[("Content-Type", "text/plain"), ("X-Tenant", "tenant-a")],
            &event("arc_easy", "0", "running"),
        ),
        "a rule reads a JSON field of this request, and its Content-Type is \"text/plain\": send application/json",
    );
    refused(
        post_event(
            &gate,
            &pod,
            "job-a",
            &[("Content-Type", "application/json"), ("Content-Encoding", "gzip"), ("X-Tenant", "tenant-a")],
            &event("arc_easy", "0", "running"),
        ),
        "the request body is encoded (\"gzip\")",
    );
    // Another tenant's pod, with all of its own facts right, still posts only in its namespace.
    let other = evaluation_pod("tenant-b", "job-a", "arc_easy", "0");
    refused(
        post_event(&gate, &other, "job-a", JSON_TENANT_A, &event("arc_easy", "0", "running")),
        "the caller's namespace is \"tenant-b\", and header X-Tenant is \"tenant-a\"",
    );
}

#[test]
fn a_token_without_a_pod_has_no_pod_facts_and_the_refusal_says_so() {
    let gate = evalhub();
    let account =
        Caller::ServiceAccount(ServiceAccount::parse("system:serviceaccount:tenant-a:evalhub-evalhub-job").unwrap());
    let v = post_event(&gate, &account, "job-a", JSON_TENANT_A, &event("arc_easy", "0", "running"));
    assert_eq!(v.allowed_by, None);
    assert!(v.reason().contains("the caller has no pod (service account system:serviceaccount:tenant-a:evalhub-evalhub-job: its token is bound to no pod, as a token from `kubectl create token` or a Secret is not), so no pod's annotation eval-hub.github.io/job_id"), "{}", v.reason());
    // A pod-bound token whose pod the gate does not know (deleted): the watch's reason.
    let unknown = Caller::Pod(keyward_gate::identity::PodCaller {
        account: ServiceAccount::parse("system:serviceaccount:tenant-a:evalhub-evalhub-job").unwrap(),
        pod_name: "gone".into(),
        pod: Err("the token is bound to pod tenant-a/gone, which does not exist".into()),
    });
    let v = post_event(&gate, &unknown, "job-a", JSON_TENANT_A, &event("arc_easy", "0", "running"));
    assert!(v.reason().contains("the gate knows nothing of the caller's pod, so no pod's annotation eval-hub.github.io/job_id: the token is bound to pod tenant-a/gone, which does not exist"), "{}", v.reason());
}

#[test]
fn the_operator_posts_failed_events_only() {
    let gate = evalhub();
    let operator = Caller::ServiceAccount(
        ServiceAccount::parse("system:serviceaccount:opendatahub:trustyai-service-operator-controller-manager")
            .unwrap(),
    );
    // evaluation_job_failure_reconciler.go: status failed, benchmark_index omitted when 0.
    let failed = r#"{"benchmark_status_event":{"provider_id":"lm_evaluation_harness","id":"arc_easy","status":"failed","error_message":{"message":"OOMKilled","message_code":"RUNTIME_FAILURE"}}}"#;
    let v = post_event(&gate, &operator, "job-a", JSON_TENANT_A, failed);
    assert_eq!(v.allowed_by.as_deref(), Some("the operator reports a job's failure"), "{v:?}");
    let v = post_event(&gate, &operator, "job-a", JSON_TENANT_A, &event("arc_easy", "0", "completed"));
    assert_eq!(v.allowed_by, None);
    assert!(v.reason().contains("rule \"the operator reports a job's failure\": JSON field benchmark_status_event.status is \"completed\", and the rule's value is \"failed\""), "{}", v.reason());
    // An evaluation pod is not the operator, whatever it posts.
    let pod = evaluation_pod("tenant-a", "job-a", "arc_easy", "0");
    let v = post_event(&gate, &pod, "job-b", JSON_TENANT_A, failed);
    assert_eq!(v.allowed_by, None);
}

#[test]
fn pod_facts_json_fields_and_request_conditions_are_checked_at_load() {
    let file =
        |spec: &str| format!("apiVersion: keyward.io/v1alpha1\nkind: Gate\nmetadata: {{name: g}}\nspec:\n{spec}");
    let problems = |spec: &str| load("g.yaml", &file(spec)).err().unwrap_or_default();
    let rule = |token_review: &str, when: &str| {
        format!("  {token_review}\n  rules:\n    - name: r\n      http: {{methods: [POST], path: \"/jobs/{{id}}\"}}\n      callers: {{serviceAccounts: [{{namespace: a, name: b}}]}}\n      when:\n{when}")
    };
    assert_eq!(
        problems(&rule("tokenReview: {}", "        - {caller: {podLabel: job_id}, equals: {pathSegment: id}}\n")),
        ["g.yaml: spec.rules[0] (\"r\").when[0]: caller pod's label job_id reads the caller's pod, which needs spec.tokenReview.pods (the pods the gate watches, by label selector)"]
    );
    let pods = "tokenReview: {pods: {labelSelector: app=evalhub}}";
    assert_eq!(
        problems(&rule(pods, "        - {caller: {podLabel: job_id}, equals: {pathSegment: id}}\n")),
        Vec::<String>::new()
    );
    assert_eq!(
        problems(&rule(pods, "        - {caller: {podAnnotation: \"bad key!\"}, equals: {pathSegment: id}}\n")),
        ["g.yaml: spec.rules[0] (\"r\").when[0]: \"bad key!\" is not a label or annotation key (as app.kubernetes.io/name)"]
    );
    for (selector, fine) in [
        ("app=evalhub,component=evaluation-job", true),
        ("!gone,x!=y,z==w", true),
        ("", false),
        ("app in (a,b)", false),
        ("a=b=c", false),
    ] {
        let spec = rule(
            &format!("tokenReview: {{pods: {{labelSelector: \"{selector}\"}}}}"),
            "        - {caller: namespace, equals: {value: a}}\n",
        );
        assert_eq!(problems(&spec).is_empty(), fine, "{selector:?}: {:?}", problems(&spec));
    }
    assert_eq!(
        problems(&rule("tokenReview: {}", "        - {request: {jsonField: a.b}, equals: {pathSegment: id}}\n        - {caller: name, request: {header: X}, equals: {value: v}}\n        - {equals: {value: v}}\n        - {request: {jsonField: a..b}, equals: {value: v}}\n")),
        [
            "g.yaml: spec.rules[0] (\"r\").when[0]: a request condition compares the request's value with a fixed one: equals {value: …}",
            "g.yaml: spec.rules[0] (\"r\").when[1]: give exactly one of caller and request",
            "g.yaml: spec.rules[0] (\"r\").when[2]: give exactly one of caller and request",
            "g.yaml: spec.rules[0] (\"r\").when[3]: JSON field \"a..b\" is not a dotted path of object keys (as status.benchmark_index)",
        ]
    );
    let grpc = "  tokenReview: {}\n  rules:\n    - name: r\n      grpc: {service: S, methods: [M]}\n      callers: {serviceAccounts: [{namespace: a, name: b}]}\n      when:\n        - {caller: name, equals: {jsonField: a}}\n";
    assert_eq!(
        problems(grpc),
        ["g.yaml: spec.rules[0] (\"r\").when[0]: jsonField \"a\" needs an http route (a JSON body)"]
    );
}

#[test]
fn the_body_is_held_for_a_json_field_and_the_user_header_is_stripped_and_named() {
    let gate = evalhub();
    let pod = evaluation_pod("tenant-a", "job-a", "arc_easy", "0");
    assert!(gate.reads_body(&pod, "POST", &RequestPath::parse("/api/v1/evaluations/jobs/job-a/events").unwrap()));
    assert!(!gate.reads_body(&pod, "GET", &RequestPath::parse("/api/v1/evaluations/jobs/job-a/events").unwrap()));
    assert!(gate.strips("X-User") && gate.strips("x_user"), "a client's X-User never reaches EvalHub");
    assert_eq!(gate.user_headers(), ["X-User"]);
    assert_eq!(gate.pods().map(|p| p.label_selector.as_str()), Some("app=evalhub,component=evaluation-job"));
    let (labels, annotations) = gate.pod_keys();
    assert_eq!(labels, ["benchmark_index"]);
    assert_eq!(
        annotations,
        ["eval-hub.github.io/job_id", "eval-hub.github.io/provider_id", "eval-hub.github.io/benchmark_id"]
    );
}

#[test]
fn a_missing_fact_is_explained_by_who_the_caller_is() {
    let text = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: g}
spec:
  trustDomain: cluster.local
  tokenReview: {pods: {labelSelector: app=x}}
  rules:
    - name: by label
      http: {methods: [POST], path: "/jobs/{id}"}
      callers: {anyServiceAccount: true, workloads: {}}
      when:
        - {caller: {podLabel: job}, equals: {pathSegment: id}}
        - {caller: {podLabel: job}, equals: {header: X-Job}}
        - {caller: {podAnnotation: a}, equals: {header: X-Job}}
        - {caller: {podAnnotation: a}, equals: {pathSegment: id}}
      subjectAccessReview: {verb: create, resource: jobs, name: "{json.job.name}"}
    - name: by kind
      http: {methods: [PUT], path: "/jobs/{id}"}
      callers: {anyServiceAccount: true, workloads: {}}
      when:
        - {caller: kind, equals: {value: job}}
      subjectAccessReview: {verb: update, resource: jobs}
"#;
    let gate = load("g.yaml", text).unwrap().gate;
    assert_eq!(gate.pod_keys(), (vec!["job".to_string()], vec!["a".to_string()]), "each key once");
    let why = |caller: &Caller, method: &str| {
        let request = Request { method, path: "/jobs/a", headers: &[], body: b"" };
        gate.decide(caller, &request, &RequestPath::parse("/jobs/a").unwrap(), &|_| Some(true)).reason()
    };
    let account = ServiceAccount::parse("system:serviceaccount:t:a").unwrap();
    let workload = driver("t", "j");
    assert_eq!(
        why(&workload, "POST"),
        "rule \"by label\": workload spiffe://cluster.local/ns/t/lmevaljob/j has no pod, so no pod's label job"
    );
    assert_eq!(
        why(&Caller::ServiceAccount(account.clone()), "PUT"),
        "rule \"by kind\": the caller has no kind (service account system:serviceaccount:t:a)"
    );
    let unknown =
        Caller::Pod(keyward_gate::identity::PodCaller { account, pod_name: "p".into(), pod: Err("deleted".into()) });
    assert_eq!(
        why(&unknown, "PUT"),
        "rule \"by kind\": the caller has no kind (service account system:serviceaccount:t:a (pod t/p))"
    );
    assert_eq!(
        why(&unknown, "POST"),
        "rule \"by label\": the gate knows nothing of the caller's pod, so no pod's label job: deleted"
    );
    let unlabelled = keyward_gate::identity::PodFacts { name: "p".into(), ..Default::default() };
    let known = Caller::Pod(keyward_gate::identity::PodCaller {
        account: ServiceAccount::parse("system:serviceaccount:t:a").unwrap(),
        pod_name: "p".into(),
        pod: Ok(std::sync::Arc::new(unlabelled)),
    });
    assert_eq!(why(&known, "POST"), "rule \"by label\": the caller's pod t/p has no label job");
}

#[test]
fn a_json_reference_reads_the_body_and_a_json_field_needs_json() {
    let text = r#"
apiVersion: keyward.io/v1alpha1
kind: Gate
metadata: {name: g}
spec:
  tokenReview: {}
  rules:
    - name: create in the body's namespace
      http: {methods: [POST], path: /jobs}
      callers: {anyServiceAccount: true}
      subjectAccessReview: {verb: create, resource: jobs, namespace: "{json.metadata.namespace}"}
"#;
    let gate = load("g.yaml", text).unwrap().gate;
    let caller = Caller::ServiceAccount(ServiceAccount::parse("system:serviceaccount:t:a").unwrap());
    let decide = |content_type: &str, body: &str| {
        let headers = [("Content-Type", content_type)];
        let request = Request { method: "POST", path: "/jobs", headers: &headers, body: body.as_bytes() };
        gate.decide(&caller, &request, &RequestPath::parse("/jobs").unwrap(), &|_| None)
    };
    let v = decide("application/vnd.k8s+json; charset=utf-8", r#"{"metadata": {"namespace": "t"}}"#);
    assert_eq!(v.pending.iter().map(|r| r.namespace.as_str()).collect::<Vec<_>>(), ["t"], "{v:?}");
    for (content_type, says) in [
        ("application/xml", "its Content-Type is \"application/xml\": send application/json"),
        ("text/plain+json", "its Content-Type is \"text/plain+json\""),
        ("", "its Content-Type is absent"),
    ] {
        let v = decide(content_type, r#"{"metadata": {"namespace": "t"}}"#);
        assert!(v.reason().contains(says), "{content_type}: {}", v.reason());
    }
    for bad in ["{json}", "{json.a..b}"] {
        let e = load("g.yaml", &text.replace("{json.metadata.namespace}", bad)).unwrap_err().join("\n");
        assert!(e.contains("is not a dotted path of object keys"), "{bad}: {e}");
    }
    let grpc = text.replace("http: {methods: [POST], path: /jobs}", "grpc: {service: S, methods: [M]}");
    let e = load("g.yaml", &grpc).unwrap_err().join("\n");
    assert!(e.ends_with("subjectAccessReview.namespace: {json.…} needs an http route (a JSON body)"), "{e}");
    // A gRPC field number in a condition is checked as in a reference.
    let field = |n: &str| {
        format!("apiVersion: keyward.io/v1alpha1\nkind: Gate\nmetadata: {{name: g}}\nspec:\n  tokenReview: {{}}\n  rules:\n    - name: r\n      grpc: {{service: S, methods: [M]}}\n      callers: {{serviceAccounts: [{{namespace: a, name: b}}]}}\n      when: [{{caller: name, equals: {{grpcField: {n}}}}}]\n")
    };
    assert!(load("g.yaml", &field("536870911")).is_ok());
    assert!(load("g.yaml", &field("536870912")).unwrap_err()[0]
        .ends_with("grpcField 536870912 is not a protobuf field number (1 to 536870911)"));
}

#[test]
fn in_front_of_kube_rbac_proxy_the_recipe_passes_on_only_the_paths_it_does_not_name() {
    use keyward_gate::rules::PASSED_ON;
    let gate = evalhub();
    let get = |gate: &Gate, path: &str| {
        let request = Request { method: "GET", path, headers: &[], body: b"" };
        gate.decide(&Caller::Anonymous, &request, &RequestPath::parse(path).unwrap(), &|_| None)
    };
    for path in ["/api/v1/health", "/api/v1/evaluations/jobs", "/api/v1/evaluations/jobs/job-a/events/x"] {
        assert_eq!(get(&gate, path).allowed_by.as_deref(), Some(PASSED_ON), "{path}");
    }
    let named = get(&gate, "/api/v1/evaluations/jobs/job-a/events");
    assert_eq!(
        (named.allowed_by.clone(), named.reason()),
        (None, "no rule of this gate covers this method and path".into())
    );
    let encoded = get(&gate, "/api/v1/evaluations/jobs/job-a/%65vents");
    assert_eq!(encoded.allowed_by, None);
    assert_eq!(encoded.reason(), "path \"/api/v1/evaluations/jobs/job-a/%65vents\" holds a percent-encoding, which the upstream may decode into a path this gate's rules name, and no rule names it as sent; send it unencoded");
    // Without it, as every other recipe: default deny.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/recipes/evalhub-status.yaml")).unwrap();
    let strict = load("strict.yaml", &text.replace("  unmatched: upstream\n", "")).unwrap().gate;
    assert_eq!(get(&strict, "/api/v1/health").allowed_by, None);
    // No rule may take the name passed-on requests are counted under.
    let taken = text.replace("- name: the operator reports a job's failure", "- name: \"(unmatched: upstream)\"");
    let problems = load("taken.yaml", &taken).unwrap_err().join("\n");
    assert!(problems.contains("spec.rules[1] (\"(unmatched: upstream)\"): the gate's name for requests no rule names; name the rule otherwise"), "{problems}");
}

#[test]
fn a_grpc_rule_names_every_method_of_its_service_and_no_other_service() {
    use keyward_gate::rules::Standing;
    let text = "apiVersion: keyward.io/v1alpha1\nkind: Gate\nmetadata: {name: g}\nspec:\n  trustDomain: cluster.local\n  unmatched: upstream\n  rules:\n    - name: drivers update their status\n      grpc: {service: lmeval.Status, methods: [Update]}\n      callers: {workloads: {kinds: [lmevaljob]}}\n";
    let gate = load("g.yaml", text).unwrap().gate;
    let standing = |path: &str| gate.standing(path, &RequestPath::parse(path).unwrap());
    assert_eq!(standing("/lmeval.Status/Update"), Standing::Judged);
    assert_eq!(standing("/lmeval.Status/Delete"), Standing::Judged, "another method of a named service is the rules'");
    assert_eq!(standing("/lmeval.Other/Update"), Standing::PassedOn);
    assert_eq!(standing("/lmeval.Status/Update/x"), Standing::PassedOn, "not a gRPC method's path");
}
