//! `keyward check-gate`: a gate file checked, and optionally a request decided offline, as
//! `keyward gate` would decide it, with the same rules (`keyward-gate`'s); the SubjectAccessReviews
//! a rule would ask are printed, not asked.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use clap::Args;
use keyward_gate::identity::{PodCaller, PodFacts, PodOwner, ServiceAccount, UserName, WorkloadIdentity};
use keyward_gate::route::RequestPath;
use keyward_gate::rules::{Caller, Request};

/// The exit code when no rule allows the request offline and a SubjectAccessReview would decide:
/// not a refusal (3), not an error (1).
pub const NEEDS_API_SERVER: u8 = 4;

#[derive(Debug, Args)]
pub struct CheckGateArgs {
    /// The gate file (apiVersion keyward.io/v1alpha1, kind Gate).
    file: PathBuf,
    /// Who calls: a keyward workload identity (spiffe://TRUST-DOMAIN/ns/NAMESPACE/KIND/NAME,
    /// by client certificate), a service account (system:serviceaccount:NAMESPACE:NAME, by
    /// token), `anonymous` (no credential), or any other user a token names (alice).
    #[arg(long, requires = "request", value_name = "IDENTITY")]
    caller: Option<String>,
    /// The request: `METHOD PATH` (`POST /LMEvalJobUpdateService/UpdateStatus` for gRPC).
    #[arg(long, requires = "caller", value_name = "METHOD PATH")]
    request: Option<String>,
    /// A request header, `NAME: VALUE` (repeat for more).
    #[arg(long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// A string field of the gRPC request's message, `NUMBER=VALUE` (repeat for more; in order).
    #[arg(long = "grpc-field", value_name = "NUMBER=VALUE", conflicts_with = "json_body")]
    grpc_fields: Vec<String>,
    /// The request's JSON body, as sent (with `Content-Type: application/json` unless a
    /// --header gives one).
    #[arg(long = "json-body", value_name = "JSON")]
    json_body: Option<String>,
    /// The pod a service account caller's token is bound to, as the gate's pod watch would
    /// know it (spec.tokenReview.pods): its name.
    #[arg(long, value_name = "NAME")]
    pod: Option<String>,
    /// A label of that pod, `KEY=VALUE` (repeat for more).
    #[arg(long = "pod-label", value_name = "KEY=VALUE", requires = "pod")]
    pod_labels: Vec<String>,
    /// An annotation of that pod, `KEY=VALUE` (repeat for more).
    #[arg(long = "pod-annotation", value_name = "KEY=VALUE", requires = "pod")]
    pod_annotations: Vec<String>,
    /// That pod's controller, `KIND/NAME` (as Job/eval-7f3c).
    #[arg(long = "pod-owner", value_name = "KIND/NAME", requires = "pod")]
    pod_owner: Option<String>,
}

/// The pod `--pod` and its facts describe, for a service account caller.
fn pod_caller(args: &CheckGateArgs, account: ServiceAccount) -> anyhow::Result<Caller> {
    let Some(name) = &args.pod else { return Ok(Caller::ServiceAccount(account)) };
    let pairs = |flag: &str, given: &[String]| -> anyhow::Result<BTreeMap<String, String>> {
        given
            .iter()
            .map(|p| match p.split_once('=') {
                Some((k, v)) => Ok((k.trim().to_string(), v.trim().to_string())),
                None => bail!("{flag} {p:?}: write KEY=VALUE"),
            })
            .collect()
    };
    let owner = match &args.pod_owner {
        Some(o) => match o.split_once('/') {
            Some((kind, name)) => Some(PodOwner { kind: kind.into(), name: name.into() }),
            None => bail!("--pod-owner {o:?}: write KIND/NAME, as Job/eval-7f3c"),
        },
        None => None,
    };
    let pod = PodFacts {
        name: name.clone(),
        uid: "(offline)".into(),
        labels: pairs("--pod-label", &args.pod_labels)?,
        annotations: pairs("--pod-annotation", &args.pod_annotations)?,
        owner,
    };
    Ok(Caller::Pod(PodCaller { account, pod_name: name.clone(), pod: Ok(Arc::new(pod)) }))
}

pub fn check(args: &CheckGateArgs) -> anyhow::Result<ExitCode> {
    let source = args.file.display().to_string();
    let text = std::fs::read_to_string(&args.file).with_context(|| format!("cannot read {source}"))?;
    let loaded = match keyward_gate::config::load(&source, &text) {
        Ok(loaded) => loaded,
        Err(problems) => bail!("gate file refused:\n  {}", problems.join("\n  ")),
    };
    let (Some(caller), Some(request)) = (&args.caller, &args.request) else {
        println!("gate {:?} OK ({source})", loaded.name);
        for line in loaded.gate.summary() {
            println!("  {line}");
        }
        if let Some(pods) = loaded.gate.pods() {
            let (labels, annotations) = loaded.gate.pod_keys();
            println!(
                "  pods: a token bound to a pod labelled {} names that pod (the gate watches them: list and watch pods); rules read its labels [{}] and annotations [{}]",
                pods.label_selector,
                labels.join(", "),
                annotations.join(", ")
            );
        }
        if !loaded.gate.user_headers().is_empty() {
            println!(
                "  userHeaders: {} set to the verified user, the client's removed",
                loaded.gate.user_headers().join(", ")
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let caller = if caller.starts_with("spiffe://") {
        Caller::Workload(WorkloadIdentity::parse(caller)?)
    } else if caller == "anonymous" {
        Caller::Anonymous
    } else if caller.starts_with("system:serviceaccount:") {
        pod_caller(args, ServiceAccount::parse(caller)?)?
    } else if args.pod.is_some() {
        bail!("--pod: only a service account's token is bound to a pod; give --caller system:serviceaccount:NAMESPACE:NAME");
    } else {
        let user = Caller::User(UserName::parse(caller)?);
        // The form that takes anything: say what else the caller could have meant.
        println!(
            "  caller {caller:?}: a user named by a bearer token (a workload by client certificate is spiffe://TRUST-DOMAIN/ns/NAMESPACE/KIND/NAME; a service account system:serviceaccount:NAMESPACE:NAME)"
        );
        user
    };
    let Some((method, path)) = request.split_once(' ') else {
        bail!("--request {request:?}: write METHOD PATH, as `POST /LMEvalJobUpdateService/UpdateStatus`");
    };
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let mut headers = Vec::new();
    for h in &args.headers {
        let Some((name, value)) = h.split_once(':') else { bail!("--header {h:?}: write NAME: VALUE") };
        headers.push((name.trim(), value.trim()));
    }
    if args.json_body.is_some() && !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("content-type")) {
        headers.push(("content-type", "application/json"));
    }
    let mut fields = Vec::new();
    for f in &args.grpc_fields {
        let parsed = f.split_once('=').and_then(|(n, v)| Some((n.parse::<u32>().ok()?, v)));
        let Some(field) = parsed else { bail!("--grpc-field {f:?}: write NUMBER=VALUE, as 1=evaljob-sample") };
        fields.push(field);
    }
    let body = match &args.json_body {
        Some(json) => json.as_bytes().to_vec(),
        None if fields.is_empty() => Vec::new(),
        None => keyward_gate::grpc::encode_strings(&fields),
    };
    let checked = RequestPath::parse(path)?;
    let request = Request { method, path, headers: &headers, body: &body };
    // Offline, no SubjectAccessReview can be asked: those a rule needs are printed.
    let verdict = loaded.gate.decide(&caller, &request, &checked, &|_| None);
    for (rule, why) in &verdict.trace {
        println!("  {rule}: {why}");
    }
    for r in &verdict.pending {
        println!(
            "  would ask the API server: may {} {} {}{}{} (group {:?}, namespace {:?}, name {:?})",
            r.user,
            r.verb,
            r.resource,
            if r.subresource.is_empty() { "" } else { "/" },
            r.subresource,
            r.group,
            r.namespace,
            r.name
        );
    }
    // Offline, the owner watch is not there either: say what the gate would also require.
    let owner = match &caller {
        Caller::Workload(id) => loaded.gate.live_owner(&id.kind).map(|o| (o, id)),
        Caller::ServiceAccount(_) | Caller::Pod(_) | Caller::User(_) | Caller::Anonymous => None,
    };
    if let (Some((owner, id)), Some(_)) = (owner, &verdict.allowed_by) {
        println!(
            "  spec.liveOwners: only while {} {}/{} exists (the gate's watch decides that; not checked offline)",
            owner.describe(),
            id.namespace,
            id.name
        );
    }
    if body.is_empty() && verdict.allowed_by.is_none() && loaded.gate.reads_body(&caller, method, &checked) {
        if checked.grpc_method().is_some() {
            println!(
                "  hint: a rule for this request reads the gRPC message: give its string fields with --grpc-field NUMBER=VALUE (as --grpc-field 1=evaljob-sample)"
            );
        } else {
            println!("  hint: a rule for this request reads its JSON body: give it with --json-body");
        }
    }
    if let Caller::Pod(p) = &caller {
        println!(
            "  the caller's pod {}: as given; the gate admits a pod-bound token only while its pod exists with the token's UID (its watch decides that; not checked offline)",
            p.pod_ref()
        );
    }
    match &verdict.allowed_by {
        Some(rule) => {
            println!("allowed by rule {rule:?}");
            Ok(ExitCode::SUCCESS)
        }
        None if !verdict.pending.is_empty() => {
            println!("not allowed offline: the API server's answer to the SubjectAccessReview above decides");
            Ok(ExitCode::from(NEEDS_API_SERVER))
        }
        None => {
            println!("refused: {}", verdict.reason());
            Ok(ExitCode::from(3))
        }
    }
}
