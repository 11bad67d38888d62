//! Automatic rollback: after a failed gate or a failed apply, put the cluster back on the rollback
//! target (`rollbackTo` of the failed release, else the last-known-good release) from that
//! release's own verified tag, prune what the failed release added, restore the snapshotted
//! custom resources, wait until the old release has rolled out, and only then report `failure`
//! naming the gate, its figure and threshold, and the release rolled back to.
//!
//! Every step is idempotent, so an agent killed during a rollback does it again on restart
//! (phase `RollingBack` is persisted before the first step).

use super::notifier::NotificationKind;
use super::reconcile::{Agent, Outcome, ReconcileError};
use super::state::{Failure, Operation};
use crate::model::FleetConfig;
use crate::source::Checkout;
use crate::status::{GateFigure, State, Status};
use chrono::Utc;

impl Agent {
    /// Moves to `RollingBack` (persisted, the failed release becomes rejected), then rolls back.
    pub(super) async fn roll_back(
        &mut self,
        checkout: &Checkout,
        config: &FleetConfig,
        operation: &Operation,
        failure: Failure,
        figures: Vec<GateFigure>,
    ) -> Result<Outcome, ReconcileError> {
        tracing::warn!(release = %operation.release, reason = %failure.reason, "{}", failure.message);
        self.services.metrics.record_rollback(&failure.reason);
        let f = failure.clone();
        // One write: an agent killed right after it must still know what failed and why.
        self.transition(|s| {
            let t = s.start_rollback(f.clone(), Utc::now())?;
            s.record_evidence(figures.clone())?;
            Ok(t)
        })
        .await?;
        let operation = self.operation().await?;
        self.finish_rollback(checkout, config, &operation, failure, figures).await
    }

    /// The rollback proper (phase `RollingBack`), then the `failure` status.
    pub(super) async fn finish_rollback(
        &mut self,
        checkout: &Checkout,
        config: &FleetConfig,
        operation: &Operation,
        failure: Failure,
        figures: Vec<GateFigure>,
    ) -> Result<Outcome, ReconcileError> {
        let cluster = self.services.config.cluster.clone();
        let target = operation.rollback_target.clone();
        match &target {
            Some(target) => {
                let verified = self.verify_known(checkout, target).await?;
                let policy = self.admission_policy(config);
                let changes = self.rollback_engine.apply(&verified, &policy).await?;
                let pruned = self.rollback_engine.prune().await?;
                tracing::info!(release = %target, changes = %changes.summary(), pruned = pruned.len(), "rollback applied");
                if let Some(snapshot) = &operation.snapshot {
                    let restored = self.rollback_engine.restore(snapshot).await?;
                    tracing::info!(snapshot = %snapshot, changes = %restored.summary(), "custom resources restored");
                }
            }
            None => {
                tracing::error!(release = %operation.release, "no earlier release to roll back to; the failed release stays applied");
            }
        }
        self.transition(|s| s.rollback_finished()).await?;

        let to = target.as_deref().unwrap_or("nothing (no earlier release)");
        let description = format!("rolled back to {to}: {}", failure.message);
        let mut status = Status::new(&cluster, &operation.release, &operation.commit, State::Failure, description)
            .with_gates(figures.clone())
            .started(operation.started_at)
            .decided(Utc::now());
        if let Some(at) = operation.applied_at {
            status = status.applied(at);
        }
        if let Some(t) = &target {
            status = status.rolled_back_to(t.clone());
        }
        self.publish(config, &status).await;
        self.notify(
            NotificationKind::Rollback,
            &operation.release,
            &failure.reason,
            &failure.message,
            target.as_deref(),
            &figures,
        )
        .await;
        if self.services.config.write_back
            && let Some(t) = &target
        {
            self.write_back(&operation.release, t, &failure).await;
        }
        Ok(Outcome::RolledBack { release: operation.release.clone(), to: target })
    }
}
