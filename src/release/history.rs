//! A move in a cluster's history, judged by signed content only: releases are ordered by their
//! signed `sequence`, a signed release may revoke older ones, and each names its `rollbackTo`.
//!
//! An unsigned branch tip may choose which signed release a cluster runs, but not take it back
//! in time: [`check_move`] refuses a revoked release, and a release older than the newest one
//! the cluster ran successfully unless the move is a signed decision (a promotion commit signed
//! by a promotion key) or the target is that newest release's own signed `rollbackTo` — one
//! undo, what reverting the last promotion asks for. The link is taken from the newest release,
//! not from the one running, so unsigned pushes cannot walk a cluster back one step at a time.

use super::VerifiedRelease;
use super::pins::TagPins;
use super::verify::{VerifyError, verify_tag_signature};
use crate::model::{MAX_YAML_BYTES, RELEASE_FILE, Release, RepoTree, parse_release};
use crate::source::Checkout;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// A release a cluster ran successfully, with its place in the fleet's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ran {
    pub release: String,
    pub sequence: u64,
}

/// The release documents of signed tags seen so far (tag object → its `release.yaml`, `None`
/// when the tag is not a signed release of this fleet), so each tag's signature is checked once
/// per agent process however many passes look at it.
#[derive(Debug, Default)]
pub struct SignedReleases {
    seen: HashMap<git2::Oid, Option<Release>>,
}

impl SignedReleases {
    /// The release `id` as its tag signs it: None when there is no such annotated tag, or its
    /// signature does not verify with `keyring`, or it belongs to another fleet. A tag that moved
    /// since `pins` recorded it is not trusted either.
    pub fn get(
        &mut self,
        checkout: &Checkout,
        keyring: &super::Keyring,
        pins: &TagPins,
        fleet: &str,
        id: &str,
    ) -> Result<Option<&Release>, VerifyError> {
        let Some(tag) = checkout.tag(id)? else { return Ok(None) };
        let Some(object) = tag.object else { return Ok(None) };
        if pins.get(id).is_some_and(|p| p != tag.commit.to_string()) {
            return Ok(None);
        }
        if !self.seen.contains_key(&object) {
            let release = match verify_tag_signature(checkout, id, object, keyring) {
                Ok(_) => read_release_doc(checkout, tag.commit)?.filter(|r| r.name() == id),
                Err(e) if e.class() == crate::model::ErrorClass::Retryable => return Err(e),
                Err(_) => None,
            };
            self.seen.insert(object, release);
        }
        Ok(self.seen[&object].as_ref().filter(|r| r.spec.fleet.as_deref() == Some(fleet)))
    }

    /// Every revoked release id → the signed release of `fleet` that revokes it.
    pub fn revocations(
        &mut self,
        checkout: &Checkout,
        keyring: &super::Keyring,
        pins: &TagPins,
        fleet: &str,
    ) -> Result<BTreeMap<String, String>, VerifyError> {
        let mut out = BTreeMap::new();
        for tag in checkout.tags()? {
            if let Some(r) = self.get(checkout, keyring, pins, fleet, &tag.name)? {
                for revoked in &r.spec.revokes {
                    out.entry(revoked.clone()).or_insert_with(|| r.name().to_string());
                }
            }
        }
        Ok(out)
    }
}

fn read_release_doc(checkout: &Checkout, commit: git2::Oid) -> Result<Option<Release>, VerifyError> {
    let tree = checkout.commit_tree(commit, "a release tag")?;
    let Some(text) = tree.read_text(RELEASE_FILE, MAX_YAML_BYTES).ok().flatten() else { return Ok(None) };
    Ok(parse_release(RELEASE_FILE, &text, None).ok())
}

/// What the agent knows of its cluster when judging a move to `target`.
#[derive(Debug, Clone)]
pub struct Standing<'a> {
    /// The newest release (highest sequence) the cluster ran successfully.
    pub newest: Option<&'a Ran>,
    /// The signed `rollbackTo` of `newest`: the one older release an unsigned tip may ask for.
    pub undo: Option<&'a str>,
    /// Revoked release → the signed release that revokes it.
    pub revoked: &'a BTreeMap<String, String>,
    /// The branch tip is signed by a promotion key.
    pub signed_decision: bool,
}

/// Whether the cluster may move to `target` (see the module documentation).
pub fn check_move(target: &VerifiedRelease, standing: &Standing<'_>) -> Result<(), VerifyError> {
    judge_move(target.id(), target.release().spec.sequence, standing)
}

/// [`check_move`] of release `id` with signed `sequence`, for a judge that holds no verified
/// release: `fleetgate plan` says before a merge what the agent will decide after it.
pub fn judge_move(id: &str, sequence: Option<u64>, standing: &Standing<'_>) -> Result<(), VerifyError> {
    if let Some(by) = standing.revoked.get(id) {
        return Err(VerifyError::Revoked { release: id.to_string(), by: by.clone() });
    }
    let Some(newest) = standing.newest else { return Ok(()) };
    let older = sequence.is_none_or(|s| s < newest.sequence);
    if !older || standing.signed_decision || standing.undo == Some(id) {
        return Ok(());
    }
    Err(VerifyError::Downgrade {
        release: id.to_string(),
        sequence,
        newest: newest.release.clone(),
        newest_sequence: newest.sequence,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TEMPLATE_FILES;
    use rstest::rstest;

    fn release(id: &str, sequence: Option<u64>) -> VerifiedRelease {
        let text = TEMPLATE_FILES.iter().find(|(p, _)| *p == RELEASE_FILE).unwrap().1;
        let mut release = parse_release(RELEASE_FILE, text, None).unwrap();
        release.metadata.name = id.to_string();
        release.spec.sequence = sequence;
        VerifiedRelease::assume_verified(release, "c0ffee", BTreeMap::new())
    }

    #[rstest]
    #[case::first_release(None, Some(1), None, false, true)]
    #[case::newer(Some(2), Some(3), None, false, true)]
    #[case::same_sequence_again(Some(2), Some(2), None, false, true)]
    #[case::older(Some(2), Some(1), None, false, false)]
    #[case::older_without_sequence(Some(2), None, None, false, false)]
    #[case::the_newest_releases_rollback_target(Some(2), Some(1), Some("rel-1"), false, true)]
    #[case::older_than_the_rollback_target(Some(3), Some(1), Some("rel-2"), false, false)]
    #[case::older_by_signed_decision(Some(2), Some(1), None, true, true)]
    fn moves_back_in_time_need_a_signed_decision(
        #[case] newest: Option<u64>,
        #[case] target: Option<u64>,
        #[case] undo: Option<&str>,
        #[case] signed: bool,
        #[case] allowed: bool,
    ) {
        let ran = newest.map(|s| Ran { release: format!("rel-{s}"), sequence: s });
        let revoked = BTreeMap::new();
        let standing = Standing { newest: ran.as_ref(), undo, revoked: &revoked, signed_decision: signed };
        let result = check_move(&release("rel-1", target), &standing);
        assert_eq!(result.is_ok(), allowed, "{result:?}");
        if let Err(e) = result {
            assert!(matches!(e, VerifyError::Downgrade { .. }), "{e}");
            assert!(e.to_string().contains("needs a signed decision"), "{e}");
        }
    }

    #[test]
    fn a_revoked_release_is_refused_even_by_a_signed_decision() {
        let revoked = BTreeMap::from([("rel-1".to_string(), "rel-3".to_string())]);
        let standing = Standing { newest: None, undo: None, revoked: &revoked, signed_decision: true };
        let err = check_move(&release("rel-1", Some(1)), &standing).unwrap_err();
        assert_eq!(
            err.to_string(),
            "release rel-1 is revoked by the signed release rel-3; promote a newer release (fleetgate promote), revoked releases never run again"
        );
    }
}
