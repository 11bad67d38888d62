//! The agent's HTTP endpoints (axum):
//!
//! * `GET /healthz` — 200 while the process serves requests (liveness).
//! * `GET /readyz` — 200 once this agent leads and finished its first sync, or follows a known
//!   leader (a standby is ready, so rolling updates of a multi-replica Deployment progress); 503 with
//!   the reason otherwise (for a leader whose passes fail, the last failure: Git out of reach, …).
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
//!
//! The webhook is the one endpoint that reads what a caller sends, so it is bounded before it
//! reads anything: at most [`MAX_CONCURRENT_HOOKS`] deliveries are handled at once (the rest get
//! 429 at once, nothing queues), a declared `Content-Length` over [`MAX_BODY_BYTES`] gets 413, and
//! a request that cannot authenticate from its headers alone (no signature header, a wrong GitLab
//! token, a signature that is not hex) gets 401 — none of them has its body read. Bodies that must
//! be read (HMAC schemes, or no secret) are read as a stream, abandoned past [`MAX_BODY_BYTES`]
//! (413) or after [`BODY_TIMEOUT`] (408). A signed delivery is accepted once: its HMAC (which
//! only the secret's holders can make, unlike a delivery-id header) is remembered, and the same
//! signature again, or a push payload whose signed `repository.pushed_at` is older than
//! [`REPLAY_WINDOW`] or than the server's start, gets 409 and counts in
//! `fleetgate_webhook_replays_total`. The signatures seen are kept in memory only; a restart
//! does not reopen the window for push payloads, because a push from before the start is
//! refused: the agent's first pass after a start syncs anyway, so such a delivery has nothing to
//! say (a forge's retry after an outage gets 409 and is not needed). A delivery without a time
//! (an empty body) may come once more after a restart: all it can do is wake one poll.
//! `/healthz`, `/readyz` and `/metrics` share no limit with
//! it, so a flood of deliveries does not make the probes fail. Every connection must send each
//! request head within [`HEADER_TIMEOUT`] or it is closed, so connections that never finish a
//! request do not pile up.

use super::lease::Leadership;
use super::metrics::{CONTENT_TYPE, Metrics};
use super::triggers::{TriggerSender, TriggerSource};
use crate::model::error_chain;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
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
use std::time::Duration;
use tokio::sync::{Semaphore, oneshot, watch};

/// Only `ref` of a push payload matters. GitHub sends up to 25 MB for pushes of many commits;
/// reading those is not worth an agent's memory: a refused delivery costs nothing, because the
/// loop polls anyway (and forges show the 413 in their delivery log).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Webhook deliveries handled at once; one is enough to wake the loop, a few cover retries and
/// several forges.
pub const MAX_CONCURRENT_HOOKS: usize = 4;
/// How long a delivery may take to send its body (a slow sender holds one of the few slots).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request head (hyper's default is 30 s; probes and
/// forges send theirs at once).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How old a signed push may be (its payload's `repository.pushed_at`) and still wake the loop.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(5 * 60);
/// Signatures of accepted deliveries remembered; the oldest is forgotten first. Only deliveries
/// that carry a valid HMAC are remembered, so only the secret's holders fill it.
const REMEMBERED_DELIVERIES: usize = 1024;

/// Liveness and readiness inputs, shared by the loop (which marks the first sync) and the server.
#[derive(Debug, Clone)]
pub struct Health {
    synced: Arc<AtomicBool>,
    /// Why the last pass failed, until one succeeds.
    failing: Arc<std::sync::Mutex<Option<String>>>,
    leadership: watch::Receiver<Leadership>,
}

impl Health {
    pub fn new(leadership: watch::Receiver<Leadership>) -> Health {
        Health { synced: Arc::new(AtomicBool::new(false)), failing: Arc::default(), leadership }
    }

    /// The loop calls this after each pass that succeeded as leader.
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The loop calls this after a pass that failed: an agent that has not synced yet says why it
    /// is not ready (a Git server that never answers, an unreachable API server) instead of only
    /// that its first sync has not finished.
    pub fn mark_failed(&self, why: String) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }

    /// `Ok(why ready)` or `Err(why not)`.
    pub fn readiness(&self) -> Result<String, String> {
        match &*self.leadership.borrow() {
            Leadership::Leading if self.synced.load(Ordering::Relaxed) => Ok("leading".to_string()),
            Leadership::Leading => match &*self.failing.lock().unwrap_or_else(|e| e.into_inner()) {
                Some(why) => Err(format!("leading; first sync not finished: the last pass failed: {why}")),
                None => Err("leading; first sync not finished".to_string()),
            },
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

    /// What the headers alone decide, before any of the body is read: `Ok(None)` when the
    /// request is authenticated (no secret, or the GitLab token), `Ok(Some(check))` when the body's
    /// HMAC must still be checked, `Err` when the request cannot pass whatever its body.
    fn authenticate_headers(&self, headers: &HeaderMap) -> Result<Option<BodyCheck>, HookRefused> {
        let Some(secret) = &self.secret else { return Ok(None) };
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let check = |hex_sig: &str, header: &'static str| {
            let signature = decode_hex(hex_sig.trim()).ok_or(HookRefused::Malformed { header })?;
            Ok(Some(BodyCheck { secret: secret.clone(), signature, header }))
        };
        if let Some(sig) = header("x-hub-signature-256") {
            let hex_sig = sig.strip_prefix("sha256=").ok_or(HookRefused::NoSha256Prefix)?;
            return check(hex_sig, "X-Hub-Signature-256");
        }
        if let Some(sig) = header("x-gitea-signature") {
            return check(sig, "X-Gitea-Signature");
        }
        if let Some(token) = header("x-gitlab-token") {
            // Comparing digests keeps the comparison's timing independent of the secret.
            return if Sha256::digest(token.as_bytes()) == Sha256::digest(secret) {
                Ok(None)
            } else {
                Err(HookRefused::TokenMismatch)
            };
        }
        Err(HookRefused::NoCredential)
    }

    /// What a delivery asks for, judged from its headers and whole body: the size bound, the
    /// signature or token, then the event and the push payload's `ref`. The handler asks the
    /// headers first ([`Self::authenticate_headers`]) so that it reads no body it would refuse.
    pub fn judge(&self, headers: &HeaderMap, body: &[u8]) -> Result<Hook, HookRefused> {
        if body.len() > MAX_BODY_BYTES {
            return Err(HookRefused::TooLarge { limit: MAX_BODY_BYTES });
        }
        if let Some(check) = self.authenticate_headers(headers)? {
            check.verify(body)?;
        }
        let event = ["x-github-event", "x-gitea-event", "x-gitlab-event"]
            .iter()
            .find_map(|h| headers.get(*h).and_then(|v| v.to_str().ok()))
            .unwrap_or("");
        if event == "ping" {
            return Ok(Hook::Ping);
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Hook::Sync);
        }
        let payload: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| HookRefused::NotJson { message: e.to_string() })?;
        if let Some(git_ref) = payload.get("ref").and_then(|r| r.as_str())
            && let Some(branch) = git_ref.strip_prefix("refs/heads/")
            && branch != self.branch
        {
            return Ok(Hook::OtherBranch(branch.to_string()));
        }
        Ok(Hook::Sync)
    }
}

/// What an accepted webhook delivery asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hook {
    /// A forge's test delivery: answered, nothing to do.
    Ping,
    /// A push to another branch than the tracked one: acknowledged, ignored.
    OtherBranch(String),
    /// A push to the tracked branch, a tag, or an empty body: wake the loop.
    Sync,
}

/// Why a webhook delivery was refused (the reason the caller gets back).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookRefused {
    #[error("a webhook secret is configured: send X-Hub-Signature-256, X-Gitea-Signature or X-Gitlab-Token")]
    NoCredential,
    #[error("X-Hub-Signature-256 must start with sha256=")]
    NoSha256Prefix,
    #[error("{header} is not a hex HMAC-SHA256 digest")]
    Malformed { header: &'static str },
    #[error("{header} does not match the body")]
    Mismatch { header: &'static str },
    #[error("X-Gitlab-Token does not match")]
    TokenMismatch,
    #[error("the body is over {limit} bytes; the agent reads only a push's ref (it polls anyway)")]
    TooLarge { limit: usize },
    #[error(
        "the body is neither empty nor a JSON push payload ({message}); set the webhook's content type to application/json"
    )]
    NotJson { message: String },
    #[error("this signed delivery was accepted before (a replay); the agent polls anyway, nothing to redeliver")]
    Replayed,
    #[error(
        "this signed push is from {age_secs} s ago, older than the {window_secs} s replay window; check the clock if it is new"
    )]
    Stale { age_secs: u64, window_secs: u64 },
    #[error(
        "this signed push is from {before_secs} s before this agent started (a replay, or a retry after an outage); the agent's first pass synced after it, nothing to redeliver"
    )]
    BeforeStart { before_secs: u64 },
}

/// The signatures of the signed deliveries accepted since the server started (at most
/// [`REMEMBERED_DELIVERIES`]), and when it started.
#[derive(Debug)]
struct SeenDeliveries {
    seen: std::sync::Mutex<std::collections::VecDeque<Vec<u8>>>,
    /// Unix seconds.
    started: u64,
}

impl SeenDeliveries {
    fn new(started: u64) -> SeenDeliveries {
        SeenDeliveries { seen: Default::default(), started }
    }

    /// Accepts a delivery with `signature` whose payload is `body` at `now` (Unix seconds), once:
    /// [`HookRefused::Replayed`] for a signature seen before, [`HookRefused::Stale`] for a push
    /// older than [`REPLAY_WINDOW`], [`HookRefused::BeforeStart`] for one from before the start.
    fn admit(&self, signature: &[u8], body: &[u8], now: u64) -> Result<(), HookRefused> {
        let pushed_at = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("repository")?.get("pushed_at")?.as_u64());
        if let Some(at) = pushed_at {
            if now.saturating_sub(at) > REPLAY_WINDOW.as_secs() {
                return Err(HookRefused::Stale { age_secs: now - at, window_secs: REPLAY_WINDOW.as_secs() });
            }
            if at < self.started {
                return Err(HookRefused::BeforeStart { before_secs: self.started - at });
            }
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.iter().any(|s| s == signature) {
            return Err(HookRefused::Replayed);
        }
        if seen.len() == REMEMBERED_DELIVERIES {
            seen.pop_front();
        }
        seen.push_back(signature.to_vec());
        Ok(())
    }
}

/// An HMAC signature from the headers, to be checked against the body once it is read.
struct BodyCheck {
    secret: Vec<u8>,
    signature: Vec<u8>,
    /// The header it came from, for the refusal.
    header: &'static str,
}

impl BodyCheck {
    fn verify(&self, body: &[u8]) -> Result<(), HookRefused> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC accepts any key length");
        mac.update(body);
        mac.verify_slice(&self.signature).map_err(|_| HookRefused::Mismatch { header: self.header })
    }
}

/// Hex digits only: `u8::from_str_radix` alone would take a sign (`"+f"`), which no digest has.
fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
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

/// The handlers' shared state: the caller's, plus the webhook's delivery slots.
struct Shared {
    state: ServerState,
    hooks: Arc<Semaphore>,
    seen: SeenDeliveries,
}

pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/hooks/git", post(git_hook))
        .with_state(Arc::new(Shared {
            state,
            hooks: Arc::new(Semaphore::new(MAX_CONCURRENT_HOOKS)),
            seen: SeenDeliveries::new(chrono::Utc::now().timestamp().max(0) as u64),
        }))
}

async fn readyz(State(s): State<Arc<Shared>>) -> Response {
    match s.state.health.readiness() {
        Ok(why) => (StatusCode::OK, format!("ok: {why}\n")).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")).into_response(),
    }
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], s.state.metrics.encode()).into_response()
}

fn answer(status: StatusCode, triggered: bool, reason: &str) -> Response {
    (status, axum::Json(json!({ "triggered": triggered, "reason": reason }))).into_response()
}

/// Why a body was not read to its end.
#[derive(Debug, PartialEq, Eq)]
enum BodyRefused {
    TooLarge,
    Broken,
}

/// The body as a stream, kept only up to `limit` bytes: a sender of more is cut off there, so
/// what a delivery costs is bounded whatever it sends.
async fn read_capped(body: Body, limit: usize) -> Result<Vec<u8>, BodyRefused> {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| BodyRefused::Broken)?;
        if out.len() + chunk.len() > limit {
            return Err(BodyRefused::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn too_large() -> Response {
    answer(StatusCode::PAYLOAD_TOO_LARGE, false, &HookRefused::TooLarge { limit: MAX_BODY_BYTES }.to_string())
}

async fn git_hook(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    let s = &shared.state;
    // These refusals happen before a byte of the body is read.
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large();
    }
    let signed = match s.webhook.authenticate_headers(&headers) {
        Ok(check) => check.map(|c| c.signature),
        Err(why) => {
            tracing::warn!(reason = %why, "refused a webhook call");
            return answer(StatusCode::UNAUTHORIZED, false, &why.to_string());
        }
    };
    // Only a delivery that gets this far reads its body, so only those need one of the few slots.
    let Ok(_slot) = shared.hooks.clone().try_acquire_owned() else {
        tracing::warn!("refused a webhook call: {MAX_CONCURRENT_HOOKS} deliveries in flight");
        let mut r = answer(
            StatusCode::TOO_MANY_REQUESTS,
            false,
            &format!("{MAX_CONCURRENT_HOOKS} deliveries are being handled; the loop polls anyway"),
        );
        r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        return r;
    };
    let body = match tokio::time::timeout(BODY_TIMEOUT, read_capped(body, MAX_BODY_BYTES)).await {
        Ok(Ok(body)) => body,
        Ok(Err(BodyRefused::TooLarge)) => return too_large(),
        Ok(Err(BodyRefused::Broken)) => return answer(StatusCode::BAD_REQUEST, false, "the body ended early"),
        Err(_) => {
            let why = format!("the body took longer than {BODY_TIMEOUT:?} to arrive");
            return answer(StatusCode::REQUEST_TIMEOUT, false, &why);
        }
    };
    let judged = s.webhook.judge(&headers, &body);
    // Judged authentic: now whether it was seen before (a refused delivery is not remembered).
    if let (Ok(_), Some(signature)) = (&judged, &signed) {
        let now = chrono::Utc::now().timestamp().max(0) as u64;
        if let Err(why) = shared.seen.admit(signature, &body, now) {
            tracing::warn!(reason = %why, "refused a webhook call");
            s.metrics.record_webhook_replay();
            return answer(StatusCode::CONFLICT, false, &why.to_string());
        }
    }
    match judged {
        Ok(Hook::Sync) => {}
        Ok(Hook::Ping) => return answer(StatusCode::OK, false, "pong"),
        Ok(Hook::OtherBranch(branch)) => {
            return answer(StatusCode::ACCEPTED, false, &format!("push to {branch}; tracking {}", s.webhook.branch));
        }
        Err(why @ HookRefused::NotJson { .. }) => return answer(StatusCode::BAD_REQUEST, false, &why.to_string()),
        Err(HookRefused::TooLarge { .. }) => return too_large(),
        Err(why) => {
            tracing::warn!(reason = %why, "refused a webhook call");
            return answer(StatusCode::UNAUTHORIZED, false, &why.to_string());
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

/// Serves `app` on `listener` until `stop`, then waits for the requests in flight. axum's own
/// `serve` is this loop without a header read timeout (it sets no timer for hyper).
async fn serve(listener: tokio::net::TcpListener, app: Router, stop: oneshot::Receiver<()>) -> std::io::Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors and the like: the next accept may work again.
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = graceful.watch(builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
    Ok(())
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
        let task = tokio::spawn(serve(listener, router(state), stop_rx));
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
        assert_eq!(w.judge(&headers(&pairs), b"{}").is_ok(), ok);
    }

    #[test]
    fn a_signed_delivery_is_accepted_once_and_only_while_fresh() {
        let now = 1_700_000_000;
        let seen = SeenDeliveries::new(now - 60);
        let push = |at: u64| format!(r#"{{"ref":"refs/heads/main","repository":{{"pushed_at":{at}}}}}"#);
        assert_eq!(seen.admit(b"sig-1", push(now - 10).as_bytes(), now), Ok(()));
        assert_eq!(seen.admit(b"sig-1", push(now - 10).as_bytes(), now + 1), Err(HookRefused::Replayed));
        assert_eq!(seen.admit(b"sig-2", b"", now), Ok(()), "an empty body has no time, its signature counts");
        assert_eq!(seen.admit(b"sig-2", b"", now + 3600), Err(HookRefused::Replayed));
        assert_eq!(
            seen.admit(b"sig-3", push(now - 301).as_bytes(), now),
            Err(HookRefused::Stale { age_secs: 301, window_secs: 300 })
        );
        // Inside the window but from before the server started (a restart): the first pass read it.
        assert_eq!(
            seen.admit(b"sig-4", push(now - 61).as_bytes(), now),
            Err(HookRefused::BeforeStart { before_secs: 1 })
        );
    }

    #[test]
    fn the_oldest_signature_is_forgotten_first() {
        let seen = SeenDeliveries::new(0);
        for i in 0..=REMEMBERED_DELIVERIES {
            assert_eq!(seen.admit(&i.to_be_bytes(), b"", 0), Ok(()));
        }
        assert_eq!(seen.admit(&REMEMBERED_DELIVERIES.to_be_bytes(), b"", 0), Err(HookRefused::Replayed));
        assert_eq!(seen.admit(&0usize.to_be_bytes(), b"", 0), Ok(()), "forgotten");
    }

    #[test]
    fn no_secret_accepts_anything() {
        assert_eq!(WebhookConfig::new("main", None).judge(&HeaderMap::new(), b"{}"), Ok(Hook::Sync));
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

    #[test]
    fn a_leader_that_never_synced_says_why_its_passes_fail() {
        let (_tx, rx) = watch::channel(Leadership::Leading);
        let h = Health::new(rx);
        h.mark_failed("git://example/fleet.git: timed out".into());
        assert_eq!(
            h.readiness(),
            Err("leading; first sync not finished: the last pass failed: git://example/fleet.git: timed out".into())
        );
        h.mark_synced();
        h.mark_failed("later failure".into());
        assert_eq!(h.readiness(), Ok("leading".into()), "a synced leader stays ready");
    }
}
