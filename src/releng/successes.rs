//! What each cluster ran successfully, from the statuses in the local notes refs (only entries
//! signed by a cluster key the configuration registers count, ordered by the cluster's signed
//! sequence, never by claimed time).
//!
//! A cluster's releases that succeeded, newest first, are its rollback candidates
//! (`rollback --list`); the first is its last-known-good release, which `release create`
//! compares new CRDs with ([`super::baseline`]). Fetch the remote's notes first
//! ([`super::publish::fetch_statuses`]) to read the newest word.

use super::RelengError;
use super::repo::{FleetRepo, ReleaseTag};
use crate::model::FleetConfig;
use crate::status::{self, State, Status};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;

/// One release a cluster reported `success` for: its newest such entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Success {
    pub release: String,
    /// When the agent says it decided (shown only; the order is `sequence`).
    pub at: DateTime<Utc>,
    /// The cluster's signed counter on that entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
}

/// Every verified status of every cluster of a fleet, per cluster in the order it wrote them.
#[derive(Debug, Clone, Default)]
pub struct Successes {
    by_cluster: BTreeMap<String, Vec<Status>>,
}

impl Successes {
    /// Reads the statuses of the releases `tags` from the local notes refs, believing the keys
    /// `config` registers.
    pub fn read(repo: &FleetRepo, config: &FleetConfig, tags: &[ReleaseTag]) -> Result<Successes, RelengError> {
        let commits: Vec<git2::Oid> = tags.iter().map(|t| t.commit).collect();
        let keys = status::StatusKeys::registered(config);
        let set = status::read_all(repo.git(), &commits, &keys).map_err(RelengError::StatusRead)?;
        let mut by_cluster = BTreeMap::new();
        for cluster in config.clusters.keys() {
            let mut all: Vec<Status> = tags.iter().flat_map(|t| set.history(cluster, &t.id).iter().cloned()).collect();
            all.sort_by_key(|s| s.sequence);
            by_cluster.insert(cluster.clone(), all);
        }
        Ok(Successes { by_cluster })
    }

    fn entries(&self, cluster: &str) -> &[Status] {
        self.by_cluster.get(cluster).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The releases `cluster` reported `success` for, newest first, each once.
    pub fn of(&self, cluster: &str) -> Vec<Success> {
        let mut out: Vec<Success> = Vec::new();
        for s in self.entries(cluster).iter().rev().filter(|s| s.state == State::Success) {
            if !out.iter().any(|o| o.release == s.release) {
                out.push(Success {
                    release: s.release.clone(),
                    at: s.decided_at.unwrap_or(s.reported_at),
                    sequence: s.sequence,
                });
            }
        }
        out
    }

    /// The release `cluster` last reported `success` for, other than those `skip` names.
    pub fn last_known_good(&self, cluster: &str, skip: impl Fn(&str) -> bool) -> Option<Success> {
        self.of(cluster).into_iter().find(|s| !skip(&s.release))
    }

    /// What `cluster` had last succeeded with when it first reported on `release` — the release
    /// it ran when its agent took the snapshot before applying `release`. `None`: it never
    /// reported on `release`; `Some(None)`: nothing had succeeded there before.
    pub fn ran_before(&self, cluster: &str, release: &str) -> Option<Option<String>> {
        let entries = self.entries(cluster);
        let first = entries.iter().position(|s| s.release == release)?;
        Some(entries[..first].iter().rev().find(|s| s.state == State::Success).map(|s| s.release.clone()))
    }
}
