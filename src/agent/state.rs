//! The agent's persisted state machine: [`AgentState`] with pure transition methods, and
//! [`StateStore`], which keeps it in the ConfigMap `fleetgate-state-<cluster>` of the state
//! namespace with optimistic concurrency, so a restart (even `kill -9` mid-apply) resumes where the
//! last agent stopped.
//!
//! ```text
//!            begin                start_apply            applied              bake_passed
//!   Idle ───────────► Verifying ─────────────► Applying ──────────► Baking ──────────────► Idle
//!    ▲                  │ block (rejected)        │ start_rollback     │ start_rollback     (current =
//!    │                  │ abort (retry later)     ▼                    ▼                  last-known-good)
//!    └──────────────────┴─────────────────── RollingBack ◄─────────────┘
//!                                  rollback_finished (current = rollback target, release rejected)
//! ```
//!
//! A **rejected** release (blocked by a pre-apply gate, or rolled back) is never started again
//! while Git keeps desiring it; [`AgentState::observe_desired`] forgets rejections as soon as Git
//! desires a different release, so promoting it again later is an explicit human decision.
//!
//! The tag pins of verification ([`TagPins`], `tag → commit` recorded the first time a release tag is
//! verified) are kept here too: they must survive restarts, and the agent's local Git cache is an
//! emptyDir that does not.
//!
//! Each transition returns a [`Transition`] (reason, message, severity) that the caller turns into
//! a Kubernetes Event and log line; the state itself never does I/O.

use crate::release::TagPins;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Resource};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Where the agent is in the pipeline of one release.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Phase {
    /// Nothing in progress: current (if any) runs and was left healthy or rolled back to.
    #[default]
    Idle,
    /// Resolving, verifying, pre-apply gates and snapshot; nothing applied yet.
    Verifying,
    /// Server-side apply of the release in progress.
    Applying,
    /// Applied; post-apply gates are being evaluated for the bake time.
    Baking,
    /// Re-applying the rollback target (or pruning to nothing) after a failure.
    RollingBack,
}

impl Phase {
    pub const ALL: [Phase; 5] = [Phase::Idle, Phase::Verifying, Phase::Applying, Phase::Baking, Phase::RollingBack];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "Idle",
            Phase::Verifying => "Verifying",
            Phase::Applying => "Applying",
            Phase::Baking => "Baking",
            Phase::RollingBack => "RollingBack",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Phase {
    type Err = String;
    fn from_str(s: &str) -> Result<Phase, String> {
        Phase::ALL.into_iter().find(|p| p.as_str() == s).ok_or_else(|| format!("unknown phase {s:?}"))
    }
}

/// Why an operation failed: a PascalCase category (the Event reason, the rollbacks metric label)
/// and a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub reason: String,
    pub message: String,
}

impl Failure {
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure { reason: reason.into(), message: message.into() }
    }
}

/// The operation in progress (any phase but Idle).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// The release being rolled out.
    pub release: String,
    /// Its tagged commit.
    pub commit: String,
    pub started_at: DateTime<Utc>,
    /// Release to return to on failure: the release's `rollbackTo`, else last-known-good at the
    /// time the apply started. `None` = there is nothing to go back to (prune to empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_target: Option<String>,
    /// Name of the snapshot taken before apply (set by `start_apply`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// When apply finished and baking began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<DateTime<Utc>>,
    /// Set when rolling back: what failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The gates' baseline sampled just before the apply (a `gates::Baseline`, opaque here), so
    /// an agent restarted mid-bake still counts restarts and compares metrics from before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<serde_json::Value>,
    /// The gate figures that failed the release, for the failure status of a restarted rollback.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<crate::status::GateFigure>,
}

/// A release the agent will not start again while Git keeps desiring it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rejection {
    #[serde(flatten)]
    pub failure: Failure,
    pub at: DateTime<Utc>,
}

/// The persisted state of one agent (one cluster). Fields are read through accessors and changed
/// only through the transition methods, which check the phase they start from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentState {
    desired: Option<String>,
    phase: Phase,
    operation: Option<Operation>,
    current: Option<String>,
    last_known_good: Option<String>,
    rejected: BTreeMap<String, Rejection>,
    tag_pins: TagPins,
}

/// What the loop should do next, read from the state alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next<'a> {
    /// Git desires nothing for this cluster yet, or the desired release already runs.
    Nothing,
    /// Git desires a release that was rejected; it stays rejected until Git desires another.
    Rejected { release: &'a str, rejection: &'a Rejection },
    /// Start rolling out the desired release (call [`AgentState::begin`]).
    Start { release: &'a str },
    /// An operation was in progress (this process or a previous one): continue it from `phase`.
    Resume { phase: Phase, operation: &'a Operation },
}

/// Severity of a transition, for Events and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

/// A state change, described for Events (reason = category, PascalCase), logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub from: Phase,
    pub to: Phase,
    pub release: String,
    pub reason: &'static str,
    pub message: String,
    pub severity: Severity,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("cannot {action} in phase {phase}: it needs phase {needs}")]
    WrongPhase { action: &'static str, phase: Phase, needs: &'static str },
    #[error(
        "release {release} was rejected ({reason}: {message}); it is not started again until Git desires a different release"
    )]
    Rejected { release: String, reason: String, message: String },
}

impl AgentState {
    pub fn desired(&self) -> Option<&str> {
        self.desired.as_deref()
    }
    pub fn phase(&self) -> Phase {
        self.phase
    }
    pub fn operation(&self) -> Option<&Operation> {
        self.operation.as_ref()
    }
    /// The release running in the cluster as far as the agent applied it (after a rollback: the
    /// release rolled back to).
    pub fn current(&self) -> Option<&str> {
        self.current.as_deref()
    }
    /// The last release that passed its bake; the default rollback target.
    pub fn last_known_good(&self) -> Option<&str> {
        self.last_known_good.as_deref()
    }
    pub fn rejected(&self) -> &BTreeMap<String, Rejection> {
        &self.rejected
    }
    /// Pins to hand to verification (clone, verify, then [`record_tag_pins`](Self::record_tag_pins)).
    pub fn tag_pins(&self) -> &TagPins {
        &self.tag_pins
    }

    /// What the loop should do next.
    pub fn next(&self) -> Next<'_> {
        if let (phase, Some(operation)) = (self.phase, &self.operation)
            && phase != Phase::Idle
        {
            return Next::Resume { phase, operation };
        }
        match self.desired.as_deref() {
            None => Next::Nothing,
            Some(d) if Some(d) == self.current.as_deref() => Next::Nothing,
            Some(d) => match self.rejected.get(d) {
                Some(rejection) => Next::Rejected { release: d, rejection },
                None => Next::Start { release: d },
            },
        }
    }

    /// Records what Git desires for this cluster now (`None`: no release set). A change forgets every
    /// rejection except one of the newly desired release itself.
    pub fn observe_desired(&mut self, desired: Option<&str>) {
        if self.desired.as_deref() == desired {
            return;
        }
        self.desired = desired.map(str::to_string);
        self.rejected.retain(|release, _| Some(release.as_str()) == desired);
    }

    /// Adds the pins verification recorded. A union, so re-applying it after a write conflict
    /// keeps pins another writer stored meanwhile. Verification refuses moved tags before this is
    /// called; here a pin is only ever added.
    pub fn record_tag_pins(&mut self, verified: &TagPins) {
        for (tag, commit) in verified.iter() {
            if self.tag_pins.get(tag).is_none() {
                // Pins kept in state have no backing file, so storing one cannot fail.
                self.tag_pins.pin(tag, commit).expect("in-memory tag pins cannot fail to store");
            }
        }
    }

    /// Idle → Verifying: start rolling out `release` (tagged `commit`).
    pub fn begin(&mut self, release: &str, commit: &str, now: DateTime<Utc>) -> Result<Transition, TransitionError> {
        self.expect("begin a release", Phase::Idle, "Idle")?;
        if let Some(r) = self.rejected.get(release) {
            return Err(TransitionError::Rejected {
                release: release.to_string(),
                reason: r.failure.reason.clone(),
                message: r.failure.message.clone(),
            });
        }
        self.operation = Some(Operation {
            release: release.to_string(),
            commit: commit.to_string(),
            started_at: now,
            rollback_target: None,
            snapshot: None,
            applied_at: None,
            failure: None,
            baseline: None,
            evidence: Vec::new(),
        });
        let from = self.current.as_deref().unwrap_or("nothing");
        Ok(self.go(Phase::Verifying, "ReleaseStarted", Severity::Normal, format!("verifying {release} (from {from})")))
    }

    /// Verifying → Idle, rejecting the release: a pre-apply gate or bad input refused it and nothing
    /// was applied. It is not retried until Git desires a different release.
    pub fn block(&mut self, failure: Failure, now: DateTime<Utc>) -> Result<Transition, TransitionError> {
        self.expect("block a release", Phase::Verifying, "Verifying")?;
        let release = self.op().release.clone();
        let message = format!("{release} blocked, nothing applied: {}: {}", failure.reason, failure.message);
        self.rejected.insert(release, Rejection { failure, at: now });
        Ok(self.finish(Phase::Idle, "ReleaseBlocked", Severity::Warning, message))
    }

    /// Verifying → Idle without rejecting: a transient problem (API server, Git unreachable, wave
    /// not ready); the next sync tries again.
    pub fn abort(&mut self, why: &str) -> Result<Transition, TransitionError> {
        self.expect("abort", Phase::Verifying, "Verifying")?;
        let release = self.op().release.clone();
        Ok(self.finish(Phase::Idle, "ReleaseDeferred", Severity::Normal, format!("{release} deferred: {why}")))
    }

    /// Verifying → Applying: verification and pre-apply gates passed, the snapshot (if any) is
    /// taken. `rollback_target` is the release's `rollbackTo`; `None` falls back to last-known-good.
    pub fn start_apply(
        &mut self,
        rollback_target: Option<&str>,
        snapshot: Option<&str>,
    ) -> Result<Transition, TransitionError> {
        self.expect("start applying", Phase::Verifying, "Verifying")?;
        let lkg = self.last_known_good.clone();
        let op = self.operation.as_mut().expect("Verifying has an operation");
        op.rollback_target = rollback_target.map(str::to_string).or(lkg);
        op.snapshot = snapshot.map(str::to_string);
        let message = format!("applying {}", op.release);
        Ok(self.go(Phase::Applying, "ApplyStarted", Severity::Normal, message))
    }

    /// Applying → Baking: every object applied and workloads rolled out.
    pub fn applied(&mut self, now: DateTime<Utc>) -> Result<Transition, TransitionError> {
        self.expect("finish applying", Phase::Applying, "Applying")?;
        let op = self.operation.as_mut().expect("Applying has an operation");
        op.applied_at = Some(now);
        // From here the cluster runs the new release, whatever the bake says.
        self.current = Some(op.release.clone());
        let message = format!("{} applied; baking", op.release);
        Ok(self.go(Phase::Baking, "Applied", Severity::Normal, message))
    }

    /// Baking → Idle: every post-apply gate held for the bake time; the release becomes
    /// last-known-good.
    pub fn bake_passed(&mut self) -> Result<Transition, TransitionError> {
        self.expect("pass the bake", Phase::Baking, "Baking")?;
        let release = self.op().release.clone();
        self.current = Some(release.clone());
        self.last_known_good = Some(release.clone());
        Ok(self.finish(Phase::Idle, "ReleaseSucceeded", Severity::Normal, format!("{release} passed its gates")))
    }

    /// Applying or Baking → RollingBack: a gate failed or apply errored. The release is rejected
    /// at once, so a crash during the rollback can never lead to re-applying it. Returns the
    /// transition; the rollback target is in [`Operation::rollback_target`].
    pub fn start_rollback(&mut self, failure: Failure, now: DateTime<Utc>) -> Result<Transition, TransitionError> {
        if !matches!(self.phase, Phase::Applying | Phase::Baking) {
            return Err(TransitionError::WrongPhase {
                action: "start a rollback",
                phase: self.phase,
                needs: "Applying or Baking",
            });
        }
        let op = self.operation.as_mut().expect("Applying/Baking has an operation");
        op.failure = Some(failure.clone());
        let release = op.release.clone();
        let target = op.rollback_target.clone();
        self.rejected.insert(release.clone(), Rejection { failure: failure.clone(), at: now });
        let to = target.as_deref().unwrap_or("nothing (no earlier release)");
        let message = format!("{release} failed ({}: {}); rolling back to {to}", failure.reason, failure.message);
        Ok(self.go(Phase::RollingBack, "RollbackStarted", Severity::Warning, message))
    }

    /// RollingBack → Idle: the rollback target is applied and healthy (or, without a target, what
    /// the failed release added is pruned).
    pub fn rollback_finished(&mut self) -> Result<Transition, TransitionError> {
        self.expect("finish a rollback", Phase::RollingBack, "RollingBack")?;
        let op = self.op();
        let (release, target) = (op.release.clone(), op.rollback_target.clone());
        let why = op.failure.as_ref().map(|f| format!(" after {}", f.reason)).unwrap_or_default();
        self.current = target.clone();
        let message = format!("rolled back from {release} to {}{why}", target.as_deref().unwrap_or("nothing"));
        Ok(self.finish(Phase::Idle, "RolledBack", Severity::Warning, message))
    }

    /// Keeps the gates' baseline with the operation (sampled while verifying, before the apply).
    pub fn record_baseline(&mut self, baseline: serde_json::Value) -> Result<(), TransitionError> {
        self.expect("record a baseline", Phase::Verifying, "Verifying")?;
        self.operation.as_mut().expect("Verifying has an operation").baseline = Some(baseline);
        Ok(())
    }

    /// Keeps the failing gate figures with a rollback in progress.
    pub fn record_evidence(&mut self, evidence: Vec<crate::status::GateFigure>) -> Result<(), TransitionError> {
        self.expect("record gate figures", Phase::RollingBack, "RollingBack")?;
        self.operation.as_mut().expect("RollingBack has an operation").evidence = evidence;
        Ok(())
    }

    fn op(&self) -> &Operation {
        self.operation.as_ref().expect("a non-Idle phase has an operation")
    }

    fn expect(&self, action: &'static str, phase: Phase, needs: &'static str) -> Result<(), TransitionError> {
        if self.phase == phase { Ok(()) } else { Err(TransitionError::WrongPhase { action, phase: self.phase, needs }) }
    }

    fn go(&mut self, to: Phase, reason: &'static str, severity: Severity, message: String) -> Transition {
        let from = std::mem::replace(&mut self.phase, to);
        Transition { from, to, release: self.op().release.clone(), reason, message, severity }
    }

    /// Like `go`, and ends the operation.
    fn finish(&mut self, to: Phase, reason: &'static str, severity: Severity, message: String) -> Transition {
        let t = self.go(to, reason, severity, message);
        self.operation = None;
        t
    }
}

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
}
const SCHEMA: &str = "fleetgate.io/agent-state/v1";

impl AgentState {
    fn to_data(&self) -> BTreeMap<String, String> {
        let mut d = BTreeMap::new();
        d.insert(key::SCHEMA.into(), SCHEMA.into());
        d.insert(key::PHASE.into(), self.phase.to_string());
        for (k, v) in [
            (key::DESIRED, &self.desired),
            (key::CURRENT, &self.current),
            (key::LAST_KNOWN_GOOD, &self.last_known_good),
        ] {
            if let Some(v) = v {
                d.insert(k.into(), v.clone());
            }
        }
        if let Some(op) = &self.operation {
            d.insert(key::OPERATION.into(), serde_json::to_string_pretty(op).expect("operation serializes"));
        }
        d.insert(key::REJECTED.into(), serde_json::to_string_pretty(&self.rejected).expect("rejections serialize"));
        d.insert(key::TAG_PINS.into(), serde_json::to_string_pretty(&self.tag_pins).expect("pins serialize"));
        d
    }

    fn from_data(data: &BTreeMap<String, String>) -> Result<AgentState, String> {
        if data.is_empty() {
            return Ok(AgentState::default());
        }
        match data.get(key::SCHEMA).map(String::as_str) {
            Some(SCHEMA) => {}
            other => return Err(format!("{}: expected {SCHEMA:?}, found {other:?}", key::SCHEMA)),
        }
        fn json<T: serde::de::DeserializeOwned + Default>(
            data: &BTreeMap<String, String>,
            k: &str,
        ) -> Result<T, String> {
            data.get(k).map(|s| serde_json::from_str(s).map_err(|e| format!("{k}: {e}"))).unwrap_or(Ok(T::default()))
        }
        let phase: Phase = data.get(key::PHASE).map(|p| p.parse()).transpose()?.unwrap_or_default();
        let operation: Option<Operation> = json(data, key::OPERATION)?;
        if (phase == Phase::Idle) != operation.is_none() {
            return Err(format!("phase {phase} with{} an operation", if operation.is_some() { "" } else { "out" }));
        }
        Ok(AgentState {
            desired: data.get(key::DESIRED).cloned(),
            phase,
            operation,
            current: data.get(key::CURRENT).cloned(),
            last_known_good: data.get(key::LAST_KNOWN_GOOD).cloned(),
            rejected: json(data, key::REJECTED)?,
            tag_pins: json(data, key::TAG_PINS)?,
        })
    }
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
    #[error("{action} state ConfigMap {namespace}/{name}: {source}")]
    Kube { action: &'static str, namespace: String, name: String, source: Box<kube::Error> },
}

/// Label on the state ConfigMap naming the cluster it belongs to.
pub const CLUSTER_LABEL: &str = "fleetgate.io/cluster";
/// How many times an update reloads and re-applies after a resourceVersion conflict.
const MAX_CONFLICT_RETRIES: u32 = 5;

#[derive(Debug, Clone)]
struct Persisted {
    state: AgentState,
    object: ConfigMap,
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
            name: format!("fleetgate-state-{cluster}"),
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
            object.data = Some(next.to_data());
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
        if cache.is_none() {
            *cache = Some(self.fetch_or_create().await?);
        }
        Ok(cache.as_ref().expect("just loaded").object.object_ref(&()))
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
        let state = AgentState::from_data(&data).map_err(|problem| StateError::Corrupt {
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
            data: Some(AgentState::default().to_data()),
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
    use rstest::rstest;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    fn fail(reason: &str) -> Failure {
        Failure::new(reason, "error rate 7.1% > 5%")
    }

    /// A state that ran rel-1 successfully.
    fn on_rel1() -> AgentState {
        let mut s = AgentState::default();
        s.observe_desired(Some("rel-1"));
        s.begin("rel-1", "c1", t(0)).unwrap();
        s.start_apply(None, None).unwrap();
        s.applied(t(1)).unwrap();
        s.bake_passed().unwrap();
        s
    }

    #[test]
    fn happy_path_makes_release_current_and_good() {
        let mut s = on_rel1();
        assert_eq!((s.phase(), s.current(), s.last_known_good()), (Phase::Idle, Some("rel-1"), Some("rel-1")));
        s.observe_desired(Some("rel-2"));
        assert_eq!(s.next(), Next::Start { release: "rel-2" });
        let tr = s.begin("rel-2", "c2", t(10)).unwrap();
        assert_eq!((tr.from, tr.to, tr.reason), (Phase::Idle, Phase::Verifying, "ReleaseStarted"));
        let tr = s.start_apply(None, Some("snap-rel-1")).unwrap();
        assert_eq!(tr.to, Phase::Applying);
        assert_eq!(s.operation().unwrap().rollback_target.as_deref(), Some("rel-1"));
        assert_eq!(s.operation().unwrap().snapshot.as_deref(), Some("snap-rel-1"));
        s.applied(t(20)).unwrap();
        assert_eq!((s.phase(), s.current(), s.last_known_good()), (Phase::Baking, Some("rel-2"), Some("rel-1")));
        assert!(matches!(s.next(), Next::Resume { phase: Phase::Baking, .. }));
        let tr = s.bake_passed().unwrap();
        assert_eq!((tr.reason, tr.severity), ("ReleaseSucceeded", Severity::Normal));
        assert_eq!((s.phase(), s.current(), s.last_known_good()), (Phase::Idle, Some("rel-2"), Some("rel-2")));
        assert_eq!(s.operation(), None);
        assert_eq!(s.next(), Next::Nothing);
    }

    #[rstest]
    #[case::from_applying(false)]
    #[case::from_baking(true)]
    fn rollback_returns_to_target_and_rejects(#[case] baked: bool) {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-2"));
        s.begin("rel-2", "c2", t(10)).unwrap();
        s.start_apply(None, None).unwrap();
        if baked {
            s.applied(t(20)).unwrap();
        }
        let tr = s.start_rollback(fail("GateFailed"), t(30)).unwrap();
        assert_eq!((tr.to, tr.severity), (Phase::RollingBack, Severity::Warning));
        assert!(tr.message.contains("rolling back to rel-1"), "{}", tr.message);
        // Rejected already while rolling back: a crash here must not lead to re-applying rel-2.
        assert!(s.rejected().contains_key("rel-2"));
        let tr = s.rollback_finished().unwrap();
        assert_eq!(tr.reason, "RolledBack");
        assert_eq!((s.phase(), s.current(), s.last_known_good()), (Phase::Idle, Some("rel-1"), Some("rel-1")));
        assert!(matches!(s.next(), Next::Rejected { release: "rel-2", .. }));
        assert!(matches!(s.begin("rel-2", "c2", t(40)), Err(TransitionError::Rejected { .. })));
    }

    #[test]
    fn explicit_rollback_target_wins_over_last_known_good() {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-3"));
        s.begin("rel-3", "c3", t(0)).unwrap();
        s.start_apply(Some("rel-0"), None).unwrap();
        assert_eq!(s.operation().unwrap().rollback_target.as_deref(), Some("rel-0"));
    }

    #[test]
    fn first_release_failing_rolls_back_to_nothing() {
        let mut s = AgentState::default();
        s.observe_desired(Some("rel-1"));
        s.begin("rel-1", "c1", t(0)).unwrap();
        s.start_apply(None, None).unwrap();
        let tr = s.start_rollback(fail("ApplyFailed"), t(1)).unwrap();
        assert!(tr.message.contains("rolling back to nothing"), "{}", tr.message);
        s.rollback_finished().unwrap();
        assert_eq!(s.current(), None);
    }

    #[test]
    fn rejection_lasts_until_git_desires_another_release() {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-2"));
        s.begin("rel-2", "c2", t(0)).unwrap();
        s.block(Failure::new("CrdIncompatible", "field spec.size removed"), t(1)).unwrap();
        assert_eq!(s.phase(), Phase::Idle);
        assert_eq!(s.current(), Some("rel-1"));
        // Git still says rel-2 (another commit changed something else): still rejected.
        s.observe_desired(Some("rel-2"));
        assert!(matches!(s.next(), Next::Rejected { release: "rel-2", .. }));
        // Git moves on (revert to rel-1): forgotten; a later re-promotion of rel-2 is tried again.
        s.observe_desired(Some("rel-1"));
        assert_eq!(s.next(), Next::Nothing);
        assert!(s.rejected().is_empty());
        s.observe_desired(Some("rel-2"));
        assert_eq!(s.next(), Next::Start { release: "rel-2" });
    }

    #[test]
    fn abort_does_not_reject() {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-2"));
        s.begin("rel-2", "c2", t(0)).unwrap();
        let tr = s.abort("wave-1 waits for canary").unwrap();
        assert_eq!(tr.reason, "ReleaseDeferred");
        assert_eq!(s.next(), Next::Start { release: "rel-2" });
    }

    #[rstest]
    #[case::apply_from_idle(|s: &mut AgentState| s.start_apply(None, None).map(drop))]
    #[case::applied_from_idle(|s: &mut AgentState| s.applied(t(0)).map(drop))]
    #[case::bake_from_idle(|s: &mut AgentState| s.bake_passed().map(drop))]
    #[case::rollback_from_idle(|s: &mut AgentState| s.start_rollback(fail("X"), t(0)).map(drop))]
    #[case::finish_rollback_from_idle(|s: &mut AgentState| s.rollback_finished().map(drop))]
    #[case::block_from_idle(|s: &mut AgentState| s.block(fail("X"), t(0)).map(drop))]
    #[case::begin_twice(|s: &mut AgentState| { s.begin("a", "c", t(0))?; s.begin("b", "c", t(0)).map(drop) })]
    #[case::rollback_from_verifying(|s: &mut AgentState| { s.begin("a", "c", t(0))?; s.start_rollback(fail("X"), t(0)).map(drop) })]
    fn transitions_check_their_phase(#[case] step: fn(&mut AgentState) -> Result<(), TransitionError>) {
        let mut s = AgentState::default();
        let before_err = s.clone();
        let err = step(&mut s).unwrap_err();
        assert!(matches!(err, TransitionError::WrongPhase { .. }), "{err}");
        // A refused transition leaves at most the steps before it (begin) applied.
        assert!(s == before_err || s.phase() == Phase::Verifying);
    }

    fn pins(pairs: &[(&str, &str)]) -> TagPins {
        let map: BTreeMap<&str, &str> = pairs.iter().copied().collect();
        serde_json::from_value(serde_json::json!({ "pins": map })).unwrap()
    }

    #[test]
    fn recorded_tag_pins_are_a_union_that_never_repins() {
        let mut s = AgentState::default();
        s.record_tag_pins(&pins(&[("rel-1", "aaa")]));
        s.record_tag_pins(&pins(&[("rel-2", "bbb"), ("rel-1", "zzz")]));
        assert_eq!(s.tag_pins(), &pins(&[("rel-1", "aaa"), ("rel-2", "bbb")]));
    }

    #[test]
    fn configmap_data_round_trips_mid_operation() {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-2"));
        s.record_tag_pins(&pins(&[("rel-2", "c2")]));
        s.begin("rel-2", "c2", t(10)).unwrap();
        s.start_apply(None, Some("snap")).unwrap();
        s.applied(t(20)).unwrap();
        s.start_rollback(fail("GateFailed"), t(30)).unwrap();
        let data = s.to_data();
        assert_eq!(data["phase"], "RollingBack");
        assert_eq!(data["current"], "rel-2");
        assert_eq!(AgentState::from_data(&data).unwrap(), s);
        assert_eq!(AgentState::from_data(&BTreeMap::new()).unwrap(), AgentState::default());
    }

    #[rstest]
    #[case::wrong_schema(&[("schema", "other/v9")], "expected")]
    #[case::bad_phase(&[("schema", SCHEMA), ("phase", "Dancing")], "unknown phase")]
    #[case::phase_without_operation(&[("schema", SCHEMA), ("phase", "Baking")], "without an operation")]
    #[case::bad_json(&[("schema", SCHEMA), ("rejected", "{")], "rejected")]
    fn corrupt_data_is_refused(#[case] entries: &[(&str, &str)], #[case] expected: &str) {
        let data = entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let err = AgentState::from_data(&data).unwrap_err();
        assert!(err.contains(expected), "{err}");
    }
}
