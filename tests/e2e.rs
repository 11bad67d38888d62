//! The end-to-end story (ARCHITECTURE.md §3, issue 7) with real processes: `hack/demo.sh` — the
//! README's `make demo` — run with `DEMO_CHAOS=1`. Three control planes with kwok workloads, a fleet
//! repo behind `git daemon`, gpg-signed releases cut with `fleetgate release create`, promotions
//! merged into `main`, and one `fleetgate agent` process per cluster. The canary's agent is killed
//! with SIGKILL while applying rel-1 and again while rolling back rel-2, and restarted.
//!
//! The script itself fails when a step does not happen in time (rel-1 success everywhere; rel-2
//! failure on the canary, which runs rel-1 again, while the later waves never leave rel-1; rel-3
//! success everywhere, with wave-2 waiting for `fleetgate approve` each time). This test then checks what the fleet's statuses say in Git, and that Git
//! tells the truth: the canary's agent (write-back is on by default) pinned the canary to rel-1 in
//! a commit on `main` whose trailers name the failed gate and its figure, which the demo shows with
//! `git log --oneline -3` and which `fleetgate rollback` recognises.
//!
//! When Gitea is built (`make testenv` builds it), the demo — and so this test — runs on it: the
//! fleet repo lives in Gitea, promotions are pull requests merged through Gitea's API, Gitea's
//! signed push webhook wakes the agents, and the canary's `failure` shows on rel-2's promotion PR.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn bin(name: &str) -> PathBuf {
    let fleetgate = PathBuf::from(env!("CARGO_BIN_EXE_fleetgate"));
    let path = fleetgate.with_file_name(name);
    assert!(path.exists(), "{} is missing: build the workspace's binaries first (make test does)", path.display());
    path
}

/// The latest status of `cluster` for `release` in `fleetgate status -o json`.
fn cell<'a>(status: &'a Value, cluster: &str, release: &str) -> Option<&'a Value> {
    status["waves"]
        .as_array()?
        .iter()
        .flat_map(|w| w["clusters"].as_array().into_iter().flatten())
        .find(|row| row["name"] == cluster)?["cells"]
        .as_array()?
        .iter()
        .find(|c| c["release"] == release)
}

fn state(status: &Value, cluster: &str, release: &str) -> Option<String> {
    cell(status, cluster, release).and_then(|c| c["state"].as_str()).map(str::to_string)
}

fn log_lines(dir: &Path, cluster: &str, needle: &str) -> usize {
    std::fs::read_to_string(dir.join(format!("agent-{cluster}.log"))).unwrap_or_default().matches(needle).count()
}

#[test]
fn three_releases_through_three_waves_with_the_canary_agent_killed_twice() {
    let dir = tempfile::Builder::new().prefix("fg-e2e").tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("hack/demo.sh"))
        .env("DEMO_DIR", dir.path())
        .env("DEMO_CHAOS", "1")
        .env("DEMO_TIMEOUT", "300")
        .env("FLEETGATE_BIN", bin("fleetgate"))
        .env("TESTENV_BIN", bin("fleetgate-testenv"))
        .env("NO_COLOR", "1")
        .output()
        .expect("run hack/demo.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        for c in ["cluster-a", "cluster-b", "cluster-c"] {
            let log = std::fs::read_to_string(dir.path().join(format!("agent-{c}.log"))).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- agent-{c}.log (last 40 lines, newest first)\n{}", tail.join("\n"));
        }
        panic!("the demo failed ({}):\n{stdout}\n{stderr}", out.status);
    }
    println!("{stdout}");

    // Both kills happened, and the agent said it resumed each time.
    assert!(dir.path().join("chaos-cluster-a-Applying").exists(), "the agent was not killed while applying:\n{stdout}");
    assert!(dir.path().join("chaos-cluster-a-RollingBack").exists(), "the agent was not killed while rolling back");
    assert!(
        log_lines(dir.path(), "cluster-a", "resuming an unfinished operation") >= 2,
        "the restarted agent did not resume both operations"
    );

    let status: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("status.json")).unwrap()).unwrap();
    for c in ["cluster-a", "cluster-b", "cluster-c"] {
        assert_eq!(state(&status, c, "rel-1").as_deref(), Some("success"), "{c} rel-1");
        assert_eq!(state(&status, c, "rel-3").as_deref(), Some("success"), "{c} rel-3");
    }
    let failed = cell(&status, "cluster-a", "rel-2").expect("cluster-a reported on rel-2");
    assert_eq!(failed["state"], "failure");
    assert_eq!(failed["status"]["rollbackTo"], "rel-1");
    let description = failed["status"]["description"].as_str().unwrap();
    assert!(description.starts_with("rolled back to rel-1: pod-restarts"), "{description}");
    assert!(
        failed["status"]["gates"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g["name"] == "pod-restarts" && g["verdict"] == "fail")),
        "the failing gate's figure is in the status: {failed}"
    );
    for c in ["cluster-b", "cluster-c"] {
        assert_eq!(state(&status, c, "rel-2"), None, "{c} must never start rel-2");
    }
    // Then people rolled the fleet back through Git: each cluster went back to rel-1 as a
    // rollback, keeping the CRD rel-3 widened, and said so in its rel-1 status.
    assert!(stdout.contains("every cluster runs rel-1 again, status success"), "the Git rollback:\n{stdout}");
    for c in ["cluster-a", "cluster-b", "cluster-c"] {
        let back = cell(&status, c, "rel-1").and_then(|v| v["status"]["description"].as_str()).unwrap_or_default();
        assert!(
            back.starts_with("rolled back from rel-3") && back.contains("redisclusters.cache.example.com"),
            "{c}: {back}"
        );
    }
    // The brake held cluster-c on rel-1 while the others took rel-3, until it was lifted.
    assert!(stdout.contains("paused cluster-c stays on rel-1"), "the demo shows the pause:\n{stdout}");
    assert!(stdout.contains("Lifting the brake"), "and the resume");
    // wave-2 requires approval: cluster-c waited for rel-1's, and its start records who gave it.
    assert!(
        stdout.contains("cluster-c waits, nothing applied: waiting for approval of wave wave-2 (fleetgate approve rel-1 --wave wave-2)"),
        "the demo shows the wait for an approval:\n{stdout}"
    );
    assert!(stdout.contains("Approved rel-1 for wave wave-2"), "then fleetgate approve");
    assert!(
        stdout.contains("↳ approved for wave wave-2 by ") && stdout.contains("CAB-1001: wave-2 may take rel-1"),
        "and fleetgate audit shows who approved"
    );

    // The write-back: one commit on main, changing the canary's pin only, with its trailers.
    let bare = dir.path().join("git/fleet.git");
    let git = |args: &[&str]| {
        let out = Command::new("git").arg("--git-dir").arg(&bare).args(args).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let write_backs: Vec<String> = git(&["log", "--format=%H", "--grep=^Fleetgate-Rolled-Back-To: rel-1", "main"])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(write_backs.len(), 1, "one write-back commit on main: {write_backs:?}");
    let commit = &write_backs[0];
    let message = git(&["log", "-1", "--format=%B", commit]);
    assert!(message.starts_with("fleetgate: roll cluster-a back to rel-1"), "{message}");
    assert!(message.contains("\nFleetgate-Release: rel-2\n"), "{message}");
    assert!(message.contains("\nFleetgate-Failure: pod-restarts"), "the trailers name gate and figure: {message}");
    assert_eq!(git(&["diff-tree", "--no-commit-id", "--name-only", "-r", commit]).trim(), "clusters/cluster-a.yaml");
    assert!(stdout.contains("fleetgate: roll cluster-a back to rel-1"), "the demo shows git log --oneline -3");
    assert!(stdout.contains("Fleetgate-Rolled-Back-To: rel-1"), "the demo shows the trailers");
    assert!(stdout.contains("Good \"git\" signature for cluster-a"), "signed with the canary's status key");
    assert!(stdout.contains("already rolled rel-2 back to rel-1"), "fleetgate rollback recognises the write-back");

    // On a real forge when there is one: promotions as Gitea PRs, the verdict on the PR.
    if fleetgate_testenv::Gitea::binary().is_some() {
        assert!(stdout.contains("forge: Gitea at http://"), "the demo runs on Gitea when it is built:\n{stdout}");
        let merged = stdout.matches("merged through Gitea's API; its push webhook wakes the agents").count();
        assert_eq!(merged, 3, "rel-1, rel-2 and rel-3 promoted through Gitea PRs");
        assert!(
            stdout.contains("forge: Gitea shows on rel-2's promotion PR")
                && stdout.contains("fleetgate/cluster-a failure rolled back to rel-1: pod-restarts"),
            "the canary's failure and its gate on the PR:\n{stdout}"
        );
        // Before each merge: the CI's plan, and (once the agents run) each spoke's own.
        assert_eq!(stdout.matches("fleetgate plan --post (what CI runs on the PR").count(), 3, "{stdout}");
        for c in ["cluster-a", "cluster-b", "cluster-c"] {
            let context = format!("fleetgate/plan/{c} ");
            let planned =
                |l: &&str| l.contains(&context) && l.contains(" success ") && l.contains("rel-3 applies here: ");
            assert!(stdout.lines().any(|l| planned(&l)), "{c}'s agent posted its plan of rel-3 on the PR:\n{stdout}");
        }
        for c in ["cluster-a", "cluster-b", "cluster-c"] {
            let line = stdout
                .lines()
                .find(|l| l.contains(&format!("push webhook woke {c}'s agent")))
                .unwrap_or_else(|| panic!("the demo counts {c}'s webhook wakes:\n{stdout}"));
            let wakes: u64 = line.split_whitespace().rev().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
            assert!(wakes > 0, "Gitea's webhook woke {c}'s agent: {line}");
        }
    } else {
        assert!(stdout.contains("forge: none (git daemon)"), "{stdout}");
    }
}
