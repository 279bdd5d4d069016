//! The webhook configuration's `matchConditions`, kept equal to what the profiles generate
//! (`keyward manifests webhook`). They decide which pods the apiserver sends keyward at all:
//! a profile added after the configuration was applied, or a configuration re-applied from an
//! old rendering, would silently leave pods without credentials (or send pods that are then
//! refused). The leader patches `matchConditions` of keyward's webhook in the one configuration
//! it is told to manage, and nothing else; `--webhook-match-conditions external` turns this off
//! for GitOps installs that render the configuration themselves.

use k8s_openapi::api::admissionregistration::v1::{MatchCondition, MutatingWebhookConfiguration};
use keyward_engine::match_conditions::{match_expression, CONDITION_NAME, WEBHOOK_NAME};
use keyward_engine::ProfileSet;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::error::Error;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::queue::Outcome;

/// The conditions the profiles generate, as the configuration holds them.
pub fn wanted(profiles: &ProfileSet) -> Vec<MatchCondition> {
    vec![MatchCondition { name: CONDITION_NAME.into(), expression: match_expression(profiles) }]
}

/// What to do about one configuration (pure).
#[derive(Debug, Clone, PartialEq)]
pub enum Repair {
    /// Every keyward webhook in it has the wanted conditions.
    InSync,
    /// A JSON patch for the keyward webhooks that differ: each replaces `matchConditions` at
    /// the webhook's index after testing the name there, so a configuration reordered
    /// meanwhile is refused (422), never mis-patched.
    Patch(Vec<Value>),
    /// No webhook named `pods.keyward.io`: nothing keyward may change.
    NoWebhook,
}

/// Compares the configuration with `wanted`; touches only keyward's webhooks.
pub fn plan(config: &MutatingWebhookConfiguration, wanted: &[MatchCondition]) -> Repair {
    let webhooks = config.webhooks.as_deref().unwrap_or_default();
    let mut ops = Vec::new();
    let mut found = false;
    for (i, webhook) in webhooks.iter().enumerate().filter(|(_, w)| w.name == WEBHOOK_NAME) {
        found = true;
        if webhook.match_conditions.as_deref().unwrap_or_default() != wanted {
            ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": WEBHOOK_NAME}));
            ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/matchConditions"), "value": wanted}));
        }
    }
    match (found, ops.is_empty()) {
        (false, _) => Repair::NoWebhook,
        (true, true) => Repair::InSync,
        (true, false) => Repair::Patch(ops),
    }
}

/// One pass against the API: read the configuration, and, as the leader, repair it.
pub async fn reconcile(
    client: &Client,
    leader: &Leadership,
    metrics: &Metrics,
    name: &str,
    profiles: &ProfileSet,
) -> Result<Outcome, Error> {
    let api = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let Some(config) = api.get_opt(name).await? else {
        // Creating it is the install's job (it holds the Service, rules and selectors).
        tracing::warn!(config = %name, "the MutatingWebhookConfiguration does not exist: no pod is sent to keyward; apply the install's webhook configuration (or `keyward manifests webhook`)");
        return Ok(Outcome::Done);
    };
    match plan(&config, &wanted(profiles)) {
        Repair::InSync => Ok(Outcome::Done),
        Repair::NoWebhook => {
            tracing::warn!(config = %name, webhook = WEBHOOK_NAME, "the MutatingWebhookConfiguration has no webhook of keyward's name; its matchConditions are not kept (check --webhook-config)");
            Ok(Outcome::Done)
        }
        Repair::Patch(ops) => {
            let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))
                .map_err(|e| Error::Malformed(format!("a matchConditions patch: {e}")))?;
            leader.check()?;
            match api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch)).await {
                Ok(_) => {}
                // Reordered or changed meanwhile (the name test failed): decide again on what
                // is there now.
                Err(kube::Error::Api(s)) if s.code == 422 || s.is_conflict() => {
                    return Ok(Outcome::At(tokio::time::Instant::now()));
                }
                Err(e) => return Err(e.into()),
            }
            tracing::warn!(
                config = %name,
                webhook = WEBHOOK_NAME,
                "the webhook's matchConditions differed from the profiles keyward runs with (re-applied from an old rendering, edited by hand, or the profiles changed); repaired"
            );
            metrics.webhook_config_repair("matchConditions");
            Ok(Outcome::Done)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhook;

    fn webhook(name: &str, conditions: Option<Vec<MatchCondition>>) -> MutatingWebhook {
        MutatingWebhook { name: name.into(), match_conditions: conditions, ..MutatingWebhook::default() }
    }

    fn config(webhooks: Vec<MutatingWebhook>) -> MutatingWebhookConfiguration {
        MutatingWebhookConfiguration { webhooks: Some(webhooks), ..MutatingWebhookConfiguration::default() }
    }

    fn condition(expression: &str) -> MatchCondition {
        MatchCondition { name: CONDITION_NAME.into(), expression: expression.into() }
    }

    #[test]
    fn only_keyward_webhooks_that_differ_are_patched_each_behind_a_name_test() {
        let want = vec![condition("new")];
        let c = config(vec![
            webhook("other.example.com", Some(vec![condition("theirs")])),
            webhook(WEBHOOK_NAME, Some(vec![condition("old")])),
        ]);
        assert_eq!(
            plan(&c, &want),
            Repair::Patch(vec![
                json!({"op": "test", "path": "/webhooks/1/name", "value": "pods.keyward.io"}),
                json!({"op": "add", "path": "/webhooks/1/matchConditions", "value": [{"name": CONDITION_NAME, "expression": "new"}]}),
            ])
        );
        // Missing conditions (a hand-written configuration) are drift too.
        assert!(matches!(plan(&config(vec![webhook(WEBHOOK_NAME, None)]), &want), Repair::Patch(_)));
        // An extra condition someone added is drift: the profiles decide what is sent.
        let extra = config(vec![webhook(WEBHOOK_NAME, Some(vec![condition("new"), condition("more")]))]);
        assert!(matches!(plan(&extra, &want), Repair::Patch(_)));
        assert_eq!(plan(&config(vec![webhook(WEBHOOK_NAME, Some(want.clone()))]), &want), Repair::InSync);
        assert_eq!(plan(&config(vec![webhook("other.example.com", None)]), &want), Repair::NoWebhook);
        assert_eq!(plan(&MutatingWebhookConfiguration::default(), &want), Repair::NoWebhook);
    }

    #[test]
    fn the_wanted_conditions_are_what_keyward_manifests_webhook_renders() {
        let set = ProfileSet::builtin().unwrap_or_default();
        let w = wanted(&set);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].name, "selected-by-a-keyward-profile");
        assert_eq!(w[0].expression, match_expression(&set));
        assert!(w[0].expression.contains("fms-lm-eval-service"), "{}", w[0].expression);
    }
}
