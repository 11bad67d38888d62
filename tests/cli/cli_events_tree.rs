//! `fleetgate events` and `fleetgate tree` against a real API server: the in-process agent runs
//! rel-1 of the template to success, then the real binary, with the test cluster's admin
//! kubeconfig, lists the Events the agent recorded about it (table and `-o json`) and the objects
//! its inventory records (the Operator's Deployment and its CRD); a cluster with no inventory is
//! exit 2 saying what to check.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use std::process::{Command, Output};

/// The real binary with `args` against the fleet's cluster as its admin; its output.
async fn fleetgate(fleet: &Fleet, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetgate"));
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(fleet.cluster.kubeconfig_path())
        .env("COLUMNS", "200")
        .env("NO_COLOR", "1")
        .env_remove("KUBECONFIG");
    tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "{:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_tree_show_what_the_agent_did_and_applied() {
    let fleet = Fleet::start("cli-events-tree", false).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    let outcome = within("reconcile rel-1", 90, agent.reconcile()).await.unwrap();
    assert_eq!(outcome, Outcome::Succeeded("rel-1".into()));

    // Events: the agent's story of rel-1, oldest first.
    let json = stdout(&fleetgate(&fleet, &["events", "--cluster", CLUSTER, "-o", "json"]).await);
    let events: serde_json::Value = serde_json::from_str(&json).unwrap();
    let events = events.as_array().unwrap();
    let reasons: Vec<&str> = events.iter().map(|e| e["reason"].as_str().unwrap()).collect();
    let (started, succeeded) = (
        reasons.iter().position(|r| *r == "ReleaseStarted").unwrap_or_else(|| panic!("{json}")),
        reasons.iter().position(|r| *r == "ReleaseSucceeded").unwrap_or_else(|| panic!("{json}")),
    );
    assert!(started < succeeded, "{reasons:?}");
    assert!(events[started]["message"].as_str().unwrap().contains("rel-1"), "{json}");
    assert_eq!(events[succeeded]["message"], "rel-1 passed its gates");
    let object = format!("ConfigMap/fleetgate-state-{CLUSTER}");
    assert!(events.iter().all(|e| e["object"] == object.as_str()), "only the agent's own Events: {json}");
    let times: Vec<chrono::DateTime<chrono::Utc>> =
        events.iter().map(|e| serde_json::from_value(e["lastSeen"].clone()).unwrap()).collect();
    assert!(times.is_sorted(), "oldest first: {times:?}");

    let table = stdout(&fleetgate(&fleet, &["events", "--cluster", CLUSTER, "--since", "1h"]).await);
    println!("{table}");
    let head = table.lines().next().unwrap();
    assert!(["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"].iter().all(|h| head.contains(h)), "{table}");
    let last = table.lines().filter(|l| l.contains("ReleaseSucceeded")).last().unwrap_or_else(|| panic!("{table}"));
    assert!(last.contains(" ago") && last.contains("Normal") && last.contains("rel-1 passed its gates"), "{table}");
    // Another cluster's agent wrote nothing here.
    let other = fleetgate(&fleet, &["events", "--cluster", "cluster-b", "-o", "json"]).await;
    assert_eq!(serde_json::from_str::<serde_json::Value>(&stdout(&other)).unwrap(), serde_json::json!([]));

    // Tree: rel-1's objects by namespace, cluster-scoped first.
    let tree = stdout(&fleetgate(&fleet, &["tree", "--cluster", CLUSTER]).await);
    println!("{tree}");
    assert!(tree.starts_with("release rel-1\n"), "{tree}");
    let line = |object: &str| tree.lines().position(|l| l.ends_with(object)).unwrap_or_else(|| panic!("{tree}"));
    let (crd, namespace, deployment) = (
        line("CustomResourceDefinition/redisclusters.cache.example.com"),
        line(&format!("── {OPERATOR_NS}")),
        line("Deployment/redis-operator"),
    );
    assert!(line("── (cluster)") < crd && crd < namespace && namespace < deployment, "{tree}");
    assert!(!tree.contains("pending prune"), "nothing awaits prune after the first release: {tree}");

    let json = stdout(&fleetgate(&fleet, &["tree", "--cluster", CLUSTER, "-o", "json"]).await);
    let inventory: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(inventory["release"], "rel-1");
    let objects = inventory["objects"].as_array().unwrap();
    assert!(
        objects.iter().any(|o| o["kind"] == "Deployment"
            && o["namespace"] == OPERATOR_NS
            && o["name"] == "redis-operator"
            && o["group"] == "apps"),
        "{json}"
    );
    assert!(objects.iter().any(|o| o["kind"] == "CustomResourceDefinition" && o.get("namespace").is_none()), "{json}");

    // No inventory for that name: exit 2, saying what to check.
    let missing = fleetgate(&fleet, &["tree", "--cluster", "nowhere"]).await;
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no inventory ConfigMap fleetgate-system/fleetgate-nowhere-inventory"), "{stderr}");
    assert!(["--cluster", "--namespace", "--kubeconfig"].iter().all(|f| stderr.contains(f)), "{stderr}");
}
