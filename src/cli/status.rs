//! `fleetgate status [RELEASE] --repo PATH|URL`: where every cluster stands on every release.
//!
//! Without RELEASE: the cluster × release matrix (clusters grouped by wave, releases newest first,
//! as many as fit the terminal). With RELEASE: one row per cluster with its state and description,
//! or — where it has not reported yet — whether wave gating lets it start and why. Tables show
//! text from the repo and its notes through [`terminal_safe`] (no control characters); `-o json`
//! and `-o yaml` print it faithfully, escaped by their encoders.
//!
//! Exit codes: 0 shown; 1 when RELEASE was given and a cluster reports `failure` or `error` for it;
//! 2 bad usage, unreachable repo, or an invalid fleet configuration.

use super::args::GitAccess;
use super::output::{OutputFormat, colours, terminal_safe};
use crate::model::error_chain;
use crate::source::Source;
use crate::status::{FleetView, Matrix, RenderOptions, State, render_release, render_table};
use anyhow::Context;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Show this release in detail (descriptions and wave-gating reasons).
    pub release: Option<String>,
    /// The fleet repo: a local path or a URL (git://, ssh://, https://).
    #[arg(long, env = "FLEETGATE_REPO")]
    pub repo: String,
    /// The tracked branch whose fleet.yaml and clusters/ define the fleet.
    #[arg(long, default_value = "main")]
    pub branch: String,
    #[command(flatten)]
    pub git: GitAccess,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
    /// Keep refreshing until interrupted (Ctrl-C).
    #[arg(long)]
    pub watch: bool,
    /// Time between refreshes with --watch.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let credentials = args.git.credentials()?;
    // A private mirror for this invocation: the branch, the tags and every status note.
    let state = tempfile::Builder::new().prefix("fleetgate-status").tempdir()?;
    let mut source = Source::open(&args.repo, state.path(), credentials)?.with_branch(&args.branch);
    loop {
        let (source_back, view) = tokio::task::spawn_blocking(move || {
            let view = load(&mut source);
            (source, view)
        })
        .await?;
        source = source_back;
        let code = match view {
            Ok(view) => show(&args, &view.matrix())?,
            // While watching, a failed refresh is reported and the next one tried.
            Err(e) if args.watch => {
                eprintln!(
                    "error: {} (retrying in {})",
                    error_chain(e.as_ref()),
                    humantime::format_duration(args.interval)
                );
                ExitCode::from(2)
            }
            Err(e) => return Err(e),
        };
        if !args.watch {
            return Ok(code);
        }
        tokio::select! {
            _ = tokio::time::sleep(args.interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(code),
        }
    }
}

fn load(source: &mut Source) -> anyhow::Result<FleetView> {
    source.sync().with_context(|| format!("reading {}", source.url()))?;
    Ok(FleetView::load(&source.checkout()?)?)
}

fn terminal_width() -> usize {
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).filter(|w| *w >= 40).unwrap_or(80)
}

fn show(args: &Args, matrix: &Matrix) -> anyhow::Result<ExitCode> {
    let matrix = match &args.release {
        Some(id) => matrix.only(id).with_context(|| {
            let known: Vec<&str> = matrix.releases.iter().map(|r| r.id.as_str()).take(5).collect();
            format!(
                "no release tag {id} (a tag on a commit with release.yaml) in {}; newest releases: {}",
                args.repo,
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            )
        })?,
        None => matrix.clone(),
    };
    match (args.output, args.watch) {
        // One compact document per refresh, so `--watch -o json` is a stream of lines.
        (OutputFormat::Json, true) => println!("{}", serde_json::to_string(&matrix)?),
        (OutputFormat::Yaml, true) => print!("---\n{}", serde_yaml_ng::to_string(&matrix)?),
        (format, _) if format.print_machine(&matrix)? => {}
        _ => {
            let opts = RenderOptions { width: terminal_width(), colours: colours() };
            let matrix = terminal_safe(&matrix)?;
            let text = match &args.release {
                Some(id) => render_release(&matrix, id, opts).expect("the release is in the matrix"),
                None => render_table(&matrix, opts),
            };
            if args.watch && colours() {
                // Clear the screen and home the cursor before each redraw.
                print!("\x1b[2J\x1b[H");
            }
            print!("{text}");
            if args.watch {
                println!("\nrefreshing every {} · Ctrl-C to stop", humantime::format_duration(args.interval));
            }
        }
    }
    let failed = args.release.is_some()
        && matrix
            .waves
            .iter()
            .flat_map(|w| &w.clusters)
            .any(|c| matches!(c.cells[0].state, Some(State::Failure | State::Error)));
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
