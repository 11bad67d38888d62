//! The agent's state machine: [`AgentState`] with pure transition methods. Each phase but Idle
//! carries its operation ([`Progress`]), so a transition never has to guard an operation that
//! the type could lack.
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
//! A **rejected** release (refused, blocked by a pre-apply gate, or rolled back) is never started
//! again on this cluster until a *signed decision* clears it: [`AgentState::observe_desired`]
//! forgets a rejection only when a branch tip signed by a promotion key desires another release.
//! An unsigned push that toggles A→B→A therefore cannot re-apply A.
//!
//! [`TrustMemory`] keeps what judging the branch tip needs across restarts: the fleet's pinned
//! name, the last tip accepted in signed mode, the newest release that passed here, and every
//! cluster's status key as first seen ([`AgentState::pin_status_keys`]).
//!
//! The tag pins of verification ([`TagPins`], `tag → commit` recorded the first time a release tag is
//! verified) are kept here too: they must survive restarts, and the agent's local Git cache is an
//! emptyDir that does not.
//!
//! Each transition returns a [`Transition`] (reason, message, severity) that the caller turns into
//! a Kubernetes Event and log line; the state itself never does I/O.

use crate::release::{Ran, TagPins};
use crate::status::{GateFigure, Status};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The name of a phase, for Events, metrics, logs and errors; [`Progress`] is the phase with its data.
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

/// A pin of the cluster to the release it was rolled back to, to push to the tracked branch
/// (`--write-back`). Persisted with the rollback's verdict and kept until Git asks for `target`
/// (or has moved on from `failed`): an agent killed before the push, or a Git server away at the
/// time, still gets Git to say what runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteBack {
    pub failed: String,
    pub target: String,
    pub failure: Failure,
}

/// The release being rolled out, from `begin` until the operation ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    /// The release being rolled out.
    pub release: String,
    /// Its tagged commit.
    pub commit: String,
    pub started_at: DateTime<Utc>,
    /// Release to return to on failure: the release's `rollbackTo`, else last-known-good at the
    /// time the apply started. `None` = there is nothing to go back to (prune to empty). Set by
    /// `start_apply`.
    pub rollback_target: Option<String>,
    /// Name of the snapshot taken before apply (set by `start_apply`; `None`: nothing to snapshot).
    pub snapshot: Option<String>,
    /// The gates' baseline sampled just before the apply (a `gates::Baseline`, opaque here), so
    /// an agent restarted mid-bake still counts restarts and compares metrics from before it.
    pub baseline: Option<serde_json::Value>,
    /// The release's signed `sequence`: passing the bake makes it the newest this cluster ran.
    pub sequence: Option<u64>,
    /// Set when this operation moves the cluster back to a release that passed its bake here
    /// before ([`AgentState::start_return`]).
    pub returning: Option<Return>,
}

/// A move back, asked for in Git (a revert, `fleetgate rollback`), to a release that passed its
/// bake on this cluster before. It is applied the way an automatic rollback is: CRDs the target
/// would narrow are kept, custom resources come back from the snapshot taken before the newer
/// release replaced the target, and it bakes for the policy's `rollbackBakeTime`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Return {
    /// The release the cluster ran when Git asked to go back.
    pub from: String,
    /// The live CRDs kept as they are (their names; the `CrdKept` Events say why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_crds: Vec<String>,
}

impl Return {
    /// `; kept 2 CRD(s) wider than rel-1's: a.example.com, b.example.com`, or nothing.
    pub fn kept_summary(&self, target: &str) -> String {
        if self.kept_crds.is_empty() {
            return String::new();
        }
        format!("; kept {} CRD(s) wider than {target}'s: {}", self.kept_crds.len(), self.kept_crds.join(", "))
    }
}

/// A rollback in progress: what failed, with the figures that failed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollback {
    pub operation: Operation,
    /// When the failed release finished applying; `None` when its apply failed.
    pub applied_at: Option<DateTime<Utc>>,
    pub failure: Failure,
    /// The gate figures that failed the release, for the failure status of a restarted rollback.
    pub evidence: Vec<GateFigure>,
}

/// Where the agent is in the pipeline of one release, with what that phase needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Progress {
    #[default]
    Idle,
    Verifying(Operation),
    Applying(Operation),
    Baking {
        operation: Operation,
        /// When apply finished and baking began; the bake ends `bakeTime` after it.
        applied_at: DateTime<Utc>,
    },
    RollingBack(Rollback),
}

impl Progress {
    pub fn phase(&self) -> Phase {
        match self {
            Progress::Idle => Phase::Idle,
            Progress::Verifying(_) => Phase::Verifying,
            Progress::Applying(_) => Phase::Applying,
            Progress::Baking { .. } => Phase::Baking,
            Progress::RollingBack(_) => Phase::RollingBack,
        }
    }

    /// The operation in progress; `None` only when Idle.
    pub fn operation(&self) -> Option<&Operation> {
        match self {
            Progress::Idle => None,
            Progress::Verifying(op) | Progress::Applying(op) | Progress::Baking { operation: op, .. } => Some(op),
            Progress::RollingBack(r) => Some(&r.operation),
        }
    }
}

/// The rejection reason of a release refused only because an unsigned tip asked for it.
pub const NEEDS_SIGNED_DECISION: &str = "DowngradeRefused";

/// A release the agent will not start again while Git keeps desiring it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rejection {
    #[serde(flatten)]
    pub failure: Failure,
    pub at: DateTime<Utc>,
}

/// The persisted state of one agent (one cluster). Fields are read through accessors and changed
/// only through the transition methods, which check the phase they start from. The fields are
/// visible to [`super::store`], which encodes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentState {
    pub(super) desired: Option<String>,
    pub(super) progress: Progress,
    pub(super) current: Option<String>,
    pub(super) last_known_good: Option<String>,
    /// Every release that passed its bake here: the only ones a rollback may return to.
    pub(super) succeeded: BTreeSet<String>,
    pub(super) rejected: BTreeMap<String, Rejection>,
    pub(super) tag_pins: TagPins,
    pub(super) trust: TrustMemory,
    /// Statuses a step decided, persisted with the step itself, that are neither in Git nor in
    /// the outbox yet: an agent killed between the two writes delivers them after its restart,
    /// so a verdict is never lost, and (being the same entry) never written twice.
    pub(super) unreported: Vec<Status>,
    /// The write-back a rollback decided, persisted with it, until Git no longer needs it.
    pub(super) write_back: Option<WriteBack>,
}

/// What the agent remembers to judge the branch tip and moves back in time (docs/SECURITY.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrustMemory {
    /// The fleet name of the first accepted release, when the agent is not given `--fleet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<String>,
    /// The newest branch tip accepted, moved only forward (to a tip that descends from it): in
    /// signed mode the next tip must descend from it, in unsigned mode a signed tip that does not
    /// is no decision ([`crate::release::is_fresh`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_tip: Option<String>,
    /// Signed promotions were in force once: a push writing `promotions: unsigned` cannot leave.
    #[serde(default)]
    pub signed_promotions: bool,
    /// Revoked release → the signed release that revokes it, as first seen: deleting the
    /// revoking tag, or rewriting history, never makes a revoked release runnable again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub revoked: BTreeMap<String, String>,
    /// The newest release (by signed sequence) that passed its bake here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newest: Option<Ran>,
    /// Each cluster's status key (`ssh-ed25519 AAAA…`) as this agent first saw it registered: the
    /// keys wave gating verifies statuses with. A push cannot swap a key; a signed tip can.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub status_keys: BTreeMap<String, String>,
}

/// What the loop should do next, read from the state alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next<'a> {
    /// Git desires nothing for this cluster yet, or the desired release already runs.
    Nothing,
    /// Git desires a release that was rejected; it stays rejected until a signed decision clears it.
    Rejected { release: &'a str, rejection: &'a Rejection },
    /// Start rolling out the desired release (call [`AgentState::begin`]).
    Start { release: &'a str },
    /// An operation was in progress (this process or a previous one): continue it from where it is.
    Resume(&'a Progress),
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
    #[error("{release} never passed its bake here: moving to it is a promotion, not a return")]
    NotReturn { release: String },
}

impl AgentState {
    pub fn desired(&self) -> Option<&str> {
        self.desired.as_deref()
    }
    pub fn phase(&self) -> Phase {
        self.progress.phase()
    }
    pub fn progress(&self) -> &Progress {
        &self.progress
    }
    pub fn operation(&self) -> Option<&Operation> {
        self.progress.operation()
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
    /// Whether `release` passed its bake on this cluster and was not rejected here since
    /// (`last_known_good` counts for states written before `succeeded` was kept).
    pub fn succeeded_here(&self, release: &str) -> bool {
        (self.succeeded.contains(release) || self.last_known_good.as_deref() == Some(release))
            && !self.rejected.contains_key(release)
    }
    /// Statuses decided but not delivered yet, oldest first ([`record_unreported`](Self::record_unreported)).
    pub fn unreported(&self) -> &[Status] {
        &self.unreported
    }

    /// Keeps `status` until [`reported`](Self::reported): called in the same state write as the
    /// step that decided it.
    pub fn record_unreported(&mut self, status: Status) {
        if !self.unreported.contains(&status) {
            self.unreported.push(status);
        }
    }

    /// `status` is in Git or in the outbox now.
    pub fn reported(&mut self, status: &Status) {
        self.unreported.retain(|s| s != status);
    }

    /// The write-back still owed to Git ([`record_write_back`](Self::record_write_back)).
    pub fn pending_write_back(&self) -> Option<&WriteBack> {
        self.write_back.as_ref()
    }

    /// Keeps `write_back` until [`written_back`](Self::written_back): called in the same state
    /// write as the rollback's verdict. A newer one replaces an older one (only the last
    /// rollback's pin says what runs).
    pub fn record_write_back(&mut self, write_back: WriteBack) {
        self.write_back = Some(write_back);
    }

    /// Git no longer needs `write_back`: it was pushed, Git already asks for its target, or Git
    /// has moved on from the failed release. A newer pending one is kept.
    pub fn written_back(&mut self, write_back: &WriteBack) {
        if self.write_back.as_ref() == Some(write_back) {
            self.write_back = None;
        }
    }

    /// Pins to hand to verification (clone, verify, then [`record_tag_pins`](Self::record_tag_pins)).
    pub fn tag_pins(&self) -> &TagPins {
        &self.tag_pins
    }

    /// What the loop should do next.
    pub fn next(&self) -> Next<'_> {
        if self.progress != Progress::Idle {
            return Next::Resume(&self.progress);
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

    /// Records what Git desires for this cluster now (`None`: no release set). A branch tip signed
    /// by a promotion key (`signed`) is a decision: it forgets every rejection but the desired
    /// release's own — unless that one was refused only for want of a signed decision (an
    /// unsigned move back in time), which this is. An unsigned tip forgets nothing.
    pub fn observe_desired(&mut self, desired: Option<&str>, signed: bool) {
        self.desired = desired.map(str::to_string);
        if signed {
            self.rejected
                .retain(|release, r| Some(release.as_str()) == desired && r.failure.reason != NEEDS_SIGNED_DECISION);
        }
    }

    pub fn trust(&self) -> &TrustMemory {
        &self.trust
    }

    /// Remembers the fleet's name (the first time only: a later push cannot rename the fleet).
    pub fn pin_fleet(&mut self, name: &str) {
        self.trust.fleet.get_or_insert_with(|| name.to_string());
    }

    /// Pins every cluster's registered status key (cluster → `ssh-ed25519 AAAA…`) the first time it
    /// is seen. A key that differs from its pin replaces it only when the tip is a signed decision
    /// (`signed`); otherwise the pin stays and the cluster is returned, so the caller can say why
    /// that cluster's new statuses read as unverified. A registration removed from the tip keeps
    /// its pin.
    pub fn pin_status_keys(&mut self, registered: &BTreeMap<String, String>, signed: bool) -> Vec<String> {
        let mut refused = Vec::new();
        for (cluster, key) in registered {
            match self.trust.status_keys.get(cluster) {
                Some(pinned) if pinned == key => {}
                Some(_) if !signed => refused.push(cluster.clone()),
                _ => {
                    self.trust.status_keys.insert(cluster.clone(), key.clone());
                }
            }
        }
        refused
    }

    /// Remembers a branch tip accepted in signed mode.
    pub fn accept_signed_tip(&mut self, commit: &str) {
        self.accept_tip(commit);
        self.trust.signed_promotions = true;
    }

    /// Moves the mark of the newest accepted tip to `commit`: called only with a tip that
    /// descends from the mark ([`crate::release::is_fresh`]), so it never moves back.
    pub fn accept_tip(&mut self, commit: &str) {
        self.trust.accepted_tip = Some(commit.to_string());
    }

    /// Adds revocations seen in signed releases (revoked → revoker) to the ones remembered, and
    /// returns all of them. The first revoker seen is kept.
    pub fn remember_revocations(&mut self, seen: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        for (release, by) in seen {
            self.trust.revoked.entry(release.clone()).or_insert_with(|| by.clone());
        }
        self.trust.revoked.clone()
    }

    /// What may be taken from a state nobody authenticated (an earlier agent's, from before states
    /// were sealed, or a forgery made to look like one): only what can make the agent stricter —
    /// rejections, remembered revocations, the newest release that ran, signed promotions once in
    /// force, tag pins (a pin can only refuse a tag). Everything else would let whoever wrote the
    /// ConfigMap choose: it is dropped, and named in the returned list. Pins of status keys, the
    /// accepted tip and the fleet name are taken again from the signed repo; an operation in
    /// progress starts over from verification (re-applying what runs is a no-op); undelivered
    /// statuses and an owed write-back are never signed on its word; the releases that ran here
    /// are learnt again as they pass their bake.
    pub fn unauthenticated_remains(self) -> (AgentState, Vec<&'static str>) {
        let mut dropped = Vec::new();
        let mut note = |present: bool, what: &'static str| {
            if present {
                dropped.push(what);
            }
        };
        note(self.progress != Progress::Idle, "the operation in progress");
        note(self.current.is_some(), "the current release");
        note(self.last_known_good.is_some() || !self.succeeded.is_empty(), "the releases that passed here");
        note(!self.unreported.is_empty(), "undelivered statuses");
        note(self.write_back.is_some(), "an owed write-back");
        note(self.trust.fleet.is_some(), "the fleet name");
        note(self.trust.accepted_tip.is_some(), "the accepted tip");
        note(!self.trust.status_keys.is_empty(), "status-key pins");
        let kept = AgentState {
            rejected: self.rejected,
            tag_pins: self.tag_pins,
            trust: TrustMemory {
                signed_promotions: self.trust.signed_promotions,
                revoked: self.trust.revoked,
                newest: self.trust.newest,
                ..TrustMemory::default()
            },
            ..AgentState::default()
        };
        (kept, dropped)
    }

    /// Keeps the release's signed sequence with the operation (recorded while verifying).
    pub fn record_sequence(&mut self, sequence: Option<u64>) -> Result<(), TransitionError> {
        match &mut self.progress {
            Progress::Verifying(op) => {
                op.sequence = sequence;
                Ok(())
            }
            _ => Err(self.wrong_phase("record a sequence", "Verifying")),
        }
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
        if self.progress != Progress::Idle {
            return Err(self.wrong_phase("begin a release", "Idle"));
        }
        if let Some(r) = self.rejected.get(release) {
            return Err(TransitionError::Rejected {
                release: release.to_string(),
                reason: r.failure.reason.clone(),
                message: r.failure.message.clone(),
            });
        }
        let operation = Operation {
            release: release.to_string(),
            commit: commit.to_string(),
            started_at: now,
            rollback_target: None,
            snapshot: None,
            baseline: None,
            sequence: None,
            returning: None,
        };
        let from = self.current.as_deref().unwrap_or("nothing");
        let message = format!("verifying {release} (from {from})");
        Ok(self.go(Progress::Verifying(operation), "ReleaseStarted", Severity::Normal, message))
    }

    /// Verifying → Idle, rejecting the release: a pre-apply gate or bad input refused it and nothing
    /// was applied. It is not retried until Git desires a different release.
    pub fn block(&mut self, failure: Failure, now: DateTime<Utc>) -> Result<Transition, TransitionError> {
        let Progress::Verifying(op) = &self.progress else {
            return Err(self.wrong_phase("block a release", "Verifying"));
        };
        let release = op.release.clone();
        let message = format!("{release} blocked, nothing applied: {}: {}", failure.reason, failure.message);
        self.rejected.insert(release, Rejection { failure, at: now });
        Ok(self.go(Progress::Idle, "ReleaseBlocked", Severity::Warning, message))
    }

    /// Verifying → Idle without rejecting: a transient problem (API server, Git unreachable, wave
    /// not ready, a restart); the next sync tries again.
    pub fn abort(&mut self, why: &str) -> Result<Transition, TransitionError> {
        let Progress::Verifying(op) = &self.progress else { return Err(self.wrong_phase("abort", "Verifying")) };
        let message = format!("{} deferred: {why}", op.release);
        Ok(self.go(Progress::Idle, "ReleaseDeferred", Severity::Normal, message))
    }

    /// Verifying → Applying: verification and pre-apply gates passed, the snapshot (if any) is
    /// taken. The rollback target is the release's signed `rollbackTo` when that release
    /// succeeded here, else the last-known-good release: never one this cluster did not run
    /// successfully (it may have failed elsewhere, or never been tried here).
    pub fn start_apply(
        &mut self,
        rollback_to: Option<&str>,
        snapshot: Option<&str>,
    ) -> Result<Transition, TransitionError> {
        self.enter_apply(rollback_to, snapshot, None)
    }

    /// Verifying → Applying for a move back to a release that passed its bake here ([`Return`]):
    /// like [`start_apply`](Self::start_apply), with the return recorded in the operation so the
    /// apply, a resumed apply and the bake treat it as a rollback. Refused for a release that did
    /// not succeed here: that move is an ordinary promotion.
    pub fn start_return(
        &mut self,
        rollback_to: Option<&str>,
        snapshot: Option<&str>,
        returning: Return,
    ) -> Result<Transition, TransitionError> {
        let release = self.progress.operation().map(|op| op.release.clone()).unwrap_or_default();
        if !self.succeeded_here(&release) {
            return Err(TransitionError::NotReturn { release });
        }
        self.enter_apply(rollback_to, snapshot, Some(returning))
    }

    fn enter_apply(
        &mut self,
        rollback_to: Option<&str>,
        snapshot: Option<&str>,
        returning: Option<Return>,
    ) -> Result<Transition, TransitionError> {
        let Progress::Verifying(op) = &self.progress else {
            return Err(self.wrong_phase("start applying", "Verifying"));
        };
        let mut op = op.clone();
        let usable = rollback_to.filter(|r| self.succeeded_here(r));
        op.rollback_target = usable.map(str::to_string).or_else(|| self.last_known_good.clone());
        op.snapshot = snapshot.map(str::to_string);
        let mut message = match &returning {
            Some(r) => {
                format!("rolling back to {} from {}, as Git asks{}", op.release, r.from, r.kept_summary(&op.release))
            }
            None => format!("applying {}", op.release),
        };
        if let Some(asked) = rollback_to.filter(|_| usable.is_none()) {
            let instead = op.rollback_target.as_deref().unwrap_or("none");
            message.push_str(&format!(
                " (its rollbackTo {asked} never succeeded here; rollback target: {instead}, the last-known-good)"
            ));
        }
        op.returning = returning;
        Ok(self.go(Progress::Applying(op), "ApplyStarted", Severity::Normal, message))
    }

    /// Applying → Baking: every object applied and workloads rolled out.
    pub fn applied(&mut self, now: DateTime<Utc>) -> Result<Transition, TransitionError> {
        let Progress::Applying(op) = &self.progress else {
            return Err(self.wrong_phase("finish applying", "Applying"));
        };
        let operation = op.clone();
        // From here the cluster runs the new release, whatever the bake says.
        self.current = Some(operation.release.clone());
        let message = format!("{} applied; baking", operation.release);
        Ok(self.go(Progress::Baking { operation, applied_at: now }, "Applied", Severity::Normal, message))
    }

    /// Baking → Idle: every post-apply gate held for the bake time; the release becomes
    /// last-known-good.
    pub fn bake_passed(&mut self) -> Result<Transition, TransitionError> {
        let Progress::Baking { operation, .. } = &self.progress else {
            return Err(self.wrong_phase("pass the bake", "Baking"));
        };
        let release = operation.release.clone();
        if let Some(sequence) = operation.sequence
            && self.trust.newest.as_ref().is_none_or(|n| sequence >= n.sequence)
        {
            self.trust.newest = Some(Ran { release: release.clone(), sequence });
        }
        self.current = Some(release.clone());
        self.last_known_good = Some(release.clone());
        self.succeeded.insert(release.clone());
        Ok(self.go(Progress::Idle, "ReleaseSucceeded", Severity::Normal, format!("{release} passed its gates")))
    }

    /// Applying or Baking → RollingBack: a gate failed (`evidence`: the gate figures) or apply
    /// errored. The release is rejected at once, so a crash during the rollback can never lead to
    /// re-applying it. The rollback target is the operation's [`Operation::rollback_target`].
    pub fn start_rollback(
        &mut self,
        failure: Failure,
        evidence: Vec<GateFigure>,
        now: DateTime<Utc>,
    ) -> Result<Transition, TransitionError> {
        let (operation, applied_at) = match &self.progress {
            Progress::Applying(op) => (op.clone(), None),
            Progress::Baking { operation, applied_at } => (operation.clone(), Some(*applied_at)),
            _ => return Err(self.wrong_phase("start a rollback", "Applying or Baking")),
        };
        let release = operation.release.clone();
        self.rejected.insert(release.clone(), Rejection { failure: failure.clone(), at: now });
        let to = match &operation.rollback_target {
            Some(t) => format!("rolling back to {t}"),
            None => "removing its workloads and webhooks (no earlier release succeeded here)".to_string(),
        };
        let message = format!("{release} failed ({}: {}); {to}", failure.reason, failure.message);
        let rollback = Rollback { operation, applied_at, failure, evidence };
        Ok(self.go(Progress::RollingBack(rollback), "RollbackStarted", Severity::Warning, message))
    }

    /// RollingBack → Idle: the rollback target is applied and healthy (or, without a target, the
    /// failed release's workloads and webhook configurations are removed).
    pub fn rollback_finished(&mut self) -> Result<Transition, TransitionError> {
        let Progress::RollingBack(r) = &self.progress else {
            return Err(self.wrong_phase("finish a rollback", "RollingBack"));
        };
        let target = r.operation.rollback_target.clone();
        let message = format!(
            "rolled back from {} to {} after {}",
            r.operation.release,
            target.as_deref().unwrap_or("nothing"),
            r.failure.reason
        );
        self.current = target;
        Ok(self.go(Progress::Idle, "RolledBack", Severity::Warning, message))
    }

    /// Keeps the gates' baseline with the operation (sampled while verifying, before the apply).
    pub fn record_baseline(&mut self, baseline: serde_json::Value) -> Result<(), TransitionError> {
        match &mut self.progress {
            Progress::Verifying(op) => {
                op.baseline = Some(baseline);
                Ok(())
            }
            _ => Err(self.wrong_phase("record a baseline", "Verifying")),
        }
    }

    fn wrong_phase(&self, action: &'static str, needs: &'static str) -> TransitionError {
        TransitionError::WrongPhase { action, phase: self.phase(), needs }
    }

    /// Moves to `to`, describing the move for the release of the operation being left or entered.
    fn go(&mut self, to: Progress, reason: &'static str, severity: Severity, message: String) -> Transition {
        let release = to.operation().or(self.progress.operation()).map(|op| op.release.clone()).unwrap_or_default();
        let from = std::mem::replace(&mut self.progress, to).phase();
        Transition { from, to: self.progress.phase(), release, reason, message, severity }
    }
}

/// States the agent's unit tests start from (the state machine, its store, the reports).
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// `secs` after a fixed instant.
    pub(crate) fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    /// A state that ran rel-1 successfully.
    pub(crate) fn on_rel1() -> AgentState {
        let mut s = AgentState::default();
        s.observe_desired(Some("rel-1"), false);
        s.begin("rel-1", "c1", t(0)).unwrap();
        s.start_apply(None, None).unwrap();
        s.applied(t(1)).unwrap();
        s.bake_passed().unwrap();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{on_rel1, t};
    use super::*;

    /// An unsealed state (an earlier agent's, or a forgery in its format) gives only what makes
    /// the agent stricter; what would let its writer choose is dropped and named.
    #[test]
    fn an_unauthenticated_state_keeps_only_what_makes_the_agent_stricter() {
        let mut s = on_rel1();
        s.trust.newest = Some(Ran { release: "rel-1".into(), sequence: 7 });
        s.trust.revoked.insert("rel-0".into(), "rel-1".into());
        s.trust.accepted_tip = Some("tip".into());
        s.trust.fleet = Some("redis-fleet".into());
        s.trust.signed_promotions = true;
        s.pin_status_keys(&BTreeMap::from([("cluster-a".into(), "ssh-ed25519 AAAA".into())]), true);
        let pins: TagPins = serde_json::from_value(serde_json::json!({ "pins": { "rel-1": "c1" } })).unwrap();
        s.record_tag_pins(&pins);
        s.observe_desired(Some("rel-2"), false);
        s.begin("rel-2", "c2", t(10)).unwrap();
        s.block(Failure::new("GateFailed", "7 > 5"), t(11)).unwrap();
        s.observe_desired(Some("rel-3"), false);
        s.begin("rel-3", "c3", t(12)).unwrap();
        s.record_unreported(Status::new("cluster-a", "rel-3", "c3", crate::status::State::Success, "forged"));

        let (kept, dropped) = s.clone().unauthenticated_remains();
        assert_eq!(kept.rejected().keys().collect::<Vec<_>>(), ["rel-2"]);
        assert_eq!(kept.trust().newest, s.trust().newest);
        assert_eq!(kept.trust().revoked, s.trust().revoked);
        assert!(kept.trust().signed_promotions);
        assert_eq!(kept.tag_pins().get("rel-1"), Some("c1"));
        assert_eq!((kept.phase(), kept.current(), kept.last_known_good()), (Phase::Idle, None, None));
        assert!(kept.unreported().is_empty() && !kept.succeeded_here("rel-1"));
        assert_eq!((kept.trust().fleet.as_ref(), kept.trust().accepted_tip.as_ref()), (None, None));
        assert!(kept.trust().status_keys.is_empty());
        assert_eq!(
            dropped,
            [
                "the operation in progress",
                "the current release",
                "the releases that passed here",
                "undelivered statuses",
                "the fleet name",
                "the accepted tip",
                "status-key pins"
            ]
        );
        assert_eq!(AgentState::default().unauthenticated_remains(), (AgentState::default(), vec![]));
    }
    use rstest::rstest;

    fn fail(reason: &str) -> Failure {
        Failure::new(reason, "error rate 7.1% > 5%")
    }

    #[test]
    fn happy_path_makes_release_current_and_good() {
        let mut s = on_rel1();
        assert_eq!((s.phase(), s.current(), s.last_known_good()), (Phase::Idle, Some("rel-1"), Some("rel-1")));
        s.observe_desired(Some("rel-2"), false);
        assert_eq!(s.next(), Next::Start { release: "rel-2" });
        let tr = s.begin("rel-2", "c2", t(10)).unwrap();
        assert_eq!(
            (tr.from, tr.to, tr.reason, tr.release.as_str()),
            (Phase::Idle, Phase::Verifying, "ReleaseStarted", "rel-2")
        );
        let tr = s.start_apply(None, Some("snap-rel-1")).unwrap();
        assert_eq!(tr.to, Phase::Applying);
        assert_eq!(s.operation().unwrap().rollback_target.as_deref(), Some("rel-1"));
        assert_eq!(s.operation().unwrap().snapshot.as_deref(), Some("snap-rel-1"));
        s.applied(t(20)).unwrap();
        assert_eq!((s.phase(), s.current(), s.last_known_good()), (Phase::Baking, Some("rel-2"), Some("rel-1")));
        assert!(matches!(s.next(), Next::Resume(Progress::Baking { applied_at, .. }) if *applied_at == t(20)));
        let tr = s.bake_passed().unwrap();
        assert_eq!((tr.reason, tr.severity, tr.release.as_str()), ("ReleaseSucceeded", Severity::Normal, "rel-2"));
        assert_eq!((s.phase(), s.current(), s.last_known_good()), (Phase::Idle, Some("rel-2"), Some("rel-2")));
        assert_eq!(s.operation(), None);
        assert_eq!(s.next(), Next::Nothing);
    }

    #[rstest]
    #[case::from_applying(false)]
    #[case::from_baking(true)]
    fn rollback_returns_to_target_and_rejects(#[case] baked: bool) {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-2"), false);
        s.begin("rel-2", "c2", t(10)).unwrap();
        s.start_apply(None, None).unwrap();
        if baked {
            s.applied(t(20)).unwrap();
        }
        let figure =
            GateFigure { name: "g".into(), observed: "7".into(), threshold: "5".into(), verdict: "fail".into() };
        let tr = s.start_rollback(fail("GateFailed"), vec![figure.clone()], t(30)).unwrap();
        assert_eq!((tr.to, tr.severity), (Phase::RollingBack, Severity::Warning));
        assert!(tr.message.contains("rolling back to rel-1"), "{}", tr.message);
        let Progress::RollingBack(r) = s.progress() else { panic!("{:?}", s.progress()) };
        assert_eq!((r.applied_at, r.evidence.as_slice()), (baked.then(|| t(20)), [figure].as_slice()));
        // Rejected already while rolling back: a crash here must not lead to re-applying rel-2.
        assert!(s.rejected().contains_key("rel-2"));
        let tr = s.rollback_finished().unwrap();
        assert_eq!(tr.reason, "RolledBack");
        assert_eq!(tr.message, "rolled back from rel-2 to rel-1 after GateFailed");
        assert_eq!((s.phase(), s.current(), s.last_known_good()), (Phase::Idle, Some("rel-1"), Some("rel-1")));
        assert!(matches!(s.next(), Next::Rejected { release: "rel-2", .. }));
        assert!(matches!(s.begin("rel-2", "c2", t(40)), Err(TransitionError::Rejected { .. })));
    }

    /// Runs `id` from idle through a passed bake.
    fn succeed(s: &mut AgentState, id: &str, at: i64) {
        s.observe_desired(Some(id), false);
        s.begin(id, "c", t(at)).unwrap();
        s.start_apply(None, None).unwrap();
        s.applied(t(at + 1)).unwrap();
        s.bake_passed().unwrap();
    }

    #[test]
    fn rollback_to_wins_over_last_known_good_only_when_it_succeeded_here() {
        let mut s = on_rel1();
        succeed(&mut s, "rel-2", 10);
        s.observe_desired(Some("rel-3"), false);
        s.begin("rel-3", "c3", t(20)).unwrap();
        let tr = s.start_apply(Some("rel-1"), None).unwrap();
        assert_eq!(s.operation().unwrap().rollback_target.as_deref(), Some("rel-1"));
        assert_eq!(tr.message, "applying rel-3");
    }

    /// The canary halted rel-0.5 elsewhere, so it never ran here: a release naming it as
    /// `rollbackTo` still rolls this cluster back to its own last-known-good.
    #[test]
    fn rollback_to_a_release_that_never_succeeded_here_falls_back_to_last_known_good() {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-3"), false);
        s.begin("rel-3", "c3", t(0)).unwrap();
        let tr = s.start_apply(Some("rel-2"), None).unwrap();
        assert_eq!(s.operation().unwrap().rollback_target.as_deref(), Some("rel-1"));
        assert!(
            tr.message.contains("its rollbackTo rel-2 never succeeded here; rollback target: rel-1"),
            "{}",
            tr.message
        );
    }

    #[test]
    fn first_release_failing_rolls_back_to_nothing() {
        let mut s = AgentState::default();
        s.observe_desired(Some("rel-1"), false);
        s.begin("rel-1", "c1", t(0)).unwrap();
        s.start_apply(None, None).unwrap();
        let tr = s.start_rollback(fail("ApplyFailed"), Vec::new(), t(1)).unwrap();
        assert!(tr.message.contains("removing its workloads and webhooks"), "{}", tr.message);
        s.rollback_finished().unwrap();
        assert_eq!(s.current(), None);
    }

    #[test]
    fn a_rejection_lasts_until_a_signed_decision_clears_it() {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-2"), false);
        s.begin("rel-2", "c2", t(0)).unwrap();
        s.block(Failure::new("CrdIncompatible", "field spec.size removed"), t(1)).unwrap();
        assert_eq!(s.phase(), Phase::Idle);
        assert_eq!(s.current(), Some("rel-1"));
        // Unsigned pushes toggle rel-2 → rel-1 → rel-2: still rejected.
        for desired in ["rel-2", "rel-1", "rel-2"] {
            s.observe_desired(Some(desired), false);
        }
        assert!(matches!(s.next(), Next::Rejected { release: "rel-2", .. }));
        // A signed tip that still desires rel-2 does not clear it either.
        s.observe_desired(Some("rel-2"), true);
        assert!(matches!(s.next(), Next::Rejected { release: "rel-2", .. }));
        // A signed tip that moves on (revert to rel-1) forgets it; promoting rel-2 again is tried.
        s.observe_desired(Some("rel-1"), true);
        assert_eq!(s.next(), Next::Nothing);
        assert!(s.rejected().is_empty());
        s.observe_desired(Some("rel-2"), false);
        assert_eq!(s.next(), Next::Start { release: "rel-2" });
    }

    #[test]
    fn a_refused_downgrade_is_cleared_by_a_signed_tip_that_asks_for_it() {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-0"), false);
        s.begin("rel-0", "c0", t(0)).unwrap();
        s.block(Failure::new(NEEDS_SIGNED_DECISION, "older than rel-1"), t(1)).unwrap();
        s.observe_desired(Some("rel-0"), false);
        assert!(matches!(s.next(), Next::Rejected { release: "rel-0", .. }));
        s.observe_desired(Some("rel-0"), true);
        assert_eq!(s.next(), Next::Start { release: "rel-0" });
    }

    #[test]
    fn passing_the_bake_remembers_the_newest_sequence_and_signed_mode_sticks() {
        let mut s = AgentState::default();
        for (release, sequence) in [("rel-2", 2), ("rel-1", 1)] {
            s.observe_desired(Some(release), true);
            s.begin(release, "c", t(0)).unwrap();
            s.record_sequence(Some(sequence)).unwrap();
            s.start_apply(None, None).unwrap();
            s.applied(t(1)).unwrap();
            s.bake_passed().unwrap();
        }
        // rel-1 ran later (a signed downgrade), but rel-2 stays the newest.
        assert_eq!(s.trust().newest, Some(Ran { release: "rel-2".into(), sequence: 2 }));
        s.pin_fleet("redis-fleet");
        s.pin_fleet("other-fleet");
        assert_eq!(s.trust().fleet.as_deref(), Some("redis-fleet"));
        s.accept_signed_tip("abc");
        assert!(s.trust().signed_promotions);
    }

    #[test]
    fn abort_does_not_reject() {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-2"), false);
        s.begin("rel-2", "c2", t(0)).unwrap();
        let tr = s.abort("wave-1 waits for canary").unwrap();
        assert_eq!((tr.reason, tr.release.as_str()), ("ReleaseDeferred", "rel-2"));
        assert_eq!(s.next(), Next::Start { release: "rel-2" });
    }

    #[test]
    fn baseline_is_kept_with_the_operation_into_the_bake() {
        let mut s = AgentState::default();
        s.begin("rel-1", "c1", t(0)).unwrap();
        s.record_baseline(serde_json::json!({"restarts": {}})).unwrap();
        s.start_apply(None, None).unwrap();
        s.applied(t(1)).unwrap();
        assert_eq!(s.operation().unwrap().baseline, Some(serde_json::json!({"restarts": {}})));
        assert!(matches!(s.record_baseline(serde_json::json!({})), Err(TransitionError::WrongPhase { .. })));
    }

    #[rstest]
    #[case::apply_from_idle(|s: &mut AgentState| s.start_apply(None, None).map(drop))]
    #[case::applied_from_idle(|s: &mut AgentState| s.applied(t(0)).map(drop))]
    #[case::bake_from_idle(|s: &mut AgentState| s.bake_passed().map(drop))]
    #[case::rollback_from_idle(|s: &mut AgentState| s.start_rollback(fail("X"), Vec::new(), t(0)).map(drop))]
    #[case::finish_rollback_from_idle(|s: &mut AgentState| s.rollback_finished().map(drop))]
    #[case::block_from_idle(|s: &mut AgentState| s.block(fail("X"), t(0)).map(drop))]
    #[case::begin_twice(|s: &mut AgentState| { s.begin("a", "c", t(0))?; s.begin("b", "c", t(0)).map(drop) })]
    #[case::rollback_from_verifying(|s: &mut AgentState| { s.begin("a", "c", t(0))?; s.start_rollback(fail("X"), Vec::new(), t(0)).map(drop) })]
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
    fn status_keys_are_pinned_on_first_sight_and_changed_only_by_a_signed_tip() {
        let mut s = AgentState::default();
        let keys = |k: &str| BTreeMap::from([("cluster-a".to_string(), k.to_string())]);
        assert!(s.pin_status_keys(&keys("ssh-ed25519 AAAA1"), false).is_empty());
        assert_eq!(s.pin_status_keys(&keys("ssh-ed25519 EVIL"), false), ["cluster-a"]);
        assert_eq!(s.trust().status_keys["cluster-a"], "ssh-ed25519 AAAA1");
        assert!(s.pin_status_keys(&BTreeMap::new(), false).is_empty(), "a removed registration keeps its pin");
        assert_eq!(s.trust().status_keys["cluster-a"], "ssh-ed25519 AAAA1");
        assert!(s.pin_status_keys(&keys("ssh-ed25519 AAAA2"), true).is_empty());
        assert_eq!(s.trust().status_keys["cluster-a"], "ssh-ed25519 AAAA2");
    }

    #[test]
    fn a_return_is_only_to_a_release_that_passed_here_and_is_kept_with_the_operation() {
        let mut s = on_rel1();
        succeed(&mut s, "rel-2", 10);
        let back = Return { from: "rel-2".into(), kept_crds: vec!["w.example.com".into()] };
        s.observe_desired(Some("rel-1"), false);
        s.begin("rel-1", "c1", t(20)).unwrap();
        let tr = s.start_return(None, Some("snap"), back.clone()).unwrap();
        assert_eq!(s.operation().unwrap().returning, Some(back));
        assert_eq!(s.operation().unwrap().rollback_target.as_deref(), Some("rel-2"));
        assert_eq!(
            tr.message,
            "rolling back to rel-1 from rel-2, as Git asks; kept 1 CRD(s) wider than rel-1's: w.example.com"
        );
        s.applied(t(21)).unwrap();
        s.bake_passed().unwrap();
        assert_eq!(s.current(), Some("rel-1"));

        // rel-3 never passed here: going to it is a promotion, whatever the caller says.
        s.observe_desired(Some("rel-3"), false);
        s.begin("rel-3", "c3", t(30)).unwrap();
        let not = s.start_return(None, None, Return { from: "rel-1".into(), kept_crds: Vec::new() });
        assert!(matches!(not, Err(TransitionError::NotReturn { release }) if release == "rel-3"));
    }

    #[test]
    fn revocations_are_remembered_with_their_first_revoker() {
        let mut s = AgentState::default();
        let seen = |pairs: &[(&str, &str)]| pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        s.remember_revocations(&seen(&[("rel-2", "rel-3")]));
        let all = s.remember_revocations(&seen(&[("rel-2", "rel-4"), ("rel-5", "rel-6")]));
        assert_eq!(all, seen(&[("rel-2", "rel-3"), ("rel-5", "rel-6")]));
        // Nothing seen this time (the revoking tags were deleted): still remembered.
        assert_eq!(s.remember_revocations(&BTreeMap::new()).len(), 2);
    }
}
