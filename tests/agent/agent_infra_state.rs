//! The agent's state store against a real API server: the state ConfigMap is created on first
//! load, every transition is persisted so a new process (a restart) resumes mid-operation, two
//! writers conflict on resourceVersion and the loser re-applies its change to the fresh state, and a
//! ConfigMap edited by anyone but the agent (its MAC fails) is refused with a way out instead of
//! being silently reset.

use chrono::Utc;
use fleetgate::agent::state::{Failure, Next, Phase, Progress, StateError, StateStore, TransitionError};
use fleetgate::apply::AgentKey;
use fleetgate::release::TagPins;
use fleetgate_testenv::wait::within;
use fleetgate_testenv::{ClusterOptions, DeployManifests, TestCluster};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams};
use std::collections::BTreeMap;

const NS: &str = "fleetgate-system";

/// A cluster with deploy/ applied, and a client as the agent's ServiceAccount: the store works
/// with exactly the RBAC we ship.
async fn deployed_cluster(name: &str) -> (TestCluster, kube::Client) {
    let cluster = TestCluster::start(ClusterOptions::new(name)).await.expect("test cluster starts");
    let agent = cluster.deploy_agent(&DeployManifests::shipped().unwrap()).await.expect("deploy/ applied").client();
    (cluster, agent)
}

/// Pins as verification would hand them over (a `TagPins` holding one tag).
fn pins(tag: &str, commit: &str) -> TagPins {
    serde_json::from_value(serde_json::json!({ "pins": { tag: commit } })).unwrap()
}

#[tokio::test]
async fn state_survives_a_restart_mid_operation_and_damage_is_refused() {
    let (cluster, agent) = deployed_cluster("state-restart").await;
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), NS);

    // First process: loads (creating the ConfigMap), runs rel-1 to success, starts rel-2 and dies
    // while baking.
    let store = StateStore::new(agent.clone(), NS, "canary");
    let state = within("load", 30, store.load()).await.unwrap();
    assert_eq!(state.phase(), Phase::Idle);
    let cm = configmaps.get("fleetgate-state-canary").await.expect("state ConfigMap created on load");
    assert_eq!(cm.metadata.labels.unwrap()["fleetgate.io/cluster"], "canary");

    within("rel-1", 30, async {
        store
            .update(|s| {
                s.observe_desired(Some("rel-1"), false);
                Ok(())
            })
            .await
            .unwrap();
        store
            .update(|s| {
                s.record_tag_pins(&pins("rel-1", "c1"));
                Ok(())
            })
            .await
            .unwrap();
        store.update(|s| s.begin("rel-1", "c1", Utc::now())).await.unwrap();
        store.update(|s| s.start_apply(None, None)).await.unwrap();
        store.update(|s| s.applied(Utc::now())).await.unwrap();
        store.update(|s| s.bake_passed()).await.unwrap();
        store
            .update(|s| {
                s.observe_desired(Some("rel-2"), false);
                Ok(())
            })
            .await
            .unwrap();
        store.update(|s| s.begin("rel-2", "c2", Utc::now())).await.unwrap();
        store.update(|s| s.start_apply(None, Some("snapshot-rel-1"))).await.unwrap();
        store.update(|s| s.applied(Utc::now())).await.unwrap();
    })
    .await;
    let data = configmaps.get("fleetgate-state-canary").await.unwrap().data.unwrap();
    assert_eq!(data["phase"], "Baking");
    assert_eq!(data["lastKnownGood"], "rel-1");
    drop(store);

    // Second process: reads the same state and resumes the bake.
    let restarted = StateStore::new(agent.clone(), NS, "canary");
    let state = within("reload", 30, restarted.load()).await.unwrap();
    match state.next() {
        Next::Resume(Progress::Baking { operation, .. }) => {
            assert_eq!(operation.release, "rel-2");
            assert_eq!(operation.rollback_target.as_deref(), Some("rel-1"));
            assert_eq!(operation.snapshot.as_deref(), Some("snapshot-rel-1"));
        }
        other => panic!("expected to resume baking rel-2, got {other:?}"),
    }
    assert_eq!(state.tag_pins().get("rel-1"), Some("c1"));
    within("rollback", 30, async {
        restarted
            .update(|s| s.start_rollback(Failure::new("GateFailed", "error rate 7%"), Vec::new(), Utc::now()))
            .await
            .unwrap();
        restarted.update(|s| s.rollback_finished()).await.unwrap();
    })
    .await;
    let again = StateStore::new(agent.clone(), NS, "canary");
    let state = within("reload", 30, again.load()).await.unwrap();
    assert_eq!(state.current(), Some("rel-1"));
    assert!(matches!(state.next(), Next::Rejected { release: "rel-2", .. }));

    // A refused transition writes nothing.
    let before = configmaps.get("fleetgate-state-canary").await.unwrap().metadata.resource_version;
    let err = within("refused", 30, again.update(|s| s.applied(Utc::now()))).await.unwrap_err();
    assert!(matches!(err, StateError::Transition(TransitionError::WrongPhase { .. })), "{err}");
    assert_eq!(configmaps.get("fleetgate-state-canary").await.unwrap().metadata.resource_version, before);

    // An edit by anyone but the agent (its MAC no longer verifies): refused with a way out, never
    // reset to empty (that would forget rejections and pins).
    let patch = serde_json::json!({ "data": { "phase": "Dancing" } });
    configmaps.patch("fleetgate-state-canary", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let err = within("edited", 30, StateStore::new(agent.clone(), NS, "canary").load()).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, StateError::Unauthenticated { .. }), "{text}");
    assert!(
        text.contains("does not verify")
            && text.contains("kubectl -n fleetgate-system get configmap fleetgate-state-canary")
            && text.contains("delete it and Secret fleetgate-system/fleetgate-state-key-canary"),
        "{text}"
    );
}

#[tokio::test]
async fn concurrent_writers_conflict_and_the_loser_reapplies_or_refuses() {
    let (_cluster, agent) = deployed_cluster("state-conflict").await;
    // Two replicas starting together: whichever creates the state first, both load it.
    let a = StateStore::new(agent.clone(), NS, "wave-1");
    let b = StateStore::new(agent.clone(), NS, "wave-1");
    let (loaded_a, loaded_b) = within("load", 30, async { tokio::join!(a.load(), b.load()) }).await;
    assert_eq!((loaded_a.unwrap().phase(), loaded_b.unwrap().phase()), (Phase::Idle, Phase::Idle));

    // The moment in between: one replica has made the state key but not yet the ConfigMap. The
    // other starts then; nothing was ever saved with that key, so it creates the state with it.
    let secrets: Api<Secret> = Api::namespaced(agent.clone(), NS);
    within("key", 30, AgentKey::create(&secrets, "fleetgate-state-key-wave-2", BTreeMap::new())).await.unwrap();
    let late = StateStore::new(agent.clone(), NS, "wave-2");
    assert_eq!(within("load", 30, late.load()).await.unwrap().phase(), Phase::Idle);
    let again = StateStore::new(agent.clone(), NS, "wave-2");
    assert_eq!(
        within("reload", 30, again.load()).await.unwrap().phase(),
        Phase::Idle,
        "sealed with the key in the Secret"
    );

    // Both start from the same resourceVersion. A writes first; B's write conflicts, B reloads and
    // re-applies its change (a commutative one: recording a tag pin) on top of A's.
    within("pins", 30, async {
        a.update(|s| {
            s.record_tag_pins(&pins("rel-1", "c1"));
            Ok(())
        })
        .await
        .unwrap();
        let (saved, ()) = b
            .update(|s| {
                s.record_tag_pins(&pins("rel-2", "c2"));
                Ok(())
            })
            .await
            .unwrap();
        // update returns what it saved: both pins.
        assert_eq!(saved.tag_pins().iter().collect::<Vec<_>>(), [("rel-1", "c1"), ("rel-2", "c2")]);
    })
    .await;
    let merged = within("reload", 30, a.load()).await.unwrap();
    assert_eq!(merged.tag_pins().iter().collect::<Vec<_>>(), [("rel-1", "c1"), ("rel-2", "c2")]);

    // Now both try to begin a release from Idle. Whoever is second sees the other's Verifying phase
    // after reloading and is refused: no lost update, no double start.
    within("begin", 30, async {
        a.update(|s| {
            s.observe_desired(Some("rel-2"), false);
            Ok(())
        })
        .await
        .unwrap();
        a.update(|s| s.begin("rel-2", "c2", Utc::now())).await.unwrap();
        let err = b.update(|s| s.begin("rel-2", "c2", Utc::now())).await.unwrap_err();
        assert!(
            matches!(err, StateError::Transition(TransitionError::WrongPhase { phase: Phase::Verifying, .. })),
            "{err}"
        );
    })
    .await;
    // B's cache now holds the fresh state.
    assert_eq!(b.cached().await.unwrap().phase(), Phase::Verifying);
}
