//! Attack: two fleets trust the same release key. Someone who can push to this fleet's repo, but
//! holds no key, pushes a release tag signed for the *other* fleet and asks for it (renaming the
//! fleet on the branch tip to match). Releases name their fleet in what is signed, and the agent
//! holds the fleet's name from its configuration (`--fleet`) or, with `--pin-first-fleet`, from
//! the first release it accepted, so the tag is refused. A new agent given neither does not start:
//! the push would otherwise reach it before any name is pinned, and choose it.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::services::StartError;
use fleetgate::agent::{AgentServices, AgentSettings, Outcome};
use fleetgate::status::State;

/// The other fleet's release `rel-payments-9`, cut with the same key on a branch of its own and
/// pushed as a tag; then the push to this fleet's branch that renames the fleet to match and asks
/// for it. Returns the foreign release's commit.
fn push_foreign_release(fleet: &Fleet) -> String {
    fleet.git(&["checkout", "-q", "-b", "payments"]);
    fleet.edit("fleet.yaml", "name: redis-fleet", "name: payments-fleet");
    fleet.git(&["commit", "-q", "-am", "the payments fleet"]);
    let foreign = fleet.release("rel-payments-9", |_| {});
    fleet.git(&["checkout", "-q", "main"]);
    fleet.edit("fleet.yaml", "name: redis-fleet", "name: payments-fleet");
    fleet.promote("rel-payments-9");
    foreign
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_signed_for_another_fleet_is_refused_by_the_name_pinned_from_the_first_release() {
    let fleet = Fleet::start("atk-foreign", false).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    // The opt-in: no --fleet, the name taken from the first release accepted (rel-1, this fleet's).
    let settings = AgentSettings { fleet: None, pin_first_fleet: Some(true), ..fleet.settings() };
    let mut agent = fleet.agent_with(settings).await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    assert_eq!(fleet.state().await.trust().fleet.as_deref(), Some(FLEET_NAME), "pinned from rel-1");

    let foreign = push_foreign_release(&fleet);

    let Outcome::Refused { release, reason } = within("foreign", 60, agent.reconcile()).await.unwrap() else {
        panic!("the foreign release was not refused")
    };
    assert_eq!(release, "rel-payments-9");
    assert!(reason.contains("belongs to fleet payments-fleet, not redis-fleet"), "{reason}");
    let status = fleet.statuses(&foreign).pop().unwrap();
    assert_eq!(status.state, State::Error);
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_before_a_new_agent_first_syncs_cannot_choose_its_fleet() {
    let fleet = Fleet::start("atk-foreign-new", false).await;
    fleet.release("rel-1", |_| {});
    // The push lands before any agent of this cluster ran: nothing is pinned yet.
    let foreign = push_foreign_release(&fleet);

    // Told nothing, the agent refuses to start rather than take the name the push wrote.
    let unnamed = AgentSettings { fleet: None, ..fleet.settings() }.resolve().unwrap();
    let Err(refused) = within("agent services start", 60, AgentServices::start(unnamed)).await else {
        panic!("an agent with no fleet and none pinned started")
    };
    assert!(matches!(refused, StartError::FleetNotGiven { .. }), "{refused:?}");
    let message = refused.to_string();
    assert!(message.contains("--fleet NAME") && message.contains("--pin-first-fleet"), "says what to do: {message}");
    assert_eq!(fleet.operator_image().await, None, "nothing ran");

    // Given its fleet, the new agent refuses the foreign release and runs nothing.
    let mut agent = fleet.agent().await;
    let Outcome::Refused { release, reason } = within("foreign", 60, agent.reconcile()).await.unwrap() else {
        panic!("the foreign release was not refused")
    };
    assert_eq!(release, "rel-payments-9");
    assert!(reason.contains("belongs to fleet payments-fleet, not redis-fleet"), "{reason}");
    assert_eq!(fleet.statuses(&foreign).pop().map(|s| s.state), Some(State::Error));
    assert_eq!(fleet.operator_image().await, None, "the foreign release was not applied");
    assert_eq!(fleet.state().await.trust().fleet, None, "a refused release pins no name");
}
