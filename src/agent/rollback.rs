//! Automatic rollback: after a failed gate or a failed apply, put the cluster back on the rollback
//! target (`rollbackTo` of the failed release, else the last-known-good release) from that
//! release's own verified tag, prune what the failed release added, restore the snapshotted
//! custom resources, wait until the old release has rolled out, and only then report `failure`
//! naming the gate, its figure and threshold, and the release rolled back to.
//!
//! Every step is idempotent, so an agent killed during a rollback does it again on restart
//! (phase `RollingBack` is persisted before the first step). A failed attempt is reported once
//! (`error` status, notification) and retried at the next pass.

use super::reconcile::{Agent, Outcome, ReconcileError};
use super::report::Step;
use super::state::{Failure, Progress, Rollback, TransitionError};
use crate::model::FleetConfig;
use crate::source::Checkout;
use crate::status::GateFigure;

impl Agent {
    /// Moves to `RollingBack` (persisted with what failed; the failed release becomes rejected),
    /// then rolls back.
    pub(super) async fn roll_back(
        &mut self,
        checkout: &Checkout,
        config: &FleetConfig,
        failure: Failure,
        figures: Vec<GateFigure>,
    ) -> Result<Outcome, ReconcileError> {
        tracing::warn!(reason = %failure.reason, "{}", failure.message);
        self.services.metrics.record_rollback(&failure.reason);
        self.step(config, Step::Failed { failure, figures }).await?;
        self.finish_rollback(checkout, config).await
    }

    /// The rollback proper (phase `RollingBack`), then the `failure` status.
    pub(super) async fn finish_rollback(
        &mut self,
        checkout: &Checkout,
        config: &FleetConfig,
    ) -> Result<Outcome, ReconcileError> {
        let state = self.services.store.load().await?;
        let Progress::RollingBack(rollback) = state.progress() else {
            let phase = state.phase();
            return Err(TransitionError::WrongPhase { action: "roll back", phase, needs: "RollingBack" }.into());
        };
        if let Err(e) = self.restore(checkout, config, rollback).await {
            let message = e.to_string();
            if self.last_rollback_error.as_deref() != Some(message.as_str()) {
                self.step(config, Step::RollbackFailed { message: message.clone() }).await?;
                self.last_rollback_error = Some(message);
            }
            return Err(e);
        }
        self.last_rollback_error = None;
        self.step(config, Step::RolledBack).await?;
        let operation = &rollback.operation;
        Ok(Outcome::RolledBack { release: operation.release.clone(), to: operation.rollback_target.clone() })
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
            tracing::error!(release = %operation.release, "no earlier release to roll back to; the failed release stays applied");
            return Ok(());
        };
        let verified = self.verify_known(checkout, target).await?;
        let admitted = self.rollback_engine.admit(&verified, &self.admission_policy(config)).await?;
        let changes = self.rollback_engine.apply(admitted).await?;
        let pruned = self.rollback_engine.prune().await?;
        tracing::info!(release = %target, changes = %changes.summary(), pruned = pruned.len(), "rollback applied");
        if let Some(snapshot) = &operation.snapshot {
            let restored = self.rollback_engine.restore(snapshot).await?;
            tracing::info!(snapshot = %snapshot, changes = %restored.summary(), "custom resources restored");
        }
        Ok(())
    }
}
