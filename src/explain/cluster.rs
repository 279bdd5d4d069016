//! `keyward explain --cluster`: what the cluster says about a pod's namespace and the objects
//! it would depend on, read-only.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use keyward_controller::desired::OPT_IN;
use keyward_engine::inject::ObjectKind;
use keyward_engine::Explanation;
use kube::Api;

use crate::kubeconfig::{request_failed, Cluster, ClusterUnreadable};
use serde::Serialize;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Seen {
    pub namespace: String,
    pub namespace_exists: bool,
    /// Labelled `keyward.io/inject=enabled`: the webhook is called for its pods.
    pub opted_in: bool,
    /// Every object the admitted pod would newly depend on, and whether it exists now.
    pub requires: Vec<Required>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Required {
    pub kind: ObjectKind,
    pub name: String,
    pub provided_by: &'static str,
    pub exists: bool,
}

pub async fn look(cluster: &Cluster, namespace: &str, explanation: &Explanation) -> Result<Seen, ClusterUnreadable> {
    let client = &cluster.client;
    let refused =
        |what: String| move |e: kube::Error| request_failed(&cluster.server, &format!("--cluster: {what}"), &e);
    let ns = Api::<Namespace>::all(client.clone())
        .get_opt(namespace)
        .await
        .map_err(refused(format!("get namespaces/{namespace}")))?;
    let opted_in = ns
        .as_ref()
        .and_then(|n| n.metadata.labels.as_ref())
        .is_some_and(|l| l.get(OPT_IN.0).map(String::as_str) == Some(OPT_IN.1));
    let mut requires = Vec::new();
    if let Ok(mutation) = &explanation.decision.outcome {
        for r in mutation.requires() {
            let what = format!("get {:?} {}/{}", r.kind, namespace, r.name);
            let exists = match r.kind {
                ObjectKind::Secret => {
                    Api::<Secret>::namespaced(client.clone(), namespace).get_opt(&r.name).await.map(|o| o.is_some())
                }
                ObjectKind::ConfigMap => {
                    Api::<ConfigMap>::namespaced(client.clone(), namespace).get_opt(&r.name).await.map(|o| o.is_some())
                }
                ObjectKind::ServiceAccount => Api::<ServiceAccount>::namespaced(client.clone(), namespace)
                    .get_opt(&r.name)
                    .await
                    .map(|o| o.is_some()),
                ObjectKind::ClusterTrustBundle if r.is_object() => {
                    keyward_controller::signer::trust_bundle_exists(client, &r.name).await
                }
                // Not an object in the namespace: `requires` names it; nothing to look up.
                ObjectKind::Signer | ObjectKind::ClusterTrustBundle => continue,
            }
            .map_err(refused(what))?;
            requires.push(Required { kind: r.kind, name: r.name.clone(), provided_by: r.provided_by.as_str(), exists });
        }
    }
    Ok(Seen { namespace: namespace.to_string(), namespace_exists: ns.is_some(), opted_in, requires })
}

impl Seen {
    /// The text output's `cluster:` lines.
    pub fn text(&self) -> String {
        let ns = &self.namespace;
        let mut out = match (self.namespace_exists, self.opted_in) {
            (false, _) => format!("cluster:    namespace {ns} does not exist\n"),
            (true, true) => format!("cluster:    namespace {ns} opted in ({}={})\n", OPT_IN.0, OPT_IN.1),
            (true, false) => format!(
                "cluster:    namespace {ns} is NOT labelled {}={}: the webhook is not called for its pods\n",
                OPT_IN.0, OPT_IN.1
            ),
        };
        for r in &self.requires {
            let state = match (r.exists, r.provided_by) {
                (true, _) => "exists".to_string(),
                (false, "keyward") if r.kind == ObjectKind::ClusterTrustBundle => {
                    "missing now (keyward's controller publishes it from the profile's source; see its logs)"
                        .to_string()
                }
                (false, "keyward") => {
                    "missing now (keyward's controller makes it when the namespace opts in or the pod is admitted)"
                        .to_string()
                }
                (false, _) => "MISSING: create it, or the pod will not start".to_string(),
            };
            // Cluster-wide: no namespace.
            let place =
                if r.kind == ObjectKind::ClusterTrustBundle { r.name.clone() } else { format!("{ns}/{}", r.name) };
            out.push_str(&format!("  - {:?} {place}: {state}\n", r.kind));
        }
        out
    }
}
