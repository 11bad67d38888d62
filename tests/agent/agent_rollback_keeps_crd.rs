//! A rollback must be able to go back: when the failed release introduced a CRD storage version
//! (so objects may be stored in it), its rollback target's CRD, which lacks that version, cannot
//! replace the live one — the API server refuses it, and a naive rollback would fail at every
//! pass with the bad release live. The agent keeps that CRD as it is, rolls back everything
//! else, and says so in a Warning Event.
//!
//! The same holds when people roll back through Git (a `git revert` of the promotion, or
//! `fleetgate rollback --push`): a move back to a release that passed its bake on this cluster is
//! a rollback, not an upgrade to an older schema. The CRD the newer release widened (a new
//! optional field, as nearly every upgrade adds) stays, the custom resources that use it stay
//! intact, the old Operator runs and the old release reports `success`. A move back to a release
//! that never ran here is an ordinary promotion, and the CRD gate judges it.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate::status::State;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::json;
use std::path::Path;

const CRD: &str = "redisclusters.cache.example.com";

/// Adds `v1beta1` (v1alpha2's schema) to the release's CRD as its new storage version.
fn add_storage_version(render: &Path) {
    let path = render.join(format!("crds/{CRD}.yaml"));
    let mut crd: serde_json::Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let versions = crd["spec"]["versions"].as_array_mut().unwrap();
    for v in versions.iter_mut() {
        v["storage"] = false.into();
    }
    let mut beta = versions.iter().find(|v| v["name"] == "v1alpha2").unwrap().clone();
    beta["name"] = "v1beta1".into();
    beta["storage"] = true.into();
    versions.push(beta);
    std::fs::write(&path, serde_saphyr::to_string(&crd).unwrap()).unwrap();
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

/// Adds an optional boolean `spec.paused` to the CRD's v1alpha2 schema: what an upgrade adds.
fn add_optional_field(render: &Path) {
    let path = render.join(format!("crds/{CRD}.yaml"));
    let mut crd: serde_json::Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let versions = crd["spec"]["versions"].as_array_mut().unwrap();
    let v1alpha2 = versions.iter_mut().find(|v| v["name"] == "v1alpha2").unwrap();
    let properties = &mut v1alpha2["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    properties["paused"] = serde_saphyr::from_str("{type: boolean, description: Stop reconciling.}").unwrap();
    std::fs::write(&path, serde_saphyr::to_string(&crd).unwrap()).unwrap();
}

fn redisclusters(fleet: &Fleet) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cache.example.com", "v1alpha2", "RedisCluster"),
        "redisclusters",
    );
    Api::namespaced_with(fleet.cluster.client(), OPERATOR_NS, &ar)
}

/// Whether the live CRD's v1alpha2 schema has `spec.paused`.
async fn crd_has_paused(fleet: &Fleet) -> bool {
    let live = Api::<CustomResourceDefinition>::all(fleet.cluster.client()).get(CRD).await.unwrap();
    let v = live.spec.versions.iter().find(|v| v.name == "v1alpha2").unwrap();
    let spec = &v.schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap().properties.as_ref().unwrap()["spec"];
    spec.properties.as_ref().unwrap().contains_key("paused")
}

/// The notes of the agent's Events with `reason`.
async fn event_notes(fleet: &Fleet, reason: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    let list = events.list(&ListParams::default()).await.unwrap().items;
    list.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).filter_map(|e| e.note).collect()
}

/// After a return to rel-1: rel-1's Operator runs, the widened CRD and the custom resource that
/// uses its new field are intact, and rel-1's last status is a `success` that names the kept CRD.
async fn assert_back_on_rel1(fleet: &Fleet, rel1: &str, by: &str) {
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")), "{by}: rel-1's Operator runs");
    assert!(crd_has_paused(fleet).await, "{by}: the CRD keeps the field rel-2 added");
    let cache = redisclusters(fleet).get("cache").await.unwrap();
    assert_eq!((&cache.data["spec"]["size"], &cache.data["spec"]["paused"]), (&json!(3), &json!(true)), "{by}");
    let status = fleet.statuses(rel1).pop().expect("a status of rel-1");
    assert_eq!(status.state, State::Success, "{by}: {}", status.description);
    // Baked for the policy's rollbackBakeTime (2s), not its bakeTime (8s).
    let said = &status.description;
    assert!(
        said.contains("rolled back from rel-2") && said.contains("passed for 2s") && said.contains(CRD),
        "{by}: {said}"
    );
    assert_eq!(fleet.state().await.current(), Some("rel-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_in_git_rolls_back_like_the_agent_keeping_the_wider_crd_and_the_custom_resources() {
    let fleet = Fleet::start("agent-git-rollback", true).await;
    // The rollback's bake is its own: shorter than the promotion's.
    fleet.set_policy("8s", "  rollbackBakeTime: 2s\n", QUICK_GATES);
    let rel1 = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    let cache: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha2", "kind": "RedisCluster",
        "metadata": {"name": "cache", "namespace": OPERATOR_NS}, "spec": {"size": 3},
    }))
    .unwrap();
    redisclusters(&fleet).create(&PostParams::default(), &cache).await.unwrap();

    // rel-2 widens the CRD; a user starts using the new field.
    fleet.release("rel-2", add_optional_field);
    fleet.promote("rel-2");
    assert_eq!(within("rel-2", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-2".into()));
    let mut cache = redisclusters(&fleet).get("cache").await.unwrap();
    cache.data["spec"]["paused"] = json!(true);
    redisclusters(&fleet).replace("cache", &PostParams::default(), &cache).await.expect("rel-2's CRD takes paused");

    // A plain `git revert` of the promotion.
    fleet.git(&["revert", "--no-edit", "HEAD"]);
    fleet.git(&["push", "-q", "origin", "main"]);
    assert_eq!(within("revert", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    assert_back_on_rel1(&fleet, &rel1, "git revert").await;
    let kept = event_notes(&fleet, "CrdKept").await;
    assert!(kept.iter().any(|k| k.contains(CRD) && k.contains("field-removed .spec.paused")), "{kept:?}");

    // Forward to rel-2 again (the CRD is already as wide), then back with `fleetgate rollback`.
    fleet.promote("rel-2");
    assert_eq!(within("rel-2 again", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-2".into()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["rollback", "--cluster", CLUSTER, "--reason", "rel-2 misbehaves", "--push", "--repo"])
        .arg(&fleet.work)
        .output()
        .unwrap();
    assert!(out.status.success(), "fleetgate rollback: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(within("fleetgate rollback", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    assert_back_on_rel1(&fleet, &rel1, "fleetgate rollback").await;
    // Nothing left to do, and drift correction never narrows the kept CRD.
    assert_eq!(within("next pass", 60, agent.reconcile()).await.unwrap(), Outcome::UpToDate);
    assert!(crd_has_paused(&fleet).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_back_to_a_release_that_never_ran_here_is_judged_as_a_promotion() {
    let fleet = Fleet::start("agent-back-never-ran", true).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    // rel-2 is cut but never runs here; rel-3 widens the CRD and runs.
    fleet.release("rel-2", |_| {});
    fleet.release("rel-3", add_optional_field);
    fleet.promote("rel-3");
    assert_eq!(within("rel-3", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-3".into()));

    // A signed decision asks for rel-2: allowed to move back, but rel-2 is not a known-good
    // release of this cluster, so its narrower CRD meets the CRD gate and nothing is applied.
    fleet.promote_signed("rel-2");
    let outcome = within("rel-2", 120, agent.reconcile()).await.unwrap();
    let Outcome::Blocked { release, reason } = outcome else { panic!("{outcome:?}") };
    assert_eq!(release, "rel-2");
    assert!(reason.contains("field removed") && reason.contains(".spec.paused"), "{reason}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-3")));
    assert!(crd_has_paused(&fleet).await);
    assert!(event_notes(&fleet, "CrdKept").await.is_empty(), "a promotion keeps nothing: the gate decides");
}
