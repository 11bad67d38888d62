//! The optional rollout wait against a cluster that runs workloads (kube-controller-manager,
//! kube-scheduler, kwok): apply returns once the Deployment is available, and a Deployment that
//! cannot roll out fails the apply with a RolloutTimeout naming it and what it waits for.

use crate::apply_support;

use apply_support::{AGENT_NS, CLUSTER, OPERATOR_NS, apply, policy, release};
use fleetgate::apply::{ApplyError, ApplyOptions, Engine};
use fleetgate_testenv::{ClusterOptions, TestCluster};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(180);

/// The v1 Deployment scheduled nowhere: no node has this label.
const UNSCHEDULABLE: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: redis-operator, namespace: redis-system}
spec:
  replicas: 2
  selector: {matchLabels: {app.kubernetes.io/name: redis-operator}}
  template:
    metadata: {labels: {app.kubernetes.io/name: redis-operator}}
    spec:
      nodeSelector: {fleetgate.io/no-such-node: 'true'}
      containers: [{name: manager, image: 'registry.example.com/redis-operator:v1.2.3-build.456'}]
";

#[tokio::test]
async fn apply_waits_for_rollouts_with_a_timeout() {
    tokio::time::timeout(TIMEOUT, async {
        let cluster =
            TestCluster::start(ClusterOptions::new("apply-rollout").with_workloads(true)).await.expect("cluster");
        let client = cluster.client();
        cluster.create_namespace(AGENT_NS).await.unwrap();
        let mut options = ApplyOptions::for_cluster(AGENT_NS, CLUSTER);
        options.rollout_timeout = Some(Duration::from_secs(90));
        let engine = Engine::new(client.clone(), options.clone());

        apply(&engine, &release("v1", "rel-v1", &[]), &policy()).await.expect("v1 rolls out");
        let d = Api::<Deployment>::namespaced(client.clone(), OPERATOR_NS).get("redis-operator").await.unwrap();
        assert_eq!(
            d.status.and_then(|s| s.available_replicas),
            Some(2),
            "apply returned only once both replicas were available"
        );

        options.rollout_timeout = Some(Duration::from_secs(3));
        let impatient = Engine::new(client.clone(), options);
        let stuck = release("v1", "rel-stuck", &[("operator/deployment.yaml", UNSCHEDULABLE)]);
        let err = apply(&impatient, &stuck, &policy()).await.expect_err("the rollout cannot finish");
        let ApplyError::RolloutTimeout { object, state, .. } = &err else {
            panic!("expected a rollout timeout, got {err}")
        };
        assert_eq!(object.to_string(), "Deployment.apps redis-system/redis-operator");
        assert!(state.contains("replicas"), "{state}");
    })
    .await
    .expect("test finishes in time");
}
