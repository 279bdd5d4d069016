//! What `keyward audit` finds, decided from what was read (pure): each pod is re-decided by the
//! engine as the webhook would decide it now, and compared with what keyward recorded on it.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use keyward_controller::desired::OPT_IN;
use keyward_engine::engine::decide_admitted;
use keyward_engine::inject::{ObjectKind, Provision};
use keyward_engine::patch::Path;
use keyward_engine::pod;
use keyward_engine::review::Object;
use keyward_engine::{ProfileSet, Reason, RequestFacts, Requester, ANNOTATION_INJECTED, LABEL_PROFILE};
use serde::Serialize;
use serde_json::Value;

/// The pod label that opts a pod out (the webhook's objectSelector); the namespace's opt-in is
/// the controller's [`OPT_IN`].
const OPT_OUT: (&str, &str) = (OPT_IN.0, "disabled");

/// What is wrong, one per finding; the names are the JSON output's (stable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    NotInjected,
    ClaimMismatch,
    Stale,
    MissingDependency,
    Expiring,
    OwnerGone,
    WebhookConfig,
    CaBundle,
    DeploymentUnavailable,
    NoLeader,
    CertificatePending,
    CertificateRequesters,
    Unreadable,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotInjected => "not-injected",
            Self::ClaimMismatch => "claim-mismatch",
            Self::Stale => "stale",
            Self::MissingDependency => "missing-dependency",
            Self::Expiring => "expiring",
            Self::OwnerGone => "owner-gone",
            Self::WebhookConfig => "webhook-config",
            Self::CaBundle => "ca-bundle",
            Self::DeploymentUnavailable => "deployment-unavailable",
            Self::NoLeader => "no-leader",
            Self::CertificatePending => "certificate-pending",
            Self::CertificateRequesters => "certificate-requesters",
            Self::Unreadable => "unreadable",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Finding {
    /// The pod's namespace; empty for a cluster finding.
    pub namespace: String,
    /// The pod; empty for a cluster finding.
    pub pod: String,
    pub finding: Kind,
    /// The profile concerned, if any.
    pub profile: Option<String>,
    /// What exactly, and what to do.
    pub detail: String,
}

/// An object a pod needs that must be looked up in the cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dependency {
    pub kind: ObjectKind,
    pub namespace: String,
    pub name: String,
}

/// A pod's controller owner, to look up.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnerRef {
    pub namespace: String,
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// A pod after the first look: findings already certain, and what to look up for the rest.
#[derive(Debug, Clone, Default)]
pub struct Examined {
    pub findings: Vec<Finding>,
    pub dependencies: Vec<Dependency>,
    /// The client certificate Secret it mounts.
    pub certificate: Option<Dependency>,
    pub owner: Option<OwnerRef>,
    /// A pod that has not started and waits for a pod certificate from this signer: its
    /// PodCertificateRequests are looked up.
    pub awaiting: Option<Awaiting>,
    /// Whether keyward concerns itself with this pod at all (counted as audited).
    pub relevant: bool,
    namespace: String,
    pod: String,
    profile: Option<String>,
}

/// A pod waiting for a pod certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Awaiting {
    pub signer: String,
    pub pod_uid: String,
    /// When the pod was created (RFC 3339), if it says.
    pub created: Option<String>,
}

/// The latest PodCertificateRequest of a pod, as far as the audit tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestState {
    Issued,
    Denied {
        reason: String,
        message: String,
    },
    /// Not answered, since then (RFC 3339).
    Unanswered {
        name: String,
        since: String,
    },
}

/// How long a scheduled pod may wait for its kubelet's first request before it is a finding.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(120);

/// What the cluster says about one namespace.
#[derive(Debug, Clone, Default)]
pub struct NamespaceFacts {
    pub labels: BTreeMap<String, String>,
}

/// The first look at a pod (as stored, in `namespace`): re-decided with `profiles`, as the
/// webhook would decide it on CREATE now, and compared with keyward's record on it.
/// `installed`: when the webhook configuration was created (pods older than that were never
/// sent to keyward). A pod admitted under either resolution of `delivery: auto` is as keyward
/// admits it ([`decide_admitted`]).
pub fn examine(
    pod: &Value,
    namespace: &str,
    ns: Option<&NamespaceFacts>,
    profiles: &ProfileSet,
    installed: Option<&str>,
) -> Examined {
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let mut e = Examined { namespace: namespace.to_string(), pod: name, ..Examined::default() };
    let record: Option<Value> = pod
        .pointer(&format!("/metadata/annotations/{}", ANNOTATION_INJECTED.replace('/', "~1")))
        .and_then(Value::as_str)
        .map(|s| serde_json::from_str(s).unwrap_or(Value::Null));
    let labelled = pod.pointer(&format!("/metadata/labels/{}", LABEL_PROFILE.replace('/', "~1"))).is_some();
    // The record is the pod creator's to write: its profile name is printed only as a name.
    let recorded_profile = record.as_ref().and_then(|r| r.get("profile")).and_then(Value::as_str).map(printable_name);

    let Ok(raw) = serde_json::value::to_raw_value(pod) else { return e };
    let read = match pod::read(&raw, profiles.annotations_read()) {
        Ok(read) => read,
        Err(_) => return e,
    };
    let facts = RequestFacts::pod_create(namespace, Requester::Assumed);
    let decision = decide_admitted(&facts, &Object::Read(read), profiles);
    let selected = decision.profile.clone();
    e.relevant = selected.is_some() || record.is_some() || labelled;
    e.profile = recorded_profile.clone().or_else(|| selected.clone());
    if !e.relevant {
        return e;
    }

    // What the decision would change in the spec: none means the pod already carries what its
    // profile injects (its own token at the same path, say), and only keyward's record and
    // label are missing, which changes nothing for the workload.
    let spec_changes =
        decision.patch().ops.iter().filter(|op| !matches!(op.path, Path::Annotations(_) | Path::Labels(_))).count();
    match (&record, decision.reason) {
        (None, Reason::Injected) if spec_changes == 0 => {}
        // Selected, and keyward has not injected it.
        (None, Reason::Injected) => {
            let why = not_injected_because(pod, ns, installed);
            e.push(
                Kind::NotInjected,
                selected.clone(),
                format!("profile {} selects it, but it has no keyward injection: {why}", quoted(&selected)),
            );
        }
        (None, reason) if !decision.allowed() => {
            let message = decision.message().unwrap_or_default();
            e.push(
                Kind::NotInjected,
                selected.clone(),
                format!(
                    "profile {} selects it but would refuse it ({}): {message}",
                    quoted(&selected),
                    reason.as_str()
                ),
            );
        }
        (None, reason) => {
            // Selected, and admitted unchanged because it collides with the injection: it runs
            // without what the profile gives, unless it wires its own.
            if reason == Reason::ConflictSkipped {
                let conflicts = conflicts_of(&decision).unwrap_or_else(|| "a conflict".into());
                e.push(
                    Kind::NotInjected,
                    selected.clone(),
                    format!(
                        "profile {} selects it, but keyward admitted it without its injection (onConflict: skip) because {conflicts}; it works only with credentials of its own: remove what conflicts and recreate it, or narrow the profile if the pod is not its to serve",
                        quoted(&selected)
                    ),
                );
            }
            // Labelled as injected, or carrying keyward's volumes, with no record of it.
            let volumes = keyward_volumes(pod);
            if labelled || !volumes.is_empty() {
                let what = if volumes.is_empty() {
                    "the label keyward.io/profile".to_string()
                } else {
                    format!("keyward's volumes {}", volumes.join(", "))
                };
                e.push(Kind::ClaimMismatch, None, format!("it carries {what} but no keyward.io/injected record: keyward did not inject it (copied from another pod, or written by hand); recreate it so keyward admits it"));
            }
        }
        (Some(record), reason) => {
            let missing = claims_missing(record, pod);
            if !missing.is_empty() {
                e.push(Kind::ClaimMismatch, recorded_profile.clone(), format!("the keyward.io/injected record claims {}, which the pod does not have: the record was written by hand or copied; recreate the pod", missing.join("; ")));
            } else if selected.is_none() {
                e.push(Kind::Stale, recorded_profile.clone(), format!("injected by profile {}, which no longer selects it (removed, or its selector changed); recreate the pod, or it keeps its old credentials", quoted(&recorded_profile)));
            } else if selected != recorded_profile {
                e.push(Kind::Stale, recorded_profile.clone(), format!("injected by profile {}, but profile {} selects it now; recreate the pod to get what {} injects", quoted(&recorded_profile), quoted(&selected), quoted(&selected)));
            } else if reason == Reason::Injected && spec_changes > 0 {
                e.push(Kind::Stale, recorded_profile.clone(), format!("injected differently from what profile {} injects now ({spec_changes} changes to the spec apart: the profile changed since); recreate the pod", quoted(&selected)));
            } else if let Some(conflicts) = conflicts_of(&decision) {
                // keyward's own injection now conflicts with what the profile injects (a
                // volume of keyward's name from another source, say): the profile changed.
                e.push(Kind::Stale, recorded_profile.clone(), format!("injected differently from what profile {} injects now, which conflicts with what keyward injected then ({conflicts}): the profile changed since; recreate the pod", quoted(&selected)));
            }
        }
    }

    // What an injected pod depends on, and its owner: looked up next (not for a record the pod
    // does not bear out: nothing was injected to depend on).
    if record.is_some() && !e.findings.iter().any(|f| f.finding == Kind::ClaimMismatch) {
        if let Ok(mutation) = &decision.outcome {
            for (_, injection) in &mutation.injections {
                // A signer is not an object to look up.
                for r in injection.requires.iter().filter(|r| r.kind == ObjectKind::Signer) {
                    // Not started yet: it may wait for its certificate.
                    if pod.pointer("/status/phase").and_then(Value::as_str) == Some("Pending") {
                        e.awaiting = Some(Awaiting {
                            signer: r.name.clone(),
                            pod_uid: pod.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().into(),
                            created: pod
                                .pointer("/metadata/creationTimestamp")
                                .and_then(Value::as_str)
                                .map(str::to_string),
                        });
                    }
                }
                for r in injection.requires.iter().filter(|r| r.is_object()) {
                    // A name no object can have (from a template over what the pod's creator
                    // wrote) is not looked up: the request would fail, and end the audit.
                    if r.kind != ObjectKind::ClusterTrustBundle && !keyward_engine::names::is_dns1123_subdomain(&r.name)
                    {
                        e.push(Kind::Unreadable, e.profile.clone(), format!("it would need {:?} {}, which is not a name Kubernetes allows: the pod cannot start; fix what the name is made from (its owner reference or labels)", r.kind, printable_name(&r.name)));
                        continue;
                    }
                    // Cluster-wide objects are looked up once, whichever namespace needs them.
                    let ns = if r.kind == ObjectKind::ClusterTrustBundle { "" } else { namespace };
                    let d = Dependency { kind: r.kind, namespace: ns.to_string(), name: r.name.clone() };
                    if r.provision == Provision::ClientCertificate {
                        e.certificate = Some(d.clone());
                    }
                    e.dependencies.push(d);
                }
            }
        }
        e.owner = controller_owner(pod, namespace);
        // An owner reference is the pod creator's to write: one that names no object Kubernetes
        // allows is reported, not looked up.
        if let Some(o) = &e.owner {
            let owner = keyward_controller::desired::Owner {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
            };
            if let Some(problem) = keyward_controller::desired::identity_problem(namespace, &owner) {
                e.owner = None;
                e.push(Kind::Unreadable, e.profile.clone(), format!("its controller owner reference cannot be looked up: {problem}; keyward issues nothing for it (written by hand, or copied); recreate the pod"));
            }
        }
    }
    e
}

impl Examined {
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn push(&mut self, finding: Kind, profile: Option<String>, detail: String) {
        self.findings.push(Finding {
            namespace: self.namespace.clone(),
            pod: self.pod.clone(),
            finding,
            profile,
            detail,
        });
    }

    /// The findings, with what the cluster said about the dependencies, the certificate and the
    /// owner.
    pub fn conclude(mut self, lookups: &Lookups, now: SystemTime, warning: Option<Duration>) -> Vec<Finding> {
        let profile = self.profile.clone();
        for d in std::mem::take(&mut self.dependencies) {
            if lookups.exists.get(&d) == Some(&false) {
                self.push(
                    Kind::MissingDependency,
                    profile.clone(),
                    format!(
                        "{:?} {} does not exist: the pod cannot start (or restart) without it; {}",
                        d.kind,
                        d.name,
                        provider_hint(d.kind)
                    ),
                );
            }
        }
        if let Some(cert) = self.certificate.take() {
            if let Some(Some(times)) = lookups.certificates.get(&cert) {
                if let Some(detail) = times.finding(now, warning) {
                    self.push(
                        Kind::Expiring,
                        profile.clone(),
                        format!("the client certificate in Secret {} {detail}", cert.name),
                    );
                }
            }
        }
        if let Some(awaiting) = self.awaiting.take() {
            let key = (self.namespace.clone(), awaiting.pod_uid.clone());
            let signer = &awaiting.signer;
            match lookups.requests.get(&key) {
                Some(RequestState::Denied { reason, message }) => self.push(Kind::CertificatePending, profile.clone(), format!("its PodCertificateRequest to {signer} was denied ({}: {}): the pod never starts; fix that, then recreate the pod", printable_word(reason), keyward_engine::text::quoted(message, 512))),
                Some(RequestState::Unanswered { name, since }) => self.push(Kind::CertificatePending, profile.clone(), format!("its PodCertificateRequest {} to {signer} is not answered (created {}): is keyward's controller running with pod certificates on, and does a replica lead? see its logs", printable_name(name), printable_word(since))),
                Some(RequestState::Issued) => {}
                None => {
                    let created = awaiting.created.as_deref().and_then(keyward_certs::parse_rfc3339);
                    if lookups.requests_read && created.is_some_and(|c| c + FIRST_REQUEST_GRACE < now) {
                        self.push(Kind::CertificatePending, profile.clone(), format!("its kubelet has not asked {signer} for its certificate (no PodCertificateRequest): the cluster must serve PodCertificateRequests and the node's kubelet have the feature on (Kubernetes 1.35 and 1.36: the PodCertificateRequest feature gate; see the README, \"Pod certificates\")"));
                    }
                }
            }
        }
        if let Some(owner) = self.owner.take() {
            match lookups.owners.get(&owner) {
                Some(None) => self.push(Kind::OwnerGone, profile.clone(), format!("its owner {} {} does not exist: the pod is orphaned and its per-owner credentials are no longer renewed; delete the pod", owner.kind, owner.name)),
                Some(Some(uid)) if *uid != owner.uid => self.push(Kind::OwnerGone, profile.clone(), format!("its owner {} {} was recreated (UID {}, the pod names {}): the pod belongs to the old one; delete it", owner.kind, owner.name, printable_word(uid), owner.uid)),
                _ => {}
            }
        }
        self.findings
    }
}

/// What the cluster said: per dependency, whether it exists (absent: not looked up); per client
/// certificate, its notAfter (`None`: unreadable); per owner, its UID (`None`: gone).
#[derive(Debug, Default)]
pub struct Lookups {
    /// The latest PodCertificateRequest per (namespace, pod UID), where they were read.
    pub requests: BTreeMap<(String, String), RequestState>,
    /// Whether PodCertificateRequests were read (the cluster serves them).
    pub requests_read: bool,
    pub exists: BTreeMap<Dependency, bool>,
    pub certificates: BTreeMap<Dependency, Option<CertificateTimes>>,
    pub owners: BTreeMap<OwnerRef, Option<String>>,
}

/// How late keyward's controller may be to renew a client certificate before the audit says
/// so: it renews within seconds of the time while it leads; a failover or a few failed tries
/// fit well inside this.
pub const RENEWAL_GRACE: Duration = Duration::from_secs(10 * 60);

/// A client certificate's times: when keyward's controller renews it (two thirds of its life,
/// `keyward_controller::identity::renewal_time`) and when it expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CertificateTimes {
    pub renew_at: SystemTime,
    pub not_after: SystemTime,
}

impl CertificateTimes {
    /// What is wrong with the certificate at `now`, if anything: its renewal is overdue (by the
    /// controller's own rule, whatever validity it issues with), or, when the caller asked with
    /// `--expiry-warning`, it ends within that.
    pub fn finding(&self, now: SystemTime, warning: Option<Duration>) -> Option<String> {
        // Written only for a finding; a time past what SystemTime holds is never reached.
        let (renew, end) = (|| keyward_certs::rfc3339(self.renew_at), || keyward_certs::rfc3339(self.not_after));
        let check = "check its logs and keyward_controller_objects_total{result=\"error\"}";
        if self.not_after <= now {
            return Some(format!("expired at {} and was due for renewal at {}: keyward's controller did not renew it ({check}); the pod cannot connect until it does", end(), renew()));
        }
        if self.renew_at.checked_add(RENEWAL_GRACE).is_some_and(|late| now > late) {
            return Some(format!("was due for renewal at {} (two thirds of its life) and expires at {}: keyward's controller has not renewed it ({check})", renew(), end()));
        }
        match warning {
            Some(within) if now.checked_add(within).is_none_or(|horizon| self.not_after < horizon) => Some(format!(
                "expires at {}, within --expiry-warning; keyward's controller renews it at {} (two thirds of its life)",
                end(),
                renew()
            )),
            _ => None,
        }
    }
}

fn quoted(profile: &Option<String>) -> String {
    format!("{:?}", profile.as_deref().unwrap_or_default())
}

fn provider_hint(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::Secret => "if keyward provides it, see the controller's logs; otherwise create it",
        ObjectKind::ConfigMap => {
            "if keyward provides it (a server CA), see the controller's conditions; otherwise create it"
        }
        ObjectKind::ServiceAccount => {
            "keyward's controller makes a profile's account when the namespace opts in; see its logs"
        }
        ObjectKind::Signer => "keyward's controller signs its PodCertificateRequests; see its logs",
        ObjectKind::ClusterTrustBundle => "if keyward provides it (a server CA, published once for the cluster), see the controller's logs; otherwise create it",
    }
}

/// What the profile's injection conflicts with in the pod, when the decision is a conflict
/// (refused, or skipped with `onConflict: skip`).
fn conflicts_of(decision: &keyward_engine::Decision) -> Option<String> {
    match decision.reason {
        Reason::Conflict => {
            decision.message().and_then(|m| m.split_once("into this pod: ").map(|(_, c)| c.to_string()))
        }
        Reason::ConflictSkipped => {
            decision.warnings.first().and_then(|w| w.split_once("(onConflict: skip): ").map(|(_, c)| c.to_string()))
        }
        _ => None,
    }
}

/// Why a selected pod has no injection, as far as the cluster tells.
fn not_injected_because(pod: &Value, ns: Option<&NamespaceFacts>, installed: Option<&str>) -> String {
    let label =
        |v: &Value, key: &str| v.get("labels").and_then(|l| l.get(key)).and_then(Value::as_str).map(str::to_string);
    if label(&pod["metadata"], OPT_OUT.0).as_deref() == Some(OPT_OUT.1) {
        return format!(
            "it is labelled {}={} (opted out); remove the label and recreate it if it needs credentials",
            OPT_OUT.0, OPT_OUT.1
        );
    }
    if ns.is_none_or(|n| n.labels.get(OPT_IN.0).map(String::as_str) != Some(OPT_IN.1)) {
        return format!("its namespace is not labelled {}={}; label it, then recreate the pod", OPT_IN.0, OPT_IN.1);
    }
    let created = pod.pointer("/metadata/creationTimestamp").and_then(Value::as_str);
    // RFC 3339 in UTC, as the apiserver writes both: they compare as strings.
    if let (Some(created), Some(installed)) = (created, installed) {
        if created < installed {
            return format!(
                "it was created at {created}, before keyward's webhook configuration ({installed}); recreate it"
            );
        }
    }
    "it was created while keyward's webhook was not called for it (down, failurePolicy Ignore, or a matchConditions gap); recreate it".into()
}

/// The claims of keyward's record the pod does not bear out: each volume it names must be in
/// the pod, mounted at the path it names.
fn claims_missing(record: &Value, pod: &Value) -> Vec<String> {
    let volumes: Vec<&str> = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    let mounts: Vec<(&str, &str)> = ["initContainers", "containers"]
        .iter()
        .flat_map(|list| pod["spec"][list].as_array().into_iter().flatten())
        .flat_map(|c| c["volumeMounts"].as_array().into_iter().flatten())
        .filter_map(|m| Some((m["name"].as_str()?, m["mountPath"].as_str()?)))
        .collect();
    // A claim holds when something is mounted at its path: keyward counts a pod's own volume
    // delivering the same thing at the same path as injected, under the pod's own name.
    let mut missing = Vec::new();
    for item in record.get("injected").and_then(Value::as_array).into_iter().flatten() {
        let Some(volume) = item.get("volume").and_then(Value::as_str) else { continue };
        match item.get("mountPath").and_then(Value::as_str) {
            Some(path) if !mounts.iter().any(|(_, p)| *p == path) => {
                missing.push(format!("volume {volume:?} mounted at {path:?}"));
            }
            Some(_) => {}
            None if !volumes.contains(&volume) => missing.push(format!("volume {volume:?}")),
            None => {}
        }
    }
    missing
}

/// The pod's volumes named like keyward's (`keyward-…`).
fn keyward_volumes(pod: &Value) -> Vec<String> {
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .filter(|n| n.starts_with("keyward-"))
        .map(str::to_string)
        .collect()
}

fn controller_owner(pod: &Value, namespace: &str) -> Option<OwnerRef> {
    let owners = pod.pointer("/metadata/ownerReferences")?.as_array()?;
    let o = owners.iter().find(|o| o["controller"] == true)?;
    Some(OwnerRef {
        namespace: namespace.to_string(),
        api_version: o["apiVersion"].as_str()?.to_string(),
        kind: o["kind"].as_str()?.to_string(),
        name: o["name"].as_str()?.to_string(),
        uid: o["uid"].as_str()?.to_string(),
    })
}

/// A name from a pod's annotation, safe to print in a table: as it is when it is a Kubernetes
/// name, else quoted with escapes and clipped (no control character reaches a terminal).
pub(super) fn printable_name(name: &str) -> String {
    if keyward_engine::names::is_dns1123_subdomain(name) {
        return name.to_string();
    }
    let quoted = format!("{name:?}");
    match quoted.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &quoted[..cut]),
        None => quoted,
    }
}

/// A word from the API (a condition's reason, a timestamp) as it is when it is one, else quoted
/// with escapes and clipped.
fn printable_word(word: &str) -> String {
    if !word.is_empty() && word.len() <= 128 && word.chars().all(|c| c.is_ascii_alphanumeric() || "_,:.-".contains(c)) {
        return word.to_string();
    }
    keyward_engine::text::quoted(word, 80)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotation: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "team-a", "labels": {"app": "x"}, "annotations": {"keyward.io/injected": annotation}},
            "spec": {"containers": [{"name": "c", "image": "x"}]}})
    }

    /// A certificate as keyward's controller issues it by default (24 hours), renewed at 16 h.
    fn issued_at(start: SystemTime, life: Duration) -> CertificateTimes {
        CertificateTimes { renew_at: start + life * 2 / 3, not_after: start + life }
    }

    /// Issue 57: the controller's 24-hour certificates always end within the old 7-day window,
    /// so a healthy cluster's audit failed. Only a renewal overdue by the controller's own rule
    /// is a finding.
    #[test]
    fn a_certificate_is_expiring_only_when_its_renewal_is_overdue() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_000_000);
        let day = Duration::from_secs(86_400);
        let cert = issued_at(start, day);
        // Fresh, and up to its renewal time and the grace after it: nothing.
        for at in [start, start + day / 2, cert.renew_at, cert.renew_at + RENEWAL_GRACE] {
            assert_eq!(cert.finding(at, None), None);
        }
        // Past the grace: the controller is late.
        let late = cert.renew_at + RENEWAL_GRACE + Duration::from_secs(1);
        assert_eq!(
            cert.finding(late, None).unwrap(),
            format!(
                "was due for renewal at {} (two thirds of its life) and expires at {}: keyward's controller has not renewed it (check its logs and keyward_controller_objects_total{{result=\"error\"}})",
                keyward_certs::rfc3339(cert.renew_at),
                keyward_certs::rfc3339(cert.not_after)
            )
        );
        // Past its end: it says so.
        assert!(cert.finding(cert.not_after, None).unwrap().starts_with("expired at "));
        // Whatever the validity: a year's certificate is not late at eight months, a ten
        // minutes' one is at eight.
        let year = issued_at(start, day * 365);
        assert_eq!(year.finding(start + day * 240, None), None);
        assert!(year.finding(start + day * 244 + RENEWAL_GRACE, None).is_some());
        let short = issued_at(start, Duration::from_secs(600));
        assert_eq!(short.finding(start + Duration::from_secs(400), None), None);
        // --expiry-warning, when asked for, reports what ends within it, renewal due or not.
        let asked = cert.finding(start + Duration::from_secs(3600), Some(day * 7)).unwrap();
        assert!(asked.contains("within --expiry-warning"), "{asked}");
        assert_eq!(cert.finding(start, Some(Duration::from_secs(3600))), None);
        // A warning longer than time itself reports, and does not panic.
        assert!(cert.finding(start, Some(Duration::MAX)).is_some());
    }

    #[test]
    fn a_forged_record_cannot_forge_the_output() {
        let profiles = ProfileSet::builtin().unwrap_or_default();
        let forged = r#"{"profile":"x\u001b[2J\nteam-a  evil  ok","injected":[{"kind":"clientCertificate","volume":"v\nNAMESPACE","mountPath":"/p\r"}]}"#;
        let e = examine(&pod(forged), "team-a", None, &profiles, None);
        let findings = e.conclude(&Lookups::default(), SystemTime::UNIX_EPOCH, None);
        assert_eq!(findings.len(), 1, "{findings:?}");
        let f = &findings[0];
        assert_eq!(f.finding, Kind::ClaimMismatch);
        for text in [f.profile.as_deref().unwrap_or_default(), f.detail.as_str()] {
            assert!(!text.chars().any(char::is_control), "{text:?}");
        }
        assert_eq!(f.profile.as_deref(), Some(r#""x\u{1b}[2J\nteam-a  evil  ok""#));
        assert!(f.detail.starts_with(r#"the keyward.io/injected record claims volume "v\nNAMESPACE""#), "{}", f.detail);
    }

    #[test]
    fn pods_keyward_has_nothing_to_do_with_are_not_audited() {
        let profiles = ProfileSet::builtin().unwrap_or_default();
        let plain = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
        let e = examine(&plain, "team-a", None, &profiles, None);
        assert!(!e.relevant);
        assert!(e.conclude(&Lookups::default(), SystemTime::UNIX_EPOCH, None).is_empty());
    }
}
