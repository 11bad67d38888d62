//! Pre-apply gates against the live cluster: does the cluster meet the release's `requires`, are
//! the release's CRDs compatible with the live ones, and would every live custom resource still
//! validate under the new schemas? Any problem blocks the release before anything is applied.
//!
//! Existing objects are validated locally ([`super::schema`]) rather than by a server-side dry run:
//! a dry run checks objects against the CRD that is live, not the one about to replace it.

use super::crd_compat::{self, Finding};
use super::schema::{self, Violation};
use super::{GateError, call};
use crate::model::Requirements;
use crate::release::{ClusterFacts, check_requirements};
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

/// Everything the pre-apply gates found; [`PreApplyReport::passed`] says whether to go on.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreApplyReport {
    pub cluster: ClusterFacts,
    /// Why the cluster does not meet `requires`, if it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmet_requirement: Option<String>,
    pub crd_findings: Vec<Finding>,
    pub invalid_objects: Vec<InvalidObject>,
}

impl PreApplyReport {
    pub fn passed(&self) -> bool {
        self.unmet_requirement.is_none() && self.crd_findings.is_empty() && self.invalid_objects.is_empty()
    }

    /// One line per problem, for statuses and logs.
    pub fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = self.unmet_requirement.iter().cloned().collect();
        out.extend(self.crd_findings.iter().map(|f| format!("CRD incompatible: {f}")));
        out.extend(self.invalid_objects.iter().map(ToString::to_string));
        out
    }
}

/// Runs every pre-apply gate: cluster requirements (when the release has any), CRD compatibility of
/// each of `new_crds` with its live counterpart, and validation of the live objects of each.
/// `timeout` bounds every single API call. CRDs not yet in the cluster are new: nothing to break.
pub async fn preapply(
    client: &kube::Client,
    new_crds: &[CustomResourceDefinition],
    requires: Option<&Requirements>,
    timeout: Duration,
) -> Result<PreApplyReport, GateError> {
    let cluster = read_cluster_facts(client, timeout).await?;
    let unmet_requirement = requires.and_then(|r| check_requirements(r, &cluster).err()).map(|e| e.to_string());
    let mut crd_findings = Vec::new();
    let mut invalid_objects = Vec::new();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for new in new_crds {
        let Some(name) = new.metadata.name.as_deref() else { continue };
        let Some(live) = call(format!("reading CRD {name}"), timeout, api.get_opt(name)).await? else { continue };
        crd_findings.extend(crd_compat::check(&live, new, &crd_compat::stored_versions(&live)));
        invalid_objects.extend(invalid_live_objects(client, &live, new, timeout).await?);
    }
    Ok(PreApplyReport { cluster, unmet_requirement, crd_findings, invalid_objects })
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
pub async fn invalid_live_objects(
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
