//! Black-box tests of `keyward explain`, `keyward check-profiles` and `keyward check-gate`: the real binary, real files.
#![allow(clippy::unwrap_used)] // a panic is the test failure report

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

const OPERATOR: &str = "system:serviceaccount:lm-eval:lm-eval-controller-manager";

fn keyward(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyward"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("KEYWARD_PROFILES")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// A failure is one clear line on stderr, exit 1, no panic.
fn assert_one_line_error(o: &Output, expected: &str) {
    assert_eq!(o.status.code(), Some(1), "stdout: {}\nstderr: {}", stdout(o), stderr(o));
    let err = stderr(o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("keyward: error: "), "{err}");
    assert!(err.contains(expected), "expected {expected:?} in {err}");
    assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
}

const FMS_POD: &str = "tests/fixtures/lmeval-fms-driver-pod.json";

/// issue 58: `explain --help` names every field of its JSON (the object for one pod; `cluster`
/// comes with --cluster, which needs a cluster).
#[test]
fn explain_help_names_every_field_of_its_json() {
    let o = keyward(&["explain", "--user", OPERATOR, "-o", "json", FMS_POD], None);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let help = stdout(&keyward(&["explain", "--help"], None));
    let listed = help.split("One JSON object per pod").nth(1).unwrap().split("yaml:").next().unwrap();
    let listed: Vec<String> =
        listed.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_string).collect();
    let mut keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    keys.sort();
    let missing: Vec<&&String> = keys.iter().filter(|k| !listed.contains(k)).collect();
    assert!(missing.is_empty(), "explain --help does not name {missing:?}:\n{help}");
    assert!(listed.iter().any(|w| w == "cluster"), "{help}");
}

#[test]
fn explain_json_on_a_pod() {
    let o = keyward(&["explain", "--user", OPERATOR, "-o", "json", FMS_POD], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["allowed"], true);
    assert_eq!(v["profile"], "lmeval");
    assert_eq!(v["reason"], "injected");
    assert_eq!(v["message"], Value::Null);
    assert_eq!(v["warnings"], json!([]));
    assert_eq!(v["pod"]["spec"]["serviceAccountName"], "default");
    assert_eq!(v["pod"]["spec"]["automountServiceAccountToken"], false);
    assert_eq!(v["injected"]["containers"], json!(["main"]));
    assert_eq!(
        v["requires"],
        json!([
            {"kind": "Secret", "namespace": "team-a", "name": "evaljob-sample-lmeval-client", "providedBy": "keyward"},
            {"kind": "ConfigMap", "namespace": "team-a", "name": "keyward-lmeval-server-ca", "providedBy": "keyward"}
        ])
    );
    assert_eq!(v["trace"][0]["profile"], "lmeval");
    assert_eq!(v["trace"][0]["selected"], true);
    // What the webhook adds and explain cannot sign, shown beside the patch, not in it.
    assert_eq!(
        v["attestation"],
        json!({"op": "add", "path": "/metadata/annotations/keyward.io~1attestation", "value": "v2.<key id>.<admitted at>.<nonce>.<binding>.<tag>"})
    );
    assert!(v["patch"].as_array().unwrap().iter().all(|op| op["path"] != v["attestation"]["path"]));
    // A profile that issues nothing per owner: no attestation.
    let o = keyward(&["explain", "-o", "json", "tests/fixtures/kfp-persistenceagent-pod-no-token.json"], None);
    assert_eq!(serde_json::from_str::<Value>(&stdout(&o)).unwrap()["attestation"], Value::Null);

    // Applying the printed patch to the input gives the printed pod.
    let mut pod: Value = serde_json::from_str(&std::fs::read_to_string(FMS_POD).unwrap()).unwrap();
    let patch: json_patch::Patch = serde_json::from_value(v["patch"].clone()).unwrap();
    json_patch::patch(&mut pod, &patch).unwrap();
    assert_eq!(pod, v["pod"]);
}

#[test]
fn explain_an_admission_review_from_stdin_as_yaml() {
    let review = std::fs::read_to_string("tests/fixtures/admissionreview-lmeval.json").unwrap();
    let o = keyward(&["explain", "-o", "yaml", "-"], Some(&review));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_saphyr::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["allowed"], true);
    assert_eq!(v["profile"], "lmeval");
    assert_eq!(v["requires"][0]["name"], "evaljob-sample-lmeval-client");
    // The requester comes from request.userInfo, so nothing is assumed.
    assert_eq!(v["warnings"], json!([]));
}

#[test]
fn explain_a_refused_pod_exits_3_with_the_reason() {
    let o = keyward(&["explain", "--user", "alice", "-o", "json", FMS_POD], None);
    assert_eq!(o.status.code(), Some(3));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["allowed"], false);
    assert_eq!(v["reason"], "requester-denied");
    assert!(v["message"].as_str().unwrap().contains("not \"alice\""), "{}", v["message"]);
    assert_eq!(v["patch"], json!([]));
    assert_eq!(v["requires"], json!([]));
}

#[test]
fn explain_diff_shows_the_token_removed_and_the_files_added() {
    let o = keyward(&["explain", "-o", "diff", FMS_POD], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("--- pod (as submitted)\n+++ pod (as admitted)\n"), "{out}");
    assert!(out.contains("\n+  automountServiceAccountToken: false\n"), "{out}");
    assert!(out.contains("\n-  - name: kube-api-access-"), "{out}");
    assert!(
        out.contains("\n+    - name: GRPC_SERVER_CA\n+      value: /var/run/secrets/keyward/lmeval-server-ca/ca.crt\n"),
        "{out}"
    );
}

#[test]
fn explain_text_lists_what_the_pod_requires_and_every_profile() {
    let o = keyward(&["explain", FMS_POD], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("profile:    lmeval (builtin:lmeval.yaml)\n"), "{out}");
    assert!(out.contains("containers: main\n"), "{out}");
    assert!(
        out.contains("requires:\n  - Secret team-a/evaljob-sample-lmeval-client (provided by keyward)\n  - ConfigMap team-a/keyward-lmeval-server-ca (provided by keyward)\n"),
        "{out}"
    );
    // Delivered as a pod certificate: the signer instead of the Secret, and the cluster's trust
    // bundle instead of the namespace's ConfigMap.
    let o = keyward(&["explain", "--profiles", "deploy/profiles/lmeval-pod-certificate.yaml", FMS_POD], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("  - client certificate: key made on the node, signed by keyward.io/lmeval (podCertificate), at /var/run/secrets/keyward/lmeval-client\n"), "{out}");
    assert!(
        out.contains("requires:\n  - Signer keyward.io/lmeval (keyward's controller signs the kubelet's PodCertificateRequests; Kubernetes 1.35+)\n  - ClusterTrustBundle keyward-lmeval-server-ca (cluster-wide, provided by keyward; Kubernetes 1.33+ with ClusterTrustBundle projection)\n"),
        "{out}"
    );
    let o = keyward(&["explain", "tests/fixtures/kuberay-worker-k8s-auth.json"], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("profile:    none\n"), "{out}");
    assert!(
        out.contains("  lmeval                   label app.kubernetes.io/name is missing\n")
            || out.contains("  lmeval                   label app.kubernetes.io/name="),
        "{out}"
    );
    assert!(out.contains("  kfp-persistence-agent    label app "), "{out}");
}

#[test]
fn a_pinned_operator_namespace_refuses_a_tenants_account_of_the_same_name() {
    let tenant = "system:serviceaccount:team-a:lm-eval-controller-manager";
    // Unpinned, the name is all the check has.
    let o = keyward(&["explain", "--no-install-pins", "--user", tenant, "-o", "json", FMS_POD], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // By default, explain pins as the shipped Deployments do, and says so.
    let o = keyward(&["explain", "--user", tenant, FMS_POD], None);
    assert_eq!(o.status.code(), Some(3), "{}", stdout(&o));
    assert!(stdout(&o).contains("decision:   DENIED (requester-denied)\n"), "{}", stdout(&o));
    assert_eq!(
        stderr(&o),
        "keyward: note: requesters pinned as the shipped Deployments pin them: --operator-namespace=lmeval=lm-eval (give --operator-namespace to pin otherwise, --no-install-pins for none)\n"
    );
    // issue 58: for a pod no pinned profile selects, the pin changed nothing, and no note says
    // it did.
    for pod in ["tests/fixtures/kfp-persistenceagent-pod.json", "tests/fixtures/kuberay-worker-k8s-auth.json"] {
        let o = keyward(&["explain", pod], None);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(stderr(&o), "", "{pod}");
    }
    let pin = ["--operator-namespace", "lmeval=lm-eval"];
    let o = keyward(&[&["explain", "--user", tenant, "-o", "json"][..], &pin, &[FMS_POD]].concat(), None);
    assert_eq!(o.status.code(), Some(3), "{}", stdout(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("only system:serviceaccount:lm-eval:lm-eval-controller-manager may create such pods"),
        "{v}"
    );
    let o = keyward(&[&["explain", "--user", OPERATOR, "-o", "json"][..], &pin, &[FMS_POD]].concat(), None);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert_one_line_error(
        &keyward(&["check-profiles", "--operator-namespace", "lmeval-job=opendatahub"], None),
        "--operator-namespace lmeval-job=opendatahub: no profile named \"lmeval-job\"",
    );
}

#[test]
fn explain_bad_input_is_one_clear_line() {
    assert_one_line_error(&keyward(&["explain", "-"], Some("key: [unclosed")), "<stdin>: not valid YAML or JSON");
    assert_one_line_error(
        &keyward(&["explain", "-"], Some("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n")),
        "<stdin>: Deployment default/d has no spec.template",
    );
    assert_one_line_error(
        &keyward(&["explain", "-"], Some("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")),
        "<stdin>: kind Service is not a Pod, an AdmissionReview, a Deployment",
    );
    assert_one_line_error(&keyward(&["explain", "-"], Some("just a string")), "<stdin>: no `kind`");
    assert_one_line_error(&keyward(&["explain", "does-not-exist.yaml"], None), "does-not-exist.yaml: cannot read");
    assert_one_line_error(
        &keyward(&["explain", "-"], Some(r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#)),
        "expected admission.k8s.io/v1 AdmissionReview",
    );
    assert_one_line_error(
        &keyward(&["explain", "--profiles", "no-such-dir", FMS_POD], None),
        "--profiles no-such-dir: cannot read the directory",
    );
}

#[test]
fn explain_names_every_field_the_apiserver_could_not_decode_where_it_is_in_the_file() {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: main\n    image: x\n    env: {A: b}\n    ports:\n    - containerPort: http\n  restartPolicy: 4\n";
    let o = keyward(&["explain", "-"], Some(pod));
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "keyward: error: <stdin>: not a valid Pod, so the apiserver would refuse it before any webhook sees it:\n\
         <stdin>: spec.containers[0].env (line 9 column 10): invalid type: map, expected a sequence\n\
         <stdin>: spec.containers[0].ports[0].containerPort (line 11 column 22): invalid type: string \"http\", expected i32\n\
         <stdin>: spec.restartPolicy (line 12 column 18): invalid type: integer `4`, expected a string\n"
    );

    // In an AdmissionReview (pretty JSON, as kubectl or a log gives it): the field from the
    // review's root, the place in the file.
    let mut review: Value =
        serde_json::from_str(&std::fs::read_to_string("tests/fixtures/admissionreview-lmeval.json").unwrap()).unwrap();
    review["request"]["object"]["spec"]["restartPolicy"] = json!(4);
    let text = serde_json::to_string_pretty(&review).unwrap();
    let (line, column) = text
        .lines()
        .enumerate()
        .find_map(|(i, l)| l.find("\"restartPolicy\": 4").map(|c| (i + 1, c + "\"restartPolicy\": ".len() + 1)))
        .unwrap();
    let o = keyward(&["explain", "-"], Some(&text));
    assert_eq!(
        stderr(&o),
        format!(
            "keyward: error: <stdin>: not a valid Pod, so the apiserver would refuse it before any webhook sees it:\n\
             <stdin>: request.object.spec.restartPolicy (line {line} column {column}): invalid type: integer `4`, expected a string\n"
        )
    );

    // Several documents: the bad one is named, with lines counted in the whole file; nothing is
    // explained from a file that cannot be read whole.
    let valid = "apiVersion: v1\nkind: Pod\nmetadata: {name: ok}\nspec: {containers: [{name: c, image: x}]}\n";
    let o = keyward(&["explain", "-"], Some(&format!("{valid}---\n{pod}")));
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty(), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.starts_with("keyward: error: <stdin> (document 2): not a valid Pod"), "{err}");
    assert!(err.contains("<stdin> (document 2): spec.containers[0].env (line 14 column 10)"), "{err}");
}

#[test]
fn check_profiles_lists_the_builtins() {
    let o = keyward(&["check-profiles"], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("3 profiles OK (built-in):\n"), "{out}");
    for name in ["lmeval", "kfp-persistence-agent", "kfp-scheduled-workflow"] {
        assert!(out.contains(name), "{out}");
    }
    // The token-lifetime rule, with the numbers: the KFP agents never hold an expired token.
    assert!(
        out.contains("\n      token \"persistenceagent-sa-token\": lives 21600 s; the kubelet asks for the next at 17280 s (80% of its life, at most 24 h) and the file has it by 17400 s (+120 s); the reader re-reads every 3600 s, so it never holds an expired token (600 s to spare)\n"),
        "{out}"
    );
    assert!(
        out.contains("\n      token \"scheduledworkflow-sa-token\": lives 3600 s; the kubelet asks for the next at 2880 s (80% of its life, at most 24 h) and the file has it by 3000 s (+120 s); the reader re-reads every 60 s, so it never holds an expired token (540 s to spare)\n"),
        "{out}"
    );
}

/// kubeflow/pipelines #13290 as a profile: a 3600 s token for a reader that re-reads it every
/// 3600 s is refused, with the arithmetic and the fix.
#[test]
fn check_profiles_refuses_a_token_lifetime_its_reader_outlives() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("agent.yaml");
    let kfp = std::fs::read_to_string("webhooks/profiles/kfp.yaml").unwrap();
    let agent = kfp.split("\n---\n").next().unwrap().replace("expirationSeconds: 21600", "expirationSeconds: 3600");
    std::fs::write(&path, agent).unwrap();
    let o = keyward(&["check-profiles", "--profiles", path.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert_eq!(
        stderr(&o),
        format!(
            "keyward: error: {}: profile \"kfp-persistence-agent\": spec.inject.serviceAccountToken.expirationSeconds: lives 3600 s; the kubelet asks for the next at 2880 s (80% of its life, at most 24 h) and the file has it by 3000 s (+120 s); the reader re-reads every 3600 s, so it can hold an expired token for up to 3000 s of every 3600 s: use expirationSeconds: 18600 or more, or make the program re-read it at least every 600 s\n",
            path.display()
        )
    );
}

#[test]
fn check_profiles_reports_every_problem_with_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("bad.yaml"),
        "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {name: bad}\nspec:\n  selector: {matchLabels: {app: x}}\n  requesters: {usernames: [bot]}\n  inject:\n    serviceAccountToken: {audience: a, expirationSeconds: 60, mountPath: relative}\n",
    )
    .unwrap();
    std::fs::write(dir.join("README.txt"), "not a profile").unwrap();
    let o = keyward(&["check-profiles", "--profiles", dir.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    let path = dir.join("bad.yaml").display().to_string();
    assert_eq!(
        err,
        format!(
            "keyward: error: {path}: profile \"bad\": spec.inject.serviceAccountToken.expirationSeconds: is 60; the apiserver refuses projected tokens under 600 seconds (10 minutes): use 600 or more (3600 is usual)\n\
             {path}: profile \"bad\": spec.inject.serviceAccountToken.mountPath: \"relative\" must be an absolute path (start with /)\n"
        )
    );

    // A directory profile named like a built-in replaces it.
    std::fs::write(dir.join("bad.yaml"), std::fs::read_to_string("webhooks/profiles/lmeval.yaml").unwrap()).unwrap();
    let o = keyward(&["check-profiles", "--profiles", dir.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains(&format!("lmeval                   {path}")), "{}", stdout(&o));
    let o = keyward(&["check-profiles", "--no-default-profiles", "--profiles", dir.to_str().unwrap()], None);
    assert!(stdout(&o).starts_with("1 profiles OK"), "{}", stdout(&o));
    // One file works as well as a directory.
    let o = keyward(&["check-profiles", "--no-default-profiles", "--profiles", &path], None);
    assert!(stdout(&o).starts_with("1 profiles OK"), "{}", stdout(&o));
}

/// issue 58: a cluster that runs one of the systems gets that system's built-ins alone (a
/// KFP-only cluster no lmeval objects), without giving up the built-ins for files of its own;
/// the shipped Deployments' lmeval pin needs no edit; a name that is no built-in is refused
/// with the choices.
#[test]
fn builtin_profiles_chooses_the_built_ins_by_system_or_name() {
    let names = |o: &Output| -> Vec<String> {
        stdout(o)
            .lines()
            .skip(1)
            .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
            .map(|l| l.split_whitespace().next().unwrap().to_string())
            .collect()
    };
    let o = keyward(&["check-profiles", "--builtin-profiles", "kfp", "--operator-namespace", "lmeval=lm-eval"], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("2 profiles OK (built-in kfp):"), "{}", stdout(&o));
    assert_eq!(names(&o), ["kfp-persistence-agent", "kfp-scheduled-workflow"]);
    let o = keyward(&["check-profiles", "--builtin-profiles", "lmeval,kfp-scheduled-workflow"], None);
    assert_eq!(names(&o), ["lmeval", "kfp-scheduled-workflow"]);
    // The environment, as a Deployment sets it.
    let mut env = Command::new(env!("CARGO_BIN_EXE_keyward"));
    let o = env
        .args(["check-profiles"])
        .env_remove("KEYWARD_PROFILES")
        .env("KEYWARD_BUILTIN_PROFILES", "lmeval")
        .output()
        .unwrap();
    assert_eq!(names(&o), ["lmeval"]);
    // An LMEvalJob driver on a KFP-only cluster: no profile selects it, nothing injected.
    let o = keyward(&["explain", "--builtin-profiles", "kfp", "--user", OPERATOR, "-o", "json", FMS_POD], None);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!((&v["profile"], &v["patch"]), (&Value::Null, &json!([])), "{v:#}");
    // A profile of one's own named like a built-in left out is pinned as any other: an
    // account of that name in another namespace gets nothing.
    let own = tempfile::tempdir().unwrap();
    std::fs::copy("webhooks/profiles/lmeval.yaml", own.path().join("lmeval.yaml")).unwrap();
    let dir = own.path().to_str().unwrap();
    let as_user = |user: &str| -> Value {
        let args =
            ["explain", "--builtin-profiles", "kfp", "--profiles", dir, "--operator-namespace", "lmeval=lm-eval"];
        let o = keyward(&[&args[..], &["--user", user, "-o", "json", FMS_POD]].concat(), None);
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let copied = as_user("system:serviceaccount:attacker:lm-eval-controller-manager");
    assert_eq!((&copied["allowed"], &copied["patch"]), (&json!(false), &json!([])), "{copied:#}");
    assert_eq!(as_user(OPERATOR)["reason"], "injected");
    // A pin of a profile that does not exist is still refused.
    let o = keyward(&["check-profiles", "--builtin-profiles", "kfp", "--operator-namespace", "mine=x"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--operator-namespace mine=x: no profile named \"mine\""), "{}", stderr(&o));
    let o = keyward(&["check-profiles", "--builtin-profiles", "kfp,ray"], None);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "keyward: error: --builtin-profiles \"ray\": no built-in system or profile of that name; give a system, or a profile in parentheses: lmeval (lmeval); kfp (kfp-persistence-agent, kfp-scheduled-workflow)\n"
    );
}

#[test]
fn check_profiles_reports_every_parse_error_in_file_order_and_profiles_that_compete() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("my.yaml");
    // The README's example.
    let text = "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata:\n  name: demo\nspec:\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: fms-lm-eval-service\n  onConflict: ignore\n  requesters:\n    usernames: [\"system:serviceaccount:*:demo-operator\"]\n  inject:\n    token:\n      mountPth: /x\n      secretName: s\n";
    std::fs::write(&path, text).unwrap();
    let p = path.display().to_string();
    let o = keyward(&["check-profiles", "--profiles", &p], None);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!(
            "keyward: error: {p}: profile \"demo\": spec.onConflict: document 1, line 9 column 15: unknown variant `ignore`, expected `deny` or `skip`\n\
             {p}: profile \"demo\": spec.inject.token.mountPth: document 1, line 14 column 7: unknown field `mountPth`, expected one of `secretName`, `key`, `volumeName`, `mountPath`, `fileEnv`, `valueEnv`, `provider`\n"
        )
    );

    // Fixed, it competes with the built-in lmeval for the fms-lm-eval-service driver pods.
    std::fs::write(&path, text.replace("  onConflict: ignore\n", "").replace("mountPth", "mountPath")).unwrap();
    let o = keyward(&["check-profiles", "--profiles", &p], None);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!(
            "keyward: error: {p}: profile \"demo\": spec.selector: selects pods that profile \"lmeval\" (builtin:lmeval.yaml) selects too, for example a pod in any namespace with labels {{app.kubernetes.io/name=\"fms-lm-eval-service\"}} owned by a foundation-model-stack.github.com.github.com/LMEvalJob; keyward would refuse every such pod rather than guess which credentials it gets. Narrow spec.selector, spec.annotationSelector, spec.controllerOwners or spec.namespaces of one of them so that no pod matches both (to replace the built-in instead, name yours \"lmeval\")\n"
        )
    );
    let o = keyward(&["check-profiles", "--no-default-profiles", "--profiles", &p], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn serve_refuses_to_start_on_bad_settings() {
    let o = keyward(&["serve", "--listen", "127.0.0.1:0", "--metrics-listen", "off", "--tls-dir", "no-such-dir"], None);
    assert_one_line_error(&o, "--tls-dir no-such-dir: no such directory; mount the serving certificate Secret there");
    let o = keyward(&["serve", "--listen", "127.0.0.1:0", "--profiles", "no-such-dir"], None);
    assert_one_line_error(&o, "--profiles no-such-dir: cannot read the directory");
    let o = keyward(&["serve", "--metrics-listen", "nine"], None);
    assert_one_line_error(&o, "--metrics-listen \"nine\": not an address like 0.0.0.0:9090 (or `off`)");
    // Profiles that are refused stop start-up before a development certificate is minted.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: keyward.io/v1alpha1\nkind: InjectionProfile\nmetadata: {name: bad}\nspec: {}\n")
        .unwrap();
    let dev = dir.path().join("dev");
    let (bad, dev) = (bad.to_str().unwrap(), dev.to_str().unwrap());
    let o = keyward(&["serve", "--listen", "127.0.0.1:0", "--profiles", bad, "--dev-cert-dir", dev], None);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("bad.yaml"), "{}", stderr(&o));
    assert!(!std::path::Path::new(dev).exists(), "minted into {dev} before refusing the profiles");
}

/// `keyward controller` checks its flags before it touches a cluster (no KUBECONFIG here).
#[test]
fn the_controller_refuses_bad_flags_with_the_fix_before_touching_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["--trust-domain", "Bad Domain"], "--trust-domain \"Bad Domain\" may hold only lower-case letters, digits, '.', '-' and '_' (a SPIFFE trust domain)"),
        (&[], "profiles lmeval issue client certificates: give --client-ca-dir, the directory where the keyward-client-ca Secret is mounted (tls.crt, tls.key)"),
        (&["--client-ca-dir", ca, "--workers", "0"], "--workers: must be at least 1"),
        (&["--client-ca-dir", ca, "--api-timeout", "0s"], "--api-timeout: must be more than 0s"),
        (&["--client-ca-dir", ca, "--attestation-key-rotation", "0s"], "--attestation-key-rotation: must be more than 0s"),
        (&["--client-ca-dir", ca, "--client-cert-validity", "5m"], "--client-cert-validity 300s: must be at least 10m (a certificate is renewed at two thirds of its life)"),
    ];
    for (flags, message) in cases {
        let mut args = vec!["controller", "--identity", "test", "--metrics-listen", "off"];
        args.extend_from_slice(flags);
        let out = Command::new(env!("CARGO_BIN_EXE_keyward"))
            .args(&args)
            .env_remove("KUBECONFIG")
            .env("HOME", dir.path())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.ends_with(&format!("keyward: error: {message}\n")), "{flags:?}: {err}");
    }
}

#[test]
fn serve_without_tls_dir_where_it_cannot_write_says_what_to_mount() {
    let out = Command::new(env!("CARGO_BIN_EXE_keyward"))
        .args([
            "serve",
            "--dev-cert-dir",
            "/proc/keyward-cannot-write",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "off",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.ends_with("keyward: error: /proc/keyward-cannot-write: cannot write: No such file or directory (os error 2); without --tls-dir keyward mints a development certificate into --dev-cert-dir /proc/keyward-cannot-write: in a cluster, give --tls-dir DIR (the serving certificate Secret mounted as a directory); elsewhere, a writable --dev-cert-dir\n"),
        "{err}"
    );
}

#[test]
fn version_names_the_commit_it_was_built_from() {
    let out = keyward(&["version"], None);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], format!("keyward {}", env!("CARGO_PKG_VERSION")));
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git").args(args).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    // Built from this checkout: the same commit (dirty or not when it was built).
    let commit = lines[1].strip_prefix("commit: ").unwrap();
    assert_eq!(commit.trim_end_matches("-dirty"), git(&["describe", "--tags", "--always"]));
    assert_eq!(lines[2], format!("commit date: {}", git(&["log", "-1", "--format=%cI"])));
}

const KFP_DEPLOYMENT: &str = "tests/fixtures/kfp-persistenceagent-deployment-no-token.yaml";

#[test]
fn explain_a_deployment_explains_the_pods_its_replicaset_creates() {
    let o = keyward(&["explain", "-o", "json", KFP_DEPLOYMENT], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        v["subject"],
        "Deployment kubeflow/ml-pipeline-persistenceagent (its pods, owned by ReplicaSet ml-pipeline-persistenceagent-pod-template-hash)"
    );
    // The ReplicaSet controller creates them, which the built-in lists as a requester.
    assert_eq!(v["requester"], "system:serviceaccount:kube-system:replicaset-controller");
    assert_eq!(
        (v["namespace"].as_str(), v["profile"].as_str(), v["reason"].as_str()),
        (Some("kubeflow"), Some("kfp-persistence-agent"), Some("injected"))
    );
    // The token the agent reads (backend/src/agent/persistence/main.go), on the pod it would get.
    let pod = &v["pod"];
    let volume =
        pod["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "persistenceagent-sa-token").unwrap();
    // For 6 h: the agent re-reads it hourly (kubeflow/pipelines #13290), and says why.
    assert_eq!(
        volume["projected"]["sources"][0]["serviceAccountToken"],
        json!({"audience": "pipelines.kubeflow.org", "expirationSeconds": 21600, "path": "persistenceagent-sa-token"})
    );
    assert_eq!(pod["metadata"]["labels"]["keyward.io/profile"], "kfp-persistence-agent");
    let text = stdout(&keyward(&["explain", KFP_DEPLOYMENT], None));
    assert!(
        text.contains("\ninjects:\n  - service-account token: audience pipelines.kubeflow.org, expires after 21600s, at /var/run/secrets/kubeflow/tokens/persistenceagent-sa-token; lives 21600 s; the kubelet asks for the next at 17280 s (80% of its life, at most 24 h) and the file has it by 17400 s (+120 s); the reader re-reads every 3600 s, so it never holds an expired token (600 s to spare)\n"),
        "{text}"
    );
    // As anyone else (kubectl's --as): the profile skips the pod, with a warning.
    let o = keyward(&["explain", "--as", "alice", "-o", "json", KFP_DEPLOYMENT], None);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!((v["requester"].as_str(), v["reason"].as_str()), (Some("alice"), Some("requester-skipped")));
}

#[test]
fn explain_several_documents_and_lists_one_report_each_and_exits_3_if_any_is_refused() {
    let deployment = std::fs::read_to_string(KFP_DEPLOYMENT).unwrap();
    let fms = std::fs::read_to_string(FMS_POD).unwrap();
    let list = format!("apiVersion: v1\nkind: List\nitems:\n- {fms}\n");
    let text = format!("{deployment}---\n{list}");
    let o = keyward(&["explain", "-o", "json", "-"], Some(&text));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let subjects: Vec<&str> = v.as_array().unwrap().iter().map(|r| r["subject"].as_str().unwrap()).collect();
    assert_eq!(subjects.len(), 2, "{subjects:?}");
    assert!(subjects[0].starts_with("Deployment kubeflow/ml-pipeline-persistenceagent"), "{subjects:?}");
    assert_eq!(subjects[1], "Pod team-a/evaljob-sample");
    assert_eq!((v[0]["reason"].as_str(), v[1]["reason"].as_str()), (Some("injected"), Some("injected")));

    // One requester for all: the lmeval pod is refused (otherwise: deny), the KFP one skipped.
    let o = keyward(&["explain", "--user", "alice", "-"], Some(&text));
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("subject:    Deployment kubeflow/ml-pipeline-persistenceagent"), "{out}");
    assert!(out.contains("subject:    Pod team-a/evaljob-sample"), "{out}");
    assert!(out.contains("decision:   DENIED (requester-denied)"), "{out}");
    assert!(out.contains("decision:   allowed (requester-skipped)"), "{out}");
}

#[test]
fn check_gate_validates_the_recipe_and_decides_a_request_offline() {
    let recipe = "gate/recipes/lmeval-status.yaml";
    let o = keyward(&["check-gate", recipe], None);
    assert_eq!(
        (o.status.code(), stdout(&o)),
        (Some(0), format!("gate \"lmeval-status\" OK ({recipe})\n  rule \"a driver updates only its own job\": gRPC LMEvalJobUpdateService/UpdateStatus; callers: workloads (lmevaljob, any namespace) by client certificate; over TLS only (a client certificate)\n"))
    );

    let driver = "spiffe://cluster.local/ns/team-a/lmevaljob/evaljob-sample";
    let update = "POST /LMEvalJobUpdateService/UpdateStatus";
    let ask = |job: &str| {
        let fields = [format!("1={job}"), "2=team-a".to_string(), "3=Running".to_string()];
        let mut args = vec!["check-gate", recipe, "--caller", driver, "--request", update];
        for f in &fields {
            args.extend(["--grpc-field", f.as_str()]);
        }
        keyward(&args, None)
    };
    let o = ask("evaljob-sample");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "  a driver updates only its own job: allows it\n  spec.liveOwners: only while LMEvalJob (foundation-model-stack.github.com.github.com/v1beta1) team-a/evaljob-sample exists (the gate's watch decides that; not checked offline)\nallowed by rule \"a driver updates only its own job\"\n"
    );
    // Without the message's fields: refused for an empty message, with the flag to give them.
    let o = keyward(&["check-gate", recipe, "--caller", driver, "--request", update], None);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("\n  hint: a rule for this request reads the gRPC message: give its string fields with --grpc-field NUMBER=VALUE (as --grpc-field 1=evaljob-sample)\nrefused: "),
        "{}",
        stdout(&o)
    );
    let o = ask("another-job");
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(!stdout(&o).contains("hint:"), "the fields were given: {}", stdout(&o));
    assert!(
        stdout(&o).ends_with("refused: rule \"a driver updates only its own job\": the caller's name is \"evaljob-sample\", and gRPC field 1 is \"another-job\"\n"),
        "{}",
        stdout(&o)
    );
    // A path the gate will not judge, a caller that is no identity: one clear line, exit 1.
    let o = keyward(
        &["check-gate", recipe, "--caller", driver, "--request", "POST /a/../LMEvalJobUpdateService/UpdateStatus"],
        None,
    );
    assert_one_line_error(
        &o,
        "path \"/a/../LMEvalJobUpdateService/UpdateStatus\": has a '.' or '..' segment; send the path without it",
    );
    let o = keyward(
        &["check-gate", recipe, "--caller", "spiffe://cluster.local/ns/team-a/lmevaljob/%2e%2e", "--request", update],
        None,
    );
    assert_one_line_error(&o, "SPIFFE ID \"spiffe://cluster.local/ns/team-a/lmevaljob/%2e%2e\": holds '%': keyward's identities are plain Kubernetes names, never encoded, with no port, query or fragment");
}

/// Each recipe's header says how to try it: the requests it names decide as it says.
#[test]
fn the_kfp_and_inference_graph_recipes_decide_their_systems_requests() {
    let kfp = "gate/recipes/kfp-api.yaml";
    let agent = "system:serviceaccount:kubeflow:ml-pipeline-persistenceagent";
    let scheduler = "system:serviceaccount:kubeflow:ml-pipeline-scheduledworkflow";
    let decide = |recipe: &str, caller: &str, request: &str| {
        keyward(&["check-gate", recipe, "--caller", caller, "--request", request], None)
    };
    for (caller, request, code) in [
        (agent, "POST /api.ReportService/ReportWorkflowV1", 0),
        (agent, "POST /api.ReportService/ReportScheduledWorkflowV1", 0),
        (agent, "POST /api.RunService/ReportRunMetricsV1", 0),
        (scheduler, "POST /kubeflow.pipelines.backend.api.v2beta1.RunService/CreateRun", 0),
        // Each agent only what its ClusterRole names; nobody else anything.
        (scheduler, "POST /api.ReportService/ReportWorkflowV1", 3),
        (agent, "POST /kubeflow.pipelines.backend.api.v2beta1.RunService/CreateRun", 3),
        ("system:serviceaccount:team-a:pipeline-runner", "POST /api.RunService/ReportRunMetricsV1", 3),
        (agent, "POST /kubeflow.pipelines.backend.api.v2beta1.RunService/DeleteRun", 3),
    ] {
        let o = decide(kfp, caller, request);
        assert_eq!(o.status.code(), Some(code), "{caller} {request}: {}{}", stdout(&o), stderr(&o));
    }
    let graph = "gate/recipes/inference-graph.yaml";
    let o = decide(graph, "system:serviceaccount:team-a:client", "POST /v1/models/x:predict");
    assert_eq!(o.status.code(), Some(4), "the review decides: not a refusal");
    assert!(
        stdout(&o).contains("would ask the API server: may system:serviceaccount:team-a:client get inferencegraphs (group \"serving.kserve.io\", namespace \"team-a\", name \"my-graph\")"),
        "{}",
        stdout(&o)
    );
    // A person, as ODH's router admits one: the review decides.
    let o = decide(graph, "alice", "POST /v1/models/x:predict");
    assert_eq!(o.status.code(), Some(4));
    assert!(stdout(&o).contains("would ask the API server: may alice get inferencegraphs"), "{}", stdout(&o));
    assert!(
        stdout(&o).starts_with("  caller \"alice\": a user named by a bearer token (a workload by client certificate is spiffe://TRUST-DOMAIN/ns/NAMESPACE/KIND/NAME; a service account system:serviceaccount:NAMESPACE:NAME)\n"),
        "{}",
        stdout(&o)
    );
    // The v2 driver's cache lookup needs no credential; another method of the service does.
    let o = decide(kfp, "anonymous", "POST /api.TaskService/ListTasksV1");
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).ends_with("allowed by rule \"the v2 driver and launcher use the cache\"\n"), "{}", stdout(&o));
    let o = decide(kfp, "anonymous", "POST /api.TaskService/DeleteTaskV1");
    assert_eq!(o.status.code(), Some(3), "{}", stdout(&o));
    let o = decide(graph, "spiffe://cluster.local/ns/team-a/lmevaljob/j", "POST /v1/models/x:predict");
    assert!(
        stdout(&o).ends_with("it does not admit workload spiffe://cluster.local/ns/team-a/lmevaljob/j\n"),
        "{}",
        stdout(&o)
    );
}

/// The evalhub-status recipe's header says how to try it: an evaluation pod's own job awaits
/// the review kube-rbac-proxy also asks, another job's is refused naming the pod's fact.
#[test]
fn the_evalhub_recipe_decides_an_evaluation_pods_events() {
    let recipe = "gate/recipes/evalhub-status.yaml";
    let o = keyward(&["check-gate", recipe], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("  pods: a token bound to a pod labelled app=evalhub,component=evaluation-job names that pod (the gate watches them: list and watch pods); rules read its labels [benchmark_index] and annotations [eval-hub.github.io/job_id, eval-hub.github.io/provider_id, eval-hub.github.io/benchmark_id]\n"), "{}", stdout(&o));
    assert!(
        stdout(&o).ends_with("  userHeaders: X-User set to the verified user, the client's removed\n"),
        "{}",
        stdout(&o)
    );
    let event = r#"{"benchmark_status_event": {"id": "arc_easy", "provider_id": "lm_evaluation_harness", "benchmark_index": 0, "status": "running"}}"#;
    let decide = |job: &str, pod: bool| {
        let path = format!("POST /api/v1/evaluations/jobs/{job}/events");
        let mut args = vec!["check-gate", recipe, "--caller", "system:serviceaccount:tenant-a:evalhub-evalhub-job"];
        if pod {
            args.extend(["--pod", "job-a-7f3c-x2x9q", "--pod-annotation", "eval-hub.github.io/job_id=job-a"]);
            args.extend(["--pod-annotation", "eval-hub.github.io/provider_id=lm_evaluation_harness"]);
            args.extend([
                "--pod-annotation",
                "eval-hub.github.io/benchmark_id=arc_easy",
                "--pod-label",
                "benchmark_index=0",
            ]);
        }
        args.extend(["--request", &path, "--header", "X-Tenant: tenant-a", "--json-body", event]);
        keyward(&args, None)
    };
    let own = decide("job-a", true);
    assert_eq!(own.status.code(), Some(4), "{}{}", stdout(&own), stderr(&own));
    assert!(stdout(&own).contains("would ask the API server: may system:serviceaccount:tenant-a:evalhub-evalhub-job create status-events (group \"trustyai.opendatahub.io\", namespace \"tenant-a\", name \"\")"), "{}", stdout(&own));
    assert!(stdout(&own).contains("  the caller's pod tenant-a/job-a-7f3c-x2x9q: as given; the gate admits a pod-bound token only while its pod exists with the token's UID"), "{}", stdout(&own));
    let other = decide("job-b", true);
    assert_eq!(other.status.code(), Some(3));
    assert!(stdout(&other).contains("refused: rule \"an evaluation pod posts its own job's events\": the caller's pod's annotation eval-hub.github.io/job_id is \"job-a\", and path segment {id} is \"job-b\""), "{}", stdout(&other));
    let no_pod = decide("job-a", false);
    assert_eq!(no_pod.status.code(), Some(3));
    assert!(stdout(&no_pod).contains("the caller has no pod (service account system:serviceaccount:tenant-a:evalhub-evalhub-job: its token is bound to no pod"), "{}", stdout(&no_pod));
    let o = keyward(&["check-gate", recipe, "--caller", "alice", "--pod", "p", "--request", "POST /x"], None);
    assert_one_line_error(
        &o,
        "--pod: only a service account's token is bound to a pod; give --caller system:serviceaccount:NAMESPACE:NAME",
    );
}

#[test]
fn check_gate_reports_every_problem_of_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gate.yaml");
    std::fs::write(&path, "apiVersion: keyward.io/v1alpha1\nkind: Gate\nmetadata: {name: g}\nspec:\n  rules:\n    - name: r\n      http: {path: /a}\n      callers: {}\n      when: [{caller: name, equals: {pathSegment: x}}]\n").unwrap();
    let o = keyward(&["check-gate", path.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(1));
    let file = path.display();
    assert_eq!(
        stderr(&o),
        format!("keyward: error: gate file refused:\n  {file}: spec.rules[0] (\"r\").callers admits no one: list workloads (client certificates) or serviceAccounts (tokens)\n  {file}: spec.rules[0] (\"r\").when[0]: path \"/a\" has no {{x}} to compare with\n")
    );
}
