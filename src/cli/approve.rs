//! `fleetgate approve RELEASE --wave W [-m WHY] --sign-key KEY [--push]`: approves a release for a
//! wave whose `approval: required` holds it ([`crate::releng::approve`]: a signed tag
//! `approve/<release>/<wave>` on the release's commit), and pushes the tag.

use super::args::{CommitSigning, GitAccess};
use super::output::{Done, OutputFormat, fail, heading, next};
use crate::releng::approve::{ApproveReport, ApproveRequest, approve};
use crate::releng::push::{Pushed, push};
use crate::releng::{FleetRepo, RelengError};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
The agents of the wave's clusters count the approval only when a key of their approvers' keyring \
(fleetgate agent --approver-keys) signed it. Example:
  fleetgate approve rel-20250315-001 --wave prod -m \"CAB-1234: approved for Tuesday\" --sign-key FPR --push")]
pub struct Args {
    /// The release to approve (its tag).
    pub release: String,
    /// The wave it is approved for (fleet.yaml spec.waves).
    #[arg(long, value_name = "WAVE")]
    pub wave: String,
    /// Why: the tag's message, recorded with the status of each cluster that starts on it.
    #[arg(short = 'm', long = "message", value_name = "WHY")]
    pub message: Option<String>,
    /// The fleet repo (a clone; bare or not).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// The branch the agents follow (its fleet.yaml lists the wave).
    #[arg(long, default_value = "main")]
    pub base: String,
    #[command(flatten)]
    pub signing: CommitSigning,
    /// Push the tag to --remote.
    #[arg(long)]
    pub push: bool,
    /// Remote to push to, a name or URL.
    #[arg(long, default_value = "origin")]
    pub remote: String,
    #[command(flatten)]
    pub git: GitAccess,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let access = args.git.credentials()?;
    match approve_and_push(&args, &access) {
        Ok((report, pushed)) => {
            let done = Done { result: "done", report: &report, pushed: pushed.as_ref(), pull_request: None };
            if !args.output.print_machine(&done)? {
                print_human(&args, &report, pushed.as_ref());
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => fail(args.output, &e),
    }
}

fn approve_and_push(
    args: &Args,
    access: &crate::source::Credentials,
) -> Result<(ApproveReport, Option<Pushed>), RelengError> {
    let mut signer = args
        .signing
        .signer()?
        .ok_or_else(|| RelengError::Usage("an approval is a signed tag: pass --sign-key (an approver's key)".into()))?;
    let repo = FleetRepo::open(&args.repo)?;
    let req = ApproveRequest {
        release: args.release.clone(),
        wave: args.wave.clone(),
        why: args.message.clone(),
        base: args.base.clone(),
    };
    let report = approve(&repo, &req, &mut signer)?;
    let pushed =
        if args.push { Some(push(&repo, &args.remote, &[format!("refs/tags/{}", report.tag)], access)?) } else { None };
    Ok((report, pushed))
}

fn print_human(args: &Args, r: &ApproveReport, pushed: Option<&Pushed>) {
    heading(&format!("Approved {} for wave {}", r.release, r.wave));
    println!("  tag        {} (object {}) on {}", r.tag, &r.object[..10], &r.commit[..10]);
    println!("  signed by  {}", r.signer);
    println!("  why        {}", r.message);
    if !r.required {
        println!(
            "  note       fleet.yaml on {} does not require approval for wave {}: nothing waits for it",
            args.base, r.wave
        );
    }
    match pushed {
        Some(p) => println!("  pushed     {} to {}", p.refs.join(", "), p.remote),
        None => {
            println!("  pushed     nothing (local only)");
            next(&format!(
                "git -C {} push {} refs/tags/{} (or re-run with --push)",
                args.repo.display(),
                args.remote,
                r.tag
            ));
        }
    }
}
