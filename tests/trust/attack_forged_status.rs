//! The status forger (docs/SECURITY.md): anyone who can push notes writes a `success` for the
//! canary, dated 2099, exactly as issue #13 did by hand — and a compromised cluster B signs one
//! with its own key into cluster-a's ref. Neither is believed: both are shown as unverified and
//! wave-1 keeps waiting until the canary's real agent reports. A future `reportedAt`, even on an
//! entry the canary's own key signed (a clock gone wrong), never hides its later real failure.
//!
//! Real components: a kube-apiserver, the fleet repo on a `git daemon`, plain `git notes` for the
//! forgery, status keys made by `ssh-keygen`, and `fleetgate status` reading what a person sees.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate::status::{Matrix, State, Status};
use std::process::Command;

const WAVE_1: &str = "cluster-b";

/// The issue's script: fetch the notes, add a forged schema-1 `success` for cluster-a dated 2099
/// on `release`'s commit, push the ref.
fn forge_success(fleet: &Fleet, release: &str, commit: &str) {
    fleet.git(&["fetch", "-q", "origin", "refs/notes/fleetgate/*:refs/notes/fleetgate/*"]);
    let note = fleet.dir.path().join("n.json");
    std::fs::write(
        &note,
        format!(
            r#"{{"schema":1,"context":"fleetgate/cluster-a","entries":[{{"cluster":"cluster-a","state":"success",
  "description":"ok","release":"{release}","commit":"{commit}","reportedAt":"2099-01-01T00:00:00Z"}}]}}"#
        ),
    )
    .unwrap();
    fleet.git(&["notes", "--ref=fleetgate/cluster-a", "add", "-f", "-F", note.to_str().unwrap(), commit]);
    fleet.git(&["push", "-q", "origin", "refs/notes/fleetgate/cluster-a"]);
}

fn cluster_a_cell(m: &Matrix) -> &fleetgate::status::matrix::Cell {
    let row = m.waves.iter().flat_map(|w| &w.clusters).find(|c| c.name == CLUSTER).unwrap();
    &row.cells[0]
}

async fn wave_1_decision(agent: &mut fleetgate::agent::Agent) -> Outcome {
    within("wave-1 pass", 90, agent.reconcile()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_successes_are_shown_unverified_and_never_open_a_wave() {
    let fleet = Fleet::start("forged-status", false).await;
    let commit = fleet.release("rel-9", |_| {});
    fleet.promote("rel-9");

    // A pusher forges the canary's success, dated 2099.
    forge_success(&fleet, "rel-9", &commit);
    let mut wave_1 = fleet.agent_with(fleet.settings_for(WAVE_1)).await;
    match wave_1_decision(&mut wave_1).await {
        Outcome::Waiting { reason, .. } => {
            assert_eq!(reason, "waiting for wave canary: cluster-a no status yet")
        }
        other => panic!("wave-1 must wait for the canary, got {other:?}"),
    }
    let cell = cluster_a_cell(&fleet.status_json("rel-9")).clone();
    assert_eq!(cell.state, None, "a forged entry gives no state");
    let forged = &cell.unverified[0];
    assert!(!forged.verified);
    assert_eq!(
        (forged.status.state, forged.status.reported_at.to_rfc3339()),
        (State::Success, "2099-01-01T00:00:00+00:00".into())
    );
    assert!(forged.reason.starts_with("unsigned"), "{}", forged.reason);
    let raw = String::from_utf8(
        Command::new(env!("CARGO_BIN_EXE_fleetgate"))
            .args(["status", "rel-9", "--repo", &fleet.url, "-o", "json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(raw.contains(r#""verified": false"#), "{raw}");

    // A compromised cluster B signs a success with its own key into cluster-a's ref.
    let b = fleet.status_identity(WAVE_1);
    fleet.write_status_as(&b, &Status::new(CLUSTER, "rel-9", &commit, State::Success, "all gates passed for 3s"));
    assert!(matches!(wave_1_decision(&mut wave_1).await, Outcome::Waiting { .. }));
    let cell = cluster_a_cell(&fleet.status_json("rel-9")).clone();
    assert_eq!(cell.state, None);
    let reasons: Vec<&str> = cell.unverified.iter().map(|u| u.reason.as_str()).collect();
    assert!(reasons.contains(&"signed by a key other than the one registered for cluster-a"), "{reasons:?}");

    // The canary's real agent reports; its success is believed and opens wave-1.
    let mut canary = fleet.agent().await;
    assert_eq!(within("canary rel-9", 90, canary.reconcile()).await.unwrap(), Outcome::Succeeded("rel-9".into()));
    let cell = cluster_a_cell(&fleet.status_json("rel-9")).clone();
    assert_eq!(cell.state, Some(State::Success));
    let real = cell.status.unwrap();
    assert_eq!((real.fleet.as_deref(), real.sequence.is_some()), (Some(FLEET_NAME), true));
    assert!(!matches!(wave_1_decision(&mut wave_1).await, Outcome::Waiting { .. }), "the real success opens wave-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_dated_2099_never_hides_a_later_real_failure() {
    let fleet = Fleet::start("future-status", false).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut canary = fleet.agent().await;
    assert_eq!(within("canary rel-1", 90, canary.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    // rel-2 binds cluster-admin: the canary's admission baseline blocks it, a real `failure`.
    let commit = fleet.blocked_release("rel-2");
    fleet.promote("rel-2");
    // Before the canary runs it: an unsigned forgery and — worse — an entry the canary's own key
    // signed with a clock set to 2099.
    forge_success(&fleet, "rel-2", &commit);
    let mut future = Status::new(CLUSTER, "rel-2", &commit, State::Success, "all gates passed for 3s");
    future.reported_at = "2099-01-01T00:00:00Z".parse().unwrap();
    fleet.write_status_as(&fleet.status_identity(CLUSTER), &future);

    match within("canary rel-2", 90, canary.reconcile()).await.unwrap() {
        Outcome::Blocked { release, .. } => assert_eq!(release, "rel-2"),
        other => panic!("rel-2 must be blocked by admission, got {other:?}"),
    }
    let cell = cluster_a_cell(&fleet.status_json("rel-2")).clone();
    assert_eq!(cell.state, Some(State::Failure), "the later failure is the canary's word: {cell:?}");
    let mut wave_1 = fleet.agent_with(fleet.settings_for(WAVE_1)).await;
    match wave_1_decision(&mut wave_1).await {
        Outcome::Waiting { reason, .. } => {
            assert!(reason.contains("cluster-a") && reason.contains("failed"), "{reason}")
        }
        other => panic!("wave-1 must not start rel-2, got {other:?}"),
    }
}
