//! `kill -9` of the agent at every boundary between two persisted steps (issue 19, item 1): one
//! case per stop point of `fleetgate::model::stop_point`, for a release that passes its gates
//! (rel-2 good) and for one that fails them and is rolled back to rel-1 (rel-2 bad).
//!
//! Each case: a real cluster with workloads, rel-1 rolled out by an in-process agent (a
//! RedisCluster created under it), rel-2 promoted, then an agent *process* (leader election on,
//! a 3 s Lease) started with `FLEETGATE_TEST_STOP_AT=<point>`. When its marker file appears the
//! agent is parked exactly there and its whole process group gets SIGKILL. A second process,
//! without the stop point and with a fresh Git cache (a Pod's emptyDir), must then converge, and
//! the end state is checked:
//!
//! * the right release is live (good: rel-2's image; bad: rel-1's) and the RedisCluster is intact;
//! * one true status per release in Git: no entry twice, exactly one verdict, the last one, with
//!   the right state; nothing left undelivered in the state or the outbox;
//! * no orphaned snapshot: every Secret labelled as a snapshot's belongs to a complete
//!   (indexed) snapshot of a release that ran here; the live release is in the last-known-good
//!   store;
//! * after a rollback, Git says what runs: the agents write back (on, as by default), and
//!   exactly one write-back commit pins the cluster to rel-1, with nothing left owed in the state;
//! * the Lease: held by the restarted agent. The killed one never released it (SIGKILL runs no
//!   step-down), so this shows its hold expired and was taken over, not that it was handed over.
//!
//! Each case prints the time from the kill to convergence (docs/RELIABILITY.md, kill -9 matrix).

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate::model::stop_point::{STOP_AT_VAR, STOP_DIR_VAR};
use fleetgate::status::{State, Status};
use fleetgate_testenv::process::{Guarded, free_port};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use rstest::rstest;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const LEASE_SECONDS: u64 = 3;

/// What rel-2 does under its gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rel2 {
    /// Passes: rel-2 ends live, `success`.
    Good,
    /// Fails its first gate round: rolled back to rel-1, `failure`.
    Bad,
}

/// An agent process for [`CLUSTER`] named `name` (its Lease identity starts with it), halting at
/// `stop_at` when given.
fn agent_process(fleet: &Fleet, name: &str, stop_at: Option<&str>) -> Guarded {
    let dir = fleet.dir.path();
    let mut cmd = fleet.agent_command(name, free_port(), LEASE_SECONDS, true);
    match stop_at {
        Some(point) => cmd.env(STOP_AT_VAR, point).env(STOP_DIR_VAR, dir),
        None => cmd.env_remove(STOP_AT_VAR),
    };
    Guarded::spawn(name, cmd, &log_path(fleet, name)).unwrap()
}

fn log_path(fleet: &Fleet, name: &str) -> std::path::PathBuf {
    fleet.dir.path().join(format!("{name}.log"))
}

fn log_tail(fleet: &Fleet, name: &str) -> String {
    let log = std::fs::read_to_string(log_path(fleet, name)).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn redisclusters(fleet: &Fleet) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cache.example.com", "v1alpha2", "RedisCluster"),
        "redisclusters",
    );
    Api::namespaced_with(fleet.cluster.client(), OPERATOR_NS, &ar)
}

/// Asserts `statuses` (one release's, oldest first) say one true thing: no entry twice, exactly
/// one verdict, last, in state `verdict`.
fn assert_one_true_status(release: &str, statuses: &[Status], verdict: State) {
    let said: Vec<(State, &str)> = statuses.iter().map(|s| (s.state, s.description.as_str())).collect();
    let distinct: BTreeSet<&str> = statuses.iter().map(|s| s.description.as_str()).collect();
    assert_eq!(distinct.len(), statuses.len(), "{release}: an entry written twice: {said:#?}");
    let verdicts: Vec<State> = statuses.iter().map(|s| s.state).filter(|s| *s != State::Pending).collect();
    assert_eq!(verdicts, [verdict], "{release}: one verdict: {said:#?}");
    assert_eq!(statuses.last().map(|s| s.state), Some(verdict), "{release}: the verdict is the last word: {said:#?}");
}

/// Every Secret labelled as part of a snapshot belongs to a complete one (its index exists) of a
/// release that ran here. Returns the complete snapshots' ids.
async fn assert_no_orphaned_snapshot(fleet: &Fleet) -> BTreeSet<String> {
    let secrets: Api<Secret> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    let list = secrets.list_metadata(&ListParams::default().labels("fleetgate.io/snapshot")).await.unwrap();
    let mut parts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut complete = BTreeSet::new();
    for s in &list.items {
        let labels = s.metadata.labels.clone().unwrap_or_default();
        let id = labels["fleetgate.io/snapshot"].clone();
        if labels.get("fleetgate.io/snapshot-index").map(String::as_str) == Some("true") {
            let release = labels.get("fleetgate.io/release").cloned().unwrap_or_default();
            assert!(["rel-1", "rel-2"].contains(&release.as_str()), "snapshot {id} holds {release:?}");
            complete.insert(id.clone());
        }
        parts.entry(id).or_default().push(s.metadata.name.clone().unwrap_or_default());
    }
    let orphaned: Vec<_> = parts.iter().filter(|(id, _)| !complete.contains(*id)).collect();
    assert!(orphaned.is_empty(), "snapshot Secrets without an index: {orphaned:?}");
    complete
}

async fn lease_holder(fleet: &Fleet) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    leases.get_opt(&format!("fleetgate-agent-{CLUSTER}")).await.ok()??.spec?.holder_identity
}

/// Whether the agents reached the end state of `rel2`: Idle on the expected release with the
/// verdict in Git and nothing left undelivered (a kill after the verdict's push leaves the rest
/// to the restarted agent).
async fn converged(fleet: &Fleet, rel2: Rel2, commit: &str) -> bool {
    let state = fleet.state().await;
    let (live, verdict) = match rel2 {
        Rel2::Good => ("rel-2", State::Success),
        Rel2::Bad => ("rel-1", State::Failure),
    };
    state.phase() == fleetgate::agent::state::Phase::Idle
        && state.current() == Some(live)
        && state.unreported().is_empty()
        && state.pending_write_back().is_none()
        && fleet.statuses(commit).last().is_some_and(|s| s.state == verdict)
}

/// The write-back commits on the remote's main that pin the cluster back to rel-1.
fn write_backs(fleet: &Fleet) -> Vec<String> {
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(fleet.daemon.path("fleet.git"))
        .args(["log", "--format=%H", "--grep=^Fleetgate-Rolled-Back-To: rel-1", "main"])
        .output()
        .unwrap();
    assert!(out.status.success(), "git log: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

#[rstest]
#[case::verifying_after_begin("step.begin.after-persist", Rel2::Good)]
#[case::snapshot_chunks_without_index("snapshot.after-chunks", Rel2::Good)]
#[case::snapshot_saved_apply_not_recorded("snapshot.after-save", Rel2::Good)]
#[case::applying_recorded_status_unpushed("step.start-apply.after-persist", Rel2::Good)]
#[case::applying_status_push_cut_off("status.push.negotiated", Rel2::Good)]
#[case::applying_status_pushed_unmarked("status.pending.after-push", Rel2::Good)]
#[case::apply_halfway("apply.after-first-phase", Rel2::Good)]
#[case::apply_done_nothing_pruned("apply.after-all", Rel2::Good)]
#[case::baking_recorded_status_unpushed("step.applied.after-persist", Rel2::Good)]
#[case::bake_started("bake.started", Rel2::Good)]
#[case::verdict_persisted_not_pushed("step.passed.after-persist", Rel2::Good)]
#[case::success_pushed_unmarked("status.success.after-push", Rel2::Good)]
#[case::rollback_begun("step.failed.after-persist", Rel2::Bad)]
#[case::rollback_target_applied("rollback.after-apply", Rel2::Bad)]
#[case::restore_halfway("restore.after-first-phase", Rel2::Bad)]
#[case::rolled_back_status_unpushed("step.rolled-back.after-persist", Rel2::Bad)]
#[case::failure_pushed_unmarked("status.failure.after-push", Rel2::Bad)]
#[case::write_back_owed("write-back.before-push", Rel2::Bad)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at(#[case] point: &str, #[case] rel2: Rel2) {
    // Cluster names are short (at most 20 characters): one per point.
    let name =
        format!("kill-{:08x}", point.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193)));
    let fleet = Fleet::start(&name, true).await;
    let commit1 = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    {
        let mut agent = fleet.agent().await;
        let outcome = within("rel-1", 180, agent.reconcile()).await.unwrap();
        assert_eq!(outcome, Outcome::Succeeded("rel-1".into()));
    }
    let cache: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha2", "kind": "RedisCluster",
        "metadata": {"name": "cache", "namespace": OPERATOR_NS}, "spec": {"size": 1},
    }))
    .unwrap();
    redisclusters(&fleet).create(&PostParams::default(), &cache).await.unwrap();
    if rel2 == Rel2::Bad {
        fleet.set_gates("3s", FAILING_GATES);
    }
    let commit2 = fleet.release("rel-2", |_| {});
    fleet.promote("rel-2");

    // The first agent runs into the stop point; SIGKILL lands there.
    let stopping = agent_process(&fleet, "agent-killed", Some(point));
    let marker = fleet.dir.path().join(point);
    let started = Instant::now();
    while !marker.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "{point} never reached; agent log:\n{}",
            log_tail(&fleet, "agent-killed")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), stopping.pid().to_string());
    let phase_at_kill = fleet.phase().await.unwrap_or_default();
    drop(stopping); // SIGKILL to its process group, then reaped
    let killed = Instant::now();

    // The restarted agent converges.
    let restarted = agent_process(&fleet, "agent-restarted", None);
    let until = Instant::now() + Duration::from_secs(180);
    while !converged(&fleet, rel2, &commit2).await {
        assert!(Instant::now() < until, "no convergence after {point}; log:\n{}", log_tail(&fleet, "agent-restarted"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = killed.elapsed();
    println!(
        "kill -9 at {point} ({rel2:?} rel-2, phase {phase_at_kill}) → converged {:.1} s after the kill",
        took.as_secs_f64()
    );

    // The right release live, the custom resource intact.
    let live = if rel2 == Rel2::Good { "rel-2" } else { "rel-1" };
    assert_eq!(fleet.operator_image().await, Some(image_of(live)));
    let size = redisclusters(&fleet).get("cache").await.unwrap().data["spec"]["size"].as_i64();
    assert_eq!(size, Some(1), "the RedisCluster is intact");
    let state = fleet.state().await;
    assert_eq!(state.rejected().contains_key("rel-2"), rel2 == Rel2::Bad, "{:?}", state.rejected());

    // One true status per release; nothing left to deliver.
    assert_one_true_status("rel-1", &fleet.statuses(&commit1), State::Success);
    let verdict = if rel2 == Rel2::Good { State::Success } else { State::Failure };
    assert_one_true_status("rel-2", &fleet.statuses(&commit2), verdict);
    assert!(state.unreported().is_empty(), "statuses left undelivered: {:?}", state.unreported());
    let pinned = write_backs(&fleet);
    assert_eq!(pinned.len(), usize::from(rel2 == Rel2::Bad), "write-back commits pinning rel-1: {pinned:?}");
    let outbox = fleet.outbox_text().await;
    assert!(outbox.is_empty() || outbox == "[]", "statuses left in the outbox: {outbox}");

    assert_no_orphaned_snapshot(&fleet).await;
    // The live release has its last-known-good copy (a later rollback to it needs no Git).
    let secrets: Api<Secret> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    let kept = secrets
        .list_metadata(&ListParams::default().labels(&format!("fleetgate.io/lkg=true,fleetgate.io/release={live}")))
        .await
        .unwrap();
    assert_eq!(kept.items.len(), 1, "{live} stored as last-known-good");

    let holder = lease_holder(&fleet).await.unwrap_or_default();
    assert!(holder.starts_with("agent-restarted_"), "the Lease is the restarted agent's: {holder:?}");
    drop(restarted);
}
