//! Prometheus from Debian's package (`/usr/bin/prometheus`), scraping a metrics endpoint the test
//! serves, every second. Its TSDB and config live in a temp dir; the process is killed on drop.
//!
//! ```no_run
//! # async fn f(metrics: std::net::SocketAddr) -> anyhow::Result<()> {
//! let prom = fleetgate_testenv::Prometheus::start(metrics).await?;
//! prom.wait_for_scrape(std::time::Duration::from_secs(30)).await?;
//! println!("{}", prom.url());
//! # Ok(()) }
//! ```

use crate::process::{Guarded, free_port};
use anyhow::{Context as _, bail};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The binary, overridable with `PROMETHEUS_BIN`.
fn binary() -> PathBuf {
    std::env::var_os("PROMETHEUS_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"))
}

/// The job name of the one scrape config.
pub const SCRAPE_JOB: &str = "test";

pub struct Prometheus {
    proc: Guarded,
    port: u16,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prometheus").field("port", &self.port).field("dir", &self.dir.path()).finish_non_exhaustive()
    }
}

impl Prometheus {
    /// Starts Prometheus on a free loopback port scraping `http://<scrape_target>/metrics` every
    /// second (job [`SCRAPE_JOB`]), and waits up to 30 s until it reports ready.
    pub async fn start(scrape_target: SocketAddr) -> anyhow::Result<Prometheus> {
        let bin = binary();
        anyhow::ensure!(
            bin.is_file(),
            "{} not found: install Debian's `prometheus` package (`make deps-test` does)",
            bin.display()
        );
        let dir = tempfile::Builder::new().prefix("fg-prom-").tempdir_in("/tmp")?;
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: {SCRAPE_JOB}\n    static_configs:\n      - targets: ['{scrape_target}']\n"
            ),
        )?;
        let port = free_port();
        let mut cmd = Command::new(&bin);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--storage.tsdb.retention.time=1h")
            .arg("--log.level=warn")
            .current_dir(dir.path());
        let proc = Guarded::spawn("prometheus", cmd, &dir.path().join("prometheus.log"))?;
        let mut prom = Prometheus { proc, port, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = prom.proc.exited() {
                bail!("prometheus exited early ({status}){}", prom.log_tail());
            }
            if let Ok((200, _)) = prom.get("/-/ready").await {
                return Ok(prom);
            }
            if Instant::now() > deadline {
                bail!("prometheus was not ready within 30 s{}", prom.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `http://127.0.0.1:PORT`, the base URL of the HTTP API.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until the target has been scraped successfully (`up == 1`).
    pub async fn wait_for_scrape(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let query = format!("up{{job=\"{SCRAPE_JOB}\"}} == 1");
        loop {
            let last = match self.query(&query).await {
                Ok(v) if v["data"]["result"].as_array().is_some_and(|r| !r.is_empty()) => return Ok(()),
                Ok(v) => v.to_string(),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!("target not scraped within {timeout:?} (last answer: {last}){}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Runs an instant query and returns the API's JSON answer.
    pub async fn query(&self, promql: &str) -> anyhow::Result<serde_json::Value> {
        let (status, body) = self.get(&format!("/api/v1/query?query={}", percent_encode(promql))).await?;
        anyhow::ensure!(status == 200, "HTTP {status}: {body}");
        serde_json::from_str(&body).context("query answer is not JSON")
    }

    /// A plain HTTP/1.0 GET on loopback: enough for Prometheus, and no HTTP client dependency.
    async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let exchange = async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).await?;
            anyhow::Ok(String::from_utf8_lossy(&raw).into_owned())
        };
        let raw = tokio::time::timeout(Duration::from_secs(5), exchange)
            .await
            .context("prometheus did not answer within 5 s")??;
        let status = raw.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("no HTTP status line")?;
        let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Ok((status, body))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!("\n--- last lines of prometheus.log ---\n{}", lines[lines.len().saturating_sub(15)..].join("\n"))
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
