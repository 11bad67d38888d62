//! `GatePolicy`: how long a release bakes, how often its gates are evaluated, and the named gates
//! it must pass (Deployment available, pod restarts, custom-resource health in CEL, Prometheus
//! queries with absolute or baseline-relative thresholds, webhook reachability).
//!
//! A gate is written as a name plus exactly one check (`deploymentAvailable`, `podRestarts`,
//! `customResources`, `prometheus`, `webhook`), the way a Kubernetes probe names one handler.
//! Thresholds are written as people say them (`5%`, `500ms`, `3`) and read as [`Quantity`]s in
//! Prometheus' base units (fractions, seconds). The annotated reference is `policies/gate-policy.yaml`.

use super::{DEFAULT_ENDPOINT, Document, SpokeRef};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

pub type GatePolicy = Document<GatePolicySpec>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatePolicySpec {
    /// How long after the apply the gates are watched before the release counts as good.
    #[serde(with = "humantime_serde")]
    pub bake_time: Duration,
    /// How long a move back to a release that passed its bake here (a revert in Git, `fleetgate
    /// rollback`) bakes: that release already proved itself on this cluster, so it is watched
    /// only long enough to see it serve. Default: `bakeTime`, at most one minute
    /// ([`Self::rollback_bake`]).
    #[serde(with = "humantime_serde::option", default, skip_serializing_if = "Option::is_none")]
    pub rollback_bake_time: Option<Duration>,
    /// Time between two evaluation rounds.
    #[serde(with = "humantime_serde", default = "default_interval")]
    pub interval: Duration,
    /// Upper bound on every single call a gate makes (Kubernetes API, Prometheus).
    #[serde(with = "humantime_serde", default = "default_call_timeout")]
    pub call_timeout: Duration,
    /// What a gate whose data is missing means; a gate may override it.
    #[serde(default)]
    pub on_unknown: OnUnknown,
    /// Which of the agent's Prometheus endpoints (`--prometheus NAME=URL`) the `prometheus` gates
    /// query; absent = `default`. A name only: the URL (and any credentials) is the spoke's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<SpokeRef<String>>,
    /// The clusters this policy is for; absent = every cluster ([`FleetConfig::gate_policy_for`]
    /// takes the first policy that selects the cluster).
    ///
    /// [`FleetConfig::gate_policy_for`]: super::FleetConfig::gate_policy_for
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<GateSelector>,
    pub gates: Vec<Gate>,
}

/// Which clusters a policy or one gate applies to: `waves` (any of), `clusters` (any of) and
/// `matchLabels` (all of); every part given must match, an empty selector matches every cluster.
///
/// Trust: it is matched against a [`ClusterIdentity`] whose name is the agent's own and whose
/// wave and labels come from the same signed tree as the policy (docs/SECURITY.md), so an
/// unsigned push that relabels a cluster cannot de-select its gates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GateSelector {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
}

/// What a [`GateSelector`] is matched against: a cluster's name, and its wave and labels when
/// the tree the policy came from describes it.
#[derive(Debug, Clone, Copy)]
pub struct ClusterIdentity<'a> {
    pub name: &'a str,
    pub wave: Option<&'a str>,
    pub labels: Option<&'a BTreeMap<String, String>>,
}

impl GateSelector {
    pub fn matches(&self, c: &ClusterIdentity<'_>) -> bool {
        let waves = self.waves.is_empty() || c.wave.is_some_and(|w| self.waves.iter().any(|x| x == w));
        let clusters = self.clusters.is_empty() || self.clusters.iter().any(|x| x == c.name);
        let labels = self.match_labels.is_empty()
            || c.labels.is_some_and(|l| self.match_labels.iter().all(|(k, v)| l.get(k) == Some(v)));
        waves && clusters && labels
    }
}

fn selects(select: &Option<GateSelector>, c: &ClusterIdentity<'_>) -> bool {
    select.as_ref().is_none_or(|s| s.matches(c))
}

fn default_interval() -> Duration {
    Duration::from_secs(15)
}

fn default_call_timeout() -> Duration {
    Duration::from_secs(10)
}

/// What an `unknown` verdict (data missing, query empty, call timed out) leads to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OnUnknown {
    /// Tolerated while baking; a gate still unknown when the bake time is over fails the release.
    #[default]
    FailAfterBake,
    /// Fails the release at once, like a failed threshold.
    Fail,
    /// Never fails the release (the figure is still reported).
    Ignore,
}

/// One named gate: a name and exactly one check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "GateDoc", into = "GateDoc")]
pub struct Gate {
    pub name: String,
    /// Overrides the policy's `onUnknown` for this gate.
    pub on_unknown: Option<OnUnknown>,
    /// The clusters this gate applies to within its policy; absent = all the policy's.
    pub select: Option<GateSelector>,
    pub check: GateCheck,
}

#[derive(Debug, Clone, PartialEq)]
pub enum GateCheck {
    DeploymentAvailable(DeploymentAvailableGate),
    PodRestarts(PodRestartsGate),
    CustomResources(CustomResourcesGate),
    Prometheus(PrometheusGate),
    Webhook(WebhookGate),
}

impl GateCheck {
    /// The YAML key of this check, used in messages.
    pub fn key(&self) -> &'static str {
        match self {
            GateCheck::DeploymentAvailable(_) => "deploymentAvailable",
            GateCheck::PodRestarts(_) => "podRestarts",
            GateCheck::CustomResources(_) => "customResources",
            GateCheck::Prometheus(_) => "prometheus",
            GateCheck::Webhook(_) => "webhook",
        }
    }
}

/// Every replica of the operator's Deployments updated and available, none past its progress deadline.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeploymentAvailableGate {
    /// Deployment names in the operator namespace; empty means every Deployment the operator
    /// selector matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
}

/// Container restarts across the operator's pods since the apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodRestartsGate {
    pub max: u32,
}

/// A CEL expression over each object of one kind; enough of them must hold it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CustomResourcesGate {
    pub api_version: String,
    /// A kind of the release's own CRDs, or one the agent allows (`gates::check_gate_kinds`).
    pub kind: String,
    /// Only objects in this namespace; all namespaces when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// CEL over `self` (the whole object) returning a bool; any other result is a configuration
    /// error that fails the gate (and never shows the value).
    pub expression: String,
    /// Healthy objects / all objects must be at least this (`100%` by default).
    #[serde(default = "full_ratio")]
    pub min_healthy_ratio: Quantity,
}

fn full_ratio() -> Quantity {
    Quantity::percent(1.0)
}

/// A Prometheus instant query compared with exactly one bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusGate {
    /// PromQL returning a scalar or a vector; with several series the worst one counts.
    pub query: String,
    /// How the query's value is shown (`number`, `percent` for a 0–1 fraction, `seconds`);
    /// default: the unit of `max`/`min`, else `number`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<Unit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<Quantity>,
    /// The value may exceed the one sampled before the apply by at most this percentage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_increase_over_baseline: Option<Quantity>,
}

/// Which bound a Prometheus gate has (exactly one; checked by [`GatePolicySpec::validate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PrometheusBound {
    Max(Quantity),
    Min(Quantity),
    MaxIncreaseOverBaseline(Quantity),
}

impl PrometheusGate {
    /// The gate's bound, or `None` when the policy set none or several.
    pub fn bound(&self) -> Option<PrometheusBound> {
        match (self.max, self.min, self.max_increase_over_baseline) {
            (Some(q), None, None) => Some(PrometheusBound::Max(q)),
            (None, Some(q), None) => Some(PrometheusBound::Min(q)),
            (None, None, Some(q)) => Some(PrometheusBound::MaxIncreaseOverBaseline(q)),
            _ => None,
        }
    }
}

/// A server-side dry-run create of `sample` must go through (and so through the release's
/// admission webhooks for that kind).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WebhookGate {
    /// A complete object (`apiVersion`, `kind`, `metadata.name`, …); created in the operator
    /// namespace when it names none.
    pub sample: serde_json::Value,
}

/// The YAML form of a gate: a name and one optional field per check.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GateDoc {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    on_unknown: Option<OnUnknown>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    select: Option<GateSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deployment_available: Option<DeploymentAvailableGate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod_restarts: Option<PodRestartsGate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    custom_resources: Option<CustomResourcesGate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prometheus: Option<PrometheusGate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    webhook: Option<WebhookGate>,
}

impl TryFrom<GateDoc> for Gate {
    type Error = String;

    fn try_from(d: GateDoc) -> Result<Gate, String> {
        let mut checks = Vec::new();
        checks.extend(d.deployment_available.map(GateCheck::DeploymentAvailable));
        checks.extend(d.pod_restarts.map(GateCheck::PodRestarts));
        checks.extend(d.custom_resources.map(GateCheck::CustomResources));
        checks.extend(d.prometheus.map(GateCheck::Prometheus));
        checks.extend(d.webhook.map(GateCheck::Webhook));
        if checks.len() != 1 {
            let found: Vec<&str> = checks.iter().map(GateCheck::key).collect();
            return Err(format!(
                "gate {:?} must have exactly one of deploymentAvailable, podRestarts, customResources, prometheus, webhook (found {})",
                d.name,
                if found.is_empty() { "none".to_string() } else { found.join(", ") }
            ));
        }
        Ok(Gate { name: d.name, on_unknown: d.on_unknown, select: d.select, check: checks.remove(0) })
    }
}

impl From<Gate> for GateDoc {
    fn from(g: Gate) -> GateDoc {
        let mut d = GateDoc {
            name: g.name,
            on_unknown: g.on_unknown,
            select: g.select,
            deployment_available: None,
            pod_restarts: None,
            custom_resources: None,
            prometheus: None,
            webhook: None,
        };
        match g.check {
            GateCheck::DeploymentAvailable(c) => d.deployment_available = Some(c),
            GateCheck::PodRestarts(c) => d.pod_restarts = Some(c),
            GateCheck::CustomResources(c) => d.custom_resources = Some(c),
            GateCheck::Prometheus(c) => d.prometheus = Some(c),
            GateCheck::Webhook(c) => d.webhook = Some(c),
        }
        d
    }
}

/// A policy that parses but cannot be evaluated as written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GatePolicyProblem {
    #[error("the policy has no gates; a release would pass without being checked")]
    NoGates,
    #[error("interval must be longer than zero")]
    ZeroInterval,
    #[error("interval {interval:?} is longer than bakeTime {bake_time:?}; the gates would be evaluated only once")]
    IntervalOverBake { interval: Duration, bake_time: Duration },
    #[error("callTimeout must be longer than zero")]
    ZeroCallTimeout,
    #[error("a gate has an empty name")]
    EmptyName,
    #[error("gate name {0:?} is used twice; names identify gates in statuses")]
    DuplicateName(String),
    #[error(
        "gate(s) {} query Prometheus {name:?}, which this agent does not have (it has: {known}); \
         pass --prometheus {name}=URL to the agent",
        gates.join(", ")
    )]
    UnknownPrometheus { name: String, gates: Vec<String>, known: String },
    #[error("gate {gate:?} needs exactly one of max, min, maxIncreaseOverBaseline")]
    PrometheusBound { gate: String },
    #[error("gate {gate:?}: maxIncreaseOverBaseline must be a percentage such as `20%`, not {value}")]
    IncreaseNotPercent { gate: String, value: Quantity },
    #[error("gate {gate:?}: minHealthyRatio must be between 0 and 100 %, not {value}")]
    BadRatio { gate: String, value: Quantity },
    #[error("gate {gate:?}: CEL expression does not compile: {message}")]
    BadExpression { gate: String, message: String },
    #[error("gate {gate:?}: apiVersion {api_version:?} is not `group/version` or `version`")]
    BadApiVersion { gate: String, api_version: String },
    #[error("gate {gate:?}: the sample must be an object with apiVersion, kind and metadata.name")]
    BadSample { gate: String },
}

/// The longest default [`GatePolicySpec::rollback_bake`].
const DEFAULT_ROLLBACK_BAKE: Duration = Duration::from_secs(60);

impl GatePolicySpec {
    /// The bake of a move back to a release that passed here before (`rollbackBakeTime`).
    pub fn rollback_bake(&self) -> Duration {
        self.rollback_bake_time.unwrap_or(self.bake_time.min(DEFAULT_ROLLBACK_BAKE))
    }

    /// Everything that parses but could not be evaluated: empty or duplicate names, a Prometheus
    /// gate with no (or several) bounds, a CEL expression that does not
    /// compile, ratios outside 0–100 %, an interval longer than the bake time.
    pub fn validate(&self) -> Result<(), Vec<GatePolicyProblem>> {
        let mut problems = Vec::new();
        if self.gates.is_empty() {
            problems.push(GatePolicyProblem::NoGates);
        }
        if self.interval.is_zero() {
            problems.push(GatePolicyProblem::ZeroInterval);
        } else if self.interval > self.bake_time {
            problems.push(GatePolicyProblem::IntervalOverBake { interval: self.interval, bake_time: self.bake_time });
        }
        if self.call_timeout.is_zero() {
            problems.push(GatePolicyProblem::ZeroCallTimeout);
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &self.gates {
            if g.name.trim().is_empty() {
                problems.push(GatePolicyProblem::EmptyName);
            } else if !seen.insert(g.name.as_str()) {
                problems.push(GatePolicyProblem::DuplicateName(g.name.clone()));
            }
            let gate = || g.name.clone();
            match &g.check {
                GateCheck::DeploymentAvailable(_) | GateCheck::PodRestarts(_) => {}
                GateCheck::Prometheus(p) => match p.bound() {
                    None => problems.push(GatePolicyProblem::PrometheusBound { gate: gate() }),
                    Some(PrometheusBound::MaxIncreaseOverBaseline(q)) if q.unit != Unit::Percent => {
                        problems.push(GatePolicyProblem::IncreaseNotPercent { gate: gate(), value: q })
                    }
                    Some(_) => {}
                },
                GateCheck::CustomResources(c) => {
                    let r = c.min_healthy_ratio;
                    if !matches!(r.unit, Unit::Percent | Unit::Number) || !(0.0..=1.0).contains(&r.value) {
                        problems.push(GatePolicyProblem::BadRatio { gate: gate(), value: r });
                    }
                    if let Err(e) = cel::Program::compile(&c.expression) {
                        problems.push(GatePolicyProblem::BadExpression { gate: gate(), message: e.to_string() });
                    }
                    if c.api_version.is_empty() || c.api_version.split('/').count() > 2 {
                        problems.push(GatePolicyProblem::BadApiVersion {
                            gate: gate(),
                            api_version: c.api_version.clone(),
                        });
                    }
                }
                GateCheck::Webhook(w) => {
                    let ok = w.sample.get("apiVersion").and_then(|v| v.as_str()).is_some()
                        && w.sample.get("kind").and_then(|v| v.as_str()).is_some()
                        && w.sample.pointer("/metadata/name").and_then(|v| v.as_str()).is_some();
                    if !ok {
                        problems.push(GatePolicyProblem::BadSample { gate: gate() });
                    }
                }
            }
        }
        if problems.is_empty() { Ok(()) } else { Err(problems) }
    }

    /// The agent's Prometheus endpoint this policy's `prometheus` gates query: its name, else
    /// [`DEFAULT_ENDPOINT`] (also when the policy still writes the old `{url: …}` form, which is
    /// ignored).
    pub fn prometheus_endpoint(&self) -> &str {
        self.prometheus.as_ref().and_then(SpokeRef::name).unwrap_or(DEFAULT_ENDPOINT)
    }

    /// The names of the `prometheus` gates.
    pub fn prometheus_gates(&self) -> Vec<String> {
        self.gates.iter().filter(|g| matches!(g.check, GateCheck::Prometheus(_))).map(|g| g.name.clone()).collect()
    }

    /// Whether this policy is for `cluster` (its own `select`).
    pub fn selects(&self, cluster: &ClusterIdentity<'_>) -> bool {
        selects(&self.select, cluster)
    }

    /// This policy as `cluster` runs it: only the gates whose `select` matches it.
    pub fn for_cluster(&self, cluster: &ClusterIdentity<'_>) -> GatePolicySpec {
        let gates = self.gates.iter().filter(|g| selects(&g.select, cluster)).cloned().collect();
        GatePolicySpec { gates, ..self.clone() }
    }

    /// The effective unknown-handling of `gate`.
    pub fn on_unknown_for(&self, gate: &Gate) -> OnUnknown {
        gate.on_unknown.unwrap_or(self.on_unknown)
    }
}

/// The unit a figure is measured in. Prometheus' conventions: ratios as fractions, time in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Unit {
    /// A plain number or count.
    Number,
    /// A fraction, shown ×100 with `%`.
    Percent,
    /// A duration in seconds, shown in ms below one second.
    Seconds,
}

/// A number with its unit: gate thresholds and observed figures.
///
/// In a policy it is written `5%` (0.05, percent), `500ms` or `0.5s` (0.5, seconds), or a bare
/// number (`3`). Serialized for machines as `{"value": 0.05, "unit": "percent"}`, which parses back.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "QuantityDoc")]
pub struct Quantity {
    pub value: f64,
    pub unit: Unit,
}

impl Quantity {
    pub fn number(value: f64) -> Quantity {
        Quantity { value, unit: Unit::Number }
    }

    /// `fraction` is 0–1 (0.05 is 5 %).
    pub fn percent(fraction: f64) -> Quantity {
        Quantity { value: fraction, unit: Unit::Percent }
    }

    pub fn seconds(value: f64) -> Quantity {
        Quantity { value, unit: Unit::Seconds }
    }

    /// The same unit, another value (an observed figure read in a threshold's unit).
    pub fn with_value(self, value: f64) -> Quantity {
        Quantity { value, unit: self.unit }
    }
}

/// Reads `5%`, `5 %`, `0.05`, `500ms`, `1.5s`, `2m`, `3`.
impl std::str::FromStr for Quantity {
    type Err = String;

    fn from_str(s: &str) -> Result<Quantity, String> {
        let t = s.trim();
        let split =
            t.find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))).unwrap_or(t.len());
        let (num, suffix) = t.split_at(split);
        let value: f64 =
            num.parse().map_err(|_| format!("{s:?} is not a number with an optional unit (5%, 500ms, 3)"))?;
        if !value.is_finite() {
            return Err(format!("{s:?} is not finite"));
        }
        let q = match suffix.trim() {
            "" => Quantity::number(value),
            "%" => Quantity::percent(value / 100.0),
            "ns" => Quantity::seconds(value / 1e9),
            "us" | "µs" => Quantity::seconds(value / 1e6),
            "ms" => Quantity::seconds(value / 1e3),
            "s" => Quantity::seconds(value),
            "m" => Quantity::seconds(value * 60.0),
            "h" => Quantity::seconds(value * 3600.0),
            other => return Err(format!("unknown unit {other:?} in {s:?}; use %, ns, us, ms, s, m or h")),
        };
        Ok(q)
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum QuantityDoc {
    Number(f64),
    Text(String),
    Full { value: f64, unit: Unit },
}

impl TryFrom<QuantityDoc> for Quantity {
    type Error = String;

    fn try_from(d: QuantityDoc) -> Result<Quantity, String> {
        match d {
            QuantityDoc::Number(v) => Ok(Quantity::number(v)),
            QuantityDoc::Text(s) => s.parse(),
            QuantityDoc::Full { value, unit } => Ok(Quantity { value, unit }),
        }
    }
}

/// Figures for people: `7.3 %`, `480 ms`, `1.2 s`, `3`.
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.unit {
            Unit::Number => write!(f, "{}", short(self.value)),
            Unit::Percent => write!(f, "{} %", short(self.value * 100.0)),
            Unit::Seconds if self.value.abs() < 1.0 => write!(f, "{} ms", short(self.value * 1000.0)),
            Unit::Seconds => write!(f, "{} s", short(self.value)),
        }
    }
}

/// A number with as many decimals as a person needs: 3, 7.3, 0.05, 497.5.
fn short(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let decimals = if v.abs() >= 10.0 || v == v.trunc() { 1 } else { 3 };
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if s == "-0" { "0".to_string() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::parse_document;
    use rstest::rstest;

    #[rstest]
    #[case("5%", Quantity::percent(0.05), "5 %")]
    #[case("7.3 %", Quantity::percent(0.073), "7.3 %")]
    #[case("500ms", Quantity::seconds(0.5), "500 ms")]
    #[case("1.5s", Quantity::seconds(1.5), "1.5 s")]
    #[case("2m", Quantity::seconds(120.0), "120 s")]
    #[case("3", Quantity::number(3.0), "3")]
    #[case("0.25", Quantity::number(0.25), "0.25")]
    #[case("1e3", Quantity::number(1000.0), "1000")]
    fn quantities_parse_and_render(#[case] text: &str, #[case] want: Quantity, #[case] shown: &str) {
        let q: Quantity = text.parse().unwrap();
        assert!((q.value - want.value).abs() < 1e-12 && q.unit == want.unit, "{text}: {q:?}");
        assert_eq!(q.to_string(), shown);
    }

    #[rstest]
    #[case("5 parsecs")]
    #[case("fast")]
    #[case("")]
    fn bad_quantities_are_refused(#[case] text: &str) {
        assert!(text.parse::<Quantity>().is_err(), "{text}");
    }

    #[test]
    fn quantities_serialize_for_machines_and_parse_back() {
        let q = Quantity::percent(0.073);
        let json = serde_json::to_string(&q).unwrap();
        assert_eq!(json, r#"{"value":0.073,"unit":"percent"}"#);
        assert_eq!(serde_json::from_str::<Quantity>(&json).unwrap(), q);
        assert_eq!(serde_json::from_str::<Quantity>("3").unwrap(), Quantity::number(3.0));
    }

    const POLICY: &str = r#"
apiVersion: fleetgate.io/v1alpha1
kind: GatePolicy
metadata: { name: default }
spec:
  bakeTime: 5m
  interval: 15s
  prometheus: monitoring
  gates:
    - name: available
      deploymentAvailable: {}
    - name: restarts
      podRestarts: { max: 3 }
    - name: ready
      onUnknown: fail
      customResources:
        apiVersion: cache.example.com/v1alpha2
        kind: RedisCluster
        expression: "self.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')"
        minHealthyRatio: 90%
    - name: error-rate
      prometheus: { query: "x", max: 5% }
    - name: latency
      prometheus: { query: "y", unit: seconds, maxIncreaseOverBaseline: 20% }
    - name: webhook
      webhook:
        sample: { apiVersion: cache.example.com/v1alpha2, kind: RedisCluster, metadata: { name: probe } }
"#;

    #[test]
    fn a_full_policy_parses_validates_and_round_trips() {
        let p: GatePolicy = parse_document("gates.yaml", POLICY, "GatePolicy").unwrap();
        assert_eq!(p.spec.bake_time, Duration::from_secs(300));
        assert_eq!(p.spec.call_timeout, Duration::from_secs(10));
        assert_eq!(p.spec.gates.len(), 6);
        assert_eq!(p.spec.on_unknown_for(&p.spec.gates[2]), OnUnknown::Fail);
        assert_eq!(p.spec.on_unknown_for(&p.spec.gates[0]), OnUnknown::FailAfterBake);
        match &p.spec.gates[2].check {
            GateCheck::CustomResources(c) => assert_eq!(c.min_healthy_ratio, Quantity::percent(0.9)),
            other => panic!("{other:?}"),
        }
        p.spec.validate().unwrap();
        assert_eq!(p.spec.prometheus_endpoint(), "monitoring");
        assert_eq!(p.spec.prometheus_gates(), ["error-rate", "latency"]);
        let back: GatePolicy = serde_saphyr::from_str(&serde_saphyr::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn the_reference_policy_is_valid_and_carries_the_seed_thresholds() {
        let text = include_str!("../../policies/gate-policy.yaml");
        let p: GatePolicy = parse_document("policies/gate-policy.yaml", text, "GatePolicy").unwrap();
        p.spec.validate().unwrap();
        let gate = |name: &str| &p.spec.gates.iter().find(|g| g.name == name).unwrap().check;
        let prom = |name: &str| match gate(name) {
            GateCheck::Prometheus(q) => q.bound(),
            other => panic!("{other:?}"),
        };
        assert_eq!(prom("error-rate"), Some(PrometheusBound::Max(Quantity::percent(0.05))));
        assert_eq!(prom("webhook-p99-latency"), Some(PrometheusBound::Max(Quantity::seconds(0.5))));
        assert_eq!(prom("reconcile-latency"), Some(PrometheusBound::MaxIncreaseOverBaseline(Quantity::percent(0.2))));
        assert_eq!(gate("pod-restarts"), &GateCheck::PodRestarts(PodRestartsGate { max: 3 }));
        assert!(matches!(gate("redisclusters-ready"), GateCheck::CustomResources(_)));
        assert!(matches!(gate("deployment-available"), GateCheck::DeploymentAvailable(_)));
        assert!(matches!(gate("webhook-reachable"), GateCheck::Webhook(_)));
    }

    #[rstest]
    #[case::two_checks("- name: a\n  podRestarts: {max: 1}\n  deploymentAvailable: {}\n", "exactly one")]
    #[case::no_check("- name: a\n", "found none")]
    #[case::typo("- name: a\n  podRestarts: {maks: 1}\n", "unknown field")]
    fn malformed_gates_are_refused_with_the_reason(#[case] gates: &str, #[case] want: &str) {
        let text = format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: GatePolicy\nmetadata: {{name: p}}\nspec:\n  bakeTime: 1m\n  gates:\n{}",
            indent(gates)
        );
        let err = parse_document::<GatePolicySpec>("p.yaml", &text, "GatePolicy").unwrap_err();
        assert!(err.to_string().contains(want), "{err}");
    }

    fn indent(s: &str) -> String {
        s.lines().map(|l| format!("    {l}\n")).collect()
    }

    #[test]
    fn selectors_pick_the_gates_of_a_cluster() {
        let text = r#"
bakeTime: 30m
interval: 10s
select: { waves: [canary, prod] }
gates:
  - name: restarts
    podRestarts: { max: 3 }
  - name: prod-errors
    select: { matchLabels: { tier: prod, cloud: aws } }
    prometheus: { query: "x", max: 1% }
  - name: only-b
    select: { clusters: [b] }
    podRestarts: { max: 0 }
"#;
        let p: GatePolicySpec = serde_saphyr::from_str(text).unwrap();
        let prod = BTreeMap::from([("tier".to_string(), "prod".to_string()), ("cloud".to_string(), "aws".to_string())]);
        let canary = BTreeMap::from([("tier".to_string(), "canary".to_string())]);
        let id = |name, wave, labels| ClusterIdentity { name, wave, labels };
        let names =
            |c: ClusterIdentity<'_>| -> Vec<String> { p.for_cluster(&c).gates.into_iter().map(|g| g.name).collect() };
        assert_eq!(names(id("a", Some("prod"), Some(&prod))), ["restarts", "prod-errors"]);
        assert_eq!(names(id("b", Some("canary"), Some(&canary))), ["restarts", "only-b"]);
        // matchLabels needs every label; a cluster the tree does not describe has none.
        let half = BTreeMap::from([("tier".to_string(), "prod".to_string())]);
        assert_eq!(names(id("a", Some("prod"), Some(&half))), ["restarts"]);
        assert_eq!(names(id("a", None, None)), ["restarts"]);
        assert!(p.selects(&id("a", Some("prod"), None)));
        assert!(!p.selects(&id("a", Some("staging"), Some(&prod))));
        assert!(!p.selects(&id("a", None, None)), "a wave selector needs a wave");
        let back: GatePolicySpec = serde_saphyr::from_str(&serde_saphyr::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
        let typo = "bakeTime: 1m\ngates:\n  - name: a\n    select: { wave: [prod] }\n    podRestarts: {max: 1}\n";
        assert!(serde_saphyr::from_str::<GatePolicySpec>(typo).unwrap_err().to_string().contains("unknown field"));
    }

    #[test]
    fn validation_names_every_problem() {
        let text = r#"
apiVersion: fleetgate.io/v1alpha1
kind: GatePolicy
metadata: { name: bad }
spec:
  bakeTime: 10s
  interval: 1m
  gates:
    - name: a
      prometheus: { query: "x", max: 5%, min: 1% }
    - name: a
      prometheus: { query: "x", maxIncreaseOverBaseline: 20ms }
    - name: c
      customResources: { apiVersion: v1, kind: X, expression: "self.status.(", minHealthyRatio: 150% }
    - name: d
      webhook: { sample: { kind: X } }
"#;
        let p: GatePolicy = parse_document("p.yaml", text, "GatePolicy").unwrap();
        let problems = p.spec.validate().unwrap_err();
        let has = |f: fn(&GatePolicyProblem) -> bool| problems.iter().any(f);
        assert!(has(|p| matches!(p, GatePolicyProblem::IntervalOverBake { .. })), "{problems:?}");
        assert!(has(|p| matches!(p, GatePolicyProblem::DuplicateName(n) if n == "a")));
        assert!(has(|p| matches!(p, GatePolicyProblem::PrometheusBound { .. })));
        assert!(has(|p| matches!(p, GatePolicyProblem::IncreaseNotPercent { .. })));
        assert!(has(|p| matches!(p, GatePolicyProblem::BadRatio { .. })));
        assert!(has(|p| matches!(p, GatePolicyProblem::BadExpression { .. })));
        assert!(has(|p| matches!(p, GatePolicyProblem::BadSample { .. })));
    }
}
