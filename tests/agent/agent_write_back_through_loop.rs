//! With write-back (on by default; the harness opts in), the agent that rolled a release back
//! pushes a commit to the fleet repo's server pinning its cluster to the release it rolled back
//! to, so Git says again what runs; the next pass then finds the cluster up to date.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate_testenv::git_in;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_is_written_back_to_the_tracked_branch() {
    let fleet = Fleet::start("agent-writeback", true).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let settings = fleetgate::agent::AgentSettings { write_back: Some(true), ..fleet.settings() };
    let mut agent = fleet.agent_with(settings).await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    fleet.set_gates("4s", FAILING_GATES);
    fleet.release("rel-2", |_| {});
    fleet.promote("rel-2");
    let before = fleet.git(&["rev-parse", "main"]);
    assert_eq!(
        within("rel-2", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) }
    );

    // The daemon's main moved on by one commit of the agent's, on top of the promotion.
    fleet.git(&["pull", "-q", "--ff-only", "origin", "main"]);
    assert_eq!(fleet.git(&["rev-parse", "HEAD~1"]), before);
    let message = fleet.git(&["log", "-1", "--format=%B"]);
    assert!(message.starts_with("fleetgate: roll cluster-a back to rel-1"), "{message}");
    assert!(message.contains("Fleetgate-Release: rel-2"), "{message}");
    assert!(message.contains("Fleetgate-Rolled-Back-To: rel-1"), "{message}");
    let changed = git_in(&fleet.work, &["diff", "--name-only", "HEAD~1", "HEAD"]);
    assert_eq!(changed, "clusters/cluster-a.yaml");
    let pin = std::fs::read_to_string(fleet.work.join("clusters/cluster-a.yaml")).unwrap();
    assert!(pin.lines().any(|l| l.trim() == "release: rel-1"), "{pin}");

    // Git now asks for what runs: nothing to do, and rel-2's rejection is forgotten.
    assert_eq!(within("after", 60, agent.reconcile()).await.unwrap(), Outcome::UpToDate);
    let state = fleet.state().await;
    assert_eq!((state.desired(), state.current()), (Some("rel-1"), Some("rel-1")));
}
