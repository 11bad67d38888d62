//! Rollback without Git, against a real cluster with the agent as its ServiceAccount: the
//! last-known-good release's signed Git objects are kept in the spoke when it succeeds, and a
//! rollback re-verifies and applies them — with the target's tag deleted (and gone from the
//! agent's mirror), or the Git server stopped during the bake. Statuses that cannot reach Git wait
//! in the outbox and land once the daemon is back. Stored bytes that were tampered with are
//! refused, and so is a snapshot whose MAC does not verify (the rollback completes without it).

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate::status::State;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams};
use std::process::Command;

/// The index Secrets of the last-known-good store, by release.
async fn stored_releases(fleet: &Fleet) -> Vec<String> {
    let secrets: Api<Secret> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    let list = secrets.list_metadata(&ListParams::default().labels("fleetgate.io/lkg=true")).await.unwrap();
    list.items.iter().filter_map(|s| s.metadata.labels.as_ref()?.get("fleetgate.io/release").cloned()).collect()
}

/// Runs one pass until the state says `Baking`, then drops it: an agent killed mid-bake.
async fn kill_while_baking(fleet: &Fleet, mut agent: fleetgate::agent::Agent) {
    within("until Baking", 180, async {
        tokio::select! {
            r = agent.reconcile() => panic!("the pass ended before it was killed: {r:?}"),
            () = eventually("Baking", 170, || async { (fleet.phase().await.as_deref() == Some("Baking")).then_some(()) }) => {}
        }
    })
    .await;
}

/// Deletes tag `id` in the working clone and on the git daemon.
fn delete_tag(fleet: &Fleet, id: &str) {
    fleet.git(&["tag", "-d", id]);
    fleet.git(&["push", "-q", "origin", &format!(":refs/tags/{id}")]);
}

fn mirror_tags(settings: &fleetgate::agent::AgentSettings) -> String {
    let mirror = settings.state_dir.as_ref().unwrap().join("mirror.git");
    let out = Command::new("git").arg("--git-dir").arg(mirror).args(["tag", "-l"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two releases, the second crash-looping and promoted; returns its commit once the first ran.
async fn rel1_then_failing_rel2(fleet: &Fleet) -> String {
    rel1_then_failing_rel2_with(fleet, |_| {}).await
}

/// A [`Fleet::release`] edit: the CRD's schema carries a ~900 KB description, the size of a real
/// Operator's CRDs (the stored copy then spans chunks).
fn big_crd(render: &std::path::Path) {
    let path = render.join("crds/redisclusters.cache.example.com.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let long = format!("Number of Redis nodes. {}", "Lorem ipsum dolor sit amet. ".repeat(32 * 1024));
    std::fs::write(&path, text.replacen("Number of Redis nodes.", &long, 1)).unwrap();
}

/// [`rel1_then_failing_rel2`] with rel-1 made by `edit`.
async fn rel1_then_failing_rel2_with(fleet: &Fleet, edit: impl FnOnce(&std::path::Path)) -> String {
    fleet.set_gates("20s", STRICT_RESTARTS);
    fleet.release("rel-1", edit);
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    assert_eq!(stored_releases(fleet).await, ["rel-1"], "rel-1 is kept as last-known-good");
    drop(agent);
    let rel2 = fleet.release("rel-2", crash_looping);
    fleet.promote("rel-2");
    rel2
}

/// rel-2 fails its bake after rel-1's tag was deleted: the restarted agent's fresh mirror has no
/// rel-1 tag at all, and the rollback completes from the stored bytes — a copy of a release whose
/// CRD is as large as a real Operator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_target_tag_does_not_stop_the_rollback() {
    let fleet = Fleet::start("nogit-tag", true).await;
    let rel2 = rel1_then_failing_rel2_with(&fleet, big_crd).await;
    let (_, stored) = secrets_named(&fleet, &format!("fleetgate-{CLUSTER}-lkg-")).await;
    let bytes: usize = stored.iter().filter_map(|s| Some(s.data.as_ref()?.get("bundle")?.0.len())).sum();
    eprintln!("last-known-good copy of rel-1: {bytes} bytes in {} chunk Secret(s)", stored.len() - 1);
    assert!(
        bytes > 900_000 && stored.len() >= 3,
        "a ~900 KB CRD spans two chunks: {bytes} bytes, {} Secrets",
        stored.len()
    );
    kill_while_baking(&fleet, fleet.agent().await).await;
    delete_tag(&fleet, "rel-1");

    let settings = fleet.settings();
    let mut agent = fleet.agent_with(settings.clone()).await;
    assert_eq!(
        within("resume and roll back", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) }
    );
    let tags = mirror_tags(&settings);
    assert!(tags.contains("rel-2") && !tags.contains("rel-1"), "the agent's mirror lost rel-1: {tags}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    let failure = fleet.statuses(&rel2).pop().unwrap();
    assert_eq!((failure.state, failure.rollback_to.as_deref()), (State::Failure, Some("rel-1")));
}

/// The git daemon stops during rel-2's bake: the rollback completes, the `failure` status waits
/// in the outbox (a pass while Git is down fails fast and changes nothing; an agent restarted
/// meanwhile keeps it), and lands in the notes once the daemon is back on the same port. The
/// write-back the rollback owes Git (its push failed with Git away) waits in the state the same
/// way and is pushed by the first pass that reaches Git, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_git_server_does_not_stop_the_rollback_and_the_status_lands_later() {
    let mut fleet = Fleet::start("nogit-daemon", true).await;
    let rel2 = rel1_then_failing_rel2(&fleet).await;
    let writing_back = fleetgate::agent::AgentSettings { write_back: Some(true), ..fleet.settings() };
    let mut agent = fleet.agent_with(writing_back.clone()).await;
    let fleet_ref = &mut fleet;
    let stop = async move {
        eventually("Baking", 120, || async { (fleet_ref.phase().await.as_deref() == Some("Baking")).then_some(()) })
            .await;
        fleet_ref.daemon.stop();
    };
    let (outcome, ()) = within("rel-2", 240, async { tokio::join!(agent.reconcile(), stop) }).await;
    assert_eq!(outcome.unwrap(), Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) });
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    assert_eq!(fleet.phase().await.as_deref(), Some("Idle"), "the rollback is finished");
    let states = |fleet: &Fleet| fleet.statuses(&rel2).iter().map(|s| s.state).collect::<Vec<_>>();
    assert!(!states(&fleet).contains(&State::Failure), "no failure in Git yet: {:?}", states(&fleet));
    let outbox = fleet.outbox_text().await;
    assert!(outbox.contains("\"state\":\"failure\"") && outbox.contains("rel-1"), "the failure waits: {outbox}");
    let owed = fleet.state().await.pending_write_back().cloned().expect("the write-back waits in the state");
    assert_eq!((owed.failed.as_str(), owed.target.as_str()), ("rel-2", "rel-1"));

    // Git still down: the pass fails at once, nothing changes.
    assert!(within("a pass without Git", 60, agent.reconcile()).await.is_err());
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));

    // The agent restarts (a fresh Git cache, the local notes gone) while Git is still down: the
    // outbox is in the cluster, so nothing is lost.
    drop(agent);
    let mut agent = fleet.agent_with(writing_back).await;
    assert!(within("a restarted agent's pass without Git", 60, agent.reconcile()).await.is_err());
    assert!(fleet.outbox_text().await.contains("\"state\":\"failure\""), "the restart kept the outbox");

    // Back on the same port: the queued statuses land in order, each once; the outbox empties.
    fleet.daemon.restart().unwrap();
    assert_eq!(within("Git is back", 60, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-2".into()));
    let landed = fleet.statuses(&rel2);
    let failure = landed.last().unwrap();
    assert_eq!((failure.state, failure.rollback_to.as_deref()), (State::Failure, Some("rel-1")), "{landed:?}");
    let sequences: Vec<u64> = landed.iter().filter_map(|s| s.sequence).collect();
    assert!(sequences.windows(2).all(|w| w[0] < w[1]), "in order, each once: {sequences:?}");
    assert_eq!(landed.iter().filter(|s| s.state == State::Failure).count(), 1, "{landed:?}");
    assert_eq!(fleet.outbox_text().await, "[]");
    // The owed write-back: one commit pinning the canary to rel-1, nothing owed any more.
    assert_eq!(fleet.state().await.pending_write_back(), None);
    fleet.git(&["pull", "-q", "--ff-only", "origin", "main"]);
    let pins = fleet.git(&["log", "--format=%s", "--grep=^Fleetgate-Rolled-Back-To: rel-1"]);
    assert_eq!(pins, format!("fleetgate: roll {CLUSTER} back to rel-1"), "one write-back commit");
    // Git now asks for rel-1: the next pass has nothing to do.
    assert_eq!(within("after the write-back", 60, agent.reconcile()).await.unwrap(), Outcome::UpToDate);
}

/// Secrets of the agent's namespace whose name starts with `prefix`, as an admin sees them.
async fn secrets_named(fleet: &Fleet, prefix: &str) -> (Api<Secret>, Vec<Secret>) {
    let api: Api<Secret> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    let all = api.list(&ListParams::default()).await.unwrap().items;
    let picked =
        all.into_iter().filter(|s| s.metadata.name.as_deref().is_some_and(|n| n.starts_with(prefix))).collect();
    (api, picked)
}

/// Someone with write access to the agent's Secrets edits rel-1's stored bytes (its Deployment's
/// image). The rollback refuses them — specific error, status `error`, nothing from them applied —
/// and, with rel-1's tag gone as well, stays in RollingBack. With the bytes back as stored, the
/// next pass completes the rollback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_last_known_good_bytes_are_refused() {
    let fleet = Fleet::start("nogit-tamper", true).await;
    let rel2 = rel1_then_failing_rel2(&fleet).await;
    let inventory = format!("fleetgate-{CLUSTER}-lkg-");
    let (api, chunks) = secrets_named(&fleet, &inventory).await;
    let mut chunk = chunks.into_iter().find(|s| s.metadata.name.as_deref().is_some_and(|n| n.ends_with("-1"))).unwrap();
    let original = chunk.clone();
    let bytes = &mut chunk.data.as_mut().unwrap().get_mut("bundle").unwrap().0;
    let at =
        bytes.windows(8).position(|w| w == b"v-rel-1\n" || w == b"v-rel-1\"").expect("rel-1's image in the bundle");
    bytes[at + 6] = b'9';
    let name = chunk.metadata.name.clone().unwrap();
    api.replace(&name, &PostParams::default(), &chunk).await.unwrap();

    kill_while_baking(&fleet, fleet.agent().await).await;
    delete_tag(&fleet, "rel-1");
    let mut agent = fleet.agent().await;
    let err = within("refused rollback", 240, agent.reconcile()).await.expect_err("the rollback cannot use the bytes");
    assert_eq!(err.reason(), "LastKnownGoodRefused", "{err:?}");
    let message = fleetgate::model::error_chain(&err);
    assert!(message.contains("stored copy") && message.contains("tampered with"), "{message}");
    assert_eq!(fleet.phase().await.as_deref(), Some("RollingBack"));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-2")), "nothing of the tampered copy applied");
    let error = fleet.statuses(&rel2).pop().unwrap();
    assert_eq!(error.state, State::Error, "{error:?}");
    assert!(error.description.contains("tampered with"), "{}", error.description);

    let mut back = original;
    back.metadata.resource_version = api.get(&name).await.unwrap().metadata.resource_version;
    api.replace(&name, &PostParams::default(), &back).await.unwrap();
    assert_eq!(
        within("rollback with the bytes as stored", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) }
    );
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
}

/// rel-2's pre-apply snapshot (of rel-1) is edited during the bake: its MAC no longer verifies, so
/// the rollback applies rel-1 without restoring it and says so in a Warning Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_whose_mac_fails_is_not_restored_and_the_rollback_completes() {
    let fleet = Fleet::start("nogit-snapmac", true).await;
    let rel2 = rel1_then_failing_rel2(&fleet).await;
    let mut agent = fleet.agent().await;
    let tamper = async {
        eventually("Baking", 120, || async { (fleet.phase().await.as_deref() == Some("Baking")).then_some(()) }).await;
        let (api, chunks) = secrets_named(&fleet, &format!("fleetgate-{CLUSTER}-snapshot-s")).await;
        let mut chunk = chunks.into_iter().find(|s| s.data.is_some()).expect("a snapshot chunk");
        // A valid gzip stream of other JSON (a space more): only the MAC can tell.
        let data = &mut chunk.data.as_mut().unwrap().get_mut("objects.json").unwrap().0;
        let mut json = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(data.as_slice()), &mut json).unwrap();
        json.push(b' ');
        let mut edited = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut edited, &json).unwrap();
        *data = edited.finish().unwrap();
        api.replace(&chunk.metadata.name.clone().unwrap(), &PostParams::default(), &chunk).await.unwrap();
    };
    let (outcome, ()) = within("rel-2", 240, async { tokio::join!(agent.reconcile(), tamper) }).await;
    assert_eq!(outcome.unwrap(), Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) });
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    let events = fleet.events_json().await;
    assert!(
        events.contains("SnapshotRefused")
            && events.contains("rel-1 applied, snapshot not restored")
            && events.contains("does not verify under the agent key"),
        "{events}"
    );
    let failure = fleet.statuses(&rel2).pop().unwrap();
    assert_eq!((failure.state, failure.rollback_to.as_deref()), (State::Failure, Some("rel-1")));
}
