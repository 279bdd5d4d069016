//! The command line. Every flag also reads an environment variable (`KEYWARD_…`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::controller::ControllerArgs;
use crate::explain::{self, ExplainOptions, OutputFormat};
use crate::logging::invoked_as;
use crate::profiles::ProfileArgs;
use crate::serve::ServeArgs;

#[derive(Debug, Parser)]
#[command(name = "keyward", version, about = "Injects control-plane credentials into operator pods on CREATE")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// Parses the command line. Run as `kubectl-keyward` (kubectl's plugin), usage and errors
    /// say `kubectl keyward`, as the user typed it.
    pub fn parse_as_invoked() -> Self {
        if invoked_as() == "keyward" {
            return Self::parse();
        }
        let matches = Self::command().bin_name("kubectl keyward").get_matches();
        Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the webhook over HTTPS: POST /mutate, GET /healthz, GET /readyz, and /metrics.
    ///
    /// Without --tls-dir it mints a development CA and certificate into --dev-cert-dir.
    Serve(Box<ServeArgs>),
    /// Show what keyward would do with a Pod, an AdmissionReview or a workload's pods, and why.
    ///
    /// Exits 0 when every pod would be admitted, 3 when one would be refused, 1 on bad input.
    Explain(ExplainArgs),
    /// Issue and provision what the profiles mark as provided by keyward: per-owner client
    /// certificates and tokens, per-namespace server CAs, accounts and role bindings.
    ///
    /// Runs in the cluster (or with KUBECONFIG), leader-elected on a Lease.
    Controller(Box<ControllerArgs>),
    /// Audit a running cluster's pods and keyward's webhook configuration against the
    /// profiles, read-only, with your kubeconfig.
    ///
    /// Exits 0 when nothing is found, 1 when anything is, 2 when the cluster cannot be read.
    Audit(Box<crate::audit::AuditArgs>),
    /// Validate the profiles and list them; exits non-zero with every problem found.
    CheckProfiles(ProfileArgs),
    /// Validate a gate file (keyward gate's rules), every problem at once; with --caller and
    /// --request, say which rule allows the request, or why none does.
    ///
    /// Exits 0 when the file is valid (and the request allowed), 3 when the request is
    /// refused, 4 when a SubjectAccessReview would decide it, 1 on bad input.
    CheckGate(crate::gate::CheckGateArgs),
    /// Serve the gate: an HTTPS reverse proxy in front of a control plane's endpoint that lets
    /// each caller (a keyward client certificate, or a service account token) do only what
    /// the gate file's rules allow, and tells the upstream who called.
    ///
    /// Without --tls-dir it mints a development CA and certificate into --dev-cert-dir.
    Gate(Box<crate::gate::GateArgs>),
    /// Print Kubernetes manifests generated from the profiles.
    #[command(subcommand)]
    Manifests(ManifestsCommand),
    /// Mint certificates for an install without cert-manager, or inspect them.
    #[command(subcommand)]
    Certs(crate::certs::CertsCommand),
    /// Print the version, the commit it was built from and that commit's date.
    Version,
}

#[derive(Debug, Subcommand)]
enum ManifestsCommand {
    /// The MutatingWebhookConfiguration, with matchConditions from the profiles' selectors.
    Webhook {
        #[command(flatten)]
        profiles: ProfileArgs,
        /// The namespace keyward runs in (excluded from the webhook).
        #[arg(long, default_value = "keyward-system")]
        namespace: String,
        /// The Service in front of keyward.
        #[arg(long, default_value = "keyward")]
        service: String,
    },
    /// The ConfigMap keyward-cluster-facts, which the webhook reads to decide `delivery: auto`:
    /// whether keyward signs pod certificates. keyward's controller writes it itself (and takes
    /// this one over); render it to set it from GitOps, or to see what the controller would write.
    ClusterFacts {
        /// `auto` (ask the cluster's discovery, with your kubeconfig), `v1`, `v1beta1` or `off`:
        /// as the controller's --pod-certificates.
        #[arg(long, value_enum, default_value_t = crate::controller::PodCertificates::Auto)]
        pod_certificates: crate::controller::PodCertificates,
        /// The namespace keyward runs in.
        #[arg(long, default_value = "keyward-system")]
        namespace: String,
        #[command(flatten)]
        access: crate::kubeconfig::KubeconfigArgs,
    },
}

#[derive(Debug, Args)]
struct ExplainArgs {
    #[command(flatten)]
    profiles: ProfileArgs,
    /// The namespace the pod is created in (default: the pod's own, else `default`).
    #[arg(long, short = 'n', env = "KEYWARD_EXPLAIN_NAMESPACE")]
    namespace: Option<String>,
    /// The requester (`request.userInfo.username`), like kubectl's `--as`. Without it, a
    /// workload's pods come from its controller's service account, and a bare Pod from a
    /// requester the profile allows.
    #[arg(long, visible_alias = "as", env = "KEYWARD_EXPLAIN_USER", value_name = "USERNAME")]
    user: Option<String>,
    /// How to print the answer.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Text, env = "KEYWARD_EXPLAIN_OUTPUT")]
    output: OutputFormat,
    /// Also read, from the cluster, whether the namespace opted in and whether the objects the
    /// pod would depend on exist (read-only, with your kubeconfig).
    #[arg(long)]
    cluster: bool,
    /// Without --operator-namespace, explain pins requesters as the shipped Deployments do
    /// (--operator-namespace=lmeval=lm-eval) and says so; this leaves them unpinned, as a
    /// keyward run without the flag would.
    #[arg(long, conflicts_with = "operator_namespaces")]
    no_install_pins: bool,
    #[command(flatten)]
    access: crate::kubeconfig::KubeconfigArgs,
    /// A Pod, an AdmissionReview, a Deployment, ReplicaSet, StatefulSet, DaemonSet, Job or
    /// CronJob (its pods), a List of them, or several YAML documents; `-` reads standard input.
    file: PathBuf,
}

impl Cli {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        match self.command {
            Command::Serve(args) => {
                crate::serve::run(args.into_config()?)?;
                Ok(ExitCode::SUCCESS)
            }
            Command::Controller(args) => {
                crate::controller::run(*args)?;
                Ok(ExitCode::SUCCESS)
            }
            Command::Explain(args) => {
                let mut profiles = args.profiles.source().load()?;
                let (mut note, mut pinned) = (None, Vec::new());
                if args.profiles.operator_namespaces.is_empty() && !args.no_install_pins {
                    // Only the pins of profiles in the set (--no-default-profiles may drop one).
                    let mut shown = Vec::new();
                    for (profile, namespace) in crate::profiles::INSTALL_OPERATOR_NAMESPACES {
                        if profiles.get(profile).is_some() {
                            profiles
                                .pin_operator_namespace(profile, namespace)
                                .map_err(|e| anyhow::anyhow!("--operator-namespace {profile}={namespace}: {e}"))?;
                            shown.push(format!("{profile}={namespace}"));
                            pinned.push(*profile);
                        }
                    }
                    note = (!shown.is_empty()).then(|| format!(
                        "keyward: note: requesters pinned as the shipped Deployments pin them: --operator-namespace={} (give --operator-namespace to pin otherwise, --no-install-pins for none)",
                        shown.join(",")
                    ));
                }
                let options = ExplainOptions {
                    namespace: args.namespace,
                    user: args.user,
                    output: args.output,
                    cluster: args.cluster.then_some(args.access),
                };
                let explained = explain::run(&args.file, &profiles, &options)?;
                // After the answer, in text only (JSON readers get the answer alone), and only
                // when a pinned profile selected something: the pin changed nothing otherwise.
                let pin_applied = pinned.iter().any(|p| explained.selected_by.contains(*p));
                if let Some(note) = note.filter(|_| pin_applied && matches!(options.output, OutputFormat::Text)) {
                    eprintln!("{note}");
                }
                Ok(explained.code)
            }
            Command::Manifests(ManifestsCommand::Webhook { profiles, namespace, service }) => {
                let set = profiles.source().load()?;
                let options = crate::manifests::WebhookOptions { namespace, service };
                print!("{}", crate::manifests::webhook_yaml(&set, &options)?);
                Ok(ExitCode::SUCCESS)
            }
            Command::Manifests(ManifestsCommand::ClusterFacts { pod_certificates, namespace, access }) => {
                print!("{}", crate::manifests::cluster_facts_yaml(pod_certificates, &namespace, &access)?);
                Ok(ExitCode::SUCCESS)
            }
            Command::Certs(command) => crate::certs::run(command),
            Command::Audit(args) => crate::audit::run(*args),
            Command::CheckGate(args) => crate::gate::check(&args),
            Command::Gate(args) => {
                crate::gate::run(args.into_config()?)?;
                Ok(ExitCode::SUCCESS)
            }
            Command::Version => {
                print!("{}", crate::build::describe());
                Ok(ExitCode::SUCCESS)
            }
            Command::CheckProfiles(args) => {
                let source = args.source();
                let profiles = source.load()?;
                println!("{} profiles OK ({}):", profiles.len(), source.describe());
                for p in profiles.iter() {
                    println!("  {:<24} {}  {}", p.name, p.source, p.spec.description.as_deref().unwrap_or(""));
                    // The token-lifetime rule, with its numbers: the reader never holds an
                    // expired token (a profile that breaks it was refused above).
                    if let Some(token) = &p.spec.inject.service_account_token {
                        match token.rotation() {
                            Some(rotation) => println!("      token {:?}: {rotation}", token.volume_name),
                            None => println!(
                                "      token {:?}: lives {} s; its reader's re-read interval is not declared (readerRefreshSeconds), so whether it can hold an expired token is not checked",
                                token.volume_name, token.expiration_seconds
                            ),
                        }
                    }
                }
                Ok(ExitCode::SUCCESS)
            }
        }
    }
}
