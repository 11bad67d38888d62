//! Kubernetes Events (`events.k8s.io/v1`) about the agent, attached to its state ConfigMap so
//! `kubectl describe configmap fleetgate-state-<cluster>` (or `kubectl events --for configmap/…`)
//! tells the story of every release: one Event per state transition, and a Warning per error.
//!
//! The reason is the category (PascalCase: `ApplyStarted`, `RolledBack`, `VerifyFailed` …); the
//! note is the message, with an error's whole `source()` chain, cut to the API's 1024-byte limit.
//! Each Event is created anew (no series aggregation): transitions are rare and each message
//! matters, whereas kube-runtime's `Recorder` folds Events with the same reason into one series and
//! keeps only the first message.
//!
//! The read side is here too: [`is_agents`] tells the agent's own Events of a cluster from the
//! rest of the namespace, [`last_seen`] when an Event (new or core API) last happened; `fleetgate
//! events` lists them.

use super::state::{Phase, Severity, Transition, state_configmap_name};
use crate::model::error_chain;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use std::error::Error;

/// `reportingController` of every Event the agent writes.
pub const REPORTING_CONTROLLER: &str = "fleetgate.io/agent";
/// The API server refuses Event notes longer than this many bytes.
pub const MAX_NOTE_BYTES: usize = 1024;
const MAX_INSTANCE_BYTES: usize = 128;

#[derive(Debug, thiserror::Error)]
#[error("recording Event {reason} on {kind}/{name}")]
pub struct EventError {
    reason: String,
    kind: String,
    name: String,
    #[source]
    source: kube::Error,
}

/// Writes Events as this agent instance.
#[derive(Clone)]
pub struct EventRecorder {
    client: Client,
    instance: String,
}

impl EventRecorder {
    /// `instance` is the agent's identity (`reportingInstance`, cut to 128 bytes).
    pub fn new(client: Client, instance: &str) -> EventRecorder {
        EventRecorder { client, instance: cut(instance, MAX_INSTANCE_BYTES) }
    }

    /// Records one Event about `regarding` in its namespace.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        severity: Severity,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), EventError> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".to_string());
        let object_name = regarding.name.clone().unwrap_or_else(|| "fleetgate".to_string());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{object_name}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(match severity {
                Severity::Normal => "Normal".to_string(),
                Severity::Warning => "Warning".to_string(),
            }),
            reason: Some(reason.to_string()),
            action: Some(action.to_string()),
            note: Some(cut(note, MAX_NOTE_BYTES)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(REPORTING_CONTROLLER.to_string()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await
            .map(drop)
            .map_err(|source| EventError {
                reason: reason.to_string(),
                kind: regarding.kind.clone().unwrap_or_default(),
                name: object_name,
                source,
            })
    }

    /// Records a state transition: reason = the transition's reason, action = the phase it happened in.
    pub async fn transition(&self, regarding: &ObjectReference, t: &Transition) -> Result<(), EventError> {
        self.publish(regarding, t.severity, t.reason, action_of(t), &t.message).await
    }

    /// Records an error as a Warning whose note is the error's whole source chain.
    pub async fn error(
        &self,
        regarding: &ObjectReference,
        reason: &str,
        action: &str,
        err: &(dyn Error + 'static),
    ) -> Result<(), EventError> {
        self.publish(regarding, Severity::Warning, reason, action, &error_chain(err)).await
    }
}

/// The step a transition belongs to: the phase it enters, or for a return to Idle the phase it
/// leaves.
fn action_of(t: &Transition) -> &'static str {
    let phase = if t.to == Phase::Idle { t.from } else { t.to };
    match phase {
        Phase::Idle => "Sync",
        Phase::Verifying => "Verify",
        Phase::Applying => "Apply",
        Phase::Baking => "Bake",
        Phase::RollingBack => "Rollback",
    }
}

/// True for an Event `cluster`'s agent wrote: reported by [`REPORTING_CONTROLLER`] about that
/// cluster's state ConfigMap (agents of other clusters may share the namespace).
pub fn is_agents(event: &Event, cluster: &str) -> bool {
    let regarding = event.regarding.as_ref();
    event.reporting_controller.as_deref() == Some(REPORTING_CONTROLLER)
        && regarding.and_then(|r| r.kind.as_deref()) == Some("ConfigMap")
        && regarding.and_then(|r| r.name.as_deref()) == Some(state_configmap_name(cluster).as_str())
}

/// When `event` last happened: its series' last observation, else its own time. Events written
/// through the core API (kubelet, controller-manager) carry only the deprecated timestamps or
/// their creation time.
pub fn last_seen(event: &Event) -> Option<DateTime<Utc>> {
    let time = event
        .series
        .as_ref()
        .map(|s| &s.last_observed_time.0)
        .or(event.event_time.as_ref().map(|t| &t.0))
        .or(event.deprecated_last_timestamp.as_ref().map(|t| &t.0))
        .or(event.metadata.creation_timestamp.as_ref().map(|t| &t.0))?;
    DateTime::from_timestamp(time.as_second(), u32::try_from(time.subsec_nanosecond()).ok()?)
}

/// `s` cut to at most `max` bytes on a character boundary, ending in "…" when cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    const ELLIPSIS: &str = "…";
    let mut end = max - ELLIPSIS.len();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ELLIPSIS}", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_respects_char_boundaries_and_limit() {
        assert_eq!(cut("short", 1024), "short");
        let long = "é".repeat(1000); // 2000 bytes
        let c = cut(&long, MAX_NOTE_BYTES);
        assert!(c.len() <= MAX_NOTE_BYTES, "{}", c.len());
        assert!(c.ends_with('…'));
        assert!(c.len() >= MAX_NOTE_BYTES - 4);
    }

    #[test]
    fn the_agents_events_are_its_own_about_its_state() {
        let event = |controller: &str, kind: &str, name: &str| Event {
            reporting_controller: Some(controller.into()),
            regarding: Some(ObjectReference { kind: Some(kind.into()), name: Some(name.into()), ..Default::default() }),
            ..Default::default()
        };
        assert!(is_agents(&event(REPORTING_CONTROLLER, "ConfigMap", "fleetgate-state-eu-1"), "eu-1"));
        assert!(!is_agents(&event(REPORTING_CONTROLLER, "ConfigMap", "fleetgate-state-eu-2"), "eu-1"));
        assert!(!is_agents(&event("kubelet", "ConfigMap", "fleetgate-state-eu-1"), "eu-1"));
        assert!(!is_agents(&event(REPORTING_CONTROLLER, "Secret", "fleetgate-state-eu-1"), "eu-1"));
    }

    #[test]
    fn last_seen_prefers_the_series_then_the_event_time() {
        use k8s_openapi::api::events::v1::EventSeries;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |secs: i64| k8s_openapi::jiff::Timestamp::from_second(secs).unwrap();
        let mut e = Event::default();
        assert_eq!(last_seen(&e), None);
        e.metadata.creation_timestamp = Some(Time(at(10)));
        assert_eq!(last_seen(&e), DateTime::from_timestamp(10, 0));
        e.deprecated_last_timestamp = Some(Time(at(20)));
        assert_eq!(last_seen(&e), DateTime::from_timestamp(20, 0));
        e.event_time = Some(MicroTime(at(30)));
        assert_eq!(last_seen(&e), DateTime::from_timestamp(30, 0));
        e.series = Some(EventSeries { count: 2, last_observed_time: MicroTime(at(40)) });
        assert_eq!(last_seen(&e), DateTime::from_timestamp(40, 0));
    }

    #[test]
    fn action_names_the_step() {
        let t = |from, to| Transition {
            from,
            to,
            release: "r".into(),
            reason: "X",
            message: String::new(),
            severity: Severity::Normal,
        };
        assert_eq!(action_of(&t(Phase::Idle, Phase::Verifying)), "Verify");
        assert_eq!(action_of(&t(Phase::Baking, Phase::Idle)), "Bake");
        assert_eq!(action_of(&t(Phase::Baking, Phase::RollingBack)), "Rollback");
        assert_eq!(action_of(&t(Phase::RollingBack, Phase::Idle)), "Rollback");
    }
}
