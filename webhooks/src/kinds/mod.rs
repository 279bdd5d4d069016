//! The kinds of injection, one module each, and the registry that lists them.
//!
//! A kind owns its settings (the serde schema under `spec.inject.<key>`, with its defaults and
//! its name templates parsed on load), their validation, what it puts into a pod, its audit
//! entry and its line in `keyward explain`. Kinds use only the building blocks in
//! [`crate::inject`] and [`crate::names`]; the profile schema, the engine and `explain` reach
//! them through [`Injections`], which the registry below generates.
//!
//! Adding a kind: write `kinds/<kind>.rs` with a settings struct that implements [`Kind`] (and
//! its tests), then add one line to `registry!` below. The compiler holds the rest together:
//! the settings struct must implement every method of [`Kind`], and everything that lists the
//! kinds is generated from that one line.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::inject::{Check, Injection, Unresolved};
use crate::names::TemplateContext;

mod api_token;
mod client_certificate;
mod env;
mod gate;
mod server_ca;
mod service_account;
mod service_account_token;
mod token;

pub use api_token::RemoveApiToken;
pub use client_certificate::{
    keyward_signer_problem, ClientCertificate, Delivery, KeyType, PodCertificate, MAX_EXPIRATION_SECONDS,
    MIN_EXPIRATION_SECONDS, SIGNER_DOMAIN,
};
pub use env::{Env, PlainEnv};
pub use gate::{Gate, InFrontOf, VolumeKey, CONFIG_VOLUME as GATE_CONFIG_VOLUME, CONTAINER as GATE_CONTAINER};
pub use server_ca::ServerCa;
pub use service_account::ServiceAccount;
pub use service_account_token::ServiceAccountToken;
pub use token::Token;

/// What every kind of injection does.
pub trait Kind: fmt::Debug {
    /// Checks what the schema cannot (names Kubernetes would refuse, paths, lifetimes) and
    /// claims the volume names, mount paths and env vars the kind puts into pods.
    fn validate(&self, check: &mut Check);
    /// What the kind puts into one pod, with its name templates resolved for that pod.
    fn plan(&self, pod: &TemplateContext<'_>) -> Result<Injection, Unresolved>;
    /// One line for people (`keyward explain`) about what `injection` does.
    fn describe(&self, injection: &Injection) -> String;
}

macro_rules! registry {
    ($($field:ident: $kind:ty = $key:literal,)*) => {
        /// `spec.inject`: at most one of each kind.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Injections {
            $(
                #[serde(default, rename = $key, skip_serializing_if = "Option::is_none")]
                pub $field: Option<$kind>,
            )*
        }

        impl Injections {
            /// Every kind's key, in the order kinds are applied.
            pub const KEYS: &'static [&'static str] = &[$($key),*];

            /// The kinds this profile injects, with their keys, in registry order.
            pub fn kinds(&self) -> impl Iterator<Item = (&'static str, &dyn Kind)> {
                [$(self.$field.as_ref().map(|k| ($key, k as &dyn Kind))),*].into_iter().flatten()
            }
        }
    };
}

// The registry: one line per kind, in the order their volumes, mounts and env vars are added.
registry! {
    client_certificate: ClientCertificate = "clientCertificate",
    server_ca: ServerCa = "serverCA",
    token: Token = "token",
    service_account_token: ServiceAccountToken = "serviceAccountToken",
    env: Env = "env",
    service_account: ServiceAccount = "serviceAccount",
    api_token: RemoveApiToken = "apiToken",
    gate: Gate = "gate",
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers for the kinds' own tests.
    use crate::inject::Check;
    use crate::names::{Labels, TemplateContext};

    pub(crate) fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
        serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    pub(crate) fn with_pod<R>(
        owner: Option<&str>,
        labels: &[(&str, &str)],
        f: impl FnOnce(&TemplateContext<'_>) -> R,
    ) -> R {
        let labels: Labels<'_> = labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        f(&TemplateContext { namespace: "team-a", owner_name: owner, labels: &labels })
    }

    pub(crate) fn problems(kind: &dyn super::Kind) -> Vec<String> {
        let mut check = Check::default();
        kind.validate(check.scoped("spec.inject.k"));
        check.finish().0.into_iter().map(|(field, reason)| format!("{field}: {reason}")).collect()
    }
}
