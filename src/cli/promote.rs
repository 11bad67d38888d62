//! `fleetgate promote ID (--cluster C | --wave W | --fleet)`: flags into a [`PromoteRequest`], one
//! call to [`fleetgate::releng::publish::promote_and_publish`] (fetch statuses, check and prepare
//! the promotion branch, push it, open the PR), and the result for people or pipelines.

use super::args::{CommitSigning, PublishArgs, TargetArgs};
use super::output::{Done, OutputFormat, crd_line, finish_published, heading, next, print_moves};
use crate::release::Keyring;
use crate::releng::promote::{PromoteOutcome, PromoteReport, PromoteRequest};
use crate::releng::publish::{PublishOptions, Published, promote_and_publish};
use crate::releng::{FleetRepo, RelengError};
use std::path::PathBuf;
use std::process::ExitCode;

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
    #[command(flatten)]
    pub publish: PublishArgs,
    /// Use the statuses already in the local clone instead of fetching them from --remote.
    #[arg(long)]
    pub offline: bool,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = args.publish.options()?;
    let outcome = promote(&args, &opts).await;
    finish_published(args.output, outcome, |repo, done| print_report(args.output, repo, &args, done))
}

async fn promote(args: &Args, opts: &PublishOptions) -> Result<(FleetRepo, Published<PromoteReport>), RelengError> {
    let repo = FleetRepo::open(&args.repo)?;
    let trust = Keyring::from_key_files(&args.trusted_keys)?;
    let mut signer = args.signing.signer()?;
    let req = PromoteRequest {
        id: args.id.clone(),
        target: args.target.target(),
        base: args.base.clone(),
        branch: args.branch.clone(),
        force: args.force,
    };
    let done = promote_and_publish(&repo, &req, trust.as_ref(), signer.as_mut(), opts, args.offline).await?;
    Ok((repo, done))
}

fn print_report(
    format: OutputFormat,
    repo: &FleetRepo,
    args: &Args,
    done: &Published<PromoteReport>,
) -> anyhow::Result<()> {
    if format.print_machine(&Done::published(done))? {
        return Ok(());
    }
    let (r, pushed, pr) = (&done.report, done.pushed.as_ref(), done.pull_request.as_ref());
    let remote = &args.publish.remote;
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
    for w in &r.waves {
        let settings = w.settings.as_deref().map(|s| format!(" ({s})")).unwrap_or_default();
        let waits =
            w.waits.as_deref().map_or("may start once merged".to_string(), |why| format!("waits once merged: {why}"));
        println!("  wave       {}{settings}: {} — {waits}", w.wave, w.clusters.join(", "));
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
        None if repo.has_remote(remote) => next(&format!(
            "git -C {} push {} {} and open a PR into {} (or re-run with --open-pr)",
            args.repo.display(),
            remote,
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
