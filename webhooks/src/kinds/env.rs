//! Plain env vars: a fixed value for each, such as `RAY_AUTH_MODE=token`.

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::inject::{AuditItem, Check, EnvSpec, EnvValue, Injection, Unresolved};
use crate::names::TemplateContext;

/// `env`: a list of `{name, value}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Env(pub Vec<PlainEnv>);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlainEnv {
    pub name: String,
    pub value: String,
}

impl Kind for Env {
    fn validate(&self, check: &mut Check) {
        if self.0.is_empty() {
            check.problem("", "must list at least one env var ({name, value})");
        }
        for (i, var) in self.0.iter().enumerate() {
            let PlainEnv { name, value: _ } = var;
            check.env_name(&format!("[{i}].name"), name);
        }
    }

    fn plan(&self, _pod: &TemplateContext<'_>) -> Result<Injection, Unresolved> {
        let names: Vec<&str> = self.0.iter().map(|v| v.name.as_str()).collect();
        let mut injection = Injection::new(AuditItem::new("env").with("names", names.join(",")));
        injection.env =
            self.0.iter().map(|v| EnvSpec { name: v.name.clone(), value: EnvValue::Value(v.value.clone()) }).collect();
        Ok(injection)
    }

    fn describe(&self, _injection: &Injection) -> String {
        let vars: Vec<String> = self.0.iter().map(|v| format!("{}={:?}", v.name, v.value)).collect();
        format!("env: {}", vars.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::testing::*;
    use serde_json::json;

    #[test]
    fn plain_values_in_order() {
        let spec: Env = yaml("- {name: RAY_AUTH_MODE, value: token}\n- {name: B, value: \"\"}\n");
        let injection = with_pod(None, &[], |pod| spec.plan(pod)).unwrap();
        let env: Vec<_> = injection.env.iter().map(EnvSpec::to_json).collect();
        assert_eq!(env, [json!({"name": "RAY_AUTH_MODE", "value": "token"}), json!({"name": "B", "value": ""})]);
        assert!(injection.volume.is_none());
        assert_eq!(serde_json::to_value(&injection.item).unwrap(), json!({"kind": "env", "names": "RAY_AUTH_MODE,B"}));
        assert_eq!(spec.describe(&injection), "env: RAY_AUTH_MODE=\"token\", B=\"\"");
    }

    #[test]
    fn names_are_checked_and_the_list_is_not_empty() {
        let spec: Env = yaml("- {name: 1X, value: v}\n");
        assert_eq!(
            problems(&spec),
            ["spec.inject.k.[0].name: \"1X\" is not a valid environment variable name (letters, digits, '_', '-' and '.', not starting with a digit or '..')"]
        );
        let spec: Env = yaml("[]");
        assert_eq!(problems(&spec), ["spec.inject.k: must list at least one env var ({name, value})"]);
    }
}
