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
//!
//! **Authentication.** Whoever may write ConfigMaps in the agent's namespace must not be able to
//! edit what the agent remembers (a rejection cleared, `newest` rewound, a status key re-pinned).
//! Every write carries `hmacSha256`: HMAC-SHA256 under the agent's state key ([`AgentKey`], Secret
//! [`state_key_secret_name`], readable by the agent and cluster admins, not by a ConfigMap writer)
//! of the ConfigMap's namespace, name, and every other data key and value as stored. A state whose
//! MAC does not verify is refused ([`StateError::Unauthenticated`]), and so is a missing state once
//! the key exists (deleting it would erase the same memory).
//!
//! **Migration.** A state ConfigMap without a key Secret was written by an agent from before states
//! were sealed (or looks like one): [`AgentState::unauthenticated_remains`] keeps of it only what
//! can make the agent stricter, the rest is named in a report ([`StateStore::take_migration_report`]),
//! then the key is made and the state written back sealed. This happens once: with the key in place
//! an unsealed state is refused like any other forgery.
//!
//! **Replays.** A sealed state carries `generation`, one more at every write. A store refuses a
//! state older than the newest it wrote or read: a saved copy written back (forgetting a
//! rejection recorded since) is refused while the agent runs. Across restarts too: after each
//! write the store records the generation in an annotation of the key Secret (which a ConfigMap
//! writer cannot write), and a start refuses a state older than it. The Secret is written after the
//! ConfigMap, so a crash in between leaves it behind the state, which is accepted.

use super::machine::{AgentState, Failure, Operation, Phase, Progress, Return, Rollback, TransitionError};
use crate::apply::{AgentKey, AgentKeyError};
use crate::status::GateFigure;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Secret};
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
    /// The MAC of every other key ([`super::seal`]).
    pub const MAC: &str = "hmacSha256";
    /// Counts the agent's writes ([`super::generation`]).
    pub const GENERATION: &str = "generation";
    /// Annotation on the state key Secret: the newest generation written, the oldest a start believes.
    pub const GENERATION_ANNOTATION: &str = "fleetgate.io/state-generation";
}
const SCHEMA: &str = "fleetgate.io/agent-state/v1";
/// What the state's MAC is computed under (the outbox has its own domain under the same key).
const MAC_DOMAIN: &str = "fleetgate agent-state v1";

/// What the MAC covers: the ConfigMap's `namespace` and `name`, then every data key and value but
/// the MAC itself, in key order.
fn mac_parts<'a>(namespace: &'a str, name: &'a str, data: &'a BTreeMap<String, String>) -> Vec<&'a [u8]> {
    [namespace.as_bytes(), name.as_bytes()]
        .into_iter()
        .chain(data.iter().filter(|(k, _)| *k != key::MAC).flat_map(|(k, v)| [k.as_bytes(), v.as_bytes()]))
        .collect()
}

/// The write count in sealed `data` (0 before the agent counted).
/// The generation the key Secret records (0 when none yet).
fn recorded_generation(secret: &Secret) -> u64 {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key::GENERATION_ANNOTATION))
        .and_then(|g| g.parse().ok())
        .unwrap_or(0)
}

fn generation(data: &BTreeMap<String, String>) -> u64 {
    data.get(key::GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0)
}

/// `data` with its MAC added.
pub(super) fn seal(
    key: &AgentKey,
    namespace: &str,
    name: &str,
    mut data: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mac = key.mac(MAC_DOMAIN, &mac_parts(namespace, name, &data));
    data.insert(key::MAC.into(), mac);
    data
}

/// Whether `data` carries a MAC that verifies under `key`; the error says what is wrong.
pub(super) fn open(key: &AgentKey, namespace: &str, name: &str, data: &BTreeMap<String, String>) -> Result<(), String> {
    let Some(mac) = data.get(key::MAC) else {
        return Err(format!(
            "it carries no {} although this agent sealed its state before (an earlier agent's unsealed state is \
             migrated once, never again)",
            key::MAC
        ));
    };
    if key.verify(MAC_DOMAIN, &mac_parts(namespace, name, data), mac) {
        Ok(())
    } else {
        Err(format!(
            "its {} does not verify under the agent's state key: someone other than the agent wrote it",
            key::MAC
        ))
    }
}

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
        "state ConfigMap {namespace}/{name} is not readable as agent state ({problem}); inspect it with `kubectl -n {namespace} get configmap {name} -o yaml`; to start over, delete it and the agent's state key Secret (that forgets rejections and tag pins)"
    )]
    Corrupt { namespace: String, name: String, problem: String },
    #[error(
        "state ConfigMap {namespace}/{name} kept changing under us ({attempts} conflicting writes); is a second agent running for this cluster without leader election?"
    )]
    Contended { namespace: String, name: String, attempts: u32 },
    #[error("{action} state ConfigMap {namespace}/{name}")]
    Kube { action: &'static str, namespace: String, name: String, source: Box<kube::Error> },
    #[error(
        "{what} {namespace}/{name} is refused, nothing in it is trusted: {problem}. Find who wrote it (`kubectl -n {namespace} get configmap {name} --show-managed-fields -o yaml`); to start over, delete it and Secret {namespace}/{key_secret} (that forgets rejections, revocations and pins)"
    )]
    Unauthenticated { what: &'static str, namespace: String, name: String, key_secret: String, problem: String },
    #[error("the agent's state key")]
    Key(#[from] AgentKeyError),
}

impl StateError {
    /// Whether the stored state was refused as not the agent's own: retrying does not help.
    pub fn is_unauthenticated(&self) -> bool {
        matches!(self, StateError::Unauthenticated { .. })
    }
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
    /// The key `object` is sealed with.
    key: AgentKey,
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

/// Secret `fleetgate-state-key-<cluster>`: the key the state and the outbox of `cluster`'s agent
/// are sealed with. Its existence also says that the state was sealed once.
pub fn state_key_secret_name(cluster: &str) -> String {
    format!("fleetgate-state-key-{cluster}")
}

/// Loads and saves one cluster's [`AgentState`] in its ConfigMap. Writes carry the last seen
/// `resourceVersion`; on a conflict the store reloads and re-applies the change to the fresh state
/// (which may then refuse it, e.g. when another writer already moved the phase on).
#[derive(Debug)]
pub struct StateStore {
    api: Api<ConfigMap>,
    secrets: Api<Secret>,
    namespace: String,
    name: String,
    cluster: String,
    cache: tokio::sync::Mutex<Option<Persisted>>,
    /// What the migration of an unsealed state dropped, until someone takes it.
    migration: std::sync::Mutex<Option<String>>,
    /// The highest generation this store wrote or read.
    newest_generation: std::sync::atomic::AtomicU64,
    /// The state key once read or made: a load then costs one request, not two (a reset, which
    /// deletes the key, takes a restart anyway).
    key: std::sync::OnceLock<AgentKey>,
}

impl StateStore {
    /// A store for `fleetgate-state-<cluster>` in `namespace`; nothing is read until [`load`](Self::load).
    pub fn new(client: Client, namespace: &str, cluster: &str) -> StateStore {
        StateStore {
            api: Api::namespaced(client.clone(), namespace),
            secrets: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: state_configmap_name(cluster),
            cluster: cluster.to_string(),
            cache: tokio::sync::Mutex::new(None),
            migration: std::sync::Mutex::new(None),
            newest_generation: Default::default(),
            key: std::sync::OnceLock::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The key the state is sealed with, which seals the outbox too (loads the state if needed).
    pub async fn key(&self) -> Result<AgentKey, StateError> {
        let mut cache = self.cache.lock().await;
        let persisted = match cache.take() {
            Some(p) => p,
            None => self.fetch_or_create().await?,
        };
        let key = persisted.key.clone();
        *cache = Some(persisted);
        Ok(key)
    }

    /// What migrating an earlier agent's unsealed state dropped, once (for a Warning Event).
    pub fn take_migration_report(&self) -> Option<String> {
        self.migration.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Reads the state from the API server and verifies its MAC, creating a sealed empty state
    /// ConfigMap (and the state key) when there is neither (so Events have an object to point at
    /// and missing RBAC shows at start-up), migrating an earlier agent's unsealed state once.
    pub async fn load(&self) -> Result<AgentState, StateError> {
        let mut cache = self.cache.lock().await;
        let persisted = self.fetch_or_create().await?;
        let state = persisted.state.clone();
        *cache = Some(persisted);
        Ok(state)
    }

    /// Reads the state without creating or changing anything (`fleetgate get agents`): `None`
    /// when the agent has not written one yet. Its MAC is not checked (the reader may not read
    /// the key): what it returns is for display, never for a decision.
    pub async fn peek(&self) -> Result<Option<Peeked>, StateError> {
        match self.api.get_opt(&self.name).await.map_err(|e| self.kube_error("reading", e))? {
            Some(object) => {
                let paused = pause_reason(&object);
                Ok(Some(Peeked { state: self.decode(&object)?, paused }))
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
            let written = generation(&object.data.clone().unwrap_or_default()) + 1;
            object.data = Some(self.sealed(&base.key, &next, written));
            match self.api.replace(&self.name, &PostParams::default(), &object).await {
                Ok(saved) => {
                    self.newest_generation.fetch_max(written, std::sync::atomic::Ordering::Relaxed);
                    self.record_generation(written).await;
                    *cache = Some(Persisted { state: next.clone(), object: saved, key: base.key });
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

    /// The sealed state: verified when the key exists, created when neither exists, migrated
    /// when only the ConfigMap does (an earlier agent's). Boxed: every step of a pass awaits
    /// it; inline, its requests outgrow a debug build's test thread stack.
    fn fetch_or_create(&self) -> std::pin::Pin<Box<dyn Future<Output = Result<Persisted, StateError>> + Send + '_>> {
        Box::pin(self.fetch_verify_or_create())
    }

    async fn fetch_verify_or_create(&self) -> Result<Persisted, StateError> {
        // Three attempts: a create or a migration can race another replica's; then both exist.
        for _ in 0..3 {
            let key = match self.key.get() {
                Some(key) => Some(key.clone()),
                None => self.read_key().await?,
            };
            let object = self.api.get_opt(&self.name).await.map_err(|e| self.kube_error("reading", e))?;
            match (object, key) {
                (Some(object), Some(key)) => {
                    let data = object.data.clone().unwrap_or_default();
                    open(&key, &self.namespace, &self.name, &data).map_err(|p| self.refused(p))?;
                    let read = generation(&data);
                    let newest = self.newest_generation.fetch_max(read, std::sync::atomic::Ordering::Relaxed);
                    if read < newest {
                        return Err(self.refused(format!(
                            "it is older than the state this agent last wrote or read, in this process or as \
                             recorded in Secret {} (generation {read} < {newest}): a saved copy written back",
                            self.key_secret()
                        )));
                    }
                    return Ok(Persisted { state: self.decode(&object)?, object, key });
                }
                // The key exists but no state was ever saved with it (the Secret records no
                // generation and this process read none): another replica is between creating
                // the key and creating the ConfigMap. Creating the empty state here erases nothing.
                (None, Some(key)) if self.newest_generation.load(std::sync::atomic::Ordering::Relaxed) == 0 => {
                    if let Some(created) = self.create_empty(key).await? {
                        return Ok(created);
                    }
                }
                (None, Some(_)) => {
                    return Err(self.refused(format!(
                        "it no longer exists, though this agent sealed it before (Secret {} exists): deleting it \
                         would erase what the agent remembers",
                        self.key_secret()
                    )));
                }
                (None, None) => {
                    let key = self.create_key().await?;
                    if let Some(created) = self.create_empty(key).await? {
                        return Ok(created);
                    }
                }
                (Some(object), None) => {
                    if let Some(migrated) = self.migrate(object).await? {
                        return Ok(migrated);
                    }
                }
            }
        }
        Err(StateError::Contended { namespace: self.namespace.clone(), name: self.name.clone(), attempts: 3 })
    }

    /// Seals an earlier agent's state, keeping only what makes the agent stricter; None when
    /// another writer changed it meanwhile (read again).
    async fn migrate(&self, object: ConfigMap) -> Result<Option<Persisted>, StateError> {
        let (state, dropped) = self.decode(&object)?.unauthenticated_remains();
        let key = self.create_key().await?;
        let mut sealed = object.clone();
        sealed.data = Some(self.sealed(&key, &state, 1));
        match self.api.replace(&self.name, &PostParams::default(), &sealed).await {
            Ok(object) => {
                let report = format!(
                    "state ConfigMap {}/{} carried no MAC (written by an agent before states were sealed, or by \
                     someone else): kept its rejections, revocations, newest release and tag pins (they can only make \
                     the agent stricter), dropped {} (taken again from the signed repo, or done again, at the next pass); \
                     sealed now",
                    self.namespace,
                    self.name,
                    if dropped.is_empty() { "nothing".to_string() } else { dropped.join(", ") }
                );
                tracing::warn!(configmap = %self.name, "{report}");
                *self.migration.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
                Ok(Some(Persisted { state, object, key }))
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(None),
            Err(e) => Err(self.kube_error("sealing", e)),
        }
    }

    /// `state` as sealed data of write number `generation`.
    fn sealed(&self, key: &AgentKey, state: &AgentState, generation: u64) -> BTreeMap<String, String> {
        let mut data = to_data(state);
        data.insert(key::GENERATION.into(), generation.to_string());
        seal(key, &self.namespace, &self.name, data)
    }

    fn key_secret(&self) -> String {
        state_key_secret_name(&self.cluster)
    }

    /// The state key, remembered, and the generation its Secret records (see
    /// [`record_generation`](Self::record_generation)) as the oldest state to believe.
    async fn read_key(&self) -> Result<Option<AgentKey>, StateError> {
        let name = self.key_secret();
        let secret = self.secrets.get_opt(&name).await.map_err(|e| AgentKeyError::Kube {
            action: "reading",
            name: name.clone(),
            source: Box::new(e),
        })?;
        let Some(secret) = secret else { return Ok(None) };
        self.newest_generation.fetch_max(recorded_generation(&secret), std::sync::atomic::Ordering::Relaxed);
        let key = AgentKey::from_secret(secret, &name)?;
        self.remember(&key);
        Ok(Some(key))
    }

    /// Records `written` in the key Secret, which a ConfigMap writer cannot write: a later process
    /// refuses a state older than it (a sealed copy saved and written back while no agent ran).
    /// Written after the ConfigMap, so a crash in between leaves the Secret behind the state, which
    /// is accepted (a state is refused only when older). Never lowers it (a slower replica's write);
    /// a failure only leaves the floor lower, so it is logged, not returned: the state is saved.
    async fn record_generation(&self, written: u64) {
        let name = self.key_secret();
        for _ in 0..MAX_CONFLICT_RETRIES {
            let mut secret = match self.secrets.get(&name).await {
                Ok(secret) => secret,
                Err(error) => {
                    tracing::warn!(secret = %name, %error, "could not read the state key Secret to record the state's generation");
                    return;
                }
            };
            if recorded_generation(&secret) >= written {
                return;
            }
            secret
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key::GENERATION_ANNOTATION.into(), written.to_string());
            match self.secrets.replace(&name, &PostParams::default(), &secret).await {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.is_conflict() => continue,
                Err(error) => {
                    tracing::warn!(
                        secret = %name, %error,
                        "could not record the state's generation in the state key Secret (does the agent's RBAC allow update on it?); a saved copy of the state written back before a restart would be believed"
                    );
                    return;
                }
            }
        }
    }

    async fn create_key(&self) -> Result<AgentKey, StateError> {
        let labels = self.labels();
        let key = AgentKey::create(&self.secrets, &self.key_secret(), labels).await?;
        self.remember(&key);
        Ok(key)
    }

    fn remember(&self, key: &AgentKey) {
        // Set once: a second value could only be the same Secret read again.
        let _ = self.key.set(key.clone());
    }

    fn refused(&self, problem: String) -> StateError {
        StateError::Unauthenticated {
            what: "state ConfigMap",
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            key_secret: self.key_secret(),
            problem,
        }
    }

    /// Decodes the state in `object` (its MAC is checked by the caller, or not at all).
    fn decode(&self, object: &ConfigMap) -> Result<AgentState, StateError> {
        let data = object.data.clone().unwrap_or_default();
        from_data(&data).map_err(|problem| StateError::Corrupt {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            problem,
        })
    }

    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("app.kubernetes.io/managed-by".to_string(), "fleetgate".to_string()),
            ("app.kubernetes.io/component".to_string(), "agent-state".to_string()),
            (CLUSTER_LABEL.to_string(), self.cluster.clone()),
        ])
    }

    /// Creates the empty state sealed with `key`; None when another replica created it first.
    async fn create_empty(&self, key: AgentKey) -> Result<Option<Persisted>, StateError> {
        let empty = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels()),
                ..Default::default()
            },
            data: Some(self.sealed(&key, &AgentState::default(), 1)),
            ..Default::default()
        };
        match self.api.create(&PostParams::default(), &empty).await {
            Ok(object) => Ok(Some(Persisted { state: AgentState::default(), object, key })),
            Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(None),
            Err(e) => Err(self.kube_error("creating", e)),
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

    /// A ConfigMap writer without the key edits trust memory: each edit is refused, and so is a
    /// state sealed under another key or for another ConfigMap, or with its MAC taken off.
    #[test]
    fn a_sealed_state_opens_and_every_edit_is_refused() {
        let key = AgentKey::from_bytes(vec![7; 32]);
        let (ns, name) = ("fleetgate-system", "fleetgate-state-cluster-a");
        let mut s = on_rel1();
        s.observe_desired(Some("rel-2"), false);
        s.begin("rel-2", "c2", t(10)).unwrap();
        s.block(Failure::new("GateFailed", "7 > 5"), t(11)).unwrap();
        s.pin_status_keys(&BTreeMap::from([("cluster-a".into(), "ssh-ed25519 AAAA-real".into())]), true);
        let sealed = seal(&key, ns, name, to_data(&s));
        open(&key, ns, name, &sealed).unwrap();
        assert_eq!(from_data(&sealed).unwrap(), s, "the MAC key is not part of the state");

        let edited = |k: &str, v: &str| {
            let mut d = sealed.clone();
            d.insert(k.into(), v.into());
            d
        };
        let mut unsealed = sealed.clone();
        unsealed.remove(key::MAC);
        for (what, data) in [
            ("a rejection cleared", edited(key::REJECTED, "{}")),
            ("newest rewound", edited(key::TRUST, r#"{"signedPromotions": false}"#)),
            ("a status key re-pinned", edited(key::TRUST, &sealed[key::TRUST].replace("AAAA-real", "AAAA-attacker"))),
            ("a key added", edited(key::UNREPORTED, "[]")),
        ] {
            let err = open(&key, ns, name, &data).unwrap_err();
            assert!(err.contains("does not verify"), "{what}: {err}");
        }
        assert!(open(&key, ns, name, &unsealed).unwrap_err().contains("carries no hmacSha256"));
        assert!(open(&AgentKey::from_bytes(vec![8; 32]), ns, name, &sealed).is_err(), "another key");
        assert!(open(&key, ns, "fleetgate-state-cluster-b", &sealed).is_err(), "another cluster's ConfigMap");
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
