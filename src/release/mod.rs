//! Resolving the desired release of a cluster and verifying it (signatures, tag pins, mapping
//! consistency) into a [`VerifiedRelease`] — the only value the apply engine accepts.
//!
//! ```text
//! Checkout ─► resolve(cluster) ─► DesiredRelease ─► verify(trust, pins) ─► VerifiedRelease
//!             (branch tip)                          (tag + tag's tree)
//! ```
//!
//! [`check_requirements`] (Kubernetes version, node architectures) needs the live cluster, so the
//! agent calls it with what it read from the API server. [`validate_repo`] runs every check over
//! every release tag for `fleetgate validate`.

pub mod mapping;
mod pins;
mod requires;
mod resolve;
mod trust;
mod validate;
mod verified;
mod verify;

pub use pins::*;
pub use requires::*;
pub use resolve::*;
pub use trust::*;
pub use validate::*;
pub use verified::*;
pub use verify::*;
