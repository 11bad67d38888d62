//! fleetgate releases one Kubernetes Operator to a fleet of clusters from one signed Git repository,
//! with no central controller.
//!
//! An agent in each spoke runs one pipeline, each stage taking the previous stage's typed value:
//!
//! ```text
//! source ─► release (resolve + verify) ─► gates::preapply ─► apply (snapshot, apply, prune)
//!   ─► gates (bake) ─► status ─► agent rollback on failure
//! ```
//!
//! Where to start reading: [`agent`] wires the loop; [`source`] turns a Git URL into a
//! [`source::Checkout`]; [`release`] turns a checkout into a [`release::VerifiedRelease`] (the only
//! thing [`apply`] accepts); [`gates`] decides whether a release may stay; [`status`] writes the
//! outcome to Git notes (and forges) and reads them back for wave coordination. [`model`] holds the
//! fleet repo's document types. `cli` holds thin commands over these modules.

pub mod agent;
pub mod apply;
pub mod cli;
pub mod gates;
pub mod http;
pub mod manifests;
pub mod model;
pub mod release;
pub mod releng;
pub mod source;
pub mod status;
pub mod validate;

/// The field manager fleetgate's server-side applies use.
pub const FIELD_MANAGER: &str = "fleetgate";
/// Version of this build, written into statuses and metrics.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
