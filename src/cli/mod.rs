//! Thin commands over the library: each file declares its arguments and turns them into one library
//! call, then prints the result for people (tables, colours on a TTY) or machines (`-o json|yaml`).
//!
//! Exit codes everywhere: 0 done/clean, 1 findings or refused, 2 usage or configuration error
//! (`wait` adds 124 for its timeout, as `timeout(1)`).
//!
//! Commands never use each other: what several share is a flag group in [`args`] or a piece of
//! output in [`output`].

mod agent;
mod approve;
mod args;
mod audit;
mod check_crd;
mod cluster;
mod completion;
mod diff;
mod events;
mod get;
#[cfg(test)]
mod hints;
mod init;
mod output;
mod pause;
mod plan;
mod promote;
mod reconcile;
mod release;
mod rollback;
mod status;
mod tree;
mod validate;
mod version;
mod wait;

pub use output::OutputFormat;
/// What `fleetgate status` does to the text of its tables, for examples/status_matrix.rs to measure.
pub use output::make_terminal_safe;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "fleetgate",
    version,
    about = "Release one Kubernetes Operator safely to a fleet of clusters from Git"
)]
pub struct Cli {
    /// Log filter (RUST_LOG syntax), e.g. `info` or `fleetgate=debug`.
    #[arg(long, global = true, env = "FLEETGATE_LOG", default_value = "info")]
    pub log: String,
    /// Log format: `human` (default on a TTY) or `json`.
    #[arg(long, global = true, env = "FLEETGATE_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    #[command(flatten)]
    pub kube: args::KubeArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent of one spoke cluster: pull, verify, apply, bake, report, roll back.
    Agent(agent::Args),
    /// Create a new fleet repo from the built-in template.
    Init(init::Args),
    /// Check a fleet repo: schemas, references, signatures, mappings, CRD compatibility.
    Validate(validate::Args),
    /// Cut releases: write release.yaml, commit rendered manifests, sign and tag.
    #[command(subcommand)]
    Release(release::Command),
    /// Promote a release to a cluster, a wave or the fleet (a commit on a branch, optionally a PR).
    Promote(promote::Args),
    /// Say what merging a promotion PR will do to each cluster, before the merge (for CI; --post
    /// publishes it as commit status fleetgate/plan and a PR comment).
    Plan(plan::Args),
    /// Put clusters back on their previous release (a revert commit, optionally a PR).
    Rollback(rollback::Args),
    /// Pause a cluster, a wave or the fleet: its agents start no release and correct no drift
    /// (an operation in flight finishes) until resumed (a commit setting `spec.paused`).
    Pause(pause::Args),
    /// Resume what `pause` paused (a commit removing `spec.paused`).
    Resume(pause::Args),
    /// Approve a release for a wave that requires approval (a signed tag approve/<release>/<wave>).
    Approve(approve::Args),
    /// Wake a cluster's agent now and wait for its pass (an annotation on its state ConfigMap).
    Reconcile(reconcile::Args),
    /// Show per-cluster statuses of releases as a matrix.
    Status(status::Args),
    /// Wait until a release reports success on a cluster, a wave or the fleet (for CI).
    Wait(wait::Args),
    /// Print every status each cluster's agent wrote (its notes ref's history), verified.
    Audit(audit::Args),
    /// Manage clusters of the fleet repo (register a cluster's status key).
    #[command(subcommand)]
    Cluster(cluster::Command),
    /// Show live vs desired objects of a cluster as a unified diff.
    Diff(diff::Args),
    /// Show the Kubernetes Events a cluster's agent recorded (each transition, each error).
    Events(events::Args),
    /// Show the objects the release a cluster's agent last applied put in the cluster (its inventory).
    Tree(tree::Args),
    /// Offline CRD compatibility verdict between two CRD files.
    CheckCrd(check_crd::Args),
    /// Print a shell completion script: `source <(fleetgate completion bash)`.
    Completion(completion::Args),
    /// Show the fleet's agents as their clusters and Git see them.
    #[command(subcommand)]
    Get(get::Command),
    /// Show this client's version and, with --repo, the version each agent last reported.
    Version(version::Args),
}

impl Cli {
    /// The runtime the command runs on: the agent's own ([`crate::agent::process`]: few threads,
    /// one malloc arena), tokio's default for every other command.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        match self.command {
            Command::Agent(_) => crate::agent::process::runtime(),
            _ => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
        }
    }
}

/// Logs go to stderr: human-readable on a TTY, JSON otherwise (in-cluster) unless told.
pub fn init_tracing(cli: &Cli) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_new(&cli.log).unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match cli.log_format {
        Some(LogFormat::Json) => true,
        Some(LogFormat::Human) => false,
        None => !std::io::stderr().is_terminal() && matches!(cli.command, Command::Agent(_)),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Agent(mut a) => {
            a.kube = cli.kube;
            agent::run(a).await
        }
        Command::Init(a) => init::run(a).await,
        Command::Validate(a) => validate::run(a).await,
        Command::Release(c) => release::run(c).await,
        Command::Promote(a) => promote::run(a).await,
        Command::Plan(a) => plan::run(a).await,
        Command::Rollback(a) => rollback::run(a).await,
        Command::Pause(a) => pause::run(a, true).await,
        Command::Resume(a) => pause::run(a, false).await,
        Command::Approve(a) => approve::run(a).await,
        Command::Status(a) => status::run(a).await,
        Command::Wait(a) => wait::run(a).await,
        Command::Audit(a) => audit::run(a).await,
        Command::Cluster(c) => cluster::run(c).await,
        Command::Diff(mut a) => {
            a.kube = cli.kube;
            diff::run(a).await
        }
        Command::Events(mut a) => {
            a.kube = cli.kube;
            events::run(a).await
        }
        Command::Tree(mut a) => {
            a.kube = cli.kube;
            tree::run(a).await
        }
        Command::Reconcile(mut a) => {
            a.kube = cli.kube;
            reconcile::run(a).await
        }
        Command::CheckCrd(a) => check_crd::run(a).await,
        Command::Completion(a) => completion::run(a),
        Command::Version(a) => version::run(a).await,
        Command::Get(c) => get::run(c, cli.kube).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::config::KubeAccess;

    #[test]
    fn kubeconfig_and_context_are_global_flags() {
        for argv in [
            &["fleetgate", "--kubeconfig", "k.yaml", "--context", "eu-1", "diff", "--repo", "r", "--cluster", "c"][..],
            &["fleetgate", "diff", "--repo", "r", "--cluster", "c", "--kubeconfig", "k.yaml", "--context", "eu-1"][..],
        ] {
            let cli = Cli::try_parse_from(argv).unwrap();
            assert_eq!(
                cli.kube.access(),
                KubeAccess::Kubeconfig { path: Some("k.yaml".into()), context: Some("eu-1".into()) },
                "{argv:?}"
            );
        }
        let cli = Cli::try_parse_from(["fleetgate", "agent", "--context", "eu-1"]).unwrap();
        assert_eq!(cli.kube.access(), KubeAccess::Kubeconfig { path: None, context: Some("eu-1".into()) });
        assert_eq!(Cli::try_parse_from(["fleetgate", "version"]).unwrap().kube.access(), KubeAccess::Infer);
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
