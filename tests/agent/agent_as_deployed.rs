//! The agent as a spoke runs it (issue 14): `deploy/` applied to a real cluster with workloads,
//! the agent authenticated as the `fleetgate-agent` ServiceAccount with a TokenRequest token — so
//! it holds exactly deploy/'s RBAC — runs two releases and a rollback. The second release is the
//! first with a pre-apply snapshot (Secrets in `fleetgate-system`), the third crash-loops and is
//! rolled back with that snapshot's objects; a RedisCluster created meanwhile survives.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate_testenv::AgentIdentity;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_releases_and_a_rollback_as_the_service_account_with_deploys_rbac() {
    let fleet = Fleet::start("as-deployed", true).await;

    // The agent's client is the ServiceAccount, not the harness's admin.
    let review = within(
        "self-subject review",
        30,
        Api::<SelfSubjectReview>::all(fleet.agent_identity.client())
            .create(&PostParams::default(), &Default::default()),
    )
    .await
    .unwrap();
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    assert_eq!(user.username, Some(AgentIdentity::username()));
    assert!(!user.groups.unwrap_or_default().iter().any(|g| g == "system:masters"));

    // A crash-looping Operator restarts, and its rollout never completes: either fails rel-3.
    fleet.set_gates(
        "10s",
        "    - name: available\n      deploymentAvailable: {}\n    - name: pod-restarts\n      podRestarts: {max: 1}\n",
    );
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 180, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cache.example.com", "v1alpha2", "RedisCluster"),
        "redisclusters",
    );
    let caches: Api<DynamicObject> = Api::namespaced_with(fleet.cluster.client(), OPERATOR_NS, &ar);
    let cache: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha2", "kind": "RedisCluster",
        "metadata": {"name": "cache", "namespace": OPERATOR_NS}, "spec": {"size": 3},
    }))
    .unwrap();
    caches.create(&PostParams::default(), &cache).await.unwrap();

    fleet.release("rel-2", |_| {});
    fleet.promote("rel-2");
    assert_eq!(within("rel-2", 180, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-2".into()));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-2")));
    // rel-2 was applied over rel-1: the agent snapshotted rel-1's objects into its namespace.
    let secrets: Api<Secret> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    let snapshots = secrets.list(&ListParams::default()).await.unwrap().items;
    assert!(!snapshots.is_empty(), "no snapshot Secret in {AGENT_NS}");

    fleet.release("rel-3", crash_looping);
    fleet.promote("rel-3");
    let outcome = within("rel-3", 240, agent.reconcile()).await.unwrap();
    assert_eq!(outcome, Outcome::RolledBack { release: "rel-3".into(), to: Some("rel-2".into()) });
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-2")));
    assert!(caches.get_opt("cache").await.unwrap().is_some(), "the RedisCluster survived the rollback");

    let commit = fleet.git(&["rev-parse", "rel-3^{commit}"]);
    let last = fleet.statuses(&commit).pop().expect("a status for rel-3");
    assert_eq!(last.state, fleetgate::status::State::Failure, "{last:?}");
    assert_eq!(within("again", 60, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-3".into()));
}
