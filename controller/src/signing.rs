//! Pod certificate signing: answers keyward's signers' PodCertificateRequests, deciding with
//! [`crate::signer`] (pure) on facts read fresh from the API.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use kube::api::{DynamicObject, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource};

use crate::attestation::first_of_its_attestation;
use crate::context::{label, Context, OwnerCheck, OwnerPods};
use crate::desired;
use crate::error::Error;
use crate::identity;
use crate::index::OwnerKey;
use crate::metrics::Refusal;
use crate::queue::Outcome;
use crate::signer;

/// Answers the PodCertificateRequest `namespace/name` if it is for one of keyward's signers
/// and not answered yet: the owner's certificate for the kubelet's key, or a denial that
/// says why (and an Event on the request). Every fact is read fresh from the API: a denial
/// is final for the pod.
pub async fn sign(
    cx: &Context,
    version: signer::ApiVersion,
    namespace: &str,
    name: &str,
    siblings: &OwnerPods<'_>,
) -> Result<Outcome, Error> {
    if cx.settings.pod_certificates.is_empty() {
        return Ok(Outcome::Done);
    }
    let api = Api::<DynamicObject>::namespaced_with(cx.client.clone(), namespace, &version.api_resource());
    let Some(object) = api.get_opt(name).await? else {
        return Ok(Outcome::Done);
    };
    let request = match signer::Request::read(&object) {
        Ok(r) if !r.decided && signer::is_keyward_signer(&r.signer_name) => r,
        Ok(_) => return Ok(Outcome::Done),
        Err(why) => {
            tracing::warn!(%namespace, %name, %why, "a PodCertificateRequest keyward cannot read; left alone");
            return Ok(Outcome::Done);
        }
    };
    if signer::answered_elsewhere(&request, version, &cx.settings.pod_certificates) {
        tracing::debug!(%namespace, %name, "no key readable at v1: answered at v1beta1");
        return Ok(Outcome::Done);
    }
    let keys = cx.attestation_keys().ok_or(Error::NoAttestationKeys)?;
    let opted_in = Api::<Namespace>::all(cx.client.clone())
        .get_opt(namespace)
        .await?
        .is_some_and(|n| label(&n.metadata, desired::OPT_IN.0) == Some(desired::OPT_IN.1));
    let pod = Api::<DynamicObject>::namespaced_with(cx.client.clone(), namespace, &crate::objects::pod_resource())
        .get_opt(&request.pod_name)
        .await?
        .and_then(|p| serde_json::value::to_raw_value(&p).ok());
    let facts = signer::Facts {
        pod: pod.as_deref(),
        opted_in,
        keys: &keys,
        trust_domain: &cx.settings.trust_domain,
        validity: cx.settings.client_cert_validity,
    };
    let now = SystemTime::now();
    let generation = object.metadata.generation;
    let verdict = match signer::decide(&request, &cx.profiles, facts) {
        signer::Verdict::Issue { owner, identity, profile, validity, pod } => {
            let mut check = OwnerCheck::default();
            let owner_key = OwnerKey { namespace: namespace.to_string(), uid: owner.uid.clone() };
            let Some(others) = siblings(&owner_key, &keys) else {
                tracing::debug!(%namespace, %name, "the pod watches have not listed yet; the request waits a second");
                return Ok(Outcome::At(tokio::time::Instant::now() + Duration::from_secs(1)));
            };
            if let Err(why) = first_of_its_attestation(&pod, &others) {
                let reason = Refusal::DuplicateAttestation.denial_reason();
                Err((reason, format!("pod {namespace}/{}: {why}", request.pod_name)))
            } else if cx.owner_verified(namespace, &owner, &mut check).await? {
                Ok((owner, identity, profile, validity))
            } else {
                Err((
                    "OwnerMissing",
                    format!(
                        "its owner {} {} does not exist with UID {}: keyward issues only for a live owner",
                        owner.kind, owner.name, owner.uid
                    ),
                ))
            }
        }
        signer::Verdict::Deny { reason, message } => Err((reason, message)),
    };
    let regarding = object.object_ref(&version.api_resource());
    let (status, result, note) = match verdict {
        Ok((owner, identity, profile, validity)) => {
            let window = signer::window(now, validity);
            let issued = request
                .public_key
                .as_deref()
                .map_err(|reason| Error::Source { what: "the requested public key".into(), reason: reason.clone() })
                .and_then(|spki| identity::issue_for_key(&cx.ca()?, namespace, &owner, &identity, spki, &window));
            let chain = match issued {
                Ok(chain) => chain,
                Err(e) => return Err(sign_failed(cx, &regarding, e).await),
            };
            let not_after = keyward_certs::rfc3339(window.not_after);
            tracing::info!(%namespace, %name, pod = %request.pod_name, %identity, %profile, %not_after, "pod certificate issued");
            let note = format!("issued {identity} for pod {}, valid until {not_after}", request.pod_name);
            (signer::issued_status(&chain, &window, &identity, now, generation), "issued", note)
        }
        Err((reason, message)) => {
            tracing::warn!(%namespace, %name, pod = %request.pod_name, %reason, %message, "pod certificate request denied");
            (signer::denied_status(reason, &message, now, generation), "denied", message)
        }
    };
    let mut answered = object.clone();
    answered.data["status"] = status;
    cx.leader.check()?;
    if let Err(e) = api.replace_status(name, &PostParams::default(), &answered).await {
        return Err(sign_failed(cx, &regarding, e.into()).await);
    }
    cx.metrics.pod_certificate(result);
    match result {
        "issued" => cx.publish(EventType::Normal, "PodCertificateIssued", &note, "Sign", &regarding).await,
        _ => cx.event("PodCertificateDenied", &note, "Sign", &regarding).await,
    }
    Ok(Outcome::Done)
}

/// A request that could not be answered (retried with backoff): counted, and a Warning
/// Event on it saying why.
async fn sign_failed(cx: &Context, regarding: &ObjectReference, e: Error) -> Error {
    cx.metrics.pod_certificate("failed");
    let note = format!("keyward could not answer this request and retries: {e}");
    cx.event("PodCertificateFailed", &note, "Sign", regarding).await;
    e
}
