//! Run the pod as a dedicated service account, and keep or remove its Kubernetes API token.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{
    ApiToken, AuditItem, Check, Injection, ObjectKind, Provider, Provision, Requirement, RoleBinding, Unresolved,
};
use crate::names::{is_dns1123_subdomain, DNS1123_SUBDOMAIN_RULE};
use crate::names::{NameTemplate, TemplateContext};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAccount {
    pub name: NameTemplate,
    /// Whether the pod keeps a Kubernetes API token (for the new service account).
    #[serde(default)]
    pub api_token: ApiToken,
    /// Who creates the account: the admin (the default), or keyward, in every opted-in namespace
    /// before pods need it (the ServiceAccount admission plugin refuses a pod whose account does
    /// not exist), which takes a fixed name.
    #[serde(default)]
    pub provider: Provider,
    /// With `provider: keyward`: the roles the account is bound to in its namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<RoleBinding>,
}

impl Kind for ServiceAccount {
    fn validate(&self, check: &mut Check) {
        let Self { name, api_token: _, provider, bindings } = self;
        if *provider == Provider::Keyward && !name.is_fixed() {
            check.problem(
                "name",
                format!("{:?}: keyward creates the account in each namespace before any pod needs it, so it takes a fixed name, not a template", name.as_str()),
            );
        }
        if *provider == Provider::User && !bindings.is_empty() {
            check.problem("bindings", "only with provider: keyward (keyward binds only the accounts it creates)");
        }
        for (i, binding) in bindings.iter().enumerate() {
            if !is_dns1123_subdomain(&binding.name) && !binding.name.starts_with("system:") {
                check.problem(
                    &format!("bindings[{i}].name"),
                    format!("{:?} is not a role name ({DNS1123_SUBDOMAIN_RULE})", binding.name),
                );
            }
        }
    }

    fn plan(&self, pod: &TemplateContext<'_>) -> Result<Injection, Unresolved> {
        let name = self.name.resolve(pod).map_err(|reason| Unresolved { field: "name", reason })?;
        let item = AuditItem::new("serviceAccount").with("name", &name).with("apiToken", self.api_token.as_str());
        let mut injection = Injection::new(item);
        let provision = match self.provider {
            Provider::Keyward => Provision::ServiceAccount { bindings: self.bindings.clone() },
            Provider::User => Provision::User,
        };
        injection.requires.push(Requirement::new(ObjectKind::ServiceAccount, name.clone(), provision));
        injection.service_account = Some(name);
        injection.api_token = self.api_token;
        Ok(injection)
    }

    fn describe(&self, injection: &Injection) -> String {
        format!(
            "service account: {} (Kubernetes API token: {})",
            injection.service_account.as_deref().unwrap_or_default(),
            self.api_token.as_str()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::RoleKind;
    use crate::kinds::testing::*;
    use serde_json::json;

    #[test]
    fn a_keyward_account_has_a_fixed_name_and_may_be_bound() {
        let spec: ServiceAccount = yaml(
            "name: keyward-router\nprovider: keyward\nbindings: [{kind: ClusterRole, name: \"system:auth-delegator\"}]\n",
        );
        assert!(problems(&spec).is_empty());
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        let bindings = vec![RoleBinding { kind: RoleKind::ClusterRole, name: "system:auth-delegator".into() }];
        assert_eq!(
            injection.requires,
            [Requirement::new(ObjectKind::ServiceAccount, "keyward-router", Provision::ServiceAccount { bindings })]
        );
        let spec: ServiceAccount = yaml("name: \"{label:g}-sa\"\nprovider: keyward\n");
        assert!(problems(&spec)[0].contains("takes a fixed name, not a template"));
        let spec: ServiceAccount = yaml("name: sa\nbindings: [{kind: Role, name: r}]\n");
        assert_eq!(
            problems(&spec),
            ["spec.inject.k.bindings: only with provider: keyward (keyward binds only the accounts it creates)"]
        );
    }

    #[test]
    fn swaps_to_the_resolved_account() {
        let spec: ServiceAccount =
            yaml("name: \"{label:serving.kserve.io/inferencegraph}-auth-verifier\"\napiToken: keep\n");
        let injection = with_pod(None, &[("serving.kserve.io/inferencegraph", "g")], |pod| spec.plan(pod)).unwrap();
        assert_eq!(injection.service_account.as_deref(), Some("g-auth-verifier"));
        assert_eq!(
            injection.requires,
            [Requirement::new(ObjectKind::ServiceAccount, "g-auth-verifier", Provision::User)]
        );
        assert_eq!(injection.api_token, ApiToken::Keep);
        assert!(injection.volume.is_none() && injection.env.is_empty());
        assert_eq!(
            serde_json::to_value(&injection.item).unwrap(),
            json!({"kind": "serviceAccount", "name": "g-auth-verifier", "apiToken": "keep"})
        );
    }
}
