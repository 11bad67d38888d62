//! `fleetgate rollback (--cluster C | --wave W | --fleet)`: the revert (or explicit) commit from
//! [`fleetgate::releng::rollback::rollback`], on the base branch or — for a PR — on a new branch,
//! then push and PR.

use super::output::OutputFormat;
use super::promote::{TargetArgs, forge_for_pr, publish};
use super::release::{CommitSigning, Done, fail, has_remote, heading, next, print_moves};
use crate::releng::forge_pr::{OpenedPullRequest, PullRequestSpec};
use crate::releng::push::Pushed;
use crate::releng::rollback::{self, RollbackMethod, RollbackReport, RollbackRequest};
use crate::releng::{FleetRepo, RelengError};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub target: TargetArgs,
    /// The fleet repo (a clone; bare or not).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// The release to go back to (default: each cluster's previous release).
    #[arg(long, value_name = "ID")]
    pub to: Option<String>,
    /// Why (goes into the commit message and the PR).
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// The branch that says what runs.
    #[arg(long, default_value = "main")]
    pub base: String,
    /// Commit on this new branch instead of on --base (default with --open-pr: rollback/<target>-<time>).
    #[arg(long)]
    pub branch: Option<String>,
    #[command(flatten)]
    pub signing: CommitSigning,
    /// Push the commit (the base branch, or the new branch).
    #[arg(long)]
    pub push: bool,
    /// Commit on a new branch, push it and open a pull/merge request through fleet.yaml spec.status.forge.
    #[arg(long)]
    pub open_pr: bool,
    /// Remote to push to (a name or URL).
    #[arg(long, default_value = "origin")]
    pub remote: String,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let format = args.output;
    let repo = match FleetRepo::open(&args.repo) {
        Ok(r) => r,
        Err(e) => return fail(format, &e),
    };
    let forge = if args.open_pr {
        match forge_for_pr(&repo, &args.base) {
            Ok(f) => Some(f),
            Err(e) => return fail(format, &e),
        }
    } else {
        None
    };
    let target = args.target.target();
    let branch = args.branch.clone().or_else(|| {
        args.open_pr.then(|| format!("rollback/{}-{}", target.slug(), chrono::Utc::now().format("%Y%m%d-%H%M%S")))
    });
    let req =
        RollbackRequest { target, to: args.to.clone(), reason: args.reason.clone(), base: args.base.clone(), branch };
    let report = match sign_and_roll_back(&repo, &args, &req) {
        Ok(r) => r,
        Err(e) => return fail(format, &e),
    };
    let spec = PullRequestSpec {
        title: report.title(),
        body: report.pr_body(),
        head: report.branch.clone(),
        base: report.base.clone(),
    };
    let done = publish(&repo, &args.remote, args.push || args.open_pr, forge, spec).await;
    print_report(format, &repo, &args, &report, done.pushed.as_ref(), done.pr.as_ref())?;
    match &done.error {
        Some(e) => fail(format, e),
        None => Ok(ExitCode::SUCCESS),
    }
}

fn sign_and_roll_back(repo: &FleetRepo, args: &Args, req: &RollbackRequest) -> Result<RollbackReport, RelengError> {
    let mut signer = args.signing.signer()?;
    rollback::rollback(repo, req, signer.as_mut())
}

fn print_report(
    format: OutputFormat,
    repo: &FleetRepo,
    args: &Args,
    r: &RollbackReport,
    pushed: Option<&Pushed>,
    pr: Option<&OpenedPullRequest>,
) -> anyhow::Result<()> {
    let done = Done { result: "done", report: r, pushed, pull_request: pr };
    if format.print_machine(&done)? {
        return Ok(());
    }
    heading(&format!("Rolled back {} on branch {}", r.target, r.branch));
    match (&r.method, &r.reverted) {
        (RollbackMethod::Revert, Some(c)) => {
            println!("  commit     {} reverts promotion {}", &r.commit[..10], &c[..10])
        }
        _ => println!("  commit     {} (explicit change of spec.release)", &r.commit[..10]),
    }
    print_moves(&r.clusters);
    println!("  reason     {}", r.reason.as_deref().unwrap_or("(none given; pass --reason)"));
    if let Some(p) = &pushed {
        println!("  pushed     {} to {}", p.refs.join(", "), p.remote);
    }
    match (pr, pushed) {
        (Some(pr), _) => {
            println!("  PR         #{} {}", pr.number, pr.url);
            next("merge the PR now; the agents follow once it lands, and `fleetgate status` shows them");
        }
        (None, Some(_)) => next("the agents pick the change up from the remote; watch with `fleetgate status`"),
        (None, None) if r.branch == r.base && has_remote(repo, &args.remote) => next(&format!(
            "git -C {} push {} {} (or re-run with --push) so the agents see it",
            args.repo.display(),
            args.remote,
            r.base
        )),
        (None, None) if r.branch == r.base => next(&format!(
            "the agents follow {}; watch them go back with `fleetgate status --repo {}`",
            r.base,
            args.repo.display()
        )),
        (None, None) => next(&format!("push {} and open a PR into {} (or re-run with --open-pr)", r.branch, r.base)),
    }
    Ok(())
}
