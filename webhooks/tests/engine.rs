//! The engine on pods shaped like what the apiserver sends: after defaulting, with the
//! `kube-api-access-*` volume the ServiceAccount admission plugin adds.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use keyward_engine::{Reason, RequestFacts, Requester, ANNOTATION_INJECTED, ANNOTATION_ORIGINAL_SA};
use serde_json::{json, Value};

use support::*;

const LMEVAL_AUDIT: &str = r#"{"profile":"lmeval-job","injected":[{"kind":"clientCertificate","secret":"evaljob-sample-keyward-client","volume":"keyward-client-cert","mountPath":"/var/run/secrets/keyward/client"},{"kind":"serverCA","configMap":"keyward-server-ca","volume":"keyward-server-ca","mountPath":"/var/run/secrets/keyward/ca"},{"kind":"serviceAccountToken","audience":"keyward.io/control-plane","expirationSeconds":3600,"volume":"keyward-sa-token","mountPath":"/var/run/secrets/keyward/sa-token"},{"kind":"serviceAccount","name":"keyward-lmeval-job","apiToken":"remove"}],"containers":"all"}"#;

fn mounts_and_env(prefix: &str, env_exists: bool) -> Vec<Value> {
    let env_first = if env_exists {
        json!({"op": "add", "path": format!("{prefix}/env/-"), "value": {"name": "KEYWARD_CLIENT_CERT_FILE", "value": "/var/run/secrets/keyward/client/tls.crt"}})
    } else {
        json!({"op": "add", "path": format!("{prefix}/env"), "value": [{"name": "KEYWARD_CLIENT_CERT_FILE", "value": "/var/run/secrets/keyward/client/tls.crt"}]})
    };
    vec![
        json!({"op": "add", "path": format!("{prefix}/volumeMounts/-"), "value": {"name": "keyward-client-cert", "mountPath": "/var/run/secrets/keyward/client", "readOnly": true}}),
        env_first,
        json!({"op": "add", "path": format!("{prefix}/env/-"), "value": {"name": "KEYWARD_CLIENT_KEY_FILE", "value": "/var/run/secrets/keyward/client/tls.key"}}),
        json!({"op": "add", "path": format!("{prefix}/volumeMounts/-"), "value": {"name": "keyward-server-ca", "mountPath": "/var/run/secrets/keyward/ca", "readOnly": true}}),
        json!({"op": "add", "path": format!("{prefix}/env/-"), "value": {"name": "KEYWARD_CA_FILE", "value": "/var/run/secrets/keyward/ca/ca.crt"}}),
        json!({"op": "add", "path": format!("{prefix}/volumeMounts/-"), "value": {"name": "keyward-sa-token", "mountPath": "/var/run/secrets/keyward/sa-token", "readOnly": true}}),
        json!({"op": "add", "path": format!("{prefix}/env/-"), "value": {"name": "KEYWARD_SA_TOKEN_FILE", "value": "/var/run/secrets/keyward/sa-token/token"}}),
    ]
}

#[test]
fn lmeval_driver_pod_gets_the_exact_patch() {
    let pod = fixture("lmeval-driver-pod.json");
    let (decision, after) = admit(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    assert_eq!(decision.reason, Reason::Injected);
    assert_eq!(decision.profile.as_deref(), Some("lmeval-job"));

    let mut expected = vec![
        json!({"op": "replace", "path": "/spec/serviceAccountName", "value": "keyward-lmeval-job"}),
        json!({"op": "replace", "path": "/spec/serviceAccount", "value": "keyward-lmeval-job"}),
        json!({"op": "add", "path": "/spec/automountServiceAccountToken", "value": false}),
        json!({"op": "remove", "path": "/spec/containers/0/volumeMounts/1"}),
        json!({"op": "remove", "path": "/spec/initContainers/0/volumeMounts/1"}),
        json!({"op": "remove", "path": "/spec/volumes/1"}),
        json!({"op": "add", "path": "/spec/volumes/-", "value": {"name": "keyward-client-cert", "secret": {"secretName": "evaljob-sample-keyward-client", "defaultMode": 420}}}),
        json!({"op": "add", "path": "/spec/volumes/-", "value": {"name": "keyward-server-ca", "configMap": {"name": "keyward-server-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}], "defaultMode": 420}}}),
        json!({"op": "add", "path": "/spec/volumes/-", "value": {"name": "keyward-sa-token", "projected": {"defaultMode": 420, "sources": [{"serviceAccountToken": {"audience": "keyward.io/control-plane", "expirationSeconds": 3600, "path": "token"}}]}}}),
    ];
    expected.extend(mounts_and_env("/spec/initContainers/0", false));
    expected.extend(mounts_and_env("/spec/containers/0", true));
    // The operator copies the job's annotations onto the pod, so the map is there.
    expected.push(json!({"op": "add", "path": "/metadata/annotations/keyward.io~1injected", "value": LMEVAL_AUDIT}));
    expected.push(
        json!({"op": "add", "path": "/metadata/annotations/keyward.io~1original-service-account", "value": "default"}),
    );
    // The listing label (`kubectl get pods -l keyward.io/profile`); the pod has labels.
    expected.push(json!({"op": "add", "path": "/metadata/labels/keyward.io~1profile", "value": "lmeval-job"}));
    assert_eq!(patch_json(&decision), Value::Array(expected));

    // The resulting pod, field by field.
    let spec = &after["spec"];
    assert_eq!(spec["serviceAccountName"], "keyward-lmeval-job");
    assert_eq!(spec["serviceAccount"], "keyward-lmeval-job");
    assert_eq!(spec["automountServiceAccountToken"], false);
    let volume_names: Vec<&str> =
        spec["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(volume_names, ["shared", "keyward-client-cert", "keyward-server-ca", "keyward-sa-token"]);
    for c in [&spec["initContainers"][0], &spec["containers"][0]] {
        let paths: Vec<&str> =
            c["volumeMounts"].as_array().unwrap().iter().map(|m| m["mountPath"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/opt/app-root/src/bin",
                "/var/run/secrets/keyward/client",
                "/var/run/secrets/keyward/ca",
                "/var/run/secrets/keyward/sa-token"
            ]
        );
    }
    assert_eq!(
        spec["containers"][0]["env"][0],
        json!({"name": "HF_HOME", "value": "/tmp/hf"}),
        "the user's env comes first, untouched"
    );
    assert_eq!(after["metadata"]["annotations"][ANNOTATION_INJECTED], LMEVAL_AUDIT);
    assert_eq!(after["metadata"]["annotations"][ANNOTATION_ORIGINAL_SA], "default");
    assert_eq!(
        serde_json::to_value(&decision.audit_annotations).unwrap(),
        json!({"profile": "lmeval-job", "injected": "clientCertificate,serverCA,serviceAccountToken,serviceAccount", "original-service-account": "default"})
    );
    assert!(decision.warnings.is_empty(), "{:?}", decision.warnings);
}

#[test]
fn kuberay_worker_native_sidecar_and_init_containers_get_mounts() {
    let pod = fixture("kuberay-worker-pod.json");
    let (decision, after) = admit(&create("ray", KUBERAY_OPERATOR), &pod, &examples());
    assert_eq!(decision.profile.as_deref(), Some("kuberay-node"));
    let audit: Value =
        serde_json::from_str(after["metadata"]["annotations"][ANNOTATION_INJECTED].as_str().unwrap()).unwrap();
    assert_eq!(audit["containers"], "all", "the profile names no containers: all of them");
    for c in ["initContainers", "containers"] {
        for container in after["spec"][c].as_array().unwrap() {
            let mounts = container["volumeMounts"].as_array().unwrap();
            assert!(mounts.iter().any(|m| m["mountPath"] == "/var/run/secrets/keyward/sa-token"), "{container:#}");
            assert!(
                mounts.iter().any(|m| m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"),
                "no swap: the API token stays"
            );
        }
    }
    // No swap in this profile: the service account and token are the pod's own.
    assert_eq!(after["spec"]["serviceAccountName"], "default");
    assert!(after["spec"].get("automountServiceAccountToken").is_none());
    // The existing annotations map is extended, not replaced; the key is escaped.
    assert_eq!(after["metadata"]["annotations"]["ray.io/ft-enabled"], "false");
    assert!(patch_json(&decision)
        .as_array()
        .unwrap()
        .iter()
        .any(|op| op["path"] == "/metadata/annotations/keyward.io~1injected" && op["op"] == "add"));
    assert_eq!(after["metadata"]["generateName"], "raycluster-sample-worker-small-group-");
    assert!(after["metadata"].get("name").is_none());
    assert_eq!(
        after["spec"]["volumes"][2]["secret"]["secretName"], "raycluster-sample-keyward-client",
        "the Secret is named after the controller owner"
    );
}

#[test]
fn inferencegraph_router_swaps_to_auth_verifier_and_keeps_api_token() {
    let pod = fixture("inferencegraph-router-pod.json");
    let (decision, after) = admit(&create("models", REPLICASET_CONTROLLER), &pod, &examples());
    assert_eq!(decision.profile.as_deref(), Some("kserve-inferencegraph"));
    let ops = patch_json(&decision);
    assert_eq!(ops[0], json!({"op": "replace", "path": "/spec/serviceAccountName", "value": "my-graph-auth-verifier"}));
    assert_eq!(ops[1], json!({"op": "replace", "path": "/spec/serviceAccount", "value": "my-graph-auth-verifier"}));
    assert!(ops.as_array().unwrap().iter().all(|op| op["op"] != "remove"), "keep: nothing removed");
    assert_eq!(after["spec"]["volumes"][0]["name"], "kube-api-access-zt5wq");
    assert_eq!(after["metadata"]["annotations"][ANNOTATION_ORIGINAL_SA], "default");
    // The user's SERVICE_ACCOUNT env var is theirs: we add ours after it.
    assert_eq!(after["spec"]["containers"][0]["env"][0]["name"], "SERVICE_ACCOUNT");
}

#[test]
fn only_pod_create_is_mutated() {
    let pod = fixture("lmeval-driver-pod.json");
    let set = examples();
    let base = create("team-a", LMEVAL_OPERATOR);
    for facts in [
        RequestFacts { operation: "UPDATE", ..base },
        RequestFacts { operation: "DELETE", ..base },
        RequestFacts { sub_resource: "ephemeralcontainers", operation: "UPDATE", ..base },
        RequestFacts { sub_resource: "binding", ..base },
        RequestFacts { resource: "deployments", group: "apps", ..base },
    ] {
        let d = decide(&facts, &pod, &set);
        assert!(d.allowed());
        assert_eq!(d.reason, Reason::NotPodCreate, "{facts:?}");
        assert!(d.patch().is_empty());
    }
}

#[test]
fn unselected_pod_is_admitted_unchanged_and_explained() {
    let mut pod = fixture("lmeval-driver-pod.json");
    pod["metadata"]["labels"]["app.kubernetes.io/name"] = json!("something-else");
    let e = explain(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    let d = &e.decision;
    assert_eq!(d.reason, Reason::NoProfile);
    assert!(d.patch().is_empty());
    assert_eq!(e.trace[0].why, "label app.kubernetes.io/name=\"something-else\", the profile wants \"ta-lmes\"");
    assert_eq!(e.trace[1].why, "label ray.io/is-ray-node is missing (the profile wants ray.io/is-ray-node=\"yes\")");
}

#[test]
fn labels_alone_do_not_grant_credentials() {
    // A user copies the operator's labels and owner reference onto their own pod.
    let pod = fixture("lmeval-driver-pod.json");
    let d = decide(&create("team-a", "alice@example.com"), &pod, &examples());
    assert!(!d.allowed());
    assert_eq!(d.reason, Reason::RequesterDenied);
    assert_eq!(
        d.message().unwrap(),
        "keyward: profile \"lmeval-job\" selects this pod, and only system:serviceaccount:*:trustyai-service-operator-controller-manager may create such pods, not \"alice@example.com\"; let the operator create it, or change the pod's labels so the profile does not select it"
    );

    // rayjob-submitter says `otherwise: skip`: admitted unchanged, with a warning.
    let mut pod = fixture("kuberay-worker-pod.json");
    let labels = pod["metadata"]["labels"].as_object_mut().unwrap();
    labels.remove("ray.io/is-ray-node");
    labels.insert("ray.io/originated-from-crd".into(), json!("RayJob"));
    pod["metadata"]["ownerReferences"][0] =
        json!({"apiVersion": "batch/v1", "kind": "Job", "name": "rayjob-sample", "uid": "u", "controller": true});
    let d = decide(&create("ray", "bob"), &pod, &examples());
    assert!(d.allowed());
    assert_eq!(d.reason, Reason::RequesterSkipped);
    assert!(d.patch().is_empty());
    assert_eq!(d.warnings.len(), 1);
    assert!(
        d.warnings[0].starts_with(
            "keyward: profile \"rayjob-submitter\" selects this pod, but \"bob\" may not receive its credentials"
        ),
        "{}",
        d.warnings[0]
    );

    // The same pod from the Job controller is injected.
    let (d, after) = admit(&create("ray", JOB_CONTROLLER), &pod, &examples());
    assert_eq!(d.profile.as_deref(), Some("rayjob-submitter"));
    assert_eq!(after["spec"]["volumes"][2]["secret"]["secretName"], "rayjob-sample-keyward-client");
}

#[test]
fn a_ray_node_of_a_rayjob_matches_only_the_node_profile() {
    let mut pod = fixture("kuberay-worker-pod.json");
    pod["metadata"]["labels"]["ray.io/originated-from-crd"] = json!("RayJob");
    let (d, _) = admit(&create("ray", KUBERAY_OPERATOR), &pod, &examples());
    assert_eq!(d.profile.as_deref(), Some("kuberay-node"));
}

#[test]
fn two_profiles_selecting_one_pod_deny_naming_both() {
    let extra = profiles(
        r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata: {name: lmeval-extra}
spec:
  selector: {matchLabels: {app.kubernetes.io/part-of: lm-eval}}
  requesters: {usernames: ["system:serviceaccount:*:trustyai-service-operator-controller-manager"]}
  inject:
    token: {secretName: api-key, mountPath: /var/run/secrets/keyward/token}
"#,
    );
    let set = examples().overlay(extra).unwrap();
    let d = decide(&create("team-a", LMEVAL_OPERATOR), &fixture("lmeval-driver-pod.json"), &set);
    assert_eq!(d.reason, Reason::Ambiguous);
    assert!(d.profile.is_none());
    assert_eq!(
        d.message().unwrap(),
        "keyward: profiles \"lmeval-job\" (examples/lmeval-job.yaml) and \"lmeval-extra\" (test.yaml) all select this pod, and keyward will not guess which credentials it should get; narrow their selectors (spec.selector, spec.controllerOwners, spec.namespaces) so that one profile selects it"
    );
}

#[test]
fn conflicts_deny_naming_container_field_profile_and_fix() {
    let mut pod = fixture("lmeval-driver-pod.json");
    pod["spec"]["volumes"].as_array_mut().unwrap().push(json!({"name": "keyward-server-ca", "emptyDir": {}}));
    pod["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "shared", "mountPath": "/var/run/secrets/keyward/client"}));
    pod["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "KEYWARD_CA_FILE", "value": "/etc/ssl/ca.pem"}));
    let d = decide(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    assert_eq!(d.reason, Reason::Conflict);
    assert!(d.patch().is_empty());
    assert_eq!(
        d.message().unwrap(),
        "keyward: profile \"lmeval-job\" cannot inject into this pod: \
container \"main\" already mounts volume \"shared\" at \"/var/run/secrets/keyward/client\" (spec.containers[0].volumeMounts[2]), where profile \"lmeval-job\" mounts \"keyward-client-cert\"; move that mount to another path, or list the containers that need credentials in the profile's spec.containers; \
spec.volumes[2] is a volume named \"keyward-server-ca\" that differs from the one profile \"lmeval-job\" injects; rename your volume (names starting with keyward- are reserved for keyward); \
container \"main\" already sets KEYWARD_CA_FILE (spec.containers[0].env[12]) to \"/etc/ssl/ca.pem\", profile \"lmeval-job\" sets it to \"/var/run/secrets/keyward/ca/ca.crt\"; remove it from the container, or set spec.onEnvConflict: keepUser in the profile"
    );
}

const MINIMAL_PROFILE: &str = r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata: {name: minimal}
spec:
  selector: {matchLabels: {app: minimal}}
  requesters: {usernames: [ci-bot]}
  onEnvConflict: keepUser
  inject:
    token:
      secretName: "{label:team}-api-key"
      key: api-key
      mountPath: /var/run/secrets/keyward/token
      fileEnv: API_KEY_FILE
      valueEnv: API_KEY
"#;

#[test]
fn env_conflict_keeps_the_users_value_when_the_profile_allows() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "minimal", "team": "blue"}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "env": [{"name": "API_KEY", "value": "mine"}]}]}
    });
    let (d, after) = admit(&create("default", "ci-bot"), &pod, &profiles(MINIMAL_PROFILE));
    assert_eq!(
        d.warnings,
        ["keyward: container \"c\" already sets API_KEY (spec.containers[0].env[0]) to \"mine\", profile \"minimal\" sets it to secretKeyRef blue-api-key/api-key; keeping the container's value"]
    );
    assert_eq!(
        after["spec"]["containers"][0]["env"],
        json!([{"name": "API_KEY", "value": "mine"}, {"name": "API_KEY_FILE", "value": "/var/run/secrets/keyward/token/api-key"}])
    );
}

#[test]
fn bare_pod_gets_whole_arrays_and_maps() {
    // No volumes, no annotations, no env, no mounts, automount off (so no kube-api-access-*).
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "job-", "labels": {"app": "minimal", "team": "blue"}},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "c", "image": "busybox"}]}
    });
    let (d, _) = admit(&create("default", "ci-bot"), &pod, &profiles(MINIMAL_PROFILE));
    let audit = r#"{"profile":"minimal","injected":[{"kind":"token","secret":"blue-api-key","key":"api-key","volume":"keyward-token","mountPath":"/var/run/secrets/keyward/token"}],"containers":"all"}"#;
    assert_eq!(
        patch_json(&d),
        json!([
            {"op": "add", "path": "/spec/volumes", "value": [{"name": "keyward-token", "secret": {"secretName": "blue-api-key", "items": [{"key": "api-key", "path": "api-key"}], "defaultMode": 420}}]},
            {"op": "add", "path": "/spec/containers/0/volumeMounts", "value": [{"name": "keyward-token", "mountPath": "/var/run/secrets/keyward/token", "readOnly": true}]},
            {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "API_KEY_FILE", "value": "/var/run/secrets/keyward/token/api-key"}]},
            {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "blue-api-key", "key": "api-key"}}}},
            {"op": "add", "path": "/metadata/annotations", "value": {"keyward.io/injected": audit}},
            {"op": "add", "path": "/metadata/labels/keyward.io~1profile", "value": "minimal"}
        ])
    );
}

#[test]
fn annotation_keys_are_escaped_in_patch_paths() {
    // The pod already has annotations (one with `~` and `/` in its key), so keyward adds its
    // own key to the map: the path must escape the `/` in keyward.io/injected as `~1` (and a
    // `~` would be `~0`, tested on the pointer itself), or the apiserver would look for a map
    // "keyward.io" with a key "injected".
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "minimal", "team": "blue"}, "annotations": {"a~b/c": "x"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    });
    let (d, after) = admit(&create("default", "ci-bot"), &pod, &profiles(MINIMAL_PROFILE));
    let ops = patch_json(&d);
    let ops = ops.as_array().unwrap();
    let last = &ops[ops.len() - 2]; // before the label
    assert_eq!(last["op"], "add");
    assert_eq!(last["path"], "/metadata/annotations/keyward.io~1injected");
    assert_eq!(after["metadata"]["annotations"]["a~b/c"], "x", "the pod's own key is untouched");
    assert!(after["metadata"]["annotations"][ANNOTATION_INJECTED].is_string());
    // Unescaped, the same operation fails under strict RFC 6902: the escape is what makes it work.
    let mut wrong: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/metadata/annotations/keyward.io/injected", "value": "x"}]),
    )
    .unwrap();
    assert!(json_patch::patch(&mut pod.clone(), &wrong).is_err());
    wrong =
        serde_json::from_value(json!([{"op": "add", "path": "/metadata/annotations/a~0b~1c", "value": "y"}])).unwrap();
    let mut tilde = pod.clone();
    json_patch::patch(&mut tilde, &wrong).unwrap();
    assert_eq!(tilde["metadata"]["annotations"]["a~b/c"], "y", "~0 and ~1 address the key with ~ and /");
}

#[test]
fn reinvocation_after_another_webhook_adds_a_container_mounts_only_that_container() {
    let pod = fixture("lmeval-driver-pod.json");
    let facts = create("team-a", LMEVAL_OPERATOR);
    let set = examples();
    let (_, mut after) = admit(&facts, &pod, &set);
    // Another webhook (say, a service mesh) adds a sidecar after us.
    after["spec"]["containers"].as_array_mut().unwrap().push(json!({
        "name": "istio-proxy", "image": "istio/proxyv2:1.24.0",
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"
    }));
    let (d, again) = admit(&facts, &after, &set);
    let ops = patch_json(&d);
    let touched: Vec<&str> = ops.as_array().unwrap().iter().map(|op| op["path"].as_str().unwrap()).collect();
    assert_eq!(
        touched,
        [
            "/spec/containers/1/volumeMounts",
            "/spec/containers/1/env",
            "/spec/containers/1/env/-",
            "/spec/containers/1/volumeMounts/-",
            "/spec/containers/1/env/-",
            "/spec/containers/1/volumeMounts/-",
            "/spec/containers/1/env/-",
        ]
    );
    // The audit record says "all containers", which still holds: it is not rewritten.
    let audit: Value =
        serde_json::from_str(again["metadata"]["annotations"][ANNOTATION_INJECTED].as_str().unwrap()).unwrap();
    assert_eq!(audit["containers"], "all");
    assert_eq!(
        again["metadata"]["annotations"][ANNOTATION_ORIGINAL_SA], "default",
        "the original account is not overwritten"
    );
}

/// What the apiserver does to a pod between two webhook calls: it decodes the patched object
/// and defaults it again (kubernetes pkg/apis/core/v1/defaults.go: SetDefaults_SecretVolumeSource,
/// _ConfigMapVolumeSource, _ProjectedVolumeSource (defaultMode 0644), _ServiceAccountTokenProjection
/// (expirationSeconds 3600), _Container (terminationMessagePath, terminationMessagePolicy,
/// imagePullPolicy), _ObjectFieldSelector (apiVersion v1)), then encodes it, leaving out empty
/// optional fields (`omitempty`: `readOnly: false`, `subPath: ""`).
fn apiserver_defaults(pod: &mut Value) {
    // Only where the object is there: indexing a serde_json value would create it.
    fn or_insert(node: Option<&mut Value>, key: &str, value: Value) {
        if let Some(Value::Object(m)) = node {
            m.entry(key.to_string()).or_insert(value);
        }
    }
    fn items<'a>(node: &'a mut Value, pointer: &str) -> impl Iterator<Item = &'a mut Value> {
        node.pointer_mut(pointer).and_then(Value::as_array_mut).into_iter().flatten()
    }
    for volume in items(pod, "/spec/volumes") {
        for source in ["secret", "configMap", "projected", "downwardAPI"] {
            or_insert(volume.get_mut(source), "defaultMode", json!(420));
        }
        for source in items(volume, "/projected/sources") {
            or_insert(source.get_mut("serviceAccountToken"), "expirationSeconds", json!(3600));
        }
    }
    for list in ["/spec/initContainers", "/spec/containers"] {
        for container in items(pod, list) {
            or_insert(Some(&mut *container), "terminationMessagePath", json!("/dev/termination-log"));
            or_insert(Some(&mut *container), "terminationMessagePolicy", json!("File"));
            or_insert(Some(&mut *container), "imagePullPolicy", json!("IfNotPresent"));
            for env in items(container, "/env") {
                or_insert(env.pointer_mut("/valueFrom/fieldRef"), "apiVersion", json!("v1"));
            }
            for mount in items(container, "/volumeMounts").filter_map(Value::as_object_mut) {
                mount.retain(|k, v| !((k == "readOnly" && *v == false) || (k == "subPath" && *v == "")));
            }
        }
    }
}

#[test]
fn reinvocation_after_apiserver_defaulting_is_a_no_op() {
    // Every kind the example profiles inject, on a pod the apiserver sent, patched, then
    // defaulted and re-encoded by the apiserver as it is before a reinvocation; the admission
    // attestation, bound to the pod, still holds for the defaulted pod (it is kept).
    let set = examples();
    let attestor = TestAttestor { key: Some(1) };
    let facts = create("team-a", LMEVAL_OPERATOR).attested_by(&attestor);
    let (d, mut after) = admit(&facts, &fixture("lmeval-driver-pod.json"), &set);
    assert!(after["metadata"]["annotations"]["keyward.io/attestation"].is_string(), "the example issues per owner");
    assert_eq!(d.reason, Reason::Injected);
    let kinds: Vec<&str> = d.outcome.as_ref().unwrap().injections.iter().map(|(kind, _)| *kind).collect();
    assert_eq!(kinds, ["clientCertificate", "serverCA", "serviceAccountToken", "serviceAccount"]);
    apiserver_defaults(&mut after);
    let again = decide(&facts, &after, &set);
    assert_eq!(again.reason, Reason::AlreadyInjected, "{:?}", again.message());
    assert!(again.patch().is_empty(), "{:?}", again.patch());
    assert!(again.warnings.is_empty(), "keyward's own mounts are there, not another volume's: {:?}", again.warnings);

    // The same with a profile that leaves the token's expiration to its default, and a mount
    // the apiserver writes without `readOnly: false`.
    let set = profiles(&MINIMAL_PROFILE.replace(
        "  inject:\n",
        "  inject:\n    serviceAccountToken: {audience: a, mountPath: /var/run/secrets/keyward/sa-token}\n",
    ));
    let facts = create("default", "ci-bot");
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "minimal", "team": "blue"}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "Always"}]}
    });
    let (_, mut after) = admit(&facts, &pod, &set);
    apiserver_defaults(&mut after);
    assert!(decide(&facts, &after, &set).patch().is_empty());
}

#[test]
fn unresolvable_template_denies_with_the_field() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "minimal"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    });
    let d = decide(&create("default", "ci-bot"), &pod, &profiles(MINIMAL_PROFILE));
    assert_eq!(d.reason, Reason::Unresolvable);
    assert_eq!(
        d.message().unwrap(),
        "keyward: profile \"minimal\" cannot name this pod's credentials: spec.inject.token.secretName: \"{label:team}-api-key\" needs the pod label \"team\", which the pod does not have; give the pod what the profile needs, or fix the profile"
    );
}

#[test]
fn an_object_that_is_not_a_pod_is_refused() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "minimal", "team": "blue"}}, "spec": {"containers": "nope"}});
    let d = decide(&create("default", "ci-bot"), &pod, &profiles(MINIMAL_PROFILE));
    assert_eq!(d.reason, Reason::InvalidPod);
    // No line and column: they would count in the apiserver's JSON, which nobody sees.
    assert_eq!(
        d.message().unwrap(),
        "keyward: request.object is not a valid Pod: invalid type: string \"nope\", expected spec.containers as a list"
    );
    // A pod no profile selects is answered from its metadata alone: its spec is never read.
    let d = decide(&create("default", "ci-bot"), &pod, &examples());
    assert_eq!(d.reason, Reason::NoProfile);
    assert!(d.allowed());
    let d = decide(&create("default", "ci-bot"), &json!({"metadata": {"labels": "nope"}}), &examples());
    assert_eq!(d.reason, Reason::InvalidPod, "metadata is always read");
}

#[test]
fn explain_without_a_requester_assumes_and_says_so() {
    let pod = fixture("lmeval-driver-pod.json");
    let d = decide(&RequestFacts::pod_create("team-a", Requester::Assumed), &pod, &examples());
    assert_eq!(d.reason, Reason::Injected);
    assert_eq!(
        d.warnings,
        ["requester not given: assumed to be one of system:serviceaccount:*:trustyai-service-operator-controller-manager"]
    );
}

#[test]
fn named_containers_only() {
    let set = profiles(&MINIMAL_PROFILE.replace("  onEnvConflict: keepUser\n", "  containers: [app, missing]\n"));
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "minimal", "team": "blue"}},
        "spec": {"initContainers": [{"name": "init", "image": "busybox"}], "containers": [{"name": "app", "image": "busybox"}, {"name": "other", "image": "busybox"}]}
    });
    let (d, after) = admit(&create("default", "ci-bot"), &pod, &set);
    assert!(after["spec"]["initContainers"][0].get("volumeMounts").is_none());
    assert!(after["spec"]["containers"][1].get("volumeMounts").is_none());
    assert_eq!(after["spec"]["containers"][0]["volumeMounts"][0]["name"], "keyward-token");
    assert_eq!(d.warnings, ["keyward: profile \"minimal\" lists container \"missing\", which this pod does not have"]);
    let audit: Value =
        serde_json::from_str(after["metadata"]["annotations"][ANNOTATION_INJECTED].as_str().unwrap()).unwrap();
    assert_eq!(audit["containers"], json!(["app"]), "the profile's names that the pod has");
}

#[test]
fn namespace_patterns_limit_where_a_profile_applies() {
    let set = profiles(&MINIMAL_PROFILE.replace("  onEnvConflict: keepUser\n", "  namespaces: [\"team-*\", evals]\n"));
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "minimal", "team": "blue"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    });
    for ns in ["team-blue", "evals"] {
        let (d, _) = admit(&create(ns, "ci-bot"), &pod, &set);
        assert_eq!(d.reason, Reason::Injected, "{ns}");
    }
    // The namespace comes from request.namespace, not from the pod (empty on CREATE).
    let e = explain(&create("default", "ci-bot"), &pod, &set);
    assert_eq!(e.decision.reason, Reason::NoProfile);
    assert_eq!(e.trace[0].why, "namespace \"default\" matches none of [\"team-*\", \"evals\"]");
}

#[test]
fn an_owner_of_another_kind_is_not_selected() {
    let mut pod = fixture("lmeval-driver-pod.json");
    pod["metadata"]["ownerReferences"][0]["kind"] = json!("Job");
    pod["metadata"]["ownerReferences"][0]["apiVersion"] = json!("batch/v1");
    let e = explain(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    assert_eq!(e.decision.reason, Reason::NoProfile);
    assert_eq!(
        e.trace[0].why,
        "controller owner batch/Job (evaljob-sample) is not one of trustyai.opendatahub.io/LMEvalJob"
    );
    pod["metadata"]["ownerReferences"][0]["controller"] = json!(false);
    let e = explain(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    assert_eq!(e.trace[0].why, "the pod has no controller ownerReference");
}

#[test]
fn owners_with_long_names_get_their_credentials() {
    // Kubernetes limits a Secret name to 253 characters in all, not 63 per dot-separated part:
    // a job named with 49 or more characters must still get its `<owner>-keyward-client`.
    let mut pod = fixture("lmeval-driver-pod.json");
    let owner = "evaluation-of-granite-on-the-full-mmlu-suite-with-few-shot-prompts";
    pod["metadata"]["ownerReferences"][0]["name"] = json!(owner);
    let (_, after) = admit(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    let secret = format!("{owner}-keyward-client");
    assert!(secret.len() > 63);
    assert_eq!(after["spec"]["volumes"][1]["secret"]["secretName"], json!(secret));

    // Past 253 characters the apiserver would refuse the name, so keyward refuses the pod, and
    // says so accurately.
    pod["metadata"]["ownerReferences"][0]["name"] = json!("o".repeat(240));
    let d = decide(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    assert_eq!(d.reason, Reason::Unresolvable);
    assert!(
        d.message().unwrap().contains(
            "spec.inject.clientCertificate.secretName: \"{owner.name}-keyward-client\" resolves to a name of 255 characters, over Kubernetes' limit of 253"
        ),
        "{:?}",
        d.message()
    );
}

#[test]
fn the_audit_annotation_stays_small_whatever_the_pod() {
    // 3,000 containers with long names: one entry per container would take ~170 KB of the
    // apiserver's 256 KiB for all annotations (4,000 took it past).
    let containers: Vec<Value> =
        (0..3000).map(|i| json!({"name": format!("c-{i:04}-{}", "x".repeat(50)), "image": "busybox"})).collect();
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "minimal", "team": "blue"}},
        "spec": {"automountServiceAccountToken": false, "containers": containers}
    });
    let (_, after) = admit(&create("default", "ci-bot"), &pod, &profiles(MINIMAL_PROFILE));
    let annotation = after["metadata"]["annotations"][ANNOTATION_INJECTED].as_str().unwrap();
    assert!(annotation.len() < 512, "{} bytes", annotation.len());
    assert!(annotation.ends_with(r#","containers":"all"}"#), "{annotation}");
}

#[test]
fn a_pod_whose_annotations_would_overflow_is_refused_with_the_reason() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "minimal", "team": "blue"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "y".repeat(262_000)}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    });
    let d = decide(&create("default", "ci-bot"), &pod, &profiles(MINIMAL_PROFILE));
    assert_eq!(d.reason, Reason::Conflict);
    let message = d.message().unwrap();
    assert!(
        message.starts_with(
            "keyward: profile \"minimal\" cannot inject into this pod: metadata.annotations would take 262"
        ),
        "{message}"
    );
    assert!(
        message.ends_with(
            "bytes with keyward's audit record, over the apiserver's limit of 262144; shorten the pod's annotations"
        ),
        "{message}"
    );
}

/// An LMEvalJob pod of `volumes` emptyDir volumes and `containers` containers, each mounting
/// the API token that the profile removes.
fn wide_pod(volumes: usize, containers: usize) -> Value {
    let mut pod = fixture("lmeval-driver-pod.json");
    let mut list: Vec<Value> = (0..volumes).map(|i| json!({"name": format!("v{i}"), "emptyDir": {}})).collect();
    list.push(json!({"name": "shared", "emptyDir": {}}));
    list.push(json!({"name": "kube-api-access-7xq2m", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}));
    pod["spec"]["volumes"] = Value::Array(list);
    pod["spec"]["containers"] = Value::Array(
        (0..containers)
            .map(|i| json!({"name": format!("c{i}"), "image": "busybox",
                "volumeMounts": [{"name": "kube-api-access-7xq2m", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]}))
            .collect(),
    );
    pod
}

#[test]
fn a_huge_element_named_like_keywards_is_unlike_it_and_never_decoded() {
    // A volume named like the profile's, with 3,000,000 items (a 6 MB body: decoded whole for
    // the comparison, it took 260 MB), and an env var the profile sets, with a huge valueFrom.
    let set = profiles(MINIMAL_PROFILE);
    let pod = |volumes: Value, env: Value| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"app": "minimal", "team": "blue"}},
            "spec": {"containers": [{"name": "c", "image": "busybox", "env": env}], "volumes": volumes}
        })
    };
    let huge_volume =
        json!([{"name": "keyward-token", "secret": {"secretName": "blue-api-key", "items": vec![0; 3_000_000]}}]);
    let d = decide(&create("default", "ci-bot"), &pod(huge_volume, json!([])), &set);
    assert_eq!(d.reason, Reason::Conflict);
    assert!(
        d.message().unwrap().starts_with("keyward: profile \"minimal\" cannot inject into this pod: spec.volumes[0] is a volume named \"keyward-token\" that differs from the one profile \"minimal\" injects"),
        "{:?}",
        d.message()
    );
    let huge_env = json!([{"name": "API_KEY", "valueFrom": {"x": vec![0; 30_000]}}]);
    let d = decide(&create("default", "ci-bot"), &pod(json!([]), huge_env), &set);
    assert_eq!(d.reason, Reason::Injected, "onEnvConflict: keepUser");
    assert!(
        d.warnings.iter().any(|w| w
            .contains("already sets API_KEY (spec.containers[0].env[0]) to a value of more than 20000 JSON values")),
        "{:?}",
        d.warnings
    );
}

#[test]
fn an_attested_pod_too_large_to_bind_is_refused_not_read_whole() {
    // The attestation binds what the pod runs, read into a tree of at most MAX_SPEC_VALUES
    // values. A driver pod with 20,000 empty args (hostile: unbudgeted, 2.2 million of them, a
    // 6.6 MB body, built 83 MB of tree) is refused before anything else is read of it.
    let attestor = TestAttestor { key: Some(1) };
    let facts = create("team-a", LMEVAL_OPERATOR).attested_by(&attestor);
    let mut pod = fixture("lmeval-driver-pod.json");
    let (d, _) = admit(&facts, &fixture("lmeval-driver-pod.json"), &examples());
    assert_eq!(d.reason, Reason::Injected, "the driver as the operator creates it is attested");
    pod["spec"]["containers"][0]["args"] = Value::Array(vec![json!(""); keyward_engine::tree::MAX_SPEC_VALUES]);
    let d = decide(&facts, &pod, &examples());
    assert_eq!(d.reason, Reason::TooLarge);
    assert_eq!(
        d.message().unwrap(),
        format!("keyward: profile \"lmeval-job\" selects this pod and binds its credentials to what the pod runs, but its spec: more than {} values in the fields the admission attestation binds (containers, volumes, the pod's identity and host fields); keyward refuses rather than hold that much per admission: keep data out of the pod spec (a ConfigMap mounted as a volume, say)", keyward_engine::tree::MAX_SPEC_VALUES)
    );
    // Without the attestation (no key), nothing is bound, and the pod is scanned from its JSON.
    let unattested = decide(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    assert_eq!(unattested.reason, Reason::Injected);
}

#[test]
fn a_huge_pod_is_answered_in_linear_time_and_bounded_work() {
    // 100,000 volumes and 10,000 containers: a 4.8 MB body. The old engine took seconds on pods
    // like this (its token removal was quadratic); this one reads each element once, and
    // refuses a patch past the apiserver's 10,000 operations instead of building it (a
    // quadratic engine would not finish this test). The time is a figure for the benchmarks:
    // BENCHMARKS.md, "Hostile pods".
    let body = raw(&wide_pod(100_000, 10_000));
    assert!(body.get().len() > 4_000_000);
    let d = keyward_engine::decide(&create("team-a", LMEVAL_OPERATOR), &body, &examples());
    assert_eq!(d.reason, Reason::TooLarge);
    assert!(
        d.message().unwrap().ends_with("keyward refuses rather than build a patch that large"),
        "{:?}",
        d.message()
    );

    // 2,000 containers without the API token: each gets the profile's 3 mounts and 4 env vars.
    let mut pod = wide_pod(0, 0);
    pod["spec"]["containers"] =
        Value::Array((0..2_000).map(|i| json!({"name": format!("c{i}"), "image": "busybox"})).collect());
    let d = decide(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    assert_eq!(d.reason, Reason::TooLarge);
    assert_eq!(
        d.message().unwrap(),
        "keyward: profile \"lmeval-job\" would need more than 10000 patch operations for this pod (every container it targets gets the profile's mounts and env vars), more than a JSON patch may have; list the containers that need credentials in the profile's spec.containers"
    );

    // Past 10,000 containers they are only counted, not held.
    let mut pod = wide_pod(0, 0);
    pod["spec"]["containers"] =
        Value::Array((0..10_001).map(|i| json!({"name": format!("c{i}"), "image": "busybox"})).collect());
    let d = decide(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    assert_eq!(d.reason, Reason::TooLarge);
    assert!(
        d.message()
            .unwrap()
            .contains("it has 10002 init containers and containers, more than keyward injects into (10000)"),
        "{:?}",
        d.message()
    );

    // A pod of 10,001 API-token volumes to remove: more than a patch may hold, so they are not
    // all held either.
    let mut pod = wide_pod(0, 1);
    pod["spec"]["volumes"] =
        Value::Array((0..10_001).map(|i| json!({"name": format!("kube-api-access-{i}"), "emptyDir": {}})).collect());
    let d = decide(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    assert_eq!(d.reason, Reason::TooLarge);
    assert!(
        d.message().unwrap().contains("more than 10000 volumes, mounts and env vars named like"),
        "{:?}",
        d.message()
    );

    // 100,000 volumes and 1,000 containers: admitted, every API-token mount removed.
    let pod = wide_pod(100_000, 1_000);
    let (_, after) = admit(&create("team-a", LMEVAL_OPERATOR), &pod, &examples());
    assert!(after["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| { c["volumeMounts"].as_array().unwrap().iter().all(|m| m["name"] != "kube-api-access-7xq2m") }));
    assert_eq!(after["spec"]["volumes"].as_array().unwrap().len(), 100_001 + 3);
}

#[test]
fn injected_pods_carry_the_profile_label_whatever_labels_they_had() {
    let annotated = r#"
apiVersion: keyward.io/v1alpha1
kind: InjectionProfile
metadata: {name: by-annotation}
spec:
  annotationSelector: {matchAnnotations: {example.com/credentials: "true"}}
  requesters: {usernames: [ci-bot]}
  inject: {apiToken: remove}
"#;
    // No labels at all (an annotation-only selector): the whole map is added.
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "annotations": {"example.com/credentials": "true"}},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "c", "image": "busybox"}]}
    });
    let (d, after) = admit(&create("default", "ci-bot"), &pod, &profiles(annotated));
    let ops = patch_json(&d);
    assert_eq!(
        ops.as_array().unwrap().last().unwrap(),
        &json!({"op": "add", "path": "/metadata/labels", "value": {"keyward.io/profile": "by-annotation"}})
    );
    assert_eq!(after["metadata"]["labels"], json!({"keyward.io/profile": "by-annotation"}));

    // A label the creator set to another profile's name is overwritten: it lists, it proves nothing.
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"app": "minimal", "team": "blue", "keyward.io/profile": "lmeval"}},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "c", "image": "busybox"}]}
    });
    let (_, after) = admit(&create("default", "ci-bot"), &pod, &profiles(MINIMAL_PROFILE));
    assert_eq!(after["metadata"]["labels"], json!({"app": "minimal", "team": "blue", "keyward.io/profile": "minimal"}));

    // A pod injected before keyward set the label is otherwise whole: re-deciding on it adds the
    // label and nothing else, and still counts as already injected (the controller re-plans
    // live pods and issues only for those).
    let mut unlabelled = after.clone();
    unlabelled["metadata"]["labels"].as_object_mut().unwrap().remove("keyward.io/profile");
    let again = decide(&create("default", "ci-bot"), &unlabelled, &profiles(MINIMAL_PROFILE));
    assert_eq!(again.reason, Reason::AlreadyInjected);
    assert_eq!(
        patch_json(&again),
        json!([{"op": "add", "path": "/metadata/labels/keyward.io~1profile", "value": "minimal"}])
    );
    let whole = decide(&create("default", "ci-bot"), &after, &profiles(MINIMAL_PROFILE));
    assert_eq!((whole.reason, whole.patch().len()), (Reason::AlreadyInjected, 0));
}

#[test]
fn a_profile_name_longer_than_a_label_value_is_refused() {
    let name = "a".repeat(64);
    let yaml = MINIMAL_PROFILE.replace("name: minimal", &format!("name: {name}"));
    let err = keyward_engine::ProfileSet::from_sources([("p.yaml".to_string(), yaml)]).unwrap_err().to_string();
    assert!(
        err.contains(
            "metadata.name: is 64 characters; at most 63, since it becomes the value of the keyward.io/profile label"
        ),
        "{err}"
    );
}
