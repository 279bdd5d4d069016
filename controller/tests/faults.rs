//! The controller's loop against the fake API when the API server misbehaves: a Lease request
//! that hangs while others work, Lease renewals that fail, a holder that died, a GET that never
//! answers, a flood of pods, 410 Gone and a restart; and what it costs when nothing changes.
//! Also the loop's own duties that only the leader does: profile reloads, and the webhook
//! configuration's `matchConditions` kept equal to the profiles.
//! Each waits on events; a time appears only as the limit after which a test fails, or as a
//! bound that a slow machine can only make easier to meet.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use keyward_certs::pki::Ca;
use keyward_controller::metrics::Refusal;
use keyward_controller::{run, LeaderElector, Leadership, LeaseConfig, Settings};
use keyward_engine::ProfileSet;
use serde_json::{json, Value};
use support::*;

fn fast_lease(identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
        ..LeaseConfig::new("keyward-controller", "keyward-system", identity)
    }
}

const LEASES: &str = "coordination.k8s.io/v1/leases";

fn is_lease(c: &Call) -> bool {
    c.resource == LEASES
}

/// Until the loop has nothing left to do: three Lease renewals since its last request that
/// was neither the Lease nor a watch.
async fn settled(fake: &FakeApi) {
    fake.until(LIMIT, |f| {
        let c = f.calls();
        let last = c.iter().rposition(|c| !is_lease(c) && !c.query.contains("watch=true"))?;
        (c[last..].iter().filter(|c| is_lease(c) && c.method == "PUT").count() >= 3).then_some(())
    })
    .await;
}

/// A replica as `keyward controller` runs one: an elector and the loop, on one client.
struct Replica {
    leadership: Leadership,
    reconciler: std::sync::Arc<keyward_controller::Context>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn replica(fake: &FakeApi, id: &str, ca: &ClientCa, deadline: Duration) -> Replica {
    replica_with(fake, id, ca, deadline, settings())
}

fn replica_with(fake: &FakeApi, id: &str, ca: &ClientCa, deadline: Duration, settings: Settings) -> Replica {
    let client = fake.client_with_deadline(id, deadline);
    let elector = LeaderElector::new(client.clone(), fast_lease(id));
    let leadership = elector.leadership();
    let election = tokio::spawn(elector.run(std::future::pending()));
    let r = reconciler_with(client.clone(), ProfileSet::builtin().unwrap(), ca, leadership.clone(), settings);
    let run = start_with(
        client,
        r.clone(),
        leadership.clone(),
        ca,
        run::LoopSettings { resync: Duration::from_secs(3600), workers: 4 },
    );
    Replica { leadership, reconciler: r, tasks: vec![election, run] }
}

async fn until_leading(leadership: &Leadership) {
    let mut watch = leadership.clone();
    let wait = async {
        while !watch.is_leader() {
            assert!(watch.changed().await);
        }
    };
    tokio::time::timeout(LIMIT, wait).await.expect("never became leader");
}

async fn until_not_leading(leadership: &Leadership) {
    let mut watch = leadership.clone();
    let wait = async {
        while watch.is_leader() {
            assert!(watch.changed().await);
        }
    };
    tokio::time::timeout(LIMIT, wait).await.expect("never stopped leading");
}

/// A new job and its attested driver pod in team-a, named `name`.
fn new_job(fake: &FakeApi, keys: &keyward_certs::attestation::Keys, name: &str) {
    fake.seed(lmevaljob("team-a", name, &format!("uid-{name}")));
    fake.seed(fms_pod(Some(keys), "team-a", name, name, &format!("uid-{name}")));
}

fn secret_of(name: &str) -> impl Fn(&FakeApi) -> Option<serde_json::Value> + '_ {
    move |f| f.get("v1", "Secret", "team-a", &format!("{name}-lmeval-client"))
}

// === leadership ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_requests_hang_writes_nothing_after_its_local_renew_deadline() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    let ca = client_ca();
    let a = replica(&fake, "replica-a", &ca, Duration::from_secs(10));
    until_leading(&a.leadership).await;
    let keys = fake.until(LIMIT, |_| a.reconciler.attestation_keys()).await;
    new_job(&fake, &keys, "before");
    fake.until(LIMIT, secret_of("before")).await;

    // A half-open connection to the apiserver that serves Leases; everything else works.
    fake.hang("GET", LEASES, None);
    fake.hang("PUT", LEASES, None);
    let deadline = a.leadership.until().unwrap();
    until_not_leading(&a.leadership).await;
    assert!(std::time::Instant::now() >= deadline.into_std(), "leadership ended before its deadline");
    // Work keeps arriving; the elector keeps trying (and hanging). No write goes out.
    new_job(&fake, &keys, "after");
    fake.until(LIMIT, |f| (f.calls().iter().filter(|c| is_lease(c) && c.status == 0).count() >= 3).then_some(())).await;
    let late: Vec<Call> =
        fake.attempted_writes().into_iter().filter(|c| !is_lease(c) && c.at >= deadline.into_std()).collect();
    assert!(late.is_empty(), "written after the renew deadline: {late:#?}");
    assert!(fake.get("v1", "Secret", "team-a", "after-lmeval-client").is_none());
    assert!(a.reconciler.metrics().render().contains("keyward_controller_leader 0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_stops_at_the_renew_deadline_and_the_other_takes_over() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    let ca = client_ca();
    let a = replica(&fake, "replica-a", &ca, Duration::from_secs(10));
    until_leading(&a.leadership).await;
    let b = replica(&fake, "replica-b", &ca, Duration::from_secs(10));
    // Every renewal of a's fails (500); b's requests are answered.
    fake.fail_for("replica-a", "PUT", LEASES, 500, usize::MAX);
    let deadline = a.leadership.until().unwrap();
    until_not_leading(&a.leadership).await;
    assert!(std::time::Instant::now() >= deadline.into_std());
    // b waits out the Lease (as it observed it) and leads; only b writes from then on.
    until_leading(&b.leadership).await;
    let keys = fake.until(LIMIT, |_| b.reconciler.attestation_keys()).await;
    new_job(&fake, &keys, "job-1");
    fake.until(LIMIT, secret_of("job-1")).await;
    let writers: BTreeSet<String> =
        fake.writes().into_iter().filter(|c| !is_lease(c) && c.at >= deadline.into_std()).map(|c| c.client).collect();
    assert_eq!(writers, BTreeSet::from(["replica-b".to_string()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_lease_is_taken_after_its_duration_as_observed_here_and_not_before() {
    let fake = FakeApi::default();
    // Held by a replica that died; its renewTime, by its own clock, is far in the future.
    fake.seed(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "keyward-controller", "namespace": "keyward-system"},
        "spec": {"holderIdentity": "dead-replica", "leaseDurationSeconds": 3, "renewTime": "2099-01-01T00:00:00.000000Z",
                 "acquireTime": "2099-01-01T00:00:00.000000Z", "leaseTransitions": 4}}));
    let client = fake.client("replica-b");
    let elector = LeaderElector::new(client, fast_lease("replica-b"));
    let leadership = elector.leadership();
    let started = Instant::now();
    let task = tokio::spawn(elector.run(std::future::pending()));
    until_leading(&leadership).await;
    task.abort();
    let first_look = fake.calls().iter().find(|c| is_lease(c)).unwrap().at;
    let taken = fake.calls().into_iter().find(|c| is_lease(c) && c.method == "PUT").unwrap();
    assert!(
        taken.at.duration_since(first_look) >= Duration::from_secs(3),
        "taken {:?} after first seeing it",
        taken.at.duration_since(first_look)
    );
    assert!(taken.at >= started);
    let lease = fake.get("coordination.k8s.io/v1", "Lease", "keyward-system", "keyward-controller").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_replicas_only_the_leader_writes_and_losing_the_lease_stops_it() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    let ca = client_ca();
    let replicas = [
        replica(&fake, "replica-a", &ca, Duration::from_secs(10)),
        replica(&fake, "replica-b", &ca, Duration::from_secs(10)),
    ];
    let leader = fake
        .until(LIMIT, |f| {
            f.get("coordination.k8s.io/v1", "Lease", "keyward-system", "keyward-controller")
                .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
        })
        .await;
    let (mine, id) = if leader == "replica-a" { (&replicas[0], "replica-a") } else { (&replicas[1], "replica-b") };
    let keys = fake.until(LIMIT, |_| mine.reconciler.attestation_keys()).await;
    fake.seed(owner());
    fake.seed(attested_fms_pod(&keys));
    fake.until(LIMIT, |f| f.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client")).await;
    let writers: BTreeSet<String> = fake.writes().into_iter().filter(|c| !is_lease(c)).map(|c| c.client).collect();
    assert_eq!(writers, BTreeSet::from([id.to_string()]));

    // Another holder takes the Lease: the leader sees it at its next renewal and stops.
    let mut lease = fake.get("coordination.k8s.io/v1", "Lease", "keyward-system", "keyward-controller").unwrap();
    lease["spec"]["holderIdentity"] = json!("replica-c");
    lease["spec"]["leaseDurationSeconds"] = json!(3600);
    fake.seed(lease);
    until_not_leading(&mine.leadership).await;
    let stopped = std::time::Instant::now();
    new_job(&fake, &keys, "after");
    fake.until(LIMIT, |f| (f.calls().iter().filter(|c| is_lease(c) && c.at > stopped).count() >= 6).then_some(()))
        .await;
    assert!(fake.attempted_writes().iter().all(|c| is_lease(c) || c.at < stopped), "{:#?}", fake.attempted_writes());
    assert!(mine.reconciler.metrics().render().contains("keyward_controller_leader 0"));
}

// === a hung request, a flood, a restart ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_that_never_answers_holds_up_only_its_own_owner() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    let ca = client_ca();
    let client = fake.client_with_deadline("keyward", Duration::from_secs(1));
    let r = reconciler_with(client.clone(), ProfileSet::builtin().unwrap(), &ca, Leadership::always(), settings());
    let _task = start_with(
        client,
        r.clone(),
        Leadership::always(),
        &ca,
        run::LoopSettings { resync: Duration::from_secs(3600), workers: 4 },
    );
    let keys = fake.until(LIMIT, |_| r.attestation_keys()).await;
    // The GET of one job's owner is accepted and never answered.
    fake.hang("GET", "lmevaljobs", Some("stuck"));
    new_job(&fake, &keys, "stuck");
    fake.until(LIMIT, |f| f.calls().iter().any(|c| c.name == "stuck" && c.status == 0).then_some(())).await;
    for name in ["job-b", "job-c", "job-d"] {
        new_job(&fake, &keys, name);
    }
    // The others are issued while it hangs.
    for name in ["job-b", "job-c", "job-d"] {
        fake.until(LIMIT, secret_of(name)).await;
    }
    // It is abandoned at the deadline and retried; once answered, it is issued too.
    fake.unhang();
    fake.until(LIMIT, secret_of("stuck")).await;
    assert!(r.metrics().render().contains("keyward_controller_reconcile_errors_total{result=\"owner\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_pods_where_nobody_opted_in_costs_nothing_and_one_namespace_cannot_starve_another() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(opted_in("busy"));
    fake.seed(namespace("flood"));
    let ca = client_ca();
    let client = fake.client("keyward");
    let r = reconciler_with(client.clone(), ProfileSet::builtin().unwrap(), &ca, Leadership::always(), settings());
    let keys = attestation_keys(&r).await;
    // 1,500 labelled pods in a namespace that did not opt in: in the initial list.
    for i in 0..1500 {
        fake.seed(fms_pod(Some(&keys), "flood", &format!("p{i}"), &format!("job-{i}"), &format!("uid-{i}")));
    }
    // An apiserver that answers busy's requests in 50 ms: two workers take 5 s for all 200,
    // far longer than the 201 watch events take to arrive, so a FIFO queue would show 200
    // busy GETs before team-a's write and a fair one shows a few.
    fake.delay("busy", Duration::from_millis(50));
    let _task = start_with(
        client,
        r.clone(),
        Leadership::always(),
        &ca,
        run::LoopSettings { resync: Duration::from_secs(3600), workers: 2 },
    );
    // Once every pod watch runs (so the list, flood and all, is behind it), 200 pods arrive in
    // one that did opt in, whose owners keyward must check one by one (none exists: each costs
    // a GET), and team-a's job arrives behind them.
    let busy: Vec<_> = (0..200)
        .map(|i| fms_pod(Some(&keys), "busy", &format!("p{i}"), &format!("job-{i}"), &format!("uid-{i}")))
        .collect();
    let watches = run::pod_selectors(&r).len();
    fake.until(LIMIT, |f| {
        let pod_watches =
            f.calls().iter().filter(|c| c.resource == "/v1/pods" && c.query.contains("watch=true")).count();
        (pod_watches >= watches).then_some(())
    })
    .await;
    for pod in busy {
        fake.seed(pod);
    }
    fake.seed(owner());
    fake.seed(attested_fms_pod(&keys));
    fake.until(LIMIT, |f| f.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client")).await;
    let calls = fake.calls();
    let busy_before = calls
        .iter()
        .take_while(|c| !(c.namespace == "team-a" && c.method == "POST"))
        .filter(|c| c.namespace == "busy" && c.resource.ends_with("lmevaljobs"))
        .count();
    // In turn, team-a's key waits for at most one of busy's per worker once queued; the rest is
    // the time the 201 events take to arrive. First in, first out would be 200.
    assert!(busy_before < 50, "team-a waited for {busy_before} of busy's 200 owners");
    // The flood namespace: not one request.
    assert!(
        calls.iter().all(|c| c.namespace != "flood"),
        "{:?}",
        calls.iter().filter(|c| c.namespace == "flood").take(3).collect::<Vec<_>>()
    );
    fake.until(LIMIT, |_| (r.metrics().refused_count(Refusal::OwnerMissing) == 200).then_some(())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_410_gone_and_an_api_server_restart_what_changed_meanwhile_is_done() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(opted_in("team-b"));
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", builtins_and_account(), &ca, Leadership::always());
    let _task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    let keys = fake.until(LIMIT, |_| r.attestation_keys()).await;
    new_job(&fake, &keys, "before");
    fake.until(LIMIT, secret_of("before")).await;
    fake.until(LIMIT, |f| f.get("v1", "ServiceAccount", "team-b", "keyward-router")).await;

    // The apiserver restarts: every watch ends, and resuming from where it was gets 410 Gone.
    fake.restart();
    // Meanwhile: a new job's pod, and team-b opts out.
    new_job(&fake, &keys, "meanwhile");
    fake.seed(namespace("team-b"));
    fake.until(LIMIT, secret_of("meanwhile")).await;
    fake.until(LIMIT, |f| f.get("v1", "ServiceAccount", "team-b", "keyward-router").is_none().then_some(())).await;
    // The watches listed again after the 410.
    assert!(fake
        .calls()
        .iter()
        .any(|c| c.resource == "/v1/pods" && !c.query.contains("watch=true") && c.query.contains("limit=500")));

    // A ServiceAccount keyward provisioned, deleted while its watch alone was down (timed out,
    // and the history compacted: 410 Gone): no event says so, the new list just lacks it, and
    // it is back when that list ends, not at the resync.
    let router = |f: &FakeApi| f.get("v1", "ServiceAccount", "team-a", "keyward-router");
    fake.until(LIMIT, router).await;
    fake.hang("GET", "/v1/serviceaccounts", Some(""));
    fake.expire_watches("/v1/serviceaccounts");
    fake.remove("v1", "ServiceAccount", "team-a", "keyward-router");
    fake.unhang();
    fake.until(LIMIT, router).await;
}

// === server CA sources, by watch ===

fn server_ca_copy(namespace: &str) -> impl Fn(&FakeApi) -> Option<String> + '_ {
    move |f| {
        let copy = f.get("v1", "ConfigMap", namespace, "keyward-lmeval-server-ca")?;
        copy["data"]["ca.crt"].as_str().map(str::to_string)
    }
}

/// Installed before fms-lm-eval-service, keyward finds no server CA; the operator's
/// Certificate is issued later, and later still cert-manager rotates it. Each reaches every
/// opted-in namespace by the source's watch, with the shipped RBAC (list and watch of that one
/// Secret by name), long before the hour-long resync of this loop would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_source_that_arrives_late_or_rotates_reaches_every_opted_in_namespace_at_once() {
    let fake = FakeApi::default();
    fake.list_only_by_name("/v1/secrets", &["grpc-server-cert"]);
    fake.seed(opted_in("team-a"));
    fake.seed(opted_in("team-b"));
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let _task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    let unusable = keyward_controller::conditions::Condition::ServerCaSourceUnusable;
    fake.until(LIMIT, |_| (r.metrics().conditions(unusable) == 2).then_some(())).await;
    assert_eq!(server_ca_copy("team-a")(&fake), None);

    let first = Ca::mint("gRPC 1", now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, first.cert_pem());
    for ns in ["team-a", "team-b"] {
        fake.until(LIMIT, |f| server_ca_copy(ns)(f).filter(|pem| pem == first.cert_pem())).await;
    }
    fake.until(LIMIT, |_| (r.metrics().conditions(unusable) == 0).then_some(())).await;

    let second = Ca::mint("gRPC 2", now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, second.cert_pem());
    for ns in ["team-a", "team-b"] {
        fake.until(LIMIT, |f| server_ca_copy(ns)(f).filter(|pem| pem == second.cert_pem())).await;
    }
    // A namespace user's Secret of the source's name, in their own namespace, with a CA of
    // their own: the watch is the source namespace's, and the copies stay the source's.
    let theirs = Ca::mint("not the operator's", now(), Duration::from_secs(86400)).unwrap();
    fake.seed(json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "grpc-server-cert", "namespace": "team-a"},
        "data": {"ca.crt": b64(theirs.cert_pem()), "tls.crt": "", "tls.key": ""}}));
    let third = Ca::mint("gRPC 3", now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, third.cert_pem());
    for ns in ["team-a", "team-b"] {
        fake.until(LIMIT, |f| server_ca_copy(ns)(f).filter(|pem| pem == third.cert_pem())).await;
    }
    // No write ever carried their CA (a copy in JSON has its line breaks escaped).
    let carried = |pem: &str| {
        let in_json = pem.replace('\n', "\\n");
        fake.writes().iter().any(|c| c.body.as_ref().is_some_and(|b| b.to_string().contains(&in_json)))
    };
    assert!(carried(third.cert_pem()), "the matcher finds the source's copies");
    assert!(!carried(theirs.cert_pem()), "a write carried the look-alike Secret's CA");
    // The watch is one Secret's, by name, in the source's namespace; nothing was refused.
    let secret_reads: BTreeSet<(String, String)> = fake
        .calls()
        .iter()
        .filter(|c| c.resource == "/v1/secrets" && c.method == "GET" && c.name.is_empty())
        .map(|c| (c.namespace.clone(), c.query.contains("watch=true").to_string()))
        .collect();
    assert_eq!(secret_reads, BTreeSet::from([("lm-eval".into(), "false".into()), ("lm-eval".into(), "true".into())]));
    let refused: Vec<Call> = fake.calls().into_iter().filter(|c| c.status == 403).collect();
    assert!(refused.is_empty(), "{refused:#?}");
}

/// Without the right to watch the source (a profile of one's own, its Secret's name not in
/// the ClusterRole), keyward says so as a condition naming the rule to add, and provisions
/// everything else; once the right is granted, the watch retries, lists, the condition ends
/// and the source reaches the namespaces without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_source_keyward_may_not_watch_is_a_condition_that_ends_when_the_right_is_granted() {
    let fake = FakeApi::default();
    fake.list_only_by_name("/v1/secrets", &[]);
    fake.seed(opted_in("team-a"));
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", builtins_and_account(), &ca, Leadership::always());
    let _task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    let unwatched = keyward_controller::conditions::Condition::ServerCaSourceUnwatched;
    let subject = "Secret lm-eval/grpc-server-cert";
    let note = fake.until(LIMIT, |_| r.conditions().message(unwatched, subject)).await;
    assert_eq!(
        note,
        "keyward may not watch the serverCA source Secret lm-eval/grpc-server-cert, so a change to it reaches opted-in namespaces only at the next resync; grant list and watch on it by name: add \"grpc-server-cert\" to the resourceNames of the ClusterRole keyward-controller-ca-sources (deploy/base/controller.yaml)"
    );
    fake.until(LIMIT, |_| (r.metrics().conditions(unwatched) == 1).then_some(())).await;
    assert!(r.metrics().render().contains("keyward_controller_conditions{condition=\"server-ca-source-unwatched\"} 1"));
    fake.until(LIMIT, |f| f.get("v1", "ServiceAccount", "team-a", "keyward-router")).await;

    let pem = Ca::mint("gRPC", now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, pem.cert_pem());
    fake.list_only_by_name("/v1/secrets", &["grpc-server-cert"]);
    fake.until(LIMIT, |f| server_ca_copy("team-a")(f).filter(|copy| copy == pem.cert_pem())).await;
    fake.until(LIMIT, |_| (r.metrics().conditions(unwatched) == 0).then_some(())).await;
    assert_eq!(r.conditions().message(unwatched, subject), None);
}

/// A rotation while the source's watch was down (the API server's storage unavailable, and
/// the history compacted meanwhile: 410 Gone): no event reports it, the new list just shows the new CA, and the end of that list
/// counts as a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_source_rotated_while_its_watch_was_down_is_read_when_the_watch_lists_again() {
    let fake = FakeApi::default();
    fake.list_only_by_name("/v1/secrets", &["grpc-server-cert"]);
    fake.seed(opted_in("team-a"));
    let first = Ca::mint("gRPC 1", now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, first.cert_pem());
    let ca = client_ca();
    let a = replica(&fake, "replica-a", &ca, Duration::from_secs(10));
    until_leading(&a.leadership).await;
    fake.until(LIMIT, |f| server_ca_copy("team-a")(f).filter(|pem| pem == first.cert_pem())).await;
    // Settled first, so that no read of the source left over from starting can see the
    // rotation below.
    settled(&fake).await;

    // The watch goes down, and is seen to be refused; the rotation happens meanwhile, and the
    // history is compacted before it comes back.
    fake.take_down("/v1/secrets");
    fake.until(LIMIT, |f| f.calls().iter().any(|c| c.resource == "/v1/secrets" && c.status == 503).then_some(())).await;
    let second = Ca::mint("gRPC 2", now(), Duration::from_secs(86400)).unwrap();
    server_ca_source(&fake, second.cert_pem());
    fake.clear_calls();
    fake.bring_up("/v1/secrets");
    fake.until(LIMIT, |f| server_ca_copy("team-a")(f).filter(|pem| pem == second.cert_pem())).await;
    // Read because a new list ended, not because an event said so.
    let reads: Vec<String> = fake
        .calls()
        .into_iter()
        .filter(|c| c.resource == "/v1/secrets" && c.status == 200 && !c.query.contains("watch=true"))
        .map(|c| format!("{} {}", c.name, c.query))
        .collect();
    assert_eq!(
        reads,
        [" &fieldSelector=metadata.name%3Dgrpc-server-cert&limit=500", "grpc-server-cert "],
        "a list, then the read of the source"
    );
}

// === what it costs ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_is_watches_and_the_lease_and_a_new_owner_costs_two_requests() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    let ca = client_ca();
    let a = replica(&fake, "replica-a", &ca, Duration::from_secs(10));
    until_leading(&a.leadership).await;
    let keys = fake.until(LIMIT, |_| a.reconciler.attestation_keys()).await;
    for i in 0..50 {
        new_job(&fake, &keys, &format!("job-{i}"));
    }
    for i in 0..50 {
        fake.until(LIMIT, secret_of(&format!("job-{i}"))).await;
    }
    // A new owner, with the loop settled: verify the owner, create the Secret.
    settled(&fake).await;
    fake.clear_calls();
    new_job(&fake, &keys, "new-owner");
    fake.until(LIMIT, secret_of("new-owner")).await;
    let spent: Vec<String> = fake
        .calls()
        .iter()
        .filter(|c| !is_lease(c) && !c.resource.starts_with("events"))
        .map(|c| format!("{} {}", c.method, c.resource))
        .collect();
    assert_eq!(spent, [format!("GET {OWNER_API}/lmevaljobs"), "POST /v1/secrets".to_string()]);

    // Then nothing changes: over twenty Lease renewals, nothing but the Lease is asked for.
    fake.clear_calls();
    fake.until(LIMIT, |f| (f.calls().iter().filter(|c| is_lease(c) && c.method == "PUT").count() >= 20).then_some(()))
        .await;
    let others: Vec<String> = fake
        .calls()
        .iter()
        .filter(|c| !is_lease(c))
        .map(|c| format!("{} {} {}", c.method, c.resource, c.query))
        .collect();
    assert!(others.is_empty(), "{others:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_retried_with_backoff_not_in_a_hot_loop() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    fake.seed(owner());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", ProfileSet::builtin().unwrap(), &ca, Leadership::always());
    let keys = attestation_keys(&r).await;
    fake.fail("POST", "/v1/secrets", 500, 3);
    let _task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    fake.seed(attested_fms_pod(&keys));
    fake.until(Duration::from_secs(30), |f| f.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client")).await;
    let posts: Vec<_> = fake
        .calls()
        .into_iter()
        .filter(|c| c.method == "POST" && c.resource == "/v1/secrets" && c.namespace == "team-a")
        .collect();
    assert_eq!(posts.iter().map(|c| c.status).collect::<Vec<_>>(), [500, 500, 500, 201]);
    // 500 ms, 1 s, 2 s between attempts (at least: a loaded machine only adds).
    for (pair, min) in posts.windows(2).zip([450u64, 950, 1950]) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(gap >= Duration::from_millis(min), "retried after {gap:?}, expected at least {min} ms");
    }
    assert!(
        r.metrics().render().contains("keyward_controller_reconcile_errors_total{result=\"owner\"} 3"),
        "{}",
        r.metrics().render()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_operators_namespace_keeps_reconciling_everything_else() {
    // The shipped manifests publish the client CA to lm-eval, and the lmeval built-in copies
    // its server CA from there; on a cluster without fms-lm-eval-service neither exists.
    let fake = FakeApi::default();
    fake.require_namespaces();
    fake.seed(namespace("default"));
    fake.seed(namespace("keyward-system"));
    fake.seed(opted_in("team-a"));
    fake.seed(owner());
    let ca = client_ca();
    let r = reconciler(&fake, "keyward", builtins_and_account(), &ca, Leadership::always());
    let _task = start(&fake, r.clone(), Leadership::always(), &ca, "keyward");
    fake.until(LIMIT, |f| f.get("v1", "ServiceAccount", "team-a", "keyward-router")).await;
    let keys = fake.until(LIMIT, |_| r.attestation_keys()).await;
    fake.seed(attested_fms_pod(&keys));
    fake.until(LIMIT, |f| f.get("v1", "Secret", "team-a", "evaljob-sample-lmeval-client")).await;
    // Opting out is acted on at once, not behind a backoff.
    fake.seed(namespace("team-a"));
    fake.until(LIMIT, |f| f.get("v1", "ServiceAccount", "team-a", "keyward-router").is_none().then_some(())).await;
    // The operator's namespace appears: the client CA is published there, by the watch.
    fake.seed(namespace("lm-eval"));
    fake.until(LIMIT, |f| f.get("v1", "ConfigMap", "lm-eval", "keyward-client-ca")).await;
    let metrics = r.metrics().render();
    assert!(!metrics.contains("keyward_controller_reconcile_errors_total{"), "{metrics}");
    // A write may race its own watch event (a delete finds the object gone, 404; a create
    // finds it made, 409, and keyward reads it and decides again): harmless, and not failures.
    let failed: Vec<Call> = fake
        .calls()
        .into_iter()
        .filter(|c| {
            c.status >= 400
                && c.method != "GET"
                && !matches!((c.method.as_str(), c.status), ("DELETE", 404) | ("POST", 409))
        })
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

const ACCOUNT_PROFILE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata: {name: router}
spec:
  selector: {matchLabels: {app: router}}
  requesters: {usernames: ["system:serviceaccount:kube-system:replicaset-controller"]}
  inject:
    serviceAccount:
      name: keyward-router
      provider: keyward
      bindings: [{kind: ClusterRole, name: "system:auth-delegator"}]
"#;

fn builtins_and_account() -> ProfileSet {
    ProfileSet::builtin()
        .unwrap()
        .overlay(ProfileSet::from_sources([("r.yaml".to_string(), ACCOUNT_PROFILE.to_string())]).unwrap())
        .unwrap()
}

// === profile reloads ===

const ROUTER_PROFILE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata: {name: router}
spec:
  selector: {matchLabels: {app: router}}
  requesters: {usernames: [router-operator]}
  inject:
    serviceAccount:
      name: keyward-router
      provider: keyward
"#;

#[tokio::test]
async fn a_new_profile_set_takes_effect_in_the_running_loop_and_a_removed_profile_is_cleaned_up() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    let ca = client_ca();
    let builtin = ProfileSet::builtin().unwrap();
    let with_router = builtin
        .clone()
        .overlay(ProfileSet::from_sources([("router.yaml".to_string(), ROUTER_PROFILE.to_string())]).unwrap())
        .unwrap();
    fake.seed(drifted_config("keyward"));
    let (profiles_tx, profiles_rx) = tokio::sync::watch::channel(std::sync::Arc::new(builtin.clone()));
    let client = fake.client("keyward");
    let reconciler_for = {
        let (client, store) = (client.clone(), ca.store.clone());
        move |profiles| {
            std::sync::Arc::new(keyward_controller::Context::new(
                client.clone(),
                profiles,
                managed_conditions(),
                store.clone(),
                Leadership::always(),
                std::sync::Arc::new(keyward_controller::Metrics::default()),
                "keyward".into(),
            ))
        }
    };
    let status = std::sync::Arc::new(run::Status::default());
    let task = tokio::spawn(run::run_reloading(
        client,
        profiles_rx,
        reconciler_for,
        Leadership::always(),
        run::LoopSettings { resync: Duration::from_secs(3600), workers: 4 },
        status.clone(),
        std::future::pending(),
    ));
    let account = |f: &FakeApi| f.get("v1", "ServiceAccount", "team-a", "keyward-router");
    // The loop runs with the built-ins: nothing of the router's.
    // (The leader's first writes: the attestation key.)
    fake.until(LIMIT, |f| (!f.writes().is_empty()).then_some(())).await;
    assert!(account(&fake).is_none());

    // A set with the router profile: its account appears in the opted-in namespace.
    let with_router_copy = with_router.clone();
    profiles_tx.send(std::sync::Arc::new(with_router)).unwrap();
    let sa = fake.until(LIMIT, account).await;
    assert_eq!(sa["metadata"]["annotations"], json!({"keyward.io/profile": "router"}));
    // And the webhook configuration sends the router's pods too.
    let expression = keyward_engine::match_conditions::match_expression(&with_router_copy);
    assert!(expression.contains("\"app\"] == \"router\""), "{expression}");
    fake.until(LIMIT, |f| (conditions_of(f, "keyward")[0]["expression"] == expression.as_str()).then_some(())).await;

    // Back to the built-ins: the account no profile wants any more is removed.
    profiles_tx.send(std::sync::Arc::new(builtin)).unwrap();
    fake.until(LIMIT, |f| account(f).is_none().then_some(())).await;
    assert!(!task.is_finished(), "the loop keeps running");
    task.abort();
}

/// Several tasks wait for the namespace watch's first list (readiness, and one pod watch per
/// profile selector). kube-runtime's `Store::wait_until_ready` wakes only the last task that
/// polled it, so each waiting on it directly left readiness unreported for ever and all pod
/// watches but one unstarted; the loop now waits once and fans out.
#[tokio::test]
async fn readiness_and_every_pod_watch_follow_the_first_namespace_list() {
    let fake = FakeApi::default();
    fake.seed(opted_in("team-a"));
    let ca = client_ca();
    let two_selectors = ProfileSet::builtin()
        .unwrap()
        .overlay(ProfileSet::from_sources([("t.yaml".to_string(), TOKEN_PROFILE.to_string())]).unwrap())
        .unwrap();
    let r = reconciler(&fake, "keyward", two_selectors, &ca, Leadership::always());
    let status = std::sync::Arc::new(run::Status::default());
    let (client, loop_status, reloads) = (fake.client("keyward"), status.clone(), ca.store.subscribe());
    let task = tokio::spawn(async move {
        run::run(
            client,
            r,
            Leadership::always(),
            run::LoopSettings::default(),
            loop_status,
            reloads,
            std::future::pending(),
        )
        .await
    });
    // Both pod watches list (after the namespaces did), each with its own selector.
    let pod_lists = |f: &FakeApi| {
        let selectors: BTreeSet<String> = f
            .calls()
            .iter()
            .filter(|c| {
                c.resource == "/v1/pods" && c.query.contains("labelSelector") && !c.query.contains("watch=true")
            })
            .map(|c| c.query.clone())
            .collect();
        (selectors.len() == 2).then_some(selectors)
    };
    let selectors = fake.until(LIMIT, pod_lists).await;
    assert!(selectors.iter().any(|q| q.contains("token-job")), "{selectors:?}");
    // Readiness is a flag, not an API call: wait on it with the same limit.
    let deadline = Instant::now() + LIMIT;
    while status.ready().is_err() {
        assert!(Instant::now() < deadline, "never ready: {:?}", status.ready());
        tokio::task::yield_now().await;
    }
    task.abort();
}

// === the webhook configuration's matchConditions ===

const MWC: &str = "admissionregistration.k8s.io/v1";

/// A webhook configuration as `deploy/base/webhook.yaml` installs it (with a caBundle someone
/// injected), its matchConditions from an older set of profiles.
fn drifted_config(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": MWC, "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "keyward"},
            "annotations": {"cert-manager.io/inject-ca-from": "keyward-system/keyward-serving"}},
        "webhooks": [{
            "name": "pods.keyward.io",
            "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
            "clientConfig": {"service": {"name": "keyward", "namespace": "keyward-system", "path": "/mutate", "port": 443}, "caBundle": "Y2E="},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchExpressions": [{"key": "keyward.io/inject", "operator": "In", "values": ["enabled"]}]},
            "objectSelector": {"matchExpressions": [{"key": "keyward.io/inject", "operator": "NotIn", "values": ["disabled"]}]},
            "matchConditions": [{"name": "selected-by-a-keyward-profile", "expression": "has(object.metadata.labels) && 'app' in object.metadata.labels"}]
        }]
    })
}

fn managed_conditions() -> Settings {
    Settings { match_conditions_of: Some("keyward".into()), ..settings() }
}

fn conditions_of(f: &FakeApi, name: &str) -> serde_json::Value {
    f.get(MWC, "MutatingWebhookConfiguration", "", name).unwrap()["webhooks"][0]["matchConditions"].clone()
}

fn wanted_conditions() -> serde_json::Value {
    let set = ProfileSet::builtin().unwrap();
    json!([{"name": "selected-by-a-keyward-profile", "expression": keyward_engine::match_conditions::match_expression(&set)}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_repairs_drifted_match_conditions_and_touches_nothing_else() {
    let fake = FakeApi::default();
    fake.seed(drifted_config("keyward"));
    // Another configuration, with a webhook of keyward's name: not the one keyward manages.
    fake.seed(drifted_config("someone-elses"));
    let before = fake.get(MWC, "MutatingWebhookConfiguration", "", "keyward").unwrap();
    let ca = client_ca();
    let a = replica_with(&fake, "replica-a", &ca, Duration::from_secs(10), managed_conditions());
    until_leading(&a.leadership).await;
    let b = replica_with(&fake, "replica-b", &ca, Duration::from_secs(10), managed_conditions());

    let wanted = wanted_conditions();
    fake.until(LIMIT, |f| (conditions_of(f, "keyward") == wanted).then_some(())).await;
    // Everything but matchConditions is as it was (resourceVersion aside).
    let mut after = fake.get(MWC, "MutatingWebhookConfiguration", "", "keyward").unwrap();
    after["webhooks"][0]["matchConditions"] = before["webhooks"][0]["matchConditions"].clone();
    after["metadata"]["resourceVersion"] = before["metadata"]["resourceVersion"].clone();
    assert_eq!(after, before);
    // The patch tested the webhook's name at its index before replacing.
    let patches: Vec<Call> =
        fake.writes().into_iter().filter(|c| c.resource.ends_with("mutatingwebhookconfigurations")).collect();
    assert_eq!(patches.len(), 1, "{patches:#?}");
    assert_eq!(
        (patches[0].client.as_str(), patches[0].method.as_str(), patches[0].name.as_str()),
        ("replica-a", "PATCH", "keyward")
    );
    assert_eq!(
        patches[0].body.as_ref().unwrap()[0],
        json!({"op": "test", "path": "/webhooks/0/name", "value": "pods.keyward.io"})
    );
    assert_ne!(conditions_of(&fake, "someone-elses"), wanted, "another configuration is never touched");

    // Re-applied from an old rendering (GitOps, by hand): the watch sees it and it is repaired
    // again, by the leader only; then nothing more is written.
    fake.seed(drifted_config("keyward"));
    fake.until(LIMIT, |f| (conditions_of(f, "keyward") == wanted).then_some(())).await;
    let patches: Vec<Call> =
        fake.writes().into_iter().filter(|c| c.resource.ends_with("mutatingwebhookconfigurations")).collect();
    assert_eq!(patches.iter().map(|c| c.client.as_str()).collect::<Vec<_>>(), ["replica-a", "replica-a"]);
    assert!(fake.attempted_writes().iter().all(|c| c.client != "replica-b" || is_lease(c)), "a follower wrote");
    // Counted after the patch returns, which may be just after the fake applied it.
    let counted = "keyward_controller_webhook_config_repairs_total{field=\"matchConditions\"} 2";
    let deadline = Instant::now() + LIMIT;
    while !a.reconciler.metrics().render().contains(counted) {
        assert!(Instant::now() < deadline, "{}", a.reconciler.metrics().render());
        tokio::task::yield_now().await;
    }
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_match_conditions_kept_externally_the_configuration_is_never_read_or_written() {
    let fake = FakeApi::default();
    fake.seed(drifted_config("keyward"));
    let ca = client_ca();
    let a = replica(&fake, "replica-a", &ca, Duration::from_secs(10));
    until_leading(&a.leadership).await;
    // Everything a leader does at start has happened once the attestation key exists.
    fake.until(LIMIT, |_| a.reconciler.attestation_keys()).await;
    keyward_controller::singletons::match_conditions(&a.reconciler).await.unwrap();
    assert!(fake.calls().iter().all(|c| !c.resource.ends_with("mutatingwebhookconfigurations")), "{:#?}", fake.calls());
    assert_ne!(conditions_of(&fake, "keyward"), wanted_conditions());
}

/// What the Lease says, as client-go writes it: the holder, the duration, when it was acquired
/// and when last renewed. Other replicas judge a holder alive by its record changing, so each
/// renewal moves `renewTime` and keeps `acquireTime` (mutations: either field left out).
#[tokio::test]
async fn the_lease_names_its_holder_and_each_renewal_moves_its_renew_time() {
    use keyward_controller::leader::Attempt;
    let fake = FakeApi::default();
    let mut elector = LeaderElector::new(fake.client("replica-a"), fast_lease("replica-a"));
    let lease = |f: &FakeApi| f.get("coordination.k8s.io/v1", "Lease", "keyward-system", "keyward-controller").unwrap();
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), Attempt::Held);
    let first = lease(&fake)["spec"].clone();
    assert_eq!(first["holderIdentity"], "replica-a");
    assert_eq!(first["leaseDurationSeconds"], 3);
    assert_eq!(first["leaseTransitions"], 0);
    let acquired = first["acquireTime"].as_str().expect("acquireTime").to_string();
    assert_eq!(first["renewTime"].as_str(), Some(acquired.as_str()), "acquired now, so renewed now");
    // A renewal a moment later (a round trip to the API: microseconds, which MicroTime keeps):
    // renewTime moves, acquireTime stays.
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), Attempt::Held);
    let spec = lease(&fake)["spec"].clone();
    assert_ne!(spec["renewTime"], first["renewTime"], "{spec}");
    assert_eq!(spec["acquireTime"].as_str(), Some(acquired.as_str()));
    assert!(spec["renewTime"].as_str().unwrap() > acquired.as_str(), "{spec}");
    assert_eq!(spec["holderIdentity"], "replica-a");
}

/// Creating the Lease: a create that loses the race (AlreadyExists) means another replica
/// leads; any other failure is an error to report and retry, never "someone else leads"
/// (mutations: the AlreadyExists guard forced either way).
#[tokio::test]
async fn a_lost_create_race_is_another_leader_and_a_failed_create_is_an_error() {
    use keyward_controller::leader::Attempt;
    let fake = FakeApi::default();
    let mut elector = LeaderElector::new(fake.client("replica-a"), fast_lease("replica-a"));
    fake.fail("POST", LEASES, 409, 1);
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), Attempt::Taken);
    fake.fail("POST", LEASES, 500, 1);
    let err = elector.try_acquire_or_renew().await.unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), Attempt::Held);
    // A renewal whose PUT meets another writer's (409 Conflict): that writer leads now.
    fake.fail("PUT", LEASES, 409, 1);
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), Attempt::Taken);
}

/// Releasing (a replica that stops): the Lease is given up only by its holder, left without
/// one and with a one-second duration so that another replica takes it at once; another
/// holder's Lease is never touched (mutations: `release` a no-op, `==` for `!=` on the holder).
#[tokio::test]
async fn only_the_holder_releases_the_lease_and_it_is_free_at_once() {
    use keyward_controller::leader::Attempt;
    let fake = FakeApi::default();
    let lease = |f: &FakeApi| f.get("coordination.k8s.io/v1", "Lease", "keyward-system", "keyward-controller").unwrap();
    let mut a = LeaderElector::new(fake.client("replica-a"), fast_lease("replica-a"));
    let mut b = LeaderElector::new(fake.client("replica-b"), fast_lease("replica-b"));
    assert_eq!(a.try_acquire_or_renew().await.unwrap(), Attempt::Held);
    let held = lease(&fake);
    b.release().await.unwrap();
    assert_eq!(lease(&fake), held, "not b's to release");
    a.release().await.unwrap();
    let released = lease(&fake)["spec"].clone();
    assert_eq!(released["holderIdentity"], Value::Null, "{released}");
    assert_eq!(released["leaseDurationSeconds"], 1);
    assert_eq!(b.try_acquire_or_renew().await.unwrap(), Attempt::Held, "free at once: no holder");
}

/// A holder that keeps renewing is never taken over, however long it leads: the standby
/// measures the duration from when it last saw the record change, on its own clock (mutation:
/// `==` for `!=` when comparing the record, which would measure from the first sight).
#[tokio::test(start_paused = true)]
async fn a_holder_that_keeps_renewing_is_never_taken_over() {
    use keyward_controller::leader::Attempt;
    let fake = FakeApi::default();
    let held = |renewed: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "keyward-controller", "namespace": "keyward-system"},
            "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 3, "renewTime": renewed,
                     "acquireTime": "2026-12-02T10:00:00.000000Z", "leaseTransitions": 0}})
    };
    fake.seed(held("2026-12-02T10:00:00.000000Z"));
    let mut standby = LeaderElector::new(fake.client("replica-b"), fast_lease("replica-b"));
    for second in 1..=5 {
        assert_eq!(standby.try_acquire_or_renew().await.unwrap(), Attempt::Taken, "{second}");
        tokio::time::advance(Duration::from_secs(2)).await;
        // The holder renews every two seconds: its record changes each time.
        fake.seed(held(&format!("2026-12-02T10:00:{:02}.000000Z", second * 2)));
    }
    // It stops renewing: three seconds after the standby last saw a change, it takes over.
    assert_eq!(standby.try_acquire_or_renew().await.unwrap(), Attempt::Taken);
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(standby.try_acquire_or_renew().await.unwrap(), Attempt::Held);
}

/// Leading starts the moment the Lease is acquired, and lasts the renew deadline from when the
/// acquiring request was sent (mutation: `-` for `+`, which would make a new leader's right to
/// write lapse before it began).
#[tokio::test]
async fn a_new_leader_may_write_as_soon_as_it_holds_the_lease() {
    let fake = FakeApi::default();
    let elector = LeaderElector::new(fake.client("replica-a"), fast_lease("replica-a"));
    let mut leadership = elector.leadership();
    let before = Instant::now();
    let task = tokio::spawn(elector.run(std::future::pending()));
    // The first change is the acquisition: leading, at once.
    assert!(tokio::time::timeout(LIMIT, leadership.changed()).await.unwrap());
    assert!(leadership.is_leader(), "leading when it is announced");
    let until = leadership.until().unwrap().into_std();
    assert!(until > before + Duration::from_secs(1), "for the renew deadline (2 s) from the acquiring request");
    task.abort();
}
