//! keyward: a Kubernetes mutating admission webhook that hands operator pods the credentials
//! they need to call back to their control plane.

mod audit;
mod build;
mod certs;
mod cli;
mod controller;
mod explain;
mod gate;
mod kubeconfig;
mod logging;
mod manifests;
mod metrics;
mod profiles;
mod serve;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse_as_invoked();
    match cli.run() {
        Ok(code) => code,
        Err(e) => {
            // One clear line (or one per problem), never a backtrace.
            eprintln!("{}: error: {e:#}", logging::invoked_as());
            // A cluster that cannot be read is not bad input: 2, whichever command read it.
            if e.downcast_ref::<kubeconfig::ClusterUnreadable>().is_some() {
                return ExitCode::from(2);
            }
            ExitCode::FAILURE
        }
    }
}
