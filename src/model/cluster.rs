//! `clusters/<name>.yaml` (kind `Cluster`): one spoke cluster, its labels (`metadata.labels`), the
//! wave it names, and an optional release pin.

use super::Document;
use serde::{Deserialize, Serialize};

pub type Cluster = Document<ClusterSpec>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterSpec {
    /// One of `fleet.yaml` `spec.waves`. Absent: the waves' selectors place the cluster (and
    /// without a match it rolls out with the last wave; see [`super::wave`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<String>,
    /// Pins this cluster to a release, overriding `fleet.yaml` `spec.release`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    /// The public key this cluster's agent signs its status entries with (`ssh-ed25519 AAAA…`,
    /// what `fleetgate agent --print-status-key` prints). Without one, none of its statuses are
    /// believed: they are shown as unverified and never open a later wave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_key: Option<String>,
    /// Holds this cluster on the release it runs, as `fleet.yaml` `spec.paused` holds the fleet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}
