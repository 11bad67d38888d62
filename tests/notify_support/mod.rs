//! A notification receiver on loopback for the notifier's tests: it records every request
//! (headers and the exact body bytes) and answers each with the next status of a script (then
//! 200), after an optional delay.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Received {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// `fleetgate.kind` of the body.
    pub fn kind(&self) -> String {
        self.json()["fleetgate"]["kind"].as_str().unwrap_or_default().to_string()
    }

    /// Whether `X-Fleetgate-Signature` is the HMAC-SHA256 with `secret` over
    /// `X-Fleetgate-Timestamp` `.` body, checked as a receiver would (README "Notifications").
    pub fn signed_with(&self, secret: &[u8]) -> bool {
        let header = |name: &str| self.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let (Some(timestamp), Some(signature)) = (header("x-fleetgate-timestamp"), header("x-fleetgate-signature"))
        else {
            return false;
        };
        let Some(hex) = signature.strip_prefix("sha256=") else { return false };
        let Some(expected) = (0..hex.len())
            .step_by(2)
            .map(|i| hex.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
            .collect::<Option<Vec<u8>>>()
        else {
            return false;
        };
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(&self.body);
        mac.verify_slice(&expected).is_ok()
    }
}

pub struct Receiver {
    /// `http://127.0.0.1:PORT/hook`.
    pub url: reqwest::Url,
    pub requests: mpsc::UnboundedReceiver<Received>,
}

#[derive(Clone)]
struct Script {
    tx: mpsc::UnboundedSender<Received>,
    answers: Arc<Mutex<VecDeque<StatusCode>>>,
    delay: Duration,
}

impl Receiver {
    /// Answers every request with 200 at once.
    pub async fn start() -> Receiver {
        Receiver::scripted(&[], Duration::ZERO).await
    }

    /// Answers the first requests with `answers`, in order, then 200; each after `delay`.
    pub async fn scripted(answers: &[StatusCode], delay: Duration) -> Receiver {
        let (tx, requests) = mpsc::unbounded_channel();
        let script = Script { tx, answers: Arc::new(Mutex::new(answers.iter().copied().collect())), delay };
        let app = Router::new()
            .route(
                "/hook",
                post(|State(script): State<Script>, headers: HeaderMap, body: Bytes| async move {
                    script.tx.send(Received { headers, body }).unwrap();
                    tokio::time::sleep(script.delay).await;
                    script.answers.lock().unwrap().pop_front().unwrap_or(StatusCode::OK)
                }),
            )
            .with_state(script);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap()).parse().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { url, requests }
    }

    /// The next request, within `secs` seconds.
    pub async fn next(&mut self, secs: u64) -> Received {
        tokio::time::timeout(Duration::from_secs(secs), self.requests.recv())
            .await
            .unwrap_or_else(|_| panic!("no notification within {secs}s"))
            .expect("the receiver runs")
    }

    /// The requests received so far, without waiting.
    pub fn drain(&mut self) -> Vec<Received> {
        std::iter::from_fn(|| self.requests.try_recv().ok()).collect()
    }
}
