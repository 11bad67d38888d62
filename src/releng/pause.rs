//! `fleetgate pause` and `fleetgate resume`: the fleet's emergency brake as a commit. Pausing sets
//! `spec.paused: true` in `fleet.yaml` (the whole fleet) or in each selected `clusters/<name>.yaml`;
//! resuming removes it. Agents hold a paused cluster on the release it runs (no new release, no
//! drift correction; an operation in flight finishes) and say so in a `pending` status.
//!
//! The commit goes on the base branch, or on a new branch for a pull request, exactly as a
//! rollback's does ([`super::publish::pause_and_publish`] pushes it and opens the request).

use super::repo::TreeEdit;
use super::{FleetRepo, RelengError, Signer, Target};
use serde::Serialize;

/// The trailer that marks a pause or resume commit in the history.
const PAUSE_TRAILER: &str = "Fleetgate-Pause:";

#[derive(Debug, Clone)]
pub struct PauseRequest {
    pub target: Target,
    /// `true` pauses, `false` resumes.
    pub paused: bool,
    pub reason: Option<String>,
    /// The branch agents follow (normally `main`).
    pub base: String,
    /// Commit on this new branch (for a pull request) instead of on `base` directly.
    pub branch: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseReport {
    pub target: Target,
    pub paused: bool,
    pub base: String,
    /// Where the commit went: `base` itself, or a new branch.
    pub branch: String,
    /// `None` when the target already was as asked (nothing written).
    pub commit: Option<String>,
    /// The files the commit changed.
    pub files: Vec<String>,
    pub reason: Option<String>,
    /// Clusters a resume leaves paused because another setting still pauses them
    /// (`fleet.yaml` for a cluster, a cluster's own file for the fleet), with that setting.
    pub still_paused: Vec<(String, String)>,
}

impl PauseReport {
    pub fn verb(&self) -> &'static str {
        if self.paused { "Pause" } else { "Resume" }
    }

    pub fn title(&self) -> String {
        format!("{} {}", self.verb(), self.target)
    }

    /// A Markdown body for the pull/merge request.
    pub fn pr_body(&self) -> String {
        let mut b = if self.paused {
            format!(
                "Pauses {}: its agents start no release and correct no drift until it is resumed; an operation in flight finishes.\n",
                self.target
            )
        } else {
            format!("Resumes {}: its agents follow Git again.\n", self.target)
        };
        b.push_str(&format!(
            "\nFiles: {}\n",
            self.files.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ")
        ));
        if let Some(r) = &self.reason {
            b.push_str(&format!("\n**Reason:** {r}\n"));
        }
        b
    }
}

/// Writes the pause (or resume) of `req.target`; `signer` signs the commit when given. A target
/// that already is as asked writes nothing (`commit: None`).
pub fn set_paused(
    repo: &FleetRepo,
    req: &PauseRequest,
    signer: Option<&mut Signer>,
) -> Result<PauseReport, RelengError> {
    let tip = repo.branch_tip(&req.base)?;
    let state = repo.fleet_state(&tip.tree()?, &format!("branch {}", req.base))?;
    let clusters = match &req.target {
        Target::Fleet => Vec::new(),
        other => state.select(other)?,
    };
    let files = state.render_paused(&clusters, req.paused)?;
    let still_paused = if req.paused {
        Vec::new()
    } else {
        let resumed: Vec<String> =
            if clusters.is_empty() { state.config.clusters.keys().cloned().collect() } else { clusters.clone() };
        resumed
            .into_iter()
            .filter_map(|c| {
                let by = match (&req.target, state.config.paused(&c)?) {
                    (Target::Fleet, crate::model::PausedBy::Fleet) => return None,
                    (Target::Fleet, by) => by,
                    (_, crate::model::PausedBy::Cluster) => return None,
                    (_, by) => by,
                };
                Some((c.clone(), by.setting(&c)))
            })
            .collect()
    };
    let mut report = PauseReport {
        target: req.target.clone(),
        paused: req.paused,
        base: req.base.clone(),
        branch: req.branch.clone().unwrap_or_else(|| req.base.clone()),
        commit: None,
        files: files.keys().cloned().collect(),
        reason: req.reason.clone(),
        still_paused,
    };
    if files.is_empty() {
        return Ok(report);
    }
    let mut edit = TreeEdit::new(repo.git(), Some(&tip.tree()?))?;
    for (path, text) in &files {
        edit.put(path, text.as_bytes(), false)?;
    }
    let tree = edit.write()?;
    let message = format!(
        "{} {}\n\nReason: {}\n\n{PAUSE_TRAILER} {}\n",
        report.verb().to_lowercase(),
        req.target,
        req.reason.as_deref().unwrap_or("(none given)"),
        if req.paused { "on" } else { "off" }
    );
    let log = format!("fleetgate {} {}", report.verb().to_lowercase(), req.target);
    let commit = repo.commit_change(signer, &tip, (&req.base, req.branch.as_deref()), &message, tree, &log)?;
    report.commit = Some(commit.to_string());
    Ok(report)
}
