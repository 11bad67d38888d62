//! The source against a real `git daemon`: mirroring, cheap change detection (an unchanged
//! remote costs one ref listing and no fetch), tags and status notes, local paths and
//! `file://` URLs, and network failures that are retried and leave the mirror intact.

use crate::fleet_support;

use fleet_support::{FleetRemote, RELEASE};
use fleetgate::model::ErrorClass;
use fleetgate::source::{Credentials, NotesSchedule, RetryPolicy, Source, SourceError, SourceStats};
use std::time::Duration;

#[test]
fn an_unchanged_remote_costs_one_ls_remote_and_no_fetch() {
    let remote = FleetRemote::new();
    let state = tempfile::tempdir().unwrap();
    let mut source = remote.source(state.path());

    let first = source.sync().unwrap();
    assert!(first.fetched);
    assert_eq!(source.stats(), SourceStats { ls_remotes: 1, fetches: 1, notes_fetches: 0 });

    let second = source.sync().unwrap();
    assert!(!second.fetched);
    assert_eq!(second.tip, first.tip);
    assert_eq!(
        source.stats(),
        SourceStats { ls_remotes: 2, fetches: 1, notes_fetches: 0 },
        "an unchanged remote was fetched"
    );

    // A new tag is a change; so is a new commit.
    remote.signed_tag(RELEASE);
    assert!(source.sync().unwrap().fetched);
    assert_eq!(source.stats(), SourceStats { ls_remotes: 3, fetches: 2, notes_fetches: 0 });
    assert!(source.checkout().unwrap().tag(RELEASE).unwrap().is_some());

    let tip = {
        remote.git(&["commit", "-q", "--allow-empty", "-m", "next"]);
        remote.git(&["push", "-q", "origin", "main"]);
        remote.git(&["rev-parse", "HEAD"]).trim().to_string()
    };
    let third = source.sync().unwrap();
    assert!(third.fetched);
    assert_eq!(third.tip.to_string(), tip);
    assert_eq!(source.stats(), SourceStats { ls_remotes: 4, fetches: 3, notes_fetches: 0 });

    // A source reopened on the same state directory (an agent restart) starts from the mirror.
    let mut reopened = remote.source(state.path());
    assert!(!reopened.sync().unwrap().fetched);
    assert_eq!(reopened.stats(), SourceStats { ls_remotes: 1, fetches: 0, notes_fetches: 0 });
}

#[test]
fn tags_and_status_notes_are_mirrored_and_deleted_tags_pruned() {
    let remote = FleetRemote::new();
    remote.signed_tag(RELEASE);
    remote.git(&["tag", "-a", "scratch", "-m", "to be deleted"]);
    remote.git(&["push", "-q", "origin", "refs/tags/scratch"]);
    remote.git(&["notes", "--ref=fleetgate/cluster-a", "add", "-m", r#"{"state":"success"}"#, RELEASE]);
    remote.git(&["push", "-q", "origin", "refs/notes/fleetgate/cluster-a"]);

    let state = tempfile::tempdir().unwrap();
    let (mut source, checkout) = remote.checkout(state.path());
    let refs = source.local_refs().unwrap();
    assert!(refs.refs.contains_key("refs/notes/fleetgate/cluster-a"), "{refs:?}");
    assert!(checkout.tag("scratch").unwrap().is_some());
    assert_eq!(source.ls_remote().unwrap(), refs);

    remote.git(&["push", "-q", "origin", ":refs/tags/scratch"]);
    assert!(source.sync().unwrap().fetched);
    assert!(source.checkout().unwrap().tag("scratch").unwrap().is_none());
    assert!(source.checkout().unwrap().tag(RELEASE).unwrap().is_some());
}

#[test]
fn local_paths_and_file_urls_work_like_remotes() {
    let remote = FleetRemote::new();
    let bare = remote.daemon.path("fleet.git");
    for url in [bare.display().to_string(), format!("file://{}", bare.display())] {
        let state = tempfile::tempdir().unwrap();
        let mut source = Source::open(&url, state.path(), Credentials::default()).unwrap();
        assert!(source.sync().unwrap().fetched, "{url}");
        assert!(!source.sync().unwrap().fetched, "{url}");
        let checkout = source.checkout().unwrap();
        assert_eq!(checkout.branch(), "main");
    }
}

#[test]
fn a_missing_branch_is_named() {
    let remote = FleetRemote::new();
    let state = tempfile::tempdir().unwrap();
    let mut source = remote.source(state.path()).with_branch("production");
    let err = source.sync().unwrap_err();
    assert!(matches!(&err, SourceError::BranchNotFound { branch, .. } if branch == "production"), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Stalling);
}

#[test]
fn network_errors_are_retried_with_backoff_and_leave_the_mirror_intact() {
    let remote = FleetRemote::new();
    let state = tempfile::tempdir().unwrap();
    let (_, before) = remote.checkout(state.path());
    let tip = before.tip();
    drop(before);

    // The same state directory, now pointing at a port where nothing listens.
    let port = fleetgate_testenv::process::free_port();
    let retry = RetryPolicy { attempts: 3, initial: Duration::from_millis(100), max: Duration::from_millis(150) };
    let mut source = Source::open(&format!("git://127.0.0.1:{port}/fleet.git"), state.path(), Credentials::default())
        .unwrap()
        .with_retry(retry);
    let started = std::time::Instant::now();
    let err = source.sync().unwrap_err();
    assert!(matches!(err, SourceError::Network { attempts: 3, .. }), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Retryable);
    assert_eq!(source.stats(), SourceStats { ls_remotes: 3, fetches: 0, notes_fetches: 0 });
    assert!(started.elapsed() >= Duration::from_millis(250), "no backoff between attempts");

    // The mirror still serves the last good state.
    let checkout = source.checkout().unwrap();
    assert_eq!(checkout.tip(), tip);
    assert!(fleetgate::model::FleetConfig::load(&checkout.tip_tree().unwrap()).is_ok());
}

#[test]
fn status_notes_fast_forward_and_unpushed_local_notes_survive_a_sync() {
    let remote = FleetRemote::new();
    remote.signed_tag(RELEASE);
    let note = |cluster: &str, text: &str| {
        remote.git(&[
            "notes",
            &format!("--ref=fleetgate/{cluster}"),
            "append",
            "-m",
            text,
            &format!("{RELEASE}^{{commit}}"),
        ]);
        remote.git(&["push", "-q", "origin", &format!("refs/notes/fleetgate/{cluster}")]);
    };
    note("cluster-a", "remote 1");
    let state = tempfile::tempdir().unwrap();
    let (mut source, checkout) = remote.checkout(state.path());
    let repo = checkout.repo();
    let tagged = checkout.tag(RELEASE).unwrap().unwrap().commit;
    let read = |source: &Source, cluster: &str| -> String {
        let repo = source.checkout().unwrap();
        let n = repo.repo().find_note(Some(&format!("refs/notes/fleetgate/{cluster}")), tagged).unwrap();
        n.message().unwrap().to_string()
    };
    assert_eq!(read(&source, "cluster-a").trim(), "remote 1");

    // The agent of cluster-a writes a note into the mirror and has not pushed it yet.
    let sig = git2::Signature::now("agent", "agent@x").unwrap();
    repo.note(&sig, &sig, Some("refs/notes/fleetgate/cluster-a"), tagged, "local, unpushed", true).unwrap();
    // An unpushed local note is not a remote change.
    assert!(!source.sync().unwrap().fetched);

    // Meanwhile the remote's cluster-a notes move on (another writer) and cluster-b reports.
    note("cluster-a", "remote 2");
    note("cluster-b", "b reports");
    assert!(source.sync().unwrap().fetched);
    assert_eq!(read(&source, "cluster-a"), "local, unpushed", "a fetch overwrote an unpushed note");
    assert_eq!(read(&source, "cluster-b").trim(), "b reports");
    assert!(!source.sync().unwrap().fetched);

    // A local ref that is merely behind fast-forwards.
    note("cluster-b", "b again");
    assert!(source.sync().unwrap().fetched);
    assert!(read(&source, "cluster-b").contains("b again"));
}

/// One fetch per release change, not one per sibling status: an agent that waits at no gate
/// leaves moved notes on the remote; a waiting agent fetches them once every cluster it waits
/// for has moved; a branch change brings every note along in its one fetch.
#[test]
fn status_notes_alone_are_fetched_only_when_the_gate_could_open() {
    let remote = FleetRemote::new();
    remote.signed_tag(RELEASE);
    let note = |cluster: &str, text: &str| {
        let target = format!("{RELEASE}^{{commit}}");
        remote.git(&["notes", &format!("--ref=fleetgate/{cluster}"), "append", "-m", text, &target]);
        remote.git(&["push", "-q", "origin", &format!("refs/notes/fleetgate/{cluster}")]);
    };
    let state = tempfile::tempdir().unwrap();
    let mut source = remote.source(state.path()).with_notes(NotesSchedule::Fresh);
    source.sync().unwrap();
    let has_note = |source: &Source, cluster: &str| {
        let checkout = source.checkout().unwrap();
        let tagged = checkout.tag(RELEASE).unwrap().unwrap().commit;
        checkout.repo().find_note(Some(&format!("refs/notes/fleetgate/{cluster}")), tagged).is_ok()
    };
    let set = |names: &[&str]| names.iter().map(|s| s.to_string()).collect();

    // Idle (the first sync's `All` is over): a sibling's status is not fetched.
    note("cluster-a", "a pending");
    let idle = source.sync().unwrap();
    assert!(!idle.fetched, "an idle agent fetched a sibling's status");
    assert!(!has_note(&source, "cluster-a"));

    // Waiting for a and b: a alone moved, so the gate cannot open yet.
    source.notes_schedule().wait_on(set(&["cluster-a", "cluster-b"]), std::time::Instant::now());
    assert!(!source.sync().unwrap().fetched);
    note("cluster-b", "b success");
    source.notes_schedule().wait_on(set(&["cluster-a", "cluster-b"]), std::time::Instant::now());
    let waiting = source.sync().unwrap();
    assert!(waiting.fetched && waiting.notes_only, "{waiting:?}");
    assert!(has_note(&source, "cluster-a") && has_note(&source, "cluster-b"));
    assert_eq!(source.stats().notes_fetches, 1);

    // The wait ended (not renewed): idle again. A branch change brings the notes with it.
    note("cluster-c", "c success");
    assert!(!source.sync().unwrap().fetched);
    remote.git(&["commit", "-q", "--allow-empty", "-m", "moved on"]);
    remote.git(&["push", "-q", "origin", "main"]);
    let release = source.sync().unwrap();
    assert!(release.fetched && !release.notes_only);
    assert!(has_note(&source, "cluster-c"));
    assert_eq!(source.stats().notes_fetches, 1);
}

/// Heartbeats move every few minutes per cluster: an agent's source neither fetches them nor
/// takes their move for a change; a reader's (`with_heartbeats`) mirrors them, force-updated,
/// fetching only when one moved and never re-fetching the release for it.
#[test]
fn heartbeat_refs_cost_agents_nothing_and_readers_only_a_fetch_when_one_moved() {
    use fleetgate::status::heartbeat::{self, heartbeat_ref};
    use fleetgate::status::{GitRemote, StatusIdentity, StatusSigner};
    let remote = FleetRemote::new();
    let (agent_state, reader_state, beats) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut agent = remote.source(agent_state.path());
    let mut reader = remote.source(reader_state.path()).with_heartbeats();
    agent.sync().unwrap();
    reader.sync().unwrap();
    let beat = || {
        let repo =
            git2::Repository::open_bare(beats.path()).or_else(|_| git2::Repository::init_bare(beats.path())).unwrap();
        let me = StatusIdentity::new("redis-fleet", StatusSigner::generate("cluster-a").unwrap());
        heartbeat::beat(&repo, &GitRemote::new(&remote.url), &me, "cluster-a", Duration::from_secs(60)).unwrap();
        repo.refname_to_id(&heartbeat_ref("cluster-a")).unwrap()
    };
    for _ in 0..2 {
        let tip = beat();
        let before = agent.stats();
        assert!(!agent.sync().unwrap().fetched);
        assert_eq!(
            agent.stats(),
            SourceStats { ls_remotes: before.ls_remotes + 1, ..before },
            "an agent fetched for a heartbeat"
        );
        let mirror = git2::Repository::open_bare(agent.state_dir().join("mirror.git")).unwrap();
        assert!(mirror.find_reference(&heartbeat_ref("cluster-a")).is_err(), "an agent mirrored a heartbeat");

        let before = reader.stats();
        assert!(!reader.sync().unwrap().fetched, "a heartbeat is no release change");
        assert_eq!(reader.stats().fetches, before.fetches + 1);
        let mirror = reader.checkout().unwrap();
        assert_eq!(
            mirror.repo().refname_to_id(&heartbeat_ref("cluster-a")).unwrap(),
            tip,
            "force-updated to the new beat"
        );
    }
    // Nothing moved: no fetch.
    let before = reader.stats();
    reader.sync().unwrap();
    assert_eq!(reader.stats().fetches, before.fetches);
}
