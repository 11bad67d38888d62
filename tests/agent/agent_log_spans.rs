//! Every log line of an agent pass says which cluster, release and pass it belongs to: the real
//! agent process, as deployed with JSON logs (`--log-format json`, `--log=fleetgate=debug`), runs
//! rel-1 to `success` on a real API server from the fleet repo on a real `git daemon`; every line
//! the pipeline wrote carries the span `pass` with `cluster`, `release` and a pass id.

use crate::agent_support;

use agent_support::*;
use fleetgate::status::State;
use fleetgate_testenv::process::{Guarded, free_port};
use fleetgate_testenv::wait::eventually;
use std::collections::BTreeSet;

/// Targets of the code a pass runs (the loop, the pipeline stages, statuses, the source).
const PIPELINE: [&str; 7] = [
    "fleetgate::agent::reconcile",
    "fleetgate::agent::rollback",
    "fleetgate::apply",
    "fleetgate::gates",
    "fleetgate::release",
    "fleetgate::source",
    "fleetgate::status",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_line_of_a_pass_carries_its_cluster_release_and_pass_id() {
    let fleet = Fleet::start("agent-log-spans", false).await;
    let commit = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let log = fleet.dir.path().join("agent.log");
    let mut cmd = fleet.agent_command("agent-json", free_port(), 15, false);
    cmd.args(["--log-format", "json", "--log", "fleetgate=debug", "--heartbeat-interval", "0s"]);
    let agent = Guarded::spawn("agent-json", cmd, &log).unwrap();
    eventually("rel-1 to succeed", 120, || async {
        fleet.statuses(&commit).iter().any(|s| s.state == State::Success).then_some(())
    })
    .await;
    drop(agent);

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let mut passes = BTreeSet::new();
    let mut releases = BTreeSet::new();
    let mut checked = 0;
    for line in &lines {
        let target = line["target"].as_str().unwrap_or_default();
        if !PIPELINE.iter().any(|p| target.starts_with(p)) {
            continue;
        }
        checked += 1;
        let span = &line["span"];
        assert_eq!(span["name"], "pass", "a pipeline line outside a pass: {line}");
        assert_eq!(span["cluster"], CLUSTER, "{line}");
        let release = span["release"].as_str().unwrap_or_else(|| panic!("no release: {line}"));
        let pass = span["pass"].as_str().unwrap_or_else(|| panic!("no pass id: {line}"));
        assert!(pass.len() == 8 && pass.chars().all(|c| c.is_ascii_hexdigit()), "{line}");
        releases.insert(release.to_string());
        passes.insert(pass.to_string());
    }
    println!("{checked} pipeline lines in {} passes, releases {releases:?}", passes.len());
    assert!(checked > 10, "the pass logged its steps: {text}");
    assert!(releases.contains("rel-1"), "{releases:?}");
    // Lines of rel-1's apply and bake name it (the start of the very first pass knows none yet).
    let applying = lines
        .iter()
        .filter(|l| l["fields"]["message"].as_str().is_some_and(|m| m.contains("rel-1")))
        .filter(|l| l["span"]["name"] == "pass")
        .collect::<Vec<_>>();
    assert!(!applying.is_empty(), "{text}");
    assert!(applying.iter().all(|l| l["span"]["release"] == "rel-1"), "{applying:?}");
}
