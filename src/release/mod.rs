//! Resolving the desired release of a cluster and verifying it (signatures, tag pins, mapping
//! consistency) into a [`VerifiedRelease`] — the only value the apply engine accepts.
//!
//! ```text
//! Checkout ─► resolve(cluster) ─► DesiredRelease ─► verify(trust, fleet, pins) ─► VerifiedRelease
//!             (branch tip)                          (tag + tag's tree)        │ for_cluster(facts, labels)
//!                                                                             ▼
//!                                                      VerifiedRelease of the variant the spoke's own facts select
//! ```
//!
//! An approval of a release for a wave (a signed `approve/<release>/<wave>` tag) is verified here
//! too ([`check_approval`]), with the same signature checks as a release tag.
//!
//! Checking a release against the live cluster (`gates::check_requirements`) and validating a whole
//! repo (`validate`) sit above this module.

mod approval;
mod history;
pub mod mapping;
mod pins;
mod promoted;
mod promotion;
mod resolve;
mod trust;
mod verified;
mod verify;

pub use approval::{ApprovalProblem, ApprovalVerdict, check_approval};
pub use history::{Ran, SignedReleases, Standing, check_move, judge_move};
pub use pins::{PinError, TagPins};
pub use promoted::promotion_head;
pub use promotion::{
    PromotionError, TipTrust, WriteBack, check_descends, check_tip, descends_from, effective_mode, is_fresh,
};
pub use resolve::{DesiredRelease, ResolveError, resolve, resolve_release};
pub use trust::{GIT_NAMESPACE, Keyring, SignatureProblem, TrustError, split_signed_tag};
pub use verified::{ReleaseFiles, UnverifiedRelease, VerifiedRelease};
pub use verify::{
    ReleaseContent, VerifyError, read_release, signed_config, tag_signer, verify, verify_commit, verify_tag_signature,
};
