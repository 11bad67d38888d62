//! Resolution: which release should cluster C run? Read from the **branch tip**: the cluster's
//! own `spec.release`, else the fleet's. The answer names a tag; its content is read later, by
//! [`super::verify`], from the tag's tree — never from the branch tip.

use crate::model::{ConfigError, ErrorClass, FleetConfig, ReleaseOrigin};
use crate::source::{Checkout, SourceError, TagRef, short};

/// The release a cluster should run, before verification.
#[derive(Debug, Clone)]
pub struct DesiredRelease {
    pub cluster: String,
    pub id: String,
    pub origin: ReleaseOrigin,
    /// The branch tip the decision was read from.
    pub branch_commit: git2::Oid,
    /// The tag named `id`.
    pub tag: TagRef,
    /// The branch tip's whole configuration (waves, gate and admission policies, rollout).
    pub config: FleetConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("the branch tip {commit} has an invalid fleet configuration")]
    Config { commit: String, source: ConfigError },
    #[error("cluster {cluster} is not in the fleet repo (no clusters/{cluster}.yaml at {commit})")]
    UnknownCluster { cluster: String, commit: String },
    #[error(
        "no release is asked for cluster {cluster}: neither clusters/{cluster}.yaml nor fleet.yaml sets spec.release"
    )]
    NoDesiredRelease { cluster: String },
    #[error("release {id} (from {origin:?}) has no tag in the repo; push the release tag, or fix spec.release")]
    TagNotFound { id: String, origin: ReleaseOrigin },
    #[error(transparent)]
    Source(#[from] SourceError),
}

impl ResolveError {
    pub fn class(&self) -> ErrorClass {
        match self {
            ResolveError::Source(e) => e.class(),
            ResolveError::Config { source: ConfigError::Read(_), .. } => ErrorClass::Retryable,
            _ => ErrorClass::Stalling,
        }
    }
}

/// The release `cluster` should run according to the checkout's branch tip.
pub fn resolve(checkout: &Checkout, cluster: &str) -> Result<DesiredRelease, ResolveError> {
    let config = load_config(checkout)?;
    let (id, origin) = match config.desired_release(cluster) {
        Some((id, origin)) => (id.to_string(), origin),
        None if config.cluster(cluster).is_none() => {
            return Err(ResolveError::UnknownCluster { cluster: cluster.to_string(), commit: short(checkout.tip()) });
        }
        None => return Err(ResolveError::NoDesiredRelease { cluster: cluster.to_string() }),
    };
    resolve_id(checkout, config, cluster, &id, origin)
}

/// A specific release for `cluster` (a rollback target, a release named on the command line),
/// with the branch tip's configuration.
pub fn resolve_release(checkout: &Checkout, cluster: &str, id: &str) -> Result<DesiredRelease, ResolveError> {
    let config = load_config(checkout)?;
    if config.cluster(cluster).is_none() {
        return Err(ResolveError::UnknownCluster { cluster: cluster.to_string(), commit: short(checkout.tip()) });
    }
    resolve_id(checkout, config, cluster, id, ReleaseOrigin::Requested)
}

fn load_config(checkout: &Checkout) -> Result<FleetConfig, ResolveError> {
    let tree = checkout.tip_tree()?;
    FleetConfig::load(&tree).map_err(|source| ResolveError::Config { commit: short(checkout.tip()), source })
}

fn resolve_id(
    checkout: &Checkout,
    config: FleetConfig,
    cluster: &str,
    id: &str,
    origin: ReleaseOrigin,
) -> Result<DesiredRelease, ResolveError> {
    let tag = checkout.tag(id)?.ok_or_else(|| ResolveError::TagNotFound { id: id.to_string(), origin })?;
    Ok(DesiredRelease {
        cluster: cluster.to_string(),
        id: id.to_string(),
        origin,
        branch_commit: checkout.tip(),
        tag,
        config,
    })
}
