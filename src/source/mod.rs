//! The fleet repo as seen through git2: a mirror in a state directory, cheap change detection,
//! fetching, and reading trees into a [`Checkout`].
//!
//! [`Source`] keeps a **bare** mirror (`<state dir>/mirror.git`) of the tracked branch, every tag
//! and the status notes `refs/notes/fleetgate/*` (fast-forward only, see [`NOTES_TRACKING_PREFIX`]). [`Source::sync`] first lists the remote's refs (one
//! `ls-remote`-style connection) and fetches only when they differ from the mirror, so an
//! unchanged remote costs one round trip. A change of the branch or a tag is always fetched
//! (notes included); notes refs that moved alone are fetched when the [`NotesSchedule`] says so
//! (an agent waiting at a wave gate; see [`notes_schedule`]). Fetching only writes objects and then moves refs —
//! there is no work tree to reset — so an interrupted fetch leaves the previous state intact.
//! Network errors are retried with exponential backoff; authentication and configuration errors
//! are not (retrying cannot fix them).
//!
//! Every call blocks (git2 is synchronous): async callers run it in `spawn_blocking`.
//!
//! Fetches are bounded by [`FetchLimits`], because anyone who can push to the repo decides what
//! the agent downloads: a remote listing more tags than `max_tags` is not fetched at all
//! ([`SourceError::TooManyTags`]), and a fetch whose pack grows past `max_pack_bytes` is aborted
//! while it downloads (libgit2's transfer progress callback). When that happens the branch and the
//! notes are fetched on their own, then each changed tag on its own: a tag whose pack alone is too
//! large is left out of the mirror and remembered ([`SyncOutcome::refused`] reports it once), so
//! one junk tag neither evicts the agent nor stops the releases pushed after it. A branch too large
//! to fetch is an error ([`SourceError::PackTooLarge`]); the mirror keeps its previous state.
//! Reading a tree is bounded too: [`GitTree`] checks a blob's size in the object database's
//! header before it loads the blob.
//!
//! URLs: a local path, `file://`, `git://`, `ssh://` (or `user@host:path`) with an SSH key file,
//! `https://` with a token (sent as the password of `username`, default `git`).
//!
//! A Git server that accepts the connection and then never answers must not hold the agent
//! forever: libgit2's server connect and read timeouts ([`NetworkTimeouts`]) are set once per
//! process, when the first [`Source`] opens (or earlier, by [`set_network_timeouts`]). A timeout is
//! a network error like any other: retried, then reported, and the agent finishes an operation in
//! flight without Git.

mod access;
mod https;
pub mod notes_schedule;
mod template;
mod tree;

pub use access::{CA_HINT, HostKeyError, ProxyEnv, check_host_key, explain_refusal, no_libgit2_proxy};
pub use notes_schedule::NotesSchedule;
pub use template::{InitError, init_fleet_repo};
pub use tree::GitTree;

use crate::model::{ErrorClass, redact_userinfo};
use git2::{AutotagOption, Direction, FetchPrune, Oid, RemoteCallbacks, Repository};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where status notes live; the source mirrors them so wave gating can read them.
pub const NOTES_PREFIX: &str = "refs/notes/fleetgate/";
/// Where the mirror keeps the remote's notes refs as they are on the remote (force-updated,
/// pruned). The local `refs/notes/fleetgate/*` only ever fast-forward to them, so a status note
/// written locally and not pushed yet is never lost to a fetch; the status module merges
/// diverged notes when it publishes.
pub const NOTES_TRACKING_PREFIX: &str = "refs/fleetgate/notes-remote/";
/// Where each cluster's agent force-pushes its heartbeat (`crate::status::heartbeat`). Only a
/// mirror opened [`Source::with_heartbeats`] lists or fetches them; agents never do, so another
/// cluster's beat neither wakes nor costs them a fetch.
pub const HEARTBEAT_PREFIX: &str = "refs/fleetgate/heartbeat/";

/// Where [`Source::fetch_pull_head`] puts the pull request head it fetched: outside the refs the
/// mirror tracks, so no sync and no checkout of the branch ever reads it.
pub const PULL_HEAD_REF: &str = "refs/fleetgate/pull-head";

/// The remote's notes refs as `repo` tracks them: each cluster under [`NOTES_TRACKING_PREFIX`]
/// with its tip.
pub(crate) fn tracked_notes(repo: &Repository) -> Result<Vec<(String, Oid)>, git2::Error> {
    Ok(repo
        .references_glob(&format!("{NOTES_TRACKING_PREFIX}*"))?
        .filter_map(Result::ok)
        .filter_map(|r| Some((r.name().ok()?.strip_prefix(NOTES_TRACKING_PREFIX)?.to_string(), r.target()?)))
        .collect())
}

/// Moves `cluster`'s local notes ref to the remote's tip `theirs` when it is absent or an ancestor
/// of it; a local ref that is ahead is left as it is. Returns the local tip when the two have
/// diverged, for the caller to keep (the mirror) or merge (the status module).
pub(crate) fn fast_forward_notes_ref(
    repo: &Repository,
    cluster: &str,
    theirs: Oid,
) -> Result<Option<Oid>, git2::Error> {
    let local = format!("{NOTES_PREFIX}{cluster}");
    match repo.refname_to_id(&local) {
        Ok(ours) if ours == theirs || repo.graph_descendant_of(ours, theirs)? => return Ok(None),
        Ok(ours) if !repo.graph_descendant_of(theirs, ours)? => return Ok(Some(ours)),
        Ok(_) => {}
        Err(e) if e.code() == git2::ErrorCode::NotFound => {}
        Err(e) => return Err(e),
    }
    repo.reference(&local, theirs, true, "fleetgate: fast-forward status notes")?;
    Ok(None)
}

/// How to authenticate to the remote. Debug output never shows the token.
#[derive(Clone, Default)]
pub struct Credentials {
    /// Private key file for `ssh://` URLs.
    pub ssh_key: Option<PathBuf>,
    /// SSH user when the URL names none (default `git`).
    pub ssh_user: Option<String>,
    /// Token for `https://` URLs, sent as the password.
    pub token: Option<String>,
    /// User name sent with the token (default `git`; GitHub and Gitea accept any, GitLab wants
    /// `oauth2` for OAuth tokens).
    pub username: Option<String>,
    /// `known_hosts` content SSH host keys are checked against; None refuses every SSH host
    /// (see [`access`](self#)'s strict checking, [`check_host_key`]).
    pub known_hosts: Option<String>,
    /// PEM CA certificates an HTTPS server's certificate may also chain to.
    pub ca_file: Option<PathBuf>,
    /// The proxies of `https://` and `http://` URLs.
    pub proxy: ProxyEnv,
    /// Without a key or token, ask the SSH agent and Git's credential helpers, the way `git`
    /// does (promote and rollback on a person's machine).
    pub git_helpers: bool,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("ssh_key", &self.ssh_key)
            .field("ssh_user", &self.ssh_user)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("username", &self.username)
            .field("known_hosts", &self.known_hosts.as_ref().map(|k| k.lines().count()))
            .field("ca_file", &self.ca_file)
            .field("proxy", &self.proxy)
            .field("git_helpers", &self.git_helpers)
            .finish()
    }
}

impl Credentials {
    /// The user and token an `https://` request authenticates with (user `username`, default
    /// `git`), when a token is configured.
    pub fn token_auth(&self) -> Option<(&str, &str)> {
        self.token.as_deref().map(|token| (self.username.as_deref().unwrap_or("git"), token))
    }

    /// The credential libgit2 asks for (`allowed`) for `url`, from what is configured: SSH key,
    /// token, the SSH agent or a credential helper when [`Credentials::git_helpers`], or just a
    /// user name. Used by [`Credentials::callbacks`].
    pub fn cred(
        &self,
        url: &str,
        user_from_url: Option<&str>,
        allowed: git2::CredentialType,
    ) -> Result<git2::Cred, git2::Error> {
        let user = user_from_url.or(self.ssh_user.as_deref()).unwrap_or("git");
        if allowed.contains(git2::CredentialType::SSH_KEY) {
            if let Some(key) = &self.ssh_key {
                return git2::Cred::ssh_key(user, None, key, None);
            }
            if self.git_helpers {
                return git2::Cred::ssh_key_from_agent(user);
            }
        }
        if allowed.contains(git2::CredentialType::USER_PASS_PLAINTEXT) {
            if let Some((user, token)) = self.token_auth() {
                return git2::Cred::userpass_plaintext(user, token);
            }
            if self.git_helpers {
                return git2::Cred::credential_helper(&git2::Config::open_default()?, url, user_from_url);
            }
        }
        if allowed.contains(git2::CredentialType::USERNAME) {
            return git2::Cred::username(user);
        }
        Err(git2::Error::from_str("the remote asks for credentials and none are configured"))
    }
}

/// What a [`Source`] downloads at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchLimits {
    /// Bytes of pack one fetch may receive before it is aborted.
    pub max_pack_bytes: u64,
    /// Tags the remote may list; more and the sync is refused.
    pub max_tags: usize,
}

impl Default for FetchLimits {
    /// 256 MiB of pack (a fleet repo is manifests: megabytes), 5000 tags (a release a day for
    /// over a decade).
    fn default() -> Self {
        FetchLimits { max_pack_bytes: 256 * 1024 * 1024, max_tags: 5000 }
    }
}

/// A tag left out of the mirror because its fetch was too large.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedRef {
    /// `refs/tags/<name>`.
    pub name: String,
    pub oid: Oid,
    /// Why, as [`SourceError::PackTooLarge`] says it.
    pub reason: String,
}

/// How long libgit2 waits for a Git server (`git://`, and `https://` through libgit2's own HTTP
/// client): to connect, and for each read or write once connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkTimeouts {
    pub connect: Duration,
    pub io: Duration,
}

impl Default for NetworkTimeouts {
    /// 10 s to connect, 30 s per read or write: generous for a server across the world, short
    /// against one that stopped answering (each retry of [`RetryPolicy`] waits as long again).
    fn default() -> Self {
        NetworkTimeouts { connect: Duration::from_secs(10), io: Duration::from_secs(30) }
    }
}

/// Sets libgit2's server timeouts for this process and returns the ones in force. They are
/// process-global in libgit2, so the first call wins and later calls change nothing;
/// [`Source::open`] calls it with the defaults.
pub fn set_network_timeouts(timeouts: NetworkTimeouts) -> NetworkTimeouts {
    static IN_FORCE: std::sync::OnceLock<NetworkTimeouts> = std::sync::OnceLock::new();
    *IN_FORCE.get_or_init(|| {
        let ms = |d: Duration| i32::try_from(d.as_millis()).unwrap_or(i32::MAX).max(1);
        // SAFETY: libgit2 keeps these in two C ints that it reads when it opens a connection; git2
        // marks the setters unsafe because the write is unsynchronised. The OnceLock makes this
        // the only write in the process, and it happens before this process's first Source
        // connects (Source::open calls this before it returns).
        let set = unsafe {
            git2::opts::set_server_connect_timeout_in_milliseconds(ms(timeouts.connect))
                .and_then(|()| git2::opts::set_server_timeout_in_milliseconds(ms(timeouts.io)))
        };
        if let Err(e) = set {
            tracing::warn!(error = %e, "libgit2 refused the server timeouts; a Git server that never answers can stall a sync");
        }
        timeouts
    })
}

/// Retries of network operations: `attempts` tries in total, waiting `initial`, then twice as
/// long each time, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub initial: Duration,
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { attempts: 4, initial: Duration::from_millis(250), max: Duration::from_secs(5) }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("opening the state directory {path}: {message}")]
    State { path: PathBuf, message: String },
    #[error("{url}: authentication failed ({message}); check the SSH key or token")]
    Auth { url: String, message: String },
    /// The SSH server's host key was refused ([`HostKeyError`] says which and why).
    #[error("{url}: {message}")]
    HostKey { url: String, message: String },
    #[error("{url}: the server's TLS certificate was refused ({message}); {hint}", hint = CA_HINT)]
    Certificate { url: String, message: String },
    #[error("{url}: {message} (after {attempts} attempt(s))")]
    Network { url: String, message: String, attempts: u32 },
    #[error("{url}: {message}")]
    Remote { url: String, message: String },
    #[error("branch {branch} does not exist in {url}")]
    BranchNotFound { url: String, branch: String },
    #[error(
        "{url}: fetching {what} was aborted after {received} bytes, over the --max-fetch-bytes limit of {limit}; \
         the mirror keeps its previous state (remove what made it so large, or raise the limit)"
    )]
    PackTooLarge { url: String, what: String, received: u64, limit: u64 },
    #[error(
        "{url} lists {count} tags, over the --max-tags limit of {limit}; nothing was fetched (delete junk tags, or raise the limit)"
    )]
    TooManyTags { url: String, count: usize, limit: usize },
    #[error("tag {tag} is not in the mirror: {reason}")]
    TagRefused { tag: String, reason: String },
    #[error("reading the repository")]
    Git(#[from] git2::Error),
}

impl SourceError {
    pub fn class(&self) -> ErrorClass {
        match self {
            SourceError::Network { .. } | SourceError::Git(_) | SourceError::State { .. } => ErrorClass::Retryable,
            SourceError::Auth { .. }
            | SourceError::HostKey { .. }
            | SourceError::Certificate { .. }
            | SourceError::Remote { .. }
            | SourceError::BranchNotFound { .. }
            | SourceError::PackTooLarge { .. }
            | SourceError::TooManyTags { .. }
            | SourceError::TagRefused { .. } => ErrorClass::Stalling,
        }
    }
}

/// The remote's refs that matter: the tracked branch, tags, status notes (name → object id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteRefs {
    pub refs: BTreeMap<String, Oid>,
}

/// How much network work a [`Source`] has done (for tests and metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Remote ref listings (successful or not, retries included).
    pub ls_remotes: u64,
    /// Fetches (successful or not, retries included).
    pub fetches: u64,
    /// Of `fetches`, those of the status notes alone (no branch or tag had moved).
    pub notes_fetches: u64,
}

/// What [`Source::sync`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    /// True when the remote differed and was fetched.
    pub fetched: bool,
    /// True when only status notes had moved and were fetched (then `fetched` is true too).
    pub notes_only: bool,
    /// The tracked branch's tip after the sync.
    pub tip: Oid,
    /// Tags this sync left out of the mirror because they were too large to fetch (each is
    /// reported once; while the remote keeps it unchanged it stays out silently).
    pub refused: Vec<RefusedRef>,
}

/// A fleet repo mirrored into a state directory.
pub struct Source {
    url: String,
    /// `url` as errors and logs show it ([`redact_userinfo`]): no token from its user info.
    shown_url: String,
    branch: String,
    state_dir: PathBuf,
    mirror: Repository,
    credentials: Credentials,
    retry: RetryPolicy,
    limits: FetchLimits,
    /// Tags too large to fetch, by ref name, at the object id they were refused at.
    refused: BTreeMap<String, RefusedRef>,
    stats: SourceStats,
    notes: NotesSchedule,
    /// Also mirror the heartbeat refs ([`HEARTBEAT_PREFIX`]), for readers of liveness.
    heartbeats: bool,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source").field("url", &self.shown_url).field("branch", &self.branch).finish_non_exhaustive()
    }
}

/// A local path becomes an absolute path (libgit2 takes those as URLs); anything else stays.
fn normalize_url(url: &str) -> String {
    let p = Path::new(url);
    if !url.contains("://") && p.exists() {
        return std::fs::canonicalize(p).map(|p| p.display().to_string()).unwrap_or_else(|_| url.to_string());
    }
    url.to_string()
}

impl Source {
    /// Opens (creating when needed) the mirror of `url` in `state_dir`. Tracks branch `main`
    /// unless [`Source::with_branch`] says otherwise. Does not touch the network; sets the
    /// process's [`NetworkTimeouts`] to the defaults unless [`set_network_timeouts`] came first.
    pub fn open(url: &str, state_dir: &Path, credentials: Credentials) -> Result<Source, SourceError> {
        set_network_timeouts(NetworkTimeouts::default());
        let state =
            |e: &dyn std::fmt::Display| SourceError::State { path: state_dir.to_path_buf(), message: e.to_string() };
        std::fs::create_dir_all(state_dir).map_err(|e| state(&e))?;
        let path = state_dir.join("mirror.git");
        let mirror = if path.exists() { Repository::open_bare(&path) } else { Repository::init_bare(&path) }
            .map_err(|e| state(&e))?;
        let url = normalize_url(url);
        Ok(Source {
            shown_url: redact_userinfo(&url),
            url,
            branch: "main".to_string(),
            state_dir: state_dir.to_path_buf(),
            mirror,
            credentials,
            retry: RetryPolicy::default(),
            limits: FetchLimits::default(),
            refused: BTreeMap::new(),
            stats: SourceStats::default(),
            notes: NotesSchedule::default(),
            heartbeats: false,
        })
    }

    pub fn with_branch(mut self, branch: impl Into<String>) -> Self {
        self.branch = branch.into();
        self
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn with_limits(mut self, limits: FetchLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Also mirror every cluster's heartbeat ref (same names locally, force-updated and pruned),
    /// fetched by [`Source::sync`] only when one moved: what `fleetgate status` reads liveness from.
    pub fn with_heartbeats(mut self) -> Self {
        self.heartbeats = true;
        self
    }

    /// How moved status notes are fetched (default [`NotesSchedule::All`]; the agent starts `Fresh`).
    pub fn with_notes(mut self, notes: NotesSchedule) -> Self {
        self.notes = notes;
        self
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn branch(&self) -> &str {
        &self.branch
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Where verification keeps its tag pins for this source.
    pub fn pins_path(&self) -> PathBuf {
        self.state_dir.join("tag-pins.json")
    }

    pub fn stats(&self) -> SourceStats {
        self.stats
    }

    /// When moved status notes are fetched; the agent renews its wait here each pass it waits.
    pub fn notes_schedule(&mut self) -> &mut NotesSchedule {
        &mut self.notes
    }

    fn branch_ref(&self) -> String {
        format!("refs/heads/{}", self.branch)
    }

    fn wanted(&self, name: &str) -> bool {
        name == self.branch_ref()
            || (name.starts_with("refs/tags/") && !name.ends_with("^{}"))
            || name.starts_with(NOTES_PREFIX)
            || (self.heartbeats && name.starts_with(HEARTBEAT_PREFIX))
    }

    fn callbacks(&self) -> RemoteCallbacks<'_> {
        self.credentials.callbacks(&self.url)
    }

    fn classify(&self, e: git2::Error, attempts: u32) -> SourceError {
        use git2::{ErrorClass as C, ErrorCode};
        let e = explain_refusal(e);
        // libgit2 and the HTTPS transport may quote the URL they were given, user info and all.
        let message = e.message().replace(&self.url, &self.shown_url);
        // A refused host is a configuration matter: retrying would only knock again. First: its
        // message says where credentials go, which is no authentication failure.
        if e.code() == ErrorCode::Certificate {
            return if self.url.starts_with("https://") || self.url.starts_with("http://") {
                SourceError::Certificate { url: self.shown_url.clone(), message }
            } else {
                SourceError::HostKey { url: self.shown_url.clone(), message }
            };
        }
        if e.code() == ErrorCode::Auth || message.contains("credentials") {
            return SourceError::Auth { url: self.shown_url.clone(), message };
        }
        match e.class() {
            C::Net | C::Ssh | C::Http | C::Ssl | C::Os => {
                SourceError::Network { url: self.shown_url.clone(), message, attempts }
            }
            _ => SourceError::Remote { url: self.shown_url.clone(), message },
        }
    }

    /// Runs `op` with retries on network errors.
    fn with_retries<T>(&mut self, mut op: impl FnMut(&mut Self) -> Result<T, git2::Error>) -> Result<T, SourceError> {
        let mut wait = self.retry.initial;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match op(self) {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let err = self.classify(e, attempt);
                    if !matches!(err, SourceError::Network { .. }) || attempt >= self.retry.attempts.max(1) {
                        return Err(err);
                    }
                    tracing::warn!(url = %self.shown_url, attempt, error = %err, "git network error, retrying in {wait:?}");
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(self.retry.max);
                }
            }
        }
    }

    /// Lists the remote's branch, tags and status notes (one connection, no objects transferred).
    pub fn ls_remote(&mut self) -> Result<RemoteRefs, SourceError> {
        self.with_retries(|s| {
            s.stats.ls_remotes += 1;
            let mut remote = s.mirror.remote_anonymous(&s.url)?;
            let proxy = access::no_libgit2_proxy();
            let conn = remote.connect_auth(Direction::Fetch, Some(s.callbacks()), Some(proxy))?;
            let refs =
                conn.list()?.iter().filter(|h| s.wanted(h.name())).map(|h| (h.name().to_string(), h.oid())).collect();
            Ok(RemoteRefs { refs })
        })
    }

    /// The mirror's view of the remote, named like [`Source::ls_remote`] names them (the
    /// remote's notes refs are kept under [`NOTES_TRACKING_PREFIX`]).
    pub fn local_refs(&self) -> Result<RemoteRefs, SourceError> {
        let mut refs = BTreeMap::new();
        for r in self.mirror.references()? {
            let r = r?;
            let (Ok(name), Some(oid)) = (r.name(), r.target()) else { continue };
            if let Some(cluster) = name.strip_prefix(NOTES_TRACKING_PREFIX) {
                refs.insert(format!("{NOTES_PREFIX}{cluster}"), oid);
            } else if self.wanted(name) && !name.starts_with(NOTES_PREFIX) {
                refs.insert(name.to_string(), oid);
            }
        }
        Ok(RemoteRefs { refs })
    }

    /// Fetches the branch, every tag and the status notes into the mirror in one go. The branch and tags
    /// are force-updated and pruned, so the mirror says what the remote says (a moved tag is
    /// caught by verification's pins, not here); notes go to [`NOTES_TRACKING_PREFIX`] and the
    /// local notes refs are fast-forwarded where they are behind. Aborted with
    /// [`SourceError::PackTooLarge`] past `max_pack_bytes` ([`Source::sync`] then fetches ref by ref).
    pub fn fetch(&mut self) -> Result<(), SourceError> {
        let specs = [self.branch_spec(), "+refs/tags/*:refs/tags/*".to_string(), Self::notes_spec()];
        self.fetch_specs(&specs, "the branch, tags and notes")?;
        self.fast_forward_notes()
    }

    fn branch_spec(&self) -> String {
        format!("+{0}:{0}", self.branch_ref())
    }

    fn notes_spec() -> String {
        format!("+{NOTES_PREFIX}*:{NOTES_TRACKING_PREFIX}*")
    }

    /// One bounded fetch of `specs` (pruning what they cover); `what` names them in errors.
    fn fetch_specs(&mut self, specs: &[String], what: &str) -> Result<(), SourceError> {
        let limit = self.limits.max_pack_bytes;
        // The callback runs inside libgit2; the last size it saw says why a fetch was aborted.
        let received = std::rc::Rc::new(std::cell::Cell::new(0u64));
        let result = self.with_retries(|s| {
            s.stats.fetches += 1;
            let mut remote = s.mirror.remote_anonymous(&s.url)?;
            let mut callbacks = s.callbacks();
            let seen = received.clone();
            callbacks.transfer_progress(move |p| {
                seen.set(p.received_bytes() as u64);
                p.received_bytes() as u64 <= limit
            });
            let mut opts = s.credentials.fetch_options(callbacks);
            opts.prune(FetchPrune::On).download_tags(AutotagOption::None).update_fetchhead(false);
            remote.fetch(specs, Some(&mut opts), Some("fleetgate fetch"))
        });
        match result {
            Err(_) if received.get() > limit => Err(SourceError::PackTooLarge {
                url: self.shown_url.clone(),
                what: what.to_string(),
                received: received.get(),
                limit,
            }),
            other => other,
        }
    }

    /// After a fetch of everything was too large: the branch and notes alone (an error if even
    /// they are too large), then each tag of `remote` (which lists no tag refused before) that
    /// differs from the mirror alone, leaving out (and returning) those too large by themselves.
    /// Tags the remote no longer has are deleted.
    fn fetch_ref_by_ref(&mut self, remote: &RemoteRefs) -> Result<Vec<RefusedRef>, SourceError> {
        let specs = [self.branch_spec(), Self::notes_spec()];
        self.fetch_specs(&specs, &format!("branch {} and the status notes", self.branch))?;
        self.fast_forward_notes()?;
        let local = self.local_refs()?;
        let mut refused = Vec::new();
        for (name, oid) in remote.refs.iter().filter(|(n, _)| n.starts_with("refs/tags/")) {
            if local.refs.get(name) == Some(oid) {
                continue;
            }
            match self.fetch_specs(&[format!("+{name}:{name}")], &format!("tag {}", &name["refs/tags/".len()..])) {
                Ok(()) => {}
                Err(e @ SourceError::PackTooLarge { .. }) => {
                    tracing::warn!(tag = %name, error = %e, "left a tag out of the mirror");
                    let r = RefusedRef { name: name.clone(), oid: *oid, reason: e.to_string() };
                    self.refused.insert(name.clone(), r.clone());
                    refused.push(r);
                }
                Err(e) => return Err(e),
            }
        }
        for name in local.refs.keys().filter(|n| n.starts_with("refs/tags/") && !remote.refs.contains_key(*n)) {
            self.mirror.find_reference(name)?.delete()?;
        }
        Ok(refused)
    }

    /// Moves each local notes ref to the remote's when it is absent or an ancestor of it; a local
    /// ref that is ahead or diverged keeps its unpushed notes.
    fn fast_forward_notes(&self) -> Result<(), SourceError> {
        for (cluster, theirs) in tracked_notes(&self.mirror)? {
            fast_forward_notes_ref(&self.mirror, &cluster, theirs)?;
        }
        Ok(())
    }

    /// Fetches the remote's ref `remote_ref` (a pull request's head, `refs/pull/7/head`) alone
    /// into [`PULL_HEAD_REF`] of the mirror, bounded like every fetch ([`FetchLimits`]); returns
    /// the commit it points to. The mirror's branch, tags and notes stay as they are; each call
    /// replaces the ref of the one before.
    pub fn fetch_pull_head(&mut self, remote_ref: &str) -> Result<Oid, SourceError> {
        let spec = format!("+{remote_ref}:{PULL_HEAD_REF}");
        self.fetch_specs(&[spec], &format!("ref {remote_ref}"))?;
        Ok(self.mirror.refname_to_id(PULL_HEAD_REF)?)
    }

    /// Lists the remote and fetches only when it differs from the mirror (tags refused earlier
    /// and unchanged since do not count as a difference).
    pub fn sync(&mut self) -> Result<SyncOutcome, SourceError> {
        let mut remote = self.ls_remote()?;
        let branch = self.branch_ref();
        if !remote.refs.contains_key(&branch) {
            return Err(SourceError::BranchNotFound { url: self.shown_url.clone(), branch: self.branch.clone() });
        }
        let tags = remote.refs.keys().filter(|n| n.starts_with("refs/tags/")).count();
        if tags > self.limits.max_tags {
            return Err(SourceError::TooManyTags {
                url: self.shown_url.clone(),
                count: tags,
                limit: self.limits.max_tags,
            });
        }
        self.refused.retain(|name, r| remote.refs.get(name) == Some(&r.oid));
        remote.refs.retain(|name, _| !self.refused.contains_key(name));
        let mut local = self.local_refs()?;
        // Heartbeats move every few minutes per cluster: they are compared and fetched on their
        // own, never taken for a moved release.
        let heartbeats_moved = take_heartbeats(&mut remote) != take_heartbeats(&mut local);
        let (remote_notes, remote_release) = split_notes(&remote);
        let (local_notes, local_release) = split_notes(&local);
        let release_moved = remote_release != local_release;
        let notes_moved: std::collections::BTreeSet<String> = remote_notes
            .iter()
            .filter(|(cluster, oid)| local_notes.get(*cluster) != Some(*oid))
            .chain(local_notes.iter().filter(|(cluster, _)| !remote_notes.contains_key(*cluster)))
            .map(|(cluster, _)| cluster.to_string())
            .collect();
        let notes_due = self.notes.due(&notes_moved, std::time::Instant::now());
        let mut refused = Vec::new();
        if release_moved {
            // Once a tag was refused, fetching everything would only be aborted again.
            let too_large = !self.refused.is_empty()
                || match self.fetch() {
                    Ok(()) => false,
                    Err(SourceError::PackTooLarge { .. }) => true,
                    Err(e) => return Err(e),
                };
            if too_large {
                refused = self.fetch_ref_by_ref(&remote)?;
            }
            self.notes.fetched();
        } else if notes_due {
            self.stats.notes_fetches += 1;
            self.fetch_specs(&[Self::notes_spec()], "the status notes")?;
            self.fast_forward_notes()?;
            self.notes.fetched();
        }
        if heartbeats_moved {
            self.fetch_specs(&[format!("+{HEARTBEAT_PREFIX}*:{HEARTBEAT_PREFIX}*")], "the heartbeats")?;
        }
        let tip = self.mirror.refname_to_id(&branch)?;
        let notes_only = !release_moved && notes_due;
        Ok(SyncOutcome { fetched: release_moved || notes_due, notes_only, tip, refused })
    }

    /// The mirror at its current state (call [`Source::sync`] first). Asking it for a tag that
    /// was left out as too large says so ([`SourceError::TagRefused`]) instead of "no such tag".
    pub fn checkout(&self) -> Result<Checkout, SourceError> {
        let repo = Repository::open_bare(self.mirror.path())?;
        let mut checkout = Checkout::new(repo, &self.branch, &self.url)?;
        checkout.refused = self
            .refused
            .values()
            .map(|r| (r.name.trim_start_matches("refs/tags/").to_string(), r.reason.clone()))
            .collect();
        Ok(checkout)
    }
}

/// Removes the heartbeat refs from `refs` and returns them.
fn take_heartbeats(refs: &mut RemoteRefs) -> BTreeMap<String, Oid> {
    let (beats, rest) =
        std::mem::take(&mut refs.refs).into_iter().partition(|(name, _)| name.starts_with(HEARTBEAT_PREFIX));
    refs.refs = rest;
    beats
}

/// `refs`' status notes by cluster, and the rest (branch and tags).
fn split_notes(refs: &RemoteRefs) -> (BTreeMap<&str, Oid>, BTreeMap<&str, Oid>) {
    let (notes, rest): (Vec<_>, Vec<_>) = refs.refs.iter().partition(|(name, _)| name.starts_with(NOTES_PREFIX));
    let notes = notes.into_iter().map(|(name, oid)| (&name[NOTES_PREFIX.len()..], *oid)).collect();
    (notes, rest.into_iter().map(|(name, oid)| (name.as_str(), *oid)).collect())
}

/// A tag as found in the repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagRef {
    pub name: String,
    /// The commit the tag (after peeling) points to.
    pub commit: Oid,
    /// The annotated tag object; None for a lightweight tag.
    pub object: Option<Oid>,
}

/// One state of the fleet repo: the tracked branch's tip, plus access to every tag and tree.
pub struct Checkout {
    repo: Repository,
    branch: String,
    tip: Oid,
    /// Tags the remote has that the mirror left out (too large to fetch): name → why.
    refused: BTreeMap<String, String>,
}

impl std::fmt::Debug for Checkout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkout").field("branch", &self.branch).field("tip", &self.tip).finish_non_exhaustive()
    }
}

impl Checkout {
    fn new(repo: Repository, branch: &str, origin: &str) -> Result<Checkout, SourceError> {
        let tip = match repo.refname_to_id(&format!("refs/heads/{branch}")) {
            Ok(oid) => oid,
            Err(e) if e.code() == git2::ErrorCode::NotFound => {
                return Err(SourceError::BranchNotFound { url: redact_userinfo(origin), branch: branch.to_string() });
            }
            Err(e) => return Err(e.into()),
        };
        let tip = repo.find_commit(tip)?.id();
        Ok(Checkout { repo, branch: branch.to_string(), tip, refused: BTreeMap::new() })
    }

    /// A checkout of an existing local repository (bare or not) without fetching: `branch`, or
    /// whatever `HEAD` points to when None.
    pub fn open_local(path: &Path, branch: Option<&str>) -> Result<Checkout, SourceError> {
        let repo = Repository::open(path)?;
        let origin = path.display().to_string();
        match branch {
            Some(b) => Checkout::new(repo, b, &origin),
            None => {
                let (tip, branch) = {
                    let head = repo.head()?;
                    (head.peel_to_commit()?.id(), head.shorthand().unwrap_or("HEAD").to_string())
                };
                Ok(Checkout { repo, branch, tip, refused: BTreeMap::new() })
            }
        }
    }

    /// A checkout of an existing local repository at commit `tip`, named `label` in messages:
    /// a pull request's head, which no local branch may name in a CI clone.
    pub fn open_local_at(path: &Path, label: &str, tip: Oid) -> Result<Checkout, SourceError> {
        let repo = Repository::open(path)?;
        let tip = repo.find_commit(tip)?.id();
        Ok(Checkout { repo, branch: label.to_string(), tip, refused: BTreeMap::new() })
    }

    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// The tracked branch's tip commit.
    pub fn tip(&self) -> Oid {
        self.tip
    }

    pub fn repo(&self) -> &Repository {
        &self.repo
    }

    /// The tree of the branch tip.
    pub fn tip_tree(&self) -> Result<GitTree<'_>, SourceError> {
        self.commit_tree(self.tip, &format!("{} at {}", self.branch, short(self.tip)))
    }

    /// The tree of any commit.
    pub fn commit_tree(&self, commit: Oid, label: &str) -> Result<GitTree<'_>, SourceError> {
        let tree = self.repo.find_commit(commit)?.tree()?;
        Ok(GitTree::new(&self.repo, tree, label))
    }

    /// The tree of the commit `tag` points to.
    pub fn tag_tree(&self, tag: &TagRef) -> Result<GitTree<'_>, SourceError> {
        self.commit_tree(tag.commit, &format!("tag {} ({})", tag.name, short(tag.commit)))
    }

    /// The tag `name`, if it exists (tags that do not point to a commit are skipped as absent);
    /// [`SourceError::TagRefused`] for a tag the source left out as too large to fetch.
    pub fn tag(&self, name: &str) -> Result<Option<TagRef>, SourceError> {
        if let Some(reason) = self.refused.get(name) {
            return Err(SourceError::TagRefused { tag: name.to_string(), reason: reason.clone() });
        }
        let r = match self.repo.find_reference(&format!("refs/tags/{name}")) {
            Ok(r) => r,
            Err(e) if matches!(e.code(), git2::ErrorCode::NotFound | git2::ErrorCode::InvalidSpec) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let Some(target) = r.target() else { return Ok(None) };
        let object = self.repo.find_object(target, None)?;
        let annotated = object.kind() == Some(git2::ObjectType::Tag);
        let Ok(commit) = object.peel_to_commit() else { return Ok(None) };
        Ok(Some(TagRef { name: name.to_string(), commit: commit.id(), object: annotated.then_some(target) }))
    }

    /// Every tag that points to a commit, by name.
    pub fn tags(&self) -> Result<Vec<TagRef>, SourceError> {
        let mut out = Vec::new();
        for name in self.repo.tag_names(None)?.iter() {
            let Some(name) = name? else { continue };
            if let Some(t) = self.tag(name)? {
                out.push(t);
            }
        }
        Ok(out)
    }

    /// The release tags, by name: tags on a commit that carries `release.yaml`, except approval
    /// tags ([`crate::model::is_approval_tag`]), which sit on the release's own commit. The one
    /// place that decides what counts as a release tag for the status view and `validate`.
    pub fn release_tags(&self) -> Result<Vec<TagRef>, SourceError> {
        let mut out = Vec::new();
        for tag in self.tags()? {
            if crate::model::is_approval_tag(&tag.name) {
                continue;
            }
            if self.repo.find_commit(tag.commit)?.tree()?.get_name(crate::model::RELEASE_FILE).is_some() {
                out.push(tag);
            }
        }
        Ok(out)
    }

    /// The raw bytes of an object (a tag object's header, message and signature).
    pub fn raw_object(&self, oid: Oid) -> Result<Vec<u8>, SourceError> {
        Ok(self.repo.odb()?.read(oid)?.data().to_vec())
    }

    /// The name a tag object records for itself (may differ from the ref pointing to it).
    pub fn tag_object_name(&self, oid: Oid) -> Result<String, SourceError> {
        Ok(self.repo.find_tag(oid)?.name()?.to_string())
    }

    /// Time of a tag: its tagger's time for an annotated tag, else its commit's time (seconds).
    pub fn tag_time(&self, tag: &TagRef) -> Result<i64, SourceError> {
        if let Some(o) = tag.object
            && let Some(tagger) = self.repo.find_tag(o)?.tagger()
        {
            return Ok(tagger.when().seconds());
        }
        Ok(self.repo.find_commit(tag.commit)?.time().seconds())
    }
}

/// A local repository read as it is, or a URL fetched into a temporary mirror that lives as long
/// as this value (the one-shot commands' way to a [`Checkout`]; the agent keeps a [`Source`]).
pub struct OpenedRepo {
    checkout: Checkout,
    /// Dropped after `checkout` (fields drop in order), which reads from it.
    _mirror: Option<tempfile::TempDir>,
}

impl OpenedRepo {
    pub fn checkout(&self) -> &Checkout {
        &self.checkout
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpenRepoError {
    #[error("{repo} is not a readable Git repository")]
    Local { repo: String, source: SourceError },
    #[error("creating a temporary mirror of {repo}")]
    Mirror { repo: String, source: std::io::Error },
    #[error("fetching {repo}")]
    Fetch { repo: String, source: SourceError },
}

/// Opens `repo`: an existing local path (its committed state on `branch`, default what `HEAD`
/// points to) or a URL mirrored with `credentials` (branch default `main`).
pub fn open_repo(repo: &str, branch: Option<&str>, credentials: Credentials) -> Result<OpenedRepo, OpenRepoError> {
    let path = Path::new(repo);
    if !repo.contains("://") && path.exists() {
        let checkout = Checkout::open_local(path, branch)
            .map_err(|source| OpenRepoError::Local { repo: repo.to_string(), source })?;
        return Ok(OpenedRepo { checkout, _mirror: None });
    }
    let mirror = tempfile::tempdir().map_err(|source| OpenRepoError::Mirror { repo: repo.to_string(), source })?;
    let fetch = |source| OpenRepoError::Fetch { repo: repo.to_string(), source };
    let mut source =
        Source::open(repo, mirror.path(), credentials).map_err(fetch)?.with_branch(branch.unwrap_or("main"));
    source.sync().map_err(fetch)?;
    Ok(OpenedRepo { checkout: source.checkout().map_err(fetch)?, _mirror: Some(mirror) })
}

/// The first 12 hex digits of an object id.
pub fn short(oid: Oid) -> String {
    oid.to_string()[..12].to_string()
}

#[cfg(test)]
mod tests {
    use super::Checkout;

    /// A release commit carries three tags: the release, its approval for a wave (on the same
    /// commit, so it sees the same `release.yaml`) and a lightweight alias; a commit without
    /// `release.yaml` carries a docs tag. Only the release and its alias are release tags.
    #[test]
    fn approval_tags_and_tags_without_release_yaml_are_not_releases() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let me = git2::Signature::now("Release Pipeline", "release@example.com").unwrap();
        let commit = |files: &[(&str, &str)], parent: Option<git2::Oid>| {
            let mut tree = repo.treebuilder(None).unwrap();
            for (name, text) in files {
                tree.insert(name, repo.blob(text.as_bytes()).unwrap(), 0o100644).unwrap();
            }
            let tree = repo.find_tree(tree.write().unwrap()).unwrap();
            let parents: Vec<git2::Commit> = parent.map(|p| repo.find_commit(p).unwrap()).into_iter().collect();
            let parents: Vec<&git2::Commit> = parents.iter().collect();
            repo.commit(Some("refs/heads/main"), &me, &me, "c", &tree, &parents).unwrap()
        };
        let release = commit(&[("release.yaml", "kind: Release\nmetadata:\n  name: rel-2\n")], None);
        let docs = commit(&[("README.md", "docs\n")], Some(release));
        let object = |oid| repo.find_object(oid, None).unwrap();
        repo.tag("rel-2", &object(release), &me, "rel-2", false).unwrap();
        repo.tag("approve/rel-2/prod", &object(release), &me, "CAB-1234", false).unwrap();
        repo.tag_lightweight("rel-2-alias", &object(release), false).unwrap();
        repo.tag("docs-1", &object(docs), &me, "docs", false).unwrap();

        let checkout = Checkout::open_local(dir.path(), Some("main")).unwrap();
        let names: Vec<String> = checkout.release_tags().unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["rel-2", "rel-2-alias"]);
        assert_eq!(checkout.tags().unwrap().len(), 4, "every tag is still a tag");
    }
}
