//! Argument groups several commands share, each a `#[command(flatten)]` struct: one spelling,
//! one default and one help text per flag across the binary.

use crate::agent::config::{DEFAULT_STATE_NAMESPACE, KubeAccess};
use crate::releng::publish::PublishOptions;
use crate::releng::{RelengError, Signer, Target};
use crate::source::{Credentials, ProxyEnv, Source};
use crate::status::{FleetView, ForgeSettings, VerifiedNotes};
use anyhow::Context;
use std::path::PathBuf;

/// Which clusters: exactly one of `--cluster`, `--wave`, `--fleet` (promote, rollback, pause, resume, wait).
#[derive(Debug, Clone, clap::Args)]
#[group(required = true, multiple = false)]
pub struct TargetArgs {
    /// One cluster (clusters/<NAME>.yaml).
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// Every cluster of a wave (fleet.yaml spec.waves).
    #[arg(long, value_name = "WAVE")]
    pub wave: Option<String>,
    /// The whole fleet: fleet.yaml spec.release, and every cluster pin dropped.
    #[arg(long)]
    pub fleet: bool,
}

impl TargetArgs {
    pub fn target(&self) -> Target {
        match (&self.cluster, &self.wave) {
            (Some(c), _) => Target::Cluster(c.clone()),
            (None, Some(w)) => Target::Wave(w.clone()),
            (None, None) => Target::Fleet,
        }
    }
}

/// Optional commit signing (promote, rollback, pause, resume).
#[derive(Debug, clap::Args)]
pub struct CommitSigning {
    /// Sign the commit with this key: a promotion key makes it a signed decision (needed with
    /// `promotions: signed`, and to move a cluster back to an older release; docs/SECURITY.md).
    /// An OpenPGP fingerprint, or with `--signing-format ssh` an OpenSSH private key file.
    #[arg(long, value_name = "FINGERPRINT|PATH")]
    pub sign_key: Option<String>,
    /// GnuPG home holding --sign-key (default: $GNUPGHOME, else ~/.gnupg).
    #[arg(long)]
    pub gpg_home: Option<PathBuf>,
    /// How --sign-key signs, as Git's `gpg.format`: openpgp (gpg) or ssh (an SSH signature).
    #[arg(long, value_enum, default_value_t, env = "FLEETGATE_SIGNING_FORMAT")]
    pub signing_format: SigningFormat,
}

impl CommitSigning {
    /// The signer, when `--sign-key` was given.
    pub fn signer(&self) -> Result<Option<Signer>, RelengError> {
        self.sign_key.as_deref().map(|k| self.signing_format.open(k, self.gpg_home.as_deref())).transpose()
    }
}

/// What `--sign-key` names, as Git's `gpg.format`: an OpenPGP key or an SSH key file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SigningFormat {
    /// `--sign-key` is the fingerprint of a secret key in the GnuPG home.
    #[default]
    Openpgp,
    /// `--sign-key` is an unencrypted OpenSSH Ed25519 private key file; the signature is an SSH
    /// signature in namespace `git` (as `git tag -s` with `gpg.format=ssh`).
    Ssh,
}

impl SigningFormat {
    pub fn open(self, key: &str, gpg_home: Option<&std::path::Path>) -> Result<Signer, RelengError> {
        Ok(match self {
            SigningFormat::Openpgp => Signer::open(key, gpg_home)?,
            SigningFormat::Ssh => Signer::open_ssh(std::path::Path::new(key))?,
        })
    }
}

/// Where the new commit goes (promote, rollback, pause, resume).
#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// Push the commit's branch (a rollback without --branch: the base branch itself).
    #[arg(long)]
    pub push: bool,
    /// Push the branch and open a pull/merge request through the forge given with --forge-* (a
    /// rollback then commits on a new branch).
    #[arg(long)]
    pub open_pr: bool,
    /// Remote to push to, a name or URL (promote also fetches statuses from it).
    #[arg(long, default_value = "origin")]
    pub remote: String,
    #[command(flatten)]
    pub forge: ForgeSettings,
    #[command(flatten)]
    pub git: GitAccess,
}

impl PublishArgs {
    /// The options; fails as [`GitAccess::credentials`] does.
    pub fn options(&self) -> anyhow::Result<PublishOptions> {
        Ok(PublishOptions {
            push: self.push,
            open_pr: self.open_pr,
            remote: self.remote.clone(),
            forge: self.forge.clone(),
            access: self.git.credentials()?,
        })
    }
}

/// The variable `--token-env` reads when not given.
const DEFAULT_TOKEN_ENV: &str = "FLEETGATE_GIT_TOKEN";

/// The fleet repo a read-only command mirrors to read statuses and the fleet (status, wait, get
/// agents, audit): where it is, which branch, how to reach it.
#[derive(Debug, Clone, clap::Args)]
pub struct FleetRepoArgs {
    /// The fleet repo: a local path or a URL (git://, ssh://, https://).
    #[arg(long, env = "FLEETGATE_REPO")]
    pub repo: String,
    /// The tracked branch whose fleet.yaml and clusters/ define the fleet.
    #[arg(long, default_value = "main")]
    pub branch: String,
    #[command(flatten)]
    pub git: GitAccess,
}

impl FleetRepoArgs {
    /// A throw-away mirror of the repo (`prefix` names its temp dir), not yet synced.
    pub fn open_mirror(&self, prefix: &str) -> anyhow::Result<(tempfile::TempDir, Source)> {
        self.git.open_mirror(&self.repo, &self.branch, prefix)
    }
}

/// How to reach a repo given by URL (validate, diff, status, promote, rollback, release create).
/// HTTPS_PROXY/NO_PROXY are honoured for https:// URLs (libgit2 cannot proxy http://).
#[derive(Debug, Clone, clap::Args)]
pub struct GitAccess {
    /// SSH private key for ssh:// URLs [default: the SSH agent].
    #[arg(long, value_name = "FILE")]
    pub ssh_key: Option<PathBuf>,
    /// Environment variable holding a token for https:// URLs (sent as the password). Without
    /// the flag, FLEETGATE_GIT_TOKEN is used when it is set, else Git's credential helpers.
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
    /// known_hosts file SSH host keys are checked against, strictly: a host not in it is refused
    /// [default: ~/.ssh/known_hosts when it exists].
    #[arg(long, env = "FLEETGATE_KNOWN_HOSTS", value_name = "FILE")]
    pub known_hosts: Option<PathBuf>,
    /// PEM file of the CA(s) an https:// server's certificate may also be issued by.
    #[arg(long, env = "FLEETGATE_GIT_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

impl GitAccess {
    /// A private mirror of `repo` for one invocation (the branch, the tags and every status
    /// note), in a temporary directory that lives as long as the returned guard.
    pub fn open_mirror(&self, repo: &str, branch: &str, prefix: &str) -> anyhow::Result<(tempfile::TempDir, Source)> {
        let state = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let source = Source::open(repo, state.path(), self.credentials()?)?.with_branch(branch);
        Ok((state, source))
    }

    /// The credentials; a variable named with `--token-env` and a `--known-hosts` file must exist.
    pub fn credentials(&self) -> anyhow::Result<Credentials> {
        let token = match &self.token_env {
            Some(var) => {
                Some(std::env::var(var).with_context(|| format!("--token-env {var}: the variable is not set"))?)
            }
            None => std::env::var(DEFAULT_TOKEN_ENV).ok(),
        };
        let known_hosts = match &self.known_hosts {
            Some(path) => {
                Some(std::fs::read_to_string(path).with_context(|| format!("--known-hosts {}", path.display()))?)
            }
            None => std::env::var_os("HOME")
                .map(|home| PathBuf::from(home).join(".ssh/known_hosts"))
                .and_then(|p| std::fs::read_to_string(p).ok()),
        };
        Ok(Credentials {
            ssh_key: self.ssh_key.clone(),
            token,
            known_hosts,
            ca_file: self.ca_file.clone(),
            proxy: ProxyEnv::from_env(),
            git_helpers: true,
            ..Credentials::default()
        })
    }
}

/// Which cluster API server: `--kubeconfig` and `--context`, global flags of the binary (given
/// before or after the subcommand), read by every command that talks to a cluster.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KubeArgs {
    /// Kubeconfig file [default: $KUBECONFIG, ~/.kube/config, else the in-cluster service account].
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context [default: its current context].
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
}

impl KubeArgs {
    /// The kubeconfig and context given, or inference (default kubeconfig, else in-cluster).
    pub fn access(&self) -> KubeAccess {
        match (&self.kubeconfig, &self.context) {
            (None, None) => KubeAccess::Infer,
            (path, context) => KubeAccess::Kubeconfig { path: path.clone(), context: context.clone() },
        }
    }
}

/// One cluster's agent as its API server holds it (events, tree): the cluster's name and the
/// agent's namespace.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentRef {
    /// The cluster's name in the fleet repo (clusters/<NAME>.yaml).
    #[arg(long, value_name = "NAME")]
    pub cluster: String,
    /// Namespace of the cluster's agent (its state, inventory and Events).
    #[arg(short = 'n', long, default_value = DEFAULT_STATE_NAMESPACE)]
    pub namespace: String,
}

/// Fetches `source` and reads the fleet view at its branch tip (status, version). Blocking.
pub fn read_fleet(source: &mut Source) -> anyhow::Result<FleetView> {
    read_fleet_remembering(source, &mut VerifiedNotes::new())
}

/// [`read_fleet`] with a memory of notes verified before (`fleetgate status`'s, kept across runs).
pub fn read_fleet_remembering(source: &mut Source, memo: &mut VerifiedNotes) -> anyhow::Result<FleetView> {
    source.sync().with_context(|| format!("reading {}", source.url()))?;
    Ok(FleetView::load_remembering(&source.checkout()?, memo)?)
}
