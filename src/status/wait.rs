//! `fleetgate wait`: whether release REL has reached `success` on the clusters waited for, judged
//! from one reading of the fleet — the [`FleetView`] `fleetgate status` reads (branch tip, release
//! tags, verified status notes). [`waited_for`] decides once which clusters count; [`observe`]
//! turns each reading into a [`ClusterWait`] per cluster; [`verdict`] says done, failed or still
//! waiting; [`changes`] says what moved since the last reading. All pure but the first, so the
//! command only polls, prints and exits.

use super::model::State;
use super::view::FleetView;
use super::waves::members;
use crate::model::{FleetConfig, MAX_YAML_BYTES, ParseError, RELEASE_FILE, RepoTree, SelectError, Target, TreeError};
use crate::source::{Checkout, SourceError};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error(
        "no release tag {0} (a tag on a commit with release.yaml); check the id with `fleetgate status`, or push the tag first"
    )]
    UnknownRelease(String),
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error(
        "release {release} does not target {} (its targetClusters are [{}]), so it never runs there; wait for clusters it targets",
        clusters.join(", "),
        targets.join(", ")
    )]
    NotTargeted { release: String, clusters: Vec<String>, targets: Vec<String> },
    #[error("reading release {release}")]
    Source { release: String, source: SourceError },
    #[error("reading release {release}")]
    Tree { release: String, source: TreeError },
    #[error("release {release}'s release.yaml")]
    Release { release: String, source: ParseError },
}

/// Where one cluster stands on the release waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Standing {
    /// No status on the release yet.
    NotStarted,
    Pending,
    Success,
    Failure,
    Error,
    /// Its agent reported failure and went back to an earlier release.
    RolledBack,
    /// It started the release, and Git now asks it for another (a rollback or revert in Git).
    MovedAway,
}

impl Standing {
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::NotStarted => "not started",
            Standing::Pending => "pending",
            Standing::Success => "success",
            Standing::Failure => "failure",
            Standing::Error => "error",
            Standing::RolledBack => "rolled back",
            Standing::MovedAway => "moved away",
        }
    }

    /// The release will not reach `success` here without a new decision in Git.
    fn is_failed(self) -> bool {
        matches!(self, Standing::Failure | Standing::Error | Standing::RolledBack | Standing::MovedAway)
    }
}

/// One cluster waited for, as the latest reading shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterWait {
    pub cluster: String,
    pub wave: String,
    pub state: Standing,
    /// What Git asks the cluster to run now.
    pub desired: Option<String>,
    /// What it runs by its own word ([`super::StatusSet::running`], as `fleetgate status` shows
    /// it): after a rollback, the release it went back to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<String>,
    /// The description of its latest status on the release.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Where its agent rolled back to, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_back_to: Option<String>,
}

/// How a wait ends, or that it goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Every cluster reports `success`.
    Succeeded,
    /// Some cluster will not get there (failure, error, rolled back, moved away).
    Failed,
    Waiting,
}

/// The clusters `target` names that release `id` targets (its `targetClusters`, from the tag's
/// own `release.yaml`). Naming only clusters it does not target is an error: they never run it.
pub fn waited_for(
    checkout: &Checkout,
    config: &FleetConfig,
    id: &str,
    target: &Target,
) -> Result<Vec<String>, WaitError> {
    let source = |source| WaitError::Source { release: id.to_string(), source };
    let tag = checkout.release_tags().map_err(source)?.into_iter().find(|t| t.name == id);
    let tag = tag.ok_or_else(|| WaitError::UnknownRelease(id.to_string()))?;
    let tree = |source| WaitError::Tree { release: id.to_string(), source };
    let text = checkout.tag_tree(&tag).map_err(source)?.read_text(RELEASE_FILE, MAX_YAML_BYTES).map_err(tree)?;
    let release = crate::model::parse_release(RELEASE_FILE, &text.unwrap_or_default(), None)
        .map_err(|source| WaitError::Release { release: id.to_string(), source })?;
    let targets = &release.spec.target_clusters;
    let selected = config.select(target)?;
    let (waited, untargeted): (Vec<String>, Vec<String>) = selected.into_iter().partition(|c| targets.contains(c));
    // The fleet means the clusters the release targets; a cluster or wave named outright must be.
    if waited.is_empty() || (*target != Target::Fleet && !untargeted.is_empty()) {
        return Err(WaitError::NotTargeted { release: id.to_string(), clusters: untargeted, targets: targets.clone() });
    }
    Ok(waited)
}

/// Where each of `clusters` stands on `release` in `view`.
pub fn observe(view: &FleetView, release: &str, clusters: &[String]) -> Vec<ClusterWait> {
    let members = members(&view.config);
    clusters
        .iter()
        .map(|c| {
            let member = members.iter().find(|m| &m.name == c);
            let desired = member.and_then(|m| m.desired_release.clone());
            let latest = view.statuses.latest(c, release);
            let state = match latest {
                None => Standing::NotStarted,
                Some(s) => match s.state {
                    State::Success => Standing::Success,
                    State::Failure if s.rollback_to.is_some() => Standing::RolledBack,
                    State::Failure => Standing::Failure,
                    State::Error => Standing::Error,
                    State::Pending | State::Unknown if desired.as_deref() != Some(release) => Standing::MovedAway,
                    State::Pending | State::Unknown => Standing::Pending,
                },
            };
            ClusterWait {
                cluster: c.clone(),
                wave: member.map(|m| m.wave.clone()).unwrap_or_default(),
                state,
                desired,
                running: view.statuses.running(c).map(str::to_string),
                description: latest.map(|s| s.description.clone()),
                rolled_back_to: latest.and_then(|s| s.rollback_to.clone()),
            }
        })
        .collect()
}

/// Failed as soon as one cluster cannot get there; succeeded when every one reports `success`.
pub fn verdict(clusters: &[ClusterWait]) -> Verdict {
    if clusters.iter().any(|c| c.state.is_failed()) {
        Verdict::Failed
    } else if clusters.iter().all(|c| c.state == Standing::Success) {
        Verdict::Succeeded
    } else {
        Verdict::Waiting
    }
}

/// One line per cluster whose standing changed since `before` (every cluster on the first
/// reading): `cluster-a: pending → success`, with the status's description when it failed.
pub fn changes(before: Option<&[ClusterWait]>, now: &[ClusterWait]) -> Vec<String> {
    now.iter()
        .filter_map(|c| {
            let was = before.and_then(|b| b.iter().find(|p| p.cluster == c.cluster)).map(|p| p.state);
            let moved = match was {
                Some(was) if was == c.state => return None,
                Some(was) => format!("{}: {} → {}", c.cluster, was.as_str(), c.state.as_str()),
                None => format!("{}: {}", c.cluster, c.state.as_str()),
            };
            let detail = match (c.state, &c.description, &c.desired) {
                (Standing::MovedAway, _, Some(d)) => Some(format!("Git asks for {d} now")),
                (s, Some(d), _) if s.is_failed() => Some(d.clone()),
                _ => None,
            };
            Some(match detail {
                Some(d) => format!("{moved} ({d})"),
                None => moved,
            })
        })
        .collect()
}

/// The clusters still waited for, as `cluster-b (pending), cluster-c (not started)`.
pub fn still_waiting(clusters: &[ClusterWait]) -> String {
    clusters
        .iter()
        .filter(|c| c.state != Standing::Success)
        .map(|c| format!("{} ({})", c.cluster, c.state.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(cluster: &str, state: Standing) -> ClusterWait {
        ClusterWait {
            cluster: cluster.into(),
            wave: "prod".into(),
            state,
            desired: Some("rel-2".into()),
            running: Some("rel-1".into()),
            description: Some("baking".into()),
            rolled_back_to: None,
        }
    }

    #[rstest::rstest]
    #[case(&[Standing::Success, Standing::Success], Verdict::Succeeded)]
    #[case(&[Standing::Success, Standing::Pending], Verdict::Waiting)]
    #[case(&[Standing::NotStarted, Standing::Pending], Verdict::Waiting)]
    #[case(&[Standing::Pending, Standing::Failure], Verdict::Failed)]
    #[case(&[Standing::Success, Standing::Error], Verdict::Failed)]
    #[case(&[Standing::Success, Standing::RolledBack], Verdict::Failed)]
    #[case(&[Standing::NotStarted, Standing::MovedAway], Verdict::Failed)]
    fn a_wait_ends_when_all_succeed_or_one_cannot(#[case] states: &[Standing], #[case] expected: Verdict) {
        let clusters: Vec<ClusterWait> =
            states.iter().enumerate().map(|(i, s)| at(&format!("cluster-{i}"), *s)).collect();
        assert_eq!(verdict(&clusters), expected);
    }

    #[test]
    fn changes_name_every_cluster_first_then_only_what_moved() {
        let first = [at("cluster-a", Standing::Pending), at("cluster-b", Standing::NotStarted)];
        assert_eq!(changes(None, &first), ["cluster-a: pending", "cluster-b: not started"]);
        let mut failed = at("cluster-b", Standing::RolledBack);
        failed.description = Some("rolled back to rel-1: error-rate 7.3 % > 5 %".into());
        let second = [at("cluster-a", Standing::Success), failed];
        assert_eq!(
            changes(Some(&first), &second),
            [
                "cluster-a: pending → success",
                "cluster-b: not started → rolled back (rolled back to rel-1: error-rate 7.3 % > 5 %)"
            ]
        );
        assert!(changes(Some(&second), &second).is_empty());
        assert_eq!(still_waiting(&first), "cluster-a (pending), cluster-b (not started)");
    }
}
