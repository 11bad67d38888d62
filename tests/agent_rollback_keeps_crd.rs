//! A rollback must be able to go back: when the failed release introduced a CRD storage version
//! (so objects may be stored in it), its rollback target's CRD, which lacks that version, cannot
//! replace the live one — the API server refuses it, and a naive rollback would fail at every
//! pass with the bad release live. The agent keeps that CRD as it is, rolls back everything
//! else, and says so in a Warning Event.

mod agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::json;
use std::path::Path;

const CRD: &str = "redisclusters.cache.example.com";

/// Adds `v1beta1` (v1alpha2's schema) to the release's CRD as its new storage version.
fn add_storage_version(render: &Path) {
    let path = render.join(format!("crds/{CRD}.yaml"));
    let mut crd: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let versions = crd["spec"]["versions"].as_sequence_mut().unwrap();
    for v in versions.iter_mut() {
        v["storage"] = false.into();
    }
    let mut beta = versions.iter().find(|v| v["name"] == "v1alpha2").unwrap().clone();
    beta["name"] = "v1beta1".into();
    beta["storage"] = true.into();
    versions.push(beta);
    std::fs::write(&path, serde_yaml_ng::to_string(&crd).unwrap()).unwrap();
}

fn versions(crd: &CustomResourceDefinition) -> Vec<String> {
    crd.spec.versions.iter().map(|v| v.name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_whose_new_storage_version_holds_objects_is_kept_and_the_rest_rolls_back() {
    let fleet = Fleet::start("agent-keep-crd", true).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    // A RedisCluster of 7 nodes: rel-2's gate allows at most 3, so rel-2 fails at its first round.
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cache.example.com", "v1alpha2", "RedisCluster"),
        "redisclusters",
    );
    let clusters: Api<DynamicObject> = Api::namespaced_with(fleet.cluster.client(), OPERATOR_NS, &ar);
    let cache: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha2", "kind": "RedisCluster",
        "metadata": {"name": "cache", "namespace": OPERATOR_NS}, "spec": {"size": 7},
    }))
    .unwrap();
    clusters.create(&PostParams::default(), &cache).await.unwrap();
    fleet.set_gates(
        "5s",
        "    - name: redisclusters-small\n      customResources:\n        apiVersion: cache.example.com/v1alpha2\n        \
         kind: RedisCluster\n        expression: \"self.spec.size <= 3\"\n        minHealthyRatio: 100%\n",
    );
    fleet.release("rel-2", add_storage_version);
    fleet.promote("rel-2");

    let outcome = within("rel-2", 240, agent.reconcile()).await.unwrap();
    assert_eq!(outcome, Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) });

    // Everything else is rel-1 again; the CRD keeps v1beta1, in which objects are now stored.
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    let crds: Api<CustomResourceDefinition> = Api::all(fleet.cluster.client());
    let live = crds.get(CRD).await.unwrap();
    assert_eq!(versions(&live), ["v1alpha1", "v1alpha2", "v1beta1"]);
    let stored = live.status.and_then(|s| s.stored_versions).unwrap_or_default();
    assert!(stored.contains(&"v1beta1".to_string()), "{stored:?}");
    assert!(clusters.get_opt("cache").await.unwrap().is_some(), "the RedisCluster survived");

    // The agent said why, and a second pass has nothing left to do (no loop in RollingBack).
    let events: Api<Event> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    let kept: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("CrdKept"))
        .filter_map(|e| e.note)
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].contains(CRD) && kept[0].contains("stored in v1beta1"), "{}", kept[0]);
    assert_eq!(fleet.state().await.current(), Some("rel-1"));
    assert_eq!(within("next pass", 60, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-2".into()));
}
