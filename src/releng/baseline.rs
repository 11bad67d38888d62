//! What `release create` compares a new release's CRDs with: what the target clusters last ran
//! successfully, not the previous tag (which may never have run anywhere).
//!
//! Each target cluster's baseline is its last-known-good release ([`Successes`]); a cluster that
//! reported no success yet (or whose last-known-good has no tag here any more) is compared with
//! the previous release in the branch's history instead, and the report says so. Each distinct
//! baseline is one comparison; the release's verdict combines them ([`CrdVerdict::combined`]).

use super::RelengError;
use super::checks::{self, CrdVerdict};
use super::repo::{FleetRepo, ReleaseTag};
use super::successes::Successes;
use serde::Serialize;
use std::collections::BTreeMap;

/// One release the new one was compared with, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdBaseline {
    pub release: String,
    /// Target clusters whose last-known-good release this is.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub last_known_good_of: Vec<String>,
    /// Target clusters with no last-known-good release: this is the previous release.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub previous_for: Vec<String>,
    pub verdict: CrdVerdict,
}

impl std::fmt::Display for CrdBaseline {
    /// `rel-1 (last-known-good of cluster-a, cluster-b)`,
    /// `rel-2 (the previous release, for cluster-c: no success reported yet)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut why = Vec::new();
        if !self.last_known_good_of.is_empty() {
            why.push(format!("last-known-good of {}", self.last_known_good_of.join(", ")));
        }
        if !self.previous_for.is_empty() {
            why.push(format!("the previous release, for {}: no success reported yet", self.previous_for.join(", ")));
        }
        write!(f, "{} ({})", self.release, why.join("; "))
    }
}

/// The baselines of a release with manifest files `new` accepting `accept`, for clusters
/// `targets`: each cluster's last-known-good release other than `own` (the release being cut),
/// else `previous`. Empty when there is nothing to compare with (a first release).
pub fn crd_baselines(
    repo: &FleetRepo,
    successes: &Successes,
    targets: &[String],
    own: &str,
    previous: Option<&ReleaseTag>,
    new: &BTreeMap<String, Vec<u8>>,
    accept: &[String],
) -> Result<Vec<CrdBaseline>, RelengError> {
    // Release → (tag, last-known-good of, previous for).
    let mut by_release: BTreeMap<String, (ReleaseTag, Vec<String>, Vec<String>)> = BTreeMap::new();
    for cluster in targets {
        let lkg = successes.last_known_good(cluster, |r| r == own);
        match lkg.map(|s| repo.release_tag(&s.release)).transpose()?.flatten() {
            Some(tag) => by_release
                .entry(tag.id.clone())
                .or_insert_with(|| (tag, Vec::new(), Vec::new()))
                .1
                .push(cluster.clone()),
            None => {
                if let Some(prev) = previous {
                    by_release
                        .entry(prev.id.clone())
                        .or_insert_with(|| (prev.clone(), Vec::new(), Vec::new()))
                        .2
                        .push(cluster.clone())
                }
            }
        }
    }
    let mut out = Vec::new();
    for (release, (tag, last_known_good_of, previous_for)) in by_release {
        let old = super::promote::release_files(repo, &tag)?;
        let verdict = checks::crd_compatibility(&old, new, accept);
        out.push(CrdBaseline { release, last_known_good_of, previous_for, verdict });
    }
    // Last-known-good baselines first: they are what runs.
    out.sort_by_key(|b| b.last_known_good_of.is_empty());
    Ok(out)
}
