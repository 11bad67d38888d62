//! SSH-signed release tags against the real things: keys made by `ssh-keygen`, tags signed by
//! `git tag -s` with `gpg.format=ssh` (and by `ssh-keygen -Y sign`, stored with `git mktag`),
//! pushed to a `git daemon`, trusted through an OpenSSH `allowed_signers` file given as a
//! trusted key file. A good tag is accepted (and `git verify-tag` agrees); an untrusted key, a
//! signature for another namespace and a corrupted signature are each refused with their own error.
//! The other way round: a tag fleetgate itself signs with an SSH key (`--signing-format ssh`)
//! verifies with `git verify-tag`, with `ssh-keygen -Y verify`, and with the agent's verification;
//! a commit it signs so (any signing command: `cluster register` here) verifies with `git
//! verify-commit` and is a signed promotion tip.

use crate::fleet_support;

use base64::Engine;
use fleet_support::{FleetRemote, RELEASE};
use fleetgate::model::ErrorClass;
use fleetgate::release::{Keyring, SignatureProblem, TagPins, VerifyError, resolve, verify};
use rstest::rstest;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// An Ed25519 key made by `ssh-keygen`; returns the private key file (its `.pub` is beside it).
fn ssh_key(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    fleetgate_testenv::ssh_keygen(&path, name);
    path
}

/// `release@example.com ssh-ed25519 AAAA…` for `key`, as an allowed_signers file.
fn allowed_signers(dir: &Path, key: &Path) -> PathBuf {
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let path = dir.join("allowed_signers");
    std::fs::write(&path, format!("release@example.com {public}")).unwrap();
    path
}

/// `git tag -s` with an SSH key, at HEAD, pushed.
fn git_ssh_tag(remote: &FleetRemote, name: &str, key: &Path) {
    let signing_key = format!("user.signingkey={}", key.display());
    remote.git(&["-c", "gpg.format=ssh", "-c", &signing_key, "tag", "-s", name, "-m", &format!("release {name}")]);
    remote.git(&["push", "-q", "origin", &format!("refs/tags/{name}")]);
}

/// An armored SSH signature of `payload` by `ssh-keygen -Y sign` in `namespace`.
fn ssh_keygen_sign(key: &Path, namespace: &str, payload: &[u8]) -> String {
    let mut child = Command::new("ssh-keygen")
        .args(["-q", "-Y", "sign", "-n", namespace, "-f"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), payload).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "ssh-keygen -Y sign: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Stores `payload` + `signature` as tag `name` with `git mktag` (which checks the format, not
/// the signature), points the ref at it and pushes.
fn store_tag(remote: &FleetRemote, name: &str, payload: &str, signature: &str) {
    let mut child = Command::new("git")
        .current_dir(&remote.work)
        .args(["mktag"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), format!("{payload}{signature}").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "git mktag");
    let oid = String::from_utf8(out.stdout).unwrap();
    remote.git(&["update-ref", &format!("refs/tags/{name}"), oid.trim()]);
    remote.git(&["push", "-q", "-f", "origin", &format!("refs/tags/{name}")]);
}

/// The payload of an annotated tag of HEAD named `name`, as git writes it before signing.
fn tag_payload(remote: &FleetRemote, name: &str) -> String {
    let head = remote.git(&["rev-parse", "HEAD"]);
    format!(
        "object {}\ntype commit\ntag {name}\ntagger Release Bot <release@example.com> 1750000000 +0000\n\nrelease {name}\n",
        head.trim()
    )
}

/// Flips one byte inside the signature value (the blob's last 64 bytes), keeping the armor valid.
fn corrupt(armored: &str) -> String {
    let body: String = armored.lines().filter(|l| !l.starts_with("-----")).collect();
    let mut blob = base64::engine::general_purpose::STANDARD.decode(body).unwrap();
    let at = blob.len() - 10;
    blob[at] ^= 0x01;
    let b64 = base64::engine::general_purpose::STANDARD.encode(blob);
    let lines: Vec<String> = b64.as_bytes().chunks(70).map(|c| String::from_utf8(c.to_vec()).unwrap()).collect();
    format!("-----BEGIN SSH SIGNATURE-----\n{}\n-----END SSH SIGNATURE-----\n", lines.join("\n"))
}

fn verify_tag(remote: &FleetRemote, trusted: &Path) -> Result<String, VerifyError> {
    let state = tempfile::tempdir().unwrap();
    let (_source, checkout) = remote.checkout(state.path());
    let desired = resolve(&checkout, "cluster-a").unwrap();
    let trust = Keyring::from_files(&[trusted.to_path_buf()]).expect("keyring");
    verify(&checkout, &desired, &trust, None, &mut TagPins::in_memory())
        .map(|v| v.signer().unwrap_or_default().to_string())
}

fn fingerprint(key: &Path) -> String {
    let out = Command::new("ssh-keygen").arg("-lf").arg(key.with_extension("pub")).output().unwrap();
    String::from_utf8(out.stdout).unwrap().split_whitespace().nth(1).unwrap().to_string()
}

#[test]
fn a_tag_signed_by_git_with_a_trusted_ssh_key_is_accepted_as_git_accepts_it() {
    let remote = FleetRemote::new();
    let key = ssh_key(remote.dir.path(), "release-ssh");
    let signers = allowed_signers(remote.dir.path(), &key);
    git_ssh_tag(&remote, RELEASE, &key);
    assert_eq!(verify_tag(&remote, &signers).unwrap(), fingerprint(&key));
    // Git itself, given the same allowed_signers, agrees.
    let allowed = format!("gpg.ssh.allowedSignersFile={}", signers.display());
    remote.git(&["-c", &allowed, "verify-tag", RELEASE]);
}

#[test]
fn a_tag_signed_by_ssh_keygen_in_the_git_namespace_is_accepted() {
    let remote = FleetRemote::new();
    let key = ssh_key(remote.dir.path(), "release-ssh");
    let signers = allowed_signers(remote.dir.path(), &key);
    let payload = tag_payload(&remote, RELEASE);
    store_tag(&remote, RELEASE, &payload, &ssh_keygen_sign(&key, "git", payload.as_bytes()));
    assert_eq!(verify_tag(&remote, &signers).unwrap(), fingerprint(&key));
}

#[test]
fn a_tag_fleetgate_signs_with_ssh_verifies_with_git_ssh_keygen_and_the_agent() {
    let remote = FleetRemote::new();
    let key = ssh_key(remote.dir.path(), "release-ssh");
    let signers = allowed_signers(remote.dir.path(), &key);
    // An SSH key carries no name: Git's identity says who tags.
    remote.git(&["config", "user.name", "Release Bot"]);
    remote.git(&["config", "user.email", "release@example.com"]);
    let manifests = remote.dir.path().join("render");
    let copied = Command::new("cp").arg("-r").arg(remote.work.join("operator")).arg(&manifests).status().unwrap();
    assert!(copied.success());
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["release", "create", "--repo"])
        .arg(&remote.work)
        .args(["--id", RELEASE, "--manifests"])
        .arg(&manifests)
        .args(["--image", "registry.example.com/redis-operator:v1.2.3-build.456", "--chart-version", "1.2.3"])
        .args(["--crd-version", "v1alpha2", "--git-commit", "a1b2c3d4e5f6", "--all", "--signing-format", "ssh"])
        .arg("--sign-key")
        .arg(&key)
        .arg("--push")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "release create: {said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains(&format!("signed by {}", fingerprint(&key))), "{said}");
    let repo = git2::Repository::open(&remote.work).unwrap();
    let tag = repo.refname_to_id(&format!("refs/tags/{RELEASE}")).unwrap();

    // Git, given the allowed_signers file, accepts the tag as its own `git tag -s` would be.
    let allowed = format!("gpg.ssh.allowedSignersFile={}", signers.display());
    let out =
        Command::new("git").current_dir(&remote.work).args(["-c", &allowed, "verify-tag", RELEASE]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "git verify-tag: {said}");
    assert!(said.contains("Good \"git\" signature for release@example.com"), "{said}");

    // OpenSSH alone: the payload (the tag object before the signature) in namespace git.
    let raw = repo.odb().unwrap().read(tag).unwrap().data().to_vec();
    let (payload, signature) = fleetgate::release::split_signed_tag(&raw).unwrap();
    let sig_file = remote.dir.path().join("tag.sig");
    std::fs::write(&sig_file, signature).unwrap();
    let mut child = Command::new("ssh-keygen")
        .args(["-Y", "verify", "-n", "git", "-I", "release@example.com", "-f"])
        .arg(&signers)
        .arg("-s")
        .arg(&sig_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), payload).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "ssh-keygen -Y verify: {}", String::from_utf8_lossy(&out.stderr));

    // And the agent's verification.
    assert_eq!(verify_tag(&remote, &signers).unwrap(), fingerprint(&key));
}

#[test]
fn an_encrypted_or_unreadable_ssh_signing_key_is_refused_with_its_own_error() {
    use fleetgate::releng::{SignError, Signer};
    let dir = tempfile::tempdir().unwrap();
    let encrypted = dir.path().join("encrypted");
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "secret", "-C", "enc", "-f"])
        .arg(&encrypted)
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = Signer::open_ssh(&encrypted).unwrap_err();
    assert!(matches!(&err, SignError::SshKeyUnusable { why, .. } if why == "encrypted"), "{err:?}");
    let not_a_key = dir.path().join("not-a-key");
    std::fs::write(&not_a_key, "hello").unwrap();
    assert!(matches!(Signer::open_ssh(&not_a_key).unwrap_err(), SignError::SshKeyFormat { .. }));
}

#[derive(Debug, Clone, Copy)]
enum Bad {
    UntrustedKey,
    WrongNamespace,
    Corrupted,
}

#[rstest]
#[case::untrusted_key(Bad::UntrustedKey)]
#[case::wrong_namespace(Bad::WrongNamespace)]
#[case::corrupted(Bad::Corrupted)]
fn an_untrustworthy_ssh_tag_is_refused_with_its_own_error(#[case] bad: Bad) {
    let remote = FleetRemote::new();
    let key = ssh_key(remote.dir.path(), "release-ssh");
    let signers = allowed_signers(remote.dir.path(), &key);
    let payload = tag_payload(&remote, RELEASE);
    let other = ssh_key(remote.dir.path(), "someone-else");
    match bad {
        Bad::UntrustedKey => git_ssh_tag(&remote, RELEASE, &other),
        Bad::WrongNamespace => {
            store_tag(&remote, RELEASE, &payload, &ssh_keygen_sign(&key, "file", payload.as_bytes()))
        }
        Bad::Corrupted => {
            store_tag(&remote, RELEASE, &payload, &corrupt(&ssh_keygen_sign(&key, "git", payload.as_bytes())))
        }
    }
    let err = verify_tag(&remote, &signers).unwrap_err();
    eprintln!("{bad:?} refused: {err}");
    match (bad, &err) {
        (Bad::UntrustedKey, VerifyError::UntrustedKey { fingerprint: f, .. }) => assert_eq!(*f, fingerprint(&other)),
        (
            Bad::WrongNamespace,
            VerifyError::InvalidSignature { problem: SignatureProblem::WrongNamespace { namespace }, .. },
        ) => assert_eq!(namespace, "file"),
        (Bad::Corrupted, VerifyError::BadSignature { .. }) => {}
        _ => panic!("{bad:?} was refused with the wrong error: {err:?}"),
    }
    assert_eq!(err.class(), ErrorClass::Stalling, "{err}");
}

#[test]
fn an_ssh_signed_promotion_commit_is_a_signed_tip_and_an_untrusted_one_is_refused() {
    use fleetgate::model::PromotionMode;
    use fleetgate::release::PromotionError;
    use fleetgate::status::StatusKeys;
    use fleetgate::status::check_tip;
    let remote = FleetRemote::new();
    let key = ssh_key(remote.dir.path(), "promoter");
    let other = ssh_key(remote.dir.path(), "someone-else");
    let keys = Keyring::from_files(&[allowed_signers(remote.dir.path(), &key)]).unwrap();
    let commit_signed_by = |k: &Path, message: &str| {
        let signing_key = format!("user.signingkey={}", k.display());
        remote.git(&["-c", "gpg.format=ssh", "-c", &signing_key, "commit", "-q", "-S", "--allow-empty", "-m", message]);
        remote.git(&["push", "-q", "origin", "main"]);
    };
    commit_signed_by(&key, "signed promotion");
    let state = tempfile::tempdir().unwrap();
    let (mut source, checkout) = remote.checkout(state.path());
    assert!(check_tip(&checkout, PromotionMode::Signed, &keys, None, &StatusKeys::default()).unwrap().is_signed());

    commit_signed_by(&other, "promotion by an untrusted key");
    source.sync().unwrap();
    let err =
        check_tip(&source.checkout().unwrap(), PromotionMode::Signed, &keys, None, &StatusKeys::default()).unwrap_err();
    assert!(
        matches!(&err, PromotionError::UnsignedTip { problem: SignatureProblem::UntrustedKey { .. }, .. }),
        "{err:?}"
    );
}

#[test]
fn a_commit_fleetgate_signs_with_ssh_is_a_signed_promotion_tip_and_verifies_with_git() {
    use fleetgate::model::PromotionMode;
    use fleetgate::status::StatusKeys;
    use fleetgate::status::check_tip;
    let remote = FleetRemote::new();
    let key = ssh_key(remote.dir.path(), "promoter");
    let signers = allowed_signers(remote.dir.path(), &key);
    remote.git(&["config", "user.name", "Release Manager"]);
    remote.git(&["config", "user.email", "release@example.com"]);
    // Any signing command takes the same flags (CommitSigning): here `cluster register`.
    let agent_key = ssh_key(remote.dir.path(), "status-cluster-a");
    let status_key = std::fs::read_to_string(agent_key.with_extension("pub")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["cluster", "register", "cluster-a", "--status-key", status_key.trim(), "--repo"])
        .arg(&remote.work)
        .args(["--signing-format", "ssh", "--sign-key"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "cluster register: {}", String::from_utf8_lossy(&out.stderr));
    remote.git(&["push", "-q", "origin", "main"]);

    let allowed = format!("gpg.ssh.allowedSignersFile={}", signers.display());
    let out =
        Command::new("git").current_dir(&remote.work).args(["-c", &allowed, "verify-commit", "HEAD"]).output().unwrap();
    assert!(out.status.success(), "git verify-commit: {}", String::from_utf8_lossy(&out.stderr));
    let state = tempfile::tempdir().unwrap();
    let (_source, checkout) = remote.checkout(state.path());
    let keys = Keyring::from_files(&[signers]).unwrap();
    let trust = check_tip(&checkout, PromotionMode::Signed, &keys, None, &StatusKeys::default()).unwrap();
    assert_eq!(trust, fleetgate::release::TipTrust::Signed { signer: fingerprint(&key) });
}
