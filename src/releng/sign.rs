//! Signing Git objects we build ourselves — annotated tags (the release's trust anchor) and,
//! optionally, commits — with one of two formats, as Git's `gpg.format` chooses:
//! * `openpgp` (default): an ASCII-armoured detached OpenPGP signature made by gpgme;
//! * `ssh`: an SSH signature (sshsig, namespace `git`) made with an unencrypted OpenSSH Ed25519
//!   private key file, what `git tag -s` writes with `gpg.format=ssh` and `user.signingkey=PATH`.
//!
//! Nothing here shells out to `git tag -s`; the object text is built byte for byte as Git does, so
//! `git verify-tag` / `git verify-commit` (with `gpg.ssh.allowedSignersFile` for SSH), `ssh-keygen
//! -Y verify -n git` and the agent's verification (payload = object text before the signature
//! block) all accept it.

use git2::{ObjectType, Oid, Repository, Signature};
use ssh_key::{Algorithm, HashAlg, LineEnding, PrivateKey};
use std::path::{Path, PathBuf};

/// A signing problem: the key, the GnuPG engine, or writing the signed object.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error(
        "no secret key {fingerprint} in the GnuPG home ({home}); import it (`gpg --import`) or pass the fingerprint of a key `gpg --list-secret-keys` shows"
    )]
    KeyNotFound { fingerprint: String, home: String, source: gpgme::Error },
    #[error("key {fingerprint} cannot sign ({why}); use a valid signing key")]
    KeyUnusable { fingerprint: String, why: &'static str },
    #[error(
        "GnuPG could not sign with {fingerprint} (a passphrase-protected key needs a running gpg-agent with the passphrase cached)"
    )]
    Sign { fingerprint: String, source: gpgme::Error },
    #[error("GnuPG engine: {0}")]
    Engine(gpgme::Error),
    #[error("GnuPG returned no signature by {fingerprint}")]
    NoSignature { fingerprint: String },
    #[error("reading the SSH signing key {path}")]
    SshKeyRead { path: PathBuf, source: std::io::Error },
    #[error(
        "{path} is not an OpenSSH private key (expected `-----BEGIN OPENSSH PRIVATE KEY-----`, e.g. from `ssh-keygen -t ed25519`)"
    )]
    SshKeyFormat { path: PathBuf, source: ssh_key::Error },
    #[error("the SSH signing key {path} is {why}; use an unencrypted ssh-ed25519 key (ssh-keygen -t ed25519 -N '')")]
    SshKeyUnusable { path: String, why: String },
    #[error("signing with the SSH key {fingerprint}")]
    SshSign { fingerprint: String, source: ssh_key::Error },
    #[error("writing the signed object")]
    Git(#[from] git2::Error),
}

/// One secret key, ready to sign: an OpenPGP key in a GnuPG home, or an SSH key.
pub struct Signer {
    key: SigningKey,
    fingerprint: String,
}

enum SigningKey {
    OpenPgp { ctx: gpgme::Context, key: gpgme::Key },
    // Boxed: a private key is large next to gpgme's handles.
    Ssh(Box<PrivateKey>),
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = match self.key {
            SigningKey::OpenPgp { .. } => "openpgp",
            SigningKey::Ssh(_) => "ssh",
        };
        f.debug_struct("Signer").field("format", &format).field("fingerprint", &self.fingerprint).finish()
    }
}

/// Upper-case hex without spaces, the form GnuPG prints and matches most reliably.
pub fn normalize_fingerprint(fpr: &str) -> String {
    fpr.chars().filter(|c| !c.is_whitespace()).collect::<String>().trim_start_matches("0x").to_ascii_uppercase()
}

impl Signer {
    /// Opens secret key `fingerprint` from `home` (a GnuPG home directory; `None` means GnuPG's
    /// default: `$GNUPGHOME`, else `~/.gnupg`).
    ///
    /// Errors: the key is unknown, has no secret part, or is revoked/expired/disabled/unable to sign.
    pub fn open(fingerprint: &str, home: Option<&Path>) -> Result<Signer, SignError> {
        let fingerprint = normalize_fingerprint(fingerprint);
        let mut ctx = gpgme::Context::from_protocol(gpgme::Protocol::OpenPgp).map_err(SignError::Engine)?;
        if let Some(h) = home {
            ctx.set_engine_home_dir(h.to_string_lossy().as_bytes()).map_err(SignError::Engine)?;
        }
        ctx.set_armor(true);
        let home_desc = home
            .map(|h| h.display().to_string())
            .unwrap_or_else(|| std::env::var("GNUPGHOME").unwrap_or_else(|_| "~/.gnupg".to_string()));
        let key = ctx.get_secret_key(fingerprint.as_str()).map_err(|source| SignError::KeyNotFound {
            fingerprint: fingerprint.clone(),
            home: home_desc,
            source,
        })?;
        let why = if key.is_revoked() {
            Some("revoked")
        } else if key.is_expired() {
            Some("expired")
        } else if key.is_disabled() {
            Some("disabled")
        } else if key.is_invalid() {
            Some("invalid")
        } else if !key.can_sign() {
            Some("no signing capability")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(SignError::KeyUnusable { fingerprint, why });
        }
        // Report the primary key's full fingerprint even when a long key id was given.
        let full = key.fingerprint().map(str::to_string).unwrap_or(fingerprint);
        ctx.add_signer(&key).map_err(SignError::Engine)?;
        Ok(Signer { key: SigningKey::OpenPgp { ctx, key }, fingerprint: full })
    }

    /// Reads an unencrypted OpenSSH Ed25519 private key file (what `user.signingkey` names with
    /// `gpg.format=ssh`); it signs in namespace `git`.
    ///
    /// Errors: the file cannot be read, is not an OpenSSH private key, is encrypted, or not Ed25519
    /// (the agents verify Ed25519 SSH keys only).
    pub fn open_ssh(path: &Path) -> Result<Signer, SignError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SignError::SshKeyRead { path: path.to_path_buf(), source })?;
        let key = PrivateKey::from_openssh(text.trim())
            .map_err(|source| SignError::SshKeyFormat { path: path.to_path_buf(), source })?;
        Signer::ssh(key, &path.display().to_string())
    }

    /// Signs with an SSH key already in memory (the agent's status key signs its write-back
    /// commits); `origin` names it in errors.
    pub fn ssh(key: PrivateKey, origin: &str) -> Result<Signer, SignError> {
        let unusable = |why: String| SignError::SshKeyUnusable { path: origin.to_string(), why };
        if key.is_encrypted() {
            return Err(unusable("encrypted".into()));
        }
        if key.algorithm() != Algorithm::Ed25519 {
            return Err(unusable(format!("a {} key", key.algorithm())));
        }
        let fingerprint = key.public_key().fingerprint(HashAlg::Sha256).to_string();
        Ok(Signer { key: SigningKey::Ssh(Box::new(key)), fingerprint })
    }

    /// The signing key's primary fingerprint (`SHA256:…` for an SSH key, as `ssh-keygen -l` prints).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Name and email of the key's first user id, used as tagger/committer when Git has none.
    /// An SSH key has no user id: Git's `user.name`/`user.email` must say who signs.
    pub fn identity(&self) -> Option<(String, String)> {
        let SigningKey::OpenPgp { key, .. } = &self.key else { return None };
        let uid = key.user_ids().next()?;
        let name = uid.name().ok()?.to_string();
        let email = uid.email().ok()?.to_string();
        (!name.is_empty() || !email.is_empty()).then_some((name, email))
    }

    /// An ASCII-armoured detached signature over `payload`: an OpenPGP signature block, or an
    /// SSH signature block in namespace `git`.
    pub fn sign_detached(&mut self, payload: &[u8]) -> Result<String, SignError> {
        let (ctx, key) = match &mut self.key {
            SigningKey::OpenPgp { ctx, key } => (ctx, key),
            SigningKey::Ssh(key) => {
                let ssh = |source: ssh_key::Error| SignError::SshSign { fingerprint: self.fingerprint.clone(), source };
                // SHA-512, as `ssh-keygen -Y sign` (and so Git) hashes by default.
                let sig = key.sign(crate::release::GIT_NAMESPACE, HashAlg::Sha512, payload).map_err(ssh)?;
                return sig.to_pem(LineEnding::LF).map_err(ssh);
            }
        };
        let mut out = Vec::new();
        let result = ctx
            .sign(gpgme::SignMode::Detached, payload, &mut out)
            .map_err(|source| SignError::Sign { fingerprint: self.fingerprint.clone(), source })?;
        // A key with a signing subkey signs with the subkey: accept any of the key's own subkeys.
        let ours = result.new_signatures().any(|s| {
            let Ok(f) = s.fingerprint() else { return false };
            key.subkeys().any(|k| k.fingerprint().is_ok_and(|kf| kf.eq_ignore_ascii_case(f)))
        });
        if !ours {
            return Err(SignError::NoSignature { fingerprint: self.fingerprint.clone() });
        }
        String::from_utf8(out).map_err(|_| SignError::NoSignature { fingerprint: self.fingerprint.clone() })
    }
}

/// `Name <email> <seconds> <±hhmm>`, the way Git writes `tagger`/`author` lines.
pub fn signature_line(sig: &Signature<'_>) -> String {
    let when = sig.when();
    let offset = when.offset_minutes();
    let sign = if offset < 0 { '-' } else { '+' };
    let abs = offset.unsigned_abs();
    format!(
        "{} <{}> {} {}{:02}{:02}",
        String::from_utf8_lossy(sig.name_bytes()),
        String::from_utf8_lossy(sig.email_bytes()),
        when.seconds(),
        sign,
        abs / 60,
        abs % 60
    )
}

/// The unsigned text of an annotated tag object pointing at commit `target`. The message always
/// ends with a newline so the signature starts on its own line, as `git tag -s` writes it.
pub fn tag_payload(target: Oid, name: &str, tagger: &Signature<'_>, message: &str) -> String {
    let mut msg = message.trim_end().to_string();
    msg.push('\n');
    format!("object {target}\ntype commit\ntag {name}\ntagger {}\n\n{msg}", signature_line(tagger))
}

/// Writes an annotated tag object for commit `target`, signed by `signer`, into the object
/// database and returns its id. The caller creates `refs/tags/<name>` once everything else it
/// depends on succeeded, so a failed release leaves only unreferenced objects behind.
pub fn write_signed_tag(
    repo: &Repository,
    signer: &mut Signer,
    target: Oid,
    name: &str,
    tagger: &Signature<'_>,
    message: &str,
) -> Result<Oid, SignError> {
    let payload = tag_payload(target, name, tagger, message);
    let signature = signer.sign_detached(payload.as_bytes())?;
    let mut object = payload;
    object.push_str(&signature);
    Ok(repo.odb()?.write(ObjectType::Tag, object.as_bytes())?)
}

/// Writes a commit object (signed with a `gpgsig` header when a signer is given) and returns its
/// id without moving any reference.
pub fn write_commit(
    repo: &Repository,
    signer: Option<&mut Signer>,
    who: &Signature<'_>,
    message: &str,
    tree: &git2::Tree<'_>,
    parents: &[&git2::Commit<'_>],
) -> Result<Oid, SignError> {
    let buf = repo.commit_create_buffer(who, who, message, tree, parents)?;
    let content = std::str::from_utf8(&buf).map_err(|_| git2::Error::from_str("commit buffer is not UTF-8"))?;
    match signer {
        Some(s) => {
            let signature = s.sign_detached(content.as_bytes())?;
            Ok(repo.commit_signed(content, &signature, None)?)
        }
        None => Ok(repo.odb()?.write(ObjectType::Commit, content.as_bytes())?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("0x abcd ef12", "ABCDEF12")]
    #[case("ABCDEF", "ABCDEF")]
    #[case(" 1234 5678 9abc ", "123456789ABC")]
    fn fingerprints_are_normalized(#[case] input: &str, #[case] want: &str) {
        assert_eq!(normalize_fingerprint(input), want);
    }

    #[rstest]
    #[case(120, "+0200")]
    #[case(-330, "-0530")]
    #[case(0, "+0000")]
    fn signature_lines_carry_git_timezones(#[case] offset: i32, #[case] tz: &str) {
        let sig = Signature::new("Rel Eng", "rel@example.com", &git2::Time::new(1_700_000_000, offset)).unwrap();
        assert_eq!(signature_line(&sig), format!("Rel Eng <rel@example.com> 1700000000 {tz}"));
    }

    #[test]
    fn tag_payload_has_git_layout() {
        let sig = Signature::new("R", "r@x", &git2::Time::new(5, 0)).unwrap();
        let oid = Oid::from_str("0123456789abcdef0123456789abcdef01234567").unwrap();
        let text = tag_payload(oid, "rel-1", &sig, "Release rel-1\n\nbody\n\n");
        assert_eq!(
            text,
            "object 0123456789abcdef0123456789abcdef01234567\ntype commit\ntag rel-1\ntagger R <r@x> 5 +0000\n\nRelease rel-1\n\nbody\n"
        );
    }
}
