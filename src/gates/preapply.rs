//! Pre-apply gates against the live cluster: does the cluster meet the release's `requires`, are
//! the release's CRDs compatible with the live ones, and would every live custom resource still
//! validate under the new schemas? The first gate that finds a problem blocks the release before
//! anything is applied, and the [`PreapplyReport`] says which gate it was and with what figures.
//!
//! Existing objects are validated locally ([`super::schema`]) rather than by a server-side dry run:
//! a dry run checks objects against the CRD that is live, not the one about to replace it.

use super::crd_compat::{self, Finding};
use super::schema::{self, Violation};
use super::{GateError, call};
use super::{RequirementError, check_requirements};
use crate::model::ClusterFacts;
use crate::model::Requirements;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde::Serialize;
use std::time::Duration;

/// Objects listed per request while validating live custom resources.
const PAGE: u32 = 500;

/// A live custom resource that the new schema of its version would refuse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InvalidObject {
    pub crd: String,
    pub version: String,
    /// `namespace/name`, or `name` for cluster-scoped kinds.
    pub object: String,
    pub violations: Vec<Violation>,
}

impl std::fmt::Display for InvalidObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v: Vec<String> = self.violations.iter().map(ToString::to_string).collect();
        write!(f, "{} {} {} would not validate: {}", self.crd, self.version, self.object, v.join("; "))
    }
}

/// What the pre-apply stage found: the cluster's facts and, when a gate refused the release, which
/// one and with what figures. The gates run in order and stop at the first that blocks.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreapplyReport {
    pub cluster: ClusterFacts,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<PreapplyBlock>,
}

impl PreapplyReport {
    pub fn passed(&self) -> bool {
        self.blocked.is_none()
    }
}

/// The pre-apply gate that refused a release, with its figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all_fields = "camelCase", tag = "gate")]
pub enum PreapplyBlock {
    /// The cluster does not meet the release's `requires` (server version, node architectures).
    #[serde(rename = "requirements")]
    Requirement {
        #[serde(serialize_with = "display")]
        error: RequirementError,
    },
    /// A release CRD would break its live counterpart (a rule of [`crd_compat`]); `invalid_objects`
    /// are the live custom resources its schemas would refuse, named so the owner can fix them.
    #[serde(rename = "crd-compatibility")]
    CrdIncompatible { findings: Vec<Finding>, invalid_objects: Vec<InvalidObject> },
    /// Every CRD change passes the compatibility rules, yet live custom resources would not
    /// validate under the new schemas (a tightened pattern, bound or enum).
    #[serde(rename = "live-custom-resources")]
    LiveCrInvalid { invalid_objects: Vec<InvalidObject> },
}

fn display<S: serde::Serializer>(value: &impl std::fmt::Display, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

impl PreapplyBlock {
    /// The gate's name in statuses and logs (also its `gate` tag when serialized).
    pub fn gate(&self) -> &'static str {
        match self {
            PreapplyBlock::Requirement { .. } => "requirements",
            PreapplyBlock::CrdIncompatible { .. } => "crd-compatibility",
            PreapplyBlock::LiveCrInvalid { .. } => "live-custom-resources",
        }
    }

    /// The PascalCase category: Event reason, rejection reason, notification reason.
    pub fn reason(&self) -> &'static str {
        match self {
            PreapplyBlock::Requirement { .. } => "RequirementUnmet",
            PreapplyBlock::CrdIncompatible { .. } => "CrdIncompatible",
            PreapplyBlock::LiveCrInvalid { .. } => "LiveCrInvalid",
        }
    }

    /// One line per problem, for statuses and logs.
    pub fn problems(&self) -> Vec<String> {
        match self {
            PreapplyBlock::Requirement { error } => vec![error.to_string()],
            PreapplyBlock::CrdIncompatible { findings, invalid_objects } => findings
                .iter()
                .map(|f| format!("CRD incompatible: {f}"))
                .chain(invalid_objects.iter().map(ToString::to_string))
                .collect(),
            PreapplyBlock::LiveCrInvalid { invalid_objects } => {
                invalid_objects.iter().map(ToString::to_string).collect()
            }
        }
    }
}

impl std::fmt::Display for PreapplyBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.gate(), self.problems().join("; "))
    }
}

/// Runs the pre-apply gates in order: cluster requirements (when the release has any), then CRD
/// compatibility of each of `new_crds` with its live counterpart together with validation of the
/// live objects of each. `timeout` bounds every single API call. CRDs not yet in the cluster are
/// new: nothing to break. Incompatibilities covered by one of `accept` (the signed release's
/// `spec.acceptCrdChanges`) do not block.
pub async fn preapply(
    client: &kube::Client,
    new_crds: &[CustomResourceDefinition],
    requires: Option<&Requirements>,
    accept: &[crd_compat::Acceptance],
    timeout: Duration,
) -> Result<PreapplyReport, GateError> {
    let cluster = read_cluster_facts(client, timeout).await?;
    if let Some(error) = requires.and_then(|r| check_requirements(r, &cluster).err()) {
        return Ok(PreapplyReport { cluster, blocked: Some(PreapplyBlock::Requirement { error }) });
    }
    let mut findings = Vec::new();
    let mut invalid_objects = Vec::new();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for new in new_crds {
        let Some(name) = new.metadata.name.as_deref() else { continue };
        let Some(live) = call(format!("reading CRD {name}"), timeout, api.get_opt(name)).await? else { continue };
        let all = crd_compat::check_with(&live, new, &crd_compat::stored_versions(&live), accept);
        findings.extend(all.into_iter().filter(Finding::blocks));
        invalid_objects.extend(invalid_live_objects(client, &live, new, timeout).await?);
    }
    let blocked = match (findings.is_empty(), invalid_objects.is_empty()) {
        (true, true) => None,
        (true, false) => Some(PreapplyBlock::LiveCrInvalid { invalid_objects }),
        (false, _) => Some(PreapplyBlock::CrdIncompatible { findings, invalid_objects }),
    };
    Ok(PreapplyReport { cluster, blocked })
}

/// The server's version and the architecture of every node (`kubernetes.io/arch`, else the
/// kubelet's `nodeInfo.architecture`).
pub async fn read_cluster_facts(client: &kube::Client, timeout: Duration) -> Result<ClusterFacts, GateError> {
    let version = call("reading the API server version", timeout, client.apiserver_version()).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let list = call("listing nodes", timeout, nodes.list(&ListParams::default())).await?;
    let mut architectures: Vec<String> = list
        .items
        .iter()
        .filter_map(|n| {
            let label = n.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/arch")).cloned();
            label.or_else(|| n.status.as_ref()?.node_info.as_ref().map(|i| i.architecture.clone()))
        })
        .filter(|a| !a.is_empty())
        .collect();
    architectures.sort();
    architectures.dedup();
    Ok(ClusterFacts { server_version: version.git_version, architectures })
}

/// Live objects of `live` that `new` would refuse, per version served by both whose schema changed.
/// Objects are read through each such version (the server converts), so each is checked against
/// the schema its clients see.
async fn invalid_live_objects(
    client: &kube::Client,
    live: &CustomResourceDefinition,
    new: &CustomResourceDefinition,
    timeout: Duration,
) -> Result<Vec<InvalidObject>, GateError> {
    let crd = live.metadata.name.clone().unwrap_or_default();
    let spec = &live.spec;
    let mut out = Vec::new();
    for lv in spec.versions.iter().filter(|v| v.served) {
        let Some(nv) = new.spec.versions.iter().find(|v| v.name == lv.name && v.served) else { continue };
        let new_schema = nv.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref());
        let live_schema = lv.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref());
        let Some(new_schema) = new_schema else { continue };
        if Some(new_schema) == live_schema {
            continue;
        }
        let resource = ApiResource {
            group: spec.group.clone(),
            version: lv.name.clone(),
            api_version: format!("{}/{}", spec.group, lv.name),
            kind: spec.names.kind.clone(),
            plural: spec.names.plural.clone(),
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let what = format!("listing {} {}", spec.names.plural, lv.name);
            let page = call(what, timeout, api.list(&params)).await?;
            for obj in &page.items {
                let Ok(json) = serde_json::to_value(obj) else { continue };
                let violations = schema::validate(new_schema, &json);
                if !violations.is_empty() {
                    let name = obj.metadata.name.clone().unwrap_or_default();
                    let object = match &obj.metadata.namespace {
                        Some(ns) => format!("{ns}/{name}"),
                        None => name,
                    };
                    out.push(InvalidObject { crd: crd.clone(), version: lv.name.clone(), object, violations });
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }
    Ok(out)
}
