//! A Prometheus gate that fails during the bake rolls the cluster back: a real Prometheus scrapes
//! a metrics endpoint this test serves, the release's error rate rises above the gate's 5 %, and
//! the agent puts the previous release back and reports `failure` with the figure and threshold.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::config::Named;
use fleetgate::agent::{AgentSettings, Outcome};
use fleetgate::status::State;
use fleetgate_testenv::Prometheus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Serves `operator_error_ratio <value>` on `/metrics`; returns the address and the value's handle.
async fn metrics_endpoint(initial: f64) -> (std::net::SocketAddr, Arc<Mutex<f64>>) {
    let value = Arc::new(Mutex::new(initial));
    let shared = value.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let v = *shared.lock().unwrap();
            async move { format!("# TYPE operator_error_ratio gauge\noperator_error_ratio {v}\n") }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_rate_above_the_gate_rolls_back_to_the_previous_release() {
    let (addr, error_ratio) = metrics_endpoint(0.01).await;
    let prometheus = Prometheus::start(addr).await.unwrap();
    prometheus.wait_for_scrape(Duration::from_secs(30)).await.unwrap();
    let fleet = Fleet::start("agent-prom", true).await;
    // The policy names the agent's endpoint; the agent maps it (`--prometheus monitoring=URL`).
    fleet.set_policy(
        "4s",
        "  prometheus: monitoring\n",
        "    - name: error-rate\n      onUnknown: fail\n      prometheus: {query: max(operator_error_ratio), max: 5%}\n",
    );

    let rel1 = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let prometheus_flag = Named::list(&[format!("monitoring={}", prometheus.url())]);
    let mut agent = fleet.agent_with(AgentSettings { prometheus: prometheus_flag, ..fleet.settings() }).await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    let passed = fleet.statuses(&rel1).pop().unwrap();
    assert_eq!(passed.gates[0].observed, "1 %");

    // rel-2 makes the Operator fail one request in five.
    *error_ratio.lock().unwrap() = 0.2;
    eventually("Prometheus sees the new error rate", 30, || async {
        let v = prometheus.query("max(operator_error_ratio)").await.ok()?;
        (v.to_string().contains("0.2")).then_some(())
    })
    .await;
    let rel2 = fleet.release("rel-2", |_| {});
    fleet.promote("rel-2");
    assert_eq!(
        within("rel-2", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) }
    );

    let failure = fleet.statuses(&rel2).pop().unwrap();
    assert_eq!(failure.state, State::Failure);
    assert!(failure.description.starts_with("rolled back to rel-1: error-rate"), "{}", failure.description);
    assert_eq!(failure.rollback_to.as_deref(), Some("rel-1"));
    let gate = &failure.gates[0];
    assert_eq!((gate.name.as_str(), gate.observed.as_str(), gate.verdict.as_str()), ("error-rate", "20 %", "fail"));
    assert!(gate.threshold.contains("5 %"), "{gate:?}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")), "rel-1's Operator runs again");
    let state = fleet.state().await;
    assert_eq!((state.current(), state.last_known_good()), (Some("rel-1"), Some("rel-1")));
    assert_eq!(state.rejected()["rel-2"].failure.reason, "GateFailed");
    assert_eq!(within("after", 30, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-2".into()));
}
