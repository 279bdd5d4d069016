//! PodCertificateRequests as the kubelet makes them, and the checks the apiserver makes on a
//! signer's status update, so that a status the fake accepts is one a real apiserver accepts.
//!
//! Followed: kubernetes/kubernetes v1.35 and v1.36, `pkg/kubelet/podcertificate/
//! podcertificatemanager.go` (the request: `generateName: req-`, owned by the pod, no labels)
//! and `pkg/apis/certificates/validation/validation.go`
//! (`ValidatePodCertificateRequestStatusUpdate`): conditions only of the types Issued, Denied
//! and Failed, at most one, `True`, with a reason, a transition time, a message of at most 32 KiB
//! and a generation not below zero; once terminal, no change (the same status written again is
//! accepted); otherwise no change but a transition to a terminal condition: nothing else on a
//! denial; on issue a PEM chain whose leaf certifies the requested key, `notBefore`/`notAfter`
//! equal to the leaf's, `notBefore` within five minutes of the apiserver's clock, a life of one
//! hour to `maxExpirationSeconds`, and `beginRefreshAt` at least ten minutes inside both ends.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{json, Value};
use x509_parser::prelude::FromDer;

/// What the kubelet puts in a request's spec for the key it made.
pub enum KeyField<'a> {
    /// Kubernetes 1.35 (v1beta1): `pkixPublicKey` (DER SubjectPublicKeyInfo) with a proof of
    /// possession.
    Pkix(&'a [u8]),
    /// Kubernetes 1.36 on: `stubPKCS10Request`, a PKCS#10 request with nothing but the key.
    Stub(&'a [u8]),
}

/// The request the kubelet on `node` makes for `pod` (as stored: with its UID, service account
/// and node), for `signer`, as the apiserver stores it.
pub fn request(api_version: &str, name: &str, pod: &Value, signer: &str, key: KeyField<'_>) -> Value {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut spec = json!({
        "signerName": signer,
        "podName": pod["metadata"]["name"],
        "podUID": pod["metadata"]["uid"],
        "serviceAccountName": pod["spec"]["serviceAccountName"].as_str().unwrap_or("default"),
        "serviceAccountUID": "8a4c6f38-6a55-4c1d-9d8e-2f3a1b0c9d7e",
        "nodeName": pod["spec"]["nodeName"],
        "nodeUID": "0b7f6c1e-4a9d-4e2b-8c3f-5d6e7f8a9b0c",
        "maxExpirationSeconds": 86400,
    });
    match key {
        KeyField::Pkix(spki) => {
            spec["pkixPublicKey"] = json!(b64(spki));
            // Checked by the apiserver only; keyward does not read it.
            spec["proofOfPossession"] = json!(b64(b"signature-over-the-pod-uid"));
        }
        KeyField::Stub(csr) => spec["stubPKCS10Request"] = json!(b64(csr)),
    }
    json!({
        "apiVersion": api_version,
        "kind": "PodCertificateRequest",
        "metadata": {
            "name": name,
            "generateName": "req-",
            "namespace": pod["metadata"]["namespace"],
            "generation": 1,
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]
        },
        "spec": spec,
    })
}

/// The apiserver's checks on a status update of `current` to `status`, at `now`, in its order:
/// the conditions' form, then immutability once terminal (an unchanged status may be written
/// again), then a transition to Issued, Denied or Failed, and nothing else.
pub fn validate_status_update(current: &Value, status: &Value, now: SystemTime) -> Result<(), String> {
    let no_conditions = Vec::new();
    let conditions = match &status["conditions"] {
        Value::Null => &no_conditions,
        other => other.as_array().ok_or("status.conditions: Invalid value: not a list")?,
    };
    let mut terminal = None;
    for (i, condition) in conditions.iter().enumerate() {
        let kind = condition["type"].as_str().unwrap_or_default();
        if !matches!(kind, "Issued" | "Denied" | "Failed") {
            return Err(format!("status.conditions[{i}].type: Unsupported value: {kind:?}"));
        }
        if terminal.replace(kind).is_some() {
            return Err("status.conditions: Invalid value: There may be at most one condition with type \"Issued\", \"Denied\", or \"Failed\"".into());
        }
        if condition["status"] != "True" {
            return Err(format!("status.conditions[{i}].status: Unsupported value: must be \"True\""));
        }
        let reason = condition["reason"].as_str().unwrap_or_default();
        let reason_ok = reason.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && reason.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':'))
            && !reason.ends_with([',', ':']);
        if !reason_ok || reason.len() > 1024 {
            return Err(format!("status.conditions[{i}].reason: Invalid value: {reason:?}"));
        }
        if condition["message"].as_str().is_some_and(|m| m.len() > 32_768) {
            return Err(format!("status.conditions[{i}].message: Too long: may not be more than 32768 bytes"));
        }
        if condition["observedGeneration"].as_i64().is_some_and(|g| g < 0) {
            return Err(format!("status.conditions[{i}].observedGeneration: Invalid value: must be >= 0"));
        }
        time(&condition["lastTransitionTime"])
            .map_err(|e| format!("status.conditions[{i}].lastTransitionTime: {e}"))?;
    }
    let was_terminal = current["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| matches!(c["type"].as_str(), Some("Issued" | "Denied" | "Failed"))));
    let empty = json!({});
    let old = if current["status"].is_null() { &empty } else { &current["status"] };
    if was_terminal {
        return if same_status(old, status) {
            Ok(())
        } else {
            Err("status: Invalid value: immutable after PodCertificateRequest is issued, denied, or failed".into())
        };
    }
    let Some(kind) = terminal else {
        return if same_status(old, status) {
            Ok(())
        } else {
            Err("status: Invalid value: status is immutable unless transitioning to \"Issued\", \"Denied\", or \"Failed\"".into())
        };
    };
    let fields = ["certificateChain", "notBefore", "beginRefreshAt", "notAfter"];
    if kind != "Issued" {
        return match fields.iter().find(|f| !status[**f].is_null()) {
            Some(f) => Err(format!("status.{f}: Forbidden: must be empty on a {kind} request")),
            None => Ok(()),
        };
    }
    let chain = status["certificateChain"].as_str().ok_or("status.certificateChain: Required value")?;
    let mut blocks = Vec::new();
    for pem in x509_parser::pem::Pem::iter_from_buffer(chain.as_bytes()) {
        let pem = pem.map_err(|e| format!("status.certificateChain: Invalid value: {e}"))?;
        if pem.label != "CERTIFICATE" {
            return Err(format!("status.certificateChain: Invalid value: a {} block", pem.label));
        }
        blocks.push(pem.contents);
    }
    let leaf_der = blocks.first().ok_or("status.certificateChain: Invalid value: no certificate")?;
    let (_, leaf) = x509_parser::certificate::X509Certificate::from_der(leaf_der)
        .map_err(|e| format!("status.certificateChain: Invalid value: {e}"))?;
    if leaf.public_key().raw != requested_key(&current["spec"])?.as_slice() {
        return Err("status.certificateChain: Invalid value: the leaf does not certify the requested public key".into());
    }
    let at = |ts: i64| UNIX_EPOCH + Duration::from_secs(u64::try_from(ts).unwrap_or(0));
    let (leaf_before, leaf_after) =
        (at(leaf.validity().not_before.timestamp()), at(leaf.validity().not_after.timestamp()));
    let not_before = time(&status["notBefore"]).map_err(|e| format!("status.notBefore: {e}"))?;
    let not_after = time(&status["notAfter"]).map_err(|e| format!("status.notAfter: {e}"))?;
    let refresh = time(&status["beginRefreshAt"]).map_err(|e| format!("status.beginRefreshAt: {e}"))?;
    if not_before != leaf_before || not_after != leaf_after {
        return Err("status.notBefore, status.notAfter: Invalid value: must equal the leaf certificate's".into());
    }
    let skew = Duration::from_secs(300);
    if not_before > now + skew || not_before + skew < now {
        return Err("status.notBefore: Invalid value: more than 5 minutes from the apiserver's clock".into());
    }
    let life = not_after.duration_since(not_before).unwrap_or_default();
    let most = Duration::from_secs(current["spec"]["maxExpirationSeconds"].as_u64().unwrap_or(86_400));
    if life < Duration::from_secs(3600) || life > most {
        return Err(format!(
            "status.certificateChain: Invalid value: a life of {}s, outside 3600..={}s",
            life.as_secs(),
            most.as_secs()
        ));
    }
    let margin = Duration::from_secs(600);
    if refresh < not_before + margin || refresh > not_after - margin {
        return Err(
            "status.beginRefreshAt: Invalid value: must be at least 10 minutes after notBefore and before notAfter"
                .into(),
        );
    }
    Ok(())
}

/// Semantic equality of two statuses: absent and `null` fields, and absent and empty lists, are
/// the same.
fn same_status(a: &Value, b: &Value) -> bool {
    fn normal(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(_, v)| !(v.is_null() || v.as_array().is_some_and(Vec::is_empty)))
                    .map(|(k, v)| (k.clone(), normal(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    normal(a) == normal(b)
}

/// The DER SubjectPublicKeyInfo a request asks to certify.
fn requested_key(spec: &Value) -> Result<Vec<u8>, String> {
    let bytes = |field: &str| {
        spec[field].as_str().map(|b| base64::engine::general_purpose::STANDARD.decode(b).map_err(|e| e.to_string()))
    };
    if let Some(csr) = bytes("stubPKCS10Request") {
        let csr = csr?;
        let (_, request) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&csr).map_err(|e| e.to_string())?;
        return Ok(request.certification_request_info.subject_pki.raw.to_vec());
    }
    bytes("pkixPublicKey").ok_or("spec: no key")?
}

fn time(value: &Value) -> Result<SystemTime, String> {
    let text = value.as_str().ok_or("Required value")?;
    let parsed = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("Invalid value: {text:?}: {e}"))?;
    Ok(UNIX_EPOCH + Duration::from_secs(u64::try_from(parsed.unix_timestamp()).unwrap_or(0)))
}
