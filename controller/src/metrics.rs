//! The controller's metrics, in Prometheus' text format.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ObjectLabels {
    kind: &'static str,
    action: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    condition: &'static str,
}

/// Why keyward issued nothing for a pod or an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// The pod has no admission attestation.
    NoAttestation,
    /// The pod's attestation does not verify, or cannot be read.
    ForgedAttestation,
    /// The pod's attestation verifies, for a pod that runs or mounts something else.
    ReboundAttestation,
    /// The pod's attestation verifies, but was made too long before or after the pod's creation.
    UntimelyAttestation,
    /// Another live pod carries the same attestation and came first (or in the same second).
    DuplicateAttestation,
    /// The pod is labelled `keyward.io/inject=disabled`: the webhook never admitted it.
    OptedOut,
    /// The pod carries an attestation in a namespace that is not opted in.
    NamespaceNotOptedIn,
    /// The owner the pod names does not exist with that UID.
    OwnerMissing,
    /// The owner's name, kind, group or UID is not what Kubernetes allows.
    UnverifiableOwner,
    /// A Secret with keyward's labels that keyward cannot vouch for.
    UnverifiedSecret,
}

impl Refusal {
    pub const ALL: [Refusal; 10] = [
        Self::NoAttestation,
        Self::ForgedAttestation,
        Self::ReboundAttestation,
        Self::UntimelyAttestation,
        Self::DuplicateAttestation,
        Self::OptedOut,
        Self::NamespaceNotOptedIn,
        Self::OwnerMissing,
        Self::UnverifiableOwner,
        Self::UnverifiedSecret,
    ];

    /// The refusal of a pod whose attestation does not hold (`None`: it holds).
    pub fn of(verdict: &keyward_engine::attest::Verdict) -> Option<Self> {
        use keyward_engine::attest::Verdict;
        match verdict {
            Verdict::Valid => None,
            Verdict::Missing => Some(Self::NoAttestation),
            Verdict::Malformed(_) | Verdict::Forged => Some(Self::ForgedAttestation),
            Verdict::Rebound => Some(Self::ReboundAttestation),
            Verdict::Untimely { .. } => Some(Self::UntimelyAttestation),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoAttestation => "no-attestation",
            Self::ForgedAttestation => "forged-attestation",
            Self::ReboundAttestation => "rebound-attestation",
            Self::UntimelyAttestation => "untimely-attestation",
            Self::DuplicateAttestation => "duplicate-attestation",
            Self::OptedOut => "opted-out",
            Self::NamespaceNotOptedIn => "namespace-not-opted-in",
            Self::OwnerMissing => "owner-missing",
            Self::UnverifiableOwner => "unverifiable-owner",
            Self::UnverifiedSecret => "unverified-secret",
        }
    }

    /// The reason of a PodCertificateRequest denied for it.
    pub fn denial_reason(self) -> &'static str {
        match self {
            Self::NoAttestation => "NoAttestation",
            Self::ForgedAttestation => "ForgedAttestation",
            Self::ReboundAttestation => "ReboundAttestation",
            Self::UntimelyAttestation => "UntimelyAttestation",
            Self::DuplicateAttestation => "DuplicateAttestation",
            Self::OptedOut => "OptedOut",
            Self::NamespaceNotOptedIn => "NamespaceNotOptedIn",
            Self::OwnerMissing => "OwnerMissing",
            Self::UnverifiableOwner => "UnverifiableOwner",
            Self::UnverifiedSecret => "UnverifiedSecret",
        }
    }

    /// The Event's reason.
    pub fn event_reason(self) -> &'static str {
        match self {
            Self::NoAttestation => "NoAdmissionAttestation",
            Self::ForgedAttestation => "ForgedAdmissionAttestation",
            Self::ReboundAttestation => "ReboundAdmissionAttestation",
            Self::UntimelyAttestation => "UntimelyAdmissionAttestation",
            Self::DuplicateAttestation => "DuplicateAdmissionAttestation",
            Self::OptedOut => "OptedOut",
            Self::NamespaceNotOptedIn => "NamespaceNotOptedIn",
            Self::OwnerMissing => "OwnerMissing",
            Self::UnverifiableOwner => "UnverifiableOwner",
            Self::UnverifiedSecret => "UnverifiedSecret",
        }
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A per-owner object created.
    Issued,
    /// A client certificate replaced.
    Renewed,
    /// A per-namespace object created or updated.
    Provisioned,
    /// Already right: nothing written.
    Unchanged,
    /// Removed (opt-out, or no profile wants it any more).
    Deleted,
    /// An object of that name that keyward does not manage: left alone, reported.
    Foreign,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Issued => "issued",
            Self::Renewed => "renewed",
            Self::Provisioned => "provisioned",
            Self::Unchanged => "unchanged",
            Self::Deleted => "deleted",
            Self::Foreign => "foreign",
        }
    }
}

pub struct Metrics {
    registry: Mutex<Registry>,
    objects: Family<ObjectLabels, Counter>,
    leader: Gauge,
    next_expiry: Gauge,
    client_ca_reloads: Family<ResultLabels, Counter>,
    profile_reloads: Family<ResultLabels, Counter>,
    reconcile_errors: Family<ResultLabels, Counter>,
    conditions: Family<ConditionLabels, Gauge>,
    refused: Family<ResultLabels, Counter>,
    pod_certificates: Family<ResultLabels, Counter>,
    serving_changes: Family<ResultLabels, Counter>,
    webhook_config_repairs: Family<FieldLabels, Counter>,
    serving_expiry: Family<ResultLabels, Gauge>,
    build_info: Family<BuildLabels, Gauge>,
    client_ca_not_after: Gauge,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FieldLabels {
    field: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("keyward_controller");
        let objects = Family::<ObjectLabels, Counter>::default();
        registry.register(
            "objects",
            "Objects reconciled, by kind (client-certificate|token|server-ca|service-account|role-binding|client-ca|trust-bundle), action (issued|renewed|provisioned|unchanged|deleted|foreign) and result (ok|error)",
            objects.clone(),
        );
        let leader = Gauge::default();
        registry.register("leader", "1 while this replica holds the Lease and may write, else 0", leader.clone());
        let next_expiry = Gauge::default();
        registry.register(
            "next_certificate_expiry_seconds",
            "Seconds until the soonest-expiring client certificate keyward issued expires (renewal is at two thirds of its life)",
            next_expiry.clone(),
        );
        let client_ca_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "client_ca_reloads",
            "Attempts to load the client CA from --client-ca-dir, by result (loaded|unchanged|failed)",
            client_ca_reloads.clone(),
        );
        let profile_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "profile_reloads",
            "Attempts to reload the profiles from --profiles, by result (loaded|unchanged|failed)",
            profile_reloads.clone(),
        );
        let reconcile_errors = Family::<ResultLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconciliations that failed and were queued to retry with backoff, by what (namespace|sweep|owner|client-ca|sources|attestation-key|serving-cert|match-conditions|pod-certificate)",
            reconcile_errors.clone(),
        );
        let conditions = Family::<ConditionLabels, Gauge>::default();
        registry.register(
            "conditions",
            "Conditions in force that keyward reports and works around rather than fails on, by condition (client-ca-namespace-missing|server-ca-source-unusable|server-ca-source-unwatched); each is logged when it starts and ends",
            conditions.clone(),
        );
        for condition in crate::conditions::Condition::ALL {
            conditions.get_or_create(&ConditionLabels { condition: condition.as_str() }).set(0);
        }
        let refused = Family::<ResultLabels, Counter>::default();
        registry.register(
            "refused",
            "Pods, owners and Secrets keyward issued nothing for, each counted once, by result (no-attestation|forged-attestation|rebound-attestation|untimely-attestation|duplicate-attestation|opted-out|namespace-not-opted-in|owner-missing|unverifiable-owner|unverified-secret)",
            refused.clone(),
        );
        for r in Refusal::ALL {
            let _ = refused.get_or_create(&ResultLabels { result: r.as_str() });
        }
        let serving_changes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "serving_changes",
            "Changes to the self-managed serving certificate and the webhook's caBundle, by result (created|leaf-renewed|ca-introduced|ca-switched|ca-retired|dropped|ca-bundle-repaired|client-ca-created)",
            serving_changes.clone(),
        );
        let webhook_config_repairs = Family::<FieldLabels, Counter>::default();
        registry.register(
            "webhook_config_repairs",
            "Times the webhook configuration was found to differ from the profiles and was repaired, by field (matchConditions)",
            webhook_config_repairs.clone(),
        );
        let _ = webhook_config_repairs.get_or_create(&FieldLabels { field: "matchConditions" });
        let serving_expiry = Family::<ResultLabels, Gauge>::default();
        registry.register(
            "serving_expiry_timestamp_seconds",
            "When the self-managed serving certificate expires, by result (leaf|ca), in Unix seconds",
            serving_expiry.clone(),
        );
        let pod_certificates = Family::<ResultLabels, Counter>::default();
        registry.register(
            "pod_certificate_requests",
            "PodCertificateRequests of keyward's signers answered, by result (issued|denied|failed: issuing or writing the answer failed, retried)",
            pod_certificates.clone(),
        );
        for result in ["issued", "denied", "failed"] {
            let _ = pod_certificates.get_or_create(&ResultLabels { result });
        }
        let build_info = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "build_info",
            "Always 1; the labels say which keyward this is (version, and the commit it was built from)",
            build_info.clone(),
        );
        let client_ca_not_after = Gauge::default();
        registry.register(
            "client_ca_not_after_timestamp_seconds",
            "notAfter of the client CA loaded from --client-ca-dir, as a Unix timestamp",
            client_ca_not_after.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            build_info,
            client_ca_not_after,
            serving_changes,
            webhook_config_repairs,
            serving_expiry,
            objects,
            leader,
            next_expiry,
            client_ca_reloads,
            profile_reloads,
            reconcile_errors,
            conditions,
            refused,
            pod_certificates,
        }
    }
}

impl Metrics {
    pub fn object(&self, kind: &'static str, action: Action, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.objects.get_or_create(&ObjectLabels { kind, action: action.as_str(), result }).inc();
    }

    /// The count for one label set (tests).
    pub fn object_count(&self, kind: &'static str, action: Action, ok: bool) -> u64 {
        let result = if ok { "ok" } else { "error" };
        self.objects.get_or_create(&ObjectLabels { kind, action: action.as_str(), result }).get()
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn set_next_expiry(&self, seconds: i64) {
        self.next_expiry.set(seconds);
    }

    pub fn client_ca_reload(&self, result: &'static str) {
        self.client_ca_reloads.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn profile_reload(&self, result: &'static str) {
        self.profile_reloads.get_or_create(&ResultLabels { result }).inc();
    }

    pub fn reconcile_error(&self, what: &'static str) {
        self.reconcile_errors.get_or_create(&ResultLabels { result: what }).inc();
    }

    pub fn set_conditions(&self, condition: crate::conditions::Condition, count: usize) {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        self.conditions.get_or_create(&ConditionLabels { condition: condition.as_str() }).set(count);
    }

    /// How many of `condition` are in force (tests).
    pub fn conditions(&self, condition: crate::conditions::Condition) -> i64 {
        self.conditions.get_or_create(&ConditionLabels { condition: condition.as_str() }).get()
    }

    pub fn refused(&self, refusal: Refusal) {
        self.refused.get_or_create(&ResultLabels { result: refusal.as_str() }).inc();
    }

    /// How many were refused for `refusal` (tests).
    pub fn refused_count(&self, refusal: Refusal) -> u64 {
        self.refused.get_or_create(&ResultLabels { result: refusal.as_str() }).get()
    }

    pub fn pod_certificate(&self, result: &'static str) {
        self.pod_certificates.get_or_create(&ResultLabels { result }).inc();
    }

    /// How many requests were answered with `result` (tests).
    pub fn pod_certificate_count(&self, result: &'static str) -> u64 {
        self.pod_certificates.get_or_create(&ResultLabels { result }).get()
    }

    pub fn webhook_config_repair(&self, field: &'static str) {
        self.webhook_config_repairs.get_or_create(&FieldLabels { field }).inc();
    }

    pub fn serving_change(&self, what: &'static str) {
        self.serving_changes.get_or_create(&ResultLabels { result: what }).inc();
    }

    /// How many serving changes of `what` (tests).
    pub fn serving_change_count(&self, what: &'static str) -> u64 {
        self.serving_changes.get_or_create(&ResultLabels { result: what }).get()
    }

    /// When the serving `leaf` or `ca` expires.
    pub fn set_serving_expiry(&self, what: &'static str, unix_seconds: i64) {
        self.serving_expiry.get_or_create(&ResultLabels { result: what }).set(unix_seconds);
    }

    /// When the client CA now loaded expires (Unix seconds).
    pub fn set_client_ca_not_after(&self, unix_seconds: i64) {
        self.client_ca_not_after.set(unix_seconds);
    }

    /// Which keyward this is (the binary knows; this crate does not).
    pub fn set_build_info(&self, version: &'static str, commit: &'static str) {
        self.build_info.get_or_create(&BuildLabels { version, commit }).set(1);
    }

    /// Everything, in the text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}
