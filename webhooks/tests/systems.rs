//! The built-in profiles on the pods of the systems they serve, and of those they must leave
//! alone, built from the upstream code (each fixture names the file and commit it follows, in
//! `tests/fixtures/README.md`). For the pods a built-in serves, every file the workload reads
//! must exist, at the path the workload reads, from the object and with the audience its
//! server checks, in the container that reads it.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use keyward_engine::Reason;
use serde_json::{json, Value};
use support::*;

const FMS_OPERATOR: &str = "system:serviceaccount:lm-eval:lm-eval-controller-manager";
const TRUSTYAI_OPERATOR: &str = "system:serviceaccount:opendatahub:trustyai-service-operator-controller-manager";

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    ["initContainers", "containers"]
        .iter()
        .flat_map(|list| pod["spec"][list].as_array().into_iter().flatten())
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env<'a>(pod: &'a Value, name: &str, var: &str) -> Option<&'a str> {
    container(pod, name)["env"].as_array()?.iter().find(|e| e["name"] == var)?["value"].as_str()
}

/// What the kubelet puts at `path` in container `name`: the volume and the file's name in it.
/// Panics when nothing would be there.
fn file_at<'a>(pod: &'a Value, name: &str, path: &str) -> (&'a Value, String) {
    let mounts = container(pod, name)["volumeMounts"].as_array().unwrap_or_else(|| panic!("{name}: no mounts"));
    let (mount, rest) = mounts
        .iter()
        .find_map(|m| {
            let dir = m["mountPath"].as_str()?;
            let rest = path.strip_prefix(dir)?.strip_prefix('/')?;
            (m["subPath"].as_str().unwrap_or_default().is_empty()).then(|| (m, rest.to_string()))
        })
        .unwrap_or_else(|| panic!("{name}: nothing mounted above {path}"));
    let volume = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("{name}: mount of a missing volume {}", mount["name"]));
    let object = volume.get("secret").or_else(|| volume.get("configMap"));
    if let Some(items) = object.and_then(|o| o["items"].as_array()) {
        assert!(items.iter().any(|i| i["path"] == rest.as_str()), "{name}: {path}: not among the items of {volume}");
    }
    if let Some(sources) = volume["projected"]["sources"].as_array() {
        let certificate_file = |s: &Value| {
            ["keyPath", "certificateChainPath", "credentialBundlePath"]
                .iter()
                .any(|f| s["podCertificate"][f] == rest.as_str())
        };
        assert!(
            sources.iter().any(|s| s["serviceAccountToken"]["path"] == rest.as_str()
                || s["clusterTrustBundle"]["path"] == rest.as_str()
                || certificate_file(s)),
            "{name}: {path}: no token at {rest} in {volume}"
        );
    }
    (volume, rest)
}

fn has_api_token(pod: &Value) -> bool {
    pod["spec"]["volumes"]
        .as_array()
        .is_some_and(|v| v.iter().any(|v| v["name"].as_str().unwrap_or_default().starts_with("kube-api-access-")))
}

fn requires(d: &keyward_engine::Decision) -> Vec<(String, String, &'static str)> {
    d.outcome
        .as_ref()
        .map(|m| m.requires().map(|r| (format!("{:?}", r.kind), r.name.clone(), r.provided_by.as_str())).collect())
        .unwrap_or_default()
}

// === the LMEvalJob driver (fms-lm-eval-service, gRPC with mTLS) ===

#[test]
fn the_fms_driver_gets_its_three_files_in_main_and_no_api_token() {
    let before = fixture("lmeval-fms-driver-pod.json");
    let (d, after) = admit(&create("team-a", FMS_OPERATOR), &before, &builtin());
    assert_eq!(d.reason, Reason::Injected);
    assert_eq!(d.profile.as_deref(), Some("lmeval"));
    assert_eq!(d.warnings, Vec::<String>::new());

    // backend/driver/driver.go reads these three env vars on `main` as file paths.
    let cert = env(&after, "main", "GRPC_CLIENT_CERT").unwrap();
    let key = env(&after, "main", "GRPC_CLIENT_KEY").unwrap();
    let ca = env(&after, "main", "GRPC_SERVER_CA").unwrap();
    assert_eq!(cert, "/var/run/secrets/keyward/lmeval-client/tls.crt");
    assert_eq!(key, "/var/run/secrets/keyward/lmeval-client/tls.key");
    assert_eq!(ca, "/var/run/secrets/keyward/lmeval-server-ca/ca.crt");
    let (volume, file) = file_at(&after, "main", cert);
    assert_eq!(
        (volume["secret"]["secretName"].as_str(), file.as_str()),
        (Some("evaljob-sample-lmeval-client"), "tls.crt")
    );
    let (volume, file) = file_at(&after, "main", key);
    assert_eq!(
        (volume["secret"]["secretName"].as_str(), file.as_str()),
        (Some("evaljob-sample-lmeval-client"), "tls.key")
    );
    let (volume, file) = file_at(&after, "main", ca);
    assert_eq!((volume["configMap"]["name"].as_str(), file.as_str()), (Some("keyward-lmeval-server-ca"), "ca.crt"));

    // The init container only copies the binary: it gets nothing (and loses the API token).
    assert_eq!(container(&after, "driver")["env"], container(&before, "driver")["env"]);
    assert_eq!(
        container(&after, "driver")["volumeMounts"],
        json!([{"name": "shared", "mountPath": "/opt/app-root/src/bin"}])
    );
    // The driver never calls the Kubernetes API, so it has no token; its account is unchanged.
    assert!(!has_api_token(&after));
    assert_eq!(after["spec"]["automountServiceAccountToken"], false);
    assert_eq!(after["spec"]["serviceAccountName"], before["spec"]["serviceAccountName"]);

    assert_eq!(
        requires(&d),
        [
            ("Secret".into(), "evaljob-sample-lmeval-client".into(), "keyward"),
            ("ConfigMap".into(), "keyward-lmeval-server-ca".into(), "keyward"),
        ]
    );
}

#[test]
fn with_pod_certificates_the_fms_driver_reads_its_key_and_chain_from_the_kubelets_files() {
    // deploy/profiles/lmeval-pod-certificate.yaml: the built-in, delivering a pod certificate.
    let path = format!("{}/../deploy/profiles/lmeval-pod-certificate.yaml", env!("CARGO_MANIFEST_DIR"));
    let set = profiles(&std::fs::read_to_string(path).unwrap());
    let before = fixture("lmeval-fms-driver-pod.json");
    let (d, after) = admit(&create("team-a", FMS_OPERATOR), &before, &set);
    assert_eq!((d.reason, d.profile.as_deref()), (Reason::Injected, Some("lmeval")));
    let cert = env(&after, "main", "GRPC_CLIENT_CERT").unwrap();
    let key = env(&after, "main", "GRPC_CLIENT_KEY").unwrap();
    assert_eq!(cert, "/var/run/secrets/keyward/lmeval-client/tls.crt");
    assert_eq!(key, "/var/run/secrets/keyward/lmeval-client/tls.key");
    // The kubelet writes both into the one projected volume, from keyward's signer.
    let (volume, _) = file_at(&after, "main", cert);
    file_at(&after, "main", key);
    assert_eq!(
        volume,
        &json!({"name": "keyward-client-cert", "projected": {"defaultMode": 420, "sources": [{"podCertificate": {
            "signerName": "keyward.io/lmeval", "keyType": "ECDSAP256", "maxExpirationSeconds": 86400,
            "keyPath": "tls.key", "certificateChainPath": "tls.crt"}}]}})
    );
    // The server CA from the cluster's one ClusterTrustBundle, written to the file it reads.
    let ca = env(&after, "main", "GRPC_SERVER_CA").unwrap();
    assert_eq!(ca, "/var/run/secrets/keyward/lmeval-server-ca/ca.crt");
    assert_eq!(
        file_at(&after, "main", ca).0,
        &json!({"name": "keyward-server-ca", "projected": {"defaultMode": 420, "sources": [
            {"clusterTrustBundle": {"name": "keyward-lmeval-server-ca", "path": "ca.crt"}}]}})
    );
    assert!(!has_api_token(&after));
    // No Secret and no ConfigMap: the signer and the trust bundle instead.
    assert_eq!(
        requires(&d),
        [
            ("Signer".into(), "keyward.io/lmeval".into(), "keyward"),
            ("ClusterTrustBundle".into(), "keyward-lmeval-server-ca".into(), "keyward"),
        ]
    );
    // The pod as admitted is what the profile injects: admitted again, nothing changes.
    let again = decide(&create("team-a", FMS_OPERATOR), &after, &set);
    assert_eq!(again.reason, Reason::AlreadyInjected);
}

#[test]
fn an_fms_operator_still_patching_its_pods_is_left_alone() {
    // config/default deploys the operator with mTLS, so patch4GrpcTLS has already set the env.
    let before = fixture("lmeval-fms-driver-pod-grpc-tls.json");
    let d = decide(&create("team-a", FMS_OPERATOR), &before, &builtin());
    assert_eq!(d.reason, Reason::ConflictSkipped);
    assert!(d.allowed() && d.patch().is_empty());
    assert_eq!(d.warnings.len(), 1);
    assert!(d.warnings[0].starts_with("keyward: profile \"lmeval\" injected nothing into this pod (onConflict: skip): container \"main\" already sets GRPC_CLIENT_CERT"), "{}", d.warnings[0]);
}

#[test]
fn only_the_fms_operator_may_create_driver_pods() {
    let d = decide(
        &create("team-a", "system:serviceaccount:team-a:default"),
        &fixture("lmeval-fms-driver-pod.json"),
        &builtin(),
    );
    assert_eq!(d.reason, Reason::RequesterDenied);
    assert_eq!(
        d.message().unwrap(),
        "keyward: profile \"lmeval\" selects this pod, and only system:serviceaccount:*:lm-eval-controller-manager may create such pods, not \"system:serviceaccount:team-a:default\"; let the operator create it, or change the pod's labels so the profile does not select it"
    );
}

#[test]
fn the_trustyai_exec_era_driver_is_never_touched() {
    // Today's trustyai driver reports status through pods/exec and reads no gRPC files.
    let d = decide(&create("team-a", TRUSTYAI_OPERATOR), &fixture("lmeval-driver-pod.json"), &builtin());
    assert_eq!(d.reason, Reason::NoProfile);
    assert!(d.allowed() && d.patch().is_empty());
}

// === Kubeflow Pipelines ===

/// kubeflow/pipelines #13290: the manifest projects the agent's token for 3600 s, and the agent
/// re-reads it every 3600 s. keyward keeps the manifest's volume and mount, and gives the
/// token a lifetime the agent never outlives.
#[test]
fn the_upstream_kfp_agent_keeps_its_own_token_with_a_lifetime_it_never_outlives() {
    let before = fixture("kfp-persistenceagent-pod.json");
    let (d, after) = admit(&create("kubeflow", REPLICASET_CONTROLLER), &before, &builtin());
    assert_eq!(d.profile.as_deref(), Some("kfp-persistence-agent"));
    assert_eq!(d.reason, Reason::Injected);
    let patch = patch_json(&d);
    let spec_ops: Vec<&Value> =
        patch.as_array().unwrap().iter().filter(|op| op["path"].as_str().unwrap().starts_with("/spec")).collect();
    assert_eq!(
        spec_ops,
        [
            &json!({"op": "replace", "path": "/spec/volumes/0/projected/sources/0/serviceAccountToken/expirationSeconds", "value": 21600})
        ]
    );
    // Everything else in the spec is the manifest's, mount and all.
    let mut expected = before["spec"].clone();
    expected["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] = json!(21600);
    assert_eq!(after["spec"], expected);
    let (volume, _) =
        file_at(&after, "ml-pipeline-persistenceagent", "/var/run/secrets/kubeflow/tokens/persistenceagent-sa-token");
    assert_eq!(volume["name"], "persistenceagent-sa-token");
    assert_eq!(
        d.warnings,
        [
            "keyward: profile \"kfp-persistence-agent\" serviceAccountToken: the pod's volume \"persistenceagent-sa-token\" (spec.volumes[0]) is the token keyward injects, with a lifetime of 3600 s, which its reader outlives (lives 3600 s; the kubelet asks for the next at 2880 s (80% of its life, at most 24 h) and the file has it by 3000 s (+120 s); the reader re-reads every 3600 s, so it can hold an expired token for up to 3000 s of every 3600 s); keyward set its expirationSeconds to 21600",
            "keyward: profile \"kfp-persistence-agent\" serviceAccountToken: container \"ml-pipeline-persistenceagent\" already gets a token for audience \"pipelines.kubeflow.org\" as \"persistenceagent-sa-token\" at \"/var/run/secrets/kubeflow/tokens\" (volume \"persistenceagent-sa-token\"); keyward counts it as injected and adds no other",
        ]
    );
    assert_eq!(requires(&d), []);
    assert_eq!(
        d.audit_annotations.get("injected").map(String::as_str),
        Some("serviceAccountToken"),
        "the audit log says the token was keyward's doing"
    );
}

/// The attacker's copy: everything a namespace user can read of the agent's pod (labels,
/// owner reference, the token volume) on a pod of their own. Created by the user, it gets
/// nothing; created through a Deployment of their own (so by the ReplicaSet controller), the
/// lifetime is raised on a token of the user's own account, for the audience the copy already
/// names, which the user could have asked the kubelet for directly: nothing is granted that
/// the pod spec could not request.
#[test]
fn a_tenants_copy_of_the_kfp_agent_gains_nothing() {
    let mut copy = fixture("kfp-persistenceagent-pod.json");
    copy["metadata"]["namespace"] = json!("team-a");
    copy["spec"]["serviceAccountName"] = json!("default");
    copy["spec"]["serviceAccount"] = json!("default");
    let d = decide(&create("team-a", "system:serviceaccount:team-a:default"), &copy, &builtin());
    assert_eq!(d.reason, Reason::RequesterSkipped);
    assert!(d.patch().is_empty());
    let (d, after) = admit(&create("team-a", REPLICASET_CONTROLLER), &copy, &builtin());
    assert_eq!(d.reason, Reason::Injected);
    let mut asked_itself = copy["spec"].clone();
    asked_itself["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] = json!(21600);
    assert_eq!(after["spec"], asked_itself, "the same spec the user could have written");
    assert_eq!(after["spec"]["serviceAccountName"], "default", "the token is still the user's own account's");
    assert!(d.outcome.as_ref().unwrap().attestation.is_none(), "and no attestation to reuse");
}

/// A token the agent's pod declares under another name is the operator's: keyward leaves it,
/// and says that the agent will outlive it, and what to change.
#[test]
fn a_kfp_agent_token_under_another_name_is_left_with_a_warning_when_its_reader_outlives_it() {
    let mut before = fixture("kfp-persistenceagent-pod.json");
    before["spec"]["volumes"][0]["name"] = json!("agent-token");
    before["spec"]["containers"][0]["volumeMounts"][0]["name"] = json!("agent-token");
    assert_eq!(before["spec"]["containers"][0]["volumeMounts"][0]["mountPath"], "/var/run/secrets/kubeflow/tokens");
    let (d, after) = admit(&create("kubeflow", REPLICASET_CONTROLLER), &before, &builtin());
    assert_eq!(after["spec"], before["spec"]);
    assert_eq!(
        d.warnings[1],
        "keyward: profile \"kfp-persistence-agent\" serviceAccountToken: the token of volume \"agent-token\" lives 3600 s; the kubelet asks for the next at 2880 s (80% of its life, at most 24 h) and the file has it by 3000 s (+120 s); the reader re-reads every 3600 s, so it can hold an expired token for up to 3000 s of every 3600 s; set its expirationSeconds to 21600, or name the volume \"persistenceagent-sa-token\" so that keyward sets it"
    );
    // One that lives long enough draws no such warning.
    before["spec"]["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] = json!(86400);
    let d = decide(&create("kubeflow", REPLICASET_CONTROLLER), &before, &builtin());
    assert_eq!(d.warnings.len(), 1, "{:?}", d.warnings);
}

/// Only the lifetime: a same-named volume that differs in anything else is still a conflict.
#[test]
fn a_same_named_kfp_token_for_another_audience_is_still_a_conflict() {
    let mut before = fixture("kfp-persistenceagent-pod.json");
    before["spec"]["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]["audience"] = json!("other");
    let d = decide(&create("kubeflow", REPLICASET_CONTROLLER), &before, &builtin());
    assert_eq!(d.reason, Reason::ConflictSkipped);
    assert!(d.patch().is_empty());
    assert!(d.warnings[0].contains("spec.volumes[0] is a volume named \"persistenceagent-sa-token\" that differs from the one profile \"kfp-persistence-agent\" injects"), "{:?}", d.warnings);
}

#[test]
fn a_kfp_agent_without_its_token_gets_it_where_the_agent_reads_it() {
    let before = fixture("kfp-persistenceagent-pod-no-token.json");
    let (d, after) = admit(&create("kubeflow", REPLICASET_CONTROLLER), &before, &builtin());
    assert_eq!(d.reason, Reason::Injected);
    // token_refresher.go: SaTokenFile; the API server's TokenReview checks pipelines.kubeflow.org.
    let (volume, file) =
        file_at(&after, "ml-pipeline-persistenceagent", "/var/run/secrets/kubeflow/tokens/persistenceagent-sa-token");
    assert_eq!(file, "persistenceagent-sa-token");
    assert_eq!(volume["projected"]["sources"][0]["serviceAccountToken"]["audience"], "pipelines.kubeflow.org");
    assert_eq!(volume["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"], 21600);
    // Its informers use the normal API token: kept. The init container gets nothing.
    assert!(has_api_token(&after));
    assert_eq!(after["spec"]["automountServiceAccountToken"], before["spec"]["automountServiceAccountToken"]);
    assert_eq!(container(&after, "wait-for-ml-pipeline"), container(&before, "wait-for-ml-pipeline"));
    assert_eq!(after["spec"]["serviceAccountName"], "ml-pipeline-persistenceagent");
    assert_eq!(requires(&d), [], "the token is the pod's own account's");
}

#[test]
fn the_kfp_scheduled_workflow_controller_gets_its_token() {
    let before = fixture("kfp-scheduledworkflow-pod.json");
    let (d, after) = admit(&create("kubeflow", REPLICASET_CONTROLLER), &before, &builtin());
    assert_eq!(d.profile.as_deref(), Some("kfp-scheduled-workflow"));
    let (volume, _) =
        file_at(&after, "ml-pipeline-scheduledworkflow", "/var/run/secrets/kubeflow/tokens/scheduledworkflow-sa-token");
    assert_eq!(volume["projected"]["sources"][0]["serviceAccountToken"]["audience"], "pipelines.kubeflow.org");
    assert!(has_api_token(&after));
}

// === systems no built-in serves: their pods are admitted unchanged ===

#[test]
fn kuberay_and_kserve_pods_are_left_alone_in_either_auth_mode() {
    for (file, namespace, user) in [
        ("kuberay-head-token-auth.json", "ray", KUBERAY_OPERATOR),
        ("kuberay-worker-k8s-auth.json", "ray", KUBERAY_OPERATOR),
        ("rayjob-submitter-pod.json", "ray", JOB_CONTROLLER),
        ("inferencegraph-router-auth.json", "models", REPLICASET_CONTROLLER),
        ("inferencegraph-router-no-auth.json", "models", REPLICASET_CONTROLLER),
    ] {
        let d = decide(&create(namespace, user), &fixture(file), &builtin());
        assert_eq!(d.reason, Reason::NoProfile, "{file}");
        assert!(d.allowed() && d.patch().is_empty(), "{file}");
    }
}

#[test]
fn the_operators_own_pods_are_never_selected() {
    // The operators' and servers' own Deployments, by the labels their upstream manifests give
    // their pods (fms config/manager/manager.yaml, kuberay helm-chart/kuberay-operator, kserve
    // config/manager/manager.yaml, KFP ml-pipeline-apiserver-deployment.yaml), created by the
    // ReplicaSet controller, on the KFP agent's pod shape.
    for labels in [
        json!({"control-plane": "controller-manager", "pod-template-hash": "5d8f7c9b6d"}),
        json!({"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/component": "kuberay-operator"}),
        json!({"control-plane": "kserve-controller-manager", "controller-tools.k8s.io": "1.0"}),
        json!({"app": "ml-pipeline", "application-crd-id": "kubeflow-pipelines"}),
    ] {
        let mut pod = fixture("kfp-persistenceagent-pod-no-token.json");
        pod["metadata"]["labels"] = labels.clone();
        let d = decide(&create("operators", REPLICASET_CONTROLLER), &pod, &builtin());
        assert_eq!(d.reason, Reason::NoProfile, "{labels}");
        assert!(d.allowed() && d.patch().is_empty(), "{labels}");
    }
}
