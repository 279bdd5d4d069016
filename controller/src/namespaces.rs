//! Namespace provisioning: in every opted-in namespace, the objects the profiles provide per
//! namespace (server CA copies, and with `--provision-accounts` ServiceAccounts and their
//! RoleBindings); removed when the namespace opts out or no profile wants them any more.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::NamespaceResourceScope;
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::conditions::Condition;
use crate::context::{label, list_all, lock, namespace_ref, Context, Same};
use crate::desired::{self, Desired, Want};
use crate::error::Error;
use crate::metrics::Action;
use crate::objects::{self, is_managed, Scope};

/// Makes the per-namespace objects of every profile exist in `namespace` (opted in).
pub async fn provision(cx: &Context, namespace: &str) -> Result<(), Error> {
    let (wanted, problems) = desired::for_namespace(&cx.profiles, namespace, &cx.settings.operator_namespaces);
    for p in problems {
        tracing::error!(profile = %p.profile, namespace, reason = %p.reason, "cannot provision the server CA");
    }
    let mut first_error = None;
    for d in &wanted {
        let subject = format!("{} {}/{}", d.want.object_kind(), d.namespace, d.name);
        let result = match ensure_object(cx, d).await {
            // A source that is missing or holds no CA certificate is not this namespace's
            // failure: the copy already there (if any) stays, the condition is reported,
            // and the source is read again at the next resync.
            Err(Error::Source { what, reason }) => {
                let note = format!(
                    "{subject} for profile {:?} is not provisioned: {what}: {reason}; pods that need it wait until the source holds a CA certificate",
                    d.profile
                );
                cx.raise(Condition::ServerCaSourceUnusable, &subject, &note, Some(namespace_ref(&d.namespace))).await;
                continue;
            }
            other => other,
        };
        if matches!(d.want, Want::ServerCa { .. }) && result.is_ok() {
            cx.resolve(Condition::ServerCaSourceUnusable, &subject);
        }
        cx.record(d, None, result, Action::Provisioned, &mut first_error).await;
    }
    first_error.map_or(Ok(()), Err)
}

async fn ensure_object(cx: &Context, d: &Desired) -> Result<Action, Error> {
    let ns = d.namespace.as_str();
    let stores = lock(&cx.stores).clone();
    match &d.want {
        Want::ServerCa { config_map, key, source } => {
            let pem = cx.source(source).await?;
            if *config_map {
                let object = objects::server_ca_config_map(d, key, &pem);
                let store = stores.as_ref().map(|s| &s.config_maps);
                cx.ensure(ns, store, object, |a, b| a.data == b.data).await
            } else {
                let object = objects::server_ca_secret(d, key, &pem);
                cx.ensure::<Secret>(ns, None, object, |a, b| a.data == b.data).await
            }
        }
        Want::ServiceAccount => {
            let object = objects::service_account(d);
            cx.ensure(ns, stores.as_ref().map(|s| &s.service_accounts), object, |_, _| true).await
        }
        Want::RoleBinding { account, role } => {
            let object = objects::role_binding(d, account, role);
            let same: Same<RoleBinding> = |a, b| a.role_ref == b.role_ref && a.subjects == b.subjects;
            cx.ensure(ns, stores.as_ref().map(|s| &s.role_bindings), object, same).await
        }
        Want::ClientCertificate { .. } | Want::Token { .. } | Want::PodCertificate { .. } => Ok(Action::Unchanged),
    }
}

/// Removes what keyward provisioned in `namespace`, which opted out.
pub async fn opt_out(cx: &Context, namespace: &str) -> Result<(), Error> {
    let opted_in = BTreeSet::new();
    sweep_in(cx, Some(namespace), &opted_in).await
}

/// Removes what keyward provisioned per namespace where no longer wanted: namespaces that
/// opted out, and objects no profile wants any more.
pub async fn sweep(cx: &Context, opted_in: &BTreeSet<String>) -> Result<(), Error> {
    sweep_in(cx, None, opted_in).await
}

async fn sweep_in(cx: &Context, only: Option<&str>, opted_in: &BTreeSet<String>) -> Result<(), Error> {
    let mut wanted: BTreeMap<String, BTreeSet<(&'static str, String)>> = BTreeMap::new();
    for ns in opted_in {
        let (desired, _) = desired::for_namespace(&cx.profiles, ns, &cx.settings.operator_namespaces);
        wanted.insert(ns.clone(), desired.into_iter().map(|d| (d.want.object_kind(), d.name)).collect());
    }
    let keep = |kind: &'static str, ns: &str, name: &str| {
        only.is_some_and(|o| o != ns) || wanted.get(ns).is_some_and(|set| set.contains(&(kind, name.to_string())))
    };
    let stores = lock(&cx.stores).clone();
    let selector = objects::managed_selector(Scope::Namespace);
    sweep_kind(cx, "ConfigMap", stores.as_ref().map(|s| &s.config_maps), &selector, only, &keep).await?;
    // Without --provision-accounts keyward may not list them (and made none).
    if cx.settings.provision_accounts {
        sweep_kind(cx, "ServiceAccount", stores.as_ref().map(|s| &s.service_accounts), &selector, only, &keep).await?;
        sweep_kind(cx, "RoleBinding", stores.as_ref().map(|s| &s.role_bindings), &selector, only, &keep).await?;
    }
    // Secrets are not watched (keyward may not list them): a namespace's server CA Secrets
    // are found by the names the profiles give them.
    if let Some(ns) = only {
        let (desired, _) = desired::for_namespace(&cx.profiles, ns, &cx.settings.operator_namespaces);
        for d in desired.iter().filter(|d| matches!(d.want, Want::ServerCa { config_map: false, .. })) {
            let api = Api::<Secret>::namespaced(cx.client.clone(), ns);
            if let Some(secret) = api.get_opt(&d.name).await? {
                if is_managed(&secret.metadata)
                    && label(&secret.metadata, desired::PROVISIONED_FOR) == Some("namespace")
                {
                    cx.delete(&api, "Secret", ns, &d.name, secret.metadata.uid.clone()).await?;
                }
            }
        }
    }
    Ok(())
}

async fn sweep_kind<K>(
    cx: &Context,
    kind: &'static str,
    store: Option<&Store<K>>,
    selector: &str,
    only: Option<&str>,
    keep: &(dyn Fn(&'static str, &str, &str) -> bool + Sync),
) -> Result<(), Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let objects: Vec<Arc<K>> = match (store, only) {
        (Some(store), _) => store.state(),
        (None, Some(ns)) => list_all(Api::<K>::namespaced(cx.client.clone(), ns), selector).await?,
        (None, None) => list_all(Api::<K>::all(cx.client.clone()), selector).await?,
    };
    for object in objects {
        let (ns, name) = (object.namespace().unwrap_or_default(), object.name_any());
        let ours = is_managed(object.meta()) && label(object.meta(), desired::PROVISIONED_FOR) == Some("namespace");
        if !ours || only.is_some_and(|o| o != ns) || keep(kind, &ns, &name) {
            continue;
        }
        let api = Api::<K>::namespaced(cx.client.clone(), &ns);
        cx.delete(&api, kind, &ns, &name, object.meta().uid.clone()).await?;
    }
    Ok(())
}
