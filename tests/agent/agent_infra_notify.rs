//! The notifier over real HTTP against a receiver on loopback: the Slack, Teams and signed
//! webhook bodies, retries of 5xx with backoff (and none of other 4xx), the per-request timeout,
//! and the background queue delivering in order.

use crate::notify_support;

use axum::http::StatusCode;
use fleetgate::agent::notifier::{
    Endpoint, Format, Notification, NotificationKind, Notifier, NotifyError, Queued, RetryPolicy,
};
use fleetgate::status::GateFigure;
use notify_support::Receiver;
use std::collections::BTreeMap;
use std::time::Duration;

/// Retries quick enough for a test.
const QUICK: RetryPolicy = RetryPolicy {
    attempts: 4,
    first_delay: Duration::from_millis(50),
    max_delay: Duration::from_millis(200),
    total_delay: Duration::from_secs(2),
};

/// A notifier whose `default` endpoint is `endpoint`.
fn notifier(endpoint: Endpoint, timeout: Duration) -> Notifier {
    Notifier::new(BTreeMap::from([("default".to_string(), endpoint)]), "canary", timeout).unwrap().with_retry(QUICK)
}

fn rollback() -> Notification {
    let gates = [GateFigure {
        name: "error-rate".into(),
        observed: "7.1%".into(),
        threshold: "5%".into(),
        verdict: "fail".into(),
    }];
    Notification {
        rolled_back_to: Some("rel-1".into()),
        ..Notification::new(
            NotificationKind::RolledBack,
            "rel-2",
            "GateFailed",
            "gate error-rate: 7.1% > 5% for 3 evaluations",
        )
        .with_gates(&gates)
    }
}

#[tokio::test]
async fn slack_gets_text_blocks_and_the_structured_details() {
    let mut rx = Receiver::start().await;
    notifier(Endpoint::new(rx.url.clone()), Duration::from_secs(5)).deliver("default", &rollback()).await.unwrap();
    let got = rx.next(5).await;
    assert_eq!(got.headers["content-type"], "application/json");
    assert!(got.headers["user-agent"].to_str().unwrap().starts_with("fleetgate/"));
    assert!(got.headers.get("x-fleetgate-signature").is_none(), "only webhook endpoints sign");
    let body = got.json();
    assert_eq!(body["text"], "fleetgate canary: rel-2 rolled back to rel-1: gate error-rate 7.1% (threshold 5%)");
    assert_eq!(body["blocks"][0]["type"], "section");
    assert_eq!(body["blocks"][0]["text"]["text"], body["text"]);
    let details = &body["fleetgate"];
    assert_eq!((details["cluster"].as_str(), details["kind"].as_str()), (Some("canary"), Some("rolledBack")));
    assert_eq!((details["release"].as_str(), details["rolledBackTo"].as_str()), (Some("rel-2"), Some("rel-1")));
    assert!(details["at"].as_str().unwrap().ends_with('Z'));
}

#[tokio::test]
async fn teams_gets_an_adaptive_card() {
    let mut rx = Receiver::start().await;
    let endpoint = Endpoint { format: Format::Teams, ..Endpoint::new(rx.url.clone()) };
    notifier(endpoint, Duration::from_secs(5)).deliver("default", &rollback()).await.unwrap();
    let body = rx.next(5).await.json();
    assert_eq!(body["type"], "message");
    let attachment = &body["attachments"][0];
    assert_eq!(attachment["contentType"], "application/vnd.microsoft.card.adaptive");
    let card = &attachment["content"];
    assert_eq!(card["type"], "AdaptiveCard");
    assert_eq!(card["body"][0]["text"], body["text"]);
    let facts = card["body"][1]["facts"].as_array().unwrap();
    assert!(facts.iter().any(|f| f["title"] == "Gate" && f["value"] == "error-rate: 7.1% (threshold 5%)"), "{facts:?}");
}

#[tokio::test]
async fn a_webhook_body_is_signed_with_the_secret_over_timestamp_and_body() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("hmac");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let mut rx = Receiver::start().await;
    let endpoint = Endpoint { format: Format::Webhook, secret_file: Some(secret), ..Endpoint::new(rx.url.clone()) };
    notifier(endpoint, Duration::from_secs(5)).deliver("default", &rollback()).await.unwrap();
    let got = rx.next(5).await;
    assert!(got.signed_with(b"s3cret"), "{:?}", got.headers);
    assert!(!got.signed_with(b"s3cret\n"), "the file's line break is not part of the secret");
    assert!(!got.signed_with(b"another secret"));
    let stamp: i64 = got.headers["x-fleetgate-timestamp"].to_str().unwrap().parse().unwrap();
    assert!((chrono::Utc::now().timestamp() - stamp).abs() < 60, "{stamp}");
    let body = got.json();
    assert_eq!(body.as_object().unwrap().len(), 2, "text and the details: {body}");
    assert_eq!(body["fleetgate"]["gates"][0]["observed"], "7.1%");
}

#[tokio::test]
async fn a_receiver_answering_503_twice_gets_the_message_on_the_third_attempt() {
    let unavailable = StatusCode::SERVICE_UNAVAILABLE;
    let mut rx = Receiver::scripted(&[unavailable, unavailable], Duration::ZERO).await;
    let attempts =
        notifier(Endpoint::new(rx.url.clone()), Duration::from_secs(5)).deliver("default", &rollback()).await.unwrap();
    assert_eq!(attempts, 3);
    let bodies: Vec<_> = rx.drain().into_iter().map(|r| r.json()).collect();
    assert_eq!(bodies.len(), 3);
    assert!(bodies.iter().all(|b| b == &bodies[0]), "the same message each time");
}

#[tokio::test]
async fn other_4xx_are_not_retried_and_never_show_the_url() {
    let mut rx = Receiver::scripted(&[StatusCode::FORBIDDEN], Duration::ZERO).await;
    let err = notifier(Endpoint::new(rx.url.clone()), Duration::from_secs(5))
        .deliver("default", &rollback())
        .await
        .unwrap_err();
    assert!(matches!(err, NotifyError::Status { status: 403, .. }), "{err}");
    assert_eq!(rx.drain().len(), 1, "a refusal is not retried");
    // The webhook URL is a secret: only its scheme and host are named.
    let text = err.to_string();
    assert!(text.starts_with("notification to http://127.0.0.1:"), "{text}");
    assert!(text.contains("/… was refused") && !text.contains("/hook"), "{text}");
}

#[tokio::test]
async fn a_slow_receiver_is_cut_off_at_the_timeout_and_retried() {
    let mut rx = Receiver::scripted(&[], Duration::from_secs(30)).await;
    let n = Notifier::new(
        BTreeMap::from([("default".to_string(), Endpoint::new(rx.url.clone()))]),
        "canary",
        Duration::from_millis(300),
    )
    .unwrap()
    .with_retry(RetryPolicy { attempts: 2, ..QUICK });
    let err = n.deliver("default", &rollback()).await.unwrap_err();
    assert!(matches!(err, NotifyError::Timeout { .. }), "{err}");
    assert_eq!(rx.drain().len(), 2, "a timeout is retried, up to the attempts");
}

#[tokio::test]
async fn the_queue_delivers_in_order_in_the_background() {
    let mut rx = Receiver::scripted(&[StatusCode::BAD_GATEWAY], Duration::ZERO).await;
    let endpoint = Endpoint { on: NotificationKind::ALL.into_iter().collect(), ..Endpoint::new(rx.url.clone()) };
    let n = notifier(endpoint, Duration::from_secs(5));
    for kind in [NotificationKind::Started, NotificationKind::Applied, NotificationKind::Passed] {
        let message = Notification::new(kind, "rel-2", "Reason", "what happened");
        assert_eq!(n.enqueue("default", message).unwrap(), Queued::Queued);
    }
    let mut kinds = Vec::new();
    while kinds.len() < 4 {
        kinds.push(rx.next(10).await.kind());
    }
    // The first delivery of `started` got 502 and was retried before the next message went.
    assert_eq!(kinds, ["started", "started", "applied", "passed"]);
}
