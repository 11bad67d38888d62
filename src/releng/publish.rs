//! Sending out what [`promote`](super::promote), [`rollback`](super::rollback) and
//! [`pause`](super::pause) wrote: push the
//! branch to a remote, then open the pull/merge request through the caller's forge
//! ([`PublishOptions::forge`], never the repo's). Each command is one call here: check the forge (before anything is
//! written), write the commit, publish it. A failure while publishing keeps what was done, so
//! the report can still show the pushed branch.

use super::forge_pr::{self, OpenedPullRequest, PullRequestSpec};
use super::pause::{self, PauseReport, PauseRequest};
use super::promote::{self, PromoteOutcome, PromoteReport, PromoteRequest};
use super::push::{self, Pushed};
use super::rollback::{self, RollbackReport, RollbackRequest};
use super::{FleetRepo, RelengError, Signer};
use crate::release::Keyring;
use crate::source::Credentials;
use crate::status::{self, ForgeConfig, ForgeSettings, GitRemote, Token};

/// Where the new commit goes besides the local clone.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    /// Push the commit's branch.
    pub push: bool,
    /// Push, and open a pull/merge request (a rollback then commits on a new branch).
    pub open_pr: bool,
    /// A remote name or URL; a promotion also fetches statuses from it.
    pub remote: String,
    /// The forge `open_pr` opens the request on: the caller's flags and environment.
    pub forge: ForgeSettings,
    /// How to reach the remote (pushing, fetching statuses).
    pub access: Credentials,
}

/// A command's report with what publishing did, and the error that stopped it after the commit
/// was written.
#[derive(Debug)]
pub struct Published<R> {
    pub report: R,
    pub pushed: Option<Pushed>,
    pub pull_request: Option<OpenedPullRequest>,
    pub error: Option<RelengError>,
}

/// The forge and its token for `--open-pr`.
struct ForgeAccess {
    settings: ForgeConfig,
    token: Token,
}

/// The caller's forge and its token when `opts.open_pr` asks for one, read before anything is
/// written.
async fn forge_if(opts: &PublishOptions) -> Result<Option<ForgeAccess>, RelengError> {
    if !opts.open_pr {
        return Ok(None);
    }
    let settings = opts.forge.clone().resolve().map_err(forge_pr::ForgeError::from)?.ok_or(RelengError::NoForge)?;
    let token = Token::obtain(&settings).await.map_err(forge_pr::ForgeError::from)?;
    Ok(Some(ForgeAccess { settings, token }))
}

/// Folds the remote's status notes into the local clone, when the remote exists. Returns
/// whether there was one to fetch from.
pub fn fetch_statuses(repo: &FleetRepo, remote: &str, access: &Credentials) -> Result<bool, RelengError> {
    let url = match repo.git().find_remote(remote) {
        Ok(r) => r.url().ok().map(str::to_string),
        Err(_) if remote.contains("://") => Some(remote.to_string()),
        Err(_) => None,
    };
    let Some(url) = url else { return Ok(false) };
    let git_remote = GitRemote::new(url).with_access(access.clone());
    status::sync(repo.git(), &git_remote)
        .map_err(|source| RelengError::StatusFetch { remote: crate::model::redact_userinfo(remote), source })?;
    Ok(true)
}

/// Pushes branch `spec.head` when `push`, then opens `spec` on `forge` when given; stops at the
/// first failure.
async fn publish<R>(
    repo: &FleetRepo,
    opts: &PublishOptions,
    push: bool,
    forge: Option<ForgeAccess>,
    report: R,
    spec: PullRequestSpec,
) -> Published<R> {
    let mut done = Published { report, pushed: None, pull_request: None, error: None };
    if push {
        match push::push(repo, &opts.remote, &[format!("refs/heads/{}", spec.head)], &opts.access) {
            Ok(p) => done.pushed = Some(p),
            Err(e) => {
                done.error = Some(e);
                return done;
            }
        }
    }
    if let Some(forge) = forge {
        match forge_pr::open(&forge.settings, forge.token.secret(), &spec).await {
            Ok(opened) => done.pull_request = Some(opened),
            Err(e) => done.error = Some(RelengError::Forge(e)),
        }
    }
    done
}

/// Fetches statuses from `opts.remote` (unless `offline`), prepares the promotion
/// ([`promote::promote`]) and publishes it; a promotion that changes nothing is not published.
///
/// # Errors
/// Before anything is written: no forge or token for `--open-pr`, statuses that cannot be
/// fetched, and every error and refusal of [`promote::promote`]. Publishing failures come back in
/// [`Published::error`].
pub async fn promote_and_publish(
    repo: &FleetRepo,
    req: &PromoteRequest,
    trusted: Option<&Keyring>,
    signer: Option<&mut Signer>,
    opts: &PublishOptions,
    offline: bool,
) -> Result<Published<PromoteReport>, RelengError> {
    let forge = forge_if(opts).await?;
    if !offline {
        fetch_statuses(repo, &opts.remote, &opts.access)?;
    }
    let report = promote::promote(repo, req, trusted, signer)?;
    let changed = report.outcome != PromoteOutcome::AlreadyPromoted;
    let spec = pull_request(report.title(), report.pr_body(), &report.branch, &report.base);
    let push = (opts.push || opts.open_pr) && changed;
    Ok(publish(repo, opts, push, forge.filter(|_| changed), report, spec).await)
}

/// Fetches statuses from `opts.remote` (unless `offline`), writes the rollback
/// ([`rollback::rollback`]) and publishes it. With `--open-pr` and no branch asked for, the commit
/// goes on a new branch `rollback/<target>-<UTC time>`. A dry run writes and publishes nothing.
///
/// # Errors
/// As [`promote_and_publish`], for [`rollback::rollback`].
pub async fn roll_back_and_publish(
    repo: &FleetRepo,
    mut req: RollbackRequest,
    signer: Option<&mut Signer>,
    opts: &PublishOptions,
    offline: bool,
) -> Result<Published<RollbackReport>, RelengError> {
    if !offline {
        fetch_statuses(repo, &opts.remote, &opts.access)?;
    }
    if req.dry_run {
        let report = rollback::rollback(repo, &req, None)?;
        return Ok(Published { report, pushed: None, pull_request: None, error: None });
    }
    let forge = forge_if(opts).await?;
    if req.branch.is_none() && opts.open_pr {
        req.branch = Some(format!("rollback/{}-{}", req.target.slug(), chrono::Utc::now().format("%Y%m%d-%H%M%S")));
    }
    let report = rollback::rollback(repo, &req, signer)?;
    let spec = pull_request(report.title(), report.pr_body(), &report.branch, &report.base);
    Ok(publish(repo, opts, opts.push || opts.open_pr, forge, report, spec).await)
}

/// Writes the pause or resume ([`pause::set_paused`]) and publishes it; with `--open-pr` and no
/// branch asked for, on a new branch `pause/<target>-<UTC time>` (or `resume/…`). A target that
/// already is as asked is not published.
///
/// # Errors
/// As [`promote_and_publish`], for [`pause::set_paused`].
pub async fn pause_and_publish(
    repo: &FleetRepo,
    mut req: PauseRequest,
    signer: Option<&mut Signer>,
    opts: &PublishOptions,
) -> Result<Published<PauseReport>, RelengError> {
    let forge = forge_if(opts).await?;
    if req.branch.is_none() && opts.open_pr {
        let verb = if req.paused { "pause" } else { "resume" };
        req.branch = Some(format!("{verb}/{}-{}", req.target.slug(), chrono::Utc::now().format("%Y%m%d-%H%M%S")));
    }
    let report = pause::set_paused(repo, &req, signer)?;
    let changed = report.commit.is_some();
    let spec = pull_request(report.title(), report.pr_body(), &report.branch, &report.base);
    Ok(publish(repo, opts, (opts.push || opts.open_pr) && changed, forge.filter(|_| changed), report, spec).await)
}

fn pull_request(title: String, body: String, head: &str, base: &str) -> PullRequestSpec {
    PullRequestSpec { title, body, head: head.to_string(), base: base.to_string() }
}
