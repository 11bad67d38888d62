//! `git daemon` on loopback over a directory of bare repos, push (receive-pack) enabled; and
//! [`git_in`], the `git` command tests set their repos up with.

use crate::process::{Guarded, free_port, wait_for_port};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Runs `git -C dir args` with a fixed identity and `main` as the default branch, for test set-up:
/// returns stdout, trimmed; panics with git's stderr when it fails.
pub fn git_in(dir: &Path, args: &[&str]) -> String {
    git_in_env(dir, &[], args)
}

/// [`git_in`] with extra environment variables (e.g. `GIT_COMMITTER_DATE`).
pub fn git_in_env(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=fleetgate test", "-c", "user.email=test@example.com"])
        .args(["-c", "init.defaultBranch=main"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("running git {args:?}: {e}"));
    assert!(out.status.success(), "git {args:?} in {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

pub struct GitDaemon {
    /// None while [`stop`](GitDaemon::stop)ped.
    proc: Option<Guarded>,
    port: u16,
    base: PathBuf,
    dir: tempfile::TempDir,
}

impl GitDaemon {
    /// Starts a daemon serving every bare repo under a fresh temp dir.
    pub fn start() -> anyhow::Result<GitDaemon> {
        let dir = tempfile::Builder::new().prefix("fg-git").tempdir()?;
        let base = dir.path().join("repos");
        std::fs::create_dir_all(&base)?;
        let port = free_port();
        let proc = Self::spawn(&base, port, dir.path())?;
        Ok(GitDaemon { proc: Some(proc), port, base, dir })
    }

    fn spawn(base: &Path, port: u16, dir: &Path) -> anyhow::Result<Guarded> {
        let mut cmd = Command::new("git");
        cmd.arg("daemon")
            .arg("--reuseaddr")
            .arg(format!("--base-path={}", base.display()))
            .arg("--export-all")
            .arg("--enable=receive-pack")
            .arg("--listen=127.0.0.1")
            .arg(format!("--port={port}"))
            .arg(base);
        let proc = Guarded::spawn_isolated("git-daemon", cmd, &dir.join("daemon.log"))?;
        wait_for_port(&format!("127.0.0.1:{port}"), Duration::from_secs(10))?;
        Ok(proc)
    }

    /// Stops the daemon (the Git server goes out of reach; its repos stay).
    pub fn stop(&mut self) {
        self.proc = None;
    }

    /// Starts the daemon again on the same port over the same repos, after [`stop`](Self::stop).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.proc.is_none(), "the git daemon is running");
        self.proc = Some(Self::spawn(&self.base, self.port, self.dir.path())?);
        Ok(())
    }

    /// Creates an empty bare repo `name` (e.g. `fleet.git`) and returns its `git://` URL.
    pub fn create_bare(&self, name: &str) -> anyhow::Result<String> {
        let path = self.base.join(name);
        let st = Command::new("git").args(["init", "--bare", "-q", "-b", "main"]).arg(&path).status()?;
        anyhow::ensure!(st.success(), "git init --bare {name} failed");
        Ok(self.url(name))
    }

    /// `127.0.0.1:PORT`: where the daemon listens (and where, while it is stopped, a test may
    /// put a server of its own that misbehaves).
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `git://127.0.0.1:PORT/NAME`.
    pub fn url(&self, name: &str) -> String {
        format!("git://127.0.0.1:{}/{}", self.port, name)
    }

    /// Filesystem path of a served bare repo.
    pub fn path(&self, name: &str) -> PathBuf {
        self.base.join(name)
    }

    pub fn base(&self) -> &Path {
        &self.base
    }
}
