//! Trust against the real things: release tags pushed to a `git daemon`, signed with real `gpg`
//! keys in throw-away homes, verified with gpgme against a keyring of trusted public keys.
//! A good tag is accepted; every way a tag can be untrustworthy is refused with its own error.

use crate::fleet_support;

use fleet_support::{FleetRemote, RELEASE};
use fleetgate::model::{ErrorClass, PromotionMode};
use fleetgate::release::{
    Keyring, PromotionError, SignatureProblem, TagPins, TipTrust, VerifyError, resolve, resolve_release, verify,
};
use fleetgate::status::{StatusKeys, check_tip};
use fleetgate_testenv::GpgHome;
use rstest::rstest;

fn trust(remote: &FleetRemote) -> Keyring {
    Keyring::from_files(std::slice::from_ref(&remote.trusted)).expect("keyring")
}

#[test]
fn a_signed_tag_by_a_trusted_key_is_accepted() {
    let remote = FleetRemote::new();
    remote.signed_tag(RELEASE);
    let state = tempfile::tempdir().unwrap();
    let (source, checkout) = remote.checkout(state.path());

    let desired = resolve(&checkout, "cluster-b").unwrap();
    assert_eq!(desired.id, RELEASE);
    let mut pins = TagPins::load(source.pins_path()).unwrap();
    let trust = trust(&remote);
    let verified = verify(&checkout, &desired, &trust, None, &mut pins).unwrap();
    // Verification starts no gpg-agent that could outlive a killed process.
    assert!(!trust.home().join("S.gpg-agent").exists());

    assert_eq!(verified.id(), RELEASE);
    assert_eq!(verified.signer(), Some(remote.fpr.as_str()));
    assert_eq!(verified.commit(), desired.tag.commit.to_string());
    assert_eq!(verified.release().spec.crd_version, "v1alpha2");
    assert!(verified.files().contains_key("operator/deployment.yaml"), "{:?}", verified.files().keys());
    assert!(verified.files().keys().all(|p| p.starts_with("operator/")));
    // The tag is pinned on first sight, on disk.
    assert_eq!(TagPins::load(source.pins_path()).unwrap().get(RELEASE), Some(verified.commit()));
    // Verifying again with the pin in place still passes.
    verify(&checkout, &desired, &trust, None, &mut pins).unwrap();
}

#[derive(Debug, Clone, Copy)]
enum Bad {
    Unsigned,
    Lightweight,
    UntrustedKey,
    TamperedMessage,
    GarbledSignature,
}

/// Creates tag `name` at HEAD the bad way and pushes it; returns the fingerprint of the
/// untrusted key when one was used.
fn make_bad_tag(remote: &FleetRemote, name: &str, bad: Bad) -> Option<String> {
    let mut other = None;
    match bad {
        Bad::Unsigned => {
            remote.git(&["tag", "-a", name, "-m", "unsigned release"]);
        }
        Bad::Lightweight => {
            remote.git(&["tag", name]);
        }
        Bad::UntrustedKey => {
            let home = GpgHome::new().unwrap();
            let fpr = home.generate_key("Mallory", "mallory@example.com").unwrap();
            home.run_git(&remote.work, &fpr, &["tag", "-s", name, "-m", "release by someone else"]).unwrap();
            other = Some(fpr);
        }
        Bad::TamperedMessage | Bad::GarbledSignature => {
            // A validly signed tag object, then altered, re-stored with `git mktag` (which checks
            // the format, not the signature) and pointed to by the ref.
            remote.git(&["tag", "-s", name, "-m", &format!("release {name}")]);
            let raw = remote.git(&["cat-file", "tag", name]);
            remote.git(&["tag", "-d", name]);
            let altered = match bad {
                Bad::TamperedMessage => raw.replace(&format!("release {name}"), &format!("release {name} (edited)")),
                _ => {
                    // Flip characters of the last base64 line of the signature (its MPIs), so the
                    // packet still names the trusted key but its value is wrong.
                    let lines: Vec<&str> = raw.lines().collect();
                    let crc = lines.iter().rposition(|l| l.starts_with('=')).unwrap();
                    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
                    out[crc - 1] = out[crc - 1]
                        .chars()
                        .enumerate()
                        .map(|(i, c)| if (4..12).contains(&i) { if c == 'A' { 'B' } else { 'A' } } else { c })
                        .collect();
                    out.join("\n") + "\n"
                }
            };
            let file = remote.dir.path().join("tag-object");
            std::fs::write(&file, altered).unwrap();
            let oid = remote
                .gpg
                .git(&remote.work, &remote.fpr)
                .arg("mktag")
                .stdin(std::fs::File::open(&file).unwrap())
                .output()
                .unwrap();
            assert!(oid.status.success(), "git mktag: {}", String::from_utf8_lossy(&oid.stderr));
            let oid = String::from_utf8(oid.stdout).unwrap();
            remote.git(&["update-ref", &format!("refs/tags/{name}"), oid.trim()]);
        }
    }
    remote.git(&["push", "-q", "origin", &format!("refs/tags/{name}")]);
    other
}

#[rstest]
#[case::unsigned_annotated_tag(Bad::Unsigned)]
#[case::lightweight_tag(Bad::Lightweight)]
#[case::tag_signed_by_an_untrusted_key(Bad::UntrustedKey)]
#[case::tag_whose_message_was_edited_after_signing(Bad::TamperedMessage)]
#[case::tag_whose_signature_is_garbled(Bad::GarbledSignature)]
fn an_untrustworthy_tag_is_refused_with_its_own_error(#[case] bad: Bad) {
    let remote = FleetRemote::new();
    let other = make_bad_tag(&remote, RELEASE, bad);
    let state = tempfile::tempdir().unwrap();
    let (_source, checkout) = remote.checkout(state.path());
    let desired = resolve(&checkout, "cluster-a").unwrap();
    let mut pins = TagPins::in_memory();

    let err = verify(&checkout, &desired, &trust(&remote), None, &mut pins).unwrap_err();
    eprintln!("{bad:?} refused: {err}");
    match (bad, &err) {
        (Bad::Unsigned, VerifyError::Unsigned { tag }) => assert_eq!(tag, RELEASE),
        (Bad::Lightweight, VerifyError::Lightweight { tag }) => assert_eq!(tag, RELEASE),
        (Bad::UntrustedKey, VerifyError::UntrustedKey { fingerprint, .. }) => {
            assert_eq!(Some(fingerprint), other.as_ref());
        }
        (Bad::TamperedMessage | Bad::GarbledSignature, VerifyError::BadSignature { .. }) => {}
        _ => panic!("{bad:?} was refused with the wrong error: {err:?}"),
    }
    assert_eq!(err.class(), ErrorClass::Stalling, "{err}");
    // Nothing untrustworthy gets pinned.
    assert_eq!(pins.get(RELEASE), None);
}

#[test]
fn a_tag_that_moves_after_it_was_verified_is_refused() {
    let remote = FleetRemote::new();
    remote.signed_tag(RELEASE);
    let state = tempfile::tempdir().unwrap();
    let (mut source, checkout) = remote.checkout(state.path());
    let first = resolve(&checkout, "cluster-a").unwrap();
    let mut pins = TagPins::load(source.pins_path()).unwrap();
    let pinned = verify(&checkout, &first, &trust(&remote), None, &mut pins).unwrap().commit().to_string();

    // Someone with the release key re-tags the same id on other content and force-pushes it.
    remote.edit("operator/deployment.yaml", "replicas: 2", "replicas: 3");
    let moved = remote.commit_all("other content");
    remote.git(&["tag", "-f", "-s", RELEASE, "-m", "release again"]);
    remote.git(&["push", "-q", "-f", "origin", &format!("refs/tags/{RELEASE}")]);

    assert!(source.sync().unwrap().fetched);
    let checkout = source.checkout().unwrap();
    let second = resolve(&checkout, "cluster-a").unwrap();
    // A restarted agent reads its pins back from the state directory.
    let mut pins = TagPins::load(source.pins_path()).unwrap();
    let err = verify(&checkout, &second, &trust(&remote), None, &mut pins).unwrap_err();
    match &err {
        VerifyError::MovedTag { tag, pinned: p, now } => {
            assert_eq!(tag, RELEASE);
            assert_eq!(p, &pinned);
            assert_eq!(now, &moved);
        }
        _ => panic!("expected MovedTag, got {err:?}"),
    }
}

#[test]
fn a_release_that_does_not_target_the_cluster_is_refused() {
    let remote = FleetRemote::new();
    remote.edit("release.yaml", "[cluster-a, cluster-b, cluster-c]", "[cluster-a, cluster-b]");
    remote.commit_all("release for two clusters");
    remote.signed_tag(RELEASE);
    let state = tempfile::tempdir().unwrap();
    let (_source, checkout) = remote.checkout(state.path());
    let desired = resolve_release(&checkout, "cluster-c", RELEASE).unwrap();
    let err = verify(&checkout, &desired, &trust(&remote), None, &mut TagPins::in_memory()).unwrap_err();
    assert!(matches!(&err, VerifyError::NotTargeted { cluster, .. } if cluster == "cluster-c"), "{err:?}");
}

#[test]
fn a_signed_release_whose_mapping_disagrees_is_refused_with_every_finding() {
    let remote = FleetRemote::new();
    remote.edit("release.yaml", "tag: v1.2.3-build.456", "tag: v1.2.4");
    remote.edit("release.yaml", "crdVersion: v1alpha2", "crdVersion: v1beta1");
    remote.commit_all("inconsistent release");
    remote.signed_tag(RELEASE);
    let state = tempfile::tempdir().unwrap();
    let (_source, checkout) = remote.checkout(state.path());
    let desired = resolve(&checkout, "cluster-a").unwrap();
    let err = verify(&checkout, &desired, &trust(&remote), None, &mut TagPins::in_memory()).unwrap_err();
    let VerifyError::MappingMismatch { findings, .. } = &err else { panic!("{err:?}") };
    let files: Vec<String> = findings.iter().map(|f| f.at.to_string()).collect();
    assert_eq!(files.len(), 2, "{err}");
    // The image mismatch where the image is; the headline crdVersion (which no CRD serves) where
    // release.yaml names it.
    assert!(files[0].starts_with("operator/deployment.yaml:"), "{err}");
    assert!(files[1].starts_with("release.yaml:"), "{err}");
}

#[test]
fn signed_promotions_require_a_signed_tip_that_descends_from_the_accepted_one() {
    let remote = FleetRemote::new();
    remote.signed_tag(RELEASE);
    let state = tempfile::tempdir().unwrap();
    let keys = trust(&remote);

    let (mut source, checkout) = remote.checkout(state.path());
    let err = check_tip(&checkout, PromotionMode::Signed, &keys, None, &StatusKeys::default()).unwrap_err();
    assert!(matches!(&err, PromotionError::UnsignedTip { problem: SignatureProblem::Missing, .. }), "{err:?}");
    // Unsigned promotions take the same tip, as a choice that is not a signed decision.
    assert_eq!(
        check_tip(&checkout, PromotionMode::Unsigned, &keys, None, &StatusKeys::default()).unwrap(),
        TipTrust::Unsigned
    );

    remote.git(&["commit", "-q", "-S", "--allow-empty", "-m", "signed promotion"]);
    remote.git(&["push", "-q", "origin", "main"]);
    source.sync().unwrap();
    let checkout = source.checkout().unwrap();
    let accepted = checkout.tip().to_string();
    assert!(check_tip(&checkout, PromotionMode::Signed, &keys, None, &StatusKeys::default()).unwrap().is_signed());
    assert!(check_tip(&checkout, PromotionMode::Unsigned, &keys, None, &StatusKeys::default()).unwrap().is_signed());

    // A signed fork of the parent: signed too, but not a descendant of the tip accepted last.
    remote.git(&["commit", "-q", "-S", "--allow-empty", "-m", "another signed promotion"]);
    remote.git(&["push", "-q", "origin", "main"]);
    source.sync().unwrap();
    let newer = source.checkout().unwrap();
    assert!(
        check_tip(&newer, PromotionMode::Signed, &keys, Some(&accepted), &StatusKeys::default()).unwrap().is_signed()
    );
    remote.git(&["reset", "-q", "--hard", "HEAD~1"]);
    remote.git(&["commit", "-q", "-S", "--allow-empty", "-m", "a signed fork"]);
    remote.git(&["push", "-q", "-f", "origin", "main"]);
    source.sync().unwrap();
    let forked = source.checkout().unwrap();
    let err = check_tip(&forked, PromotionMode::Signed, &keys, Some(&newer.tip().to_string()), &StatusKeys::default())
        .unwrap_err();
    assert!(matches!(err, PromotionError::NotDescendant { .. }), "{err:?}");
}

#[test]
fn a_keyring_only_trusts_what_it_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.asc");
    std::fs::write(&empty, "not a key\n").unwrap();
    assert!(Keyring::from_files(&[empty]).is_err());
    assert!(Keyring::from_files(&[dir.path().join("missing.asc")]).is_err());
}
