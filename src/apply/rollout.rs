//! Waiting for workloads to roll out (Deployments, StatefulSets, DaemonSets), read from the
//! objects' status the way `kubectl rollout status` does.

use super::ApplyError;
use super::phases::Resolver;
use crate::apply::{api_message, is_unreachable};
use crate::manifests::Manifest;
use futures::future::try_join_all;
use serde_json::Value;
use std::time::Duration;

/// Whether a workload has rolled out (the checks of `kubectl rollout status`): `Ok(())` when
/// done, `Err(state)` saying what it still waits for. `data` is the object's body (`spec`,
/// `status`). Kinds without a rollout are done at once.
pub(crate) fn rollout_state(kind: &str, generation: Option<i64>, data: &Value) -> Result<(), String> {
    if !matches!(kind, "Deployment" | "StatefulSet" | "DaemonSet") {
        return Ok(());
    }
    let status = data.get("status").ok_or("no status yet")?;
    let int = |f: &str| status.get(f).and_then(Value::as_i64).unwrap_or(0);
    let observed = status.get("observedGeneration").and_then(Value::as_i64);
    if let Some(g) = generation
        && observed.is_none_or(|o| o < g)
    {
        return Err(format!("generation {g} not observed yet"));
    }
    let spec_replicas = data.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let (want, updated, ready) = match kind {
        "DaemonSet" => (int("desiredNumberScheduled"), int("updatedNumberScheduled"), int("numberAvailable")),
        "StatefulSet" => (spec_replicas, int("updatedReplicas"), int("readyReplicas")),
        _ => (spec_replicas, int("updatedReplicas"), int("availableReplicas")),
    };
    if updated < want {
        return Err(format!("{updated} of {want} replicas updated"));
    }
    if kind == "Deployment" && int("replicas") > updated {
        return Err(format!("{} old replicas pending termination", int("replicas") - updated));
    }
    if ready < want {
        return Err(format!("{ready} of {want} updated replicas available"));
    }
    Ok(())
}

/// Waits for every workload among `objects` to roll out, each within `timeout`.
pub(crate) async fn wait_all(resolver: &Resolver, objects: &[&Manifest], timeout: Duration) -> Result<(), ApplyError> {
    try_join_all(objects.iter().map(|m| wait_one(resolver, m, timeout))).await?;
    Ok(())
}

async fn wait_one(resolver: &Resolver, m: &Manifest, timeout: Duration) -> Result<(), ApplyError> {
    let wait_err = |reason: String| ApplyError::Wait { what: format!("rollout of {}", m.key), reason };
    let api = resolver.api(m).map_err(wait_err)?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let obj = match api.get(&m.key.name).await {
            Ok(obj) => obj,
            Err(source) if is_unreachable(&source) => {
                return Err(ApplyError::Kube { action: format!("waiting for the rollout of {}", m.key), source });
            }
            Err(e) => return Err(wait_err(api_message(&e))),
        };
        let generation = obj.metadata.generation;
        match rollout_state(&m.key.kind, generation, &obj.data) {
            Ok(()) => return Ok(()),
            Err(state) if tokio::time::Instant::now() >= deadline => {
                return Err(ApplyError::RolloutTimeout { object: Box::new(m.key.clone()), timeout, state });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    #[rstest]
    #[case::not_a_workload("ConfigMap", None, json!({}), true)]
    #[case::no_status("Deployment", Some(1), json!({"spec": {"replicas": 1}}), false)]
    #[case::old_generation("Deployment", Some(2), json!({"spec": {"replicas": 1}, "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}}), false)]
    #[case::done("Deployment", Some(2), json!({"spec": {"replicas": 2}, "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}}), true)]
    #[case::not_created_yet("Deployment", Some(1), json!({"spec": {"replicas": 2}, "status": {"observedGeneration": 1}}), false)]
    #[case::surge_pending("Deployment", Some(2), json!({"spec": {"replicas": 2}, "status": {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 2, "availableReplicas": 3}}), false)]
    #[case::unavailable("Deployment", Some(2), json!({"spec": {"replicas": 2}, "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 1}}), false)]
    #[case::scaled_to_zero("Deployment", Some(3), json!({"spec": {"replicas": 0}, "status": {"observedGeneration": 3}}), true)]
    #[case::statefulset_ready("StatefulSet", Some(1), json!({"spec": {"replicas": 3}, "status": {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3}}), true)]
    #[case::daemonset_partial("DaemonSet", Some(1), json!({"status": {"observedGeneration": 1, "desiredNumberScheduled": 3, "updatedNumberScheduled": 2, "numberAvailable": 2}}), false)]
    fn states(#[case] kind: &str, #[case] generation: Option<i64>, #[case] data: Value, #[case] done: bool) {
        assert_eq!(
            rollout_state(kind, generation, &data).is_ok(),
            done,
            "{:?}",
            rollout_state(kind, generation, &data)
        );
    }
}
