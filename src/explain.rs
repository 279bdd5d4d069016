//! `keyward explain`: what keyward would do with a pod, and why.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::ValueEnum;
use keyward_engine::{explain, Explanation, ProfileSet, RequestFacts, Requester};
use keyward_engine::{review, yaml};
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// Exit code when the pod would be refused: distinct from 1 (bad input) and 2 (bad usage).
const EXIT_DENIED: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// A readable summary.
    Text,
    /// One JSON object: allowed, profile, reason, patch, pod, warnings, message, trace.
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
}

pub fn run(file: &Path, profiles: &ProfileSet, options: &ExplainOptions) -> anyhow::Result<ExitCode> {
    let (label, text) = read_input(file)?;
    let input = Input::parse(&label, &text)?;
    let request = match &input {
        Input::Review(bytes, _) => Some(review::parse_request(bytes).map_err(|e| anyhow::anyhow!("{label}: {e}"))?),
        Input::Pod(_) => None,
    };
    let facts = input.facts(request.as_ref(), options);
    let pod = input.pod()?;
    let explanation = explain(&facts, &pod.raw, profiles);
    let after = pod_after(&explanation, &pod.value)?;
    let out = match options.output {
        OutputFormat::Json => serde_json::to_string_pretty(&report(&facts, &explanation, &after))? + "\n",
        OutputFormat::Yaml => serde_saphyr::to_string(&report(&facts, &explanation, &after))?,
        OutputFormat::Diff => diff(&pod.value, &after)?,
        OutputFormat::Text => text_report(&facts, &explanation, profiles),
    };
    print!("{out}");
    Ok(if explanation.decision.allowed() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_DENIED) })
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

/// A Pod, or an AdmissionReview as JSON bytes.
enum Input {
    Pod(Value),
    Review(Vec<u8>, String),
}

/// The pod, as a value (to print and diff) and raw (for the engine).
struct Pod {
    value: Value,
    raw: Box<RawValue>,
}

impl Input {
    fn parse(label: &str, text: &str) -> anyhow::Result<Self> {
        let documents =
            yaml::documents(text).map_err(|e| anyhow::anyhow!("{label}: not valid YAML or JSON: {}", e.message))?;
        let document = match <[yaml::Document; 1]>::try_from(documents) {
            Ok([document]) => document,
            Err(documents) if documents.is_empty() => bail!("{label}: empty; expected a Pod or an AdmissionReview"),
            Err(documents) => bail!(
                "{label}: {} documents; explain reads one Pod or AdmissionReview (e.g. kubectl get pod NAME -o yaml)",
                documents.len()
            ),
        };
        match document.value.get("kind").and_then(Value::as_str).unwrap_or_default() {
            "AdmissionReview" => {
                let bytes = serde_json::to_vec(&document.value)?;
                let request = review::parse_request(&bytes).map_err(|e| anyhow::anyhow!("{label}: {e}"))?;
                match document.subtree(&["request", "object"]) {
                    Some(object) if !matches!(request.object, review::Object::Missing) => {
                        check_pod(label, &object, "request.object.")?
                    }
                    _ => bail!("{label}: the AdmissionReview has no request.object"),
                }
                Ok(Self::Review(bytes, label.to_string()))
            }
            "Pod" => {
                check_pod(label, &document, "")?;
                Ok(Self::Pod(document.value))
            }
            "" => bail!("{label}: no `kind`; expected a Pod or an AdmissionReview"),
            other => bail!("{label}: kind {other} is not a Pod or an AdmissionReview; for a Deployment or Job, explain its pod (e.g. kubectl get pod NAME -o yaml)"),
        }
    }

    /// The request's facts (from the review, when there is one); flags override them.
    fn facts<'a>(
        &'a self,
        request: Option<&'a review::AdmissionRequest<'a>>,
        options: &'a ExplainOptions,
    ) -> RequestFacts<'a> {
        let mut facts = match (self, request) {
            (Self::Review(..), Some(request)) => request.facts(),
            (_, _) => {
                let namespace = match self {
                    Self::Pod(value) => value.pointer("/metadata/namespace").and_then(Value::as_str),
                    Self::Review(..) => None,
                };
                RequestFacts::pod_create(namespace.unwrap_or("default"), Requester::Assumed)
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

    fn pod(&self) -> anyhow::Result<Pod> {
        let value = match self {
            Self::Pod(value) => value.clone(),
            Self::Review(bytes, label) => {
                let review: Value = serde_json::from_slice(bytes)?;
                match review.pointer("/request/object") {
                    Some(object) => object.clone(),
                    None => bail!("{label}: the AdmissionReview has no request.object"),
                }
            }
        };
        Ok(Pod { raw: serde_json::value::to_raw_value(&value)?, value })
    }
}

/// A pod that does not decode as a Pod never reaches a webhook: the apiserver refuses it first.
/// Every such problem is reported, each with its field (`prefix` + path in the pod) and where
/// it is in the file.
fn check_pod(label: &str, pod: &yaml::Document, prefix: &str) -> anyhow::Result<()> {
    let Err(problems) = yaml::check::<k8s_openapi::api::core::v1::Pod>(pod) else { return Ok(()) };
    let lines: Vec<String> = problems
        .iter()
        .map(|p| {
            let at = p.position.map(|p| format!(" ({p})")).unwrap_or_default();
            let field = if p.path.is_empty() {
                prefix.trim_end_matches('.').to_string()
            } else {
                format!("{prefix}{}", p.path)
            };
            format!("{label}: {field}{at}: {}", p.message)
        })
        .collect();
    bail!(
        "{label}: not a valid Pod, so the apiserver would refuse it before any webhook sees it:\n{}",
        lines.join("\n")
    )
}

/// The pod after the patch (the pod as submitted when there is none).
fn pod_after(explanation: &Explanation, pod: &Value) -> anyhow::Result<Value> {
    let mut after = pod.clone();
    let patch: json_patch::Patch = serde_json::from_value(serde_json::to_value(explanation.decision.patch())?)?;
    json_patch::patch(&mut after, &patch).context("keyward's patch does not apply to the pod (a bug in keyward)")?;
    Ok(after)
}

fn report(facts: &RequestFacts<'_>, explanation: &Explanation, after: &Value) -> Value {
    let decision = &explanation.decision;
    json!({
        "allowed": decision.allowed(),
        "reason": decision.reason,
        "profile": decision.profile,
        "message": decision.message(),
        "warnings": decision.warnings,
        "patch": decision.patch(),
        "pod": after,
        "auditAnnotations": decision.audit_annotations,
        "injected": decision.outcome.as_ref().ok().and_then(|m| m.audit()),
        "requires": requires(facts.namespace, explanation),
        "trace": explanation.trace,
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

fn text_report(facts: &RequestFacts<'_>, explanation: &Explanation, profiles: &ProfileSet) -> String {
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
        if let Some(original) = d.audit_annotations.get("original-service-account") {
            line(format!("service account swapped from: {original}"));
        }
        let mut requires = m.requires().peekable();
        if requires.peek().is_some() {
            line("requires:".into());
            for r in requires {
                line(format!(
                    "  - {:?} {}/{} (provided by {})",
                    r.kind,
                    facts.namespace,
                    r.name,
                    r.provided_by.as_str()
                ));
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
