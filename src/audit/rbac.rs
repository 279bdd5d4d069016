//! Who, besides the nodes, may create PodCertificateRequests (pure).
//!
//! A PodCertificateRequest does not record who created it. The apiserver's NodeRestriction
//! admission holds a kubelet to the pods bound to its node, but anyone else granted `create`
//! on `podcertificaterequests` may name any pod, UID, node and account, with a key of their own
//! (KEP-4317 allows such requests "on behalf of other workloads"). keyward's signer cannot tell
//! those from the kubelet's, so the audit reports every grant beyond the nodes.
//!
//! Full wildcards (`apiGroups: ["*"]`, as in `cluster-admin`) are not reported: whoever holds
//! one may read the client CA's key anyway.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject};

use super::findings::printable_name as shown;

const GROUP: &str = "certificates.k8s.io";
const RESOURCE: &str = "podcertificaterequests";

/// What the audit read of RBAC.
#[derive(Debug, Default)]
pub struct Rbac {
    pub cluster_roles: Vec<ClusterRole>,
    pub roles: Vec<Role>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    pub role_bindings: Vec<RoleBinding>,
}

/// One subject that may create requests, and through what.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    /// `User "alice"`, `Group "ops"`, `ServiceAccount team-a/robot`.
    pub subject: String,
    /// `ClusterRoleBinding x -> ClusterRole y`, or `RoleBinding ns/x -> Role y`.
    pub via: String,
    /// The namespace it holds in; `None`: every namespace.
    pub namespace: Option<String>,
}

impl Grant {
    pub fn detail(&self) -> String {
        let pods = match &self.namespace {
            Some(ns) => format!("of any pod in namespace {ns} that keyward signs for"),
            None => "of any pod keyward signs for".to_string(),
        };
        format!(
            "{} may create PodCertificateRequests ({}): with a key of its own it can ask keyward's signers for the identity {pods}, and keyward cannot tell its requests from a kubelet's; grant it to the nodes only",
            self.subject, self.via
        )
    }
}

/// Every grant of `create` on PodCertificateRequests to someone other than the nodes.
pub fn pod_certificate_creators(rbac: &Rbac) -> Vec<Grant> {
    let creates = |rules: Option<&Vec<PolicyRule>>| rules.into_iter().flatten().any(grants_create);
    let cluster_role = |name: &str| {
        rbac.cluster_roles.iter().find(|r| r.metadata.name.as_deref() == Some(name)).map(|r| r.rules.as_ref())
    };
    let mut out = Vec::new();
    for binding in &rbac.cluster_role_bindings {
        let role = &binding.role_ref;
        if role.kind == "ClusterRole" && cluster_role(&role.name).is_some_and(creates) {
            let via =
                format!("ClusterRoleBinding {} -> ClusterRole {}", name(&binding.metadata.name), shown(&role.name));
            out.extend(grants(binding.subjects.as_ref(), &via, None));
        }
    }
    for binding in &rbac.role_bindings {
        let ns = binding.metadata.namespace.clone().unwrap_or_default();
        let role = &binding.role_ref;
        let (kind, rules) = match role.kind.as_str() {
            "ClusterRole" => ("ClusterRole", cluster_role(&role.name)),
            "Role" => {
                let found = rbac.roles.iter().find(|r| {
                    r.metadata.name.as_deref() == Some(&role.name) && r.metadata.namespace.as_deref() == Some(&ns)
                });
                ("Role", found.map(|r| r.rules.as_ref()))
            }
            _ => ("", None),
        };
        if rules.is_some_and(creates) {
            let via =
                format!("RoleBinding {}/{} -> {kind} {}", shown(&ns), name(&binding.metadata.name), shown(&role.name));
            out.extend(grants(binding.subjects.as_ref(), &via, Some(ns.as_str())));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Whether `rule` grants `create` on PodCertificateRequests, naming their group (a full
/// wildcard group is a superuser's, not reported).
fn grants_create(rule: &PolicyRule) -> bool {
    let has =
        |list: Option<&Vec<String>>, wanted: &[&str]| list.into_iter().flatten().any(|v| wanted.contains(&v.as_str()));
    has(rule.api_groups.as_ref(), &[GROUP])
        && has(rule.resources.as_ref(), &[RESOURCE, "*"])
        && rule.verbs.iter().any(|v| v == "create" || v == "*")
}

/// The subjects of a binding that are not nodes.
fn grants(subjects: Option<&Vec<Subject>>, via: &str, namespace: Option<&str>) -> Vec<Grant> {
    subjects
        .into_iter()
        .flatten()
        .filter(|s| !is_node(s))
        .map(|s| Grant {
            subject: match s.kind.as_str() {
                "ServiceAccount" => format!(
                    "ServiceAccount {}/{}",
                    shown(s.namespace.as_deref().unwrap_or(namespace.unwrap_or_default())),
                    shown(&s.name)
                ),
                kind @ ("User" | "Group") => format!("{kind} {}", shown(&s.name)),
                kind => format!("{} {}", shown(kind), shown(&s.name)),
            },
            via: via.to_string(),
            namespace: namespace.map(str::to_string),
        })
        .collect()
}

fn is_node(s: &Subject) -> bool {
    (s.kind == "Group" && s.name == "system:nodes") || (s.kind == "User" && s.name.starts_with("system:node:"))
}

fn name(n: &Option<String>) -> String {
    shown(n.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    /// A cluster as kubeadm leaves it (the nodes' role, cluster-admin for system:masters), plus
    /// a team's grants.
    fn rbac() -> Rbac {
        Rbac {
            cluster_roles: vec![
                from(json!({"metadata": {"name": "system:node"}, "rules": [
                    {"apiGroups": ["certificates.k8s.io"], "resources": ["podcertificaterequests"], "verbs": ["create", "get", "list", "watch"]}]})),
                from(json!({"metadata": {"name": "cluster-admin"}, "rules": [
                    {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]})),
                from(json!({"metadata": {"name": "cert-robot"}, "rules": [
                    {"apiGroups": ["certificates.k8s.io"], "resources": ["*"], "verbs": ["*"]}]})),
                from(json!({"metadata": {"name": "pcr-reader"}, "rules": [
                    {"apiGroups": ["certificates.k8s.io"], "resources": ["podcertificaterequests"], "verbs": ["get", "list"]}]})),
            ],
            roles: vec![from(json!({"metadata": {"name": "requester", "namespace": "team-a"}, "rules": [
                {"apiGroups": ["certificates.k8s.io"], "resources": ["podcertificaterequests"], "verbs": ["create"]}]}))],
            cluster_role_bindings: vec![
                from(
                    json!({"metadata": {"name": "system:node"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
                    "subjects": [{"kind": "Group", "name": "system:nodes"}, {"kind": "User", "name": "system:node:worker-1"}]}),
                ),
                from(
                    json!({"metadata": {"name": "cluster-admin"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                    "subjects": [{"kind": "Group", "name": "system:masters"}]}),
                ),
                from(
                    json!({"metadata": {"name": "robots"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cert-robot"},
                    "subjects": [{"kind": "User", "name": "alice\nforged"}, {"kind": "ServiceAccount", "name": "robot", "namespace": "tools"}]}),
                ),
                from(
                    json!({"metadata": {"name": "readers"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pcr-reader"},
                    "subjects": [{"kind": "Group", "name": "auditors"}]}),
                ),
            ],
            role_bindings: vec![
                from(
                    json!({"metadata": {"name": "team", "namespace": "team-a"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "requester"},
                    "subjects": [{"kind": "ServiceAccount", "name": "ci"}]}),
                ),
                // A Role of that name in another namespace grants nothing here.
                from(
                    json!({"metadata": {"name": "team", "namespace": "team-b"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "requester"},
                    "subjects": [{"kind": "ServiceAccount", "name": "ci"}]}),
                ),
                from(
                    json!({"metadata": {"name": "borrowed", "namespace": "team-c"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cert-robot"},
                    "subjects": [{"kind": "Group", "name": "team-c-devs"}]}),
                ),
            ],
        }
    }

    #[test]
    fn every_grant_beyond_the_nodes_is_found_with_how_and_where() {
        let found: Vec<(String, String, Option<String>)> =
            pod_certificate_creators(&rbac()).into_iter().map(|g| (g.subject, g.via, g.namespace)).collect();
        assert_eq!(
            found,
            [
                (
                    "Group team-c-devs".into(),
                    "RoleBinding team-c/borrowed -> ClusterRole cert-robot".into(),
                    Some("team-c".into())
                ),
                (
                    "ServiceAccount team-a/ci".into(),
                    "RoleBinding team-a/team -> Role requester".into(),
                    Some("team-a".into())
                ),
                (
                    "ServiceAccount tools/robot".into(),
                    "ClusterRoleBinding robots -> ClusterRole cert-robot".into(),
                    None
                ),
                ("User \"alice\\nforged\"".into(), "ClusterRoleBinding robots -> ClusterRole cert-robot".into(), None),
            ]
        );
    }

    #[test]
    fn the_detail_says_what_it_allows_and_the_fix_on_one_line() {
        let grants = pod_certificate_creators(&rbac());
        let alice = grants.iter().find(|g| g.subject.starts_with("User")).unwrap();
        assert_eq!(
            alice.detail(),
            "User \"alice\\nforged\" may create PodCertificateRequests (ClusterRoleBinding robots -> ClusterRole cert-robot): with a key of its own it can ask keyward's signers for the identity of any pod keyward signs for, and keyward cannot tell its requests from a kubelet's; grant it to the nodes only"
        );
        assert!(!alice.detail().contains('\n'));
        let ci = grants.iter().find(|g| g.subject == "ServiceAccount team-a/ci").unwrap();
        assert!(ci.detail().contains("the identity of any pod in namespace team-a that keyward signs for"));
        // Only the nodes, and superusers: nothing.
        let mut clean = rbac();
        clean.cluster_role_bindings.truncate(2);
        clean.role_bindings.clear();
        assert!(pod_certificate_creators(&clean).is_empty());
    }
}
