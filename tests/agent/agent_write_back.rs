//! Write-back against a real `git daemon`: after a rollback the agent pins its cluster to the
//! release it rolled back to, on the tracked branch, with a message and trailers saying why — and
//! does it on top of commits someone else pushed meanwhile. The commit is SSH-signed with the
//! cluster's status key, as the real `git verify-commit` checks, and `fleetgate rollback`
//! recognises it as a rollback the agent already made.

use fleetgate::agent::state::Failure;
use fleetgate::agent::write_back::{WriteBackOutcome, write_back};
use fleetgate::releng::rollback::{RollbackRequest, rollback};
use fleetgate::releng::{FleetRepo, Target};
use fleetgate::source::{Credentials, Source, init_fleet_repo};
use fleetgate::status::StatusSigner;
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

/// A git daemon serving an empty `fleet.git`, and a work dir whose `fleet` is the template repo
/// (not pushed yet).
fn served_template() -> (GitDaemon, String, tempfile::TempDir) {
    let daemon = GitDaemon::start().unwrap();
    let url = daemon.create_bare("fleet.git").unwrap();
    let work = tempfile::tempdir().unwrap();
    init_fleet_repo(&work.path().join("fleet")).unwrap();
    (daemon, url, work)
}

#[test]
fn a_rollback_is_written_back_as_a_pin_of_this_cluster_only() {
    let (_daemon, url, work) = served_template();
    let repo = work.path().join("fleet");
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

    let failure = Failure::new("GateFailed", "pod-restarts observed 4 > threshold 3");
    let key = StatusSigner::generate("fleetgate/cluster-a").unwrap();
    let outcome = write_back(&mut source, &Credentials::default(), &key, "cluster-a", "rel-2", "rel-1", &failure);
    let WriteBackOutcome::Pushed(commit) = outcome.unwrap() else { panic!("a commit was pushed") };

    git(&repo, &["pull", "-q", &url, "main"]);
    assert_eq!(git(&repo, &["rev-parse", "HEAD"]).trim(), commit.to_string());
    let message = git(&repo, &["log", "-1", "--format=%B"]);
    assert!(message.starts_with("fleetgate: roll cluster-a back to rel-1"), "{message}");
    assert!(
        message.contains(
            "Fleetgate-Release: rel-2\nFleetgate-Reason: GateFailed\n\
             Fleetgate-Failure: pod-restarts observed 4 > threshold 3\nFleetgate-Rolled-Back-To: rel-1"
        ),
        "{message}"
    );
    // Signed by the status key, as Git checks an SSH signature against allowed_signers.
    let signers = work.path().join("allowed_signers");
    std::fs::write(&signers, format!("cluster-a {}\n", key.public())).unwrap();
    let allowed = format!("gpg.ssh.allowedSignersFile={}", signers.display());
    let verified =
        Command::new("git").arg("-C").arg(&repo).args(["-c", &allowed, "verify-commit", "HEAD"]).output().unwrap();
    assert!(verified.status.success(), "git verify-commit: {}", String::from_utf8_lossy(&verified.stderr));
    assert!(String::from_utf8_lossy(&verified.stderr).contains("Good \"git\" signature for cluster-a"));
    assert!(repo.join("NOTES.md").exists(), "the concurrent commit was kept");
    let cluster_a = std::fs::read_to_string(repo.join("clusters/cluster-a.yaml")).unwrap();
    assert!(cluster_a.lines().any(|l| l.trim() == "release: rel-1"), "{cluster_a}");
    let cluster_b = std::fs::read_to_string(repo.join("clusters/cluster-b.yaml")).unwrap();
    assert!(!cluster_b.lines().any(|l| l.trim().starts_with("release:")), "only this cluster is pinned");

    // Git now says what runs: a second write-back has nothing to do.
    let again =
        write_back(&mut source, &Credentials::default(), &key, "cluster-a", "rel-2", "rel-1", &failure).unwrap();
    assert_eq!(again, WriteBackOutcome::AlreadyAsked);

    git(&repo, &["config", "user.name", "On Call"]);
    git(&repo, &["config", "user.email", "oncall@example.invalid"]);
    // `fleetgate rollback` sees the agent's rollback in the history and explains it, instead of
    // taking the write-back for a promotion to revert (which would ask for rel-2 again).
    let request = RollbackRequest {
        target: Target::Cluster("cluster-a".into()),
        to: None,
        reason: None,
        base: "main".into(),
        branch: None,
        staged: false,
        dry_run: false,
    };
    let err = rollback(&FleetRepo::open(&repo).unwrap(), &request, None).unwrap_err().to_string();
    assert!(err.contains("the agent of cluster-a already rolled rel-2 back to rel-1"), "{err}");
    assert!(err.contains("GateFailed: pod-restarts observed 4 > threshold 3"), "{err}");
    assert!(err.contains("fleetgate promote rel-2 --cluster cluster-a"), "{err}");

    // Reverting the write-back asks for rel-2 again: a promotion now. No status says another
    // release succeeded on cluster-a, so rollback does not guess a target; it names the flag.
    git(&repo, &["revert", "--no-edit", "HEAD"]);
    let err = rollback(&FleetRepo::open(&repo).unwrap(), &request, None).unwrap_err().to_string();
    assert!(
        err.contains("nothing to go back to") && err.contains("fleetgate rollback --cluster cluster-a --to ID"),
        "{err}"
    );
}

/// A write-back tried again later (the first push failed, or the agent was killed before it)
/// must not undo what people did since: once the tip asks for another release than the failed
/// one, the owed pin is dropped, and nothing is pushed.
#[test]
fn a_late_write_back_leaves_a_later_promotion_alone() {
    let (_daemon, url, work) = served_template();
    let repo = work.path().join("fleet");
    // After the rollback someone promoted the fix, rel-3, to the canary.
    let pin = repo.join("clusters/cluster-a.yaml");
    let text = std::fs::read_to_string(&pin).unwrap();
    std::fs::write(&pin, text.replace("spec:\n", "spec:\n  release: rel-3\n")).unwrap();
    assert!(std::fs::read_to_string(&pin).unwrap().contains("  release: rel-3"), "the template has a spec");
    git(&repo, &["commit", "-qam", "promote rel-3 to cluster-a"]);
    git(&repo, &["push", "-q", &url, "main"]);
    let tip = git(&repo, &["rev-parse", "HEAD"]);

    let state = tempfile::tempdir().unwrap();
    let mut source = Source::open(&url, state.path(), Credentials::default()).unwrap();
    let failure = Failure::new("GateFailed", "pod-restarts observed 4 > threshold 3");
    let key = StatusSigner::generate("fleetgate/cluster-a").unwrap();
    let outcome = write_back(&mut source, &Credentials::default(), &key, "cluster-a", "rel-2", "rel-1", &failure);
    assert_eq!(outcome.unwrap(), WriteBackOutcome::MovedOn);
    let remote = Command::new("git").args(["ls-remote", &url, "refs/heads/main"]).output().unwrap();
    assert!(String::from_utf8_lossy(&remote.stdout).starts_with(tip.trim()), "nothing pushed");
}
