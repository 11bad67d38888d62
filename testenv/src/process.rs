//! Child processes that die with their handle, and free loopback ports.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A child process killed (and reaped) on drop, even when the test panics.
#[derive(Debug)]
pub struct Guarded {
    name: String,
    child: Child,
}

impl Guarded {
    /// Spawns `cmd` with stdout/stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Guarded> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        // Own process group: a terminal's Ctrl-C goes to the test runner alone, whose Drop then
        // stops the servers in order. A runner killed outright cannot run Drop; cluster processes
        // are covered there by PR_SET_PDEATHSIG (see cluster.rs).
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let child = cmd.spawn().map_err(|e| anyhow::anyhow!("starting {name}: {e}"))?;
        Ok(Guarded { name: name.to_string(), child })
    }

    /// Like [`spawn`](Self::spawn), for a server that needs nothing inherited beyond its stdio:
    /// every other descriptor open at the fork is closed at exec. A long-lived child would
    /// otherwise also keep what another test thread had open without close-on-exec at that
    /// instant, such as the pipe gpgme reads `gpgconf` or `gpg` from until EOF, which then never
    /// comes (a concurrent test hung in `Keyring::from_files` while a `git daemon` started).
    pub fn spawn_isolated(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Guarded> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: one async-signal-safe syscall between fork and exec. Marked close-on-exec
            // rather than closed, so the pipe through which std reports a failed exec still
            // works; a kernel without CLOSE_RANGE_CLOEXEC (before 5.11) fails it, and the child
            // inherits as before.
            unsafe {
                cmd.pre_exec(|| {
                    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
                    libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC);
                    Ok(())
                });
            }
        }
        Guarded::spawn(name, cmd, log)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns the exit status if the process already ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // The whole process group: some servers run their work in a child (`git daemon` forks
        // `git-daemon`), which would outlive a kill of the direct child alone.
        #[cfg(unix)]
        if let Ok(pgid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) with a negative pid signals the group we created in `spawn`.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("bind 127.0.0.1:0")
}

/// Waits until `addr` accepts TCP connections, up to `timeout`.
pub fn wait_for_port(addr: &str, timeout: std::time::Duration) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!("{addr} did not accept connections within {timeout:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A memory figure of process `pid` (a number, or `self`) from `/proc/<pid>/status`, in KiB:
/// `VmRSS` (resident now) or `VmHWM` (the peak so far).
pub fn memory_kib(pid: &str, field: &str) -> anyhow::Result<u64> {
    use anyhow::Context as _;
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))
        .with_context(|| format!("{field} missing in /proc/{pid}/status"))?;
    Ok(line.split_whitespace().nth(1).context("no value")?.parse()?)
}
