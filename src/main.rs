//! The `fleetgate` binary: parse arguments, set up logging, run one command.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = fleetgate::cli::Cli::parse();
    let runtime = match cli.runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    fleetgate::cli::init_tracing(&cli);
    match runtime.block_on(fleetgate::cli::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            // Each source once, also where an error type prints its source itself.
            eprintln!("error: {}", fleetgate::model::error_chain(e.as_ref()));
            ExitCode::from(2)
        }
    }
}
