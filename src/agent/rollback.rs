//! Automatic rollback: after a failed gate or a failed apply, put the cluster back on the rollback
//! target (`rollbackTo` of the failed release when that succeeded here, else the last-known-good
//! release) from that release's own verified tag, prune what the failed release added, restore
//! the snapshotted custom resources, wait until the old release has rolled out, and only then
//! report `failure` naming the gate, its figure and threshold, and the release rolled back to.
//! With no target (the first release here failed), the failed release's workloads and webhook
//! configurations are removed and its CRDs and custom resources kept. The snapshot is restored
//! only when it holds the target's own objects, its MAC verifies and the admission policy admits
//! what it holds (custom resources aside); otherwise the rollback completes without it, with a
//! Warning Event that says why.
//!
//! The target's content comes from the last-known-good store ([`super::lkg`]), re-verified
//! before use, so neither the Git server nor the target's tag is needed; only a target stored
//! before the agent kept copies is read from its tag in the mirror.
//!
//! Every step is idempotent, so an agent killed during a rollback does it again on restart
//! (phase `RollingBack` is persisted before the first step). A failed attempt is reported once
//! (`error` status, notification) and retried at the next pass.

use super::reconcile::{Agent, Outcome, ReconcileError, Run};
use super::report::Step;
use super::state::{Failure, Progress, Rollback, TransitionError};
use crate::apply::{AdmittedSet, ApplyError, Engine};
use crate::gates::crd_compat;
use crate::model::FleetConfig;
use crate::model::{error_chain, stop_point};
use crate::source::Checkout;
use crate::status::GateFigure;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;

impl Agent {
    /// Moves to `RollingBack` (persisted with what failed; the failed release becomes rejected),
    /// then rolls back.
    pub(super) async fn roll_back(
        &mut self,
        run: &Run<'_>,
        failure: Failure,
        figures: Vec<GateFigure>,
    ) -> Result<Outcome, ReconcileError> {
        tracing::warn!(reason = %failure.reason, "{}", failure.message);
        let reason = failure.reason.clone();
        self.step(run, Step::Failed { failure, figures }).await?;
        // Counted once persisted: a verdict the API server never took is judged again next pass.
        self.services.metrics.record_rollback(&reason);
        self.finish_rollback(run).await
    }

    /// The rollback proper (phase `RollingBack`), then the `failure` status.
    pub(super) async fn finish_rollback(&mut self, run: &Run<'_>) -> Result<Outcome, ReconcileError> {
        let state = self.services.store.load().await?;
        let Progress::RollingBack(rollback) = state.progress() else {
            let phase = state.phase();
            return Err(TransitionError::WrongPhase { action: "roll back", phase, needs: "RollingBack" }.into());
        };
        if let Err(e) = self.restore(run.checkout, run.config, rollback).await {
            let message = error_chain(&e);
            if self.last_rollback_error.as_deref() != Some(message.as_str()) {
                self.step(run, Step::RollbackFailed { message: message.clone() }).await?;
                self.last_rollback_error = Some(message);
            }
            return Err(e);
        }
        self.last_rollback_error = None;
        self.step(run, Step::RolledBack).await?;
        let operation = &rollback.operation;
        Ok(Outcome::RolledBack { release: operation.release.clone(), to: operation.rollback_target.clone() })
    }

    /// Before a rollback (or a return, [`super::state::Return`]) applies its target's CRDs: a
    /// live CRD the target's would narrow ([`crd_compat::crds_to_keep`]: a stored version it
    /// lacks — the API server would refuse it, and the rollback fail at every pass — or a field,
    /// version or looser bound objects may rely on) stays as it is, with a Warning Event
    /// `CrdKept` of `action` that says why (none without one: a plan only looks), while
    /// everything else goes back. Returns what was kept.
    pub(super) async fn keep_wider_crds(
        &self,
        admitted: &mut AdmittedSet<'_>,
        action: Option<&str>,
    ) -> Result<Vec<crd_compat::KeptCrd>, ReconcileError> {
        let api: Api<CustomResourceDefinition> = Api::all(self.services.client.clone());
        let mut live = Vec::new();
        for crd in admitted.crds() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let found = api.get_opt(&name).await.map_err(|source| ApplyError::Kube {
                action: format!("reading the live CustomResourceDefinition {name}"),
                source,
            })?;
            live.extend(found);
        }
        let kept = crd_compat::crds_to_keep(&live, admitted.crds());
        for k in &kept {
            let Some(crd) = live.iter().find(|l| l.metadata.name.as_deref() == Some(k.name.as_str())) else {
                continue;
            };
            admitted.keep_live_crd(crd);
            if let Some(action) = action {
                tracing::warn!(crd = %k.name, "{k}");
                self.services.record_warning("CrdKept", action, &k.to_string()).await;
            }
        }
        Ok(kept)
    }

    /// Applies the rollback target, prunes what the failed release added, restores the snapshot.
    async fn restore(
        &self,
        checkout: &Checkout,
        config: &FleetConfig,
        rollback: &Rollback,
    ) -> Result<(), ReconcileError> {
        let operation = &rollback.operation;
        let Some(target) = &operation.rollback_target else {
            // Nothing succeeded here before: take the failed release's workloads and webhooks
            // out, keep its CRDs and custom resources (the users' data).
            let removed = self.rollback_engine.withdraw().await?;
            tracing::warn!(release = %operation.release, removed = removed.len(), "no earlier release succeeded here; workloads and webhooks removed, CRDs and custom resources kept");
            return Ok(());
        };
        let verified = self.rollback_release(checkout, target).await?;
        let mut admitted = self.rollback_engine.admit(&verified, &self.admission_policy(config)).await?;
        self.keep_wider_crds(&mut admitted, Some("RollingBack")).await?;
        let changes = self.rollback_engine.apply(admitted).await?;
        stop_point::reached("rollback.after-apply").await;
        let pruned = self.rollback_engine.prune().await?;
        tracing::info!(release = %target, changes = %changes.summary(), pruned = pruned.len(), "rollback applied");
        let Some(snapshot) = &operation.snapshot else { return Ok(()) };
        self.restore_snapshot(&self.rollback_engine, snapshot, target, config).await
    }

    /// Restores `snapshot` after `target` was applied, when it holds `target`'s own objects. A
    /// snapshot of another release, one whose MAC does not verify, or one holding what no
    /// release may apply is not restored: `target` is applied, so the rollback still completes,
    /// with a Warning Event that says why.
    pub(super) async fn restore_snapshot(
        &self,
        engine: &Engine,
        snapshot: &str,
        target: &str,
        config: &FleetConfig,
    ) -> Result<(), ReconcileError> {
        let policy = self.admission_policy(config);
        // A snapshot holds the objects of the release that ran when it was taken; restored on
        // top of another release it would leave the cluster part one, part the other.
        let taken_of = engine.snapshots().await?.into_iter().find(|s| s.id == snapshot).map(|s| s.release);
        if taken_of.as_deref() != Some(target) {
            let of = taken_of.map_or_else(|| "no longer exists".to_string(), |r| format!("holds {r}'s objects"));
            let note =
                format!("snapshot {snapshot} {of}, not {target}'s: {target} applied, custom resources not restored");
            tracing::warn!(snapshot = %snapshot, target = %target, "{note}");
            self.services.record_warning("SnapshotSkipped", "RollingBack", &note).await;
            return Ok(());
        }
        match engine.restore(snapshot, &policy).await {
            Ok(restored) => {
                tracing::info!(snapshot = %snapshot, changes = %restored.summary(), "custom resources restored");
                Ok(())
            }
            // A snapshot that is not the agent's own, or holds what no release may apply, is
            // never restored; the target itself is applied, so the rollback still completes.
            Err(e @ (ApplyError::SnapshotUnauthenticated { .. } | ApplyError::Admission(_))) => {
                let note = format!("{target} applied, snapshot not restored: {}", error_chain(&e));
                tracing::warn!(snapshot = %snapshot, target = %target, "{note}");
                self.services.record_warning("SnapshotRefused", "RollingBack", &note).await;
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}
