//! Snapshot and restore against a real API server: the state of release N (its objects and every
//! custom resource of its CRDs, users' ones included) comes back after N+1 changed it, across a
//! snapshot large enough to be chunked; only the newest snapshots are kept. A snapshot is
//! authenticated by a MAC under the agent key (an edited or relabelled one is refused), and restore
//! runs the admission policy on what it restores.

use crate::apply_support;

use apply_support::{AGENT_NS, OPERATOR_NS, api, apply, get, policy, policy_spec, release, start};
use fleetgate::apply::ApplyError;
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
        // A ConfigMap of ~900 KB of random base64 (which gzip shrinks only to ~680 KB) makes the
        // snapshot span two Secrets.
        let noise: Vec<u8> = (0..675_000).map(|_| rand::random::<u8>()).collect();
        let big = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big, namespace: redis-system}}\ndata: {{blob: {}}}\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, noise)
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

        let restored = engine.restore(&snap.id, &policy()).await.expect("restore");
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
        assert!(engine.restore(&snap.id, &policy()).await.is_err());
    })
    .await
    .expect("test finishes in time");
}

/// The snapshot's Secrets as an admin (or anyone granted Secrets in the agent's namespace)
/// can edit them: the index and the single chunk of snapshot `id`.
async fn snapshot_secrets(client: &kube::Client, id: &str) -> (Api<Secret>, Secret, Secret) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), AGENT_NS);
    let all = secrets.list(&ListParams::default().labels(&format!("{LABEL_SNAPSHOT}={id}"))).await.unwrap();
    let (index, chunks): (Vec<_>, Vec<_>) =
        all.items.into_iter().partition(|s| s.metadata.name.as_deref().is_some_and(|n| n.ends_with(id)));
    assert_eq!((index.len(), chunks.len()), (1, 1), "one index and one chunk");
    (secrets, index.into_iter().next().unwrap(), chunks.into_iter().next().unwrap())
}

/// The snapshot's integrity is authenticated by a MAC under the agent's key, not a hash anyone
/// could recompute: an edited chunk — even one whose stored hash an editor updated — and a
/// snapshot relabelled as another release's are refused, and nothing is restored.
#[tokio::test]
async fn an_edited_snapshot_is_refused_by_its_mac() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("snapshot-mac").await;
        let client = cluster.client();
        apply(&engine, &release("v1", "rel-v1", &[]), &policy()).await.expect("v1 applies");
        let snap = engine.snapshot().await.expect("snapshot").expect("a release is applied");
        apply(&engine, &release("v2", "rel-v2", &[]), &policy()).await.expect("v2 applies");
        assert_eq!(replicas(&client, "sample").await, 3);

        // The key is a Secret of the agent's namespace, made on first use.
        let secrets: Api<Secret> = Api::namespaced(client.clone(), AGENT_NS);
        let key = secrets.get(&format!("{}-snapshot-key", engine.options().inventory)).await.expect("agent key");
        assert_eq!(key.data.unwrap()["key"].0.len(), 32);

        // Edit the chunk: sample's replicas 1 → 7.
        let (secrets, index, mut chunk) = snapshot_secrets(&client, &snap.id).await;
        let data = chunk.data.as_mut().unwrap().get_mut("objects.json").unwrap();
        let stored = data.0.clone();
        let text = gunzip(&stored);
        let edited = text.replacen("\"replicas\":1", "\"replicas\":7", 1);
        assert_ne!(text, edited, "the snapshot holds sample's replicas");
        data.0 = gzip(&edited);
        let name = chunk.metadata.name.clone().unwrap();
        secrets.replace(&name, &PostParams::default(), &chunk).await.expect("edit the chunk");
        let err = engine.restore(&snap.id, &policy()).await.expect_err("an edited snapshot is refused");
        assert!(matches!(err, ApplyError::SnapshotUnauthenticated { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&format!("snapshot {} (labelled as rel-v1's) does not verify", snap.id)),
            "{err}"
        );
        assert_eq!(replicas(&client, "sample").await, 3, "nothing restored");

        // Put the content back but label it as another release's: refused too (the MAC covers it).
        data_back(&secrets, &name, stored).await;
        let mut relabelled = index.clone();
        relabelled.metadata.labels.as_mut().unwrap().insert("fleetgate.io/release".into(), "rel-v2".into());
        secrets.replace(index.metadata.name.as_deref().unwrap(), &PostParams::default(), &relabelled).await.unwrap();
        let err = engine.restore(&snap.id, &policy()).await.expect_err("a relabelled snapshot is refused");
        assert!(
            matches!(err, ApplyError::SnapshotUnauthenticated { ref release, .. } if release == "rel-v2"),
            "{err:?}"
        );

        // Untouched, it restores.
        let fresh = secrets.get(index.metadata.name.as_deref().unwrap()).await.unwrap();
        let mut original = index.clone();
        original.metadata.resource_version = fresh.metadata.resource_version;
        secrets.replace(index.metadata.name.as_deref().unwrap(), &PostParams::default(), &original).await.unwrap();
        engine.restore(&snap.id, &policy()).await.expect("the agent's own snapshot restores");
        assert_eq!(replicas(&client, "sample").await, 1);
    })
    .await
    .expect("test finishes in time");
}

async fn data_back(secrets: &Api<Secret>, name: &str, stored: Vec<u8>) {
    let mut chunk = secrets.get(name).await.unwrap();
    chunk.data.as_mut().unwrap().insert("objects.json".into(), k8s_openapi::ByteString(stored));
    secrets.replace(name, &PostParams::default(), &chunk).await.unwrap();
}

/// A snapshot chunk's JSON, as an editor reads it (snapshots are stored gzipped).
fn gunzip(stored: &[u8]) -> String {
    use std::io::Read;
    let mut text = String::new();
    flate2::read::GzDecoder::new(stored).read_to_string(&mut text).expect("a gzipped snapshot chunk");
    text
}

/// `text` gzipped, as an editor writes it back: a valid stream, so only the MAC can tell.
fn gzip(text: &str) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(text.as_bytes()).unwrap();
    enc.finish().unwrap()
}

/// Restore runs the admission policy like an apply: a snapshot holding a ClusterRoleBinding to
/// cluster-admin (applied when the policy allowed it, since narrowed) is refused as a whole, while
/// the custom resources of the snapshot's CRDs — users' data — are not judged by it.
#[tokio::test]
async fn a_snapshot_with_a_forbidden_object_is_refused_by_admission() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("snapshot-admission").await;
        let client = cluster.client();
        let binding = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: redis-operator-admin}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\nsubjects: [{kind: ServiceAccount, name: redis-operator, namespace: redis-system}]\n";
        let mut permissive = policy_spec();
        permissive.allow_cluster_admin_bindings = true;
        let permissive = fleetgate::manifests::AdmissionPolicy::baseline(permissive);
        let extra = [("operator/admin.yaml", binding)];
        apply(&engine, &release("v1", "rel-v1", &extra), &permissive).await.expect("v1 applies under the permissive policy");
        let snap = engine.snapshot().await.expect("snapshot").expect("a release is applied");
        apply(&engine, &release("v2", "rel-v2", &extra), &permissive).await.expect("v2 applies");
        assert_eq!(replicas(&client, "sample").await, 3);

        let err = engine.restore(&snap.id, &policy()).await.expect_err("the policy refuses the binding");
        let ApplyError::Admission(refusal) = &err else { panic!("not an admission refusal: {err:?}") };
        let refused: Vec<String> = refusal.violations.iter().map(|v| v.object.to_string()).collect();
        assert!(refused.len() == 1 && refused[0].contains("ClusterRoleBinding") && refused[0].contains("redis-operator-admin"), "{err}");
        assert!(err.to_string().contains(&format!("snapshot {}", snap.id)), "names where it came from: {err}");
        assert_eq!(replicas(&client, "sample").await, 3, "nothing restored");

        // Under the policy it was applied with, the same snapshot restores (custom resources too).
        engine.restore(&snap.id, &permissive).await.expect("restores under the permissive policy");
        assert_eq!(replicas(&client, "sample").await, 1);
    })
    .await
    .expect("test finishes in time");
}
