//! What each step of a pass tells the world, computed apart from telling it: [`conclude`] takes
//! the state and a [`Step`] (what the pipeline just decided) and returns the state transition
//! (for the Event and log line), the status for Git, the notification and the write-back to make.
//! It is pure — the loop persists the state it leaves, then writes exactly what it returned — so
//! every verdict's report is tested here with a table. The status is also kept in the state it
//! leaves ([`AgentState::unreported`]) until it is delivered, so a `kill -9` between the state
//! write and the push loses nothing.
//!
//! | step            | transition              | status                  | notification       |
//! |-----------------|-------------------------|-------------------------|--------------------|
//! | `Begin`         | Idle → Verifying        | –                       | –                  |
//! | `Deferred`      | Verifying → Idle        | –                       | –                  |
//! | `Refused`       | Verifying → Idle (rej.) | `error`                 | refused            |
//! | `Blocked`       | Verifying → Idle (rej.) | `failure`, gate named   | refused, gate      |
//! | `StartApply`    | Verifying → Applying    | `pending` applying (+ who approved) | started |
//! | `Applied`       | Applying → Baking       | `pending` baking        | applied            |
//! | `Passed`        | Baking → Idle           | `success` with figures  | passed, figures    |
//! | `Failed`        | → RollingBack (rej.)    | –                       | failed, figures    |
//! | `RolledBack`    | RollingBack → Idle      | `failure` with figures  | rolledBack, figures|
//! | `RollbackFailed`| none (retried)          | `error`                 | error              |
//!
//! Every notification carries [`Context::about`] (scope, who released and promoted the release);
//! which of them reach an endpoint is the notifier's filter ([`super::notifier`]).

use super::notifier::{About, Notification, NotificationKind};
use super::state::{AgentState, Failure, Operation, Progress, Return, Transition, TransitionError, WriteBack};
use crate::gates::PreapplyBlock;
use crate::model::ApprovalRecord;
use crate::status::{GateFigure, State, Status};
use chrono::{DateTime, Utc};
use std::time::Duration;

/// What refused a release before anything was applied.
#[derive(Debug, Clone, PartialEq)]
pub enum Blocker {
    /// A pre-apply gate of [`crate::gates::preapply`], with its figures.
    Gate(PreapplyBlock),
    /// The release's manifests are outside what the admission policy allows (or cannot be read).
    Admission(String),
    /// The server-side dry run refused an object.
    DryRun(String),
    /// The gate policy reads what the release may not (`customResources` on a foreign kind).
    GatePolicy(String),
}

impl Blocker {
    /// The gate's name in the status.
    pub fn gate(&self) -> &'static str {
        match self {
            Blocker::Gate(b) => b.gate(),
            Blocker::Admission(_) => "admission",
            Blocker::DryRun(_) => "dry-run",
            Blocker::GatePolicy(_) => "gate-policy",
        }
    }

    /// The rejection, Event and notification reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Blocker::Gate(b) => b.reason(),
            Blocker::Admission(_) => "AdmissionRefused",
            Blocker::DryRun(_) => "DryRunFailed",
            Blocker::GatePolicy(_) => "GatePolicyRefused",
        }
    }

    /// What the gate found, one line.
    pub fn problems(&self) -> String {
        match self {
            Blocker::Gate(b) => b.problems().join("; "),
            Blocker::Admission(m) | Blocker::DryRun(m) | Blocker::GatePolicy(m) => m.clone(),
        }
    }
}

/// What the pipeline decided in one step of a pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Start rolling out `release` (tagged `commit`).
    Begin { release: String, commit: String },
    /// Nothing decided (transient trouble, or the agent restarted while verifying); try again.
    Deferred { why: String },
    /// The release cannot be used at all (signature, mapping); nothing applied.
    Refused { reason: &'static str, message: String },
    /// A pre-apply check refused the release; nothing applied.
    Blocked(Blocker),
    /// Verified and through the pre-apply gates, snapshot taken: apply. `approval`: who approved
    /// the release for the cluster's wave, when the wave requires it (recorded in the status).
    /// `returning`: the move goes back to a release that passed here before ([`Return`]).
    StartApply {
        rollback_target: Option<String>,
        snapshot: Option<String>,
        approval: Option<ApprovalRecord>,
        returning: Option<Return>,
    },
    /// Applied; the bake of `bake_time` begins.
    Applied { bake_time: Duration },
    /// Every gate held for `bake_time`.
    Passed { bake_time: Duration, figures: Vec<GateFigure> },
    /// A gate failed (`figures`) or the apply did: roll back.
    Failed { failure: Failure, figures: Vec<GateFigure> },
    /// The rollback target is applied and healthy.
    RolledBack,
    /// This rollback attempt failed; the next pass tries again.
    RollbackFailed { message: String },
}

impl Step {
    /// The step's name in logs and stop points (`step.<name>.after-persist`).
    pub fn name(&self) -> &'static str {
        match self {
            Step::Begin { .. } => "begin",
            Step::Deferred { .. } => "deferred",
            Step::Refused { .. } => "refused",
            Step::Blocked(_) => "blocked",
            Step::StartApply { .. } => "start-apply",
            Step::Applied { .. } => "applied",
            Step::Passed { .. } => "passed",
            Step::Failed { .. } => "failed",
            Step::RolledBack => "rolled-back",
            Step::RollbackFailed { .. } => "rollback-failed",
        }
    }
}

/// Where and when the report is made.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub cluster: &'a str,
    pub now: DateTime<Utc>,
    /// The agent pins its cluster in Git after a rollback (`--write-back`).
    pub write_back: bool,
    /// The release in progress, as the notifications describe it (empty when the loop could not
    /// read it).
    pub about: &'a About,
}

/// Everything one step tells: the loop writes each part that is there.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    pub transition: Option<Transition>,
    pub status: Option<Status>,
    pub notification: Option<Notification>,
    pub write_back: Option<WriteBack>,
}

/// Applies `step` to `state` and says what to tell about it.
///
/// # Errors
/// The state's [`TransitionError`] when `step` does not fit the phase `state` is in; `state` is
/// then unchanged.
pub fn conclude(state: &mut AgentState, step: &Step, ctx: &Context<'_>) -> Result<Report, TransitionError> {
    let before = state.progress().clone();
    let status = |op: &Operation, st: State, description: String| {
        let mut s = Status::new(ctx.cluster, &op.release, &op.commit, st, description)
            .started(op.started_at)
            .of_variant(ctx.about.variant.clone());
        s.reported_at = ctx.now;
        s
    };
    let notification = |kind, op: &Operation, reason: &str, message: &str| Notification {
        about: Box::new(ctx.about.clone()),
        ..Notification::new(kind, &op.release, reason, message)
    };
    let mut report = Report::default();
    match step {
        Step::Begin { release, commit } => {
            report.transition = Some(state.begin(release, commit, ctx.now)?);
        }
        Step::Deferred { why } => {
            report.transition = Some(state.abort(why)?);
        }
        Step::Refused { reason, message } => {
            let t = state.block(Failure::new(*reason, message.clone()), ctx.now)?;
            let op = verifying(&before);
            report.status =
                Some(status(op, State::Error, format!("refused, nothing applied: {message}")).decided(ctx.now));
            report.notification = Some(notification(NotificationKind::Refused, op, reason, message));
            report.transition = Some(t);
        }
        Step::Blocked(blocker) => {
            let message = format!("{}: {}", blocker.gate(), blocker.problems());
            let t = state.block(Failure::new(blocker.reason(), message.clone()), ctx.now)?;
            let op = verifying(&before);
            let figure = GateFigure {
                name: blocker.gate().to_string(),
                observed: blocker.problems(),
                threshold: "no problems".to_string(),
                verdict: "fail".to_string(),
            };
            report.status = Some(
                status(op, State::Failure, format!("blocked before apply by {message}"))
                    .with_gates(vec![figure])
                    .decided(ctx.now),
            );
            report.notification = Some(Notification {
                gate: Some(blocker.gate().to_string()),
                ..notification(NotificationKind::Refused, op, blocker.reason(), &blocker.problems())
            });
            report.transition = Some(t);
        }
        Step::StartApply { rollback_target, snapshot, approval, returning } => {
            let from = state.current().unwrap_or("nothing").to_string();
            let (rollback_target, snapshot) = (rollback_target.as_deref(), snapshot.as_deref());
            let t = match returning {
                Some(r) => state.start_return(rollback_target, snapshot, r.clone())?,
                None => state.start_apply(rollback_target, snapshot)?,
            };
            let op = verifying(&before);
            let mut description = match returning {
                Some(r) => {
                    format!("rolling back to {} from {from}, as Git asks{}", op.release, r.kept_summary(&op.release))
                }
                None => format!("applying {} (from {from})", op.release),
            };
            if let Some(a) = approval {
                description = format!("{description}, {}", a.summary());
            }
            report.notification = Some(notification(NotificationKind::Started, op, t.reason, &description));
            let started = status(op, State::Pending, description);
            report.status = Some(match approval {
                Some(a) => started.approved(a.clone()),
                None => started,
            });
            report.transition = Some(t);
        }
        Step::Applied { bake_time } => {
            let t = state.applied(ctx.now)?;
            let Progress::Applying(op) = &before else { unreachable!("applied succeeds only from Applying") };
            let bake = humantime::format_duration(*bake_time);
            let description = match &op.returning {
                Some(_) => format!("baking for {bake} (the rollback's bake)"),
                None => format!("baking for {bake}"),
            };
            report.notification = Some(notification(NotificationKind::Applied, op, t.reason, &description));
            report.status = Some(status(op, State::Pending, description).applied(ctx.now));
            report.transition = Some(t);
        }
        Step::Passed { bake_time, figures } => {
            let t = state.bake_passed()?;
            let Progress::Baking { operation, applied_at } = &before else {
                unreachable!("bake_passed succeeds only from Baking")
            };
            let bake = humantime::format_duration(*bake_time);
            let description = match &operation.returning {
                Some(r) => format!(
                    "rolled back from {} as Git asks: all gates passed for {bake}{}",
                    r.from,
                    r.kept_summary(&operation.release)
                ),
                None => format!("all gates passed for {bake}"),
            };
            report.notification =
                Some(notification(NotificationKind::Passed, operation, t.reason, &description).with_gates(figures));
            report.status = Some(
                status(operation, State::Success, description)
                    .with_gates(figures.clone())
                    .applied(*applied_at)
                    .decided(ctx.now),
            );
            report.transition = Some(t);
        }
        Step::Failed { failure, figures } => {
            report.transition = Some(state.start_rollback(failure.clone(), figures.clone(), ctx.now)?);
            let Progress::RollingBack(r) = state.progress() else {
                unreachable!("start_rollback leaves the state RollingBack")
            };
            let op = &r.operation;
            report.notification = Some(Notification {
                rolled_back_to: op.rollback_target.clone(),
                ..notification(NotificationKind::Failed, op, &failure.reason, &failure.message).with_gates(figures)
            });
        }
        Step::RolledBack => {
            let t = state.rollback_finished()?;
            let Progress::RollingBack(r) = &before else {
                unreachable!("rollback_finished succeeds only from RollingBack")
            };
            let op = &r.operation;
            let target = op.rollback_target.clone();
            let done = match &target {
                Some(t) => format!("rolled back to {t}"),
                None => "workloads and webhooks removed (no earlier release succeeded here)".to_string(),
            };
            let mut s = status(op, State::Failure, format!("{done}: {}", r.failure.message))
                .with_gates(r.evidence.clone())
                .decided(ctx.now);
            if let Some(at) = r.applied_at {
                s = s.applied(at);
            }
            if let Some(t) = &target {
                s = s.rolled_back_to(t.clone());
            }
            report.status = Some(s);
            report.notification = Some(Notification {
                rolled_back_to: target.clone(),
                ..notification(NotificationKind::RolledBack, op, &r.failure.reason, &r.failure.message)
                    .with_gates(&r.evidence)
            });
            report.write_back = target.filter(|_| ctx.write_back).map(|target| WriteBack {
                failed: op.release.clone(),
                target,
                failure: r.failure.clone(),
            });
            report.transition = Some(t);
        }
        Step::RollbackFailed { message } => {
            let Progress::RollingBack(r) = &before else {
                return Err(TransitionError::WrongPhase {
                    action: "report a failed rollback",
                    phase: before.phase(),
                    needs: "RollingBack",
                });
            };
            let op = &r.operation;
            let to = op.rollback_target.as_deref().unwrap_or("nothing (removing workloads and webhooks)");
            report.status = Some(status(
                op,
                State::Error,
                format!("rollback to {to} failed, retrying: {message} (after {})", r.failure.reason),
            ));
            report.notification = Some(notification(NotificationKind::Error, op, "RollbackFailed", message));
        }
    }
    // Persisted with the step: a kill before the status reaches Git must not lose it.
    if let Some(status) = &report.status {
        state.record_unreported(status.clone());
    }
    if let Some(wb) = &report.write_back {
        state.record_write_back(wb.clone());
    }
    Ok(report)
}

/// The operation of a state that was Verifying: the transitions that leave Verifying succeed only
/// from there, so any other progress is a bug in [`conclude`].
fn verifying(before: &Progress) -> &Operation {
    match before {
        Progress::Verifying(op) => op,
        other => unreachable!("a transition out of Verifying succeeded from {}", other.phase()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::state::Phase;
    use crate::agent::state::machine::fixtures::{on_rel1, t};
    use crate::gates::RequirementError;
    use rstest::rstest;

    fn figure(name: &str, observed: &str, threshold: &str, verdict: &str) -> GateFigure {
        GateFigure {
            name: name.into(),
            observed: observed.into(),
            threshold: threshold.into(),
            verdict: verdict.into(),
        }
    }

    /// rel-1 ran and passed; Git now desires rel-2; `phase` says how far rel-2 got.
    fn state_in(phase: Phase) -> AgentState {
        let mut s = on_rel1();
        s.observe_desired(Some("rel-2"), false);
        if phase == Phase::Idle {
            return s;
        }
        s.begin("rel-2", "c2", t(10)).unwrap();
        if phase == Phase::Verifying {
            return s;
        }
        s.start_apply(None, Some("snap-1")).unwrap();
        if phase == Phase::Applying {
            return s;
        }
        s.applied(t(20)).unwrap();
        if phase == Phase::Baking {
            return s;
        }
        let evidence = vec![figure("error-rate", "9 %", "5 %", "fail"), figure("restarts", "0", "3", "pass")];
        s.start_rollback(Failure::new("GateFailed", "error-rate 9 % > 5 %"), evidence, t(30)).unwrap();
        s
    }

    /// The expected report, as plain values: (transition reason, phase after, current after,
    /// status state and description, notification kind and text).
    type Expected = (
        Option<&'static str>,
        Phase,
        Option<&'static str>,
        Option<(State, &'static str)>,
        Option<(NotificationKind, &'static str)>,
    );

    fn crd_block() -> Blocker {
        Blocker::Gate(PreapplyBlock::CrdIncompatible { findings: Vec::new(), invalid_objects: Vec::new() })
    }

    #[rstest]
    #[case::begin(Phase::Idle, Step::Begin { release: "rel-2".into(), commit: "c2".into() },
        (Some("ReleaseStarted"), Phase::Verifying, Some("rel-1"), None, None))]
    #[case::deferred(Phase::Verifying, Step::Deferred { why: "Git unreachable".into() },
        (Some("ReleaseDeferred"), Phase::Idle, Some("rel-1"), None, None))]
    #[case::resumed_while_verifying(Phase::Verifying, Step::Deferred { why: "the agent restarted while verifying".into() },
        (Some("ReleaseDeferred"), Phase::Idle, Some("rel-1"), None, None))]
    #[case::refused(Phase::Verifying, Step::Refused { reason: "SignatureInvalid", message: "tag rel-2 is signed by an untrusted key".into() },
        (Some("ReleaseBlocked"), Phase::Idle, Some("rel-1"),
         Some((State::Error, "refused, nothing applied: tag rel-2 is signed by an untrusted key")),
         Some((NotificationKind::Refused, "fleetgate c: rel-2 refused before apply: SignatureInvalid: tag rel-2 is signed by an untrusted key"))))]
    #[case::blocked_by_requirement(Phase::Verifying,
        Step::Blocked(Blocker::Gate(PreapplyBlock::Requirement { error: RequirementError::KubernetesVersion { required: ">=1.40".into(), found: "v1.36.3".into() } })),
        (Some("ReleaseBlocked"), Phase::Idle, Some("rel-1"),
         Some((State::Failure, "blocked before apply by requirements: the release requires Kubernetes >=1.40, the cluster runs v1.36.3")),
         Some((NotificationKind::Refused, "fleetgate c: rel-2 refused before apply: gate requirements: the release requires Kubernetes >=1.40, the cluster runs v1.36.3"))))]
    #[case::blocked_by_dry_run(Phase::Verifying, Step::Blocked(Blocker::DryRun("Deployment x: field is immutable".into())),
        (Some("ReleaseBlocked"), Phase::Idle, Some("rel-1"),
         Some((State::Failure, "blocked before apply by dry-run: Deployment x: field is immutable")),
         Some((NotificationKind::Refused, "fleetgate c: rel-2 refused before apply: gate dry-run: Deployment x: field is immutable"))))]
    #[case::start_apply(Phase::Verifying, Step::StartApply { rollback_target: None, snapshot: Some("snap-1".into()), approval: None, returning: None },
        (Some("ApplyStarted"), Phase::Applying, Some("rel-1"), Some((State::Pending, "applying rel-2 (from rel-1)")),
         Some((NotificationKind::Started, "fleetgate c: rel-2 apply started: ApplyStarted: applying rel-2 (from rel-1)"))))]
    #[case::applied(Phase::Applying, Step::Applied { bake_time: Duration::from_secs(90) },
        (Some("Applied"), Phase::Baking, Some("rel-2"), Some((State::Pending, "baking for 1m 30s")),
         Some((NotificationKind::Applied, "fleetgate c: rel-2 applied, baking: Applied: baking for 1m 30s"))))]
    #[case::baked_ok(Phase::Baking, Step::Passed { bake_time: Duration::from_secs(5), figures: vec![figure("restarts", "0", "3", "pass")] },
        (Some("ReleaseSucceeded"), Phase::Idle, Some("rel-2"), Some((State::Success, "all gates passed for 5s")),
         Some((NotificationKind::Passed, "fleetgate c: rel-2 passed its gates: ReleaseSucceeded: all gates passed for 5s"))))]
    #[case::gate_failed(Phase::Baking, Step::Failed { failure: Failure::new("GateFailed", "error-rate 9 % > 5 %"), figures: vec![figure("error-rate", "9 %", "5 %", "fail")] },
        (Some("RollbackStarted"), Phase::RollingBack, Some("rel-2"), None,
         Some((NotificationKind::Failed, "fleetgate c: rel-2 failed, rolling back: gate error-rate 9 % (threshold 5 %)"))))]
    #[case::apply_failed(Phase::Applying, Step::Failed { failure: Failure::new("ApplyFailed", "webhook refused"), figures: Vec::new() },
        (Some("RollbackStarted"), Phase::RollingBack, Some("rel-1"), None,
         Some((NotificationKind::Failed, "fleetgate c: rel-2 failed, rolling back: ApplyFailed: webhook refused"))))]
    #[case::rolled_back(Phase::RollingBack, Step::RolledBack,
        (Some("RolledBack"), Phase::Idle, Some("rel-1"),
         Some((State::Failure, "rolled back to rel-1: error-rate 9 % > 5 %")),
         Some((NotificationKind::RolledBack, "fleetgate c: rel-2 rolled back to rel-1: gate error-rate 9 % (threshold 5 %)"))))]
    #[case::rollback_failed(Phase::RollingBack, Step::RollbackFailed { message: "apply: API server unreachable".into() },
        (None, Phase::RollingBack, Some("rel-2"),
         Some((State::Error, "rollback to rel-1 failed, retrying: apply: API server unreachable (after GateFailed)")),
         Some((NotificationKind::Error, "fleetgate c: rel-2 error: RollbackFailed: apply: API server unreachable"))))]
    fn each_step_reports_what_it_decided(#[case] phase: Phase, #[case] step: Step, #[case] expected: Expected) {
        let mut state = state_in(phase);
        let ctx = Context { cluster: "c", now: t(100), write_back: false, about: &About::default() };
        let report = conclude(&mut state, &step, &ctx).unwrap();
        let got: (_, _, _, _, _) = (
            report.transition.as_ref().map(|t| t.reason),
            state.phase(),
            state.current().map(str::to_string),
            report.status.as_ref().map(|s| (s.state, s.description.clone())),
            report.notification.as_ref().map(|n| (n.kind, n.text("c"))),
        );
        let want = (
            expected.0,
            expected.1,
            expected.2.map(str::to_string),
            expected.3.map(|(s, d)| (s, d.to_string())),
            expected.4.map(|(k, t)| (k, t.to_string())),
        );
        assert_eq!(got, want);
        // Every status is about the release in progress, on its commit, reported at `now`.
        if let Some(s) = &report.status {
            assert_eq!(
                (s.release.as_str(), s.commit.as_str(), s.started_at, s.reported_at),
                ("rel-2", "c2", Some(t(10)), t(100))
            );
        }
        assert_eq!(report.write_back, None, "write-back is off");
        // The status is persisted with the step until it is delivered; a step without one adds none.
        assert_eq!(state.unreported(), report.status.as_slice());
        state.reported(report.status.as_ref().unwrap_or(&Status::new("c", "x", "c", State::Pending, "x")));
        assert!(state.unreported().is_empty());
    }

    #[test]
    fn a_block_or_rollback_rejects_the_release() {
        for (phase, step) in [
            (Phase::Verifying, Step::Blocked(crd_block())),
            (Phase::Verifying, Step::Refused { reason: "SignatureInvalid", message: "bad".into() }),
            (Phase::RollingBack, Step::RolledBack),
        ] {
            let mut state = state_in(phase);
            conclude(
                &mut state,
                &step,
                &Context { cluster: "c", now: t(100), write_back: false, about: &About::default() },
            )
            .unwrap();
            assert!(state.rejected().contains_key("rel-2"), "{step:?}");
        }
        let mut state = state_in(Phase::Verifying);
        conclude(
            &mut state,
            &Step::Deferred { why: "x".into() },
            &Context { cluster: "c", now: t(1), write_back: false, about: &About::default() },
        )
        .unwrap();
        assert!(state.rejected().is_empty(), "deferring rejects nothing");
    }

    #[test]
    fn the_success_and_rollback_statuses_carry_the_figures_and_times() {
        let ctx = Context { cluster: "c", now: t(100), write_back: true, about: &About::default() };
        let mut state = state_in(Phase::Baking);
        let figures = vec![figure("restarts", "0", "3", "pass")];
        let report =
            conclude(&mut state, &Step::Passed { bake_time: Duration::from_secs(5), figures: figures.clone() }, &ctx)
                .unwrap();
        let s = report.status.unwrap();
        assert_eq!((s.gates, s.applied_at, s.decided_at), (figures, Some(t(20)), Some(t(100))));
        assert_eq!(state.last_known_good(), Some("rel-2"));

        let mut state = state_in(Phase::RollingBack);
        let report = conclude(&mut state, &Step::RolledBack, &ctx).unwrap();
        let s = report.status.unwrap();
        assert_eq!((s.rollback_to.as_deref(), s.applied_at, s.gates.len()), (Some("rel-1"), Some(t(20)), 2));
        let n = report.notification.unwrap();
        assert_eq!(
            (n.gate.as_deref(), n.figure.as_deref(), n.rolled_back_to.as_deref()),
            (Some("error-rate"), Some("9 %"), Some("rel-1"))
        );
        assert_eq!(
            report.write_back,
            Some(WriteBack {
                failed: "rel-2".into(),
                target: "rel-1".into(),
                failure: Failure::new("GateFailed", "error-rate 9 % > 5 %")
            })
        );
        assert_eq!(state.pending_write_back(), report.write_back.as_ref(), "persisted with the verdict");
    }

    #[test]
    fn every_notification_and_status_carries_the_scope_and_the_variant() {
        let about = About {
            wave: Some("canary".into()),
            target_clusters: vec!["c".into()],
            variant: Some("eu".into()),
            ..About::default()
        };
        let mut state = state_in(Phase::Verifying);
        for step in [
            Step::StartApply { rollback_target: None, snapshot: None, approval: None, returning: None },
            Step::Applied { bake_time: Duration::from_secs(5) },
            Step::Passed { bake_time: Duration::from_secs(5), figures: vec![figure("restarts", "0", "3", "pass")] },
        ] {
            let ctx = Context { cluster: "c", now: t(100), write_back: false, about: &about };
            let report = conclude(&mut state, &step, &ctx).unwrap();
            let n = report.notification.expect("a notification");
            assert_eq!(*n.about, about, "{step:?}");
            assert_eq!(report.status.expect("a status").variant.as_deref(), Some("eu"), "{step:?}");
        }
    }

    #[test]
    fn the_start_records_who_approved() {
        let mut state = state_in(Phase::Verifying);
        let approval = ApprovalRecord {
            by: "Ana <ana@example.com> (key ABC)".into(),
            why: "CAB-1234".into(),
            wave: "prod".into(),
            via: "tag approve/rel-2/prod".into(),
        };
        let step = Step::StartApply {
            rollback_target: None,
            snapshot: None,
            approval: Some(approval.clone()),
            returning: None,
        };
        let ctx = Context { cluster: "c", now: t(100), write_back: false, about: &About::default() };
        let s = conclude(&mut state, &step, &ctx).unwrap().status.unwrap();
        assert_eq!(s.description, "applying rel-2 (from rel-1), approved by Ana <ana@example.com> (key ABC): CAB-1234");
        assert_eq!(s.approval, Some(approval));
    }

    #[test]
    fn a_blocked_status_names_the_gate_as_a_figure() {
        let mut state = state_in(Phase::Verifying);
        let ctx = Context { cluster: "c", now: t(100), write_back: true, about: &About::default() };
        let report = conclude(&mut state, &Step::Blocked(crd_block()), &ctx).unwrap();
        let s = report.status.unwrap();
        assert_eq!(s.gates[0].name, "crd-compatibility");
        assert_eq!(s.gates[0].verdict, "fail");
        assert_eq!(state.rejected()["rel-2"].failure.reason, "CrdIncompatible");
        assert_eq!(report.write_back, None, "nothing was applied: nothing to write back");
    }

    #[rstest]
    #[case::applied_from_verifying(Phase::Verifying, Step::Applied { bake_time: Duration::ZERO })]
    #[case::rolled_back_from_baking(Phase::Baking, Step::RolledBack)]
    #[case::rollback_failed_from_idle(Phase::Idle, Step::RollbackFailed { message: "x".into() })]
    #[case::refused_from_idle(Phase::Idle, Step::Refused { reason: "X", message: "x".into() })]
    fn a_step_out_of_order_changes_and_reports_nothing(#[case] phase: Phase, #[case] step: Step) {
        let mut state = state_in(phase);
        let before = state.clone();
        let err = conclude(
            &mut state,
            &step,
            &Context { cluster: "c", now: t(100), write_back: true, about: &About::default() },
        )
        .unwrap_err();
        assert!(matches!(err, TransitionError::WrongPhase { .. }), "{err}");
        assert_eq!(state, before);
    }
}
