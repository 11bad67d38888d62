//! `fleetgate pause|resume (--cluster C | --wave W | --fleet)`: the emergency brake as a commit
//! ([`fleetgate::releng::publish::pause_and_publish`]: `spec.paused` on the base branch, or on a
//! new branch for a PR, then push and PR), and the result.

use super::args::{CommitSigning, PublishArgs, TargetArgs};
use super::output::{Done, OutputFormat, PublishHints, finish_published, heading, print_published_tail};
use crate::releng::pause::{PauseReport, PauseRequest};
use crate::releng::publish::{PublishOptions, Published, pause_and_publish};
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
    /// Why (goes into the commit message and the PR).
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    /// The branch the agents follow.
    #[arg(long, default_value = "main")]
    pub base: String,
    /// Commit on this new branch instead of on --base (default with --open-pr: pause/<target>-<time>).
    #[arg(long)]
    pub branch: Option<String>,
    #[command(flatten)]
    pub signing: CommitSigning,
    #[command(flatten)]
    pub publish: PublishArgs,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// `paused`: true for `fleetgate pause`, false for `fleetgate resume`.
pub async fn run(args: Args, paused: bool) -> anyhow::Result<ExitCode> {
    let opts = args.publish.options()?;
    let outcome = set_paused(&args, paused, &opts).await;
    finish_published(args.output, outcome, |repo, done| print_report(args.output, repo, &args, done))
}

async fn set_paused(
    args: &Args,
    paused: bool,
    opts: &PublishOptions,
) -> Result<(FleetRepo, Published<PauseReport>), RelengError> {
    let repo = FleetRepo::open(&args.repo)?;
    let mut signer = args.signing.signer()?;
    let req = PauseRequest {
        target: args.target.target(),
        paused,
        reason: args.reason.clone(),
        base: args.base.clone(),
        branch: args.branch.clone(),
    };
    let done = pause_and_publish(&repo, req, signer.as_mut(), opts).await?;
    Ok((repo, done))
}

fn print_report(
    format: OutputFormat,
    repo: &FleetRepo,
    args: &Args,
    done: &Published<PauseReport>,
) -> anyhow::Result<()> {
    if format.print_machine(&Done::published(done))? {
        return Ok(());
    }
    let r = &done.report;
    let Some(commit) = &r.commit else {
        let already = if r.paused { "paused" } else { "not paused" };
        heading(&format!("Nothing to do: {} is already {already} on {}", r.target, r.base));
        print_still_paused(r);
        return Ok(());
    };
    let done_verb = if r.paused { "Paused" } else { "Resumed" };
    heading(&format!("{done_verb} {} on branch {}", r.target, r.branch));
    println!("  commit     {} sets spec.paused in {}", &commit[..10], r.files.join(", "));
    println!("  reason     {}", r.reason.as_deref().unwrap_or("(none given; pass --reason)"));
    print_still_paused(r);
    print_published_tail(
        done,
        repo,
        &args.repo,
        &args.publish.remote,
        (&r.branch, &r.base),
        &PublishHints {
            after_pr: "merge the PR; the agents follow once it lands, and `fleetgate status` marks paused clusters",
            after_push: "the agents pick the change up from the remote; `fleetgate status` marks paused clusters",
            on_local_base: |status| format!("{status} marks paused clusters"),
        },
    );
    Ok(())
}

fn print_still_paused(r: &PauseReport) {
    for (cluster, by) in &r.still_paused {
        println!("  still      {cluster} stays paused by {by}");
    }
}
