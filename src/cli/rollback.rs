//! `fleetgate rollback (--cluster C | --wave W | --fleet)`: flags into a [`RollbackRequest`], one
//! call to [`fleetgate::releng::publish::roll_back_and_publish`] (the revert or explicit commit, on
//! the base branch or — for a PR — on a new branch, then push and PR), and the result.

use super::args::{CommitSigning, PublishArgs, TargetArgs};
use super::output::{Done, OutputFormat, PublishHints, finish_published, heading, print_moves, print_published_tail};
use crate::releng::publish::{PublishOptions, Published, roll_back_and_publish};
use crate::releng::rollback::{RollbackMethod, RollbackReport, RollbackRequest};
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
    #[command(flatten)]
    pub publish: PublishArgs,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = args.publish.options()?;
    let outcome = roll_back(&args, &opts).await;
    finish_published(args.output, outcome, |repo, done| print_report(args.output, repo, &args, done))
}

async fn roll_back(args: &Args, opts: &PublishOptions) -> Result<(FleetRepo, Published<RollbackReport>), RelengError> {
    let repo = FleetRepo::open(&args.repo)?;
    let mut signer = args.signing.signer()?;
    let req = RollbackRequest {
        target: args.target.target(),
        to: args.to.clone(),
        reason: args.reason.clone(),
        base: args.base.clone(),
        branch: args.branch.clone(),
    };
    let done = roll_back_and_publish(&repo, req, signer.as_mut(), opts).await?;
    Ok((repo, done))
}

fn print_report(
    format: OutputFormat,
    repo: &FleetRepo,
    args: &Args,
    done: &Published<RollbackReport>,
) -> anyhow::Result<()> {
    if format.print_machine(&Done::published(done))? {
        return Ok(());
    }
    let r = &done.report;
    heading(&format!("Rolled back {} on branch {}", r.target, r.branch));
    match (&r.method, &r.reverted) {
        (RollbackMethod::Revert, Some(c)) => {
            println!("  commit     {} reverts promotion {}", &r.commit[..10], &c[..10])
        }
        _ => println!("  commit     {} (explicit change of spec.release)", &r.commit[..10]),
    }
    print_moves(&r.clusters);
    println!("  reason     {}", r.reason.as_deref().unwrap_or("(none given; pass --reason)"));
    print_published_tail(
        done,
        repo,
        &args.repo,
        &args.publish.remote,
        (&r.branch, &r.base),
        &PublishHints {
            after_pr: "merge the PR now; the agents follow once it lands, and `fleetgate status` shows them",
            after_push: "the agents pick the change up from the remote; watch with `fleetgate status`",
            on_local_base: |status| format!("watch them go back with {status}"),
        },
    );
    Ok(())
}
