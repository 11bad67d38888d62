//! The agent's HTTP endpoints (axum):
//!
//! * `GET /healthz` — 200 while the process serves requests (liveness).
//! * `GET /readyz` — 200 once this agent leads and finished its first sync, or follows a known
//!   leader (a standby is ready, so rolling updates of a multi-replica Deployment progress); 503 with
//!   the reason otherwise.
//! * `GET /metrics` — OpenMetrics text ([`super::metrics`]).
//! * `POST /hooks/git` — a push notification from GitHub, Gitea/Forgejo or GitLab (their push
//!   payloads), or an empty body from anything else (`curl -X POST`): wakes the loop. Pushes to
//!   other branches are acknowledged and ignored; tags always count (a new release is a tag). With
//!   a webhook secret, a request must carry a valid `X-Hub-Signature-256` (GitHub, Gitea),
//!   `X-Gitea-Signature` (HMAC-SHA256 of the body) or `X-Gitlab-Token` (the secret itself).
//!
//! A standby (not leading) acknowledges a webhook with `"triggered": false` and the leader's name:
//! the leader picks the change up at its next poll. The default Deployment runs one replica, where
//! this does not arise.

use super::lease::Leadership;
use super::metrics::{CONTENT_TYPE, Metrics};
use super::triggers::{TriggerSender, TriggerSource};
use crate::model::error_chain;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::{oneshot, watch};

/// Push payloads with many commits are large; GitHub caps them at 25 MB, but only `ref` matters.
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Liveness and readiness inputs, shared by the loop (which marks the first sync) and the server.
#[derive(Debug, Clone)]
pub struct Health {
    synced: Arc<AtomicBool>,
    leadership: watch::Receiver<Leadership>,
}

impl Health {
    pub fn new(leadership: watch::Receiver<Leadership>) -> Health {
        Health { synced: Arc::new(AtomicBool::new(false)), leadership }
    }

    /// The loop calls this after its first sync (whatever the outcome) as leader.
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
    }

    /// `Ok(why ready)` or `Err(why not)`.
    pub fn readiness(&self) -> Result<String, String> {
        match &*self.leadership.borrow() {
            Leadership::Leading if self.synced.load(Ordering::Relaxed) => Ok("leading".to_string()),
            Leadership::Leading => Err("leading; first sync not finished".to_string()),
            Leadership::Following { holder: Some(h) } => Ok(format!("standby; leader is {h}")),
            Leadership::Following { holder: None } | Leadership::Unknown => Err("leader not known yet".to_string()),
        }
    }
}

/// How `POST /hooks/git` authenticates and which pushes it cares about.
#[derive(Clone)]
pub struct WebhookConfig {
    /// The tracked branch; pushes to other branches do not trigger.
    pub branch: String,
    secret: Option<Vec<u8>>,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("branch", &self.branch)
            .field("secret", &self.secret.as_ref().map(|_| "…"))
            .finish()
    }
}

impl WebhookConfig {
    pub fn new(branch: &str, secret: Option<Vec<u8>>) -> WebhookConfig {
        WebhookConfig { branch: branch.to_string(), secret }
    }

    /// Reads the secret from a file (a mounted Secret); a trailing newline is not part of it.
    pub fn with_secret_file(branch: &str, path: Option<&Path>) -> Result<WebhookConfig, ServerError> {
        let secret = path
            .map(|p| {
                std::fs::read(p)
                    .map(|mut s| {
                        while s.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                            s.pop();
                        }
                        s
                    })
                    .map_err(|source| ServerError::Secret { path: p.to_path_buf(), source })
            })
            .transpose()?;
        Ok(WebhookConfig::new(branch, secret))
    }

    /// Checks the request's signature or token against the secret (any request passes without one).
    fn authenticate(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), &'static str> {
        let Some(secret) = &self.secret else { return Ok(()) };
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let hmac_matches = |hex_sig: &str| {
            let Some(sig) = decode_hex(hex_sig.trim()) else { return false };
            let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length");
            mac.update(body);
            mac.verify_slice(&sig).is_ok()
        };
        if let Some(sig) = header("x-hub-signature-256") {
            let hex_sig = sig.strip_prefix("sha256=").ok_or("X-Hub-Signature-256 must start with sha256=")?;
            return if hmac_matches(hex_sig) { Ok(()) } else { Err("X-Hub-Signature-256 does not match the body") };
        }
        if let Some(sig) = header("x-gitea-signature") {
            return if hmac_matches(sig) { Ok(()) } else { Err("X-Gitea-Signature does not match the body") };
        }
        if let Some(token) = header("x-gitlab-token") {
            // Comparing digests keeps the comparison's timing independent of the secret.
            return if Sha256::digest(token.as_bytes()) == Sha256::digest(secret) {
                Ok(())
            } else {
                Err("X-Gitlab-Token does not match")
            };
        }
        Err("a webhook secret is configured: send X-Hub-Signature-256, X-Gitea-Signature or X-Gitlab-Token")
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// What the handlers share.
#[derive(Debug, Clone)]
pub struct ServerState {
    pub metrics: Arc<Metrics>,
    pub health: Health,
    pub triggers: TriggerSender,
    pub webhook: WebhookConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("listening on {addr}; pass another --listen address")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("reading webhook secret {path}")]
    Secret { path: PathBuf, source: std::io::Error },
}

pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/hooks/git", post(git_hook))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(Arc::new(state))
}

async fn readyz(State(s): State<Arc<ServerState>>) -> Response {
    match s.health.readiness() {
        Ok(why) => (StatusCode::OK, format!("ok: {why}\n")).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response(),
    }
}

async fn metrics(State(s): State<Arc<ServerState>>) -> Response {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], s.metrics.encode()).into_response()
}

fn answer(status: StatusCode, triggered: bool, reason: &str) -> Response {
    (status, axum::Json(json!({ "triggered": triggered, "reason": reason }))).into_response()
}

async fn git_hook(State(s): State<Arc<ServerState>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(why) = s.webhook.authenticate(&headers, &body) {
        tracing::warn!(reason = why, "refused a webhook call");
        return answer(StatusCode::UNAUTHORIZED, false, why);
    }
    let event = ["x-github-event", "x-gitea-event", "x-gitlab-event"]
        .iter()
        .find_map(|h| headers.get(*h).and_then(|v| v.to_str().ok()))
        .unwrap_or("");
    if event == "ping" {
        return answer(StatusCode::OK, false, "pong");
    }
    if !body.iter().all(u8::is_ascii_whitespace) {
        let payload: serde_json::Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                let why = format!(
                    "the body is neither empty nor a JSON push payload ({e}); set the webhook's content type to application/json"
                );
                return answer(StatusCode::BAD_REQUEST, false, &why);
            }
        };
        if let Some(git_ref) = payload.get("ref").and_then(|r| r.as_str())
            && let Some(branch) = git_ref.strip_prefix("refs/heads/")
            && branch != s.webhook.branch
        {
            return answer(StatusCode::ACCEPTED, false, &format!("push to {branch}; tracking {}", s.webhook.branch));
        }
    }
    let leadership = s.health.leadership.borrow().clone();
    if let Leadership::Following { holder } = leadership {
        let leader = holder.as_deref().unwrap_or("not known yet");
        return answer(
            StatusCode::ACCEPTED,
            false,
            &format!("standby; the leader ({leader}) picks this up at its next poll"),
        );
    }
    s.triggers.fire(TriggerSource::Webhook);
    answer(StatusCode::ACCEPTED, true, "sync scheduled")
}

/// The server running in a background task.
#[derive(Debug)]
pub struct HttpServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port) and serves [`router`] until [`stop`](Self::stop) or drop.
    pub async fn start(addr: SocketAddr, state: ServerState) -> Result<HttpServer, ServerError> {
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { addr, source })?;
        let local = listener.local_addr().map_err(|source| ServerError::Bind { addr, source })?;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let app = router(state);
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stop_rx.await;
                })
                .await
        });
        tracing::info!(%local, "serving /healthz /readyz /metrics /hooks/git");
        Ok(HttpServer { addr: local, stop: Some(stop_tx), task: Some(task) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting connections and waits for in-flight requests.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take()
            && let Ok(Err(e)) = task.await
        {
            tracing::warn!(error = %error_chain(&e), "HTTP server ended with an error");
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn sign(secret: &[u8], body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
        mac.update(body);
        mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[rstest]
    #[case::github(vec![("x-hub-signature-256", format!("sha256={}", sign(b"s3cret", b"{}")))], true)]
    #[case::github_wrong(vec![("x-hub-signature-256", format!("sha256={}", sign(b"other", b"{}")))], false)]
    #[case::github_no_prefix(vec![("x-hub-signature-256", sign(b"s3cret", b"{}"))], false)]
    #[case::gitea(vec![("x-gitea-signature", sign(b"s3cret", b"{}"))], true)]
    #[case::gitlab(vec![("x-gitlab-token", "s3cret".to_string())], true)]
    #[case::gitlab_wrong(vec![("x-gitlab-token", "guess".to_string())], false)]
    #[case::not_hex(vec![("x-gitea-signature", "zz".to_string())], false)]
    #[case::nothing(vec![], false)]
    fn authentication(#[case] pairs: Vec<(&'static str, String)>, #[case] ok: bool) {
        let w = WebhookConfig::new("main", Some(b"s3cret".to_vec()));
        assert_eq!(w.authenticate(&headers(&pairs), b"{}").is_ok(), ok);
    }

    #[test]
    fn no_secret_accepts_anything() {
        assert!(WebhookConfig::new("main", None).authenticate(&HeaderMap::new(), b"x").is_ok());
    }

    #[test]
    fn secret_file_drops_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secret");
        std::fs::write(&p, "s3cret\n").unwrap();
        let w = WebhookConfig::with_secret_file("main", Some(&p)).unwrap();
        assert_eq!(w.secret.as_deref(), Some(&b"s3cret"[..]));
    }

    #[rstest]
    #[case(Leadership::Leading, false, false)]
    #[case(Leadership::Leading, true, true)]
    #[case(Leadership::Following { holder: Some("a".into()) }, false, true)]
    #[case(Leadership::Following { holder: None }, true, false)]
    #[case(Leadership::Unknown, true, false)]
    fn readiness(#[case] leadership: Leadership, #[case] synced: bool, #[case] ready: bool) {
        let (_tx, rx) = watch::channel(leadership);
        let h = Health::new(rx);
        if synced {
            h.mark_synced();
        }
        assert_eq!(h.readiness().is_ok(), ready);
    }
}
