//! Spoke plans: what merging each open promotion pull request would do to *this* cluster, judged
//! in the cluster before anyone merges, and posted on the pull request's head as commit status
//! `fleetgate/plan/<cluster>` (docs/PLAN.md "Spoke plans"). Opt-in (`planPullRequests: true`,
//! `--plan-pull-requests`), on the agent's own forge with its own token: the repo decides
//! neither where a status goes nor with which credential.
//!
//! ```text
//! after a pass ─► forge: open PRs into the tracked branch ─► each head not judged yet:
//!   fetch refs/pull/N/head ─► desired release at merge-base(branch, head) vs at head
//!     same (or none) ─► no status
//!     moves ─► resolve + verify + move check (the pass's own judgement, nothing persisted) + variant
//!            ─► pre-apply checks: admission, gate kinds, requirements, CRDs against the live
//!               ones and their CRs, server-side dry run ─► counts of what the apply would do
//!     ─► success "rel-2 applies here: 1 created, 1 changed, 1 pruned, 9 unchanged"
//!        │ failure "rel-3 refused here: admission: …"
//! ```
//!
//! Only signed releases are planned: the head can only name a release tag the agent already
//! holds, and one that does not verify (or may not run here: revoked, another fleet's, an
//! unsigned move back) is a `failure` saying so, never a dry run. The policies that judge it
//! come from the release's own signed tree, as a pass takes them from an unsigned tip; with
//! signed promotions, from the head, which the merge commit will carry signed. Nothing is
//! applied and nothing persisted: the dry run is the apply engine's, the verification a copy of
//! the pass's over the state as it is.
//!
//! Paced so the pass stays first: at most one listing every [`PLAN_INTERVAL`], after a pass and
//! only when no operation is in flight, within [`PLAN_BUDGET`]; each head is judged once (a push
//! makes a new head, and a new plan): the agent remembers the heads it judged, and a head that
//! carries `fleetgate/plan/<cluster>` on the forge already (a restarted agent's, another
//! replica's) is not judged again. A head that could not be judged (the forge or the API server
//! away) is tried again at the next listing; errors are logged, never fatal.

use super::config::AgentConfig;
use super::reconcile::{Agent, Check, Precheck, Prechecked, ReconcileError, Verified, movement};
use crate::apply::{Action, ApplyError, ChangeSet};
use crate::model::{ErrorClass, FleetConfig, PromotionMode, error_chain};
use crate::release;
use crate::source::{Checkout, SourceError, short};
use crate::status::{ForgeBackend, ForgeError, OpenPull, State};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The commit status context of a cluster's plan: `fleetgate/plan/<cluster>`.
pub fn plan_context(cluster: &str) -> String {
    format!("fleetgate/plan/{cluster}")
}

/// The shortest time between two listings of the open pull requests.
pub const PLAN_INTERVAL: Duration = Duration::from_secs(30);
/// How long the plans after one pass may take; the heads left wait for the next listing.
pub const PLAN_BUDGET: Duration = Duration::from_secs(120);
/// How many judged heads are remembered (the oldest is forgotten first).
const REMEMBERED_HEADS: usize = 512;

/// The heads already judged, and when the open pull requests were last listed.
#[derive(Debug, Default)]
pub struct PlanMemory {
    heads: VecDeque<String>,
    last_listing: Option<Instant>,
}

impl PlanMemory {
    /// Whether the loop lists the open pull requests after this pass.
    pub(super) fn due(&self, config: &AgentConfig) -> bool {
        config.plan_pull_requests && self.last_listing.is_none_or(|t| t.elapsed() >= PLAN_INTERVAL)
    }

    fn judged(&self, head: &str) -> bool {
        self.heads.iter().any(|h| h == head)
    }

    fn remember(&mut self, head: &str) {
        if self.heads.len() >= REMEMBERED_HEADS {
            self.heads.pop_front();
        }
        self.heads.push_back(head.to_string());
    }
}

/// What the agent found for one pull request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpokePlan {
    /// Merging it changes nothing this cluster runs: no status.
    Unchanged,
    /// The release would apply here: what the apply would do to the cluster's objects.
    Applies { release: String, created: usize, changed: usize, pruned: usize, unchanged: usize },
    /// The agent would refuse the release (`None`: the head's configuration names none it can
    /// read); `reason` is the check's own words.
    Refused { release: Option<String>, reason: String },
}

impl SpokePlan {
    /// The plan of `release` from what applying it would do.
    pub fn applies(release: &str, changes: &ChangeSet) -> SpokePlan {
        let count = |pred: fn(&Action) -> bool| changes.changes.iter().filter(|c| pred(&c.action)).count();
        SpokePlan::Applies {
            release: release.to_string(),
            created: count(|a| *a == Action::Created),
            changed: count(|a| *a == Action::Configured),
            pruned: count(|a| *a == Action::Pruned),
            // Retained objects are kept as they are.
            unchanged: count(|a| matches!(a, Action::Unchanged | Action::Retained(_))),
        }
    }

    /// The commit status that says it: `success` with the counts, `failure` with the reason,
    /// none when nothing changes here.
    pub fn status(&self) -> Option<(State, String)> {
        match self {
            SpokePlan::Unchanged => None,
            SpokePlan::Applies { release, created, changed, pruned, unchanged } => Some((
                State::Success,
                format!(
                    "{release} applies here: {created} created, {changed} changed, {pruned} pruned, {unchanged} unchanged"
                ),
            )),
            SpokePlan::Refused { release: Some(release), reason } => {
                Some((State::Failure, format!("{release} refused here: {}", one_line(reason))))
            }
            SpokePlan::Refused { release: None, reason } => {
                Some((State::Failure, format!("refused here: {}", one_line(reason))))
            }
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What the fleet configuration at one commit asks of this cluster.
enum Asks {
    Release(String),
    Nothing,
    /// The configuration does not load; why.
    Invalid(String),
}

/// One pull request head judged by [`Agent::plan_pull_requests`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub pull: u64,
    pub head: String,
    pub plan: SpokePlan,
}

/// Why a head could not be judged now; it is tried again at the next listing.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("the forge")]
    Forge(#[from] ForgeError),
    #[error("pull request #{pull} moved from {listed} to {fetched} since it was listed; the next listing plans it")]
    Moved { pull: u64, listed: String, fetched: String },
    #[error(transparent)]
    Reconcile(#[from] ReconcileError),
}

impl From<SourceError> for PlanError {
    fn from(e: SourceError) -> Self {
        PlanError::Reconcile(e.into())
    }
}

impl Agent {
    /// Lists the open pull requests into the tracked branch on the agent's forge and judges
    /// each head not judged yet, posting `fleetgate/plan/<cluster>` where it moves this
    /// cluster (module docs). Within [`PLAN_BUDGET`]; nothing when the agent does not plan
    /// pull requests or an operation is in flight. Returns the heads judged; errors are logged.
    pub async fn plan_pull_requests(&mut self) -> Vec<Planned> {
        self.plans.last_listing = Some(Instant::now());
        match tokio::time::timeout(PLAN_BUDGET, self.plan_open_pulls()).await {
            Ok(Ok(planned)) => planned,
            Ok(Err(e)) => {
                tracing::warn!(error = %error_chain(&e), "could not list the pull requests to plan; trying at the next listing");
                Vec::new()
            }
            Err(_) => {
                tracing::warn!(budget = ?PLAN_BUDGET, "spoke plans ran out of time; the heads left wait for the next listing");
                Vec::new()
            }
        }
    }

    async fn plan_open_pulls(&mut self) -> Result<Vec<Planned>, PlanError> {
        let config = &self.services.config;
        let Some(forge) = config.forge.clone().filter(|_| config.plan_pull_requests) else { return Ok(Vec::new()) };
        let (branch, context) = (config.branch.clone(), plan_context(&config.cluster));
        if self.services.store.load().await.map_err(ReconcileError::from)?.operation().is_some() {
            tracing::debug!("an operation is in flight; planning pull requests later");
            return Ok(Vec::new());
        }
        let backend = ForgeBackend::from_config(&forge).await?;
        let pulls = backend.open_pull_requests(&branch).await?;
        let mut planned = Vec::new();
        for pull in &pulls {
            if self.plans.judged(&pull.head) {
                continue;
            }
            // The forge remembers what an earlier run of the agent (or another replica) posted.
            match backend.has_status(&pull.head, &context).await {
                Ok(true) => {
                    self.plans.remember(&pull.head);
                    continue;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(pull = pull.number, error = %error_chain(&e), "could not read the head's statuses; trying at the next listing");
                    continue;
                }
            }
            let plan = match Box::pin(self.plan_pull(pull)).await {
                Ok(plan) => plan,
                Err(e) => {
                    tracing::warn!(pull = pull.number, head = %pull.head, error = %error_chain(&e), "could not plan the pull request; trying at the next listing");
                    continue;
                }
            };
            if let Some((state, description)) = plan.status() {
                if let Err(e) = backend.set_status(&pull.head, &context, state, &description).await {
                    tracing::warn!(pull = pull.number, error = %error_chain(&e), "could not post the plan; trying at the next listing");
                    continue;
                }
                tracing::info!(pull = pull.number, head = %pull.head, state = state.as_str(), "{description}");
            }
            self.plans.remember(&pull.head);
            planned.push(Planned { pull: pull.number, head: pull.head.clone(), plan });
        }
        Ok(planned)
    }

    /// Judges the head of `pull` for this cluster (module docs); `Err` when it cannot be judged now.
    async fn plan_pull(&mut self, pull: &OpenPull) -> Result<SpokePlan, PlanError> {
        let cluster = self.services.config.cluster.clone();
        let head = tokio::task::block_in_place(|| self.source.fetch_pull_head(&pull.git_ref))?;
        if head.to_string() != pull.head {
            return Err(PlanError::Moved { pull: pull.number, listed: pull.head.clone(), fetched: head.to_string() });
        }
        let mirror = self.source.state_dir().join("mirror.git");
        let label = format!("pull request #{} at {}", pull.number, short(head));
        let at_head = Checkout::open_local_at(&mirror, &label, head)?;
        let tip = at_head
            .repo()
            .refname_to_id(&format!("refs/heads/{}", self.services.config.branch))
            .map_err(SourceError::from)?;
        // What the pull request changes: its head against where it left the branch, as the
        // forge shows it (a branch that moved on since does not count as the PR's change).
        let base = at_head.repo().merge_base(tip, head).map_err(SourceError::from)?;
        let asks = |commit: git2::Oid| -> Result<Asks, SourceError> {
            let tree = at_head.commit_tree(commit, &format!("{label} (at {})", short(commit)))?;
            Ok(match FleetConfig::load(&tree) {
                Ok(config) => match config.desired_release(&cluster) {
                    Some((release, _)) => Asks::Release(release.to_string()),
                    None => Asks::Nothing,
                },
                Err(e) => Asks::Invalid(error_chain(&e)),
            })
        };
        let before = match asks(base)? {
            Asks::Release(release) => Some(release),
            Asks::Nothing | Asks::Invalid(_) => None,
        };
        let target = match asks(head)? {
            Asks::Release(after) if Some(&after) != before.as_ref() => after,
            // Nothing asked, or what is asked already: the agent keeps what runs.
            Asks::Release(_) | Asks::Nothing => return Ok(SpokePlan::Unchanged),
            Asks::Invalid(why) => {
                return Ok(SpokePlan::Refused {
                    release: None,
                    reason: format!("the fleet configuration at the head is invalid: {why}"),
                });
            }
        };
        let refused = |reason: String| Ok(SpokePlan::Refused { release: Some(target.clone()), reason });

        let desired = match tokio::task::block_in_place(|| release::resolve(&at_head, &cluster)) {
            Ok(desired) => desired,
            Err(e) if e.class() == ErrorClass::Stalling => return refused(error_chain(&e)),
            Err(e) => return Err(ReconcileError::from(e).into()),
        };
        let state = self.services.store.load().await.map_err(ReconcileError::from)?;
        let signed = self.promotion_mode(&state, &desired.config) == PromotionMode::Signed;
        let verified = match self.judge(&at_head, &desired, signed, &state).map(|j| j.verdict) {
            Ok(Verified::Release(verified)) => verified,
            Ok(Verified::Refused(e)) => return refused(error_chain(&e)),
            Err(e) if e.class() == ErrorClass::Stalling => return refused(error_chain(&e)),
            Err(e) => return Err(ReconcileError::Verify(e).into()),
        };
        // In the variant this cluster would run, as the pass after the merge selects it.
        let verified = match self.for_this_cluster(verified).await? {
            Verified::Release(verified) => verified,
            Verified::Refused(e) => return refused(error_chain(&e)),
        };
        // The settings that judge it, as the pass after the merge will take them.
        let config = if signed {
            desired.config.clone()
        } else {
            let commit = desired.tag.commit.to_string();
            match tokio::task::block_in_place(|| release::signed_config(&at_head, &target, &commit)) {
                Ok(config) => config,
                Err(e) if e.class() == ErrorClass::Stalling => return refused(error_chain(&e)),
                Err(e) => return Err(ReconcileError::Verify(e).into()),
            }
        };
        let (_, returning_from) = movement(&state, &verified);
        let Prechecked { admitted, dry_run, .. } = match self
            .preapply(&verified, &config, returning_from.is_some(), Check::Plan)
            .await
        {
            Ok(Precheck::Passed(checked)) => checked,
            Ok(Precheck::Blocked(blocker)) => return refused(format!("{}: {}", blocker.gate(), blocker.problems())),
            // What the agent's RBAC lacks stalls the release after the merge just as surely.
            Err(ReconcileError::Apply(e @ ApplyError::Forbidden(_))) => return refused(error_chain(&e)),
            Err(e) if e.class() == ErrorClass::Stalling => return refused(error_chain(&e)),
            Err(e) => return Err(e.into()),
        };
        let changes = self.engine.changes(&admitted, &dry_run).await.map_err(ReconcileError::from)?;
        Ok(SpokePlan::applies(&target, &changes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::ObjectChange;
    use crate::manifests::{ObjectKey, Phase};

    fn change(name: &str, action: Action) -> ObjectChange {
        let object =
            ObjectKey { group: String::new(), kind: "Service".into(), namespace: Some("ns".into()), name: name.into() };
        ObjectChange { object, phase: Phase::Config, action }
    }

    #[test]
    fn a_plan_says_what_the_apply_would_do_or_why_it_is_refused() {
        let mut changes = ChangeSet::new("rel-2");
        changes.changes = vec![
            change("a", Action::Created),
            change("b", Action::Configured),
            change("c", Action::Unchanged),
            change("d", Action::Pruned),
            change("e", Action::Retained("crd".into())),
        ];
        let cases = [
            (SpokePlan::Unchanged, None),
            (
                SpokePlan::applies("rel-2", &changes),
                Some((State::Success, "rel-2 applies here: 1 created, 1 changed, 1 pruned, 2 unchanged")),
            ),
            (
                SpokePlan::Refused {
                    release: Some("rel-3".into()),
                    reason: "admission: refuses\n  Deployment x".into(),
                },
                Some((State::Failure, "rel-3 refused here: admission: refuses Deployment x")),
            ),
            (
                SpokePlan::Refused { release: None, reason: "the fleet configuration at the head is invalid".into() },
                Some((State::Failure, "refused here: the fleet configuration at the head is invalid")),
            ),
        ];
        for (plan, want) in cases {
            assert_eq!(plan.status(), want.map(|(s, d)| (s, d.to_string())), "{plan:?}");
        }
    }

    #[test]
    fn each_head_is_judged_once_and_the_oldest_is_forgotten_first() {
        let mut memory = PlanMemory::default();
        for i in 0..=REMEMBERED_HEADS {
            memory.remember(&format!("head-{i}"));
        }
        assert!(!memory.judged("head-0"), "the oldest went");
        assert!(memory.judged("head-1") && memory.judged(&format!("head-{REMEMBERED_HEADS}")));
    }
}
