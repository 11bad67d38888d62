//! Liveness end to end: an agent on a real API server, authenticated as its ServiceAccount,
//! publishes its signed heartbeat to the fleet repo on a real `git daemon`; the real
//! `fleetgate status` reads it. The heartbeat ref appears and advances without a commit added to
//! any history; forged heartbeats (unsigned, or signed by a key other than the cluster's) are
//! ignored; an agent stopped for longer than its allowance shows `stale`, first in its wave.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::{AgentSettings, Outcome};
use fleetgate::status::heartbeat::{self, heartbeat_ref};
use fleetgate::status::{GitRemote, Matrix, StatusIdentity, StatusSigner};
use fleetgate_testenv::wait::eventually;
use std::process::Command;
use std::time::Duration;

/// `git` in the daemon's repository.
fn server_git(fleet: &Fleet, args: &[&str]) -> String {
    let out = Command::new("git").arg("--git-dir").arg(fleet.daemon.path("fleet.git")).args(args).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The server's heartbeat tip of `cluster`, if any.
fn tip(fleet: &Fleet, cluster: &str) -> Option<String> {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(fleet.daemon.path("fleet.git"))
        .args(["rev-parse", "--verify", "-q", &heartbeat_ref(cluster)])
        .output()
        .unwrap();
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Every commit of every history but the heartbeats': branches, tags and status notes.
fn histories(fleet: &Fleet) -> String {
    server_git(fleet, &["rev-list", "--branches", "--tags", "--glob=refs/notes/*"])
}

/// `fleetgate status -o json` with `extra` arguments.
async fn status(fleet: &Fleet, extra: &[&str]) -> Matrix {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetgate"));
    cmd.args(["status", "--repo", &fleet.url, "-o", "json"]).args(extra).env_remove("FLEETGATE_REPO");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    assert!(out.status.success(), "status: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn row<'m>(m: &'m Matrix, cluster: &str) -> &'m fleetgate::status::matrix::ClusterRow {
    m.waves.iter().flat_map(|w| &w.clusters).find(|c| c.name == cluster).unwrap_or_else(|| panic!("{cluster}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_agent_beats_without_history_forgeries_are_ignored_and_a_stopped_agent_goes_stale() {
    let fleet = Fleet::start("status-heartbeat", false).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let settings = AgentSettings { heartbeat_interval: Some(Duration::from_secs(2)), ..fleet.settings() };
    let mut agent = fleet.agent_with(settings).await;
    let outcome = within("reconcile rel-1", 90, agent.reconcile()).await.unwrap();
    assert_eq!(outcome, Outcome::Succeeded("rel-1".into()));

    // The heartbeat appears, then advances: each beat a new root commit, no history anywhere grows.
    let first = eventually("the first heartbeat", 30, || async { tip(&fleet, CLUSTER) }).await;
    let before = histories(&fleet);
    let second = eventually("the next heartbeat", 30, || async { tip(&fleet, CLUSTER).filter(|t| *t != first) }).await;
    assert_eq!(server_git(&fleet, &["rev-list", "--count", &heartbeat_ref(CLUSTER)]), "1", "a beat has no parent");
    assert_eq!(
        server_git(&fleet, &["rev-parse", &format!("{second}^{{tree}}")]),
        "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    );
    assert_eq!(histories(&fleet), before, "no branch, tag or notes history gained a commit");
    // The agent is not disturbed by heartbeats (its own or others'): nothing to do.
    assert_eq!(within("reconcile again", 60, agent.reconcile()).await.unwrap(), Outcome::UpToDate);

    // Forgeries for cluster-b: one signed by cluster-a's key (registered, but not cluster-b's)
    // and one unsigned. Neither makes cluster-b look alive.
    let scratch = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(scratch.path()).unwrap();
    let remote = GitRemote::new(&fleet.url);
    heartbeat::beat(&repo, &remote, &fleet.status_identity(CLUSTER), "cluster-b", Duration::from_secs(60)).unwrap();
    let m = status(&fleet, &[]).await;
    assert_eq!(row(&m, "cluster-b").heartbeat, None, "a heartbeat signed by another cluster's key");
    let stranger = StatusIdentity::new(FLEET_NAME, StatusSigner::generate("stranger").unwrap());
    let mut forged = heartbeat::Heartbeat::signed(&stranger, "cluster-b", Duration::from_secs(60)).unwrap();
    forged.signature = None;
    let tree = server_git(&fleet, &["hash-object", "-t", "tree", "-w", "/dev/null"]);
    let message = serde_json::to_string(&forged).unwrap();
    let commit = server_git(
        &fleet,
        &["-c", "user.name=x", "-c", "user.email=x@example.com", "commit-tree", &tree, "-m", &message],
    );
    server_git(&fleet, &["update-ref", &heartbeat_ref("cluster-b"), &commit]);
    let m = status(&fleet, &[]).await;
    assert_eq!(row(&m, "cluster-b").heartbeat, None, "an unsigned heartbeat");
    assert_eq!(row(&m, "cluster-b").last_seen, None);

    // The live agent: its heartbeat is LAST SEEN, with its interval, and it is not stale.
    let live = row(&m, CLUSTER);
    let beat = live.heartbeat.expect("cluster-a's verified heartbeat");
    assert_eq!((beat.interval_seconds, live.stale_after_seconds), (2, Some(6)));
    assert_eq!(live.last_seen, Some(beat.at));

    // Stopped: no beat after it, and once the allowance (3 × 2 s) has passed, `stale`.
    drop(agent);
    let stopped_at = eventually("the agent's last beat to land", 30, || async {
        let t = tip(&fleet, CLUSTER);
        tokio::time::sleep(Duration::from_secs(3)).await;
        (tip(&fleet, CLUSTER) == t).then_some(t)
    })
    .await;
    let m = eventually("cluster-a to be stale", 60, || async {
        let m = status(&fleet, &["--state", "stale"]).await;
        (m.cluster_count() == 1).then_some(m)
    })
    .await;
    let stale = row(&m, CLUSTER);
    assert!(stale.stale && stale.last_seen.is_some(), "{stale:?}");
    assert_eq!(tip(&fleet, CLUSTER), stopped_at, "a stopped agent does not beat");
    // In the table: first in its wave and marked.
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["status", "--repo", &fleet.url])
        .env("COLUMNS", "200")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    println!("{table}");
    let line = table.lines().find(|l| l.starts_with(&format!("  {CLUSTER} "))).unwrap_or_else(|| panic!("{table}"));
    assert!(line.ends_with("(stale)"), "{table}");
    assert!(table.contains("1 stale (not heard from"), "{table}");
    // A reader's own allowance: generous enough, nobody is stale.
    let m = status(&fleet, &["--stale-after", "1h"]).await;
    assert!(!row(&m, CLUSTER).stale);
    assert_eq!(row(&m, CLUSTER).stale_after_seconds, Some(3600));
}
