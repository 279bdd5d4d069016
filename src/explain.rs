//! `keyward explain`: what keyward would do with a pod, and why.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context};
use keyward_webhooks::review::AdmissionReview;
use keyward_webhooks::{decide, Decision, InjectedItem, ProfileSet, RequestFacts, Requester};
use serde_json::{json, Value};

use crate::cli::OutputFormat;

/// Exit code when the pod would be refused: distinct from 1 (bad input) and 2 (bad usage).
const EXIT_DENIED: u8 = 3;

#[derive(Debug, Clone)]
pub struct ExplainOptions {
    pub namespace: Option<String>,
    pub user: Option<String>,
    pub output: OutputFormat,
}

pub fn run(file: &Path, profiles: &ProfileSet, options: &ExplainOptions) -> anyhow::Result<ExitCode> {
    let (label, text) = read_input(file)?;
    let (facts, pod) = parse_input(&label, &text, options)?;
    let decision = decide(&facts, &pod, profiles);
    let after = pod_after(&decision, &pod);
    let out = match options.output {
        OutputFormat::Json => serde_json::to_string_pretty(&report(&decision, &after))? + "\n",
        OutputFormat::Yaml => serde_yaml::to_string(&report(&decision, &after))?,
        OutputFormat::Diff => diff(&pod, &after)?,
        OutputFormat::Text => text_report(&facts, &decision, profiles),
    };
    print!("{out}");
    Ok(if decision.allowed() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_DENIED) })
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

/// Turns a Pod or an AdmissionReview into the engine's inputs. Flags override the review.
pub fn parse_input(label: &str, text: &str, options: &ExplainOptions) -> anyhow::Result<(RequestFacts, Value)> {
    let value: Value =
        serde_yaml::from_str(text).map_err(|e| anyhow::anyhow!("{label}: not valid YAML or JSON: {e}"))?;
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default();
    match kind {
        "AdmissionReview" => {
            let request = AdmissionReview::parse_request(&serde_json::to_vec(&value)?).map_err(|e| anyhow::anyhow!("{label}: {e}"))?;
            let mut facts = request.facts();
            if let Some(ns) = &options.namespace {
                facts.namespace = ns.clone();
            }
            if let Some(user) = &options.user {
                facts.requester = Requester::User(user.clone());
            }
            let Some(object) = request.object else { bail!("{label}: the AdmissionReview has no request.object") };
            Ok((facts, object))
        }
        "Pod" => {
            let namespace = options
                .namespace
                .clone()
                .or_else(|| value.pointer("/metadata/namespace").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_else(|| "default".into());
            let requester = options.user.clone().map_or(Requester::Assumed, Requester::User);
            Ok((RequestFacts::pod_create(namespace, requester), value))
        }
        "" => bail!("{label}: no `kind`; expected a Pod or an AdmissionReview"),
        other => bail!("{label}: kind {other} is not a Pod or an AdmissionReview; for a Deployment or Job, explain its pod (e.g. kubectl get pod NAME -o yaml)"),
    }
}

fn pod_after(decision: &Decision, pod: &Value) -> Value {
    match &decision.outcome {
        Ok(m) => m.pod.clone().unwrap_or_else(|| pod.clone()),
        Err(_) => pod.clone(),
    }
}

fn report(decision: &Decision, after: &Value) -> Value {
    json!({
        "allowed": decision.allowed(),
        "reason": decision.reason,
        "profile": decision.profile,
        "message": decision.message(),
        "warnings": decision.warnings,
        "patch": decision.patch(),
        "pod": after,
        "auditAnnotations": decision.audit_annotations,
        "injected": decision.outcome.as_ref().ok().and_then(|m| m.audit.as_ref()),
        "trace": decision.trace,
    })
}

fn diff(before: &Value, after: &Value) -> anyhow::Result<String> {
    let a = serde_yaml::to_string(before)?;
    let b = serde_yaml::to_string(after)?;
    if a == b {
        return Ok("# no change\n".into());
    }
    Ok(similar::TextDiff::from_lines(&a, &b)
        .unified_diff()
        .context_radius(3)
        .header("pod (as submitted)", "pod (as admitted)")
        .to_string())
}

fn text_report(facts: &RequestFacts, d: &Decision, profiles: &ProfileSet) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    let requester = match &facts.requester {
        Requester::User(u) => u.as_str(),
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
        if let Some(audit) = &m.audit {
            line("injects:".into());
            for item in &audit.injected {
                line(format!("  - {}", describe(item)));
            }
            line(format!("containers: {}", audit.containers.describe()));
        }
        if let Some(original) = d.audit_annotations.get("original-service-account") {
            line(format!("service account swapped from: {original}"));
        }
        line(format!("patch:      {} operations (see --output json or --output diff)", m.patch.len()));
    }
    for w in &d.warnings {
        line(format!("warning:    {w}"));
    }
    line("profiles considered:".into());
    for t in &d.trace {
        line(format!("  {:<24} {}", t.profile, t.why));
    }
    out
}

fn describe(item: &InjectedItem) -> String {
    match item {
        InjectedItem::ClientCertificate { secret, mount_path, .. } => {
            format!("client certificate: Secret {secret} at {mount_path}")
        }
        InjectedItem::ServerCa { secret, config_map, mount_path, .. } => match (secret, config_map) {
            (Some(s), _) => format!("server CA: Secret {s} at {mount_path}"),
            (_, Some(c)) => format!("server CA: ConfigMap {c} at {mount_path}"),
            _ => format!("server CA at {mount_path}"),
        },
        InjectedItem::Token { secret, key, mount_path, .. } => {
            format!("token: Secret {secret} key {key} at {mount_path}/{key}")
        }
        InjectedItem::ServiceAccountToken { audience, expiration_seconds, mount_path, .. } => {
            format!("service-account token: audience {audience}, expires after {expiration_seconds}s, at {mount_path}")
        }
        InjectedItem::ServiceAccount { name, api_token } => {
            format!(
                "service account: {name} (Kubernetes API token: {})",
                serde_json::to_value(api_token).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
            )
        }
    }
}
