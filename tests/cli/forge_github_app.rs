//! GitHub App authentication against a local server that holds GitHub's side of the contract: it
//! knows the app's public key, accepts only a JWT GitHub would (RS256 by that key, `iss` the app
//! id, at most 10 minutes long, not expired), mints installation tokens with an `expires_at`, and
//! accepts a status or a pull request only with a token it minted and that has not expired.
//! Shown: statuses and `promote --open-pr` with installation tokens, a token reused while it
//! lasts and renewed before it expires, GitHub's refusals named, and a token file re-read when
//! it changes.

use crate::releng_common;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, TimeDelta, Utc};
use fleetgate::model::ForgeKind;
use fleetgate::status::{ForgeBackend, ForgeSettings, State, Status};
use openssl::pkey::{PKey, Private, Public};
use releng_common::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const APP_ID: u64 = 4242;
const INSTALLATION: u64 = 99;
const REPOSITORY: &str = "octo/fleet";
const SHA: &str = "6dcb09b5b57875f334f61aebed695e2e4193db5e";
/// Personal tokens the server also accepts (the token-file case).
const PERSONAL: [&str; 2] = ["ghp_first", "ghp_second"];

/// GitHub's side: the app's public key, the tokens it minted, and what it was sent.
#[derive(Clone)]
struct GitHub {
    public: Arc<PKey<Public>>,
    /// How long minted tokens live.
    ttl: Arc<Mutex<TimeDelta>>,
    minted: Arc<Mutex<Vec<(String, DateTime<Utc>)>>>,
    /// `METHOD path authorization` of every request.
    seen: Arc<Mutex<Vec<String>>>,
}

fn err(code: StatusCode, message: &str) -> (StatusCode, axum::Json<Value>) {
    (code, axum::Json(json!({"message": message, "documentation_url": "https://docs.github.com/rest"})))
}

impl GitHub {
    /// Whether GitHub would take `auth` as this app's JWT; why not, else.
    fn check_jwt(&self, auth: &str) -> Result<(), String> {
        let jwt = auth.strip_prefix("Bearer ").ok_or("not a Bearer authorization")?;
        let parts: Vec<&str> = jwt.split('.').collect();
        let [header, claims, signature] = parts[..] else { return Err("not three parts".into()) };
        let decode = |p: &str| -> Result<Value, String> {
            let bytes = URL_SAFE_NO_PAD.decode(p).map_err(|e| e.to_string())?;
            serde_json::from_slice(&bytes).map_err(|e| e.to_string())
        };
        if decode(header)?["alg"] != "RS256" {
            return Err("alg is not RS256".into());
        }
        let claims = decode(claims)?;
        let (iat, exp) = (claims["iat"].as_i64().ok_or("no iat")?, claims["exp"].as_i64().ok_or("no exp")?);
        let now = Utc::now().timestamp();
        if claims["iss"] != APP_ID.to_string() || iat > now + 5 || exp <= now || exp - iat > 600 {
            return Err(format!("claims {claims} refused at {now}"));
        }
        let mut verifier = openssl::sign::Verifier::new(openssl::hash::MessageDigest::sha256(), &self.public).unwrap();
        verifier.update(format!("{header}.{}", parts[1]).as_bytes()).unwrap();
        let sig = URL_SAFE_NO_PAD.decode(signature).map_err(|e| e.to_string())?;
        verifier.verify(&sig).unwrap_or(false).then_some(()).ok_or_else(|| "bad signature".to_string())
    }

    /// Whether `auth` carries a token this server minted and that has not expired, or a personal one.
    fn token_ok(&self, auth: &str) -> bool {
        let Some(token) = auth.strip_prefix("Bearer ") else { return false };
        PERSONAL.contains(&token)
            || self.minted.lock().unwrap().iter().any(|(t, until)| t == token && *until > Utc::now())
    }

    fn minted(&self) -> Vec<String> {
        self.minted.lock().unwrap().iter().map(|(t, _)| t.clone()).collect()
    }

    fn seen(&self, what: &str) -> Vec<String> {
        self.seen.lock().unwrap().iter().filter(|s| s.contains(what)).cloned().collect()
    }
}

async fn handle(
    axum::extract::State(gh): axum::extract::State<GitHub>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    _body: Bytes,
) -> (StatusCode, axum::Json<Value>) {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let path = uri.path().to_string();
    gh.seen.lock().unwrap().push(format!("{method} {path} {auth}"));
    if headers.get("accept").and_then(|v| v.to_str().ok()) != Some("application/vnd.github+json")
        || headers.get("x-github-api-version").is_none()
        || headers.get("user-agent").is_none()
    {
        return err(StatusCode::BAD_REQUEST, "missing GitHub API headers");
    }
    let app_call = path.starts_with("/app/") || path.ends_with("/installation");
    if app_call {
        if let Err(why) = gh.check_jwt(&auth) {
            return err(StatusCode::UNAUTHORIZED, &format!("A JSON web token could not be decoded ({why})"));
        }
    } else if !gh.token_ok(&auth) {
        return err(StatusCode::UNAUTHORIZED, "Bad credentials");
    }
    match (method.as_str(), path.as_str()) {
        ("GET", "/repos/octo/fleet/installation") => {
            (StatusCode::OK, axum::Json(json!({"id": INSTALLATION, "app_id": APP_ID, "target_type": "Organization"})))
        }
        ("POST", p) if p == format!("/app/installations/{INSTALLATION}/access_tokens") => {
            let mut minted = gh.minted.lock().unwrap();
            let token = format!("ghs_{}", minted.len() + 1);
            let until = Utc::now() + *gh.ttl.lock().unwrap();
            minted.push((token.clone(), until));
            let answer = json!({"token": token, "expires_at": until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                                "permissions": {"statuses": "write", "pull_requests": "write"}});
            (StatusCode::CREATED, axum::Json(answer))
        }
        ("POST", p) if p == format!("/repos/octo/fleet/statuses/{SHA}") => {
            (StatusCode::CREATED, axum::Json(json!({"id": 1, "state": "success", "context": "fleetgate/cluster-a"})))
        }
        ("POST", "/repos/octo/fleet/pulls") => (
            StatusCode::CREATED,
            axum::Json(json!({"id": 1, "number": 42, "html_url": "https://github.com/octo/fleet/pull/42"})),
        ),
        _ => err(StatusCode::NOT_FOUND, "Not Found"),
    }
}

/// The server on a loopback port, for an app whose private key is written to `dir/app.pem`.
async fn start(dir: &Path, ttl: TimeDelta) -> (String, GitHub, PathBuf) {
    let key: PKey<Private> = PKey::from_rsa(openssl::rsa::Rsa::generate(2048).unwrap()).unwrap();
    let file = dir.join("app.pem");
    // PKCS#1 (`BEGIN RSA PRIVATE KEY`), the form GitHub hands out.
    std::fs::write(&file, key.rsa().unwrap().private_key_to_pem().unwrap()).unwrap();
    let public = PKey::public_key_from_pem(&key.public_key_to_pem().unwrap()).unwrap();
    let gh = GitHub {
        public: Arc::new(public),
        ttl: Arc::new(Mutex::new(ttl)),
        minted: Arc::default(),
        seen: Arc::default(),
    };
    let app = axum::Router::new().fallback(handle).with_state(gh.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, gh, file)
}

fn app_settings(url: &str, repository: &str, key: &Path, installation: Option<u64>) -> ForgeSettings {
    ForgeSettings {
        kind: Some(ForgeKind::Github),
        url: Some(url.to_string()),
        repository: Some(repository.to_string()),
        app_id: Some(APP_ID),
        app_installation_id: installation,
        app_key_file: Some(key.to_path_buf()),
        ..Default::default()
    }
}

fn status() -> Status {
    Status::new("cluster-a", "rel-1", SHA, State::Success, "baked 20 s, every gate passed")
}

/// What the agent does every pass: a backend from its configuration, then one status.
async fn send_status(settings: &ForgeSettings) -> Result<(), fleetgate::status::ForgeError> {
    let config = settings.clone().resolve()?.expect("a forge");
    ForgeBackend::from_config(&config).await?.send(&status()).await
}

#[tokio::test]
async fn statuses_carry_an_installation_token_that_is_minted_once_and_reused_while_it_lasts() {
    let dir = tempfile::tempdir().unwrap();
    let (url, gh, key) = start(dir.path(), TimeDelta::hours(1)).await;
    let settings = app_settings(&url, REPOSITORY, &key, None);
    for _ in 0..3 {
        send_status(&settings).await.unwrap();
    }
    assert_eq!(gh.minted(), ["ghs_1"], "one token for three passes");
    assert_eq!(gh.seen("/installation ").len(), 1, "the installation was looked up once: {:?}", gh.seen(""));
    let statuses = gh.seen("/statuses/");
    assert_eq!(statuses.len(), 3);
    assert!(statuses.iter().all(|s| s.ends_with("Bearer ghs_1")), "{statuses:?}");
}

#[tokio::test]
async fn a_token_close_to_its_expiry_is_renewed_before_it_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    // Four minutes left is inside the renewal margin: every pass gets a fresh token.
    let (url, gh, key) = start(dir.path(), TimeDelta::minutes(4)).await;
    let settings = app_settings(&url, REPOSITORY, &key, Some(INSTALLATION));
    send_status(&settings).await.unwrap();
    send_status(&settings).await.unwrap();
    assert_eq!(gh.minted(), ["ghs_1", "ghs_2"]);
    assert!(gh.seen("/installation ").is_empty(), "a given installation id is not looked up");
    let statuses = gh.seen("/statuses/");
    assert!(statuses[0].ends_with("Bearer ghs_1") && statuses[1].ends_with("Bearer ghs_2"), "{statuses:?}");
    // Once the app's tokens last again, the last one is kept.
    *gh.ttl.lock().unwrap() = TimeDelta::hours(1);
    send_status(&settings).await.unwrap();
    send_status(&settings).await.unwrap();
    assert_eq!(gh.minted().len(), 3);
}

#[tokio::test]
async fn what_github_refuses_is_named_with_what_to_check() {
    let dir = tempfile::tempdir().unwrap();
    let (url, gh, key) = start(dir.path(), TimeDelta::hours(1)).await;

    // Another app's key: GitHub refuses the JWT, and no status is sent.
    let other = dir.path().join("other.pem");
    let stranger = PKey::from_rsa(openssl::rsa::Rsa::generate(2048).unwrap()).unwrap();
    std::fs::write(&other, stranger.private_key_to_pem_pkcs8().unwrap()).unwrap();
    let e = send_status(&app_settings(&url, REPOSITORY, &other, None)).await.unwrap_err().to_string();
    assert!(e.contains("GitHub refused the JWT of GitHub App 4242 (401: A JSON web token could not be decoded"), "{e}");
    assert!(e.contains("that the private key is this app's"), "{e}");

    // Not installed on the repository.
    let e = send_status(&app_settings(&url, "octo/elsewhere", &key, None)).await.unwrap_err().to_string();
    assert!(
        e.contains("GitHub App 4242 has no installation on octo/elsewhere (404: Not Found); install the app"),
        "{e}"
    );
    let e = send_status(&app_settings(&url, REPOSITORY, &key, Some(7))).await.unwrap_err().to_string();
    assert!(e.contains("no installation 7") && e.contains("check --forge-app-installation-id"), "{e}");

    // A key file that is not a key.
    let token_file = dir.path().join("token.pem");
    std::fs::write(&token_file, "ghp_pasted_by_mistake\n").unwrap();
    let e = send_status(&app_settings(&url, REPOSITORY, &token_file, None)).await.unwrap_err().to_string();
    assert!(e.contains("token.pem: not a PEM private key"), "{e}");
    assert!(gh.seen("/statuses/").is_empty(), "{:?}", gh.seen(""));
}

#[tokio::test]
async fn a_token_file_that_changes_on_disk_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let (url, gh, _) = start(dir.path(), TimeDelta::hours(1)).await;
    let file = dir.path().join("token");
    let settings = ForgeSettings {
        kind: Some(ForgeKind::Github),
        url: Some(url),
        repository: Some(REPOSITORY.into()),
        token_file: Some(file.clone()),
        ..Default::default()
    };
    std::fs::write(&file, format!("{}\n", PERSONAL[0])).unwrap();
    send_status(&settings).await.unwrap();
    // The Secret is rotated: kubelet swaps the mounted file.
    std::fs::write(&file, format!("{}\n", PERSONAL[1])).unwrap();
    send_status(&settings).await.unwrap();
    let statuses = gh.seen("/statuses/");
    assert!(statuses[0].ends_with("Bearer ghp_first") && statuses[1].ends_with("Bearer ghp_second"), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_open_pr_opens_the_pull_request_as_the_app() {
    let dir = tempfile::tempdir().unwrap();
    let (url, gh, key) = start(dir.path(), TimeDelta::hours(1)).await;
    let out = tokio::task::spawn_blocking(move || {
        let (f, _daemon) = Fixture::with_origin();
        f.release("rel-1", "v1.0.0");
        let keys = f.keys.to_str().unwrap().to_string();
        let key = key.to_str().unwrap().to_string();
        let app_id = APP_ID.to_string();
        f.fleetgate(&[
            "promote",
            "rel-1",
            "--wave",
            "canary",
            "--open-pr",
            "--offline",
            "--repo",
            "fleet",
            "--trusted-keys",
            &keys,
            "--forge-kind",
            "github",
            "--forge-url",
            &url,
            "--forge-repository",
            REPOSITORY,
            "--forge-app-id",
            &app_id,
            "--forge-app-key-file",
            &key,
        ])
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("PR         #42 https://github.com/octo/fleet/pull/42"), "{}", stdout(&out));
    assert_eq!(gh.seen("POST /repos/octo/fleet/pulls Bearer ghs_1").len(), 1, "{:?}", gh.seen(""));
}
