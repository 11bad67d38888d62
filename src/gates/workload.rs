//! The operator's own workload: Deployments available, container restarts since the apply.

use super::{GateEvaluation, Threshold, Verdict};
use crate::model::Quantity;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;

/// How many unhealthy objects a detail line names before it says "and N more".
pub(crate) const DETAIL_ITEMS: usize = 3;

pub(crate) fn list_detail(items: &[String]) -> Option<String> {
    if items.is_empty() {
        return None;
    }
    let mut d = items.iter().take(DETAIL_ITEMS).cloned().collect::<Vec<_>>().join("; ");
    if items.len() > DETAIL_ITEMS {
        d.push_str(&format!("; and {} more", items.len() - DETAIL_ITEMS));
    }
    Some(d)
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or(""), meta.name.as_deref().unwrap_or(""))
}

/// Deployment availability: every replica updated and available, the controller caught up with
/// the spec, and no `ProgressDeadlineExceeded`. The figure is the share of desired replicas that
/// are both updated and available. A rollout still in progress is `unknown` (the policy decides
/// whether that fails once the bake time is over); a progress deadline exceeded fails at once.
pub(crate) fn judge_deployments(gate: &str, deployments: &[Deployment], scope: &str) -> GateEvaluation {
    let threshold = Threshold::AtLeast { limit: Quantity::percent(1.0) };
    if deployments.is_empty() {
        return GateEvaluation::unknown(gate, format!("no Deployment found ({scope})"), threshold);
    }
    let (mut desired_sum, mut ready_sum) = (0i64, 0i64);
    let (mut stuck, mut rolling) = (Vec::new(), Vec::new());
    for d in deployments {
        let desired = i64::from(d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1));
        let st = d.status.clone().unwrap_or_default();
        let updated = i64::from(st.updated_replicas.unwrap_or(0));
        let available = i64::from(st.available_replicas.unwrap_or(0));
        let total = i64::from(st.replicas.unwrap_or(0));
        let observed = st.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
        let ready = updated.min(available).min(desired);
        desired_sum += desired;
        ready_sum += ready;
        let figures = format!("{updated}/{desired} updated, {available}/{desired} available");
        let deadline = st.conditions.iter().flatten().find(|c| {
            c.type_ == "Progressing" && c.status == "False" && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
        });
        if let Some(c) = deadline {
            stuck.push(format!(
                "{}: ProgressDeadlineExceeded ({figures}){}",
                key(&d.metadata),
                c.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
            ));
        } else if !(observed && updated >= desired && available >= desired && total <= updated) {
            let old = if total > updated { format!(", {} old replicas left", total - updated) } else { String::new() };
            let lag = if observed { "" } else { ", controller has not seen the latest spec" };
            rolling.push(format!("{}: {figures}{old}{lag}", key(&d.metadata)));
        }
    }
    let share = if desired_sum == 0 { 1.0 } else { ready_sum as f64 / desired_sum as f64 };
    let observed = Quantity::percent(share);
    if !stuck.is_empty() {
        stuck.extend(rolling);
        return GateEvaluation {
            gate: gate.into(),
            verdict: Verdict::Fail,
            observed: Some(observed),
            threshold,
            detail: list_detail(&stuck),
        };
    }
    if !rolling.is_empty() {
        return GateEvaluation {
            gate: gate.into(),
            verdict: Verdict::Unknown { reason: "rollout in progress".into() },
            observed: Some(observed),
            threshold,
            detail: list_detail(&rolling),
        };
    }
    GateEvaluation::compare(gate, observed, threshold, None)
}

/// Sum of container (and init container) restarts per pod UID: the baseline taken at apply time.
pub fn restart_counts(pods: &[Pod]) -> BTreeMap<String, u32> {
    pods.iter()
        .filter_map(|p| {
            let uid = p.metadata.uid.clone()?;
            Some((uid, pod_restarts(p)))
        })
        .collect()
}

fn pod_restarts(p: &Pod) -> u32 {
    let st = p.status.as_ref();
    let containers = st.and_then(|s| s.container_statuses.as_ref()).into_iter().flatten();
    let inits = st.and_then(|s| s.init_container_statuses.as_ref()).into_iter().flatten();
    containers.chain(inits).map(|c| u32::try_from(c.restart_count).unwrap_or(0)).sum()
}

/// Restarts since the apply across `pods`: each pod's count minus its count in `baseline` (pods
/// created after the apply count from zero).
pub(crate) fn judge_restarts(gate: &str, max: u32, pods: &[Pod], baseline: &BTreeMap<String, u32>) -> GateEvaluation {
    let mut per_pod: Vec<(String, u32)> = pods
        .iter()
        .map(|p| {
            let before = p.metadata.uid.as_ref().and_then(|u| baseline.get(u)).copied().unwrap_or(0);
            (key(&p.metadata), pod_restarts(p).saturating_sub(before))
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    per_pod.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let total: u32 = per_pod.iter().map(|(_, n)| n).sum();
    let items: Vec<String> = per_pod.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    GateEvaluation::compare(
        gate,
        Quantity::number(f64::from(total)),
        Threshold::AtMost { limit: Quantity::number(f64::from(max)) },
        list_detail(&items),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(name: &str, desired: i32, updated: i32, available: i32, total: i32, deadline: bool) -> Deployment {
        let mut conditions = vec![];
        if deadline {
            conditions.push(json!({"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "ReplicaSet \"op-1\" has timed out progressing."}));
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "operator", "generation": 2},
            "spec": {"replicas": desired, "selector": {}, "template": {}},
            "status": {"observedGeneration": 2, "replicas": total, "updatedReplicas": updated, "availableReplicas": available, "conditions": conditions}
        }))
        .unwrap()
    }

    #[test]
    fn deployments_pass_when_every_replica_is_updated_and_available() {
        let e = judge_deployments("available", &[deployment("op", 2, 2, 2, 2, false)], "x");
        assert_eq!(e.to_string(), "available 100 % ≥ 100 %");
    }

    #[test]
    fn a_rollout_in_progress_is_unknown_with_its_figure() {
        let e = judge_deployments("available", &[deployment("op", 2, 2, 1, 3, false)], "x");
        assert!(e.is_unknown());
        assert_eq!(
            e.to_string(),
            "available unknown (rollout in progress; observed 50 %; threshold ≥ 100 %) — operator/op: 2/2 updated, 1/2 available, 1 old replicas left"
        );
    }

    #[test]
    fn a_progress_deadline_fails_at_once() {
        let e = judge_deployments(
            "available",
            &[deployment("op", 2, 1, 0, 2, true), deployment("web", 1, 1, 1, 1, false)],
            "x",
        );
        assert!(e.is_fail());
        assert_eq!(
            e.to_string(),
            "available 33.3 % < 100 % — operator/op: ProgressDeadlineExceeded (1/2 updated, 0/2 available): ReplicaSet \"op-1\" has timed out progressing."
        );
    }

    #[test]
    fn no_deployment_is_unknown() {
        let e = judge_deployments("available", &[], "selector app=op in namespace operator");
        assert_eq!(
            e.verdict,
            Verdict::Unknown { reason: "no Deployment found (selector app=op in namespace operator)".into() }
        );
    }

    fn pod(name: &str, uid: &str, restarts: &[i32]) -> Pod {
        let statuses: Vec<_> = restarts.iter().enumerate().map(|(i, r)| json!({"name": format!("c{i}"), "image": "x", "imageID": "", "ready": false, "restartCount": r})).collect();
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "operator", "uid": uid}, "status": {"containerStatuses": statuses}})).unwrap()
    }

    #[test]
    fn restarts_count_from_the_baseline() {
        let baseline = restart_counts(&[pod("a", "u1", &[2, 1])]);
        assert_eq!(baseline, BTreeMap::from([("u1".to_string(), 3)]));
        let now = [pod("a", "u1", &[4, 1]), pod("b", "u2", &[3])];
        let e = judge_restarts("pod-restarts", 3, &now, &baseline);
        assert_eq!(e.to_string(), "pod-restarts 5 > 3 — operator/b: 3; operator/a: 2");
        let e = judge_restarts("pod-restarts", 5, &now, &baseline);
        assert!(e.is_pass(), "{e}");
    }

    #[test]
    fn details_name_a_few_and_count_the_rest() {
        let items: Vec<String> = (0..5).map(|i| format!("p{i}")).collect();
        assert_eq!(list_detail(&items).unwrap(), "p0; p1; p2; and 2 more");
    }
}
