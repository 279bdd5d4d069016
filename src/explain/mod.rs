//! `keyward explain`: what keyward would do with a pod, and why: a Pod, an AdmissionReview,
//! or the pods a workload would create (`subjects`).

mod cluster;
mod subjects;

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::ValueEnum;
use keyward_engine::review;
use keyward_engine::{explain, Explanation, ProfileSet, RequestFacts, Requester};

use crate::kubeconfig::KubeconfigArgs;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use subjects::{Input, Subject};

/// Exit code when the pod would be refused: distinct from 1 (bad input) and 2 (bad usage).
const EXIT_DENIED: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// A readable summary.
    Text,
    /// One JSON object per pod (a list of them when there are several): subject, namespace,
    /// requester, allowed, reason, profile, message, warnings, patch, attestation, pod,
    /// auditAnnotations, injected, requires, trace (and cluster, with --cluster).
    Json,
    /// The same object as YAML.
    Yaml,
    /// A unified diff of the pod before and after.
    Diff,
}

#[derive(Debug, Clone)]
pub struct ExplainOptions {
    pub namespace: Option<String>,
    pub user: Option<String>,
    pub output: OutputFormat,
    /// `--cluster`: how to reach the cluster to read.
    pub cluster: Option<KubeconfigArgs>,
}

/// What `explain` answered: its exit code, and the profiles that selected a subject.
#[derive(Debug)]
pub struct Explained {
    pub code: ExitCode,
    pub selected_by: std::collections::BTreeSet<String>,
}

pub fn run(file: &Path, profiles: &ProfileSet, options: &ExplainOptions) -> anyhow::Result<Explained> {
    let (label, text) = read_input(file)?;
    let subjects = subjects::parse(&label, &text, options.namespace.as_deref())?;
    let cluster = match &options.cluster {
        Some(access) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let cluster = runtime.block_on(access.client())?;
            Some((runtime, cluster))
        }
        None => None,
    };
    // With the cluster at hand, `delivery: auto` as keyward's controller resolves it there.
    let resolved = match &cluster {
        Some((runtime, cluster)) => runtime.block_on(crate::profiles::resolved_by_discovery(cluster, profiles))?,
        None => None,
    };
    let profiles = resolved.as_ref().unwrap_or(profiles);
    let several = subjects.len() > 1;
    let (mut out, mut reports, mut all_allowed) = (String::new(), Vec::new(), true);
    let mut selected_by = std::collections::BTreeSet::new();
    for subject in &subjects {
        let request = match &subject.input {
            Input::Review(bytes, label) => {
                Some(review::parse_request(bytes).map_err(|e| anyhow::anyhow!("{label}: {e}"))?)
            }
            Input::Pod(_) => None,
        };
        let facts = facts(subject, request.as_ref(), options);
        let pod = pod_of(&subject.input)?;
        let explanation = explain(&facts, &pod.raw, profiles);
        let after = pod_after(&explanation, &pod.value)?;
        all_allowed &= explanation.decision.allowed();
        selected_by.extend(explanation.decision.profile.clone());
        let seen = match &cluster {
            Some((runtime, seen_in)) => {
                Some(runtime.block_on(cluster::look(seen_in, facts.namespace, &explanation))?)
            }
            None => None,
        };
        match options.output {
            OutputFormat::Json | OutputFormat::Yaml => {
                let mut report = report(&facts, &explanation, &after, profiles);
                report["subject"] = json!(subject.what);
                if let Some(seen) = &seen {
                    report["cluster"] = serde_json::to_value(seen)?;
                }
                reports.push(report);
            }
            OutputFormat::Diff => {
                if several {
                    out.push_str(&format!("# {}\n", subject.what));
                }
                out.push_str(&diff(&pod.value, &after)?);
            }
            OutputFormat::Text => {
                if several && !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&text_report(&subject.what, &facts, &explanation, profiles));
                if let Some(seen) = &seen {
                    out.push_str(&seen.text());
                }
            }
        }
    }
    // One subject: the object itself (as before several were read); several: a list of them.
    let reports = match <[Value; 1]>::try_from(reports) {
        Ok([one]) => one,
        Err(many) => Value::Array(many),
    };
    match options.output {
        OutputFormat::Json => out = serde_json::to_string_pretty(&reports)? + "\n",
        OutputFormat::Yaml => out = serde_saphyr::to_string(&reports)?,
        OutputFormat::Diff | OutputFormat::Text => {}
    }
    print!("{out}");
    let code = if all_allowed { ExitCode::SUCCESS } else { ExitCode::from(EXIT_DENIED) };
    Ok(Explained { code, selected_by })
}

fn read_input(file: &Path) -> anyhow::Result<(String, String)> {
    if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("cannot read standard input")?;
        Ok(("<stdin>".into(), text))
    } else {
        let text = std::fs::read_to_string(file).with_context(|| format!("{}: cannot read", file.display()))?;
        Ok((file.display().to_string(), text))
    }
}

/// The pod, as a value (to print and diff) and raw (for the engine).
struct Pod {
    value: Value,
    raw: Box<RawValue>,
}

/// The request's facts (from the review, when there is one); flags override them. A
/// workload's pods are requested by its controller unless `--user` says otherwise.
fn facts<'a>(
    subject: &'a Subject,
    request: Option<&'a review::AdmissionRequest<'a>>,
    options: &'a ExplainOptions,
) -> RequestFacts<'a> {
    let mut facts = match (&subject.input, request) {
        (Input::Review(..), Some(request)) => request.facts(),
        (input, _) => {
            let namespace = match input {
                Input::Pod(value) => value.pointer("/metadata/namespace").and_then(Value::as_str),
                Input::Review(..) => None,
            };
            let requester = subject.creator.map_or(Requester::Assumed, Requester::User);
            RequestFacts::pod_create(namespace.unwrap_or("default"), requester)
        }
    };
    if let Some(ns) = &options.namespace {
        facts.namespace = ns;
    }
    if let Some(user) = &options.user {
        facts.requester = Requester::User(user);
    }
    facts
}

fn pod_of(input: &Input) -> anyhow::Result<Pod> {
    let value = match input {
        Input::Pod(value) => value.clone(),
        Input::Review(bytes, label) => {
            let review: Value = serde_json::from_slice(bytes)?;
            match review.pointer("/request/object") {
                Some(object) => object.clone(),
                None => bail!("{label}: the AdmissionReview has no request.object"),
            }
        }
    };
    Ok(Pod { raw: serde_json::value::to_raw_value(&value)?, value })
}

/// The pod after the patch (the pod as submitted when there is none).
fn pod_after(explanation: &Explanation, pod: &Value) -> anyhow::Result<Value> {
    let mut after = pod.clone();
    let patch: json_patch::Patch = serde_json::from_value(serde_json::to_value(explanation.decision.patch())?)?;
    json_patch::patch(&mut after, &patch).context("keyward's patch does not apply to the pod (a bug in keyward)")?;
    Ok(after)
}

fn report(facts: &RequestFacts<'_>, explanation: &Explanation, after: &Value, profiles: &ProfileSet) -> Value {
    let decision = &explanation.decision;
    let requester = match facts.requester {
        Requester::User(u) => Some(u),
        Requester::Assumed => None,
    };
    json!({
        "namespace": facts.namespace,
        "requester": requester,
        "allowed": decision.allowed(),
        "reason": decision.reason,
        "profile": decision.profile,
        "message": decision.message(),
        "warnings": decision.warnings,
        "patch": decision.patch(),
        // Not in `patch`: signed by the webhook at admission (explain has no key).
        "attestation": attestation_op(explanation, profiles),
        "pod": after,
        "auditAnnotations": decision.audit_annotations,
        "injected": decision.outcome.as_ref().ok().and_then(|m| m.audit()),
        "requires": requires(facts.namespace, explanation),
        "trace": explanation.trace,
    })
}

/// What the webhook adds that explain cannot: the admission attestation, for a pod injected
/// by a profile that issues per-owner credentials. The webhook signs it with its key at
/// admission (binding the pod, the owner and the moment); explain has no key, so its patch
/// leaves the operation out and says so here.
fn attestation_op(explanation: &Explanation, profiles: &ProfileSet) -> Option<Value> {
    let decision = &explanation.decision;
    let injected = decision.outcome.as_ref().ok().and_then(|m| m.audit()).is_some();
    let issuing = decision.profile.as_deref().and_then(|p| profiles.get(p)).is_some_and(|p| p.issues_per_owner);
    (injected && issuing).then(|| {
        json!({
            "op": "add",
            "path": "/metadata/annotations/keyward.io~1attestation",
            "value": "v2.<key id>.<admitted at>.<nonce>.<binding>.<tag>",
        })
    })
}

/// The objects the admitted pod depends on, each with the pod's namespace.
fn requires(namespace: &str, explanation: &Explanation) -> Vec<Value> {
    let Ok(mutation) = &explanation.decision.outcome else { return Vec::new() };
    mutation
        .requires()
        .map(|r| json!({"kind": r.kind, "namespace": namespace, "name": r.name, "providedBy": r.provided_by}))
        .collect()
}

fn diff(before: &Value, after: &Value) -> anyhow::Result<String> {
    let a = serde_saphyr::to_string(before)?;
    let b = serde_saphyr::to_string(after)?;
    if a == b {
        return Ok("# no change\n".into());
    }
    Ok(similar::TextDiff::from_lines(&a, &b)
        .unified_diff()
        .context_radius(3)
        .header("pod (as submitted)", "pod (as admitted)")
        .to_string())
}

fn text_report(what: &str, facts: &RequestFacts<'_>, explanation: &Explanation, profiles: &ProfileSet) -> String {
    let d = &explanation.decision;
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    let requester = match facts.requester {
        Requester::User(u) => u,
        Requester::Assumed => "(not given)",
    };
    line(format!("subject:    {what}"));
    line(format!("namespace:  {}", facts.namespace));
    line(format!("requester:  {requester}"));
    match (&d.profile, d.profile.as_deref().and_then(|p| profiles.get(p))) {
        (Some(name), Some(p)) => line(format!("profile:    {name} ({})", p.source)),
        _ => line("profile:    none".into()),
    }
    let verdict = if d.allowed() { "allowed" } else { "DENIED" };
    line(format!("decision:   {verdict} ({})", d.reason.as_str()));
    if let Some(message) = d.message() {
        line(format!("message:    {message}"));
    }
    if let Ok(m) = &d.outcome {
        if let Some(audit) = m.audit() {
            line("injects:".into());
            for item in &explanation.injects {
                line(format!("  - {item}"));
            }
            line(format!("containers: {}", audit.containers.describe()));
        }
        if let Some(op) = attestation_op(explanation, profiles) {
            line(format!(
                "attestation: the webhook also adds {} ({}), signed with its key at admission; explain has no key, so its patch leaves it out",
                op["path"].as_str().unwrap_or_default(),
                op["value"].as_str().unwrap_or_default()
            ));
        }
        if let Some(original) = d.audit_annotations.get("original-service-account") {
            line(format!("service account swapped from: {original}"));
        }
        let mut requires = m.requires().peekable();
        if requires.peek().is_some() {
            line("requires:".into());
            for r in requires {
                line(match r.kind {
                    // Cluster-wide, and not an object: what the pod waits for at start.
                    keyward_engine::ObjectKind::Signer => format!(
                        "  - Signer {} (keyward's controller signs the kubelet's PodCertificateRequests; Kubernetes 1.35+)",
                        r.name
                    ),
                    // Cluster-wide: by name, or a signer's bundles.
                    keyward_engine::ObjectKind::ClusterTrustBundle if !r.is_object() => format!(
                        "  - ClusterTrustBundles of signer {} (provided by {}; Kubernetes 1.33+ with ClusterTrustBundle projection)",
                        r.name,
                        r.provided_by.as_str()
                    ),
                    keyward_engine::ObjectKind::ClusterTrustBundle => format!(
                        "  - ClusterTrustBundle {} (cluster-wide, provided by {}; Kubernetes 1.33+ with ClusterTrustBundle projection)",
                        r.name,
                        r.provided_by.as_str()
                    ),
                    kind => format!("  - {kind:?} {}/{} (provided by {})", facts.namespace, r.name, r.provided_by.as_str()),
                });
            }
        }
        line(format!("patch:      {} operations (see --output json or --output diff)", m.ops.len()));
    }
    for w in &d.warnings {
        line(format!("warning:    {w}"));
    }
    line("profiles considered:".into());
    for t in &explanation.trace {
        line(format!("  {:<24} {}", t.profile, t.why));
    }
    out
}
