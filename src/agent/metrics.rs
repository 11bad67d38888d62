//! The agent's Prometheus metrics, served as OpenMetrics text at `/metrics`. Every series carries a
//! constant `cluster` label, so one Prometheus scraping many spokes (or federating them) can tell
//! them apart.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `fleetgate_reconcile_duration_seconds` | histogram | `result` (ok, error) |
//! | `fleetgate_release_info` | gauge (1) | `role` (current, desired, last_known_good), `release` |
//! | `fleetgate_phase` | gauge (1 for the current phase, else 0) | `phase` |
//! | `fleetgate_rollbacks_total` | counter | `reason` |
//! | `fleetgate_gate_evaluations_total` | counter | `gate`, `verdict` |
//! | `fleetgate_last_sync_timestamp_seconds` | gauge | |
//! | `fleetgate_leader` | gauge (1 while this process leads) | |
//! | `fleetgate_paused` | gauge (1 while the agent holds its cluster: flag, annotation, `spec.paused`) | |
//! | `fleetgate_triggers_total` | counter | `source` (startup, poll, webhook, git-refs, request) |
//! | `fleetgate_webhook_replays_total` | counter (signed deliveries refused as replays or stale) | |
//! | `fleetgate_notifications_total` | counter | `endpoint`, `outcome` (delivered, failed: no retry left, dropped: queue full) |

use super::state::{AgentState, Phase};
use super::triggers::TriggerSource;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileResult {
    Ok,
    Error,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReleaseLabels {
    role: &'static str,
    release: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GateLabels {
    gate: String,
    verdict: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NotificationLabels {
    endpoint: String,
    outcome: &'static str,
}

/// What became of each notification, by endpoint: the counter the notifier's delivery task
/// shares with [`Metrics`] (a clone counts into the same series). A notification that never
/// arrived leaves no other trace than a log line, so this is what an alert can watch.
#[derive(Debug, Clone, Default)]
pub struct NotificationOutcomes(Family<NotificationLabels, Counter>);

/// The end of one notification's delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotificationOutcome {
    Delivered,
    /// Every attempt failed (or the error was not worth a retry).
    Failed,
    /// The queue was full; it was never sent.
    Dropped,
}

impl NotificationOutcomes {
    pub fn record(&self, endpoint: &str, outcome: NotificationOutcome) {
        let outcome = match outcome {
            NotificationOutcome::Delivered => "delivered",
            NotificationOutcome::Failed => "failed",
            NotificationOutcome::Dropped => "dropped",
        };
        self.0.get_or_create(&NotificationLabels { endpoint: endpoint.to_string(), outcome }).inc();
    }
}

type HistogramFamily = Family<ResultLabels, Histogram, fn() -> Histogram>;

fn reconcile_histogram() -> Histogram {
    // 10 ms (nothing changed) … about 10 min (apply with slow rollouts).
    Histogram::new(exponential_buckets(0.01, 2.5, 13))
}

/// The metrics and their registry. Shared as `Arc<Metrics>` by the loop and the HTTP server.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconcile_duration: HistogramFamily,
    release_info: Family<ReleaseLabels, Gauge>,
    phase: Family<PhaseLabels, Gauge>,
    rollbacks: Family<ReasonLabels, Counter>,
    gate_evaluations: Family<GateLabels, Counter>,
    last_sync: Gauge<f64, AtomicU64>,
    leader: Gauge,
    paused: Gauge,
    triggers: Family<SourceLabels, Counter>,
    webhook_replays: Counter,
    notifications: NotificationOutcomes,
}

impl Metrics {
    pub fn new(cluster: &str) -> Metrics {
        let mut registry =
            Registry::with_prefix_and_labels("fleetgate", [("cluster".into(), cluster.to_string().into())].into_iter());
        let reconcile_duration = HistogramFamily::new_with_constructor(reconcile_histogram);
        let release_info = Family::<ReleaseLabels, Gauge>::default();
        let phase = Family::<PhaseLabels, Gauge>::default();
        let rollbacks = Family::<ReasonLabels, Counter>::default();
        let gate_evaluations = Family::<GateLabels, Counter>::default();
        let last_sync = Gauge::<f64, AtomicU64>::default();
        let leader = Gauge::default();
        let paused = Gauge::default();
        let triggers = Family::<SourceLabels, Counter>::default();
        let notifications = NotificationOutcomes::default();
        let webhook_replays = Counter::default();
        let seconds = prometheus_client::registry::Unit::Seconds;
        registry.register_with_unit(
            "reconcile_duration",
            "Time one reconcile (one wake of the loop) took",
            seconds.clone(),
            reconcile_duration.clone(),
        );
        registry.register(
            "release_info",
            "Releases this cluster runs, wants and last saw pass (value 1)",
            release_info.clone(),
        );
        registry.register("phase", "The agent's phase (1 for the current one)", phase.clone());
        registry.register("rollbacks", "Automatic rollbacks by reason", rollbacks.clone());
        registry.register("gate_evaluations", "Gate evaluations by gate and verdict", gate_evaluations.clone());
        registry.register_with_unit(
            "last_sync_timestamp",
            "Unix time of the last completed sync",
            seconds,
            last_sync.clone(),
        );
        registry.register("leader", "1 while this process holds the leader Lease", leader.clone());
        registry.register("paused", "1 while the agent holds its cluster on the release it runs", paused.clone());
        registry.register("triggers", "Loop wake-ups by trigger source", triggers.clone());
        registry.register(
            "webhook_replays",
            "Signed webhook deliveries refused as replays or as older than the replay window",
            webhook_replays.clone(),
        );
        registry.register("notifications", "Notifications by endpoint and outcome", notifications.0.clone());
        let metrics = Metrics {
            registry,
            reconcile_duration,
            release_info,
            phase,
            rollbacks,
            gate_evaluations,
            last_sync,
            leader,
            paused,
            triggers,
            webhook_replays,
            notifications,
        };
        metrics.observe_state(&AgentState::default());
        metrics
    }

    /// OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    pub fn observe_reconcile(&self, took: Duration, result: ReconcileResult) {
        let result = match result {
            ReconcileResult::Ok => "ok",
            ReconcileResult::Error => "error",
        };
        self.reconcile_duration.get_or_create(&ResultLabels { result }).observe(took.as_secs_f64());
    }

    /// Publishes the releases and phase of `state`; call after every state change (and once after
    /// loading).
    pub fn observe_state(&self, state: &AgentState) {
        self.release_info.clear();
        for (role, release) in
            [("current", state.current()), ("desired", state.desired()), ("last_known_good", state.last_known_good())]
        {
            if let Some(release) = release {
                self.release_info.get_or_create(&ReleaseLabels { role, release: release.to_string() }).set(1);
            }
        }
        for p in Phase::ALL {
            self.phase.get_or_create(&PhaseLabels { phase: p.as_str() }).set(i64::from(p == state.phase()));
        }
    }

    /// Counts an automatic rollback; `reason` is the failure category (e.g. `GateFailed`).
    pub fn record_rollback(&self, reason: &str) {
        self.rollbacks.get_or_create(&ReasonLabels { reason: reason.to_string() }).inc();
    }

    /// Counts one gate evaluation; `verdict` is `pass`, `fail` or `error`.
    pub fn record_gate_evaluation(&self, gate: &str, verdict: &str) {
        self.gate_evaluations.get_or_create(&GateLabels { gate: gate.to_string(), verdict: verdict.to_string() }).inc();
    }

    /// Records that a sync finished now.
    pub fn mark_synced(&self) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.last_sync.set(now.as_secs_f64());
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn set_paused(&self, paused: bool) {
        self.paused.set(i64::from(paused));
    }

    pub fn record_trigger(&self, source: TriggerSource) {
        self.triggers.get_or_create(&SourceLabels { source: source.as_str() }).inc();
    }

    pub fn record_webhook_replay(&self) {
        self.webhook_replays.inc();
    }

    /// The notification counter, for the notifier to count into.
    pub fn notifications(&self) -> NotificationOutcomes {
        self.notifications.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    #[test]
    fn every_metric_is_exposed_with_the_cluster_label() {
        let m = Metrics::new("canary");
        m.observe_reconcile(Duration::from_millis(30), ReconcileResult::Ok);
        m.record_rollback("GateFailed");
        m.record_gate_evaluation("error-rate", "fail");
        m.mark_synced();
        m.set_leader(true);
        m.record_trigger(TriggerSource::Webhook);
        m.notifications().record("oncall", NotificationOutcome::Failed);
        let text = m.encode();
        for name in [
            "fleetgate_reconcile_duration_seconds_bucket{",
            "fleetgate_phase{",
            "fleetgate_rollbacks_total{",
            "fleetgate_gate_evaluations_total{",
            "fleetgate_last_sync_timestamp_seconds{",
            "fleetgate_leader{",
            "fleetgate_triggers_total{",
            "fleetgate_notifications_total{",
        ] {
            let lines = line(&text, name);
            assert!(!lines.is_empty(), "{name} missing in\n{text}");
            assert!(lines.iter().all(|l| l.contains("cluster=\"canary\"")), "{lines:?}");
        }
        assert_eq!(
            line(&text, "fleetgate_rollbacks_total{"),
            ["fleetgate_rollbacks_total{cluster=\"canary\",reason=\"GateFailed\"} 1"]
        );
        assert_eq!(
            line(&text, "fleetgate_notifications_total{"),
            ["fleetgate_notifications_total{cluster=\"canary\",endpoint=\"oncall\",outcome=\"failed\"} 1"]
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn state_replaces_release_info_and_phase() {
        let m = Metrics::new("c");
        let mut s = AgentState::default();
        s.observe_desired(Some("rel-1"), false);
        s.begin("rel-1", "abc", chrono::Utc::now()).unwrap();
        m.observe_state(&s);
        let text = m.encode();
        assert_eq!(
            line(&text, "fleetgate_release_info{"),
            ["fleetgate_release_info{cluster=\"c\",role=\"desired\",release=\"rel-1\"} 1"]
        );
        assert!(text.contains("fleetgate_phase{cluster=\"c\",phase=\"Verifying\"} 1"), "{text}");
        assert!(text.contains("fleetgate_phase{cluster=\"c\",phase=\"Idle\"} 0"), "{text}");
        s.observe_desired(Some("rel-2"), false);
        s.abort("test").unwrap();
        m.observe_state(&s);
        let text = m.encode();
        assert_eq!(
            line(&text, "fleetgate_release_info{"),
            ["fleetgate_release_info{cluster=\"c\",role=\"desired\",release=\"rel-2\"} 1"]
        );
    }
}
