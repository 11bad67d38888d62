//! SSH keys made by the real `ssh-keygen`, for SSH-signed tags and commits and agent status keys.

use std::path::Path;
use std::process::Command;

/// Writes an unencrypted Ed25519 key pair to `path` and `path.pub` with `comment`; panics with
/// `ssh-keygen`'s stderr when it fails.
pub fn ssh_keygen(path: &Path, comment: &str) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
        .arg(path)
        .output()
        .expect("running ssh-keygen (`make deps-test` installs openssh-client)");
    assert!(out.status.success(), "ssh-keygen: {}", String::from_utf8_lossy(&out.stderr));
}
