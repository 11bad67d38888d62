//! `fleetgate plan`: what merging a promotion pull request will do, said before the merge, for
//! CI on the PR branch. It compares the desired releases at the PR's head with its base
//! ([`FleetState::assignments`] of both, [`super::promote::moves_between`]) and judges each
//! moving cluster's target release the way that cluster's agent will once the PR is merged:
//!
//! * the target's tag, signed by a trusted key ([`checks::verify_release_in`]), targeting the cluster;
//! * not revoked by a signed release, and not older than the newest release the cluster ran
//!   successfully unless it is that release's signed `rollbackTo` ([`judge_move`], the agent's
//!   rule; revocations as the agent reads them, [`SignedReleases::revocations`]);
//! * admission by the agents' baseline narrowed by the head's policies ([`super::create::admission`]);
//! * CRD compatibility against what the cluster last reported running successfully
//!   ([`baseline::crd_baselines`], as `release create` does);
//! * an approval, when the cluster's wave requires one.
//!
//! The verdict is [`Verdict::Refused`] when an agent would refuse, [`Verdict::Needs`] when a
//! person still has to act (approve, sign), else [`Verdict::Ok`]. [`post`] publishes it on the
//! forge as commit status `fleetgate/plan` on the head and one pull request comment, edited in
//! place on every run. Statuses are read from the local notes refs: fetch them first
//! ([`super::publish::fetch_statuses`]).

use super::baseline::{self, CrdBaseline};
use super::checks::{self, CrdVerdict};
use super::promote::{ClusterMove, moves_between, release_files};
use super::repo::{FleetRepo, ReleaseTag};
use super::successes::Successes;
use super::{AdmissionFix, FleetState, Refusal, RelengError};
use crate::manifests::admission::ObjectRefusal;
use crate::model::{AdmissionBaseline, ApprovalSetting, FleetConfig, approval_tag};
use crate::release::{
    Keyring, Ran, ReleaseContent, SignedReleases, Standing, TagPins, UnverifiedRelease, VerifyError, judge_move,
};
use crate::source::Checkout;
use crate::status::{ForgeBackend, ForgeConfig, State};
use serde::Serialize;
use std::collections::BTreeMap;

/// The commit status context the verdict is published under.
pub const PLAN_CONTEXT: &str = "fleetgate/plan";
/// What marks fleetgate's plan comment on a pull request, so the next run edits it.
const COMMENT_MARKER: &str = "<!-- fleetgate:plan -->";

/// What to compare.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    /// The branch the PR merges into: a branch or any revision (`origin/main`).
    pub base: String,
    /// The PR's head: a branch or any revision (`HEAD`).
    pub head: String,
    /// The agents' admission baseline, which the head's policies narrow.
    pub admission_baseline: AdmissionBaseline,
}

/// Ordered from best to worst: a report's verdict is its worst cluster's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Every moving cluster's agent will take its release.
    Ok,
    /// They will, once people act: approvals, signatures.
    Needs,
    /// An agent will refuse: merging this changes nothing but the statuses.
    Refused,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Ok => "ok",
            Verdict::Needs => "needs",
            Verdict::Refused => "refused",
        })
    }
}

/// Why a cluster's agent will refuse its target release.
#[derive(Debug, Clone, PartialEq, Serialize, thiserror::Error)]
#[serde(tag = "code", rename_all = "kebab-case")]
pub enum Blocker {
    #[error("{release} has no release tag here; cut it with `fleetgate release create`, or `git fetch --tags`")]
    UnknownRelease { release: String },
    #[error("{release} does not target this cluster (targetClusters: {}); cut a release that names it", targets.join(", "))]
    NotTargeted { release: String, targets: Vec<String> },
    #[error("{release} is revoked by the signed release {by}; promote a newer release")]
    Revoked { release: String, by: String },
    #[error("{release}'s mapping disagrees with its manifests: {}", findings.join("; "))]
    MappingInconsistent { release: String, findings: Vec<String> },
    #[error("{}", admission_line(objects, fixes))]
    Admission { objects: Vec<ObjectRefusal>, fixes: Vec<AdmissionFix> },
    #[error(
        "CRDs are incompatible with {}: {}{}",
        baselines.join(", "),
        findings.join("; "),
        if accept.is_empty() { String::new() } else { format!(" (a release accepting them would set spec.acceptCrdChanges: {})", accept.join(", ")) }
    )]
    IncompatibleCrds { baselines: Vec<String>, findings: Vec<String>, accept: Vec<String> },
}

fn admission_line(objects: &[ObjectRefusal], fixes: &[AdmissionFix]) -> String {
    let refused: Vec<String> = objects
        .iter()
        .flat_map(|o| {
            o.rules.iter().map(move |r| format!("{}: {} (refused by {})", o.object, r.reason, r.policies.join(", ")))
        })
        .collect();
    let mut m = format!("admission refuses {}", refused.join("; "));
    for f in fixes {
        m.push_str(&format!("; to admit, in {} set {}", f.file, f.lines.join(", ")));
    }
    m
}

/// What people must do before a cluster's agent takes its target release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "code", rename_all = "kebab-case")]
pub enum Need {
    #[error(
        "approval of {release} for wave {wave}: `fleetgate approve {release} --wave {wave}`{}",
        if *tagged { format!(" (tag {} is there; the agents check its signature)", approval_tag(release, wave)) } else { String::new() }
    )]
    Approval {
        release: String,
        wave: String,
        /// An approval tag is there; whether it counts is the agents' (their approvers' keys).
        tagged: bool,
    },
    #[error("a trusted signature on {release}: {reason}")]
    Signature { release: String, reason: String },
    /// Moving back in time: the agent's own words ([`VerifyError::Downgrade`]).
    #[error("{message}")]
    SignedDecision { release: String, newest: String, message: String },
}

/// One moving cluster, judged.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPlan {
    #[serde(flatten)]
    pub moves: ClusterMove,
    /// The release the cluster last reported `success` for (verified statuses).
    pub last_known_good: Option<String>,
    /// The key that signed the target's tag, when a trusted one did.
    pub signer: Option<String>,
    /// What the target's CRDs were compared with, and the verdict over them.
    pub crd_baselines: Vec<CrdBaseline>,
    pub crd: CrdVerdict,
    pub needs: Vec<Need>,
    pub refused: Vec<Blocker>,
}

impl ClusterPlan {
    pub fn verdict(&self) -> Verdict {
        match (self.refused.is_empty(), self.needs.is_empty()) {
            (false, _) => Verdict::Refused,
            (true, false) => Verdict::Needs,
            (true, true) => Verdict::Ok,
        }
    }
}

/// A revision compared, as given and as resolved.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Revision {
    pub rev: String,
    pub commit: String,
}

/// What merging head into base will do.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReport {
    pub verdict: Verdict,
    pub base: Revision,
    pub head: Revision,
    /// The clusters that move, in wave order.
    pub clusters: Vec<ClusterPlan>,
}

impl PlanReport {
    /// One line: `refused: cluster-b: admission refuses …`, `needs: approval of rel-2 for wave
    /// prod`, `ok: 2 cluster(s) move`.
    pub fn summary(&self) -> String {
        let first = |pick: fn(&ClusterPlan) -> Option<String>| {
            let all: Vec<String> = self.clusters.iter().filter_map(pick).collect();
            all.join("; ")
        };
        match self.verdict {
            Verdict::Refused => {
                format!("refused: {}", first(|c| c.refused.first().map(|b| format!("{}: {b}", c.moves.cluster))))
            }
            Verdict::Needs => {
                format!("needs: {}", first(|c| c.needs.first().map(|n| format!("{}: {n}", c.moves.cluster))))
            }
            Verdict::Ok if self.clusters.is_empty() => "ok: no cluster moves".to_string(),
            Verdict::Ok => format!("ok: {} cluster(s) move", self.clusters.len()),
        }
    }

    /// The pull request comment: the verdict, a table of the moves, and each finding.
    pub fn markdown(&self) -> String {
        let mut b = format!(
            "{COMMENT_MARKER}\n### fleetgate plan: **{}**\n\n`{}` ({}) into `{}` ({})\n\n",
            self.verdict,
            self.head.rev,
            short(&self.head.commit),
            self.base.rev,
            short(&self.base.commit)
        );
        if self.clusters.is_empty() {
            b.push_str("No cluster's desired release changes.\n");
            return b;
        }
        b.push_str("| cluster | wave | from | to | CRDs | verdict |\n|---|---|---|---|---|---|\n");
        for c in &self.clusters {
            let m = &c.moves;
            b.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                m.cluster,
                m.wave,
                m.from_or_none(),
                m.to,
                c.crd.summary(),
                c.verdict()
            ));
        }
        for c in self.clusters.iter().filter(|c| c.verdict() != Verdict::Ok) {
            b.push_str(&format!("\n**{}**\n", c.moves.cluster));
            for r in &c.refused {
                b.push_str(&format!("- refused: {}\n", r.to_string().replace('\n', " ")));
            }
            for n in &c.needs {
                b.push_str(&format!("- needs: {n}\n"));
            }
        }
        b
    }
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(10)]
}

/// Plans the merge of `req.head` into `req.base`. `trust` is the agents' release keys.
///
/// # Errors
/// Revisions that are not commits here, an invalid configuration at either, unreadable
/// statuses or release trees. Everything an agent would refuse is in the report, not an error.
pub fn plan(repo: &FleetRepo, req: &PlanRequest, trust: &Keyring) -> Result<PlanReport, RelengError> {
    let base = commit_of(repo, &req.base, "--base")?;
    let head = commit_of(repo, &req.head, "--head")?;
    let base_state = repo.fleet_state(&base.tree()?, &format!("--base {}", req.base))?;
    let head_state = repo.fleet_state(&head.tree()?, &format!("--head {}", req.head))?;
    let moves = moves_between(&head_state, &base_state.assignments(), &head_state.assignments())?;

    let tags = repo.release_tags()?;
    // Only statuses signed by keys the base registers count: the head is what is being judged.
    let successes = Successes::read(repo, &base_state.config, &tags)?;
    let checkout = Checkout::open_local_at(repo.path(), &format!("--head {}", req.head), head.id())
        .map_err(|e| verify_error(&req.head, e.into()))?;
    let fleet = head_state.config.fleet.name();
    let revoked = SignedReleases::default()
        .revocations(&checkout, trust, &TagPins::in_memory(), fleet)
        .map_err(|e| verify_error(&req.head, e))?;
    let mut judge =
        Judge { repo, req, trust, checkout, head: &head_state, successes, revoked, admission: BTreeMap::new() };

    let mut clusters = Vec::new();
    for m in moves {
        clusters.push(judge.cluster(m, &tags)?);
    }
    let verdict = clusters.iter().map(ClusterPlan::verdict).max().unwrap_or(Verdict::Ok);
    Ok(PlanReport {
        verdict,
        base: Revision { rev: req.base.clone(), commit: base.id().to_string() },
        head: Revision { rev: req.head.clone(), commit: head.id().to_string() },
        clusters,
    })
}

fn verify_error(id: &str, source: VerifyError) -> RelengError {
    RelengError::Verify { id: id.to_string(), source: Box::new(source) }
}

fn commit_of<'r>(repo: &'r FleetRepo, rev: &str, flag: &str) -> Result<git2::Commit<'r>, RelengError> {
    repo.git().revparse_single(rev).and_then(|o| o.peel_to_commit()).map_err(|e| {
        RelengError::Usage(format!(
            "{flag} {rev} is not a commit in this clone ({}); fetch it (`git fetch origin {rev}`) or pass a branch or commit that is",
            e.message()
        ))
    })
}

/// What the per-cluster judgement shares: the head's configuration, the clusters' successes,
/// the signed revocations, and admission verdicts per release (they do not depend on the cluster).
struct Judge<'a> {
    repo: &'a FleetRepo,
    req: &'a PlanRequest,
    trust: &'a Keyring,
    checkout: Checkout,
    head: &'a FleetState,
    successes: Successes,
    revoked: BTreeMap<String, String>,
    admission: BTreeMap<String, Option<Blocker>>,
}

impl Judge<'_> {
    fn cluster(&mut self, moves: ClusterMove, tags: &[ReleaseTag]) -> Result<ClusterPlan, RelengError> {
        let name = moves.cluster.clone();
        let last_known_good = self.successes.last_known_good(&name, |_| false).map(|s| s.release);
        let mut plan = ClusterPlan {
            moves,
            last_known_good,
            signer: None,
            crd_baselines: Vec::new(),
            crd: CrdVerdict::first_release(),
            needs: Vec::new(),
            refused: Vec::new(),
        };
        let to = plan.moves.to.clone();
        if to.is_empty() {
            // The cluster is asked to run nothing: its agent keeps what runs.
            return Ok(plan);
        }
        let Some(tag) = tags.iter().find(|t| t.id == to) else {
            plan.refused.push(Blocker::UnknownRelease { release: to });
            return Ok(plan);
        };
        let spec = &tag.release.spec;
        if !spec.target_clusters.contains(&name) {
            plan.refused.push(Blocker::NotTargeted { release: to.clone(), targets: spec.target_clusters.clone() });
        } else {
            match checks::verify_release_in(&self.checkout, &to, &name, self.trust) {
                Ok(fpr) => plan.signer = Some(fpr),
                Err(RelengError::Refused(Refusal::Unsigned { reason, .. })) => {
                    plan.needs.push(Need::Signature { release: to.clone(), reason })
                }
                Err(RelengError::Refused(Refusal::MappingInconsistent { findings })) => {
                    plan.refused.push(Blocker::MappingInconsistent { release: to.clone(), findings })
                }
                Err(e) => return Err(e),
            }
        }

        // Revoked, or back in time: the agent's own rule, over what the cluster ran successfully.
        let newest = self
            .successes
            .of(&name)
            .iter()
            .filter_map(|s| tags.iter().find(|t| t.id == s.release))
            .filter_map(|t| t.release.spec.sequence.map(|sequence| (t, sequence)))
            .max_by_key(|(_, sequence)| *sequence);
        let ran = newest.map(|(t, sequence)| Ran { release: t.id.clone(), sequence });
        let undo = newest.and_then(|(t, _)| t.release.spec.rollback_to.as_deref());
        let standing = Standing { newest: ran.as_ref(), undo, revoked: &self.revoked, signed_decision: false };
        let mut moving_back = false;
        match judge_move(&to, spec.sequence, &standing) {
            Ok(()) => {}
            Err(VerifyError::Revoked { release, by }) => plan.refused.push(Blocker::Revoked { release, by }),
            Err(e @ VerifyError::Downgrade { .. }) => {
                moving_back = true;
                let newest = ran.as_ref().map(|r| r.release.clone()).unwrap_or_default();
                plan.needs.push(Need::SignedDecision { release: to.clone(), newest, message: e.to_string() });
            }
            Err(e) => return Err(verify_error(&to, e)),
        }
        // An approval never holds a move back (docs/WAVES.md); the undo of the newest is one too.
        moving_back |= undo == Some(to.as_str());
        if !moving_back && self.requires_approval(&plan.moves.wave, tag) {
            let tagged =
                self.repo.git().find_reference(&format!("refs/tags/{}", approval_tag(&to, &plan.moves.wave))).is_ok();
            plan.needs.push(Need::Approval { release: to.clone(), wave: plan.moves.wave.clone(), tagged });
        }

        if let Some(refused) = self.admission(tag)? {
            plan.refused.push(refused);
        }

        let new = release_files(self.repo, tag)?;
        let from = plan.moves.from.as_deref().map(|f| self.repo.release_tag(f)).transpose()?.flatten();
        let baselines = baseline::crd_baselines(
            self.repo,
            &self.successes,
            std::slice::from_ref(&name),
            &to,
            from.as_ref(),
            &new,
            &spec.accept_crd_changes,
        )?;
        plan.crd = CrdVerdict::combined(baselines.iter().map(|b| &b.verdict));
        if !plan.crd.compatible {
            plan.refused.push(Blocker::IncompatibleCrds {
                baselines: baselines.iter().filter(|b| !b.verdict.compatible).map(ToString::to_string).collect(),
                findings: plan.crd.findings.clone(),
                accept: plan.crd.accept.clone(),
            });
        }
        plan.crd_baselines = baselines;
        Ok(plan)
    }

    /// Whether `wave` requires an approval of `tag`: by the head's configuration or by the one
    /// signed in the release's tree (which the agents trust with unsigned promotions) — the
    /// stricter, since the plan cannot know each agent's promotion mode.
    fn requires_approval(&self, wave: &str, tag: &ReleaseTag) -> bool {
        let required = |config: &FleetConfig| {
            config.fleet.spec.wave(wave).is_some_and(|(_, w)| w.approval == ApprovalSetting::Required)
        };
        let signed = self
            .repo
            .git()
            .find_commit(tag.commit)
            .and_then(|c| c.tree())
            .ok()
            .and_then(|tree| self.repo.fleet_state(&tree, &format!("release {}", tag.id)).ok());
        required(&self.head.config) || signed.is_some_and(|s| required(&s.config))
    }

    /// Admission of `tag` by the baseline narrowed by the head's policies, once per release.
    fn admission(&mut self, tag: &ReleaseTag) -> Result<Option<Blocker>, RelengError> {
        if let Some(known) = self.admission.get(&tag.id) {
            return Ok(known.clone());
        }
        let content = ReleaseContent {
            release: tag.release.clone(),
            files: release_files(self.repo, tag)?,
            variants: Default::default(),
        };
        let release = UnverifiedRelease::new(&tag.id, content);
        let blocker = super::create::admission(&self.req.admission_baseline, &self.head.config, &release)?
            .map(|refused| Blocker::Admission { objects: refused.objects, fixes: refused.fixes });
        self.admission.insert(tag.id.clone(), blocker.clone());
        Ok(blocker)
    }
}

/// Where [`post`] put the plan.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Posted {
    pub context: &'static str,
    pub commit: String,
    pub state: State,
    pub description: String,
    /// The pull requests of the head commented on (none found: only the status was set).
    pub pull_requests: Vec<u64>,
}

/// Publishes `report` on `forge`: commit status [`PLAN_CONTEXT`] on the head (`success` for
/// ok and needs, `failure` for refused), and the plan as a comment on each pull request whose
/// head it is (into `base_branch` when known), edited in place on later runs.
///
/// # Errors
/// The forge's refusals and failures to reach it ([`RelengError::PlanPost`]).
pub async fn post(report: &PlanReport, forge: &ForgeConfig, base_branch: Option<&str>) -> Result<Posted, RelengError> {
    let backend = ForgeBackend::from_config(forge).await.map_err(RelengError::PlanPost)?;
    let state = match report.verdict {
        Verdict::Refused => State::Failure,
        Verdict::Ok | Verdict::Needs => State::Success,
    };
    let description = report.summary();
    let sha = &report.head.commit;
    backend.set_status(sha, PLAN_CONTEXT, state, &description).await.map_err(RelengError::PlanPost)?;
    let pull_requests = backend.pull_requests(sha, base_branch).await.map_err(RelengError::PlanPost)?;
    let body = report.markdown();
    for pull in &pull_requests {
        backend.upsert_comment(*pull, COMMENT_MARKER, &body).await.map_err(RelengError::PlanPost)?;
    }
    Ok(Posted { context: PLAN_CONTEXT, commit: sha.clone(), state, description, pull_requests })
}

/// The branch name `rev` stands for, for matching pull requests: a local branch as is, a
/// remote-tracking one (`origin/main`) without its remote; None for anything else.
pub fn branch_name(repo: &FleetRepo, rev: &str) -> Option<String> {
    if repo.branch_exists(rev) {
        return Some(rev.to_string());
    }
    let remote = repo.git().find_branch(rev, git2::BranchType::Remote).ok()?;
    // `origin/main`: the remote's name, then the branch's.
    let short = remote.name().ok()??.to_string();
    short.split_once('/').map(|(_, branch)| branch.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str, needs: Vec<Need>, refused: Vec<Blocker>) -> ClusterPlan {
        ClusterPlan {
            moves: ClusterMove {
                cluster: name.into(),
                wave: "prod".into(),
                from: Some("rel-1".into()),
                to: "rel-2".into(),
            },
            last_known_good: Some("rel-1".into()),
            signer: None,
            crd_baselines: Vec::new(),
            crd: CrdVerdict::first_release(),
            needs,
            refused,
        }
    }

    fn report(clusters: Vec<ClusterPlan>) -> PlanReport {
        let verdict = clusters.iter().map(ClusterPlan::verdict).max().unwrap_or(Verdict::Ok);
        let rev = |r: &str| Revision { rev: r.into(), commit: "0123456789abcdef".into() };
        PlanReport { verdict, base: rev("main"), head: rev("HEAD"), clusters }
    }

    #[test]
    fn the_worst_cluster_decides_and_the_summary_names_it() {
        let approval = Need::Approval { release: "rel-2".into(), wave: "prod".into(), tagged: false };
        let revoked = Blocker::Revoked { release: "rel-2".into(), by: "rel-3".into() };
        let ok = report(vec![cluster("a", vec![], vec![])]);
        assert_eq!((ok.verdict, ok.summary().as_str()), (Verdict::Ok, "ok: 1 cluster(s) move"));
        let needs = report(vec![cluster("a", vec![], vec![]), cluster("b", vec![approval.clone()], vec![])]);
        assert_eq!(needs.verdict, Verdict::Needs);
        assert_eq!(needs.summary(), "needs: b: approval of rel-2 for wave prod: `fleetgate approve rel-2 --wave prod`");
        let refused = report(vec![cluster("b", vec![approval], vec![]), cluster("c", vec![], vec![revoked])]);
        assert_eq!(refused.verdict, Verdict::Refused);
        assert!(
            refused.summary().starts_with("refused: c: rel-2 is revoked by the signed release rel-3"),
            "{}",
            refused.summary()
        );
        assert_eq!(report(vec![]).summary(), "ok: no cluster moves");
    }

    #[test]
    fn the_comment_carries_its_marker_and_every_finding() {
        let r = report(vec![cluster(
            "b",
            vec![Need::Signature { release: "rel-2".into(), reason: "not signed".into() }],
            vec![],
        )]);
        let md = r.markdown();
        assert!(md.starts_with(COMMENT_MARKER), "{md}");
        assert!(md.contains("| b | prod | rel-1 | rel-2 | nothing to compare with | needs |"), "{md}");
        assert!(md.contains("- needs: a trusted signature on rel-2: not signed"), "{md}");
    }
}
