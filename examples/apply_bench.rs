//! Wall time to apply N ConfigMaps (default 200) with fleetgate's apply engine and with
//! `kubectl apply --server-side`, against the same real kube-apiserver (from fleetgate-testenv).
//!
//! ```text
//! cargo run --example apply_bench [-- N]
//! ```
//!
//! Each run gets its own namespace with the same objects: the engine with its default
//! concurrency (16), the engine one object at a time, and kubectl. Measured: the first apply (creates
//! everything) and a second apply of the same content (changes nothing). The engine's figure
//! includes what kubectl does not do: admission policy, a server-side dry run of every object
//! before the first write, the inventory and the release-manifest ConfigMap.

use fleetgate::apply::{ApplyOptions, Engine};
use fleetgate::manifests::admission::AdmissionPolicy;
use fleetgate::model::{Document, ImageRef, ReleaseAdmissionPolicySpec, ReleaseSpec};
use fleetgate::release::VerifiedRelease;
use fleetgate_testenv::{ClusterOptions, TestCluster};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn manifests(namespace: &str, n: usize) -> String {
    let mut text = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n");
    for i in 0..n {
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-{i:04}\n  namespace: {namespace}\n\
             data:\n  index: \"{i}\"\n  payload: {}\n",
            "x".repeat(256)
        ));
    }
    text
}

fn release(text: String) -> VerifiedRelease {
    let spec = ReleaseSpec {
        fleet: Some("redis-fleet".into()),
        sequence: Some(1),
        revokes: Vec::new(),
        git_commit: "bench".into(),
        image: ImageRef { repository: "example/bench".into(), tag: "v1".into(), digest: None },
        images: Vec::new(),
        chart_version: "1.0.0".into(),
        chart: None,
        crd_version: "v1".into(),
        crds: Vec::new(),
        accept_crd_changes: Vec::new(),
        target_clusters: vec!["bench".into()],
        rollback_to: None,
        requires: None,
        manifests: "operator/".into(),
        deploy_timestamp: None,
    };
    let files = BTreeMap::from([("operator/objects.yaml".to_string(), text.into_bytes())]);
    VerifiedRelease::assume_verified(Document::new("Release", "rel-bench", spec), "bench", files)
}

async fn kubectl(file: &std::path::Path, kubeconfig: &std::path::Path) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let out = tokio::process::Command::new("kubectl")
        .args(["apply", "--server-side", "--field-manager", "bench", "-f"])
        .arg(file)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .await?;
    anyhow::ensure!(out.status.success(), "kubectl: {}", String::from_utf8_lossy(&out.stderr));
    Ok(start.elapsed())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(200);
    let cluster = TestCluster::start(ClusterOptions::new("apply-bench")).await?;
    let client = cluster.client();
    let agent = Namespace {
        metadata: ObjectMeta { name: Some("fleetgate-system".into()), ..Default::default() },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &agent).await?;

    let policy = AdmissionPolicy::baseline(ReleaseAdmissionPolicySpec {
        allowed_namespaces: Some(vec!["bench-*".into()]),
        allowed_cluster_scoped_kinds: Some(vec![]),
        ..Default::default()
    });
    let engine = Engine::new(client.clone(), ApplyOptions::new("fleetgate-system"));
    let rel = release(manifests("bench-engine", n));
    let start = Instant::now();
    let first = engine.apply(engine.admit(&rel, &policy).await?).await?;
    let engine_first = start.elapsed();
    let start = Instant::now();
    let second = engine.apply(engine.admit(&rel, &policy).await?).await?;
    let engine_second = start.elapsed();
    anyhow::ensure!(!second.changed_anything(), "the second apply changed something");

    // The same with one object at a time, as kubectl does (another inventory and namespace).
    let mut serial_options = ApplyOptions::new("fleetgate-system");
    serial_options.inventory = "bench-serial".into();
    serial_options.concurrency = 1;
    let serial = Engine::new(client.clone(), serial_options);
    let rel = release(manifests("bench-serial", n));
    let start = Instant::now();
    serial.apply(serial.admit(&rel, &policy).await?).await?;
    let serial_first = start.elapsed();
    let start = Instant::now();
    serial.apply(serial.admit(&rel, &policy).await?).await?;
    let serial_second = start.elapsed();

    let dir = tempfile::tempdir()?;
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, manifests("bench-kubectl", n))?;
    let kubectl_first = kubectl(&file, cluster.kubeconfig_path()).await?;
    let kubectl_second = kubectl(&file, cluster.kubeconfig_path()).await?;

    println!("objects: {} ({n} ConfigMaps + 1 Namespace); engine: {}", n + 1, first.summary());
    println!("{:<40} {:>10} {:>10}", "", "create", "no-op");
    println!(
        "{:<40} {:>9.2}s {:>9.2}s",
        "fleetgate Engine::apply",
        engine_first.as_secs_f64(),
        engine_second.as_secs_f64()
    );
    println!(
        "{:<40} {:>9.2}s {:>9.2}s",
        "fleetgate Engine::apply, concurrency 1",
        serial_first.as_secs_f64(),
        serial_second.as_secs_f64()
    );
    println!(
        "{:<40} {:>9.2}s {:>9.2}s",
        "kubectl apply --server-side",
        kubectl_first.as_secs_f64(),
        kubectl_second.as_secs_f64()
    );
    Ok(())
}
