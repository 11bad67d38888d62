//! Everything the status view needs from one state of the fleet repo: the branch tip's
//! configuration, the release tags (newest first), every cluster's statuses on them and the
//! clusters' verified heartbeats.

use super::heartbeat::{self, Heartbeat};
use super::identity::StatusKeys;
use super::matrix::{Matrix, Origin, ReleaseRef};
use super::memo::VerifiedNotes;
use super::model::StatusSet;
use super::notes::{self, NotesError};
use super::waves::members;
use crate::model::{ConfigError, FleetConfig};
use crate::source::{Checkout, SourceError};

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("the branch tip's fleet configuration")]
    Config(#[from] ConfigError),
    #[error("reading status notes")]
    Notes(#[from] NotesError),
    #[error("reading heartbeats")]
    Heartbeats(#[source] git2::Error),
}

/// The fleet at the branch tip, its releases and their statuses.
#[derive(Debug, Clone)]
pub struct FleetView {
    pub config: FleetConfig,
    pub origin: Origin,
    /// Release tags ([`Checkout::release_tags`]), newest first (tagger time, else commit time).
    pub releases: Vec<ReleaseRef>,
    pub statuses: StatusSet,
    /// Each cluster's newest verified heartbeat, where the mirror holds heartbeat refs
    /// ([`crate::source::Source::with_heartbeats`]).
    pub heartbeats: std::collections::BTreeMap<String, Heartbeat>,
}

impl FleetView {
    /// Reads the view from a checkout (whose repository holds the notes refs: a
    /// [`crate::source::Source`] mirror fetches them). Statuses are verified with the keys the
    /// branch tip registers (`statusKey`); an agent additionally pins them (see
    /// `crate::agent::state`), a one-off reader cannot.
    pub fn load(checkout: &Checkout) -> Result<FleetView, ViewError> {
        FleetView::load_remembering(checkout, &mut VerifiedNotes::new())
    }

    /// [`FleetView::load`], skipping the signature checks of notes `memo` saw verified before
    /// ([`notes::read_all_remembering`]).
    pub fn load_remembering(checkout: &Checkout, memo: &mut VerifiedNotes) -> Result<FleetView, ViewError> {
        let config = FleetConfig::load(&checkout.tip_tree()?)?;
        let mut releases = Vec::new();
        for tag in checkout.release_tags()? {
            let created_at = chrono::DateTime::from_timestamp(checkout.tag_time(&tag)?, 0);
            releases.push(ReleaseRef { id: tag.name, commit: tag.commit.to_string(), created_at });
        }
        releases.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.id.cmp(&a.id)));
        let commits: Vec<git2::Oid> = releases.iter().filter_map(|r| git2::Oid::from_str(&r.commit).ok()).collect();
        let keys = StatusKeys::registered(&config);
        // The heartbeats are read on a thread of their own, beside the notes: at fleet scale both
        // reads are mostly listing thousands of loose refs (a file each), which two cores overlap.
        let repo_path = checkout.repo().path();
        let mut beats_memo = std::mem::take(&mut memo.beats);
        let (statuses, heartbeats) = std::thread::scope(|s| {
            let beats = s.spawn(|| {
                git2::Repository::open(repo_path)
                    .and_then(|repo| heartbeat::read_remembering(&repo, &keys, &mut beats_memo))
            });
            let statuses = notes::read_all_remembering(checkout.repo(), &commits, &keys, memo);
            (statuses, beats.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
        });
        memo.beats = beats_memo;
        let (statuses, heartbeats) = (statuses?, heartbeats.map_err(ViewError::Heartbeats)?);
        let origin = Origin { branch: checkout.branch().to_string(), revision: checkout.tip().to_string() };
        Ok(FleetView { config, origin, releases, statuses, heartbeats })
    }

    /// The cluster × release matrix of this view, each cluster judged stale by the allowance its
    /// heartbeat announces, or by `stale_after` (when given) for every cluster
    /// ([`Matrix::judge_liveness`]). The view's statuses move into the matrix.
    pub fn into_matrix(self, stale_after: Option<std::time::Duration>) -> Matrix {
        let now = chrono::Utc::now();
        let members = members(&self.config);
        let mut m = Matrix::build(&self.config.fleet, &members, &self.releases, self.statuses, &self.origin, now);
        m.judge_liveness(&self.heartbeats, stale_after, now);
        m
    }
}
