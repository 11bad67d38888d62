//! Forge backends: the same statuses, sent to a forge's commit-status API so they show next to the
//! commit and the pull request in its UI. Git notes stay the source of truth (see
//! [`super::Publisher`]); a forge is a mirror.
//!
//! Request shapes, as each forge documents them:
//! * GitHub — `POST {api}/repos/{owner}/{repo}/statuses/{sha}`, `Authorization: Bearer …`,
//!   `Accept: application/vnd.github+json`, `X-GitHub-Api-Version: 2022-11-28`, a `User-Agent`;
//!   body `state` (error|failure|pending|success), `target_url`, `description`, `context`.
//! * Gitea / Forgejo — `POST {url}/api/v1/repos/{owner}/{repo}/statuses/{sha}`,
//!   `Authorization: token …`; body as GitHub's (states pending|success|error|failure|warning).
//! * GitLab — `POST {url}/api/v4/projects/{id or URL-encoded path}/statuses/{sha}`,
//!   `PRIVATE-TOKEN: …`; body `state` (pending|running|success|failed|canceled), `name` (the
//!   context), `description`, `target_url`.
//!
//! Approvals of a promotion PR ([`ForgeBackend::approvals`]) are read from GitHub's
//! `GET /repos/{o}/{r}/commits/{sha}/pulls` and `…/pulls/{n}/reviews`, Gitea's
//! `GET /repos/{o}/{r}/pulls?state=all&sort=recentupdate` (the newest 50) and `…/pulls/{n}/reviews`, and GitLab's
//! `GET /projects/{id}/repository/commits/{sha}/merge_requests` and `…/merge_requests/{iid}/approvals`.
//! The same lookup finds the pull request `fleetgate plan --post` comments on
//! ([`ForgeBackend::upsert_comment`]: `issues/{n}/comments` on GitHub and Gitea, `merge_requests/{iid}/notes`
//! on GitLab), next to its `fleetgate/plan` status ([`ForgeBackend::set_status`]). The open pull
//! requests an agent plans ([`ForgeBackend::open_pull_requests`]) are GitHub's and Gitea's
//! `GET /repos/{o}/{r}/pulls?state=open` and GitLab's `GET /projects/{id}/merge_requests?state=opened`;
//! whether a head carries the agent's plan already, `commits/{sha}/statuses`
//! ([`ForgeBackend::has_status`]).
//!
//! Descriptions are cut to 140 characters (GitHub's documented limit), for every forge alike.

use super::github_app::{self, GithubApp};
use super::model::{State, Status, truncate};
use crate::model::ForgeKind;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Longest description sent to a forge.
pub const MAX_DESCRIPTION: usize = 140;
/// Longest forge error message shown.
pub const MAX_ERROR_MESSAGE: usize = 300;
/// The GitHub REST API version requests are written against.
pub const GITHUB_API_VERSION: &str = "2022-11-28";
const TIMEOUT: Duration = Duration::from_secs(30);
/// How many recently updated Gitea pull requests are searched for a promotion's head.
const RECENT_PULLS: usize = 50;

/// The forge's name as people know it, for messages.
pub(crate) fn forge_name(kind: ForgeKind) -> &'static str {
    match kind {
        ForgeKind::Github => "GitHub",
        ForgeKind::Gitea => "Gitea",
        ForgeKind::Gitlab => "GitLab",
    }
}

/// The variable a forge token is read from when no token file is configured.
pub const FORGE_TOKEN_ENV: &str = "FLEETGATE_FORGE_TOKEN";

/// The forge as one source configures it, every field optional: the agent's flags and its config
/// file (`forge: {kind, url, repository, tokenFile, statusUrl}`, or `appId`, `appInstallationId` and
/// `appKeyFile` for a GitHub App instead of the token), or the flags of `fleetgate promote` /
/// `rollback --open-pr` / `plan --post`. Never the fleet repo: whoever can push to it could
/// otherwise send the token to an address of their choosing. The doc comments are the flags' help.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize, clap::Args)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ForgeSettings {
    /// The forge's kind: github, gitea (also Forgejo) or gitlab.
    #[arg(id = "forge_kind", long = "forge-kind", env = "FLEETGATE_FORGE_KIND", value_name = "KIND")]
    pub kind: Option<ForgeKind>,
    /// The forge's API base URL (https://api.github.com, https://gitea.example.com, https://gitlab.com).
    #[arg(id = "forge_url", long = "forge-url", env = "FLEETGATE_FORGE_URL", value_name = "URL")]
    pub url: Option<String>,
    /// The fleet repo on the forge: OWNER/REPO (GitHub, Gitea) or the project path or id (GitLab).
    #[arg(
        id = "forge_repository",
        long = "forge-repository",
        env = "FLEETGATE_FORGE_REPOSITORY",
        value_name = "REPOSITORY"
    )]
    pub repository: Option<String>,
    /// File holding the forge's API token [default: the token in $FLEETGATE_FORGE_TOKEN].
    #[arg(id = "forge_token_file", long = "forge-token-file", env = "FLEETGATE_FORGE_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// GitHub only, instead of a token: the id of a GitHub App installed on the repository; its
    /// installation tokens are minted from --forge-app-key-file and renewed before they expire.
    #[arg(id = "forge_app_id", long = "forge-app-id", env = "FLEETGATE_FORGE_APP_ID", value_name = "ID")]
    pub app_id: Option<u64>,
    /// The GitHub App's installation id [default: looked up from --forge-repository].
    #[arg(
        id = "forge_app_installation_id",
        long = "forge-app-installation-id",
        env = "FLEETGATE_FORGE_APP_INSTALLATION_ID",
        value_name = "ID"
    )]
    pub app_installation_id: Option<u64>,
    /// The GitHub App's private key (the PEM file GitHub generates); read at every renewal.
    #[arg(
        id = "forge_app_key_file",
        long = "forge-app-key-file",
        env = "FLEETGATE_FORGE_APP_KEY_FILE",
        value_name = "FILE"
    )]
    pub app_key_file: Option<PathBuf>,
    /// Agent: the details link of each forge status, `{cluster}` and `{release}` replaced, e.g.
    /// `https://grafana.example.com/d/fleet?var-cluster={cluster}&var-release={release}`
    /// (config file: `forge: {statusUrl}`).
    #[arg(id = "forge_status_url", long = "forge-status-url", env = "FLEETGATE_FORGE_STATUS_URL", value_name = "URL")]
    pub status_url: Option<String>,
}

impl ForgeSettings {
    /// No forge when nothing is set; else all of kind, URL and repository, and the token from
    /// its file or [`FORGE_TOKEN_ENV`], or a GitHub App (id and key; the installation optional).
    ///
    /// # Errors
    /// [`ForgeError::Incomplete`] naming the first missing flag, [`ForgeError::AppSettings`] for a
    /// GitHub App given in part, beside a token file, or for another forge.
    pub fn resolve(self) -> Result<Option<ForgeConfig>, ForgeError> {
        if self == ForgeSettings::default() {
            return Ok(None);
        }
        let missing = |flag| ForgeError::Incomplete { missing: flag };
        let kind = self.kind.ok_or(missing("--forge-kind"))?;
        let app = |reason: &'static str| ForgeError::AppSettings { reason };
        let token = match (self.token_file, self.app_id, self.app_key_file) {
            (None, None, None) if self.app_installation_id.is_some() => {
                return Err(app("--forge-app-installation-id needs --forge-app-id and --forge-app-key-file"));
            }
            (None, None, None) => TokenSource::Env(FORGE_TOKEN_ENV.to_string()),
            (Some(path), None, None) if self.app_installation_id.is_none() => TokenSource::File(path),
            (Some(_), _, _) => {
                return Err(app(
                    "give either --forge-token-file or a GitHub App (--forge-app-id, --forge-app-key-file), not both",
                ));
            }
            (None, Some(_), Some(_)) if kind != ForgeKind::Github => {
                return Err(app("--forge-app-id is for --forge-kind github; Gitea and GitLab take --forge-token-file"));
            }
            (None, Some(app_id), Some(private_key_file)) => TokenSource::GithubApp(GithubApp {
                app_id,
                installation_id: self.app_installation_id,
                private_key_file,
            }),
            (None, None, Some(_)) => return Err(app("--forge-app-key-file needs --forge-app-id")),
            (None, Some(_), None) => {
                return Err(app("--forge-app-id needs --forge-app-key-file, the app's private key"));
            }
        };
        Ok(Some(ForgeConfig {
            kind,
            url: self.url.ok_or(missing("--forge-url"))?,
            repository: self.repository.ok_or(missing("--forge-repository"))?,
            token,
            status_url: self.status_url.as_deref().map(StatusUrl::parse).transpose()?,
        }))
    }
}

/// A complete forge configuration: where statuses are mirrored and pull requests opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForgeConfig {
    pub kind: ForgeKind,
    pub url: String,
    pub repository: String,
    pub token: TokenSource,
    /// Where each status's details link leads (agent only; `None`: no link).
    pub status_url: Option<StatusUrl>,
}

/// The details link of a forge status (`target_url`): a page about one cluster and release —
/// a dashboard, the agent's logs — with `{cluster}` and `{release}` replaced. The agent's own
/// setting like the rest of the forge's: the fleet repo cannot point people's clicks elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusUrl(String);

impl StatusUrl {
    /// Accepts only http(s) templates, so the forge's link can only open a web page.
    pub fn parse(template: &str) -> Result<StatusUrl, ForgeError> {
        if !(template.starts_with("https://") || template.starts_with("http://")) {
            return Err(ForgeError::StatusUrl(template.to_string()));
        }
        Ok(StatusUrl(template.to_string()))
    }

    /// The link for `cluster` and `release`, each percent-encoded as a path segment (a tag name
    /// may hold `/`).
    pub fn fill(&self, cluster: &str, release: &str) -> String {
        self.0.replace("{cluster}", &encode_path_segment(cluster)).replace("{release}", &encode_path_segment(release))
    }
}

/// Where a token came from, so errors can say which one to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    File(PathBuf),
    Env(String),
    Given,
    /// Installation tokens minted for a GitHub App ([`super::github_app`]).
    GithubApp(GithubApp),
}

impl fmt::Display for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenSource::File(p) => write!(f, "token file {}", p.display()),
            TokenSource::Env(v) => write!(f, "environment variable {v}"),
            TokenSource::Given => f.write_str("the token given to fleetgate"),
            TokenSource::GithubApp(app) => write!(f, "the installation token of GitHub App {}", app.app_id),
        }
    }
}

/// An API token; its `Debug` never shows the secret.
#[derive(Clone)]
pub struct Token {
    secret: String,
    source: TokenSource,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token(from {})", self.source)
    }
}

impl Token {
    pub fn new(secret: impl Into<String>) -> Token {
        Token { secret: secret.into(), source: TokenSource::Given }
    }

    /// The secret itself, for the request that carries it.
    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }

    /// The token of `forge` now: read from its file or variable (trimmed; an empty one is an
    /// error), or a GitHub App's installation token ([`github_app::installation_token`]).
    pub async fn obtain(forge: &ForgeConfig) -> Result<Token, ForgeError> {
        let name = forge_name(forge.kind);
        let unreadable =
            |reason: String| ForgeError::TokenUnreadable { forge: name, source_name: forge.token.to_string(), reason };
        let secret = match &forge.token {
            TokenSource::GithubApp(app) => github_app::installation_token(&forge.url, &forge.repository, app).await?,
            TokenSource::File(path) => std::fs::read_to_string(path).map_err(|e| unreadable(e.to_string()))?,
            TokenSource::Env(var) => std::env::var(var).map_err(|e| match e {
                std::env::VarError::NotPresent => ForgeError::TokenEnvUnset { forge: name, var: var.clone() },
                e => unreadable(e.to_string()),
            })?,
            TokenSource::Given => return Err(unreadable("no token was given".into())),
        };
        let secret = secret.trim().to_string();
        if secret.is_empty() {
            return Err(unreadable("it is empty".into()));
        }
        Ok(Token { secret, source: forge.token.clone() })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    #[error(
        "the forge is configured only in part: {missing} is missing (a forge needs --forge-kind, --forge-url and \
         --forge-repository, and a token from --forge-token-file or ${FORGE_TOKEN_ENV})"
    )]
    Incomplete { missing: &'static str },
    #[error("status URL template {0:?}: must start with https:// or http://")]
    StatusUrl(String),
    #[error("GitHub App settings: {reason}")]
    AppSettings { reason: &'static str },
    #[error("GitHub App private key {file}: {reason}")]
    AppKey { file: PathBuf, reason: String },
    #[error(
        "GitHub refused the JWT of GitHub App {app_id} (401: {message}); check --forge-app-id, that the private key \
         is this app's, and this machine's clock"
    )]
    AppRejected { app_id: u64, message: String },
    #[error(
        "GitHub App {app_id} has no installation {} (404: {message}); install the app on {repository}{}",
        installation.map_or_else(|| format!("on {repository}"), |i| i.to_string()),
        if installation.is_some() { " and check --forge-app-installation-id" } else { "" }
    )]
    AppNotInstalled { app_id: u64, installation: Option<u64>, repository: String, message: String },
    #[error("{forge} token: no --forge-token-file given and ${var} is not set; export the {forge} API token there")]
    TokenEnvUnset { forge: &'static str, var: String },
    #[error("{forge} token: cannot read {source_name}: {reason}")]
    TokenUnreadable { forge: &'static str, source_name: String, reason: String },
    #[error("{forge} repository {repository:?} must be {expected}")]
    InvalidRepository { forge: &'static str, repository: String, expected: &'static str },
    #[error("{forge} API URL {url:?} is not an http(s) URL")]
    InvalidUrl { forge: &'static str, url: String },
    #[error("{forge} rejected the token from {token} (401: {message}); check that it is valid and not expired")]
    Unauthorized { forge: &'static str, token: TokenSource, message: String },
    #[error(
        "{forge} refused the request (403: {message}); the token needs permission to write commit statuses on {repository}"
    )]
    Forbidden { forge: &'static str, repository: String, message: String },
    #[error(
        "{forge} found no repository {repository} or commit {sha} (404: {message}); check --forge-repository, \
         that the commit was pushed there, and that the token can see the repository"
    )]
    NotFound { forge: &'static str, repository: String, sha: String, message: String },
    #[error("{forge} rejected the status ({status}: {message})")]
    Rejected { forge: &'static str, status: u16, message: String },
    #[error("{forge} rate limit reached ({status}: {message}); {}", retry_hint(.retry_after, .reset_at))]
    RateLimited {
        forge: &'static str,
        status: u16,
        message: String,
        /// From `Retry-After`.
        retry_after: Option<Duration>,
        /// From `X-RateLimit-Reset` / `RateLimit-Reset` (UTC epoch seconds).
        reset_at: Option<chrono::DateTime<chrono::Utc>>,
    },
    #[error("{forge} answered {status}: {message}")]
    Unexpected { forge: &'static str, status: u16, message: String },
    /// `source` has its URL stripped ([`reqwest::Error::without_url`]): `url` says where, once.
    #[error("{forge} at {url}")]
    Transport { forge: &'static str, url: String, source: reqwest::Error },
}

fn retry_hint(retry_after: &Option<Duration>, reset_at: &Option<chrono::DateTime<chrono::Utc>>) -> String {
    match (retry_after, reset_at) {
        (Some(d), _) => format!("retry after {} s", d.as_secs()),
        (None, Some(t)) => format!("the limit resets at {}", t.format("%Y-%m-%d %H:%M:%S UTC")),
        (None, None) => "retry in a minute or more".to_string(),
    }
}

/// One request a forge backend sends: built by a pure function so its shape is testable alone.
#[derive(Debug, Clone, PartialEq)]
pub struct ForgeRequest {
    pub url: String,
    /// Header name (lowercase) and value, secrets included.
    pub headers: Vec<(&'static str, String)>,
    pub body: Value,
}

/// A forge's commit-status API for one repository.
#[derive(Debug, Clone)]
pub struct ForgeBackend {
    kind: ForgeKind,
    api: String,
    repository: String,
    token: Token,
    client: reqwest::Client,
    status_url: Option<StatusUrl>,
}

impl ForgeBackend {
    /// `url` as in [`ForgeSettings::url`]: the GitHub API root (`https://api.github.com`, or
    /// `https://HOST/api/v3` for GitHub Enterprise Server), or the Gitea/GitLab server root.
    pub fn new(kind: ForgeKind, url: &str, repository: &str, token: Token) -> Result<ForgeBackend, ForgeError> {
        let forge = forge_name(kind);
        let url = url.trim_end_matches('/');
        if !(url.starts_with("http://") || url.starts_with("https://")) || reqwest::Url::parse(url).is_err() {
            return Err(ForgeError::InvalidUrl { forge, url: url.to_string() });
        }
        let api = match kind {
            ForgeKind::Github => url.to_string(),
            ForgeKind::Gitea if url.ends_with("/api/v1") => url.to_string(),
            ForgeKind::Gitea => format!("{url}/api/v1"),
            ForgeKind::Gitlab if url.ends_with("/api/v4") => url.to_string(),
            ForgeKind::Gitlab => format!("{url}/api/v4"),
        };
        let valid_segment =
            |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        let ok = match kind {
            ForgeKind::Github | ForgeKind::Gitea => {
                repository.split('/').count() == 2 && repository.split('/').all(valid_segment)
            }
            ForgeKind::Gitlab => repository.split('/').all(valid_segment),
        };
        if !ok {
            let expected = match kind {
                ForgeKind::Gitlab => "a project id or path like group/subgroup/project",
                _ => "owner/repo",
            };
            return Err(ForgeError::InvalidRepository { forge, repository: repository.to_string(), expected });
        }
        let client = api_client(forge, &api)?;
        Ok(ForgeBackend { kind, api, repository: repository.to_string(), token, client, status_url: None })
    }

    /// A backend for `forge`, its token obtained now (so a rotated Secret is picked up by the
    /// next one, and a GitHub App's token is fresh).
    pub async fn from_config(forge: &ForgeConfig) -> Result<ForgeBackend, ForgeError> {
        let backend = ForgeBackend::new(forge.kind, &forge.url, &forge.repository, Token::obtain(forge).await?)?;
        Ok(match &forge.status_url {
            Some(url) => backend.with_status_url(url.clone()),
            None => backend,
        })
    }

    /// Statuses without a link of their own get one from `url`.
    pub fn with_status_url(mut self, url: StatusUrl) -> ForgeBackend {
        self.status_url = Some(url);
        self
    }

    pub fn kind(&self) -> ForgeKind {
        self.kind
    }

    /// The exact request [`send`](Self::send) makes for `status`.
    pub fn request(&self, status: &Status) -> ForgeRequest {
        let gitlab = gitlab_state(status.state, status.started_at.is_some() || status.applied_at.is_some());
        // The status's own link, else the agent's statusUrl for this cluster and release.
        let link = status
            .target_url
            .clone()
            .or_else(|| Some(self.status_url.as_ref()?.fill(&status.cluster, &status.release)));
        self.status_request(
            &status.commit,
            &status.context(),
            (status.state.as_str(), gitlab),
            &status.description,
            link.as_deref(),
        )
    }

    /// A commit-status request; the state as GitHub and Gitea name it, then as GitLab does.
    fn status_request(
        &self,
        sha: &str,
        context: &str,
        (state, gitlab): (&str, &str),
        description: &str,
        target_url: Option<&str>,
    ) -> ForgeRequest {
        let description = truncate(description, MAX_DESCRIPTION);
        let mut headers = self.auth_headers();
        let (url, mut body) = match self.kind {
            ForgeKind::Github | ForgeKind::Gitea => (
                format!("{}/repos/{}/statuses/{sha}", self.api, self.repository),
                json!({"state": state, "description": description, "context": context}),
            ),
            ForgeKind::Gitlab => (
                format!("{}/projects/{}/statuses/{sha}", self.api, encode_path_segment(&self.repository)),
                json!({"state": gitlab, "name": context, "description": description}),
            ),
        };
        headers.push(("user-agent", user_agent()));
        headers.push(("content-type", "application/json".to_string()));
        if let Some(url) = target_url {
            body["target_url"] = Value::String(url.to_string());
        }
        ForgeRequest { url, headers, body }
    }

    /// Sends `status` to the forge.
    ///
    /// # Errors
    /// One variant per documented failure: [`ForgeError::Unauthorized`] (401),
    /// [`ForgeError::Forbidden`] (403), [`ForgeError::NotFound`] (404), [`ForgeError::Rejected`]
    /// (400/422), [`ForgeError::RateLimited`] (403/429 with rate-limit headers, or 429), else
    /// [`ForgeError::Unexpected`] or [`ForgeError::Transport`].
    pub async fn send(&self, status: &Status) -> Result<(), ForgeError> {
        self.post(self.request(status), &status.commit).await
    }

    /// Sets commit status `context` (not a cluster's: `fleetgate/plan`) on commit `sha`.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub async fn set_status(
        &self,
        sha: &str,
        context: &str,
        state: State,
        description: &str,
    ) -> Result<(), ForgeError> {
        let req = self.status_request(sha, context, (state.as_str(), gitlab_state(state, false)), description, None);
        self.post(req, sha).await
    }

    async fn post(&self, req: ForgeRequest, sha: &str) -> Result<(), ForgeError> {
        let mut builder = self.client.post(&req.url).json(&req.body);
        for (name, value) in &req.headers {
            builder = builder.header(*name, value);
        }
        self.exchange(builder, &req.url, sha).await.map(drop)
    }

    /// The open or closed pull (merge) requests whose head is commit `head`, into branch `base`
    /// when given: GitHub's `commits/{sha}/pulls`, Gitea's [`RECENT_PULLS`] most recently
    /// updated, GitLab's `commits/{sha}/merge_requests` (whose head is still `head`).
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub async fn pull_requests(&self, head: &str, base: Option<&str>) -> Result<Vec<u64>, ForgeError> {
        let (api, repo) = (&self.api, &self.repository);
        let into_base = |v: &Value| base.is_none_or(|b| v == b);
        let (listed, head_of, base_of, number_of): (Value, &[&str], &[&str], &str) = match self.kind {
            ForgeKind::Github => (
                self.get(&format!("{api}/repos/{repo}/commits/{head}/pulls"), head).await?,
                &[],
                &["base", "ref"],
                "number",
            ),
            ForgeKind::Gitea => {
                // Gitea finds a commit's pull request by its merge commit only: look for the head
                // among the recently updated ones, merged or not.
                let recent = format!("{api}/repos/{repo}/pulls?state=all&sort=recentupdate&limit={RECENT_PULLS}");
                (self.get(&recent, head).await?, &["head", "sha"], &["base", "ref"], "number")
            }
            ForgeKind::Gitlab => {
                let project = encode_path_segment(repo);
                let url = format!("{api}/projects/{project}/repository/commits/{head}/merge_requests");
                // GitLab lists every request that ever contained the commit; only one whose head is still it counts.
                (self.get(&url, head).await?, &["sha"], &["target_branch"], "iid")
            }
        };
        let at = |v: &Value, path: &[&str]| path.iter().fold(v.clone(), |v, k| v[*k].clone());
        Ok(listed
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| head_of.is_empty() || at(p, head_of) == head)
            .filter(|p| into_base(&at(p, base_of)))
            .filter_map(|p| p[number_of].as_u64())
            .collect())
    }

    /// The open pull (merge) requests into branch `base`, the most recently updated first, at
    /// most [`RECENT_PULLS`]: each with its head commit and the ref its head is fetched from
    /// (`refs/pull/N/head` on GitHub and Gitea, `refs/merge-requests/IID/head` on GitLab: the
    /// forge keeps it in the base repository, for pull requests from forks too). GitHub's
    /// `pulls?state=open&base=…&sort=updated`, Gitea's `pulls?state=open&sort=recentupdate`,
    /// GitLab's `merge_requests?state=opened&target_branch=…&order_by=updated_at`.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub async fn open_pull_requests(&self, base: &str) -> Result<Vec<OpenPull>, ForgeError> {
        let (api, repo) = (&self.api, &self.repository);
        let base_q = encode_path_segment(base);
        let what = format!("open pull requests into {base}");
        let (listed, number_of, head_of, base_of): (Value, &str, &[&str], &[&str]) = match self.kind {
            ForgeKind::Github => {
                let url = format!(
                    "{api}/repos/{repo}/pulls?state=open&base={base_q}&sort=updated&direction=desc&per_page={RECENT_PULLS}"
                );
                (self.get(&url, &what).await?, "number", &["head", "sha"], &["base", "ref"])
            }
            ForgeKind::Gitea => {
                let url = format!("{api}/repos/{repo}/pulls?state=open&sort=recentupdate&limit={RECENT_PULLS}");
                (self.get(&url, &what).await?, "number", &["head", "sha"], &["base", "ref"])
            }
            ForgeKind::Gitlab => {
                let project = encode_path_segment(repo);
                let url = format!(
                    "{api}/projects/{project}/merge_requests?state=opened&target_branch={base_q}&order_by=updated_at&per_page={RECENT_PULLS}"
                );
                (self.get(&url, &what).await?, "iid", &["sha"], &["target_branch"])
            }
        };
        let at = |v: &Value, path: &[&str]| path.iter().fold(v.clone(), |v, k| v[*k].clone());
        Ok(listed
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| at(p, base_of) == base)
            .filter_map(|p| {
                let number = p[number_of].as_u64()?;
                let head = at(p, head_of).as_str()?.to_string();
                let git_ref = match self.kind {
                    ForgeKind::Gitlab => format!("refs/merge-requests/{number}/head"),
                    _ => format!("refs/pull/{number}/head"),
                };
                Some(OpenPull { number, head, git_ref })
            })
            .take(RECENT_PULLS)
            .collect())
    }

    /// Whether commit `sha` carries a status of `context` already (whatever its state): GitHub's
    /// and Gitea's `commits/{sha}/statuses`, GitLab's `repository/commits/{sha}/statuses?name=…`.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub async fn has_status(&self, sha: &str, context: &str) -> Result<bool, ForgeError> {
        let (api, repo) = (&self.api, &self.repository);
        let (url, name) = match self.kind {
            ForgeKind::Github => (format!("{api}/repos/{repo}/commits/{sha}/statuses?per_page=100"), "context"),
            ForgeKind::Gitea => (format!("{api}/repos/{repo}/commits/{sha}/statuses?limit=50"), "context"),
            ForgeKind::Gitlab => {
                let (project, context) = (encode_path_segment(repo), encode_path_segment(context));
                (format!("{api}/projects/{project}/repository/commits/{sha}/statuses?name={context}"), "name")
            }
        };
        let listed = self.get(&url, sha).await?;
        Ok(listed.as_array().into_iter().flatten().any(|s| s[name] == context))
    }

    /// Writes `body` as a comment of pull (merge) request `pull`: edits the comment that holds
    /// `marker` when there is one (so each run updates one comment instead of adding another),
    /// else adds a comment. GitHub and Gitea: `issues/{n}/comments` and `issues/comments/{id}`;
    /// GitLab: `merge_requests/{iid}/notes`. Returns the comment's id.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub async fn upsert_comment(&self, pull: u64, marker: &str, body: &str) -> Result<u64, ForgeError> {
        let (api, repo) = (&self.api, &self.repository);
        // Where the comments are listed, and the prefix of one comment's URL.
        let (list, one) = match self.kind {
            ForgeKind::Github | ForgeKind::Gitea => {
                (format!("{api}/repos/{repo}/issues/{pull}/comments"), format!("{api}/repos/{repo}/issues/comments"))
            }
            ForgeKind::Gitlab => {
                let notes = format!("{api}/projects/{}/merge_requests/{pull}/notes", encode_path_segment(repo));
                (notes.clone(), notes)
            }
        };
        let edit = |id: u64| format!("{one}/{id}");
        let what = format!("pull request {pull}");
        let existing = self.get(&list, &what).await?;
        let ours = existing
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["body"].as_str().is_some_and(|b| b.contains(marker)))
            .and_then(|c| c["id"].as_u64());
        let builder = match (ours, self.kind) {
            (Some(id), ForgeKind::Gitlab) => self.client.put(edit(id)),
            (Some(id), _) => self.client.patch(edit(id)),
            (None, _) => self.client.post(&list),
        };
        let builder = self.auth_headers().into_iter().fold(builder, |b, (name, value)| b.header(name, value));
        let (code, text) = self.exchange(builder.json(&json!({ "body": body })), &list, &what).await?;
        let answer: Value = serde_json::from_str(&text).unwrap_or_default();
        answer["id"].as_u64().or(ours).ok_or_else(|| ForgeError::Unexpected {
            forge: forge_name(self.kind),
            status: code.as_u16(),
            message: "the comment written has no id".to_string(),
        })
    }

    /// The approvals given on the pull (merge) requests whose head is `head` and whose target is
    /// `base` (the branch the agent tracks: an approval of a PR into another branch approves
    /// nothing here), each by a login the forge authenticated and given at that very head: an
    /// approval of an earlier head (content pushed since), a dismissed or stale one does not count.
    ///
    /// # Errors
    /// As [`send`](Self::send): the forge refused or could not be reached.
    pub async fn approvals(&self, head: &str, base: &str) -> Result<Vec<ForgeApproval>, ForgeError> {
        let (api, repo) = (&self.api, &self.repository);
        let mut out = Vec::new();
        for pull in self.pull_requests(head, Some(base)).await? {
            match self.kind {
                ForgeKind::Github | ForgeKind::Gitea => {
                    let found = self.get(&format!("{api}/repos/{repo}/pulls/{pull}/reviews"), head).await?;
                    for r in found.as_array().into_iter().flatten() {
                        let counts = r["state"] == "APPROVED"
                            && r["commit_id"] == head
                            && r["dismissed"] != true
                            && r["stale"] != true;
                        if let (true, Some(login)) = (counts, r["user"]["login"].as_str()) {
                            let body = r["body"].as_str().unwrap_or_default().to_string();
                            out.push(ForgeApproval { login: login.to_string(), pull, body });
                        }
                    }
                }
                ForgeKind::Gitlab => {
                    let project = encode_path_segment(repo);
                    let found =
                        self.get(&format!("{api}/projects/{project}/merge_requests/{pull}/approvals"), head).await?;
                    let logins = found["approved_by"].as_array().into_iter().flatten();
                    for login in logins.filter_map(|a| a["user"]["username"].as_str()) {
                        out.push(ForgeApproval { login: login.to_string(), pull, body: String::new() });
                    }
                }
            }
        }
        Ok(out)
    }

    /// A GET of the forge's API with its authorization; `sha` names the commit in a 404.
    async fn get(&self, url: &str, sha: &str) -> Result<Value, ForgeError> {
        let mut builder = self.client.get(url);
        for (name, value) in self.auth_headers() {
            builder = builder.header(name, value);
        }
        let (code, text) = self.exchange(builder, url, sha).await?;
        serde_json::from_str(&text).map_err(|e| ForgeError::Unexpected {
            forge: forge_name(self.kind),
            status: code.as_u16(),
            message: format!("an answer that is not JSON ({e})"),
        })
    }

    /// Sends one request to `url` and reads the answer: its status and body on success, else the
    /// refusal [`classify`](Self::classify) names.
    async fn exchange(
        &self,
        builder: reqwest::RequestBuilder,
        url: &str,
        sha: &str,
    ) -> Result<(StatusCode, String), ForgeError> {
        let forge = forge_name(self.kind);
        let transport = |source: reqwest::Error| ForgeError::Transport {
            forge,
            url: url.to_string(),
            source: source.without_url(),
        };
        let response = builder.send().await.map_err(transport)?;
        let code = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.map_err(transport)?;
        if code.is_success() { Ok((code, text)) } else { Err(self.classify(code, &headers, &text, sha)) }
    }

    /// The authorization (and content type) headers every request to this forge carries.
    fn auth_headers(&self) -> Vec<(&'static str, String)> {
        auth_headers(self.kind, &self.token.secret)
    }

    fn classify(&self, code: StatusCode, headers: &HeaderMap, body: &str, sha: &str) -> ForgeError {
        let forge = forge_name(self.kind);
        let message = error_message(body);
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
        let retry_after = header("retry-after").and_then(|v| v.parse::<u64>().ok()).map(Duration::from_secs);
        let remaining = header("x-ratelimit-remaining").or_else(|| header("ratelimit-remaining"));
        let reset_at = header("x-ratelimit-reset")
            .or_else(|| header("ratelimit-reset"))
            .and_then(|v| v.parse::<i64>().ok())
            .and_then(|secs| chrono::DateTime::from_timestamp(secs, 0));
        let rate_limited = code == StatusCode::TOO_MANY_REQUESTS
            || (code == StatusCode::FORBIDDEN && (remaining == Some("0") || retry_after.is_some()))
            || (code == StatusCode::FORBIDDEN && message.to_lowercase().contains("rate limit"));
        match code.as_u16() {
            _ if rate_limited => {
                ForgeError::RateLimited { forge, status: code.as_u16(), message, retry_after, reset_at }
            }
            401 => ForgeError::Unauthorized { forge, token: self.token.source.clone(), message },
            403 => ForgeError::Forbidden { forge, repository: self.repository.clone(), message },
            404 => ForgeError::NotFound { forge, repository: self.repository.clone(), sha: sha.to_string(), message },
            400 | 422 => ForgeError::Rejected { forge, status: code.as_u16(), message },
            other => ForgeError::Unexpected { forge, status: other, message },
        }
    }
}

/// The HTTP client of a forge's API: bounded in time, naming fleetgate (GitHub refuses requests
/// without a `User-Agent`), and following no redirect, which would carry the token to wherever
/// the answer points.
pub(crate) fn api_client(forge: &'static str, api: &str) -> Result<reqwest::Client, ForgeError> {
    crate::http::client_builder()
        .timeout(TIMEOUT)
        .user_agent(user_agent())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|source| ForgeError::Transport { forge, url: api.to_string(), source: source.without_url() })
}

/// The authorization (and content type) headers of a request with `token` to a forge of `kind`:
/// the commit-status mirror's and the pull requests' (`releng::forge_pr`).
pub(crate) fn auth_headers(kind: ForgeKind, token: &str) -> Vec<(&'static str, String)> {
    match kind {
        ForgeKind::Github => {
            [("authorization", format!("Bearer {token}"))].into_iter().chain(github_headers()).collect()
        }
        ForgeKind::Gitea => {
            vec![("authorization", format!("token {token}")), ("accept", "application/json".to_string())]
        }
        ForgeKind::Gitlab => vec![("private-token", token.to_string()), ("accept", "application/json".to_string())],
    }
}

fn user_agent() -> String {
    format!("fleetgate/{}", crate::VERSION)
}

/// The headers GitHub's REST API asks of every request, besides its authorization.
pub(crate) fn github_headers() -> [(&'static str, String); 2] {
    [("accept", "application/vnd.github+json".to_string()), ("x-github-api-version", GITHUB_API_VERSION.to_string())]
}

/// GitLab has no `error` or `failure`: both are `failed`. An agent at work (applying or baking:
/// `running`) is `running`; one waiting for its wave is `pending`.
fn gitlab_state(state: State, running: bool) -> &'static str {
    match state {
        State::Pending if running => "running",
        State::Pending | State::Unknown => "pending",
        State::Success => "success",
        State::Failure | State::Error => "failed",
    }
}

/// An approving review of a pull (merge) request: its author as the forge authenticated them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForgeApproval {
    pub login: String,
    /// The pull request's number (GitLab: the merge request's iid).
    pub pull: u64,
    /// The review's text (empty on GitLab, whose approvals carry none).
    pub body: String,
}

/// An open pull (merge) request, as [`ForgeBackend::open_pull_requests`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenPull {
    /// The pull request's number (GitLab: the merge request's iid).
    pub number: u64,
    /// Its head commit.
    pub head: String,
    /// The ref of the base repository its head can be fetched from.
    pub git_ref: String,
}

/// Percent-encodes everything but RFC 3986 unreserved characters (GitLab wants `group%2Fproject`).
fn encode_path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The forge's own words from an error body: `message` (a string, a list, or GitLab's field →
/// list), `error` / `error_description` (GitLab, OAuth), and `errors[]` (GitHub's objects — their
/// `message`, else `field code` — or Gitea's strings), joined with "; " and cut to
/// [`MAX_ERROR_MESSAGE`] characters. A body that is not the forge's JSON error (a proxy's HTML
/// page, anything else) is never echoed: these messages reach logs, Events and statuses.
pub(crate) fn error_message(body: &str) -> String {
    fn flatten(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) if !s.is_empty() => out.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|x| flatten(x, out)),
            Value::Object(o) => {
                if let Some(m) = o.get("message") {
                    flatten(m, out);
                } else if let Some(code) = o.get("code").and_then(Value::as_str) {
                    let field = o.get("field").and_then(Value::as_str).unwrap_or("?");
                    out.push(format!("{field} {code}"));
                } else {
                    for (k, x) in o {
                        let mut inner = Vec::new();
                        flatten(x, &mut inner);
                        out.extend(inner.into_iter().map(|s| format!("{k} {s}")));
                    }
                }
            }
            _ => {}
        }
    }
    let mut parts = Vec::new();
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        for key in ["message", "error", "error_description", "errors"] {
            if let Some(x) = v.get(key) {
                flatten(x, &mut parts);
            }
        }
    }
    parts.dedup();
    if parts.is_empty() {
        let what = if body.trim().is_empty() { "an empty body" } else { "a body that is not its JSON error" };
        format!("no error message ({what}, not shown)")
    } else {
        truncate(&parts.join("; "), MAX_ERROR_MESSAGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("group/sub/project", "group%2Fsub%2Fproject")]
    #[case("42", "42")]
    #[case("a.b_c-d~e", "a.b_c-d~e")]
    fn gitlab_project_paths_are_encoded(#[case] raw: &str, #[case] encoded: &str) {
        assert_eq!(encode_path_segment(raw), encoded);
    }

    #[rstest]
    #[case(ForgeKind::Github)]
    #[case(ForgeKind::Gitea)]
    #[case(ForgeKind::Gitlab)]
    fn the_status_url_template_fills_each_forges_details_link(#[case] kind: ForgeKind) {
        let url = StatusUrl::parse("https://grafana.example.com/d/fleet?var-cluster={cluster}&var-release={release}")
            .unwrap();
        let backend = ForgeBackend::new(kind, "https://forge.example.com", "o/r", Token::new("t")).unwrap();
        let status = Status::new("cluster-a", "rel/2", "c0ffee", State::Failure, "rolled back");
        assert!(backend.request(&status).body.get("target_url").is_none(), "no template, no link");
        let backend = backend.with_status_url(url);
        let body = backend.request(&status).body;
        assert_eq!(body["target_url"], "https://grafana.example.com/d/fleet?var-cluster=cluster-a&var-release=rel%2F2");
        // A link the status carries itself wins.
        let own = status.with_target_url("https://example.com/own");
        assert_eq!(backend.request(&own).body["target_url"], "https://example.com/own");
        assert!(matches!(StatusUrl::parse("javascript:alert(1)//{cluster}"), Err(ForgeError::StatusUrl(_))));
    }

    #[rstest]
    #[case(State::Pending, false, "pending")]
    #[case(State::Pending, true, "running")]
    #[case(State::Success, false, "success")]
    #[case(State::Failure, false, "failed")]
    #[case(State::Error, false, "failed")]
    fn gitlab_states_map(#[case] state: State, #[case] started: bool, #[case] expected: &str) {
        let mut s = Status::new("a", "r", "c", state, "d");
        if started {
            s = s.started(chrono::Utc::now());
        }
        assert_eq!(gitlab_state(s.state, s.started_at.is_some()), expected);
    }

    #[rstest]
    #[case(r#"{"message":"Bad credentials","documentation_url":"https://docs"}"#, "Bad credentials")]
    #[case(
        r#"{"message":"Validation Failed","errors":[{"resource":"Status","field":"state","code":"invalid"}]}"#,
        "Validation Failed; state invalid"
    )]
    #[case(r#"{"message":"Validation Failed","errors":[{"resource":"Status","code":"custom","message":"This SHA and context has reached the maximum number of statuses."}]}"#, "Validation Failed; This SHA and context has reached the maximum number of statuses.")]
    #[case(r#"{"message":"Validation Failed","errors":[{"resource":"PullRequest","code":"custom","message":"A pull request already exists for acme:promote/x."}]}"#,
           "Validation Failed; A pull request already exists for acme:promote/x.")]
    #[case(
        r#"{"errors":["repository does not exist"],"message":"The target couldn't be found."}"#,
        "The target couldn't be found.; repository does not exist"
    )]
    #[case(r#"{"message":"[State]: Required","url":"https://gitea/api/swagger"}"#, "[State]: Required")]
    #[case(r#"{"error":"state does not have a valid value"}"#, "state does not have a valid value")]
    #[case(
        r#"{"message":["Another open merge request already exists for this source branch: !7"]}"#,
        "Another open merge request already exists for this source branch: !7"
    )]
    #[case(r#"{"message":{"name":["is too long"]}}"#, "name is too long")]
    #[case(
        r#"{"error":"insufficient_scope","error_description":"The request requires higher privileges."}"#,
        "insufficient_scope; The request requires higher privileges."
    )]
    #[case("<html>bad gateway</html>", "no error message (a body that is not its JSON error, not shown)")]
    #[case("Retry later token=s3cret\n", "no error message (a body that is not its JSON error, not shown)")]
    #[case("", "no error message (an empty body, not shown)")]
    fn error_messages_come_from_the_forge(#[case] body: &str, #[case] expected: &str) {
        assert_eq!(error_message(body), expected);
    }

    #[test]
    fn repositories_and_urls_are_checked() {
        let t = || Token::new("t");
        assert!(matches!(
            ForgeBackend::new(ForgeKind::Github, "https://api.github.com", "just-a-name", t()),
            Err(ForgeError::InvalidRepository { .. })
        ));
        assert!(matches!(
            ForgeBackend::new(ForgeKind::Gitea, "gitea.example.com", "o/r", t()),
            Err(ForgeError::InvalidUrl { .. })
        ));
        assert!(ForgeBackend::new(ForgeKind::Gitlab, "https://gitlab.com/", "g/s/p", t()).is_ok());
    }

    #[test]
    fn long_forge_messages_are_cut() {
        let body = serde_json::json!({ "message": "x".repeat(5000) }).to_string();
        assert!(error_message(&body).chars().count() <= MAX_ERROR_MESSAGE);
    }

    #[tokio::test]
    async fn transport_errors_name_the_url_once_and_never_the_query() {
        let backend = ForgeBackend::new(ForgeKind::Gitea, "http://127.0.0.1:9", "o/r", Token::new("s3cret")).unwrap();
        let err = backend.send(&Status::new("c", "r", "deadbeef", State::Success, "d")).await.unwrap_err();
        let chain = crate::model::error_chain(&err);
        assert_eq!(chain.matches("127.0.0.1:9").count(), 1, "{chain}");
        assert!(!chain.contains("s3cret"), "{chain}");
    }

    #[rstest]
    #[case::nothing(ForgeSettings::default(), Ok(None))]
    #[case::no_url(ForgeSettings { kind: Some(ForgeKind::Github), repository: Some("o/r".into()), ..Default::default() }, Err("--forge-url is missing"))]
    #[case::token_from_env(
        ForgeSettings { kind: Some(ForgeKind::Gitea), url: Some("https://g".into()), repository: Some("o/r".into()), ..Default::default() },
        Ok(Some(TokenSource::Env(FORGE_TOKEN_ENV.into())))
    )]
    #[case::token_from_file(
        ForgeSettings { kind: Some(ForgeKind::Gitea), url: Some("https://g".into()), repository: Some("o/r".into()), token_file: Some("/t".into()), ..Default::default() },
        Ok(Some(TokenSource::File("/t".into())))
    )]
    #[case::github_app(
        ForgeSettings { kind: Some(ForgeKind::Github), url: Some("https://api.github.com".into()), repository: Some("o/r".into()), app_id: Some(7), app_key_file: Some("/k.pem".into()), ..Default::default() },
        Ok(Some(TokenSource::GithubApp(GithubApp { app_id: 7, installation_id: None, private_key_file: "/k.pem".into() })))
    )]
    #[case::app_and_token(
        ForgeSettings { kind: Some(ForgeKind::Github), url: Some("https://g".into()), repository: Some("o/r".into()), token_file: Some("/t".into()), app_id: Some(7), app_key_file: Some("/k".into()), ..Default::default() },
        Err("not both")
    )]
    #[case::app_on_gitea(
        ForgeSettings { kind: Some(ForgeKind::Gitea), url: Some("https://g".into()), repository: Some("o/r".into()), app_id: Some(7), app_key_file: Some("/k".into()), ..Default::default() },
        Err("--forge-app-id is for --forge-kind github")
    )]
    #[case::app_without_key(
        ForgeSettings { kind: Some(ForgeKind::Github), url: Some("https://g".into()), repository: Some("o/r".into()), app_id: Some(7), ..Default::default() },
        Err("--forge-app-id needs --forge-app-key-file")
    )]
    #[case::installation_alone(
        ForgeSettings { kind: Some(ForgeKind::Github), url: Some("https://g".into()), repository: Some("o/r".into()), app_installation_id: Some(9), ..Default::default() },
        Err("--forge-app-installation-id needs --forge-app-id")
    )]
    fn settings_resolve_whole_or_say_what_is_missing(
        #[case] settings: ForgeSettings,
        #[case] want: Result<Option<TokenSource>, &str>,
    ) {
        match (settings.resolve(), want) {
            (Ok(got), Ok(want)) => assert_eq!(got.map(|f| f.token), want),
            (Err(e), Err(want)) => assert!(e.to_string().contains(want), "{e}"),
            (got, want) => panic!("{got:?} vs {want:?}"),
        }
    }

    #[test]
    fn tokens_are_never_printed() {
        assert_eq!(format!("{:?}", Token::new("s3cret")), "Token(from the token given to fleetgate)");
    }
}
