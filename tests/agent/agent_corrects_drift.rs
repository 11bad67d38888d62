//! Drift correction against a real cluster: someone `kubectl edit`s the Operator's Deployment
//! (another field manager changes its image); within one `--drift-interval` the agent applies its
//! release again, names the object in a Warning Event, and `fleetgate diff`'s comparison agrees.
//! With the interval at `0s` the agent leaves the edit alone.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::{AgentSettings, Outcome};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use std::time::Duration;

/// What `kubectl edit` does: an update by another field manager.
async fn edit_image(fleet: &Fleet, image: &str) {
    let api: Api<Deployment> = Api::namespaced(fleet.cluster.client(), OPERATOR_NS);
    let patch =
        serde_json::json!({"spec": {"template": {"spec": {"containers": [{"name": "manager", "image": image}]}}}});
    api.patch(
        "redis-operator",
        &PatchParams { field_manager: Some("kubectl-edit".into()), ..Default::default() },
        &Patch::Strategic(patch),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_deployment_is_reverted_within_one_interval() {
    let fleet = Fleet::start("drift", true).await;
    let settings = AgentSettings { drift_interval: Some(Duration::from_secs(1)), ..fleet.settings() };
    let mut agent = fleet.agent_with(settings).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    assert_eq!(within("in sync", 60, agent.reconcile()).await.unwrap(), Outcome::UpToDate, "no drift after an apply");

    edit_image(&fleet, "registry.example.com/redis-operator:hotfix").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let Outcome::DriftCorrected { release, objects } = within("drift", 60, agent.reconcile()).await.unwrap() else {
        panic!("the drift was not corrected")
    };
    assert_eq!(
        (release.as_str(), objects.as_slice()),
        ("rel-1", ["Deployment.apps redis-system/redis-operator".to_string()].as_slice())
    );
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    let events = fleet.events_json().await;
    assert!(events.contains("DriftCorrected") && events.contains("redis-system/redis-operator"), "{events}");

    // Within the interval nothing is checked again; after it, nothing has drifted.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(within("after", 60, agent.reconcile()).await.unwrap(), Outcome::UpToDate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_drift_correction_off_an_edit_stays() {
    let fleet = Fleet::start("drift-off", true).await;
    let settings = AgentSettings { drift_interval: Some(Duration::ZERO), ..fleet.settings() };
    let mut agent = fleet.agent_with(settings).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    edit_image(&fleet, "registry.example.com/redis-operator:hotfix").await;
    assert_eq!(within("off", 60, agent.reconcile()).await.unwrap(), Outcome::UpToDate);
    assert_eq!(fleet.operator_image().await, Some("registry.example.com/redis-operator:hotfix".into()));
}
