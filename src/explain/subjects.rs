//! What `keyward explain` reads: the documents of a file, each a Pod, an AdmissionReview, a
//! workload (whose pod template is what keyward would see), or a `List` of those.
//!
//! A workload's pod is made as its controller makes it: the template's metadata and spec, the
//! workload's namespace, `generateName`, and the controller ownerReference (a Deployment's
//! pods are owned by its ReplicaSet, a CronJob's by its Jobs). It is requested by that
//! controller's service account in kube-controller-manager (as it runs with
//! `--use-service-account-credentials`, the default of kubeadm, kind and the managed clouds).

use anyhow::bail;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use keyward_engine::yaml;
use serde_json::{json, Value};

/// One pod to explain, and where it came from.
#[derive(Debug)]
pub struct Subject {
    /// What it is, for the output: `Pod team-a/web-0`, `Deployment team-a/web`.
    pub what: String,
    pub input: Input,
    /// Who creates such pods (a workload's controller), unless the user says otherwise.
    pub creator: Option<&'static str>,
}

/// A Pod, or an AdmissionReview as JSON bytes.
#[derive(Debug)]
pub enum Input {
    Pod(Value),
    Review(Vec<u8>, String),
}

/// A workload kind: where its pod template is, and what owns and creates its pods.
struct Workload {
    kind: &'static str,
    template: &'static [&'static str],
    /// The owner's apiVersion and kind, and its name from the workload's.
    owner: (&'static str, &'static str, fn(&str) -> String),
    creator: &'static str,
}

const REPLICASET_CONTROLLER: &str = "system:serviceaccount:kube-system:replicaset-controller";
const JOB_CONTROLLER: &str = "system:serviceaccount:kube-system:job-controller";

const WORKLOADS: [Workload; 6] = [
    Workload {
        kind: "Deployment",
        template: &["spec", "template"],
        // The ReplicaSet's name ends in the template's hash, known only in the cluster.
        owner: ("apps/v1", "ReplicaSet", |name| format!("{name}-pod-template-hash")),
        creator: REPLICASET_CONTROLLER,
    },
    Workload {
        kind: "ReplicaSet",
        template: &["spec", "template"],
        owner: ("apps/v1", "ReplicaSet", str::to_string),
        creator: REPLICASET_CONTROLLER,
    },
    Workload {
        kind: "StatefulSet",
        template: &["spec", "template"],
        owner: ("apps/v1", "StatefulSet", str::to_string),
        creator: "system:serviceaccount:kube-system:statefulset-controller",
    },
    Workload {
        kind: "DaemonSet",
        template: &["spec", "template"],
        owner: ("apps/v1", "DaemonSet", str::to_string),
        creator: "system:serviceaccount:kube-system:daemon-set-controller",
    },
    Workload {
        kind: "Job",
        template: &["spec", "template"],
        owner: ("batch/v1", "Job", str::to_string),
        creator: JOB_CONTROLLER,
    },
    Workload {
        kind: "CronJob",
        template: &["spec", "jobTemplate", "spec", "template"],
        // Each Job is named after the minute it was scheduled for.
        owner: ("batch/v1", "Job", |name| format!("{name}-29000000")),
        creator: JOB_CONTROLLER,
    },
];

/// The kinds explain reads, for messages.
const KINDS: &str =
    "a Pod, an AdmissionReview, a Deployment, ReplicaSet, StatefulSet, DaemonSet, Job or CronJob, or a List of them";

/// Every subject in `text`, in order. Any document that cannot be explained is an error that
/// names it: nothing is explained from a file keyward cannot read whole.
pub fn parse(label: &str, text: &str, namespace: Option<&str>) -> anyhow::Result<Vec<Subject>> {
    let documents =
        yaml::documents(text).map_err(|e| anyhow::anyhow!("{label}: not valid YAML or JSON: {}", e.message))?;
    if documents.is_empty() {
        bail!("{label}: empty; expected {KINDS}");
    }
    let several = documents.len() > 1;
    let mut subjects = Vec::new();
    for document in &documents {
        let at = if several { format!("{label} (document {})", document.index) } else { label.to_string() };
        subjects.extend(subjects_of(&at, document, namespace, true)?);
    }
    Ok(subjects)
}

fn subjects_of(
    label: &str,
    document: &yaml::Document,
    namespace: Option<&str>,
    top: bool,
) -> anyhow::Result<Vec<Subject>> {
    let value = &document.value;
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("(no name)");
    let ns = namespace.or_else(|| value.pointer("/metadata/namespace").and_then(Value::as_str)).unwrap_or("default");
    match kind {
        "AdmissionReview" => {
            let bytes = serde_json::to_vec(value)?;
            let request = keyward_engine::review::parse_request(&bytes).map_err(|e| anyhow::anyhow!("{label}: {e}"))?;
            match document.subtree(&["request", "object"]) {
                Some(object) if !matches!(request.object, keyward_engine::review::Object::Missing) => {
                    check::<Pod>(label, &object, "request.object.", "Pod")?
                }
                _ => bail!("{label}: the AdmissionReview has no request.object"),
            }
            let what = format!("AdmissionReview {}", request.uid);
            Ok(vec![Subject { what, input: Input::Review(bytes, label.to_string()), creator: None }])
        }
        "Pod" => {
            check::<Pod>(label, document, "", "Pod")?;
            Ok(vec![Subject { what: format!("Pod {ns}/{name}"), input: Input::Pod(value.clone()), creator: None }])
        }
        // `kubectl get … -o yaml` of several objects: a List (or a typed one, `PodList`).
        list if top && list.ends_with("List") && value.get("items").is_some_and(Value::is_array) => {
            let count = value["items"].as_array().map_or(0, Vec::len);
            let mut subjects = Vec::new();
            for i in 0..count {
                let Some(item) = document.item("items", i) else { continue };
                subjects.extend(subjects_of(&format!("{label} items[{i}]"), &item, namespace, false)?);
            }
            Ok(subjects)
        }
        "" => bail!("{label}: no `kind`; expected {KINDS}"),
        other => {
            let Some(workload) = WORKLOADS.iter().find(|w| w.kind == other) else {
                bail!("{label}: kind {other} is not {KINDS}")
            };
            let path = workload.template.join(".");
            let Some(template) = document.subtree(workload.template) else {
                bail!("{label}: {other} {ns}/{name} has no {path}")
            };
            check::<PodTemplateSpec>(label, &template, &format!("{path}."), "pod template")?;
            let (api_version, owner_kind, owner_name) = workload.owner;
            let owner = owner_name(name);
            let pod = json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "generateName": format!("{owner}-"),
                    "namespace": ns,
                    "labels": template.value.pointer("/metadata/labels").cloned().unwrap_or(json!({})),
                    "annotations": template.value.pointer("/metadata/annotations").cloned().unwrap_or(json!({})),
                    "ownerReferences": [{
                        "apiVersion": api_version, "kind": owner_kind, "name": owner,
                        "uid": "00000000-0000-0000-0000-000000000000", "controller": true, "blockOwnerDeletion": true
                    }]
                },
                "spec": template.value.get("spec").cloned().unwrap_or(json!({})),
            });
            let what = format!("{other} {ns}/{name} (its pods, owned by {owner_kind} {owner})");
            Ok(vec![Subject { what, input: Input::Pod(pod), creator: Some(workload.creator) }])
        }
    }
}

/// An object that does not decode as `T` never reaches a webhook: the apiserver refuses it
/// first. Every such problem is reported, each with its field (`prefix` + path) and where it
/// is in the file.
fn check<T: serde::de::DeserializeOwned>(
    label: &str,
    document: &yaml::Document,
    prefix: &str,
    what: &str,
) -> anyhow::Result<()> {
    let Err(problems) = yaml::check::<T>(document) else { return Ok(()) };
    let lines: Vec<String> = problems
        .iter()
        .map(|p| {
            let at = p.position.map(|p| format!(" ({p})")).unwrap_or_default();
            let field = if p.path.is_empty() {
                prefix.trim_end_matches('.').to_string()
            } else {
                format!("{prefix}{}", p.path)
            };
            format!("{label}: {field}{at}: {}", p.message)
        })
        .collect();
    bail!(
        "{label}: not a valid {what}, so the apiserver would refuse it before any webhook sees it:\n{}",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Subject {
        let mut subjects = parse("f.yaml", text, None).unwrap();
        assert_eq!(subjects.len(), 1);
        subjects.remove(0)
    }

    fn pod_of(subject: &Subject) -> &Value {
        match &subject.input {
            Input::Pod(pod) => pod,
            Input::Review(..) => panic!("a review"),
        }
    }

    const TEMPLATE: &str =
        "metadata: {labels: {app: web}, annotations: {a: b}}\n    spec: {containers: [{name: c, image: busybox}]}";

    #[test]
    fn each_workload_kind_gives_the_pod_its_controller_would_create() {
        for (kind, owner, creator) in [
            (
                "Deployment",
                json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-pod-template-hash"}),
                REPLICASET_CONTROLLER,
            ),
            (
                "ReplicaSet",
                json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web"}),
                REPLICASET_CONTROLLER,
            ),
            (
                "StatefulSet",
                json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web"}),
                "system:serviceaccount:kube-system:statefulset-controller",
            ),
            (
                "DaemonSet",
                json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "web"}),
                "system:serviceaccount:kube-system:daemon-set-controller",
            ),
            ("Job", json!({"apiVersion": "batch/v1", "kind": "Job", "name": "web"}), JOB_CONTROLLER),
        ] {
            let api = if kind == "Job" { "batch/v1" } else { "apps/v1" };
            let s = one(&format!(
                "apiVersion: {api}\nkind: {kind}\nmetadata: {{name: web, namespace: team-a}}\nspec:\n  template:\n    {TEMPLATE}\n"
            ));
            let pod = pod_of(&s);
            assert_eq!(s.creator, Some(creator), "{kind}");
            assert_eq!(pod["metadata"]["namespace"], "team-a");
            assert_eq!(pod["metadata"]["labels"], json!({"app": "web"}));
            assert_eq!(pod["metadata"]["annotations"], json!({"a": "b"}));
            assert_eq!(pod["metadata"]["generateName"], format!("{}-", owner["name"].as_str().unwrap()));
            let reference = &pod["metadata"]["ownerReferences"][0];
            for field in ["apiVersion", "kind", "name"] {
                assert_eq!(reference[field], owner[field], "{kind} {field}");
            }
            assert_eq!(reference["controller"], true);
            assert_eq!(pod["spec"]["containers"][0]["name"], "c");
        }
        let cron = one(&format!(
            "apiVersion: batch/v1\nkind: CronJob\nmetadata: {{name: nightly}}\nspec:\n  schedule: '0 1 * * *'\n  jobTemplate:\n    spec:\n      template:\n        {}\n",
            TEMPLATE.replace("\n    ", "\n        ")
        ));
        let pod = pod_of(&cron);
        assert_eq!(cron.creator, Some(JOB_CONTROLLER));
        assert_eq!(pod["metadata"]["namespace"], "default");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "Job");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["name"], "nightly-29000000");
        assert_eq!(cron.what, "CronJob default/nightly (its pods, owned by Job nightly-29000000)");
    }

    #[test]
    fn lists_and_several_documents_are_explained_in_order() {
        let list = format!(
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: apps/v1\n  kind: StatefulSet\n  metadata: {{name: db, namespace: data}}\n  spec:\n    template:\n      {}\n- apiVersion: v1\n  kind: Pod\n  metadata: {{name: solo, namespace: data}}\n  spec: {{containers: [{{name: c, image: busybox}}]}}\n",
            TEMPLATE.replace("\n    ", "\n      ")
        );
        let text = format!("{list}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: last}}\nspec: {{containers: [{{name: c, image: x}}]}}\n");
        let subjects = parse("f.yaml", &text, None).unwrap();
        let what: Vec<&str> = subjects.iter().map(|s| s.what.as_str()).collect();
        assert_eq!(
            what,
            ["StatefulSet data/db (its pods, owned by StatefulSet db)", "Pod data/solo", "Pod default/last"]
        );
        // -n overrides every namespace.
        let subjects = parse("f.yaml", &text, Some("other")).unwrap();
        assert!(subjects.iter().all(|s| s.what.contains(" other/")), "{subjects:?}");
    }

    #[test]
    fn a_bad_item_names_its_document_its_field_and_its_line() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: x}]}\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: apps/v1\n  kind: Deployment\n  metadata: {name: web}\n  spec:\n    template:\n      spec: {containers: [{name: c, image: x, ports: [{containerPort: high}]}]}\n";
        let err = parse("f.yaml", text, None).unwrap_err().to_string();
        assert!(err.starts_with("f.yaml (document 2) items[0]: not a valid pod template"), "{err}");
        assert!(err.contains("spec.template.spec.containers[0].ports[0].containerPort (line 14"), "{err}");
        let err =
            parse("f.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n", None).unwrap_err().to_string();
        assert_eq!(err, format!("f.yaml: kind Service is not {KINDS}"));
        let err = parse("f.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {}\n", None)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "f.yaml: Deployment default/d has no spec.template");
    }
}
