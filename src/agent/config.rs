//! The agent's configuration: [`AgentSettings`] (every field optional, what flags, environment
//! variables and the optional YAML config file each provide) resolved into one typed, validated
//! [`AgentConfig`].
//!
//! Precedence, field by field: command-line flag or its `FLEETGATE_*` environment variable (clap
//! merges those two) > config file (`--config FILE`) > built-in default. One struct,
//! [`AgentSettings`], is both what clap parses and what serde reads from the file;
//! [`AgentSettings::overlay`] puts the flags over the file without naming a field. Validation happens once,
//! here, so the rest of the agent never sees a half-valid configuration: paths that must be read at
//! run time (trusted keys, credentials, webhook secret) are checked to exist at start-up, because a
//! missing Secret mount should stop the Pod with a clear message, not fail the first reconcile.
//!
//! Leader election is **on by default**, in-cluster or not: it costs one `Lease` renewal every few
//! seconds and it is the only thing that stops two agents for the same cluster (two replicas, a
//! rolling update, or someone running `fleetgate agent` from a laptop against a spoke that already
//! has one) from applying concurrently. `--leader-elect=false` turns it off for environments whose
//! RBAC does not grant `leases`.

use super::notifier::{Endpoint, Format, NotificationKind};
use crate::gates::{PrometheusAuth, PrometheusEndpoints, PrometheusSource};
use crate::model::{AdmissionBaseline, BaselineError, PromotionMode, ReleaseAdmissionPolicySpec};
use crate::model::{DEFAULT_ENDPOINT, is_dns_label, is_label_key, is_label_value};
use crate::source::{Credentials, FetchLimits};
use crate::status::{ForgeConfig, ForgeError, ForgeSettings};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_BRANCH: &str = "main";
pub const DEFAULT_STATE_NAMESPACE: &str = "fleetgate-system";
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// How often an idle agent checks for drift, by default.
pub const DEFAULT_DRIFT_INTERVAL: Duration = Duration::from_secs(300);
/// How often an agent publishes its heartbeat, by default: readers call it stale after three
/// missed beats (6 min), and 1,000 agents add about 8 small pushes a second (docs/BENCHMARKS.md).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(120);
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Polls closer together than this would hammer the Git server for no benefit: the webhook and the
/// file-system watcher are the fast paths.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the fleet repo lives. A local path (or `file://` URL) additionally gets a file-system
/// watcher on its refs so a commit or push wakes the agent at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepoLocation {
    Local(PathBuf),
    Remote(String),
}

impl RepoLocation {
    /// `file://PATH`, an absolute path, `./…`/`../…`, or any existing directory is local; anything
    /// else (`https://`, `ssh://`, `git://`, `user@host:path`) is remote.
    pub fn parse(repo: &str) -> RepoLocation {
        if let Some(path) = repo.strip_prefix("file://") {
            return RepoLocation::Local(PathBuf::from(path));
        }
        let looks_local = repo.starts_with('/') || repo.starts_with("./") || repo.starts_with("../");
        if looks_local || (!repo.contains("://") && Path::new(repo).is_dir()) {
            RepoLocation::Local(PathBuf::from(repo))
        } else {
            RepoLocation::Remote(repo.to_string())
        }
    }

    /// What git2 is given as the remote URL (a local path is passed as the path).
    pub fn url(&self) -> String {
        match self {
            RepoLocation::Local(p) => p.display().to_string(),
            RepoLocation::Remote(u) => u.clone(),
        }
    }

    pub fn local_path(&self) -> Option<&Path> {
        match self {
            RepoLocation::Local(p) => Some(p),
            RepoLocation::Remote(_) => None,
        }
    }
}

/// How the agent reaches its cluster's API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeAccess {
    /// A kubeconfig: `path` (default: `$KUBECONFIG` or `~/.kube/config`) and optional `context`.
    Kubeconfig { path: Option<PathBuf>, context: Option<String> },
    /// Neither `--kubeconfig` nor `--context`: the default kubeconfig if there is one, else the
    /// Pod's service account (in-cluster).
    Infer,
}

impl KubeAccess {
    /// Builds a client. Errors name the kubeconfig or say that neither a kubeconfig nor an
    /// in-cluster service account was found.
    pub async fn client(&self) -> Result<kube::Client, ConfigError> {
        let config = match self {
            KubeAccess::Infer => kube::Config::infer().await.map_err(|e| ConfigError::Kube(e.to_string()))?,
            KubeAccess::Kubeconfig { path, context } => {
                let options = kube::config::KubeConfigOptions { context: context.clone(), ..Default::default() };
                match path {
                    Some(path) => {
                        let kubeconfig = kube::config::Kubeconfig::read_from(path)
                            .map_err(|e| ConfigError::Kube(format!("{}: {e}", path.display())))?;
                        kube::Config::from_custom_kubeconfig(kubeconfig, &options).await
                    }
                    None => kube::Config::from_kubeconfig(&options).await,
                }
                .map_err(|e| ConfigError::Kube(e.to_string()))?
            }
        };
        kube::Client::try_from(config).map_err(|e| ConfigError::Kube(e.to_string()))
    }
}

/// Git credentials; which one is used depends on the URL scheme (SSH key for `ssh://` and
/// `user@host:path`, token for `https://`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GitCredentials {
    pub ssh_key: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    /// `known_hosts` SSH host keys are checked against, strictly (none: every SSH host is refused).
    pub known_hosts: Option<PathBuf>,
    /// PEM CA certificates an HTTPS Git server's certificate may chain to.
    pub ca_file: Option<PathBuf>,
}

impl GitCredentials {
    /// The credentials git2 is given: the SSH key path, the token and `known_hosts` read from
    /// their files (each call reads them again, so a rotated Secret is picked up), the CA file,
    /// and the proxies of the environment.
    pub fn to_source(&self) -> Result<Credentials, ConfigError> {
        let read = |what: &'static str, path: &Option<PathBuf>| {
            path.as_ref()
                .map(|path| {
                    std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
                        what,
                        path: path.clone(),
                        source,
                    })
                })
                .transpose()
        };
        Ok(Credentials {
            ssh_key: self.ssh_key.clone(),
            token: read("git token file", &self.token_file)?.map(|t| t.trim().to_string()),
            known_hosts: read("git known_hosts file", &self.known_hosts)?,
            ca_file: self.ca_file.clone(),
            proxy: crate::source::ProxyEnv::from_env(),
            ..Default::default()
        })
    }
}

/// Reads the agent's baseline `ReleaseAdmissionPolicy` document.
fn read_admission_policy(path: &Path) -> Result<ReleaseAdmissionPolicySpec, ConfigError> {
    match AdmissionBaseline::read(path) {
        Ok(baseline) => Ok(baseline.spec),
        Err(BaselineError::Unreadable { path, source }) => {
            Err(ConfigError::Unreadable { what: "admission policy", path, source })
        }
        Err(BaselineError::Parse(e)) => {
            Err(ConfigError::ParseFile { path: path.to_path_buf(), message: e.to_string() })
        }
    }
}

/// The `Lease` used for leader election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionSettings {
    /// How long a holder's claim lasts without renewal; a standby takes over this long after the
    /// leader's last renewal. The leader renews every `lease_duration / 7` (2 s at the default) and
    /// steps down when it could not renew for `2/3` of it, before anyone else may take over.
    pub lease_duration: Duration,
}

/// The validated configuration of one agent.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    pub repo: RepoLocation,
    pub branch: String,
    /// This spoke's name in the fleet repo (`clusters/<cluster>.yaml`); also names the state
    /// ConfigMap, the Lease and the status context.
    pub cluster: String,
    pub kube: KubeAccess,
    /// ASCII-armoured or binary OpenPGP public keys; a directory given on the command line is
    /// expanded to the files in it.
    pub trusted_keys: Vec<PathBuf>,
    pub state_namespace: String,
    /// Local Git cache (clone of the fleet repo).
    pub state_dir: PathBuf,
    /// Poll interval; each wait is this ±10 %.
    pub interval: Duration,
    /// How often an idle agent compares the live objects with its current release and re-applies
    /// what drifted; `None`: never.
    pub drift_interval: Option<Duration>,
    /// How often the leader publishes this cluster's signed heartbeat
    /// (`refs/fleetgate/heartbeat/<cluster>`, see `crate::status::heartbeat`); `None`: never.
    pub heartbeat_interval: Option<Duration>,
    pub listen: SocketAddr,
    pub write_back: bool,
    /// The local emergency brake (`--paused[=REASON]`): hold this cluster on the release it runs
    /// whatever Git says, until the agent restarts without it. The reason, shown in the status.
    pub paused: Option<String>,
    pub git_credentials: GitCredentials,
    /// Where notifications are POSTed, in which format and of which transitions, by the name
    /// `fleet.yaml` `spec.status.notify` picks (absent: `default`); see [`super::notifier`].
    pub notify: BTreeMap<String, Endpoint>,
    pub notify_timeout: Duration,
    /// The forge commit statuses are mirrored to (token read at each status, so a rotated Secret
    /// is picked up); `fleet.yaml` can only switch it off (`spec.status.forge: false`).
    pub forge: Option<ForgeConfig>,
    /// The Prometheus servers a GatePolicy's `prometheus: NAME` refers to.
    pub prometheus: PrometheusEndpoints,
    /// `KIND.GROUP`s (e.g. `Certificate.cert-manager.io`) that `customResources` gates may read
    /// besides the kinds of the release's own CRDs.
    pub allowed_gate_kinds: Vec<String>,
    /// Shared secret for `POST /hooks/git` (GitHub/Gitea HMAC or GitLab token); none = accept any.
    pub webhook_secret_file: Option<PathBuf>,
    /// Listening beyond loopback without a webhook secret was asked for (`--insecure-webhook`).
    pub insecure_webhook: bool,
    /// What one fetch may download, and how many tags the agent considers.
    pub fetch_limits: FetchLimits,
    /// `None` when leader election is turned off.
    pub leader_election: Option<LeaderElectionSettings>,
    /// This process's identity in the Lease and in Events: `<pod or host name>_<random>`.
    pub identity: String,
    /// The upper bound of what any release may touch; the repo's `ReleaseAdmissionPolicy`
    /// documents can only narrow it. Default: anything but bindings to `cluster-admin`.
    pub admission_baseline: ReleaseAdmissionPolicySpec,
    /// The promotion mode; `None` leaves it to the fleet repo (docs/SECURITY.md).
    pub promotions: Option<PromotionMode>,
    /// Keys that may sign promotion commits; empty: the trusted (release) keys.
    pub promotion_keys: Vec<PathBuf>,
    /// The approvers' keys: who may approve a release for a wave with `approval: required`
    /// (signed `approve/<release>/<wave>` tags); empty: no approval counts, such waves wait.
    pub approver_keys: Vec<PathBuf>,
    /// Forge logins whose approval of the promotion PR approves a release for such a wave too
    /// (the forge authenticates them; needs `forge`). Empty: only signed tags count.
    pub approvers: Vec<String>,
    /// Spoke plans ([`super::plans`]): after each pass, judge the open promotion pull requests on
    /// `forge` that move this cluster and post `fleetgate/plan/<cluster>` on their heads.
    pub plan_pull_requests: bool,
    /// The fleet every release must name; `None`: the name the state pinned, else (with
    /// `pin_first_fleet`) the first accepted `fleet.yaml`'s.
    pub fleet: Option<String>,
    /// `--pin-first-fleet`: an agent without `fleet` and without a pinned name may take the name
    /// of the first release it accepts. Otherwise [`super::services::AgentServices::start`]
    /// refuses to start, since whoever pushes first would choose the fleet (docs/SECURITY.md).
    pub pin_first_fleet: bool,
    /// The status key file (OpenSSH Ed25519 private key); `None`: the key in the Secret
    /// `fleetgate-status-key-<cluster>`, generated on first start ([`super::identity`]).
    pub status_key: Option<PathBuf>,
    /// What this spoke is, as the operator of the spoke says (`region: eu`): a release's variant
    /// selectors match these, never the labels of `clusters/*.yaml` on the branch.
    pub labels: BTreeMap<String, String>,
}

impl AgentConfig {
    /// `fleetgate-state-<cluster>`.
    pub fn state_configmap_name(&self) -> String {
        super::state::state_configmap_name(&self.cluster)
    }

    /// `fleetgate-agent-<cluster>`.
    pub fn lease_name(&self) -> String {
        lease_name(&self.cluster)
    }
}

/// The leader-election Lease of `cluster`'s agents: `fleetgate-agent-<cluster>`.
pub fn lease_name(cluster: &str) -> String {
    format!("fleetgate-agent-{cluster}")
}

/// What one source says, every field optional: the flags and their `FLEETGATE_*` environment
/// variables (clap reads this struct: the doc comments are `fleetgate agent --help`), or the
/// config file (serde reads it: the same names in camelCase, e.g. `stateNamespace:
/// fleetgate-system`). A new setting is one field here and its use in [`AgentSettings::resolve`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, clap::Args)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AgentSettings {
    /// The fleet repo: a URL (https://, ssh://, git://, user@host:path) or a local path.
    #[arg(long, env = "FLEETGATE_REPO", value_name = "URL")]
    pub repo: Option<String>,
    /// The tracked branch [default: main].
    #[arg(long, env = "FLEETGATE_BRANCH")]
    pub branch: Option<String>,
    /// This cluster's name in the fleet repo (clusters/<NAME>.yaml).
    #[arg(long, env = "FLEETGATE_CLUSTER", value_name = "NAME")]
    pub cluster: Option<String>,
    /// The kubeconfig: the binary's global `--kubeconfig` (which the CLI puts here), or the file's.
    #[arg(skip)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context: the global `--context`, or the file's.
    #[arg(skip)]
    pub context: Option<String>,
    /// Public keys of the release signers (files, or directories of key files): OpenPGP keys, or
    /// OpenSSH allowed_signers files for SSH-signed tags; repeatable.
    #[arg(long, env = "FLEETGATE_TRUSTED_KEYS", value_name = "FILE", num_args = 1.., value_delimiter = ',')]
    #[serde(default)]
    pub trusted_keys: Vec<PathBuf>,
    /// Namespace of the agent's state ConfigMap, Lease and Events [default: fleetgate-system].
    #[arg(long, env = "FLEETGATE_STATE_NAMESPACE", value_name = "NAMESPACE")]
    pub state_namespace: Option<String>,
    /// Local Git cache [default: ~/.cache/fleetgate/agent/<cluster>].
    #[arg(long, env = "FLEETGATE_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Poll interval, each wait ±10 % [default: 10s].
    #[arg(long, env = "FLEETGATE_INTERVAL", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// How often an idle agent compares the cluster with its current release and re-applies
    /// what drifted (`0s`: never) [default: 5m].
    #[arg(long, env = "FLEETGATE_DRIFT_INTERVAL", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub drift_interval: Option<Duration>,
    /// How often the agent publishes this cluster's signed heartbeat (`0s`: never); readers mark
    /// the cluster stale after 3 missed beats [default: 2m].
    #[arg(long, env = "FLEETGATE_HEARTBEAT_INTERVAL", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub heartbeat_interval: Option<Duration>,
    /// Address for /healthz, /readyz, /metrics and POST /hooks/git [default: 127.0.0.1:8080].
    #[arg(long, env = "FLEETGATE_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// After a rollback, push a commit (signed with the status key) that pins this cluster to the
    /// rolled-back-to release. On by default; `--write-back=false` switches it off.
    #[arg(long, env = "FLEETGATE_WRITE_BACK", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub write_back: Option<bool>,
    /// Hold this cluster on the release it runs, whatever Git says (an operation in flight still
    /// finishes); the optional value is the reason shown in statuses. The same brake without a
    /// restart: annotate the state ConfigMap `fleetgate.io/paused=REASON`.
    #[arg(long, env = "FLEETGATE_PAUSED", num_args = 0..=1, default_missing_value = "", value_name = "REASON")]
    pub paused: Option<String>,
    /// SSH private key for ssh:// and user@host:path repos.
    #[arg(long, env = "FLEETGATE_GIT_SSH_KEY", value_name = "FILE")]
    pub git_ssh_key: Option<PathBuf>,
    /// File holding a token for https:// repos.
    #[arg(long, env = "FLEETGATE_GIT_TOKEN_FILE", value_name = "FILE")]
    pub git_token_file: Option<PathBuf>,
    /// known_hosts file the Git server's SSH host key must be in (strict: without it every SSH
    /// host is refused; the pod has no ~/.ssh).
    #[arg(long, env = "FLEETGATE_GIT_KNOWN_HOSTS", value_name = "FILE")]
    pub git_known_hosts: Option<PathBuf>,
    /// PEM file of the CA(s) an https:// Git server's certificate may also be issued by.
    #[arg(long, env = "FLEETGATE_GIT_CA_FILE", value_name = "FILE")]
    pub git_ca_file: Option<PathBuf>,
    /// POST notifications of this cluster's release transitions here; repeatable, `NAME=URL` for
    /// the endpoint fleet.yaml spec.status.notify names (a bare URL is `default`).
    #[arg(long, env = "FLEETGATE_NOTIFY_URL", value_name = "[NAME=]URL", value_delimiter = ',')]
    #[serde(default, with = "by_name")]
    pub notify_url: Vec<Named>,
    /// Which transitions an endpoint hears: started, applied, passed, failed, rolledBack, paused,
    /// refused, error, or all; repeatable, one `[NAME=]KIND,KIND…` per endpoint [default:
    /// failed,rolledBack,refused,error,paused].
    #[arg(long, env = "FLEETGATE_NOTIFY_ON", value_name = "[NAME=]KINDS")]
    #[serde(default, with = "by_name")]
    pub notify_on: Vec<Named>,
    /// An endpoint's message format: slack (text and blocks), teams (an Adaptive Card) or webhook
    /// (JSON signed with HMAC-SHA256); repeatable, `[NAME=]FORMAT` [default: slack].
    #[arg(long, env = "FLEETGATE_NOTIFY_FORMAT", value_name = "[NAME=]FORMAT", value_delimiter = ',')]
    #[serde(default, with = "by_name")]
    pub notify_format: Vec<Named>,
    /// The file holding a webhook endpoint's HMAC secret (read at each delivery); repeatable,
    /// `[NAME=]FILE`.
    #[arg(long, env = "FLEETGATE_NOTIFY_SECRET_FILE", value_name = "[NAME=]FILE", value_delimiter = ',')]
    #[serde(default, with = "by_name")]
    pub notify_secret_file: Vec<Named>,
    /// A Prometheus server for the gates; repeatable, `NAME=URL` for the one a GatePolicy's
    /// `prometheus: NAME` names (a bare URL is `default`, what policies use by default).
    #[arg(long, env = "FLEETGATE_PROMETHEUS", value_name = "[NAME=]URL", value_delimiter = ',')]
    #[serde(default, with = "by_name")]
    pub prometheus: Vec<Named>,
    /// Prometheus sources with credentials, headers and a CA (config file only: credentials are
    /// never a flag); a source replaces a `prometheus` URL of the same name.
    #[arg(skip)]
    #[serde(default)]
    pub prometheus_sources: BTreeMap<String, PrometheusSourceSettings>,
    /// A kind (KIND.GROUP, e.g. Certificate.cert-manager.io, or a core KIND such as Secret) customResources gates may read besides
    /// the release's own CRDs; repeatable.
    #[arg(
        long = "allow-gate-kind",
        env = "FLEETGATE_ALLOW_GATE_KINDS",
        value_name = "KIND.GROUP",
        value_delimiter = ','
    )]
    #[serde(default)]
    pub allow_gate_kinds: Vec<String>,
    /// Where commit statuses are mirrored besides Git notes (the token: --forge-token-file, else
    /// $FLEETGATE_FORGE_TOKEN). Never taken from the fleet repo. The file: `forge: {kind, url,
    /// repository, tokenFile}`.
    #[command(flatten)]
    #[serde(default)]
    pub forge: ForgeSettings,
    /// Timeout of each notification POST (each message is tried up to 4 times, in the
    /// background) [default: 5s].
    #[arg(long, env = "FLEETGATE_NOTIFY_TIMEOUT", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub notify_timeout: Option<Duration>,
    /// Shared secret for POST /hooks/git (GitHub/Gitea HMAC signature or GitLab token).
    #[arg(long, env = "FLEETGATE_WEBHOOK_SECRET_FILE", value_name = "FILE")]
    pub webhook_secret_file: Option<PathBuf>,
    /// Serve POST /hooks/git beyond loopback without a webhook secret (only behind a
    /// NetworkPolicy that admits just the forge); without it such a --listen is refused.
    #[arg(long, env = "FLEETGATE_INSECURE_WEBHOOK", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub insecure_webhook: Option<bool>,
    /// Abort a fetch whose pack grows past this many bytes; a tag too large to fetch is skipped
    /// and reported [default: 268435456, 256 MiB].
    #[arg(long, env = "FLEETGATE_MAX_FETCH_BYTES", value_name = "BYTES")]
    pub max_fetch_bytes: Option<u64>,
    /// Refuse to sync a remote with more tags than this [default: 5000].
    #[arg(long, env = "FLEETGATE_MAX_TAGS", value_name = "N")]
    pub max_tags: Option<usize>,
    /// Leader election over a Lease, so only one agent per cluster works [default: true].
    #[arg(long, env = "FLEETGATE_LEADER_ELECT", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub leader_elect: Option<bool>,
    /// How long a leader's claim lasts without renewal [default: 15s].
    #[arg(long, env = "FLEETGATE_LEASE_DURATION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub lease_duration: Option<Duration>,
    /// The agent's baseline ReleaseAdmissionPolicy (YAML); the repo's policies can only narrow it
    /// [default: anything but bindings to cluster-admin].
    #[arg(long, env = "FLEETGATE_ADMISSION_POLICY", value_name = "FILE")]
    pub admission_policy: Option<PathBuf>,
    /// Who decides what this cluster runs: `signed` (every branch tip must be a commit signed by a
    /// promotion key, descending from the last accepted tip) or `unsigned` (pushes choose among
    /// signed releases; policies come from the release's own tag) [default: fleet.yaml's
    /// spec.promotions; this setting wins over it]. See docs/SECURITY.md.
    #[arg(long, env = "FLEETGATE_PROMOTIONS", value_name = "MODE")]
    pub promotions: Option<PromotionMode>,
    /// Public keys (files or directories) that may sign promotion commits: a release manager's,
    /// or the forge's merge key [default: the --trusted-keys].
    #[arg(long, env = "FLEETGATE_PROMOTION_KEYS", value_name = "FILE|DIR", value_delimiter = ',')]
    #[serde(default)]
    pub promotion_keys: Vec<PathBuf>,
    /// Public keys (files or directories: OpenPGP, or OpenSSH allowed_signers) of the approvers:
    /// who may approve a release for a wave with `approval: required` (`fleetgate approve`)
    /// [default: none; such waves wait].
    #[arg(long, env = "FLEETGATE_APPROVER_KEYS", value_name = "FILE|DIR", value_delimiter = ',')]
    #[serde(default)]
    pub approver_keys: Vec<PathBuf>,
    /// A forge login whose approving review of the promotion PR (at its head) approves a release
    /// for such a wave too; needs --forge-* [default: none; only signed approval tags count].
    #[arg(long = "approver", env = "FLEETGATE_APPROVERS", value_name = "LOGIN", value_delimiter = ',')]
    #[serde(default)]
    pub approvers: Vec<String>,
    /// Spoke plans: after each pass, judge the open promotion pull requests on the forge that move
    /// this cluster (pre-apply checks and a server-side dry run, nothing applied) and post
    /// `fleetgate/plan/<cluster>` on their heads; needs --forge-* [default: false]. docs/PLAN.md.
    #[arg(long, env = "FLEETGATE_PLAN_PULL_REQUESTS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub plan_pull_requests: Option<bool>,
    /// The fleet's name (fleet.yaml metadata.name) every release must name in spec.fleet
    /// [default: the name this agent's state pinned; required when there is none yet, unless
    /// --pin-first-fleet].
    #[arg(long, env = "FLEETGATE_FLEET", value_name = "NAME")]
    pub fleet: Option<String>,
    /// Without --fleet and with no name pinned yet, take the fleet name of the first release this
    /// agent accepts. Whoever pushes before that first sync then chooses the fleet, including
    /// another fleet's releases signed by the same key (docs/SECURITY.md).
    #[arg(long, env = "FLEETGATE_PIN_FIRST_FLEET", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub pin_first_fleet: Option<bool>,
    /// This cluster's status key: an unencrypted OpenSSH Ed25519 private key file [default: the
    /// Secret fleetgate-status-key-<cluster> in the state namespace, generated on first start].
    #[arg(long, env = "FLEETGATE_STATUS_KEY", value_name = "FILE")]
    pub status_key: Option<PathBuf>,
    /// A label of this spoke, KEY=VALUE (repeatable): what a release's variant selectors
    /// (matchLabels) match to choose the variant this cluster runs. Only the spoke's own
    /// configuration says this; labels in the fleet repo's clusters/ never choose a variant.
    #[arg(long = "label", env = "FLEETGATE_LABELS", value_name = "KEY=VALUE", value_delimiter = ',')]
    #[serde(default, with = "by_name")]
    pub labels: Vec<Label>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}")]
    ReadFile { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    ParseFile { path: PathBuf, message: String },
    #[error("no fleet repo given: pass --repo URL (or `repo:` in the config file)")]
    MissingRepo,
    #[error("no cluster name given: pass --cluster NAME, the name of clusters/<NAME>.yaml in the fleet repo")]
    MissingCluster,
    #[error(
        "cluster name {name:?} {why}; it names Kubernetes objects, so use lowercase letters, digits and '-' (at most 47 characters)"
    )]
    InvalidClusterName { name: String, why: &'static str },
    #[error(
        "no trusted keys given: pass --trusted-keys FILE (the release signers' public keys); releases cannot be verified without them"
    )]
    NoTrustedKeys,
    #[error("{what} {path}")]
    Unreadable { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("trusted keys directory {0} holds no key files")]
    EmptyKeyDir(PathBuf),
    #[error("--interval {given:?} is below the minimum of {min:?}; the webhook and file watcher are the fast paths")]
    IntervalTooShort { given: Duration, min: Duration },
    /// The URL itself is not shown: a webhook URL is a secret, and this message reaches logs.
    #[error("{flag} {name}=…: not an http(s) URL ({message})")]
    InvalidEndpointUrl { flag: &'static str, name: String, message: String },
    #[error("{flag} {name:?}=…: the name must be a DNS-1123 label (what the fleet repo refers to it by)")]
    InvalidEndpointName { flag: &'static str, name: String },
    #[error("{flag} {name}=…: {problem}")]
    InvalidNotifySetting { flag: &'static str, name: String, problem: String },
    #[error(
        "--allow-gate-kind {0:?} is not KIND.GROUP (e.g. Certificate.cert-manager.io) or a core KIND (e.g. Secret)"
    )]
    InvalidGateKind(String),
    #[error(transparent)]
    Forge(#[from] ForgeError),
    #[error("--lease-duration {0:?} is too short; use at least 3s")]
    LeaseTooShort(Duration),
    #[error("Kubernetes client configuration: {0}")]
    Kube(String),
    #[error(
        "--listen {0} accepts connections from beyond this host, and without a webhook secret anyone who reaches \
         the port can trigger syncs: set --webhook-secret-file FILE (the secret the forge signs its deliveries \
         with), listen on 127.0.0.1, or pass --insecure-webhook if a NetworkPolicy already admits only the forge"
    )]
    InsecureWebhook(SocketAddr),
    #[error("--max-fetch-bytes {0} is too small to fetch any fleet repo; use at least 1 MiB (1048576)")]
    FetchLimitTooSmall(u64),
    #[error("--max-tags 0 would consider no release at all; use at least 1")]
    NoTags,
    #[error(
        "--plan-pull-requests reads the pull requests on the agent's forge and posts its plans there: configure \
         the forge (--forge-kind, --forge-url, --forge-repository, and its token)"
    )]
    PlanWithoutForge,
    #[error("prometheusSources.{name}: {problem}")]
    InvalidPrometheusSource { name: String, problem: String },
    #[error(
        "--label {0:?} is not KEY=VALUE with a Kubernetes label key and value (e.g. region=eu, topology.example.com/zone=a)"
    )]
    InvalidLabel(String),
    /// Only a path that is not UTF-8 (from a flag or variable) can make the settings unmergeable.
    #[error("combining the flags with the config file: {0}")]
    Overlay(String),
}

/// The longest cluster name: `fleetgate-state-<cluster>` and `fleetgate-agent-<cluster>` must stay
/// valid label values too (63), which leaves 47 characters for the cluster part.
const MAX_CLUSTER_NAME: usize = 63 - "fleetgate-state-".len();

impl AgentSettings {
    /// Reads a YAML config file (unknown keys are errors, like every fleetgate document).
    pub fn from_file(path: &Path) -> Result<AgentSettings, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::ReadFile { path: path.to_path_buf(), source })?;
        crate::model::parse_yaml(&path.display().to_string(), &text)
            .map_err(|e| ConfigError::ParseFile { path: path.to_path_buf(), message: e.to_string() })
    }

    /// `higher` over `self`, setting by setting: what `higher` gives (a value, a non-empty list)
    /// replaces `self`'s; the maps (`forge`, and the settings kept by name: `notifyUrl`,
    /// `prometheus`, `labels`, …) merge key by key, `higher` winning. Done on the two as serde
    /// writes them, so it covers every field without naming one.
    pub fn overlay(self, higher: AgentSettings) -> Result<AgentSettings, ConfigError> {
        let tree =
            |settings: &AgentSettings| serde_json::to_value(settings).map_err(|e| ConfigError::Overlay(e.to_string()));
        let mut merged = tree(&self)?;
        overlay_tree(&mut merged, tree(&higher)?);
        serde_json::from_value(merged).map_err(|e| ConfigError::Overlay(e.to_string()))
    }

    /// Applies defaults and validates. Reads the file system to expand key directories and to check
    /// that every configured file is readable.
    pub fn resolve(self) -> Result<AgentConfig, ConfigError> {
        let repo = self.repo.filter(|r| !r.trim().is_empty()).ok_or(ConfigError::MissingRepo)?;
        let cluster = self.cluster.ok_or(ConfigError::MissingCluster)?;
        validate_cluster_name(&cluster)?;
        let trusted_keys = expand_key_files(&self.trusted_keys)?;
        let interval = self.interval.unwrap_or(DEFAULT_INTERVAL);
        if interval < MIN_INTERVAL {
            return Err(ConfigError::IntervalTooShort { given: interval, min: MIN_INTERVAL });
        }
        for (what, path) in [
            ("git SSH key", &self.git_ssh_key),
            ("git token file", &self.git_token_file),
            ("git known_hosts file", &self.git_known_hosts),
            ("git CA file", &self.git_ca_file),
            ("webhook secret file", &self.webhook_secret_file),
            ("forge token file", &self.forge.token_file),
        ] {
            if let Some(path) = path {
                check_readable(what, path)?;
            }
        }
        let notify = resolve_notify(
            by_name::map(self.notify_url),
            by_name::map(self.notify_on),
            by_name::map(self.notify_format),
            by_name::map(self.notify_secret_file),
        )?;
        let prometheus = PrometheusEndpoints::new(resolve_urls(by_name::map(self.prometheus), "--prometheus")?)
            .with_sources(resolve_prometheus_sources(self.prometheus_sources)?);
        let forge = self.forge.resolve()?;
        let plan_pull_requests = self.plan_pull_requests.unwrap_or(false);
        if plan_pull_requests && forge.is_none() {
            return Err(ConfigError::PlanWithoutForge);
        }
        if let Some(kind) = self.allow_gate_kinds.iter().find(|k| !is_kind_group(k)) {
            return Err(ConfigError::InvalidGateKind(kind.clone()));
        }
        let labels = by_name::map(self.labels);
        if let Some((k, v)) = labels.iter().find(|(k, v)| !is_label_key(k) || !is_label_value(v)) {
            return Err(ConfigError::InvalidLabel(format!("{k}={v}")));
        }
        let leader_election = if self.leader_elect.unwrap_or(true) {
            let lease_duration = self.lease_duration.unwrap_or(DEFAULT_LEASE_DURATION);
            if lease_duration < Duration::from_secs(3) {
                return Err(ConfigError::LeaseTooShort(lease_duration));
            }
            Some(LeaderElectionSettings { lease_duration })
        } else {
            None
        };
        let kube = if self.kubeconfig.is_some() || self.context.is_some() {
            KubeAccess::Kubeconfig { path: self.kubeconfig, context: self.context }
        } else {
            KubeAccess::Infer
        };
        let listen = self.listen.unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("default listen address parses"));
        let insecure_webhook = self.insecure_webhook.unwrap_or(false);
        if !listen.ip().is_loopback() && self.webhook_secret_file.is_none() && !insecure_webhook {
            return Err(ConfigError::InsecureWebhook(listen));
        }
        let fetch_limits = FetchLimits {
            max_pack_bytes: self.max_fetch_bytes.unwrap_or(FetchLimits::default().max_pack_bytes),
            max_tags: self.max_tags.unwrap_or(FetchLimits::default().max_tags),
        };
        if fetch_limits.max_pack_bytes < 1024 * 1024 {
            return Err(ConfigError::FetchLimitTooSmall(fetch_limits.max_pack_bytes));
        }
        if fetch_limits.max_tags == 0 {
            return Err(ConfigError::NoTags);
        }
        let state_dir = self.state_dir.unwrap_or_else(|| default_state_dir(&cluster));
        let admission_baseline = match &self.admission_policy {
            Some(path) => read_admission_policy(path)?,
            // The baseline deploy/ ships, as `release create` and `validate` assume by default:
            // an agent started without one judges as the spokes set up from deploy/ do.
            None => AdmissionBaseline::shipped().spec,
        };
        Ok(AgentConfig {
            repo: RepoLocation::parse(&repo),
            branch: self.branch.unwrap_or_else(|| DEFAULT_BRANCH.to_string()),
            kube,
            trusted_keys,
            state_namespace: self.state_namespace.unwrap_or_else(|| DEFAULT_STATE_NAMESPACE.to_string()),
            state_dir,
            interval,
            drift_interval: Some(self.drift_interval.unwrap_or(DEFAULT_DRIFT_INTERVAL)).filter(|d| !d.is_zero()),
            heartbeat_interval: Some(self.heartbeat_interval.unwrap_or(DEFAULT_HEARTBEAT_INTERVAL))
                .filter(|d| !d.is_zero()),
            listen,
            // On unless switched off: after a rollback Git should say what runs (docs/STATUS.md).
            write_back: self.write_back.unwrap_or(true),
            paused: self.paused,
            git_credentials: GitCredentials {
                ssh_key: self.git_ssh_key,
                token_file: self.git_token_file,
                known_hosts: self.git_known_hosts,
                ca_file: self.git_ca_file,
            },
            notify,
            notify_timeout: self.notify_timeout.unwrap_or(DEFAULT_NOTIFY_TIMEOUT),
            forge,
            prometheus,
            allowed_gate_kinds: self.allow_gate_kinds,
            webhook_secret_file: self.webhook_secret_file,
            insecure_webhook,
            fetch_limits,
            leader_election,
            identity: instance_identity(),
            admission_baseline,
            promotions: self.promotions,
            promotion_keys: optional_key_files(&self.promotion_keys)?,
            approver_keys: optional_key_files(&self.approver_keys)?,
            approvers: self.approvers,
            plan_pull_requests,
            fleet: self.fleet,
            pin_first_fleet: self.pin_first_fleet.unwrap_or(false),
            status_key: self.status_key,
            labels,
            cluster,
        })
    }
}

/// [`AgentSettings::overlay`] on serde's view: an object merges key by key; any other value of
/// `higher` replaces `lower` unless it says nothing (`null`: an unset option; `[]`: no list given).
fn overlay_tree(lower: &mut serde_json::Value, higher: serde_json::Value) {
    use serde_json::Value;
    match (lower, higher) {
        (Value::Object(lower), Value::Object(higher)) => {
            for (key, value) in higher {
                overlay_tree(lower.entry(key).or_insert(Value::Null), value);
            }
        }
        (_, Value::Null) => {}
        (_, Value::Array(items)) if items.is_empty() => {}
        (lower, higher) => *lower = higher,
    }
}

/// A DNS-1123 label short enough to be embedded in the agent's object names.
pub fn validate_cluster_name(name: &str) -> Result<(), ConfigError> {
    let bad = |why| Err(ConfigError::InvalidClusterName { name: name.to_string(), why });
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > MAX_CLUSTER_NAME {
        return bad("is too long");
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return bad("has characters other than a-z, 0-9 and '-'");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return bad("starts or ends with '-'");
    }
    Ok(())
}

fn check_readable(what: &'static str, path: &Path) -> Result<(), ConfigError> {
    std::fs::File::open(path).map(drop).map_err(|source| ConfigError::Unreadable {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// [`expand_key_files`] for a keyring the agent may go without (promotion, approvers' keys).
fn optional_key_files(given: &[PathBuf]) -> Result<Vec<PathBuf>, ConfigError> {
    if given.is_empty() { Ok(Vec::new()) } else { expand_key_files(given) }
}

/// Files stay as given; a directory (a mounted Secret) becomes its non-hidden regular files in name
/// order. Hidden entries are skipped because Secret volumes keep `..data` and timestamped
/// directories next to the key files.
fn expand_key_files(given: &[PathBuf]) -> Result<Vec<PathBuf>, ConfigError> {
    if given.is_empty() {
        return Err(ConfigError::NoTrustedKeys);
    }
    let mut out = Vec::new();
    for path in given {
        let meta = std::fs::metadata(path).map_err(|source| unreadable_key(path, source))?;
        if !meta.is_dir() {
            check_readable("trusted key", path)?;
            out.push(path.clone());
            continue;
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|source| unreadable_key(path, source))?
            .filter_map(Result::ok)
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        if files.is_empty() {
            return Err(ConfigError::EmptyKeyDir(path.clone()));
        }
        files.sort();
        out.extend(files);
    }
    Ok(out)
}

fn unreadable_key(path: &Path, source: std::io::Error) -> ConfigError {
    ConfigError::Unreadable { what: "trusted key", path: path.to_path_buf(), source }
}

/// One entry of `prometheusSources` in the agent's config file:
///
/// ```yaml
/// prometheusSources:
///   prod-mimir:
///     url: https://mimir.monitoring:8080/prometheus
///     bearerTokenFile: /etc/fleetgate/mimir/token      # or basicAuth: {username, passwordFile}
///     headers: { X-Scope-OrgID: team-redis }
///     caFile: /etc/fleetgate/mimir/ca.crt
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusSourceSettings {
    pub url: String,
    pub bearer_token_file: Option<PathBuf>,
    pub basic_auth: Option<BasicAuthSettings>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BasicAuthSettings {
    pub username: String,
    pub password_file: PathBuf,
}

/// Checks names, URLs and that every credential and CA file is readable now (a missing Secret
/// mount stops the start, not the first bake).
fn resolve_prometheus_sources(
    sources: BTreeMap<String, PrometheusSourceSettings>,
) -> Result<Vec<PrometheusSource>, ConfigError> {
    sources
        .into_iter()
        .map(|(name, s)| {
            let invalid = |problem: String| ConfigError::InvalidPrometheusSource { name: name.clone(), problem };
            if !is_dns_label(&name) {
                return Err(invalid("the name must be a DNS-1123 label (what a GatePolicy refers to it by)".into()));
            }
            // The URL itself is not shown: it may carry credentials.
            let url = reqwest::Url::parse(&s.url).map_err(|e| invalid(format!("url is not a URL ({e})")))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(invalid(format!("url: not an http(s) URL (scheme {:?})", url.scheme())));
            }
            let auth = match (s.bearer_token_file, s.basic_auth) {
                (Some(_), Some(_)) => return Err(invalid("give bearerTokenFile or basicAuth, not both".into())),
                (Some(token_file), None) => PrometheusAuth::Bearer { token_file },
                (None, Some(b)) => PrometheusAuth::Basic { username: b.username, password_file: b.password_file },
                (None, None) => PrometheusAuth::None,
            };
            let files = match &auth {
                PrometheusAuth::Bearer { token_file } => vec![("Prometheus bearer token file", token_file)],
                PrometheusAuth::Basic { password_file, .. } => vec![("Prometheus password file", password_file)],
                PrometheusAuth::None => vec![],
            };
            for (what, path) in files.into_iter().chain(s.ca_file.iter().map(|p| ("Prometheus CA file", p))) {
                check_readable(what, path)?;
            }
            Ok(PrometheusSource { name: name.clone(), url, auth, headers: s.headers, ca_file: s.ca_file })
        })
        .collect()
}

/// The notification endpoints: each `--notify-url` with its `--notify-on` kinds (default
/// [`DEFAULT_KINDS`](super::notifier::DEFAULT_KINDS)), `--notify-format` (default `slack`) and
/// `--notify-secret-file`, which a `webhook` endpoint must have (readable now; it is read again at
/// each delivery). A setting for a name without a URL is an error: it would be silently unused.
fn resolve_notify(
    urls: BTreeMap<String, String>,
    on: BTreeMap<String, String>,
    formats: BTreeMap<String, String>,
    secrets: BTreeMap<String, String>,
) -> Result<BTreeMap<String, Endpoint>, ConfigError> {
    let mut endpoints: BTreeMap<String, Endpoint> =
        resolve_urls(urls, "--notify-url")?.into_iter().map(|(name, url)| (name, Endpoint::new(url))).collect();
    let invalid =
        |flag, name: &str, problem: String| ConfigError::InvalidNotifySetting { flag, name: name.to_string(), problem };
    for (flag, settings) in [("--notify-on", &on), ("--notify-format", &formats), ("--notify-secret-file", &secrets)] {
        if let Some(name) = settings.keys().find(|name| !endpoints.contains_key(*name)) {
            return Err(invalid(flag, name, format!("there is no --notify-url {name}=URL")));
        }
    }
    for (name, endpoint) in &mut endpoints {
        if let Some(kinds) = on.get(name) {
            endpoint.on = NotificationKind::parse_list(kinds).map_err(|p| invalid("--notify-on", name, p))?;
        }
        if let Some(format) = formats.get(name) {
            endpoint.format = format.parse().map_err(|p| invalid("--notify-format", name, p))?;
        }
        if let Some(file) = secrets.get(name) {
            let path = PathBuf::from(file);
            check_readable("notification secret file", &path)?;
            endpoint.secret_file = Some(path);
        }
        if endpoint.format == Format::Webhook && endpoint.secret_file.is_none() {
            return Err(invalid(
                "--notify-format",
                name,
                format!("a webhook endpoint signs its messages: pass --notify-secret-file {name}=FILE"),
            ));
        }
    }
    Ok(endpoints)
}

/// One `[NAME=]VALUE` of a setting kept by the logical name of the endpoint it is for: URLs the
/// fleet repo refers to by name (`--prometheus`, `--notify-url`), and what else an endpoint has
/// (`--notify-on`, `--notify-format`, `--notify-secret-file`). `NAME=` when the part before the
/// first `=` is a DNS-1123 label, else all of it is the value of [`DEFAULT_ENDPOINT`] (a URL's
/// own `=` comes after its `://`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub value: String,
}

impl Named {
    /// Each item as a flag gives it.
    pub fn list<S: AsRef<str>>(items: &[S]) -> Vec<Named> {
        items.iter().map(|item| Named::from(item.as_ref())).collect()
    }
}

impl From<&str> for Named {
    fn from(item: &str) -> Named {
        match item.split_once('=') {
            Some((name, value)) if is_dns_label(name) => Named { name: name.into(), value: value.into() },
            _ => Named { name: DEFAULT_ENDPOINT.into(), value: item.into() },
        }
    }
}

/// One `KEY=VALUE` label of this spoke (`--label`; checked in [`AgentSettings::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    pub key: String,
    pub value: String,
}

impl std::str::FromStr for Label {
    type Err = ConfigError;
    fn from_str(item: &str) -> Result<Label, ConfigError> {
        match item.split_once('=') {
            Some((key, value)) => Ok(Label { key: key.trim().into(), value: value.trim().into() }),
            None => Err(ConfigError::InvalidLabel(item.to_string())),
        }
    }
}

/// The serde form of a list of [`Named`] or [`Label`]s: a map `NAME: VALUE` (what
/// [`AgentSettings::overlay`] merges key by key); read also from one `[NAME=]VALUE` or a list
/// of them, as the flags give them. A later item of a name wins.
mod by_name {
    use super::{Label, Named};
    use serde::{Deserialize, Deserializer, Serializer};
    use std::collections::BTreeMap;

    /// A name (or label key) and its value.
    pub trait Pair: Sized {
        fn pair(&self) -> (&str, &str);
        fn new(name: String, value: String) -> Self;
        fn parse(item: &str) -> Result<Self, String>;
    }

    impl Pair for Named {
        fn pair(&self) -> (&str, &str) {
            (&self.name, &self.value)
        }
        fn new(name: String, value: String) -> Self {
            Named { name, value }
        }
        fn parse(item: &str) -> Result<Self, String> {
            Ok(Named::from(item))
        }
    }

    impl Pair for Label {
        fn pair(&self) -> (&str, &str) {
            (&self.key, &self.value)
        }
        fn new(key: String, value: String) -> Self {
            Label { key, value }
        }
        fn parse(item: &str) -> Result<Self, String> {
            item.parse().map_err(|e: super::ConfigError| e.to_string())
        }
    }

    /// The map the items say, a later item of a name winning.
    pub fn map<P: Pair>(items: Vec<P>) -> BTreeMap<String, String> {
        items.iter().map(Pair::pair).map(|(name, value)| (name.to_string(), value.to_string())).collect()
    }

    pub fn serialize<S: Serializer, P: Pair>(items: &[P], s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(items.iter().map(Pair::pair).collect::<BTreeMap<_, _>>())
    }

    pub fn deserialize<'de, D: Deserializer<'de>, P: Pair>(d: D) -> Result<Vec<P>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged, expecting = "a value, a list of [NAME=]VALUE, or a map of NAME: VALUE")]
        enum Form {
            One(String),
            List(Vec<String>),
            Map(BTreeMap<String, String>),
        }
        let parse = |item: String| P::parse(&item).map_err(serde::de::Error::custom);
        match Form::deserialize(d)? {
            Form::One(item) => Ok(vec![parse(item)?]),
            Form::List(items) => items.into_iter().map(parse).collect(),
            Form::Map(map) => Ok(map.into_iter().map(|(name, value)| P::new(name, value)).collect()),
        }
    }
}

/// Each name a DNS-1123 label and each URL http(s); `flag` names the setting in errors.
fn resolve_urls(
    urls: BTreeMap<String, String>,
    flag: &'static str,
) -> Result<BTreeMap<String, reqwest::Url>, ConfigError> {
    urls.into_iter()
        .map(|(name, url)| {
            if !is_dns_label(&name) {
                return Err(ConfigError::InvalidEndpointName { flag, name });
            }
            let invalid = |message: String| ConfigError::InvalidEndpointUrl { flag, name: name.clone(), message };
            let parsed = reqwest::Url::parse(&url).map_err(|e| invalid(e.to_string()))?;
            match parsed.scheme() {
                "http" | "https" => Ok((name, parsed)),
                other => Err(invalid(format!("scheme {other:?}"))),
            }
        })
        .collect()
}

/// `KIND.GROUP` as Kubernetes writes a kind of an API group (`Certificate.cert-manager.io`,
/// `Deployment.apps`): a kind of letters and digits, then the group's DNS labels; or a bare
/// `KIND` of the core group (`Secret`).
fn is_kind_group(s: &str) -> bool {
    match s.split_once('.') {
        Some((kind, group)) => {
            !kind.is_empty() && kind.chars().all(|c| c.is_ascii_alphanumeric()) && group.split('.').all(is_dns_label)
        }
        // A kind of the core group (`Secret`, `ConfigMap`).
        None => s.starts_with(|c: char| c.is_ascii_uppercase()) && s.chars().all(|c| c.is_ascii_alphanumeric()),
    }
}

/// `$XDG_CACHE_HOME/fleetgate/agent/<cluster>`, else `~/.cache/…`, else the temp dir. The
/// Deployment passes `--state-dir` explicitly (an emptyDir).
fn default_state_dir(cluster: &str) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("fleetgate").join("agent").join(cluster)
}

/// `<POD_NAME or HOSTNAME or kernel host name>_<8 random hex digits>`. The random part keeps two
/// agents on one host (or a restarted Pod that kept its name) from both believing they hold the
/// Lease.
fn instance_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|s| s.trim().to_string()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "fleetgate-agent".to_string());
    format!("{host}_{:08x}", rand::random::<u32>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn minimal(dir: &Path) -> AgentSettings {
        let key = dir.join("key.asc");
        std::fs::write(&key, "key").unwrap();
        AgentSettings {
            repo: Some("https://git.example.com/fleet.git".into()),
            cluster: Some("canary".into()),
            trusted_keys: vec![key],
            ..Default::default()
        }
    }

    #[test]
    fn defaults_apply() {
        let dir = tempfile::tempdir().unwrap();
        let c = minimal(dir.path()).resolve().unwrap();
        assert_eq!(c.branch, "main");
        assert_eq!(c.state_namespace, "fleetgate-system");
        assert_eq!(c.interval, Duration::from_secs(10));
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert!(c.write_back, "write-back is on by default");
        assert_eq!(c.kube, KubeAccess::Infer);
        assert_eq!(c.leader_election, Some(LeaderElectionSettings { lease_duration: DEFAULT_LEASE_DURATION }));
        assert_eq!(c.state_configmap_name(), "fleetgate-state-canary");
        assert_eq!(c.lease_name(), "fleetgate-agent-canary");
        assert!(c.identity.contains('_'), "{}", c.identity);
    }

    #[test]
    fn prometheus_sources_come_with_their_credentials_from_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t0k\n").unwrap();
        let file = dir.path().join("agent.yaml");
        let yaml = |source: &str| {
            std::fs::write(&file, format!("prometheusSources:\n  prod-mimir:\n{source}")).unwrap();
            AgentSettings::from_file(&file).unwrap().overlay(minimal(dir.path())).unwrap().resolve()
        };
        let c = yaml(&format!(
            "    url: https://mimir:8080/prometheus\n    bearerTokenFile: {}\n    headers: {{X-Scope-OrgID: team-a}}\n",
            token.display()
        ))
        .unwrap();
        let policy: crate::model::GatePolicySpec = serde_saphyr::from_str(
            "bakeTime: 1m\nprometheus: prod-mimir\ngates: [{name: e, prometheus: {query: x, max: 1}}]\n",
        )
        .unwrap();
        let source = c.prometheus.for_policy(&policy).unwrap().unwrap();
        assert_eq!(source.auth, PrometheusAuth::Bearer { token_file: token.clone() });
        assert_eq!(source.headers["X-Scope-OrgID"], "team-a");
        let err = |source: String| yaml(&source).unwrap_err().to_string();
        let both = format!(
            "    url: https://m\n    bearerTokenFile: {t}\n    basicAuth: {{username: u, passwordFile: {t}}}\n",
            t = token.display()
        );
        assert_eq!(err(both), "prometheusSources.prod-mimir: give bearerTokenFile or basicAuth, not both");
        let missing = err("    url: https://m\n    bearerTokenFile: /nonexistent/token\n".into());
        assert!(missing.starts_with("Prometheus bearer token file /nonexistent/token"), "{missing}");
        assert!(
            err("    url: https://user:pw@m/x\n    caFile: /nonexistent/ca\n".into()).starts_with("Prometheus CA file")
        );
        let scheme = err("    url: ftp://user:s3cret@m/\n".into());
        assert!(scheme.contains("not an http(s) URL") && !scheme.contains("s3cret"), "{scheme}");
    }

    #[test]
    fn approvers_keys_are_optional_and_a_directory_is_its_files() {
        let dir = tempfile::tempdir().unwrap();
        assert!(minimal(dir.path()).resolve().unwrap().approver_keys.is_empty(), "no approvers unless given");
        let approvers = dir.path().join("approvers");
        std::fs::create_dir(&approvers).unwrap();
        std::fs::write(approvers.join("ana.asc"), "key").unwrap();
        let file = dir.path().join("agent.yaml");
        std::fs::write(&file, format!("approverKeys: [{}]\n", approvers.display())).unwrap();
        let c = AgentSettings::from_file(&file).unwrap().overlay(minimal(dir.path())).unwrap().resolve().unwrap();
        assert_eq!(c.approver_keys, [approvers.join("ana.asc")]);
    }

    #[test]
    fn flags_override_file_field_by_field() {
        let dir = tempfile::tempdir().unwrap();
        let file_path = dir.path().join("agent.yaml");
        std::fs::write(
            &file_path,
            "repo: https://a/fleet.git\nbranch: release\ninterval: 30s\nwriteBack: true\nleaderElect: false\n",
        )
        .unwrap();
        let file = AgentSettings::from_file(&file_path).unwrap();
        let flags = AgentSettings { interval: Some(Duration::from_secs(5)), ..minimal(dir.path()) };
        let c = file.overlay(flags).unwrap().resolve().unwrap();
        assert_eq!(c.repo, RepoLocation::Remote("https://git.example.com/fleet.git".into()));
        assert_eq!(c.branch, "release");
        assert_eq!(c.interval, Duration::from_secs(5));
        assert!(c.write_back);
        assert_eq!(c.leader_election, None);
    }

    /// The flags as clap reads them (this struct is also `fleetgate agent`'s flags), over a file.
    #[test]
    fn parsed_flags_override_the_file_and_maps_merge_key_by_key() {
        #[derive(clap::Parser)]
        struct Flags {
            #[command(flatten)]
            settings: AgentSettings,
        }
        let dir = tempfile::tempdir().unwrap();
        let file_path = dir.path().join("agent.yaml");
        std::fs::write(
            &file_path,
            "branch: release\nwriteBack: true\npaused: from-file\nlabels: {region: eu, tier: prod}\n\
             forge: {kind: gitea, url: 'https://gitea.example.com', repository: platform/fleet}\n\
             trustedKeys: [/file/key.asc]\nnotifyUrl: {chat: 'https://chat.example/x'}\n",
        )
        .unwrap();
        let flags = <Flags as clap::Parser>::try_parse_from([
            "agent",
            "--write-back=false",
            "--paused",
            "--label",
            "tier=canary",
            "--forge-repository",
            "platform/other",
            "--notify-url",
            "oncall=https://hooks.example/y",
            "--trusted-keys",
            "/flag/key.asc",
        ])
        .unwrap()
        .settings;
        let merged = AgentSettings::from_file(&file_path).unwrap().overlay(flags).unwrap();
        assert_eq!(merged.branch.as_deref(), Some("release"), "the file where no flag says");
        assert_eq!((merged.write_back, merged.paused.as_deref()), (Some(false), Some("")), "the flags' false and \"\"");
        assert_eq!(merged.trusted_keys, [PathBuf::from("/flag/key.asc")], "a list given replaces the file's");
        assert_eq!(
            by_name::map(merged.labels),
            BTreeMap::from([("region".into(), "eu".into()), ("tier".into(), "canary".into())])
        );
        assert_eq!(by_name::map(merged.notify_url).keys().collect::<Vec<_>>(), ["chat", "oncall"]);
        let forge = (merged.forge.kind, merged.forge.url.as_deref(), merged.forge.repository.as_deref());
        assert_eq!(
            forge,
            (Some(crate::model::ForgeKind::Gitea), Some("https://gitea.example.com"), Some("platform/other"))
        );
        let bad = <Flags as clap::Parser>::try_parse_from(["agent", "--label", "region"]).err().unwrap().to_string();
        assert!(bad.contains("--label") && bad.contains("is not KEY=VALUE"), "{bad}");
    }

    #[test]
    fn a_path_that_is_not_utf8_is_an_error_not_a_panic() {
        use std::os::unix::ffi::OsStrExt;
        let flags =
            AgentSettings { state_dir: Some(std::ffi::OsStr::from_bytes(b"/tmp/\xff").into()), ..Default::default() };
        let err = AgentSettings::default().overlay(flags).unwrap_err().to_string();
        assert!(err.starts_with("combining the flags with the config file"), "{err}");
    }

    #[test]
    fn destinations_and_credentials_come_from_flags_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("forge-token");
        std::fs::write(&token, "t0k\n").unwrap();
        let file_path = dir.path().join("agent.yaml");
        std::fs::write(
            &file_path,
            format!(
                "forge: {{kind: gitea, url: 'https://gitea.example.com', repository: platform/fleet, tokenFile: {}}}\n\
                 prometheus: {{default: 'http://prom:9090', thanos: 'http://thanos:9090'}}\n\
                 notifyUrl: 'https://hooks.slack.com/services/T/B/X'\n\
                 allowGateKinds: [Certificate.cert-manager.io]\n\
                 labels: {{region: eu, tier: prod}}\n",
                token.display()
            ),
        )
        .unwrap();
        let file = AgentSettings::from_file(&file_path).unwrap();
        let flags = AgentSettings {
            prometheus: Named::list(&["http://prom-2:9090"]),
            notify_url: Named::list(&["oncall=https://hooks.example.com/x?a=b"]),
            labels: vec!["tier=canary".parse().unwrap()],
            ..minimal(dir.path())
        };
        let c = file.overlay(flags).unwrap().resolve().unwrap();
        let forge = c.forge.unwrap();
        assert_eq!((forge.kind, forge.repository.as_str()), (crate::model::ForgeKind::Gitea, "platform/fleet"));
        assert_eq!(forge.token, crate::status::TokenSource::File(token));
        let host = |u: &reqwest::Url| u.host_str().unwrap().to_string();
        assert_eq!(c.prometheus.names().collect::<Vec<_>>(), ["default", "thanos"]);
        let policy: crate::model::GatePolicySpec =
            serde_saphyr::from_str("bakeTime: 1m\ngates: [{name: e, prometheus: {query: x, max: 1}}]\n").unwrap();
        assert_eq!(
            c.prometheus.for_policy(&policy).unwrap().map(|s| host(&s.url)).as_deref(),
            Some("prom-2"),
            "the flag wins"
        );
        let notify: Vec<(&str, String)> = c.notify.iter().map(|(n, e)| (n.as_str(), host(&e.url))).collect();
        assert_eq!(notify, [("default", "hooks.slack.com".into()), ("oncall", "hooks.example.com".into())]);
        assert_eq!(c.allowed_gate_kinds, ["Certificate.cert-manager.io"]);
        // Labels merge key by key, the flag winning.
        let labels: Vec<(&str, &str)> = c.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(labels, [("region", "eu"), ("tier", "canary")]);
        assert!("region".parse::<Label>().is_err());
    }

    #[test]
    fn each_notification_endpoint_has_its_format_kinds_and_secret() {
        use crate::agent::notifier::NotificationKind::*;
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("hmac");
        std::fs::write(&secret, "s3cret\n").unwrap();
        let file = dir.path().join("agent.yaml");
        std::fs::write(
            &file,
            format!(
                "notifyUrl: {{chat: 'https://hooks.slack.com/x', teams: 'https://teams.example/x', audit: 'https://audit.example/x'}}\n\
                 notifyFormat: {{teams: teams, audit: webhook}}\n\
                 notifySecretFile: {{audit: {}}}\n\
                 notifyOn: {{audit: all}}\n",
                secret.display()
            ),
        )
        .unwrap();
        let flags = AgentSettings { notify_on: Named::list(&["chat=failed,rolledBack"]), ..minimal(dir.path()) };
        let c = AgentSettings::from_file(&file).unwrap().overlay(flags).unwrap().resolve().unwrap();
        let chat = &c.notify["chat"];
        let kinds: Vec<_> = chat.on.iter().copied().collect();
        assert_eq!((chat.format, kinds), (Format::Slack, vec![Failed, RolledBack]));
        let teams = &c.notify["teams"];
        let defaults = (teams.format, teams.on.len(), teams.secret_file.as_ref());
        assert_eq!(defaults, (Format::Teams, 5, None), "the default kinds");
        assert!(!teams.on.contains(&Started) && teams.on.contains(&Paused));
        let audit = &c.notify["audit"];
        assert_eq!((audit.format, audit.on.len(), audit.secret_file.as_ref()), (Format::Webhook, 8, Some(&secret)));
    }

    #[test]
    fn without_destinations_there_are_none() {
        let dir = tempfile::tempdir().unwrap();
        let c = minimal(dir.path()).resolve().unwrap();
        assert_eq!((c.forge, c.notify.len(), c.prometheus.names().count()), (None, 0, 0));
        assert!(c.allowed_gate_kinds.is_empty());
    }

    #[test]
    fn unknown_file_keys_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("agent.yaml");
        std::fs::write(&p, "repo: x\nintreval: 5s\n").unwrap();
        let err = AgentSettings::from_file(&p).unwrap_err().to_string();
        assert!(err.contains("intreval"), "{err}");
    }

    #[test]
    fn key_directory_expands_skipping_hidden_entries() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        std::fs::create_dir_all(keys.join("..data")).unwrap();
        std::fs::write(keys.join("b.asc"), "b").unwrap();
        std::fs::write(keys.join("a.asc"), "a").unwrap();
        std::fs::write(keys.join(".hidden"), "h").unwrap();
        let s = AgentSettings { trusted_keys: vec![keys.clone()], ..minimal(dir.path()) };
        assert_eq!(s.resolve().unwrap().trusted_keys, vec![keys.join("a.asc"), keys.join("b.asc")]);
    }

    #[rstest]
    #[case::no_repo(|s: &mut AgentSettings| s.repo = None, "--repo")]
    #[case::no_cluster(|s: &mut AgentSettings| s.cluster = None, "--cluster")]
    #[case::bad_cluster(|s: &mut AgentSettings| s.cluster = Some("Canary_1".into()), "characters other than")]
    #[case::dash_cluster(|s: &mut AgentSettings| s.cluster = Some("-a".into()), "starts or ends")]
    #[case::long_cluster(|s: &mut AgentSettings| s.cluster = Some("a".repeat(48)), "too long")]
    #[case::no_keys(|s: &mut AgentSettings| s.trusted_keys.clear(), "--trusted-keys")]
    #[case::missing_key(|s: &mut AgentSettings| s.trusted_keys = vec!["/nonexistent/k.asc".into()], "/nonexistent/k.asc")]
    #[case::fast_poll(|s: &mut AgentSettings| s.interval = Some(Duration::from_millis(200)), "minimum")]
    #[case::notify_scheme(|s: &mut AgentSettings| s.notify_url = Named::list(&["ftp://x/secret-path"]), "--notify-url default=…: not an http(s) URL (scheme \"ftp\")")]
    #[case::notify_on_unknown_endpoint(|s: &mut AgentSettings| s.notify_on = Named::list(&["oncall=failed"]), "--notify-on oncall=…: there is no --notify-url oncall=URL")]
    #[case::notify_on_kind(|s: &mut AgentSettings| { s.notify_url = Named::list(&["http://h/x"]); s.notify_on = Named::list(&["failed,rollback"]) }, "--notify-on default=…: \"rollback\" is not one of all, started")]
    #[case::notify_format(|s: &mut AgentSettings| { s.notify_url = Named::list(&["http://h/x"]); s.notify_format = Named::list(&["discord"]) }, "\"discord\" is not one of slack, teams, webhook")]
    #[case::webhook_without_secret(|s: &mut AgentSettings| { s.notify_url = Named::list(&["http://h/x"]); s.notify_format = Named::list(&["webhook"]) }, "pass --notify-secret-file default=FILE")]
    #[case::missing_secret(|s: &mut AgentSettings| { s.notify_url = Named::list(&["http://h/x"]); s.notify_secret_file = Named::list(&["/nonexistent/secret"]) }, "notification secret file /nonexistent/secret")]
    #[case::prometheus_url(|s: &mut AgentSettings| s.prometheus = Named::list(&["thanos=not a url"]), "--prometheus thanos=…: not an http(s) URL")]
    #[case::endpoint_name(|s: &mut AgentSettings| s.prometheus = vec![Named { name: "Thanos".into(), value: "http://t".into() }], "must be a DNS-1123 label")]
    #[case::half_a_forge(|s: &mut AgentSettings| s.forge.url = Some("https://api.github.com".into()), "--forge-kind is missing")]
    #[case::missing_forge_token(|s: &mut AgentSettings| s.forge.token_file = Some("/nonexistent/forge-token".into()), "forge token file")]
    #[case::gate_kind(|s: &mut AgentSettings| s.allow_gate_kinds = vec!["secrets".into()], "--allow-gate-kind \"secrets\"")]
    #[case::missing_token(|s: &mut AgentSettings| s.git_token_file = Some("/nonexistent/token".into()), "git token file")]
    #[case::short_lease(|s: &mut AgentSettings| s.lease_duration = Some(Duration::from_secs(1)), "lease-duration")]
    #[case::open_webhook(|s: &mut AgentSettings| s.listen = Some("0.0.0.0:8080".parse().unwrap()), "--webhook-secret-file FILE")]
    #[case::open_webhook_v6(|s: &mut AgentSettings| s.listen = Some("[::]:8080".parse().unwrap()), "--insecure-webhook")]
    #[case::tiny_fetch(|s: &mut AgentSettings| s.max_fetch_bytes = Some(1000), "--max-fetch-bytes 1000")]
    #[case::no_tags(|s: &mut AgentSettings| s.max_tags = Some(0), "--max-tags 0")]
    #[case::label_key(|s: &mut AgentSettings| s.labels = vec!["re gion=eu".parse().unwrap()], "--label \"re gion=eu\"")]
    #[case::label_value(|s: &mut AgentSettings| s.labels = vec!["region=eu west".parse().unwrap()], "is not KEY=VALUE")]
    #[case::plan_without_forge(|s: &mut AgentSettings| s.plan_pull_requests = Some(true), "--plan-pull-requests reads the pull requests on the agent's forge")]
    fn invalid_settings_say_what_to_fix(#[case] edit: fn(&mut AgentSettings), #[case] expected: &str) {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = minimal(dir.path());
        edit(&mut settings);
        let err = settings.resolve().unwrap_err().to_string();
        assert!(err.contains(expected), "{err}");
    }

    /// Beyond loopback the webhook needs a secret, or an explicit `--insecure-webhook`.
    #[test]
    fn a_webhook_beyond_loopback_needs_a_secret_or_an_explicit_opt_out() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s3cret").unwrap();
        let open = AgentSettings { listen: Some("0.0.0.0:8080".parse().unwrap()), ..minimal(dir.path()) };
        let with_secret = AgentSettings { webhook_secret_file: Some(secret), ..open.clone() };
        assert!(with_secret.resolve().is_ok());
        let opted_out = AgentSettings { insecure_webhook: Some(true), ..open.clone() };
        assert!(opted_out.resolve().unwrap().insecure_webhook);
        let file = dir.path().join("agent.yaml");
        std::fs::write(&file, "insecureWebhook: true\nmaxFetchBytes: 8388608\nmaxTags: 50\n").unwrap();
        let c = AgentSettings::from_file(&file).unwrap().overlay(open).unwrap().resolve().unwrap();
        assert_eq!(c.fetch_limits, FetchLimits { max_pack_bytes: 8 << 20, max_tags: 50 });
    }

    #[rstest]
    #[case("file:///srv/fleet.git", Some("/srv/fleet.git"))]
    #[case("/srv/fleet.git", Some("/srv/fleet.git"))]
    #[case("./fleet", Some("./fleet"))]
    #[case("https://github.com/acme/fleet.git", None)]
    #[case("git@github.com:acme/fleet.git", None)]
    #[case("git://127.0.0.1:9418/fleet.git", None)]
    fn repo_location(#[case] repo: &str, #[case] local: Option<&str>) {
        assert_eq!(RepoLocation::parse(repo).local_path(), local.map(Path::new));
    }
}
