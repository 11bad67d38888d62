//! Write-back against a real `git daemon`: after a rollback the agent pins its cluster to the
//! release it rolled back to, on the tracked branch, with a message and trailers saying why — and
//! does it on top of commits someone else pushed meanwhile.

use fleetgate::agent::state::Failure;
use fleetgate::agent::write_back::write_back;
use fleetgate::source::{Credentials, Source, init_fleet_repo};
use fleetgate_testenv::GitDaemon;
use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_rollback_is_written_back_as_a_pin_of_this_cluster_only() {
    let daemon = GitDaemon::start().unwrap();
    let url = daemon.create_bare("fleet.git").unwrap();
    let work = tempfile::tempdir().unwrap();
    let repo = work.path().join("fleet");
    init_fleet_repo(&repo).unwrap();
    // Git asks for rel-2 fleet-wide (as after `fleetgate promote rel-2 --fleet`).
    let fleet = std::fs::read_to_string(repo.join("fleet.yaml")).unwrap();
    let fleet = fleet.replace("  # release: rel-20250315-001", "  release: rel-2");
    assert!(fleet.contains("\n  release: rel-2"), "the template names a commented fleet release");
    std::fs::write(repo.join("fleet.yaml"), fleet).unwrap();
    git(&repo, &["commit", "-qam", "promote rel-2"]);
    git(&repo, &["push", "-q", &url, "main"]);

    let state = tempfile::tempdir().unwrap();
    let mut source = Source::open(&url, state.path(), Credentials::default()).unwrap();
    source.sync().unwrap();
    // Someone pushes after the agent's last fetch: the write-back must land on top, not over it.
    std::fs::write(repo.join("NOTES.md"), "unrelated change\n").unwrap();
    git(&repo, &["add", "NOTES.md"]);
    git(&repo, &["commit", "-qm", "unrelated"]);
    git(&repo, &["push", "-q", &url, "main"]);

    let failure = Failure::new("GateFailed", "pod-restarts 4 > 3");
    let commit = write_back(&mut source, &Credentials::default(), "cluster-a", "rel-2", "rel-1", &failure)
        .unwrap()
        .expect("a commit was pushed");

    git(&repo, &["pull", "-q", &url, "main"]);
    assert_eq!(git(&repo, &["rev-parse", "HEAD"]).trim(), commit.to_string());
    let message = git(&repo, &["log", "-1", "--format=%B"]);
    assert!(message.starts_with("fleetgate: roll cluster-a back to rel-1"), "{message}");
    assert!(
        message.contains("Fleetgate-Release: rel-2\nFleetgate-Reason: GateFailed\nFleetgate-Rolled-Back-To: rel-1"),
        "{message}"
    );
    assert!(repo.join("NOTES.md").exists(), "the concurrent commit was kept");
    let cluster_a = std::fs::read_to_string(repo.join("clusters/cluster-a.yaml")).unwrap();
    assert!(cluster_a.lines().any(|l| l.trim() == "release: rel-1"), "{cluster_a}");
    let cluster_b = std::fs::read_to_string(repo.join("clusters/cluster-b.yaml")).unwrap();
    assert!(!cluster_b.lines().any(|l| l.trim().starts_with("release:")), "only this cluster is pinned");

    // Git now says what runs: a second write-back has nothing to do.
    let again = write_back(&mut source, &Credentials::default(), "cluster-a", "rel-2", "rel-1", &failure).unwrap();
    assert_eq!(again, None);
}
