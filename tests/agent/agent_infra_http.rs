//! The agent's HTTP endpoints over real HTTP: health and readiness follow leadership and the first
//! sync, the Git webhook wakes the loop (signed GitHub/Gitea/GitLab deliveries, empty bodies) and
//! refuses or ignores what it should, and a real Prometheus scrapes `/metrics`. Deliveries that
//! are too large, unauthenticated or too many at once are refused before their body is read (the
//! requests below never send one), while the probes keep answering. The agent's token-carrying
//! HTTP clients (forge statuses, pull requests, notifications) do not follow a redirect to
//! another host.

use fleetgate::agent::lease::Leadership;
use fleetgate::agent::metrics::Metrics;
use fleetgate::agent::server::{Health, HttpServer, ServerState, WebhookConfig};
use fleetgate::agent::triggers::{TriggerSource, Triggers};
use fleetgate_testenv::Prometheus;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

const SECRET: &[u8] = b"webhook-s3cret";

struct Fixture {
    server: HttpServer,
    leadership: watch::Sender<Leadership>,
    health: Health,
    metrics: Arc<Metrics>,
    triggers: Triggers,
    http: reqwest::Client,
}

async fn start(secret: Option<&[u8]>) -> Fixture {
    let (leadership, rx) = watch::channel(Leadership::Unknown);
    let health = Health::new(rx);
    let metrics = Arc::new(Metrics::new("canary"));
    let (mut triggers, sender) = Triggers::new(Duration::from_secs(3600));
    // Consume the startup wake so later wakes are the webhook's.
    tokio::time::timeout(Duration::from_secs(2), triggers.next()).await.expect("startup wake");
    let state = ServerState {
        metrics: metrics.clone(),
        health: health.clone(),
        triggers: sender,
        webhook: WebhookConfig::new("main", secret.map(<[u8]>::to_vec)),
    };
    let server = HttpServer::start("127.0.0.1:0".parse().unwrap(), state).await.expect("server starts");
    let http = fleetgate::http::client_builder().timeout(Duration::from_secs(5)).build().unwrap();
    Fixture { server, leadership, health, metrics, triggers, http }
}

impl Fixture {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.local_addr())
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let r = self.http.get(self.url(path)).send().await.expect("GET answers");
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn hook(&self, headers: &[(&str, String)], body: &'static [u8]) -> (u16, serde_json::Value) {
        let mut req = self.http.post(self.url("/hooks/git")).body(body);
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let r = req.send().await.expect("POST answers");
        (r.status().as_u16(), r.json().await.expect("JSON answer"))
    }

    /// The sources of the next wake, or None if nothing wakes the loop within 500 ms.
    async fn woken(&mut self) -> Option<BTreeSet<TriggerSource>> {
        tokio::time::timeout(Duration::from_millis(500), self.triggers.next()).await.ok().map(|w| w.sources)
    }
}

fn github_signature(body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
    mac.update(body);
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

const PUSH_MAIN: &[u8] =
    br#"{"ref":"refs/heads/main","before":"0000","after":"a1b2","repository":{"full_name":"acme/fleet"}}"#;
const PUSH_OTHER: &[u8] = br#"{"ref":"refs/heads/feature-x","after":"a1b2"}"#;
const PUSH_TAG: &[u8] = br#"{"ref":"refs/tags/rel-2","after":"a1b2"}"#;

#[tokio::test]
async fn health_and_readiness_follow_leadership_and_first_sync() {
    let f = start(None).await;
    assert_eq!(f.get("/healthz").await.0, 200);
    let (status, body) = f.get("/readyz").await;
    assert_eq!((status, body.trim()), (503, "not ready: leader not known yet"));
    f.leadership.send_replace(Leadership::Following { holder: Some("agent-a".into()) });
    assert_eq!(f.get("/readyz").await, (200, "ok: standby; leader is agent-a\n".into()));
    f.leadership.send_replace(Leadership::Leading);
    assert_eq!(f.get("/readyz").await.0, 503, "leading but not synced yet");
    f.health.mark_synced();
    assert_eq!(f.get("/readyz").await, (200, "ok: leading\n".into()));
    assert_eq!(f.get("/nothing").await.0, 404);
}

#[tokio::test]
async fn signed_webhooks_wake_the_loop_and_bad_ones_do_not() {
    let mut f = start(Some(SECRET)).await;
    f.leadership.send_replace(Leadership::Leading);

    let (status, answer) = f
        .hook(&[("x-github-event", "push".into()), ("x-hub-signature-256", github_signature(PUSH_MAIN))], PUSH_MAIN)
        .await;
    assert_eq!((status, &answer["triggered"]), (202, &serde_json::json!(true)), "{answer}");
    assert_eq!(f.woken().await, Some(BTreeSet::from([TriggerSource::Webhook])));

    // A signature over other bytes, a missing signature, a wrong GitLab token: 401, no wake.
    let forged = github_signature(PUSH_OTHER);
    for headers in [vec![("x-hub-signature-256", forged)], vec![], vec![("x-gitlab-token", "guess".to_string())]] {
        let (status, answer) = f.hook(&headers, PUSH_MAIN).await;
        assert_eq!(status, 401, "{answer}");
    }
    assert_eq!(f.woken().await, None);

    // Gitea's own header and GitLab's token; a tag push counts whatever the branch.
    let gitea_sig = github_signature(PUSH_TAG).trim_start_matches("sha256=").to_string();
    assert_eq!(f.hook(&[("x-gitea-event", "push".into()), ("x-gitea-signature", gitea_sig)], PUSH_TAG).await.0, 202);
    assert_eq!(f.woken().await, Some(BTreeSet::from([TriggerSource::Webhook])));
    let (status, answer) =
        f.hook(&[("x-gitlab-event", "Push Hook".into()), ("x-gitlab-token", "webhook-s3cret".into())], PUSH_MAIN).await;
    assert_eq!((status, answer["triggered"].as_bool()), (202, Some(true)));
    assert!(f.woken().await.is_some());

    // A push to another branch and GitHub's ping are acknowledged without a sync.
    let (status, answer) = f.hook(&[("x-hub-signature-256", github_signature(PUSH_OTHER))], PUSH_OTHER).await;
    assert_eq!((status, answer["triggered"].as_bool()), (202, Some(false)), "{answer}");
    assert!(answer["reason"].as_str().unwrap().contains("feature-x"), "{answer}");
    let (status, answer) =
        f.hook(&[("x-github-event", "ping".into()), ("x-hub-signature-256", github_signature(b"{}"))], b"{}").await;
    assert_eq!((status, answer["reason"].as_str()), (200, Some("pong")));
    assert_eq!(f.woken().await, None);

    // Someone who captured the first signed delivery sends it again: 409, no wake, counted.
    let (status, answer) = f
        .hook(&[("x-github-event", "push".into()), ("x-hub-signature-256", github_signature(PUSH_MAIN))], PUSH_MAIN)
        .await;
    assert_eq!((status, answer["triggered"].as_bool()), (409, Some(false)), "{answer}");
    assert!(answer["reason"].as_str().unwrap().contains("a replay"), "{answer}");
    // A signed push from an hour ago, never seen: too old.
    let old = format!(
        r#"{{"ref":"refs/heads/main","repository":{{"pushed_at":{}}}}}"#,
        chrono::Utc::now().timestamp() - 3600
    );
    let old: &'static [u8] = Box::leak(old.into_boxed_str()).as_bytes();
    let (status, answer) = f.hook(&[("x-hub-signature-256", github_signature(old))], old).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["reason"].as_str().unwrap().contains("older than the 300 s replay window"), "{answer}");
    assert_eq!(f.woken().await, None);
    let (_, metrics) = f.get("/metrics").await;
    assert!(metrics.contains("fleetgate_webhook_replays_total{cluster=\"canary\"} 2"), "{metrics}");
}

/// A restart forgets the signatures seen, but not the window: a signed push captured before the
/// restart and sent again after it gets 409 (the restarted agent's first pass synced after that
/// push anyway), and a push made after the restart is welcome.
#[tokio::test]
async fn a_delivery_captured_before_a_restart_is_refused_after_it() {
    let push_at = |at: i64| -> &'static [u8] {
        let body = format!(r#"{{"ref":"refs/heads/main","repository":{{"pushed_at":{at}}}}}"#);
        Box::leak(body.into_boxed_str()).as_bytes()
    };
    let mut before = start(Some(SECRET)).await;
    before.leadership.send_replace(Leadership::Leading);
    let captured = push_at(chrono::Utc::now().timestamp());
    let headers = [("x-github-event", "push".to_string()), ("x-hub-signature-256", github_signature(captured))];
    assert_eq!(before.hook(&headers, captured).await.0, 202);
    assert!(before.woken().await.is_some());
    before.server.stop().await;
    // The push's second is over before the new process starts (its time has a second's grain).
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let mut after = start(Some(SECRET)).await;
    after.leadership.send_replace(Leadership::Leading);
    let (status, answer) = after.hook(&headers, captured).await;
    assert_eq!((status, answer["triggered"].as_bool()), (409, Some(false)), "{answer}");
    assert!(answer["reason"].as_str().unwrap().contains("before this agent started"), "{answer}");
    assert_eq!(after.woken().await, None);
    let (_, metrics) = after.get("/metrics").await;
    assert!(metrics.contains("fleetgate_webhook_replays_total{cluster=\"canary\"} 1"), "{metrics}");
    let fresh = push_at(chrono::Utc::now().timestamp());
    assert_eq!(after.hook(&[("x-hub-signature-256", github_signature(fresh))], fresh).await.0, 202);
    assert!(after.woken().await.is_some());
}

#[tokio::test]
async fn unsigned_setup_accepts_empty_bodies_and_explains_bad_ones() {
    let mut f = start(None).await;
    f.leadership.send_replace(Leadership::Leading);
    assert_eq!(f.hook(&[], b"").await.0, 202);
    assert_eq!(f.woken().await, Some(BTreeSet::from([TriggerSource::Webhook])));
    let (status, answer) = f.hook(&[], b"payload=%7B%7D").await;
    assert_eq!(status, 400);
    assert!(answer["reason"].as_str().unwrap().contains("application/json"), "{answer}");

    // A burst of deliveries while the loop is busy becomes one wake.
    for _ in 0..5 {
        assert_eq!(f.hook(&[], b"").await.0, 202);
    }
    assert_eq!(f.woken().await, Some(BTreeSet::from([TriggerSource::Webhook])));
    assert_eq!(f.woken().await, None);

    // A standby acknowledges but does not wake its (idle) loop.
    f.leadership.send_replace(Leadership::Following { holder: Some("agent-a".into()) });
    let (status, answer) = f.hook(&[], b"").await;
    assert_eq!((status, answer["triggered"].as_bool()), (202, Some(false)));
    assert!(answer["reason"].as_str().unwrap().contains("agent-a"), "{answer}");
    assert_eq!(f.woken().await, None);
}

#[tokio::test]
async fn prometheus_scrapes_the_metrics() {
    let f = start(None).await;
    f.metrics.record_rollback("GateFailed");
    f.metrics.record_gate_evaluation("error-rate", "fail");
    f.metrics.observe_reconcile(Duration::from_millis(250), fleetgate::agent::metrics::ReconcileResult::Ok);
    f.metrics.mark_synced();
    let (status, text) = f.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(text.ends_with("# EOF\n"), "{text}");

    let prom = Prometheus::start(f.server.local_addr()).await.expect("prometheus starts");
    prom.wait_for_scrape(Duration::from_secs(30)).await.expect("scraped");
    let value = |v: &serde_json::Value| v["data"]["result"][0]["value"][1].as_str().map(str::to_string);
    let v = prom.query(r#"fleetgate_rollbacks_total{cluster="canary",reason="GateFailed"}"#).await.unwrap();
    assert_eq!(value(&v).as_deref(), Some("1"), "{v}");
    let v = prom.query(r#"fleetgate_gate_evaluations_total{gate="error-rate",verdict="fail"}"#).await.unwrap();
    assert_eq!(value(&v).as_deref(), Some("1"), "{v}");
    let v = prom.query(r#"fleetgate_reconcile_duration_seconds_count{result="ok"}"#).await.unwrap();
    assert_eq!(value(&v).as_deref(), Some("1"), "{v}");
    let v = prom.query(r#"fleetgate_phase{phase="Idle"}"#).await.unwrap();
    assert_eq!(value(&v).as_deref(), Some("1"), "{v}");
    let v = prom.query("time() - fleetgate_last_sync_timestamp_seconds < 60").await.unwrap();
    assert!(value(&v).is_some(), "last sync timestamp is recent: {v}");
}

/// Sends a request head (and `body`, which may be less than its Content-Length says) over a
/// plain connection, without waiting for anything.
async fn send_raw(f: &Fixture, head: &str, body: &[u8]) -> TcpStream {
    let mut conn = TcpStream::connect(f.server.local_addr()).await.unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body).await.unwrap();
    conn
}

/// The status code of the answer on `conn` (within 5 s).
async fn status_of(conn: &mut TcpStream) -> u16 {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(2).any(|w| w == b"\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await.expect("an answer").unwrap();
        assert!(n > 0, "connection closed without an answer: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&got);
    line.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("not an HTTP answer: {line:?}"))
}

fn post_head(length: usize, headers: &str) -> String {
    format!("POST /hooks/git HTTP/1.1\r\nHost: agent\r\nContent-Length: {length}\r\n{headers}\r\n")
}

#[tokio::test]
async fn deliveries_are_refused_before_their_body_is_read_and_the_probes_keep_answering() {
    let mut f = start(Some(SECRET)).await;
    f.leadership.send_replace(Leadership::Leading);
    let sig = format!("X-Hub-Signature-256: {}\r\n", github_signature(PUSH_MAIN));

    // Refusals the headers decide: the body (8 MiB declared) is never sent, the answer comes anyway.
    let eight_mib = 8 << 20;
    for (headers, expected) in [
        (sig.as_str(), 413),
        ("", 401),
        ("X-Gitlab-Token: guess\r\n", 401),
        ("X-Hub-Signature-256: sha256=not-hex\r\n", 401),
    ] {
        let length = if expected == 413 { eight_mib } else { 1000 };
        let mut conn = send_raw(&f, &post_head(length, headers), b"").await;
        assert_eq!(status_of(&mut conn).await, expected, "{headers:?}");
    }

    // Signed deliveries must send their body; four that never finish hold every slot. The next
    // is refused at once, the probes and metrics still answer.
    let mut stuck = Vec::new();
    for _ in 0..fleetgate::agent::server::MAX_CONCURRENT_HOOKS {
        stuck.push(send_raw(&f, &post_head(PUSH_MAIN.len(), &sig), &PUSH_MAIN[..10]).await);
    }
    // Let the four reach the handler (nothing to observe them by but their effect).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut fifth = send_raw(&f, &post_head(PUSH_MAIN.len(), &sig), b"").await;
    let answered = status_of(&mut fifth).await;
    assert_eq!(answered, 429, "the fifth concurrent delivery");
    assert_eq!(f.get("/healthz").await.0, 200);
    assert_eq!(f.get("/metrics").await.0, 200);
    assert_eq!(f.woken().await, None);

    // A sender that gives up frees its slot; a complete signed delivery then wakes the loop.
    stuck.clear();
    let mut status = 0;
    for _ in 0..50 {
        let (s, _) = f.hook(&[("x-hub-signature-256", github_signature(PUSH_MAIN))], PUSH_MAIN).await;
        status = s;
        if status == 202 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, 202);
    assert_eq!(f.woken().await, Some(BTreeSet::from([TriggerSource::Webhook])));
}

#[tokio::test]
async fn a_connection_that_never_finishes_its_request_head_is_closed() {
    let f = start(None).await;
    let mut slow = send_raw(&f, "GET /healthz HTTP/1.1\r\nHost: ag", b"").await;
    // Meanwhile everyone else is served.
    assert_eq!(f.get("/healthz").await.0, 200);
    let limit = fleetgate::agent::server::HEADER_TIMEOUT + Duration::from_secs(10);
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(limit, slow.read(&mut buf)).await.expect("the agent closed the connection");
    // Closed (possibly after a 408 answer), never left open.
    match read {
        Ok(0) | Err(_) => {}
        Ok(n) => {
            let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        }
    }
}

#[tokio::test]
async fn a_body_past_64_kib_is_cut_off_while_it_streams() {
    let f = start(None).await;
    // No Content-Length to refuse by: chunks of 16 KiB until the agent stops reading.
    let mut conn =
        send_raw(&f, "POST /hooks/git HTTP/1.1\r\nHost: agent\r\nTransfer-Encoding: chunked\r\n\r\n", b"").await;
    let chunk = format!("4000\r\n{}\r\n", " ".repeat(16 * 1024));
    for _ in 0..5 {
        conn.write_all(chunk.as_bytes()).await.unwrap();
    }
    assert_eq!(status_of(&mut conn).await, 413);
    // Exactly the limit is still read.
    let body = vec![b' '; fleetgate::agent::server::MAX_BODY_BYTES];
    let r = f.http.post(f.url("/hooks/git")).body(body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 202);
}

/// A server on 127.0.0.1 that answers every request with a 302 to `target`, and the target: a
/// listener on another loopback address that counts the connections it gets.
struct Redirector {
    url: String,
    stolen: Arc<std::sync::atomic::AtomicUsize>,
}

async fn redirector() -> Redirector {
    let evil = tokio::net::TcpListener::bind("127.0.0.2:0").await.expect("127.0.0.2 is loopback too");
    let target = format!("http://{}/collect", evil.local_addr().unwrap());
    let stolen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = stolen.clone();
    tokio::spawn(async move {
        while let Ok((_conn, _)) = evil.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let forge = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", forge.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = forge.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let _ = conn.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 302 Found\r\nLocation: {target}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
    Redirector { url, stolen }
}

#[tokio::test]
async fn token_carrying_clients_do_not_follow_a_redirect_to_another_host() {
    use fleetgate::agent::notifier::{Endpoint, Notification, NotificationKind, Notifier};
    use fleetgate::model::ForgeKind;
    use fleetgate::releng::forge_pr::{self, PullRequestSpec};
    use fleetgate::status::{ForgeBackend, ForgeConfig, State, Status, Token, TokenSource};

    let r = redirector().await;
    // GitLab's token is a custom header, which a followed redirect would carry along.
    let status = Status::new("cluster-a", "rel-1", "a".repeat(40), State::Success, "ok");
    for kind in [ForgeKind::Gitlab, ForgeKind::Github, ForgeKind::Gitea] {
        let repository = if kind == ForgeKind::Gitlab { "group/fleet" } else { "acme/fleet" };
        let forge = ForgeBackend::new(kind, &r.url, repository, Token::new("forge-token")).unwrap();
        let err = forge.send(&status).await.expect_err("a 302 is not a status written");
        assert!(err.to_string().contains("302"), "{kind:?}: {err}");

        let config = ForgeConfig {
            kind,
            url: r.url.clone(),
            repository: repository.into(),
            token: TokenSource::Given,
            status_url: None,
        };
        let pr = PullRequestSpec { title: "t".into(), body: "b".into(), head: "h".into(), base: "main".into() };
        forge_pr::open(&config, "forge-token", &pr).await.expect_err("a 302 is not a pull request opened");
    }
    let notifier = Notifier::new(
        std::collections::BTreeMap::from([(
            "default".to_string(),
            Endpoint::new(format!("{}/hooks/T/B/secret", r.url).parse().unwrap()),
        )]),
        "cluster-a",
        Duration::from_secs(5),
    )
    .unwrap();
    let n = Notification::new(NotificationKind::RolledBack, "rel-2", "GateFailed", "m");
    notifier.deliver("default", &n).await.expect_err("a 302 is not a notification delivered");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(r.stolen.load(std::sync::atomic::Ordering::SeqCst), 0, "a client followed the redirect");
}
