//! The deploy manifests: rendered with `kubectl kustomize` (kustomize is built into the kubectl
//! on these machines), then checked against the rules a reviewer would check.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

mod support;

use std::process::Command;

use serde_json::{json, Value};

fn root() -> &'static str {
    env!("CARGO_MANIFEST_DIR")
}

fn render(overlay: &str) -> Vec<Value> {
    let out = support::tool("kubectl")
        .args(["kustomize", &format!("{}/deploy/overlays/{overlay}", root())])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    keyward_engine::yaml::documents(&text).unwrap().into_iter().map(|d| d.value).collect()
}

/// Every install under deploy/overlays, so that a new one is checked by every test that walks
/// them.
fn overlays() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("{}/deploy/overlays", root()))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert!(names.len() >= 7, "{names:?}");
    names
}

/// issue 58: the OpenShift install had no variant for a build of one's own, as `local` and
/// `local-self-managed` are for the others. `local-openshift` is the OpenShift install but for
/// the image, which it pulls from the cluster's internal registry in keyward's own namespace
/// (whose accounts may pull from it by default).
#[test]
fn the_local_openshift_install_is_the_openshift_one_with_an_image_from_the_internal_registry() {
    let (local, shipped) = (render("local-openshift"), render("openshift"));
    assert_eq!(local.len(), shipped.len());
    let mut images = Vec::new();
    for (mut ours, theirs) in local.into_iter().zip(shipped) {
        if ours["kind"] == "Deployment" {
            for c in ours["spec"]["template"]["spec"]["containers"].as_array_mut().unwrap() {
                images.push(c["image"].as_str().unwrap().to_string());
                c["image"] = json!("ghcr.io/keyward/keyward:unreleased");
            }
        }
        assert_eq!(ours, theirs, "only the image differs");
    }
    let namespace = find(&render("openshift"), "Deployment", "keyward")["metadata"]["namespace"].clone();
    let want = format!("image-registry.openshift-image-registry.svc:5000/{}/keyward:dev", namespace.as_str().unwrap());
    assert_eq!(images, [want.clone(), want]);
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} in the rendered overlay"))
}

#[test]
fn the_checked_in_webhook_configuration_is_what_the_profiles_generate() {
    let out = Command::new(env!("CARGO_BIN_EXE_keyward"))
        .args(["manifests", "webhook"])
        .env_remove("KEYWARD_PROFILES")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let checked_in = std::fs::read_to_string(format!("{}/deploy/base/webhook.yaml", root())).unwrap();
    assert!(
        String::from_utf8(out.stdout).unwrap() == checked_in,
        "deploy/base/webhook.yaml is stale: run `make manifests` and commit the result"
    );
}

#[test]
fn the_deployment_passes_the_restricted_pod_security_standard() {
    let docs = render("cert-manager");
    let deploy = find(&docs, "Deployment", "keyward");
    assert_eq!(deploy["metadata"]["namespace"], "keyward-system");
    let pod = &deploy["spec"]["template"]["spec"];
    let psc = &pod["securityContext"];
    assert_eq!(psc["runAsNonRoot"], true);
    assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(psc["runAsUser"].as_i64().unwrap() > 0);
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(pod[field].is_null() || pod[field] == false, "{field}");
    }
    for v in pod["volumes"].as_array().unwrap() {
        assert!(v["hostPath"].is_null(), "restricted forbids hostPath: {v}");
    }
    let containers: Vec<&Value> =
        ["initContainers", "containers"].iter().flat_map(|f| pod[*f].as_array().into_iter().flatten()).collect();
    assert!(!containers.is_empty());
    for c in containers {
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{}", c["name"]);
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{}", c["name"]);
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{}", c["name"]);
        assert!(sc["capabilities"]["add"].is_null(), "{}", c["name"]);
        assert!(sc["privileged"].is_null() || sc["privileged"] == false);
        assert!(sc["runAsUser"].is_null() || sc["runAsUser"].as_i64().unwrap() > 0);
        assert!(c["ports"].as_array().unwrap().iter().all(|p| p["hostPort"].is_null()));
        // The serving Secret is mounted as a directory: subPath mounts never update.
        for m in c["volumeMounts"].as_array().unwrap() {
            assert!(m["subPath"].is_null() && m["subPathExpr"].is_null(), "{m}");
        }
        assert_eq!(c["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "https", "scheme": "HTTPS"}));
        // Live before its certificate arrives (tests/serve.rs, started on an empty --tls-dir):
        // the metrics port, which `serve` opens on 9090 unless told otherwise.
        assert_eq!(c["livenessProbe"]["httpGet"], json!({"path": "/healthz", "port": "metrics"}));
        let metrics = c["ports"].as_array().unwrap().iter().find(|p| p["name"] == "metrics").unwrap();
        assert_eq!(metrics["containerPort"], 9090);
        assert!(!c["args"].as_array().unwrap().iter().any(|a| a.as_str().unwrap().starts_with("--metrics-listen")));
        assert!(c["resources"]["requests"]["cpu"].is_string() && c["resources"]["requests"]["memory"].is_string());
        assert!(c["resources"]["limits"]["memory"].is_string());
    }
    let ns = find(&docs, "Namespace", "keyward-system");
    assert_eq!(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted");
}

#[test]
fn the_deployment_is_highly_available() {
    let docs = render("cert-manager");
    let deploy = find(&docs, "Deployment", "keyward");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let pod = &deploy["spec"]["template"]["spec"];
    // Spread across nodes, but never so hard that a one-node cluster (or kind's tainted control
    // plane) leaves a replica Pending and wedges rollouts and drains.
    let spread = pod["topologySpreadConstraints"].as_array().unwrap();
    assert!(spread.iter().any(|c| c["topologyKey"] == "kubernetes.io/hostname"));
    for deployment in ["keyward", "keyward-controller"] {
        let constraints = find(&docs, "Deployment", deployment)["spec"]["template"]["spec"]
            ["topologySpreadConstraints"]
            .as_array()
            .unwrap()
            .clone();
        for c in constraints {
            assert_eq!(c["whenUnsatisfiable"], "ScheduleAnyway", "{deployment}: {c}");
            assert_eq!(c["nodeTaintsPolicy"], "Honor", "{deployment}: {c}");
        }
    }
    for field in ["affinity", "nodeSelector"] {
        assert!(pod[field].is_null(), "a hard {field} could leave a replica Pending");
    }
    let priority = pod["priorityClassName"].as_str().unwrap();
    find(&docs, "PriorityClass", priority);
    for deployment in ["keyward", "keyward-controller"] {
        let selector = &find(&docs, "Deployment", deployment)["spec"]["selector"]["matchLabels"];
        let pdb = find(&docs, "PodDisruptionBudget", deployment);
        assert_eq!(pdb["spec"]["minAvailable"], 1, "{deployment}");
        assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow", "{deployment}");
        assert_eq!(&pdb["spec"]["selector"]["matchLabels"], selector, "{deployment}");
        assert_eq!(find(&docs, "Deployment", deployment)["spec"]["replicas"], 2, "{deployment}");
    }
    assert_eq!(pod["automountServiceAccountToken"], false, "keyward makes no API call");
    find(&docs, "NetworkPolicy", "keyward");
    let tls = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "tls").unwrap();
    let serving = find(&docs, "Certificate", "keyward-serving");
    assert_eq!(tls["secret"]["secretName"], serving["spec"]["secretName"]);
}

#[test]
fn the_webhook_is_create_only_side_effect_free_and_scoped() {
    let docs = render("cert-manager");
    let config = find(&docs, "MutatingWebhookConfiguration", "keyward");
    assert_eq!(config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], "keyward-system/keyward-serving");
    let webhooks = config["webhooks"].as_array().unwrap();
    assert_eq!(webhooks.len(), 1);
    let w = &webhooks[0];
    assert_eq!(w["admissionReviewVersions"], json!(["v1"]));
    assert_eq!(w["sideEffects"], "None");
    assert_eq!(w["reinvocationPolicy"], "IfNeeded");
    assert!(w["timeoutSeconds"].as_i64().unwrap() <= 10);
    assert_eq!(
        w["rules"],
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}])
    );
    // The pod opt-out: a pod labelled keyward.io/inject=disabled is never sent.
    assert_eq!(
        w["objectSelector"],
        json!({"matchExpressions": [{"key": "keyward.io/inject", "operator": "NotIn", "values": ["disabled"]}]})
    );
    assert_eq!(
        w["clientConfig"]["service"],
        json!({"name": "keyward", "namespace": "keyward-system", "path": "/mutate", "port": 443})
    );
    find(&docs, "Service", "keyward");
    // failurePolicy: Fail, but only for opted-in namespaces, never kube-system or keyward's
    // own, and only for pods some profile could select.
    assert_eq!(w["failurePolicy"], "Fail");
    let exprs = w["namespaceSelector"]["matchExpressions"].as_array().unwrap();
    assert!(exprs.contains(&json!({"key": "keyward.io/inject", "operator": "In", "values": ["enabled"]})));
    assert!(exprs.contains(
        &json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "keyward-system"]})
    ));
    let conditions = w["matchConditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 1);
    let expression = conditions[0]["expression"].as_str().unwrap();
    assert!(expression.starts_with("(has(object.metadata.labels) ? "), "{expression}");
    assert!(expression.contains("\"fms-lm-eval-service\""), "{expression}");
}

#[test]
fn cert_manager_issues_an_ecdsa_serving_certificate_that_rotates_its_key() {
    let docs = render("cert-manager");
    let serving = find(&docs, "Certificate", "keyward-serving");
    // PKCS#8, which every tool reads (cert-manager writes SEC1 for ECDSA unless told; keyward
    // reads both, certs/tests/keys.rs).
    for certificate in ["keyward-serving", "keyward-serving-ca", "keyward-client-ca"] {
        assert_eq!(
            find(&docs, "Certificate", certificate)["spec"]["privateKey"],
            json!({"algorithm": "ECDSA", "size": 256, "encoding": "PKCS8", "rotationPolicy": "Always"}),
            "{certificate}"
        );
    }
    assert_eq!(
        serving["spec"]["dnsNames"],
        json!(["keyward.keyward-system.svc", "keyward.keyward-system.svc.cluster.local"])
    );
    let issuer = serving["spec"]["issuerRef"]["name"].as_str().unwrap();
    let ca_secret = find(&docs, "Issuer", issuer)["spec"]["ca"]["secretName"].as_str().unwrap();
    let ca = docs.iter().find(|d| d["kind"] == "Certificate" && d["spec"]["secretName"] == ca_secret).unwrap();
    assert_eq!(ca["spec"]["isCA"], true);
    assert_eq!(
        find(&docs, "Issuer", ca["spec"]["issuerRef"]["name"].as_str().unwrap())["spec"]["selfSigned"],
        json!({})
    );
    let client_ca = find(&docs, "Certificate", "keyward-client-ca");
    assert_eq!(client_ca["spec"]["isCA"], true);
}

/// keyward's controller alone signs with the client CA, after its checks: an Issuer of that
/// key would sign any workload identity for whoever may create a CertificateRequest, approved by
/// cert-manager's default approver. No install, no component, has one.
#[test]
fn no_issuer_in_any_install_signs_with_keywards_client_ca() {
    let mut installs: Vec<(String, Vec<Value>)> = overlays().into_iter().map(|o| (o.clone(), render(&o))).collect();
    for component in ["account-provisioning", "audit", "monitoring"] {
        let docs = render_own(
            json!({"resources": ["deploy/overlays/cert-manager"], "components": [format!("deploy/components/{component}")]}),
        );
        installs.push((component.to_string(), docs));
    }
    for (install, docs) in &installs {
        // The Secret the controller reads the client CA from, where it has one.
        let controller =
            docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "keyward-controller");
        let volumes =
            controller.and_then(|c| c["spec"]["template"]["spec"]["volumes"].as_array()).cloned().unwrap_or_default();
        let client_ca = volumes.iter().find(|v| v["name"] == "client-ca").map(|v| v["secret"]["secretName"].clone());
        if let Some(secret) = &client_ca {
            assert_eq!(secret, "keyward-client-ca", "{install}");
        }
        for issuer in docs.iter().filter(|d| d["kind"] == "Issuer" || d["kind"] == "ClusterIssuer") {
            assert_ne!(issuer["spec"]["ca"]["secretName"], "keyward-client-ca", "{install}: {issuer}");
        }
    }
}

#[test]
fn the_controller_is_leader_elected_least_privileged_and_mounts_the_client_ca() {
    let docs = render("cert-manager");
    let deploy = find(&docs, "Deployment", "keyward-controller");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "keyward-controller");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let c = &pod["containers"][0];
    assert_eq!(c["args"][0], "controller");
    assert!(c["args"].as_array().unwrap().contains(&json!("--client-ca-dir=/var/run/keyward/client-ca")));
    assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name", "the Lease identity is the pod");
    let sc = &c["securityContext"];
    assert_eq!(
        (sc["allowPrivilegeEscalation"].clone(), sc["readOnlyRootFilesystem"].clone()),
        (json!(false), json!(true))
    );
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "metrics"}));
    // The client CA cert-manager issues, mounted as a directory.
    let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "client-ca").unwrap();
    assert_eq!(volume["secret"]["secretName"], find(&docs, "Certificate", "keyward-client-ca")["spec"]["secretName"]);
    assert!(c["volumeMounts"].as_array().unwrap().iter().all(|m| m["subPath"].is_null()));

    // RBAC: named verbs only; no escalate, impersonate or bind; the Lease by name.
    let role = find(&docs, "ClusterRole", "keyward-controller");
    for rule in role["rules"].as_array().unwrap() {
        for field in ["apiGroups", "resources", "verbs"] {
            assert!(!rule[field].as_array().unwrap().contains(&json!("*")), "wildcard in {rule}");
        }
        for verb in ["escalate", "impersonate", "bind"] {
            assert!(!rule["verbs"].as_array().unwrap().contains(&json!(verb)), "{verb} in {rule}");
        }
    }
    let rule_for = |resource: &str| {
        role["rules"].as_array().unwrap().iter().find(|r| r["resources"] == json!([resource])).unwrap()["verbs"].clone()
    };
    assert_eq!(rule_for("pods"), json!(["list", "watch"]), "pods are only watched");
    // Secrets are never enumerated: renewal is driven from verified owners.
    let secrets = rule_for("secrets");
    for verb in ["list", "watch"] {
        assert!(!secrets.as_array().unwrap().contains(&json!(verb)), "{verb} on secrets: {secrets}");
    }
    assert_eq!(rule_for("namespaces"), json!(["get", "list", "watch"]));
    assert_eq!(rule_for("lmevaljobs"), json!(["get"]), "owners are only checked");
    // Exactly what the built-in profiles use: no ServiceAccounts or RoleBindings (those are
    // deploy/components/account-provisioning's, with --provision-accounts).
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "update", "patch", "delete"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "update", "delete"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            {"apiGroups": ["foundation-model-stack.github.com.github.com"], "resources": ["lmevaljobs"], "verbs": ["get"]}
        ])
    );
    assert!(!c["args"].as_array().unwrap().contains(&json!("--provision-accounts")));
    // The one webhook configuration whose matchConditions it keeps, by name, and no other verb.
    let config_role = find(&docs, "ClusterRole", "keyward-controller-webhook-config");
    let config_name = find(&docs, "MutatingWebhookConfiguration", "keyward")["metadata"]["name"].clone();
    assert_eq!(
        config_role["rules"],
        json!([{"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"], "resourceNames": [config_name], "verbs": ["get", "list", "watch", "patch"]}])
    );
    assert_eq!(
        find(&docs, "ClusterRoleBinding", "keyward-controller-webhook-config")["subjects"],
        json!([{"kind": "ServiceAccount", "name": "keyward-controller", "namespace": "keyward-system"}])
    );
    // The signer: its requests, their status, `sign` and `attest` for keyward's signers only, its
    // trust bundles, and the pods they name by GET.
    let signer = find(&docs, "ClusterRole", "keyward-controller-signer");
    assert_eq!(
        signer["rules"],
        json!([
            {"apiGroups": ["certificates.k8s.io"], "resources": ["podcertificaterequests"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["certificates.k8s.io"], "resources": ["podcertificaterequests/status"], "verbs": ["update"]},
            {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "resourceNames": ["keyward.io/*"], "verbs": ["sign", "attest"]},
            {"apiGroups": ["certificates.k8s.io"], "resources": ["clustertrustbundles"], "verbs": ["get", "list", "watch", "create", "update", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}
        ])
    );
    assert_eq!(
        find(&docs, "ClusterRoleBinding", "keyward-controller-signer")["subjects"],
        json!([{"kind": "ServiceAccount", "name": "keyward-controller", "namespace": "keyward-system"}])
    );
    assert_eq!(
        keyward_controller::signer::SIGNER_RBAC_NAME,
        signer["rules"][2]["resourceNames"][0],
        "the rule names the signers the code serves"
    );
    // The built-in profiles' Secret CA sources, each watched by name (list and watch with a
    // metadata.name field selector, which RBAC checks against resourceNames): exactly their
    // names, and nothing else on Secrets.
    let sources = keyward_controller::desired::ca_sources(
        &keyward_engine::ProfileSet::builtin().unwrap(),
        &std::collections::BTreeMap::new(),
    );
    let secret_sources: Vec<&str> = sources.iter().filter(|s| !s.config_map).map(|s| s.name.as_str()).collect();
    assert_eq!(secret_sources, ["grpc-server-cert"], "a new built-in source needs its name in the rule below");
    assert_eq!(
        find(&docs, "ClusterRole", "keyward-controller-ca-sources")["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": secret_sources, "verbs": ["list", "watch"]}])
    );
    assert_eq!(
        find(&docs, "ClusterRoleBinding", "keyward-controller-ca-sources")["subjects"],
        json!([{"kind": "ServiceAccount", "name": "keyward-controller", "namespace": "keyward-system"}])
    );
    let lease = find(&docs, "Role", "keyward-controller-lease");
    assert_eq!(lease["metadata"]["namespace"], "keyward-system");
    assert_eq!(lease["rules"][1]["resourceNames"], json!(["keyward-controller"]));
    let binding = find(&docs, "ClusterRoleBinding", "keyward-controller");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "keyward-controller", "namespace": "keyward-system"}])
    );
    // The webhook's account stays without any binding.
    for doc in docs.iter().filter(|d| matches!(d["kind"].as_str(), Some("RoleBinding" | "ClusterRoleBinding"))) {
        assert!(doc["subjects"].as_array().unwrap().iter().all(|s| s["name"] != "keyward"), "{doc}");
    }
    find(&docs, "NetworkPolicy", "keyward-controller");
}

#[test]
fn the_webhook_mounts_the_attestation_key_the_controller_makes() {
    let docs = render("cert-manager");
    let pod = &find(&docs, "Deployment", "keyward")["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert!(c["args"].as_array().unwrap().contains(&json!("--attestation-key-dir=/var/run/keyward/attestation")));
    let mount = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "attestation").unwrap();
    assert_eq!(mount["mountPath"], "/var/run/keyward/attestation");
    assert!(mount["subPath"].is_null(), "a directory, so rotations reach it");
    let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "attestation").unwrap();
    // The controller's default --attestation-secret, in the same namespace; optional, so the
    // webhook starts before it exists.
    assert_eq!(volume["secret"], json!({"secretName": "keyward-attestation", "optional": true, "defaultMode": 288}));
    let controller = &find(&docs, "Deployment", "keyward-controller")["spec"]["template"]["spec"]["containers"][0];
    assert!(controller["args"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| !a.as_str().unwrap().starts_with("--attestation-secret")));
}

#[test]
fn the_webhook_reads_the_cluster_facts_the_controller_writes_in_every_overlay() {
    use keyward_engine::cluster::{CONFIG_MAP, FILE_NAME};
    for overlay in overlays() {
        let docs = render(&overlay);
        let pod = &find(&docs, "Deployment", "keyward")["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let file = format!("/etc/keyward/cluster/{FILE_NAME}");
        assert!(c["args"].as_array().unwrap().contains(&json!(format!("--cluster-facts={file}"))), "{overlay}");
        let mount = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "cluster-facts").unwrap();
        assert_eq!(mount["mountPath"], "/etc/keyward/cluster", "{overlay}: the file's directory, whole");
        assert!(mount["subPath"].is_null(), "a directory, so the controller's updates reach it");
        let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "cluster-facts").unwrap();
        // Written by the controller in its own namespace (the webhook's); optional, so the
        // webhook starts first and `auto` delivers Secrets until it is there.
        assert_eq!(volume["configMap"], json!({"name": CONFIG_MAP, "optional": true}), "{overlay}");
        let controller = find(&docs, "Deployment", "keyward-controller");
        assert_eq!(controller["metadata"]["namespace"], find(&docs, "Deployment", "keyward")["metadata"]["namespace"]);
    }
}

#[test]
fn the_lmeval_built_in_is_pinned_to_its_operators_namespace_in_both_halves() {
    let docs = render("cert-manager");
    for deployment in ["keyward", "keyward-controller"] {
        let args = find(&docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]["args"].clone();
        assert!(
            args.as_array().unwrap().contains(&json!("--operator-namespace=lmeval=lm-eval")),
            "{deployment}: {args}"
        );
    }
    // `keyward explain` answers as the install would: its default pins are these.
    let profiles = std::fs::read_to_string(format!("{}/src/profiles.rs", root())).unwrap();
    assert!(
        profiles.contains("pub const INSTALL_OPERATOR_NAMESPACES: &[(&str, &str)] = &[(\"lmeval\", \"lm-eval\")];"),
        "src/profiles.rs INSTALL_OPERATOR_NAMESPACES differs from the Deployments' --operator-namespace"
    );
}

#[test]
fn the_one_file_installs_are_their_rendered_overlays() {
    for (file, overlay, header) in [
        ("keyward.yaml", "cert-manager", "# keyward, one file (needs cert-manager). Generated by `make install-files` from deploy/overlays/cert-manager; edit the overlay, not this file. Its image is the placeholder ghcr.io/keyward/keyward:unreleased: install a release's keyward.yaml (pinned by digest), or build and load the image yourself (README, \"Deploy\").\n"),
        ("keyward-self-managed.yaml", "self-managed", "# keyward, one file, without cert-manager. Generated by `make install-files` from deploy/overlays/self-managed; edit the overlay, not this file. Its image is the placeholder ghcr.io/keyward/keyward:unreleased: install a release's keyward-self-managed.yaml (pinned by digest), or build and load the image yourself (README, \"Deploy\").\n"),
    ] {
        let out = support::tool("kubectl")
            .args(["kustomize", &format!("{}/deploy/overlays/{overlay}", root())])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let expected = format!("{header}{}", String::from_utf8(out.stdout).unwrap());
        let checked_in = std::fs::read_to_string(format!("{}/deploy/{file}", root())).unwrap();
        assert!(checked_in == expected, "deploy/{file} is stale: run `make install-files` and commit the result");
    }
}

#[test]
fn the_self_managed_install_needs_no_cert_manager_and_never_mounts_a_ca_key_in_the_webhook() {
    let docs = render("self-managed");
    for d in &docs {
        let api = d["apiVersion"].as_str().unwrap();
        assert!(!api.starts_with("cert-manager.io"), "a cert-manager object: {}", d["kind"]);
        assert!(!d["metadata"]["annotations"].to_string().contains("cert-manager.io"), "{}", d["metadata"]["name"]);
    }
    let webhook = &find(&docs, "Deployment", "keyward")["spec"]["template"]["spec"];
    let tls = webhook["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "tls").unwrap();
    assert_eq!(
        tls["secret"],
        json!({"secretName": "keyward-serving", "optional": true, "defaultMode": 288,
               "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}, {"key": "ca.crt", "path": "ca.crt"}]})
    );
    assert_eq!(webhook["automountServiceAccountToken"], false, "the webhook makes no API call");
    let controller = &find(&docs, "Deployment", "keyward-controller")["spec"]["template"]["spec"];
    let args: Vec<&str> =
        controller["containers"][0]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(args.contains(&"--serving-cert=self-managed") && args.contains(&"--client-ca=self-managed"), "{args:?}");
    let client_ca = controller["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "client-ca").unwrap();
    assert_eq!(client_ca["secret"]["optional"], true, "the controller starts before it makes the client CA");
    // Least privilege: the Secrets and the webhook configuration by name.
    let role = find(&docs, "Role", "keyward-controller-certificates");
    assert_eq!(role["rules"][0]["resourceNames"], json!(["keyward-serving", "keyward-client-ca"]));
    assert_eq!(role["rules"][0]["verbs"], json!(["get", "list", "watch", "update"]));
    let cluster_role = find(&docs, "ClusterRole", "keyward-controller-webhook-config");
    assert_eq!(
        cluster_role["rules"],
        json!([{"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"], "resourceNames": ["keyward"], "verbs": ["get", "list", "watch", "patch"]}])
    );
    // The controller may reach the webhook replicas' port, to ask what they serve.
    let policy = find(&docs, "NetworkPolicy", "keyward-controller");
    assert!(policy["spec"]["egress"].as_array().unwrap().iter().any(|e| e["ports"][0]["port"] == 8443
        && e["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"));
    // The Secret the controller writes is the one the webhook mounts, for the Service it names.
    let service = find(&docs, "Service", "keyward");
    assert_eq!(service["metadata"]["namespace"], "keyward-system");
    assert_eq!(
        find(&docs, "MutatingWebhookConfiguration", "keyward")["webhooks"][0]["clientConfig"]["caBundle"],
        Value::Null
    );
}

#[test]
fn the_openshift_install_runs_under_restricted_v2_and_takes_its_certificate_from_the_service_ca() {
    let docs = render("openshift");
    // restricted-v2 assigns UIDs, GIDs and the fsGroup from the namespace's ranges and refuses
    // fixed ones: none anywhere.
    fn fixed_ids(v: &Value, path: &str, found: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    if ["runAsUser", "runAsGroup", "fsGroup", "supplementalGroups"].contains(&k.as_str()) {
                        found.push(format!("{path}.{k}"));
                    }
                    fixed_ids(v, &format!("{path}.{k}"), found);
                }
            }
            Value::Array(a) => a.iter().enumerate().for_each(|(i, v)| fixed_ids(v, &format!("{path}[{i}]"), found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    for d in &docs {
        fixed_ids(
            d,
            &format!("{}/{}", d["kind"].as_str().unwrap(), d["metadata"]["name"].as_str().unwrap()),
            &mut found,
        );
    }
    assert!(found.is_empty(), "{found:?}");
    for deployment in ["keyward", "keyward-controller"] {
        let pod = &find(&docs, "Deployment", deployment)["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{deployment}");
        assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "{deployment}");
    }
    // The service CA operator: the Secret the webhook mounts, and caBundle.
    let service = find(&docs, "Service", "keyward");
    let secret =
        service["metadata"]["annotations"]["service.beta.openshift.io/serving-cert-secret-name"].as_str().unwrap();
    let webhook = &find(&docs, "Deployment", "keyward")["spec"]["template"]["spec"];
    let tls = webhook["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "tls").unwrap();
    assert_eq!(tls["secret"]["secretName"], secret);
    let config = find(&docs, "MutatingWebhookConfiguration", "keyward");
    assert_eq!(config["metadata"]["annotations"], json!({"service.beta.openshift.io/inject-cabundle": "true"}));
    // No cert-manager; the client CA is the controller's.
    assert!(docs.iter().all(|d| !d["apiVersion"].as_str().unwrap().starts_with("cert-manager.io")));
    let controller = &find(&docs, "Deployment", "keyward-controller")["spec"]["template"]["spec"];
    let args = controller["containers"][0]["args"].as_array().unwrap();
    assert!(args.contains(&json!("--client-ca=self-managed")) && !args.contains(&json!("--serving-cert=self-managed")));
    let role = find(&docs, "Role", "keyward-controller-client-ca");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["keyward-client-ca"], "verbs": ["get", "list", "watch", "update"]}])
    );
}

#[test]
fn every_metric_an_alert_uses_is_one_keyward_exports() {
    // The names registered in the two registries (prefix keyward_ and keyward_controller_), as
    // the text format exposes them (counters with _total, histograms with _bucket).
    let mut exported = std::collections::BTreeSet::new();
    for (file, prefix) in [
        ("src/metrics.rs", "keyward_"),
        ("src/gate/metrics.rs", "keyward_"),
        ("controller/src/metrics.rs", "keyward_controller_"),
    ] {
        let source = std::fs::read_to_string(format!("{}/{file}", root())).unwrap();
        for part in source.split("register(").skip(1) {
            let name = part.trim_start().trim_start_matches('"').split('"').next().unwrap();
            for suffix in ["", "_total", "_bucket", "_sum", "_count"] {
                exported.insert(format!("{prefix}{name}{suffix}"));
            }
        }
    }
    let rules = std::fs::read_to_string(format!("{}/deploy/components/monitoring/rules.yaml", root())).unwrap();
    let rules = &keyward_engine::yaml::documents(&rules).unwrap()[0].value;
    let mut used = Vec::new();
    for rule in rules["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let expr = rule["expr"].as_str().unwrap();
        let mut rest = expr;
        while let Some(at) = rest.find("keyward_") {
            let name: String =
                rest[at..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit()).collect();
            used.push((rule["alert"].as_str().unwrap().to_string(), name.clone()));
            rest = &rest[at + name.len()..];
        }
    }
    assert!(used.len() >= 8, "{used:?}");
    let unknown: Vec<_> = used.iter().filter(|(_, m)| !exported.contains(m)).collect();
    assert!(unknown.is_empty(), "alerts on metrics keyward does not export: {unknown:?}");
}

// === the admission policy that keeps keyward's attestation keyward's ===

#[test]
fn no_pod_gets_keywards_attestation_except_through_its_webhook() {
    let docs = render("cert-manager");
    let policy = find(&docs, "ValidatingAdmissionPolicy", "keyward-attestation");
    let binding = find(&docs, "ValidatingAdmissionPolicyBinding", "keyward-attestation");
    assert_eq!(binding["spec"], json!({"policyName": "keyward-attestation", "validationActions": ["Deny"]}));
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"],
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods", "pods/status"]}])
    );
    let ns = |name: &str, opted_in: bool| {
        let mut labels = json!({"kubernetes.io/metadata.name": name});
        if opted_in {
            labels["keyward.io/inject"] = json!("enabled");
        }
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    };
    let pod = |annotations: Value, labels: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a", "labels": labels, "annotations": annotations}, "spec": {"containers": [{"name": "c", "image": "x"}]}});
    let attested = json!({"keyward.io/attestation": "v2.abc", "other": "x"});
    let app = json!({"app": "x"});
    let team_a = ns("team-a", true);
    let admits = |op: &str, object: &Value, old: &Value, namespace: &Value| {
        support::policy_admits(policy, op, object, old, namespace)
    };

    // CREATE: where the webhook sees the pod (and removes any attestation it did not write).
    assert_eq!(admits("CREATE", &pod(attested.clone(), app.clone()), &Value::Null, &team_a), Ok(()));
    // Where it does not: refused, saying why.
    let refusal = "keyward.io/attestation is written only by keyward's webhook, which does not see pods in this namespace or pods labelled keyward.io/inject=disabled: remove the annotation";
    let opted_out = pod(attested.clone(), json!({"app": "x", "keyward.io/inject": "disabled"}));
    assert_eq!(admits("CREATE", &opted_out, &Value::Null, &team_a), Err(refusal.into()));
    for namespace in [ns("team-b", false), ns("kube-system", true), ns("keyward-system", true)] {
        assert_eq!(
            admits("CREATE", &pod(attested.clone(), app.clone()), &Value::Null, &namespace),
            Err(refusal.into()),
            "{namespace}"
        );
    }
    // A pod without one is none of the policy's business, anywhere.
    assert_eq!(
        admits(
            "CREATE",
            &pod(json!({"a": "b"}), json!({"keyward.io/inject": "disabled"})),
            &Value::Null,
            &ns("team-b", false)
        ),
        Ok(())
    );
    assert_eq!(admits("CREATE", &json!({"metadata": {"name": "bare"}}), &Value::Null, &ns("team-b", false)), Ok(()));

    // UPDATE (pods or pods/status): added or changed, refused; kept or removed, admitted.
    let updated = "keyward.io/attestation is written only by keyward's webhook when a pod is created: it may not be added or changed afterwards (removing it is allowed)";
    let plain = pod(json!({"other": "x"}), app.clone());
    assert_eq!(admits("UPDATE", &pod(attested.clone(), app.clone()), &plain, &team_a), Err(updated.into()));
    assert_eq!(
        admits("UPDATE", &pod(attested.clone(), app.clone()), &json!({"metadata": {"name": "p"}}), &team_a),
        Err(updated.into())
    );
    let other = pod(json!({"keyward.io/attestation": "v2.copied"}), app.clone());
    assert_eq!(admits("UPDATE", &other, &pod(attested.clone(), app.clone()), &team_a), Err(updated.into()));
    let relabelled = pod(attested.clone(), json!({"app": "x", "team": "blue"}));
    assert_eq!(admits("UPDATE", &relabelled, &pod(attested.clone(), app.clone()), &team_a), Ok(()));
    assert_eq!(admits("UPDATE", &plain, &pod(attested, app), &team_a), Ok(()));
}

#[test]
fn the_policy_mirrors_the_webhooks_scope_and_is_cluster_scoped_in_every_install() {
    let docs = render("cert-manager");
    let webhook = &find(&docs, "MutatingWebhookConfiguration", "keyward")["webhooks"][0];
    // The namespaces and the pod label the webhook skips are those the policy names.
    assert_eq!(
        webhook["namespaceSelector"]["matchExpressions"],
        json!([{"key": "keyward.io/inject", "operator": "In", "values": ["enabled"]},
               {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "keyward-system"]}])
    );
    assert_eq!(
        webhook["objectSelector"]["matchExpressions"],
        json!([{"key": "keyward.io/inject", "operator": "NotIn", "values": ["disabled"]}])
    );
    let create_rule = find(&docs, "ValidatingAdmissionPolicy", "keyward-attestation")["spec"]["validations"][1]
        ["expression"]
        .as_str()
        .unwrap()
        .to_string();
    for part in [
        "namespaceObject.metadata.labels['keyward.io/inject'] == 'enabled'",
        "['kube-system', 'keyward-system']",
        "object.metadata.labels['keyward.io/inject'] == 'disabled'",
    ] {
        assert!(create_rule.contains(part), "{part} not in {create_rule}");
    }
    // Cluster-scoped objects carry no namespace, in every overlay (kustomize would give the
    // policy one, and the apiserver would drop it, but a GitOps diff would not).
    let cluster_scoped = [
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "PriorityClass",
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    for overlay in overlays() {
        let docs = render(&overlay);
        assert_eq!(docs.iter().filter(|d| d["kind"] == "ValidatingAdmissionPolicy").count(), 1, "{overlay}");
        for d in docs.iter().filter(|d| cluster_scoped.contains(&d["kind"].as_str().unwrap_or_default())) {
            assert!(
                d["metadata"]["namespace"].is_null(),
                "{overlay}: {} {} has a namespace",
                d["kind"],
                d["metadata"]["name"]
            );
        }
    }
}

/// `kubectl kustomize` of a kustomization of one's own (`fields` beside its `apiVersion` and
/// `kind`), with paths relative to the repository's root, as a user's overlay would be.
fn render_own(fields: Value) -> Vec<Value> {
    // kustomize takes only relative paths inside its root: a directory two levels down.
    let parent = format!("{}/target/deploy-tests", root());
    std::fs::create_dir_all(&parent).unwrap();
    let dir = tempfile::tempdir_in(&parent).unwrap();
    let mut kustomization = json!({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"});
    for (key, value) in fields.as_object().unwrap() {
        let value = match value {
            Value::Array(paths) if key != "images" => {
                Value::Array(paths.iter().map(|p| json!(format!("../../../{}", p.as_str().unwrap()))).collect())
            }
            other => other.clone(),
        };
        kustomization[key] = value;
    }
    std::fs::write(dir.path().join("kustomization.yaml"), kustomization.to_string()).unwrap();
    let out = support::tool("kubectl").arg("kustomize").arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    keyward_engine::yaml::documents(&text).unwrap().into_iter().map(|d| d.value).collect()
}

#[test]
fn account_provisioning_is_an_opt_in_component_with_the_flag_and_its_rights() {
    let plain = render("cert-manager");
    let docs = render_own(json!({"resources": ["deploy/overlays/cert-manager"],
        "components": ["deploy/components/account-provisioning"]}));
    let args = &find(&docs, "Deployment", "keyward-controller")["spec"]["template"]["spec"]["containers"][0]["args"];
    assert_eq!(args.as_array().unwrap().last().unwrap(), "--provision-accounts");
    let role = find(&docs, "ClusterRole", "keyward-controller-accounts");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "list", "watch", "create", "update", "delete"]},
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"], "verbs": ["get", "list", "watch", "create", "update", "delete"]}
        ])
    );
    assert_eq!(
        find(&docs, "ClusterRoleBinding", "keyward-controller-accounts")["subjects"],
        json!([{"kind": "ServiceAccount", "name": "keyward-controller", "namespace": "keyward-system"}])
    );
    // Nothing else changes.
    assert_eq!(docs.len(), plain.len() + 2);
    for doc in &plain {
        if doc["kind"] != "Deployment" || doc["metadata"]["name"] != "keyward-controller" {
            assert!(docs.contains(doc), "{}", doc["metadata"]["name"]);
        }
    }
}

#[test]
fn a_missing_tool_is_named_in_one_line() {
    let failure = std::panic::catch_unwind(|| support::require("keyward-no-such-tool")).unwrap_err();
    assert_eq!(
        failure.downcast_ref::<String>().unwrap(),
        "this test needs keyward-no-such-tool: `keyward-no-such-tool` is not on the PATH (README, \"Prerequisites\")"
    );
}

/// The audit CronJob is a component, so an install's `images:` reaches it as it reaches the
/// Deployments; and it names no UID, which OpenShift's restricted-v2 would refuse.
#[test]
fn the_audit_runs_the_installs_image_and_any_uid() {
    // An overlay of one's own with a local build's image, as deploy/overlays/local has.
    let local = render_own(json!({"resources": ["deploy/overlays/cert-manager"],
        "components": ["deploy/components/audit"],
        "images": [{"name": "ghcr.io/keyward/keyward", "newName": "keyward", "newTag": "dev"}]}));
    let deployment = find(&local, "Deployment", "keyward");
    assert_eq!(deployment["spec"]["template"]["spec"]["containers"][0]["image"], "keyward:dev");
    let cronjob = find(&local, "CronJob", "keyward-audit");
    let pod = &cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["image"], "keyward:dev");
    assert_eq!(pod["securityContext"], json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}));
    assert_eq!(pod["containers"][0]["securityContext"]["runAsUser"], Value::Null);
    // Exactly as docs/audit-and-explain.md composes it: an install whose overlay maps the image
    // (deploy/overlays/local), the component beside it. The objects keep their namespace (the
    // binding names keyward-system) and the CronJob runs the overlay's image.
    let composed =
        render_own(json!({"resources": ["deploy/overlays/local"], "components": ["deploy/components/audit"]}));
    let cronjob = find(&composed, "CronJob", "keyward-audit");
    assert_eq!(cronjob["metadata"]["namespace"], "keyward-system");
    assert_eq!(find(&composed, "ServiceAccount", "keyward-audit")["metadata"]["namespace"], "keyward-system");
    assert_eq!(
        find(&composed, "ClusterRoleBinding", "keyward-audit")["subjects"],
        json!([{"kind": "ServiceAccount", "name": "keyward-audit", "namespace": "keyward-system"}])
    );
    assert_eq!(
        cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"],
        find(&composed, "Deployment", "keyward")["spec"]["template"]["spec"]["containers"][0]["image"]
    );
    assert_eq!(cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"], "keyward:dev");
    let docs = std::fs::read_to_string(format!("{}/docs/audit-and-explain.md", root())).unwrap();
    assert!(
        docs.contains("resources:\n  - ../local\ncomponents:\n  - ../../components/audit\n"),
        "the docs compose it otherwise"
    );
    // On its own beside an install: the release placeholder, like the installs.
    let out = support::tool("kubectl").args(["kustomize", &format!("{}/deploy/audit", root())]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let alone: Vec<Value> = keyward_engine::yaml::documents(&text).unwrap().into_iter().map(|d| d.value).collect();
    let image = &find(&alone, "CronJob", "keyward-audit")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        ["containers"][0]["image"];
    assert_eq!(image, "ghcr.io/keyward/keyward:unreleased");
    assert_eq!(find(&alone, "CronJob", "keyward-audit")["metadata"]["namespace"], "keyward-system");
    // issue 58: which is no release's image, so nothing calls it one.
    let kustomization = std::fs::read_to_string(format!("{}/deploy/audit/kustomization.yaml", root())).unwrap();
    for (file, text) in [("deploy/audit/kustomization.yaml", &kustomization), ("docs/audit-and-explain.md", &docs)] {
        let text = text.replace("\n# ", " ").replace('\n', " ");
        assert!(!text.contains("(the release's image)") && !text.contains("with the release's image"), "{file}");
        assert!(text.contains("ghcr.io/keyward/keyward:unreleased"), "{file} names the placeholder it renders");
    }
}

/// Every alert's `runbook` names its section of docs/operations.md, which exists.
#[test]
fn every_alert_has_its_runbook_in_the_operations_page() {
    let rules = std::fs::read_to_string(format!("{}/deploy/components/monitoring/rules.yaml", root())).unwrap();
    let rules = &keyward_engine::yaml::documents(&rules).unwrap()[0].value;
    let runbooks = std::fs::read_to_string(format!("{}/docs/operations.md", root())).unwrap();
    let alerts = rules["spec"]["groups"][0]["rules"].as_array().unwrap();
    assert!(alerts.len() >= 14);
    for rule in alerts {
        let name = rule["alert"].as_str().unwrap();
        assert_eq!(rule["annotations"]["runbook"], format!("docs/operations.md#{}", name.to_lowercase()), "{name}");
        assert!(runbooks.contains(&format!("\n### {name}\n")), "no runbook in docs/operations.md for {name}");
    }
}

fn render_dir(dir: &str) -> Vec<Value> {
    let out = support::tool("kubectl").args(["kustomize", &format!("{}/{dir}", root())]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    keyward_engine::yaml::documents(&text).unwrap().into_iter().map(|d| d.value).collect()
}

/// The lmeval recipe's certificates fit together as fms-lm-eval-service's driver uses them
/// (backend/driver/driver.go @ 38689a3, l.137, 161-167): it dials the Service as
/// `<service>.<namespace>.svc:<port>` and verifies that name, port included, against the CA
/// keyward's lmeval profile gives it. The gate serves a certificate with exactly that name, and
/// the profile's CA is what signs it (a self-signed certificate's ca.crt is itself).
/// tests/interop.rs runs the driver's Go client against such a certificate.
#[test]
fn the_lmeval_gate_serves_the_name_the_driver_dials_signed_by_the_ca_the_profile_injects() {
    let docs = render_dir("deploy/gate/example");
    let service = docs.iter().find(|d| d["kind"] == "Service" && d["spec"]["ports"][0]["targetPort"] == 8444).unwrap();
    let dialled = format!(
        "{}.{}.svc:{}",
        service["metadata"]["name"].as_str().unwrap(),
        service["metadata"]["namespace"].as_str().unwrap(),
        service["spec"]["ports"][0]["port"]
    );
    assert_eq!(dialled, "lm-eval-grpc.lm-eval.svc:8082", "the operator's Service, as fms's config/default names it");
    let deployment = find(&docs, "Deployment", "lm-eval-controller-manager");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
    let tls = volumes.iter().find(|v| v["name"] == "keyward-gate-tls").unwrap();
    let secret = tls["secret"]["secretName"].as_str().unwrap();
    let certificate = docs.iter().find(|d| d["kind"] == "Certificate" && d["spec"]["secretName"] == secret).unwrap();
    assert_eq!(certificate["spec"]["dnsNames"][0], dialled.as_str());
    let issuer = find(&docs, "Issuer", certificate["spec"]["issuerRef"]["name"].as_str().unwrap());
    assert_eq!(issuer["spec"], json!({"selfSigned": {}}), "so that the Secret's ca.crt is the certificate itself");

    let profile: Value = keyward_engine::yaml::documents(
        &std::fs::read_to_string(format!("{}/webhooks/profiles/lmeval.yaml", root())).unwrap(),
    )
    .unwrap()
    .remove(0)
    .value;
    assert_eq!(
        profile["spec"]["inject"]["serverCA"]["source"]["secret"],
        json!({"namespace": certificate["metadata"]["namespace"], "name": secret, "key": "ca.crt"})
    );
    let account = deployment["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap();
    assert_eq!(profile["spec"]["requesters"]["usernames"], json!([format!("system:serviceaccount:*:{account}")]));
}

/// The inference-graph recipe as it runs (gate/recipes/inference-graph.yaml): a Deployment of
/// its own, the router's Service over TLS verified with the service CA, its own account bound
/// to system:auth-delegator, and the router's pods open to the gate alone; every name the same
/// graph's.
#[test]
fn the_inference_graph_gate_fronts_the_routers_service_with_its_own_account() {
    let docs = render_dir("deploy/gate/inference-graph");
    let recipe = std::fs::read_to_string(format!("{}/gate/recipes/inference-graph.yaml", root())).unwrap();
    let config_map = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    assert!(
        config_map["data"]["gate.yaml"] == recipe.as_str(),
        "deploy/gate/inference-graph/gate.yaml differs from gate/recipes/inference-graph.yaml: copy the recipe"
    );
    let gate: Value = keyward_engine::yaml::documents(&recipe).unwrap().remove(0).value;
    let review = &gate["spec"]["rules"][0]["subjectAccessReview"];
    let (graph, namespace) = (review["name"].as_str().unwrap(), review["namespace"].as_str().unwrap());
    let deployment = find(&docs, "Deployment", &format!("{graph}-gate"));
    assert_eq!(deployment["metadata"]["namespace"], namespace);
    // Scraped by the monitoring component's PodMonitor, its metrics port open to scrapers only.
    assert_eq!(deployment["spec"]["template"]["metadata"]["labels"]["keyward.io/gate"], "deployment");
    let own = find(&docs, "NetworkPolicy", &format!("{graph}-gate"));
    assert_eq!(
        own["spec"]["ingress"][1],
        json!({"from": [{"namespaceSelector": {"matchLabels": {"keyward.io/metrics-scraper": "true"}}}],
               "ports": [{"port": "gate-metrics", "protocol": "TCP"}]})
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let args: Vec<&str> =
        pod["containers"][0]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    // ODH's router Service: <graph>, port 443, its certificate <graph>-serving-cert for
    // <graph>.<namespace>.svc (opendatahub-io/kserve 3cf0a04, raw_ig.go l.219-222).
    assert!(args.contains(&format!("--upstream=https://{graph}.{namespace}.svc:443").as_str()), "{args:?}");
    assert!(args.contains(&"--upstream-ca=/etc/keyward/upstream-ca/service-ca.crt"), "{args:?}");
    assert!(!args.iter().any(|a| a.starts_with("--client-ca")), "the recipe admits tokens only");
    let upstream_ca = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "upstream-ca").unwrap();
    assert_eq!(upstream_ca["configMap"]["name"], "openshift-service-ca.crt");
    let account = pod["serviceAccountName"].as_str().unwrap();
    let binding = docs.iter().find(|d| d["kind"] == "ClusterRoleBinding").unwrap();
    assert_eq!(binding["roleRef"]["name"], "system:auth-delegator");
    assert_eq!(binding["subjects"], json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}]));
    let security = &pod["containers"][0]["securityContext"];
    assert!(
        security.get("runAsUser").is_none() && pod["securityContext"].get("runAsUser").is_none(),
        "OpenShift's restricted-v2 assigns the user"
    );
    let policy = find(&docs, "NetworkPolicy", &format!("{graph}-through-the-gate"));
    assert_eq!(policy["spec"]["podSelector"]["matchLabels"], json!({"serving.kserve.io/inferencegraph": graph}));
    assert_eq!(
        policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    // The binary takes the container's arguments: it gets as far as reading the gate file.
    let out = Command::new(env!("CARGO_BIN_EXE_keyward")).args(&args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot read /etc/keyward/gate/gate.yaml"), "{stderr}");
}

#[test]
fn the_gate_sidecar_runs_the_recipe_restricted_behind_its_own_port_only() {
    let docs = render_dir("deploy/gate/example");
    let deployment = find(&docs, "Deployment", "lm-eval-controller-manager");
    let pod = &deployment["spec"]["template"]["spec"];
    let names = |list: &Value| -> Vec<String> {
        list.as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().to_string()).collect()
    };
    // A native sidecar: started (its startup probe) before the operator, which stays
    // containers/0; its startup asks only that it serves, its readiness that it is ready (issue
    // 58: a startup probe on /readyz kept the operator from starting while the gate waited for
    // its client CA, and restarted the gate in a loop).
    assert_eq!(names(&pod["containers"]), ["operator"]);
    assert_eq!(names(&pod["initContainers"]), ["keyward-gate"]);
    let gate = &pod["initContainers"][0];
    assert_eq!(gate["restartPolicy"], "Always");
    assert_eq!(gate["startupProbe"]["httpGet"], json!({"path": "/healthz", "port": "gate-metrics"}));
    assert_eq!(gate["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "gate-metrics"}));
    assert_eq!(deployment["spec"]["template"]["metadata"]["labels"]["keyward.io/gate"], "sidecar");
    let security = &gate["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    // No fixed IDs in what the component adds (OpenShift's restricted-v2 assigns them); the key
    // is read through the pod's fsGroup, which the example's stand-in sets.
    let component = std::fs::read_to_string(format!("{}/deploy/gate/sidecar/sidecar.yaml", root())).unwrap();
    for field in ["runAsUser", "runAsGroup", "fsGroup", "supplementalGroups"] {
        assert!(!component.contains(&format!("{field}:")), "the sidecar component sets {field}");
    }
    assert_eq!(pod["securityContext"]["fsGroup"], 65532);
    let volume = |name: &str| pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == name).unwrap().clone();
    assert_eq!(volume("keyward-gate-tls")["secret"]["defaultMode"], 0o440);
    // The client CA is published only where the controller is told to: optional, and the gate
    // waits for it only if its gate file admits workloads (src/gate/tests.rs).
    assert_eq!(volume("keyward-client-ca")["configMap"], json!({"name": "keyward-client-ca", "optional": true}));

    // The gate file the ConfigMap holds is the recipe, and the upstream is on loopback.
    let config_map = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let recipe = std::fs::read_to_string(format!("{}/gate/recipes/lmeval-status.yaml", root())).unwrap();
    assert!(
        config_map["data"]["gate.yaml"] == recipe.as_str(),
        "deploy/gate/example/gate.yaml differs from gate/recipes/lmeval-status.yaml: copy the recipe"
    );
    assert_eq!(config_map["data"]["upstream"], "http://127.0.0.1:8082");
    let upstream_ref = &gate["env"][0]["valueFrom"]["configMapKeyRef"];
    assert_eq!((&upstream_ref["name"], &upstream_ref["key"]), (&config_map["metadata"]["name"], &json!("upstream")));

    // The ports the binary listens on by default are the ones named, and the Service and the
    // NetworkPolicy lead only to them.
    let ports: Vec<(&str, u64)> = gate["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["containerPort"].as_u64().unwrap()))
        .collect();
    assert_eq!(ports, [("gate", 8444), ("gate-metrics", 9091)]);
    let help = Command::new(env!("CARGO_BIN_EXE_keyward")).args(["gate", "--help"]).output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(help.contains("[default: [::]:8444]") && help.contains("[default: [::]:9091]"), "{help}");
    assert_eq!(find(&docs, "Service", "lm-eval-grpc")["spec"]["ports"][0]["targetPort"], 8444);
    let policy = find(&docs, "NetworkPolicy", "lm-eval-controller-manager-through-the-gate");
    assert_eq!(
        policy["spec"]["ingress"],
        json!([
            {"ports": [{"port": 8444, "protocol": "TCP"}]},
            {"from": [{"namespaceSelector": {"matchLabels": {"keyward.io/metrics-scraper": "true"}}}],
             "ports": [{"port": 9091, "protocol": "TCP"}]}
        ])
    );
    // The monitoring component scrapes it by the label the sidecar puts on the pod.
    let monitors = render_own(json!({"resources": ["deploy/overlays/cert-manager"],
        "components": ["deploy/components/monitoring"]}));
    let monitor = find(&monitors, "PodMonitor", "keyward-gate");
    assert_eq!(
        monitor["spec"]["selector"],
        json!({"matchExpressions": [{"key": "keyward.io/gate", "operator": "Exists"}]})
    );
    assert_eq!(monitor["spec"]["podMetricsEndpoints"][0]["port"], "gate-metrics");

    // The binary takes the container's arguments: it gets as far as reading the gate file.
    let mut args: Vec<String> =
        gate["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
    args.push("--upstream=http://127.0.0.1:8082".into());
    let out = Command::new(env!("CARGO_BIN_EXE_keyward")).args(&args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("cannot read /etc/keyward/gate/gate.yaml"), "{stderr}");
}

/// The release workflow holds `packages: write` and `id-token: write`: every action it runs is
/// pinned by commit (a tag can be moved under it), with the version beside it for people and
/// Dependabot's config to propose the next; the image's SBOM can list the crates (the binary is
/// built with cargo-auditable) and arm64 is cross-compiled (no QEMU).
#[test]
fn the_release_pins_its_actions_and_ships_an_sbom_of_the_crates() {
    let workflow = std::fs::read_to_string(format!("{}/.github/workflows/release.yml", root())).unwrap();
    let mut pinned = 0;
    for line in workflow.lines().filter(|l| l.trim_start().trim_start_matches("- ").starts_with("uses:")) {
        let reference = line.split("uses:").nth(1).unwrap().trim();
        let (action, rest) = reference.split_once('@').unwrap();
        let (sha, comment) = rest.split_once(" # v").unwrap_or((rest, ""));
        assert!(
            sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
            "{action} is not pinned by commit: {line}"
        );
        assert!(!comment.is_empty(), "{action}: say which version the SHA is (`# vX.Y.Z`)");
        pinned += 1;
    }
    assert!(pinned >= 5, "{pinned}");
    assert!(!workflow.contains("setup-qemu-action"), "arm64 is cross-compiled");
    let dependabot = std::fs::read_to_string(format!("{}/.github/dependabot.yml", root())).unwrap();
    assert!(dependabot.contains("package-ecosystem: github-actions"));
    assert!(workflow.contains("sbom: true"));
    let dockerfile = std::fs::read_to_string(format!("{}/Dockerfile", root())).unwrap();
    assert!(dockerfile.contains("FROM --platform=$BUILDPLATFORM rust:"), "the build stage runs on the build host");
    assert!(dockerfile.contains("cargo auditable build --profile dist --locked --bin keyward --target"));
    // The private-package stop comes before the release is published.
    let visibility = workflow.find("The image can be pulled without credentials").unwrap();
    assert!(visibility < workflow.find("gh release create").unwrap());

    // issue 58: nothing is built, pushed or signed before the tagged commit passes .ci/run,
    // whatever the tag (a suffixed one is a pre-release).
    let jobs = keyward_engine::yaml::documents(&workflow).unwrap().remove(0).value["jobs"].clone();
    assert_eq!(jobs["release"]["needs"], "test");
    let test_steps: Vec<String> = jobs["test"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["run"].as_str().map(str::to_string))
        .collect();
    assert_eq!(test_steps.last().map(String::as_str), Some("bash .ci/run"));
    assert!(workflow.contains("gh release create \"$GITHUB_REF_NAME\" dist/* --verify-tag \"${prerelease[@]}\""));
    assert!(workflow.contains("if [[ \"$GITHUB_REF_NAME\" == *-* ]]; then\n            prerelease=(--prerelease)"));
    // The index and every platform's image are signed.
    assert!(workflow.contains("cosign sign --yes --recursive \"${IMAGE}@${DIGEST}\""), "sign recursively");
    // The installs are rendered as CI renders them: its kubectl (so its kustomize), its PyYAML.
    let pyyaml = std::fs::read_to_string(format!("{}/deploy/requirements.txt", root())).unwrap();
    let pyyaml = pyyaml.lines().find(|l| l.starts_with("PyYAML")).unwrap();
    assert!(pyyaml.starts_with("PyYAML=="), "CI pins PyYAML: {pyyaml}");
    assert!(workflow.contains(&format!("pip install --quiet {pyyaml}\n")), "the release installs CI's {pyyaml}");
    let installer = std::fs::read_to_string(format!("{}/scripts/install-kubectl.sh", root())).unwrap();
    let pinned = installer.lines().find_map(|l| l.strip_prefix("version=")).unwrap().split(' ').next().unwrap();
    let ours = support::tool("kubectl").args(["version", "--client"]).output().unwrap();
    let ours = String::from_utf8(ours.stdout).unwrap();
    let minor = |v: &str| v.trim_start_matches('v').split('.').take(2).collect::<Vec<_>>().join(".");
    let ours_version = ours.lines().find_map(|l| l.strip_prefix("Client Version: ")).unwrap();
    assert_eq!(minor(pinned), minor(ours_version), "the release's kubectl is CI's: {ours}");
    assert!(workflow.contains("scripts/install-kubectl.sh \"$RUNNER_TEMP/bin\""));
    assert!(workflow.contains("scripts/install-kubectl.sh /usr/local/bin"));
}

/// issue 58: the sidecar component's image `keyward` pulls nothing until an install maps it,
/// and a native sidecar that cannot be pulled keeps the whole pod from starting; the docs say
/// how to map it, by digest, and the examples map it.
#[test]
fn the_sidecar_components_image_is_mapped_by_every_example_and_the_docs_say_how() {
    let sidecar = std::fs::read_to_string(format!("{}/deploy/gate/sidecar/sidecar.yaml", root())).unwrap();
    assert!(sidecar.contains("          image: keyward\n"), "the name the docs tell people to map");
    for dir in ["deploy/gate/example", "deploy/e2e/gate"] {
        let docs = render_dir(dir);
        for d in docs.iter().filter(|d| d["kind"] == "Deployment") {
            for c in d["spec"]["template"]["spec"]["initContainers"].as_array().into_iter().flatten() {
                assert_ne!(c["image"], "keyward", "{dir}: the sidecar's image is not mapped");
            }
        }
    }
    let guide = std::fs::read_to_string(format!("{}/docs/gate.md", root())).unwrap();
    let section = &guide[guide.find("## As a sidecar").unwrap()..];
    assert!(
        section.contains("images:\n    - name: keyward\n      newName: ghcr.io/<owner>/keyward\n      digest: sha256:"),
        "docs/gate.md says how to map the sidecar's image"
    );
}

/// issue 58: OpenShift's user-workload monitoring ignores a PodMonitor's namespaceSelector and
/// kube-prometheus lists pods only where its RBAC says, so the cluster-wide gate PodMonitor sees
/// nothing there. deploy/gate/monitoring scrapes a namespace's gates from that namespace, as the
/// same job, by a port their sidecar declares.
#[test]
fn a_gates_own_namespace_can_scrape_it_with_the_same_job_as_the_cluster_wide_monitor() {
    // As an overlay of the operator's adds it, in the operator's namespace.
    let docs = render_own(json!({"namespace": "lm-eval", "resources": ["deploy/gate/example"],
        "components": ["deploy/gate/monitoring"]}));
    let monitor = find(&docs, "PodMonitor", "keyward-gate");
    assert_eq!(monitor["metadata"]["namespace"], "lm-eval", "beside the gate");
    assert_eq!(monitor["spec"]["namespaceSelector"], Value::Null, "its own namespace only");
    let pod = &find(&docs, "Deployment", "lm-eval-controller-manager")["spec"]["template"];
    assert!(pod["metadata"]["labels"]["keyward.io/gate"].is_string(), "selected by keyward.io/gate");
    assert_eq!(
        monitor["spec"]["selector"],
        json!({"matchExpressions": [{"key": "keyward.io/gate", "operator": "Exists"}]})
    );
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    let sidecar =
        pod["spec"]["initContainers"].as_array().unwrap().iter().find(|c| c["name"] == "keyward-gate").unwrap();
    let port = sidecar["ports"].as_array().unwrap().iter().find(|p| p["name"] == endpoint["port"]).unwrap();
    assert_eq!(port["containerPort"], 9091, "the gate's metrics port");
    // The cluster-wide one, as the alerts know it: same endpoint, same job.
    let monitors = render_own(json!({"resources": ["deploy/overlays/cert-manager"],
        "components": ["deploy/components/monitoring"]}));
    let cluster_wide = find(&monitors, "PodMonitor", "keyward-gate");
    assert_eq!(cluster_wide["spec"]["podMetricsEndpoints"], monitor["spec"]["podMetricsEndpoints"]);
    let rules = std::fs::read_to_string(format!("{}/deploy/components/monitoring/rules.yaml", root())).unwrap();
    assert!(rules.contains("up{job=\"keyward-gate\"}"), "the alerts name the job both set");
}

/// A native sidecar's named ports are resolved for a Service only from Kubernetes 1.33
/// (kubernetes PR #128850, issue #127958), and not by every CNI for a NetworkPolicy: on the
/// 1.30–1.32 clusters the docs claim, a Service whose targetPort names the gate's port has no
/// endpoint. No gate install names a port that only an init container declares.
#[test]
fn no_gate_install_reaches_a_native_sidecar_by_a_port_name() {
    for dir in ["deploy/gate/example", "deploy/gate/inference-graph", "deploy/gate/evalhub", "deploy/e2e/gate"] {
        let docs = render_dir(dir);
        let init_port_names: Vec<String> = docs
            .iter()
            .filter(|d| d["kind"] == "Deployment")
            .flat_map(|d| d["spec"]["template"]["spec"]["initContainers"].as_array().cloned().unwrap_or_default())
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["name"].as_str().map(str::to_string))
            .collect();
        for doc in &docs {
            let named: Vec<&Value> = match doc["kind"].as_str() {
                Some("Service") => doc["spec"]["ports"].as_array().unwrap().iter().map(|p| &p["targetPort"]).collect(),
                Some("NetworkPolicy") => doc["spec"]["ingress"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|rule| rule["ports"].as_array().unwrap().iter().map(|p| &p["port"]))
                    .collect(),
                _ => continue,
            };
            for port in named.into_iter().filter_map(Value::as_str) {
                assert!(
                    !init_port_names.iter().any(|n| n == port),
                    "{dir}: {} {} reaches the native sidecar's port {port:?} by name",
                    doc["kind"],
                    doc["metadata"]["name"]
                );
            }
        }
    }
}

/// issue 58: the inference-graph gate file told people to give `--upstream-ca
/// /etc/keyward-gate/...`, where its Deployment mounts nothing. Every path under `/etc/keyward`
/// that a gate install names (in its arguments or in the words beside them) is under a
/// directory one of its files mounts.
#[test]
fn every_path_a_gate_install_names_is_mounted_there() {
    let mut checked = 0;
    for dir in std::fs::read_dir(format!("{}/deploy/gate", root())).unwrap() {
        let dir = dir.unwrap().path();
        let texts: Vec<(String, String)> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|f| f.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .map(|p| (p.display().to_string(), std::fs::read_to_string(&p).unwrap()))
            .collect();
        let mounts: Vec<&str> = texts
            .iter()
            .flat_map(|(_, t)| t.lines())
            .filter_map(|l| l.trim().strip_prefix("mountPath:").map(str::trim))
            .collect();
        for (file, text) in &texts {
            for line in text.lines().filter(|l| !l.trim().starts_with("mountPath:")) {
                for (at, _) in line.match_indices("/etc/keyward") {
                    let path: String = line[at..]
                        .chars()
                        .take_while(|c| !c.is_whitespace() && !matches!(c, '"' | '\'' | ',' | ')'))
                        .collect();
                    checked += 1;
                    assert!(
                        mounts.iter().any(|m| path == *m || path.starts_with(&format!("{m}/"))),
                        "{file}: {path} is not under any mountPath of {} ({mounts:?})",
                        dir.display()
                    );
                }
            }
        }
    }
    assert!(checked >= 4, "only {checked} paths found");
}

/// The evalhub-status recipe as it runs (deploy/gate/evalhub): the gate file is the recipe, in
/// the ConfigMap the profile names, in EvalHub's namespace; the pod's account may watch pods;
/// and the profile places the gate on the port, certificate and CA the operator's pod has
/// (webhooks/tests/placement.rs runs it on that pod).
#[test]
fn the_evalhub_gate_is_the_recipe_in_the_configmap_its_profile_names() {
    let docs = render_dir("deploy/gate/evalhub");
    let recipe = std::fs::read_to_string(format!("{}/gate/recipes/evalhub-status.yaml", root())).unwrap();
    let config_map = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    assert!(
        config_map["data"]["gate.yaml"] == recipe.as_str(),
        "deploy/gate/evalhub/gate.yaml differs from gate/recipes/evalhub-status.yaml: copy the recipe"
    );
    let profile_text = std::fs::read_to_string(format!("{}/deploy/gate/evalhub/profile.yaml", root())).unwrap();
    let profile: Value = keyward_engine::yaml::documents(&profile_text).unwrap().remove(0).value;
    let gate = &profile["spec"]["inject"]["gate"];
    assert_eq!(config_map["metadata"]["name"], gate["configMap"]);
    let namespace = config_map["metadata"]["namespace"].as_str().unwrap();
    let binding = docs.iter().find(|d| d["kind"] == "ClusterRoleBinding").unwrap();
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "evalhub-service", "namespace": namespace}])
    );
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    assert_eq!(role["rules"], json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]));
    assert!(keyward_engine::ProfileSet::from_sources([("profile.yaml".to_string(), profile_text)]).is_ok());
}
