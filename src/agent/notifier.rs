//! The optional notification webhooks (`--notify-url [NAME=]URL`, the fleet repo picks one by name
//! in `spec.status.notify`): on a failure or a rollback the agent POSTs
//! one JSON document that a Slack incoming webhook (or Mattermost, Rocket.Chat, Teams' Slack
//! compatibility) shows as a message — the `text` field — and that any other receiver can read
//! field by field under `fleetgate`:
//!
//! ```json
//! { "text": "fleetgate canary: rel-2 rolled back to rel-1: gate error-rate 7.1% > 5%",
//!   "fleetgate": { "cluster": "canary", "kind": "rollback", "release": "rel-2",
//!                  "rolledBackTo": "rel-1", "reason": "GateFailed", "message": "…",
//!                  "gate": "error-rate", "figure": "7.1%", "threshold": "5%",
//!                  "at": "2025-03-15T10:00:00Z" } }
//! ```
//!
//! Every POST has a timeout, so a slow receiver never holds up a rollback. A webhook URL is a
//! secret (whoever knows a Slack webhook URL can post to the channel): errors show only its scheme
//! and host ([`redacted_url`]).

use crate::model::redacted_url;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NotificationKind {
    /// A release was rolled back after it was applied.
    Rollback,
    /// A release was refused before anything was applied (pre-apply gate).
    Blocked,
    /// The agent could not do its work (bad signature, unreadable repo, failed rollback).
    Error,
}

/// What happened; the notifier adds the cluster and the time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    pub kind: NotificationKind,
    pub release: String,
    /// The failure category (e.g. `GateFailed`, `ApplyFailed`, `SignatureInvalid`).
    pub reason: String,
    /// The full message (error chain).
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_back_to: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figure: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<String>,
}

impl Notification {
    /// The one-line human text (Slack's `text`).
    pub fn text(&self, cluster: &str) -> String {
        let what = match (self.kind, &self.rolled_back_to) {
            (NotificationKind::Rollback, Some(to)) => format!("{} rolled back to {to}", self.release),
            (NotificationKind::Rollback, None) => format!("{} rolled back (no earlier release)", self.release),
            (NotificationKind::Blocked, _) => format!("{} blocked before apply", self.release),
            (NotificationKind::Error, _) => format!("{} error", self.release),
        };
        let why = match (&self.gate, &self.figure, &self.threshold) {
            (Some(g), Some(f), Some(t)) => format!("gate {g} {f} (threshold {t})"),
            (Some(g), _, _) => format!("gate {g}: {}", self.message),
            _ => format!("{}: {}", self.reason, self.message),
        };
        format!("fleetgate {cluster}: {what}: {why}")
    }
}

#[derive(Debug, Serialize)]
struct Payload<'a> {
    text: String,
    fleetgate: Details<'a>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Details<'a> {
    cluster: &'a str,
    #[serde(flatten)]
    notification: &'a Notification,
    at: DateTime<Utc>,
}

/// Every `url` is redacted ([`redacted_url`]) and every `source` stripped of its URL.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("cannot set up the HTTP client for notifications")]
    Client(#[source] reqwest::Error),
    #[error(
        "fleet.yaml spec.status.notify names endpoint {name:?}, which this agent does not have (it has: {known}); \
         pass --notify-url {name}=URL to the agent"
    )]
    UnknownEndpoint { name: String, known: String },
    #[error("notification to {url} timed out after {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("notification to {url} was refused with HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("notification to {url} failed")]
    Transport { url: String, source: reqwest::Error },
}

/// POSTs notifications for one cluster to the endpoint the fleet names.
#[derive(Debug, Clone)]
pub struct Notifier {
    http: reqwest::Client,
    endpoints: BTreeMap<String, reqwest::Url>,
    cluster: String,
    timeout: Duration,
}

impl Notifier {
    /// A notifier POSTing to `endpoints` (by name), each request bounded by `timeout`.
    ///
    /// # Errors
    /// [`NotifyError::Client`] when the HTTP client cannot be built (its TLS backend fails to
    /// initialise, e.g. no usable system certificate store).
    pub fn new(
        endpoints: BTreeMap<String, reqwest::Url>,
        cluster: &str,
        timeout: Duration,
    ) -> Result<Notifier, NotifyError> {
        // The URL is a secret (a Slack webhook's path is its credential); a redirect would hand
        // the payload to wherever the answer points: follow none.
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("fleetgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| NotifyError::Client(e.without_url()))?;
        Ok(Notifier { http, endpoints, cluster: cluster.to_string(), timeout })
    }

    /// The JSON document [`send`](Self::send) POSTs.
    pub fn payload(&self, n: &Notification, at: DateTime<Utc>) -> serde_json::Value {
        let payload =
            Payload { text: n.text(&self.cluster), fleetgate: Details { cluster: &self.cluster, notification: n, at } };
        serde_json::to_value(payload).expect("notification serializes")
    }

    /// POSTs `n` to the endpoint named `endpoint`; any 2xx answer is success.
    pub async fn send(&self, endpoint: &str, n: &Notification) -> Result<(), NotifyError> {
        let Some(target) = self.endpoints.get(endpoint) else {
            return Err(NotifyError::UnknownEndpoint {
                name: endpoint.to_string(),
                known: self.endpoints.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        };
        let url = redacted_url(target);
        let response =
            self.http.post(target.clone()).json(&self.payload(n, Utc::now())).send().await.map_err(|source| {
                if source.is_timeout() {
                    NotifyError::Timeout { url: url.clone(), after: self.timeout }
                } else {
                    NotifyError::Transport { url: url.clone(), source: source.without_url() }
                }
            })?;
        let status = response.status();
        if status.is_success() { Ok(()) } else { Err(NotifyError::Status { url, status: status.as_u16() }) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollback() -> Notification {
        Notification {
            kind: NotificationKind::Rollback,
            release: "rel-2".into(),
            reason: "GateFailed".into(),
            message: "error rate 7.1% above 5%".into(),
            rolled_back_to: Some("rel-1".into()),
            gate: Some("error-rate".into()),
            figure: Some("7.1%".into()),
            threshold: Some("5%".into()),
        }
    }

    const SLACK: &str = "https://hooks.slack.com/services/T000/B000/XXXXsecret";

    fn notifier(endpoints: &[(&str, &str)]) -> Notifier {
        let endpoints = endpoints.iter().map(|(n, u)| (n.to_string(), u.parse().unwrap())).collect();
        Notifier::new(endpoints, "canary", Duration::from_secs(2)).unwrap()
    }

    #[tokio::test]
    async fn failures_never_show_the_webhook_url() {
        // A closed port: the transport error, whose reqwest text would carry the whole URL.
        let n = notifier(&[("default", "http://127.0.0.1:9/services/T000/B000/XXXXsecret")]);
        let err = crate::model::error_chain(&n.send("default", &rollback()).await.unwrap_err());
        assert!(err.starts_with("notification to http://127.0.0.1:9/… failed"), "{err}");
        assert!(!err.contains("XXXXsecret") && !err.contains("/services"), "{err}");
    }

    #[tokio::test]
    async fn an_endpoint_the_agent_lacks_names_the_flag() {
        let err = notifier(&[("default", SLACK)]).send("oncall", &rollback()).await.unwrap_err().to_string();
        assert!(err.contains("(it has: default); pass --notify-url oncall=URL"), "{err}");
        assert!(!err.contains("XXXXsecret"), "{err}");
    }

    #[test]
    fn payload_is_slack_text_plus_structured_fields() {
        let n = notifier(&[("default", "http://127.0.0.1:1/hook")]);
        let at = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let v = n.payload(&rollback(), at);
        assert_eq!(v["text"], "fleetgate canary: rel-2 rolled back to rel-1: gate error-rate 7.1% (threshold 5%)");
        assert_eq!(v["fleetgate"]["cluster"], "canary");
        assert_eq!(v["fleetgate"]["kind"], "rollback");
        assert_eq!(v["fleetgate"]["rolledBackTo"], "rel-1");
        assert_eq!(v["fleetgate"]["threshold"], "5%");
        assert_eq!(v["fleetgate"]["at"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn text_without_gate_uses_reason_and_message() {
        let n = Notification {
            kind: NotificationKind::Error,
            gate: None,
            figure: None,
            threshold: None,
            rolled_back_to: None,
            reason: "SignatureInvalid".into(),
            message: "tag rel-2 is signed by an untrusted key".into(),
            ..rollback()
        };
        assert_eq!(
            n.text("wave-1"),
            "fleetgate wave-1: rel-2 error: SignatureInvalid: tag rel-2 is signed by an untrusted key"
        );
    }
}
