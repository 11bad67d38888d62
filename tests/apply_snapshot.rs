//! Snapshot and restore against a real API server: the state of release N (its objects and every
//! custom resource of its CRDs, users' ones included) comes back after N+1 changed it, across a
//! snapshot large enough to be chunked; only the newest snapshots are kept.

mod apply_support;

use apply_support::{AGENT_NS, OPERATOR_NS, api, apply, get, policy, release, start};
use fleetgate::apply::{Action, LABEL_SNAPSHOT};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

async fn replicas(client: &kube::Client, name: &str) -> serde_json::Value {
    let cr = get(client, "cache.example.com/v1alpha2", "RedisCluster", Some(OPERATOR_NS), name).await;
    cr.unwrap_or_else(|| panic!("RedisCluster {name}")).data["spec"]["replicas"].clone()
}

#[tokio::test]
async fn restore_brings_back_custom_resources_and_release_objects() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("snapshot-restore").await;
        let client = cluster.client();
        // A ConfigMap of ~700 KB makes the snapshot span two Secrets.
        let big = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big, namespace: redis-system}}\ndata: {{blob: {}}}\n",
            "x".repeat(700 * 1024)
        );
        let extra = [("operator/big.yaml", big.as_str())];
        apply(&engine, &release("v1", "rel-v1", &extra), &policy()).await.expect("v1 applies");

        // A RedisCluster a user created, not part of any release.
        let clusters = api(&client, "cache.example.com/v1alpha2", "RedisCluster", Some(OPERATOR_NS)).await;
        let users: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cache.example.com/v1alpha2", "kind": "RedisCluster",
            "metadata": {"name": "users", "namespace": OPERATOR_NS},
            "spec": {"replicas": 2, "version": "7.0"}
        }))
        .unwrap();
        clusters.create(&PostParams::default(), &users).await.expect("user's RedisCluster");

        let snap = engine.snapshot().await.expect("snapshot").expect("a release is applied");
        assert_eq!(snap.release, "rel-v1");
        assert_eq!(snap.objects, 15, "14 release objects and the user's RedisCluster: {snap:?}");
        assert_eq!(snap.chunks, 2);

        // N+1 changes the release's RedisCluster and the Deployment; the user changes theirs.
        apply(&engine, &release("v2", "rel-v2", &extra), &policy()).await.expect("v2 applies");
        let edit = Patch::Merge(json!({"spec": {"replicas": 5}}));
        clusters.patch("users", &PatchParams::default(), &edit).await.expect("user edit");
        assert_eq!(replicas(&client, "sample").await, 3);

        let restored = engine.restore(&snap.id).await.expect("restore");
        assert_eq!(replicas(&client, "sample").await, 1, "the release's CR spec is back");
        assert_eq!(replicas(&client, "users").await, 2, "the user's CR spec is back");
        let deployment = get(&client, "apps/v1", "Deployment", Some(OPERATOR_NS), "redis-operator").await.unwrap();
        assert_eq!(
            deployment.data.pointer("/spec/template/spec/containers/0/image").unwrap(),
            "registry.example.com/redis-operator:v1.2.3-build.456"
        );
        let configured: Vec<String> = restored.with(&Action::Configured).iter().map(|k| k.name.clone()).collect();
        assert!(
            configured.contains(&"sample".to_string()) && configured.contains(&"users".to_string()),
            "{restored:#?}"
        );
        let legacy = get(&client, "v1", "ConfigMap", Some(OPERATOR_NS), "redis-operator-legacy").await;
        assert!(legacy.is_some(), "v2 applied without prune: the object v1 had is still there");

        // History: only the newest three snapshots (and their chunks) are kept.
        let mut ids = vec![snap.id.clone()];
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            ids.push(engine.snapshot().await.unwrap().unwrap().id);
        }
        let kept: Vec<String> = engine.snapshots().await.unwrap().into_iter().map(|s| s.id).collect();
        assert_eq!(kept, [ids[3].clone(), ids[2].clone(), ids[1].clone()]);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), AGENT_NS);
        let oldest =
            secrets.list(&ListParams::default().labels(&format!("{LABEL_SNAPSHOT}={}", snap.id))).await.unwrap();
        assert!(oldest.items.is_empty(), "the oldest snapshot's index and chunks are deleted");
        assert!(engine.restore(&snap.id).await.is_err());
    })
    .await
    .expect("test finishes in time");
}
