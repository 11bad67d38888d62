//! `fleetgate agent` as a process against a real API server: it validates its flags (exit 2 with
//! what to fix), creates its state ConfigMap, takes its Lease, serves its endpoints (ready after its
//! first sync of a fleet repo that desires no release yet), wakes on a push to a local repo and on
//! the webhook, and on SIGTERM releases the Lease and exits 0.

use fleetgate_testenv::process::{Guarded, free_port, memory_kib, wait_for_port};
use fleetgate_testenv::{ClusterOptions, DeployManifests, GpgHome, TestCluster, git_in};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fleetgate");

fn agent_command() -> Command {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("FLEETGATE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Polls `/metrics` until a line starting with `series` shows `value`; returns how long it took.
async fn wait_for_metric(http: &reqwest::Client, base: &str, series: &str, value: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let text = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
        if text.lines().any(|l| l.starts_with(series) && l.ends_with(&format!(" {value}"))) {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{series} not {value} within {limit:?}:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn missing_settings_exit_2_and_say_what_to_pass() {
    let out = agent_command().args(["agent", "--repo", "/nonexistent"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--cluster NAME"), "{stderr}");
}

#[tokio::test]
async fn the_agent_process_runs_its_services_and_hands_over_on_sigterm() {
    let cluster = TestCluster::start(ClusterOptions::new("agent-cli")).await.expect("test cluster starts");
    let identity = cluster.deploy_agent(&DeployManifests::shipped().unwrap()).await.expect("deploy/ applied");

    // A fleet repo from the built-in template (it desires no release yet), served from a bare repo.
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("fleet.git");
    let work = dir.path().join("work");
    let init = agent_command().arg("init").arg(&work).output().unwrap();
    assert!(init.status.success(), "fleetgate init: {}", String::from_utf8_lossy(&init.stderr));
    git_in(dir.path(), &["init", "-q", "--bare", "fleet.git"]);
    git_in(&work, &["push", "-q", bare.to_str().unwrap(), "main"]);
    let gpg = GpgHome::new().unwrap();
    let fingerprint = gpg.generate_key("Release Signer", "release@example.com").unwrap();
    let key = gpg.write_public_key(&fingerprint, &dir.path().join("signer.asc")).unwrap();

    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut cmd = agent_command();
    cmd.env("POD_NAME", "agent-under-test").args([
        "--log=info",
        "agent",
        "--kubeconfig",
        identity.kubeconfig_path().to_str().unwrap(),
        "--repo",
        bare.to_str().unwrap(),
        "--cluster",
        "cluster-a",
        "--fleet",
        "redis-fleet",
        "--trusted-keys",
        key.to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--state-dir",
        dir.path().join("cache").to_str().unwrap(),
        "--interval",
        "1h",
        "--lease-duration",
        "3s",
    ]);
    let log = dir.path().join("agent.log");
    let mut agent = Guarded::spawn("fleetgate-agent", cmd, &log).unwrap();
    let addr = format!("127.0.0.1:{port}");
    tokio::task::spawn_blocking(move || wait_for_port(&addr, Duration::from_secs(20))).await.unwrap().unwrap_or_else(
        |e| {
            panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        },
    );
    let http = fleetgate::http::client_builder().timeout(Duration::from_secs(5)).build().unwrap();
    assert_eq!(http.get(format!("{base}/healthz")).send().await.unwrap().status(), 200);

    // It leads (the Lease names it), created its state, woke once at start-up and, its first sync
    // done, is ready.
    wait_for_metric(&http, &base, "fleetgate_leader{", "1", Duration::from_secs(10)).await;
    let startup = "fleetgate_triggers_total{cluster=\"cluster-a\",source=\"startup\"}";
    wait_for_metric(&http, &base, startup, "1", Duration::from_secs(5)).await;
    let leases: Api<Lease> = Api::namespaced(cluster.client(), "fleetgate-system");
    let holder = leases.get("fleetgate-agent-cluster-a").await.unwrap().spec.unwrap().holder_identity.unwrap();
    assert!(holder.starts_with("agent-under-test_"), "{holder}");
    let configmaps: Api<ConfigMap> = Api::namespaced(cluster.client(), "fleetgate-system");
    assert_eq!(configmaps.get("fleetgate-state-cluster-a").await.unwrap().data.unwrap()["phase"], "Idle");
    let ready = Instant::now();
    loop {
        let r = http.get(format!("{base}/readyz")).send().await.unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(ready.elapsed() < Duration::from_secs(30), "not ready: {}", r.text().await.unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A push to the local repo wakes it (the file-system watcher), as does the webhook.
    let mut readme = std::fs::read_to_string(work.join("README.md")).unwrap();
    readme.push_str("\nA line added by the test.\n");
    std::fs::write(work.join("README.md"), readme).unwrap();
    git_in(&work, &["commit", "-q", "-am", "second"]);
    let pushed = Instant::now();
    git_in(&work, &["push", "-q", bare.to_str().unwrap(), "main"]);
    let series = "fleetgate_triggers_total{cluster=\"cluster-a\",source=\"git-refs\"}";
    wait_for_metric(&http, &base, series, "1", Duration::from_secs(3)).await;
    println!("push to local repo → agent woken: {:?}", pushed.elapsed());
    let answer = http.post(format!("{base}/hooks/git")).send().await.unwrap();
    assert_eq!(answer.status(), 202);
    let series = "fleetgate_triggers_total{cluster=\"cluster-a\",source=\"webhook\"}";
    wait_for_metric(&http, &base, series, "1", Duration::from_secs(3)).await;
    println!("agent RSS while idle: {} KiB", memory_kib(&agent.pid().to_string(), "VmRSS").unwrap());

    // SIGTERM: exit 0 and the Lease released for a standby.
    let st = Command::new("kill").args(["-TERM", &agent.pid().to_string()]).status().unwrap();
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = agent.exited() {
            break status;
        }
        assert!(Instant::now() < deadline, "agent did not exit within 10 s of SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}: {}", std::fs::read_to_string(dir.path().join("agent.log")).unwrap());
    let spec = leases.get("fleetgate-agent-cluster-a").await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity, None, "{spec:?}");
}
