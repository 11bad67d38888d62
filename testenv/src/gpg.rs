//! Throw-away GnuPG homes with generated keys, for signing tags and commits in tests.
//!
//! The home lives directly under `/tmp` with a short name: gpg-agent puts its socket in the home
//! directory and a Unix socket path is limited to about 108 bytes, which a deep temp dir exceeds.
//! Dropping the home stops its gpg-agent (`gpgconf --kill all`) and removes the directory.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct GpgHome {
    dir: tempfile::TempDir,
}

impl GpgHome {
    /// Creates an empty home (mode 0700, as gpg insists).
    pub fn new() -> anyhow::Result<GpgHome> {
        let dir = tempfile::Builder::new().prefix("fgpg").tempdir_in("/tmp").context("creating a GNUPGHOME")?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(GpgHome { dir })
    }

    /// The `GNUPGHOME` directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A `gpg` command bound to this home, in batch mode.
    pub fn gpg(&self) -> Command {
        let mut cmd = Command::new("gpg");
        cmd.env("GNUPGHOME", self.path()).arg("--batch");
        cmd
    }

    /// Generates an ed25519 signing key without passphrase for `Name <email>`; returns its fingerprint.
    pub fn generate_key(&self, name: &str, email: &str) -> anyhow::Result<String> {
        let out = self
            .gpg()
            .args(["--status-fd", "1", "--pinentry-mode", "loopback", "--passphrase", ""])
            .args(["--quick-gen-key", &format!("{name} <{email}>"), "ed25519", "sign", "never"])
            .output()
            .context("running gpg --quick-gen-key")?;
        let out = checked("gpg --quick-gen-key", out)?;
        // `[GNUPG:] KEY_CREATED P <fingerprint>`
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("[GNUPG:] KEY_CREATED ").and_then(|r| r.split_whitespace().nth(1)))
            .map(str::to_string)
            .context("gpg --quick-gen-key printed no KEY_CREATED line")
    }

    /// The ASCII-armored public key of `fingerprint`.
    pub fn export_public(&self, fingerprint: &str) -> anyhow::Result<String> {
        let out = self.gpg().args(["--armor", "--export", fingerprint]).output().context("running gpg --export")?;
        let out = checked("gpg --export", out)?;
        let text = String::from_utf8(out.stdout)?;
        if !text.contains("BEGIN PGP PUBLIC KEY BLOCK") {
            bail!("gpg --export {fingerprint} returned no key");
        }
        Ok(text)
    }

    /// Writes the armored public key of `fingerprint` to `path` (a trusted-keys file for fleetgate).
    pub fn write_public_key(&self, fingerprint: &str, path: &Path) -> anyhow::Result<PathBuf> {
        std::fs::write(path, self.export_public(fingerprint)?)?;
        Ok(path.to_path_buf())
    }

    /// A `git -C repo` command that signs with `fingerprint` from this home (`git tag -s`,
    /// `git commit -S`), with a fixed identity so it works without a global git config.
    pub fn git(&self, repo: &Path, fingerprint: &str) -> Command {
        let mut cmd = Command::new("git");
        cmd.env("GNUPGHOME", self.path())
            .arg("-C")
            .arg(repo)
            .args(["-c", &format!("user.signingkey={fingerprint}")])
            .args(["-c", "user.name=Release Bot", "-c", "user.email=release@example.com"])
            .args(["-c", "gpg.program=gpg", "-c", "gpg.format=openpgp"]);
        cmd
    }

    /// Runs [`GpgHome::git`] with `args` and returns stdout; fails with git's stderr.
    pub fn run_git(&self, repo: &Path, fingerprint: &str, args: &[&str]) -> anyhow::Result<String> {
        let out = self.git(repo, fingerprint).args(args).output().with_context(|| format!("running git {args:?}"))?;
        let out = checked(&format!("git {}", args.join(" ")), out)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

fn checked(what: &str, out: Output) -> anyhow::Result<Output> {
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out)
}

impl Drop for GpgHome {
    fn drop(&mut self) {
        // Stops the gpg-agent (and any keyboxd) this home started; the TempDir then removes it.
        let _ = Command::new("gpgconf").env("GNUPGHOME", self.path()).args(["--kill", "all"]).output();
    }
}
