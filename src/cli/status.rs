//! `fleetgate status [RELEASE] --repo PATH|URL`: where every cluster stands on every release.
//!
//! Without RELEASE: the cluster × release matrix (clusters grouped by wave, releases newest first,
//! as many as fit the terminal). With RELEASE: one row per cluster with its state and description,
//! or — where it has not reported yet — whether wave gating lets it start and why. Tables show
//! text from the repo and its notes through [`make_terminal_safe`] (no control characters); `-o json`
//! and `-o yaml` print it faithfully, escaped by their encoders.
//!
//! `--wave`, `--cluster`, `--state` and `-l key=value` choose the clusters shown (every output);
//! those failing at a glance come first in each wave ([`Matrix::select`]). Tables say how long ago
//! each cluster reported ("3 m ago"); `-o wide`, `-o json` and `-o yaml` carry the exact times.
//! The mirror also fetches every cluster's heartbeat ref: LAST SEEN is the newest of a cluster's
//! verified heartbeat and statuses, and a cluster unheard for longer than its allowance
//! (`--stale-after`, else 3 × its heartbeat interval) is marked `stale` and shown first.
//!
//! `--serve ADDR` serves the page instead, read-only, re-reading the repo every `--interval`; the
//! page follows without reloading ([`crate::status::live`]). A bare port binds 127.0.0.1.
//!
//! `-o wide` drops the terminal's width limit (every release column, full ids, descriptions on one
//! line, exact times); `-o html [--out FILE]` writes the matrix as one self-contained page
//! ([`crate::status::html`]), with release links from `--commit-url-template`.
//!
//! Exit codes: 0 shown; 1 when RELEASE was given and a cluster reports `failure` or `error` for it;
//! 2 bad usage, unreachable repo, or an invalid fleet configuration.

use super::args::{FleetRepoArgs, read_fleet_remembering};
use super::output::{OutputFormat, colours, make_terminal_safe, terminal_width};
use crate::model::error_chain;
use crate::status::live::LivePage;
use crate::status::matrix::{RowFilter, StateFilter, parse_label};
use crate::status::{
    CommitUrl, HtmlOptions, Matrix, RenderOptions, State, VerifiedNotes, render_html, render_release, render_table,
};
use anyhow::Context;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

/// `--serve`: a port alone is on loopback, so the page is not offered to the network by accident.
fn parse_serve_addr(s: &str) -> Result<SocketAddr, String> {
    match s.parse::<u16>() {
        Ok(port) => Ok(SocketAddr::from(([127, 0, 0, 1], port))),
        Err(_) => s.parse().map_err(|e| format!("{s:?}: expected PORT or HOST:PORT ({e})")),
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Show this release in detail (descriptions and wave-gating reasons).
    pub release: Option<String>,
    #[command(flatten)]
    pub fleet: FleetRepoArgs,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: StatusFormat,
    /// With `-o html`: write the page to FILE instead of stdout (with --watch, rewritten on each
    /// refresh).
    #[arg(long, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
    /// With `-o html`: link each release to its commit on the forge's web UI, `{sha}` replaced by
    /// the commit id, e.g. `https://github.com/acme/fleet/commit/{sha}`.
    #[arg(long, env = "FLEETGATE_COMMIT_URL_TEMPLATE", value_name = "URL", value_parser = CommitUrl::parse)]
    pub commit_url_template: Option<CommitUrl>,
    /// Keep refreshing until interrupted (Ctrl-C).
    #[arg(long)]
    pub watch: bool,
    /// Serve the page live and read-only at ADDR (`8090` = 127.0.0.1:8090, or HOST:PORT),
    /// re-reading the repo every --interval, until interrupted. Query parameters narrow it as the
    /// flags do: `/?wave=prod&state=failure&cluster=C&l=key=value`.
    #[arg(long, value_name = "ADDR", value_parser = parse_serve_addr, conflicts_with_all = ["watch", "output", "out", "release"])]
    pub serve: Option<SocketAddr>,
    /// Time between refreshes with --watch.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Only the clusters of this wave; repeatable.
    #[arg(long, value_name = "WAVE")]
    pub wave: Vec<String>,
    /// Only this cluster; repeatable.
    #[arg(long, value_name = "CLUSTER")]
    pub cluster: Vec<String>,
    /// Only clusters in this state on RELEASE, else on their desired release: success, failure,
    /// error, pending, unknown or not-started; or `stale` (not heard from within the allowance);
    /// repeatable.
    #[arg(long, value_name = "STATE", value_parser = |s: &str| s.parse::<StateFilter>())]
    pub state: Vec<StateFilter>,
    /// Only clusters with this label (`metadata.labels` of clusters/<name>.yaml); repeatable,
    /// every one must match.
    #[arg(short = 'l', long = "selector", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Mark a cluster stale when its agent was not heard from (heartbeat or status) for longer
    /// than this [default: 3 × the heartbeat interval its agent announces; never for a cluster
    /// without heartbeats].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub stale_after: Option<Duration>,
}

impl Args {
    fn filter(&self) -> RowFilter {
        RowFilter {
            waves: self.wave.clone(),
            clusters: self.cluster.clone(),
            states: self.state.clone(),
            labels: self.labels.clone(),
        }
    }
}

/// `-o` of `fleetgate status`: the shared formats, and `wide` and `html`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFormat {
    /// For people: tables fitted to the terminal, colours on a TTY.
    #[default]
    Table,
    /// Like table, without the width limit: every release, full ids, unwrapped descriptions.
    Wide,
    Json,
    Yaml,
    /// One self-contained HTML page (to stdout or --out).
    Html,
}

impl StatusFormat {
    fn machine(self) -> OutputFormat {
        match self {
            StatusFormat::Json => OutputFormat::Json,
            StatusFormat::Yaml => OutputFormat::Yaml,
            StatusFormat::Table | StatusFormat::Wide | StatusFormat::Html => OutputFormat::Table,
        }
    }
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (_state, source) = args.fleet.open_mirror("fleetgate-status")?;
    // Liveness: every cluster's heartbeat ref too (fetched only when one moved).
    let mut source = source.with_heartbeats();
    // Notes verified by the last run (or refresh) are not checked again; see VerifiedNotes.
    let mut memo = VerifiedNotes::default_path().map_or_else(VerifiedNotes::new, VerifiedNotes::open);
    let live = match args.serve {
        Some(addr) => {
            let page = LivePage::new(HtmlOptions { commit_url: args.commit_url_template.clone(), live: None });
            let (local, server) =
                page.clone().serve(addr).await.with_context(|| format!("--serve {addr}: cannot listen there"))?;
            eprintln!(
                "serving http://{local}/ (read-only) · re-reading {} every {} · Ctrl-C to stop",
                args.fleet.repo,
                humantime::format_duration(args.interval)
            );
            Some((page, server))
        }
        None => None,
    };
    let refreshing = args.watch || live.is_some();
    loop {
        let (source_back, memo_back, view) = tokio::task::spawn_blocking(move || {
            let view = read_fleet_remembering(&mut source, &mut memo);
            (source, memo, view)
        })
        .await?;
        (source, memo) = (source_back, memo_back);
        if view.is_ok()
            && let Err(e) = memo.save()
        {
            // Only a cache: the next run checks every signature again.
            tracing::warn!(error = %error_chain(&e), "not remembering verified status notes");
        }
        let code = match (view, &live) {
            (Ok(view), Some((page, _))) => {
                page.publish(view.into_matrix(args.stale_after));
                ExitCode::SUCCESS
            }
            (Ok(view), None) => show(&args, view.into_matrix(args.stale_after))?,
            // While watching or serving, a failed refresh is reported and the next one tried.
            (Err(e), _) if refreshing => {
                eprintln!(
                    "error: {} (retrying in {})",
                    error_chain(e.as_ref()),
                    humantime::format_duration(args.interval)
                );
                ExitCode::from(2)
            }
            (Err(e), _) => return Err(e),
        };
        if !refreshing {
            return Ok(code);
        }
        tokio::select! {
            _ = tokio::time::sleep(args.interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(code),
        }
    }
}

fn show(args: &Args, mut matrix: Matrix) -> anyhow::Result<ExitCode> {
    // Filters and the failures-first order apply to every output, so a pipeline reads what a
    // person sees. An unknown release is reported below, by `only`.
    matrix.select(&args.filter(), args.release.as_deref())?;
    let mut matrix = match &args.release {
        Some(id) => matrix.only(id).with_context(|| {
            let known: Vec<&str> = matrix.releases.iter().map(|r| r.id.as_str()).take(5).collect();
            format!(
                "no release tag {id} (a tag on a commit with release.yaml) in {}; newest releases: {}",
                args.fleet.repo,
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            )
        })?,
        None => matrix,
    };
    match (args.output, args.watch) {
        // One compact document per refresh, so `--watch -o json` is a stream of lines.
        (StatusFormat::Json, true) => println!("{}", serde_json::to_string(&matrix)?),
        (StatusFormat::Yaml, true) => print!("---\n{}", serde_saphyr::to_string(&matrix)?),
        (format, _) if format.machine().print_machine(&matrix)? => {}
        (StatusFormat::Html, _) => {
            let page = render_html(&matrix, &HtmlOptions { commit_url: args.commit_url_template.clone(), live: None });
            match &args.out {
                Some(path) => {
                    std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))?;
                    if args.watch {
                        eprintln!(
                            "wrote {} · refreshing every {}",
                            path.display(),
                            humantime::format_duration(args.interval)
                        );
                    }
                }
                None => print!("{page}"),
            }
        }
        (format, _) => {
            // Wide: no line is cut or wrapped short of this.
            let width = if format == StatusFormat::Wide { 10_000 } else { terminal_width() };
            let opts = RenderOptions {
                width,
                colours: colours(),
                now: chrono::Utc::now(),
                exact_times: format == StatusFormat::Wide,
            };
            // Text from the repo and its notes, without anything a terminal acts on.
            matrix.for_each_text_mut(make_terminal_safe);
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
    if !args.watch {
        // The process ends right after a one-shot run, so its matrix is left to the exit, as
        // compilers leave theirs (clang's -disable-free): freeing its strings one by one was a
        // fifth of `fleetgate status` at 10,000 clusters × 20 releases (docs/BENCHMARKS.md).
        std::mem::forget(matrix);
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

#[cfg(test)]
mod tests {
    use super::parse_serve_addr;

    #[test]
    fn a_bare_port_serves_on_loopback_only() {
        assert_eq!(parse_serve_addr("8090").unwrap().to_string(), "127.0.0.1:8090");
        assert_eq!(parse_serve_addr("0.0.0.0:8090").unwrap().to_string(), "0.0.0.0:8090");
        assert_eq!(parse_serve_addr("[::1]:8090").unwrap().to_string(), "[::1]:8090");
        assert!(parse_serve_addr("localhost:x").unwrap_err().contains("expected PORT or HOST:PORT"));
    }
}
