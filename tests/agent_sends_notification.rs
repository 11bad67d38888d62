//! With `--notify-url oncall=URL` (and `notify: oncall` in fleet.yaml), a rollback is POSTed to a receiver this test runs on loopback, naming the
//! release, the release rolled back to, and the failing gate with its figure and threshold. A
//! release that passes sends nothing.

mod agent_support;

use agent_support::*;
use axum::routing::post;
use fleetgate::agent::Outcome;
use fleetgate::agent::config::NamedUrls;
use tokio::sync::mpsc;

/// A gate that fails at once: the Deployment it waits for never exists.
const FAILING_GATES: &str = "    - name: canary-probe\n      onUnknown: fail\n      deploymentAvailable: {names: [redis-operator-canary-probe]}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_is_notified_with_the_failing_gate() {
    let (tx, mut received) = mpsc::unbounded_channel::<serde_json::Value>();
    let app = axum::Router::new().route(
        "/hook",
        post(move |body: String| {
            let tx = tx.clone();
            async move {
                tx.send(serde_json::from_str(&body).expect("JSON body")).unwrap();
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let fleet = Fleet::start("agent-notify", true).await;
    // The fleet names the agent's endpoint; the URL (a secret) is only the agent's.
    fleet.edit("fleet.yaml", "notify: default", "notify: oncall");
    fleet.commit_and_push("notify the on-call channel");
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let notify_url = NamedUrls::parse(&[format!("oncall={url}")]);
    let mut agent = fleet.agent_with(fleetgate::agent::AgentSettings { notify_url, ..fleet.settings() }).await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    assert!(received.try_recv().is_err(), "a release that passes is not notified");

    fleet.set_gates("4s", FAILING_GATES);
    fleet.release("rel-2", |_| {});
    fleet.promote("rel-2");
    assert_eq!(
        within("rel-2", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) }
    );

    let body = within("the notification", 10, received.recv()).await.expect("a notification");
    let details = &body["fleetgate"];
    assert_eq!(details["cluster"], CLUSTER);
    assert_eq!(details["kind"], "rollback");
    assert_eq!(details["release"], "rel-2");
    assert_eq!(details["rolledBackTo"], "rel-1");
    assert_eq!(details["reason"], "GateFailed");
    assert_eq!(details["gate"], "canary-probe");
    assert!(details["figure"].as_str().unwrap().starts_with("unknown (Deployment not found"), "{details}");
    assert_eq!(details["threshold"], "≥ 100 %");
    let text = body["text"].as_str().unwrap();
    assert!(text.starts_with("fleetgate cluster-a: rel-2 rolled back to rel-1: gate canary-probe"), "{text}");
    assert!(received.try_recv().is_err(), "one notification per rollback");
}
