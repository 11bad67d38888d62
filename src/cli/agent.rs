//! `fleetgate agent rbac --release ID`: the RBAC that release needs, as YAML on stdout.
//!
//! `fleetgate agent`: flags (each also a `FLEETGATE_*` environment variable and a camelCase key of
//! the optional `--config` file) into an [`AgentConfig`], then the agent until SIGTERM or Ctrl-C.

use super::args::{ForgeArgs, GitAccess, KubeArgs};
use crate::agent::config::{NamedUrls, parse_labels};
use crate::agent::{Agent, AgentConfig, AgentServices, AgentSettings};
use crate::model::PromotionMode;
use anyhow::Context as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

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
    /// The fleet repo: a URL (https://, ssh://, git://, user@host:path) or a local path.
    #[arg(long, env = "FLEETGATE_REPO", value_name = "URL")]
    repo: Option<String>,
    /// The tracked branch [default: main].
    #[arg(long, env = "FLEETGATE_BRANCH")]
    branch: Option<String>,
    /// This cluster's name in the fleet repo (clusters/<NAME>.yaml).
    #[arg(long, env = "FLEETGATE_CLUSTER", value_name = "NAME")]
    cluster: Option<String>,
    /// The global `--kubeconfig` / `--context` (set by [`super::run`]); the config file's
    /// `kubeconfig`/`context` apply where they are not given.
    #[arg(skip)]
    pub(super) kube: KubeArgs,
    /// Public keys of the release signers (files, or directories of key files): OpenPGP keys, or
    /// OpenSSH allowed_signers files for SSH-signed tags; repeatable.
    #[arg(long, env = "FLEETGATE_TRUSTED_KEYS", value_name = "FILE", num_args = 1.., value_delimiter = ',')]
    trusted_keys: Vec<PathBuf>,
    /// Namespace of the agent's state ConfigMap, Lease and Events [default: fleetgate-system].
    #[arg(long, env = "FLEETGATE_STATE_NAMESPACE", value_name = "NAMESPACE")]
    state_namespace: Option<String>,
    /// Local Git cache [default: ~/.cache/fleetgate/agent/<cluster>].
    #[arg(long, env = "FLEETGATE_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Poll interval, each wait ±10 % [default: 10s].
    #[arg(long, env = "FLEETGATE_INTERVAL", value_parser = humantime::parse_duration)]
    interval: Option<Duration>,
    /// How often an idle agent compares the cluster with its current release and re-applies
    /// what drifted (`0s`: never) [default: 5m].
    #[arg(long, env = "FLEETGATE_DRIFT_INTERVAL", value_parser = humantime::parse_duration)]
    drift_interval: Option<Duration>,
    /// How often the agent publishes this cluster's signed heartbeat (`0s`: never); readers mark
    /// the cluster stale after 3 missed beats [default: 2m].
    #[arg(long, env = "FLEETGATE_HEARTBEAT_INTERVAL", value_parser = humantime::parse_duration)]
    heartbeat_interval: Option<Duration>,
    /// Address for /healthz, /readyz, /metrics and POST /hooks/git [default: 127.0.0.1:8080].
    #[arg(long, env = "FLEETGATE_LISTEN", value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// After a rollback, push a commit (signed with the status key) that pins this cluster to the
    /// rolled-back-to release. On by default; `--write-back=false` switches it off.
    #[arg(long, env = "FLEETGATE_WRITE_BACK", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    write_back: Option<bool>,
    /// Hold this cluster on the release it runs, whatever Git says (an operation in flight still
    /// finishes); the optional value is the reason shown in statuses. The same brake without a
    /// restart: annotate the state ConfigMap `fleetgate.io/paused=REASON`.
    #[arg(long, env = "FLEETGATE_PAUSED", num_args = 0..=1, default_missing_value = "", value_name = "REASON")]
    paused: Option<String>,
    /// SSH private key for ssh:// and user@host:path repos.
    #[arg(long, env = "FLEETGATE_GIT_SSH_KEY", value_name = "FILE")]
    git_ssh_key: Option<PathBuf>,
    /// File holding a token for https:// repos.
    #[arg(long, env = "FLEETGATE_GIT_TOKEN_FILE", value_name = "FILE")]
    git_token_file: Option<PathBuf>,
    /// known_hosts file the Git server's SSH host key must be in (strict: without it every SSH
    /// host is refused; the pod has no ~/.ssh).
    #[arg(long, env = "FLEETGATE_GIT_KNOWN_HOSTS", value_name = "FILE")]
    git_known_hosts: Option<PathBuf>,
    /// PEM file of the CA(s) an https:// Git server's certificate may also be issued by.
    #[arg(long, env = "FLEETGATE_GIT_CA_FILE", value_name = "FILE")]
    git_ca_file: Option<PathBuf>,
    /// POST notifications of this cluster's release transitions here; repeatable, `NAME=URL` for
    /// the endpoint fleet.yaml spec.status.notify names (a bare URL is `default`).
    #[arg(long, env = "FLEETGATE_NOTIFY_URL", value_name = "[NAME=]URL", value_delimiter = ',')]
    notify_url: Vec<String>,
    /// Which transitions an endpoint hears: started, applied, passed, failed, rolledBack, paused,
    /// refused, error, or all; repeatable, one `[NAME=]KIND,KIND…` per endpoint [default:
    /// failed,rolledBack,refused,error,paused].
    #[arg(long, env = "FLEETGATE_NOTIFY_ON", value_name = "[NAME=]KINDS")]
    notify_on: Vec<String>,
    /// An endpoint's message format: slack (text and blocks), teams (an Adaptive Card) or webhook
    /// (JSON signed with HMAC-SHA256); repeatable, `[NAME=]FORMAT` [default: slack].
    #[arg(long, env = "FLEETGATE_NOTIFY_FORMAT", value_name = "[NAME=]FORMAT", value_delimiter = ',')]
    notify_format: Vec<String>,
    /// The file holding a webhook endpoint's HMAC secret (read at each delivery); repeatable,
    /// `[NAME=]FILE`.
    #[arg(long, env = "FLEETGATE_NOTIFY_SECRET_FILE", value_name = "[NAME=]FILE", value_delimiter = ',')]
    notify_secret_file: Vec<String>,
    /// A Prometheus server for the gates; repeatable, `NAME=URL` for the one a GatePolicy's
    /// `prometheus: NAME` names (a bare URL is `default`, what policies use by default).
    #[arg(long, env = "FLEETGATE_PROMETHEUS", value_name = "[NAME=]URL", value_delimiter = ',')]
    prometheus: Vec<String>,
    /// A kind (KIND.GROUP, e.g. Certificate.cert-manager.io, or a core KIND such as Secret) customResources gates may read besides
    /// the release's own CRDs; repeatable.
    #[arg(
        long = "allow-gate-kind",
        env = "FLEETGATE_ALLOW_GATE_KINDS",
        value_name = "KIND.GROUP",
        value_delimiter = ','
    )]
    allow_gate_kinds: Vec<String>,
    /// Where commit statuses are mirrored besides Git notes (the token: --forge-token-file, else
    /// $FLEETGATE_FORGE_TOKEN). Never taken from the fleet repo.
    #[command(flatten)]
    forge: ForgeArgs,
    /// Timeout of each notification POST (each message is tried up to 4 times, in the
    /// background) [default: 5s].
    #[arg(long, env = "FLEETGATE_NOTIFY_TIMEOUT", value_parser = humantime::parse_duration)]
    notify_timeout: Option<Duration>,
    /// Shared secret for POST /hooks/git (GitHub/Gitea HMAC signature or GitLab token).
    #[arg(long, env = "FLEETGATE_WEBHOOK_SECRET_FILE", value_name = "FILE")]
    webhook_secret_file: Option<PathBuf>,
    /// Serve POST /hooks/git beyond loopback without a webhook secret (only behind a
    /// NetworkPolicy that admits just the forge); without it such a --listen is refused.
    #[arg(long, env = "FLEETGATE_INSECURE_WEBHOOK", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    insecure_webhook: Option<bool>,
    /// Abort a fetch whose pack grows past this many bytes; a tag too large to fetch is skipped
    /// and reported [default: 268435456, 256 MiB].
    #[arg(long, env = "FLEETGATE_MAX_FETCH_BYTES", value_name = "BYTES")]
    max_fetch_bytes: Option<u64>,
    /// Refuse to sync a remote with more tags than this [default: 5000].
    #[arg(long, env = "FLEETGATE_MAX_TAGS", value_name = "N")]
    max_tags: Option<usize>,
    /// Leader election over a Lease, so only one agent per cluster works [default: true].
    #[arg(long, env = "FLEETGATE_LEADER_ELECT", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    leader_elect: Option<bool>,
    /// How long a leader's claim lasts without renewal [default: 15s].
    #[arg(long, env = "FLEETGATE_LEASE_DURATION", value_parser = humantime::parse_duration)]
    lease_duration: Option<Duration>,
    /// The agent's baseline ReleaseAdmissionPolicy (YAML); the repo's policies can only narrow it
    /// [default: anything but bindings to cluster-admin].
    #[arg(long, env = "FLEETGATE_ADMISSION_POLICY", value_name = "FILE")]
    admission_policy: Option<PathBuf>,
    /// Who decides what this cluster runs: `signed` (every branch tip must be a commit signed by a
    /// promotion key, descending from the last accepted tip) or `unsigned` (pushes choose among
    /// signed releases; policies come from the release's own tag) [default: fleet.yaml's
    /// spec.promotions; this setting wins over it]. See docs/SECURITY.md.
    #[arg(long, env = "FLEETGATE_PROMOTIONS", value_name = "MODE")]
    promotions: Option<PromotionMode>,
    /// Public keys (files or directories) that may sign promotion commits: a release manager's,
    /// or the forge's merge key [default: the --trusted-keys].
    #[arg(long, env = "FLEETGATE_PROMOTION_KEYS", value_name = "FILE|DIR", value_delimiter = ',')]
    promotion_keys: Vec<PathBuf>,
    /// Public keys (files or directories: OpenPGP, or OpenSSH allowed_signers) of the approvers:
    /// who may approve a release for a wave with `approval: required` (`fleetgate approve`)
    /// [default: none; such waves wait].
    #[arg(long, env = "FLEETGATE_APPROVER_KEYS", value_name = "FILE|DIR", value_delimiter = ',')]
    approver_keys: Vec<PathBuf>,
    /// A forge login whose approving review of the promotion PR (at its head) approves a release
    /// for such a wave too; needs --forge-* [default: none; only signed approval tags count].
    #[arg(long = "approver", env = "FLEETGATE_APPROVERS", value_name = "LOGIN", value_delimiter = ',')]
    approvers: Vec<String>,
    /// Spoke plans: after each pass, judge the open promotion pull requests on the forge that move
    /// this cluster (pre-apply checks and a server-side dry run, nothing applied) and post
    /// `fleetgate/plan/<cluster>` on their heads; needs --forge-* [default: false]. docs/PLAN.md.
    #[arg(long, env = "FLEETGATE_PLAN_PULL_REQUESTS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    plan_pull_requests: Option<bool>,
    /// The fleet's name (fleet.yaml metadata.name) every release must name in spec.fleet
    /// [default: the name this agent's state pinned; required when there is none yet, unless
    /// --pin-first-fleet].
    #[arg(long, env = "FLEETGATE_FLEET", value_name = "NAME")]
    fleet: Option<String>,
    /// Without --fleet and with no name pinned yet, take the fleet name of the first release this
    /// agent accepts. Whoever pushes before that first sync then chooses the fleet, including
    /// another fleet's releases signed by the same key (docs/SECURITY.md).
    #[arg(long, env = "FLEETGATE_PIN_FIRST_FLEET", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pin_first_fleet: Option<bool>,
    /// This cluster's status key: an unencrypted OpenSSH Ed25519 private key file [default: the
    /// Secret fleetgate-status-key-<cluster> in the state namespace, generated on first start].
    #[arg(long, env = "FLEETGATE_STATUS_KEY", value_name = "FILE")]
    status_key: Option<PathBuf>,
    /// A label of this spoke, KEY=VALUE (repeatable): what a release's variant selectors
    /// (matchLabels) match to choose the variant this cluster runs. Only the spoke's own
    /// configuration says this; labels in the fleet repo's clusters/ never choose a variant.
    #[arg(long = "label", env = "FLEETGATE_LABELS", value_name = "KEY=VALUE", value_delimiter = ',')]
    labels: Vec<String>,
    /// Print this cluster's public status key (generating it if there is none yet) and exit;
    /// register it with `fleetgate cluster register NAME --status-key KEY`.
    #[arg(long)]
    print_status_key: bool,
}

impl Args {
    /// Config file (if any) overlaid with the flags, resolved and validated.
    fn into_config(self) -> anyhow::Result<AgentConfig> {
        let file = match &self.config {
            Some(path) => AgentSettings::from_file(path)?,
            None => AgentSettings::default(),
        };
        let flags = AgentSettings {
            repo: self.repo,
            branch: self.branch,
            cluster: self.cluster,
            kubeconfig: self.kube.kubeconfig,
            context: self.kube.context,
            trusted_keys: self.trusted_keys,
            state_namespace: self.state_namespace,
            state_dir: self.state_dir,
            interval: self.interval,
            drift_interval: self.drift_interval,
            heartbeat_interval: self.heartbeat_interval,
            listen: self.listen,
            write_back: self.write_back,
            paused: self.paused,
            git_ssh_key: self.git_ssh_key,
            git_token_file: self.git_token_file,
            git_known_hosts: self.git_known_hosts,
            git_ca_file: self.git_ca_file,
            notify_url: NamedUrls::parse(&self.notify_url),
            notify_on: NamedUrls::parse(&self.notify_on),
            notify_format: NamedUrls::parse(&self.notify_format),
            notify_secret_file: NamedUrls::parse(&self.notify_secret_file),
            prometheus: NamedUrls::parse(&self.prometheus),
            // Credentials are for the config file only (`prometheusSources`), never a flag.
            prometheus_sources: Default::default(),
            allow_gate_kinds: self.allow_gate_kinds,
            forge: self.forge.settings(),
            notify_timeout: self.notify_timeout,
            webhook_secret_file: self.webhook_secret_file,
            insecure_webhook: self.insecure_webhook,
            max_fetch_bytes: self.max_fetch_bytes,
            max_tags: self.max_tags,
            leader_elect: self.leader_elect,
            lease_duration: self.lease_duration,
            admission_policy: self.admission_policy,
            promotions: self.promotions,
            promotion_keys: self.promotion_keys,
            approver_keys: self.approver_keys,
            approvers: self.approvers,
            plan_pull_requests: self.plan_pull_requests,
            fleet: self.fleet,
            pin_first_fleet: self.pin_first_fleet,
            status_key: self.status_key,
            labels: parse_labels(&self.labels)?,
        };
        Ok(file.overlay(flags).resolve()?)
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
    let trust = crate::release::TrustConfig::from_key_files(&args.trusted_keys).context("loading --trusted-keys")?;
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
