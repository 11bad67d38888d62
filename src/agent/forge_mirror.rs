//! Statuses on the commits people look at besides the release commit, on the agent's own forge:
//! the head of the pull request that promoted this cluster to the release (so its PR page shows
//! each cluster's health) and the agent's write-back commit after a rollback. Forge only — the Git
//! note stays on the release commit, the source of truth — and best effort: a mirror that fails
//! is logged, never retried at the cost of the loop.
//!
//! The fleet repo only decides which of its own commits gets the status
//! ([`crate::release::promotion_head`]); the forge, its URL and its token are the agent's
//! configuration, so a pushed commit cannot send the token anywhere.

use super::reconcile::Agent;
use crate::model::{FleetConfig, error_chain};
use crate::release::promotion_head;
use crate::status::{Publisher, Status};

impl Agent {
    /// After `status` was written: the same status on the head of the change that promoted this
    /// cluster to its release, when that is another commit than the release's.
    pub(super) async fn mirror_on_promotion(&self, publisher: &Publisher, status: &Status) {
        if !publisher.has_forge() {
            return;
        }
        let head = self.source.checkout().and_then(|c| promotion_head(&c, &status.cluster, &status.release));
        let head = match head {
            Ok(Some(head)) if head.to_string() != status.commit => head,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "could not find the promotion commit; its PR shows no status");
                return;
            }
        };
        self.mirror(publisher, status, &head.to_string(), "promotion PR head").await;
    }

    /// After a write-back: the status that led to it (the failure) on the write-back commit.
    pub(super) async fn mirror_on_write_back(&self, config: &FleetConfig, status: &Status, commit: git2::Oid) {
        let publisher = self.publisher(config).await;
        self.mirror(&publisher, status, &commit.to_string(), "write-back commit").await;
    }

    async fn mirror(&self, publisher: &Publisher, status: &Status, commit: &str, what: &'static str) {
        match publisher.mirror_on(status, commit).await {
            Ok(()) => {
                tracing::info!(release = %status.release, %commit, state = status.state.as_str(), "status mirrored on the {what}")
            }
            Err(e) => tracing::warn!(%commit, error = %error_chain(&e), "could not mirror the status on the {what}"),
        }
    }
}
