//! The gate's metrics, registered beside the connection metrics every keyward listener has.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use crate::metrics::Metrics;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    rule: &'static str,
    decision: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReviewLabels {
    review: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    file: &'static str,
    result: &'static str,
}

/// What the gate decided, asked and reloaded.
pub struct GateMetrics {
    shared: Arc<Metrics>,
    requests: Family<RequestLabels, Counter>,
    duration: Histogram,
    reviews: Family<ReviewLabels, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    upstream_errors: Counter,
    owners: Family<KindLabels, Gauge>,
    owner_watch_errors: Family<KindLabels, Counter>,
}

/// How the gate answered a request (a metrics label and a log field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Identified, and no rule allows it: 403 / PERMISSION_DENIED.
    Refused,
    /// No identity the gate accepts: 401 / UNAUTHENTICATED.
    Unauthenticated,
    /// The API server could not be asked: 503 / UNAVAILABLE (fail closed).
    Unavailable,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Refused => "refused",
            Self::Unauthenticated => "unauthenticated",
            Self::Unavailable => "unavailable",
        }
    }
}

impl GateMetrics {
    pub fn new(shared: Arc<Metrics>) -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        shared.register(
            "gate_requests",
            "Requests the gate decided, by the rule that allowed them (empty when none did) and decision (allowed|refused|unauthenticated|unavailable)",
            requests.clone(),
        );
        // 10 µs to ~0.3 s: a decision from the caches takes microseconds; a review, milliseconds.
        let duration = Histogram::new(exponential_buckets(0.00001, 2.0, 16));
        shared.register(
            "gate_decision_duration_seconds",
            "Time from a request's headers to the gate's decision (reviews and a held message included), in seconds",
            duration.clone(),
        );
        let reviews = Family::<ReviewLabels, Counter>::default();
        shared.register(
            "gate_reviews",
            "TokenReviews and SubjectAccessReviews the gate needed, by review (token|access) and result (cached|shared|allowed|denied|error; shared: answered by a TokenReview another request was asking)",
            reviews.clone(),
        );
        let reloads = Family::<ReloadLabels, Counter>::default();
        shared.register(
            "gate_reloads",
            "Reloads of the gate file and the client CA bundle, by file (gate|client-ca) and result (loaded|unchanged|failed)",
            reloads.clone(),
        );
        let upstream_errors = Counter::default();
        shared.register(
            "gate_upstream_errors",
            "Allowed requests the upstream could not be sent (connection refused, reset, bad answer)",
            upstream_errors.clone(),
        );
        let owners = Family::<KindLabels, Gauge>::default();
        shared.register(
            "gate_live_owners",
            "Owners of each watched kind (spec.liveOwners, kind in lower case) that exist, as the gate's watch has seen them",
            owners.clone(),
        );
        let owner_watch_errors = Family::<KindLabels, Counter>::default();
        shared.register(
            "gate_owner_watch_errors",
            "Failures of the watch of a spec.liveOwners kind (each retried with backoff; the owners known meanwhile still decide)",
            owner_watch_errors.clone(),
        );
        Self { shared, requests, duration, reviews, reloads, upstream_errors, owners, owner_watch_errors }
    }

    pub fn observe_request(&self, rule: Option<&str>, decision: Decision, took: Duration) {
        let rule = rule.map_or("", |r| self.shared.intern(r));
        self.requests.get_or_create(&RequestLabels { rule, decision: decision.as_str() }).inc();
        self.duration.observe(took.as_secs_f64());
    }

    pub fn observe_review(&self, review: &'static str, result: &'static str) {
        self.reviews.get_or_create(&ReviewLabels { review, result }).inc();
    }

    pub fn observe_reload(&self, file: &'static str, result: &'static str) {
        self.reloads.get_or_create(&ReloadLabels { file, result }).inc();
    }

    pub fn observe_upstream_error(&self) {
        self.upstream_errors.inc();
    }

    /// A label value that lives as long as the process (a gate file's kind).
    pub fn intern(&self, value: &str) -> &'static str {
        self.shared.intern(value)
    }

    pub fn observe_owners(&self, kind: &'static str, count: usize) {
        self.owners.get_or_create(&KindLabels { kind }).set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub fn observe_owner_watch_error(&self, kind: &'static str) {
        self.owner_watch_errors.get_or_create(&KindLabels { kind }).inc();
    }
}
