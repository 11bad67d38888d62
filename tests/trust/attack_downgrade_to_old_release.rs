//! Attack: someone who can push, but holds no key, points `spec.release` back at an old signed
//! release (say, one with a known vulnerability). It verifies, and it already has `success`
//! statuses, so nothing else would stop it. The agent refuses a move to a release older than
//! the newest it ran successfully unless the move is signed; the one exception is the newest
//! release's own signed `rollbackTo` (reverting the last promotion).

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::{Agent, Outcome};
use fleetgate::status::State;

/// rel-1, rel-2 and rel-3 cut, promoted and run in turn; their tagged commits.
async fn run_three_releases(fleet: &Fleet, agent: &mut Agent) -> Vec<String> {
    let mut commits = Vec::new();
    for id in ["rel-1", "rel-2", "rel-3"] {
        commits.push(fleet.release(id, |_| {}));
        fleet.promote(id);
        assert_eq!(within(id, 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded(id.into()));
    }
    commits
}

/// rel-1 runs; rel-2 is cut and never promoted.
async fn run_rel1_and_cut_rel2(fleet: &Fleet, agent: &mut Agent) {
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    fleet.release("rel-2", |_| {});
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsigned_move_back_to_an_old_release_is_refused_with_the_reason() {
    let fleet = Fleet::start("atk-downgrade", false).await;
    let mut agent = fleet.agent().await;
    let commits = run_three_releases(&fleet, &mut agent).await;

    // Two releases back: refused, nothing applied, the reason in rel-1's status for this cluster.
    fleet.promote("rel-1");
    let Outcome::Refused { release, reason } = within("rel-1 again", 60, agent.reconcile()).await.unwrap() else {
        panic!("the downgrade was not refused")
    };
    assert_eq!(release, "rel-1");
    assert!(reason.contains("older than rel-3"), "{reason}");
    let status = fleet.statuses(&commits[0]).pop().unwrap();
    assert_eq!(status.state, State::Error);
    assert!(status.description.contains("needs a signed decision"), "{}", status.description);
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-3")));
    assert_eq!(within("after", 30, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-1".into()));

    // Reverting the last promotion (rel-3's signed rollbackTo is rel-2) needs no signature...
    fleet.promote("rel-2");
    assert_eq!(within("rel-2", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-2".into()));
    // ...but walking on back one more step does: rel-3 is still the newest this cluster ran.
    fleet.promote("rel-1");
    assert!(matches!(within("rel-1", 60, agent.reconcile()).await.unwrap(), Outcome::Rejected(r) if r == "rel-1"));

    // A promotion commit signed by a promotion key is the signed decision that allows it.
    fleet.promote_signed("rel-1");
    assert_eq!(within("signed", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_release_never_runs_again_even_when_signed() {
    let fleet = Fleet::start("atk-revoked", false).await;
    let mut agent = fleet.agent().await;
    run_rel1_and_cut_rel2(&fleet, &mut agent).await;
    // rel-3 withdraws rel-2 (e.g. a vulnerable build) before any cluster ran it.
    fleet.release_with(&["--revokes", "rel-2"], "rel-3", |_| {});

    fleet.promote_signed("rel-2");
    let Outcome::Refused { reason, .. } = within("rel-2", 60, agent.reconcile()).await.unwrap() else {
        panic!("the revoked release was not refused")
    };
    assert!(reason.contains("revoked by the signed release rel-3"), "{reason}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    fleet.promote("rel-3");
    assert_eq!(within("rel-3", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-3".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_signed_commit_pushed_again_is_no_signed_decision() {
    let fleet = Fleet::start("atk-replay", false).await;
    let mut agent = fleet.agent().await;
    let commits = run_three_releases(&fleet, &mut agent).await;
    let tip = fleet.tip();

    // rel-2's release commit is signed by the release key, and its fleet.yaml still asks for
    // rel-1. Force-pushed back as main, it is an old decision replayed: unsigned, so the move
    // two releases back is refused and rel-3 keeps running.
    fleet.force_push(&commits[1]);
    let outcome = within("replay", 60, agent.reconcile()).await.unwrap();
    let Outcome::Refused { release, reason } = outcome else { panic!("the replayed commit was obeyed: {outcome:?}") };
    assert_eq!(release, "rel-1");
    assert!(reason.contains("needs a signed decision"), "{reason}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-3")));
    assert_eq!(fleet.state().await.trust().accepted_tip.as_deref(), Some(tip.as_str()), "the mark never moves back");

    // A new signed decision on top of the real history still counts, and clears the refusal.
    fleet.force_push(&tip);
    fleet.promote_signed("rel-1");
    assert_eq!(within("signed", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_once_seen_survives_the_deletion_of_the_revoking_tag() {
    let fleet = Fleet::start("atk-revoke-erased", false).await;
    let mut agent = fleet.agent().await;
    run_rel1_and_cut_rel2(&fleet, &mut agent).await;
    fleet.release_with(&["--revokes", "rel-2"], "rel-3", |_| {});
    fleet.promote("rel-3");
    assert_eq!(within("rel-3", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-3".into()));

    // The pusher deletes the revoking tag, then asks for rel-2 (even with a signed decision).
    fleet.git(&["push", "-q", "origin", ":refs/tags/rel-3"]);
    fleet.git(&["tag", "-d", "rel-3"]);
    fleet.promote_signed("rel-2");
    let outcome = within("rel-2", 60, agent.reconcile()).await.unwrap();
    let Outcome::Refused { release, reason } = outcome else { panic!("the revoked release ran: {outcome:?}") };
    assert_eq!(release, "rel-2");
    assert!(reason.contains("revoked by the signed release rel-3"), "{reason}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-3")));
    assert_eq!(fleet.state().await.trust().revoked.get("rel-2").map(String::as_str), Some("rel-3"));
}
