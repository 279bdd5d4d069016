//! Removing the pod's Kubernetes API token, for workloads that never call the API: without a
//! token a compromised pod has nothing to call it with. (To swap the account and remove the
//! token, use `serviceAccount` with `apiToken: remove`.)

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{ApiToken, AuditItem, Check, Injection, Unresolved};
use crate::names::TemplateContext;

/// `apiToken: remove`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RemoveApiToken {
    Remove,
}

impl Kind for RemoveApiToken {
    fn validate(&self, _check: &mut Check) {}

    fn plan(&self, _pod: &TemplateContext<'_>) -> Result<Injection, Unresolved> {
        let mut injection = Injection::new(AuditItem::new("apiToken").with("apiToken", "remove"));
        injection.api_token = ApiToken::Remove;
        Ok(injection)
    }

    fn describe(&self, _injection: &Injection) -> String {
        "Kubernetes API token: removed (automountServiceAccountToken: false, the kube-api-access volume and its mounts)"
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::testing::*;

    #[test]
    fn only_remove_is_accepted() {
        let spec: RemoveApiToken = yaml("remove");
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        assert_eq!(injection.api_token, ApiToken::Remove);
        assert!(injection.service_account.is_none() && injection.volume.is_none());
        assert!(serde_saphyr::from_str::<RemoveApiToken>("keep").is_err());
    }
}
