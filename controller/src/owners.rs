//! Per-owner credentials: for an owner whose pods keyward admitted, its client certificate
//! Secret (issued, renewed in place) and its generated token, each only after the owner is
//! verified to exist with the UID the pod names.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Secret;
use keyward_engine::attest::Verdict;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;

use crate::attestation::{first_of_its_attestation, refusal_note, Sibling};
use crate::context::{lock, namespace_ref, Context, Memo, OwnerCheck, OwnerResult};
use crate::desired::{Desired, Owner, PodClaim, Want};
use crate::error::Error;
use crate::identity::{self, Renewal, CA_CRT, TLS_CRT, TLS_KEY};
use crate::index::{OwnerKey, PodKey};
use crate::metrics::{Action, Refusal};
use crate::objects::{self, is_managed};
use crate::queue::Outcome;

/// Issues what an owner's pods need: `pods` are its live pods in opted-in namespaces, with
/// their claims. Returns when to come back (the next renewal).
pub async fn reconcile(cx: &Context, owner: &OwnerKey, pods: &[(PodKey, String, PodClaim)]) -> OwnerResult {
    let Some((_, _, first)) = pods.first() else {
        return Ok(Outcome::Done);
    };
    let keys = cx.attestation_keys().ok_or(Error::NoAttestationKeys)?;
    // Serve the pod whose attestation holds and which is not a copy of another's; report
    // the others once each.
    let verdicts: Vec<Verdict> = pods.iter().map(|(_, _, c)| c.attested(&keys)).collect();
    let siblings: Vec<Sibling> = pods
        .iter()
        .zip(&verdicts)
        .map(|((key, uid, c), v)| Sibling::of(&key.name, uid, &c.evidence, *v == Verdict::Valid))
        .collect();
    let mut served = None;
    for (((key, uid, c), me), verdict) in pods.iter().zip(&siblings).zip(&verdicts) {
        let refused = match Refusal::of(verdict) {
            Some(refusal) => Some((refusal, refusal_note(verdict))),
            None => first_of_its_attestation(me, &siblings).err().map(|why| (Refusal::DuplicateAttestation, why)),
        };
        match refused {
            None => served = served.or(Some(c)),
            Some((refusal, why)) => cx.report_pod(key, uid, refusal, &why).await,
        }
    }
    let attested = served.is_some();
    let claim = served.unwrap_or(first);
    let mut check = OwnerCheck::default();
    let mut next: Option<SystemTime> = None;
    let mut first_error = None;
    // Pod certificates are signed when the kubelet asks (`sign`), not per owner here.
    for d in claim.wants.iter().filter(|d| !matches!(d.want, Want::PodCertificate { .. })) {
        let result = match &d.want {
            Want::ClientCertificate { owner: o, identity } => {
                client_certificate(cx, d, o, identity, attested, &mut check).await
            }
            Want::Token { owner: o, key } => token(cx, d, o, key, attested, &mut check).await,
            _ => Ok((Action::Unchanged, None)),
        };
        let result = match result {
            Ok((action, renew_at)) => {
                if let Some(at) = renew_at {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
                Ok(action)
            }
            Err(e) => Err(e),
        };
        cx.record(d, Some(&claim.owner), result, Action::Issued, &mut first_error).await;
    }
    if check.missing {
        report_owner(cx, owner, &claim.owner).await;
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(match next {
        Some(at) => Outcome::At(tokio::time::Instant::now() + at.duration_since(SystemTime::now()).unwrap_or_default()),
        None => Outcome::Done,
    })
}

/// The client certificate for `owner`: issued, renewed, or left as it is. Returns what was
/// done and when to renew.
async fn client_certificate(
    cx: &Context,
    d: &Desired,
    owner: &Owner,
    identity: &str,
    attested: bool,
    check: &mut OwnerCheck,
) -> Result<(Action, Option<SystemTime>), Error> {
    let now = SystemTime::now();
    let ca_sha = cx.ca_sha();
    let memo = lock(&cx.memo).get(&(d.namespace.clone(), d.name.clone())).cloned();
    // The common cases, from memory: fresh (no request), or due (renew in place).
    if let Some(m) = memo.as_ref().filter(|m| m.owner_uid == owner.uid && !m.stale) {
        match m.renew_at {
            Some(at) if now < at && m.ca_sha == ca_sha => return Ok((Action::Unchanged, Some(at))),
            _ if attested || m.renew_at.is_some() => {
                if !cx.owner_verified(&d.namespace, owner, check).await? {
                    return Ok((Action::Unchanged, None));
                }
                match write_certificate(cx, d, owner, identity, Some(&m.resource_version)).await {
                    Ok(done) => return Ok(done),
                    // Changed or gone since: look again.
                    Err(Error::Kube(kube::Error::Api(s))) if s.is_conflict() || s.is_not_found() => {
                        lock(&cx.memo).remove(&(d.namespace.clone(), d.name.clone()));
                    }
                    Err(e) => return Err(e),
                }
            }
            _ => {}
        }
    }
    let api = Api::<Secret>::namespaced(cx.client.clone(), &d.namespace);
    let existing = if attested && memo.is_none() {
        // A new owner, the common case: verify it and create; read only on a conflict.
        if !cx.owner_verified(&d.namespace, owner, check).await? {
            return Ok((Action::Unchanged, None));
        }
        match write_certificate(cx, d, owner, identity, None).await {
            Ok(done) => return Ok(done),
            Err(Error::Kube(kube::Error::Api(s))) if s.is_already_exists() => api.get_opt(&d.name).await?,
            Err(e) => return Err(e),
        }
    } else {
        api.get_opt(&d.name).await?
    };
    let Some(existing) = existing else {
        if !attested || !cx.owner_verified(&d.namespace, owner, check).await? {
            return Ok((Action::Unchanged, None));
        }
        // Gone (deleted by someone, or between a create's conflict and this read).
        return write_certificate(cx, d, owner, identity, None).await;
    };
    if !is_managed(&existing.metadata) {
        return Ok((Action::Foreign, None));
    }
    let rv = existing.metadata.resource_version.clone().unwrap_or_default();
    let owned = owned_by(&existing.metadata, owner);
    let data = existing.data.as_ref();
    let get = |k: &str| data.and_then(|d| d.get(k)).map(|b| b.0.as_slice());
    let ca = cx.ca()?;
    if !attested {
        // No attestation: renew only a certificate keyward itself issued for this very
        // owner (an owner issued before attestations existed). Anything else is left
        // alone and reported: a Secret's labels and ownerReferences are anyone's to write.
        let ours = owned && get(TLS_CRT).is_some_and(|c| identity::issued_by(c, &ca));
        if !ours {
            report_secret(cx, d, owner).await;
            return Ok((Action::Unchanged, None));
        }
    }
    let why = if owned {
        match identity::renewal(get(TLS_CRT), get(TLS_KEY), get(CA_CRT), ca.cert_pem(), identity, now) {
            Renewal::Fresh { not_after } => {
                let renew_at = identity::renew_at(get(TLS_CRT)).unwrap_or(not_after);
                remember(cx, d, owner, &rv, Some((renew_at, not_after)), &ca_sha);
                return Ok((Action::Unchanged, Some(renew_at)));
            }
            Renewal::Due(reason) => reason,
        }
    } else {
        "it belongs to an earlier owner of that name".to_string()
    };
    if !cx.owner_verified(&d.namespace, owner, check).await? {
        return Ok((Action::Unchanged, None));
    }
    tracing::debug!(namespace = %d.namespace, name = %d.name, reason = %why, "renewing the client certificate");
    write_certificate(cx, d, owner, identity, Some(&rv)).await
}

/// Issues a certificate and writes it: a create, or an in-place update of the Secret at
/// `resource_version` (only data, keyward's labels and annotation, and the owner change).
async fn write_certificate(
    cx: &Context,
    d: &Desired,
    owner: &Owner,
    identity: &str,
    resource_version: Option<&str>,
) -> Result<(Action, Option<SystemTime>), Error> {
    let ca = cx.ca()?;
    let ca_sha = cx.ca_sha();
    let issued =
        identity::issue(&ca, &d.namespace, owner, identity, SystemTime::now(), cx.settings.client_cert_validity)?;
    let secret = objects::client_certificate_secret(d, owner, &issued.cert_pem, &issued.key_pem, &issued.ca_pem);
    let api = Api::<Secret>::namespaced(cx.client.clone(), &d.namespace);
    cx.leader.check()?;
    let (written, action) = match resource_version {
        None => (api.create(&PostParams::default(), &secret).await?, Action::Issued),
        Some(rv) => {
            let patch = objects::merge_patch(&secret, rv);
            (api.patch(&d.name, &PatchParams::default(), &Patch::Merge(&patch)).await?, Action::Renewed)
        }
    };
    let renew_at = identity::renew_at(Some(issued.cert_pem.as_bytes())).unwrap_or(issued.not_after);
    remember(
        cx,
        d,
        owner,
        written.metadata.resource_version.as_deref().unwrap_or_default(),
        Some((renew_at, issued.not_after)),
        &ca_sha,
    );
    tracing::info!(namespace = %d.namespace, name = %d.name, %identity, profile = %d.profile, action = action.as_str(), "client certificate written");
    Ok((action, Some(renew_at)))
}

fn remember(cx: &Context, d: &Desired, owner: &Owner, rv: &str, cert: Option<(SystemTime, SystemTime)>, ca_sha: &str) {
    let (renew_at, not_after) = (cert.map(|c| c.0), cert.map(|c| c.1));
    let memo = Memo {
        resource_version: rv.to_string(),
        owner_uid: owner.uid.clone(),
        renew_at,
        ca_sha: ca_sha.to_string(),
        stale: false,
        not_after,
    };
    lock(&cx.memo).insert((d.namespace.clone(), d.name.clone()), memo);
}

/// A generated token for `owner`: created once, never replaced (a new one would lock out
/// whoever holds the old).
async fn token(
    cx: &Context,
    d: &Desired,
    owner: &Owner,
    key: &str,
    attested: bool,
    check: &mut OwnerCheck,
) -> Result<(Action, Option<SystemTime>), Error> {
    let memo = lock(&cx.memo).get(&(d.namespace.clone(), d.name.clone())).cloned();
    if memo.as_ref().is_some_and(|m| m.owner_uid == owner.uid && !m.stale) {
        return Ok((Action::Unchanged, None));
    }
    let api = Api::<Secret>::namespaced(cx.client.clone(), &d.namespace);
    let existing = if attested && memo.is_none() { None } else { api.get_opt(&d.name).await? };
    let existing = match existing {
        Some(existing) => existing,
        None if !attested => return Ok((Action::Unchanged, None)),
        None => {
            if !cx.owner_verified(&d.namespace, owner, check).await? {
                return Ok((Action::Unchanged, None));
            }
            let secret = objects::token_secret(d, owner, key, &identity::generate_token()?);
            cx.leader.check()?;
            match api.create(&PostParams::default(), &secret).await {
                Ok(created) => {
                    tracing::info!(namespace = %d.namespace, name = %d.name, profile = %d.profile, "token generated");
                    remember(cx, d, owner, created.metadata.resource_version.as_deref().unwrap_or_default(), None, "");
                    return Ok((Action::Issued, None));
                }
                Err(kube::Error::Api(s)) if s.is_already_exists() => match api.get_opt(&d.name).await? {
                    Some(existing) => existing,
                    None => return Err(Error::Stale(format!("{}/{}", d.namespace, d.name))),
                },
                Err(e) => return Err(e.into()),
            }
        }
    };
    if !is_managed(&existing.metadata) {
        return Ok((Action::Foreign, None));
    }
    let rv = existing.metadata.resource_version.clone().unwrap_or_default();
    let has_key = existing.data.as_ref().is_some_and(|data| data.contains_key(key));
    if has_key && owned_by(&existing.metadata, owner) {
        remember(cx, d, owner, &rv, None, "");
        return Ok((Action::Unchanged, None));
    }
    if !attested {
        report_secret(cx, d, owner).await;
        return Ok((Action::Unchanged, None));
    }
    // Keyward's Secret, for an earlier owner or without its key: take it over for this
    // owner, keeping its token (and any other keys) when it has one.
    let mut data = BTreeMap::new();
    if !has_key {
        tracing::warn!(namespace = %d.namespace, name = %d.name, key, "the token Secret lacks its key; adding a new token under it (the Secret's other keys are kept)");
        data.insert(key.to_string(), k8s_openapi::ByteString(identity::generate_token()?.into_bytes()));
    }
    let mut secret = objects::token_secret(d, owner, key, "");
    secret.data = Some(data);
    let patch = objects::merge_patch(&secret, &rv);
    cx.leader.check()?;
    let written = api.patch(&d.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    remember(cx, d, owner, written.metadata.resource_version.as_deref().unwrap_or_default(), None, "");
    Ok((Action::Issued, None))
}

async fn report_owner(cx: &Context, key: &OwnerKey, owner: &Owner) {
    if !lock(&cx.reported).insert((key.uid.clone(), Refusal::OwnerMissing)) {
        return;
    }
    cx.metrics.refused(Refusal::OwnerMissing);
    tracing::warn!(namespace = %key.namespace, owner_kind = %owner.kind, owner = %owner.name, uid = %owner.uid,
        "the pod's controller owner does not exist with the UID the pod names; nothing issued");
}

/// A Secret with keyward's labels that keyward cannot vouch for: left alone, reported.
async fn report_secret(cx: &Context, d: &Desired, owner: &Owner) {
    if !lock(&cx.reported).insert((format!("{}/{}", d.namespace, d.name), Refusal::UnverifiedSecret)) {
        return;
    }
    cx.metrics.refused(Refusal::UnverifiedSecret);
    let note = format!(
        "Secret {}/{} carries keyward's labels but holds nothing keyward issued for {} {} (uid {}), and the pod has no admission attestation; keyward leaves it alone. Delete it, and have the operator create the pod again",
        d.namespace, d.name, owner.kind, owner.name, owner.uid
    );
    tracing::warn!(namespace = %d.namespace, name = %d.name, "a Secret with keyward's labels that keyward did not issue; left alone");
    cx.event("UnverifiedSecret", &note, "Issue", &namespace_ref(&d.namespace)).await;
}

fn owned_by(meta: &kube::api::ObjectMeta, owner: &Owner) -> bool {
    meta.owner_references.iter().flatten().any(|r| r.uid == owner.uid && r.controller == Some(true))
}
