//! `fleetgate rollback (--cluster C | --wave W | --fleet)`: flags into a [`RollbackRequest`]; the
//! per-cluster preview printed before anything is written (`--dry-run` stops there); then one
//! call to [`fleetgate::releng::publish::roll_back_and_publish`] (the revert or explicit commit, on
//! the base branch or — for a PR — on a new branch, then push and PR), and the result.
//! `fleetgate rollback --list [--cluster C]` prints each cluster's rollback candidates instead.

use super::args::{CommitSigning, PublishArgs, TargetArgs};
use super::output::{
    Done, OutputFormat, PublishHints, fail, finish_published, heading, next, print_moves, print_published_tail,
    terminal_text,
};
use crate::releng::publish::{self, PublishOptions, Published, roll_back_and_publish};
use crate::releng::rollback::{RollbackMethod, RollbackReport, RollbackRequest};
use crate::releng::rollback_preview::{self, ClusterCandidates, ClusterPreview};
use crate::releng::{FleetRepo, RelengError, Target};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
// A target is required, except by --list (checked in `run`).
#[command(mut_group("TargetArgs", |g: clap::ArgGroup| g.required(false)))]
pub struct Args {
    #[command(flatten)]
    pub target: TargetArgs,
    /// The fleet repo (a clone; bare or not).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// The release to go back to (default: each cluster's own last-known-good release, the newest
    /// that succeeded on it other than the one it runs now; a cluster without one stays).
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
    /// Print what each cluster would do (where it goes and why, the CRDs kept, what is restored)
    /// and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// With --fleet: roll back only the first wave that needs it, and print the commands for the
    /// later waves, to run as the waves before report success (default: every cluster at once).
    #[arg(long, requires = "fleet")]
    pub staged: bool,
    /// List each cluster's rollback candidates (the releases that succeeded on it, newest first)
    /// instead of rolling back; with --cluster, that cluster's only.
    #[arg(long, conflicts_with_all = ["wave", "fleet", "to", "reason", "branch", "dry_run", "staged"])]
    pub list: bool,
    /// Use the statuses already in the local clone instead of fetching them from --remote.
    #[arg(long)]
    pub offline: bool,
    #[command(flatten)]
    pub signing: CommitSigning,
    #[command(flatten)]
    pub publish: PublishArgs,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = args.publish.options()?;
    if args.list {
        return list(&args, &opts);
    }
    if args.target.cluster.is_none() && args.target.wave.is_none() && !args.target.fleet {
        let usage =
            RelengError::Usage("say what to roll back: --cluster NAME, --wave WAVE or --fleet (or --list)".into());
        return fail(args.output, &usage);
    }
    let outcome = roll_back(&args, &opts).await;
    finish_published(args.output, outcome, |repo, done| print_report(args.output, repo, &args, done))
}

fn request(args: &Args, dry_run: bool) -> RollbackRequest {
    RollbackRequest {
        target: args.target.target(),
        to: args.to.clone(),
        reason: args.reason.clone(),
        base: args.base.clone(),
        branch: args.branch.clone(),
        staged: args.staged,
        dry_run,
    }
}

async fn roll_back(args: &Args, opts: &PublishOptions) -> Result<(FleetRepo, Published<RollbackReport>), RelengError> {
    let repo = FleetRepo::open(&args.repo)?;
    let mut signer = args.signing.signer()?;
    if args.output == OutputFormat::Table {
        // People see what will happen before anything is written.
        let preview = roll_back_and_publish(&repo, request(args, true), None, opts, args.offline).await?;
        print_preview(args, &preview.report);
        if args.dry_run {
            return Ok((repo, preview));
        }
        // The statuses were fetched for the preview already.
        let done = roll_back_and_publish(&repo, request(args, false), signer.as_mut(), opts, true).await?;
        return Ok((repo, done));
    }
    let done = roll_back_and_publish(&repo, request(args, args.dry_run), signer.as_mut(), opts, args.offline).await?;
    Ok((repo, done))
}

fn print_preview(args: &Args, r: &RollbackReport) {
    let verb = if args.dry_run { "Would roll back" } else { "Rolling back" };
    heading(&format!("{verb} {}", r.target));
    for p in &r.preview {
        print_cluster(p);
    }
    for l in &r.left_alone {
        println!("  {} (wave {}): stays on {}", l.cluster, l.wave, l.current.as_deref().unwrap_or("(none)"));
        println!("      why       {}", terminal_text(&l.why));
    }
    if !r.later.is_empty() {
        println!("  later waves (staged: run each once the waves before report success for their release)");
        for step in &r.later {
            println!("    wave {:<10} fleetgate {} --repo {}", step.wave, step.args.join(" "), args.repo.display());
        }
    }
    if args.dry_run {
        let mut again = format!("fleetgate rollback {}", target_flags(&r.target));
        if let Some(to) = &args.to {
            again.push_str(&format!(" --to {to}"));
        }
        if args.staged {
            again.push_str(" --staged");
        }
        next(&format!("nothing was written; to roll back: {again} --repo {}", args.repo.display()));
    }
}

fn target_flags(t: &Target) -> String {
    match t {
        Target::Cluster(c) => format!("--cluster {c}"),
        Target::Wave(w) => format!("--wave {w}"),
        Target::Fleet => "--fleet".to_string(),
    }
}

fn print_cluster(p: &ClusterPreview) {
    let from = p.from.as_deref().unwrap_or("(none)");
    println!("  {} (wave {}): {from} -> {}", p.cluster, p.wave, p.to);
    println!("      why       {}", terminal_text(&p.why));
    match &p.succeeded_here {
        Some(s) => println!(
            "      agent     a rollback: {} succeeded here ({}); it bakes with rollbackBakeTime",
            p.to,
            s.at.format("%Y-%m-%d %H:%M:%SZ")
        ),
        None => println!(
            "      agent     a promotion: {} never succeeded here, so the CRD gate judges the move like any other",
            p.to
        ),
    }
    let label = if p.is_rollback() { "keeps" } else { "blocks" };
    if p.wider_crds.is_empty() {
        println!("      {label:<9} no CRD: {}'s CRDs take everything {from}'s do", p.to);
    }
    for c in &p.wider_crds {
        println!("      {label:<9} CRD {} ({from}'s is wider):", c.name);
        for f in &c.findings {
            println!("                  - {f}");
        }
    }
    println!("      restores  {}", p.restore);
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
    if r.dry_run {
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
    if !r.left_alone.is_empty() {
        println!("  left alone (no earlier success here, or rolled back already: see above)");
    }
    for l in &r.left_alone {
        println!("    {:<20} wave {:<10} stays on {}", l.cluster, l.wave, l.current.as_deref().unwrap_or("(none)"));
    }
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

fn list(args: &Args, opts: &PublishOptions) -> anyhow::Result<ExitCode> {
    let listed = FleetRepo::open(&args.repo).and_then(|repo| {
        if !args.offline {
            publish::fetch_statuses(&repo, &opts.remote, &opts.access)?;
        }
        rollback_preview::list(&repo, &args.base, args.target.cluster.as_deref())
    });
    let clusters = match listed {
        Ok(c) => c,
        Err(e) => return fail(args.output, &e),
    };
    #[derive(serde::Serialize)]
    struct Listed<'a> {
        clusters: &'a [ClusterCandidates],
    }
    if !args.output.print_machine(&Listed { clusters: &clusters })? {
        print_candidates(&clusters);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_candidates(clusters: &[ClusterCandidates]) {
    println!("{:<20} {:<10} {:<24} {:<21} NOTE", "CLUSTER", "WAVE", "RELEASE", "SUCCEEDED");
    for c in clusters {
        if c.candidates.is_empty() {
            println!("{:<20} {:<10} {:<24} {:<21} no release succeeded here yet", c.cluster, c.wave, "-", "-");
        }
        for k in &c.candidates {
            let mut notes = Vec::new();
            if k.desired {
                notes.push("desired now");
            }
            if k.revoked {
                notes.push("revoked: no agent applies it again");
            }
            println!(
                "{:<20} {:<10} {:<24} {:<21} {}",
                c.cluster,
                c.wave,
                k.success.release,
                k.success.at.format("%Y-%m-%d %H:%M:%SZ"),
                notes.join("; ")
            );
        }
    }
}
