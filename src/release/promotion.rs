//! The branch tip as a decision. With `promotions: signed` the tip must be a commit signed by a
//! trusted promotion key that descends from the last tip the agent accepted: a force-push to an
//! older (signed) commit would otherwise replay an old configuration. With `promotions: unsigned`
//! the tip is anyone's push, and a signature on it still counts as a *signed decision* (it may
//! move a cluster back to an older release, or clear a rejection).

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
    #[error(transparent)]
    Source(#[from] SourceError),
}

impl PromotionError {
    pub fn class(&self) -> ErrorClass {
        match self {
            PromotionError::UnsignedTip { problem, .. } => problem.class(),
            PromotionError::NotDescendant { .. } => ErrorClass::Stalling,
            PromotionError::Source(e) => e.class(),
        }
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

/// Judges the checkout's tip under `mode`. `accepted` is the last tip accepted in signed mode.
pub fn check_tip(
    checkout: &Checkout,
    mode: PromotionMode,
    keyring: &Keyring,
    accepted: Option<&str>,
) -> Result<TipTrust, PromotionError> {
    let tip = checkout.tip();
    let signer = match verify_commit(checkout, tip, keyring) {
        Ok(signer) => Some(signer),
        Err(VerifyError::CommitSignature { problem, .. }) if mode == PromotionMode::Signed => {
            return Err(PromotionError::UnsignedTip { commit: short(tip), problem });
        }
        Err(VerifyError::CommitSignature { .. }) => None,
        Err(VerifyError::Source(e)) => return Err(e.into()),
        Err(other) => unreachable!("verify_commit returns signature or source errors only: {other}"),
    };
    if mode == PromotionMode::Signed
        && let Some(accepted) = accepted
        && !descends(checkout, tip, accepted)
    {
        return Err(PromotionError::NotDescendant { tip: short(tip), accepted: accepted.chars().take(12).collect() });
    }
    Ok(match signer {
        Some(signer) => TipTrust::Signed { signer },
        None => TipTrust::Unsigned,
    })
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
    fn the_agents_setting_wins_and_signed_mode_is_sticky() {
        use PromotionMode::*;
        assert_eq!(effective_mode(Some(Unsigned), true, Signed), Unsigned);
        assert_eq!(effective_mode(Some(Signed), false, Unsigned), Signed);
        assert_eq!(effective_mode(None, true, Unsigned), Signed);
        assert_eq!(effective_mode(None, false, Signed), Signed);
        assert_eq!(effective_mode(None, false, Unsigned), Unsigned);
    }
}
