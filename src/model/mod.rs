//! The fleet repo's typed documents: [`Fleet`], [`Cluster`], [`Release`], [`GatePolicy`] and
//! [`ReleaseAdmissionPolicy`], plus the YAML parsing every one of them goes through.
//!
//! Every document is `apiVersion: fleetgate.io/v1alpha1` with a `kind`, `metadata` and `spec`.
//! Unknown fields are errors: a typo must never silently disable a gate or widen a policy.
//! Parse errors name the file and, where the parser knows it, the line and column.
//!
//! [`FleetConfig`] loads a whole commit's configuration from a [`RepoTree`]; the checks in
//! `validate` and [`FleetConfig::load`] report every [`Finding`] at once.

mod admission;
mod approval;
mod checks;
mod cluster;
mod config;
mod error_chain;
mod error_class;
mod finding;
mod fleet;
mod gate_policy;
mod release;
pub mod stop_point;
mod target;
mod template;
mod tree;
mod variant;
mod wave;
mod yaml;

pub use admission::{
    AdmissionBaseline, BaselineError, PodSecurityLevel, RELEASE_ADMISSION_POLICY_KIND, RbacGrant,
    ReleaseAdmissionPolicy, ReleaseAdmissionPolicySpec,
};
pub use approval::{ApprovalRecord, approval_tag, is_approval_tag, tagger_and_message};
pub use checks::{
    KNOWN_ARCHITECTURES, check_cluster, check_fleet, check_release, is_digest, is_dns_label, is_image_repository,
    is_image_tag, is_label_key, is_label_value, is_release_id, ordering_findings, safe_relative_path,
};
pub use cluster::{Cluster, ClusterSpec};
pub use config::{
    CLUSTERS_DIR, ConfigError, FLEET_FILE, FleetConfig, PausedBy, RELEASE_FILE, ReleaseOrigin, SpokeSetting,
    spoke_setting_findings,
};
pub use error_chain::{error_chain, redact_userinfo, redacted_url};
pub use error_class::ErrorClass;
pub use finding::{Finding, Rule, join_findings};
pub use fleet::{
    DEFAULT_ENDPOINT, Fleet, FleetSpec, ForgeKind, OperatorIdentity, PromotionMode, RolloutSettings, SpokeRef,
    StatusSettings,
};
pub use gate_policy::{
    ClusterIdentity, CustomResourcesGate, DeploymentAvailableGate, Gate, GateCheck, GatePolicy, GatePolicyProblem,
    GatePolicySpec, GateSelector, OnUnknown, PodRestartsGate, PrometheusBound, PrometheusGate, Quantity, Unit,
    WebhookGate,
};
pub use release::{
    BadVersionRange, ChartSource, CrdVersions, ImageRef, NamedImage, PRIMARY_IMAGE_NAME, Release, ReleaseSpec,
    Requirements, default_manifests, parse_release, parse_version_range, release_seed_data, seed_keys,
};
pub use target::{SelectError, Target};
#[cfg(test)]
pub(crate) use template::template_dir;
pub use template::{TEMPLATE_FILES, TemplateError, write_template};
pub(crate) use tree::clean_tree_path;
pub use tree::{DirTree, EntryKind, RepoTree, TreeEntry, TreeError};
pub use variant::{
    BadServerVersion, ClusterFacts, NoVariant, Variant, VariantSelector, check_variants, parse_server_version,
    select_variant,
};
pub use wave::{ApprovalSetting, ClockTime, DaySpan, Placed, Placement, Wave, Window, Zone, assign, rendezvous};
pub(crate) use yaml::DocumentHead;
pub use yaml::{Location, MAX_ALIAS_EXPANSION, MAX_YAML_BYTES, ParseError, parse_document, parse_multi, parse_yaml};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The API group/version every fleetgate document carries.
pub const API_VERSION: &str = "fleetgate.io/v1alpha1";

/// The group of CustomResourceDefinitions.
pub const CRD_GROUP: &str = "apiextensions.k8s.io";
/// The kind every CRD document has.
pub const CRD_KIND: &str = "CustomResourceDefinition";

/// Whether a document (`apiVersion`, `kind`) is a CustomResourceDefinition.
pub fn is_crd(api_version: &str, kind: &str) -> bool {
    kind == CRD_KIND && api_version.split('/').next() == Some(CRD_GROUP)
}

/// `metadata` of a fleetgate document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The envelope shared by every fleetgate document: `apiVersion`, `kind`, `metadata`, `spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Document<S> {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: S,
}

impl<S> Document<S> {
    pub fn new(kind: &str, name: impl Into<String>, spec: S) -> Self {
        Document {
            api_version: API_VERSION.to_string(),
            kind: kind.to_string(),
            metadata: ObjectMeta { name: name.into(), ..Default::default() },
            spec,
        }
    }

    pub fn name(&self) -> &str {
        &self.metadata.name
    }
}
