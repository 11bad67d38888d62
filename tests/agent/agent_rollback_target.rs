//! Where a rollback goes, against a real cluster: never to a release this cluster did not run
//! successfully, whatever the failed release's signed `rollbackTo` says; and with no earlier
//! release at all, the failed release's workloads and webhooks go while its CRDs stay.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate::status::State;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;

/// The example: the canary halted rel-2, so this cluster never ran it; rel-3 names rel-2
/// as `rollbackTo` and fails here. The cluster goes back to rel-1, its own last-known-good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_to_a_release_that_never_ran_here_goes_to_last_known_good() {
    let fleet = Fleet::start("rb-target", true).await;
    fleet.set_gates("20s", STRICT_RESTARTS);
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    fleet.release("rel-2", |_| {});
    let rel3 = fleet.release_with(&["--rollback-to", "rel-2"], "rel-3", crash_looping);
    fleet.promote("rel-3");
    assert_eq!(
        within("rel-3", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-3".into(), to: Some("rel-1".into()) }
    );
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    let failure = fleet.statuses(&rel3).pop().unwrap();
    assert_eq!((failure.state, failure.rollback_to.as_deref()), (State::Failure, Some("rel-1")));
    assert!(failure.description.starts_with("rolled back to rel-1: pod-restarts"), "{}", failure.description);
    let events = fleet.events_json().await;
    assert!(events.contains("its rollbackTo rel-2 never succeeded here; rollback target: rel-1"), "{events}");
}

/// The first release here fails: nothing to return to. Its Deployment and webhook configuration
/// are removed (a crash-looping controller and a webhook without a backend), its CRD stays, and
/// the status says what was done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_release_loses_its_workloads_and_webhooks_and_keeps_its_crds() {
    let fleet = Fleet::start("rb-first", true).await;
    fleet.set_gates("20s", STRICT_RESTARTS);
    let rel1 = fleet.release("rel-1", crash_looping);
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(
        within("rel-1", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-1".into(), to: None }
    );

    assert_eq!(fleet.operator_image().await, None, "the Deployment is gone");
    let client = fleet.cluster.client();
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    assert!(webhooks.get_opt("redis-operator").await.unwrap().is_none(), "the webhook configuration is gone");
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    assert!(crds.get_opt("redisclusters.cache.example.com").await.unwrap().is_some(), "the CRD stays");

    let failure = fleet.statuses(&rel1).pop().unwrap();
    assert_eq!((failure.state, failure.rollback_to.as_deref()), (State::Failure, None));
    assert!(
        failure
            .description
            .starts_with("workloads and webhooks removed (no earlier release succeeded here): pod-restarts"),
        "{}",
        failure.description
    );
    // The next pass leaves the rejected release alone.
    assert_eq!(within("again", 60, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-1".into()));
    assert_eq!(fleet.operator_image().await, None);
}

/// rel-3 names rel-1 as its `rollbackTo`, but ran on top of rel-2: its snapshot holds rel-2's
/// objects. Restoring it after going back to rel-1 would leave the cluster part rel-1, part
/// rel-2, so the agent applies rel-1 and skips the restore, saying so; afterwards the live
/// objects equal rel-1's manifests (`fleetgate diff --release rel-1` finds no drift).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_another_release_is_not_restored_over_the_target() {
    let fleet = Fleet::start("rb-mixed", true).await;
    fleet.set_gates("20s", STRICT_RESTARTS);
    let mut agent = fleet.agent().await;
    for id in ["rel-1", "rel-2"] {
        fleet.release(id, |_| {});
        fleet.promote(id);
        assert_eq!(within(id, 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded(id.into()));
    }
    fleet.release_with(&["--rollback-to", "rel-1"], "rel-3", crash_looping);
    fleet.promote("rel-3");
    assert_eq!(
        within("rel-3", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-3".into(), to: Some("rel-1".into()) }
    );
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")), "not rel-2's Deployment from the snapshot");
    let events = fleet.events_json().await;
    assert!(events.contains("SnapshotSkipped") && events.contains("holds rel-2's objects, not rel-1's"), "{events}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["diff", "--repo", &fleet.url, "--cluster", CLUSTER, "--release", "rel-1", "--kubeconfig"])
        .arg(fleet.cluster.kubeconfig_path())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
