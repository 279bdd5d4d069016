//! Reporting, part of the shared layer: refusals, conditions and names taken, each once, as a
//! log line, a metric and (written by the leader only) an Event.

use k8s_openapi::api::core::v1::ObjectReference;
use keyward_engine::text::clip;
use kube::runtime::events::{Event, EventType};

use crate::conditions::{Change, Condition};
use crate::context::{lock, namespace_ref, Context};
use crate::desired::{Desired, Owner};
use crate::index::PodKey;
use crate::metrics::Refusal;

impl Context {
    /// Reports a pod keyward issues nothing for, once per pod and reason: a log line, the
    /// metric, and a Warning Event on the pod saying `why` (none in a namespace that did not
    /// opt in: keyward writes nothing there, so pods there cost it no API call).
    pub async fn report_pod(&self, pod: &PodKey, uid: &str, refusal: Refusal, why: &str) {
        if !lock(&self.reported).insert((uid.to_string(), refusal)) {
            return;
        }
        self.metrics.refused(refusal);
        let advice = match refusal {
            Refusal::OptedOut | Refusal::NamespaceNotOptedIn | Refusal::UnverifiableOwner => "",
            _ => "; have the operator create the pod again",
        };
        let note = format!("keyward issues nothing for this pod's owner: {why}{advice}");
        tracing::warn!(namespace = %pod.namespace, pod = %pod.name, reason = refusal.as_str(), why = %clip(why, 1024), "pod refused: nothing issued");
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            uid: Some(uid.to_string()),
            ..ObjectReference::default()
        };
        if refusal != Refusal::NamespaceNotOptedIn {
            self.event(refusal.event_reason(), &clip(&note, 1024), "Issue", &regarding).await;
        }
    }

    /// Forgets the reports about a pod (deleted), so a new pod of that name is reported anew.
    pub fn forget_reports(&self, uid: &str) {
        lock(&self.reported).retain(|(who, _)| who != uid);
    }

    /// Reports `condition` on `subject` when it starts or its message changes: a log line, the
    /// metric, and an Event on `regarding` when there is an object to attach it to.
    pub(crate) async fn raise(
        &self,
        condition: Condition,
        subject: &str,
        note: &str,
        regarding: Option<ObjectReference>,
    ) {
        if self.conditions.raise(condition, subject, note) != Change::Raised {
            return;
        }
        self.metrics.set_conditions(condition, self.conditions.count(condition));
        tracing::warn!(
            condition = condition.as_str(),
            subject,
            note,
            "condition: keyward carries on with everything else"
        );
        if let Some(regarding) = regarding {
            let reason = match condition {
                Condition::ClientCaNamespaceMissing => "ClientCaNamespaceMissing",
                Condition::ServerCaSourceUnusable => "ServerCaSourceUnusable",
                Condition::ServerCaSourceUnwatched => "ServerCaSourceUnwatched",
            };
            self.event(reason, note, "Provision", &regarding).await;
        }
    }

    /// Says that `condition` on `subject` no longer holds, if it did.
    pub(crate) fn resolve(&self, condition: Condition, subject: &str) {
        if self.conditions.clear(condition, subject) == Change::Cleared {
            self.metrics.set_conditions(condition, self.conditions.count(condition));
            tracing::info!(condition = condition.as_str(), subject, "condition resolved");
        }
    }

    /// Reports an object keyward would write whose name someone else's object has: a log line
    /// and an Event (on the owner when there is one, else on the namespace).
    pub(crate) async fn report_foreign(&self, d: &Desired, owner: Option<&Owner>) {
        let note = format!(
            "{} {}/{} exists and is not managed by keyward (no label app.kubernetes.io/managed-by=keyward); keyward leaves it alone, and pods of profile {:?} get its content, not keyward's. Rename or remove it",
            d.want.object_kind(), d.namespace, d.name, d.profile
        );
        tracing::warn!(namespace = %d.namespace, name = %d.name, kind = d.want.object_kind(), profile = %d.profile, "name taken by an object keyward does not manage; left alone");
        let regarding = match owner {
            Some(o) => ObjectReference {
                api_version: Some(o.api_version.clone()),
                kind: Some(o.kind.clone()),
                name: Some(o.name.clone()),
                namespace: Some(d.namespace.clone()),
                uid: Some(o.uid.clone()),
                ..ObjectReference::default()
            },
            None => namespace_ref(&d.namespace),
        };
        self.event("NameTaken", &note, "Provision", &regarding).await;
    }

    /// A Warning Event on `regarding`, written by the leader only.
    pub(crate) async fn event(&self, reason: &str, note: &str, action: &str, regarding: &ObjectReference) {
        self.publish(EventType::Warning, reason, note, action, regarding).await;
    }

    /// An Event of `type_` on `regarding`, written by the leader only.
    pub(crate) async fn publish(
        &self,
        type_: EventType,
        reason: &str,
        note: &str,
        action: &str,
        regarding: &ObjectReference,
    ) {
        if !self.leader.is_leader() {
            return;
        }
        let event =
            Event { type_, reason: reason.into(), note: Some(note.into()), action: action.into(), secondary: None };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            tracing::debug!(error = %e, "could not record the event");
        }
    }
}
