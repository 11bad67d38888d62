//! `fleetgate check-crd` (scaffold: the owning issue replaces this).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`fleetgate check-crd` is not available in this build yet")
}
