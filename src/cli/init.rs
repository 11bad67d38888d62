//! `fleetgate init DIR`: a new fleet repo from the built-in template (files, `git init` on
//! branch `main`, first commit). Works from any directory: the template is inside the binary.

use crate::model::TEMPLATE_FILES;
use crate::source::{init_fleet_repo, short};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory of the new fleet repo (created when missing; must be empty when it exists).
    pub dir: PathBuf,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let commit = init_fleet_repo(&args.dir)?;
    let dir = args.dir.display();
    println!("Created fleet repo {dir}: {} files, branch main, commit {}.", TEMPLATE_FILES.len(), short(commit));
    println!();
    println!("Next:");
    println!("  1. Edit fleet.yaml (operator, waves), clusters/*.yaml, policies/, and put your rendered");
    println!("     operator manifests under operator/ with a matching release.yaml.");
    println!("  2. fleetgate validate --repo {dir}");
    println!("  3. Cut a signed release (fleetgate release create) and promote it (fleetgate promote).");
    Ok(ExitCode::SUCCESS)
}
