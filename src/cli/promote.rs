//! `fleetgate promote ID (--cluster C | --wave W | --fleet)`: fetch statuses, check and prepare the
//! promotion branch ([`fleetgate::releng::promote::promote`]), push it, open the PR.

use super::output::OutputFormat;
use super::release::{CommitSigning, Done, crd_line, fail, has_remote, heading, next, print_moves};
use crate::model::ForgeSettings;
use crate::release::{Keyring, TrustConfig};
use crate::releng::forge_pr::{self, OpenedPullRequest, PullRequestSpec};
use crate::releng::promote::{self, PromoteOutcome, PromoteReport, PromoteRequest};
use crate::releng::push::{self, Pushed};
use crate::releng::{FleetRepo, RelengError, Target};
use crate::status::Token;
use std::path::PathBuf;
use std::process::ExitCode;

/// Which clusters: exactly one of `--cluster`, `--wave`, `--fleet`.
#[derive(Debug, Clone, clap::Args)]
#[group(required = true, multiple = false)]
pub struct TargetArgs {
    /// One cluster (clusters/<NAME>.yaml).
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// Every cluster of a wave (fleet.yaml spec.waves).
    #[arg(long, value_name = "WAVE")]
    pub wave: Option<String>,
    /// The whole fleet: fleet.yaml spec.release, and every cluster pin dropped.
    #[arg(long)]
    pub fleet: bool,
}

impl TargetArgs {
    pub fn target(&self) -> Target {
        match (&self.cluster, &self.wave) {
            (Some(c), _) => Target::Cluster(c.clone()),
            (None, Some(w)) => Target::Wave(w.clone()),
            (None, None) => Target::Fleet,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The release id (its tag).
    pub id: String,
    #[command(flatten)]
    pub target: TargetArgs,
    /// The fleet repo (a clone; bare or not).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// The branch to create (default: promote/<ID>-<target>).
    #[arg(long)]
    pub branch: Option<String>,
    /// The branch the promotion merges into.
    #[arg(long, default_value = "main")]
    pub base: String,
    /// Armored public keys the agents trust; the release tag must be signed by one (repeatable).
    #[arg(long, value_name = "FILE", env = "FLEETGATE_TRUSTED_KEYS", value_delimiter = ',')]
    pub trusted_keys: Vec<PathBuf>,
    /// Promote despite refusals (unsigned, not targeted, failed earlier wave); each is recorded.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub signing: CommitSigning,
    /// Push the branch.
    #[arg(long)]
    pub push: bool,
    /// Push the branch and open a pull/merge request through fleet.yaml spec.status.forge.
    #[arg(long)]
    pub open_pr: bool,
    /// Remote to fetch statuses from and push to (a name or URL).
    #[arg(long, default_value = "origin")]
    pub remote: String,
    /// Use the statuses already in the local clone instead of fetching them from --remote.
    #[arg(long)]
    pub offline: bool,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// The forge and its token when `--open-pr` was asked for, checked before anything is written.
pub(super) fn forge_for_pr(repo: &FleetRepo, base: &str) -> Result<(ForgeSettings, Token), RelengError> {
    let tip = repo.branch_tip(base)?;
    let state = repo.fleet_state(&tip.tree()?, base)?;
    let forge = state.config.fleet.spec.status.forge.clone().ok_or_else(|| {
        RelengError::Usage(
            "--open-pr needs a forge: add spec.status.forge {kind, url, repository, tokenEnv} to fleet.yaml, or push and open the PR by hand"
                .into(),
        )
    })?;
    let token = Token::from_settings(&forge).map_err(forge_pr::ForgeError::from)?;
    Ok((forge, token))
}

/// What `--push` and `--open-pr` did with the new branch, and the error that stopped them.
pub(super) struct Published {
    pub pushed: Option<Pushed>,
    pub pr: Option<OpenedPullRequest>,
    pub error: Option<RelengError>,
}

/// Pushes branch `spec.head` to `remote` when `push`, then opens `spec` on `forge` when one is
/// given. Stops at the first failure and keeps what was done, so the report can still show it.
pub(super) async fn publish(
    repo: &FleetRepo,
    remote: &str,
    push: bool,
    forge: Forge,
    spec: PullRequestSpec,
) -> Published {
    let mut done = Published { pushed: None, pr: None, error: None };
    if push {
        match push::push(repo, remote, &[format!("refs/heads/{}", spec.head)]) {
            Ok(p) => done.pushed = Some(p),
            Err(e) => {
                done.error = Some(e);
                return done;
            }
        }
    }
    if let Some((forge, token)) = forge {
        match forge_pr::open(&forge, token.secret(), &spec).await {
            Ok(opened) => done.pr = Some(opened),
            Err(e) => done.error = Some(RelengError::Forge(e)),
        }
    }
    done
}

/// Folds the remote's status notes into the local clone, when the remote exists.
pub(super) fn fetch_statuses(repo: &FleetRepo, remote: &str) -> Result<bool, RelengError> {
    let url = match repo.git().find_remote(remote) {
        Ok(r) => r.url().ok().map(str::to_string),
        Err(_) if remote.contains("://") => Some(remote.to_string()),
        Err(_) => None,
    };
    let Some(url) = url else { return Ok(false) };
    let git_remote = crate::status::GitRemote::new(url).with_credentials(push::git_credentials());
    crate::status::sync(repo.git(), &git_remote).map_err(|e| {
        RelengError::Usage(format!("fetching statuses from {remote}: {e}; pass --offline to use the local ones"))
    })?;
    Ok(true)
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let format = args.output;
    let repo = match FleetRepo::open(&args.repo) {
        Ok(r) => r,
        Err(e) => return fail(format, &e),
    };
    let prepared = prepare(&repo, &args);
    let (report, forge) = match prepared {
        Ok(v) => v,
        Err(e) => return fail(format, &e),
    };
    let changed = report.outcome != PromoteOutcome::AlreadyPromoted;
    let spec = PullRequestSpec {
        title: report.title(),
        body: report.pr_body(),
        head: report.branch.clone(),
        base: report.base.clone(),
    };
    let done =
        publish(&repo, &args.remote, (args.push || args.open_pr) && changed, forge.filter(|_| changed), spec).await;
    print_report(format, &repo, &args, &report, done.pushed.as_ref(), done.pr.as_ref())?;
    match &done.error {
        Some(e) => fail(format, e),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// The forge and its token, when `--open-pr` asked for one.
pub(super) type Forge = Option<(ForgeSettings, Token)>;

fn prepare(repo: &FleetRepo, args: &Args) -> Result<(PromoteReport, Forge), RelengError> {
    let forge = if args.open_pr { Some(forge_for_pr(repo, &args.base)?) } else { None };
    if !args.offline {
        fetch_statuses(repo, &args.remote)?;
    }
    let keyring = if args.trusted_keys.is_empty() {
        None
    } else {
        let keys =
            Keyring::from_files(&args.trusted_keys).map_err(|e| RelengError::Usage(format!("--trusted-keys: {e}")))?;
        Some(TrustConfig::new(keys))
    };
    let mut signer = args.signing.signer()?;
    let req = PromoteRequest {
        id: args.id.clone(),
        target: args.target.target(),
        base: args.base.clone(),
        branch: args.branch.clone(),
        force: args.force,
    };
    let report = promote::promote(repo, &req, keyring.as_ref(), signer.as_mut())?;
    Ok((report, forge))
}

fn print_report(
    format: OutputFormat,
    repo: &FleetRepo,
    args: &Args,
    r: &PromoteReport,
    pushed: Option<&Pushed>,
    pr: Option<&OpenedPullRequest>,
) -> anyhow::Result<()> {
    let done = Done { result: "done", report: r, pushed, pull_request: pr };
    if format.print_machine(&done)? {
        return Ok(());
    }
    match r.outcome {
        PromoteOutcome::Prepared => {
            heading(&format!("Prepared the promotion of {} to {} on branch {}", r.id, r.target, r.branch))
        }
        PromoteOutcome::AlreadyPrepared => {
            heading(&format!("Branch {} already holds this promotion of {}", r.branch, r.id))
        }
        PromoteOutcome::AlreadyPromoted => {
            heading(&format!("Nothing to do: {} already runs {} on {}", r.target, r.id, r.base));
            return Ok(());
        }
    }
    if let Some(c) = &r.commit {
        println!("  commit     {} (on top of {})", &c[..10], r.base);
    }
    match &r.signer {
        Some(s) => println!("  release    {} on commit {}, signed by trusted key {s}", r.id, &r.release_commit[..10]),
        None => println!("  release    {} on commit {} (signature NOT checked)", r.id, &r.release_commit[..10]),
    }
    print_moves(&r.clusters);
    for c in &r.crd_compatibility {
        println!("  CRDs       {}", crd_line(&c.verdict, Some(c.from.as_deref().unwrap_or("(nothing installed)"))));
        for f in &c.verdict.findings {
            println!("               - {f}");
        }
    }
    if r.earlier_waves.is_empty() {
        println!("  statuses   none to wait for (first wave)");
    } else {
        println!("  statuses of {} on earlier waves", r.id);
    }
    for w in &r.earlier_waves {
        let state = w.state.map(|s| s.to_string()).unwrap_or_else(|| "no status".into());
        println!("    {:<20} wave {:<10} {}", w.cluster, w.wave, format!("{state} {}", w.description).trim_end());
    }
    for o in &r.overridden {
        println!("  FORCED     {}", o.to_string().replace('\n', " "));
    }
    if let Some(p) = pushed {
        println!("  pushed     {} to {}", p.refs.join(", "), p.remote);
    }
    match pr {
        Some(pr) => {
            println!("  PR         #{} {}", pr.number, pr.url);
            next("review and merge the PR; then watch the clusters with `fleetgate status`");
        }
        None if pushed.is_some() => {
            next(&format!("open a PR from {} into {}, or re-run with --open-pr", r.branch, r.base))
        }
        None if has_remote(repo, &args.remote) => next(&format!(
            "git -C {} push {} {} and open a PR into {} (or re-run with --open-pr)",
            args.repo.display(),
            args.remote,
            r.branch,
            r.base
        )),
        None => next(&format!(
            "review and merge it into {}: git -C {} merge --ff-only {}",
            r.base,
            args.repo.display(),
            r.branch
        )),
    }
    Ok(())
}
