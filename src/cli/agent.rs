//! `fleetgate agent rbac --release ID`: the RBAC that release needs, as YAML on stdout.
//!
//! `fleetgate agent`: flags (each also a `FLEETGATE_*` environment variable and a camelCase key of
//! the optional `--config` file) into an [`AgentConfig`], then the agent until SIGTERM or Ctrl-C.

use super::args::{GitAccess, KubeArgs};
use crate::agent::{Agent, AgentConfig, AgentServices, AgentSettings};
use anyhow::Context as _;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
#[command(after_help = "Precedence: flag or environment variable > config file > default.\n\
Example: fleetgate agent --repo https://git.example.com/fleet.git --cluster canary --trusted-keys /etc/fleetgate/keys")]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// YAML config file with the same settings in camelCase (e.g. `stateNamespace: fleetgate-system`).
    #[arg(long, env = "FLEETGATE_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: AgentSettings,
    /// Print this cluster's public status key (generating it if there is none yet) and exit;
    /// register it with `fleetgate cluster register NAME --status-key KEY`.
    #[arg(long)]
    print_status_key: bool,
    /// The global `--kubeconfig` / `--context` (set by [`super::run`]); the config file's
    /// `kubeconfig`/`context` apply where they are not given.
    #[arg(skip)]
    pub(super) kube: KubeArgs,
}

impl Args {
    /// Config file (if any) overlaid with the flags, resolved and validated.
    fn into_config(self) -> anyhow::Result<AgentConfig> {
        let file = match &self.config {
            Some(path) => AgentSettings::from_file(path)?,
            None => AgentSettings::default(),
        };
        let flags = AgentSettings { kubeconfig: self.kube.kubeconfig, context: self.kube.context, ..self.settings };
        Ok(file.overlay(flags)?.resolve()?)
    }
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Print the least-privilege RBAC (ClusterRole, Role per namespace, bindings to the agent's
    /// ServiceAccount) for the kinds and names a release contains: deploy/rbac-operator.yaml.
    Rbac(RbacArgs),
}

#[derive(Debug, clap::Args)]
struct RbacArgs {
    /// The release (its tag).
    #[arg(long, value_name = "ID")]
    release: String,
    /// The fleet repo: a local path or a Git URL.
    #[arg(long, default_value = ".")]
    repo: String,
    /// Armored public key of a trusted release signer (repeatable): the tag's signature is
    /// verified first. Without it the tag's content is read as it is.
    #[arg(long = "trusted-keys", value_name = "FILE")]
    trusted_keys: Vec<PathBuf>,
    /// The agent's namespace (where its ServiceAccount lives).
    #[arg(long, default_value = crate::agent::config::DEFAULT_STATE_NAMESPACE, value_name = "NAMESPACE")]
    agent_namespace: String,
    #[command(flatten)]
    git: GitAccess,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(Command::Rbac(a)) = args.command {
        return rbac(a).await;
    }
    let print_status_key = args.print_status_key;
    let config = args.into_config()?;
    if print_status_key {
        let client = config.kube.client().await?;
        let signer = crate::agent::identity::load_or_create(
            &client,
            &config.state_namespace,
            &config.cluster,
            config.status_key.as_deref(),
        )
        .await?;
        println!("{}", signer.public());
        return Ok(ExitCode::SUCCESS);
    }
    tracing::info!(
        cluster = %config.cluster,
        repo = %crate::model::redact_userinfo(&config.repo.url()),
        branch = %config.branch,
        identity = %config.identity,
        leader_election = config.leader_election.is_some(),
        "starting agent"
    );
    let services = AgentServices::start(config).await?;
    tracing::info!(addr = %services.http_addr(), "agent services started");
    let agent = Agent::new(services)?;
    let services = agent.run(shutdown_signal()).await;
    tracing::info!("shutting down");
    services.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// SIGTERM (Kubernetes stopping the Pod) or Ctrl-C.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the agent");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn rbac(args: RbacArgs) -> anyhow::Result<ExitCode> {
    let trust = crate::release::Keyring::from_key_files(&args.trusted_keys).context("loading --trusted-keys")?;
    let credentials = args.git.credentials()?;
    let unchecked = trust.is_none();
    // git2 and gpgme block; keep them off the async runtime.
    let rbac = tokio::task::spawn_blocking(move || -> anyhow::Result<crate::apply::AgentRbac> {
        let opened = crate::source::open_repo(&args.repo, None, credentials)?;
        Ok(crate::apply::release_rbac(opened.checkout(), &args.release, trust.as_ref())?)
    })
    .await??;
    if unchecked {
        eprintln!("note: without --trusted-keys the release's signature was not checked");
    }
    print!("{}", rbac.to_yaml(&args.agent_namespace));
    Ok(ExitCode::SUCCESS)
}
