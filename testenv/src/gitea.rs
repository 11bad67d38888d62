//! Gitea, a real forge, built by `hack/gitea-binary.sh` from its Go module into the cache: SQLite,
//! loopback on a free port, its own work dir in a temp dir, an admin made with its CLI and an API
//! token from its API; the process is killed on drop. Plain HTTP by default, or HTTPS with a
//! certificate and key the test brings ([`GiteaOptions::tls`]).
//!
//! What fleetgate's tests need of it, through its documented API (`/api/v1`): a repo
//! ([`Gitea::create_repo`]) the fleet repo is pushed to with plain `git push` over HTTP
//! ([`Gitea::push_url`]), a push webhook with a secret ([`Gitea::add_push_webhook`]), pull
//! requests to list and merge ([`Gitea::merge_pull`]), and a commit's statuses
//! ([`Gitea::statuses`]).
//!
//! Without the binary, [`Gitea::binary`] is None and [`Gitea::skip_message`] says how to build it:
//! tests print it and return, as tests of other optional components do.
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! let Some(_) = fleetgate_testenv::Gitea::binary() else { return Ok(()) };
//! let gitea = fleetgate_testenv::Gitea::start().await?;
//! let clone = gitea.create_repo("fleet").await?;
//! println!("{clone} (push to {})", gitea.push_url("fleet"));
//! # Ok(()) }
//! ```

use crate::process::{Guarded, free_port};
use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The version `hack/gitea-binary.sh` builds (and the cache directory it builds into).
pub const GITEA_VERSION: &str = "v1.26.0";
/// The admin user the harness creates; it owns every repo it creates.
pub const GITEA_ADMIN: &str = "fleetgate";
const ADMIN_PASSWORD: &str = "fleetgate-test-password-1";

/// How the harness serves Gitea.
#[derive(Debug, Clone, Default)]
pub struct GiteaOptions {
    /// Serve HTTPS with this certificate (PEM: the server's certificate, then its issuers) and
    /// key instead of plain HTTP (`[server] PROTOCOL = https`, `CERT_FILE`, `KEY_FILE`). The
    /// harness's own client ([`Gitea::client`]) trusts every certificate in the file; Git clients
    /// under test are given the CA (or not) by the test.
    pub tls: Option<(PathBuf, PathBuf)>,
}

pub struct Gitea {
    proc: Guarded,
    port: u16,
    scheme: &'static str,
    token: String,
    client: reqwest::Client,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Gitea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gitea").field("url", &self.url()).field("dir", &self.dir.path()).finish_non_exhaustive()
    }
}

impl Gitea {
    /// The binary: `$FLEETGATE_GITEA`, else the one `hack/gitea-binary.sh` caches
    /// (`~/.cache/fleetgate/gitea-v1.26.0/gitea`), when it exists with its `options/` beside it.
    pub fn binary() -> Option<PathBuf> {
        let bin = match std::env::var_os("FLEETGATE_GITEA") {
            Some(path) => PathBuf::from(path),
            None => {
                let cache = std::env::var_os("FLEETGATE_CACHE").map(PathBuf::from).or_else(|| {
                    std::env::var_os("XDG_CACHE_HOME")
                        .map(PathBuf::from)
                        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                        .map(|c| c.join("fleetgate"))
                })?;
                cache.join(format!("gitea-{GITEA_VERSION}")).join("gitea")
            }
        };
        (bin.is_file() && bin.parent()?.join("options").is_dir()).then_some(bin)
    }

    /// What a test prints when it skips for want of the binary.
    pub fn skip_message() -> String {
        format!("SKIPPED: Gitea {GITEA_VERSION} is not built (`make testenv` or `bash hack/gitea-binary.sh` builds it)")
    }

    /// [`start_with`](Self::start_with) the defaults: plain HTTP.
    pub async fn start() -> anyhow::Result<Gitea> {
        Gitea::start_with(GiteaOptions::default()).await
    }

    /// Writes `app.ini`, migrates the database, creates the admin with `gitea admin user create`,
    /// starts `gitea web`, waits up to 60 s for its API, and takes a token from it.
    pub async fn start_with(options: GiteaOptions) -> anyhow::Result<Gitea> {
        let bin = Gitea::binary().with_context(Gitea::skip_message)?;
        // Gitea keeps sockets and its queue's files under the work dir: keep the path short.
        let dir = tempfile::Builder::new().prefix("fg-gitea-").tempdir_in("/tmp")?;
        let port = free_port();
        let scheme = if options.tls.is_some() { "https" } else { "http" };
        let config = dir.path().join("app.ini");
        std::fs::write(&config, app_ini(dir.path(), bin.parent().context("binary dir")?, port, &options))?;
        let gitea = |args: &[&str]| -> anyhow::Result<()> {
            let out = Command::new(&bin)
                .args(args)
                .arg("--config")
                .arg(&config)
                .env("GITEA_WORK_DIR", dir.path())
                .env("HOME", dir.path())
                .output()
                .with_context(|| format!("running gitea {args:?}"))?;
            ensure!(
                out.status.success(),
                "gitea {args:?}: {}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            );
            Ok(())
        };
        gitea(&["migrate"])?;
        gitea(&[
            "admin",
            "user",
            "create",
            "--admin",
            "--username",
            GITEA_ADMIN,
            "--password",
            ADMIN_PASSWORD,
            "--email",
            "fleetgate@example.com",
            "--must-change-password=false",
        ])?;
        let mut cmd = Command::new(&bin);
        cmd.args(["web", "--config"]).arg(&config).env("GITEA_WORK_DIR", dir.path()).env("HOME", dir.path());
        let proc = Guarded::spawn("gitea", cmd, &dir.path().join("gitea.log"))?;
        // rustls on ring, as fleetgate's own clients (`Err`: a provider is installed already).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut client = reqwest::Client::builder().tls_backend_rustls().timeout(Duration::from_secs(30));
        if let Some((cert, _)) = &options.tls {
            let pem = std::fs::read(cert).with_context(|| cert.display().to_string())?;
            // The test's own chain, trusted as roots so the harness talks to its server: the
            // issuer must be among them (a leaf alone is no trust anchor).
            for cert in reqwest::Certificate::from_pem_bundle(&pem)? {
                client = client.add_root_certificate(cert);
            }
        }
        let mut gitea = Gitea { proc, port, scheme, token: String::new(), client: client.build()?, dir };
        gitea.wait_ready(Duration::from_secs(60)).await?;
        gitea.token = gitea.create_token().await?;
        Ok(gitea)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.proc.exited() {
                bail!("gitea exited early ({status}){}", self.log_tail());
            }
            if let Ok(r) = self.client.get(format!("{}/api/v1/version", self.url())).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("gitea did not answer /api/v1/version within {timeout:?}{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `POST /api/v1/users/{admin}/tokens` with basic auth (the one call that needs the password).
    async fn create_token(&self) -> anyhow::Result<String> {
        let scopes = ["write:repository", "write:user", "write:issue", "write:organization", "write:admin"];
        let r = self
            .client
            .post(format!("{}/api/v1/users/{GITEA_ADMIN}/tokens", self.url()))
            .basic_auth(GITEA_ADMIN, Some(ADMIN_PASSWORD))
            .json(&json!({"name": "fleetgate-test", "scopes": scopes}))
            .send()
            .await?;
        let v = answer(r, "creating an API token").await?;
        Ok(v["sha1"].as_str().context("no sha1 in the token answer")?.to_string())
    }

    /// `http(s)://127.0.0.1:PORT`, the server root (what `--forge-url` takes).
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.port)
    }

    /// The admin's API token (what `--forge-token-file` holds).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// `owner/name` of a repo the harness created.
    pub fn repository(&self, name: &str) -> String {
        format!("{GITEA_ADMIN}/{name}")
    }

    /// The clone URL of `name`, without credentials (public repos clone anonymously).
    pub fn clone_url(&self, name: &str) -> String {
        format!("{}/{GITEA_ADMIN}/{name}.git", self.url())
    }

    /// [`clone_url`](Self::clone_url) with the admin's token as password, for `git push`.
    pub fn push_url(&self, name: &str) -> String {
        format!("{}://{GITEA_ADMIN}:{}@127.0.0.1:{}/{GITEA_ADMIN}/{name}.git", self.scheme, self.token, self.port)
    }

    /// Where Gitea keeps the bare repo `name` on disk (for inspecting it with plain `git`).
    pub fn repo_path(&self, name: &str) -> PathBuf {
        self.dir.path().join("repos").join(GITEA_ADMIN).join(format!("{name}.git"))
    }

    /// Creates an empty public repo `name` owned by the admin, default branch `main`; returns its
    /// [`clone_url`](Self::clone_url).
    pub async fn create_repo(&self, name: &str) -> anyhow::Result<String> {
        let body = json!({"name": name, "private": false, "auto_init": false, "default_branch": "main"});
        self.api(reqwest::Method::POST, "/user/repos", Some(body)).await?;
        Ok(self.clone_url(name))
    }

    /// Adds a push webhook (Gitea's own type, JSON, signed with `secret` when given) to `url`;
    /// returns the hook's id.
    pub async fn add_push_webhook(&self, repo: &str, url: &str, secret: Option<&str>) -> anyhow::Result<u64> {
        let mut config = json!({"url": url, "content_type": "json"});
        if let Some(secret) = secret {
            config["secret"] = json!(secret);
        }
        let body = json!({"type": "gitea", "config": config, "events": ["push"], "active": true, "branch_filter": "*"});
        let v = self.api(reqwest::Method::POST, &format!("/repos/{}/hooks", self.repository(repo)), Some(body)).await?;
        v["id"].as_u64().context("no id in the hook answer")
    }

    /// The pull requests of `repo` in `state` (`open`, `closed`, `all`), newest first.
    pub async fn pulls(&self, repo: &str, state: &str) -> anyhow::Result<Vec<Value>> {
        let path = format!("/repos/{}/pulls?state={state}", self.repository(repo));
        Ok(self.api(reqwest::Method::GET, &path, None).await?.as_array().cloned().unwrap_or_default())
    }

    /// Pull request `number` of `repo`.
    pub async fn pull(&self, repo: &str, number: u64) -> anyhow::Result<Value> {
        self.api(reqwest::Method::GET, &format!("/repos/{}/pulls/{number}", self.repository(repo)), None).await
    }

    /// The unified diff of pull request `number`.
    pub async fn pull_diff(&self, repo: &str, number: u64) -> anyhow::Result<String> {
        let url = format!("{}/api/v1/repos/{}/pulls/{number}.diff", self.url(), self.repository(repo));
        let r = self.client.get(url).header("authorization", format!("token {}", self.token)).send().await?;
        ensure!(r.status().is_success(), "GET pull {number}.diff: HTTP {}", r.status());
        Ok(r.text().await?)
    }

    /// Merges pull request `number` with `style` (`merge`, `rebase`, `fast-forward-only`,
    /// `squash`). Gitea checks a new PR's mergeability in the background and refuses a merge
    /// until it has, so this retries for up to 30 s.
    pub async fn merge_pull(&self, repo: &str, number: u64, style: &str) -> anyhow::Result<()> {
        let path = format!("/repos/{}/pulls/{number}/merge", self.repository(repo));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.api(reqwest::Method::POST, &path, Some(json!({"Do": style}))).await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "merge not possible yet");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(e) => return Err(e.context(format!("merging pull request {number}"))),
            }
        }
    }

    /// The newest status of each context on `sha` (Gitea's combined status): `context`,
    /// `status` (Gitea's name for the state), `description`, `target_url`.
    pub async fn statuses(&self, repo: &str, sha: &str) -> anyhow::Result<Vec<Value>> {
        let path = format!("/repos/{}/commits/{sha}/status", self.repository(repo));
        let combined = self.api(reqwest::Method::GET, &path, None).await?;
        Ok(combined["statuses"].as_array().cloned().unwrap_or_default())
    }

    /// One API call with the admin's token; the answer's JSON (Null for an empty body).
    pub async fn api(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let what = format!("{method} {path}");
        let mut req = self
            .client
            .request(method, format!("{}/api/v1{path}", self.url()))
            .header("authorization", format!("token {}", self.token));
        if let Some(body) = body {
            req = req.json(&body);
        }
        answer(req.send().await.with_context(|| what.clone())?, &what).await
    }

    /// A client that trusts the certificate given in [`GiteaOptions::tls`] (when any), for tests
    /// that talk to this Gitea themselves.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("gitea.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!("\n--- last lines of gitea.log ---\n{}", lines[lines.len().saturating_sub(20)..].join("\n"))
    }
}

async fn answer(r: reqwest::Response, what: &str) -> anyhow::Result<Value> {
    let status = r.status();
    let text = r.text().await?;
    ensure!(status.is_success(), "{what}: HTTP {status}: {text}");
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&text).with_context(|| format!("{what}: the answer is not JSON"))
}

/// The smallest configuration that runs Gitea's API on loopback: no SSH, no mail, no Actions, no
/// outside calls (`OFFLINE_MODE`), webhooks allowed to loopback only (Gitea's default refuses
/// private addresses), and the built-in `options/` read from the binary's cache dir.
fn app_ini(work: &Path, static_root: &Path, port: u16, options: &GiteaOptions) -> String {
    let w = work.display();
    let (scheme, tls) = match &options.tls {
        Some((cert, key)) => {
            ("https", format!("PROTOCOL = https\nCERT_FILE = {}\nKEY_FILE = {}\n", cert.display(), key.display()))
        }
        None => ("http", "PROTOCOL = http\n".to_string()),
    };
    // Gitea refuses to run as root unless told; tests here often do.
    format!(
        "I_AM_BEING_UNSAFE_RUNNING_AS_ROOT = true\nAPP_NAME = fleetgate test forge\nRUN_MODE = prod\nWORK_PATH = {w}\n\n\
         [server]\n{tls}HTTP_ADDR = 127.0.0.1\nHTTP_PORT = {port}\nROOT_URL = {scheme}://127.0.0.1:{port}/\n\
         DISABLE_SSH = true\nSTART_SSH_SERVER = false\nOFFLINE_MODE = true\nLFS_START_SERVER = false\n\
         STATIC_ROOT_PATH = {}\nAPP_DATA_PATH = {w}/data\n\n\
         [database]\nDB_TYPE = sqlite3\nPATH = {w}/gitea.db\n\n\
         [repository]\nROOT = {w}/repos\nDEFAULT_BRANCH = main\n\n\
         [security]\nINSTALL_LOCK = true\nSECRET_KEY = fleetgate-test-secret-key\n\n\
         [service]\nDISABLE_REGISTRATION = true\nREQUIRE_SIGNIN_VIEW = false\n\n\
         [webhook]\nALLOWED_HOST_LIST = loopback\nDELIVER_TIMEOUT = 10\n\n\
         [indexer]\nISSUE_INDEXER_TYPE = db\nREPO_INDEXER_ENABLED = false\n\n\
         [actions]\nENABLED = false\n\n[mailer]\nENABLED = false\n\n\
         [session]\nPROVIDER = memory\n\n[cache]\nADAPTER = memory\n\n\
         [log]\nMODE = console\nLEVEL = Warn\n",
        static_root.display()
    )
}
