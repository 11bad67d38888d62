//! Resolving the desired release of a cluster and verifying it (signatures, tag pins, mapping
//! consistency) into a [`VerifiedRelease`] — the only value the apply engine accepts.

mod verified;

pub use verified::*;
