//! `fleetgate cluster register NAME --status-key KEY`: flags into one call to
//! [`crate::releng::register::register`] (a commit on the base branch), and what it did.

use super::args::CommitSigning;
use crate::releng::FleetRepo;
use crate::releng::register::{Registered, register};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Register a cluster's status key (what `fleetgate agent --print-status-key` printed) in
    /// clusters/NAME.yaml, as a commit on the base branch; push it to publish the registration.
    Register(RegisterArgs),
}

#[derive(Debug, clap::Args)]
pub struct RegisterArgs {
    /// The cluster (clusters/NAME.yaml).
    pub name: String,
    /// Its public status key, `ssh-ed25519 AAAA…`.
    #[arg(long, value_name = "KEY")]
    pub status_key: String,
    /// The fleet repo (a clone; bare or not).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// The branch that says what runs.
    #[arg(long, default_value = "main")]
    pub base: String,
    #[command(flatten)]
    pub signing: CommitSigning,
}

pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Register(args) => {
            let repo = FleetRepo::open(&args.repo)?;
            let mut signer = args.signing.signer()?;
            match register(&repo, &args.base, &args.name, &args.status_key, signer.as_mut())? {
                Registered::Unchanged => println!("clusters/{}.yaml already registers that key", args.name),
                Registered::Committed(commit) => println!(
                    "registered the status key of {} in commit {commit} on {}; push {} to publish it",
                    args.name, args.base, args.base
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
