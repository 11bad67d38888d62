//! The agent's configuration: [`AgentSettings`] (every field optional, what flags, environment
//! variables and the optional YAML config file each provide) resolved into one typed, validated
//! [`AgentConfig`].
//!
//! Precedence, field by field: command-line flag or its `FLEETGATE_*` environment variable (clap
//! merges those two) > config file (`--config FILE`) > built-in default. Validation happens once,
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
use serde::Deserialize;
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

/// What one source (flags+env, or the config file) says; every field optional. The config file
/// uses the same names in camelCase, e.g. `stateNamespace: fleetgate-system`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AgentSettings {
    pub repo: Option<String>,
    pub branch: Option<String>,
    pub cluster: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    #[serde(default)]
    pub trusted_keys: Vec<PathBuf>,
    pub state_namespace: Option<String>,
    pub state_dir: Option<PathBuf>,
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// `0s` turns drift correction off.
    #[serde(default, with = "humantime_serde")]
    pub drift_interval: Option<Duration>,
    /// `0s` turns heartbeats off.
    #[serde(default, with = "humantime_serde")]
    pub heartbeat_interval: Option<Duration>,
    pub listen: Option<SocketAddr>,
    pub write_back: Option<bool>,
    /// Hold the cluster on its current release; the value is the reason (may be empty).
    pub paused: Option<String>,
    pub git_ssh_key: Option<PathBuf>,
    pub git_token_file: Option<PathBuf>,
    pub git_known_hosts: Option<PathBuf>,
    pub git_ca_file: Option<PathBuf>,
    #[serde(default)]
    pub notify_url: NamedUrls,
    /// `NAME=KIND,KIND…` (or `all`): which transitions an endpoint hears.
    #[serde(default)]
    pub notify_on: NamedUrls,
    /// `NAME=slack|teams|webhook`.
    #[serde(default)]
    pub notify_format: NamedUrls,
    /// `NAME=FILE`: the HMAC secret of a `webhook` endpoint.
    #[serde(default)]
    pub notify_secret_file: NamedUrls,
    #[serde(default, with = "humantime_serde")]
    pub notify_timeout: Option<Duration>,
    pub webhook_secret_file: Option<PathBuf>,
    pub insecure_webhook: Option<bool>,
    pub max_fetch_bytes: Option<u64>,
    pub max_tags: Option<usize>,
    /// `forge: {kind, url, repository, tokenFile}`.
    #[serde(default)]
    pub forge: ForgeSettings,
    #[serde(default)]
    pub prometheus: NamedUrls,
    /// Prometheus sources with credentials, headers and a CA (config file only); a source
    /// replaces a `prometheus` URL of the same name.
    #[serde(default)]
    pub prometheus_sources: BTreeMap<String, PrometheusSourceSettings>,
    #[serde(default)]
    pub allow_gate_kinds: Vec<String>,
    pub leader_elect: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    pub lease_duration: Option<Duration>,
    pub admission_policy: Option<PathBuf>,
    pub promotions: Option<PromotionMode>,
    #[serde(default)]
    pub promotion_keys: Vec<PathBuf>,
    #[serde(default)]
    pub approver_keys: Vec<PathBuf>,
    #[serde(default)]
    pub approvers: Vec<String>,
    pub plan_pull_requests: Option<bool>,
    pub fleet: Option<String>,
    pub pin_first_fleet: Option<bool>,
    pub status_key: Option<PathBuf>,
    /// `labels: {region: eu}`: what variant selectors match (`--label KEY=VALUE`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
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
}

/// `--label KEY=VALUE` flags as the settings' `labels` (checked in [`AgentSettings::resolve`]).
pub fn parse_labels(flags: &[String]) -> Result<BTreeMap<String, String>, ConfigError> {
    flags
        .iter()
        .map(|f| match f.split_once('=') {
            Some((k, v)) => Ok((k.trim().to_string(), v.trim().to_string())),
            None => Err(ConfigError::InvalidLabel(f.clone())),
        })
        .collect()
}

/// The longest cluster name: `fleetgate-state-<cluster>` and `fleetgate-agent-<cluster>` must stay
/// valid label values too (63), which leaves 47 characters for the cluster part.
const MAX_CLUSTER_NAME: usize = 63 - "fleetgate-state-".len();

impl AgentSettings {
    /// Reads a YAML config file (unknown keys are errors, like every fleetgate document).
    pub fn from_file(path: &Path) -> Result<AgentSettings, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::ReadFile { path: path.to_path_buf(), source })?;
        serde_yaml_ng::from_str(&text)
            .map_err(|e| ConfigError::ParseFile { path: path.to_path_buf(), message: e.to_string() })
    }

    /// Field by field, `higher` wins where it says something.
    pub fn overlay(self, higher: AgentSettings) -> AgentSettings {
        AgentSettings {
            repo: higher.repo.or(self.repo),
            branch: higher.branch.or(self.branch),
            cluster: higher.cluster.or(self.cluster),
            kubeconfig: higher.kubeconfig.or(self.kubeconfig),
            context: higher.context.or(self.context),
            trusted_keys: if higher.trusted_keys.is_empty() { self.trusted_keys } else { higher.trusted_keys },
            state_namespace: higher.state_namespace.or(self.state_namespace),
            state_dir: higher.state_dir.or(self.state_dir),
            interval: higher.interval.or(self.interval),
            drift_interval: higher.drift_interval.or(self.drift_interval),
            heartbeat_interval: higher.heartbeat_interval.or(self.heartbeat_interval),
            listen: higher.listen.or(self.listen),
            write_back: higher.write_back.or(self.write_back),
            paused: higher.paused.or(self.paused),
            git_ssh_key: higher.git_ssh_key.or(self.git_ssh_key),
            git_token_file: higher.git_token_file.or(self.git_token_file),
            git_known_hosts: higher.git_known_hosts.or(self.git_known_hosts),
            git_ca_file: higher.git_ca_file.or(self.git_ca_file),
            notify_url: self.notify_url.overlay(higher.notify_url),
            notify_on: self.notify_on.overlay(higher.notify_on),
            notify_format: self.notify_format.overlay(higher.notify_format),
            notify_secret_file: self.notify_secret_file.overlay(higher.notify_secret_file),
            notify_timeout: higher.notify_timeout.or(self.notify_timeout),
            webhook_secret_file: higher.webhook_secret_file.or(self.webhook_secret_file),
            insecure_webhook: higher.insecure_webhook.or(self.insecure_webhook),
            max_fetch_bytes: higher.max_fetch_bytes.or(self.max_fetch_bytes),
            max_tags: higher.max_tags.or(self.max_tags),
            forge: self.forge.overlay(higher.forge),
            prometheus: self.prometheus.overlay(higher.prometheus),
            prometheus_sources: {
                let mut sources = self.prometheus_sources;
                sources.extend(higher.prometheus_sources);
                sources
            },
            allow_gate_kinds: if higher.allow_gate_kinds.is_empty() {
                self.allow_gate_kinds
            } else {
                higher.allow_gate_kinds
            },
            leader_elect: higher.leader_elect.or(self.leader_elect),
            lease_duration: higher.lease_duration.or(self.lease_duration),
            admission_policy: higher.admission_policy.or(self.admission_policy),
            promotions: higher.promotions.or(self.promotions),
            promotion_keys: if higher.promotion_keys.is_empty() { self.promotion_keys } else { higher.promotion_keys },
            approver_keys: if higher.approver_keys.is_empty() { self.approver_keys } else { higher.approver_keys },
            approvers: if higher.approvers.is_empty() { self.approvers } else { higher.approvers },
            plan_pull_requests: higher.plan_pull_requests.or(self.plan_pull_requests),
            fleet: higher.fleet.or(self.fleet),
            pin_first_fleet: higher.pin_first_fleet.or(self.pin_first_fleet),
            status_key: higher.status_key.or(self.status_key),
            labels: {
                let mut labels = self.labels;
                labels.extend(higher.labels);
                labels
            },
        }
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
        let notify = resolve_notify(self.notify_url, self.notify_on, self.notify_format, self.notify_secret_file)?;
        let prometheus = PrometheusEndpoints::new(self.prometheus.resolve("--prometheus")?)
            .with_sources(resolve_prometheus_sources(self.prometheus_sources)?);
        let forge = self.forge.resolve()?;
        let plan_pull_requests = self.plan_pull_requests.unwrap_or(false);
        if plan_pull_requests && forge.is_none() {
            return Err(ConfigError::PlanWithoutForge);
        }
        if let Some(kind) = self.allow_gate_kinds.iter().find(|k| !is_kind_group(k)) {
            return Err(ConfigError::InvalidGateKind(kind.clone()));
        }
        if let Some((k, v)) = self.labels.iter().find(|(k, v)| !is_label_key(k) || !is_label_value(v)) {
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
            labels: self.labels,
            cluster,
        })
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
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusSourceSettings {
    pub url: String,
    pub bearer_token_file: Option<PathBuf>,
    pub basic_auth: Option<BasicAuthSettings>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
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
    urls: NamedUrls,
    on: NamedUrls,
    formats: NamedUrls,
    secrets: NamedUrls,
) -> Result<BTreeMap<String, Endpoint>, ConfigError> {
    let mut endpoints: BTreeMap<String, Endpoint> =
        urls.resolve("--notify-url")?.into_iter().map(|(name, url)| (name, Endpoint::new(url))).collect();
    let invalid =
        |flag, name: &str, problem: String| ConfigError::InvalidNotifySetting { flag, name: name.to_string(), problem };
    for (flag, settings) in [("--notify-on", &on), ("--notify-format", &formats), ("--notify-secret-file", &secrets)] {
        if let Some(name) = settings.0.keys().find(|name| !endpoints.contains_key(*name)) {
            return Err(invalid(flag, name, format!("there is no --notify-url {name}=URL")));
        }
    }
    for (name, endpoint) in &mut endpoints {
        if let Some(kinds) = on.0.get(name) {
            endpoint.on = NotificationKind::parse_list(kinds).map_err(|p| invalid("--notify-on", name, p))?;
        }
        if let Some(format) = formats.0.get(name) {
            endpoint.format = format.parse().map_err(|p| invalid("--notify-format", name, p))?;
        }
        if let Some(file) = secrets.0.get(name) {
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

/// Settings by the logical name of the endpoint they are for: URLs the fleet repo refers to by
/// name (`--prometheus`, `--notify-url`), and what else an endpoint has (`--notify-on`,
/// `--notify-format`, `--notify-secret-file`). Flags give `[NAME=]VALUE` (repeatable; a bare
/// value is [`DEFAULT_ENDPOINT`]'s); the config file a value, a list of `[NAME=]VALUE`, or a map
/// `NAME: VALUE`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamedUrls(BTreeMap<String, String>);

impl NamedUrls {
    /// `NAME=URL` when the part before the first `=` is a DNS-1123 label, else all of it is the
    /// URL of [`DEFAULT_ENDPOINT`] (a URL's own `=` comes after its `://`).
    pub fn parse<S: AsRef<str>>(items: &[S]) -> NamedUrls {
        NamedUrls(
            items
                .iter()
                .map(|item| {
                    let item = item.as_ref();
                    match item.split_once('=') {
                        Some((name, url)) if is_dns_label(name) => (name.to_string(), url.to_string()),
                        _ => (DEFAULT_ENDPOINT.to_string(), item.to_string()),
                    }
                })
                .collect(),
        )
    }

    /// Name by name, `higher` wins.
    fn overlay(mut self, higher: NamedUrls) -> NamedUrls {
        self.0.extend(higher.0);
        self
    }

    fn resolve(self, flag: &'static str) -> Result<BTreeMap<String, reqwest::Url>, ConfigError> {
        self.0
            .into_iter()
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
}

impl<'de> Deserialize<'de> for NamedUrls {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged, expecting = "a value, a list of [NAME=]VALUE, or a map of NAME: VALUE")]
        enum Form {
            One(String),
            List(Vec<String>),
            Map(BTreeMap<String, String>),
        }
        Ok(match Form::deserialize(d)? {
            Form::One(url) => NamedUrls::parse(&[url]),
            Form::List(items) => NamedUrls::parse(&items),
            Form::Map(map) => NamedUrls(map),
        })
    }
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
            AgentSettings::from_file(&file).unwrap().overlay(minimal(dir.path())).resolve()
        };
        let c = yaml(&format!(
            "    url: https://mimir:8080/prometheus\n    bearerTokenFile: {}\n    headers: {{X-Scope-OrgID: team-a}}\n",
            token.display()
        ))
        .unwrap();
        let policy: crate::model::GatePolicySpec = serde_yaml_ng::from_str(
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
        let c = AgentSettings::from_file(&file).unwrap().overlay(minimal(dir.path())).resolve().unwrap();
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
        let c = file.overlay(flags).resolve().unwrap();
        assert_eq!(c.repo, RepoLocation::Remote("https://git.example.com/fleet.git".into()));
        assert_eq!(c.branch, "release");
        assert_eq!(c.interval, Duration::from_secs(5));
        assert!(c.write_back);
        assert_eq!(c.leader_election, None);
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
            prometheus: NamedUrls::parse(&["http://prom-2:9090"]),
            notify_url: NamedUrls::parse(&["oncall=https://hooks.example.com/x?a=b"]),
            labels: parse_labels(&["tier=canary".into()]).unwrap(),
            ..minimal(dir.path())
        };
        let c = file.overlay(flags).resolve().unwrap();
        let forge = c.forge.unwrap();
        assert_eq!((forge.kind, forge.repository.as_str()), (crate::model::ForgeKind::Gitea, "platform/fleet"));
        assert_eq!(forge.token, crate::status::TokenSource::File(token));
        let host = |u: &reqwest::Url| u.host_str().unwrap().to_string();
        assert_eq!(c.prometheus.names().collect::<Vec<_>>(), ["default", "thanos"]);
        let policy: crate::model::GatePolicySpec =
            serde_yaml_ng::from_str("bakeTime: 1m\ngates: [{name: e, prometheus: {query: x, max: 1}}]\n").unwrap();
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
        assert!(parse_labels(&["region".into()]).is_err());
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
        let flags = AgentSettings { notify_on: NamedUrls::parse(&["chat=failed,rolledBack"]), ..minimal(dir.path()) };
        let c = AgentSettings::from_file(&file).unwrap().overlay(flags).resolve().unwrap();
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
    #[case::notify_scheme(|s: &mut AgentSettings| s.notify_url = NamedUrls::parse(&["ftp://x/secret-path"]), "--notify-url default=…: not an http(s) URL (scheme \"ftp\")")]
    #[case::notify_on_unknown_endpoint(|s: &mut AgentSettings| s.notify_on = NamedUrls::parse(&["oncall=failed"]), "--notify-on oncall=…: there is no --notify-url oncall=URL")]
    #[case::notify_on_kind(|s: &mut AgentSettings| { s.notify_url = NamedUrls::parse(&["http://h/x"]); s.notify_on = NamedUrls::parse(&["failed,rollback"]) }, "--notify-on default=…: \"rollback\" is not one of all, started")]
    #[case::notify_format(|s: &mut AgentSettings| { s.notify_url = NamedUrls::parse(&["http://h/x"]); s.notify_format = NamedUrls::parse(&["discord"]) }, "\"discord\" is not one of slack, teams, webhook")]
    #[case::webhook_without_secret(|s: &mut AgentSettings| { s.notify_url = NamedUrls::parse(&["http://h/x"]); s.notify_format = NamedUrls::parse(&["webhook"]) }, "pass --notify-secret-file default=FILE")]
    #[case::missing_secret(|s: &mut AgentSettings| { s.notify_url = NamedUrls::parse(&["http://h/x"]); s.notify_secret_file = NamedUrls::parse(&["/nonexistent/secret"]) }, "notification secret file /nonexistent/secret")]
    #[case::prometheus_url(|s: &mut AgentSettings| s.prometheus = NamedUrls::parse(&["thanos=not a url"]), "--prometheus thanos=…: not an http(s) URL")]
    #[case::endpoint_name(|s: &mut AgentSettings| s.prometheus = NamedUrls(BTreeMap::from([("Thanos".into(), "http://t".into())])), "must be a DNS-1123 label")]
    #[case::half_a_forge(|s: &mut AgentSettings| s.forge.url = Some("https://api.github.com".into()), "--forge-kind is missing")]
    #[case::missing_forge_token(|s: &mut AgentSettings| s.forge.token_file = Some("/nonexistent/forge-token".into()), "forge token file")]
    #[case::gate_kind(|s: &mut AgentSettings| s.allow_gate_kinds = vec!["secrets".into()], "--allow-gate-kind \"secrets\"")]
    #[case::missing_token(|s: &mut AgentSettings| s.git_token_file = Some("/nonexistent/token".into()), "git token file")]
    #[case::short_lease(|s: &mut AgentSettings| s.lease_duration = Some(Duration::from_secs(1)), "lease-duration")]
    #[case::open_webhook(|s: &mut AgentSettings| s.listen = Some("0.0.0.0:8080".parse().unwrap()), "--webhook-secret-file FILE")]
    #[case::open_webhook_v6(|s: &mut AgentSettings| s.listen = Some("[::]:8080".parse().unwrap()), "--insecure-webhook")]
    #[case::tiny_fetch(|s: &mut AgentSettings| s.max_fetch_bytes = Some(1000), "--max-fetch-bytes 1000")]
    #[case::no_tags(|s: &mut AgentSettings| s.max_tags = Some(0), "--max-tags 0")]
    #[case::label_key(|s: &mut AgentSettings| s.labels = BTreeMap::from([("re gion".into(), "eu".into())]), "--label \"re gion=eu\"")]
    #[case::label_value(|s: &mut AgentSettings| s.labels = BTreeMap::from([("region".into(), "eu west".into())]), "is not KEY=VALUE")]
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
        let c = AgentSettings::from_file(&file).unwrap().overlay(open).resolve().unwrap();
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
