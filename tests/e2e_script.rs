//! `deploy/e2e/kind.sh` cannot run here (no Docker, no cluster), so every step whose logic can
//! be exercised offline is: the overlay it installs renders with the image it builds; its
//! volume lookups find keyward's volumes by name in the pods the apiserver really stores
//! (`kube-api-access-*` first); its pod selectors pick the webhook and not the controller; its
//! mTLS check passes only when the server answers, against a local `openssl s_server` with a
//! good and a rogue client certificate; its pod certificate step runs on a cluster configured to
//! serve them, with the shipped profile mounted; and it never deletes a kind cluster it did not
//! create (run with stub `kind`, `docker` and `kubectl` on the PATH).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod support;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use keyward_certs::pki::Ca;
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn render(overlay: &str) -> Vec<Value> {
    let out = support::tool("kubectl")
        .args(["kustomize", &format!("{}/deploy/overlays/{overlay}", root().display())])
        .output();
    let out = out.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    keyward_engine::yaml::documents(&text).unwrap().into_iter().map(|d| d.value).collect()
}

/// Runs `script` in bash with `deploy/e2e/lib.sh` sourced.
fn with_lib(script: &str) -> Output {
    let lib = root().join("deploy/e2e/lib.sh");
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", &format!("source {}; {script}", lib.display())])
        .output()
        .unwrap()
}

fn lib_var(name: &str) -> String {
    let out = with_lib(&format!("printf %s \"${name}\""));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_overlays_kind_sh_installs_are_the_shipped_installs_with_the_image_it_builds() {
    let script = std::fs::read_to_string(root().join("deploy/e2e/kind.sh")).unwrap();
    assert!(script.contains("IMAGE=\"keyward:dev\""));
    for (overlay, shipped) in [("local", "cert-manager"), ("local-self-managed", "self-managed")] {
        assert!(script.contains(&format!("apply -k \"$ROOT/deploy/overlays/{overlay}\"")), "{overlay}");
        same_but_the_image(&render(overlay), &render(shipped));
    }
}

fn render_dir(dir: &str) -> Vec<Value> {
    let out = support::tool("kubectl").args(["kustomize", &format!("{}/{dir}", root().display())]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    keyward_engine::yaml::documents(&text).unwrap().into_iter().map(|d| d.value).collect()
}

/// kind.sh's last install is the self-managed one with its two components, and its gate step
/// runs deploy/gate/example as it ships, but for the operator (a stand-in) and the certificate
/// (the e2e's own, named for the Service too) and the image.
#[test]
fn its_gate_and_components_steps_run_what_ships() {
    let script = std::fs::read_to_string(root().join("deploy/e2e/kind.sh")).unwrap();
    for dir in ["deploy/e2e/gate", "deploy/e2e/install"] {
        assert!(script.contains(&format!("apply -k \"$ROOT/{dir}\"")), "{dir}");
    }
    let install = render_dir("deploy/e2e/install");
    let plain = render("local-self-managed");
    for doc in &plain {
        assert!(install.contains(doc), "{} {} changed", doc["kind"], doc["metadata"]["name"]);
    }
    let added: Vec<(String, String)> = install
        .iter()
        .filter(|d| !plain.contains(d))
        .map(|d| (d["kind"].as_str().unwrap().to_string(), d["metadata"]["name"].as_str().unwrap().to_string()))
        .collect();
    let names: Vec<(&str, &str)> = added.iter().map(|(k, n)| (k.as_str(), n.as_str())).collect();
    for expected in [("PrometheusRule", "keyward"), ("PodMonitor", "keyward-gate"), ("CronJob", "keyward-audit")] {
        assert!(names.contains(&expected), "{expected:?} not in {names:?}");
    }

    let e2e = render_dir("deploy/e2e/gate");
    let example = render_dir("deploy/gate/example");
    let kinds = |docs: &[Value]| docs.iter().map(|d| d["kind"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    assert!(kinds(&example).contains(&"Certificate".to_string()));
    // issue 58: the example's own Issuer and Certificate are exercised, not deleted: kind.sh
    // applies them first by their label, and the Certificate names what the e2e dials besides
    // the drivers' names.
    let label = "e2e.keyward.io/step=operator-certificate";
    assert!(script.contains(&format!("apply -k \"$ROOT/deploy/e2e/gate\" -l {label}\n")));
    assert!(script.contains("wait certificate/lm-eval-grpc-server-cert --for=condition=Ready"));
    let (key, value) = label.split_once('=').unwrap();
    let labelled: Vec<&Value> = e2e.iter().filter(|d| d["metadata"]["labels"][key] == value).collect();
    for doc in &labelled {
        let mut shipped = example
            .iter()
            .find(|d| d["kind"] == doc["kind"] && d["metadata"]["name"] == doc["metadata"]["name"])
            .unwrap()
            .clone();
        shipped["metadata"]["labels"] = json!({key: value});
        if doc["kind"] == "Certificate" {
            let names = shipped["spec"]["dnsNames"].as_array_mut().unwrap();
            names.extend([json!("lm-eval-grpc.lm-eval.svc"), json!("tls-echo.lm-eval.svc")]);
        }
        assert_eq!(**doc, shipped, "the example's {} as it ships, but for the e2e's label and names", doc["kind"]);
    }
    let labelled_kinds: Vec<&str> = labelled.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(labelled_kinds, ["Certificate", "Issuer"]);
    let pod =
        |docs: &[Value]| docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"].clone();
    let (mut ran, shipped) = (pod(&e2e), pod(&example));
    assert_eq!(ran["initContainers"][0]["image"], "keyward:dev");
    ran["initContainers"][0]["image"] = shipped["initContainers"][0]["image"].clone();
    assert_eq!(ran["initContainers"], shipped["initContainers"], "the gate runs as it ships");
    assert_eq!(ran["containers"][0]["image"], "docker.io/nginxinc/nginx-unprivileged:1.27-alpine");
    assert_eq!(ran["securityContext"], shipped["securityContext"]);
    assert!(!script.contains("kind: Certificate"), "kind.sh issues no certificate of its own for the operator");
    assert!(script.contains("https://lm-eval-grpc.lm-eval.svc:8082/LMEvalJobUpdateService/UpdateStatus"));
}

#[test]
fn its_pod_certificate_step_runs_on_a_cluster_that_serves_them_with_the_shipped_profile_mounted() {
    let script = std::fs::read_to_string(root().join("deploy/e2e/kind.sh")).unwrap();
    assert!(script.contains("--config \"$ROOT/deploy/e2e/kind-config.yaml\""));
    assert!(script.contains("apply -k \"$ROOT/deploy/overlays/local-pod-certificates\""));
    // The default node image is a Kubernetes that has the API (1.35 on).
    let image = script.lines().find_map(|l| l.strip_prefix("KIND_NODE_IMAGE=\"${KIND_NODE_IMAGE:-")).unwrap();
    let minor: u32 = image.strip_prefix("kindest/node:v1.").unwrap().split('.').next().unwrap().parse().unwrap();
    assert!(minor >= 35, "{image}");
    // On 1.35 and 1.36 the feature gate and the v1beta1 API must be turned on.
    let text = std::fs::read_to_string(root().join("deploy/e2e/kind-config.yaml")).unwrap();
    let config = &keyward_engine::yaml::documents(&text).unwrap()[0].value;
    assert_eq!(config["apiVersion"], "kind.x-k8s.io/v1alpha4");
    assert_eq!(config["featureGates"]["PodCertificateRequest"], true);
    assert_eq!(config["runtimeConfig"]["certificates.k8s.io/v1beta1/podcertificaterequests"], "true");

    // The overlay: deploy/overlays/local, plus the shipped profile in a ConfigMap mounted as a
    // directory in both Deployments and given to both with --profiles; nothing else differs.
    let with = render("local-pod-certificates");
    let without = render("local");
    let profile = std::fs::read_to_string(root().join("deploy/profiles/lmeval-pod-certificate.yaml")).unwrap();
    let config_map =
        with.iter().find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "keyward-profiles").unwrap();
    assert_eq!(config_map["metadata"]["namespace"], "keyward-system");
    assert_eq!(config_map["data"]["lmeval-pod-certificate.yaml"], profile.as_str());
    let rest: Vec<Value> = with.iter().filter(|d| *d != config_map).cloned().collect();
    assert_eq!(rest.len(), without.len());
    for (mut w, o) in rest.into_iter().zip(without) {
        if w["kind"] == "Deployment" {
            let spec = &mut w["spec"]["template"]["spec"];
            let volume = spec["volumes"].as_array_mut().unwrap().pop().unwrap();
            assert_eq!(volume, serde_json::json!({"name": "profiles", "configMap": {"name": "keyward-profiles"}}));
            let container = &mut spec["containers"][0];
            let mount = container["volumeMounts"].as_array_mut().unwrap().pop().unwrap();
            assert_eq!(
                mount,
                serde_json::json!({"name": "profiles", "mountPath": "/etc/keyward/profiles", "readOnly": true})
            );
            let arg = container["args"].as_array_mut().unwrap().pop().unwrap();
            assert_eq!(arg, "--profiles=/etc/keyward/profiles");
        }
        assert_eq!(w, o);
    }
}

fn same_but_the_image(local: &[Value], upstream: &[Value]) {
    assert_eq!(local.len(), upstream.len());
    for (l, u) in local.iter().zip(upstream) {
        let mut l = l.clone();
        if l["kind"] == "Deployment" {
            let name = l["metadata"]["name"].clone();
            let image = &mut l["spec"]["template"]["spec"]["containers"][0]["image"];
            assert_eq!(*image, "keyward:dev", "{name}");
            *image = u["spec"]["template"]["spec"]["containers"][0]["image"].clone();
        }
        assert_eq!(&l, u);
    }
}

/// The pod `keyward explain` says the apiserver would store (after keyward's patch).
fn admitted_pod(fixture: &str) -> tempfile::NamedTempFile {
    let out = Command::new(env!("CARGO_BIN_EXE_keyward"))
        .args(["explain", "-o", "json", "--namespace", "team-a"])
        .arg(root().join("tests/fixtures").join(fixture))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(answer["pod"].to_string().as_bytes()).unwrap();
    file
}

/// `kubectl`'s jsonpath over a local file, as kind.sh applies it to the pod it reads.
fn jsonpath_of_volume(pod: &Path, volume: &str, field: &str) -> String {
    support::require("kubectl");
    let script = format!(
        "KUBECONFIG=/dev/null kubectl patch --local -f {} --type=merge -p '{{}}' -o jsonpath=\"$(volume_jsonpath {volume} '{field}')\"",
        pod.display()
    );
    let out = with_lib(&script);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// issue 58: kind.sh's PodMonitor check passed on a label match alone, with a wrong port or
/// scope. Its port lookup, run here as kind.sh runs it on the gate's pod: the PodMonitor's port
/// finds the sidecar's 9091, and a port the sidecar does not declare finds nothing. And its
/// image build carries no provenance attestation, which `kind load` cannot take from Docker's
/// containerd image store (kind #3795).
#[test]
fn the_podmonitor_check_finds_the_sidecars_metrics_port_and_nothing_for_another() {
    let script = std::fs::read_to_string(root().join("deploy/e2e/kind.sh")).unwrap();
    assert!(script.contains("docker build --provenance=false -t \"$IMAGE\""));
    let lookup = r#"{.items[0].spec.initContainers[?(@.name==\"keyward-gate\")].ports[?(@.name==\"$gate_port\")].containerPort}"#;
    assert!(script.contains(lookup), "kind.sh's lookup changed: change it here too");
    assert!(script.contains("get podmonitor keyward-gate -o jsonpath='{.spec.namespaceSelector.any}'"));
    let docs = render_dir("deploy/e2e/gate");
    let template = &docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"];
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gate", "namespace": "lm-eval"},
        "spec": template["spec"]});
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), serde_json::to_vec(&pod).unwrap()).unwrap();
    let port_of = |name: &str| {
        // kind.sh reads the first pod of a list; a local patch prints the one pod itself.
        let jsonpath = lookup.replace("\\\"", "\"").replace("$gate_port", name).replace(".items[0]", "");
        let out = support::tool("kubectl")
            .env("KUBECONFIG", "/dev/null")
            .args(["patch", "--local", "-f"])
            .arg(file.path())
            .args(["--type=merge", "-p", "{}", "-o", &format!("jsonpath={jsonpath}")])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let monitor = render("local-self-managed");
    assert!(monitor.iter().all(|d| d["kind"] != "PodMonitor"), "the monitors come with the component");
    let install = render_dir("deploy/e2e/install");
    let monitor =
        install.iter().find(|d| d["kind"] == "PodMonitor" && d["metadata"]["name"] == "keyward-gate").unwrap();
    assert_eq!(monitor["spec"]["namespaceSelector"]["any"], true);
    assert_eq!(port_of(monitor["spec"]["podMetricsEndpoints"][0]["port"].as_str().unwrap()), "9091");
    assert_eq!(port_of("metrics"), "", "a port the sidecar does not declare");
}

#[test]
fn volumes_are_found_by_name_after_the_api_access_volume_the_apiserver_adds_first() {
    let kfp = admitted_pod("kfp-persistenceagent-pod-no-token.json");
    let pod: Value = serde_json::from_reader(std::fs::File::open(kfp.path()).unwrap()).unwrap();
    // What the old lookup (volumes[0]) read: the ServiceAccount plugin's volume.
    assert!(pod["spec"]["volumes"][0]["name"].as_str().unwrap().starts_with("kube-api-access-"));
    assert_eq!(
        jsonpath_of_volume(
            kfp.path(),
            "persistenceagent-sa-token",
            "projected.sources[0].serviceAccountToken.audience"
        ),
        "pipelines.kubeflow.org"
    );
    let lmeval = admitted_pod("lmeval-fms-driver-pod.json");
    let name = jsonpath_of_volume(lmeval.path(), "keyward-client-cert", "secret.secretName");
    assert!(name.ends_with("-lmeval-client"), "{name}");
}

#[test]
fn the_rotation_check_selects_the_webhooks_pods_and_not_the_controllers() {
    let docs = render("local");
    let labels = |name: &str| {
        let d = docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == name).unwrap();
        d["spec"]["template"]["metadata"]["labels"].as_object().unwrap().clone()
    };
    let selects = |selector: &str, labels: &serde_json::Map<String, Value>| {
        selector.split(',').all(|term| {
            let (k, v) = term.split_once('=').unwrap();
            labels.get(k).and_then(Value::as_str) == Some(v)
        })
    };
    let (webhook, controller) = (lib_var("WEBHOOK_PODS"), lib_var("CONTROLLER_PODS"));
    assert!(selects(&webhook, &labels("keyward")) && !selects(&webhook, &labels("keyward-controller")));
    assert!(selects(&controller, &labels("keyward-controller")) && !selects(&controller, &labels("keyward")));
    let script = std::fs::read_to_string(root().join("deploy/e2e/kind.sh")).unwrap();
    // The webhook's restarts and reloads; the controller's replicas only where it says so.
    for line in script.lines().filter(|l| l.contains("restartCount") || l.contains("for pod in")) {
        let by_webhook = line.contains("\"$WEBHOOK_PODS\"");
        let by_controller = line.contains("\"$CONTROLLER_PODS\"");
        assert!(by_webhook != by_controller, "selects pods by something else: {line}");
    }
    assert_eq!(
        script.matches("for pod in $(\"${K[@]}\" -n keyward-system get pods -l \"$CONTROLLER_PODS\"").count(),
        1
    );
}

// === the mTLS check ===

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `openssl s_server -www` requiring client certificates from `client_ca`, as the e2e's
/// tls-echo does. Returns once it accepts connections.
fn s_server(dir: &Path, client_ca: &Path) -> Server {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = support::tool("openssl")
        .args(["s_server", "-accept", &format!("127.0.0.1:{port}"), "-cert"])
        .arg(dir.join("server.crt"))
        .arg("-key")
        .arg(dir.join("server.key"))
        .args(["-Verify", "1", "-verify_return_error", "-CAfile"])
        .arg(client_ca)
        .arg("-www")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl is needed for this test");
    let server = Server { child, port };
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "openssl s_server did not listen on {port}");
        std::thread::yield_now();
    }
    server
}

fn mtls_check(server: &Server, dir: &Path, client: &str, server_ca: &str) -> Output {
    Command::new("sh")
        .arg(root().join("deploy/e2e/mtls-check.sh"))
        .args(["localhost", &server.port.to_string()])
        .arg(dir.join(format!("{client}.crt")))
        .arg(dir.join(format!("{client}.key")))
        .arg(dir.join(server_ca))
        .output()
        .unwrap()
}

#[test]
fn the_mtls_check_passes_only_when_the_server_answers_a_trusted_client() {
    let dir = tempfile::tempdir().unwrap();
    let now = SystemTime::now();
    let day = Duration::from_secs(86400);
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    let server_ca = Ca::mint("lm-eval gRPC", now, day).unwrap();
    let serving = server_ca.issue_serving(&["localhost".into()], now, day).unwrap();
    write("server-ca.crt", server_ca.cert_pem());
    write("server.crt", &serving.cert_pem);
    write("server.key", &serving.key_pem);
    // keyward's client CA, and a rogue one with the very same name.
    for (who, ca) in [
        ("client", Ca::mint("keyward client CA", now, day).unwrap()),
        ("rogue", Ca::mint("keyward client CA", now, day).unwrap()),
    ] {
        let leaf =
            ca.issue_client_identity(&[], "spiffe://cluster.local/ns/team-a/lmevaljob/e2e-eval", now, day).unwrap();
        write(&format!("{who}-ca.crt"), ca.cert_pem());
        write(&format!("{who}.crt"), &leaf.cert_pem);
        write(&format!("{who}.key"), &leaf.key_pem);
    }
    let server = s_server(dir.path(), &dir.path().join("client-ca.crt"));

    let ok = mtls_check(&server, dir.path(), "client", "server-ca.crt");
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert_eq!(
        String::from_utf8_lossy(&ok.stdout),
        format!("FILES-PRESENT\nMTLS-OK: localhost:{} answered over mutual TLS\n", server.port)
    );
    // A file keyward's injection names that is not there (or empty): refused before any call.
    std::fs::write(dir.path().join("empty.key"), "").unwrap();
    std::fs::copy(dir.path().join("client.crt"), dir.path().join("empty.crt")).unwrap();
    let missing = mtls_check(&server, dir.path(), "empty", "server-ca.crt");
    assert_eq!(missing.status.code(), Some(1));
    assert!(missing.stdout.is_empty(), "{}", String::from_utf8_lossy(&missing.stdout));
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr),
        format!("FILES-MISSING: {} is missing or empty\n", dir.path().join("empty.key").display())
    );

    // With TLS 1.3 the rogue client completes its handshake; the server's refusal comes after.
    let rogue = mtls_check(&server, dir.path(), "rogue", "server-ca.crt");
    assert_eq!(rogue.status.code(), Some(1), "a rogue client certificate passed the check");
    assert!(String::from_utf8_lossy(&rogue.stderr).starts_with("MTLS-FAILED: "));
    // A server the client does not trust.
    let untrusted = mtls_check(&server, dir.path(), "client", "rogue-ca.crt");
    assert_eq!(untrusted.status.code(), Some(1));
}

// === kind.sh and clusters it did not create ===

/// Runs kind.sh with stub `docker`, `kind`, `kubectl` and `openssl` that log their arguments.
/// `clusters`: what `kind get clusters` prints; `create_ok`: whether `kind create` succeeds.
/// Every `kubectl` call fails, which stops the script at its first cluster step.
fn run_kind_sh(clusters: &str, create_ok: bool, keep: bool) -> (Output, String) {
    let bin = tempfile::tempdir().unwrap();
    let log = bin.path().join("calls.log");
    let stub = |name: &str, body: &str| {
        let path = bin.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\necho \"{name} $*\" >> '{}'\n{body}\n", log.display())).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    };
    stub("docker", "exit 0");
    stub("openssl", "exit 0");
    stub("kubectl", "exit 1");
    let create = if create_ok { "exit 0" } else { "exit 1" };
    stub(
        "kind",
        &format!("case \"$1 $2\" in\n  'get clusters') printf '%s' '{clusters}' ;;\n  'create cluster') {create} ;;\nesac\nexit 0"),
    );
    let path = format!("{}:{}", bin.path().display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("bash")
        .arg(root().join("deploy/e2e/kind.sh"))
        .env("PATH", path)
        .env("KEEP", if keep { "1" } else { "0" })
        .env_remove("CLUSTER")
        .output()
        .unwrap();
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    (out, calls)
}

#[test]
fn kind_sh_refuses_a_cluster_that_exists_and_never_deletes_one_it_did_not_create() {
    // Left behind by KEEP=1: refused, and still there afterwards.
    let (out, calls) = run_kind_sh("other\nkeyward-e2e\n", true, false);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a kind cluster named keyward-e2e exists already"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!calls.contains("create cluster") && !calls.contains("delete cluster"), "{calls}");

    // kind create failed: nothing of ours to delete.
    let (out, calls) = run_kind_sh("", false, false);
    assert!(!out.status.success());
    assert!(calls.contains("kind create cluster --name keyward-e2e") && !calls.contains("delete cluster"), "{calls}");

    // Created, then a later step failed: the cluster it created is deleted...
    let (out, calls) = run_kind_sh("", true, false);
    assert!(!out.status.success());
    assert!(calls.contains("kind delete cluster --name keyward-e2e"), "{calls}");
    // ...unless KEEP=1.
    let (out, calls) = run_kind_sh("", true, true);
    assert!(!out.status.success());
    assert!(calls.contains("kind create cluster") && !calls.contains("delete cluster"), "{calls}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("cluster kept: kubectl --context kind-keyward-e2e"));
}

#[test]
fn cert_manager_is_ready_when_its_webhook_admits_a_dry_run_not_when_it_rolled_out() {
    // A stub kubectl that refuses (as the apiserver does before cainjector has run) twice.
    let dir = tempfile::tempdir().unwrap();
    let count = dir.path().join("count");
    let stub = dir.path().join("kubectl");
    std::fs::write(
        &stub,
        format!(
            "#!/bin/sh\ncat > {dir}/body\necho \"$*\" >> {dir}/args\nn=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}\n[ $n -ge 3 ]\n",
            dir = dir.path().display(),
            count = count.display()
        ),
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = with_lib(&format!("WAIT_INTERVAL=0 wait_for_cert_manager {} --context kind-x", stub.display()));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&count).unwrap().trim(), "3");
    let args = std::fs::read_to_string(dir.path().join("args")).unwrap();
    assert_eq!(args.lines().last(), Some("--context kind-x apply --dry-run=server -f -"));
    let body: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("body")).unwrap()).unwrap();
    assert_eq!((body["apiVersion"].as_str(), body["kind"].as_str()), (Some("cert-manager.io/v1"), Some("Issuer")));

    // Never admitted: a failure that says so, after the tries it was given.
    std::fs::write(&count, "-100").unwrap();
    let out = with_lib(&format!("WAIT_TRIES=4 WAIT_INTERVAL=0 wait_for_cert_manager {}", stub.display()));
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "cert-manager's webhook did not admit a dry-run Issuer after 4 tries\n"
    );
}

#[test]
fn the_operator_kind_sh_impersonates_is_the_one_the_manifests_pin() {
    let docs = render("local");
    let webhook = docs.iter().find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "keyward").unwrap();
    let pinned = webhook["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix("--operator-namespace=lmeval="))
        .unwrap()
        .to_string();
    let script = std::fs::read_to_string(root().join("deploy/e2e/kind.sh")).unwrap();
    assert!(script.contains(&format!("LMEVAL_USER=\"system:serviceaccount:{pinned}:lm-eval-controller-manager\"")));
    assert!(script.contains(&format!("-n {pinned} create serviceaccount lm-eval-controller-manager")));
}

// === every check fails when its subject is broken ===

/// Runs `script` with lib.sh, returning (exit code, stdout, stderr).
fn lib_run(script: &str) -> (i32, String, String) {
    let out = with_lib(script);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn expect_and_expect_contains_fail_on_what_differs() {
    assert_eq!(lib_run("expect label same same"), (0, "ok: label = same\n".into(), String::new()));
    let (code, _, err) = lib_run("expect 'lmeval volumes' '' 'keyward-client-cert'; echo not reached");
    assert_eq!((code, err.as_str()), (1, "\nFAIL: lmeval volumes: got '', expected 'keyward-client-cert'\n"));
    assert_eq!(lib_run("expect_contains l 'a MTLS-OK b' MTLS-OK").0, 0);
    assert_eq!(lib_run("expect_contains l 'MTLS-FAILED' MTLS-OK").0, 1);
    // An empty needle would match anything: a check built from an empty value fails.
    let (code, _, err) = lib_run("expect_contains 'controller signs' 'anything' ''");
    assert_eq!((code, err.as_str()), (1, "\nFAIL: controller signs: nothing to look for\n"));
}

/// A refused pod prints nothing: a check that expects nothing must still fail then. The fake
/// here is the API server refusing the dry run, as it would if keyward wrongly denied the pod.
#[test]
fn a_check_of_an_empty_value_fails_when_the_command_is_refused() {
    let refusing = "dry_create() { echo 'Error from server (Forbidden): admission webhook \"keyward.io\" denied the request' >&2; return 1; }";
    let (code, _, err) = lib_run(&format!(
        "{refusing}; expect 'ray pod unchanged' \"$(dry_create u f '{{.metadata.annotations}}')\" ''; echo not reached"
    ));
    assert_eq!(code, 1);
    assert!(err.ends_with("\nFAIL: ray pod unchanged: expects nothing, which a failed command prints too: check it with expect_output\n"), "{err}");
    let (code, out, err) =
        lib_run(&format!("{refusing}; expect_output 'ray pod unchanged' '' dry_create u f x; echo not reached"));
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(
        err.contains("denied the request")
            && err.ends_with("\nFAIL: ray pod unchanged: the command failed: dry_create u f x\n"),
        "{err}"
    );
    let (code, _, err) = lib_run(&format!(
        "{refusing}; expect_output_contains 'audit annotation' lmeval dry_create u f x; echo not reached"
    ));
    assert_eq!(code, 1);
    assert!(err.ends_with("\nFAIL: audit annotation: the command failed: dry_create u f x\n"), "{err}");
    // Admitted: the empty value is what it says, and a wrong one fails.
    assert_eq!(lib_run("dry_create() { echo; }; expect_output 'ray pod unchanged' '' dry_create").0, 0);
    assert_eq!(
        lib_run("dry_create() { echo 'raycluster-sample||'; }; expect_output r 'raycluster-sample||' dry_create"),
        (0, "ok: r = 'raycluster-sample||'\n".into(), String::new())
    );
    assert_eq!(lib_run("dry_create() { echo '{\"keyward.io/injected\": 1}'; }; expect_output r '' dry_create").0, 1);
    assert_eq!(lib_run("dry_create() { echo 'x \"profile\":\"lmeval\"'; }; expect_output_contains a '\"profile\":\"lmeval\"' dry_create").0, 0);
}

#[test]
fn output_has_reads_the_whole_output_where_a_grep_q_pipe_fails_on_sigpipe() {
    // A log that goes on after the line looked for: `| grep -q` quits at the line, the writer
    // gets SIGPIPE, and under pipefail the check fails though the line is there.
    let log = "big_log() { echo needle; head -c 4000000 /dev/zero | tr '\\0' x; echo; }";
    assert_ne!(lib_run(&format!("{log}; big_log | grep -q needle")).0, 0, "the hazard this helper avoids");
    assert_eq!(lib_run(&format!("{log}; output_has needle big_log")).0, 0);
    assert_eq!(lib_run(&format!("{log}; output_has absent big_log")).0, 1);
    // A command that fails (no such pod yet) is not a match, whatever it printed.
    assert_eq!(lib_run("output_has needle sh -c 'echo needle; exit 1'").0, 1);
}

#[test]
fn prints_counts_an_uninjected_admission_as_a_failure() {
    // The rotation check: admitted *and* injected. A pod keyward never saw is admitted with no
    // volume: the jsonpath prints nothing.
    let count = |stub: &str| {
        lib_run(&format!(
            "dry_create() {{ {stub}; }}; failures=0; prints evaljob-sample-lmeval-client dry_create || failures=$((failures + 1)); echo $failures"
        ))
        .1
    };
    assert_eq!(count("echo evaljob-sample-lmeval-client"), "0\n");
    assert_eq!(count("echo ''"), "1\n", "admitted without keyward");
    assert_eq!(count("echo evaljob-sample-lmeval-client; return 1"), "1\n", "refused");
}

#[test]
fn line_with_finds_the_line_or_nothing_so_the_check_after_it_fails() {
    let logs = "logs() { printf '%s\\n' '{\"message\":\"profiles loaded\"}' '{\"message\":\"signing PodCertificateRequests of keyward signers\",\"signers\":\"[\\\"keyward.io/lmeval\\\"]\"}'; }";
    let (code, out, _) = lib_run(&format!("{logs}; line_with 'signing PodCertificateRequests' logs"));
    assert_eq!(code, 0);
    assert!(out.contains("keyward.io/lmeval") && out.starts_with("{\"message\":\"signing"), "{out}");
    // A replica without the profile prints the line with no signer: the e2e check fails.
    let none =
        "logs() { echo '{\"message\":\"signing PodCertificateRequests of keyward signers\",\"signers\":\"[]\"}'; }";
    let check = "expect_contains signs \"$(line_with 'signing PodCertificateRequests' logs)\" keyward.io/lmeval";
    assert_eq!(lib_run(&format!("{none}; {check}")).0, 1);
    assert_eq!(lib_run(&format!("{logs}; {check}")).0, 0);
    assert_eq!(lib_run("logs() { echo other; }; [[ -z \"$(line_with needle logs)\" ]]").0, 0);
}

#[test]
fn wait_settled_waits_out_terminating_pods_and_fails_when_they_stay() {
    let kubectl = |deleting: &str| {
        format!("kubectl() {{ [[ \"$*\" == *'get pods -l app=x -o jsonpath={{.items[*].metadata.deletionTimestamp}}'* ]] || return 9; {deleting}; }}")
    };
    let fast = "WAIT_TRIES=3 WAIT_INTERVAL=0";
    assert_eq!(lib_run(&format!("{}; {fast} wait_settled app=x kubectl", kubectl("echo"))).0, 0);
    let (code, _, err) =
        lib_run(&format!("{}; {fast} wait_settled app=x kubectl", kubectl("echo 2026-12-02T11:00:00Z")));
    assert_eq!((code, err.as_str()), (1, "pods app=x still terminating after 3 tries\n"));
    // Terminating on the first look, gone on the second.
    let script = format!(
        "{}; {fast} wait_settled app=x kubectl",
        kubectl("if [[ -e $T/seen ]]; then echo; else touch $T/seen; echo 2026-12-02T11:00:00Z; fi")
    );
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(lib_run(&format!("T={}; {script}", dir.path().display())).0, 0);
    // The API unreachable is not "settled".
    assert_eq!(lib_run(&format!("{}; {fast} wait_settled app=x kubectl", kubectl("return 1"))).0, 1);
}

#[test]
fn kind_sh_checks_what_it_means_to() {
    let script = std::fs::read_to_string(root().join("deploy/e2e/kind.sh")).unwrap();
    // No check that passes on a missing file or fails on SIGPIPE.
    assert!(!script.contains("| grep -q"), "read whole output (output_has), never `| grep -q` under pipefail");
    assert!(!script.contains("test -s"), "file checks live in mtls-check.sh, one per file");
    // The self-managed half opts the namespace in again before it sends pods to keyward.
    let opted_out = script.find("label namespace \"$NS\" keyward.io/inject-").unwrap();
    let opted_in_again =
        script[opted_out..].find("label namespace \"$NS\" keyward.io/inject=enabled").unwrap() + opted_out;
    let first_self_managed_check = script.find("\"lmeval with self-managed certificates\"").unwrap();
    assert!(opted_out < opted_in_again && opted_in_again < first_self_managed_check);
    // Every rollout is waited out to the end (old pods gone) before pods are read.
    for (at, _) in script.match_indices("rollout status deploy/keyward") {
        let inside_rolled_out =
            script[..at].rfind("rolled_out() {").is_some_and(|start| !script[start..at].contains("\n}\n"));
        let followed = script[at..].split("\n").take(4).any(|l| l == "rolled_out");
        assert!(inside_rolled_out || followed, "a rollout not followed by rolled_out at byte {at}");
    }
    // No check of an empty value made from a command substitution (lib.sh refuses it at run
    // time too): a refused pod would pass it.
    let empty: Vec<&str> = script.lines().filter(|l| l.starts_with("expect ") && l.ends_with(" \"\"")).collect();
    assert!(empty.is_empty(), "use expect_output: {empty:?}");
    // The rotation counts an uninjected admission as a failure.
    assert!(script.contains("prints evaljob-sample-lmeval-client dry_create \"$LMEVAL_USER\" \"$WORK/lmeval.yaml\" \"$injected_secret\" || failures=$((failures + 1))"));
}
