//! The reconcile loop of one spoke cluster: the pipeline of ARCHITECTURE.md §3, one stage after the
//! other, each persisted in the state ConfigMap before the next starts so a restart resumes.
//!
//! ```text
//! wake ─► sync (ls-remote, fetch if changed) ─► judge the tip ─► resolve ─► state.next()
//!   Start:  verify + check the move ─► variant (the cluster's facts, the agent's labels) ─► wave gate
//!           ─► approval ─► pre-apply gates + dry run ─► baseline
//!           ─► snapshot ─► apply + prune ─► bake ─► success │ failure ─► rollback (rollback.rs)
//!   Resume: Verifying → start over · Applying → apply again, bake · Baking → bake on
//!           · RollingBack → roll back again (every step is idempotent)
//! ```
//!
//! Each stage ends in a [`Step`]; [`Agent::step`] persists the state it leads to and tells what
//! [`conclude`](super::report::conclude) computed for it (the table is in [`super::report`]): `pending`
//! when the apply starts and when the bake starts, `success` after the bake, `failure` when a
//! pre-apply gate blocks the release (nothing applied) or after a rollback, `error` when the
//! release cannot be used at all (bad signature, bad mapping, another fleet's, revoked, an
//! unsigned move back in time; nothing applied) or a rollback attempt failed. A release that was
//! refused, blocked or rolled back is remembered as rejected and not started again until a signed
//! decision clears it. Any error before the apply starts defers the release (Verifying → Idle)
//! for the next pass.
//!
//! The stages of one operation take its [`Run`] — the checkout this pass read, the trusted
//! configuration, the release as notifications describe it — built where the pass learns them
//! (`start`, `resume`), not notes the agent keeps between one stage and the next. A stage that
//! judges the release returns its verdict ([`Verified`], [`Precheck`], the wave's `Approval`)
//! inside `Result<_, ReconcileError>`: the verdict refuses, blocks or holds the release (a status
//! says so), while an error is trouble that defers it.
//!
//! A wave with `approval: required` waits, after the wave gate lets it start, for a signed
//! approval tag ([`release::check_approval`], the agent's approvers' keys) or an approving review
//! of the promotion PR by an `--approver` login on the agent's forge: meanwhile a `pending`
//! status says so (once per reason), a tag that does not count is a Warning Event
//! `ApprovalIgnored`, and the start's status records who approved.
//!
//! Trust (docs/SECURITY.md): the branch tip is judged first ([`status::check_tip`]). Unless a
//! promotion key signed it, the tip only chooses which signed release runs and when; the safety
//! settings (gate and admission policies, operator namespace, `maxFailedClusters`) come from the
//! fleet configuration in the release tag's own tree ([`Agent::policy_config`]).

use super::AgentServices;
use super::metrics::ReconcileResult;
use super::notifier::{About, Notification, NotificationKind};
use super::report::{Blocker, Context, Report, Step, conclude};
use super::state::{AgentState, Failure, Next, Progress, Return, Transition, TransitionError};
use crate::apply::{AdmittedSet, ApplyError, ApplyOptions, Engine};
use crate::gates::{self, BakeVerdict, GateError, GateEvaluation, GateRunner, OperatorTarget, Verdict, crd_compat};
use crate::manifests::AdmissionPolicy;
use crate::model::{
    ApprovalRecord, ApprovalSetting, ErrorClass, FleetConfig, GatePolicySpec, PromotionMode, ReleaseAdmissionPolicySpec,
};
use crate::model::{error_chain, stop_point};
use crate::release::{self, DesiredRelease, Keyring, TipTrust, VerifiedRelease, VerifyError};
use crate::source::{Checkout, NotesSchedule, Source, SourceError};
use crate::status::{self, GateFigure, GitNotesBackend, GitRemote, Publisher, Status};
use chrono::Utc;
use std::time::{Duration, Instant};

/// How long a rollback may wait for the restored release's workloads to roll out.
const ROLLBACK_ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);
/// Timeout of each API call the pre-apply gates make.
const PREAPPLY_CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// Why one pass of the loop could not finish. Release-level verdicts (blocked, rolled back) are
/// not errors: they end in a status. These are what is left: the agent logs them, records an
/// Event, and tries again at the next wake if [`ReconcileError::class`] says it may help.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("fleet repo")]
    Source(#[from] SourceError),
    #[error("resolving the desired release")]
    Resolve(#[from] release::ResolveError),
    #[error("agent state")]
    State(#[from] super::state::StateError),
    #[error("gates")]
    Gates(#[from] GateError),
    #[error("apply")]
    Apply(#[from] ApplyError),
    #[error("verifying a release: {0}")]
    Verify(VerifyError),
    #[error("writing the status")]
    Status(#[from] status::StatusError),
    #[error("the release's state is inconsistent")]
    Transition(#[from] super::state::TransitionError),
    #[error("the branch tip is not accepted")]
    Promotion(#[from] release::PromotionError),
    #[error("the last-known-good store")]
    Lkg(#[source] Box<super::lkg::LkgError>),
}

impl From<super::lkg::LkgError> for ReconcileError {
    fn from(e: super::lkg::LkgError) -> Self {
        ReconcileError::Lkg(Box::new(e))
    }
}

impl ReconcileError {
    pub fn class(&self) -> ErrorClass {
        match self {
            ReconcileError::Source(e) => e.class(),
            ReconcileError::Resolve(e) => e.class(),
            ReconcileError::Gates(e) => e.class(),
            ReconcileError::Apply(e) => e.class(),
            ReconcileError::Verify(e) => e.class(),
            ReconcileError::Promotion(e) => e.class(),
            ReconcileError::Lkg(e) => e.class(),
            ReconcileError::State(e) if e.is_unauthenticated() => ErrorClass::Stalling,
            ReconcileError::State(_) | ReconcileError::Status(_) | ReconcileError::Transition(_) => {
                ErrorClass::Retryable
            }
        }
    }

    /// The Event reason / metrics label.
    pub fn reason(&self) -> &'static str {
        match self {
            ReconcileError::Source(_) => "SourceFailed",
            ReconcileError::Resolve(_) => "ResolveFailed",
            ReconcileError::State(e) if e.is_unauthenticated() => "StateUnauthenticated",
            ReconcileError::State(_) => "StateFailed",
            ReconcileError::Gates(_) => "GatesFailed",
            ReconcileError::Apply(e) => e.reason(),
            ReconcileError::Verify(e) => verify_reason(e),
            ReconcileError::Status(_) => "StatusWriteFailed",
            ReconcileError::Transition(_) => "StateInconsistent",
            ReconcileError::Promotion(_) => "PromotionRefused",
            ReconcileError::Lkg(_) => "LastKnownGoodRefused",
        }
    }
}

/// What one pass did, for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The cluster runs what Git asks (or Git asks nothing).
    UpToDate,
    /// The desired release was rejected earlier; waiting for Git to ask for another.
    Rejected(String),
    /// An earlier wave has not finished (or failed) the release.
    Waiting {
        release: String,
        reason: String,
    },
    Succeeded(String),
    /// Refused before anything was applied.
    Blocked {
        release: String,
        reason: String,
    },
    /// The release cannot be used (signature, mapping); nothing applied, status `error`.
    Refused {
        release: String,
        reason: String,
    },
    RolledBack {
        release: String,
        to: Option<String>,
    },
    /// The cluster ran the desired release, but `objects` had drifted from it: re-applied.
    DriftCorrected {
        release: String,
        objects: Vec<String>,
    },
    /// Paused ([`Agent::pause`]): nothing started, nothing corrected; `release` is what Git asks for.
    Paused {
        release: String,
        reason: String,
    },
}

/// What verification made of a release: one that may run here, or why it cannot be used (a
/// verdict, not trouble: the release is refused, and retrying would not change it).
pub(super) enum Verified {
    Release(VerifiedRelease),
    Refused(VerifyError),
}

impl From<Result<VerifiedRelease, VerifyError>> for Verified {
    fn from(result: Result<VerifiedRelease, VerifyError>) -> Self {
        match result {
            Ok(verified) => Verified::Release(verified),
            Err(e) => Verified::Refused(e),
        }
    }
}

impl Verified {
    /// The release, or its refusal as an error: for a release this agent accepted once (resume,
    /// rollback target), where a refusal now is trouble, not a verdict on a new release.
    pub(super) fn or_error(self) -> Result<VerifiedRelease, ReconcileError> {
        match self {
            Verified::Release(verified) => Ok(verified),
            Verified::Refused(e) => Err(ReconcileError::Verify(e)),
        }
    }
}

/// What the wave's approval rule ([`Agent::approval`]) says about starting a release.
enum Approval {
    /// The wave does not require one, or the release moves back.
    NotNeeded,
    Given(ApprovalRecord),
    /// None that counts yet; the tag's verdict says why.
    Missing(release::ApprovalVerdict),
}

/// The verdict of the pre-apply checks ([`Agent::preapply`]).
pub(super) enum Precheck<'r> {
    /// The release may be applied.
    Passed(Prechecked<'r>),
    /// A check refuses the release, naming itself.
    Blocked(Blocker),
}

/// What [`Agent::judge`] decided about a release, and what it learnt on the way (for the state).
pub(super) struct Judged {
    /// The verified release, or why it cannot be used here.
    pub verdict: Verified,
    /// The recorded tag pins, with the ones this verification added.
    pub pins: release::TagPins,
    /// Every revocation remembered or seen now.
    pub revoked: std::collections::BTreeMap<String, String>,
    /// Some revocation was not remembered yet.
    pub unseen: bool,
    /// The fleet the release was checked against.
    pub fleet: String,
}

/// The agent: services plus the pipeline's long-lived parts.
pub struct Agent {
    pub(super) services: AgentServices,
    pub(super) source: Source,
    pub(super) keyring: Keyring,
    /// Who may sign promotion commits (the release keys when the agent is given none).
    promotion_keys: Option<Keyring>,
    /// Who may approve a release for a wave that requires it (none: no approval counts).
    approvers: Option<Keyring>,
    /// Signed release documents seen so far: revocations and rollbackTo chains.
    signed_releases: release::SignedReleases,
    pub(super) engine: Engine,
    /// The same engine waiting for rollouts: a rollback is only done when the old release serves.
    pub(super) rollback_engine: Engine,
    pub(super) admission_baseline: ReleaseAdmissionPolicySpec,
    /// The last "waiting for wave" reason logged, so a waiting agent does not log every poll.
    last_wait: Option<String>,
    /// The last failed rollback attempt reported, so a rollback retried every pass reports each
    /// distinct failure once (status, notification), not once per pass.
    pub(super) last_rollback_error: Option<String>,
    /// When drift was last checked (`--drift-interval`).
    pub(super) last_drift_check: Option<Instant>,
    /// Why the agent holds the cluster and which release it holds back, while it does: logged,
    /// recorded and reported once per (reason, release).
    last_pause: Option<(String, String)>,
    /// Statuses delivered since the state was last written, still listed in its `unreported`:
    /// they are taken out by the next state write (the next step, or the next pass's start)
    /// rather than by a write of their own, which would stall the bake that follows a push
    /// whenever the API server stalls.
    pub(super) delivered: std::sync::Mutex<Vec<Status>>,
    /// The pull request heads spoke plans already judged, and when they last listed them.
    pub(super) plans: super::plans::PlanMemory,
}

impl Agent {
    /// Opens the fleet repo mirror and the trusted keyring; fails early with what to fix.
    pub fn new(services: AgentServices) -> Result<Agent, AgentStartError> {
        let config = &services.config;
        let source = Source::open(&config.repo.url(), &config.state_dir, config.git_credentials.to_source()?)?
            .with_branch(config.branch.clone())
            .with_limits(config.fetch_limits)
            .with_notes(NotesSchedule::Fresh);
        let keyring = Keyring::from_files(&config.trusted_keys)?;
        let optional = |files: &[std::path::PathBuf]| {
            if files.is_empty() { Ok(None) } else { Keyring::from_files(files).map(Some) }
        };
        let promotion_keys = optional(&config.promotion_keys)?;
        let approvers = optional(&config.approver_keys)?;
        let mut options = ApplyOptions::for_cluster(config.state_namespace.clone(), &config.cluster);
        let engine = Engine::new(services.client.clone(), options.clone());
        options.rollout_timeout = Some(ROLLBACK_ROLLOUT_TIMEOUT);
        let rollback_engine = Engine::new(services.client.clone(), options);
        let admission_baseline = config.admission_baseline.clone();
        Ok(Agent {
            services,
            source,
            keyring,
            promotion_keys,
            approvers,
            signed_releases: release::SignedReleases::default(),
            engine,
            rollback_engine,
            admission_baseline,
            last_wait: None,
            last_rollback_error: None,
            last_drift_check: None,
            last_pause: None,
            delivered: std::sync::Mutex::default(),
            plans: super::plans::PlanMemory::default(),
        })
    }

    pub fn services(&self) -> &AgentServices {
        &self.services
    }

    /// Runs until `shutdown` resolves: wait for a wake, reconcile when leading.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> AgentServices {
        tokio::pin!(shutdown);
        // The first pass runs at once: a restarted agent resumes without waiting for a poll.
        let mut first = true;
        loop {
            if !first {
                tokio::select! {
                    _ = self.services.next_wake() => {}
                    () = &mut shutdown => break,
                }
            }
            first = false;
            if !self.services.leader.is_leading() {
                // Between passes, about the Lease: logged under the lease module, not as a pass.
                tracing::debug!(target: "fleetgate::agent::lease", "not the leader; standing by");
                continue;
            }
            let started = Instant::now();
            let mut leadership = self.services.leader.subscribe();
            let result = tokio::select! {
                r = self.pass() => r,
                () = &mut shutdown => break,
                // Another agent leads now: stop at once; the state says where it resumes.
                Ok(_) = leadership.wait_for(|l| !l.is_leading()) => {
                    tracing::warn!("lost the leadership mid-pass; stopping work");
                    continue;
                }
            };
            let took = started.elapsed();
            match &result {
                Ok(_) => {
                    self.services.metrics.observe_reconcile(took, ReconcileResult::Ok);
                    self.services.metrics.mark_synced();
                    self.services.health.mark_synced();
                }
                Err(e) => {
                    self.services.metrics.observe_reconcile(took, ReconcileResult::Error);
                    self.services.health.mark_failed(error_chain(e));
                }
            }
            // Spoke plans after the pass, never in its way: bounded, and their errors only logged.
            if self.plans.due(&self.services.config) {
                tokio::select! {
                    _ = self.plan_pull_requests() => {}
                    () = &mut shutdown => break,
                }
            }
            // What the pass read and built is dropped by now; the agent waits with what it keeps.
            super::process::release_free_memory();
        }
        self.services
    }

    /// One pass as the agent's loop runs it: [`Self::reconcile`], and a failed pass recorded as a
    /// Warning Event that names the reason (what `kubectl describe` shows an operator).
    ///
    /// Everything logged during the pass is inside the span `pass` with the fields `cluster`,
    /// `release` and `pass` (a random id, so one pass's lines can be picked out of many):
    /// `release` starts as the release in flight, else the one running (`none` before any), and
    /// becomes the desired release once the pass resolved it. JSON logs carry them on every line
    /// (`"span": {"cluster": …, "release": …, "pass": …}`).
    pub async fn pass(&mut self) -> Result<Outcome, ReconcileError> {
        let known = self.services.store.cached().await;
        let release = known
            .as_ref()
            .and_then(|s| s.operation().map(|op| op.release.as_str()).or(s.current()))
            .unwrap_or("none")
            .to_string();
        let span = tracing::info_span!(
            "pass",
            cluster = %self.services.config.cluster,
            release = %release,
            pass = %format!("{:08x}", rand::random::<u32>()),
        );
        tracing::Instrument::instrument(self.pass_in_span(), span).await
    }

    async fn pass_in_span(&mut self) -> Result<Outcome, ReconcileError> {
        let started = Instant::now();
        let result = self.reconcile().await;
        let took_ms = started.elapsed().as_millis() as u64;
        match &result {
            Ok(outcome) => tracing::debug!(?outcome, took_ms, "reconciled"),
            Err(e) => tracing::warn!(error = %error_chain(e), class = ?e.class(), took_ms, "reconcile failed"),
        }
        if let Err(e) = &result {
            self.record_error(e).await;
        }
        // `fleetgate reconcile` waits for this: a pass that started after its request has ended.
        match self.services.store.acknowledge_reconcile_request().await {
            Ok(Some(requested)) => tracing::info!(%requested, "reconcile request handled"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %error_chain(&e), "could not mark the reconcile request handled"),
        }
        result
    }

    /// One pass of the pipeline.
    pub async fn reconcile(&mut self) -> Result<Outcome, ReconcileError> {
        let sync = match tokio::task::block_in_place(|| self.source.sync()) {
            Ok(sync) => Some(sync),
            // Git out of reach with an operation in flight (a rollback, a bake): finish it from
            // what the agent holds — the mirror, the last-known-good store; statuses wait in the
            // outbox. Nothing new starts until Git answers.
            Err(e) if e.class() == ErrorClass::Retryable && self.services.store.load().await?.operation().is_some() => {
                tracing::warn!(error = %error_chain(&e), "Git is out of reach; finishing the operation in flight without it");
                None
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(sync) = sync.as_ref().filter(|s| s.fetched) {
            tracing::info!(tip = %sync.tip, "fleet repo changed");
        }
        for tag in sync.iter().flat_map(|s| &s.refused) {
            self.services.record_warning("FetchRefused", "Fetch", &tag.reason).await;
        }
        let checkout = tokio::task::block_in_place(|| self.source.checkout())?;
        if sync.is_some() {
            self.deliver_waiting(&checkout).await;
        }
        // Boxed: inline, its future would grow every pass's (a debug build's test thread overflows).
        Box::pin(self.deliver_unreported(&checkout)).await;
        if sync.is_some() {
            Box::pin(self.deliver_write_back()).await;
        }
        let state = self.services.store.load().await?;
        let tip = self.judge_tip(&checkout, &state);
        if let Next::Resume(progress) = state.next() {
            let progress = progress.clone();
            if let Some(op) = progress.operation() {
                tracing::Span::current().record("release", op.release.as_str());
            }
            // A refused tip never stops an operation in flight (a rollback must finish); it only
            // loses the trust a signed tip would give.
            let tip = tip.unwrap_or(TipTrust::Unsigned);
            // Boxed, like `start` below: inline, a pass's future outgrows a debug build's test thread stack.
            return Box::pin(self.resume(&checkout, progress, &tip)).await;
        }
        let tip = tip?;
        let desired = match tokio::task::block_in_place(|| release::resolve(&checkout, &self.services.config.cluster)) {
            Ok(d) => d,
            Err(release::ResolveError::NoDesiredRelease { .. }) => return Ok(Outcome::UpToDate),
            Err(e) => return Err(e.into()),
        };
        tracing::Span::current().record("release", desired.id.as_str());
        let signed_mode = self.promotion_mode(&state, &desired.config) == PromotionMode::Signed;
        let tip_commit = checkout.tip().to_string();
        // In unsigned mode too the mark moves only forward: a force-push back to an old commit
        // is used as it is, but leaves the mark where it was, so an old signed commit pushed
        // again later never counts as a fresh decision.
        let fresh = release::is_fresh(&checkout, state.trust().accepted_tip.as_deref());
        let registered = status::StatusKeys::registrations(&desired.config);
        let mut refused_keys = Vec::new();
        let state = self
            .update(|s| {
                s.observe_desired(Some(&desired.id), tip.is_signed());
                if signed_mode {
                    s.accept_signed_tip(&tip_commit);
                } else if fresh {
                    s.accept_tip(&tip_commit);
                }
                refused_keys = s.pin_status_keys(&registered, tip.is_signed());
                Ok(())
            })
            .await?;
        for cluster in &refused_keys {
            let message = format!(
                "clusters/{cluster}.yaml registers a different statusKey than the one pinned here; keeping the pinned key until a commit signed by a promotion key changes it (statuses signed by the new key read as unverified)"
            );
            tracing::warn!(%cluster, "{message}");
            self.services.record_warning("StatusKeyChangeRefused", "Reconcile", &message).await;
        }
        match self.pause(&desired.config).await {
            Some(why) => return self.hold(&checkout, &desired, &state, why).await,
            None => self.resume_from_pause().await,
        }
        match state.next() {
            Next::Nothing if state.current() == Some(desired.id.as_str()) => {
                self.correct_drift(&checkout, &desired, &tip).await
            }
            Next::Nothing => Ok(Outcome::UpToDate),
            Next::Rejected { release, .. } => Ok(Outcome::Rejected(release.to_string())),
            Next::Start { .. } => Box::pin(self.start(&checkout, desired, &tip)).await,
            Next::Resume(_) => unreachable!("handled above"),
        }
    }

    /// Why the cluster is held on the release it runs, if it is: the agent's `--paused` flag, the
    /// state ConfigMap's [`PAUSED_ANNOTATION`](super::state::PAUSED_ANNOTATION) (both the spoke's
    /// own brake, which no commit can release), then the tip's `spec.paused` (the fleet's, then
    /// the cluster's). A pause from the tip needs no signature of its own: like the desired
    /// release, it only says *when* a signed release runs, and under signed promotions the tip
    /// itself is signed. An operation in flight is not held (a rollback must finish).
    pub async fn pause(&self, tip: &FleetConfig) -> Option<String> {
        let with = |by: String, reason: &str| match reason.trim() {
            "" => by,
            reason => format!("{by}: {reason}"),
        };
        use status::PAUSED_PREFIX;
        if let Some(reason) = &self.services.config.paused {
            return Some(with(format!("{PAUSED_PREFIX}the agent's --paused flag"), reason));
        }
        if let Some(reason) = self.services.store.paused_annotation().await {
            let (annotation, configmap) = (super::state::PAUSED_ANNOTATION, self.services.store.name());
            return Some(with(format!("{PAUSED_PREFIX}the annotation {annotation} on ConfigMap {configmap}"), &reason));
        }
        let cluster = &self.services.config.cluster;
        tip.paused(cluster).map(|by| format!("{PAUSED_PREFIX}{}", by.setting(cluster)))
    }

    /// A paused pass: nothing starts and drift is left alone. A release Git asks for gets one
    /// `pending` status that says why it waits, so the promotion PR and `fleetgate status` show
    /// the brake.
    async fn hold(
        &mut self,
        checkout: &Checkout,
        desired: &DesiredRelease,
        state: &AgentState,
        why: String,
    ) -> Result<Outcome, ReconcileError> {
        self.services.metrics.set_paused(true);
        let cluster = self.services.config.cluster.clone();
        let held = (why.clone(), desired.id.clone());
        if self.last_pause.as_ref() != Some(&held) {
            tracing::warn!(release = %desired.id, reason = %why, "holding the cluster on the release it runs");
            self.services.record_normal("Paused", "Reconcile", &format!("{why}; Git asks for {}", desired.id)).await;
            self.last_pause = Some(held);
            let running = state.current().unwrap_or("nothing yet");
            let message = format!("{why}; Git asks for {}, running {running}", desired.id);
            let wave = desired.config.wave_of(&cluster);
            let about = About::read(checkout, &desired.id, None, &TipTrust::Unsigned, wave);
            let paused = Notification::new(NotificationKind::Paused, &desired.id, "Paused", &message);
            self.notify(&desired.config, &Notification { about: Box::new(about), ..paused }).await;
            if matches!(state.next(), Next::Start { .. }) {
                let description = format!("{why}; holding {} here, running {running}", desired.id);
                self.say_pending(checkout, desired, &description).await?;
            }
        }
        Ok(Outcome::Paused { release: desired.id.clone(), reason: why })
    }

    /// Publishes a `pending` status of `desired` that says `description` (why it does not start),
    /// unless the cluster's latest status for it says just that (a restarted agent does not
    /// repeat itself).
    async fn say_pending(
        &self,
        checkout: &Checkout,
        desired: &DesiredRelease,
        description: &str,
    ) -> Result<(), ReconcileError> {
        let cluster = &self.services.config.cluster;
        let keys = self.status_keys(&desired.config).await?;
        let commit = desired.tag.commit;
        let statuses = tokio::task::block_in_place(|| status::read_all(checkout.repo(), &[commit], &keys))
            .map_err(status::StatusError::from)?;
        let status = Status::new(cluster, &desired.id, commit.to_string(), status::State::Pending, description);
        let said = statuses
            .latest(cluster, &desired.id)
            .is_some_and(|s| s.state == status::State::Pending && s.description == status.description);
        if !said {
            self.publish(&desired.config, &status).await;
        }
        Ok(())
    }

    /// The last rule of the wave gating: when the cluster's wave (`wave`, in the trusted `config`)
    /// requires approval, a move forward to `desired` needs one: a signed tag
    /// ([`release::check_approval`] with the approvers' keys), else an approving review of the
    /// promotion PR by an `--approver` login ([`Self::forge_approval`]).
    async fn approval(
        &self,
        checkout: &Checkout,
        config: &FleetConfig,
        wave: &str,
        desired: &DesiredRelease,
        movement: status::Move,
    ) -> Result<Approval, ReconcileError> {
        let required = config.fleet.spec.wave(wave).is_some_and(|(_, w)| w.approval == ApprovalSetting::Required);
        if !required || movement == status::Move::Back {
            return Ok(Approval::NotNeeded);
        }
        let verdict = tokio::task::block_in_place(|| {
            release::check_approval(checkout, self.approvers.as_ref(), &desired.id, desired.tag.commit, wave)
        })?;
        if let release::ApprovalVerdict::Approved(record) = verdict {
            return Ok(Approval::Given(record));
        }
        Ok(match self.forge_approval(checkout, &desired.id, wave).await {
            Some(record) => Approval::Given(record),
            None => Approval::Missing(verdict),
        })
    }

    /// An approving review, at its head, of the PR that promoted this cluster to `release`
    /// ([`release::promotion_head`]) by one of the agent's `--approver` logins, read from the
    /// agent's own forge: the forge authenticated the login, the agent's configuration says who
    /// may approve, the repo decides neither. None without a forge or approvers, and when the
    /// forge cannot be read (logged; the wave keeps waiting).
    async fn forge_approval(&self, checkout: &Checkout, release: &str, wave: &str) -> Option<ApprovalRecord> {
        let config = &self.services.config;
        let forge = config.forge.as_ref().filter(|_| !config.approvers.is_empty())?;
        let head = match tokio::task::block_in_place(|| release::promotion_head(checkout, &config.cluster, release)) {
            Ok(head) => head?,
            Err(e) => {
                let why = "could not find the promotion commit; its PR's approvals are not read";
                tracing::warn!(error = %error_chain(&e), "{why}");
                return None;
            }
        };
        let found = match status::ForgeBackend::from_config(forge).await {
            Ok(backend) => backend.approvals(&head.to_string(), &config.branch).await,
            Err(e) => Err(e),
        };
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "could not read the promotion PR's approvals");
                return None;
            }
        };
        let name = status::forge::forge_name(forge.kind);
        found.into_iter().find(|a| config.approvers.contains(&a.login)).map(|a| ApprovalRecord {
            by: format!("{} ({name} login)", a.login),
            why: if a.body.trim().is_empty() { format!("approved pull request #{}", a.pull) } else { a.body },
            wave: wave.to_string(),
            via: format!("{name} review of pull request #{} at {}", a.pull, crate::source::short(head)),
        })
    }

    /// The first pass after a pause ends: say so once.
    async fn resume_from_pause(&mut self) {
        if let Some((was, _)) = self.last_pause.take() {
            self.services.metrics.set_paused(false);
            tracing::info!(was = %was, "pause lifted; reconciling again");
            self.services.record_normal("Resumed", "Reconcile", &format!("no longer {was}")).await;
        }
    }

    /// The promotion mode in force: the agent's own setting, else signed once signed, else the
    /// tip's `fleet.yaml`.
    pub(super) fn promotion_mode(&self, state: &AgentState, tip_config: &FleetConfig) -> PromotionMode {
        release::effective_mode(
            self.services.config.promotions,
            state.trust().signed_promotions,
            tip_config.fleet.spec.promotions,
        )
    }

    /// How far this pass trusts the branch tip; an error when signed promotions refuse it.
    fn judge_tip(&self, checkout: &Checkout, state: &AgentState) -> Result<TipTrust, ReconcileError> {
        // An invalid tip configuration is reported by resolve; its mode falls back to unsigned.
        let tip_config = self.config_at_tip(checkout).ok();
        let tip_says = tip_config.as_ref().map(|c| c.fleet.spec.promotions).unwrap_or_default();
        let mode = release::effective_mode(self.services.config.promotions, state.trust().signed_promotions, tip_says);
        let keys = self.promotion_keys.as_ref().unwrap_or(&self.keyring);
        let accepted = state.trust().accepted_tip.as_deref();
        // Write-backs are checked with the pinned status keys (status::check_tip).
        let fleet = tip_config.as_ref().map(|c| self.fleet_name(state, c)).unwrap_or_default();
        let clusters = status::StatusKeys::from_openssh(&fleet, &state.trust().status_keys);
        Ok(tokio::task::block_in_place(|| status::check_tip(checkout, mode, keys, accepted, &clusters))?)
    }

    /// The configuration the safety settings of `release` (tagged at `commit`) come from: the
    /// tip's when a promotion key signed it, else the one in the release tag's own signed tree.
    pub(super) fn policy_config(
        &self,
        checkout: &Checkout,
        tip: &TipTrust,
        release: &str,
        commit: &str,
    ) -> Result<FleetConfig, ReconcileError> {
        if tip.is_signed() {
            return self.config_at_tip(checkout);
        }
        tokio::task::block_in_place(|| release::signed_config(checkout, release, commit))
            .map_err(ReconcileError::Verify)
    }

    /// Verification, the wave gate, pre-apply gates, then apply and bake.
    async fn start(
        &mut self,
        checkout: &Checkout,
        desired: DesiredRelease,
        tip: &TipTrust,
    ) -> Result<Outcome, ReconcileError> {
        let cluster = self.services.config.cluster.clone();
        let id = desired.id.clone();
        let commit = desired.tag.commit.to_string();

        // Verify first: a release that cannot be trusted (or may not run here now) is refused
        // wherever its wave stands, without touching anything.
        let wave = desired.config.wave_of(&cluster);
        // Then the variant this cluster's own facts select: none fitting is refused the same way.
        let verified = match self.verify(checkout, &desired, tip).await? {
            Verified::Release(verified) => self.for_this_cluster(verified).await?,
            refused @ Verified::Refused(_) => refused,
        };
        let verified = match verified {
            Verified::Release(verified) => verified,
            Verified::Refused(e) => {
                let about = About::read(checkout, &id, None, tip, wave);
                return self.refuse(&Run { checkout, config: &desired.config, about }, &id, commit, &e).await;
            }
        };
        let about = About::read(checkout, &id, Some(&verified), tip, wave);
        let config = match self.policy_config(checkout, tip, &id, &commit) {
            Ok(config) => config,
            Err(ReconcileError::Verify(e)) if e.class() == ErrorClass::Stalling => {
                return self.refuse(&Run { checkout, config: &desired.config, about }, &id, commit, &e).await;
            }
            Err(e) => return Err(e),
        };

        let keys = self.status_keys(&desired.config).await?;
        let statuses = tokio::task::block_in_place(|| status::read_all(checkout.repo(), &[desired.tag.commit], &keys))
            .map_err(status::StatusError::from)?;
        // What each cluster runs is the tip's to choose; waves, their membership and pacing, and how
        // many failures halt a release come from the trusted configuration, like the policies.
        let members = status::members_placed_by(&desired.config, &config);
        let state = self.services.store.load().await?;
        let (movement, returning_from) = movement(&state, &verified);
        let decision =
            status::may_start(&config.fleet, &members, &statuses, &cluster, &id, chrono::Utc::now(), movement);
        if !decision.allowed {
            // Renewed every waiting pass: the next syncs fetch sibling statuses only once the gate could open.
            let waits_for = decision.waits_for.iter().cloned().collect();
            self.source.notes_schedule().wait_on(waits_for, Instant::now());
            if let Some(at) = decision.retry_at {
                self.services.wake_at(at);
            }
            if self.last_wait.as_deref() != Some(decision.reason.as_str()) {
                tracing::info!(release = %id, reason = %decision.reason, "waiting for earlier waves");
                self.last_wait = Some(decision.reason.clone());
            }
            return Ok(Outcome::Waiting { release: id, reason: decision.reason });
        }
        // The wave may start: does it wait for a person? Its clusters say so in a pending status.
        let wave = members.iter().find(|m| m.name == cluster).map(|m| m.wave.clone()).unwrap_or_default();
        let approval = match self.approval(checkout, &config, &wave, &desired, movement).await? {
            Approval::NotNeeded => None,
            Approval::Given(record) => Some(record),
            Approval::Missing(verdict) => {
                let ignored = match &verdict {
                    release::ApprovalVerdict::Ignored(problem) => Some(problem.to_string()),
                    _ => None,
                };
                let reason = status::awaiting_approval(&id, &wave, ignored.as_deref());
                if self.last_wait.as_deref() != Some(reason.as_str()) {
                    tracing::info!(release = %id, %reason, "waiting for an approval");
                    if let Some(why) = &ignored {
                        self.services.record_warning("ApprovalIgnored", "Approve", why).await;
                    }
                    self.say_pending(checkout, &desired, &reason).await?;
                    self.last_wait = Some(reason.clone());
                }
                return Ok(Outcome::Waiting { release: id, reason });
            }
        };
        self.last_wait = None;
        match &approval {
            Some(a) => {
                tracing::info!(release = %id, reason = %decision.reason, approval = %a.summary(), "starting release")
            }
            None => tracing::info!(release = %id, reason = %decision.reason, "starting release"),
        }
        let run = Run { checkout, config: &config, about };
        self.step(&run, Step::Begin { release: id.clone(), commit }).await?;

        // Pre-apply gates: requirements, CRD compatibility, live CRs, admission, dry run.
        let returning = returning_from.is_some();
        let Prechecked { admitted, kept, .. } = match self.preapply(&verified, &config, returning, Check::Pass).await {
            Ok(Precheck::Passed(checked)) => checked,
            Ok(Precheck::Blocked(blocker)) => {
                let reason = format!("{}: {}", blocker.gate(), blocker.problems());
                self.step(&run, Step::Blocked(blocker)).await?;
                return Ok(Outcome::Blocked { release: id, reason });
            }
            Err(e) => return self.defer(&run, e).await,
        };

        let (baseline, snapshot, rollback_target) = match self.prepare(&config, &verified, &admitted).await {
            Ok(prepared) => prepared,
            Err(e) => return self.defer(&run, e).await,
        };
        let returning =
            returning_from.map(|from| Return { from, kept_crds: kept.into_iter().map(|k| k.name).collect() });
        self.step(&run, Step::StartApply { rollback_target, snapshot, approval, returning }).await?;
        self.apply_and_bake(&run, &verified, Some(admitted), baseline).await
    }

    /// The fleet this agent belongs to, once known: `--fleet`, else the name `state` pinned from
    /// the first accepted release. Read from the state each time, so a restarted agent holds
    /// its first pass (a resume, a rollback) to the pin as well.
    pub(super) fn pinned_fleet<'a>(&'a self, state: &'a AgentState) -> Option<&'a str> {
        self.services.config.fleet.as_deref().or(state.trust().fleet.as_deref())
    }

    /// [`Self::pinned_fleet`], else (before any release was accepted) the name in `config`, the
    /// tip's `fleet.yaml`.
    fn fleet_name(&self, state: &AgentState, config: &FleetConfig) -> String {
        self.pinned_fleet(state).unwrap_or(config.fleet.name()).to_string()
    }

    /// The keys statuses are believed with: the pinned ones ([`AgentState::pin_status_keys`]),
    /// for this agent's fleet.
    async fn status_keys(&self, config: &FleetConfig) -> Result<status::StatusKeys, ReconcileError> {
        let state = self.services.store.load().await?;
        Ok(status::StatusKeys::from_openssh(&self.fleet_name(&state, config), &state.trust().status_keys))
    }

    /// Refuses `id` (status `error`, rejected until a signed decision): it cannot be used here.
    async fn refuse(
        &mut self,
        run: &Run<'_>,
        id: &str,
        commit: String,
        e: &VerifyError,
    ) -> Result<Outcome, ReconcileError> {
        let message = error_chain(e);
        self.step(run, Step::Begin { release: id.to_string(), commit }).await?;
        self.step(run, Step::Refused { reason: verify_reason(e), message: message.clone() }).await?;
        Ok(Outcome::Refused { release: id.to_string(), reason: message })
    }

    /// Verifies the desired release against the trusted keys and the recorded tag pins (recording
    /// new ones and the fleet's name), then checks the move from what the cluster runs
    /// ([`release::check_move`]): [`Verified::Refused`] is a release that cannot be used, `Err(_)`
    /// trouble worth a retry.
    async fn verify(
        &mut self,
        checkout: &Checkout,
        desired: &DesiredRelease,
        tip: &TipTrust,
    ) -> Result<Verified, ReconcileError> {
        let state = self.services.store.load().await?;
        let judged = match self.judge(checkout, desired, tip.is_signed(), &state) {
            Ok(judged) => judged,
            // Reading the repo, verifying or storing a pin failed: nothing was decided.
            Err(e) if e.class() == ErrorClass::Retryable => return Err(ReconcileError::Verify(e)),
            Err(e) => return Ok(Verified::Refused(e)),
        };
        if judged.unseen {
            self.update(|s| {
                s.remember_revocations(&judged.revoked);
                Ok(())
            })
            .await?;
        }
        let verified = match judged.verdict {
            Verified::Release(v) => v,
            refused @ Verified::Refused(_) => return Ok(refused),
        };
        self.update(|s| {
            s.record_tag_pins(&judged.pins);
            s.pin_fleet(&judged.fleet);
            Ok(())
        })
        .await?;
        Ok(Verified::Release(verified))
    }

    /// The judgement of [`Self::verify`] over `state`, writing nothing: the release verified with
    /// a copy of the recorded tag pins, then the move checked against the revocations remembered
    /// and seen now and the newest release that ran here (`signed_decision`: the tip that asks
    /// for it is signed by a promotion key). Spoke plans judge a pull request's head with it.
    pub(super) fn judge(
        &mut self,
        checkout: &Checkout,
        desired: &DesiredRelease,
        signed_decision: bool,
        state: &AgentState,
    ) -> Result<Judged, VerifyError> {
        let mut pins = state.tag_pins().clone();
        let fleet = self.fleet_name(state, &desired.config);
        let (keyring, signed) = (&self.keyring, &mut self.signed_releases);
        // Revocations are remembered once seen (state), so deleting the tag that revoked a
        // release never makes it runnable again.
        let mut revoked = state.trust().revoked.clone();
        tokio::task::block_in_place(|| {
            let verified = release::verify(checkout, desired, keyring, Some(&fleet), &mut pins)?;
            let seen = signed.revocations(checkout, keyring, &pins, &fleet)?;
            let unseen = seen.iter().any(|(r, _)| !revoked.contains_key(r));
            for (release, by) in seen {
                revoked.entry(release).or_insert(by);
            }
            let newest = state.trust().newest.as_ref();
            let undo = match newest {
                Some(n) => {
                    signed.get(checkout, keyring, &pins, &fleet, &n.release)?.and_then(|r| r.spec.rollback_to.clone())
                }
                None => None,
            };
            let standing = release::Standing { newest, undo: undo.as_deref(), revoked: &revoked, signed_decision };
            let verdict = release::check_move(&verified, &standing).map(|()| verified).into();
            Ok(Judged { verdict, pins, revoked, unseen, fleet })
        })
    }

    /// What the apply needs ready: the gates' baseline (persisted with the operation), the
    /// snapshot of the current release (what applying `admitted` changes of it), the rollback
    /// target.
    async fn prepare(
        &self,
        config: &FleetConfig,
        verified: &VerifiedRelease,
        admitted: &AdmittedSet<'_>,
    ) -> Result<(gates::Baseline, Option<String>, Option<String>), ReconcileError> {
        let policy = gate_policy(config, &self.services.config.cluster);
        let prometheus = self.services.config.prometheus.for_policy(&policy)?;
        let baseline =
            gates::sample_baseline(&policy, prometheus, &self.services.client, &operator_target(config)).await?;
        let saved = serde_json::to_value(&baseline).expect("a baseline serializes");
        let sequence = verified.release().spec.sequence;
        self.update(|s| {
            s.record_baseline(saved.clone())?;
            s.record_sequence(sequence)
        })
        .await?;
        let snapshot = self.engine.snapshot_before(admitted).await?;
        stop_point::reached("snapshot.after-save").await;
        // The state machine keeps it only if it succeeded here (else: last-known-good).
        let rollback_to = verified.release().spec.rollback_to.clone();
        Ok((baseline, snapshot.map(|s| s.id), rollback_to))
    }

    /// Ends a pass that failed before the apply: the release is deferred (not rejected) and the
    /// error returned, so the next pass tries again.
    async fn defer(&mut self, run: &Run<'_>, e: ReconcileError) -> Result<Outcome, ReconcileError> {
        self.step(run, Step::Deferred { why: error_chain(&e) }).await?;
        Err(e)
    }

    /// The apply proper: `admitted` (admitting `verified` again when this pass has no set), then
    /// prune what the previous release had and this one dropped. A return ([`Return`]) keeps
    /// the CRDs its target would narrow and then restores the custom resources from the snapshot
    /// taken before the newer release replaced the target, as an automatic rollback does.
    async fn apply_and_prune(
        &self,
        verified: &VerifiedRelease,
        config: &FleetConfig,
        admitted: Option<AdmittedSet<'_>>,
        returning: bool,
    ) -> Result<(), ReconcileError> {
        let admitted = match admitted {
            Some(admitted) => admitted,
            None => {
                let mut admitted = self.engine.admit(verified, &self.admission_policy(config)).await?;
                if returning {
                    self.keep_wider_crds(&mut admitted, Some("Apply")).await?;
                }
                admitted
            }
        };
        let changes = self.engine.apply(admitted).await?;
        tracing::info!(release = verified.id(), changes = %changes.summary(), "applied");
        stop_point::reached("apply.after-all").await;
        self.engine.prune().await?;
        if returning {
            self.restore_from_before(verified.id(), config).await?;
        }
        Ok(())
    }

    /// The custom resources of `target` as they were before a newer release replaced it (the
    /// newest snapshot that holds `target`'s objects), when the agent still keeps one.
    async fn restore_from_before(&self, target: &str, config: &FleetConfig) -> Result<(), ReconcileError> {
        let snapshots = self.engine.snapshots().await?;
        match snapshots.iter().filter(|s| s.release == target).max_by_key(|s| s.created.clone()) {
            Some(snapshot) => self.restore_snapshot(&self.engine, &snapshot.id, target, config).await,
            None => {
                let note =
                    format!("{target} applied; no snapshot of {target} is kept, custom resources stay as they are");
                tracing::info!(target = %target, "{note}");
                self.services.record_normal("SnapshotNotFound", "Apply", &note).await;
                Ok(())
            }
        }
    }

    /// Applying → Baking → Idle, or a rollback. Also the path an agent restarted mid-apply takes:
    /// it has no `admitted` set from this pass's pre-apply stage and admits the release again.
    async fn apply_and_bake(
        &mut self,
        run: &Run<'_>,
        verified: &VerifiedRelease,
        admitted: Option<AdmittedSet<'_>>,
        baseline: gates::Baseline,
    ) -> Result<Outcome, ReconcileError> {
        let returning = self.services.store.load().await?.operation().is_some_and(|op| op.returning.is_some());
        let applied = self.apply_and_prune(verified, run.config, admitted, returning).await;
        if let Err(e) = applied {
            if e.class() == ErrorClass::Retryable && matches!(e, ReconcileError::Apply(ApplyError::Kube { .. })) {
                // The API server is unreachable: nothing can be rolled back either. Stay in
                // Applying; the next pass applies again.
                return Err(e);
            }
            let failure = Failure::new(e.reason(), error_chain(&e));
            return self.roll_back(run, failure, Vec::new()).await;
        }
        let bake_time = bake_policy(run.config, &self.services.config.cluster, returning).bake_time;
        self.step(run, Step::Applied { bake_time }).await?;
        self.bake(run, baseline).await
    }

    /// Bakes the applied release (until `applied_at + bakeTime`, also after a restart).
    async fn bake(&mut self, run: &Run<'_>, baseline: gates::Baseline) -> Result<Outcome, ReconcileError> {
        let config = run.config;
        let state = self.services.store.load().await?;
        let Progress::Baking { operation, applied_at } = state.progress() else {
            return Err(TransitionError::WrongPhase { action: "bake", phase: state.phase(), needs: "Baking" }.into());
        };
        let policy = bake_policy(config, &self.services.config.cluster, operation.returning.is_some());
        let bake_time = policy.bake_time;
        let prometheus = self.services.config.prometheus.for_policy(&policy)?;
        let runner = GateRunner::new(
            policy,
            prometheus,
            self.services.client.clone(),
            operator_target(config),
            *applied_at,
            baseline,
        )?;
        let metrics = self.services.metrics.clone();
        stop_point::reached("bake.started").await;
        let verdict = runner
            .run(|round| {
                for e in &round.evaluations {
                    metrics.record_gate_evaluation(&e.gate, verdict_text(&e.verdict));
                }
                tracing::info!(round = round.number, gates = %summary(&round.evaluations), "gate round");
            })
            .await;
        match verdict {
            BakeVerdict::Passed { ref evaluations, .. } => {
                // Stored before the verdict is persisted: an agent killed in between bakes again
                // and stores the same bytes again, while one killed after it would never store
                // them (it finds the release done).
                self.keep_last_known_good(run.checkout, &operation.release).await;
                self.step(run, Step::Passed { bake_time, figures: figures(evaluations) }).await?;
                Ok(Outcome::Succeeded(operation.release.clone()))
            }
            BakeVerdict::Failed { ref gate, ref evaluations, .. } => {
                let failure = Failure::new("GateFailed", gate.to_string());
                self.roll_back(run, failure, figures(evaluations)).await
            }
        }
    }

    /// Picks up an operation a previous run of the agent left unfinished.
    async fn resume(
        &mut self,
        checkout: &Checkout,
        progress: Progress,
        tip: &TipTrust,
    ) -> Result<Outcome, ReconcileError> {
        let Some(operation) = progress.operation() else { return Ok(Outcome::UpToDate) };
        tracing::warn!(release = %operation.release, phase = %progress.phase(), "resuming an unfinished operation");
        let config = self.policy_config(checkout, tip, &operation.release, &operation.commit)?;
        let about = {
            // Boxed, and dropped before the operation resumes: the loop's future stays small.
            let verified = Box::pin(self.verify_known(checkout, &operation.release)).await.ok();
            let wave = config.wave_of(&self.services.config.cluster);
            About::read(checkout, &operation.release, verified.as_ref(), tip, wave)
        };
        let run = Run { checkout, config: &config, about };
        match &progress {
            Progress::Idle => Ok(Outcome::UpToDate),
            Progress::Verifying(_) => {
                // Nothing was applied yet: start over from the current Git state.
                self.step(&run, Step::Deferred { why: "the agent restarted while verifying".into() }).await?;
                Ok(Outcome::UpToDate)
            }
            Progress::Applying(op) => {
                let verified = match self.verify_known(checkout, &op.release).await {
                    Ok(v) => v,
                    Err(e) => {
                        let failure = Failure::new("VerificationFailed", error_chain(&e));
                        return self.roll_back(&run, failure, Vec::new()).await;
                    }
                };
                let baseline = self.saved_baseline(&config, op.baseline.clone()).await?;
                self.apply_and_bake(&run, &verified, None, baseline).await
            }
            Progress::Baking { operation, .. } => {
                let baseline = self.saved_baseline(&config, operation.baseline.clone()).await?;
                self.bake(&run, baseline).await
            }
            Progress::RollingBack(_) => self.finish_rollback(&run).await,
        }
    }

    /// The baseline an operation persisted; without one (or one a newer agent wrote) a sample
    /// taken now, the best that is left.
    async fn saved_baseline(
        &self,
        config: &FleetConfig,
        saved: Option<serde_json::Value>,
    ) -> Result<gates::Baseline, ReconcileError> {
        match saved.map(serde_json::from_value) {
            Some(Ok(b)) => Ok(b),
            _ => {
                let policy = gate_policy(config, &self.services.config.cluster);
                let prometheus = self.services.config.prometheus.for_policy(&policy)?;
                Ok(gates::sample_baseline(&policy, prometheus, &self.services.client, &operator_target(config)).await?)
            }
        }
    }

    pub(super) fn config_at_tip(&self, checkout: &Checkout) -> Result<FleetConfig, ReconcileError> {
        let tree = checkout.tip_tree()?;
        FleetConfig::load(&tree).map_err(|source| {
            release::ResolveError::Config { commit: crate::source::short(checkout.tip()), source }.into()
        })
    }

    /// Resolves and verifies a release this agent already accepted once (resume, rollback
    /// target), against the tag pins it recorded then, as this cluster runs it
    /// ([`Self::for_this_cluster`]).
    pub(super) async fn verify_known(&self, checkout: &Checkout, id: &str) -> Result<VerifiedRelease, ReconcileError> {
        let state = self.services.store.load().await?;
        let mut pins = state.tag_pins().clone();
        let verified = tokio::task::block_in_place(|| {
            let desired = release::resolve_release(checkout, &self.services.config.cluster, id)?;
            release::verify(checkout, &desired, &self.keyring, self.pinned_fleet(&state), &mut pins)
                .map_err(ReconcileError::Verify)
        })?;
        self.for_this_cluster(verified).await?.or_error()
    }

    /// `verified` as this cluster runs it: the variant its live facts (server version, node
    /// architectures) and the agent's own `labels` select — never the branch's `clusters/`
    /// labels. A release without variants is returned as it is, without reading the cluster.
    /// [`Verified::Refused`]: no variant fits; `Err(_)`: the facts could not be read.
    pub(super) async fn for_this_cluster(&self, verified: VerifiedRelease) -> Result<Verified, ReconcileError> {
        if verified.release().spec.variants.is_empty() {
            return Ok(Verified::Release(verified));
        }
        let facts = gates::read_cluster_facts(&self.services.client, PREAPPLY_CALL_TIMEOUT).await?;
        let selected = verified.for_cluster(&facts, &self.services.config.labels);
        if let Ok(v) = &selected {
            tracing::debug!(release = v.id(), variant = v.variant(), "variant selected by the cluster's facts");
        }
        Ok(selected.into())
    }

    pub(super) fn admission_policy(&self, config: &FleetConfig) -> AdmissionPolicy {
        AdmissionPolicy::effective(self.admission_baseline.clone(), &config.admission_policies)
    }

    /// The manifests stage and the pre-apply gates: [`Precheck::Passed`] may be applied,
    /// [`Precheck::Blocked`] refuses the release, naming the check that did.
    /// A return (`returning`) first keeps the live CRDs the target would narrow, so the CRD gate
    /// judges what will really be applied; they are returned with the set (and, in a pass,
    /// recorded as Events; a plan keeps nothing).
    pub(super) async fn preapply<'r>(
        &self,
        verified: &'r VerifiedRelease,
        config: &FleetConfig,
        returning: bool,
        check: Check,
    ) -> Result<Precheck<'r>, ReconcileError> {
        let mut admitted = match self.engine.admit(verified, &self.admission_policy(config)).await {
            Ok(admitted) => admitted,
            Err(e) if e.class() == ErrorClass::Stalling => {
                return Ok(Precheck::Blocked(Blocker::Admission(error_chain(&e))));
            }
            Err(e) => return Err(e.into()),
        };
        let kept = match returning {
            true => self.keep_wider_crds(&mut admitted, (check == Check::Pass).then_some("Verify")).await?,
            false => Vec::new(),
        };
        // Gates read with the agent's permissions: only the release's own kinds, or the spoke's.
        let allowed = &self.services.config.allowed_gate_kinds;
        if let Err(e) =
            gates::check_gate_kinds(&gate_policy(config, &self.services.config.cluster), admitted.crds(), allowed)
        {
            return Ok(Precheck::Blocked(Blocker::GatePolicy(e.to_string())));
        }
        let accept = match gates::crd_compat::Acceptance::parse_all(&verified.release().spec.accept_crd_changes) {
            Ok(accept) => accept,
            Err(why) => return Ok(Precheck::Blocked(Blocker::Admission(why))),
        };
        // The dry run before the gates: it asks the API server, object by object, whether the agent
        // may write the release at all, and what its RBAC lacks (ApplyError::Forbidden) is said
        // before a gate meets the same 403 reading live state. Its verdicts on the release itself
        // come after the gates', which say more.
        let dry_run = self.engine.dry_run(&admitted).await;
        if let Err(e @ ApplyError::Forbidden(_)) = dry_run {
            return Err(e.into());
        }
        let report = gates::preapply(
            &self.services.client,
            admitted.crds(),
            verified.release().spec.requires.as_ref(),
            &accept,
            PREAPPLY_CALL_TIMEOUT,
        )
        .await?;
        if let Some(block) = report.blocked {
            return Ok(Precheck::Blocked(Blocker::Gate(block)));
        }
        match dry_run {
            Ok(dry_run) => Ok(Precheck::Passed(Prechecked { admitted, kept, dry_run })),
            // Taking over a live object fleetgate did not apply: refused like any admission rule.
            Err(e @ ApplyError::Admission(_)) => Ok(Precheck::Blocked(Blocker::Admission(error_chain(&e)))),
            Err(e) if e.class() == ErrorClass::Stalling => Ok(Precheck::Blocked(Blocker::DryRun(error_chain(&e)))),
            Err(e) => Err(e.into()),
        }
    }

    /// Changes the persisted state (optimistic concurrency in the store) without a transition.
    pub(super) async fn update(
        &self,
        change: impl FnMut(&mut AgentState) -> Result<(), TransitionError>,
    ) -> Result<AgentState, ReconcileError> {
        let (state, ()) = self.services.store.update(change).await?;
        self.services.metrics.observe_state(&state);
        Ok(state)
    }

    /// One step of the pipeline: [`conclude`] computes its report on the persisted state (under
    /// the store's optimistic concurrency), then this writes what it returned — log line, Event,
    /// metrics, the status to Git, the notification, the write-back.
    pub(super) async fn step(&mut self, run: &Run<'_>, step: Step) -> Result<Report, ReconcileError> {
        let (config, cluster) = (run.config, self.services.config.cluster.clone());
        let write_back = self.services.config.write_back;
        let ctx = Context { cluster: &cluster, now: Utc::now(), write_back, about: &run.about };
        let delivered = self.take_delivered();
        let written = self
            .services
            .store
            .update(|s| {
                delivered.iter().for_each(|d| s.reported(d));
                conclude(s, &step, &ctx)
            })
            .await;
        let (state, report) = written.inspect_err(|_| self.keep_delivered(delivered))?;
        stop_point::reached(&format!("step.{}.after-persist", step.name())).await;
        self.services.metrics.observe_state(&state);
        if let Some(t) = &report.transition {
            self.record_transition(t).await;
        }
        if let Some(status) = &report.status {
            self.publish(config, status).await;
        }
        if let Some(n) = &report.notification {
            self.notify(config, n).await;
        }
        if let Some(wb) = &report.write_back {
            self.write_back(wb, report.status.as_ref().map(|s| (config, s))).await;
        }
        Ok(report)
    }

    /// Logs a transition and records it as an Event on the state ConfigMap.
    async fn record_transition(&self, t: &Transition) {
        tracing::info!(release = %t.release, from = %t.from, to = %t.to, reason = t.reason, "{}", t.message);
        match self.services.store.object_ref().await {
            Ok(regarding) => {
                if let Err(e) = self.services.events.transition(&regarding, t).await {
                    tracing::warn!(error = %error_chain(&e), "could not record an Event");
                }
            }
            Err(e) => tracing::warn!(error = %error_chain(&e), "could not reference the state ConfigMap for an Event"),
        }
    }

    /// Writes a status to Git (and the forge). A status that cannot be written is logged, not
    /// fatal: the cluster's state is already decided and persisted; the next pass does not
    /// repeat the release, so the failure is also recorded as an Event.
    async fn publish(&self, config: &FleetConfig, status: &Status) {
        let publisher = self.publisher(config).await;
        match self.deliver(&publisher, status).await {
            Ok(super::outbox::Delivery::Written) => {
                tracing::info!(release = %status.release, state = status.state.as_str(), "{}", status.description);
                self.mirror_on_promotion(&publisher, status).await;
            }
            Ok(super::outbox::Delivery::Queued { why }) => {
                let note = format!(
                    "status {} of {} waits in the outbox until Git answers: {why}",
                    status.state.as_str(),
                    status.release
                );
                tracing::warn!(release = %status.release, "{note}");
                self.services.record_warning("StatusQueued", "Publish", &note).await;
            }
            Err(e) => {
                tracing::error!(release = %status.release, error = %error_chain(&e), "could not write the status");
                self.record_error(&ReconcileError::Status(e)).await;
            }
        }
    }

    /// Git notes, and the agent's own forge (`--forge-*`) unless the fleet switched it off. The
    /// forge, its token and every other destination are never the repo's: a setting in the repo
    /// that still names one is ignored, with a Warning Event `RepoSettingIgnored` each time a
    /// status is written (so whoever reads the cluster's Events learns why).
    pub(super) async fn publisher(&self, config: &FleetConfig) -> Publisher {
        for ignored in config.spoke_settings() {
            tracing::warn!(document = %ignored.document, key = ignored.key, "{}", ignored.message);
            self.services.record_warning("RepoSettingIgnored", "Publish", &ignored.message).await;
        }
        let remote = GitRemote::new(self.source.url());
        let remote = match self.services.config.git_credentials.to_source() {
            Ok(creds) => remote.with_access(creds),
            Err(_) => remote,
        };
        // The state as last loaded or saved (start loads it): a publisher is made for each status.
        let state = self.services.store.cached().await.unwrap_or_default();
        let identity =
            status::StatusIdentity::new(self.fleet_name(&state, config), self.services.status_signer.clone());
        let git = GitNotesBackend::new(self.source.state_dir().join("mirror.git"), remote, identity);
        let forge = match &self.services.config.forge {
            Some(forge) if config.fleet.spec.status.forge_enabled() => {
                match status::ForgeBackend::from_config(forge).await {
                    Ok(b) => Some(b),
                    Err(e) => {
                        tracing::warn!(error = %error_chain(&e), "forge statuses disabled");
                        None
                    }
                }
            }
            _ => None,
        };
        Publisher::new(git, forge)
    }

    /// Queues the notification for the agent's endpoint the fleet names (`spec.status.notify`),
    /// when the agent has any; delivery happens in the background (a receiver never holds up a
    /// rollback). An endpoint the agent lacks is recorded as a Warning Event (a configuration
    /// problem someone must fix).
    async fn notify(&self, config: &FleetConfig, n: &Notification) {
        let Some(notifier) = &self.services.notifier else { return };
        if let Err(e) = notifier.enqueue(config.fleet.spec.status.notify_endpoint(), n.clone()) {
            tracing::warn!(error = %error_chain(&e), "notification not sent");
            self.services.record_warning("NotifyEndpointUnknown", "Notify", &error_chain(&e)).await;
        }
    }

    async fn record_error(&self, e: &ReconcileError) {
        if let Ok(regarding) = self.services.store.object_ref().await
            && let Err(err) = self.services.events.error(&regarding, e.reason(), "Reconcile", e).await
        {
            tracing::warn!(error = %error_chain(&err), "could not record an Event");
        }
    }
}

/// What the stages of one operation share within a pass, built where the pass learns it
/// ([`Agent::start`], [`Agent::resume`]) and handed to each stage: the agent keeps none of it
/// between passes or stages.
pub(super) struct Run<'p> {
    /// The fleet repo as this pass read it.
    pub checkout: &'p Checkout,
    /// The configuration the operation's statuses, notifications and policies go by.
    pub config: &'p FleetConfig,
    /// The release in progress as the notifications describe it.
    pub about: About,
}

/// Who runs the pre-apply checks ([`Agent::preapply`]): a pass, which records what it keeps as
/// Events, or a spoke plan, which records nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    Pass,
    Plan,
}

/// A release through the manifests stage and the pre-apply gates ([`Agent::preapply`]).
pub(super) struct Prechecked<'r> {
    pub admitted: AdmittedSet<'r>,
    /// Live CRDs a return keeps instead of the target's narrower ones.
    pub kept: Vec<crd_compat::KeptCrd>,
    /// The server-side dry run of `admitted`.
    pub dry_run: crate::apply::DryRun,
}

/// Errors that stop the agent from starting at all.
#[derive(Debug, thiserror::Error)]
pub enum AgentStartError {
    #[error("opening the fleet repo")]
    Source(#[from] SourceError),
    #[error("reading the trusted keys (check --trusted-keys)")]
    Trust(#[from] release::TrustError),
    #[error(transparent)]
    Config(#[from] super::config::ConfigError),
}

/// The Event/metrics reason of a refused release.
fn verify_reason(e: &VerifyError) -> &'static str {
    match e {
        VerifyError::Lightweight { .. } | VerifyError::Unsigned { .. } => "ReleaseUnsigned",
        VerifyError::TagNameMismatch { .. } | VerifyError::MovedTag { .. } => "TagMoved",
        VerifyError::UnsupportedSignature { .. }
        | VerifyError::UntrustedKey { .. }
        | VerifyError::BadSignature { .. }
        | VerifyError::InvalidSignature { .. }
        | VerifyError::CommitSignature { .. } => "SignatureInvalid",
        VerifyError::NotTargeted { .. } => "NotTargeted",
        VerifyError::MappingMismatch { .. } => "MappingMismatch",
        VerifyError::OtherFleet { .. } => "OtherFleet",
        VerifyError::Revoked { .. } => "ReleaseRevoked",
        VerifyError::Downgrade { .. } => super::state::NEEDS_SIGNED_DECISION,
        VerifyError::SignedConfig { .. } => "SignedConfigInvalid",
        VerifyError::NoVariant { .. } => "NoVariantFits",
        VerifyError::Pins(_) | VerifyError::Source(_) | VerifyError::Tree(_) => "VerifyFailed",
    }
}

/// Which way moving to `verified` goes from what `state` says ran here, and, when it goes back
/// to a release that passed its bake here (a rollback, whoever asked for it), the release it
/// returns from. Back to one this cluster never ran is a promotion like any other, judged as one.
pub(super) fn movement(state: &AgentState, verified: &VerifiedRelease) -> (status::Move, Option<String>) {
    let id = verified.id();
    let newest = state.trust().newest.as_ref().map(|n| n.sequence);
    let back = newest.is_some_and(|n| verified.release().spec.sequence.is_none_or(|s| s < n));
    let movement = if back { status::Move::Back } else { status::Move::Forward };
    let returning_from = state.current().filter(|c| back && *c != id && state.succeeded_here(id)).map(str::to_string);
    (movement, returning_from)
}

/// Gates of a fleet repo without a `GatePolicy`: the seed's Kubernetes-side gates.
const DEFAULT_GATE_POLICY: &str = "
bakeTime: 5m
interval: 10s
gates:
  - name: operator-available
    deploymentAvailable: {}
  - name: pod-restarts
    podRestarts: { max: 3 }
";

/// The gate policy of `cluster`: the first `GatePolicy` in `policies/` that selects it (with the
/// gates that select it, [`FleetConfig::gate_policy_for`]), else [`DEFAULT_GATE_POLICY`].
/// `config` is the one the policies are trusted from ([`Agent::policy_config`]), so the
/// selectors see that tree's wave and labels of the cluster, never an unsigned tip's.
pub(super) fn gate_policy(config: &FleetConfig, cluster: &str) -> GatePolicySpec {
    match config.gate_policy_for(cluster) {
        Some(p) => p,
        None => crate::model::parse_yaml("the built-in gate policy", DEFAULT_GATE_POLICY)
            .expect("the built-in gate policy parses"),
    }
}

/// The gate policy a bake runs with: [`gate_policy`], baked for its `rollbackBakeTime` when the
/// operation returns to a release that passed here before.
fn bake_policy(config: &FleetConfig, cluster: &str, returning: bool) -> GatePolicySpec {
    let policy = gate_policy(config, cluster);
    match returning {
        true => GatePolicySpec { bake_time: policy.rollback_bake(), ..policy },
        false => policy,
    }
}

/// The Operator's namespace from `fleet.yaml`; its gates look at everything there.
pub(super) fn operator_target(config: &FleetConfig) -> OperatorTarget {
    OperatorTarget { namespace: config.fleet.spec.operator.namespace.clone(), selector: String::new() }
}

pub(super) fn figures(evaluations: &[GateEvaluation]) -> Vec<GateFigure> {
    evaluations
        .iter()
        .map(|e| GateFigure {
            name: e.gate.clone(),
            observed: observed_text(e),
            threshold: e.threshold.to_string(),
            verdict: verdict_text(&e.verdict).to_string(),
        })
        .collect()
}

fn observed_text(e: &GateEvaluation) -> String {
    match (&e.observed, &e.verdict) {
        (Some(q), _) => q.to_string(),
        (None, Verdict::Unknown { reason }) => format!("unknown ({reason})"),
        (None, _) => String::new(),
    }
}

fn verdict_text(v: &Verdict) -> &'static str {
    match v {
        Verdict::Pass => "pass",
        Verdict::Fail => "fail",
        Verdict::Unknown { .. } => "unknown",
    }
}

fn summary(evaluations: &[GateEvaluation]) -> String {
    evaluations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}
