//! The apply engine against a real kube-apiserver: a release of the template's operator, then a
//! release that changes the Deployment, adds an object and drops another; prune, inventory and
//! `release-manifest-<id>`; re-applying changes nothing; a CRD and its custom resource in one pass.

use crate::apply_support;

use apply_support::{AGENT_NS, OPERATOR_NS, apply, cluster_state, get, policy, release, start};
use fleetgate::apply::{Action, ChangeSet, release_manifest_name};
use fleetgate::manifests::{ObjectKey, Phase};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

fn names(keys: Vec<&ObjectKey>) -> Vec<String> {
    keys.into_iter().map(|k| k.to_string()).collect()
}

fn configured_image(obj: &kube::api::DynamicObject) -> String {
    obj.data.pointer("/spec/template/spec/containers/0/image").and_then(|v| v.as_str()).unwrap_or_default().to_string()
}

#[tokio::test]
async fn upgrade_prunes_dropped_objects_and_records_the_release() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("apply-upgrade").await;
        let client = cluster.client();

        // v1: the CRD and a RedisCluster of it in the same release, one pass.
        let v1 = apply(&engine, &release("v1", "rel-v1", &[]), &policy()).await.expect("v1 applies");
        assert_eq!(v1.changes.len(), 13, "{v1:#?}");
        assert!(v1.changes.iter().all(|c| c.action == Action::Created), "{v1:#?}");
        let deferred: Vec<(String, Phase)> =
            v1.dry_run_deferred.iter().map(|d| (d.object.to_string(), d.after)).collect();
        assert!(
            deferred.contains(&("RedisCluster.cache.example.com redis-system/sample".into(), Phase::Crds)),
            "{deferred:?}"
        );
        assert!(
            deferred.contains(&("Deployment.apps redis-system/redis-operator".into(), Phase::Namespaces)),
            "{deferred:?}"
        );
        let sample = get(&client, "cache.example.com/v1alpha2", "RedisCluster", Some(OPERATOR_NS), "sample").await;
        assert_eq!(sample.expect("custom resource exists").data["spec"]["replicas"], 1);
        let order: Vec<String> = v1.changes.iter().map(|c| c.object.kind.clone()).collect();
        assert_eq!(order.first().map(String::as_str), Some("Namespace"));
        assert_eq!(order.get(1).map(String::as_str), Some("CustomResourceDefinition"));
        assert_eq!(order.last().map(String::as_str), Some("ValidatingWebhookConfiguration"));
        assert!(engine.prune().await.expect("nothing to prune").is_empty());

        // v2: Deployment image changed, redis-operator-features added, redis-operator-legacy dropped.
        let mut v2 = apply(&engine, &release("v2", "rel-v2", &[]), &policy()).await.expect("v2 applies");
        assert_eq!(names(v2.with(&Action::Created)), ["ConfigMap redis-system/redis-operator-features"]);
        // Only what v2 changes is written: applied objects carry no per-release label.
        assert_eq!(
            names(v2.with(&Action::Configured)),
            ["Deployment.apps redis-system/redis-operator", "RedisCluster.cache.example.com redis-system/sample"],
            "{v2:#?}"
        );
        assert_eq!(v2.with(&Action::Unchanged).len(), 10, "{v2:#?}");
        let legacy = get(&client, "v1", "ConfigMap", Some(OPERATOR_NS), "redis-operator-legacy").await;
        assert!(legacy.is_some(), "nothing is deleted before prune");

        v2.changes.extend(engine.prune().await.expect("prune"));
        assert_eq!(names(v2.with(&Action::Pruned)), ["ConfigMap redis-system/redis-operator-legacy"]);
        assert!(get(&client, "v1", "ConfigMap", Some(OPERATOR_NS), "redis-operator-legacy").await.is_none());
        assert!(get(&client, "v1", "ConfigMap", Some(OPERATOR_NS), "redis-operator-features").await.is_some());
        let deployment = get(&client, "apps/v1", "Deployment", Some(OPERATOR_NS), "redis-operator").await.unwrap();
        assert_eq!(configured_image(&deployment), "registry.example.com/redis-operator:v1.3.0-build.500");
        let labels = deployment.metadata.labels.unwrap();
        assert_eq!(labels["fleetgate.io/inventory"], engine.options().inventory);
        assert!(!labels.contains_key("fleetgate.io/release"), "the inventory records the release: {labels:?}");

        let inventory = engine.inventory().await.expect("inventory").expect("inventory exists");
        assert_eq!(inventory.release, "rel-v2");
        assert_eq!(inventory.previous_release.as_deref(), Some("rel-v1"));
        assert!(inventory.pending_prune.is_empty());
        let listed: Vec<String> = inventory.objects.iter().map(|e| e.key().to_string()).collect();
        assert_eq!(listed.len(), 13);
        assert!(listed.contains(&"ConfigMap redis-system/redis-operator-features".to_string()));
        assert!(!listed.iter().any(|l| l.contains("redis-operator-legacy")));

        for (id, tag) in [("rel-v1", "rel-v1-tag"), ("rel-v2", "rel-v2-tag")] {
            let cm = get(&client, "v1", "ConfigMap", Some(AGENT_NS), &release_manifest_name(id)).await;
            let data = cm.unwrap_or_else(|| panic!("release-manifest-{id}")).data["data"].clone();
            assert_eq!(data["release.id"], id);
            assert_eq!(data["git.commit"], "a1b2c3d4e5f6");
            assert_eq!(data["image.tag"], tag);
            assert_eq!(data["chart.version"], "1.2.3");
            assert_eq!(data["crd.version"], "v1alpha2");
            assert_eq!(data["target.clusters"], "cluster-a,cluster-b");
            assert!(data["deploy.timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{data}");
        }
    })
    .await
    .expect("test finishes in time");
}

#[tokio::test]
async fn reapplying_a_release_changes_nothing() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("apply-again").await;
        let client = cluster.client();
        let v1 = release("v1", "rel-v1", &[]);
        apply(&engine, &v1, &policy()).await.expect("first apply");
        let before = cluster_state(&client).await;

        let again: ChangeSet = apply(&engine, &v1, &policy()).await.expect("second apply");
        assert!(!again.changed_anything(), "{again:#?}");
        assert_eq!(again.with(&Action::Unchanged).len(), 13);
        assert!(again.dry_run_deferred.is_empty(), "namespace and CRD exist and do not change: all dry-run up front");
        assert!(engine.prune().await.expect("prune").is_empty());
        // The inventory alone may move: its record of the CRD catches up with the status the
        // API server wrote after fleetgate applied it (tests/apply/apply_unchanged.rs: a third apply
        // writes nothing at all).
        let inventory = format!("/ConfigMap {AGENT_NS}/{}-inventory", engine.options().inventory);
        let without_inventory = |mut state: std::collections::BTreeMap<String, String>| {
            assert!(state.remove(&inventory).is_some(), "{inventory} in {state:#?}");
            state
        };
        let after = cluster_state(&client).await;
        assert_eq!(
            without_inventory(before),
            without_inventory(after),
            "no resourceVersion moved, release manifest included"
        );
    })
    .await
    .expect("test finishes in time");
}
