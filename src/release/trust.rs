//! Trust anchors and signature checks: OpenPGP (gpgme) and SSH (sshsig, the format of
//! `git tag -s` / `git commit -S` with `gpg.format=ssh`).
//!
//! A [`Keyring`] is built only from armored public keys the *caller* supplies (the agent's own
//! configuration, `--trusted-keys` files) — never from the repo being verified. It lives in a
//! private GnuPG home of its own (a short path under `/tmp`: gpg's socket paths are limited to
//! about 108 bytes), where every imported key is marked trusted through `trusted-key` lines in its
//! `gpg.conf`; the user's own `~/.gnupg` is never consulted, and no gpg-agent is started
//! (`no-autostart`), so a killed process leaves no daemon behind.
//!
//! gpgme's `verify` returns Ok even when the signing key is unknown, so a signature is accepted
//! only when its status is OK, its summary says VALID (not expired, not revoked), and the primary
//! fingerprint of its key is one of the imported ones — and *every* signature must pass.
//!
//! A key file in OpenSSH `allowed_signers` form (`principal [namespaces="git"] ssh-ed25519 AAAA…`)
//! adds SSH keys instead. An SSH signature is accepted only when it parses, was made by one of
//! them, is for namespace `git` (what Git signs tags and commits in; a signature made for any
//! other use is refused), the key's `namespaces=` option (if any) allows `git`, and it verifies
//! over the signed content. Only Ed25519 SSH keys are supported.

use crate::model::ErrorClass;
use gpgme::{Context, Protocol, SignatureSummary};
use ssh_key::{Algorithm, HashAlg, PublicKey, SshSig};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Why a signature was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureProblem {
    #[error("not signed")]
    Missing,
    #[error("signed in {format} format; fleetgate verifies OpenPGP and SSH signatures only")]
    UnsupportedFormat { format: String },
    #[error("the SSH signature is for namespace {namespace:?}, not \"git\" (it was made for another use)")]
    WrongNamespace { namespace: String },
    #[error("signed by key {fingerprint}, which is not among the trusted keys")]
    UntrustedKey { fingerprint: String },
    #[error("the signature does not verify: {detail}")]
    Bad { detail: String },
    #[error("the signature by {fingerprint} is not valid: {detail}")]
    NotValid { fingerprint: String, detail: String },
    #[error("the verification engine (gpg) failed: {detail}")]
    Engine { detail: String },
}

impl SignatureProblem {
    pub fn class(&self) -> ErrorClass {
        match self {
            SignatureProblem::Engine { .. } => ErrorClass::Retryable,
            _ => ErrorClass::Stalling,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("reading trusted key file {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("trusted key file {origin} holds no OpenPGP public key")]
    NoKey { origin: String },
    #[error("importing trusted keys from {origin}: {detail}")]
    Import { origin: String, detail: String },
    #[error("setting up the private keyring: {detail}")]
    Setup { detail: String },
    #[error("allowed_signers file {origin}, line {line}: {detail}")]
    AllowedSigners { origin: String, line: usize, detail: String },
}

/// The SSH signature namespace Git signs tags and commits in.
pub const GIT_NAMESPACE: &str = "git";

/// One line of an `allowed_signers` file.
#[derive(Debug, Clone)]
struct AllowedSigner {
    key: PublicKey,
    /// `namespaces="…"`: the namespaces the key may sign in; None: any.
    namespaces: Option<Vec<String>>,
}

/// Whether a key file is in `allowed_signers` form: its first meaningful line names a principal,
/// then (after options) an SSH key type. Armored or binary OpenPGP keys never look like that.
fn is_allowed_signers(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else { return false };
    let first = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#'));
    first.is_some_and(|l| {
        l.split_whitespace().skip(1).any(|t| t.starts_with("ssh-") || t.starts_with("ecdsa-") || t.starts_with("sk-"))
    })
}

/// Parses `principals [options] keytype base64 [comment]` lines.
fn parse_allowed_signers(origin: &str, text: &str) -> Result<Vec<AllowedSigner>, TrustError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |detail: String| TrustError::AllowedSigners { origin: origin.to_string(), line: i + 1, detail };
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let at = tokens
            .iter()
            .position(|t| t.starts_with("ssh-") || t.starts_with("ecdsa-") || t.starts_with("sk-"))
            .filter(|&at| at >= 1 && at + 1 < tokens.len())
            .ok_or_else(|| bad("expected `principals [options] ssh-ed25519 AAAA…`".into()))?;
        let mut namespaces = None;
        for option in tokens[1..at].iter().flat_map(|o| o.split(',')) {
            if option.eq_ignore_ascii_case("cert-authority") {
                return Err(bad("cert-authority lines are not supported; list the signing keys themselves".into()));
            }
            if let Some(value) = option.strip_prefix("namespaces=") {
                namespaces = Some(value.trim_matches('"').split(',').map(str::to_string).collect());
            }
        }
        let key = PublicKey::from_openssh(&format!("{} {}", tokens[at], tokens[at + 1]))
            .map_err(|e| bad(format!("not an OpenSSH public key: {e}")))?;
        if key.algorithm() != Algorithm::Ed25519 {
            return Err(bad(format!("{} keys are not supported; use ssh-ed25519", key.algorithm())));
        }
        out.push(AllowedSigner { key, namespaces });
    }
    if out.is_empty() {
        return Err(TrustError::NoKey { origin: origin.to_string() });
    }
    Ok(out)
}

/// A private keyring of trusted public keys.
pub struct Keyring {
    home: tempfile::TempDir,
    /// Primary fingerprints of the trusted keys (upper-case hex).
    trusted: BTreeSet<String>,
    /// Trusted SSH keys, from `allowed_signers` files.
    ssh: Vec<AllowedSigner>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ssh: Vec<String> = self.ssh.iter().map(|s| s.key.fingerprint(HashAlg::Sha256).to_string()).collect();
        f.debug_struct("Keyring").field("trusted", &self.trusted).field("ssh", &ssh).finish()
    }
}

fn engine(e: impl std::fmt::Display) -> SignatureProblem {
    SignatureProblem::Engine { detail: e.to_string() }
}

impl Keyring {
    /// The keyring of a command's key files (`--trusted-keys`): None when none are given, so the
    /// caller decides what "not checked" means for it.
    pub fn from_key_files(paths: &[PathBuf]) -> Result<Option<Keyring>, TrustError> {
        if paths.is_empty() {
            return Ok(None);
        }
        Ok(Some(Keyring::from_files(paths)?))
    }

    /// Imports every armored (or binary) public key in `paths`.
    pub fn from_files(paths: &[PathBuf]) -> Result<Keyring, TrustError> {
        let mut keys = Vec::new();
        for p in paths {
            let bytes = std::fs::read(p).map_err(|source| TrustError::Read { path: p.clone(), source })?;
            keys.push((p.display().to_string(), bytes));
        }
        Keyring::from_keys(&keys)
    }

    /// Imports keys given as `(origin for messages, key bytes)`: OpenPGP public keys, or OpenSSH
    /// `allowed_signers` files.
    pub fn from_keys(keys: &[(String, Vec<u8>)]) -> Result<Keyring, TrustError> {
        let setup = |e: &dyn std::fmt::Display| TrustError::Setup { detail: e.to_string() };
        let home = tempfile::Builder::new().prefix("fgk").tempdir_in("/tmp").map_err(|e| setup(&e))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).map_err(|e| setup(&e))?;
        }
        // No gpg-agent, dirmngr or network: verifying with public keys needs none of them, and an
        // agent started here would outlive a process that is killed before this keyring drops.
        const BASE_CONF: &str = "no-autostart\nno-auto-key-retrieve\ntrust-model pgp\n";
        std::fs::write(home.path().join("gpg.conf"), BASE_CONF).map_err(|e| setup(&e))?;
        let mut ring = Keyring { home, trusted: BTreeSet::new(), ssh: Vec::new() };
        let mut ctx = ring.context().map_err(|e| setup(&e))?;
        for (origin, bytes) in keys {
            if is_allowed_signers(bytes) {
                ring.ssh.extend(parse_allowed_signers(origin, &String::from_utf8_lossy(bytes))?);
                continue;
            }
            let result = ctx
                .import(bytes.as_slice())
                .map_err(|e| TrustError::Import { origin: origin.clone(), detail: e.to_string() })?;
            let mut found = false;
            for import in result.imports() {
                let Ok(fpr) = import.fingerprint() else { continue };
                // Resolve to the primary key's fingerprint: signatures made by a subkey are
                // attributed to their primary key below.
                let key = ctx
                    .get_key(fpr)
                    .map_err(|e| TrustError::Import { origin: origin.clone(), detail: e.to_string() })?;
                if let Ok(primary) = key.fingerprint() {
                    ring.trusted.insert(primary.to_ascii_uppercase());
                    found = true;
                }
            }
            if !found {
                return Err(TrustError::NoKey { origin: origin.clone() });
            }
        }
        // Every imported key is an anchor: mark it ultimately trusted for this home only.
        let mut conf = String::from(BASE_CONF);
        for f in &ring.trusted {
            conf.push_str(&format!("trusted-key {f}\n"));
        }
        std::fs::write(ring.home.path().join("gpg.conf"), conf).map_err(|e| setup(&e))?;
        Ok(ring)
    }

    /// Primary fingerprints of the trusted keys.
    pub fn fingerprints(&self) -> impl Iterator<Item = &str> {
        self.trusted.iter().map(String::as_str)
    }

    pub fn home(&self) -> &Path {
        self.home.path()
    }

    fn context(&self) -> Result<Context, gpgme::Error> {
        let mut ctx = Context::from_protocol(Protocol::OpenPgp)?;
        ctx.set_engine_home_dir(self.home.path().to_string_lossy().as_bytes())?;
        ctx.set_offline(true);
        Ok(ctx)
    }

    /// Verifies a detached armored signature over `payload`. Returns the primary fingerprint of
    /// the (trusted) key that made it.
    ///
    /// An SSH signature (`-----BEGIN SSH SIGNATURE-----`) is checked against the `allowed_signers`
    /// keys instead; the signer is then named by its `SHA256:…` fingerprint.
    pub fn verify_detached(&self, payload: &[u8], signature: &[u8]) -> Result<String, SignatureProblem> {
        if String::from_utf8_lossy(signature).trim_start().starts_with(SSH_SIGNATURE) {
            return self.verify_ssh(payload, signature);
        }
        if let Some(format) = foreign_format(signature) {
            return Err(SignatureProblem::UnsupportedFormat { format: format.to_string() });
        }
        let mut ctx = self.context().map_err(engine)?;
        let result = ctx
            .verify_detached(signature, payload)
            .map_err(|e| SignatureProblem::Bad { detail: format!("gpg could not read the signature block ({e})") })?;
        let mut signer = None;
        for sig in result.signatures() {
            let fpr = sig.fingerprint().unwrap_or("(unknown key)").to_ascii_uppercase();
            let summary = sig.summary();
            if summary.contains(SignatureSummary::KEY_MISSING) {
                return Err(SignatureProblem::UntrustedKey { fingerprint: fpr });
            }
            if let Err(e) = sig.status() {
                if e.code() == gpgme::Error::NO_PUBKEY.code() {
                    return Err(SignatureProblem::UntrustedKey { fingerprint: fpr });
                }
                return Err(SignatureProblem::Bad { detail: e.to_string() });
            }
            for (flag, what) in [
                (SignatureSummary::KEY_REVOKED, "the key is revoked"),
                (SignatureSummary::KEY_EXPIRED, "the key has expired"),
                (SignatureSummary::SIG_EXPIRED, "the signature has expired"),
                (SignatureSummary::RED, "the signature is marked bad"),
            ] {
                if summary.contains(flag) {
                    return Err(SignatureProblem::NotValid { fingerprint: fpr, detail: what.to_string() });
                }
            }
            let primary = ctx
                .get_key(fpr.as_str())
                .ok()
                .and_then(|k| k.fingerprint().ok().map(str::to_ascii_uppercase))
                .unwrap_or_else(|| fpr.clone());
            if !self.trusted.contains(&primary) {
                return Err(SignatureProblem::UntrustedKey { fingerprint: primary });
            }
            if !summary.contains(SignatureSummary::VALID) {
                return Err(SignatureProblem::NotValid {
                    fingerprint: primary,
                    detail: format!("gpg reports validity {:?}, summary {:?}", sig.validity(), summary),
                });
            }
            signer.get_or_insert(primary);
        }
        signer.ok_or_else(|| SignatureProblem::Bad { detail: "no signature found in the signature block".to_string() })
    }
}

impl Keyring {
    fn verify_ssh(&self, payload: &[u8], signature: &[u8]) -> Result<String, SignatureProblem> {
        let sig = SshSig::from_pem(signature)
            .map_err(|e| SignatureProblem::Bad { detail: format!("not a readable SSH signature ({e})") })?;
        let fingerprint = sig.public_key().fingerprint(HashAlg::Sha256).to_string();
        let Some(signer) = self.ssh.iter().find(|s| s.key.key_data() == sig.public_key()) else {
            return Err(SignatureProblem::UntrustedKey { fingerprint });
        };
        if sig.namespace() != GIT_NAMESPACE {
            return Err(SignatureProblem::WrongNamespace { namespace: sig.namespace().to_string() });
        }
        if let Some(allowed) = &signer.namespaces
            && !allowed.iter().any(|n| n == GIT_NAMESPACE)
        {
            return Err(SignatureProblem::NotValid {
                fingerprint,
                detail: format!("allowed_signers limits this key to namespaces {}", allowed.join(",")),
            });
        }
        signer.key.verify(GIT_NAMESPACE, payload, &sig).map_err(|e| SignatureProblem::Bad {
            detail: format!("the SSH signature does not match the signed content ({e})"),
        })?;
        Ok(fingerprint)
    }
}

impl Drop for Keyring {
    fn drop(&mut self) {
        // Stop any gpg-agent or keyboxd a verification started in this home; TempDir removes it.
        let _ =
            std::process::Command::new("gpgconf").env("GNUPGHOME", self.home.path()).args(["--kill", "all"]).output();
    }
}

const PGP_SIGNATURE: &str = "-----BEGIN PGP SIGNATURE-----";
const SSH_SIGNATURE: &str = "-----BEGIN SSH SIGNATURE-----";
const FOREIGN: [(&str, &str); 1] = [("-----BEGIN SIGNED MESSAGE-----", "X.509")];

fn foreign_format(signature: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(signature);
    FOREIGN.iter().find(|(marker, _)| text.trim_start().starts_with(marker)).map(|(_, f)| *f)
}

/// A signed tag object's bytes split into (payload, signature): the signature starts at the last
/// line that opens a signature block (OpenPGP or SSH). Returns `Err(problem)` when there is no
/// signature, or one in another format.
pub fn split_signed_tag(raw: &[u8]) -> Result<(&[u8], &[u8]), SignatureProblem> {
    let starts = |marker: &str| -> Option<usize> {
        let m = marker.as_bytes();
        (0..raw.len().saturating_sub(m.len() - 1))
            .rev()
            .find(|&i| raw[i..].starts_with(m) && (i == 0 || raw[i - 1] == b'\n'))
    };
    if let Some(i) = [PGP_SIGNATURE, SSH_SIGNATURE].into_iter().filter_map(starts).max() {
        return Ok((&raw[..i], &raw[i..]));
    }
    if let Some((_, format)) = FOREIGN.iter().find(|(m, _)| starts(m).is_some()) {
        return Err(SignatureProblem::UnsupportedFormat { format: format.to_string() });
    }
    Err(SignatureProblem::Missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "object 0123\ntype commit\ntag rel-1\ntagger A <a@x> 1 +0000\n\nrelease rel-1\n";

    #[test]
    fn splits_at_the_last_signature_block() {
        let raw =
            format!("{HEAD}quoting {PGP_SIGNATURE} in a message\n{PGP_SIGNATURE}\nabc\n-----END PGP SIGNATURE-----\n");
        let (payload, sig) = split_signed_tag(raw.as_bytes()).unwrap();
        assert!(payload.ends_with(b"in a message\n"));
        assert!(sig.starts_with(PGP_SIGNATURE.as_bytes()));
    }

    #[test]
    fn unsigned_ssh_and_foreign_tags_are_told_apart() {
        assert_eq!(split_signed_tag(HEAD.as_bytes()), Err(SignatureProblem::Missing));
        let ssh = format!("{HEAD}{SSH_SIGNATURE}\nx\n-----END SSH SIGNATURE-----\n");
        let (payload, sig) = split_signed_tag(ssh.as_bytes()).unwrap();
        assert_eq!((payload, &sig[..SSH_SIGNATURE.len()]), (HEAD.as_bytes(), SSH_SIGNATURE.as_bytes()));
        let x509 = format!("{HEAD}-----BEGIN SIGNED MESSAGE-----\nx\n");
        assert_eq!(
            split_signed_tag(x509.as_bytes()),
            Err(SignatureProblem::UnsupportedFormat { format: "X.509".to_string() })
        );
    }

    #[test]
    fn allowed_signers_lines_are_read_with_their_namespaces() {
        let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILM+rvN+ot98qgEN796jTiQfZfG1KaT0PtFDJ/XFSqti";
        let text =
            format!("# release signers\nrelease@example.com {key} laptop\nci@example.com namespaces=\"file\" {key}\n");
        assert!(is_allowed_signers(text.as_bytes()));
        assert!(!is_allowed_signers(b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n"));
        let signers = parse_allowed_signers("f", &text).unwrap();
        assert_eq!(signers.len(), 2);
        assert_eq!(signers[1].namespaces.as_deref(), Some(&["file".to_string()][..]));
        let err = parse_allowed_signers("f", &format!("ca@x cert-authority {key}\n")).unwrap_err();
        assert!(err.to_string().contains("cert-authority"), "{err}");
    }
}
