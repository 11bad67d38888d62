//! `fleet.yaml` (kind `Fleet`): the operator's identity, the wave order, the fleet-wide desired
//! release, and rollout/status settings.

use super::Document;
use serde::{Deserialize, Serialize};

pub type Fleet = Document<FleetSpec>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FleetSpec {
    pub operator: OperatorIdentity,
    /// Desired release of every cluster that does not pin its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// Wave names in rollout order; every cluster names one of them.
    pub waves: Vec<String>,
    #[serde(default)]
    pub rollout: RolloutSettings,
    #[serde(default)]
    pub status: StatusSettings,
}

/// Which Operator this fleet releases and where it lives in each spoke.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OperatorIdentity {
    pub name: String,
    pub namespace: String,
    /// The Operator's image repository (no tag). Releases written in the seed's ConfigMap form
    /// name only `image.tag`; their repository comes from here unless they set `image.repository`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RolloutSettings {
    /// A release halts fleet-wide once this many clusters report `failure` for it.
    #[serde(default = "default_max_failed")]
    pub max_failed_clusters: u32,
    /// Require every commit on the tracked branch tip to be signed by a trusted key.
    #[serde(default)]
    pub require_signed_commits: bool,
}

fn default_max_failed() -> u32 {
    1
}

impl Default for RolloutSettings {
    fn default() -> Self {
        RolloutSettings { max_failed_clusters: default_max_failed(), require_signed_commits: false }
    }
}

/// Where statuses go besides Git notes (which are always written).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StatusSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forge: Option<ForgeSettings>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForgeKind {
    Github,
    Gitea,
    Gitlab,
}

/// A forge whose commit-status (and pull-request) API mirrors what fleetgate writes to Git.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ForgeSettings {
    pub kind: ForgeKind,
    /// API base URL, e.g. `https://api.github.com`, `https://gitea.example.com`, `https://gitlab.com`.
    pub url: String,
    /// `owner/repo` (GitHub, Gitea) or the project path or id (GitLab).
    pub repository: String,
    /// Environment variable holding the API token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
    /// File holding the API token (takes precedence over `tokenEnv`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
}
