//! A real agent (as deployed, against a real test cluster and a git daemon) notifies a receiver
//! this test runs on loopback. The fleet names the endpoint (`notify: NAME` in fleet.yaml); its
//! URL, format, filter and HMAC secret are only the agent's.
//!
//! * An endpoint hearing every transition, in the signed `webhook` format: a good release sends
//!   started, applied, passed; a bad one started, applied, failed, rolled back; a pause, paused —
//!   in order, each signed (the HMAC verifies with the secret, not with another), each naming who
//!   released and promoted the release (author, subject, trailers, the verified signer), its scope
//!   and the gate figures. The receiver answers the first delivery 503 twice: the third attempt
//!   gets it, and nothing after it overtakes it.
//! * A `slack` endpoint with the default filter: nothing for a release that passes, failed and
//!   rolled back for one that does not.

use crate::agent_support;
use crate::notify_support;

use agent_support::*;
use axum::http::StatusCode;
use fleetgate::agent::Outcome;
use fleetgate::agent::config::Named;
use notify_support::{Received, Receiver};
use std::time::Duration;

/// Waits for the next `n` messages (each within 60 s: retries take seconds).
async fn next(rx: &mut Receiver, n: usize) -> Vec<Received> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(rx.next(60).await);
    }
    out
}

fn kinds(messages: &[Received]) -> Vec<String> {
    messages.iter().map(Received::kind).collect()
}

/// rel-2, whose gate fails, promoted and rolled back to rel-1 by `agent`'s next pass.
async fn bad_rel_2_rolls_back(fleet: &Fleet, agent: &mut fleetgate::agent::Agent) {
    fleet.set_gates("4s", FAILING_GATES);
    fleet.release("rel-2", |_| {});
    fleet.promote("rel-2");
    assert_eq!(
        within("rel-2", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transition_is_notified_in_order_signed_with_who_why_and_figures() {
    let unavailable = StatusCode::SERVICE_UNAVAILABLE;
    let mut rx = Receiver::scripted(&[unavailable, unavailable], Duration::ZERO).await;
    let fleet = Fleet::start("agent-notify-all", true).await;
    fleet.edit("fleet.yaml", "notify: default", "notify: audit");
    fleet.commit_and_push("notify the audit endpoint");
    let secret = fleet.dir.path().join("notify-secret");
    std::fs::write(&secret, "s3cret\n").unwrap();
    fleet.release("rel-1", |_| {});
    fleet.write_fleet_release("rel-1");
    fleet.commit_and_push("promote rel-1 to the fleet\n\nChange-Id: I0001\nReviewed-by: Ann <ann@example.com>");
    let settings = fleetgate::agent::AgentSettings {
        notify_url: Named::list(&[format!("audit={}", rx.url)]),
        notify_format: Named::list(&["audit=webhook"]),
        notify_on: Named::list(&["audit=all"]),
        notify_secret_file: Named::list(&[format!("audit={}", secret.display())]),
        ..fleet.settings()
    };
    let mut agent = fleet.agent_with(settings).await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    // `started` was answered 503 twice; its third delivery is the one that counts.
    let good = next(&mut rx, 5).await;
    assert_eq!(kinds(&good), ["started", "started", "started", "applied", "passed"]);
    assert!(good[..3].iter().all(|r| r.body == good[0].body), "the same message was retried");
    for message in &good {
        assert!(message.signed_with(b"s3cret"), "{:?}", message.headers);
        assert!(!message.signed_with(b"another secret"));
    }
    let passed = good[4].json();
    let d = &passed["fleetgate"];
    assert_eq!(
        (d["cluster"].as_str(), d["release"].as_str(), d["wave"].as_str()),
        (Some(CLUSTER), Some("rel-1"), Some("canary"))
    );
    assert!(d["targetClusters"].as_array().unwrap().iter().any(|c| c == CLUSTER), "{d}");
    assert_eq!(d["gates"][0]["name"], "pod-restarts");
    assert_eq!(d["gates"][0]["verdict"], "pass");
    let released = &d["releasedBy"];
    assert!(released["signer"].as_str().unwrap().eq_ignore_ascii_case(&fleet.fpr), "{released}");
    assert!(released["tagger"].is_string() && released["author"].is_string(), "{released}");
    let promoted = &d["promotedBy"];
    assert_eq!(promoted["author"], "fleetgate test <test@example.com>");
    assert_eq!(promoted["subject"], "promote rel-1 to the fleet");
    assert_eq!(promoted["trailers"][0], serde_json::json!({"key": "Change-Id", "value": "I0001"}));
    assert_eq!(promoted["trailers"][1]["key"], "Reviewed-by");
    assert!(promoted.get("signer").is_none(), "an unsigned promotion names no signer: {promoted}");
    assert!(passed["text"].as_str().unwrap().starts_with("fleetgate cluster-a: rel-1 passed its gates"), "{passed}");

    bad_rel_2_rolls_back(&fleet, &mut agent).await;
    let bad = next(&mut rx, 4).await;
    assert_eq!(kinds(&bad), ["started", "applied", "failed", "rolledBack"]);
    assert!(bad.iter().all(|m| m.signed_with(b"s3cret")));
    let failed = bad[2].json();
    let d = &failed["fleetgate"];
    assert_eq!((d["reason"].as_str(), d["gate"].as_str()), (Some("GateFailed"), Some("canary-probe")));
    assert!(d["figure"].as_str().unwrap().starts_with("unknown (Deployment not found"), "{d}");
    assert_eq!(d["threshold"], "≥ 100 %");
    assert_eq!(d["promotedBy"]["subject"], "promote rel-2 to the fleet");
    let rolled_back = bad[3].json();
    assert_eq!(rolled_back["fleetgate"]["rolledBackTo"], "rel-1");
    assert_eq!(rolled_back["fleetgate"]["gate"], "canary-probe");

    // The brake: one `paused` message, naming the commit that pulled it.
    fleet.edit("fleet.yaml", "  # paused: true", "  paused: true");
    fleet.commit_and_push("pause the fleet for INC-42");
    let outcome = within("paused pass", 60, agent.reconcile()).await.unwrap();
    assert!(matches!(outcome, Outcome::Paused { .. }), "{outcome:?}");
    let paused = rx.next(60).await;
    assert_eq!(paused.kind(), "paused");
    let d = &paused.json()["fleetgate"];
    assert!(d["message"].as_str().unwrap().starts_with("paused by fleet.yaml spec.paused"), "{d}");
    assert_eq!(d["promotedBy"]["subject"], "pause the fleet for INC-42");
    within("a second paused pass", 60, agent.reconcile()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(rx.drain().is_empty(), "a pause is told once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_only_a_failure_and_its_rollback_are_notified() {
    let mut rx = Receiver::start().await;
    let fleet = Fleet::start("agent-notify", true).await;
    // The fleet names the agent's endpoint; the URL (a secret) is only the agent's.
    fleet.edit("fleet.yaml", "notify: default", "notify: oncall");
    fleet.commit_and_push("notify the on-call channel");
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let notify_url = Named::list(&[format!("oncall={}", rx.url)]);
    let mut agent = fleet.agent_with(fleetgate::agent::AgentSettings { notify_url, ..fleet.settings() }).await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    bad_rel_2_rolls_back(&fleet, &mut agent).await;
    // Nothing of rel-1's passing came first: the first message is rel-2's failure.
    let messages = next(&mut rx, 2).await;
    assert_eq!(kinds(&messages), ["failed", "rolledBack"]);
    let body = messages[1].json();
    let details = &body["fleetgate"];
    assert_eq!((details["release"].as_str(), details["rolledBackTo"].as_str()), (Some("rel-2"), Some("rel-1")));
    assert_eq!(details["gate"], "canary-probe");
    let text = body["text"].as_str().unwrap();
    assert!(text.starts_with("fleetgate cluster-a: rel-2 rolled back to rel-1: gate canary-probe"), "{text}");
    assert_eq!(body["blocks"][0]["text"]["text"], text, "Slack blocks lead with the text");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(rx.drain().is_empty(), "one message per transition");
}
