//! `fleetgate wait REL (--cluster C | --wave W | --fleet)`: waits until release REL reports
//! `success` on every cluster waited for, as `kubectl wait` and `argocd app wait` serve CI. It
//! reads the fleet repo's statuses the way `fleetgate status` does, every `--interval`, and judges
//! each reading with [`crate::status::wait`]. Progress goes to stderr, one line per change
//! (`cluster-a: pending → success`); the final states go to stdout (`-o json|yaml` for machines).
//!
//! With `--fleet` it waits for every cluster the release targets; a cluster or wave named outright
//! must be targeted.
//!
//! Exit codes: 0 every cluster succeeded; 1 one reported failure or error, its agent rolled back,
//! or Git moved it away from REL; 124 the timeout passed first (as `timeout(1)` does), naming the
//! clusters still waited for; 2 bad usage, an unknown release, cluster or wave, or a repo that
//! cannot be read at the start (later read errors are reported and retried until the timeout).

use super::args::{FleetRepoArgs, TargetArgs, read_fleet};
use super::output::{OutputFormat, colours, terminal_text};
use crate::model::error_chain;
use crate::status::wait::{self, ClusterWait, Standing, Verdict};
use owo_colors::OwoColorize;
use serde::Serialize;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `timeout(1)`'s exit code when the time ran out.
const TIMED_OUT: u8 = 124;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The release to wait for.
    pub release: String,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub fleet: FleetRepoArgs,
    /// Give up after this long (exit 124), e.g. `90s`, `10m`.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Time between readings of the statuses.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// The `-o json|yaml` document: how the wait ended and every cluster's final state.
#[derive(Serialize)]
struct Waited<'a> {
    release: &'a str,
    /// `succeeded`, `failed` or `timed-out`.
    result: &'a str,
    clusters: &'a [ClusterWait],
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let deadline = Instant::now() + args.timeout;
    let (_state, source) = args.fleet.open_mirror("fleetgate-wait")?;
    let (release, target) = (args.release.clone(), args.target.target());
    // The first reading decides which clusters count; anything wrong with it ends the wait.
    let (mut source, first) = tokio::task::spawn_blocking(move || {
        let mut source = source;
        let first = read_fleet(&mut source).and_then(|view| {
            let clusters = wait::waited_for(&source.checkout()?, &view.config, &release, &target)?;
            Ok((view, clusters))
        });
        (source, first)
    })
    .await?;
    let (mut view, clusters) = first?;
    let mut before: Option<Vec<ClusterWait>> = None;
    loop {
        let now = wait::observe(&view, &args.release, &clusters);
        for line in wait::changes(before.as_deref(), &now) {
            eprintln!("{}", terminal_text(&line));
        }
        match wait::verdict(&now) {
            Verdict::Succeeded => {
                eprintln!("{} reached success on {} cluster(s)", args.release, now.len());
                return finish(&args, "succeeded", &now, 0);
            }
            Verdict::Failed => {
                eprintln!("{} will not reach success everywhere without a new decision in Git", args.release);
                return finish(&args, "failed", &now, 1);
            }
            Verdict::Waiting if Instant::now() >= deadline => {
                eprintln!(
                    "timed out after {}; still waiting for {}",
                    humantime::format_duration(args.timeout),
                    wait::still_waiting(&now)
                );
                return finish(&args, "timed-out", &now, TIMED_OUT);
            }
            Verdict::Waiting => {}
        }
        before = Some(now);
        tokio::time::sleep(args.interval.min(deadline.saturating_duration_since(Instant::now()))).await;
        let read;
        (source, read) = tokio::task::spawn_blocking(move || {
            let read = read_fleet(&mut source);
            (source, read)
        })
        .await?;
        match read {
            Ok(v) => view = v,
            // A Git server that blips mid-wait is no verdict: the last reading stands until the next.
            Err(e) => eprintln!("error: {} (retrying)", error_chain(e.as_ref())),
        }
    }
}

fn finish(args: &Args, result: &str, clusters: &[ClusterWait], code: u8) -> anyhow::Result<ExitCode> {
    if !args.output.print_machine(&Waited { release: &args.release, result, clusters })? {
        print_table(clusters);
    }
    Ok(ExitCode::from(code))
}

fn print_table(clusters: &[ClusterWait]) {
    println!("{:<20} {:<10} {:<12} DESCRIPTION", "CLUSTER", "WAVE", "STATE");
    for c in clusters {
        let state = format!("{:<12}", c.state.as_str());
        let state = match (colours(), c.state) {
            (false, _) => state,
            (true, Standing::Success) => state.green().to_string(),
            (true, Standing::Pending | Standing::NotStarted) => state.yellow().to_string(),
            (true, _) => state.red().to_string(),
        };
        let description = c.description.as_deref().map(terminal_text).unwrap_or_default();
        println!("{:<20} {:<10} {state} {description}", c.cluster, c.wave);
    }
}
