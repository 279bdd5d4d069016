//! Prometheus metrics, served in the text format on the metrics port.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keyward_certs::ReloadOutcome;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::profiles::ProfileReload;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    profile: &'static str,
    decision: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedLabels {
    listener: &'static str,
    reason: &'static str,
}

/// Everything keyward measures. Cheap to update from any thread.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    duration: Histogram,
    bad_requests: Counter,
    cert_not_after: Gauge,
    cert_reloads: Family<ReloadLabels, Counter>,
    profile_reloads: Family<ReloadLabels, Counter>,
    open_connections: Family<ListenerLabels, Gauge>,
    closed_connections: Family<ClosedLabels, Counter>,
    refused_connections: Family<ListenerLabels, Counter>,
    accept_errors: Family<ListenerLabels, Counter>,
    in_flight: Family<ListenerLabels, Gauge>,
    decisions_running: Gauge,
    /// Profile names as labels, interned once each (profiles come from configuration, so there
    /// are few), so that counting a decision allocates nothing.
    profile_names: RwLock<HashMap<String, &'static str>>,
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
        let mut registry = Registry::with_prefix("keyward");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "Admission decisions, by profile (empty when none), decision (allowed|denied) and reason",
            requests.clone(),
        );
        // 100 µs to ~3.3 s: decisions take microseconds; the tail shows contention.
        let duration = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "admission_duration_seconds",
            "Time from a complete request body to the response, in seconds",
            duration.clone(),
        );
        let bad_requests = Counter::default();
        registry.register(
            "admission_bad_requests",
            "Bodies refused before a decision (HTTP 4xx)",
            bad_requests.clone(),
        );
        let cert_not_after = Gauge::default();
        registry.register(
            "certificate_not_after_timestamp_seconds",
            "notAfter of the serving certificate now served, as a Unix timestamp",
            cert_not_after.clone(),
        );
        let cert_reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "certificate_reloads",
            "Serving certificate reload attempts, by result (loaded|unchanged|failed)",
            cert_reloads.clone(),
        );
        let profile_reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "profile_reloads",
            "Attempts to reload the profiles from --profiles, by result (loaded|unchanged|failed)",
            profile_reloads.clone(),
        );
        let open_connections = Family::<ListenerLabels, Gauge>::default();
        registry.register(
            "open_connections",
            "Connections open now, by listener (webhook|metrics)",
            open_connections.clone(),
        );
        let closed_connections = Family::<ClosedLabels, Counter>::default();
        registry.register(
            "connections_closed_by_server",
            "Connections keyward closed, by listener and reason (handshake-timeout|handshake-failed|first-request-timeout|header-timeout|slow-request|idle|evicted|shutdown|credential-ended)",
            closed_connections.clone(),
        );
        let refused_connections = Family::<ListenerLabels, Counter>::default();
        registry.register(
            "connections_refused",
            "Connections closed on arrival because every open connection had a request in flight",
            refused_connections.clone(),
        );
        let accept_errors = Family::<ListenerLabels, Counter>::default();
        registry.register(
            "accept_errors",
            "Failed accepts (e.g. out of file descriptors), each followed by a back-off",
            accept_errors.clone(),
        );
        let decisions_running = Gauge::default();
        registry.register(
            "admission_decisions_running",
            "Admission decisions being computed now (bodies read, answers not yet sent)",
            decisions_running.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "build_info",
            "Always 1; the labels say which keyward this is (version, and the commit it was built from)",
            build_info.clone(),
        );
        build_info.get_or_create(&BuildLabels { version: crate::build::VERSION, commit: crate::build::COMMIT }).set(1);
        let in_flight = Family::<ListenerLabels, Gauge>::default();
        registry.register("requests_in_flight", "Requests being answered now, by listener", in_flight.clone());
        Self {
            registry: Mutex::new(registry),
            requests,
            duration,
            bad_requests,
            cert_not_after,
            cert_reloads,
            profile_reloads,
            open_connections,
            closed_connections,
            refused_connections,
            accept_errors,
            in_flight,
            decisions_running,
            profile_names: RwLock::default(),
        }
    }
}

impl Metrics {
    /// `name` as a `&'static str` label value, leaked once per distinct name: only for names
    /// from configuration (profiles, gate rules), never from requests.
    pub fn intern(&self, name: &str) -> &'static str {
        if let Some(interned) = self.profile_names.read().unwrap_or_else(|p| p.into_inner()).get(name) {
            return interned;
        }
        let mut names = self.profile_names.write().unwrap_or_else(|p| p.into_inner());
        names.entry(name.to_string()).or_insert_with(|| Box::leak(name.to_string().into_boxed_str()))
    }

    pub fn observe_decision(&self, profile: Option<&str>, allowed: bool, reason: &'static str, took: Duration) {
        let labels = RequestLabels {
            profile: profile.map_or("", |p| self.intern(p)),
            decision: if allowed { "allowed" } else { "denied" },
            reason,
        };
        self.requests.get_or_create(&labels).inc();
        self.duration.observe(took.as_secs_f64());
    }

    pub fn observe_bad_request(&self) {
        self.bad_requests.inc();
    }

    pub fn observe_reload(&self, outcome: &ReloadOutcome) {
        self.cert_reloads.get_or_create(&ReloadLabels { result: outcome.as_str() }).inc();
        if let ReloadOutcome::Loaded(info) = outcome {
            self.cert_not_after.set(unix_seconds(info.not_after));
        }
    }

    pub fn observe_profile_reload(&self, outcome: &ProfileReload) {
        self.profile_reloads.get_or_create(&ReloadLabels { result: outcome.as_str() }).inc();
    }

    pub fn set_open_connections(&self, listener: &'static str, open: usize) {
        self.open_connections.get_or_create(&ListenerLabels { listener }).set(i64::try_from(open).unwrap_or(i64::MAX));
    }

    pub fn observe_connection_closed(&self, listener: &'static str, reason: &'static str) {
        self.closed_connections.get_or_create(&ClosedLabels { listener, reason }).inc();
    }

    pub fn observe_connection_refused(&self, listener: &'static str) {
        self.refused_connections.get_or_create(&ListenerLabels { listener }).inc();
    }

    pub fn observe_accept_error(&self, listener: &'static str) {
        self.accept_errors.get_or_create(&ListenerLabels { listener }).inc();
    }

    /// The gauge of decisions running, for the handler to move.
    pub fn decisions_running(&self) -> Gauge {
        self.decisions_running.clone()
    }

    /// The gauge of requests in flight on `listener`, for the connection layer to move.
    pub fn requests_in_flight(&self, listener: &'static str) -> Gauge {
        self.in_flight.get_or_create(&ListenerLabels { listener }).clone()
    }

    /// Registers `metric` beside keyward's own (the gate's), under the `keyward_` prefix.
    pub fn register(&self, name: &str, help: &str, metric: impl prometheus_client::registry::Metric) {
        self.registry.lock().unwrap_or_else(|p| p.into_inner()).register(name, help, metric);
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)).unwrap_or(0)
}
