//! Attack on `promotions: signed`: every branch tip must be a commit signed by a promotion key.
//! Someone who can push, but holds no key, cannot sign — but can force-push the branch back to an
//! *older signed* commit, replaying an old configuration (an old release, old gates). The agent
//! accepts only tips that descend from the last tip it accepted, and never an unsigned one.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::{AgentSettings, Outcome};
use fleetgate::model::PromotionMode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_push_to_an_older_signed_commit_is_refused() {
    let fleet = Fleet::start("atk-force", false).await;
    let settings = AgentSettings { promotions: Some(PromotionMode::Signed), ..fleet.settings() };
    let mut agent = fleet.agent_with(settings.clone()).await;

    fleet.release("rel-1", |_| {});
    fleet.promote_signed("rel-1");
    let old_tip = fleet.tip();
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    fleet.release("rel-2", |_| {});
    fleet.promote_signed("rel-2");
    let accepted = fleet.tip();
    assert_eq!(within("rel-2", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-2".into()));

    // Replay: the older signed tip, force-pushed.
    fleet.force_push(&old_tip);
    let err = within("replay", 60, agent.pass()).await.unwrap_err();
    assert_eq!(err.reason(), "PromotionRefused");
    let message = fleetgate::model::error_chain(&err);
    assert!(message.contains("does not descend from"), "{message}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-2")), "the cluster stays on rel-2");
    let events = fleet.events_json().await;
    assert!(events.contains("PromotionRefused"), "no Event says why: {events}");

    // A restarted agent (fresh Git cache) remembers the accepted tip in its state.
    drop(agent);
    let mut agent = fleet.agent_with(settings).await;
    assert_eq!(within("restarted", 60, agent.reconcile()).await.unwrap_err().reason(), "PromotionRefused");

    // An unsigned commit on top of the accepted tip is refused as well.
    fleet.force_push(&accepted);
    fleet.promote("rel-1");
    let err = within("unsigned", 60, agent.reconcile()).await.unwrap_err();
    assert!(fleetgate::model::error_chain(&err).contains("not signed by a promotion key"), "{err:?}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-2")));
}
