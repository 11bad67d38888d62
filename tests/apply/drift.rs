//! Drift against a real API server: after a `kubectl edit`-style change of one field, the engine
//! and `fleetgate diff` show exactly that field (exit 1); applying the release again corrects it
//! (exit 0). The CLI reads the desired release from a real Git repository.

use crate::apply_support;

use apply_support::{AGENT_NS, OPERATOR_NS, api, apply, policy, release, start};
use fleetgate::apply::DriftState;
use fleetgate_testenv::git_in;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

/// A fleet repo whose branch tip asks cluster-a to run `rel-v1`, tagged over the v1 fixture.
fn fleet_repo(dir: &Path) {
    let write = |rel: &str, text: &str| {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "fleet.yaml",
        "apiVersion: fleetgate.io/v1alpha1\nkind: Fleet\nmetadata: {name: drift-fleet}\nspec:\n  \
         operator: {name: redis-operator, namespace: redis-system}\n  release: rel-v1\n  waves: [canary]\n",
    );
    write(
        "clusters/cluster-a.yaml",
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: cluster-a}\nspec: {wave: canary}\n",
    );
    write(
        "release.yaml",
        "apiVersion: fleetgate.io/v1alpha1\nkind: Release\nmetadata: {name: rel-v1}\nspec:\n  gitCommit: a1b2c3d4e5f6\n  \
         image: {repository: registry.example.com/redis-operator, tag: v1.2.3-build.456}\n  chartVersion: 1.2.3\n  \
         crdVersion: v1alpha2\n  targetClusters: [cluster-a]\n  manifests: operator/\n",
    );
    for (path, bytes) in release("v1", "rel-v1", &[]).files() {
        write(path, std::str::from_utf8(bytes).unwrap());
    }
    git_in(dir, &["init", "-q", "-b", "main"]);
    git_in(dir, &["add", "."]);
    git_in(dir, &["commit", "-q", "-m", "release rel-v1"]);
    git_in(dir, &["tag", "-a", "rel-v1", "-m", "rel-v1"]);
}

/// Runs `fleetgate diff` against the cluster; returns (exit code, stdout).
async fn fleetgate_diff(repo: &Path, kubeconfig: &Path) -> (i32, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["diff", "--cluster", "cluster-a", "--namespace", AGENT_NS])
        .arg("--repo")
        .arg(repo)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("NO_COLOR", "1")
        .output()
        .await
        .expect("fleetgate runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), format!("{stdout}\n--- stderr:\n{stderr}"))
}

/// The `-`/`+` lines of unified diffs, without their `---`/`+++` headers.
fn changed_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| (l.starts_with('-') || l.starts_with('+')) && !l.starts_with("---") && !l.starts_with("+++"))
        .collect()
}

#[tokio::test]
async fn a_manual_edit_shows_as_exactly_that_field() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("drift").await;
        let client = cluster.client();
        let repo = tempfile::tempdir().unwrap();
        fleet_repo(repo.path());
        let v1 = release("v1", "rel-v1", &[]);
        apply(&engine, &v1, &policy()).await.expect("v1 applies");

        let clean = engine.drift(&v1).await.expect("drift");
        assert!(!clean.has_drift(), "{clean:#?}");
        let (code, out) = fleetgate_diff(repo.path(), cluster.kubeconfig_path()).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("no drift: 13 objects match release rel-v1"), "{out}");

        // What `kubectl edit` does: an update by another field manager, one field changed.
        let deployments = api(&client, "apps/v1", "Deployment", Some(OPERATOR_NS)).await;
        let edit = PatchParams { field_manager: Some("kubectl-edit".into()), ..Default::default() };
        deployments
            .patch("redis-operator", &edit, &Patch::Merge(json!({"spec": {"replicas": 5}})))
            .await
            .expect("manual edit");

        let report = engine.drift(&v1).await.expect("drift");
        let drifted: Vec<_> = report.drifted().collect();
        assert_eq!(drifted.len(), 1, "{report:#?}");
        assert_eq!(drifted[0].object.to_string(), "Deployment.apps redis-system/redis-operator");
        let DriftState::Drifted { diff } = &drifted[0].state else { panic!("expected a diff: {report:#?}") };
        assert_eq!(changed_lines(diff), ["-  replicas: 2", "+  replicas: 5"], "{diff}");

        let (code, out) = fleetgate_diff(repo.path(), cluster.kubeconfig_path()).await;
        assert_eq!(code, 1, "{out}");
        assert_eq!(changed_lines(&out), ["-  replicas: 2", "+  replicas: 5"], "{out}");
        assert!(out.contains("--- desired Deployment.apps redis-system/redis-operator"), "{out}");
        assert!(out.contains("1 of 13 objects drifted from release rel-v1"), "{out}");

        // Applying the release again takes the field back.
        apply(&engine, &v1, &policy()).await.expect("re-apply corrects drift");
        let (code, out) = fleetgate_diff(repo.path(), cluster.kubeconfig_path()).await;
        assert_eq!(code, 0, "{out}");
    })
    .await
    .expect("test finishes in time");
}
