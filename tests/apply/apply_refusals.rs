//! Releases the engine refuses before changing anything: an admission-policy violation and a
//! server-side dry-run failure each leave the cluster exactly as it was (every object and its
//! resourceVersion compared before and after).

use crate::apply_support;

use apply_support::{apply, cluster_state, policy, release, start};
use fleetgate::apply::ApplyError;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

const CLUSTER_ADMIN_BINDING: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: redis-operator-admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: redis-operator, namespace: redis-system}]
";

const KUBE_SYSTEM_CONFIG: &str = "apiVersion: v1
kind: ConfigMap
metadata: {name: redis-hook, namespace: kube-system}
data: {a: b}
";

#[tokio::test]
async fn admission_violation_leaves_the_cluster_untouched() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("refuse-policy").await;
        let client = cluster.client();
        let before = cluster_state(&client).await;
        let bad = release(
            "v1",
            "rel-bad",
            &[("operator/admin.yaml", CLUSTER_ADMIN_BINDING), ("operator/extra.yaml", KUBE_SYSTEM_CONFIG)],
        );
        let err = apply(&engine, &bad, &policy()).await.expect_err("the policy refuses the release");
        let ApplyError::Admission(refusal) = &err else { panic!("expected an admission refusal, got {err}") };
        let named: Vec<String> = refusal.violations.iter().map(|v| v.object.to_string()).collect();
        assert_eq!(
            named,
            ["ClusterRoleBinding.rbac.authorization.k8s.io redis-operator-admin", "ConfigMap kube-system/redis-hook"]
        );
        let text = err.to_string();
        assert!(text.contains("binds ClusterRole cluster-admin"), "{text}");
        assert!(text.contains("namespace kube-system is not in allowedNamespaces"), "{text}");
        assert!(engine.inventory().await.unwrap().is_none());
        assert_eq!(cluster_state(&client).await, before, "nothing was created or changed");
    })
    .await
    .expect("test finishes in time");
}

/// A Deployment the API server's validation refuses, and a Service with an impossible port.
const BROKEN: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: broken, namespace: redis-system}
spec:
  replicas: -1
  selector: {matchLabels: {app: broken}}
  template:
    metadata: {labels: {app: broken}}
    spec: {containers: [{name: c, image: 'example/broken:1'}]}
---
apiVersion: v1
kind: Service
metadata: {name: broken, namespace: redis-system}
spec:
  ports: [{port: 70000}]
";

/// The RedisCluster of the release, over the CRD's `maximum: 9`.
const SAMPLE_OVER_SCHEMA: &str = "apiVersion: cache.example.com/v1alpha2
kind: RedisCluster
metadata: {name: sample, namespace: redis-system}
spec: {replicas: 20}
";

#[tokio::test]
async fn dry_run_failures_are_all_reported_and_leave_the_cluster_untouched() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("refuse-dryrun").await;
        let client = cluster.client();
        apply(&engine, &release("v1", "rel-v1", &[]), &policy()).await.expect("v1 applies");
        let before = cluster_state(&client).await;

        // v2 changes the Deployment and adds and drops objects, but three of its objects are
        // refused: the Deployment and Service by validation, the custom resource by its CRD's
        // schema (the CRD does not change, so it is checked up front too).
        let bad =
            release("v2", "rel-v2", &[("operator/broken.yaml", BROKEN), ("operator/sample.yaml", SAMPLE_OVER_SCHEMA)]);
        let err = apply(&engine, &bad, &policy()).await.expect_err("the dry run refuses the release");
        let ApplyError::DryRun(failures) = &err else { panic!("expected a dry-run refusal, got {err}") };
        let named: Vec<String> = failures.iter().map(|f| f.object.to_string()).collect();
        assert_eq!(
            named,
            [
                "Service redis-system/broken",
                "Deployment.apps redis-system/broken",
                "RedisCluster.cache.example.com redis-system/sample",
            ]
        );
        let text = err.to_string();
        assert!(text.contains("operator/broken.yaml (document 1)"), "{text}");
        assert!(text.contains("spec.replicas"), "{text}");
        assert!(text.contains("nothing was applied"), "{text}");

        assert_eq!(cluster_state(&client).await, before, "v1 stays exactly as it was");
        assert_eq!(engine.inventory().await.unwrap().unwrap().release, "rel-v1");
    })
    .await
    .expect("test finishes in time");
}
