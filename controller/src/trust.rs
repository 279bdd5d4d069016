//! Trust publication: the client CA as ConfigMaps in `--publish-client-ca-to` and as one
//! signer-linked ClusterTrustBundle per pod certificate signer (with the replaced CA kept for
//! the overlap), and the server CAs the profiles deliver as ClusterTrustBundles.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use keyward_certs::pki::Ca;
use kube::api::{DeleteParams, DynamicObject, PostParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use crate::conditions::Condition;
use crate::context::{label, list_all, lock, Context};
use crate::desired;
use crate::error::Error;
use crate::identity;
use crate::metrics::Action;
use crate::objects::{self, is_managed, Scope};
use crate::signer;

/// Publishes the client CA's certificate to the namespaces named, and removes it from
/// those no longer named.
pub async fn publish_client_ca(cx: &Context) -> Result<(), Error> {
    // The trust bundles and the ConfigMaps are independent: one failing does not hold up
    // the other (the first error is returned, and the key retried).
    let bundles = publish_trust_bundles(cx).await;
    if cx.settings.publish_client_ca_to.is_empty() {
        return bundles;
    }
    let ca = cx.ca()?;
    let mut first_error = None;
    let stores = lock(&cx.stores).clone();
    for ns in &cx.settings.publish_client_ca_to {
        // Nothing is published into a namespace that does not exist (creating the ConfigMap
        // would fail, every time): reported, and published when the namespace appears.
        match Api::<Namespace>::all(cx.client.clone()).get_opt(ns).await {
            Ok(Some(_)) => cx.resolve(Condition::ClientCaNamespaceMissing, ns),
            Ok(None) => {
                let note = format!(
                    "--publish-client-ca-to names namespace {ns:?}, which does not exist; the client CA is published there when it is created"
                );
                cx.raise(Condition::ClientCaNamespaceMissing, ns, &note, None).await;
                continue;
            }
            Err(e) => {
                first_error.get_or_insert(e.into());
                continue;
            }
        }
        // The CA it replaced stays beside it as long as a certificate it signed can be
        // presented, as in the trust bundles.
        let name = &cx.settings.client_ca_config_map;
        let existing = match &stores {
            Some(s) => s.config_maps.get(&ObjectRef::new(name).within(ns)).map(|o| (*o).clone()),
            None => Api::<ConfigMap>::namespaced(cx.client.clone(), ns).get_opt(name).await?,
        };
        let there = existing.as_ref().filter(|cm| is_managed(&cm.metadata)).map(|cm| {
            (cm.data.as_ref().and_then(|d| d.get(identity::CA_CRT)).map_or("", String::as_str), &cm.metadata)
        });
        let (bundle, until) = client_ca_bundle(cx, &ca, there);
        let object = objects::client_ca_config_map(ns, name, &bundle, until);
        let same = |a: &ConfigMap, b: &ConfigMap| {
            a.data == b.data && previous_until(&a.metadata) == previous_until(&b.metadata)
        };
        match cx.ensure(ns, stores.as_ref().map(|s| &s.config_maps), object, same).await {
            Ok(Action::Foreign) => {
                cx.metrics.object("client-ca", Action::Foreign, true);
                tracing::warn!(namespace = %ns, name = %cx.settings.client_ca_config_map, "a ConfigMap keyward does not manage has the client CA's name; left alone");
            }
            Ok(action) => cx.metrics.object("client-ca", action, true),
            Err(e) => {
                cx.metrics.object("client-ca", Action::Provisioned, false);
                first_error.get_or_insert(e);
            }
        }
    }
    // Published where no longer named: removed (found in the watched ConfigMaps).
    let named: BTreeSet<&String> = cx.settings.publish_client_ca_to.iter().collect();
    let published: Vec<Arc<ConfigMap>> = match &stores {
        Some(s) => s.config_maps.state(),
        None => list_all(Api::<ConfigMap>::all(cx.client.clone()), &objects::managed_selector(Scope::ClientCa)).await?,
    };
    for cm in published {
        let ns = cm.namespace().unwrap_or_default();
        let ours = is_managed(&cm.metadata) && label(&cm.metadata, desired::PROVISIONED_FOR) == Some("client-ca");
        if ours && cm.name_any() == cx.settings.client_ca_config_map && !named.contains(&ns) {
            let api = Api::<ConfigMap>::namespaced(cx.client.clone(), &ns);
            cx.delete(&api, "ConfigMap", &ns, &cm.name_any(), cm.metadata.uid.clone()).await?;
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => bundles,
    }
}

/// What a published client CA holds now, given what it held (its PEM and metadata): the
/// current CA, and the one it replaced while a certificate that one signed can still be
/// presented. With until when.
fn client_ca_bundle(
    cx: &Context,
    ca: &Ca,
    there: Option<(&str, &kube::api::ObjectMeta)>,
) -> (String, Option<SystemTime>) {
    signer::trust_bundle(
        ca.cert_pem(),
        there.map(|(pem, meta)| (pem, previous_until(meta))),
        SystemTime::now(),
        signer::trust_overlap(cx.settings.client_cert_validity),
    )
}

/// One ClusterTrustBundle per signer the profiles use, linked to it, holding the client CA
/// (and, after a rotation, the CA it replaced, until everything that one signed expired);
/// bundles of signers no profile uses any more are deleted. Only keyward's own are touched.
async fn publish_trust_bundles(cx: &Context) -> Result<(), Error> {
    let Some(version) = cx.settings.trust_bundles else {
        return Ok(());
    };
    let resource = version.trust_bundles();
    let api = Api::<DynamicObject>::all_with(cx.client.clone(), &resource);
    let signers = signer::signers(&cx.profiles);
    let wanted: BTreeSet<String> = signers.iter().map(|(s, _)| signer::trust_bundle_name(s)).collect();
    if !signers.is_empty() {
        let ca = cx.ca()?;
        for (signer_name, profile) in &signers {
            let name = signer::trust_bundle_name(signer_name);
            let existing = api.get_opt(&name).await?;
            if let Some(e) = &existing {
                if !is_managed(&e.metadata) {
                    cx.metrics.object("trust-bundle", Action::Foreign, true);
                    tracing::warn!(%name, "a ClusterTrustBundle keyward does not manage has its name; left alone");
                    continue;
                }
            }
            let there =
                existing.as_ref().map(|e| (e.data["spec"]["trustBundle"].as_str().unwrap_or_default(), &e.metadata));
            let (bundle, until) = client_ca_bundle(cx, &ca, there);
            if there.is_some_and(|(b, meta)| b == bundle && previous_until(meta) == until) {
                cx.metrics.object("trust-bundle", Action::Unchanged, true);
                continue;
            }
            let mut meta = objects::meta("", &name, Some(profile), Scope::ClientCa, None);
            let annotations = meta.annotations.get_or_insert_with(Default::default);
            if let Some(t) = until {
                annotations.insert(signer::PREVIOUS_UNTIL.into(), keyward_certs::rfc3339(t));
            }
            let spec = serde_json::json!({"signerName": signer_name, "trustBundle": bundle});
            let action = put_trust_bundle(cx, &api, &resource, meta, spec, existing.as_ref()).await?;
            cx.metrics.object("trust-bundle", action, true);
            tracing::info!(%name, signer = %signer_name, certificates = if until.is_some() { 2 } else { 1 }, "client CA trust bundle written");
        }
    }
    let unwanted = |name: &str| !wanted.contains(name);
    remove_trust_bundles(
        cx,
        &api,
        Scope::ClientCa,
        unwanted,
        "trust-bundle",
        "client CA trust bundle of a signer no profile uses",
    )
    .await
}

/// The server CAs the profiles deliver by `clusterTrustBundle` projection, each published
/// once for the cluster as an unlinked ClusterTrustBundle of the name the profile gives,
/// from its source (read again at each resync, so a rotated CA follows); keyward's bundles
/// no profile wants any more are deleted. One whose source is unusable keeps what it holds.
pub async fn publish_server_ca_bundles(cx: &Context) -> Result<(), Error> {
    let (wanted, problems) = desired::trust_bundles(&cx.profiles, &cx.settings.operator_namespaces);
    for p in &problems {
        tracing::warn!(profile = %p.profile, reason = %p.reason, "a server CA trust bundle cannot be planned");
    }
    let Some(version) = cx.settings.trust_bundles else {
        if !wanted.is_empty() {
            tracing::error!(
                bundles = ?wanted.iter().map(|w| &w.name).collect::<Vec<_>>(),
                "profiles deliver a server CA by clusterTrustBundle projection, but this cluster serves no ClusterTrustBundle API: their pods do not start; enable it (see the README, \"Pod certificates\") or use configMapName"
            );
        }
        return Ok(());
    };
    let resource = version.trust_bundles();
    let api = Api::<DynamicObject>::all_with(cx.client.clone(), &resource);
    let mut first_error = None;
    for w in &wanted {
        let subject = format!("ClusterTrustBundle {}", w.name);
        let pem = match cx.source(&w.source).await {
            Ok(pem) => pem,
            Err(Error::Source { what, reason }) => {
                let note = format!(
                    "{subject} for profile {:?} is not published: {what}: {reason}; pods that need it wait until the source holds a CA certificate",
                    w.profile
                );
                cx.raise(Condition::ServerCaSourceUnusable, &subject, &note, None).await;
                continue;
            }
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        cx.resolve(Condition::ServerCaSourceUnusable, &subject);
        match write_bundle(cx, &api, &resource, w, &pem).await {
            Ok(action) => cx.metrics.object("server-ca-bundle", action, true),
            Err(e) => {
                cx.metrics.object("server-ca-bundle", Action::Provisioned, false);
                tracing::warn!(error = %e, name = %w.name, "publishing the server CA trust bundle failed; will retry");
                first_error.get_or_insert(e);
            }
        }
    }
    let names: BTreeSet<&str> = wanted.iter().map(|w| w.name.as_str()).collect();
    let unwanted = |name: &str| !names.contains(name);
    remove_trust_bundles(
        cx,
        &api,
        Scope::ServerCaBundle,
        unwanted,
        "server-ca-bundle",
        "server CA trust bundle no profile delivers",
    )
    .await?;
    first_error.map_or(Ok(()), Err)
}

/// Creates or replaces one server CA bundle; another's of that name is left alone.
async fn write_bundle(
    cx: &Context,
    api: &Api<DynamicObject>,
    resource: &kube::api::ApiResource,
    w: &desired::WantedBundle,
    pem: &str,
) -> Result<Action, Error> {
    let existing = api.get_opt(&w.name).await?;
    if let Some(e) = &existing {
        if !is_managed(&e.metadata) {
            tracing::warn!(name = %w.name, profile = %w.profile, "a ClusterTrustBundle keyward does not manage has the server CA bundle's name; left alone");
            return Ok(Action::Foreign);
        }
        if e.data["spec"]["trustBundle"].as_str() == Some(pem) && e.data["spec"]["signerName"].is_null() {
            return Ok(Action::Unchanged);
        }
    }
    let meta = objects::meta("", &w.name, Some(&w.profile), Scope::ServerCaBundle, None);
    let spec = serde_json::json!({"trustBundle": pem});
    let action = put_trust_bundle(cx, api, resource, meta, spec, existing.as_ref()).await?;
    match action {
        Action::Provisioned => {
            tracing::info!(name = %w.name, profile = %w.profile, "server CA trust bundle published")
        }
        _ => tracing::info!(name = %w.name, profile = %w.profile, "server CA trust bundle updated from its source"),
    }
    Ok(action)
}

/// Creates the ClusterTrustBundle `meta` names with `spec`, or replaces `existing` at the
/// version read (changed since: a 409, and the key is retried).
async fn put_trust_bundle(
    cx: &Context,
    api: &Api<DynamicObject>,
    resource: &kube::api::ApiResource,
    mut meta: kube::api::ObjectMeta,
    spec: serde_json::Value,
    existing: Option<&DynamicObject>,
) -> Result<Action, Error> {
    let name = meta.name.clone().unwrap_or_default();
    // Cluster-scoped.
    meta.namespace = None;
    meta.resource_version = existing.and_then(|e| e.metadata.resource_version.clone());
    let mut object = DynamicObject::new(&name, resource);
    object.metadata = meta;
    object.data = serde_json::json!({ "spec": spec });
    cx.leader.check()?;
    if existing.is_some() {
        api.replace(&name, &PostParams::default(), &object).await?;
        Ok(Action::Renewed)
    } else {
        api.create(&PostParams::default(), &object).await?;
        Ok(Action::Provisioned)
    }
}

/// Deletes keyward's ClusterTrustBundles of `scope` whose names are `unwanted`.
async fn remove_trust_bundles(
    cx: &Context,
    api: &Api<DynamicObject>,
    scope: Scope,
    unwanted: impl Fn(&str) -> bool,
    metric: &'static str,
    what: &str,
) -> Result<(), Error> {
    for bundle in list_all(api.clone(), &objects::managed_selector(scope)).await? {
        let name = bundle.name_any();
        if is_managed(&bundle.metadata) && unwanted(&name) {
            cx.leader.check()?;
            // Only the bundle listed: one of that name made since by someone else (after an
            // admin deleted keyward's) is theirs, and the apiserver refuses the delete with 409.
            let params = DeleteParams {
                preconditions: bundle
                    .metadata
                    .uid
                    .clone()
                    .map(|uid| Preconditions { uid: Some(uid), resource_version: None }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {
                    cx.metrics.object(metric, Action::Deleted, true);
                    tracing::info!(%name, "{what} removed");
                }
                // Gone already, or no longer the one listed: nothing of keyward's to remove.
                Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => {}
                Err(e) => {
                    cx.metrics.object(metric, Action::Deleted, false);
                    return Err(e.into());
                }
            }
        }
    }
    Ok(())
}

/// Until when a published client CA bundle keeps the CA it replaced (its annotation).
fn previous_until(meta: &kube::api::ObjectMeta) -> Option<SystemTime> {
    meta.annotations.as_ref()?.get(signer::PREVIOUS_UNTIL).and_then(|t| keyward_certs::parse_rfc3339(t))
}
