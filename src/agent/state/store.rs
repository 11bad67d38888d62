//! The state ConfigMap `fleetgate-state-<cluster>`: [`StateStore`] reads it, writes it with
//! optimistic concurrency (the last seen `resourceVersion`), and encodes an [`AgentState`] into its
//! data and back.
//!
//! The encoding is the one every agent since `fleetgate.io/agent-state/v1` wrote — keys `phase`,
//! `operation` (JSON, one flat object whatever the phase), `desired`, `current`, `lastKnownGood`,
//! `rejected`, `tagPins` (and, since fleetgate tracked promotions, `trust`, and since rollback
//! targets are checked against this cluster's history, `succeeded`; both absent in older states;
//! `unreported`, the statuses decided but not yet delivered, and `writeBack`, the pin a rollback
//! owes Git, each only while there is one) — so an
//! agent upgraded mid-operation resumes what the previous one left.
//! Decoding checks that the operation carries what its phase needs.

use super::machine::{AgentState, Failure, Operation, Phase, Progress, Return, Rollback, TransitionError};
use crate::status::GateFigure;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Resource};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

// ---- ConfigMap encoding --------------------------------------------------------------------

/// Data keys of the state ConfigMap. Scalars are plain strings so `kubectl get cm -o yaml` reads
/// well; structured fields are JSON.
mod key {
    pub const SCHEMA: &str = "schema";
    pub const DESIRED: &str = "desired";
    pub const PHASE: &str = "phase";
    pub const OPERATION: &str = "operation";
    pub const CURRENT: &str = "current";
    pub const LAST_KNOWN_GOOD: &str = "lastKnownGood";
    pub const REJECTED: &str = "rejected";
    pub const TAG_PINS: &str = "tagPins";
    pub const TRUST: &str = "trust";
    pub const SUCCEEDED: &str = "succeeded";
    pub const UNREPORTED: &str = "unreported";
    pub const WRITE_BACK: &str = "writeBack";
}
const SCHEMA: &str = "fleetgate.io/agent-state/v1";

/// The `operation` key's JSON: every phase's data in one object, optional fields absent where a
/// phase has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireOperation {
    release: String,
    commit: String,
    started_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rollback_target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    snapshot: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    applied_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failure: Option<Failure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    baseline: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    evidence: Vec<GateFigure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sequence: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    returning: Option<Return>,
}

impl WireOperation {
    fn of(progress: &Progress) -> Option<WireOperation> {
        let (op, applied_at, failure, evidence) = match progress {
            Progress::Idle => return None,
            Progress::Verifying(op) | Progress::Applying(op) => (op, None, None, Vec::new()),
            Progress::Baking { operation, applied_at } => (operation, Some(*applied_at), None, Vec::new()),
            Progress::RollingBack(r) => (&r.operation, r.applied_at, Some(r.failure.clone()), r.evidence.clone()),
        };
        Some(WireOperation {
            release: op.release.clone(),
            commit: op.commit.clone(),
            started_at: op.started_at,
            rollback_target: op.rollback_target.clone(),
            snapshot: op.snapshot.clone(),
            applied_at,
            failure,
            baseline: op.baseline.clone(),
            evidence,
            sequence: op.sequence,
            returning: op.returning.clone(),
        })
    }

    fn into_progress(self, phase: Phase) -> Result<Progress, String> {
        let operation = Operation {
            release: self.release,
            commit: self.commit,
            started_at: self.started_at,
            rollback_target: self.rollback_target,
            snapshot: self.snapshot,
            baseline: self.baseline,
            sequence: self.sequence,
            returning: self.returning,
        };
        Ok(match phase {
            Phase::Idle => return Err("phase Idle with an operation".to_string()),
            Phase::Verifying => Progress::Verifying(operation),
            Phase::Applying => Progress::Applying(operation),
            Phase::Baking => {
                let applied_at = self.applied_at.ok_or("phase Baking without operation.appliedAt")?;
                Progress::Baking { operation, applied_at }
            }
            Phase::RollingBack => {
                let failure = self.failure.ok_or("phase RollingBack without operation.failure")?;
                Progress::RollingBack(Rollback {
                    operation,
                    applied_at: self.applied_at,
                    failure,
                    evidence: self.evidence,
                })
            }
        })
    }
}

/// The state ConfigMap's data for `state`.
pub(super) fn to_data(state: &AgentState) -> BTreeMap<String, String> {
    let mut d = BTreeMap::new();
    d.insert(key::SCHEMA.into(), SCHEMA.into());
    d.insert(key::PHASE.into(), state.phase().to_string());
    for (k, v) in
        [(key::DESIRED, &state.desired), (key::CURRENT, &state.current), (key::LAST_KNOWN_GOOD, &state.last_known_good)]
    {
        if let Some(v) = v {
            d.insert(k.into(), v.clone());
        }
    }
    if let Some(op) = WireOperation::of(&state.progress) {
        d.insert(key::OPERATION.into(), serde_json::to_string_pretty(&op).expect("operation serializes"));
    }
    d.insert(key::REJECTED.into(), serde_json::to_string_pretty(&state.rejected).expect("rejections serialize"));
    d.insert(key::TAG_PINS.into(), serde_json::to_string_pretty(&state.tag_pins).expect("pins serialize"));
    d.insert(key::TRUST.into(), serde_json::to_string_pretty(&state.trust).expect("trust memory serializes"));
    d.insert(key::SUCCEEDED.into(), serde_json::to_string(&state.succeeded).expect("releases serialize"));
    if !state.unreported.is_empty() {
        d.insert(key::UNREPORTED.into(), serde_json::to_string_pretty(&state.unreported).expect("statuses serialize"));
    }
    if let Some(wb) = &state.write_back {
        d.insert(key::WRITE_BACK.into(), serde_json::to_string_pretty(wb).expect("write-back serializes"));
    }
    d
}

/// Decodes the state ConfigMap's data; empty data is the initial state. The error says what is wrong.
pub(super) fn from_data(data: &BTreeMap<String, String>) -> Result<AgentState, String> {
    if data.is_empty() {
        return Ok(AgentState::default());
    }
    match data.get(key::SCHEMA).map(String::as_str) {
        Some(SCHEMA) => {}
        other => return Err(format!("{}: expected {SCHEMA:?}, found {other:?}", key::SCHEMA)),
    }
    fn json<T: serde::de::DeserializeOwned + Default>(data: &BTreeMap<String, String>, k: &str) -> Result<T, String> {
        data.get(k).map(|s| serde_json::from_str(s).map_err(|e| format!("{k}: {e}"))).unwrap_or(Ok(T::default()))
    }
    let phase: Phase = data.get(key::PHASE).map(|p| p.parse()).transpose()?.unwrap_or_default();
    let operation: Option<WireOperation> = json(data, key::OPERATION)?;
    let progress = match (phase, operation) {
        (Phase::Idle, None) => Progress::Idle,
        (phase, None) => return Err(format!("phase {phase} without an operation")),
        (phase, Some(op)) => op.into_progress(phase)?,
    };
    Ok(AgentState {
        desired: data.get(key::DESIRED).cloned(),
        progress,
        current: data.get(key::CURRENT).cloned(),
        last_known_good: data.get(key::LAST_KNOWN_GOOD).cloned(),
        succeeded: json(data, key::SUCCEEDED)?,
        rejected: json(data, key::REJECTED)?,
        tag_pins: json(data, key::TAG_PINS)?,
        trust: json(data, key::TRUST)?,
        unreported: json(data, key::UNREPORTED)?,
        write_back: json(data, key::WRITE_BACK)?,
    })
}

// ---- StateStore ----------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error(
        "state ConfigMap {namespace}/{name} is not readable as agent state ({problem}); inspect it with `kubectl -n {namespace} get configmap {name} -o yaml`, fix or delete it (deleting forgets rejections and tag pins)"
    )]
    Corrupt { namespace: String, name: String, problem: String },
    #[error(
        "state ConfigMap {namespace}/{name} kept changing under us ({attempts} conflicting writes); is a second agent running for this cluster without leader election?"
    )]
    Contended { namespace: String, name: String, attempts: u32 },
    #[error("{action} state ConfigMap {namespace}/{name}")]
    Kube { action: &'static str, namespace: String, name: String, source: Box<kube::Error> },
}

/// Label on the state ConfigMap naming the cluster it belongs to.
pub const CLUSTER_LABEL: &str = "fleetgate.io/cluster";
/// The annotation that pauses the agent without a restart or a commit (the on-call engineer's
/// brake: `kubectl annotate cm fleetgate-state-<cluster> fleetgate.io/paused="INC-123"`); its value
/// is the reason. `false` (or removing it) resumes.
pub const PAUSED_ANNOTATION: &str = "fleetgate.io/paused";
/// `fleetgate reconcile` writes the time of its request here; the agent wakes, runs a pass, and
/// copies the value to [`RECONCILE_HANDLED_ANNOTATION`] (Flux's `requestedAt`/`lastHandledReconcileAt`).
pub const RECONCILE_REQUEST_ANNOTATION: &str = "fleetgate.io/reconcile-requested-at";
/// The last [`RECONCILE_REQUEST_ANNOTATION`] value a finished pass had seen at its start.
pub const RECONCILE_HANDLED_ANNOTATION: &str = "fleetgate.io/reconcile-handled-at";
/// How many times an update reloads and re-applies after a resourceVersion conflict.
const MAX_CONFLICT_RETRIES: u32 = 5;

#[derive(Debug, Clone)]
struct Persisted {
    state: AgentState,
    object: ConfigMap,
}

/// The reason in a state ConfigMap's [`PAUSED_ANNOTATION`], unless absent or `false`.
fn pause_reason(object: &ConfigMap) -> Option<String> {
    let value = object.metadata.annotations.as_ref()?.get(PAUSED_ANNOTATION)?.trim();
    (value != "false").then(|| value.to_string())
}

/// What [`StateStore::peek`] reads: the state and the pause annotation's reason.
#[derive(Debug, Clone)]
pub struct Peeked {
    pub state: AgentState,
    pub paused: Option<String>,
}

/// The state ConfigMap of `cluster`'s agents: `fleetgate-state-<cluster>`; the agent's Events are
/// about it ([`crate::agent::events`]).
pub fn state_configmap_name(cluster: &str) -> String {
    format!("fleetgate-state-{cluster}")
}

/// Loads and saves one cluster's [`AgentState`] in its ConfigMap. Writes carry the last seen
/// `resourceVersion`; on a conflict the store reloads and re-applies the change to the fresh state
/// (which may then refuse it, e.g. when another writer already moved the phase on).
#[derive(Debug)]
pub struct StateStore {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    cluster: String,
    cache: tokio::sync::Mutex<Option<Persisted>>,
}

impl StateStore {
    /// A store for `fleetgate-state-<cluster>` in `namespace`; nothing is read until [`load`](Self::load).
    pub fn new(client: Client, namespace: &str, cluster: &str) -> StateStore {
        StateStore {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: state_configmap_name(cluster),
            cluster: cluster.to_string(),
            cache: tokio::sync::Mutex::new(None),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Reads the state from the API server, creating an empty state ConfigMap when there is none
    /// (so Events have an object to point at and missing RBAC shows at start-up).
    pub async fn load(&self) -> Result<AgentState, StateError> {
        let mut cache = self.cache.lock().await;
        let persisted = self.fetch_or_create().await?;
        let state = persisted.state.clone();
        *cache = Some(persisted);
        Ok(state)
    }

    /// Reads the state without creating or changing anything (`fleetgate get agents`): `None`
    /// when the agent has not written one yet.
    pub async fn peek(&self) -> Result<Option<Peeked>, StateError> {
        match self.api.get_opt(&self.name).await.map_err(|e| self.kube_error("reading", e))? {
            Some(object) => {
                let paused = pause_reason(&object);
                Ok(Some(Peeked { state: self.decode(object)?.state, paused }))
            }
            None => Ok(None),
        }
    }

    /// The reason in [`PAUSED_ANNOTATION`] as last loaded or saved, when the ConfigMap has one
    /// that is not `false`.
    pub async fn paused_annotation(&self) -> Option<String> {
        pause_reason(&self.cache.lock().await.as_ref()?.object)
    }

    /// After a pass: marks the reconcile request the pass saw when it loaded the state as handled
    /// (a merge patch of [`RECONCILE_HANDLED_ANNOTATION`]); returns the value when there was one
    /// not handled yet. A request written during the pass is handled by the next one.
    pub async fn acknowledge_reconcile_request(&self) -> Result<Option<String>, StateError> {
        let mut cache = self.cache.lock().await;
        let Some(persisted) = cache.as_mut() else { return Ok(None) };
        let annotations = persisted.object.metadata.annotations.clone().unwrap_or_default();
        let Some(requested) = annotations.get(RECONCILE_REQUEST_ANNOTATION) else { return Ok(None) };
        if annotations.get(RECONCILE_HANDLED_ANNOTATION) == Some(requested) {
            return Ok(None);
        }
        let patch = serde_json::json!({"metadata": {"annotations": {RECONCILE_HANDLED_ANNOTATION: requested}}});
        let patched = self
            .api
            .patch(&self.name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .map_err(|e| self.kube_error("writing", e))?;
        // The patched object's resourceVersion, so the next state write does not conflict with it.
        persisted.object = patched;
        Ok(Some(requested.clone()))
    }

    /// The state as last loaded or saved by this store, without a request.
    pub async fn cached(&self) -> Option<AgentState> {
        self.cache.lock().await.as_ref().map(|p| p.state.clone())
    }

    /// Applies `change` to the state and saves it; returns the saved state and what `change`
    /// returned. If `change` fails, nothing is written and its error is returned; if it changes
    /// nothing, nothing is written. On a write conflict the store reloads and calls `change` again
    /// on the fresh state, up to 5 times.
    pub async fn update<T>(
        &self,
        mut change: impl FnMut(&mut AgentState) -> Result<T, TransitionError>,
    ) -> Result<(AgentState, T), StateError> {
        let mut cache = self.cache.lock().await;
        let mut base = match cache.take() {
            Some(p) => p,
            None => self.fetch_or_create().await?,
        };
        for _ in 0..MAX_CONFLICT_RETRIES {
            let mut next = base.state.clone();
            let out = match change(&mut next) {
                Ok(out) => out,
                Err(e) => {
                    *cache = Some(base);
                    return Err(e.into());
                }
            };
            if next == base.state {
                *cache = Some(base);
                return Ok((next, out));
            }
            let mut object = base.object.clone();
            object.data = Some(to_data(&next));
            match self.api.replace(&self.name, &PostParams::default(), &object).await {
                Ok(saved) => {
                    *cache = Some(Persisted { state: next.clone(), object: saved });
                    return Ok((next, out));
                }
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    tracing::debug!(configmap = %self.name, "state write conflict; reloading");
                    base = self.fetch_or_create().await?;
                }
                Err(source) => {
                    *cache = Some(base);
                    return Err(self.kube_error("writing", source));
                }
            }
        }
        Err(StateError::Contended {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            attempts: MAX_CONFLICT_RETRIES,
        })
    }

    /// A reference to the state ConfigMap (with its uid) for Events. Loads it if needed.
    pub async fn object_ref(&self) -> Result<ObjectReference, StateError> {
        let mut cache = self.cache.lock().await;
        let persisted = match cache.take() {
            Some(p) => p,
            None => self.fetch_or_create().await?,
        };
        let reference = persisted.object.object_ref(&());
        *cache = Some(persisted);
        Ok(reference)
    }

    async fn fetch_or_create(&self) -> Result<Persisted, StateError> {
        // Two attempts: a create can race another agent's create; then the object exists.
        for _ in 0..2 {
            match self.api.get_opt(&self.name).await.map_err(|e| self.kube_error("reading", e))? {
                Some(object) => return self.decode(object),
                None => {
                    let empty = self.empty_object();
                    match self.api.create(&PostParams::default(), &empty).await {
                        Ok(object) => return Ok(Persisted { state: AgentState::default(), object }),
                        Err(kube::Error::Api(s)) if s.is_already_exists() => continue,
                        Err(e) => return Err(self.kube_error("creating", e)),
                    }
                }
            }
        }
        Err(StateError::Contended { namespace: self.namespace.clone(), name: self.name.clone(), attempts: 2 })
    }

    fn decode(&self, object: ConfigMap) -> Result<Persisted, StateError> {
        let data = object.data.clone().unwrap_or_default();
        let state = from_data(&data).map_err(|problem| StateError::Corrupt {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            problem,
        })?;
        Ok(Persisted { state, object })
    }

    fn empty_object(&self) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([
                    ("app.kubernetes.io/managed-by".to_string(), "fleetgate".to_string()),
                    ("app.kubernetes.io/component".to_string(), "agent-state".to_string()),
                    (CLUSTER_LABEL.to_string(), self.cluster.clone()),
                ])),
                ..Default::default()
            },
            data: Some(to_data(&AgentState::default())),
            ..Default::default()
        }
    }

    fn kube_error(&self, action: &'static str, source: kube::Error) -> StateError {
        StateError::Kube {
            action,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: Box::new(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::state::machine::fixtures::{on_rel1, t};
    use crate::release::TagPins;
    use rstest::rstest;

    fn data(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn configmap_data_round_trips_mid_operation() {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-2"), false);
        let pins: TagPins = serde_json::from_value(serde_json::json!({ "pins": { "rel-2": "c2" } })).unwrap();
        s.record_tag_pins(&pins);
        s.begin("rel-2", "c2", t(10)).unwrap();
        s.record_baseline(serde_json::json!({"restarts": {"uid": 1}})).unwrap();
        s.start_apply(None, Some("snap")).unwrap();
        for step in 0..3 {
            match step {
                1 => drop(s.applied(t(20)).unwrap()),
                2 => drop(s.start_rollback(Failure::new("GateFailed", "7 > 5"), Vec::new(), t(30)).unwrap()),
                _ => {}
            }
            let d = to_data(&s);
            assert_eq!(from_data(&d).unwrap(), s, "phase {}", s.phase());
        }
        // A status decided with the step and not delivered yet survives the restart with it.
        s.record_unreported(crate::status::Status::new("c", "rel-2", "c2", crate::status::State::Pending, "applying"));
        assert_eq!(from_data(&to_data(&s)).unwrap(), s);
        // So does the write-back a rollback owes Git.
        s.record_write_back(super::super::machine::WriteBack {
            failed: "rel-2".into(),
            target: "rel-1".into(),
            failure: Failure::new("GateFailed", "7 > 5"),
        });
        assert_eq!(from_data(&to_data(&s)).unwrap(), s);
        let d = to_data(&s);
        assert!(d["writeBack"].contains(r#""target": "rel-1""#), "{}", d["writeBack"]);
        assert_eq!(d["phase"], "RollingBack");
        assert_eq!(d["current"], "rel-2");
        assert_eq!(from_data(&BTreeMap::new()).unwrap(), AgentState::default());
    }

    /// Data exactly as the agent before typed phases wrote it (one flat `operation` object): an
    /// agent upgraded while rolling back must pick the rollback up.
    #[test]
    fn data_written_by_the_previous_agent_is_read() {
        let operation = r#"{
  "release": "rel-2",
  "commit": "c2",
  "startedAt": "2023-11-14T22:13:30Z",
  "rollbackTarget": "rel-1",
  "snapshot": "snap",
  "appliedAt": "2023-11-14T22:13:40Z",
  "failure": { "reason": "GateFailed", "message": "pod-restarts 4 > 3" },
  "baseline": { "restarts": {} },
  "evidence": [ { "name": "pod-restarts", "observed": "4", "threshold": "3", "verdict": "fail" } ]
}"#;
        let d = data(&[
            ("schema", SCHEMA),
            ("phase", "RollingBack"),
            ("desired", "rel-2"),
            ("current", "rel-2"),
            ("lastKnownGood", "rel-1"),
            ("operation", operation),
            (
                "rejected",
                r#"{"rel-2": {"reason": "GateFailed", "message": "pod-restarts 4 > 3", "at": "2023-11-14T22:13:50Z"}}"#,
            ),
            ("tagPins", r#"{"pins": {"rel-1": "c1", "rel-2": "c2"}}"#),
        ]);
        let s = from_data(&d).unwrap();
        let Progress::RollingBack(r) = s.progress() else { panic!("{:?}", s.progress()) };
        assert_eq!(r.operation.rollback_target.as_deref(), Some("rel-1"));
        assert_eq!(r.operation.snapshot.as_deref(), Some("snap"));
        assert_eq!(r.applied_at, Some(t(20)));
        assert_eq!(r.failure, Failure::new("GateFailed", "pod-restarts 4 > 3"));
        assert_eq!(r.evidence[0].name, "pod-restarts");
        assert_eq!((s.current(), s.last_known_good()), (Some("rel-2"), Some("rel-1")));
        assert!(s.rejected().contains_key("rel-2"));
        assert_eq!(s.tag_pins().get("rel-1"), Some("c1"));
        // Written back in the same form.
        let again = to_data(&s);
        let (old, new): (serde_json::Value, serde_json::Value) =
            (serde_json::from_str(operation).unwrap(), serde_json::from_str(&again["operation"]).unwrap());
        assert_eq!(old, new);
    }

    #[rstest]
    #[case::wrong_schema(&[("schema", "other/v9")], "expected")]
    #[case::bad_phase(&[("schema", SCHEMA), ("phase", "Dancing")], "unknown phase")]
    #[case::phase_without_operation(&[("schema", SCHEMA), ("phase", "Baking")], "without an operation")]
    #[case::idle_with_operation(&[("schema", SCHEMA), ("phase", "Idle"), ("operation", r#"{"release":"r","commit":"c","startedAt":"2023-11-14T22:13:20Z"}"#)], "Idle with an operation")]
    #[case::baking_without_applied_at(&[("schema", SCHEMA), ("phase", "Baking"), ("operation", r#"{"release":"r","commit":"c","startedAt":"2023-11-14T22:13:20Z"}"#)], "appliedAt")]
    #[case::rolling_back_without_failure(&[("schema", SCHEMA), ("phase", "RollingBack"), ("operation", r#"{"release":"r","commit":"c","startedAt":"2023-11-14T22:13:20Z"}"#)], "failure")]
    #[case::bad_json(&[("schema", SCHEMA), ("rejected", "{")], "rejected")]
    fn corrupt_data_is_refused(#[case] entries: &[(&str, &str)], #[case] expected: &str) {
        let err = from_data(&data(entries)).unwrap_err();
        assert!(err.contains(expected), "{err}");
    }
}
