//! Kubernetes Events against a real API server: each state transition becomes an `events.k8s.io/v1`
//! Event on the state ConfigMap (reason = category, Warning for failures), and an error's whole
//! source chain is recorded, cut to the API's 1024-byte note limit.

use chrono::Utc;
use fleetgate::agent::events::{EventRecorder, REPORTING_CONTROLLER};
use fleetgate::agent::state::{Failure, StateStore};
use fleetgate_testenv::{ClusterOptions, DeployManifests, TestCluster};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};

const NS: &str = "fleetgate-system";

#[derive(Debug, thiserror::Error)]
#[error("applying {release}")]
struct ApplyError {
    release: String,
    #[source]
    source: std::io::Error,
}

#[tokio::test]
async fn transitions_and_errors_become_events_on_the_state_configmap() {
    let cluster = TestCluster::start(ClusterOptions::new("events")).await.expect("test cluster starts");
    // The store and the recorder act as the agent's ServiceAccount (deploy/'s RBAC).
    let agent = cluster.deploy_agent(&DeployManifests::shipped().unwrap()).await.expect("deploy/ applied").client();

    let store = StateStore::new(agent.clone(), NS, "canary");
    store.load().await.unwrap();
    let regarding = store.object_ref().await.unwrap();
    assert!(regarding.uid.is_some(), "{regarding:?}");
    let recorder = EventRecorder::new(agent, "fleetgate-agent-7d9f_0a1b2c3d");

    let steps = [
        store
            .update(|s| {
                s.observe_desired(Some("rel-1"), false);
                s.begin("rel-1", "c1", Utc::now())
            })
            .await
            .unwrap()
            .1,
        store.update(|s| s.start_apply(None, None)).await.unwrap().1,
        store
            .update(|s| {
                s.start_rollback(Failure::new("ApplyFailed", "CRD not established in 60s"), Vec::new(), Utc::now())
            })
            .await
            .unwrap()
            .1,
    ];
    for t in &steps {
        recorder.transition(&regarding, t).await.expect("event recorded");
    }
    let long = ApplyError { release: "rel-1".into(), source: std::io::Error::other("x".repeat(3000)) };
    recorder.error(&regarding, "ApplyFailed", "Apply", &long).await.expect("error event recorded");

    let events: Api<Event> = Api::namespaced(cluster.client(), NS);
    let mut list = events.list(&ListParams::default()).await.unwrap().items;
    list.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
    let seen: Vec<(String, String, String)> =
        list.iter().map(|e| (e.type_.clone().unwrap(), e.reason.clone().unwrap(), e.action.clone().unwrap())).collect();
    let expected = [
        ("Normal", "ReleaseStarted", "Verify"),
        ("Normal", "ApplyStarted", "Apply"),
        ("Warning", "RollbackStarted", "Rollback"),
        ("Warning", "ApplyFailed", "Apply"),
    ]
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()));
    assert_eq!(seen, expected);
    for e in &list {
        let r = e.regarding.as_ref().unwrap();
        assert_eq!(
            (r.kind.as_deref(), r.name.as_deref(), &r.uid),
            (Some("ConfigMap"), Some("fleetgate-state-canary"), &regarding.uid)
        );
        assert_eq!(e.reporting_controller.as_deref(), Some(REPORTING_CONTROLLER));
        assert_eq!(e.reporting_instance.as_deref(), Some("fleetgate-agent-7d9f_0a1b2c3d"));
    }
    let rollback_note = list[2].note.as_deref().unwrap();
    assert!(
        rollback_note.contains("ApplyFailed: CRD not established in 60s")
            && rollback_note.contains("removing its workloads and webhooks (no earlier release succeeded here)"),
        "{rollback_note}"
    );
    let error_note = list[3].note.as_deref().unwrap();
    assert!(error_note.starts_with("applying rel-1: xxx"), "{error_note}");
    assert!(error_note.len() <= 1024 && error_note.ends_with('…'), "{} bytes", error_note.len());
}
