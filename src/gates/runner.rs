//! The bake: every `interval` until `bakeTime` after the apply, evaluate every gate of the policy;
//! stop at the first failure; at the end, pass — or fail on gates still unknown, as the policy says.

use super::prometheus::{self, PrometheusClient, PrometheusSource};
use super::{GateError, GateEvaluation, call, cel_health, webhook, workload};
use crate::model::error_chain;
use crate::model::{GateCheck, GatePolicySpec, OnUnknown, PrometheusBound};
use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Where the operator runs: its namespace and the label selector of its Deployments and pods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorTarget {
    pub namespace: String,
    /// Label selector (`app.kubernetes.io/name=redis-operator`); empty selects everything in the namespace.
    pub selector: String,
}

impl OperatorTarget {
    fn describe(&self) -> String {
        match self.selector.as_str() {
            "" => format!("namespace {}", self.namespace),
            s => format!("selector {s} in namespace {}", self.namespace),
        }
    }

    fn list_params(&self) -> ListParams {
        if self.selector.is_empty() { ListParams::default() } else { ListParams::default().labels(&self.selector) }
    }
}

/// What was true just before the apply: the figures relative gates compare with, and the restart
/// counts restarts are counted from. Serializable, so an agent that restarts mid-bake resumes with it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Baseline {
    pub sampled_at: Option<DateTime<Utc>>,
    /// Container restarts per pod UID of the operator's pods.
    #[serde(default)]
    pub restarts: BTreeMap<String, u32>,
    /// Value per relative Prometheus gate.
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    /// Why a relative gate has no value (query empty, Prometheus down); the gate is then unknown.
    #[serde(default)]
    pub missing: BTreeMap<String, String>,
}

impl Baseline {
    /// Queries every relative Prometheus gate of `policy` and records its value (the worst series,
    /// as the gate will judge it) or why there is none. [`sample_baseline`] calls it.
    /// `prometheus` is the server the policy's gates query ([`super::PrometheusEndpoints::for_policy`]).
    pub async fn sample_metrics(
        &mut self,
        policy: &GatePolicySpec,
        prometheus: Option<&PrometheusSource>,
    ) -> Result<(), GateError> {
        let relative: Vec<_> = policy
            .gates
            .iter()
            .filter_map(|g| match &g.check {
                GateCheck::Prometheus(p) if matches!(p.bound(), Some(PrometheusBound::MaxIncreaseOverBaseline(_))) => {
                    Some((g, p))
                }
                _ => None,
            })
            .collect();
        // `PrometheusEndpoints::for_policy` gives a server whenever there is a Prometheus gate.
        let (Some(endpoint), false) = (prometheus, relative.is_empty()) else { return Ok(()) };
        let client = PrometheusClient::new(endpoint, policy.call_timeout)?;
        for (gate, p) in relative {
            match client.instant(&p.query).await.map_err(|e| e.to_string()).and_then(|s| prometheus::worst(p, &s)) {
                Ok(sample) => {
                    self.metrics.insert(gate.name.clone(), sample.value);
                    self.missing.remove(&gate.name);
                }
                Err(reason) => {
                    tracing::warn!(gate = %gate.name, %reason, "no baseline for relative gate");
                    self.missing.insert(gate.name.clone(), reason);
                }
            }
        }
        Ok(())
    }
}

/// Samples the baseline: call it right before the apply. A relative gate whose query has no value
/// is recorded in `missing` (the gate will be unknown); failing to read the operator's pods is an
/// error, since restarts could then not be counted from the apply.
pub async fn sample_baseline(
    policy: &GatePolicySpec,
    prometheus: Option<&PrometheusSource>,
    client: &kube::Client,
    target: &OperatorTarget,
) -> Result<Baseline, GateError> {
    policy.validate().map_err(GateError::InvalidPolicy)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
    let list =
        call(format!("listing pods ({})", target.describe()), policy.call_timeout, pods.list(&target.list_params()))
            .await?;
    let mut baseline = Baseline {
        sampled_at: Some(Utc::now()),
        restarts: workload::restart_counts(&list.items),
        ..Default::default()
    };
    baseline.sample_metrics(policy, prometheus).await?;
    Ok(baseline)
}

/// One evaluation of every gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Round {
    /// 1, 2, …
    pub number: u32,
    pub at: DateTime<Utc>,
    pub evaluations: Vec<GateEvaluation>,
}

/// How the bake ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum BakeVerdict {
    /// Every gate passed (or was unknown under `onUnknown: ignore`) until the end of the bake time.
    #[serde(rename_all = "camelCase")]
    Passed { rounds: u32, evaluations: Vec<GateEvaluation> },
    /// `gate` failed; `at_bake_end` when it failed by still being unknown at the end.
    #[serde(rename_all = "camelCase")]
    Failed { gate: GateEvaluation, at_bake_end: bool, rounds: u32, evaluations: Vec<GateEvaluation> },
}

impl BakeVerdict {
    pub fn passed(&self) -> bool {
        matches!(self, BakeVerdict::Passed { .. })
    }

    /// The last round's evaluations, every gate.
    pub fn evaluations(&self) -> &[GateEvaluation] {
        match self {
            BakeVerdict::Passed { evaluations, .. } | BakeVerdict::Failed { evaluations, .. } => evaluations,
        }
    }

    /// The failing gate's evaluation, if any.
    pub fn failing(&self) -> Option<&GateEvaluation> {
        match self {
            BakeVerdict::Failed { gate, .. } => Some(gate),
            BakeVerdict::Passed { .. } => None,
        }
    }
}

/// `gates passed (4 rounds): …` or `gate error-rate failed: error-rate 7.3 % > 5 %`.
impl fmt::Display for BakeVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BakeVerdict::Passed { rounds, evaluations } => {
                let all: Vec<String> = evaluations.iter().map(ToString::to_string).collect();
                write!(f, "gates passed ({rounds} rounds): {}", all.join("; "))
            }
            BakeVerdict::Failed { gate, at_bake_end, .. } => {
                write!(f, "gate {} failed: {gate}", gate.gate)?;
                if *at_bake_end {
                    write!(f, " at the end of the bake time")?;
                }
                Ok(())
            }
        }
    }
}

/// The decision after one round: `Some` ends the bake.
pub fn decide(policy: &GatePolicySpec, round: &Round, bake_over: bool) -> Option<BakeVerdict> {
    let on_unknown = |name: &str| {
        policy.gates.iter().find(|g| g.name == name).map(|g| policy.on_unknown_for(g)).unwrap_or(policy.on_unknown)
    };
    let failed = |e: &&GateEvaluation| e.fails_release(on_unknown(&e.gate), bake_over);
    // A threshold failure names the problem better than an unknown, so it is reported first.
    let first =
        round.evaluations.iter().filter(|e| e.is_fail()).find(failed).or_else(|| round.evaluations.iter().find(failed));
    if let Some(gate) = first {
        return Some(BakeVerdict::Failed {
            gate: gate.clone(),
            at_bake_end: gate.is_unknown() && on_unknown(&gate.gate) == OnUnknown::FailAfterBake,
            rounds: round.number,
            evaluations: round.evaluations.clone(),
        });
    }
    bake_over.then(|| BakeVerdict::Passed { rounds: round.number, evaluations: round.evaluations.clone() })
}

/// Runs a policy's post-apply gates against one cluster.
pub struct GateRunner {
    policy: GatePolicySpec,
    client: kube::Client,
    target: OperatorTarget,
    applied_at: DateTime<Utc>,
    baseline: Baseline,
    prometheus: Option<PrometheusClient>,
}

impl GateRunner {
    /// Checks the policy (see [`GatePolicySpec::validate`]) and prepares the Prometheus client.
    /// `applied_at` is when the apply finished; the bake ends `bakeTime` later, also for an agent
    /// that resumes after a restart.
    pub fn new(
        policy: GatePolicySpec,
        prometheus: Option<&PrometheusSource>,
        client: kube::Client,
        target: OperatorTarget,
        applied_at: DateTime<Utc>,
        baseline: Baseline,
    ) -> Result<GateRunner, GateError> {
        policy.validate().map_err(GateError::InvalidPolicy)?;
        let prometheus = prometheus.map(|source| PrometheusClient::new(source, policy.call_timeout)).transpose()?;
        Ok(GateRunner { policy, client, target, applied_at, baseline, prometheus })
    }

    /// Bakes: evaluates every `interval` (and once more when the bake time is over), calling
    /// `on_round` after each round, and ends at the first failure or at the end of the bake time.
    pub async fn run(&self, mut on_round: impl FnMut(&Round)) -> BakeVerdict {
        let bake = chrono::Duration::from_std(self.policy.bake_time).unwrap_or(chrono::TimeDelta::MAX);
        let bake_end = self.applied_at + bake;
        let mut number = 0;
        loop {
            number += 1;
            let evaluations = self.evaluate().await;
            let at = Utc::now();
            let round = Round { number, at, evaluations };
            on_round(&round);
            let bake_over = at >= bake_end;
            if let Some(verdict) = decide(&self.policy, &round, bake_over) {
                return verdict;
            }
            // Sleep one interval, but wake exactly at the end of the bake for the final round.
            let left = (bake_end - at).to_std().unwrap_or_default();
            tokio::time::sleep(self.policy.interval.min(left)).await;
        }
    }

    /// One round: every gate, concurrently, each call bounded by `callTimeout`.
    pub async fn evaluate(&self) -> Vec<GateEvaluation> {
        futures::future::join_all(self.policy.gates.iter().map(|g| self.evaluate_gate(&g.name, &g.check))).await
    }

    async fn evaluate_gate(&self, name: &str, check: &GateCheck) -> GateEvaluation {
        let timeout = self.policy.call_timeout;
        let ns = &self.target.namespace;
        match check {
            GateCheck::DeploymentAvailable(d) => {
                let api: Api<Deployment> = Api::namespaced(self.client.clone(), ns);
                let listed = if d.names.is_empty() {
                    call("listing Deployments", timeout, api.list(&self.target.list_params())).await.map(|l| l.items)
                } else {
                    let mut found = Vec::new();
                    let mut err = None;
                    for n in &d.names {
                        match call(format!("reading Deployment {ns}/{n}"), timeout, api.get_opt(n)).await {
                            Ok(Some(dep)) => found.push(dep),
                            Ok(None) => {}
                            Err(e) => err = Some(e),
                        }
                    }
                    err.map_or(Ok(found), Err)
                };
                match listed {
                    Ok(items) => {
                        let scope = if d.names.is_empty() {
                            self.target.describe()
                        } else {
                            format!("{} in namespace {ns}", d.names.join(", "))
                        };
                        let mut e = workload::judge_deployments(name, &items, &scope);
                        if !d.names.is_empty() && items.len() < d.names.len() {
                            let missing: Vec<&String> = d
                                .names
                                .iter()
                                .filter(|n| !items.iter().any(|i| i.metadata.name.as_ref() == Some(n)))
                                .collect();
                            e = GateEvaluation::unknown(
                                name,
                                format!("Deployment not found: {missing:?} in namespace {ns}"),
                                e.threshold,
                            );
                        }
                        e
                    }
                    Err(err) => GateEvaluation::unknown(name, error_chain(&err), availability_threshold()),
                }
            }
            GateCheck::PodRestarts(r) => {
                let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
                match call("listing pods", timeout, api.list(&self.target.list_params())).await {
                    Ok(list) => workload::judge_restarts(name, r.max, &list.items, &self.baseline.restarts),
                    Err(err) => GateEvaluation::unknown(
                        name,
                        error_chain(&err),
                        super::Threshold::AtMost { limit: crate::model::Quantity::number(f64::from(r.max)) },
                    ),
                }
            }
            GateCheck::CustomResources(c) => {
                match self.list_objects(&c.api_version, &c.kind, c.namespace.as_deref()).await {
                    Ok(objects) => cel_health::judge_objects(name, &c.expression, c.min_healthy_ratio, &objects),
                    Err(err) => GateEvaluation::unknown(
                        name,
                        error_chain(&err),
                        super::Threshold::AtLeast { limit: crate::model::Quantity::percent(c.min_healthy_ratio.value) },
                    ),
                }
            }
            GateCheck::Prometheus(p) => {
                let baseline = match p.bound() {
                    Some(PrometheusBound::MaxIncreaseOverBaseline(_)) => Some(match self.baseline.metrics.get(name) {
                        Some(v) => Ok(*v),
                        None => Err(self
                            .baseline
                            .missing
                            .get(name)
                            .map(String::as_str)
                            .unwrap_or("not sampled before the apply")),
                    }),
                    _ => None,
                };
                let result = match &self.prometheus {
                    Some(client) => client.instant(&p.query).await,
                    None => Err(super::PrometheusError::Unreachable {
                        url: String::new(),
                        reason: "the agent gave the gates no Prometheus endpoint".into(),
                    }),
                };
                prometheus::judge(name, p, result, baseline)
            }
            GateCheck::Webhook(w) => webhook::probe(&self.client, name, &w.sample, ns, timeout).await,
        }
    }

    /// Every object of a kind (in one namespace or all), as JSON for CEL.
    async fn list_objects(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, GateError> {
        let timeout = self.policy.call_timeout;
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, _) = call(
            format!("discovering {api_version} {kind}"),
            timeout,
            kube::discovery::pinned_kind(&self.client, &gvk),
        )
        .await?;
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        };
        let list = call(format!("listing {kind}"), timeout, api.list(&ListParams::default())).await?;
        Ok(list.items.iter().filter_map(|o| serde_json::to_value(o).ok()).collect())
    }
}

fn availability_threshold() -> super::Threshold {
    super::Threshold::AtLeast { limit: crate::model::Quantity::percent(1.0) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::{Threshold, Verdict};
    use crate::model::{Gate, PodRestartsGate, Quantity};
    use std::time::Duration;

    fn policy(on_unknown: OnUnknown) -> GatePolicySpec {
        let gate = |name: &str, on: Option<OnUnknown>| Gate {
            name: name.into(),
            on_unknown: on,
            select: None,
            check: GateCheck::PodRestarts(PodRestartsGate { max: 3 }),
        };
        GatePolicySpec {
            bake_time: Duration::from_secs(60),
            rollback_bake_time: None,
            interval: Duration::from_secs(5),
            call_timeout: Duration::from_secs(5),
            on_unknown,
            prometheus: None,
            select: None,
            gates: vec![gate("a", None), gate("b", Some(OnUnknown::Ignore))],
        }
    }

    fn eval(gate: &str, verdict: Verdict) -> GateEvaluation {
        GateEvaluation {
            gate: gate.into(),
            verdict,
            observed: Some(Quantity::number(1.0)),
            threshold: Threshold::AtMost { limit: Quantity::number(3.0) },
            detail: None,
        }
    }

    fn round(evals: Vec<GateEvaluation>) -> Round {
        Round { number: 2, at: Utc::now(), evaluations: evals }
    }

    fn unknown() -> Verdict {
        Verdict::Unknown { reason: "no data".into() }
    }

    #[test]
    fn a_failed_gate_ends_the_bake_at_once() {
        let r = round(vec![eval("a", unknown()), eval("b", Verdict::Fail)]);
        let v = decide(&policy(OnUnknown::FailAfterBake), &r, false).unwrap();
        assert_eq!(v.failing().unwrap().gate, "b");
        assert!(matches!(v, BakeVerdict::Failed { at_bake_end: false, rounds: 2, .. }));
    }

    #[test]
    fn unknown_is_tolerated_until_the_bake_is_over() {
        let r = round(vec![eval("a", unknown()), eval("b", Verdict::Pass)]);
        assert_eq!(decide(&policy(OnUnknown::FailAfterBake), &r, false), None);
        let v = decide(&policy(OnUnknown::FailAfterBake), &r, true).unwrap();
        assert!(matches!(v, BakeVerdict::Failed { at_bake_end: true, .. }), "{v:?}");
        assert_eq!(
            v.to_string(),
            "gate a failed: a unknown (no data; observed 1; threshold ≤ 3) at the end of the bake time"
        );
    }

    #[test]
    fn unknown_fails_at_once_or_never_as_configured() {
        let r = round(vec![eval("a", unknown()), eval("b", Verdict::Pass)]);
        assert!(decide(&policy(OnUnknown::Fail), &r, false).is_some_and(|v| !v.passed()));
        // Gate b ignores unknowns whatever the policy default says.
        let r = round(vec![eval("a", Verdict::Pass), eval("b", unknown())]);
        assert!(decide(&policy(OnUnknown::Fail), &r, true).is_some_and(|v| v.passed()));
    }

    #[test]
    fn all_pass_until_the_end_then_passed() {
        let r = round(vec![eval("a", Verdict::Pass), eval("b", Verdict::Pass)]);
        assert_eq!(decide(&policy(OnUnknown::FailAfterBake), &r, false), None);
        let v = decide(&policy(OnUnknown::FailAfterBake), &r, true).unwrap();
        assert!(v.passed());
        assert_eq!(v.to_string(), "gates passed (2 rounds): a 1 ≤ 3; b 1 ≤ 3");
        let json = serde_json::to_value(&v).unwrap();
        assert_eq!(json["result"], "passed");
        assert_eq!(json["evaluations"][0]["verdict"], "pass");
    }
}
