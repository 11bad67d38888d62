//! Floods a real agent's `POST /hooks/git` and measures what it costs the agent: 40 concurrent
//! deliveries of 8 MiB each, three times over —
//!
//! 1. unauthenticated, with a `Content-Length` (refused from the headers: 413);
//! 2. unauthenticated, chunked (no length to refuse by; no signature header: 401);
//! 3. chunked with a well-formed but wrong signature (the body must be read for the HMAC: at most
//!    four at once, each cut off at 64 KiB, the rest 429).
//!
//! The agent is the `fleetgate` binary as a process (so its memory is its own, read from
//! `/proc/PID/status`), authenticated as the `fleetgate-agent` ServiceAccount of deploy/ against a
//! real kube-apiserver from `fleetgate-testenv`, polling a fleet repo on a real `git daemon` every
//! second, with a webhook secret as deploy/ configures it. During the flood `/healthz` must keep
//! answering, and afterwards the loop must still be reconciling (its reconcile counter grows).
//!
//! ```text
//! cargo build --bin fleetgate && cargo run --example webhook_flood
//! ```
//!
//! Figures go to docs/BENCHMARKS.md ("Webhook flood").

use anyhow::{Context, bail, ensure};
use fleetgate_testenv::process::memory_kib;
use fleetgate_testenv::{ClusterOptions, DeployManifests, GitDaemon, GpgHome, TestCluster, git_in, ssh_keygen};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONCURRENT: usize = 40;
const BODY: usize = 8 << 20;
const SECRET: &str = "flood-test-webhook-secret";

/// The agent's `VmHWM` and `VmRSS` in KiB.
fn memory(pid: u32) -> anyhow::Result<(u64, u64)> {
    let pid = pid.to_string();
    Ok((memory_kib(&pid, "VmHWM")?, memory_kib(&pid, "VmRSS")?))
}

/// The `fleetgate` binary next to this example's directory (`target/<profile>/fleetgate`).
fn fleetgate_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.parent().and_then(Path::parent).context("examples directory")?.join("fleetgate");
    ensure!(bin.exists(), "{} does not exist: run `cargo build --bin fleetgate` first", bin.display());
    Ok(bin)
}

/// One delivery over a plain connection: the head, then the 8 MiB body as fast as the agent
/// takes it, then the answer's status code — or how the connection ended if it was cut first.
async fn deliver(addr: std::net::SocketAddr, head: String, chunked: bool) -> String {
    let Ok(mut conn) = TcpStream::connect(addr).await else { return "connect failed".into() };
    if conn.write_all(head.as_bytes()).await.is_err() {
        return "cut off".into();
    }
    let piece = vec![b' '; 64 * 1024];
    let mut sent = 0;
    let mut cut = false;
    while sent < BODY {
        let r = if chunked {
            let mut frame = format!("{:x}\r\n", piece.len()).into_bytes();
            frame.extend_from_slice(&piece);
            frame.extend_from_slice(b"\r\n");
            conn.write_all(&frame).await
        } else {
            conn.write_all(&piece).await
        };
        if r.is_err() {
            cut = true;
            break;
        }
        sent += piece.len();
        // The agent may answer before it has all of it: stop sending once it did.
        let mut peek = [0u8; 16];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(0), conn.peek(&mut peek)).await
            && n > 0
        {
            break;
        }
    }
    let mut answer = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(30), conn.read(&mut answer)).await {
        Ok(Ok(n)) if n > 12 => String::from_utf8_lossy(&answer[9..12]).into_owned(),
        _ if cut => "cut off".into(),
        _ => "no answer".into(),
    }
}

async fn get(http: &reqwest::Client, url: &str) -> anyhow::Result<(u16, String)> {
    let r = http.get(url).send().await?;
    Ok((r.status().as_u16(), r.text().await?))
}

/// `fleetgate_reconcile_duration_seconds_count{result="ok"}` from the agent's `/metrics`.
async fn reconciles(http: &reqwest::Client, base: &str) -> anyhow::Result<u64> {
    let (_, text) = get(http, &format!("{base}/metrics")).await?;
    let line = text
        .lines()
        .find(|l| l.starts_with("fleetgate_reconcile_duration_seconds_count") && l.contains("result=\"ok\""))
        .context("no reconcile count in /metrics")?;
    Ok(line.rsplit(' ').next().unwrap_or("0").parse::<f64>()? as u64)
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let bin = fleetgate_binary()?;
    let repo_root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cluster = TestCluster::start(ClusterOptions::new("flood")).await?;
    let identity = cluster.deploy_agent(&DeployManifests::load(&repo_root.join("deploy"))?).await?;
    let daemon = GitDaemon::start()?;
    let url = daemon.create_bare("fleet.git")?;
    let dir = tempfile::Builder::new().prefix("fg-flood").tempdir()?;
    let work = dir.path().join("fleet");
    let init = Command::new(&bin).arg("init").arg(&work).output()?;
    ensure!(init.status.success(), "fleetgate init: {}", String::from_utf8_lossy(&init.stderr));
    git_in(&work, &["remote", "add", "origin", &url]);
    git_in(&work, &["push", "-q", "origin", "main"]);
    let gpg = GpgHome::new()?;
    let fpr = gpg.generate_key("Release Bot", "release@example.com")?;
    let trusted = gpg.write_public_key(&fpr, &dir.path().join("release-key.asc"))?;
    let status_key = dir.path().join("status-key");
    ssh_keygen(&status_key, "cluster-a");
    let secret = dir.path().join("webhook-secret");
    std::fs::write(&secret, SECRET)?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let log = std::fs::File::create(dir.path().join("agent.log"))?;
    let child = Command::new(&bin)
        .args(["agent", "--repo", &url, "--cluster", "cluster-a", "--interval", "1s", "--leader-elect=false"])
        .arg("--kubeconfig")
        .arg(identity.kubeconfig_path())
        .arg("--trusted-keys")
        .arg(&trusted)
        .arg("--status-key")
        .arg(&status_key)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--webhook-secret-file")
        .arg(&secret)
        .args(["--listen", &addr.to_string()])
        .env("FLEETGATE_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    let pid = child.id();
    let _agent = Agent(child);
    let base = format!("http://{addr}");
    let http = fleetgate::http::client_builder().timeout(Duration::from_secs(10)).build()?;

    let started = Instant::now();
    while reconciles(&http, &base).await.unwrap_or(0) < 2 {
        if started.elapsed() > Duration::from_secs(90) {
            bail!("the agent did not reconcile twice in 90 s; see {}", dir.path().join("agent.log").display());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (idle_hwm, idle_rss) = memory(pid)?;
    println!("agent pid {pid}, idle: VmHWM {} KiB, VmRSS {} KiB", idle_hwm, idle_rss);

    let rounds = [
        ("unauthenticated, Content-Length 8 MiB", format!("Content-Length: {BODY}\r\n"), false),
        ("unauthenticated, chunked 8 MiB", "Transfer-Encoding: chunked\r\n".to_string(), true),
        (
            "wrong signature, chunked 8 MiB",
            format!("Transfer-Encoding: chunked\r\nX-Hub-Signature-256: sha256={}\r\n", "00".repeat(32)),
            true,
        ),
    ];
    for (name, headers, chunked) in rounds {
        let before = reconciles(&http, &base).await?;
        let head = format!("POST /hooks/git HTTP/1.1\r\nHost: agent\r\n{headers}\r\n");
        let t0 = Instant::now();
        let floods: Vec<_> = (0..CONCURRENT).map(|_| tokio::spawn(deliver(addr, head.clone(), chunked))).collect();
        // The probes while the flood is on.
        let mut probes = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let (code, _) = get(&http, &format!("{base}/healthz")).await?;
            probes.push((code, t.elapsed()));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
        for f in floods {
            *outcomes.entry(f.await?).or_default() += 1;
        }
        let took = t0.elapsed();
        let (hwm, rss) = memory(pid)?;
        let slowest = probes.iter().map(|(_, t)| *t).max().unwrap_or_default();
        ensure!(probes.iter().all(|(c, _)| *c == 200), "/healthz failed during the flood: {probes:?}");
        // The loop goes on: two more passes after the flood.
        let t = Instant::now();
        while reconciles(&http, &base).await? < before + 2 {
            ensure!(t.elapsed() < Duration::from_secs(30), "the loop stopped reconciling after the flood");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        println!(
            "{name}: {CONCURRENT} deliveries in {took:.2?}: {outcomes:?}; /healthz 200 ×{} (slowest {slowest:.1?}); \
             agent VmHWM {hwm} KiB, VmRSS {rss} KiB; loop reconciled {} times since",
            probes.len(),
            reconciles(&http, &base).await? - before
        );
    }
    let (hwm, rss) = memory(pid)?;
    println!("after all rounds: VmHWM {} MiB, VmRSS {} MiB (idle was {} MiB)", hwm / 1024, rss / 1024, idle_hwm / 1024);
    ensure!(hwm < 64 * 1024, "peak RSS {hwm} KiB is over 64 MiB");
    Ok(())
}
