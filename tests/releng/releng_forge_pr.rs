//! `--open-pr` against a local HTTP server that accepts a request only in the exact shape each
//! forge's API documents (method, path with the GitLab project path encoded, auth header, JSON
//! body fields) and answers like the forge — including its error responses, which fleetgate must
//! show clearly.

use crate::releng_common;
use crate::status_support;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use fleetgate::model::ForgeKind;
use fleetgate::releng::forge_pr::{self, ForgeError, PullRequestSpec};
use fleetgate::status::{ForgeConfig, TokenSource};
use releng_common::*;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

const TOKEN: &str = "s3cret-token";

#[derive(Debug, Clone)]
struct Recorded {
    method: String,
    path: String,
    headers: HeaderMap,
    body: Value,
}

#[derive(Clone, Default)]
struct Forge {
    requests: Arc<Mutex<Vec<Recorded>>>,
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Which problems a request has against the documented shape (empty: none).
fn shape_problems(kind: ForgeKind, r: &Recorded) -> Vec<String> {
    let mut p = Vec::new();
    if r.method != "POST" {
        p.push(format!("method {}", r.method));
    }
    if !header(&r.headers, "content-type").starts_with("application/json") {
        p.push("content-type is not JSON".into());
    }
    let keys = |want: &[&str]| -> Option<String> {
        let obj = r.body.as_object()?;
        let mut got: Vec<&str> = obj.keys().map(String::as_str).collect();
        got.sort();
        let mut want = want.to_vec();
        want.sort();
        (got != want || obj.values().any(|v| !v.is_string()))
            .then(|| format!("body keys {got:?}, want {want:?} (strings)"))
    };
    match kind {
        ForgeKind::Github => {
            if header(&r.headers, "authorization") != format!("Bearer {TOKEN}") {
                p.push("authorization is not Bearer <token>".into());
            }
            if header(&r.headers, "accept") != "application/vnd.github+json" {
                p.push("accept is not application/vnd.github+json".into());
            }
            if header(&r.headers, "x-github-api-version") != "2022-11-28" {
                p.push("x-github-api-version missing".into());
            }
            if header(&r.headers, "user-agent").is_empty() {
                p.push("user-agent missing (GitHub rejects requests without one)".into());
            }
            p.extend(keys(&["title", "head", "base", "body"]));
        }
        ForgeKind::Gitea => {
            if header(&r.headers, "authorization") != format!("token {TOKEN}") {
                p.push("authorization is not `token <token>`".into());
            }
            p.extend(keys(&["title", "head", "base", "body"]));
        }
        ForgeKind::Gitlab => {
            if header(&r.headers, "private-token") != TOKEN {
                p.push("PRIVATE-TOKEN missing".into());
            }
            p.extend(keys(&["source_branch", "target_branch", "title", "description"]));
        }
    }
    p
}

async fn handle(
    axum::extract::State(forge): axum::extract::State<Forge>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let rec = Recorded {
        method: method.to_string(),
        path: uri.path().to_string(),
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    let earlier = {
        let mut requests = forge.requests.lock().unwrap();
        requests.push(rec.clone());
        requests.iter().filter(|r| r.path == rec.path && r.method == rec.method).count() - 1
    };
    // The repositories Gitea knows: acme/indexing's branch becomes known after three PR attempts.
    if method == Method::GET {
        return match rec.path.as_str() {
            "/api/v1/repos/acme/fleet" | "/api/v1/repos/acme/indexing"
                if header(&rec.headers, "authorization") == format!("token {TOKEN}") =>
            {
                (StatusCode::OK, axum::Json(json!({"full_name": rec.path.trim_start_matches("/api/v1/repos/")})))
            }
            other => (StatusCode::NOT_FOUND, axum::Json(json!({"message": format!("Not Found: {other}")}))),
        };
    }
    if rec.path == "/api/v1/repos/acme/indexing/pulls" && earlier < 3 {
        return (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"errors": null, "message": "The target couldn't be found."})),
        );
    }
    let kind = match rec.path.as_str() {
        "/repos/acme/fleet/pulls" | "/repos/acme/taken/pulls" => ForgeKind::Github,
        "/api/v1/repos/acme/fleet/pulls" | "/api/v1/repos/acme/indexing/pulls" => ForgeKind::Gitea,
        "/api/v4/projects/platform%2Fredis%2Ffleet/merge_requests"
        | "/api/v4/projects/platform%2Ftaken/merge_requests" => ForgeKind::Gitlab,
        other => return (StatusCode::NOT_FOUND, axum::Json(json!({"message": format!("Not Found: {other}")}))),
    };
    let problems = shape_problems(kind, &rec);
    if !problems.is_empty() {
        return (StatusCode::BAD_REQUEST, axum::Json(json!({"message": problems.join("; ")})));
    }
    // The forges' own error answers.
    if rec.path.contains("taken") {
        return match kind {
            ForgeKind::Gitlab => (
                StatusCode::CONFLICT,
                axum::Json(
                    json!({"message": ["Another open merge request already exists for this source branch: !12"]}),
                ),
            ),
            _ => (
                StatusCode::UNPROCESSABLE_ENTITY,
                axum::Json(json!({
                    "message": "Validation Failed",
                    "errors": [{"resource": "PullRequest", "code": "custom",
                                "message": format!("A pull request already exists for acme:{}.", rec.body["head"].as_str().unwrap_or(""))}],
                    "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request"
                })),
            ),
        };
    }
    let answer = match kind {
        ForgeKind::Gitlab => {
            json!({"id": 901, "iid": 12, "web_url": "https://gitlab.example.com/platform/redis/fleet/-/merge_requests/12"})
        }
        ForgeKind::Gitea => json!({"id": 55, "number": 7, "html_url": "https://gitea.example.com/acme/fleet/pulls/7"}),
        ForgeKind::Github => json!({"id": 1, "number": 42, "html_url": "https://github.com/acme/fleet/pull/42"}),
    };
    (StatusCode::CREATED, axum::Json(answer))
}

/// Starts the fake forge on a loopback port; returns its base URL and request log.
async fn start_forge() -> (String, Forge) {
    let forge = Forge::default();
    let app = axum::Router::new().fallback(handle).with_state(forge.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), forge)
}

fn settings(kind: ForgeKind, url: &str, repository: &str) -> ForgeConfig {
    ForgeConfig {
        kind,
        url: url.to_string(),
        repository: repository.to_string(),
        token: TokenSource::Given,
        status_url: None,
    }
}

fn spec() -> PullRequestSpec {
    PullRequestSpec {
        title: "Promote rel-2 to wave canary".into(),
        body: "| cluster | wave | from | to |".into(),
        head: "promote/rel-2-wave-canary".into(),
        base: "main".into(),
    }
}

#[tokio::test]
async fn each_forge_gets_the_request_its_api_documents() {
    let (url, forge) = start_forge().await;
    let gh = forge_pr::open(&settings(ForgeKind::Github, &url, "acme/fleet"), TOKEN, &spec()).await.unwrap();
    assert_eq!((gh.number, gh.url.as_str()), (42, "https://github.com/acme/fleet/pull/42"));
    let gt = forge_pr::open(&settings(ForgeKind::Gitea, &url, "acme/fleet"), TOKEN, &spec()).await.unwrap();
    assert_eq!((gt.number, gt.url.as_str()), (7, "https://gitea.example.com/acme/fleet/pulls/7"));
    let gl = forge_pr::open(&settings(ForgeKind::Gitlab, &url, "platform/redis/fleet"), TOKEN, &spec()).await.unwrap();
    assert_eq!(
        (gl.number, gl.url.as_str()),
        (12, "https://gitlab.example.com/platform/redis/fleet/-/merge_requests/12")
    );

    let reqs = forge.requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 3);
    assert_eq!(
        reqs[0].body,
        json!({"title": "Promote rel-2 to wave canary", "head": "promote/rel-2-wave-canary", "base": "main", "body": "| cluster | wave | from | to |"})
    );
    assert_eq!(reqs[1].body, reqs[0].body, "Gitea takes GitHub's fields");
    assert_eq!(
        reqs[2].body,
        json!({"source_branch": "promote/rel-2-wave-canary", "target_branch": "main", "title": "Promote rel-2 to wave canary", "description": "| cluster | wave | from | to |"})
    );
    assert_eq!(
        reqs[2].path, "/api/v4/projects/platform%2Fredis%2Ffleet/merge_requests",
        "the project path is one encoded segment"
    );
}

#[tokio::test]
async fn forge_errors_are_shown_with_status_message_and_what_to_do() {
    let (url, forge) = start_forge().await;
    let err = forge_pr::open(&settings(ForgeKind::Github, &url, "acme/taken"), TOKEN, &spec()).await.unwrap_err();
    assert!(matches!(err, ForgeError::Rejected { status: 422, .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "GitHub refused to open the pull request (HTTP 422): Validation Failed; A pull request already exists for \
         acme:promote/rel-2-wave-canary.; a pull request for promote/rel-2-wave-canary may already be open, or the \
         branch is not on the forge (push it with --push)"
    );
    let err = forge_pr::open(&settings(ForgeKind::Gitlab, &url, "platform/taken"), TOKEN, &spec()).await.unwrap_err();
    assert!(
        err.to_string().starts_with(
            "GitLab refused to open the merge request (HTTP 409): Another open merge request already exists for this source branch: !12"
        ),
        "{err}"
    );
    let err = forge_pr::open(&settings(ForgeKind::Gitea, &url, "acme/missing"), TOKEN, &spec()).await.unwrap_err();
    assert!(
        err.to_string().contains("(HTTP 404): Not Found: /api/v1/repos/acme/missing/pulls; check --forge-url"),
        "{err}"
    );
    // A repository that does not answer is not waited for: one attempt.
    let attempts = forge.requests.lock().unwrap().iter().filter(|r| r.path.contains("acme/missing/pulls")).count();
    assert_eq!(attempts, 1);
    let err = forge_pr::open(&settings(ForgeKind::Gitea, "http://127.0.0.1:9", "acme/fleet"), TOKEN, &spec())
        .await
        .unwrap_err();
    assert!(
        err.to_string().starts_with("cannot reach Gitea at http://127.0.0.1:9/api/v1/repos/acme/fleet/pulls"),
        "{err}"
    );
    let chain = fleetgate::model::error_chain(&err);
    assert_eq!(chain.matches("127.0.0.1:9").count(), 1, "the URL once, not again in reqwest's text: {chain}");
}

/// Gitea indexes a pushed branch in the background; until it has, a pull request from it is a
/// 404 though the repository answers. `open` tries again while the repository answers.
#[tokio::test]
async fn a_branch_the_forge_has_not_indexed_yet_is_waited_for() {
    let (url, forge) = start_forge().await;
    let pr = forge_pr::open(&settings(ForgeKind::Gitea, &url, "acme/indexing"), TOKEN, &spec()).await.unwrap();
    assert_eq!(pr.number, 7);
    let requests = forge.requests.lock().unwrap().clone();
    let posts = requests.iter().filter(|r| r.method == "POST").count();
    let looks = requests.iter().filter(|r| r.method == "GET" && r.path == "/api/v1/repos/acme/indexing").count();
    assert_eq!((posts, looks), (4, 3), "three 404s, each followed by a look at the repository, then the PR");
}

/// A fixture with a `git daemon` remote as origin.
/// The caller's forge flags (the token comes from `$FLEETGATE_FORGE_TOKEN`).
fn forge_flags(kind: &str, url: &str, repository: &str) -> Vec<String> {
    ["--forge-kind", kind, "--forge-url", url, "--forge-repository", repository].map(str::to_string).to_vec()
}

/// `fleetgate ARGS --repo fleet --trusted-keys …` with the forge token in the caller's environment.
fn promote_cli(f: &Fixture, args: &[&str]) -> std::process::Output {
    let keys = f.keys.to_str().unwrap().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--repo", "fleet", "--trusted-keys", &keys]);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fleetgate"));
    cmd.args(&all)
        .env("GNUPGHOME", f.gpg.path())
        .env("NO_COLOR", "1")
        .env("FLEETGATE_FORGE_TOKEN", TOKEN)
        .current_dir(f.dir.path());
    cmd.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_open_pr_pushes_the_branch_and_opens_a_pr_showing_mapping_crds_and_waves() {
    let (url, forge) = start_forge().await;
    let (f, daemon) = tokio::task::spawn_blocking(Fixture::with_origin).await.unwrap();
    let f = Arc::new(f);
    let g = f.clone();
    let out = tokio::task::spawn_blocking(move || {
        g.release("rel-1", "v1.0.0");
        g.git(&["push", "-q", "origin", "main", "rel-1"]);
        let flags = forge_flags("gitea", &url, "acme/fleet");
        let mut args = vec!["promote", "rel-1", "--wave", "prod", "--open-pr"];
        args.extend(flags.iter().map(String::as_str));
        promote_cli(&g, &args)
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("pushed     refs/heads/promote/rel-1-wave-prod to origin"), "{text}");
    assert!(text.contains("PR         #7 https://gitea.example.com/acme/fleet/pulls/7"), "{text}");
    let remote = daemon.path("fleet.git");
    assert_eq!(
        git_in(&remote, &["rev-parse", "promote/rel-1-wave-prod"]),
        f.git(&["rev-parse", "promote/rel-1-wave-prod"])
    );

    let reqs = forge.requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 1);
    let body = &reqs[0].body;
    assert_eq!(body["title"], "Promote rel-1 to wave prod");
    assert_eq!(body["head"], "promote/rel-1-wave-prod");
    assert_eq!(body["base"], "main");
    let md = body["body"].as_str().unwrap();
    assert!(md.contains("| cluster-b | prod | (none) | rel-1 |"), "the moves: {md}");
    assert!(md.contains("image:         registry.example.com/redis-operator:v1.0.0"), "the mapping: {md}");
    assert!(md.contains(&format!("signed by trusted key `{}`", f.fpr)), "{md}");
    assert!(md.contains("- from `(nothing installed)`: **nothing to compare with**"), "the CRD verdict: {md}");
    assert!(md.contains("| canary | cluster-a | no status |"), "earlier waves: {md}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forge_refusal_is_shown_clearly_and_exits_2() {
    let (url, _forge) = start_forge().await;
    let (f, _daemon) = tokio::task::spawn_blocking(Fixture::with_origin).await.unwrap();
    let out = tokio::task::spawn_blocking(move || {
        f.release("rel-1", "v1.0.0");
        let flags = forge_flags("github", &url, "acme/taken");
        let mut args = vec!["promote", "rel-1", "--cluster", "cluster-a", "--open-pr", "--offline"];
        args.extend(flags.iter().map(String::as_str));
        let out = promote_cli(&f, &args);
        // Without the token the command stops before writing anything.
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fleetgate"));
        let no_token = cmd
            .args(["promote", "rel-1", "--fleet", "--repo", "fleet", "--open-pr", "--offline", "--force"])
            .args(&flags)
            .env("NO_COLOR", "1")
            .env_remove("FLEETGATE_FORGE_TOKEN")
            .current_dir(f.dir.path())
            .output()
            .unwrap();
        (out, no_token, f.git(&["branch", "--list", "promote/rel-1-fleet"]))
    })
    .await
    .unwrap();
    let (out, no_token, fleet_branch) = out;
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("pushed     refs/heads/promote/rel-1-cluster-a to origin"),
        "what was done is still shown: {}",
        stdout(&out)
    );
    let err = stderr(&out);
    assert!(
        err.starts_with("error: GitHub refused to open the pull request (HTTP 422): Validation Failed; A pull request already exists for acme:promote/rel-1-cluster-a."),
        "{err}"
    );
    assert_eq!(no_token.status.code(), Some(2));
    assert!(
        stderr(&no_token).contains("no --forge-token-file given and $FLEETGATE_FORGE_TOKEN is not set"),
        "{}",
        stderr(&no_token)
    );
    assert!(fleet_branch.is_empty(), "nothing was written before the forge settings were checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_open_pr_opens_a_gitlab_merge_request_from_a_new_branch() {
    let (url, forge) = start_forge().await;
    let (f, daemon) = tokio::task::spawn_blocking(Fixture::with_origin).await.unwrap();
    let (out, f) = tokio::task::spawn_blocking(move || {
        for (id, tag) in [("rel-1", "v1.0.0"), ("rel-2", "v1.1.0")] {
            f.release(id, tag);
            let out = promote_cli(&f, &["promote", id, "--wave", "canary"]);
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            f.git(&[
                "merge",
                "-q",
                "--no-ff",
                "-m",
                &format!("Merge promote/{id}-wave-canary"),
                &format!("promote/{id}-wave-canary"),
            ]);
            if id == "rel-1" {
                // The canary's agent ran rel-1 well: where its rollback goes.
                status_support::report(&f.repo, "cluster-a", id, fleetgate::status::State::Success);
                f.git(&["push", "-q", "origin", "refs/notes/*:refs/notes/*"]);
            }
        }
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fleetgate"));
        cmd.args([
            "rollback",
            "--wave",
            "canary",
            "--repo",
            "fleet",
            "--open-pr",
            "--reason",
            "reconcile latency +35 %",
        ])
        .args(forge_flags("gitlab", &url, "platform/redis/fleet"))
        .env("NO_COLOR", "1")
        .env("FLEETGATE_FORGE_TOKEN", TOKEN)
        .current_dir(f.dir.path());
        (cmd.output().unwrap(), f)
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("PR         #12 https://gitlab.example.com/platform/redis/fleet/-/merge_requests/12"),
        "{text}"
    );
    assert!(f.show("main", "clusters/cluster-a.yaml").contains("  release: rel-2"), "main waits for the merge request");

    let reqs = forge.requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 1);
    let body = &reqs[0].body;
    let branch = body["source_branch"].as_str().unwrap();
    assert!(branch.starts_with("rollback/wave-canary-"), "{branch}");
    assert_eq!(body["target_branch"], "main");
    assert_eq!(body["title"], "Roll back wave canary: rel-2 -> rel-1");
    let md = body["description"].as_str().unwrap();
    assert!(md.contains("| cluster-a | canary | rel-2 | rel-1 |"), "{md}");
    assert!(md.contains("**Reason:** reconcile latency +35 %"), "{md}");
    assert!(md.contains("This reverts the promotion commit"), "{md}");
    let remote = daemon.path("fleet.git");
    assert_eq!(git_in(&remote, &["rev-parse", branch]), f.git(&["rev-parse", branch]), "the branch was pushed");
    assert!(f.show(branch, "clusters/cluster-a.yaml").contains("  release: rel-1"));
}

/// A fleet.yaml that still names a forge (the old `spec.status.forge` map, pointing at a
/// listener) is never used by `--open-pr`: without the caller's own --forge-* flags there is no
/// forge, and nothing is sent anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_pr_never_takes_the_forge_from_the_repo() {
    let (url, forge) = start_forge().await;
    let (f, _daemon) = tokio::task::spawn_blocking(Fixture::with_origin).await.unwrap();
    let (out, branch) = tokio::task::spawn_blocking(move || {
        let fleet = FLEET.replace(
            "  waves: [canary, prod]\n",
            &format!(
                "  waves: [canary, prod]\n  status:\n    forge:\n      kind: gitea\n      url: {url}\n      \
                 repository: acme/fleet\n      tokenEnv: FLEETGATE_FORGE_TOKEN\n"
            ),
        );
        std::fs::write(f.repo.join("fleet.yaml"), fleet).unwrap();
        f.git(&["commit", "-q", "-am", "forge"]);
        f.release("rel-1", "v1.0.0");
        let out = promote_cli(&f, &["promote", "rel-1", "--wave", "prod", "--open-pr", "--offline"]);
        (out, f.git(&["branch", "--list", "promote/rel-1-wave-prod"]))
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains("--open-pr needs a forge: pass --forge-kind, --forge-url"), "{}", stderr(&out));
    assert!(branch.is_empty(), "nothing was written");
    assert!(forge.requests.lock().unwrap().is_empty(), "the repo's forge was contacted");
}
