//! Whether a release is approved for a wave: the tag `approve/<release>/<wave>`
//! ([`crate::model::approval_tag`]) counts only when it is an annotated tag object of that very
//! name, points at the release's commit, and carries a valid signature by a key of the approvers'
//! keyring — a trust anchor of the agent's own configuration (`--approver-keys`), checked by the
//! same code as release tags ([`super::tag_signer`]). Anything else is ignored, with why.

use super::trust::{Keyring, SignatureProblem};
use super::verify::tag_signer;
use crate::model::{ApprovalRecord, ErrorClass, approval_tag, tagger_and_message};
use crate::source::{Checkout, SourceError, short};

/// The answer for one (release, wave).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalVerdict {
    Approved(ApprovalRecord),
    /// No approval tag.
    Missing,
    /// There is one, and it does not count.
    Ignored(ApprovalProblem),
}

/// Why an approval tag does not count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalProblem {
    #[error("this agent has no approvers' keys (--approver-keys), so no approval can count")]
    NoApprovers,
    #[error("tag {tag} is a lightweight tag; an approval is an annotated, signed tag (fleetgate approve)")]
    Lightweight { tag: String },
    #[error("ref refs/tags/{tag} points to a tag object named {object_name:?}, an approval of something else")]
    OtherName { tag: String, object_name: String },
    #[error("tag {tag} points to commit {points_to}, not to {release}'s commit {commit}")]
    WrongCommit { tag: String, release: String, points_to: String, commit: String },
    #[error("tag {tag} is ignored: {problem} (approvals count only when signed by a key in --approver-keys)")]
    Signature { tag: String, problem: SignatureProblem },
}

impl ApprovalProblem {
    /// Retryable when gpg itself failed; every other problem waits for Git to change.
    pub fn class(&self) -> ErrorClass {
        match self {
            ApprovalProblem::Signature { problem, .. } => problem.class(),
            _ => ErrorClass::Stalling,
        }
    }
}

/// Whether `release` (tagged at `commit`) is approved for `wave`, checked with `approvers`
/// (`None`: the agent has no approvers' keys, so nothing counts).
///
/// # Errors
/// The repository could not be read.
pub fn check_approval(
    checkout: &Checkout,
    approvers: Option<&Keyring>,
    release: &str,
    commit: git2::Oid,
    wave: &str,
) -> Result<ApprovalVerdict, SourceError> {
    let name = approval_tag(release, wave);
    let Some(tag) = checkout.tag(&name)? else { return Ok(ApprovalVerdict::Missing) };
    let ignored = |problem| Ok(ApprovalVerdict::Ignored(problem));
    let Some(approvers) = approvers else { return ignored(ApprovalProblem::NoApprovers) };
    let Some(object) = tag.object else { return ignored(ApprovalProblem::Lightweight { tag: name }) };
    let object_name = checkout.tag_object_name(object)?;
    if object_name != name {
        return ignored(ApprovalProblem::OtherName { tag: name, object_name });
    }
    if tag.commit != commit {
        return ignored(ApprovalProblem::WrongCommit {
            tag: name,
            release: release.to_string(),
            points_to: short(tag.commit),
            commit: short(commit),
        });
    }
    let (payload, signer) = tag_signer(checkout, object, approvers)?;
    let fingerprint = match signer {
        Ok(f) => f,
        Err(problem) => return ignored(ApprovalProblem::Signature { tag: name, problem }),
    };
    let (tagger, why) = tagger_and_message(&payload);
    let by = match tagger {
        Some(tagger) => format!("{tagger} (key {fingerprint})"),
        None => format!("key {fingerprint}"),
    };
    Ok(ApprovalVerdict::Approved(ApprovalRecord { by, why, wave: wave.to_string(), via: format!("tag {name}") }))
}
