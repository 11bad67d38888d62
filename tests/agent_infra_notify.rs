//! The notification webhook over real HTTP: a rollback is POSTed as Slack-compatible JSON with the
//! structured fields; a slow receiver is cut off at the timeout and a refusing one is reported.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use fleetgate::agent::notifier::{Notification, NotificationKind, Notifier, NotifyError};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A receiver on loopback that records each request and answers with `status` after `delay`.
async fn receiver(
    status: StatusCode,
    delay: Duration,
) -> (reqwest::Url, mpsc::UnboundedReceiver<(HeaderMap, serde_json::Value)>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/hook",
            post(
                move |State(tx): State<mpsc::UnboundedSender<(HeaderMap, serde_json::Value)>>,
                      headers: HeaderMap,
                      body: String| async move {
                    tx.send((headers, serde_json::from_str(&body).expect("JSON body"))).unwrap();
                    tokio::time::sleep(delay).await;
                    status
                },
            ),
        )
        .with_state(tx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap()).parse().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, rx)
}

/// A notifier whose `default` endpoint is `url`.
fn notifier(url: reqwest::Url, timeout: Duration) -> Notifier {
    Notifier::new(BTreeMap::from([("default".to_string(), url)]), "canary", timeout).unwrap()
}

fn rollback() -> Notification {
    Notification {
        kind: NotificationKind::Rollback,
        release: "rel-2".into(),
        reason: "GateFailed".into(),
        message: "gate error-rate: 7.1% > 5% for 3 evaluations".into(),
        rolled_back_to: Some("rel-1".into()),
        gate: Some("error-rate".into()),
        figure: Some("7.1%".into()),
        threshold: Some("5%".into()),
    }
}

#[tokio::test]
async fn a_rollback_is_posted_as_slack_compatible_json() {
    let (url, mut rx) = receiver(StatusCode::OK, Duration::ZERO).await;
    notifier(url, Duration::from_secs(5)).send("default", &rollback()).await.expect("delivered");
    let (headers, body) = rx.recv().await.unwrap();
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers["user-agent"].to_str().unwrap().starts_with("fleetgate/"));
    assert_eq!(body["text"], "fleetgate canary: rel-2 rolled back to rel-1: gate error-rate 7.1% (threshold 5%)");
    let details = &body["fleetgate"];
    assert_eq!(details["cluster"], "canary");
    assert_eq!(details["kind"], "rollback");
    assert_eq!(details["release"], "rel-2");
    assert_eq!(details["rolledBackTo"], "rel-1");
    assert_eq!(details["reason"], "GateFailed");
    assert!(details["at"].as_str().unwrap().ends_with('Z'));
}

#[tokio::test]
async fn slow_and_refusing_receivers_are_errors_not_hangs() {
    let (slow, _rx) = receiver(StatusCode::OK, Duration::from_secs(30)).await;
    let started = Instant::now();
    let err = notifier(slow, Duration::from_millis(300)).send("default", &rollback()).await.unwrap_err();
    assert!(matches!(err, NotifyError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());

    let (refusing, _rx) = receiver(StatusCode::FORBIDDEN, Duration::ZERO).await;
    let err = notifier(refusing, Duration::from_secs(5)).send("default", &rollback()).await.unwrap_err();
    assert!(err.to_string().contains("HTTP 403"), "{err}");
    // The webhook URL is a secret: only its scheme and host are named.
    assert!(err.to_string().starts_with("notification to http://127.0.0.1:"), "{err}");
    assert!(err.to_string().contains("/… was refused") && !err.to_string().contains("/hook"), "{err}");
}
