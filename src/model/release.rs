//! `release.yaml` (kind `Release`): the artifact mapping of the release a tagged commit carries.

use super::Document;
use serde::{Deserialize, Serialize};

pub type Release = Document<ReleaseSpec>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseSpec {
    /// The Operator's source commit this release was built from.
    pub git_commit: String,
    pub image: ImageRef,
    pub chart_version: String,
    /// The CRD version every CRD of this release must serve.
    pub crd_version: String,
    /// The clusters this release may run on; any other cluster refuses it.
    pub target_clusters: Vec<String>,
    /// Explicit rollback target; default is the cluster's last-known-good release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires: Option<Requirements>,
    /// Folder (relative to the repo root) holding the rendered manifests.
    #[serde(default = "default_manifests")]
    pub manifests: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy_timestamp: Option<String>,
}

pub fn default_manifests() -> String {
    "operator/".to_string()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageRef {
    pub repository: String,
    pub tag: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

impl ImageRef {
    /// `repository:tag[@digest]`, the form manifests use.
    pub fn reference(&self) -> String {
        match &self.digest {
            Some(d) => format!("{}:{}@{}", self.repository, self.tag, d),
            None => format!("{}:{}", self.repository, self.tag),
        }
    }
}

/// What a cluster must offer to run the release.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Requirements {
    /// A semver range over the server's version, e.g. `>=1.28`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<String>,
    /// Node architectures the images are built for; every node must be one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub architectures: Vec<String>,
}
