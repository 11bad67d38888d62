//! A release tag signed by a key the agent does not trust is refused: status `error` naming the
//! reason, nothing applied, and the release is not tried again while Git keeps asking for it.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate::status::State;
use fleetgate_testenv::GpgHome;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_signed_by_an_untrusted_key_is_refused_and_nothing_is_applied() {
    let fleet = Fleet::start("agent-refuse", false).await;
    let mallory = GpgHome::new().unwrap();
    let fpr = mallory.generate_key("Mallory", "mallory@example.com").unwrap();
    let commit = fleet.release_signed_by("rel-1", &mallory, &fpr, |_| {});
    fleet.promote("rel-1");

    let mut agent = fleet.agent().await;
    let outcome = within("reconcile", 60, agent.reconcile()).await.unwrap();
    let Outcome::Refused { release, reason } = &outcome else { panic!("expected a refusal, got {outcome:?}") };
    assert_eq!(release, "rel-1");
    assert!(
        reason.starts_with("tag rel-1 is signed by key") && reason.ends_with("which is not among the trusted keys"),
        "{reason}"
    );

    let statuses = fleet.statuses(&commit);
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    assert_eq!(statuses[0].state, State::Error);
    assert_eq!(statuses[0].description, format!("refused, nothing applied: {reason}"));

    // Nothing reached the cluster: no Operator namespace applied, no Deployment, no applied release.
    assert!(!fleet.namespace_applied(OPERATOR_NS).await, "the release's namespace was applied");
    assert_eq!(fleet.operator_image().await, None);
    let state = fleet.state().await;
    assert_eq!(state.current(), None);
    assert_eq!(state.rejected()["rel-1"].failure.reason, "SignatureInvalid");

    // Git still asks for rel-1: it stays refused and nothing new is reported.
    assert_eq!(within("again", 30, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-1".into()));
    assert_eq!(fleet.statuses(&commit).len(), 1);
}
