//! Debian's tinyproxy (`/usr/bin/tinyproxy`), an HTTP proxy with `CONNECT`, on a free loopback
//! port in the foreground (`-d`) with its own config file and log in a temp dir; killed on drop.
//! It admits clients from loopback only and may connect to any port (no `ConnectPort` lines), so
//! it reaches the other test servers. [`Tinyproxy::requests`] reads its log: the proof that a
//! client really went through it.
//!
//! Without the binary, [`Tinyproxy::binary`] is None and [`Tinyproxy::skip_message`] says what
//! to install.
//!
//! ```no_run
//! # fn f() -> anyhow::Result<()> {
//! let proxy = fleetgate_testenv::Tinyproxy::start()?;
//! println!("HTTPS_PROXY={}", proxy.url());
//! assert!(proxy.requests().is_empty());
//! # Ok(()) }
//! ```

use crate::process::{Guarded, free_port, wait_for_port};
use anyhow::{Context as _, bail};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

pub struct Tinyproxy {
    _proc: Guarded,
    port: u16,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Tinyproxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tinyproxy").field("port", &self.port).field("dir", &self.dir.path()).finish_non_exhaustive()
    }
}

impl Tinyproxy {
    /// `$TINYPROXY_BIN`, else `/usr/bin/tinyproxy`, when it exists.
    pub fn binary() -> Option<PathBuf> {
        let bin =
            std::env::var_os("TINYPROXY_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/tinyproxy"));
        bin.is_file().then_some(bin)
    }

    /// What a test prints when it skips for want of the binary.
    pub fn skip_message() -> String {
        "SKIPPED: /usr/bin/tinyproxy is not installed (`make deps-test` installs Debian's tinyproxy)".to_string()
    }

    /// Starts the proxy and waits up to 10 s for its port.
    pub fn start() -> anyhow::Result<Tinyproxy> {
        let bin = Tinyproxy::binary().with_context(Tinyproxy::skip_message)?;
        let dir = tempfile::Builder::new().prefix("fg-proxy-").tempdir_in("/tmp")?;
        let port = free_port();
        let config = dir.path().join("tinyproxy.conf");
        // LogLevel Connect logs each request line ("Request (file descriptor N): CONNECT host:port").
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListen 127.0.0.1\nAllow 127.0.0.1\nTimeout 60\nMaxClients 32\n\
                 LogFile \"{}\"\nLogLevel Connect\nDisableViaHeader Yes\n",
                dir.path().join("access.log").display()
            ),
        )?;
        let mut cmd = Command::new(&bin);
        cmd.arg("-d").arg("-c").arg(&config);
        let mut proc = Guarded::spawn("tinyproxy", cmd, &dir.path().join("tinyproxy.out"))?;
        if let Err(e) = wait_for_port(&format!("127.0.0.1:{port}"), Duration::from_secs(10)) {
            let out = std::fs::read_to_string(dir.path().join("tinyproxy.out")).unwrap_or_default();
            let exited = proc.exited().map(|s| format!(" (exited: {s})")).unwrap_or_default();
            bail!("tinyproxy did not start{exited}: {e}\n--- its output ---\n{out}");
        }
        Ok(Tinyproxy { _proc: proc, port, dir })
    }

    /// `http://127.0.0.1:PORT`, what `HTTPS_PROXY`/`HTTP_PROXY` take.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The request lines the proxy received so far, in order: `CONNECT 127.0.0.1:PORT HTTP/1.1`
    /// for an https:// URL, `GET http://…` for a plain one.
    pub fn requests(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        log.lines()
            .filter_map(|l| l.split_once("]: Request (file descriptor ").and_then(|(_, rest)| rest.split_once("): ")))
            .map(|(_, request)| request.trim().to_string())
            .collect()
    }
}
