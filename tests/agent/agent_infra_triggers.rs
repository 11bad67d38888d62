//! The file-system trigger against real Git: a push into a bare repo, a commit in a work tree and a
//! new tag each wake the loop within about a second, once per burst, while work-tree edits, index
//! updates and object writes do not.

use fleetgate::agent::triggers::{RefWatcher, TriggerSource, Triggers};
use fleetgate_testenv::git_in;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// A wake from the watcher within `limit`, with its latency measured from just before the Git command.
async fn expect_wake(triggers: &mut Triggers, started: Instant, limit: Duration) -> Duration {
    let wake = tokio::time::timeout(limit, triggers.next()).await.expect("the loop wakes");
    assert_eq!(wake.sources, BTreeSet::from([TriggerSource::GitRefs]));
    started.elapsed()
}

async fn expect_quiet(triggers: &mut Triggers) {
    if let Ok(wake) = tokio::time::timeout(Duration::from_millis(600), triggers.next()).await {
        panic!("unexpected wake {wake:?}");
    }
}

#[tokio::test]
async fn pushes_commits_and_tags_wake_the_loop_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("fleet.git");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    git_in(dir.path(), &["init", "-q", "--bare", "fleet.git"]);
    git_in(&work, &["init", "-q"]);
    std::fs::write(work.join("fleet.yaml"), "kind: Fleet\n").unwrap();
    git_in(&work, &["add", "."]);
    git_in(&work, &["commit", "-q", "-m", "first"]);
    git_in(&work, &["remote", "add", "origin", bare.to_str().unwrap()]);

    // The agent watches the bare repo (what a Git server holds) ...
    let (mut triggers, sender) = Triggers::new(Duration::from_secs(3600));
    triggers.next().await; // startup
    let watcher = RefWatcher::start(&bare, sender.clone()).expect("watching the bare repo");
    assert!(watcher.watched().iter().any(|p| p.ends_with("refs")), "{:?}", watcher.watched());

    let mut latencies = Vec::new();
    let t = Instant::now();
    git_in(&work, &["push", "-q", "origin", "main"]);
    latencies.push(("push to bare repo", expect_wake(&mut triggers, t, Duration::from_secs(2)).await));
    expect_quiet(&mut triggers).await;

    let t = Instant::now();
    git_in(&work, &["tag", "-a", "-m", "release", "rel-1"]);
    git_in(&work, &["push", "-q", "origin", "rel-1"]);
    latencies.push(("tag push", expect_wake(&mut triggers, t, Duration::from_secs(2)).await));

    // ... or a work tree (a local checkout used as the fleet repo).
    drop(watcher);
    let _watcher = RefWatcher::start(&work, sender).expect("watching the work tree");
    expect_quiet(&mut triggers).await;
    // Editing and staging files changes the work tree and index, not refs.
    std::fs::write(work.join("fleet.yaml"), "kind: Fleet\nmetadata: {}\n").unwrap();
    git_in(&work, &["add", "."]);
    expect_quiet(&mut triggers).await;
    let t = Instant::now();
    git_in(&work, &["commit", "-q", "-m", "second"]);
    latencies.push(("commit in work tree", expect_wake(&mut triggers, t, Duration::from_secs(2)).await));
    // Packing refs rewrites packed-refs: a ref change as far as readers are concerned.
    let t = Instant::now();
    git_in(&work, &["pack-refs", "--all"]);
    latencies.push(("pack-refs", expect_wake(&mut triggers, t, Duration::from_secs(2)).await));

    for (what, took) in &latencies {
        println!("{what}: loop woken after {took:?}");
        assert!(*took < Duration::from_secs(1), "{what} took {took:?}");
    }
}

#[test]
fn a_path_that_is_not_a_repo_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_triggers, sender) = Triggers::new(Duration::from_secs(10));
    let err = RefWatcher::start(dir.path(), sender).err().expect("refused");
    assert!(err.to_string().contains("is not a Git repository"), "{err}");
}
