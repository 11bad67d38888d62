//! What a pusher can make the agent download and read is bounded, and hitting a bound never costs
//! the cluster its release: a signed release whose `release.yaml` is a 1.5 GB blob is refused by
//! its size (status `error`, nothing read into memory), a junk tag whose pack is over
//! `--max-fetch-bytes` is left out of the mirror with a `FetchRefused` Event (and asking for it is
//! an error that says so, not "no such tag"), a remote with more
//! tags than `--max-tags` is not fetched — and in each case the current release stays applied and
//! a good release pushed afterwards still rolls out.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::{AgentSettings, Outcome};
use fleetgate::status::State;
use fleetgate_testenv::git_in_env;
use std::path::Path;

/// The highest resident set size of this process so far (`VmHWM`), in bytes. The agent runs
/// in-process; the API server and git daemon are other processes.
fn peak_rss() -> u64 {
    fleetgate_testenv::process::memory_kib("self", "VmHWM").unwrap() * 1024
}

/// Writes `path` into the object database of the working clone and returns the blob's id.
fn hash_object(fleet: &Fleet, path: &Path) -> String {
    fleet.git(&["hash-object", "-w", path.to_str().unwrap()])
}

/// A commit (not on any branch) of `base`'s tree with `file` replaced by `blob`.
fn commit_with_blob(fleet: &Fleet, base: &str, file: &str, blob: &str) -> String {
    let index = fleet.dir.path().join("junk.index");
    let index = index.to_str().unwrap();
    let env = [("GIT_INDEX_FILE", index)];
    git_in_env(&fleet.work, &env, &["read-tree", &format!("{base}^{{tree}}")]);
    git_in_env(&fleet.work, &env, &["update-index", "--add", "--cacheinfo", &format!("100644,{blob},{file}")]);
    let tree = git_in_env(&fleet.work, &env, &["write-tree"]);
    fleet.git(&["commit-tree", &tree, "-p", &format!("{base}^{{commit}}"), "-m", &format!("{file}: a large blob")])
}

fn has_event(events: &str, reason: &str, text: &str) -> bool {
    let events: serde_json::Value =
        serde_json::from_str(events.lines().next().unwrap()).expect("events.k8s.io Events as JSON");
    events
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["reason"] == reason && e["note"].as_str().is_some_and(|n| n.contains(text)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_release_yaml_is_1_5_gb_is_refused_by_size_and_the_cluster_keeps_serving() {
    let fleet = Fleet::start("fetch-blob", true).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 180, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    // 1.5 GB of zeros: a sparse file, a pack of about 1.5 MB. Signed by the trusted key, so only
    // its size stands between it and the agent's memory.
    const SIZE: u64 = 1536 * 1024 * 1024;
    let sparse = fleet.dir.path().join("huge.yaml");
    std::fs::File::create(&sparse).unwrap().set_len(SIZE).unwrap();
    let blob = hash_object(&fleet, &sparse);
    std::fs::remove_file(&sparse).unwrap();
    let junk = commit_with_blob(&fleet, "rel-1", "release.yaml", &blob);
    fleet.gpg.run_git(&fleet.work, &fleet.fpr, &["tag", "-s", "-m", "rel-2", "rel-2", &junk]).unwrap();
    fleet.git(&["push", "-q", "origin", "rel-2"]);
    fleet.promote("rel-2");

    let before = peak_rss();
    let outcome = within("rel-2", 180, agent.reconcile()).await.unwrap();
    let Outcome::Refused { release, reason } = &outcome else { panic!("expected a refusal, got {outcome:?}") };
    assert_eq!(release, "rel-2");
    let limit = fleetgate::model::MAX_YAML_BYTES;
    assert!(reason.contains(&format!("release.yaml: {SIZE} bytes, over the {limit}-byte limit")), "{reason}");
    let statuses = fleet.statuses(&junk);
    assert_eq!(statuses.last().map(|s| s.state), Some(State::Error), "{statuses:?}");
    assert!(statuses.last().unwrap().description.contains(&format!("{SIZE} bytes")), "{statuses:?}");
    let peak = peak_rss();
    assert!(peak < 512 << 20, "peak RSS {} MiB (before the pass: {} MiB)", peak >> 20, before >> 20);
    println!("peak RSS of the test process (agent in-process): {} MiB", peak >> 20);

    // The cluster still runs rel-1; the agent keeps working: a good release rolls out.
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    assert_eq!(fleet.state().await.current(), Some("rel-1"));
    fleet.release("rel-3", |_| {});
    fleet.promote("rel-3");
    assert_eq!(within("rel-3", 180, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-3".into()));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-3")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_junk_tag_over_the_pack_limit_is_left_out_and_later_releases_still_roll_out() {
    let fleet = Fleet::start("fetch-pack", true).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    const LIMIT: u64 = 8 << 20;
    let settings = AgentSettings { max_fetch_bytes: Some(LIMIT), ..fleet.settings() };
    let mut agent = fleet.agent_with(settings.clone()).await;
    assert_eq!(within("rel-1", 180, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    // 48 MiB that do not compress, on a tag nobody signed, off the branch.
    let random = fleet.dir.path().join("random.bin");
    let mut bytes = vec![0u8; 48 << 20];
    rand::fill(&mut bytes[..]);
    std::fs::write(&random, &bytes).unwrap();
    drop(bytes);
    let blob = hash_object(&fleet, &random);
    let junk = commit_with_blob(&fleet, "rel-1", "operator/blob.yaml", &blob);
    fleet.git(&["tag", "junk", &junk]);
    fleet.git(&["push", "-q", "origin", "junk"]);

    assert_eq!(within("junk pushed", 120, agent.reconcile()).await.unwrap(), Outcome::UpToDate);
    let events = fleet.events_json().await;
    let said = "fetching tag junk was aborted after";
    assert!(has_event(&events, "FetchRefused", said), "no FetchRefused Event saying {said:?}: {events}");
    assert!(has_event(&events, "FetchRefused", &format!("over the --max-fetch-bytes limit of {LIMIT}")), "{events}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));

    // Asked for, the junk tag is an error that says why it is missing; nothing changes.
    fleet.promote("junk");
    let err = within("junk promoted", 120, agent.reconcile()).await.unwrap_err();
    let text = fleetgate::model::error_chain(&err);
    assert!(text.contains("tag junk is not in the mirror: ") && text.contains(said), "{text}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));

    // A release pushed after the junk tag rolls out; the junk tag is not fetched again.
    fleet.release("rel-2", |_| {});
    fleet.promote("rel-2");
    assert_eq!(within("rel-2", 180, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-2".into()));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-2")));
    let events = fleet.events_json().await;
    let refusals = serde_json::from_str::<serde_json::Value>(events.lines().next().unwrap()).unwrap();
    let refusals = refusals.as_array().unwrap().iter().filter(|e| e["reason"] == "FetchRefused").count();
    assert_eq!(refusals, 1, "the junk tag was reported more than once: {events}");
    let peak = peak_rss();
    assert!(peak < 512 << 20, "peak RSS {} MiB", peak >> 20);

    // More tags than --max-tags (rel-1, rel-2, junk): nothing is fetched, the error says why.
    drop(agent);
    let mut agent = fleet.agent_with(AgentSettings { max_tags: Some(2), ..settings }).await;
    let err = within("too many tags", 60, agent.reconcile()).await.unwrap_err();
    let text = fleetgate::model::error_chain(&err);
    assert!(text.contains("lists 3 tags, over the --max-tags limit of 2; nothing was fetched"), "{text}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-2")));
}
