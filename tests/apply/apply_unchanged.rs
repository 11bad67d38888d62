//! What an apply leaves alone, against a real kube-apiserver: an object whose content and live
//! state are what fleetgate last applied is neither dry-run nor applied (a release already applied
//! sends no write at all), while an object someone changed is applied again — also when the
//! attacker forges the inventory's records to say it was not changed, or strips its inventory
//! label. The snapshot taken before a release holds what the release changes, and restores it.

use crate::apply_support;

use apply_support::{AGENT_NS, OPERATOR_NS, api, apply, cluster_state, get, policy, release, start};
use fleetgate::apply::{Action, Engine};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

/// An engine like `engine` on a client that counts the PATCH requests it sends (server-side
/// applies and their dry runs).
async fn counting(kubeconfig: &std::path::Path, engine: &Engine) -> (Engine, Arc<AtomicU64>) {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("client config");
    let patches = Arc::new(AtomicU64::new(0));
    let count = patches.clone();
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        if req.method() == http::Method::PATCH {
            count.fetch_add(1, Ordering::Relaxed);
        }
        req
    });
    let client = kube::client::ClientBuilder::try_from(config).expect("client").with_layer(&layer).build();
    (Engine::new(client, engine.options().clone()), patches)
}

fn data(cm: &ConfigMap, key: &str) -> Option<String> {
    cm.data.as_ref()?.get(key).cloned()
}

#[tokio::test]
async fn an_applied_release_sends_no_write_and_a_changed_object_is_applied_again() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("apply-unchanged").await;
        let client = cluster.client();
        let (counted, patches) = counting(cluster.kubeconfig_path(), &engine).await;
        let v1 = release("v1", "rel-v1", &[]);
        apply(&engine, &v1, &policy()).await.expect("v1 applies");
        // The CRD's status was written after fleetgate applied it: this apply writes it again
        // (a no-op) and records what the server holds now.
        apply(&engine, &v1, &policy()).await.expect("v1 again");
        let before = cluster_state(&client).await;

        let again = apply(&counted, &v1, &policy()).await.expect("v1 a third time");
        assert_eq!(again.with(&Action::Unchanged).len(), 13, "{again:#?}");
        assert_eq!(patches.load(Ordering::Relaxed), 0, "no dry run, no apply, no inventory write");
        assert_eq!(cluster_state(&client).await, before, "no resourceVersion moved");

        // Someone changes a field fleetgate applied; another object loses its inventory label.
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), OPERATOR_NS);
        let edit = PatchParams { field_manager: Some("kubectl-edit".into()), ..Default::default() };
        configmaps
            .patch("redis-operator-config", &edit, &Patch::Merge(json!({"data": {"log-level": "debug"}})))
            .await
            .expect("manual edit");
        let unlabel = json!({"metadata": {"labels": {"fleetgate.io/inventory": null}}});
        configmaps.patch("redis-operator-legacy", &edit, &Patch::Merge(unlabel)).await.expect("label removed");

        patches.store(0, Ordering::Relaxed);
        let repaired = apply(&counted, &v1, &policy()).await.expect("v1 after the edits");
        let mut configured: Vec<String> = repaired.with(&Action::Configured).iter().map(|k| k.name.clone()).collect();
        configured.sort();
        assert_eq!(configured, ["redis-operator-config", "redis-operator-legacy"], "{repaired:#?}");
        let config = configmaps.get("redis-operator-config").await.unwrap();
        assert_eq!(data(&config, "log-level").as_deref(), Some("info"), "the edited field is taken back");
        let legacy = configmaps.get("redis-operator-legacy").await.unwrap();
        assert_eq!(
            legacy.metadata.labels.unwrap_or_default().get("fleetgate.io/inventory"),
            Some(&engine.options().inventory)
        );
        // A dry run and an apply for each of the two, and the inventory's new records.
        assert_eq!(patches.load(Ordering::Relaxed), 5);
    })
    .await
    .expect("test finishes in time");
}

/// The attack: whoever may edit ConfigMaps in the agent's namespace (not the agent key) changes
/// an object and rewrites the inventory's record of it to the object's new resourceVersion, so the
/// engine would take the object as unchanged. The records' MAC no longer verifies: every object is
/// applied, the change is taken back.
#[tokio::test]
async fn forged_records_do_not_stop_an_edit_from_being_taken_back() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("apply-forged-records").await;
        let client = cluster.client();
        let v1 = release("v1", "rel-v1", &[]);
        apply(&engine, &v1, &policy()).await.expect("v1 applies");
        apply(&engine, &v1, &policy()).await.expect("v1 again");

        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), OPERATOR_NS);
        let edit = PatchParams { field_manager: Some("kubectl-edit".into()), ..Default::default() };
        let edited = configmaps
            .patch("redis-operator-config", &edit, &Patch::Merge(json!({"data": {"log-level": "debug"}})))
            .await
            .expect("manual edit");
        let new_rv = edited.metadata.resource_version.clone().unwrap();

        let inventories: Api<ConfigMap> = Api::namespaced(client.clone(), AGENT_NS);
        let name = format!("{}-inventory", engine.options().inventory);
        let inventory = inventories.get(&name).await.unwrap();
        let mut records: Vec<Value> = serde_json::from_str(&data(&inventory, "applied").unwrap()).unwrap();
        let record = records.iter_mut().find(|r| r["name"] == "redis-operator-config").expect("a record of it");
        record["resourceVersion"] = json!(new_rv);
        let forged = json!({"data": {"applied": serde_json::to_string(&records).unwrap()}});
        inventories.patch(&name, &PatchParams::default(), &Patch::Merge(forged)).await.expect("forged records");

        let changes = apply(&engine, &v1, &policy()).await.expect("v1 after the attack");
        assert_eq!(
            changes.with(&Action::Configured).iter().map(|k| k.name.clone()).collect::<Vec<_>>(),
            ["redis-operator-config"],
            "{changes:#?}"
        );
        let config = configmaps.get("redis-operator-config").await.unwrap();
        assert_eq!(data(&config, "log-level").as_deref(), Some("info"), "the edit is taken back");
    })
    .await
    .expect("test finishes in time");
}

/// Before v2, the snapshot holds what v2 changes of v1 (the Deployment, the RedisCluster, the
/// ConfigMap v2 drops) and every custom resource, not what v2 leaves as it is; restoring it after
/// v2 brings v1's state back.
#[tokio::test]
async fn the_snapshot_before_a_release_holds_what_it_changes_and_restores_it() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("snapshot-before").await;
        let client = cluster.client();
        let v1 = release("v1", "rel-v1", &[]);
        apply(&engine, &v1, &policy()).await.expect("v1 applies");
        apply(&engine, &v1, &policy()).await.expect("v1 again");

        let v2 = release("v2", "rel-v2", &[]);
        let admitted = engine.admit(&v2, &policy()).await.expect("v2 admitted");
        let snap = engine.snapshot_before(&admitted).await.expect("snapshot").expect("v1 is applied");
        let mut held: Vec<String> = engine
            .read_snapshot(&snap.id)
            .await
            .expect("the snapshot reads back")
            .iter()
            .map(|o| format!("{} {}", o.types.as_ref().unwrap().kind, o.metadata.name.clone().unwrap_or_default()))
            .collect();
        held.sort();
        assert_eq!(held, ["ConfigMap redis-operator-legacy", "Deployment redis-operator", "RedisCluster sample"]);

        engine.apply(admitted).await.expect("v2 applies");
        engine.prune().await.expect("v2 prunes");
        assert!(get(&client, "v1", "ConfigMap", Some(OPERATOR_NS), "redis-operator-legacy").await.is_none());
        engine.restore(&snap.id, &policy()).await.expect("restore");
        let deployment = get(&client, "apps/v1", "Deployment", Some(OPERATOR_NS), "redis-operator").await.unwrap();
        assert_eq!(
            deployment.data.pointer("/spec/template/spec/containers/0/image").unwrap(),
            "registry.example.com/redis-operator:v1.2.3-build.456"
        );
        let clusters = api(&client, "cache.example.com/v1alpha2", "RedisCluster", Some(OPERATOR_NS)).await;
        assert_eq!(clusters.get("sample").await.unwrap().data["spec"]["replicas"], 1);
        assert!(get(&client, "v1", "ConfigMap", Some(OPERATOR_NS), "redis-operator-legacy").await.is_some());
    })
    .await
    .expect("test finishes in time");
}
