//! Status notes against a real `git daemon`: concurrent agents, a same-cluster re-install that
//! must merge instead of overwrite, a server-side refusal reported only through git2's
//! `push_update_reference` callback, and plain `git log --notes` showing what agents wrote.

use crate::status_support;

use fleetgate::status::{self, GateFigure, GitRemote, State, Status, StatusNote};
use fleetgate_testenv::{GitDaemon, git_in};
use git2::{Oid, Repository};
use status_support::{identity, keys};
use std::sync::{Arc, Barrier};
use std::time::Duration;

const RELEASE: &str = "rel-20250315-001";

/// A served repo `fleet.git` with one commit on main; returns its URL and the commit.
fn seeded(daemon: &GitDaemon) -> (String, Oid) {
    let url = daemon.create_bare("fleet.git").unwrap();
    let work = tempfile::tempdir().unwrap();
    git_in(work.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(work.path().join("release.yaml"), "kind: Release\n").unwrap();
    git_in(work.path(), &["add", "."]);
    git_in(work.path(), &["commit", "-q", "-m", "release"]);
    git_in(work.path(), &["push", "-q", &url, "main"]);
    let commit = git_in(work.path(), &["rev-parse", "HEAD"]);
    (url, Oid::from_str(commit.trim()).unwrap())
}

/// An agent's bare state clone with the release commit fetched.
fn agent_clone(url: &str) -> (tempfile::TempDir, Repository) {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init_bare(dir.path()).unwrap();
    repo.remote_anonymous(url).unwrap().fetch(&["+refs/heads/main:refs/heads/main"], None, None).unwrap();
    (dir, repo)
}

fn status_of(cluster: &str, commit: Oid, state: State, description: &str) -> Status {
    Status::new(cluster, RELEASE, commit.to_string(), state, description)
}

fn reader(url: &str) -> (tempfile::TempDir, Repository) {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init_bare(dir.path()).unwrap();
    status::sync(&repo, &GitRemote::new(url)).unwrap();
    (dir, repo)
}

#[test]
fn three_agents_write_concurrently_and_a_fourth_reader_sees_all() {
    let daemon = GitDaemon::start().unwrap();
    let (url, commit) = seeded(&daemon);
    let start = Arc::new(Barrier::new(3));
    let agents: Vec<_> = ["cluster-a", "cluster-b", "cluster-c"]
        .into_iter()
        .map(|cluster| {
            let (url, start) = (url.clone(), start.clone());
            std::thread::spawn(move || {
                let (_dir, repo) = agent_clone(&url);
                let remote = GitRemote::new(&url);
                start.wait();
                let pending = status_of(cluster, commit, State::Pending, "applying").started(chrono::Utc::now());
                status::write(&repo, &remote, &pending, &identity(cluster)).unwrap();
                let gates = vec![GateFigure {
                    name: "error-rate".into(),
                    observed: "0.4 %".into(),
                    threshold: "≤ 5 %".into(),
                    verdict: "pass".into(),
                }];
                let done = status_of(cluster, commit, State::Success, format!("{cluster}: all gates passed").as_str())
                    .with_gates(gates)
                    .decided(chrono::Utc::now());
                status::write(&repo, &remote, &done, &identity(cluster)).unwrap()
            })
        })
        .collect();
    for a in agents {
        let written = a.join().unwrap();
        // Each cluster owns its ref: nobody had to merge.
        assert_eq!(written.attempts, 1);
    }

    let (_dir, repo) = reader(&url);
    let set = status::read_all(&repo, &[commit], &keys()).unwrap();
    for cluster in ["cluster-a", "cluster-b", "cluster-c"] {
        let history: Vec<State> = set.history(cluster, RELEASE).iter().map(|s| s.state).collect();
        assert_eq!(history, [State::Pending, State::Success], "{cluster}");
        let latest = set.latest(cluster, RELEASE).unwrap();
        assert_eq!(latest.description, format!("{cluster}: all gates passed"));
        assert_eq!(latest.gates[0].observed, "0.4 %");
        assert_eq!(latest.agent_version, fleetgate::VERSION);
    }
    let refs = git_in(daemon.path("fleet.git").as_path(), &["for-each-ref", "--format=%(refname)", "refs/notes/"]);
    assert_eq!(
        refs.lines().collect::<Vec<_>>(),
        ["refs/notes/fleetgate/cluster-a", "refs/notes/fleetgate/cluster-b", "refs/notes/fleetgate/cluster-c"]
    );
}

#[test]
fn a_reinstalled_agent_merges_its_history_instead_of_overwriting_it() {
    let daemon = GitDaemon::start().unwrap();
    let (url, commit) = seeded(&daemon);
    let remote = GitRemote::new(&url);
    let (_a, old_install) = agent_clone(&url);
    status::write(
        &old_install,
        &remote,
        &status_of("cluster-a", commit, State::Pending, "baking"),
        &identity("cluster-a"),
    )
    .unwrap();

    // A fresh clone that never saw the ref: its push is refused, it fetches, merges, pushes again.
    let (_b, new_install) = agent_clone(&url);
    let written = status::write(
        &new_install,
        &remote,
        &status_of("cluster-a", commit, State::Failure, "rolled back to rel-20250310-002: error-rate 7.3 % > 5 %"),
        &identity("cluster-a"),
    )
    .unwrap();
    assert_eq!(written.attempts, 2);

    let (_r, repo) = reader(&url);
    let set = status::read_all(&repo, &[commit], &keys()).unwrap();
    let history: Vec<State> = set.history("cluster-a", RELEASE).iter().map(|s| s.state).collect();
    assert_eq!(history, [State::Pending, State::Failure]);
    // The served ref's history contains both writers' commits.
    let log = git_in(daemon.path("fleet.git").as_path(), &["log", "--format=%s", "refs/notes/fleetgate/cluster-a"]);
    assert!(log.lines().next().unwrap().contains("merged"), "{log}");
}

#[test]
fn concurrent_writers_of_one_cluster_lose_nothing() {
    let daemon = GitDaemon::start().unwrap();
    let (url, commit) = seeded(&daemon);
    let start = Arc::new(Barrier::new(2));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (url, start) = (url.clone(), start.clone());
            std::thread::spawn(move || {
                let (_dir, repo) = agent_clone(&url);
                let remote = GitRemote::new(&url);
                start.wait();
                (0..3)
                    .map(|i| {
                        let s = status_of("cluster-a", commit, State::Pending, &format!("writer {w} entry {i}"));
                        status::write(&repo, &remote, &s, &identity("cluster-a")).unwrap().attempts
                    })
                    .sum::<u32>()
            })
        })
        .collect();
    let pushes: u32 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(pushes > 6, "two writers of one fresh ref must have collided at least once");

    let (_r, repo) = reader(&url);
    let set = status::read_all(&repo, &[commit], &keys()).unwrap();
    let mut seen: Vec<String> = set.history("cluster-a", RELEASE).iter().map(|s| s.description.clone()).collect();
    seen.sort();
    let expected: Vec<String> = (0..2).flat_map(|w| (0..3).map(move |i| format!("writer {w} entry {i}"))).collect();
    assert_eq!(seen, expected);
}

#[test]
fn a_refusal_reported_only_by_the_server_is_merged_and_retried() {
    use std::os::unix::fs::PermissionsExt;
    let daemon = GitDaemon::start().unwrap();
    let (url, commit) = seeded(&daemon);
    // The server refuses the first update of the notes ref (as a racing writer or a re-check
    // would): libgit2's push call succeeds and only `push_update_reference` says so.
    let bare = daemon.path("fleet.git");
    let marker = bare.join("refuse-once");
    std::fs::write(&marker, "").unwrap();
    let hook = bare.join("hooks/update");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\nif [ -e {m} ]; then rm {m}; echo 'refusing once' >&2; exit 1; fi\nexit 0\n",
            m = marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();

    let (_a, repo) = agent_clone(&url);
    let written = status::write(
        &repo,
        &GitRemote::new(&url),
        &status_of("cluster-a", commit, State::Success, "ok"),
        &identity("cluster-a"),
    )
    .unwrap();
    assert_eq!(written.attempts, 2);
    assert!(!marker.exists());
    let (_r, reader) = reader(&url);
    assert_eq!(
        status::read_all(&reader, &[commit], &keys()).unwrap().latest("cluster-a", RELEASE).unwrap().state,
        State::Success
    );
}

#[test]
fn a_remote_that_always_refuses_ends_in_a_bounded_contended_error() {
    use std::os::unix::fs::PermissionsExt;
    let daemon = GitDaemon::start().unwrap();
    let (url, commit) = seeded(&daemon);
    let hook = daemon.path("fleet.git").join("hooks/update");
    std::fs::write(&hook, "#!/bin/sh\necho 'notes are read-only here' >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_a, repo) = agent_clone(&url);
    let started = std::time::Instant::now();
    let err = status::write(
        &repo,
        &GitRemote::new(&url),
        &status_of("cluster-a", commit, State::Success, "ok"),
        &identity("cluster-a"),
    )
    .unwrap_err();
    assert!(matches!(err, status::NotesError::Contended { attempts: status::notes::MAX_PUSH_ATTEMPTS, .. }), "{err}");
    assert!(err.to_string().contains("refs/notes/fleetgate/cluster-a"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn plain_git_log_shows_the_notes() {
    let daemon = GitDaemon::start().unwrap();
    let (url, commit) = seeded(&daemon);
    let (_a, repo) = agent_clone(&url);
    let description = "rolled back to rel-20250310-002: error-rate 7.3 % > 5 %";
    let s = status_of("cluster-a", commit, State::Failure, description).rolled_back_to("rel-20250310-002");
    status::write(&repo, &GitRemote::new(&url), &s, &identity("cluster-a")).unwrap();

    // What a person does: clone, fetch the notes, look at the log.
    let user = tempfile::tempdir().unwrap();
    git_in(user.path(), &["clone", "-q", &url, "fleet"]);
    let clone = user.path().join("fleet");
    git_in(&clone, &["fetch", "-q", "origin", "refs/notes/*:refs/notes/*"]);
    let log = git_in(&clone, &["log", "--notes=fleetgate/*", "-1", &commit.to_string()]);
    assert!(log.contains("Notes (fleetgate/cluster-a):"), "{log}");
    assert!(log.contains(description), "{log}");
    assert!(log.contains("\"rollbackTo\": \"rel-20250310-002\""), "{log}");
    // And the note is the documented JSON.
    let raw = git_in(&clone, &["notes", "--ref=fleetgate/cluster-a", "show", &commit.to_string()]);
    let note = StatusNote::parse(&raw).unwrap();
    assert_eq!((note.schema, note.context.as_str()), (2, "fleetgate/cluster-a"));
    let entry = &note.entries[0];
    assert_eq!((entry.sequence, entry.fleet.as_deref()), (Some(1), Some(status_support::FLEET)));
    assert!(entry.signature.as_deref().unwrap().starts_with("-----BEGIN SSH SIGNATURE-----"));
}
