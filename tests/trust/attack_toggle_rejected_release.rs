//! Attack: a release failed its gates here and was rolled back, so the cluster rejects it. Someone
//! who can push, but holds no key, toggles `spec.release` A→B→A, hoping the agent forgets that A
//! was rejected. A rejection lasts until a signed decision clears it, so A is not applied again.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toggling_away_and_back_does_not_re_apply_a_rejected_release() {
    let fleet = Fleet::start("atk-toggle", true).await;
    fleet.set_gates("20s", STRICT_RESTARTS);
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    fleet.release("rel-2", crash_looping);
    fleet.promote("rel-2");
    assert_eq!(
        within("rel-2", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) }
    );

    // A → B → A, each pushed and seen by the agent.
    fleet.promote("rel-1");
    assert_eq!(within("B", 60, agent.reconcile()).await.unwrap(), Outcome::UpToDate);
    fleet.promote("rel-2");
    assert_eq!(within("A again", 60, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-2".into()));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")), "rel-2 was not applied again");
    let state = fleet.state().await;
    assert_eq!(state.rejected()["rel-2"].failure.reason, "GateFailed");
    // A restarted agent remembers it too.
    drop(agent);
    let mut agent = fleet.agent().await;
    assert_eq!(within("restarted", 60, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-2".into()));
}
