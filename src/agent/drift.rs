//! Drift correction: while the cluster runs what Git asks, the agent compares the live objects
//! with its current release every `--drift-interval` and, when any drifted or went missing,
//! applies the release again (through the same admission), with a Warning Event naming each
//! corrected object. Drift is what `fleetgate diff` shows: both use `Engine::drift`.
//!
//! CustomResourceDefinitions are left out: a CRD goes back only through a release apply or a
//! rollback, which know when an older CRD cannot replace a live one (its stored versions); a
//! re-apply keeps every live CRD the release would narrow, as a rollback does.

use super::reconcile::{Agent, Outcome, ReconcileError};
use crate::manifests::{CRD_GROUP, CRD_KIND};
use crate::release::{DesiredRelease, TipTrust};
use crate::source::Checkout;
use std::time::Instant;

/// Objects named in one Event at most; the rest are counted.
const NAMED: usize = 10;

impl Agent {
    /// Checks the current release (`desired`, which the cluster runs) for drift when the interval
    /// has passed, and re-applies it if anything drifted.
    pub(super) async fn correct_drift(
        &mut self,
        checkout: &Checkout,
        desired: &DesiredRelease,
        tip: &TipTrust,
    ) -> Result<Outcome, ReconcileError> {
        let Some(every) = self.services.config.drift_interval else { return Ok(Outcome::UpToDate) };
        if self.last_drift_check.is_some_and(|at| at.elapsed() < every) {
            return Ok(Outcome::UpToDate);
        }
        self.last_drift_check = Some(Instant::now());
        let verified = self.verify_known(checkout, &desired.id).await?;
        let report = self.engine.drift(&verified).await?;
        let drifted: Vec<String> = report
            .drifted()
            .filter(|o| !(o.object.group == CRD_GROUP && o.object.kind == CRD_KIND))
            .map(|o| o.object.to_string())
            .collect();
        if drifted.is_empty() {
            return Ok(Outcome::UpToDate);
        }
        let config = self.policy_config(checkout, tip, &desired.id, &desired.tag.commit.to_string())?;
        let mut admitted = self.engine.admit(&verified, &self.admission_policy(&config)).await?;
        // A release returned to (a rollback) may run under wider CRDs it kept: never narrowed.
        self.keep_wider_crds(&mut admitted, Some("Drift")).await?;
        self.engine.apply(admitted).await?;
        let mut named = drifted.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
        if drifted.len() > NAMED {
            named.push_str(&format!(" and {} more", drifted.len() - NAMED));
        }
        tracing::warn!(release = %desired.id, objects = %named, "drift corrected");
        let note = format!("{} re-applied: {} object(s) had drifted from it: {named}", desired.id, drifted.len());
        self.services.record_warning("DriftCorrected", "Apply", &note).await;
        Ok(Outcome::DriftCorrected { release: desired.id.clone(), objects: drifted })
    }
}
