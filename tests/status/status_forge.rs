//! Forge status backends against a local HTTP server that checks the exact request each forge's
//! API documentation specifies and answers as the forge does, errors included. The publisher is
//! shown to write the Git note (real `git daemon`) whatever the forge answers.

use crate::status_support;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use fleetgate::model::ForgeKind;
use fleetgate::status::{
    ForgeBackend, ForgeError, GitNotesBackend, GitRemote, Publisher, State, Status, StatusBackend, StatusError, Token,
};
use fleetgate::status::{ForgeSettings, TokenSource};
use fleetgate_testenv::git_in;
use rstest::rstest;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SHA: &str = "6dcb09b5b57875f334f61aebed695e2e4193db5e";

#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    /// The path exactly as sent (percent-encoding kept).
    path: String,
    headers: HeaderMap,
    body: Value,
}

/// Answers every request with one canned response and records what it got.
struct FakeForge {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeForge {
    async fn start(status: u16, headers: &[(&'static str, &'static str)], body: &'static str) -> FakeForge {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let record = seen.clone();
        let headers: Vec<(&'static str, &'static str)> = headers.to_vec();
        let app =
            axum::Router::new().fallback(move |method: Method, uri: Uri, req_headers: HeaderMap, bytes: Bytes| {
                let record = record.clone();
                let headers = headers.clone();
                async move {
                    let sent = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    record.lock().unwrap().push(Seen {
                        method,
                        path: uri.path().to_string(),
                        headers: req_headers,
                        body: sent,
                    });
                    let mut response = axum::response::Response::new(axum::body::Body::from(body));
                    *response.status_mut() = StatusCode::from_u16(status).unwrap();
                    for (k, v) in headers {
                        response.headers_mut().insert(k, v.parse().unwrap());
                    }
                    response
                }
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeForge { base, seen }
    }

    fn only_request(&self) -> Seen {
        let seen = self.seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "{seen:?}");
        seen[0].clone()
    }
}

fn header<'a>(seen: &'a Seen, name: &str) -> &'a str {
    seen.headers.get(name).unwrap_or_else(|| panic!("no {name} header")).to_str().unwrap()
}

fn failure() -> Status {
    Status::new(
        "cluster-a",
        "rel-20250315-001",
        SHA,
        State::Failure,
        "rolled back to rel-20250310-002: error-rate 7.3 % > 5 %",
    )
    .with_target_url("https://grafana.example.com/d/fleet?var-cluster=cluster-a")
}

fn backend(kind: ForgeKind, base: &str, repository: &str, token: &str) -> ForgeBackend {
    ForgeBackend::new(kind, base, repository, Token::new(token)).unwrap()
}

const GITHUB_CREATED: &str = r#"{"url":"https://api.github.com/repos/octo/fleet/statuses/6dcb09b5b57875f334f61aebed695e2e4193db5e","id":1,"node_id":"MDY6U3RhdHVzMQ==","state":"failure","description":"rolled back","target_url":"https://grafana.example.com","context":"fleetgate/cluster-a","created_at":"2025-03-15T10:00:00Z","updated_at":"2025-03-15T10:00:00Z"}"#;

#[tokio::test]
async fn github_request_has_the_documented_shape() {
    let forge = FakeForge::start(201, &[("content-type", "application/json; charset=utf-8")], GITHUB_CREATED).await;
    backend(ForgeKind::Github, &forge.base, "octo/fleet", "ghp_test").send(&failure()).await.unwrap();
    let seen = forge.only_request();
    assert_eq!(seen.method, Method::POST);
    assert_eq!(seen.path, format!("/repos/octo/fleet/statuses/{SHA}"));
    assert_eq!(header(&seen, "authorization"), "Bearer ghp_test");
    assert_eq!(header(&seen, "accept"), "application/vnd.github+json");
    assert_eq!(header(&seen, "x-github-api-version"), "2022-11-28");
    assert_eq!(header(&seen, "user-agent"), format!("fleetgate/{}", fleetgate::VERSION));
    assert_eq!(header(&seen, "content-type"), "application/json");
    assert_eq!(
        seen.body,
        json!({
            "state": "failure",
            "target_url": "https://grafana.example.com/d/fleet?var-cluster=cluster-a",
            "description": "rolled back to rel-20250310-002: error-rate 7.3 % > 5 %",
            "context": "fleetgate/cluster-a",
        })
    );
}

#[tokio::test]
async fn descriptions_are_cut_to_140_characters() {
    let forge = FakeForge::start(201, &[], GITHUB_CREATED).await;
    let long = Status::new("cluster-a", "rel-1", SHA, State::Error, "x".repeat(300));
    backend(ForgeKind::Github, &forge.base, "octo/fleet", "t").send(&long).await.unwrap();
    let description = forge.only_request().body["description"].as_str().unwrap().to_string();
    assert_eq!(description.chars().count(), 140);
    assert!(description.ends_with('…'));
    assert!(forge.only_request().body.get("target_url").is_none());
}

#[tokio::test]
async fn gitea_request_has_the_documented_shape() {
    let forge = FakeForge::start(201, &[], r#"{"id":1,"status":"failure","context":"fleetgate/cluster-a"}"#).await;
    let pending = Status::new("cluster-b", "rel-1", SHA, State::Pending, "waiting for wave canary: cluster-a pending");
    backend(ForgeKind::Gitea, &forge.base, "platform/fleet", "gitea-token").send(&pending).await.unwrap();
    let seen = forge.only_request();
    assert_eq!(seen.method, Method::POST);
    assert_eq!(seen.path, format!("/api/v1/repos/platform/fleet/statuses/{SHA}"));
    assert_eq!(header(&seen, "authorization"), "token gitea-token");
    assert_eq!(header(&seen, "accept"), "application/json");
    assert!(header(&seen, "user-agent").starts_with("fleetgate/"));
    assert_eq!(
        seen.body,
        json!({"state": "pending", "description": "waiting for wave canary: cluster-a pending", "context": "fleetgate/cluster-b"})
    );
}

#[tokio::test]
async fn gitlab_request_has_the_documented_shape() {
    let forge =
        FakeForge::start(201, &[], r#"{"id":93,"sha":"6dcb09b5","status":"failed","name":"fleetgate/cluster-a"}"#)
            .await;
    backend(ForgeKind::Gitlab, &forge.base, "platform/sub/fleet", "glpat-test").send(&failure()).await.unwrap();
    let seen = forge.only_request();
    assert_eq!(seen.method, Method::POST);
    assert_eq!(seen.path, format!("/api/v4/projects/platform%2Fsub%2Ffleet/statuses/{SHA}"));
    assert_eq!(header(&seen, "private-token"), "glpat-test");
    assert!(seen.headers.get("authorization").is_none());
    assert_eq!(
        seen.body,
        json!({
            "state": "failed",
            "name": "fleetgate/cluster-a",
            "description": "rolled back to rel-20250310-002: error-rate 7.3 % > 5 %",
            "target_url": "https://grafana.example.com/d/fleet?var-cluster=cluster-a",
        })
    );
}

#[tokio::test]
async fn gitlab_shows_an_agent_at_work_as_running() {
    let forge = FakeForge::start(201, &[], "{}").await;
    let baking = Status::new("cluster-a", "rel-1", SHA, State::Pending, "baking 4/10 min").applied(chrono::Utc::now());
    backend(ForgeKind::Gitlab, &forge.base, "42", "t").send(&baking).await.unwrap();
    let seen = forge.only_request();
    assert_eq!(seen.path, format!("/api/v4/projects/42/statuses/{SHA}"));
    assert_eq!(seen.body["state"], "running");
}

/// Each forge's documented error answers become specific errors with the forge's own words.
#[rstest]
#[case::github_401(ForgeKind::Github, 401, &[], r#"{"message":"Bad credentials","documentation_url":"https://docs.github.com/rest"}"#, "Unauthorized", "GitHub rejected the token from the token given to fleetgate (401: Bad credentials)")]
#[case::github_404(ForgeKind::Github, 404, &[], r#"{"message":"Not Found","documentation_url":"https://docs.github.com/rest/commits/statuses#create-a-commit-status"}"#, "NotFound", "GitHub found no repository octo/fleet or commit 6dcb09b5b57875f334f61aebed695e2e4193db5e (404: Not Found)")]
#[case::github_422(ForgeKind::Github, 422, &[], r#"{"message":"Validation Failed","errors":[{"resource":"Status","code":"custom","message":"This SHA and context has reached the maximum number of statuses."}],"documentation_url":"https://docs.github.com"}"#, "Rejected", "GitHub rejected the status (422: Validation Failed; This SHA and context has reached the maximum number of statuses.)")]
#[case::github_primary_rate_limit(ForgeKind::Github, 403, &[("x-ratelimit-limit", "5000"), ("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "1742032800")], r#"{"message":"API rate limit exceeded for user ID 1.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"}"#, "RateLimited", "the limit resets at 2025-03-15 10:00:00 UTC")]
#[case::github_secondary_rate_limit(ForgeKind::Github, 429, &[("retry-after", "60")], r#"{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.","documentation_url":"https://docs.github.com"}"#, "RateLimited", "retry after 60 s")]
#[case::github_403_permissions(ForgeKind::Github, 403, &[("x-ratelimit-remaining", "4999")], r#"{"message":"Resource not accessible by integration","documentation_url":"https://docs.github.com"}"#, "Forbidden", "needs permission to write commit statuses on octo/fleet")]
#[case::gitea_401(ForgeKind::Gitea, 401, &[], r#"{"message":"token is required","url":"https://gitea.example.com/api/swagger"}"#, "Unauthorized", "Gitea rejected the token")]
#[case::gitea_404(ForgeKind::Gitea, 404, &[], r#"{"errors":["repository does not exist"],"message":"The target couldn't be found.","url":"https://gitea.example.com/api/swagger"}"#, "NotFound", "The target couldn't be found.; repository does not exist")]
#[case::gitea_422(ForgeKind::Gitea, 422, &[], r#"{"message":"[State]: Required","url":"https://gitea.example.com/api/swagger"}"#, "Rejected", "Gitea rejected the status (422: [State]: Required)")]
#[case::gitlab_401(ForgeKind::Gitlab, 401, &[], r#"{"message":"401 Unauthorized"}"#, "Unauthorized", "GitLab rejected the token from the token given to fleetgate (401: 401 Unauthorized)")]
#[case::gitlab_404(ForgeKind::Gitlab, 404, &[], r#"{"message":"404 Project Not Found"}"#, "NotFound", "404: 404 Project Not Found")]
#[case::gitlab_400(ForgeKind::Gitlab, 400, &[], r#"{"error":"state does not have a valid value"}"#, "Rejected", "GitLab rejected the status (400: state does not have a valid value)")]
#[case::gitlab_429(ForgeKind::Gitlab, 429, &[("ratelimit-limit", "600"), ("ratelimit-remaining", "0"), ("ratelimit-reset", "1742032800"), ("retry-after", "30")], "Retry later", "RateLimited", "GitLab rate limit reached (429: no error message (a body that is not its JSON error, not shown)); retry after 30 s")]
// A body that is not the forge's JSON error (a proxy's page, anything a server sends) is never
// repeated: these messages reach logs, Events and statuses.
#[case::server_error(ForgeKind::Gitea, 502, &[], "<html>Bad Gateway token=s3cret</html>", "Unexpected", "Gitea answered 502: no error message (a body that is not its JSON error, not shown)")]
#[tokio::test]
async fn forge_errors_are_specific(
    #[case] kind: ForgeKind,
    #[case] code: u16,
    #[case] headers: &'static [(&'static str, &'static str)],
    #[case] body: &'static str,
    #[case] variant: &str,
    #[case] message: &str,
) {
    let forge = FakeForge::start(code, headers, body).await;
    let repository = if kind == ForgeKind::Gitlab { "platform/fleet" } else { "octo/fleet" };
    let err = backend(kind, &forge.base, repository, "t").send(&failure()).await.unwrap_err();
    let name = match &err {
        ForgeError::Unauthorized { .. } => "Unauthorized",
        ForgeError::Forbidden { .. } => "Forbidden",
        ForgeError::NotFound { .. } => "NotFound",
        ForgeError::Rejected { .. } => "Rejected",
        ForgeError::RateLimited { .. } => "RateLimited",
        ForgeError::Unexpected { .. } => "Unexpected",
        other => panic!("unexpected variant: {other:?}"),
    };
    assert_eq!(name, variant, "{err}");
    assert!(err.to_string().contains(message), "{err}");
    assert!(!err.to_string().contains("s3cret"), "{err}");
    if let ForgeError::RateLimited { retry_after, reset_at, .. } = &err {
        assert!(retry_after.is_some() || reset_at.is_some(), "{err:?}");
    }
}

#[tokio::test]
async fn an_unreachable_forge_is_a_transport_error() {
    let port = fleetgate_testenv::process::free_port();
    let err =
        backend(ForgeKind::Github, &format!("http://127.0.0.1:{port}"), "o/r", "t").send(&failure()).await.unwrap_err();
    assert!(matches!(err, ForgeError::Transport { .. }), "{err:?}");
    // The URL once (reqwest's own text would repeat it), with the path but never the token.
    let chain = fleetgate::model::error_chain(&err);
    assert_eq!(chain.matches(&format!("127.0.0.1:{port}")).count(), 1, "{chain}");
    assert!(!chain.contains("ghp_") && !chain.contains("Bearer"), "{chain}");
}

#[tokio::test]
async fn tokens_come_from_the_callers_file_or_fleetgate_forge_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "ghp_from_file\n").unwrap();
    let config = |token_file: Option<std::path::PathBuf>| {
        ForgeSettings {
            kind: Some(ForgeKind::Github),
            url: Some("https://api.github.com".into()),
            repository: Some("octo/fleet".into()),
            token_file,
            ..Default::default()
        }
        .resolve()
        .unwrap()
        .unwrap()
    };
    let from_file = config(Some(file.clone()));
    assert_eq!(from_file.token, TokenSource::File(file));
    assert!(ForgeBackend::from_config(&from_file).await.is_ok());
    // Without a file: $FLEETGATE_FORGE_TOKEN (unset in tests).
    let from_env = config(None);
    assert_eq!(from_env.token, TokenSource::Env(fleetgate::status::FORGE_TOKEN_ENV.into()));
    let unset = ForgeBackend::from_config(&from_env).await.unwrap_err();
    assert!(unset.to_string().contains("no --forge-token-file given and $FLEETGATE_FORGE_TOKEN is not set"), "{unset}");
    let gone = ForgeBackend::from_config(&config(Some("/nonexistent/token".into()))).await.unwrap_err();
    assert!(gone.to_string().contains("token file /nonexistent/token"), "{gone}");
    let partial = ForgeSettings { kind: Some(ForgeKind::Github), ..Default::default() }.resolve().unwrap_err();
    assert!(partial.to_string().contains("--forge-url is missing"), "{partial}");
}

/// The publisher writes the note first; a forge failure is reported but never loses the status.
#[tokio::test]
async fn publisher_writes_git_notes_even_when_the_forge_fails() {
    let daemon = fleetgate_testenv::GitDaemon::start().unwrap();
    let url = daemon.create_bare("fleet.git").unwrap();
    let work = tempfile::tempdir().unwrap();
    git_in(work.path(), &["init", "-q", "-b", "main"]);
    git_in(work.path(), &["commit", "-q", "--allow-empty", "-m", "release"]);
    git_in(work.path(), &["push", "-q", &url, "main"]);
    let sha = git_in(work.path(), &["rev-parse", "HEAD"]);
    let state = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(state.path()).unwrap();
    repo.remote_anonymous(&url).unwrap().fetch(&["+refs/heads/main:refs/heads/main"], None, None).unwrap();

    let forge = FakeForge::start(401, &[], r#"{"message":"Bad credentials"}"#).await;
    let publisher = Publisher::new(
        GitNotesBackend::new(state.path(), GitRemote::new(&url), status_support::identity("cluster-a")),
        Some(backend(ForgeKind::Github, &forge.base, "octo/fleet", "expired")),
    );
    assert_eq!(publisher.name(), "git+github");
    let status = Status::new("cluster-a", "rel-1", &sha, State::Success, "all gates passed");
    let err = tokio::time::timeout(Duration::from_secs(30), publisher.publish(&status)).await.unwrap().unwrap_err();
    assert!(matches!(err, StatusError::Forge(ForgeError::Unauthorized { .. })), "{err:?}");
    assert!(err.to_string().starts_with("the status note is in Git"), "{err}");
    assert_eq!(forge.only_request().body["state"], "success");

    let reader = tempfile::tempdir().unwrap();
    let reader = git2::Repository::init_bare(reader.path()).unwrap();
    fleetgate::status::sync(&reader, &GitRemote::new(&url)).unwrap();
    let set =
        fleetgate::status::read_all(&reader, &[git2::Oid::from_str(&sha).unwrap()], &status_support::keys()).unwrap();
    assert_eq!(set.latest("cluster-a", "rel-1").unwrap().description, "all gates passed");
}

/// Serves `answers` (path → JSON) to GETs carrying `auth` in `header`; anything else is a 404.
async fn serve_answers(header: &'static str, auth: &'static str, answers: Vec<(String, Value)>) -> String {
    let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap| {
        let answers = answers.clone();
        async move {
            let authorized = headers.get(header).and_then(|v| v.to_str().ok()) == Some(auth);
            match answers.iter().find(|(p, _)| *p == uri.path()) {
                Some((_, body)) if method == Method::GET && authorized => (StatusCode::OK, axum::Json(body.clone())),
                _ => (StatusCode::NOT_FOUND, axum::Json(json!({"message": "404 Not Found"}))),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// Approvals of the promotion PR as Gitea and GitLab report them: only approvals at the head of a
/// request into the tracked branch count (Gitea: not dismissed, not stale; GitLab: a merge request
/// whose head is still it).
#[tokio::test]
async fn gitea_and_gitlab_approvals_count_only_at_the_head() {
    let review = |login: &str, state: &str, commit: &str, extra: Value| {
        let mut r =
            json!({"user": {"login": login}, "state": state, "commit_id": commit, "body": format!("by {login}")});
        r.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        r
    };
    let reviews = json!([
        review("ana", "APPROVED", SHA, json!({})),
        review("bob", "APPROVED", "0".repeat(40).as_str(), json!({})),
        review("cy", "APPROVED", SHA, json!({"dismissed": true})),
        review("dee", "APPROVED", SHA, json!({"stale": true})),
        review("eve", "REQUEST_CHANGES", SHA, json!({})),
    ]);
    let gitea = serve_answers(
        "authorization",
        "token gitea-t",
        vec![
            (
                "/api/v1/repos/octo/fleet/pulls".to_string(),
                json!([
                    {"number": 4, "head": {"sha": "0".repeat(40)}, "base": {"ref": "main"}},
                    {"number": 3, "head": {"sha": SHA}, "base": {"ref": "main"}},
                    // The same head approved in a PR into another branch approves nothing on main.
                    {"number": 2, "head": {"sha": SHA}, "base": {"ref": "staging"}},
                ]),
            ),
            ("/api/v1/repos/octo/fleet/pulls/3/reviews".to_string(), reviews.clone()),
            (
                "/api/v1/repos/octo/fleet/pulls/2/reviews".to_string(),
                json!([review("zed", "APPROVED", SHA, json!({}))]),
            ),
        ],
    )
    .await;
    let found = backend(ForgeKind::Gitea, &gitea, "octo/fleet", "gitea-t").approvals(SHA, "main").await.unwrap();
    let found: Vec<(&str, u64, &str)> = found.iter().map(|a| (a.login.as_str(), a.pull, a.body.as_str())).collect();
    assert_eq!(found, [("ana", 3, "by ana")]);

    let gitlab = serve_answers(
        "private-token",
        "glpat-t",
        vec![
            (
                format!("/api/v4/projects/platform%2Ffleet/repository/commits/{SHA}/merge_requests"),
                json!([
                    {"iid": 5, "sha": SHA, "target_branch": "main"},
                    {"iid": 4, "sha": "0".repeat(40), "target_branch": "main"},
                    {"iid": 6, "sha": SHA, "target_branch": "staging"},
                ]),
            ),
            (
                "/api/v4/projects/platform%2Ffleet/merge_requests/5/approvals".to_string(),
                json!({"approved_by": [{"user": {"username": "ana"}}]}),
            ),
            (
                "/api/v4/projects/platform%2Ffleet/merge_requests/4/approvals".to_string(),
                json!({"approved_by": [{"user": {"username": "bob"}}]}),
            ),
            (
                "/api/v4/projects/platform%2Ffleet/merge_requests/6/approvals".to_string(),
                json!({"approved_by": [{"user": {"username": "zed"}}]}),
            ),
        ],
    )
    .await;
    let found = backend(ForgeKind::Gitlab, &gitlab, "platform/fleet", "glpat-t").approvals(SHA, "main").await.unwrap();
    let found: Vec<(&str, u64)> = found.iter().map(|a| (a.login.as_str(), a.pull)).collect();
    assert_eq!(found, [("ana", 5)]);
}
