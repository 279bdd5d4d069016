//! `keyward audit`: what a running cluster's pods, and keyward's webhook configuration, say
//! against the profiles, read-only and with the user's own credentials (kubeconfig). Exit 0
//! when nothing is found, 1 when anything is, 2 when the cluster cannot be read.

mod collect;
mod findings;
mod rbac;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Args, ValueEnum};
use keyward_engine::text::terminal_safe;
use keyward_engine::ProfileSet;
use serde_json::json;

pub use collect::{gather, AuditError, Gathered, Scope};

use crate::kubeconfig::KubeconfigArgs;
use crate::profiles::ProfileArgs;
use crate::serve::config::parse_duration;

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    profiles: ProfileArgs,
    /// The namespace to audit (default: the kubeconfig context's).
    #[arg(long, short = 'n', value_name = "NAMESPACE", conflicts_with = "all_namespaces")]
    namespace: Option<String>,
    /// Audit every namespace.
    #[arg(long, short = 'A')]
    all_namespaces: bool,
    /// How to print the report.
    #[arg(long, short = 'o', value_enum, default_value_t = AuditFormat::Table)]
    output: AuditFormat,
    /// Also report client certificates that expire within this long, renewal due or not (off
    /// by default: a certificate is reported when keyward's controller is late to renew it, at
    /// two thirds of its life, and a 24-hour certificate always ends within a day).
    #[arg(long, value_parser = parse_days)]
    expiry_warning: Option<Duration>,
    /// Read no Secrets (for users without that right): missing Secrets and expiring
    /// certificates are then not reported, and the report says so.
    #[arg(long)]
    no_secrets: bool,
    #[command(flatten)]
    cluster: KubeconfigArgs,
    /// keyward's MutatingWebhookConfiguration.
    #[arg(long, default_value = "keyward")]
    webhook_config: String,
    /// The namespace keyward runs in (its Deployments, Lease and serving Secret).
    #[arg(long, default_value = "keyward-system")]
    keyward_namespace: String,
    /// keyward's Service, for the configuration the profiles generate and the serving
    /// certificate's name; the webhook's Deployment has the same name.
    #[arg(long, default_value = "keyward")]
    service: String,
    /// The Secret in keyward's namespace with the webhook's serving certificate, checked against
    /// the caBundle (`keyward-serving-tls` on OpenShift).
    #[arg(long, default_value = "keyward-serving")]
    serving_secret: String,
    /// The controller's Deployment and Lease in keyward's namespace.
    #[arg(long, default_value = "keyward-controller")]
    controller: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuditFormat {
    /// One line per finding, grouped by namespace, and a summary line.
    Table,
    /// The AuditReport object (docs/audit-and-explain.md, "keyward audit").
    Json,
}

/// `7d` as well as Go's durations.
fn parse_days(s: &str) -> Result<Duration, String> {
    match s.strip_suffix('d').and_then(|d| d.parse::<u64>().ok()) {
        Some(days) => days
            .checked_mul(86_400)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{s:?}: more days than a duration holds; give a number of days such as 7d")),
        None => parse_duration(s),
    }
}

pub fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let profiles = args.profiles.source().load()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match runtime.block_on(audit(&args, &profiles)) {
        Ok(report) => {
            print!("{}", report);
            Ok(report_exit(&report))
        }
        Err(e) => {
            eprintln!("{}: error: {e:#}", crate::logging::invoked_as());
            Ok(ExitCode::from(2))
        }
    }
}

/// The printed report and whether it found anything.
struct Printed {
    text: String,
    found: bool,
}

impl std::fmt::Display for Printed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn report_exit(p: &Printed) -> ExitCode {
    if p.found {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

async fn audit(args: &AuditArgs, profiles: &ProfileSet) -> anyhow::Result<Printed> {
    let cluster = args.cluster.client().await?;
    // `delivery: auto` as keyward's controller resolves it: by what the cluster serves.
    let resolved = crate::profiles::resolved_by_discovery(&cluster, profiles).await?;
    let (client, default_namespace) = (&cluster.client, cluster.namespace.clone());
    let profiles = resolved.as_ref().unwrap_or(profiles);
    let scope = Scope {
        namespace: if args.all_namespaces { None } else { Some(args.namespace.clone().unwrap_or(default_namespace)) },
        webhook_config: args.webhook_config.clone(),
        keyward_namespace: args.keyward_namespace.clone(),
        service: args.service.clone(),
        secrets: !args.no_secrets,
        serving_secret: args.serving_secret.clone(),
        controller: args.controller.clone(),
    };
    // Progress on stderr, for people: every ten pages when it is a terminal.
    let tty = std::io::stderr().is_terminal();
    let mut progress = |pods: usize, pages: usize| {
        if tty && pages.is_multiple_of(10) {
            eprintln!("keyward audit: {pods} pods read ({pages} pages)…");
        }
    };
    let gathered = gather(client, &scope, profiles, SystemTime::now(), args.expiry_warning, &mut progress)
        .await
        .map_err(|e| match e {
            AuditError::Api { what, source } => {
                anyhow::Error::new(crate::kubeconfig::request_failed(&cluster.server, &what, &source))
            }
            forbidden => anyhow::Error::new(forbidden),
        })?;
    let found = !gathered.findings.is_empty();
    let text = match args.output {
        AuditFormat::Table => table(&gathered),
        AuditFormat::Json => serde_json::to_string_pretty(&json_report(&gathered))? + "\n",
    };
    Ok(Printed { text, found })
}

/// One line per finding, grouped by namespace (cluster findings first), then a summary. Every
/// cell is the cluster's to write (pod names, owner references, records, messages): each goes
/// through [`terminal_safe`], so no control or format character reaches the terminal and a
/// finding is always one line.
pub fn table(g: &Gathered) -> String {
    let cell = |s: &str| terminal_safe(s).into_owned();
    let rows: Vec<[String; 5]> = g
        .findings
        .iter()
        .map(|f| {
            [
                if f.namespace.is_empty() { "(cluster)".into() } else { cell(&f.namespace) },
                if f.pod.is_empty() { "-".into() } else { cell(&f.pod) },
                f.profile.as_deref().map_or_else(|| "-".into(), cell),
                f.finding.as_str().into(),
                cell(&f.detail),
            ]
        })
        .collect();
    let mut out = String::new();
    if !rows.is_empty() {
        let header = ["NAMESPACE", "POD", "PROFILE", "FINDING", "DETAIL"].map(String::from);
        let mut widths = [0usize; 4];
        for row in std::iter::once(&header).chain(&rows) {
            for (w, cell) in widths.iter_mut().zip(row.iter()) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for row in std::iter::once(&header).chain(&rows) {
            let mut line = String::new();
            for (cell, w) in row.iter().zip(widths) {
                line.push_str(&format!("{cell:<w$}  "));
            }
            line.push_str(&row[4]);
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out.push_str(&summary(g));
    out.push('\n');
    for note in &g.notes {
        out.push_str(&format!("note: {}\n", terminal_safe(note)));
    }
    out
}

fn counts(g: &Gathered) -> BTreeMap<&'static str, usize> {
    let mut by = BTreeMap::new();
    for f in &g.findings {
        *by.entry(f.finding.as_str()).or_insert(0) += 1;
    }
    by
}

fn summary(g: &Gathered) -> String {
    let by = counts(g);
    let found = if g.findings.is_empty() {
        "no findings".to_string()
    } else {
        let parts: Vec<String> = by.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let total = g.findings.len();
        format!("{total} finding{} ({})", if total == 1 { "" } else { "s" }, parts.join(", "))
    };
    let n = |count: usize, one: &str, many: &str| format!("{count} {}", if count == 1 { one } else { many });
    format!(
        "{found}; {} of {} concern keyward, in {} ({} read)",
        g.pods_audited,
        n(g.pods_listed, "pod", "pods"),
        n(g.namespaces.len(), "namespace", "namespaces"),
        n(g.pages, "page", "pages")
    )
}

/// The stable JSON report.
pub fn json_report(g: &Gathered) -> serde_json::Value {
    json!({
        "apiVersion": "keyward.io/v1alpha1",
        "kind": "AuditReport",
        "findings": g.findings,
        "summary": {
            "findings": g.findings.len(),
            "byFinding": counts(g),
            "podsListed": g.pods_listed,
            "podsAudited": g.pods_audited,
            "namespaces": g.namespaces.len(),
            "pages": g.pages,
        },
        "notes": g.notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use findings::{Finding, Kind};

    /// A number of days past what a duration holds is refused, not a panic.
    #[test]
    fn days_are_read_and_too_many_refused() {
        assert_eq!(parse_days("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(
            parse_days("1000000000000000d"),
            Err("\"1000000000000000d\": more days than a duration holds; give a number of days such as 7d".into())
        );
    }

    /// Guards the table's own escape (mutation: `terminal_safe` returning its input): whatever a
    /// finding's detail, profile or a note holds, the table holds no control or format
    /// character, and each finding stays one line.
    #[test]
    fn the_table_escapes_every_cell_and_note() {
        let hostile = "x\u{1b}]0;pwned\u{7}\r\nno findings\u{202e}";
        let g = Gathered {
            findings: vec![Finding {
                namespace: "team-a".into(),
                pod: "p".into(),
                finding: Kind::Unreadable,
                profile: Some(hostile.into()),
                detail: hostile.into(),
            }],
            pods_listed: 1,
            pods_audited: 1,
            namespaces: ["team-a".to_string()].into(),
            pages: 1,
            notes: vec![hostile.into()],
        };
        let text = table(&g);
        assert!(!text.chars().any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'), "{text:?}");
        assert_eq!(text.lines().count(), 4, "header, the finding, the summary, the note: {text}");
        assert!(text.contains(r"x\u{1b}]0;pwned\u{7}\u{d}\u{a}no findings\u{202e}"), "{text}");
    }
}
