//! `fleetgate release …` (scaffold: the owning issue replaces this).

use std::process::ExitCode;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Write release.yaml, commit rendered manifests, sign and tag.
    Create {},
}

pub async fn run(_cmd: Command) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`fleetgate release create` is not available in this build yet")
}
