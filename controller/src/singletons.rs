//! The cluster-scoped singletons the leader keeps: the cluster facts the webhook reads, the
//! attestation keys, the self-managed serving certificate and client CA, and the webhook
//! configuration's `matchConditions`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use keyward_certs::attestation::{self, Keys};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

use crate::context::Context;
use crate::error::Error;
use crate::metrics::Action;
use crate::objects::{self, is_managed};
use crate::queue::Outcome;

/// Writes the cluster facts (whether this controller signs pod certificates, from its
/// discovery) where the webhook reads them: `delivery: auto` resolves the same in both.
pub async fn publish_cluster_facts(cx: &Context) -> Result<(), Error> {
    let ns = &cx.settings.namespace;
    let object = objects::cluster_facts_config_map(ns, &cx.profiles.facts());
    // Read fresh, not from the watched store: its own watch calls this the moment the
    // ConfigMap is deleted, when the store may not have seen the deletion yet.
    match cx.ensure::<ConfigMap>(ns, None, object, |a, b| a.data == b.data).await {
        Ok(Action::Foreign) => {
            cx.metrics.object("cluster-facts", Action::Foreign, true);
            tracing::warn!(namespace = %ns, name = keyward_engine::cluster::CONFIG_MAP, "a ConfigMap keyward does not manage has the cluster facts' name; left alone (the webhook reads it: delete it, or make it say what this controller found)");
            Ok(())
        }
        Ok(action) => {
            cx.metrics.object("cluster-facts", action, true);
            Ok(())
        }
        Err(e) => {
            cx.metrics.object("cluster-facts", Action::Provisioned, false);
            Err(e)
        }
    }
}

/// Makes the attestation key Secret exist, rotates it when due, and loads its keys. Returns
/// when the next rotation is due.
pub async fn attestation_key(cx: &Context) -> Result<Outcome, Error> {
    let (ns, name) = (&cx.settings.namespace, &cx.settings.attestation_secret);
    let api = Api::<Secret>::namespaced(cx.client.clone(), ns);
    let now = time::OffsetDateTime::now_utc();
    let rfc3339 =
        |t: time::OffsetDateTime| t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
    let rotation = time::Duration::try_from(cx.settings.attestation_rotation).unwrap_or(time::Duration::WEEK);
    let existing = api.get_opt(name).await?;
    let read = |secret: &Secret, file: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(file))
            .and_then(|b| attestation::Key::from_bytes(&b.0, file).ok().map(|k| (k, b.0.clone())))
    };
    let (keys, rotated_at) = match existing {
        None => {
            let current = attestation::generate()?;
            let secret = objects::attestation_secret(ns, name, &current, None, &rfc3339(now));
            cx.leader.check()?;
            match api.create(&PostParams::default(), &secret).await {
                Ok(_) => tracing::info!(namespace = %ns, name = %name, "attestation key created"),
                // Another replica made it a moment ago: read it next time.
                Err(kube::Error::Api(s)) if s.is_already_exists() => {
                    return Ok(Outcome::At(tokio::time::Instant::now()))
                }
                Err(e) => return Err(e.into()),
            }
            (Keys { current: Some(attestation::Key::from_bytes(&current, "current")?), previous: None }, now)
        }
        Some(secret) if !is_managed(&secret.metadata) => {
            return Err(Error::Source {
                what: format!("Secret {ns}/{name}"),
                reason: "exists and is not managed by keyward (no label app.kubernetes.io/managed-by=keyward); remove it, or name another with --attestation-secret".into(),
            });
        }
        Some(secret) => {
            let rotated_at = secret
                .annotations()
                .get(objects::ROTATED_AT)
                .and_then(|t| time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok());
            let current = read(&secret, attestation::CURRENT_FILE);
            let due = rotated_at.is_none_or(|t| now >= t + rotation) || current.is_none();
            if due {
                // Rotate: the current key becomes the previous one, which still verifies.
                let fresh = attestation::generate()?;
                let previous = current.as_ref().map(|(_, bytes)| bytes.clone());
                let desired = objects::attestation_secret(ns, name, &fresh, previous.as_deref(), &rfc3339(now));
                let mut patch =
                    objects::merge_patch(&desired, secret.metadata.resource_version.as_deref().unwrap_or_default());
                if previous.is_none() {
                    patch["data"][attestation::PREVIOUS_FILE] = serde_json::Value::Null;
                }
                cx.leader.check()?;
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                tracing::info!(namespace = %ns, name = %name, "attestation key rotated; the previous key stays valid for one more period");
                let previous = current.map(|(k, _)| k);
                (Keys { current: Some(attestation::Key::from_bytes(&fresh, "current")?), previous }, now)
            } else {
                let keys = Keys {
                    current: current.map(|(k, _)| k),
                    previous: read(&secret, attestation::PREVIOUS_FILE).map(|(k, _)| k),
                };
                (keys, rotated_at.unwrap_or(now))
            }
        }
    };
    cx.keys.store(Arc::new(Some(keys)));
    let next = rotated_at + rotation - now;
    let wait = Duration::try_from(next).unwrap_or_default().max(Duration::from_secs(1));
    Ok(Outcome::At(tokio::time::Instant::now() + wait))
}

/// The self-managed serving certificate and `caBundle`, and the self-managed client CA,
/// when keyward manages them.
pub async fn serving_cert(cx: &Context) -> Result<Outcome, Error> {
    let ns = &cx.settings.namespace;
    if let Some(name) = &cx.settings.client_ca_secret {
        let validity = Duration::from_secs(10 * 365 * 86_400);
        crate::self_managed::client_ca(&cx.client, &cx.leader, &cx.metrics, ns, name, validity).await?;
    }
    match &cx.settings.serving {
        Some(serving) => crate::self_managed::reconcile(&cx.client, &cx.leader, &cx.metrics, ns, serving).await,
        None => Ok(Outcome::Done),
    }
}

/// The webhook configuration's `matchConditions`, when keyward keeps them.
pub async fn match_conditions(cx: &Context) -> Result<Outcome, Error> {
    match &cx.settings.match_conditions_of {
        Some(name) => crate::webhook_config::reconcile(&cx.client, &cx.leader, &cx.metrics, name, &cx.profiles).await,
        None => Ok(Outcome::Done),
    }
}
