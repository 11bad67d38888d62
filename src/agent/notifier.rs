//! The notification endpoints: every transition of a release on this cluster can be POSTed to
//! the agent's endpoints (`--notify-url [NAME=]URL`); the fleet repo picks one by name in
//! `fleet.yaml` `spec.status.notify` and never supplies a URL, a format or a secret.
//!
//! **Transitions** ([`NotificationKind`]): `started` (the apply begins), `applied` (the bake
//! begins), `passed` (every gate held for the bake), `failed` (a gate or the apply failed; the
//! rollback starts), `rolledBack`, `paused` (the agent holds the cluster: `spec.paused`,
//! `--paused` or the state ConfigMap's annotation; once per reason and release), `refused`
//! (signature, trust, admission or a pre-apply gate; nothing applied) and `error` (a rollback
//! attempt failed). Each endpoint hears the kinds of its `--notify-on NAME=KIND,…` (or `all`);
//! by default [`DEFAULT_KINDS`]: what someone must look at — failed, rolledBack, refused, error,
//! paused. The progress of a healthy release (started, applied, passed) is opt-in.
//!
//! **Formats** (`--notify-format NAME=FORMAT`, [`Format`]), each carrying the same structured
//! details under `fleetgate` (kind, cluster, wave, the release's target clusters, release, reason,
//! message, the gate with its figure and threshold, every gate figure, who released and promoted
//! it with commit, author, subject, trailers and the verified signer's fingerprint, time):
//! * `slack` (default): `text` plus Slack `blocks`; Mattermost and Rocket.Chat show `text`.
//! * `teams`: an Adaptive Card (1.4) in the `attachments` envelope — what a Teams workflow
//!   ("When a Teams webhook request is received") accepts. Not the legacy MessageCard: it only
//!   worked through Office 365 connectors, which Microsoft retired.
//!
//! What Git supplies (commit subjects, authors, trailers, release ids, messages quoting them) is
//! written by whoever can push, so in the chat formats it is text, never markup: Slack's `&`, `<`,
//! `>` become the entities Slack documents (`<!channel>` and `<https://evil|click>` show as
//! written, and ping or link nobody), and Teams' Markdown characters (`\ [ ] * _ ` ~`) are
//! backslash-escaped (`[click](https://evil)` is no link). The structured `fleetgate` details stay as they are.
//! * `webhook`: `text` and the details only, signed (see [`sign`]): `X-Fleetgate-Timestamp: T`
//!   (Unix seconds) and `X-Fleetgate-Signature: sha256=HEX`, HEX the HMAC-SHA256 with the secret
//!   of `--notify-secret-file NAME=FILE` over `T.` followed by the exact body bytes. A receiver
//!   recomputes it over the raw body, compares in constant time and refuses a T older than a
//!   few minutes (a replay).
//!
//! **Delivery** is off the critical path: [`Notifier::enqueue`] checks the endpoint and its
//! filter and queues the message; one task per agent delivers the queue in order, each message
//! with [`RetryPolicy`] (bounded attempts, exponential backoff with jitter, a bound on the total
//! wait) on a transport error, a timeout, HTTP 429 or 5xx — never on another 4xx. A message that
//! still fails is logged (`notification not delivered`) and dropped, and counted either way in
//! `fleetgate_notifications_total{endpoint, outcome}` (which an alert watches); a rollback never
//! waits for a receiver. A webhook URL is a secret (whoever knows a Slack webhook URL can post to the
//! channel): errors show only its scheme and host ([`redacted_url`]).

use super::metrics::{NotificationOutcome, NotificationOutcomes};
use crate::model::redacted_url;
use crate::release::{TipTrust, VerifiedRelease};
use crate::source::Checkout;
use crate::status::{GateFigure, truncate};
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::Serialize;
use serde_json::json;
use sha2::Sha256;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::mpsc;

/// The header with the HMAC of a `webhook` body: `sha256=<hex>`.
pub const SIGNATURE_HEADER: &str = "X-Fleetgate-Signature";
/// The header with the Unix time the signature covers.
pub const TIMESTAMP_HEADER: &str = "X-Fleetgate-Timestamp";
/// Messages waiting for delivery beyond this are dropped (with a log line): a receiver that is
/// down for long must not grow the agent's memory.
const QUEUE: usize = 256;

/// A transition of a release on this cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum NotificationKind {
    /// The apply begins.
    Started,
    /// Applied; the bake begins.
    Applied,
    /// Every gate held for the bake time.
    Passed,
    /// A gate or the apply failed; the rollback begins.
    Failed,
    /// The release was rolled back.
    RolledBack,
    /// The agent holds the cluster on the release it runs.
    Paused,
    /// The release was refused before anything was applied (signature, trust, admission,
    /// a pre-apply gate).
    Refused,
    /// The agent could not finish (a rollback attempt failed and is retried).
    Error,
}

/// What an endpoint hears when `--notify-on` says nothing for it.
pub const DEFAULT_KINDS: [NotificationKind; 5] = [
    NotificationKind::Failed,
    NotificationKind::RolledBack,
    NotificationKind::Refused,
    NotificationKind::Error,
    NotificationKind::Paused,
];

impl NotificationKind {
    pub const ALL: [NotificationKind; 8] = [
        NotificationKind::Started,
        NotificationKind::Applied,
        NotificationKind::Passed,
        NotificationKind::Failed,
        NotificationKind::RolledBack,
        NotificationKind::Paused,
        NotificationKind::Refused,
        NotificationKind::Error,
    ];

    /// Its name in `--notify-on` and in the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationKind::Started => "started",
            NotificationKind::Applied => "applied",
            NotificationKind::Passed => "passed",
            NotificationKind::Failed => "failed",
            NotificationKind::RolledBack => "rolledBack",
            NotificationKind::Paused => "paused",
            NotificationKind::Refused => "refused",
            NotificationKind::Error => "error",
        }
    }

    /// `KIND,KIND…` (or `all`) as `--notify-on` takes it.
    ///
    /// # Errors
    /// The first word that is no kind, with the kinds there are.
    pub fn parse_list(list: &str) -> Result<BTreeSet<NotificationKind>, String> {
        let mut kinds = BTreeSet::new();
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if word == "all" {
                kinds.extend(NotificationKind::ALL);
                continue;
            }
            match NotificationKind::ALL.into_iter().find(|k| k.as_str().eq_ignore_ascii_case(word)) {
                Some(kind) => kinds.insert(kind),
                None => {
                    let known: Vec<&str> = NotificationKind::ALL.iter().map(|k| k.as_str()).collect();
                    return Err(format!("{word:?} is not one of all, {}", known.join(", ")));
                }
            };
        }
        Ok(kinds)
    }
}

/// How an endpoint's messages are shaped (module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    #[default]
    Slack,
    Teams,
    Webhook,
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "slack" => Ok(Format::Slack),
            "teams" => Ok(Format::Teams),
            "webhook" => Ok(Format::Webhook),
            other => Err(format!("{other:?} is not one of slack, teams, webhook")),
        }
    }
}

/// One of the agent's endpoints, as its configuration resolved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: reqwest::Url,
    pub format: Format,
    /// The kinds it hears.
    pub on: BTreeSet<NotificationKind>,
    /// The HMAC secret of a `webhook` endpoint, read at each delivery (a rotated Secret is
    /// picked up); trailing line breaks are not part of it.
    pub secret_file: Option<PathBuf>,
}

impl Endpoint {
    /// A `slack` endpoint hearing [`DEFAULT_KINDS`].
    pub fn new(url: reqwest::Url) -> Endpoint {
        Endpoint { url, format: Format::Slack, on: DEFAULT_KINDS.into_iter().collect(), secret_file: None }
    }
}

/// A commit behind the release: who made it and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Provenance {
    pub commit: String,
    /// `Name <email>` of the commit's author.
    pub author: String,
    /// The first line of the commit message.
    pub subject: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub trailers: Vec<Trailer>,
    /// `Name <email>` of the release tag's tagger (inside the signed tag).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tagger: Option<String>,
    /// Fingerprint of the trusted key whose signature the agent verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Trailer {
    pub key: String,
    pub value: String,
}

impl Provenance {
    /// Reads `commit` of `repo`; `None` when it is not there.
    pub fn of_commit(repo: &git2::Repository, commit: git2::Oid, signer: Option<&str>) -> Option<Provenance> {
        let c = repo.find_commit(commit).ok()?;
        let message = String::from_utf8_lossy(c.message_bytes()).into_owned();
        let trailers = git2::message_trailers_strs(&message)
            .map(|t| t.iter().map(|(k, v)| Trailer { key: k.to_string(), value: v.to_string() }).collect())
            .unwrap_or_default();
        Some(Provenance {
            commit: commit.to_string(),
            author: person(&c.author()),
            subject: message.lines().next().unwrap_or_default().to_string(),
            trailers,
            tagger: None,
            signer: signer.map(str::to_string),
        })
    }
}

fn person(s: &git2::Signature<'_>) -> String {
    format!("{} <{}>", String::from_utf8_lossy(s.name_bytes()), String::from_utf8_lossy(s.email_bytes()))
}

/// What a notification says about the release besides the transition: its scope and who made
/// it; read from Git by the loop when the release starts (or resumes), the same for every
/// message of the release.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct About {
    /// This cluster's wave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wave: Option<String>,
    /// The release's `targetClusters`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub target_clusters: Vec<String>,
    /// The variant of the release this cluster runs (selected by its own facts), if it has variants.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// The tagged commit, its tagger and the key that signed the tag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_by: Option<Provenance>,
    /// The branch tip that asked for the release (the promotion, or its merge), and the
    /// promotion key that signed it if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promoted_by: Option<Provenance>,
}

impl About {
    /// What the notifications of `release` say about it, read from `checkout`: this cluster's
    /// wave (in the tip's configuration), the tagged commit with the tag's tagger, and the branch
    /// tip. Only a `verified` release names its signer and target clusters. Best effort: what
    /// cannot be read is left out.
    pub fn read(
        checkout: &Checkout,
        release: &str,
        verified: Option<&VerifiedRelease>,
        tip: &TipTrust,
        wave: Option<&str>,
    ) -> About {
        let repo = checkout.repo();
        let released_by = checkout.tag(release).ok().flatten().and_then(|tag| {
            let mut p = Provenance::of_commit(repo, tag.commit, verified.and_then(VerifiedRelease::signer))?;
            p.tagger = tag.object.and_then(|o| repo.find_tag(o).ok()).and_then(|t| t.tagger().map(|s| person(&s)));
            Some(p)
        });
        let promotion_signer = match tip {
            TipTrust::Signed { signer } => Some(signer.as_str()),
            TipTrust::Unsigned | TipTrust::WriteBack { .. } => None,
        };
        About {
            wave: wave.map(str::to_string),
            target_clusters: verified.map(|v| v.release().spec.target_clusters.clone()).unwrap_or_default(),
            variant: verified.and_then(VerifiedRelease::variant).map(str::to_string),
            released_by,
            promoted_by: Provenance::of_commit(repo, checkout.tip(), promotion_signer),
        }
    }
}

/// What happened; the notifier adds the cluster and the time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    pub kind: NotificationKind,
    pub release: String,
    /// The category (e.g. `GateFailed`, `ApplyFailed`, `SignatureInvalid`, `Paused`).
    pub reason: String,
    /// The full message (error chain, or what happened).
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_back_to: Option<String>,
    /// The deciding gate, its figure and threshold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figure: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<String>,
    /// Every gate's figure (passed, failed, rolled back).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<GateFigure>,
    /// Boxed: a notification is part of every step's report, which the loop's futures hold.
    #[serde(flatten)]
    pub about: Box<About>,
}

impl Notification {
    /// A notification without gate or scope details.
    pub fn new(kind: NotificationKind, release: &str, reason: &str, message: &str) -> Notification {
        Notification {
            kind,
            release: release.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            rolled_back_to: None,
            gate: None,
            figure: None,
            threshold: None,
            gates: Vec::new(),
            about: Box::default(),
        }
    }

    /// With `gates`, the deciding one being the first that failed (else the first not passed).
    pub fn with_gates(mut self, gates: &[GateFigure]) -> Notification {
        let deciding =
            gates.iter().find(|g| g.verdict == "fail").or_else(|| gates.iter().find(|g| g.verdict != "pass"));
        if let Some(g) = deciding {
            self.gate = Some(g.name.clone());
            self.figure = Some(g.observed.clone());
            self.threshold = Some(g.threshold.clone());
        }
        self.gates = gates.to_vec();
        self
    }

    /// The one-line human text (Slack's `text`).
    pub fn text(&self, cluster: &str) -> String {
        let release = &self.release;
        let what = match (self.kind, &self.rolled_back_to) {
            (NotificationKind::Started, _) => format!("{release} apply started"),
            (NotificationKind::Applied, _) => format!("{release} applied, baking"),
            (NotificationKind::Passed, _) => format!("{release} passed its gates"),
            (NotificationKind::Failed, _) => format!("{release} failed, rolling back"),
            (NotificationKind::RolledBack, Some(to)) => format!("{release} rolled back to {to}"),
            (NotificationKind::RolledBack, None) => format!("{release} rolled back (no earlier release)"),
            (NotificationKind::Paused, _) => format!("{release} held"),
            (NotificationKind::Refused, _) => format!("{release} refused before apply"),
            (NotificationKind::Error, _) => format!("{release} error"),
        };
        let why = match (&self.gate, &self.figure, &self.threshold) {
            (Some(g), Some(f), Some(t)) if self.kind != NotificationKind::Passed => {
                format!("gate {g} {f} (threshold {t})")
            }
            (Some(g), None, _) => format!("gate {g}: {}", self.message),
            _ => format!("{}: {}", self.reason, self.message),
        };
        format!("fleetgate {cluster}: {what}: {why}")
    }
}

/// How often and how long a message is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (the first one included).
    pub attempts: usize,
    /// The wait after the first failure; each next wait doubles (with jitter) up to `max_delay`.
    pub first_delay: Duration,
    pub max_delay: Duration,
    /// The sum of the waits is at most this.
    pub total_delay: Duration,
}

impl Default for RetryPolicy {
    /// 4 attempts, 1 s, 2 s, 4 s apart (±jitter), waiting 30 s at most.
    fn default() -> Self {
        RetryPolicy {
            attempts: 4,
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(10),
            total_delay: Duration::from_secs(30),
        }
    }
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
    #[error("reading the HMAC secret of notification endpoint {endpoint:?} ({path})")]
    Secret { endpoint: String, path: PathBuf, source: std::io::Error },
    #[error("notification endpoint {0:?} has the webhook format but no secret; pass --notify-secret-file {0}=FILE")]
    NoSecret(String),
}

impl NotifyError {
    /// Whether another attempt may succeed: a transport failure, a timeout, HTTP 429 or 5xx.
    pub fn is_retryable(&self) -> bool {
        match self {
            NotifyError::Timeout { .. } | NotifyError::Transport { .. } => true,
            NotifyError::Status { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}

/// What [`Notifier::enqueue`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    /// Queued for delivery.
    Queued,
    /// The endpoint does not hear this kind (`--notify-on`).
    Filtered,
    /// The queue was full: dropped.
    Dropped,
}

/// The HMAC-SHA256 of `timestamp.body` with `secret`, as the `X-Fleetgate-Signature` value.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// The JSON document of `n` for `format` (module docs).
pub fn body(format: Format, cluster: &str, n: &Notification, at: DateTime<Utc>) -> serde_json::Value {
    let mut details = serde_json::to_value(n).expect("a notification serializes");
    details["cluster"] = json!(cluster);
    details["at"] = json!(at);
    let text = escape(format, &n.text(cluster));
    match format {
        Format::Webhook => json!({ "text": text, "fleetgate": details }),
        Format::Slack => json!({ "text": text, "blocks": slack_blocks(&text, cluster, n), "fleetgate": details }),
        Format::Teams => json!({
            "type": "message",
            "text": text,
            "attachments": [{
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": null,
                "content": teams_card(&text, cluster, n),
            }],
            "fleetgate": details,
        }),
    }
}

/// `s` as plain text in `format`'s markup (module docs): Slack's mrkdwn controls as entities,
/// Teams' Markdown characters backslash-escaped; a `webhook` body is JSON, read by a program.
fn escape(format: Format, s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match (format, c) {
            (Format::Slack, '&') => out.push_str("&amp;"),
            (Format::Slack, '<') => out.push_str("&lt;"),
            (Format::Slack, '>') => out.push_str("&gt;"),
            // Without `[` and `]` no link can be written; emphasis and code need the others.
            (Format::Teams, '\\' | '[' | ']' | '*' | '_' | '`' | '~') => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

/// Title, value pairs both chat formats show, the values escaped for `format`.
fn facts(format: Format, cluster: &str, n: &Notification) -> Vec<(&'static str, String)> {
    let mut facts = vec![("Release", n.release.clone())];
    let scope = match &n.about.wave {
        Some(wave) => format!("{cluster} (wave {wave})"),
        None => cluster.to_string(),
    };
    facts.push(("Cluster", scope));
    if !n.about.target_clusters.is_empty() {
        facts.push(("Targets", n.about.target_clusters.join(", ")));
    }
    if let (Some(g), Some(f), Some(t)) = (&n.gate, &n.figure, &n.threshold) {
        facts.push(("Gate", format!("{g}: {f} (threshold {t})")));
    }
    if let Some(to) = &n.rolled_back_to {
        facts.push(("Rolled back to", to.clone()));
    }
    let by = |who: &str, p: &Provenance| {
        let signer = p.signer.as_deref().map(|s| format!(", signed by {s}")).unwrap_or_default();
        format!("{who} — {}{signer}", p.subject)
    };
    if let Some(p) = &n.about.promoted_by {
        facts.push(("Promoted by", by(&p.author, p)));
    }
    if let Some(p) = &n.about.released_by {
        facts.push(("Released by", by(p.tagger.as_deref().unwrap_or(&p.author), p)));
    }
    facts.into_iter().map(|(t, v)| (t, escape(format, &v))).collect()
}

fn slack_blocks(text: &str, cluster: &str, n: &Notification) -> serde_json::Value {
    // Slack refuses a message (400, not retried) whose section text passes 3000 characters, a
    // field 2000, or a section with more than 10 fields: cut them to fit.
    let fields: Vec<_> = facts(Format::Slack, cluster, n)
        .into_iter()
        .take(10)
        .map(|(t, v)| json!({ "type": "mrkdwn", "text": truncate(&format!("*{t}*\n{v}"), 2000) }))
        .collect();
    let why = truncate(&escape(Format::Slack, &format!("{}: {}", n.reason, n.message)), 3000);
    json!([
        { "type": "section", "text": { "type": "mrkdwn", "text": truncate(text, 3000) } },
        { "type": "section", "fields": fields },
        { "type": "context", "elements": [{ "type": "mrkdwn", "text": why }] },
    ])
}

fn teams_card(text: &str, cluster: &str, n: &Notification) -> serde_json::Value {
    let colour = match n.kind {
        NotificationKind::Passed => "Good",
        NotificationKind::Started | NotificationKind::Applied | NotificationKind::Paused => "Default",
        _ => "Attention",
    };
    let facts: Vec<_> =
        facts(Format::Teams, cluster, n).into_iter().map(|(t, v)| json!({ "title": t, "value": v })).collect();
    json!({
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": [
            { "type": "TextBlock", "text": text, "weight": "Bolder", "wrap": true, "color": colour },
            { "type": "FactSet", "facts": facts },
            { "type": "TextBlock", "text": escape(Format::Teams, &format!("{}: {}", n.reason, n.message)), "wrap": true, "isSubtle": true },
        ],
    })
}

/// What the delivery task shares with the loop.
#[derive(Debug, Clone)]
struct Delivery {
    http: reqwest::Client,
    endpoints: BTreeMap<String, Endpoint>,
    cluster: String,
    timeout: Duration,
    retry: RetryPolicy,
    outcomes: NotificationOutcomes,
}

/// Sends notifications for one cluster to the endpoints the agent was given.
#[derive(Debug, Clone)]
pub struct Notifier {
    delivery: Arc<Delivery>,
    /// The delivery task's queue, started on the first [`enqueue`](Self::enqueue).
    queue: Arc<OnceLock<mpsc::Sender<(String, Notification)>>>,
}

impl Notifier {
    /// A notifier for `endpoints` (by name), each request bounded by `timeout`, retried by
    /// [`RetryPolicy::default`].
    ///
    /// # Errors
    /// [`NotifyError::Client`] when the HTTP client cannot be built (its TLS backend fails to
    /// initialise, e.g. no usable system certificate store).
    pub fn new(
        endpoints: BTreeMap<String, Endpoint>,
        cluster: &str,
        timeout: Duration,
    ) -> Result<Notifier, NotifyError> {
        // The URL is a secret (a Slack webhook's path is its credential); a redirect would hand
        // the payload to wherever the answer points: follow none.
        let http = crate::http::client_builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("fleetgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| NotifyError::Client(e.without_url()))?;
        let delivery = Delivery {
            http,
            endpoints,
            cluster: cluster.to_string(),
            timeout,
            retry: RetryPolicy::default(),
            outcomes: NotificationOutcomes::default(),
        };
        Ok(Notifier { delivery: Arc::new(delivery), queue: Arc::default() })
    }

    /// The same notifier retrying by `retry` (before anything was enqueued).
    pub fn with_retry(self, retry: RetryPolicy) -> Notifier {
        self.with(|d| d.retry = retry)
    }

    /// The same notifier counting what became of each notification into `outcomes` (before
    /// anything was enqueued).
    pub fn counting(self, outcomes: NotificationOutcomes) -> Notifier {
        self.with(|d| d.outcomes = outcomes)
    }

    fn with(self, change: impl FnOnce(&mut Delivery)) -> Notifier {
        let mut delivery = (*self.delivery).clone();
        change(&mut delivery);
        Notifier { delivery: Arc::new(delivery), queue: Arc::default() }
    }

    fn endpoint(&self, name: &str) -> Result<&Endpoint, NotifyError> {
        self.delivery.endpoints.get(name).ok_or_else(|| NotifyError::UnknownEndpoint {
            name: name.to_string(),
            known: self.delivery.endpoints.keys().cloned().collect::<Vec<_>>().join(", "),
        })
    }

    /// Queues `n` for endpoint `name` when it hears `n`'s kind; the delivery task sends the queue
    /// in order, retrying each message (module docs). Call it from within a Tokio runtime.
    ///
    /// # Errors
    /// [`NotifyError::UnknownEndpoint`] when the agent has no endpoint `name`.
    pub fn enqueue(&self, name: &str, n: Notification) -> Result<Queued, NotifyError> {
        if !self.endpoint(name)?.on.contains(&n.kind) {
            return Ok(Queued::Filtered);
        }
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(deliver_queue(self.delivery.clone(), rx));
            tx
        });
        match queue.try_send((name.to_string(), n)) {
            Ok(()) => Ok(Queued::Queued),
            Err(e) => {
                let (_, n) = e.into_inner();
                tracing::warn!(endpoint = name, kind = n.kind.as_str(), release = %n.release, "notification queue full; dropped");
                self.delivery.outcomes.record(name, NotificationOutcome::Dropped);
                Ok(Queued::Dropped)
            }
        }
    }

    /// Sends `n` to endpoint `name` now, whatever its filter, retrying by the policy; returns the
    /// attempts it took.
    ///
    /// # Errors
    /// The last attempt's error once no retry is left (or the error is not worth one).
    pub async fn deliver(&self, name: &str, n: &Notification) -> Result<usize, NotifyError> {
        self.delivery.deliver(name, n).await
    }
}

/// The delivery task: the queue in order, until every [`Notifier`] is dropped.
async fn deliver_queue(delivery: Arc<Delivery>, mut rx: mpsc::Receiver<(String, Notification)>) {
    while let Some((endpoint, n)) = rx.recv().await {
        match delivery.deliver(&endpoint, &n).await {
            Ok(1) => {}
            Ok(attempts) => {
                tracing::info!(%endpoint, kind = n.kind.as_str(), attempts, "notification delivered after retries")
            }
            Err(e) => tracing::warn!(
                %endpoint,
                kind = n.kind.as_str(),
                release = %n.release,
                error = %crate::model::error_chain(&e),
                "notification not delivered"
            ),
        }
    }
}

impl Delivery {
    /// [`Self::try_deliver`], counted.
    async fn deliver(&self, name: &str, n: &Notification) -> Result<usize, NotifyError> {
        let delivered = self.try_deliver(name, n).await;
        let outcome = if delivered.is_ok() { NotificationOutcome::Delivered } else { NotificationOutcome::Failed };
        self.outcomes.record(name, outcome);
        delivered
    }

    async fn try_deliver(&self, name: &str, n: &Notification) -> Result<usize, NotifyError> {
        use backon::{ExponentialBuilder, Retryable};
        let endpoint = self.endpoints.get(name).ok_or_else(|| NotifyError::UnknownEndpoint {
            name: name.to_string(),
            known: self.endpoints.keys().cloned().collect::<Vec<_>>().join(", "),
        })?;
        let body = serde_json::to_vec(&body(endpoint.format, &self.cluster, n, Utc::now())).expect("JSON serializes");
        let secret = match (endpoint.format, &endpoint.secret_file) {
            (Format::Webhook, Some(path)) => Some(read_secret(name, path)?),
            (Format::Webhook, None) => return Err(NotifyError::NoSecret(name.to_string())),
            _ => None,
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.retry.first_delay)
            .with_max_delay(self.retry.max_delay)
            .with_max_times(self.retry.attempts.saturating_sub(1))
            .with_total_delay(Some(self.retry.total_delay))
            .with_jitter();
        let attempts = AtomicUsize::new(0);
        let (counter, body, secret) = (&attempts, body.as_slice(), secret.as_deref());
        let attempt = move || async move {
            counter.fetch_add(1, Ordering::Relaxed);
            self.post(endpoint, body, secret).await
        };
        attempt
            .retry(backoff)
            .when(NotifyError::is_retryable)
            .notify(|e, wait| tracing::debug!(endpoint = name, error = %e, ?wait, "notification failed; retrying"))
            .await?;
        Ok(attempts.into_inner())
    }

    /// One POST of `body`, signed with `secret` when there is one.
    async fn post(&self, endpoint: &Endpoint, body: &[u8], secret: Option<&[u8]>) -> Result<(), NotifyError> {
        let url = redacted_url(&endpoint.url);
        let mut request =
            self.http.post(endpoint.url.clone()).header(reqwest::header::CONTENT_TYPE, "application/json");
        if let Some(secret) = secret {
            let now = Utc::now().timestamp();
            request =
                request.header(TIMESTAMP_HEADER, now.to_string()).header(SIGNATURE_HEADER, sign(secret, now, body));
        }
        let response = request.body(body.to_vec()).send().await.map_err(|source| {
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

fn read_secret(endpoint: &str, path: &std::path::Path) -> Result<Vec<u8>, NotifyError> {
    let mut secret = std::fs::read(path).map_err(|source| NotifyError::Secret {
        endpoint: endpoint.to_string(),
        path: path.to_path_buf(),
        source,
    })?;
    while secret.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
        secret.pop();
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn rollback() -> Notification {
        let gates = [
            GateFigure { name: "restarts".into(), observed: "0".into(), threshold: "3".into(), verdict: "pass".into() },
            GateFigure {
                name: "error-rate".into(),
                observed: "7.1%".into(),
                threshold: "5%".into(),
                verdict: "fail".into(),
            },
        ];
        Notification {
            rolled_back_to: Some("rel-1".into()),
            about: Box::new(About {
                wave: Some("canary".into()),
                target_clusters: vec!["canary".into(), "prod-1".into()],
                variant: None,
                released_by: None,
                promoted_by: Some(Provenance {
                    commit: "c0ffee".into(),
                    author: "Ann <ann@example.com>".into(),
                    subject: "promote rel-2 to canary".into(),
                    trailers: vec![Trailer { key: "Change-Id".into(), value: "I42".into() }],
                    tagger: None,
                    signer: Some("ABCD1234".into()),
                }),
            }),
            ..Notification::new(NotificationKind::RolledBack, "rel-2", "GateFailed", "error rate 7.1% above 5%")
                .with_gates(&gates)
        }
    }

    const SLACK: &str = "https://hooks.slack.com/services/T000/B000/XXXXsecret";
    const AT: i64 = 1_700_000_000;

    fn notifier(endpoints: &[(&str, &str)]) -> Notifier {
        let endpoints = endpoints.iter().map(|(n, u)| (n.to_string(), Endpoint::new(u.parse().unwrap()))).collect();
        Notifier::new(endpoints, "canary", Duration::from_secs(2)).unwrap()
    }

    #[tokio::test]
    async fn failures_never_show_the_webhook_url() {
        // A closed port: the transport error, whose reqwest text would carry the whole URL.
        let n = notifier(&[("default", "http://127.0.0.1:9/services/T000/B000/XXXXsecret")])
            .with_retry(RetryPolicy { attempts: 1, ..RetryPolicy::default() });
        let err = crate::model::error_chain(&n.deliver("default", &rollback()).await.unwrap_err());
        assert!(err.starts_with("notification to http://127.0.0.1:9/… failed"), "{err}");
        assert!(!err.contains("XXXXsecret") && !err.contains("/services"), "{err}");
    }

    #[tokio::test]
    async fn a_notification_that_never_arrived_is_counted() {
        let metrics = crate::agent::metrics::Metrics::new("canary");
        let n = notifier(&[("oncall", "http://127.0.0.1:9/hook")])
            .with_retry(RetryPolicy { attempts: 1, ..RetryPolicy::default() })
            .counting(metrics.notifications());
        n.deliver("oncall", &rollback()).await.unwrap_err();
        let text = metrics.encode();
        let series = "fleetgate_notifications_total{cluster=\"canary\",endpoint=\"oncall\",outcome=\"failed\"} 1";
        assert!(text.contains(series), "{text}");
    }

    #[tokio::test]
    async fn an_endpoint_the_agent_lacks_names_the_flag() {
        let err = notifier(&[("default", SLACK)]).enqueue("oncall", rollback()).unwrap_err().to_string();
        assert!(err.contains("(it has: default); pass --notify-url oncall=URL"), "{err}");
        assert!(!err.contains("XXXXsecret"), "{err}");
    }

    #[test]
    fn an_endpoint_hears_only_its_kinds() {
        let n = notifier(&[("default", SLACK)]);
        let started = Notification::new(NotificationKind::Started, "rel-2", "ApplyStarted", "applying");
        assert_eq!(n.enqueue("default", started).unwrap(), Queued::Filtered, "progress is opt-in");
    }

    #[test]
    fn kinds_parse_from_the_flag() {
        use NotificationKind::*;
        assert_eq!(NotificationKind::parse_list("failed, rolledBack").unwrap(), BTreeSet::from([Failed, RolledBack]));
        assert_eq!(NotificationKind::parse_list("all").unwrap().len(), 8);
        let err = NotificationKind::parse_list("failed,rollback").unwrap_err();
        assert!(err.starts_with("\"rollback\" is not one of all, started, applied"), "{err}");
    }

    #[test]
    fn slack_keeps_text_and_details_and_adds_blocks() {
        let v = body(Format::Slack, "canary", &rollback(), DateTime::from_timestamp(AT, 0).unwrap());
        assert_eq!(v["text"], "fleetgate canary: rel-2 rolled back to rel-1: gate error-rate 7.1% (threshold 5%)");
        let d = &v["fleetgate"];
        assert_eq!(
            (d["cluster"].as_str(), d["kind"].as_str(), d["wave"].as_str()),
            (Some("canary"), Some("rolledBack"), Some("canary"))
        );
        assert_eq!(d["rolledBackTo"], "rel-1");
        assert_eq!((d["gate"].as_str(), d["threshold"].as_str()), (Some("error-rate"), Some("5%")));
        assert_eq!(d["gates"].as_array().unwrap().len(), 2);
        assert_eq!(d["targetClusters"], json!(["canary", "prod-1"]));
        assert_eq!(d["promotedBy"]["author"], "Ann <ann@example.com>");
        assert_eq!(d["promotedBy"]["trailers"][0], json!({"key": "Change-Id", "value": "I42"}));
        assert_eq!(d["at"], "2023-11-14T22:13:20Z");
        assert_eq!(v["blocks"][0]["text"]["text"], v["text"]);
        let fields = v["blocks"][1]["fields"].to_string();
        assert!(fields.contains("*Gate*\\nerror-rate: 7.1% (threshold 5%)"), "{fields}");
        assert!(
            fields.contains("Ann &lt;ann@example.com&gt; — promote rel-2 to canary, signed by ABCD1234"),
            "{fields}"
        );
    }

    #[test]
    fn teams_gets_an_adaptive_card_in_the_attachments_envelope() {
        let v = body(Format::Teams, "canary", &rollback(), DateTime::from_timestamp(AT, 0).unwrap());
        assert_eq!(v["type"], "message");
        let a = &v["attachments"][0];
        assert_eq!(a["contentType"], "application/vnd.microsoft.card.adaptive");
        let card = &a["content"];
        assert_eq!((card["type"].as_str(), card["version"].as_str()), (Some("AdaptiveCard"), Some("1.4")));
        assert_eq!(card["body"][0]["color"], "Attention");
        let facts = card["body"][1]["facts"].as_array().unwrap();
        assert!(facts.contains(&json!({"title": "Cluster", "value": "canary (wave canary)"})), "{facts:?}");
        assert!(facts.contains(&json!({"title": "Rolled back to", "value": "rel-1"})), "{facts:?}");
    }

    /// A pusher's commit subject (and author, and a refusal message quoting a tag) reaches the chat
    /// as text: no `@channel` ping, no disguised link, no bold.
    fn from_a_pusher() -> Notification {
        let mut n = Notification::new(NotificationKind::Refused, "rel-2", "SignatureInvalid", "tag <!here> & more");
        n.about.promoted_by = Some(Provenance {
            commit: "c0ffee".into(),
            author: "Eve <eve@example.com>".into(),
            subject: "<!channel> urgent: <https://evil.example|approve here> [click](https://evil.example) *now*"
                .into(),
            trailers: vec![],
            tagger: None,
            signer: None,
        });
        n
    }

    #[rstest]
    #[case("<!channel> & <https://evil|click>", "&lt;!channel&gt; &amp; &lt;https://evil|click&gt;")]
    #[case("plain rel-2 (wave canary)", "plain rel-2 (wave canary)")]
    fn slack_markup_in_git_text_becomes_entities(#[case] raw: &str, #[case] escaped: &str) {
        assert_eq!(escape(Format::Slack, raw), escaped);
    }

    #[rstest]
    #[case("[click](https://evil)", "\\[click\\](https://evil)")]
    #[case("*bold* _it_ `code` ~x~ a\\b", "\\*bold\\* \\_it\\_ \\`code\\` \\~x\\~ a\\\\b")]
    #[case("canary (wave canary)", "canary (wave canary)")]
    fn teams_markdown_in_git_text_is_backslash_escaped(#[case] raw: &str, #[case] escaped: &str) {
        assert_eq!(escape(Format::Teams, raw), escaped);
    }

    #[test]
    fn a_commit_subject_pings_and_links_nobody_in_slack() {
        let v = body(Format::Slack, "canary", &from_a_pusher(), DateTime::from_timestamp(AT, 0).unwrap());
        let rendered = [v["text"].to_string(), v["blocks"].to_string()].concat();
        for markup in ["<!channel>", "<!here>", "<https://evil.example|approve here>", " & "] {
            assert!(!rendered.contains(markup), "{markup} reached Slack as markup: {rendered}");
        }
        assert!(rendered.contains("&lt;!channel&gt; urgent: &lt;https://evil.example|approve here&gt;"), "{rendered}");
        assert!(rendered.contains("tag &lt;!here&gt; &amp; more"), "{rendered}");
        // The structured details keep what Git said, for programs.
        assert_eq!(v["fleetgate"]["promotedBy"]["subject"].as_str().unwrap().get(..10), Some("<!channel>"));
    }

    #[test]
    fn a_commit_subject_links_nobody_in_teams() {
        let v = body(Format::Teams, "canary", &from_a_pusher(), DateTime::from_timestamp(AT, 0).unwrap());
        let card = v["attachments"][0]["content"].to_string();
        assert!(!card.contains("[click](https://evil.example)"), "{card}");
        assert!(card.contains("\\\\[click\\\\](https://evil.example) \\\\*now\\\\*"), "{card}");
    }

    #[test]
    fn the_webhook_body_is_text_and_details_only() {
        let v = body(Format::Webhook, "canary", &rollback(), DateTime::from_timestamp(AT, 0).unwrap());
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["fleetgate", "text"]);
    }

    /// The value `openssl dgst -sha256 -hmac s3cret` prints for `1700000000.{"text":"hi"}`.
    #[test]
    fn the_signature_is_hmac_sha256_over_timestamp_dot_body() {
        let body = br#"{"text":"hi"}"#;
        assert_eq!(
            sign(b"s3cret", AT, body),
            "sha256=a4abab2c9ec335a751cf8c3848e413a84a4e0eef17a9660d993911fafacadb66"
        );
        assert_ne!(sign(b"other", AT, body), sign(b"s3cret", AT, body));
        assert_ne!(sign(b"s3cret", AT + 1, body), sign(b"s3cret", AT, body), "the timestamp is covered");
    }

    #[rstest]
    #[case(503, true)]
    #[case(500, true)]
    #[case(429, true)]
    #[case(404, false)]
    #[case(400, false)]
    fn only_server_trouble_and_throttling_are_retried(#[case] status: u16, #[case] retried: bool) {
        let e = NotifyError::Status { url: "http://x/…".into(), status };
        assert_eq!(e.is_retryable(), retried);
    }

    #[test]
    fn text_without_gate_uses_reason_and_message() {
        let n = Notification::new(
            NotificationKind::Refused,
            "rel-2",
            "SignatureInvalid",
            "tag rel-2 is signed by an untrusted key",
        );
        assert_eq!(
            n.text("wave-1"),
            "fleetgate wave-1: rel-2 refused before apply: SignatureInvalid: tag rel-2 is signed by an untrusted key"
        );
    }
}
