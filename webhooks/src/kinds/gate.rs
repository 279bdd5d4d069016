//! keyward gate in front of a server of the pod, on that server's own port: for a server whose
//! pod an operator owns and recreates (EvalHub's kube-rbac-proxy), where the gate can only be
//! placed as the pod is created. The gate becomes a native sidecar (an init container with
//! `restartPolicy: Always`: up and ready before the pod's containers) listening on the port;
//! the server's listen argument moves to 127.0.0.1 on another port, where only the pod reaches
//! it, and the gate forwards to it there, verifying its certificate for the name it holds.
//!
//! What the pod must already have is read at planning ([`crate::placement`]): the server's
//! container and its listen argument on this port, the volumes with the serving certificate
//! and the CA, and the Kubernetes API token's volume (the gate's reviews and watch use the
//! pod's account; the ServiceAccount plugin mounted it into the pod's containers before
//! keyward was called, so keyward mounts it into the gate itself).

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Kind;
use crate::inject::{
    AuditItem, Check, Injection, ObjectKind, Placement, ProbeKind, Provision, Requirement, Unresolved,
};
use crate::names::{is_dns1123_label, NameTemplate, TemplateContext, SERVICE_ACCOUNT_MOUNT_PATH};

/// The gate's container: a name no operator's container is likely to have.
pub const CONTAINER: &str = "keyward-gate";
/// The volume of the gate file, from [`Gate::config_map`].
pub const CONFIG_VOLUME: &str = "keyward-gate-config";
const CONFIG_DIR: &str = "/etc/keyward/gate";
const TLS_DIR: &str = "/var/run/keyward/gate-tls";
const CA_DIR: &str = "/var/run/keyward/upstream-ca";

/// `gate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gate {
    /// keyward's image, as the install maps it.
    pub image: String,
    /// The ConfigMap, in the pod's namespace, whose `gate.yaml` is the gate file.
    pub config_map: String,
    /// The port the gate takes: the server's, which its Service and probes name.
    pub port: u16,
    /// The pod's volume with the serving certificate (`tls.crt`, `tls.key`) the server used
    /// for that port: the gate serves it now, reloaded as it rotates.
    pub tls_volume: NameTemplate,
    /// The gate's `/metrics`, `/healthz` and `/readyz` (plain HTTP).
    #[serde(default = "default_metrics_port")]
    pub metrics_port: u16,
    pub in_front_of: InFrontOf,
}

/// `gate.inFrontOf`: the server the gate takes the port from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InFrontOf {
    /// Its container (in `containers` or `initContainers`).
    pub container: String,
    /// Its argument `NAME=HOST:PORT` that says where it listens, with PORT = `gate.port`.
    pub listen_argument: String,
    /// The port it moves to, on 127.0.0.1.
    pub port: u16,
    /// The name its certificate holds, which the gate verifies it for.
    pub server_name: NameTemplate,
    /// The pod's volume, and the key in it, with the CA that signed that certificate.
    pub ca: VolumeKey,
    /// Its probes to remove: one that reaches what moved to 127.0.0.1 with it (kube-rbac-proxy
    /// binds its `--proxy-endpoints-port` to the listen address's host) would fail for ever.
    #[serde(default)]
    pub remove_probes: Vec<ProbeKind>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeKey {
    pub volume: NameTemplate,
    pub key: String,
}

fn default_metrics_port() -> u16 {
    9091
}

impl Kind for Gate {
    fn validate(&self, check: &mut Check) {
        let Self { image, config_map, port, tls_volume: _, metrics_port, in_front_of } = self;
        if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
            check.problem(
                "image",
                format!("{image:?} is not an image reference; give keyward's, as the install maps it"),
            );
        }
        if !crate::names::is_dns1123_subdomain(config_map) {
            check.problem("configMap", format!("{config_map:?} is not a valid ConfigMap name"));
        }
        check.volume_name("", CONFIG_VOLUME);
        let InFrontOf { container, listen_argument, port: moved, server_name: _, ca, remove_probes: _ } = in_front_of;
        if !is_dns1123_label(container) {
            check.problem("inFrontOf.container", format!("{container:?} is not a valid container name"));
        }
        if !listen_argument.starts_with('-') || listen_argument.contains(['=', ' ']) {
            check.problem(
                "inFrontOf.listenArgument",
                format!("{listen_argument:?}: give the flag alone, as --secure-listen-address"),
            );
        }
        check.data_key("inFrontOf.ca.key", &ca.key);
        let ports = [("port", *port), ("metricsPort", *metrics_port), ("inFrontOf.port", *moved)];
        for (i, (field, value)) in ports.iter().enumerate() {
            if *value == 0 {
                check.problem(field, "must be a port, 1 to 65535");
            } else if let Some((other, _)) = ports[..i].iter().find(|(_, v)| v == value) {
                check.problem(field, format!("{value} is also {other}; each needs a port of its own"));
            }
        }
    }

    fn plan(&self, pod: &TemplateContext<'_>) -> Result<Injection, Unresolved> {
        let tls = self.tls_volume.resolve(pod).map_err(|reason| Unresolved { field: "tlsVolume", reason })?;
        let front = &self.in_front_of;
        let server_name =
            front.server_name.resolve(pod).map_err(|reason| Unresolved { field: "inFrontOf.serverName", reason })?;
        let ca = front.ca.volume.resolve(pod).map_err(|reason| Unresolved { field: "inFrontOf.ca.volume", reason })?;
        let moved_to = format!("127.0.0.1:{}", front.port);
        let item = AuditItem::new("gate")
            .with("configMap", &self.config_map)
            .with("port", self.port.to_string())
            .with("inFrontOf", &front.container)
            .with("movedTo", &moved_to);
        let mut injection = Injection::new(item);
        injection.requires.push(Requirement::new(ObjectKind::ConfigMap, self.config_map.clone(), Provision::User));
        let container = json!({
            "name": CONTAINER,
            "image": self.image,
            "restartPolicy": "Always",
            "args": [
                "gate",
                format!("--config={CONFIG_DIR}/gate.yaml"),
                format!("--listen=0.0.0.0:{}", self.port),
                format!("--metrics-listen=0.0.0.0:{}", self.metrics_port),
                format!("--tls-dir={TLS_DIR}"),
                format!("--upstream=https://{moved_to}"),
                format!("--upstream-ca={CA_DIR}/{}", front.ca.key),
                format!("--upstream-server-name={server_name}"),
                "--log-format=json",
            ],
            "ports": [{"name": "gate-metrics", "containerPort": self.metrics_port, "protocol": "TCP"}],
            // The pod's containers start once the gate serves, not once it is ready: a gate that
            // waits for its pod watch (its RBAC missing, say) must not keep the server from
            // starting, nor restart in a loop. Its readiness keeps the pod out of its Service
            // until it is ready (a native sidecar's readiness counts for the pod's).
            "startupProbe": {"httpGet": {"path": "/healthz", "port": self.metrics_port}, "periodSeconds": 1, "failureThreshold": 60},
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": self.metrics_port}, "periodSeconds": 5, "failureThreshold": 2},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": self.metrics_port}, "periodSeconds": 10, "failureThreshold": 3},
            "resources": {"requests": {"cpu": "20m", "memory": "24Mi"}, "limits": {"memory": "128Mi"}},
            "securityContext": {
                "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true,
                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumeMounts": [
                {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": true},
                {"name": tls, "mountPath": TLS_DIR, "readOnly": true},
                {"name": ca, "mountPath": CA_DIR, "readOnly": true},
            ],
        });
        let volume = json!({"name": CONFIG_VOLUME, "configMap": {"name": self.config_map}});
        injection.placement = Some(Placement {
            container,
            volume,
            pod_volumes: vec![tls, ca],
            server: front.container.clone(),
            argument: front.listen_argument.clone(),
            port: self.port,
            moved_to,
            remove_probes: front.remove_probes.clone(),
        });
        Ok(injection)
    }

    fn describe(&self, injection: &Injection) -> String {
        let front = &self.in_front_of;
        let removed: Vec<&str> = front.remove_probes.iter().map(|p| p.field()).collect();
        let mut line = format!(
            "gate: keyward gate ({}) on port {}, with ConfigMap {}'s gate.yaml, in front of container {:?}, whose {} moves to {}",
            self.image,
            self.port,
            self.config_map,
            front.container,
            front.listen_argument,
            injection.item.get("movedTo").unwrap_or_default()
        );
        if !removed.is_empty() {
            line.push_str(&format!(" (its {} removed)", removed.join(", ")));
        }
        line.push_str(&format!("; the gate uses the pod's API token, mounted at {SERVICE_ACCOUNT_MOUNT_PATH}"));
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::testing::*;

    /// As deploy/gate/evalhub/profile.yaml sets it.
    pub(crate) const EVALHUB: &str = r#"
image: ghcr.io/keyward/keyward:0.1.0
configMap: keyward-gate-evalhub
port: 8443
tlsVolume: "{label:instance}-tls"
inFrontOf:
  container: kube-rbac-proxy
  listenArgument: --secure-listen-address
  port: 8442
  serverName: "{label:instance}.{namespace}.svc"
  ca: {volume: service-ca, key: service-ca.crt}
  removeProbes: [livenessProbe]
"#;

    #[test]
    fn the_gate_takes_the_port_and_reaches_the_server_on_loopback_by_its_services_name() {
        let spec: Gate = yaml(EVALHUB);
        assert!(problems(&spec).is_empty(), "{:?}", problems(&spec));
        let injection = with_pod(None, &[("instance", "evalhub")], |pod| spec.plan(pod)).unwrap();
        let placement = injection.placement.clone().unwrap();
        assert_eq!(
            placement.container["args"],
            json!([
                "gate",
                "--config=/etc/keyward/gate/gate.yaml",
                "--listen=0.0.0.0:8443",
                "--metrics-listen=0.0.0.0:9091",
                "--tls-dir=/var/run/keyward/gate-tls",
                "--upstream=https://127.0.0.1:8442",
                "--upstream-ca=/var/run/keyward/upstream-ca/service-ca.crt",
                "--upstream-server-name=evalhub.team-a.svc",
                "--log-format=json",
            ])
        );
        assert_eq!(placement.container["restartPolicy"], "Always");
        assert_eq!(placement.pod_volumes, ["evalhub-tls", "service-ca"]);
        assert_eq!(
            placement.volume,
            json!({"name": "keyward-gate-config", "configMap": {"name": "keyward-gate-evalhub"}})
        );
        assert_eq!((placement.moved_to.as_str(), placement.port), ("127.0.0.1:8442", 8443));
        assert_eq!(
            serde_json::to_value(&injection.item).unwrap(),
            json!({"kind": "gate", "configMap": "keyward-gate-evalhub", "port": "8443", "inFrontOf": "kube-rbac-proxy", "movedTo": "127.0.0.1:8442"})
        );
        assert_eq!(
            spec.describe(&injection),
            "gate: keyward gate (ghcr.io/keyward/keyward:0.1.0) on port 8443, with ConfigMap keyward-gate-evalhub's gate.yaml, in front of container \"kube-rbac-proxy\", whose --secure-listen-address moves to 127.0.0.1:8442 (its livenessProbe removed); the gate uses the pod's API token, mounted at /var/run/secrets/kubernetes.io/serviceaccount"
        );
        // A pod without the instance label cannot name its certificate's volume.
        let unresolved = with_pod(None, &[], |pod| spec.plan(pod)).unwrap_err();
        assert_eq!(unresolved.field, "tlsVolume");
    }

    #[test]
    fn ports_names_and_the_argument_are_checked() {
        let bad = EVALHUB
            .replace("port: 8442", "port: 8443")
            .replace("--secure-listen-address", "--secure-listen-address=0.0.0.0:8443")
            .replace("configMap: keyward-gate-evalhub", "configMap: Gate")
            .replace("container: kube-rbac-proxy", "container: kube_rbac_proxy");
        let spec: Gate = yaml(&bad);
        for image in ["", "ghcr.io/keyward/keyward: 0.1", "ghcr.io/keyward/keyward:0.1\u{1}"] {
            let spec = Gate { image: image.into(), ..yaml(EVALHUB) };
            assert_eq!(
                problems(&spec),
                [format!(
                    "spec.inject.k.image: {image:?} is not an image reference; give keyward's, as the install maps it"
                )]
            );
        }
        assert_eq!(
            problems(&spec),
            [
                "spec.inject.k.configMap: \"Gate\" is not a valid ConfigMap name",
                "spec.inject.k.inFrontOf.container: \"kube_rbac_proxy\" is not a valid container name",
                "spec.inject.k.inFrontOf.listenArgument: \"--secure-listen-address=0.0.0.0:8443\": give the flag alone, as --secure-listen-address",
                "spec.inject.k.inFrontOf.port: 8443 is also port; each needs a port of its own",
            ]
        );
    }
}
