//! Parsing and ordering a release's rendered manifests into a [`ManifestSet`].
//!
//! Every manifest file of a release ([`ReleaseFiles`]; `.yaml`, `.yml`, `.json`; multi-document YAML)
//! becomes [`Manifest`]s: typed dynamic objects with their scope resolved, their namespace filled
//! in, and the [`Phase`] they are applied in. The set is ordered by phase, then by API group,
//! kind, namespace and name, so the same release always yields the same order.
//!
//! Scope (namespaced or cluster-scoped) is not knowable from a manifest alone: it comes from a
//! [`KindScopes`] lookup (a [`kube::Discovery`] of the target cluster, or a plain closure in
//! tests), and from the CustomResourceDefinitions in the release itself, so custom resources of
//! a CRD the cluster does not have yet still resolve.
//!
//! A kind the cluster serves takes its scope from discovery even when a release CRD claims the
//! same group and kind. [`admission`] holds the `ReleaseAdmissionPolicy` check over a set.

pub mod admission;
mod crds;

pub use crate::model::{CRD_GROUP, CRD_KIND, is_crd};
pub use admission::{AdmissionError, AdmissionPolicy, Violation};
pub use crds::{CrdNames, FileCrd, crds_in_files, typed_crd};

use crate::model::{Location, ParseError, parse_multi};
use crate::release::ReleaseFiles;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::DynamicObject;
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Identity of an object independent of API version: group, kind, namespace, name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct ObjectKey {
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    /// `Kind.group` (just `Kind` for the core group), as kubectl and admission policies write it.
    pub fn group_kind(&self) -> String {
        group_kind(&self.group, &self.kind)
    }

    pub fn is(&self, group: &str, kind: &str) -> bool {
        self.group == group && self.kind == kind
    }
}

/// API groups the Kubernetes API server serves itself (besides the core group `""`). Admission
/// refuses release CRDs in them even on a server that has one switched off today (it may be
/// switched on tomorrow); `fleetgate agent rbac` takes kinds in them as built-in.
pub const BUILTIN_GROUPS: [&str; 24] = [
    "apps",
    "batch",
    "policy",
    "autoscaling",
    "extensions",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apidiscovery.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "internal.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// `Kind.group`, or `Kind` for the core group.
pub fn group_kind(group: &str, kind: &str) -> String {
    if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.group_kind(), ns, self.name),
            None => write!(f, "{} {}", self.group_kind(), self.name),
        }
    }
}

/// Where a manifest came from: the file and the 1-based document index within it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Source {
    pub file: String,
    pub document: usize,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (document {})", self.file, self.document)
    }
}

/// The apply phases, in order. Each phase completes (and is waited on) before the next starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    Namespaces,
    /// CustomResourceDefinitions; waited on until Established.
    Crds,
    /// ServiceAccounts, Roles, ClusterRoles and their bindings.
    Rbac,
    /// ConfigMaps, Secrets, Services and other configuration a workload reads at start.
    Config,
    /// Deployments, StatefulSets, DaemonSets, Jobs …; optionally waited on until rolled out.
    Workloads,
    /// Everything else, custom resources included (their controller is running by now).
    Other,
    /// Admission webhook configurations, last: a webhook must not point at a service that is
    /// not serving yet, or it blocks every later write it intercepts.
    Webhooks,
}

impl Phase {
    pub const ALL: [Phase; 7] =
        [Phase::Namespaces, Phase::Crds, Phase::Rbac, Phase::Config, Phase::Workloads, Phase::Other, Phase::Webhooks];

    /// The phase an object of `group`/`kind` is applied in.
    pub fn of(group: &str, kind: &str) -> Phase {
        match (group, kind) {
            ("", "Namespace") => Phase::Namespaces,
            (CRD_GROUP, "CustomResourceDefinition") => Phase::Crds,
            ("", "ServiceAccount")
            | ("rbac.authorization.k8s.io", "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding") => {
                Phase::Rbac
            }
            ("", "ConfigMap" | "Secret" | "Service" | "PersistentVolumeClaim" | "ResourceQuota" | "LimitRange")
            | ("scheduling.k8s.io", "PriorityClass")
            | ("networking.k8s.io", "NetworkPolicy")
            | ("policy", "PodDisruptionBudget") => Phase::Config,
            ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
            | ("batch", "Job" | "CronJob")
            | ("", "Pod" | "ReplicationController") => Phase::Workloads,
            (
                "admissionregistration.k8s.io",
                "ValidatingWebhookConfiguration"
                | "MutatingWebhookConfiguration"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
                | "MutatingAdmissionPolicy"
                | "MutatingAdmissionPolicyBinding",
            ) => Phase::Webhooks,
            _ => Phase::Other,
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Phase::Namespaces => "namespaces",
            Phase::Crds => "crds",
            Phase::Rbac => "rbac",
            Phase::Config => "config",
            Phase::Workloads => "workloads",
            Phase::Other => "other",
            Phase::Webhooks => "webhooks",
        };
        f.write_str(s)
    }
}

/// Tells whether a kind is namespaced. Implemented for [`kube::Discovery`] (after `run`) and for
/// closures `Fn(group, kind) -> Option<Scope>`.
pub trait KindScopes {
    /// The scope of `kind` in API `group`, or None when the cluster does not serve it.
    fn scope_of(&self, group: &str, kind: &str) -> Option<Scope>;
}

impl<F: Fn(&str, &str) -> Option<Scope>> KindScopes for F {
    fn scope_of(&self, group: &str, kind: &str) -> Option<Scope> {
        self(group, kind)
    }
}

impl KindScopes for kube::Discovery {
    fn scope_of(&self, group: &str, kind: &str) -> Option<Scope> {
        let g = self.get(group)?;
        g.versions().flat_map(|v| g.versioned_resources(v)).find(|(ar, _)| ar.kind == kind).map(|(_, caps)| caps.scope)
    }
}

/// One object of a release, ready to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub key: ObjectKey,
    pub gvk: GroupVersionKind,
    pub scope: Scope,
    pub phase: Phase,
    pub source: Source,
    /// The object with `apiVersion`/`kind` set and its namespace resolved (absent when
    /// cluster-scoped).
    pub object: DynamicObject,
}

impl Manifest {
    /// `group/version` or `version` for the core group.
    pub fn api_version(&self) -> String {
        api_version(&self.gvk.group, &self.gvk.version)
    }
}

/// `group/version`, or `version` for the core group.
pub fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() { version.to_string() } else { format!("{group}/{version}") }
}

/// Why a release's manifests cannot be applied. Every problem in the set is reported at once
/// ([`ManifestError::Many`] when there are several).
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error("{at}: not a Kubernetes object: {reason}")]
    NotAnObject { at: Source, reason: String },
    #[error("{at}: {key} is defined twice; first at {first}")]
    Duplicate { at: Source, key: Box<ObjectKey>, first: Source },
    #[error(
        "{at}: {key} is namespaced but has no metadata.namespace, and the release sets no spec.namespace \
         (`fleetgate release create` writes the fleet's operator.namespace there; --namespace NS chooses another)"
    )]
    MissingNamespace { at: Source, key: Box<ObjectKey> },
    #[error(
        "{at}: {kind} ({api_version}) is not served by the cluster and no CustomResourceDefinition in the release defines it"
    )]
    UnknownKind { at: Source, api_version: String, kind: String },
    #[error("{at}: {reason}")]
    InvalidCrd { at: Source, reason: String },
    #[error("{} problems in the release's manifests:\n  {}", .0.len(), .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n  "))]
    Many(Vec<ManifestError>),
}

impl ManifestError {
    pub(crate) fn from_all(mut errors: Vec<ManifestError>) -> Option<ManifestError> {
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(ManifestError::Many(errors)),
        }
    }
}

/// The ordered objects of one release.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestSet {
    release_id: String,
    manifests: Vec<Manifest>,
    /// The set's CRDs, typed (read once, by [`typed_crd`]), in apply order.
    crds: Vec<CustomResourceDefinition>,
}

impl ManifestSet {
    /// Parses every manifest file of `release` (sorted by path; documents in file order),
    /// resolves each object's scope through `scopes` and the release's own CRDs, puts namespaced
    /// objects without a namespace in the release's [`default_namespace`](ReleaseFiles::default_namespace)
    /// (as `kubectl apply -n` does), drops `metadata.namespace` from cluster-scoped objects (as
    /// kubectl does), and orders the result by phase. Every reader of a release (the agent,
    /// `diff`, `validate`, `agent rbac`, admission, drift) goes through here, so all of them see
    /// the same objects in the same namespaces.
    ///
    /// Errors: every unparsable document, duplicate (same group, kind, namespace and name),
    /// namespaced object without a namespace when the release sets no default, and kind neither
    /// served nor defined by the release — all reported together.
    pub fn from_release(release: &dyn ReleaseFiles, scopes: &dyn KindScopes) -> Result<ManifestSet, ManifestError> {
        let default_namespace = release.default_namespace();
        let mut errors = Vec::new();
        let mut parsed: Vec<(Source, DynamicObject, GroupVersionKind)> = Vec::new();
        // `files()` is a BTreeMap: path order is the deterministic file order.
        for (path, bytes) in release.files().iter().filter(|(p, _)| is_manifest_file(p)) {
            let path = path.as_str();
            let text = match std::str::from_utf8(bytes) {
                Ok(t) => t,
                Err(e) => {
                    errors.push(ManifestError::Parse(ParseError::Invalid {
                        at: Location { file: path.to_string(), line: None, column: None },
                        message: format!("not UTF-8: {e}"),
                    }));
                    continue;
                }
            };
            let docs = match parse_multi(path, text) {
                Ok(d) => d,
                Err(e) => {
                    errors.push(e.into());
                    continue;
                }
            };
            for (i, doc) in docs.into_iter().enumerate() {
                let at = Source { file: path.to_string(), document: i + 1 };
                match to_object(doc) {
                    Ok((obj, gvk)) => parsed.push((at, obj, gvk)),
                    Err(reason) => errors.push(ManifestError::NotAnObject { at, reason }),
                }
            }
        }
        Self::build(release.id(), parsed, errors, default_namespace, scopes)
    }

    /// A set of objects that did not come from manifest files (a snapshot's live objects),
    /// checked and ordered exactly like [`from_release`](Self::from_release).
    pub fn from_objects(
        id: &str,
        objects: Vec<(Source, DynamicObject)>,
        default_namespace: Option<&str>,
        scopes: &dyn KindScopes,
    ) -> Result<ManifestSet, ManifestError> {
        let mut errors = Vec::new();
        let mut parsed = Vec::new();
        for (at, obj) in objects {
            match serde_json::to_value(&obj).map_err(|e| e.to_string()).and_then(to_object) {
                Ok((obj, gvk)) => parsed.push((at, obj, gvk)),
                Err(reason) => errors.push(ManifestError::NotAnObject { at, reason }),
            }
        }
        Self::build(id, parsed, errors, default_namespace, scopes)
    }

    fn build(
        id: &str,
        parsed: Vec<(Source, DynamicObject, GroupVersionKind)>,
        mut errors: Vec<ManifestError>,
        default_namespace: Option<&str>,
        scopes: &dyn KindScopes,
    ) -> Result<ManifestSet, ManifestError> {
        // The release's own CRDs define the scope of their kinds, whatever the cluster serves now.
        // Each CRD is converted once, here; the set keeps the first of each name in apply order.
        let mut release_crds: HashMap<(String, String), Scope> = HashMap::new();
        let mut typed: HashMap<String, CustomResourceDefinition> = HashMap::new();
        for (at, obj, gvk) in &parsed {
            if !is_crd(&api_version(&gvk.group, &gvk.version), &gvk.kind) {
                continue;
            }
            match serde_json::to_value(obj).map_err(|e| e.to_string()).and_then(|v| typed_crd(&v)) {
                Ok(crd) => {
                    let names = CrdNames::of(&crd);
                    release_crds.insert((names.group, names.kind), names.scope);
                    typed.entry(names.name).or_insert(crd);
                }
                Err(reason) => errors.push(ManifestError::InvalidCrd { at: at.clone(), reason }),
            }
        }

        let mut seen: BTreeMap<ObjectKey, Source> = BTreeMap::new();
        let mut manifests = Vec::new();
        for (at, mut object, gvk) in parsed {
            // Live discovery first: a kind the cluster serves has the scope the cluster gives it,
            // whatever a release CRD of the same group and kind claims (admission refuses such a
            // CRD; its claim must not move the object out of the cluster-scope checks meanwhile).
            let scope = match scopes.scope_of(&gvk.group, &gvk.kind) {
                Some(s) => s,
                None => match release_crds.get(&(gvk.group.clone(), gvk.kind.clone())) {
                    Some(s) => s.clone(),
                    None => {
                        errors.push(ManifestError::UnknownKind {
                            at,
                            api_version: api_version(&gvk.group, &gvk.version),
                            kind: gvk.kind.clone(),
                        });
                        continue;
                    }
                },
            };
            let name = object.metadata.name.clone().unwrap_or_default();
            let namespace = match scope {
                Scope::Cluster => None,
                Scope::Namespaced => object
                    .metadata
                    .namespace
                    .clone()
                    .filter(|ns| !ns.is_empty())
                    .or_else(|| default_namespace.map(str::to_string)),
            };
            let key =
                ObjectKey { group: gvk.group.clone(), kind: gvk.kind.clone(), namespace: namespace.clone(), name };
            if scope == Scope::Namespaced && namespace.is_none() {
                errors.push(ManifestError::MissingNamespace { at, key: Box::new(key) });
                continue;
            }
            if let Some(first) = seen.get(&key) {
                errors.push(ManifestError::Duplicate { at, key: Box::new(key), first: first.clone() });
                continue;
            }
            object.metadata.namespace = namespace;
            seen.insert(key.clone(), at.clone());
            manifests.push(Manifest { phase: Phase::of(&key.group, &key.kind), key, gvk, scope, source: at, object });
        }
        if let Some(e) = ManifestError::from_all(errors) {
            return Err(e);
        }
        manifests.sort_by(|a, b| (a.phase, &a.key).cmp(&(b.phase, &b.key)));
        let crds = manifests
            .iter()
            .filter(|m| is_crd(&m.api_version(), &m.key.kind))
            .filter_map(|m| typed.remove(&m.key.name))
            .collect();
        Ok(ManifestSet { release_id: id.to_string(), manifests, crds })
    }

    /// The id of the release these objects belong to.
    pub fn release_id(&self) -> &str {
        &self.release_id
    }

    /// All objects, in apply order.
    pub fn iter(&self) -> impl Iterator<Item = &Manifest> {
        self.manifests.iter()
    }

    pub fn len(&self) -> usize {
        self.manifests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.manifests.is_empty()
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Manifest> {
        self.manifests.iter().find(|m| &m.key == key)
    }

    /// The objects of one phase, in order.
    pub fn phase(&self, phase: Phase) -> impl Iterator<Item = &Manifest> {
        self.manifests.iter().filter(move |m| m.phase == phase)
    }

    /// Adds `labels` to every object (the apply engine's release and inventory labels).
    pub fn add_labels(&mut self, labels: &[(&str, String)]) {
        for m in &mut self.manifests {
            let map = m.object.metadata.labels.get_or_insert_with(Default::default);
            for (k, v) in labels {
                map.insert(k.to_string(), v.clone());
            }
        }
    }

    /// Whether `group`/`kind` is defined by a CustomResourceDefinition of this set.
    pub fn defines_kind(&self, group: &str, kind: &str) -> bool {
        self.crds.iter().any(|c| c.spec.group == group && c.spec.names.kind == kind)
    }

    /// Replaces the set's CRD of `crd`'s name with `crd` (its spec; the set's own labels stay),
    /// so the apply leaves that CRD as `crd` has it. False when the set has no such CRD.
    pub fn replace_crd(&mut self, crd: &CustomResourceDefinition) -> bool {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let Some(m) = self.manifests.iter_mut().find(|m| is_crd(&m.api_version(), &m.key.kind) && m.key.name == name)
        else {
            return false;
        };
        let labels = m.object.metadata.labels.clone();
        let spec = serde_json::to_value(&crd.spec).expect("a CRD spec serializes");
        m.object.data = serde_json::json!({ "spec": spec });
        m.object.metadata = kube::api::ObjectMeta { name: Some(name.clone()), labels, ..Default::default() };
        if let Some(typed) = self.crds.iter_mut().find(|c| c.metadata.name.as_deref() == Some(name.as_str())) {
            typed.spec = crd.spec.clone();
        }
        true
    }

    /// Every CustomResourceDefinition in the set, typed.
    pub fn crds(&self) -> &[CustomResourceDefinition] {
        &self.crds
    }

    /// The names of every CustomResourceDefinition in the set.
    pub fn crd_names(&self) -> Vec<CrdNames> {
        self.crds.iter().map(CrdNames::of).collect()
    }
}

fn is_manifest_file(path: &str) -> bool {
    [".yaml", ".yml", ".json"].iter().any(|ext| path.ends_with(ext))
}

/// Turns one YAML document into a dynamic object with `apiVersion`, `kind` and `metadata.name`.
fn to_object(value: Value) -> Result<(DynamicObject, GroupVersionKind), String> {
    if !value.is_object() {
        return Err("the document is not a mapping".into());
    }
    let obj: DynamicObject = serde_json::from_value(value).map_err(|e| e.to_string())?;
    let types = obj.types.clone().ok_or("missing apiVersion or kind")?;
    if types.api_version.is_empty() || types.kind.is_empty() {
        return Err("missing apiVersion or kind".into());
    }
    if types.kind.ends_with("List") && obj.data.get("items").is_some() {
        return Err(format!("{} documents are not supported; put each object in its own document", types.kind));
    }
    if obj.metadata.name.as_deref().unwrap_or("").is_empty() {
        return Err(format!(
            "{} has no metadata.name (generateName is not supported: server-side apply needs a name)",
            types.kind
        ));
    }
    let gvk = GroupVersionKind::try_from(&types).map_err(|e| e.to_string())?;
    Ok((obj, gvk))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{Document, ImageRef, Release, ReleaseSpec};
    use crate::release::VerifiedRelease;

    /// A release of `files` whose default namespace is `redis-system`.
    pub(crate) fn release(files: &[(&str, &str)]) -> VerifiedRelease {
        release_in(Some("redis-system"), files)
    }

    pub(crate) fn release_in(namespace: Option<&str>, files: &[(&str, &str)]) -> VerifiedRelease {
        let spec = ReleaseSpec {
            fleet: Some("redis-fleet".into()),
            sequence: Some(1),
            revokes: Vec::new(),
            git_commit: "a1b2c3d".into(),
            image: ImageRef { repository: "example/op".into(), tag: "v1".into(), digest: None },
            images: Vec::new(),
            chart_version: "1.0.0".into(),
            chart: None,
            crd_version: "v1".into(),
            crds: Vec::new(),
            accept_crd_changes: Vec::new(),
            target_clusters: vec!["c1".into()],
            rollback_to: None,
            requires: None,
            manifests: "operator/".into(),
            namespace: namespace.map(str::to_string),
            deploy_timestamp: None,
            variants: Vec::new(),
        };
        let release: Release = Document::new("Release", "rel-1", spec);
        let files = files.iter().map(|(p, t)| (p.to_string(), t.as_bytes().to_vec())).collect();
        VerifiedRelease::assume_verified(release, "0123abcd", files)
    }

    /// A fixed view of a cluster: core, apps and batch kinds, RBAC, CRDs, webhooks.
    pub(crate) fn scopes(group: &str, kind: &str) -> Option<Scope> {
        match (group, kind) {
            ("", "Namespace") | (CRD_GROUP, "CustomResourceDefinition") => Some(Scope::Cluster),
            ("rbac.authorization.k8s.io", "ClusterRole" | "ClusterRoleBinding") => Some(Scope::Cluster),
            ("rbac.authorization.k8s.io", "Role" | "RoleBinding") => Some(Scope::Namespaced),
            ("", "ConfigMap" | "Secret" | "Service" | "ServiceAccount") => Some(Scope::Namespaced),
            ("apps", "Deployment" | "StatefulSet" | "DaemonSet") | ("batch", "Job" | "CronJob") | ("", "Pod") => {
                Some(Scope::Namespaced)
            }
            ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration") => {
                Some(Scope::Cluster)
            }
            _ => None,
        }
    }

    const CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true}]
";

    #[test]
    fn orders_by_phase_and_resolves_namespaces() {
        let r = release(&[
            (
                "operator/b.yaml",
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: op}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: ns1, namespace: ignored}\n",
            ),
            ("operator/a.yaml", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w, namespace: ns1}\n---\n"),
            ("operator/crd.yaml", CRD),
            (
                "operator/webhook.yaml",
                "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {name: vw}\n",
            ),
            ("operator/README.md", "not yaml: ["),
        ]);
        let set = ManifestSet::from_release(&r, &scopes).unwrap();
        let order: Vec<String> = set.iter().map(|m| m.key.to_string()).collect();
        assert_eq!(
            order,
            [
                "Namespace ns1",
                "CustomResourceDefinition.apiextensions.k8s.io widgets.example.com",
                "Deployment.apps redis-system/op",
                "Widget.example.com ns1/w",
                "ValidatingWebhookConfiguration.admissionregistration.k8s.io vw",
            ]
        );
        let ns = set.iter().next().unwrap();
        assert_eq!(ns.object.metadata.namespace, None, "cluster-scoped objects carry no namespace");
        assert_eq!(CrdNames::of(&set.crds()[0]).plural, "widgets");
    }

    #[test]
    fn reports_every_problem_at_once() {
        let r = release_in(
            None,
            &[
                (
                    "operator/a.yaml",
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: x}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: x}\n",
                ),
                (
                    "operator/b.yaml",
                    "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n---\napiVersion: nope.io/v1\nkind: Thing\nmetadata: {name: t}\n---\n- a list\n",
                ),
                ("operator/c.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {generateName: x-}\n"),
            ],
        );
        let err = ManifestSet::from_release(&r, &scopes).unwrap_err();
        assert!(err.to_string().contains("sets no spec.namespace"), "{err}");
        let ManifestError::Many(all) = err else { panic!("expected many errors, got {err}") };
        let kinds: Vec<&str> = all
            .iter()
            .map(|e| match e {
                ManifestError::Duplicate { .. } => "duplicate",
                ManifestError::MissingNamespace { .. } => "missing-namespace",
                ManifestError::UnknownKind { .. } => "unknown-kind",
                ManifestError::NotAnObject { .. } => "not-an-object",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["not-an-object", "not-an-object", "duplicate", "missing-namespace", "unknown-kind"]);
        let text = ManifestError::Many(all).to_string();
        assert!(
            text.contains(
                "operator/a.yaml (document 2): ConfigMap x/c is defined twice; first at operator/a.yaml (document 1)"
            ),
            "{text}"
        );
        assert!(text.contains("operator/b.yaml (document 1): Secret s is namespaced"), "{text}");
    }

    #[test]
    fn same_object_under_two_versions_is_a_duplicate() {
        let r = release(&[(
            "m.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: n}\n---\napiVersion: apps/v1beta2\nkind: Deployment\nmetadata: {name: d, namespace: n}\n",
        )]);
        assert!(matches!(ManifestSet::from_release(&r, &scopes), Err(ManifestError::Duplicate { .. })));
    }

    #[test]
    fn default_namespace_makes_implicit_and_explicit_duplicates() {
        let r = release_in(
            Some("d"),
            &[(
                "m.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: d}\n",
            )],
        );
        assert!(matches!(ManifestSet::from_release(&r, &scopes), Err(ManifestError::Duplicate { .. })));
    }

    #[test]
    fn a_served_kind_keeps_its_live_scope_whatever_a_release_crd_claims() {
        let shadow = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: validatingwebhookconfigurations.admissionregistration.k8s.io}
spec:
  group: admissionregistration.k8s.io
  names: {kind: ValidatingWebhookConfiguration, plural: validatingwebhookconfigurations}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true}]
";
        let r = release(&[
            ("operator/crd.yaml", shadow),
            (
                "operator/hook.yaml",
                "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {name: vw, namespace: ns1}\n",
            ),
        ]);
        let set = ManifestSet::from_release(&r, &scopes).unwrap();
        let hook = set.iter().find(|m| m.key.kind == "ValidatingWebhookConfiguration").unwrap();
        assert_eq!((&hook.scope, &hook.key.namespace), (&Scope::Cluster, &None));
    }

    #[test]
    fn phases() {
        assert_eq!(Phase::of("", "Namespace"), Phase::Namespaces);
        assert_eq!(Phase::of("rbac.authorization.k8s.io", "ClusterRoleBinding"), Phase::Rbac);
        assert_eq!(Phase::of("", "Service"), Phase::Config);
        assert_eq!(Phase::of("apps", "StatefulSet"), Phase::Workloads);
        assert_eq!(Phase::of("example.com", "Widget"), Phase::Other);
        assert_eq!(Phase::of("admissionregistration.k8s.io", "MutatingWebhookConfiguration"), Phase::Webhooks);
        assert!(Phase::Webhooks > Phase::Other && Phase::Crds < Phase::Rbac);
    }
}
