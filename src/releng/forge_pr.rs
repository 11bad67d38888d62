//! Opening the pull request (GitHub, Gitea/Forgejo) or merge request (GitLab) for a promotion or
//! rollback branch, through the forge the person running the command configures
//! (`--forge-kind`, `--forge-url`, `--forge-repository`, token from `--forge-token-file` or
//! `$FLEETGATE_FORGE_TOKEN`) — never the fleet repo's, which anyone who can push could point at a
//! listener of their own.
//!
//! Request shapes, as each API documents them:
//! * GitHub — `POST {url}/repos/{owner}/{repo}/pulls`, `Authorization: Bearer <token>`,
//!   `Accept: application/vnd.github+json`, `X-GitHub-Api-Version: 2022-11-28`, a `User-Agent`;
//!   body `{title, head, base, body}`; 201 with `number`, `html_url`.
//! * Gitea/Forgejo — `POST {url}/api/v1/repos/{owner}/{repo}/pulls`, `Authorization: token <token>`;
//!   body `{title, head, base, body}`; 201 with `number`, `html_url`.
//! * GitLab — `POST {url}/api/v4/projects/{id or URL-encoded path}/merge_requests`,
//!   `PRIVATE-TOKEN: <token>`; body `{source_branch, target_branch, title, description}`; 201 with
//!   `iid`, `web_url`.
//!
//! A refusal by the forge is shown with its HTTP status, the forge's own message(s), and what to
//! do about it. The token, the forge's name and the reading of its error bodies are
//! [`crate::status::forge`]'s, shared with the commit-status mirror.

use crate::model::ForgeKind;
use crate::status::forge::{ForgeConfig, TokenSource, auth_headers, error_message, forge_name};
use serde::Serialize;
use serde_json::{Value, json};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

/// What to open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PullRequestSpec {
    pub title: String,
    pub body: String,
    /// The branch with the change.
    pub head: String,
    /// The branch it merges into.
    pub base: String,
}

/// What the forge opened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpenedPullRequest {
    pub forge: ForgeKind,
    /// PR number (GitHub, Gitea) or MR iid (GitLab).
    pub number: u64,
    pub url: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    #[error("{forge} refused to open the {what} (HTTP {status}): {message}{hint}")]
    Rejected { forge: String, what: &'static str, status: u16, message: String, hint: String },
    /// `source` has its URL stripped ([`reqwest::Error::without_url`]): `url` says where, once.
    #[error("cannot reach {forge} at {url}; check --forge-url and the network")]
    Transport { forge: String, url: String, source: reqwest::Error },
    /// The body is not shown: it is whatever the server sent, and this message reaches the terminal
    /// and CI logs.
    #[error("{forge} answered HTTP {status} but not with a {what} fleetgate understands (no number or URL in it)")]
    BadResponse { forge: String, what: &'static str, status: u16 },
    #[error("--forge-*: {0}")]
    Config(String),
    /// The forge settings are incomplete or their token cannot be read ([`crate::status::Token::read`]).
    #[error(transparent)]
    Token(#[from] crate::status::ForgeError),
}

fn what(kind: ForgeKind) -> &'static str {
    match kind {
        ForgeKind::Gitlab => "merge request",
        _ => "pull request",
    }
}

/// The endpoint URL for `forge`: base URL + the API's path, each segment percent-encoded (a
/// GitLab project path `group/app` becomes one segment `group%2Fapp`).
pub fn endpoint(forge: &ForgeConfig) -> Result<reqwest::Url, ForgeError> {
    let mut url = reqwest::Url::parse(&forge.url)
        .map_err(|e| ForgeError::Config(format!("url {:?} is not a URL: {e}", forge.url)))?;
    let owner_repo = || -> Result<(String, String), ForgeError> {
        match forge.repository.split_once('/') {
            Some((o, r)) if !o.is_empty() && !r.is_empty() && !r.contains('/') => Ok((o.to_string(), r.to_string())),
            _ => Err(ForgeError::Config(format!("repository {:?} must be OWNER/REPO", forge.repository))),
        }
    };
    let segments: Vec<String> = match forge.kind {
        ForgeKind::Github => {
            let (o, r) = owner_repo()?;
            vec!["repos".into(), o, r, "pulls".into()]
        }
        ForgeKind::Gitea => {
            let (o, r) = owner_repo()?;
            vec!["api".into(), "v1".into(), "repos".into(), o, r, "pulls".into()]
        }
        ForgeKind::Gitlab => {
            vec!["api".into(), "v4".into(), "projects".into(), forge.repository.clone(), "merge_requests".into()]
        }
    };
    url.path_segments_mut()
        .map_err(|_| ForgeError::Config(format!("url {:?} cannot be a base URL", forge.url)))?
        .pop_if_empty()
        .extend(&segments);
    Ok(url)
}

/// The JSON body each forge expects.
pub fn request_body(kind: ForgeKind, pr: &PullRequestSpec) -> Value {
    match kind {
        ForgeKind::Github | ForgeKind::Gitea => {
            json!({ "title": pr.title, "head": pr.head, "base": pr.base, "body": pr.body })
        }
        ForgeKind::Gitlab => json!({
            "source_branch": pr.head,
            "target_branch": pr.base,
            "title": pr.title,
            "description": pr.body,
        }),
    }
}

/// How long a 404 is taken for a branch the forge has not indexed yet (Gitea indexes a pushed
/// branch in the background, and until it has, a pull request from it is a 404), as long as the
/// repository itself answers.
const BRANCH_WAIT: Duration = Duration::from_secs(20);
const BRANCH_POLL: Duration = Duration::from_millis(500);

/// Opens the pull/merge request `pr` on `forge` with API token `token`.
///
/// Errors: [`ForgeError::Rejected`] when the forge answers with an error status (its message and
/// a hint included), [`ForgeError::Transport`] when it cannot be reached, [`ForgeError::BadResponse`]
/// when a success answer lacks the number or URL, [`ForgeError::Config`] for unusable settings.
pub async fn open(forge: &ForgeConfig, token: &str, pr: &PullRequestSpec) -> Result<OpenedPullRequest, ForgeError> {
    let url = endpoint(forge)?;
    let name = forge_name(forge.kind).to_string();
    let transport = |source: reqwest::Error| ForgeError::Transport {
        forge: name.clone(),
        url: url.to_string(),
        source: source.without_url(),
    };
    // A redirect would carry the token to wherever the answer points: follow none.
    let client = crate::http::client_builder()
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(format!("fleetgate/{}", crate::VERSION))
        .build()
        .map_err(transport)?;
    let started = std::time::Instant::now();
    let (status, text) = loop {
        let req = authorized(client.post(url.clone()).json(&request_body(forge.kind, pr)), forge.kind, token);
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let text = resp.text().await.map_err(transport)?;
        let unindexed = status == reqwest::StatusCode::NOT_FOUND
            && started.elapsed() < BRANCH_WAIT
            && repository_answers(&client, forge.kind, token, &url).await;
        if !unindexed {
            break (status, text);
        }
        tokio::time::sleep(BRANCH_POLL).await;
    };
    if !status.is_success() {
        return Err(ForgeError::Rejected {
            forge: name,
            what: what(forge.kind),
            status: status.as_u16(),
            message: error_message(&text),
            hint: hint(forge, status.as_u16(), pr),
        });
    }
    let bad = || ForgeError::BadResponse { forge: name.clone(), what: what(forge.kind), status: status.as_u16() };
    let v: Value = serde_json::from_str(&text).map_err(|_| bad())?;
    let (number, link) = match forge.kind {
        ForgeKind::Gitlab => (v.get("iid"), v.get("web_url")),
        _ => (v.get("number"), v.get("html_url")),
    };
    match (number.and_then(Value::as_u64), link.and_then(Value::as_str)) {
        (Some(number), Some(url)) => Ok(OpenedPullRequest { forge: forge.kind, number, url: url.to_string() }),
        _ => Err(bad()),
    }
}

/// `req` with the forge's API headers and `token`.
fn authorized(req: reqwest::RequestBuilder, kind: ForgeKind, token: &str) -> reqwest::RequestBuilder {
    auth_headers(kind, token).into_iter().fold(req, |req, (name, value)| req.header(name, value))
}

/// Whether the repository of the pull-request endpoint `pulls` (its URL less the last segment)
/// answers: then a 404 from that endpoint is about the branch, not the repository.
async fn repository_answers(client: &reqwest::Client, kind: ForgeKind, token: &str, pulls: &reqwest::Url) -> bool {
    let mut repository = pulls.clone();
    let Ok(mut segments) = repository.path_segments_mut() else { return false };
    segments.pop();
    drop(segments);
    let answer = authorized(client.get(repository), kind, token).send().await;
    answer.is_ok_and(|r| r.status().is_success())
}

fn hint(forge: &ForgeConfig, status: u16, pr: &PullRequestSpec) -> String {
    let token = match &forge.token {
        TokenSource::File(f) => format!("the token in {}", f.display()),
        TokenSource::Env(e) => format!("the token in ${e}"),
        TokenSource::Given => "the API token".to_string(),
        TokenSource::GithubApp(app) => format!("the installation token of GitHub App {}", app.app_id),
    };
    match status {
        401 => format!("; {token} was not accepted — renew it"),
        403 => format!("; {token} may lack permission to open {}s on {}", what(forge.kind), forge.repository),
        404 => format!(
            "; check --forge-url ({}) and --forge-repository ({}) — and that branch {} was pushed",
            forge.url, forge.repository, pr.head
        ),
        409 | 422 => format!(
            "; a {} for {} may already be open, or the branch is not on the forge (push it with --push)",
            what(forge.kind),
            pr.head
        ),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn settings(kind: ForgeKind, url: &str, repository: &str) -> ForgeConfig {
        ForgeConfig {
            kind,
            url: url.into(),
            repository: repository.into(),
            token: TokenSource::Given,
            status_url: None,
        }
    }

    #[rstest]
    #[case(ForgeKind::Github, "https://api.github.com", "acme/fleet", "https://api.github.com/repos/acme/fleet/pulls")]
    #[case(
        ForgeKind::Github,
        "https://ghe.example.com/api/v3/",
        "acme/fleet",
        "https://ghe.example.com/api/v3/repos/acme/fleet/pulls"
    )]
    #[case(
        ForgeKind::Gitea,
        "https://git.example.com",
        "acme/fleet",
        "https://git.example.com/api/v1/repos/acme/fleet/pulls"
    )]
    #[case(
        ForgeKind::Gitlab,
        "https://gitlab.com",
        "group/sub/fleet",
        "https://gitlab.com/api/v4/projects/group%2Fsub%2Ffleet/merge_requests"
    )]
    #[case(ForgeKind::Gitlab, "https://gitlab.com", "42", "https://gitlab.com/api/v4/projects/42/merge_requests")]
    fn endpoints_follow_each_api(#[case] kind: ForgeKind, #[case] url: &str, #[case] repo: &str, #[case] want: &str) {
        assert_eq!(endpoint(&settings(kind, url, repo)).unwrap().as_str(), want);
    }

    #[test]
    fn github_repository_must_be_owner_repo() {
        assert!(matches!(
            endpoint(&settings(ForgeKind::Github, "https://api.github.com", "fleet")),
            Err(ForgeError::Config(_))
        ));
    }
}
