//! `fleetgate get agents` against a real API server: a fleet repo served by `git daemon` (four
//! clusters with signed statuses), one reachable cluster whose kubeconfig context is mapped with
//! `--context-for`, holding the agent's state ConfigMap and Lease; the other clusters have no
//! context in the kubeconfig and show as unreachable without failing the table.

use crate::status_support;

use fleetgate::agent::state::StateStore;
use fleetgate_testenv::wait::within;
use fleetgate_testenv::{ClusterOptions, TestCluster};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{Api, ObjectMeta, PostParams};
use status_support::{NEW, fleet};
use std::process::Command;

const NS: &str = "fleetgate-system";

#[tokio::test]
async fn each_cluster_gets_a_row_from_its_api_server_or_says_why_not() {
    let cluster = TestCluster::start(ClusterOptions::new("eu-west-1")).await.expect("test cluster starts");
    cluster.create_namespace(NS).await.unwrap();
    // What a running agent of cluster-a leaves: its state (it wants NEW) and its Lease.
    let store = StateStore::new(cluster.client(), NS, "cluster-a");
    within("state", 30, store.load()).await.unwrap();
    within("state", 30, store.update(|s| Ok(s.observe_desired(Some(NEW), false)))).await.unwrap();
    let lease = Lease {
        metadata: ObjectMeta { name: Some("fleetgate-agent-cluster-a".into()), ..Default::default() },
        spec: Some(LeaseSpec { holder_identity: Some("fleetgate-agent-7d9f-x2".into()), ..Default::default() }),
    };
    Api::<Lease>::namespaced(cluster.client(), NS).create(&PostParams::default(), &lease).await.unwrap();
    let f = fleet();

    let get = |output: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetgate"));
        cmd.args(["get", "agents", "--repo", &f.url, "--context-for", "cluster-a=eu-west-1", "-o", output])
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path())
            .env("COLUMNS", "160")
            .env("NO_COLOR", "1")
            .env_remove("FLEETGATE_REPO");
        cmd
    };
    let mut json = get("json");
    let out = tokio::task::spawn_blocking(move || json.output().unwrap()).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("{rows:#}");
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let a = &rows[0];
    assert_eq!((a["cluster"].as_str(), a["context"].as_str()), (Some("cluster-a"), Some("eu-west-1")));
    assert_eq!(a["phase"], "Idle");
    assert_eq!(a["desired"], NEW);
    assert_eq!(a["leader"], "fleetgate-agent-7d9f-x2");
    assert_eq!(a["version"], fleetgate::VERSION);
    assert!(a["lastReport"].is_string() && a.get("error").is_none(), "{a}");
    // No context cluster-b in the kubeconfig: unreachable, with what Git knows kept.
    let b = &rows[1];
    assert!(b["error"].as_str().unwrap().starts_with("unreachable: "), "{b}");
    assert!(b["error"].as_str().unwrap().contains("cluster-b"), "the error names the context: {b}");
    assert!(b["phase"].is_null() && b["lastReport"].is_string(), "{b}");

    let mut wide = get("wide");
    let table = tokio::task::spawn_blocking(move || wide.output().unwrap()).await.unwrap();
    let text = String::from_utf8(table.stdout).unwrap();
    println!("{text}");
    assert!(table.status.success());
    let line_a = text.lines().find(|l| l.starts_with("cluster-a")).unwrap();
    assert!(line_a.contains("Idle") && line_a.contains("fleetgate-agent-7d9f-x2") && line_a.contains(NEW), "{text}");
    let line_d = text.lines().find(|l| l.starts_with("cluster-d")).unwrap();
    assert!(line_d.contains("unreachable: "), "{text}");
    let header = text.lines().next().unwrap();
    assert!(["LEADER", "DESIRED", "CONTEXT", "VERSION"].iter().all(|h| header.contains(h)), "{text}");
}
