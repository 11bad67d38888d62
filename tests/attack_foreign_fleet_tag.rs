//! Attack: two fleets trust the same release key. Someone who can push to this fleet's repo, but
//! holds no key, pushes a release tag signed for the *other* fleet and asks for it (renaming the
//! fleet on the branch tip to match). Releases name their fleet in what is signed, and the agent
//! pinned this fleet's name when it accepted its first release, so the tag is refused.

mod agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate::status::State;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_signed_for_another_fleet_is_refused() {
    let fleet = Fleet::start("atk-foreign", false).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    // The other fleet's release, cut with the same key on a branch of its own, pushed as a tag.
    fleet.git(&["checkout", "-q", "-b", "payments"]);
    fleet.edit("fleet.yaml", "name: redis-fleet", "name: payments-fleet");
    fleet.git(&["commit", "-q", "-am", "the payments fleet"]);
    let foreign = fleet.release("rel-payments-9", |_| {});
    fleet.git(&["checkout", "-q", "main"]);
    // The push to this fleet's branch: rename the fleet to match, ask for the foreign release.
    fleet.edit("fleet.yaml", "name: redis-fleet", "name: payments-fleet");
    fleet.promote("rel-payments-9");

    let Outcome::Refused { release, reason } = within("foreign", 60, agent.reconcile()).await.unwrap() else {
        panic!("the foreign release was not refused")
    };
    assert_eq!(release, "rel-payments-9");
    assert!(reason.contains("belongs to fleet payments-fleet, not redis-fleet"), "{reason}");
    let status = fleet.statuses(&foreign).pop().unwrap();
    assert_eq!(status.state, State::Error);
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
}
