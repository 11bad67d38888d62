//! `promote`: a new branch whose one commit moves a cluster, a wave or the whole fleet to a
//! release — after checking that the release tag is signed by a trusted key, that the release
//! targets those clusters, and that it has not failed on an earlier wave (statuses from Git notes).
//! `--force` turns each refusal into a recorded override.
//!
//! What "moving" means is [`FleetState::plan`]: a cluster or wave gets pins where needed (or loses
//! a pin when the fleet already says the release); the fleet gets `fleet.yaml` `spec.release` and
//! every cluster pin is dropped, because a promotion of the fleet means every cluster runs it.

use super::checks::{self, CrdVerdict};
use super::create::mapping_lines;
use super::repo::{FleetRepo, ReleaseTag, TreeEdit};
use super::sign::Signer;
use super::{DesiredChange, FleetState, Refusal, RelengError, Target, check_release_id};
use crate::model::ReleaseSpec;
use crate::release::Keyring;
use crate::status::{self, State, StatusSet};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// What to promote where.
#[derive(Debug, Clone)]
pub struct PromoteRequest {
    pub id: String,
    pub target: Target,
    /// The branch the promotion will be merged into (normally `main`).
    pub base: String,
    /// Default: `promote/<id>-<target>`.
    pub branch: Option<String>,
    /// Go on despite refusals; each overridden refusal is recorded in the report and commit.
    pub force: bool,
}

/// One cluster's move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterMove {
    pub cluster: String,
    pub wave: String,
    pub from: Option<String>,
    pub to: String,
}

impl ClusterMove {
    /// The release the cluster ran before, `(none)` when it ran none.
    pub fn from_or_none(&self) -> &str {
        self.from.as_deref().unwrap_or("(none)")
    }
}

/// The clusters `change` moves (in wave order), each with its release before and after.
pub(super) fn moves(state: &FleetState, change: &DesiredChange) -> Result<Vec<ClusterMove>, RelengError> {
    moves_between(state, &state.assignments(), &state.assignments_after(change))
}

/// The clusters of `state` whose desired release differs between `before` and `after`
/// ([`FleetState::assignments`] of two commits, or of one and a change), in `state`'s wave order.
/// A cluster `before` does not know moves from nothing.
pub(super) fn moves_between(
    state: &FleetState,
    before: &BTreeMap<String, Option<String>>,
    after: &BTreeMap<String, Option<String>>,
) -> Result<Vec<ClusterMove>, RelengError> {
    let was = |c: &str| before.get(c).cloned().flatten();
    let is = |c: &str| after.get(c).cloned().flatten();
    Ok(state
        .select(&Target::Fleet)?
        .into_iter()
        .filter(|c| was(c) != is(c))
        .map(|c| ClusterMove {
            wave: state.wave_of(&c).to_string(),
            from: was(&c),
            to: is(&c).unwrap_or_default(),
            cluster: c,
        })
        .collect())
}

/// The moves as a Markdown table, for pull request bodies.
pub(super) fn moves_table(moves: &[ClusterMove]) -> String {
    let mut t = "| cluster | wave | from | to |\n|---|---|---|---|\n".to_string();
    for m in moves {
        t.push_str(&format!("| {} | {} | {} | {} |\n", m.cluster, m.wave, m.from_or_none(), m.to));
    }
    t
}

/// The moves as commit message lines: `  cluster-a (wave canary): rel-1 -> rel-2`.
pub(super) fn moves_lines(moves: &[ClusterMove]) -> String {
    moves.iter().map(|m| format!("  {} (wave {}): {} -> {}\n", m.cluster, m.wave, m.from_or_none(), m.to)).collect()
}

/// The latest status of a cluster of an earlier wave for the release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaveStatus {
    pub wave: String,
    pub cluster: String,
    /// `None`: the cluster has not reported on this release.
    pub state: Option<State>,
    pub description: String,
}

/// A wave the promotion moves clusters of: who is in it (as computed from `spec.wave`, selectors
/// and percentages), how it is paced, and why it would wait once the promotion is merged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WavePlan {
    pub wave: String,
    /// [`crate::model::Wave::summary`]; None for a plain wave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<String>,
    /// Every cluster of the wave, moved or not.
    pub clusters: Vec<String>,
    /// Why the wave's first moved cluster could not start now (an earlier wave, a soak, a
    /// window, maxUnavailable); None when it could.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waits: Option<String>,
}

/// The waves `moves` touch, in rollout order, judged as if the promotion were merged now.
fn wave_plans(state: &FleetState, moves: &[ClusterMove], statuses: &StatusSet) -> Vec<WavePlan> {
    let mut members = status::members(&state.config);
    for m in &mut members {
        if let Some(mv) = moves.iter().find(|mv| mv.cluster == m.name) {
            m.desired_release = Some(mv.to.clone());
        }
    }
    let fleet = &state.config.fleet;
    let now = chrono::Utc::now();
    fleet
        .spec
        .waves
        .iter()
        .filter_map(|w| {
            let first = moves.iter().find(|m| m.wave == w.name)?;
            let decision =
                status::may_start(fleet, &members, statuses, &first.cluster, &first.to, now, status::Move::Forward);
            Some(WavePlan {
                wave: w.name.clone(),
                settings: w.summary(),
                clusters: state.config.clusters_in_wave(&w.name).iter().map(|c| c.name().to_string()).collect(),
                waits: (!decision.allowed).then_some(decision.reason),
            })
        })
        .collect()
}

/// CRD compatibility of the release against what the moving clusters run now.
#[derive(Debug, Clone, Serialize)]
pub struct CrdCheck {
    /// The release the clusters move from (`None`: they run nothing yet).
    pub from: Option<String>,
    pub verdict: CrdVerdict,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromoteOutcome {
    /// The branch and its commit were created.
    Prepared,
    /// The branch already holds exactly this promotion.
    AlreadyPrepared,
    /// Every cluster already runs the release on the base branch; nothing to do.
    AlreadyPromoted,
}

/// What `promote` did and everything a reviewer needs to judge it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PromoteReport {
    pub outcome: PromoteOutcome,
    pub id: String,
    pub target: Target,
    pub base: String,
    pub branch: String,
    /// The promotion commit (None when already promoted).
    pub commit: Option<String>,
    pub clusters: Vec<ClusterMove>,
    pub release_commit: String,
    pub mapping: ReleaseSpec,
    /// Fingerprint of the key that signed the tag (None when not checked under `--force`).
    pub signer: Option<String>,
    pub crd_compatibility: Vec<CrdCheck>,
    pub earlier_waves: Vec<WaveStatus>,
    /// The waves the promotion moves clusters of.
    pub waves: Vec<WavePlan>,
    /// Refusals `--force` overrode.
    pub overridden: Vec<Refusal>,
}

impl PromoteReport {
    /// The pull/merge request title.
    pub fn title(&self) -> String {
        format!("Promote {} to {}", self.id, self.target)
    }

    /// A Markdown body: the moves, the mapping, the CRD verdict, earlier waves' statuses.
    pub fn pr_body(&self) -> String {
        let mut b = format!(
            "Promotes release `{}` to {} (branch `{}` into `{}`).\n\n",
            self.id, self.target, self.branch, self.base
        );
        b.push_str("### Clusters\n\n");
        b.push_str(&moves_table(&self.clusters));
        b.push_str(&format!("\n### Release `{}`\n\n```\n{}\n```\n", self.id, mapping_lines(&self.mapping).join("\n")));
        match &self.signer {
            Some(s) => b.push_str(&format!(
                "Tag `{}` on commit `{}`, signed by trusted key `{s}`.\n",
                self.id, self.release_commit
            )),
            None => b.push_str(&format!(
                "Tag `{}` on commit `{}`; **signature not checked** (`--force`).\n",
                self.id, self.release_commit
            )),
        }
        b.push_str("\n### CRD compatibility\n\n");
        for c in &self.crd_compatibility {
            let from = c.from.as_deref().unwrap_or("(nothing installed)");
            b.push_str(&format!("- from `{from}`: **{}**\n", c.verdict.summary()));
            for f in &c.verdict.findings {
                b.push_str(&format!("  - {f}\n"));
            }
        }
        b.push_str("\n### Waves\n\n| wave | settings | clusters | once merged |\n|---|---|---|---|\n");
        for w in &self.waves {
            b.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                w.wave,
                w.settings.as_deref().unwrap_or("—"),
                w.clusters.join(", "),
                w.waits.as_deref().map_or("may start".to_string(), |why| format!("waits: {}", why.replace('|', "\\|")))
            ));
        }
        b.push_str("\n### Earlier waves\n\n");
        if self.earlier_waves.is_empty() {
            b.push_str("None: this is the first wave.\n");
        } else {
            b.push_str("| wave | cluster | status | description |\n|---|---|---|---|\n");
            for w in &self.earlier_waves {
                let state = w.state.map(|s| s.to_string()).unwrap_or_else(|| "no status".into());
                b.push_str(&format!(
                    "| {} | {} | {state} | {} |\n",
                    w.wave,
                    w.cluster,
                    w.description.replace('|', "\\|")
                ));
            }
        }
        if !self.overridden.is_empty() {
            b.push_str("\n### ⚠ Overridden with `--force`\n\n");
            for r in &self.overridden {
                b.push_str(&format!("- {}\n", r.to_string().replace('\n', " ")));
            }
        }
        b.push_str(
            "\nMerging this PR is the promotion; each cluster's agent reports its status on the release commit.\n",
        );
        b
    }
}

/// Default branch name: `promote/<id>-<target slug>`.
pub fn default_branch(id: &str, target: &Target) -> String {
    format!("promote/{id}-{}", target.slug())
}

/// Prepares the promotion of `req.id` to `req.target` as a commit on a new branch off `req.base`.
/// `trusted` verifies the tag's signature (None is allowed only with `force`); `signer` signs the
/// commit when given. Statuses are read from the local notes refs (fetch them first).
///
/// Refusals (unless `force`): unsigned or untrusted tag, clusters the release does not target, a
/// failure of the release on an earlier wave, an existing branch with other content.
pub fn promote(
    repo: &FleetRepo,
    req: &PromoteRequest,
    trusted: Option<&Keyring>,
    signer: Option<&mut Signer>,
) -> Result<PromoteReport, RelengError> {
    check_release_id(&req.id)?;
    let tag = repo.release_tag(&req.id)?.ok_or_else(|| RelengError::UnknownRelease(req.id.clone()))?;
    let base = repo.branch_tip(&req.base)?;
    let state = repo.fleet_state(&base.tree()?, &format!("branch {}", req.base))?;
    let selected = state.select(&req.target)?;
    let mut overridden = Vec::new();
    let mut refuse = |r: Refusal| -> Result<(), RelengError> {
        if req.force {
            overridden.push(r);
            Ok(())
        } else {
            Err(r.into())
        }
    };

    // 1. Signed by a trusted key: the agent's verification, for a cluster the release targets.
    let targets: BTreeSet<&str> = tag.release.spec.target_clusters.iter().map(String::as_str).collect();
    let probe = selected
        .iter()
        .map(String::as_str)
        .chain(tag.release.spec.target_clusters.iter().map(String::as_str))
        .find(|c| targets.contains(c) && state.config.cluster(c).is_some());
    let signer_fpr = match (trusted, probe) {
        (Some(trust), Some(cluster)) => match checks::verify_release(repo, &req.base, &req.id, cluster, trust) {
            Ok(fpr) => Some(fpr),
            Err(RelengError::Refused(r @ Refusal::Unsigned { .. })) => {
                refuse(r)?;
                None
            }
            Err(e) => return Err(e),
        },
        (Some(_), None) => {
            refuse(Refusal::Unsigned {
                id: req.id.clone(),
                reason: "it targets no cluster of this fleet, so no agent could verify it".into(),
            })?;
            None
        }
        (None, _) if req.force => None,
        (None, _) => {
            return Err(RelengError::Usage(
                "pass --trusted-keys FILE (the armored public keys your agents trust) so the release's signature can be checked"
                    .into(),
            ));
        }
    };

    // 2. Targets those clusters.
    let missing: Vec<String> = selected.iter().filter(|c| !targets.contains(c.as_str())).cloned().collect();
    if !missing.is_empty() {
        refuse(Refusal::NotTargeted {
            id: req.id.clone(),
            clusters: missing,
            targets: tag.release.spec.target_clusters.clone(),
        })?;
    }

    // 3. Not failed on an earlier wave.
    let keys = status::StatusKeys::registered(&state.config);
    let statuses = status::read_all(repo.git(), &[tag.commit], &keys).map_err(RelengError::StatusRead)?;
    let earlier_waves = earlier_wave_statuses(&state, &req.target, &selected, &statuses, &req.id);
    let failures: Vec<String> = earlier_waves
        .iter()
        .filter(|w| w.state == Some(State::Failure))
        .map(|w| format!("{} (wave {}): {}", w.cluster, w.wave, w.description))
        .collect();
    if !failures.is_empty() {
        refuse(Refusal::FailedEarlierWave { id: req.id.clone(), failures })?;
    }

    // The change.
    let want: BTreeMap<String, String> = selected.iter().map(|c| (c.clone(), req.id.clone())).collect();
    let fleet_wide = matches!(req.target, Target::Fleet).then_some(req.id.as_str());
    let change = state.plan(&want, fleet_wide);
    let clusters = moves(&state, &change)?;
    let waves = wave_plans(&state, &clusters, &statuses);
    let crd_compatibility = crd_checks(repo, &tag, &clusters)?;
    let branch = req.branch.clone().unwrap_or_else(|| default_branch(&req.id, &req.target));
    let mut report = PromoteReport {
        outcome: PromoteOutcome::AlreadyPromoted,
        id: req.id.clone(),
        target: req.target.clone(),
        base: req.base.clone(),
        branch,
        commit: None,
        clusters,
        release_commit: tag.commit.to_string(),
        mapping: tag.release.spec.clone(),
        signer: signer_fpr,
        crd_compatibility,
        earlier_waves,
        waves,
        overridden,
    };
    if change.is_empty() {
        return Ok(report);
    }

    let mut edit = TreeEdit::new(repo.git(), Some(&base.tree()?))?;
    for (path, text) in state.render(&change)? {
        edit.put(&path, text.as_bytes(), false)?;
    }
    let tree = edit.write()?;

    if let Some(existing) = repo.branch_oid(&report.branch) {
        let c = repo.git().find_commit(existing)?;
        if c.tree_id() == tree && c.parent_id(0).ok() == Some(base.id()) {
            report.outcome = PromoteOutcome::AlreadyPrepared;
            report.commit = Some(existing.to_string());
            return Ok(report);
        }
        return Err(Refusal::BranchExists { branch: report.branch.clone() }.into());
    }
    let who = repo.identity(signer.as_deref())?;
    let commit = repo.commit(signer, &who, &commit_message(&report), tree, &[&base])?;
    repo.set_branch(&report.branch, commit, None, &format!("fleetgate promote {} to {}", req.id, req.target))?;
    report.outcome = PromoteOutcome::Prepared;
    report.commit = Some(commit.to_string());
    Ok(report)
}

/// Latest statuses of the release on clusters of waves before the promoted ones (every wave for
/// the fleet), in wave order.
fn earlier_wave_statuses(
    state: &FleetState,
    target: &Target,
    selected: &[String],
    statuses: &StatusSet,
    id: &str,
) -> Vec<WaveStatus> {
    let first = match target {
        Target::Fleet => usize::MAX,
        _ => selected.iter().map(|c| state.cluster_wave_index(c)).min().unwrap_or(0),
    };
    let all = state.select(&Target::Fleet).unwrap_or_default();
    all.into_iter()
        .filter(|c| state.cluster_wave_index(c) < first)
        .map(|c| {
            let latest = statuses.latest(&c, id);
            WaveStatus {
                wave: state.wave_of(&c).to_string(),
                state: latest.map(|s| s.state),
                description: latest.map(|s| s.description.clone()).unwrap_or_default(),
                cluster: c,
            }
        })
        .collect()
}

/// One verdict per release the moving clusters leave.
fn crd_checks(repo: &FleetRepo, tag: &ReleaseTag, moves: &[ClusterMove]) -> Result<Vec<CrdCheck>, RelengError> {
    let froms: BTreeSet<Option<String>> = moves.iter().map(|m| m.from.clone()).collect();
    let new = release_files(repo, tag)?;
    let mut out = Vec::new();
    for from in froms {
        let verdict = match from.as_deref().map(|f| repo.release_tag(f)).transpose()?.flatten() {
            Some(old) => {
                checks::crd_compatibility(&release_files(repo, &old)?, &new, &tag.release.spec.accept_crd_changes)
            }
            None => CrdVerdict::first_release(),
        };
        out.push(CrdCheck { from, verdict });
    }
    Ok(out)
}

/// The manifest files of a release, from its tag's tree.
pub(super) fn release_files(repo: &FleetRepo, tag: &ReleaseTag) -> Result<BTreeMap<String, Vec<u8>>, RelengError> {
    let tree = repo.git().find_commit(tag.commit)?.tree()?;
    repo.files_under(&tree, &tag.release.spec.manifests)
}

fn commit_message(r: &PromoteReport) -> String {
    let mut m = format!("promote {} to {}\n\nClusters:\n", r.id, r.target);
    m.push_str(&moves_lines(&r.clusters));
    m.push_str(&format!("\nRelease {} (commit {}):\n", r.id, r.release_commit));
    for l in mapping_lines(&r.mapping) {
        m.push_str(&format!("  {l}\n"));
    }
    for o in &r.overridden {
        m.push_str(&format!("\nForced past: {}\n", o.to_string().replace('\n', " ")));
    }
    m.push_str(&format!("\nFleetgate-Promote: {}\nFleetgate-Target: {}\n", r.id, r.target));
    m
}
