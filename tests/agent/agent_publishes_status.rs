//! The agent publishes its statuses as a Git note in `refs/notes/fleetgate/<cluster>` on the fleet
//! repo's server: `pending` when the apply starts and when the bake starts, then `success` with
//! the gate figures, all on the release's tagged commit.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate::status::State;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_passes_its_bake_is_reported_pending_then_success_in_a_git_note() {
    let fleet = Fleet::start("agent-status", false).await;
    let commit = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    assert!(fleet.statuses(&commit).is_empty(), "no status before the agent ran");

    let mut agent = fleet.agent().await;
    let outcome = within("reconcile rel-1", 90, agent.reconcile()).await.unwrap();
    assert_eq!(outcome, Outcome::Succeeded("rel-1".into()));

    let statuses = fleet.statuses(&commit);
    let seen: Vec<(State, &str)> = statuses.iter().map(|s| (s.state, s.description.as_str())).collect();
    assert_eq!(
        seen,
        [
            (State::Pending, "applying rel-1 (from nothing)"),
            (State::Pending, "baking for 3s"),
            (State::Success, "all gates passed for 3s"),
        ]
    );
    let success = statuses.last().unwrap();
    assert_eq!(
        (success.cluster.as_str(), success.release.as_str(), success.commit.as_str()),
        (CLUSTER, "rel-1", commit.as_str())
    );
    assert_eq!(
        success.gates.iter().map(|g| (g.name.as_str(), g.verdict.as_str())).collect::<Vec<_>>(),
        [("pod-restarts", "pass")]
    );
    let (started, applied, decided) =
        (success.started_at.unwrap(), success.applied_at.unwrap(), success.decided_at.unwrap());
    assert!(started <= applied && applied < decided, "{started} {applied} {decided}");
    assert!(decided - applied >= chrono::Duration::seconds(3), "baked for the bake time");

    // The state says rel-1 runs and is good; a second pass has nothing to do and reports nothing new.
    let state = fleet.state().await;
    assert_eq!((state.current(), state.last_known_good()), (Some("rel-1"), Some("rel-1")));
    assert_eq!(within("second pass", 30, agent.reconcile()).await.unwrap(), Outcome::UpToDate);
    assert_eq!(fleet.statuses(&commit).len(), 3);
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
}
