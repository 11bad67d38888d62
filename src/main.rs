//! The `fleetgate` binary: parse arguments, set up logging, run one command.

use clap::Parser;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = fleetgate::cli::Cli::parse();
    fleetgate::cli::init_tracing(&cli);
    match fleetgate::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            // Each source once, also where an error type prints its source itself.
            eprintln!("error: {}", fleetgate::model::error_chain(e.as_ref()));
            ExitCode::from(2)
        }
    }
}
