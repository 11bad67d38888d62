//! What a rollback will do on each cluster, said before anything is written (`rollback`,
//! `rollback --dry-run`), and the releases a cluster can go back to (`rollback --list`).
//!
//! Per cluster: where it goes, why that release, whether the agent will treat the move as a
//! rollback (the target succeeded on that cluster before) or as a promotion, which CRDs of the
//! current release stay because the target's would narrow them ([`crd_compat`]: a CRD whose
//! replacement yields an incompatible finding is kept), and whether custom resources come back
//! from the agent's snapshot (taken before the current release was applied, so it matches the
//! target only when the cluster ran the target then). The last two are read from the releases'
//! manifests and the clusters' statuses: the agent decides with the live cluster.

use super::promote::release_files;
use super::repo::{FleetRepo, ReleaseTag};
use super::successes::{Success, Successes};
use super::{FleetState, RelengError};
use crate::gates::crd_compat;
use crate::manifests::crds_in_files;
use crate::model::error_chain;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A CRD of the current release the target's CRD would narrow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WiderCrd {
    pub name: String,
    /// What replacing it with the target's would break, as findings print.
    pub findings: Vec<String>,
}

/// One cluster's rollback, as the agent will see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPreview {
    pub cluster: String,
    pub wave: String,
    pub from: Option<String>,
    pub to: String,
    /// Why this release: `--to`, or when it last succeeded here (its last-known-good).
    pub why: String,
    /// When `to` last succeeded on this cluster; `None`: never, so the agent judges the move as
    /// a promotion (the CRD gate applies) rather than a rollback.
    pub succeeded_here: Option<Success>,
    /// CRDs of `from` wider than `to`'s: kept as they are on a rollback; on a promotion, what the
    /// CRD gate blocks.
    pub wider_crds: Vec<WiderCrd>,
    /// Whether the agent restores custom resources from its snapshot.
    pub restores: bool,
    /// Why it does or does not.
    pub restore: String,
}

impl ClusterPreview {
    /// The agent treats the move as a rollback.
    pub fn is_rollback(&self) -> bool {
        self.succeeded_here.is_some()
    }
}

/// The preview of moving `cluster` from `from` to `to`, `why` already decided.
pub(super) fn preview(
    repo: &FleetRepo,
    state: &FleetState,
    successes: &Successes,
    cluster: &str,
    (from, to): (Option<&str>, &str),
    why: String,
) -> Result<ClusterPreview, RelengError> {
    let succeeded_here = successes.of(cluster).into_iter().find(|s| s.release == to);
    let wider_crds = match from.map(|f| repo.release_tag(f)).transpose()?.flatten() {
        Some(current) => wider_crds(repo, &current, &known(repo, to)?)?,
        None => Vec::new(),
    };
    let from_name = from.unwrap_or("(none)");
    let (restores, restore) = match (&succeeded_here, from.map(|f| successes.ran_before(cluster, f))) {
        (None, _) => (false, format!("nothing: {to} never succeeded here, so the move is not a rollback")),
        (Some(_), None | Some(None)) => {
            (false, format!("nothing: {cluster} reported nothing on {from_name}, so it took no snapshot for it"))
        }
        (Some(_), Some(Some(None))) => {
            (false, format!("nothing: no release had succeeded here before {from_name}, so no snapshot holds {to}"))
        }
        (Some(_), Some(Some(Some(ran)))) if ran == to => (
            true,
            format!(
                "custom resources from the snapshot taken before {from_name} was applied (the cluster ran {to} then)"
            ),
        ),
        (Some(_), Some(Some(Some(ran)))) => {
            (false, format!("nothing: the snapshot taken before {from_name} holds {ran}'s objects, not {to}'s"))
        }
    };
    Ok(ClusterPreview {
        cluster: cluster.to_string(),
        wave: state.wave_of(cluster).to_string(),
        from: from.map(str::to_string),
        to: to.to_string(),
        why,
        succeeded_here,
        wider_crds,
        restores,
        restore,
    })
}

fn known(repo: &FleetRepo, id: &str) -> Result<ReleaseTag, RelengError> {
    repo.release_tag(id)?.ok_or_else(|| RelengError::UnknownRelease(id.to_string()))
}

/// The CRDs of `current` that `target`'s would narrow (or that `target` lacks), with why.
fn wider_crds(repo: &FleetRepo, current: &ReleaseTag, target: &ReleaseTag) -> Result<Vec<WiderCrd>, RelengError> {
    let (old, new) = (crds_of(repo, current)?, crds_of(repo, target)?);
    let mut by_crd: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in crd_compat::check_all(&old, &new) {
        let shown = f.to_string();
        let shown = shown.strip_prefix(&format!("{} ", f.crd)).unwrap_or(&shown).to_string();
        by_crd.entry(f.crd).or_default().push(shown);
    }
    Ok(by_crd.into_iter().map(|(name, findings)| WiderCrd { name, findings }).collect())
}

fn crds_of(repo: &FleetRepo, release: &ReleaseTag) -> Result<Vec<CustomResourceDefinition>, RelengError> {
    let files = release_files(repo, release)?;
    let crds = crds_in_files(&files).map_err(|e| {
        RelengError::Usage(format!("the CRDs of release {} cannot be read: {}", release.id, error_chain(&e)))
    })?;
    Ok(crds.into_iter().map(|c| c.crd).collect())
}

/// A release a cluster can go back to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    #[serde(flatten)]
    pub success: Success,
    /// The release Git asks the cluster to run now.
    pub desired: bool,
    /// Withdrawn by a later release (`spec.revokes`): no agent applies it again.
    pub revoked: bool,
}

/// A cluster's rollback candidates: the releases that succeeded on it, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCandidates {
    pub cluster: String,
    pub wave: String,
    pub desired: Option<String>,
    pub candidates: Vec<Candidate>,
}

/// The candidates of `clusters` (in that order), from `successes`; also where a rollback without
/// `--to` sends each ([`super::rollback`]).
pub(super) fn candidates(
    state: &FleetState,
    successes: &Successes,
    tags: &[ReleaseTag],
    clusters: &[String],
) -> Vec<ClusterCandidates> {
    let revoked: BTreeSet<&str> = tags.iter().flat_map(|t| t.release.spec.revokes.iter()).map(String::as_str).collect();
    clusters
        .iter()
        .map(|c| {
            let desired = state.effective(c).map(str::to_string);
            let candidates = successes
                .of(c)
                .into_iter()
                .map(|s| Candidate {
                    desired: desired.as_deref() == Some(s.release.as_str()),
                    revoked: revoked.contains(s.release.as_str()),
                    success: s,
                })
                .collect();
            ClusterCandidates { cluster: c.clone(), wave: state.wave_of(c).to_string(), desired, candidates }
        })
        .collect()
}

/// `rollback --list`: the candidates of `cluster` (every cluster of the fleet when `None`, in wave
/// order), as branch `base` and the local statuses say.
pub fn list(repo: &FleetRepo, base: &str, cluster: Option<&str>) -> Result<Vec<ClusterCandidates>, RelengError> {
    let tip = repo.branch_tip(base)?;
    let state = repo.fleet_state(&tip.tree()?, &format!("branch {base}"))?;
    let target = match cluster {
        Some(c) => super::Target::Cluster(c.to_string()),
        None => super::Target::Fleet,
    };
    let clusters = state.select(&target)?;
    let tags = repo.release_tags()?;
    let successes = Successes::read(repo, &state.config, &tags)?;
    Ok(candidates(&state, &successes, &tags, &clusters))
}
