//! A rollback restores custom resources, not only the Operator: a RedisCluster changed while the
//! failed release baked (as its migration would) gets back the spec it had before the apply,
//! from the snapshot the agent took.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

fn redisclusters(fleet: &Fleet) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cache.example.com", "v1alpha2", "RedisCluster"),
        "redisclusters",
    );
    Api::namespaced_with(fleet.cluster.client(), OPERATOR_NS, &ar)
}

async fn size(api: &Api<DynamicObject>) -> i64 {
    api.get("cache").await.unwrap().data["spec"]["size"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_resource_changed_during_a_failed_bake_is_restored_by_the_rollback() {
    let fleet = Fleet::start("agent-restore", true).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    // A RedisCluster of size 1 under rel-1 (the CRD came with it).
    let api = redisclusters(&fleet);
    let cache: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha2", "kind": "RedisCluster",
        "metadata": {"name": "cache", "namespace": OPERATOR_NS}, "spec": {"size": 1},
    }))
    .unwrap();
    api.create(&PostParams::default(), &cache).await.unwrap();

    // rel-2's gate wants every RedisCluster at most 3 nodes; while rel-2 bakes, its "migration"
    // grows the cluster to 7, which fails the gate.
    fleet.set_gates(
        "8s",
        "    - name: redisclusters-small\n      customResources:\n        apiVersion: cache.example.com/v1alpha2\n        \
         kind: RedisCluster\n        expression: \"self.spec.size <= 3\"\n        minHealthyRatio: 100%\n",
    );
    fleet.release("rel-2", |_| {});
    fleet.promote("rel-2");
    let migrate = async {
        eventually("rel-2 baking", 120, || async { (fleet.phase().await.as_deref() == Some("Baking")).then_some(()) })
            .await;
        let patch = json!({"spec": {"size": 7}});
        api.patch("cache", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    };
    let (outcome, ()) = within("rel-2", 240, async { tokio::join!(agent.reconcile(), migrate) }).await;
    assert_eq!(outcome.unwrap(), Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) });

    assert_eq!(size(&api).await, 1, "the RedisCluster has the spec it had before rel-2");
    // And it stays so: nothing re-applies the migration.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(size(&api).await, 1);
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    let state = fleet.state().await;
    assert_eq!(state.rejected()["rel-2"].failure.reason, "GateFailed");
    assert!(state.rejected()["rel-2"].failure.message.contains("redisclusters-small"), "{:?}", state.rejected());
}
