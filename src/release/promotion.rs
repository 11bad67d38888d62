//! The branch tip as a decision. With `promotions: signed` the tip must be a commit signed by a
//! trusted promotion key that descends from the last tip the agent accepted: a force-push to an
//! older (signed) commit would otherwise replay an old configuration. With `promotions: unsigned`
//! the tip is anyone's push, and a signature on it counts as a *signed decision* (it may move a
//! cluster back to an older release, clear a rejection, re-pin a status key) only when it is
//! fresh: the tip is, or descends from, the newest tip the agent accepted ([`is_fresh`]; that mark
//! moves only forward, by fast-forward). An old signed commit force-pushed back as the tip — a
//! release commit `release create` signed, a promotion from last month — is an unsigned tip, so
//! a pusher without a key cannot replay yesterday's decision.
//!
//! One more commit is accepted as a signed-mode tip without a promotion key: an agent's
//! **write-back** ([`WriteBack`]'s trailers), SSH-signed in namespace `git` by the status key of
//! cluster C (the key pinned for C, or on first sight the one its parent registers). It must,
//! relative to its single parent, change nothing but `clusters/C.yaml`'s `spec.release`, to a
//! release C ran: a verified `success` status of C for it, or a verified `failure` of C for the
//! release named by `Fleetgate-Release` that says C rolled back to it. Each other shape is refused
//! with its own [`PromotionError`] (judged by [`crate::status::check_tip`], which reads the statuses). A write-back is not a signed decision: it cannot change keys,
//! settings or other clusters, and the safety settings still come from the release's signed tree.

use super::trust::{Keyring, SignatureProblem};
use super::verify::{VerifyError, verify_commit};
use crate::model::{ErrorClass, PromotionMode};
use crate::source::{Checkout, SourceError, short};

/// How far this pass trusts the branch tip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TipTrust {
    /// Anyone's push: it chooses among signed releases; settings come from the release's tag.
    Unsigned,
    /// Signed by promotion key `signer` (and, in signed mode, descending from the accepted tip).
    Signed { signer: String },
    /// In signed mode: the write-back of `cluster`'s agent, pinning it to `release` (module docs).
    WriteBack { cluster: String, release: String },
}

impl TipTrust {
    pub fn is_signed(&self) -> bool {
        matches!(self, TipTrust::Signed { .. })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PromotionError {
    #[error(
        "promotions are signed, but the branch tip {commit} is not signed by a promotion key ({problem}); sign promotion commits (git commit -S, `fleetgate promote --sign-key`, or a forge that signs merges)"
    )]
    UnsignedTip { commit: String, problem: SignatureProblem },
    #[error(
        "the branch tip {tip} does not descend from {accepted}, the last tip this agent accepted: a force-push to an older or unrelated commit is refused; push a new signed commit on top of {accepted}"
    )]
    NotDescendant { tip: String, accepted: String },
    #[error(
        "the branch tip {commit} is signed by the status key of cluster {cluster} but is a merge; a write-back has exactly one parent"
    )]
    WriteBackMerge { commit: String, cluster: String },
    #[error(
        "the branch tip {commit} is signed by the status key of cluster {cluster} but pins cluster {other} (clusters/{other}.yaml); an agent's write-back may pin its own cluster only"
    )]
    WriteBackOtherCluster { commit: String, cluster: String, other: String },
    #[error(
        "the branch tip {commit} is signed by the status key of cluster {cluster} but changes {path}; a write-back changes nothing but clusters/{cluster}.yaml"
    )]
    WriteBackOtherFile { commit: String, cluster: String, path: String },
    #[error(
        "the branch tip {commit} is signed by the status key of cluster {cluster} but changes more of clusters/{cluster}.yaml than spec.release ({what}); a write-back only pins the release"
    )]
    WriteBackNotAPin { commit: String, cluster: String, what: String },
    #[error(
        "the branch tip {commit} is signed by the status key of cluster {cluster} and pins it to {release}, a release {cluster} never reported running (no verified success, and no verified rollback to it); a write-back pins only a release the cluster runs"
    )]
    WriteBackUnrunRelease { commit: String, cluster: String, release: String },
    #[error(
        "the branch tip {commit} is signed by the status key of cluster {cluster} as a write-back, but its parent {parent} was never acceptable (not the last accepted tip, nor signed by a promotion key and descending from it, nor such a write-back): a write-back cannot carry unsigned changes beneath it; push a signed promotion commit on top of the accepted tip"
    )]
    WriteBackOnUnacceptedParent { commit: String, cluster: String, parent: String },
    #[error("reading the statuses a write-back is checked against")]
    Statuses(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error(transparent)]
    Source(#[from] SourceError),
}

impl PromotionError {
    pub fn class(&self) -> ErrorClass {
        match self {
            PromotionError::UnsignedTip { problem, .. } => problem.class(),
            PromotionError::Source(e) => e.class(),
            PromotionError::Statuses(_) => ErrorClass::Retryable,
            // A write-back whose status note has not arrived yet is re-judged every pass anyway.
            _ => ErrorClass::Stalling,
        }
    }
}

/// The trailers of an agent's write-back commit (`--write-back`); `fleetgate rollback` reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteBack {
    /// `Fleetgate-Release`: the release the agent rolled back.
    pub release: String,
    /// `Fleetgate-Reason`: why (the failure category, e.g. `GateFailed`).
    pub reason: String,
    /// `Fleetgate-Failure`: the failed gate with its figure and threshold (absent before it existed).
    pub failure: Option<String>,
    /// `Fleetgate-Rolled-Back-To`: the release the agent went back to, now pinned.
    pub rolled_back_to: String,
}

impl WriteBack {
    pub const RELEASE: &'static str = "Fleetgate-Release";
    pub const REASON: &'static str = "Fleetgate-Reason";
    pub const FAILURE: &'static str = "Fleetgate-Failure";
    pub const ROLLED_BACK_TO: &'static str = "Fleetgate-Rolled-Back-To";

    /// The trailers of a commit message, when it is a write-back (release and target named).
    pub fn parse(message: &str) -> Option<WriteBack> {
        let trailer = |key: &str| {
            message.lines().rev().find_map(|l| l.strip_prefix(key)?.strip_prefix(':').map(|v| v.trim().to_string()))
        };
        Some(WriteBack {
            release: trailer(Self::RELEASE)?,
            reason: trailer(Self::REASON).unwrap_or_default(),
            failure: trailer(Self::FAILURE),
            rolled_back_to: trailer(Self::ROLLED_BACK_TO)?,
        })
    }

    /// The trailer block, one per line (single-line values: a newline would end the trailer).
    pub fn trailers(&self) -> String {
        let one_line = |v: &str| v.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut out = format!("{}: {}\n{}: {}\n", Self::RELEASE, self.release, Self::REASON, one_line(&self.reason));
        if let Some(f) = &self.failure {
            out.push_str(&format!("{}: {}\n", Self::FAILURE, one_line(f)));
        }
        out.push_str(&format!("{}: {}\n", Self::ROLLED_BACK_TO, self.rolled_back_to));
        out
    }
}

/// The mode an agent applies: its own setting wins; else once it accepted a signed-mode tip it
/// stays signed (a push that writes `promotions: unsigned` cannot leave signed mode); else what
/// the tip's `fleet.yaml` says.
pub fn effective_mode(agent: Option<PromotionMode>, was_signed: bool, tip_says: PromotionMode) -> PromotionMode {
    match agent {
        Some(mode) => mode,
        None if was_signed => PromotionMode::Signed,
        None => tip_says,
    }
}

/// Judges the checkout's tip under `mode` by promotion keys alone; `accepted` is the newest tip
/// the agent accepted (module docs). A signed-mode tip no promotion key signed is [`PromotionError::UnsignedTip`]:
/// [`crate::status::check_tip`] then judges it as a write-back (the status layer holds the keys and
/// statuses that takes).
pub fn check_tip(
    checkout: &Checkout,
    mode: PromotionMode,
    keyring: &Keyring,
    accepted: Option<&str>,
) -> Result<TipTrust, PromotionError> {
    let tip = checkout.tip();
    let trust = match verify_commit(checkout, tip, keyring) {
        Ok(signer) => TipTrust::Signed { signer },
        Err(VerifyError::CommitSignature { problem, .. }) if mode == PromotionMode::Signed => {
            return Err(PromotionError::UnsignedTip { commit: short(tip), problem });
        }
        Err(VerifyError::CommitSignature { .. }) => TipTrust::Unsigned,
        Err(VerifyError::Source(e)) => return Err(e.into()),
        Err(other) => unreachable!("verify_commit returns signature or source errors only: {other}"),
    };
    check_descends(checkout, mode, accepted)?;
    if trust.is_signed() && !is_fresh(checkout, accepted) {
        // Only reachable in unsigned mode (signed mode refused it above).
        tracing::warn!(
            tip = %short(tip),
            accepted = accepted.unwrap_or_default(),
            "the branch tip is signed but does not descend from the newest tip accepted: an old signed commit pushed again is no decision; judged as unsigned"
        );
        return Ok(TipTrust::Unsigned);
    }
    Ok(trust)
}

/// The checkout's tip is `accepted` (the newest tip the agent accepted) or descends from it, or
/// the agent accepted none yet: a signature on it may count as a new decision, and the tip may
/// become the new mark.
pub fn is_fresh(checkout: &Checkout, accepted: Option<&str>) -> bool {
    descends_from(checkout, checkout.tip(), accepted)
}

/// `commit` is `accepted` or descends from it, or nothing was accepted yet.
pub fn descends_from(checkout: &Checkout, commit: git2::Oid, accepted: Option<&str>) -> bool {
    accepted.is_none_or(|accepted| descends(checkout, commit, accepted))
}

/// In signed mode, the tip must be `accepted` or descend from it (module docs).
pub fn check_descends(checkout: &Checkout, mode: PromotionMode, accepted: Option<&str>) -> Result<(), PromotionError> {
    let tip = checkout.tip();
    if mode == PromotionMode::Signed
        && let Some(accepted) = accepted
        && !descends(checkout, tip, accepted)
    {
        return Err(PromotionError::NotDescendant { tip: short(tip), accepted: accepted.chars().take(12).collect() });
    }
    Ok(())
}

/// `tip` is `accepted` or one of its descendants. An accepted commit the mirror no longer has
/// (history rewritten and collected) is not an ancestor.
fn descends(checkout: &Checkout, tip: git2::Oid, accepted: &str) -> bool {
    let Ok(accepted) = git2::Oid::from_str(accepted) else { return false };
    tip == accepted || checkout.repo().graph_descendant_of(tip, accepted).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_back_trailers_round_trip_and_name_the_cluster_files() {
        let wb = WriteBack {
            release: "rel-2".into(),
            reason: "GateFailed".into(),
            failure: Some("pod-restarts observed 4\n> threshold 3".into()),
            rolled_back_to: "rel-1".into(),
        };
        let message = format!("fleetgate: roll c back to rel-1\n\nbody\n\n{}", wb.trailers());
        let parsed = WriteBack::parse(&message).unwrap();
        assert_eq!(parsed.failure.as_deref(), Some("pod-restarts observed 4 > threshold 3"));
        assert_eq!((parsed.release.as_str(), parsed.rolled_back_to.as_str()), ("rel-2", "rel-1"));
        assert_eq!(WriteBack::parse("promote rel-2\n\nFleetgate-Release: rel-2\n"), None);
    }

    #[test]
    fn the_agents_setting_wins_and_signed_mode_is_sticky() {
        use PromotionMode::*;
        assert_eq!(effective_mode(Some(Unsigned), true, Signed), Unsigned);
        assert_eq!(effective_mode(Some(Signed), false, Unsigned), Signed);
        assert_eq!(effective_mode(None, true, Unsigned), Signed);
        assert_eq!(effective_mode(None, false, Signed), Signed);
        assert_eq!(effective_mode(None, false, Unsigned), Unsigned);
    }
}
