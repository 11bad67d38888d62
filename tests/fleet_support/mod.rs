//! A fleet repo served by a real `git daemon`, with a working clone and a real GnuPG key that signs
//! its tags: the fixture of the trust, source and validate tests.

use fleetgate::source::{Checkout, Credentials, RetryPolicy, Source, init_fleet_repo};
use fleetgate_testenv::{GitDaemon, GpgHome};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The template's release id.
pub const RELEASE: &str = "rel-20250315-001";

pub struct FleetRemote {
    pub daemon: GitDaemon,
    pub url: String,
    /// The working clone releases are cut and pushed from.
    pub work: PathBuf,
    pub gpg: GpgHome,
    /// Fingerprint of the release key.
    pub fpr: String,
    /// The release key's armored public key file (the trust anchor).
    pub trusted: PathBuf,
    pub dir: tempfile::TempDir,
}

impl FleetRemote {
    /// The template as a repo on a git daemon, with `fleet.yaml` asking for [`RELEASE`]
    /// (not tagged yet).
    pub fn new() -> FleetRemote {
        let daemon = GitDaemon::start().expect("git daemon");
        let url = daemon.create_bare("fleet.git").expect("bare repo");
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        init_fleet_repo(&work).expect("fleetgate init");
        let gpg = GpgHome::new().expect("gpg home");
        let fpr = gpg.generate_key("Release Bot", "release@example.com").expect("gpg key");
        let trusted = gpg.write_public_key(&fpr, &dir.path().join("release-key.asc")).unwrap();
        let remote = FleetRemote { daemon, url, work, gpg, fpr, trusted, dir };
        remote.git(&["remote", "add", "origin", &remote.url]);
        remote.edit("fleet.yaml", "  # release: rel-20250315-001", "  release: rel-20250315-001");
        remote.commit_all("promote rel-20250315-001 to the fleet");
        remote.git(&["push", "-q", "origin", "main"]);
        remote
    }

    /// Runs git in the working clone (signing with the release key when asked to).
    pub fn git(&self, args: &[&str]) -> String {
        self.gpg.run_git(&self.work, &self.fpr, args).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Replaces `from` by `to` in a file of the working clone.
    pub fn edit(&self, file: &str, from: &str, to: &str) {
        let path = self.work.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{file} lacks {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    }

    pub fn commit_all(&self, message: &str) -> String {
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "-m", message]);
        self.git(&["rev-parse", "HEAD"]).trim().to_string()
    }

    /// A signed annotated tag at HEAD, pushed.
    pub fn signed_tag(&self, name: &str) {
        self.git(&["tag", "-s", name, "-m", &format!("release {name}")]);
        self.git(&["push", "-q", "origin", &format!("refs/tags/{name}")]);
    }

    pub fn source(&self, state: &Path) -> Source {
        Source::open(&self.url, state, Credentials::default()).unwrap().with_retry(RetryPolicy {
            attempts: 2,
            initial: Duration::from_millis(50),
            max: Duration::from_millis(100),
        })
    }

    /// A fresh mirror of the remote in `state`, synced, and its checkout.
    pub fn checkout(&self, state: &Path) -> (Source, Checkout) {
        let mut source = self.source(state);
        source.sync().expect("sync");
        let checkout = source.checkout().expect("checkout");
        (source, checkout)
    }
}
