//! Debian's OpenSSH server (`/usr/sbin/sshd`) on loopback, serving bare repos over `ssh://` the
//! way a Git host does: its own `sshd_config`, Ed25519 host key and `AuthorizedKeysFile` in a temp
//! dir, a free port, in the foreground (`-D -e`, its log in the temp dir); killed on drop.
//!
//! The one authorized key may run nothing but Git: `git-shell` (git-upload-pack for fetches,
//! git-receive-pack for pushes). Logins are as the user running the test, key only.
//!
//! Without the binary, [`Sshd::binary`] is None and [`Sshd::skip_message`] says what to install.
//!
//! ```no_run
//! # fn f(client_pub: &str, repo: &std::path::Path) -> anyhow::Result<()> {
//! let sshd = fleetgate_testenv::Sshd::start(client_pub)?;
//! std::fs::write("known_hosts", sshd.known_hosts_line())?;
//! println!("{}", sshd.url(repo));
//! # Ok(()) }
//! ```

use crate::process::{Guarded, free_port, wait_for_port};
use crate::ssh::ssh_keygen;
use anyhow::{Context as _, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub struct Sshd {
    _proc: Guarded,
    port: u16,
    user: String,
    host_key: String,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Sshd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sshd").field("port", &self.port).field("dir", &self.dir.path()).finish_non_exhaustive()
    }
}

impl Sshd {
    /// `$SSHD_BIN`, else `/usr/sbin/sshd`, when it exists. sshd re-executes itself for each
    /// connection and so wants an absolute path.
    pub fn binary() -> Option<PathBuf> {
        let bin = std::env::var_os("SSHD_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/sbin/sshd"));
        bin.is_file().then_some(bin)
    }

    /// What a test prints when it skips for want of the binary.
    pub fn skip_message() -> String {
        "SKIPPED: /usr/sbin/sshd is not installed (`make deps-test` installs Debian's openssh-server)".to_string()
    }

    /// Starts sshd on a free loopback port, accepting `authorized_key` (an OpenSSH public key
    /// line) for Git only, and waits up to 10 s for its port.
    pub fn start(authorized_key: &str) -> anyhow::Result<Sshd> {
        let bin = Sshd::binary().with_context(Sshd::skip_message)?;
        let dir = tempfile::Builder::new().prefix("fg-sshd-").tempdir_in("/tmp")?;
        let host_key = dir.path().join("host_ed25519");
        ssh_keygen(&host_key, "fleetgate-test-sshd");
        let host_pub = std::fs::read_to_string(host_key.with_extension("pub"))?;
        // Key type and base64, without the comment: what a known_hosts line carries.
        let host_pub: Vec<&str> = host_pub.split_whitespace().take(2).collect();
        let authorized = dir.path().join("authorized_keys");
        std::fs::write(
            &authorized,
            format!("command=\"git-shell -c \\\"$SSH_ORIGINAL_COMMAND\\\"\",restrict {}\n", authorized_key.trim()),
        )?;
        let port = free_port();
        let config = dir.path().join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "ListenAddress 127.0.0.1:{port}\nHostKey {}\nPidFile {}\nAuthorizedKeysFile {}\n\
                 # The temp dir is not laid out as sshd wants a home's .ssh to be.\nStrictModes no\n\
                 UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 PermitRootLogin prohibit-password\nLogLevel VERBOSE\n",
                host_key.display(),
                dir.path().join("sshd.pid").display(),
                authorized.display(),
            ),
        )?;
        if is_root() {
            // Run as root, sshd insists on its privilege separation directory, which Debian's
            // ssh.service creates (RuntimeDirectory) and a test machine may not have.
            std::fs::create_dir_all("/run/sshd").context("creating /run/sshd")?;
        }
        let mut cmd = Command::new(&bin);
        cmd.arg("-D").arg("-e").arg("-f").arg(&config);
        let mut proc = Guarded::spawn("sshd", cmd, &dir.path().join("sshd.log"))?;
        if let Err(e) = wait_for_port(&format!("127.0.0.1:{port}"), Duration::from_secs(10)) {
            let log = std::fs::read_to_string(dir.path().join("sshd.log")).unwrap_or_default();
            let exited = proc.exited().map(|s| format!(" (exited: {s})")).unwrap_or_default();
            bail!("sshd did not start{exited}: {e}\n--- sshd.log ---\n{log}");
        }
        Ok(Sshd { _proc: proc, port, user: current_user()?, host_key: host_pub.join(" "), dir })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `ssh://USER@127.0.0.1:PORT/ABSOLUTE/PATH` of a bare repo on this machine.
    pub fn url(&self, repo: &Path) -> String {
        format!("ssh://{}@127.0.0.1:{}{}", self.user, self.port, repo.display())
    }

    /// The host's public key: `ssh-ed25519 AAAA…`.
    pub fn host_key(&self) -> &str {
        &self.host_key
    }

    /// The `known_hosts` line for this server: `[127.0.0.1]:PORT ssh-ed25519 AAAA…`.
    pub fn known_hosts_line(&self) -> String {
        format!("[127.0.0.1]:{} {}\n", self.port, self.host_key)
    }

    /// Sessions the server started (`Starting session:` lines of its log: each a Git command
    /// through `git-shell`), which shows a client really came through it.
    pub fn sessions(&self) -> usize {
        self.log().lines().filter(|l| l.contains("Starting session:")).count()
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The user sshd logs clients in as: the one running it.
fn current_user() -> anyhow::Result<String> {
    let out = Command::new("id").arg("-un").output().context("running id -un")?;
    anyhow::ensure!(out.status.success(), "id -un: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
