//! Resolving the desired release of a cluster and verifying it (signatures, tag pins, mapping
//! consistency) into a [`VerifiedRelease`] — the only value the apply engine accepts.
//!
//! ```text
//! Checkout ─► resolve(cluster) ─► DesiredRelease ─► verify(trust, pins) ─► VerifiedRelease
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

pub use approval::*;
pub use history::*;
pub use pins::*;
pub use promoted::*;
pub use promotion::*;
pub use resolve::*;
pub use trust::*;
pub use verified::*;
pub use verify::*;
