//! keyward as a Kubernetes certificate signer (KEP-4317, pod certificates): for a pod whose
//! profile delivers its client certificate as a `podCertificate` volume, the kubelet makes the
//! key on the node and asks the signer `keyward.io/<name>` through a PodCertificateRequest; the
//! apiserver has checked that the kubelet runs that pod and holds the key. keyward answers with
//! the owner's certificate, or a denial a person can act on.
//!
//! Pure but for two lookups ([`served_version`], [`trust_bundle_exists`]): what a request says ([`Request::read`]), what
//! to answer ([`decide`]), and the status that answers it ([`issued_status`],
//! [`denied_status`]). The calls are in `reconcile`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use keyward_certs::attestation::Keys;
use keyward_engine::cluster::{ClusterFacts, PodCertificates};
use keyward_engine::kinds::SIGNER_DOMAIN;
use keyward_engine::text::clip;
use keyward_engine::ProfileSet;
use kube::api::{ApiResource, DynamicObject};
use serde_json::{json, Value};
use x509_parser::prelude::FromDer;

use crate::attestation::{refusal_note, Sibling};
use crate::desired::{self, Owner, PodVerdict, Want};
use crate::metrics::Refusal;

/// Which version of `certificates.k8s.io` serves PodCertificateRequests in this cluster: v1
/// from Kubernetes 1.37, v1beta1 in 1.35 and 1.36 (behind the `PodCertificateRequest` gate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ApiVersion {
    V1,
    V1beta1,
}

impl ApiVersion {
    pub const GROUP: &'static str = "certificates.k8s.io";
    pub const PLURAL: &'static str = "podcertificaterequests";

    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V1beta1 => "v1beta1",
        }
    }

    pub fn api_resource(self) -> ApiResource {
        self.resource("PodCertificateRequest", Self::PLURAL)
    }

    /// ClusterTrustBundles, in this version of the group.
    pub fn trust_bundles(self) -> ApiResource {
        self.resource("ClusterTrustBundle", Self::TRUST_BUNDLES)
    }

    pub const TRUST_BUNDLES: &'static str = "clustertrustbundles";

    fn resource(self, kind: &str, plural: &str) -> ApiResource {
        ApiResource {
            group: Self::GROUP.into(),
            version: self.as_str().into(),
            api_version: format!("{}/{}", Self::GROUP, self.as_str()),
            kind: kind.into(),
            plural: plural.into(),
        }
    }
}

/// The `signers` resource name keyward's RBAC grants `sign` on: every name in its domain.
pub const SIGNER_RBAC_NAME: &str = "keyward.io/*";

/// Whether `signer` is in keyward's domain (requests of other signers are never touched).
pub fn is_keyward_signer(signer: &str) -> bool {
    signer.strip_prefix(SIGNER_DOMAIN).is_some_and(|rest| rest.starts_with('/'))
}

/// The signer names the profiles deliver pod certificates for (`delivery: auto` as resolved),
/// with their profile.
pub fn signers(profiles: &ProfileSet) -> Vec<(String, String)> {
    profiles
        .iter()
        .filter_map(|p| Some((p.spec.inject.client_certificate.as_ref()?.signer()?.to_string(), p.name.clone())))
        .collect()
}

/// The cluster facts of a controller that signs at `version` (`None`: does not sign).
pub fn cluster_facts(version: Option<ApiVersion>) -> ClusterFacts {
    ClusterFacts {
        pod_certificates: match version {
            None => PodCertificates::Off,
            Some(ApiVersion::V1beta1) => PodCertificates::V1beta1,
            Some(ApiVersion::V1) => PodCertificates::V1,
        },
    }
}

/// The version of `certificates.k8s.io` that serves `plural` (PodCertificateRequests,
/// ClusterTrustBundles), by discovery, v1 preferred; `None` when neither does. (The one API
/// call in this module: the controller and `keyward audit` both ask it.)
pub async fn served_version(client: &kube::Client, plural: &str) -> Result<Option<ApiVersion>, kube::Error> {
    Ok(served_versions(client, plural).await?.first().copied())
}

/// Every version of `certificates.k8s.io` that serves `plural`, v1 first. Where both serve
/// PodCertificateRequests (1.37, with kubelets of 1.35 or 1.36 still creating v1beta1 requests
/// whose `pkixPublicKey` does not survive conversion to v1), the signer watches and signs both.
pub async fn served_versions(client: &kube::Client, plural: &str) -> Result<Vec<ApiVersion>, kube::Error> {
    let mut served = Vec::new();
    for version in [ApiVersion::V1, ApiVersion::V1beta1] {
        let group_version = format!("{}/{}", ApiVersion::GROUP, version.as_str());
        match client.list_api_group_resources(&group_version).await {
            Ok(list) if list.resources.iter().any(|r| r.name == plural) => served.push(version),
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(served)
}

/// Whether the ClusterTrustBundle `name` exists, at whichever version serves it (a version the
/// cluster does not serve answers 404 like a missing bundle: then none exists for the pod).
pub async fn trust_bundle_exists(client: &kube::Client, name: &str) -> Result<bool, kube::Error> {
    for version in [ApiVersion::V1, ApiVersion::V1beta1] {
        let api = kube::Api::<DynamicObject>::all_with(client.clone(), &version.trust_bundles());
        match api.get_opt(name).await {
            Ok(Some(_)) => return Ok(true),
            Ok(None) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

// === impl Request ===

/// A PodCertificateRequest, as far as the signer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub namespace: String,
    pub name: String,
    pub signer_name: String,
    pub pod_name: String,
    pub pod_uid: String,
    pub service_account_name: String,
    pub node_name: String,
    pub max_expiration_seconds: i64,
    /// The DER SubjectPublicKeyInfo to certify (`pkixPublicKey`, or the key of
    /// `stubPKCS10Request`), or why there is none.
    pub public_key: Result<Vec<u8>, String>,
    /// The keys of `spec.unverifiedUserAnnotations` (the pod's `userAnnotations`): keyward
    /// recognises none, and denies a request that has any, as the API asks of signers.
    pub user_annotations: Vec<String>,
    /// Issued, Denied or Failed already: its status may not change again.
    pub decided: bool,
}

/// The default of `spec.maxExpirationSeconds` (the apiserver writes it when the kubelet
/// leaves it out).
const DEFAULT_MAX_EXPIRATION: i64 = 86_400;

impl Request {
    /// Reads the fields the signer needs; `Err` names what is missing (then the request is
    /// not one the apiserver would have accepted, and is left alone).
    pub fn read(object: &DynamicObject) -> Result<Self, String> {
        let spec = &object.data["spec"];
        let text = |field: &str| -> Result<String, String> {
            spec[field]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .ok_or_else(|| format!("spec.{field} is missing"))
        };
        let namespace = object.metadata.namespace.clone().ok_or("metadata.namespace is missing")?;
        let name = object.metadata.name.clone().ok_or("metadata.name is missing")?;
        let public_key = public_key(spec);
        let decided = object.data["status"]["conditions"].as_array().is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| matches!(c["type"].as_str(), Some("Issued" | "Denied" | "Failed")) && c["status"] == "True")
        });
        Ok(Self {
            namespace,
            name,
            signer_name: text("signerName")?,
            pod_name: text("podName")?,
            pod_uid: text("podUID")?,
            service_account_name: text("serviceAccountName")?,
            node_name: text("nodeName")?,
            max_expiration_seconds: spec["maxExpirationSeconds"].as_i64().unwrap_or(DEFAULT_MAX_EXPIRATION),
            public_key,
            user_annotations: spec["unverifiedUserAnnotations"]
                .as_object()
                .map(|m| m.keys().map(|k| clip(k, 64).into_owned()).collect())
                .unwrap_or_default(),
            decided,
        })
    }
}

/// The key to certify: `stubPKCS10Request` (Kubernetes 1.36 on) or `pkixPublicKey` (1.35).
/// The apiserver has verified the proof of possession of either.
fn public_key(spec: &Value) -> Result<Vec<u8>, String> {
    let bytes = |field: &str| {
        spec[field].as_str().filter(|s| !s.is_empty()).map(|b64| {
            base64::engine::general_purpose::STANDARD.decode(b64).map_err(|e| format!("spec.{field}: not base64: {e}"))
        })
    };
    if let Some(csr) = bytes("stubPKCS10Request") {
        let csr = csr?;
        let (_, request) = x509_parser::certification_request::X509CertificationRequest::from_der(&csr)
            .map_err(|e| format!("spec.stubPKCS10Request: not a PKCS#10 request: {e}"))?;
        return Ok(request.certification_request_info.subject_pki.raw.to_vec());
    }
    bytes("pkixPublicKey").unwrap_or_else(|| Err("neither spec.stubPKCS10Request nor spec.pkixPublicKey is set".into()))
}

/// Whether a request read at `version` is left to another version keyward also signs at: v1
/// has no `pkixPublicKey`, so a request a 1.35 kubelet made at v1beta1 shows no key at v1, and
/// is answered at v1beta1, where its key can be read, rather than denied.
pub fn answered_elsewhere(request: &Request, version: ApiVersion, signing: &[ApiVersion]) -> bool {
    version == ApiVersion::V1 && request.public_key.is_err() && signing.contains(&ApiVersion::V1beta1)
}

// === impl Verdict ===

/// What to answer a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Issue `identity` for `owner` once the owner is confirmed to exist and `pod` is not a
    /// copy of another pod with its attestation (the facts left to the caller), valid at most
    /// `validity`.
    Issue { owner: Owner, identity: String, profile: String, validity: Duration, pod: Box<Sibling> },
    /// Deny, with a condition reason and a message that says what to do.
    Deny { reason: &'static str, message: String },
}

/// What the signer knows about the request's pod and namespace.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The pod as stored now (`None`: no pod of that name).
    pub pod: Option<&'a serde_json::value::RawValue>,
    pub opted_in: bool,
    pub keys: &'a Keys,
    pub trust_domain: &'a str,
    /// The longest life keyward gives a client certificate (`--client-cert-validity`).
    pub validity: Duration,
}

/// Decides a request of one of keyward's signers: the pod exists with the request's UID,
/// service account and node; its namespace opted in; a profile whose signer this is selects
/// it and it carries exactly that profile's injection, attested by keyward's webhook. Facts a
/// pod creator cannot forge: the UID and node come from the apiserver's own check of the
/// kubelet; the attestation from keyward's key.
pub fn decide(request: &Request, profiles: &ProfileSet, facts: Facts<'_>) -> Verdict {
    let deny = |reason: &'static str, message: String| Verdict::Deny { reason, message };
    let pod_ref = format!("pod {}/{}", request.namespace, request.pod_name);
    let Some(profile) = signers(profiles).into_iter().find(|(s, _)| *s == request.signer_name).map(|(_, p)| p) else {
        return deny(
            "UnknownSigner",
            format!(
                "no keyward profile delivers pod certificates from signer {:?}; the profiles name {:?}",
                request.signer_name,
                signers(profiles).into_iter().map(|(s, _)| s).collect::<Vec<_>>()
            ),
        );
    };
    if !facts.opted_in {
        return deny(
            "NamespaceNotOptedIn",
            format!("namespace {} is not labelled {}={}: keyward signs only for opted-in namespaces; label it and recreate the pod", request.namespace, desired::OPT_IN.0, desired::OPT_IN.1),
        );
    }
    let Some(raw) = facts.pod else {
        return deny("PodNotFound", format!("{pod_ref} does not exist (deleted, or never created)"));
    };
    let Ok(pod) = serde_json::from_str::<PodIdentity>(raw.get()) else {
        return deny("PodNotFound", format!("{pod_ref} could not be read as a pod"));
    };
    if pod.metadata.uid != request.pod_uid {
        return deny(
            "PodUIDMismatch",
            format!(
                "{pod_ref} has UID {}, not {} as requested: the pod was recreated; its kubelet asks again",
                pod.metadata.uid, request.pod_uid
            ),
        );
    }
    let account = pod.spec.service_account_name.as_deref().unwrap_or("default");
    if account != request.service_account_name || pod.spec.node_name.as_deref() != Some(request.node_name.as_str()) {
        return deny(
            "PodMismatch",
            format!(
                "{pod_ref} runs as service account {account:?} on node {:?}, not {:?} on {:?} as requested",
                pod.spec.node_name.as_deref().unwrap_or_default(),
                request.service_account_name,
                request.node_name
            ),
        );
    }
    if !request.user_annotations.is_empty() {
        return deny(
            "InvalidUnverifiedUserAnnotations",
            format!(
                "keyward's signers recognise no userAnnotations, and the request carries {}; remove userAnnotations from the pod's podCertificate volume",
                request.user_annotations.join(", ")
            ),
        );
    }
    let claim = match desired::for_pod(profiles, raw, &request.namespace, facts.trust_domain) {
        PodVerdict::Claim(claim) => claim,
        PodVerdict::Refused(refusal, why) => {
            return deny(refusal.denial_reason(), format!("{pod_ref} is not one keyward serves: {why}"));
        }
        PodVerdict::Nothing(why) => {
            return deny("NotInjected", format!("{pod_ref} is not one keyward injected for signer {:?}: {why}; recreate it in an opted-in namespace", request.signer_name));
        }
    };
    let wanted = claim.wants.iter().find_map(|d| match &d.want {
        Want::PodCertificate { owner, identity } if d.name == request.signer_name && claim.profile == profile => {
            Some((owner.clone(), identity.clone()))
        }
        _ => None,
    });
    let Some((owner, identity)) = wanted else {
        return deny(
            "NotInjected",
            format!(
                "{pod_ref} is injected by profile {:?}, which does not use signer {:?}",
                claim.profile, request.signer_name
            ),
        );
    };
    let verdict = claim.attested(facts.keys);
    if let Some(refusal) = Refusal::of(&verdict) {
        return deny(
            refusal.denial_reason(),
            format!("{pod_ref}: {}; have the operator create it again", refusal_note(&verdict)),
        );
    }
    if let Err(reason) = &request.public_key {
        return deny("UnsupportedKeyType", format!("the request's key cannot be read: {reason}"));
    }
    let asked = Duration::from_secs(u64::try_from(request.max_expiration_seconds).unwrap_or(0));
    let pod = Box::new(Sibling::of(&request.pod_name, &request.pod_uid, &claim.evidence, true));
    Verdict::Issue { owner, identity, profile, validity: facts.validity.min(asked), pod }
}

/// The parts of a pod the identity check reads.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodIdentity {
    metadata: PodMeta,
    #[serde(default)]
    spec: PodSpecIdentity,
}

#[derive(serde::Deserialize)]
struct PodMeta {
    #[serde(default)]
    uid: String,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodSpecIdentity {
    service_account_name: Option<String>,
    node_name: Option<String>,
}

// === the answers ===

/// When an issued certificate is valid, and when the kubelet should start refreshing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub not_before: SystemTime,
    pub begin_refresh_at: SystemTime,
    pub not_after: SystemTime,
}

/// The apiserver's bounds: at least an hour of life, `notBefore` within five minutes of its
/// clock, and `beginRefreshAt` at least ten minutes inside either end.
const MIN_LIFE: Duration = Duration::from_secs(3600);
const BACKDATE: Duration = Duration::from_secs(60);
const REFRESH_MARGIN: Duration = Duration::from_secs(600);

/// How long a replaced client CA must stay trusted: the longest a certificate it signed can
/// still be presented. A pod certificate lives at least the apiserver's hour whatever
/// `--client-cert-validity` says, and every certificate is backdated a minute.
pub fn trust_overlap(validity: Duration) -> Duration {
    validity.max(MIN_LIFE) + BACKDATE
}

/// The window for a certificate of life `validity` issued at `now`: backdated a minute (clock
/// skew), in whole seconds, refreshed at two thirds of its life.
pub fn window(now: SystemTime, validity: Duration) -> Window {
    let seconds = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let not_before = UNIX_EPOCH + Duration::from_secs(seconds) - BACKDATE;
    let life = Duration::from_secs(validity.max(MIN_LIFE).as_secs());
    let not_after = not_before + life;
    let refresh = (life * 2 / 3).clamp(REFRESH_MARGIN, life - REFRESH_MARGIN);
    Window { not_before, begin_refresh_at: not_before + Duration::from_secs(refresh.as_secs()), not_after }
}

fn condition(kind: &str, reason: &str, message: &str, now: SystemTime, generation: Option<i64>) -> Value {
    let mut c = json!({"type": kind, "status": "True", "reason": reason, "message": message,
                       "lastTransitionTime": keyward_certs::rfc3339(whole(now))});
    if let Some(g) = generation {
        c["observedGeneration"] = json!(g);
    }
    c
}

fn whole(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs())
}

/// The status that issues `chain_pem` valid over `window`; written in one update, as the
/// apiserver allows no later change.
pub fn issued_status(
    chain_pem: &str,
    window: &Window,
    identity: &str,
    now: SystemTime,
    generation: Option<i64>,
) -> Value {
    json!({
        "conditions": [condition("Issued", "Issued", &format!("issued by keyward for {identity}"), now, generation)],
        "certificateChain": chain_pem,
        "notBefore": keyward_certs::rfc3339(window.not_before),
        "beginRefreshAt": keyward_certs::rfc3339(window.begin_refresh_at),
        "notAfter": keyward_certs::rfc3339(window.not_after),
    })
}

/// The status that denies a request.
pub fn denied_status(reason: &str, message: &str, now: SystemTime, generation: Option<i64>) -> Value {
    json!({"conditions": [condition("Denied", reason, message, now, generation)]})
}

// === the trust bundle ===

/// The ClusterTrustBundle that carries the client CA for `signer`: a signer-linked bundle's
/// name must start with the signer name, `/` written `:`, and a `:`.
pub fn trust_bundle_name(signer: &str) -> String {
    format!("{}:client-ca", signer.replace('/', ":"))
}

/// The annotation on a trust bundle saying until when the CA it replaced stays in it.
pub const PREVIOUS_UNTIL: &str = "keyward.io/previous-ca-until";

/// What a signer's trust bundle holds: the current client CA first and, after a change of CA,
/// the one it replaced until every certificate that one signed has expired (`overlap`, the
/// longest life keyward gives a certificate, after the change is first seen). Returns the
/// bundle and until when the previous CA stays.
pub fn trust_bundle(
    current_pem: &str,
    existing: Option<(&str, Option<SystemTime>)>,
    now: SystemTime,
    overlap: Duration,
) -> (String, Option<SystemTime>) {
    let current = certificates(current_pem).into_iter().next().unwrap_or_default();
    let (there, until) = existing.map(|(pem, until)| (certificates(pem), until)).unwrap_or_default();
    let (kept, until) = match there.split_first() {
        // Unchanged: the previous CA stays until its time is up.
        Some((first, rest)) if *first == current => {
            let kept: Vec<Vec<u8>> = match until {
                Some(t) if now < t => rest.iter().filter(|c| **c != current).take(1).cloned().collect(),
                _ => Vec::new(),
            };
            let until = if kept.is_empty() { None } else { until };
            (kept, until)
        }
        // A new CA: the one it replaces stays for the overlap.
        Some((first, _)) => (vec![first.clone()], Some(whole(now) + overlap)),
        None => (Vec::new(), None),
    };
    let pem = std::iter::once(&current).chain(&kept).map(|der| keyward_certs::pem::certificate_pem(der)).collect();
    (pem, until)
}

/// The DER certificates of a PEM bundle.
fn certificates(pem: &str) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
        .filter_map(Result::ok)
        .filter(|p| p.label == "CERTIFICATE")
        .map(|p| p.contents)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn the_window_is_what_the_apiserver_accepts() {
        let w = window(t(1_000_000) + Duration::from_millis(700), Duration::from_secs(86_400));
        assert_eq!(w.not_before, t(1_000_000 - 60));
        assert_eq!(w.not_after, t(1_000_000 - 60 + 86_400));
        assert_eq!(w.begin_refresh_at, t(1_000_000 - 60 + 57_600));
        // The shortest life Kubernetes allows still leaves ten minutes at each end.
        let w = window(t(1_000_000), Duration::from_secs(600));
        assert_eq!(w.not_after.duration_since(w.not_before).unwrap(), Duration::from_secs(3600));
        assert_eq!(w.begin_refresh_at, w.not_before + Duration::from_secs(2400));
        let w = window(t(1_000_000), Duration::from_secs(3600));
        assert!(w.begin_refresh_at >= w.not_before + REFRESH_MARGIN);
        assert!(w.begin_refresh_at <= w.not_after - REFRESH_MARGIN);
    }

    #[test]
    fn the_trust_bundle_keeps_the_replaced_ca_for_the_overlap_only() {
        let old = keyward_certs::pki::Ca::mint("old", t(1_800_000_000), Duration::from_secs(86_400 * 90)).unwrap();
        let new = keyward_certs::pki::Ca::mint("new", t(1_800_000_000), Duration::from_secs(86_400 * 90)).unwrap();
        let day = Duration::from_secs(86_400);
        let (first, until) = trust_bundle(old.cert_pem(), None, t(1_800_000_000), day);
        assert_eq!((certificates(&first), until), (certificates(old.cert_pem()), None));
        assert_eq!(first, old.cert_pem().replace("\r", ""), "the same PEM back");
        // Unchanged: the same bundle.
        assert_eq!(trust_bundle(old.cert_pem(), Some((&first, None)), t(1_800_000_100), day), (first.clone(), None));
        // Rotated: new first, the old one for a day.
        let (both, until) = trust_bundle(new.cert_pem(), Some((&first, None)), t(1_800_000_200), day);
        let expected: Vec<Vec<u8>> = [new.cert_pem(), old.cert_pem()].iter().flat_map(|p| certificates(p)).collect();
        assert_eq!((certificates(&both), until), (expected, Some(t(1_800_000_200) + day)));
        // Within the day: kept; after it: dropped.
        assert_eq!(
            trust_bundle(new.cert_pem(), Some((&both, until)), t(1_800_000_200) + day / 2, day),
            (both.clone(), until)
        );
        let (after, until) = trust_bundle(new.cert_pem(), Some((&both, until)), t(1_800_000_200) + day, day);
        assert_eq!((certificates(&after), until), (certificates(new.cert_pem()), None));
        assert_eq!(trust_bundle_name("keyward.io/lmeval"), "keyward.io:lmeval:client-ca");
    }

    #[test]
    fn a_replaced_ca_stays_as_long_as_any_certificate_it_signed_can_be_presented() {
        // Twenty-minute certificates, but a pod certificate lives at least the apiserver's hour.
        let validity = Duration::from_secs(20 * 60);
        assert_eq!(trust_overlap(validity), Duration::from_secs(3660));
        assert_eq!(trust_overlap(Duration::from_secs(86_400)), Duration::from_secs(86_460));
        let old = keyward_certs::pki::Ca::mint("old", t(1_800_000_000), Duration::from_secs(86_400 * 90)).unwrap();
        let new = keyward_certs::pki::Ca::mint("new", t(1_800_000_000), Duration::from_secs(86_400 * 90)).unwrap();
        // The last pod certificate the old CA signed, a moment before it was replaced.
        let rotation = t(1_800_000_500);
        let last = window(rotation, validity);
        let (first, _) = trust_bundle(old.cert_pem(), None, t(1_800_000_000), trust_overlap(validity));
        let (both, until) = trust_bundle(new.cert_pem(), Some((&first, None)), rotation, trust_overlap(validity));
        assert!(until.unwrap() >= last.not_after, "trusted until the last one it signed expires");
        // A minute before that certificate expires, its CA is still in the bundle.
        let (still, _) = trust_bundle(
            new.cert_pem(),
            Some((&both, until)),
            last.not_after - Duration::from_secs(60),
            trust_overlap(validity),
        );
        assert_eq!(certificates(&still).len(), 2);
    }

    #[test]
    fn only_keyward_io_signers_are_keywards() {
        assert!(is_keyward_signer("keyward.io/lmeval"));
        for other in
            ["keyward.io", "keyward.iox/a", "kubernetes.io/kube-apiserver-client-pod", "example.com/keyward.io/x"]
        {
            assert!(!is_keyward_signer(other), "{other}");
        }
    }

    #[test]
    fn statuses_are_one_terminal_condition() {
        let w = window(t(1_800_000_000), Duration::from_secs(7200));
        let s = issued_status("PEM", &w, "spiffe://x", t(1_800_000_000), Some(1));
        assert_eq!(
            s,
            json!({"conditions": [{"type": "Issued", "status": "True", "reason": "Issued", "message": "issued by keyward for spiffe://x", "lastTransitionTime": "2027-01-15T08:00:00Z", "observedGeneration": 1}],
                   "certificateChain": "PEM", "notBefore": "2027-01-15T07:59:00Z", "beginRefreshAt": "2027-01-15T09:19:00Z", "notAfter": "2027-01-15T09:59:00Z"})
        );
        let s = denied_status("PodNotFound", "gone", t(1_800_000_000), None);
        assert_eq!(
            s,
            json!({"conditions": [{"type": "Denied", "status": "True", "reason": "PodNotFound", "message": "gone", "lastTransitionTime": "2027-01-15T08:00:00Z"}]})
        );
    }
}
