//! Two agent processes for one cluster, as a Deployment with two replicas runs them: only the
//! Lease holder acts; `kill -9` of the leader in the middle of a bake hands the Lease to the
//! standby once the lease has expired, and the new leader finishes the bake in flight (no second
//! apply) and reports `success`. The hand-over time is printed (docs/RELIABILITY.md).

use crate::agent_support;

use agent_support::*;
use fleetgate::status::State;
use fleetgate_testenv::process::{Guarded, free_port};
use fleetgate_testenv::wait::eventually_every;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use std::process::Command;
use std::time::{Duration, Instant};

const LEASE_SECONDS: u64 = 3;

fn replica(fleet: &Fleet, name: &str, port: u16) -> Guarded {
    let cmd = fleet.agent_command(name, port, LEASE_SECONDS, false);
    Guarded::spawn(name, cmd, &fleet.dir.path().join(format!("{name}.log"))).unwrap()
}

fn log_of(fleet: &Fleet, name: &str) -> String {
    std::fs::read_to_string(fleet.dir.path().join(format!("{name}.log"))).unwrap_or_default()
}

async fn holder(fleet: &Fleet) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    leases.get_opt(&format!("fleetgate-agent-{CLUSTER}")).await.ok()??.spec?.holder_identity
}

async fn leader_metric(port: u16) -> Option<String> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.ok()?.text().await.ok()?;
    text.lines()
        .find(|l| l.starts_with("fleetgate_leader{"))
        .and_then(|l| l.split_whitespace().last())
        .map(str::to_string)
}

/// Waits for `probe` at a 50 ms resolution (the hand-over time is reported).
async fn wait_for<T, Fut: std::future::Future<Output = Option<T>>>(
    what: &str,
    secs: u64,
    probe: impl FnMut() -> Fut,
) -> T {
    eventually_every(what, secs, Duration::from_millis(50), probe).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_acts_and_a_killed_leader_hands_its_bake_over() {
    let fleet = Fleet::start("two-replicas", true).await;
    fleet.set_gates("20s", QUICK_GATES);
    let commit = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");

    let ports = [free_port(), free_port()];
    let mut replicas = vec![replica(&fleet, "agent-a", ports[0]), replica(&fleet, "agent-b", ports[1])];
    let lead = wait_for("a leader", 30, || holder(&fleet)).await;
    let (leader, standby) = if lead.starts_with("agent-a_") { (0, 1) } else { (1, 0) };
    assert!(lead.starts_with(["agent-a_", "agent-b_"][leader]), "{lead}");

    // Both replicas start at once (they race to create the state): the standby too comes up and serves.
    let standby_says = wait_for("the standby's /metrics", 60, || leader_metric(ports[standby])).await;
    assert_eq!(standby_says, "0", "the standby does not lead");

    wait_for("the leader baking rel-1", 120, || async {
        (fleet.phase().await.as_deref() == Some("Baking")).then_some(())
    })
    .await;
    assert_eq!(leader_metric(ports[standby]).await.as_deref(), Some("0"), "the standby does not lead");
    let applied_by: Vec<String> = fleet
        .statuses(&commit)
        .iter()
        .filter(|s| s.state == State::Pending && s.description.starts_with("applying"))
        .map(|s| s.description.clone())
        .collect();
    assert_eq!(applied_by.len(), 1, "one apply, by the leader: {applied_by:?}");
    assert!(!log_of(&fleet, ["agent-a", "agent-b"][standby]).contains("applying"), "the standby applied something");

    // kill -9: no step-down, the Lease stays held until it expires.
    let killed = Instant::now();
    let pid = replicas[leader].pid().to_string();
    assert!(Command::new("kill").args(["-9", &pid]).status().unwrap().success());
    let new = wait_for("the standby to take the Lease", 30, || async {
        holder(&fleet).await.filter(|h| h.starts_with(["agent-a_", "agent-b_"][standby]))
    })
    .await;
    let handover = killed.elapsed();
    println!("kill -9 of the leader → {new} holds the Lease: {handover:?} (lease {LEASE_SECONDS}s)");
    assert!(handover >= Duration::from_secs(LEASE_SECONDS) / 2, "taken before the lease could expire: {handover:?}");
    assert_eq!(leader_metric(ports[standby]).await.as_deref(), Some("1"));

    // The new leader finishes the bake in flight: success, and still exactly one apply.
    let done = wait_for("rel-1's success", 120, || async {
        fleet.statuses(&commit).last().filter(|s| s.state == State::Success).cloned()
    })
    .await;
    println!("kill → success reported by the new leader: {:?}", killed.elapsed());
    assert_eq!(done.release, "rel-1");
    let applies = fleet.statuses(&commit).iter().filter(|s| s.description.starts_with("applying")).count();
    assert_eq!(applies, 1, "the new leader resumed the bake instead of applying again");
    let state = fleet.state().await;
    assert_eq!((state.current(), state.last_known_good()), (Some("rel-1"), Some("rel-1")));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    replicas.clear();
}
