//! `rollback`: a commit that puts clusters back on the release they last ran successfully (or `--to`).
//!
//! Each cluster goes back to its own last-known-good release: the newest release its verified
//! statuses say succeeded on it, other than the one Git asks it to run now and other than revoked
//! releases ([`super::successes`], the candidates of `rollback --list`). Clusters of one fleet often
//! ran different histories — a canary ran a release that never reached the later waves — so one
//! "previous release" for everybody would send some clusters to a release they never ran, which
//! their agents judge as a promotion, not a rollback. A cluster with no such release is left alone
//! and reported ([`LeftAlone`], with the `--to` that moves it anyway); when every selected cluster
//! is left alone, the rollback is refused.
//!
//! The base branch's first-parent history still decides two things: the commit that last changed a
//! cluster's desired release, and whether the rollback can be a real `git revert` of it. When that
//! one commit changed exactly the clusters being rolled back and reverting it gives exactly the
//! wanted configuration, the rollback is a `git revert` (git2 `revert_commit`, mainline 1 for a
//! merged PR); otherwise it is an explicit change of `spec.release` (a fleet-wide `fleet.yaml`
//! when the whole fleet goes to one release, else a pin per cluster). Either way the message says
//! from what to what and why.
//!
//! A cluster whose last change was itself a rollback is left alone: "back" would then mean
//! forward to the release that was just abandoned. `--to` names a release explicitly instead.
//!
//! An agent's write-back commit (its trailers, [`WriteBack`]) is such a rollback, already done by
//! the agent: the reason names the failed release, the reason and the gate figure it recorded.
//! A `git revert` of a write-back asks the cluster to run the failed release again, so it counts as
//! a promotion, and rolling it back reverts the revert.
//!
//! Every report carries the per-cluster preview ([`super::rollback_preview`]); `dry_run` computes
//! it and writes nothing. A fleet-wide rollback is immediate (every cluster at once: the agents'
//! wave gate never holds a move back to a release the earlier waves ran successfully). `staged`
//! paces it like a promotion instead: only the first wave (in `spec.waves` order) that needs it
//! is rolled back now, and the report lists the commands that roll back each later wave, to run
//! once the waves before report `success` ([`LaterStep`]).

use super::promote::{ClusterMove, moves, moves_lines, moves_table};
use super::repo::{FleetRepo, TreeEdit};
use super::rollback_preview::{self, ClusterCandidates, ClusterPreview};
use super::sign::Signer;
use super::successes::Successes;
use super::{DesiredChange, FleetState, Refusal, RelengError, Target};
use crate::model::FleetConfig;
use crate::release::WriteBack;
use crate::source::GitTree;
use git2::{Commit, Oid};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The trailer fleetgate writes into rollback commits; a revert by hand says "This reverts commit".
const ROLLBACK_TRAILER: &str = "Fleetgate-Rollback:";
/// How far back the history walk for previous releases goes.
const MAX_HISTORY: usize = 2000;

#[derive(Debug, Clone)]
pub struct RollbackRequest {
    pub target: Target,
    /// The release to go back to; default: each cluster's last-known-good one.
    pub to: Option<String>,
    pub reason: Option<String>,
    /// The branch that says what runs (normally `main`).
    pub base: String,
    /// Commit on this new branch (for a pull request) instead of on `base` directly.
    pub branch: Option<String>,
    /// Fleet only: roll back the first wave that needs it; the report lists the later steps.
    pub staged: bool,
    /// Compute and report; write nothing.
    pub dry_run: bool,
}

/// A later wave of a staged rollback: the command that rolls it back (the arguments after
/// `fleetgate`), to run once the waves before it report `success` for their targets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaterStep {
    pub wave: String,
    pub clusters: Vec<ClusterMove>,
    pub args: Vec<String>,
}

/// A selected cluster the rollback does not move, and why (what to do about it included).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeftAlone {
    pub cluster: String,
    pub wave: String,
    /// The release Git asks it to run, which it keeps.
    pub current: Option<String>,
    pub why: String,
}

impl LeftAlone {
    /// `cluster-c (wave prod) stays on rel-3: why`.
    pub fn line(&self) -> String {
        format!(
            "{} (wave {}) stays on {}: {}",
            self.cluster,
            self.wave,
            self.current.as_deref().unwrap_or("(none)"),
            self.why
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RollbackMethod {
    /// `git revert` of the promotion commit.
    Revert,
    /// An explicit edit of `spec.release`.
    Explicit,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackReport {
    pub target: Target,
    pub method: RollbackMethod,
    /// The promotion commit that was reverted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reverted: Option<String>,
    pub base: String,
    /// Where the commit went: `base` itself, or a new branch.
    pub branch: String,
    /// Empty on a dry run.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub commit: String,
    pub clusters: Vec<ClusterMove>,
    /// What each moved cluster's agent will do.
    pub preview: Vec<ClusterPreview>,
    /// Selected clusters that stay where they are (no earlier success, already rolled back).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_alone: Vec<LeftAlone>,
    /// A staged rollback's later waves.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub later: Vec<LaterStep>,
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

impl RollbackReport {
    pub fn title(&self) -> String {
        format!("Roll back {}: {}", self.target, summary(&self.clusters))
    }

    /// A Markdown body for the pull/merge request.
    pub fn pr_body(&self) -> String {
        let mut b = format!("Rolls back {} (branch `{}` into `{}`).\n\n", self.target, self.branch, self.base);
        b.push_str(&moves_table(&self.clusters));
        for l in &self.left_alone {
            b.push_str(&format!("\n**Left alone:** {}\n", l.line()));
        }
        if let Some(r) = &self.reason {
            b.push_str(&format!("\n**Reason:** {r}\n"));
        }
        match (&self.method, &self.reverted) {
            (RollbackMethod::Revert, Some(c)) => b.push_str(&format!("\nThis reverts the promotion commit `{c}`.\n")),
            _ => b.push_str("\nAn explicit change of `spec.release` (no single promotion commit to revert).\n"),
        }
        b
    }
}

/// `rel-2 -> rel-1` when every cluster moves the same way, else `3 clusters`.
fn summary(moves: &[ClusterMove]) -> String {
    let pairs: BTreeSet<(Option<&str>, &str)> = moves.iter().map(|m| (m.from.as_deref(), m.to.as_str())).collect();
    match pairs.iter().next() {
        Some((from, to)) if pairs.len() == 1 => format!("{} -> {to}", from.unwrap_or("(none)")),
        _ => format!("{} clusters", moves.len()),
    }
}

/// One step of the base branch's first-parent history that changed desired releases.
struct Change {
    commit: Oid,
    message: String,
    /// A `git revert` of an agent's write-back: it asks for the failed release again (a promotion).
    reverts_write_back: bool,
    before: BTreeMap<String, Option<String>>,
    after: BTreeMap<String, Option<String>>,
}

impl Change {
    fn new(
        repo: &FleetRepo,
        commit: &Commit<'_>,
        before: BTreeMap<String, Option<String>>,
        after: BTreeMap<String, Option<String>>,
    ) -> Change {
        let message = commit.message().unwrap_or_default().to_string();
        let reverts_write_back = reverted(&message)
            .and_then(|oid| repo.git().find_commit(oid).ok())
            .is_some_and(|c| WriteBack::parse(c.message().unwrap_or_default()).is_some());
        Change { commit: commit.id(), message, reverts_write_back, before, after }
    }

    fn changed(&self) -> BTreeSet<String> {
        self.after.iter().filter(|(c, r)| self.before.get(*c) != Some(r)).map(|(c, _)| c.clone()).collect()
    }

    /// The agent's write-back trailers, when this is one.
    fn write_back(&self) -> Option<WriteBack> {
        WriteBack::parse(&self.message)
    }

    fn is_rollback(&self) -> bool {
        self.message.lines().any(|l| l.starts_with(ROLLBACK_TRAILER))
            || self.write_back().is_some()
            || (reverted(&self.message).is_some() && !self.reverts_write_back)
    }
}

/// The commit a `git revert` message says it reverts.
fn reverted(message: &str) -> Option<Oid> {
    let rest = &message[message.find("This reverts commit ")? + "This reverts commit ".len()..];
    Oid::from_str(rest.split(|c: char| !c.is_ascii_hexdigit()).next()?).ok()
}

fn assignments_at(repo: &FleetRepo, commit: &Commit<'_>) -> Option<BTreeMap<String, Option<String>>> {
    // Commits whose configuration does not load (older layouts, broken states) are skipped.
    let tree = commit.tree().ok()?;
    let config = FleetConfig::load(&GitTree::new(repo.git(), tree, commit.id().to_string())).ok()?;
    Some(config.clusters.keys().map(|n| (n.clone(), config.desired_release(n).map(|(r, _)| r.to_string()))).collect())
}

/// For every cluster of `wanted`, the most recent first-parent commit that changed its desired release.
fn last_changes(
    repo: &FleetRepo,
    tip: &Commit<'_>,
    wanted: &[String],
) -> Result<BTreeMap<String, Change>, RelengError> {
    let mut out: BTreeMap<String, Change> = BTreeMap::new();
    let mut commit = tip.clone();
    let mut after = assignments_at(repo, &commit);
    for _ in 0..MAX_HISTORY {
        if wanted.iter().all(|c| out.contains_key(c)) {
            break;
        }
        let Ok(parent) = commit.parent(0) else { break };
        let before = assignments_at(repo, &parent);
        if let (Some(a), Some(b)) = (&after, &before) {
            for c in wanted {
                if !out.contains_key(c) && a.get(c) != b.get(c) && a.contains_key(c) {
                    out.insert(c.clone(), Change::new(repo, &commit, b.clone(), a.clone()));
                }
            }
        }
        commit = parent;
        after = before;
    }
    Ok(out)
}

/// Writes the rollback of `req.target` (see the module docs), or only reports it with
/// `req.dry_run`. `signer` signs the commit when given. Statuses are read from the local notes
/// refs (fetch them first).
///
/// Refusals: no selected cluster can go back (each one's reason, with the `--to` that moves it),
/// the `to` release does not target a cluster, nothing would change.
pub fn rollback(
    repo: &FleetRepo,
    req: &RollbackRequest,
    signer: Option<&mut Signer>,
) -> Result<RollbackReport, RelengError> {
    let tip = repo.branch_tip(&req.base)?;
    let state = repo.fleet_state(&tip.tree()?, &format!("branch {}", req.base))?;
    if req.staged && req.target != Target::Fleet {
        return Err(RelengError::Usage(format!(
            "--staged paces a rollback of the fleet through its waves; {} is rolled back at once (drop --staged)",
            req.target
        )));
    }
    let selected = state.select(&req.target)?;
    let history = last_changes(repo, &tip, &selected)?;
    let tags = repo.release_tags()?;
    let successes = Successes::read(repo, &state.config, &tags)?;

    // Where each cluster goes, and why; or why it stays.
    let mut want: BTreeMap<String, String> = BTreeMap::new();
    let mut why: BTreeMap<String, String> = BTreeMap::new();
    let mut left_alone = Vec::new();
    match &req.to {
        Some(to) => {
            let tag = repo.release_tag(to)?.ok_or_else(|| RelengError::UnknownRelease(to.clone()))?;
            let missing: Vec<String> =
                selected.iter().filter(|c| !tag.release.spec.target_clusters.contains(c)).cloned().collect();
            if !missing.is_empty() {
                return Err(Refusal::NotTargeted {
                    id: to.clone(),
                    clusters: missing,
                    targets: tag.release.spec.target_clusters.clone(),
                }
                .into());
            }
            for c in &selected {
                want.insert(c.clone(), to.clone());
                why.insert(c.clone(), "asked for (--to)".to_string());
            }
        }
        None => {
            for found in rollback_preview::candidates(&state, &successes, &tags, &selected) {
                let c = found.cluster.clone();
                match own_target(&found, history.get(&c)) {
                    Ok((to, reason)) => {
                        why.insert(c.clone(), reason);
                        want.insert(c, to);
                    }
                    Err(reason) => {
                        left_alone.push(LeftAlone { cluster: c, wave: found.wave, current: found.desired, why: reason })
                    }
                }
            }
            if want.is_empty() {
                let reasons: Vec<&str> = left_alone.iter().map(|l| l.why.as_str()).collect();
                return Err(Refusal::NothingToRollBack(reasons.join("\n")).into());
            }
        }
    }

    let targets: BTreeSet<String> = want.values().cloned().collect();
    // `fleet.yaml` says the release only when every cluster of the fleet goes there; otherwise
    // each cluster gets its own pin and the ones left alone keep following the fleet.
    let fleet_wide = match (&req.target, targets.len()) {
        (Target::Fleet, 1) if !req.staged && left_alone.is_empty() => targets.first().map(|s| s.as_str()),
        _ => None,
    };
    let mut change = state.plan(&want, fleet_wide);
    if change.is_empty() {
        return Err(Refusal::NothingToRollBack(format!(
            "{} already runs {}; nothing to roll back",
            req.target,
            targets.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ))
        .into());
    }
    let mut later = Vec::new();
    if req.staged {
        (change, later) = stage(&state, &want, &moves(&state, &change)?, left_alone.is_empty());
    }
    let after = state.assignments_after(&change);
    let clusters = moves(&state, &change)?;
    let preview = clusters
        .iter()
        .map(|m| {
            let reason = why.get(&m.cluster).cloned().unwrap_or_default();
            rollback_preview::preview(repo, &state, &successes, &m.cluster, (m.from.as_deref(), &m.to), reason)
        })
        .collect::<Result<Vec<_>, _>>()?;

    let mut edit = TreeEdit::new(repo.git(), Some(&tip.tree()?))?;
    for (path, text) in state.render(&change)? {
        edit.put(&path, text.as_bytes(), false)?;
    }
    let explicit_tree = edit.write()?;

    // A single promotion commit behind every selected cluster's current release?
    let promotions: BTreeSet<Oid> = selected.iter().filter_map(|c| history.get(c).map(|h| h.commit)).collect();
    let revert = match promotions.iter().next() {
        Some(p) if promotions.len() == 1 && history.len() == selected.len() => {
            let change = &history[&selected[0]];
            let moved: BTreeSet<String> = clusters.iter().map(|m| m.cluster.clone()).collect();
            if change.changed() == moved { try_revert(repo, &tip, *p, &after)? } else { None }
        }
        _ => None,
    };

    let mut report = RollbackReport {
        target: req.target.clone(),
        method: RollbackMethod::Explicit,
        reverted: None,
        base: req.base.clone(),
        branch: req.branch.clone().unwrap_or_else(|| req.base.clone()),
        commit: String::new(),
        clusters,
        preview,
        left_alone,
        later,
        reason: req.reason.clone(),
        dry_run: req.dry_run,
    };
    let (tree, message) = match revert {
        Some((tree, promotion)) => {
            report.method = RollbackMethod::Revert;
            report.reverted = Some(promotion.id().to_string());
            let subject = promotion.summary().ok().flatten().unwrap_or_default().to_string();
            (
                tree,
                format!("Revert \"{subject}\"\n\nThis reverts commit {}.\n\n{}", promotion.id(), message_body(&report)),
            )
        }
        None => (
            explicit_tree,
            format!("rollback {}: {}\n\n{}", req.target, summary(&report.clusters), message_body(&report)),
        ),
    };

    if req.dry_run {
        return Ok(report);
    }
    let log = format!("fleetgate rollback {}", req.target);
    let commit = repo.commit_change(signer, &tip, (&req.base, req.branch.as_deref()), &message, tree, &log)?;
    report.commit = commit.to_string();
    Ok(report)
}

/// Where a cluster goes without `--to`, and why: its newest success other than the release Git
/// asks for now and other than revoked ones (`found`, newest first). `Err` says why it stays —
/// its last change of release was a rollback already (by a person or its agent's write-back), or
/// nothing else succeeded on it — and what to do instead.
fn own_target(found: &ClusterCandidates, last_change: Option<&Change>) -> Result<(String, String), String> {
    let c = &found.cluster;
    let Some(current) = found.desired.as_deref() else {
        return Err(format!("{c} runs no release yet; nothing to roll back"));
    };
    if let Some(change) = last_change {
        if let Some(wb) = change.write_back() {
            return Err(format!(
                "the agent of {c} already rolled {} back to {} and wrote it back in commit {} (reason {}{}); Git asks for what runs. To try {} again, promote it (fleetgate promote {} --cluster {c}); to go elsewhere, pass --to ID",
                wb.release,
                wb.rolled_back_to,
                short(change.commit),
                if wb.reason.is_empty() { "not given" } else { wb.reason.as_str() },
                wb.failure.as_deref().map(|f| format!(": {f}")).unwrap_or_default(),
                wb.release,
                wb.release,
            ));
        }
        if change.is_rollback() {
            return Err(format!(
                "{c} was already rolled back by commit {} ({}); pass --to ID to choose another release",
                short(change.commit),
                change.message.lines().next().unwrap_or_default()
            ));
        }
    }
    let newer_revoked: Vec<&str> = found
        .candidates
        .iter()
        .take_while(|k| k.desired || k.revoked)
        .filter(|k| k.revoked)
        .map(|k| k.success.release.as_str())
        .collect();
    let skipped = match newer_revoked.as_slice() {
        [] => String::new(),
        revoked => format!("; skipped {} (revoked)", revoked.join(", ")),
    };
    match found.candidates.iter().find(|k| !k.desired && !k.revoked) {
        Some(k) => Ok((
            k.success.release.clone(),
            format!("last success here at {}{skipped}", k.success.at.format("%Y-%m-%d %H:%M:%SZ")),
        )),
        None => Err(format!(
            "no release other than {current} succeeded on {c}{}, so it has nothing to go back to and stays on {current}; to move it anyway: fleetgate rollback --cluster {c} --to ID",
            if newer_revoked.is_empty() {
                String::new()
            } else {
                format!(" that is not revoked ({} is)", newer_revoked.join(", "))
            }
        )),
    }
}

/// A staged rollback of the fleet: the change that rolls back the first wave `moves` touch, and
/// the steps for the waves after it, in wave order. A later wave whose clusters share one target
/// is one `--wave` step; the last step, when every cluster of the fleet (`whole_fleet`: none is
/// left alone) goes to the same release, is `--fleet`, which also sets `fleet.yaml` and drops the
/// pins the earlier steps wrote.
fn stage(
    state: &FleetState,
    want: &BTreeMap<String, String>,
    moves: &[ClusterMove],
    whole_fleet: bool,
) -> (DesiredChange, Vec<LaterStep>) {
    let mut waves: Vec<(String, Vec<ClusterMove>)> = Vec::new();
    for m in moves {
        match waves.last_mut() {
            Some((w, ms)) if *w == m.wave => ms.push(m.clone()),
            _ => waves.push((m.wave.clone(), vec![m.clone()])),
        }
    }
    let mut waves = waves.into_iter();
    let first: BTreeMap<String, String> = waves
        .next()
        .map(|(_, ms)| ms.into_iter().map(|m| (m.cluster.clone(), want[&m.cluster].clone())).collect())
        .unwrap_or_default();
    let one_target: BTreeSet<&String> = want.values().collect();
    let rest: Vec<(String, Vec<ClusterMove>)> = waves.collect();
    let count = rest.len();
    let mut later = Vec::new();
    for (i, (wave, clusters)) in rest.into_iter().enumerate() {
        let targets: BTreeSet<String> = clusters.iter().map(|m| m.to.clone()).collect();
        let step = |args: Vec<String>, clusters: Vec<ClusterMove>| LaterStep { wave: wave.clone(), clusters, args };
        match targets.first() {
            Some(to) if whole_fleet && one_target.len() == 1 && i + 1 == count => {
                later.push(step(rollback_args(&["--fleet"], to), clusters))
            }
            Some(to) if targets.len() == 1 => later.push(step(rollback_args(&["--wave", &wave], to), clusters)),
            _ => {
                for m in clusters {
                    later.push(step(rollback_args(&["--cluster", &m.cluster], &m.to), vec![m.clone()]));
                }
            }
        }
    }
    (state.plan(&first, None), later)
}

/// `rollback SCOPE… --to TO`, as command-line arguments.
fn rollback_args(scope: &[&str], to: &str) -> Vec<String> {
    let mut args = vec!["rollback".to_string()];
    args.extend(scope.iter().map(|s| s.to_string()));
    args.extend(["--to".to_string(), to.to_string()]);
    args
}

fn message_body(r: &RollbackReport) -> String {
    let mut m = format!("Roll back {}:\n", r.target);
    m.push_str(&moves_lines(&r.clusters));
    for step in &r.later {
        m.push_str(&format!("Later, wave {}: fleetgate {}\n", step.wave, step.args.join(" ")));
    }
    for l in &r.left_alone {
        m.push_str(&format!("Left alone: {}\n", l.line()));
    }
    m.push_str(&format!("\nReason: {}\n", r.reason.as_deref().unwrap_or("(none given)")));
    m.push_str(&format!("\n{ROLLBACK_TRAILER} {}\n", r.target));
    m
}

/// Reverts `promotion` on top of `tip` when `promotion` is a pure promotion (it changed nothing
/// but desired releases) and reverting it is clean and yields exactly `want` (every cluster's
/// desired release); returns the reverted tree and the promotion commit.
fn try_revert<'r>(
    repo: &'r FleetRepo,
    tip: &Commit<'_>,
    promotion: Oid,
    want: &BTreeMap<String, Option<String>>,
) -> Result<Option<(Oid, Commit<'r>)>, RelengError> {
    let promotion = repo.git().find_commit(promotion)?;
    let Ok(parent) = promotion.parent(0) else { return Ok(None) };
    if !only_config_changed(repo, &parent.tree()?, &promotion.tree()?)? {
        return Ok(None);
    }
    let (Some(a), Some(b)) = (config_at(repo, parent.tree()?), config_at(repo, promotion.tree()?)) else {
        return Ok(None);
    };
    if without_releases(a) != without_releases(b) {
        return Ok(None);
    }
    let mainline = if promotion.parent_count() > 1 { 1 } else { 0 };
    let Ok(mut index) = repo.git().revert_commit(&promotion, tip, mainline, None) else { return Ok(None) };
    if index.has_conflicts() {
        return Ok(None);
    }
    let tree = index.write_tree_to(repo.git())?;
    let reverted = repo.git().find_tree(tree)?;
    if !only_config_changed(repo, &tip.tree()?, &reverted)? {
        return Ok(None);
    }
    let Some(config) = config_at(repo, reverted) else { return Ok(None) };
    let got: BTreeMap<String, Option<String>> =
        config.clusters.keys().map(|n| (n.clone(), config.desired_release(n).map(|(r, _)| r.to_string()))).collect();
    Ok((&got == want).then_some((tree, promotion)))
}

fn config_at(repo: &FleetRepo, tree: git2::Tree<'_>) -> Option<FleetConfig> {
    FleetConfig::load(&GitTree::new(repo.git(), tree, "history")).ok()
}

/// The configuration with every `spec.release` cleared: what must not differ across a promotion.
fn without_releases(mut c: FleetConfig) -> FleetConfig {
    c.fleet.spec.release = None;
    for cl in c.clusters.values_mut() {
        cl.spec.release = None;
    }
    c
}

/// True when `a` → `b` touches nothing but `fleet.yaml` and `clusters/`.
fn only_config_changed(repo: &FleetRepo, a: &git2::Tree<'_>, b: &git2::Tree<'_>) -> Result<bool, RelengError> {
    let diff = repo.git().diff_tree_to_tree(Some(a), Some(b), None)?;
    let clusters = format!("{}/", crate::model::CLUSTERS_DIR);
    Ok(diff.deltas().all(|d| {
        d.new_file()
            .path()
            .or(d.old_file().path())
            .and_then(|p| p.to_str())
            .is_some_and(|p| p == crate::model::FLEET_FILE || p.starts_with(&clusters))
    }))
}

fn short(oid: Oid) -> String {
    oid.to_string()[..10].to_string()
}
