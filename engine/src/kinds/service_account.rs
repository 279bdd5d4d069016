//! Run the pod as a dedicated service account, and keep or remove its Kubernetes API token.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{ApiToken, AuditItem, Check, Injection, Unresolved};
use crate::names::{NameTemplate, TemplateContext};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceAccount {
    pub name: NameTemplate,
    /// Whether the pod keeps a Kubernetes API token (for the new service account).
    #[serde(default)]
    pub api_token: ApiToken,
}

impl Kind for ServiceAccount {
    fn validate(&self, _check: &mut Check) {
        // The template is checked when it is parsed; nothing else can be wrong.
        let Self { name: _, api_token: _ } = self;
    }

    fn plan(&self, pod: &TemplateContext<'_>) -> Result<Injection, Unresolved> {
        let name = self.name.resolve(pod).map_err(|reason| Unresolved { field: "name", reason })?;
        let item = AuditItem::new("serviceAccount").with("name", &name).with("apiToken", self.api_token.as_str());
        let mut injection = Injection::new(item);
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
    use crate::kinds::testing::*;
    use serde_json::json;

    #[test]
    fn swaps_to_the_resolved_account() {
        let spec: ServiceAccount =
            yaml("name: \"{label:serving.kserve.io/inferencegraph}-auth-verifier\"\napiToken: keep\n");
        let injection = with_pod(None, &[("serving.kserve.io/inferencegraph", "g")], |pod| spec.plan(pod)).unwrap();
        assert_eq!(injection.service_account.as_deref(), Some("g-auth-verifier"));
        assert_eq!(injection.api_token, ApiToken::Keep);
        assert!(injection.volume.is_none() && injection.env.is_empty());
        assert_eq!(
            serde_json::to_value(&injection.item).unwrap(),
            json!({"kind": "serviceAccount", "name": "g-auth-verifier", "apiToken": "keep"})
        );
    }
}
