//! The least-privilege RBAC the agent needs to apply, prune, snapshot and health-check one
//! release: what `fleetgate agent rbac` prints and `deploy/rbac-operator.yaml` ships for the
//! template Operator.
//!
//! The rules follow from how the engine works, not from the objects' contents:
//! * It writes only by server-side apply, a PATCH to a named object, where the API server checks
//!   even `create` against the name — so every cluster-scoped object is granted by
//!   `resourceNames`, and `escalate`/`bind` only for the release's own (Cluster)Roles.
//! * Namespaces are never deleted (pruning one would delete everything in it).
//! * CRDs are watched by name until Established; custom resources of the release's CRDs are read
//!   and written in every namespace (snapshots, restore, compatibility checks), never deleted.
//! * Health gates list Deployments, ReplicaSets and Pods in namespaces that run workloads.
//! * Nodes are read for `requires.architectures`.
//! * Roles and ClusterRoles are read (not written) everywhere: admission judges a binding of a
//!   role the release does not define by that role's rules in the cluster.
//!
//! The agent's own needs in its namespace (state, snapshots, Events, Lease) are in
//! `deploy/rbac-state.yaml`, the same for every Operator.

use crate::manifests::{BUILTIN_GROUPS, ManifestError, ManifestSet, ObjectKey};
use crate::model::{Location, ParseError, TreeError, parse_multi};
use crate::release::{Keyring, UnverifiedRelease, VerifyError, read_release, verify_tag_signature};
use crate::source::{Checkout, SourceError};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::Scope;
use std::collections::{BTreeMap, BTreeSet};

/// Why the RBAC of a release cannot be worked out.
#[derive(Debug, thiserror::Error)]
pub enum RbacError {
    #[error("no tag {id} in the repository")]
    NoTag { id: String },
    #[error("tag {id} is a lightweight tag; releases are annotated, signed tags")]
    Lightweight { id: String },
    #[error("release {id}: its signature does not verify")]
    Signature {
        id: String,
        #[source]
        source: VerifyError,
    },
    #[error("release {id} has no readable release.yaml:\n{}", findings.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("\n"))]
    NoRelease { id: String, findings: Vec<crate::model::Finding> },
    #[error("release {id}: its manifests")]
    Manifests {
        id: String,
        #[source]
        source: ManifestError,
    },
    #[error("reading the repository")]
    Source(#[from] SourceError),
    #[error("reading the release's tree")]
    Tree(#[from] TreeError),
}

/// The RBAC release `id` of `checkout` needs, from its tag's tree: the signature is checked first
/// when `trust` is given (what the agent would accept), else the content is read as it is.
/// Kinds are resolved without a cluster: built-in kinds by [`builtin_scope`], custom kinds by the
/// release's own CRDs; unqualified namespaced objects go to the release's `spec.namespace`.
pub fn release_rbac(checkout: &Checkout, id: &str, trust: Option<&Keyring>) -> Result<AgentRbac, RbacError> {
    let tag = checkout.tag(id)?.ok_or_else(|| RbacError::NoTag { id: id.into() })?;
    if let Some(trust) = trust {
        let object = tag.object.ok_or_else(|| RbacError::Lightweight { id: id.into() })?;
        verify_tag_signature(checkout, id, object, trust)
            .map_err(|source| RbacError::Signature { id: id.into(), source })?;
    }
    let tree = checkout.tag_tree(&tag)?;
    let (content, findings) = read_release(&tree, Some(id))?;
    let content = content.ok_or_else(|| RbacError::NoRelease { id: id.into(), findings })?;
    let release = UnverifiedRelease::new(id, content);
    let set = ManifestSet::from_release(&release, &builtin_scope)
        .map_err(|source| RbacError::Manifests { id: id.into(), source })?;
    Ok(AgentRbac::for_release(&set))
}

/// Name of the (Cluster)Roles and bindings the output defines.
const AGENT_ROLE: &str = "fleetgate-agent";

/// The cluster-scoped kinds of the built-in groups that a release may plausibly contain.
const CLUSTER_SCOPED: &[(&str, &str)] = &[
    ("", "Namespace"),
    ("", "PersistentVolume"),
    ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"),
    ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"),
    ("apiextensions.k8s.io", "CustomResourceDefinition"),
    ("apiregistration.k8s.io", "APIService"),
    ("flowcontrol.apiserver.k8s.io", "FlowSchema"),
    ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration"),
    ("networking.k8s.io", "IngressClass"),
    ("node.k8s.io", "RuntimeClass"),
    ("rbac.authorization.k8s.io", "ClusterRole"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("scheduling.k8s.io", "PriorityClass"),
    ("storage.k8s.io", "CSIDriver"),
    ("storage.k8s.io", "StorageClass"),
];

/// Scopes of built-in kinds without a cluster (for [`ManifestSet::from_release`]): kinds of the
/// built-in groups ([`BUILTIN_GROUPS`]) are namespaced unless listed in [`CLUSTER_SCOPED`]; custom
/// kinds are left to the release's CRDs.
pub fn builtin_scope(group: &str, kind: &str) -> Option<Scope> {
    if CLUSTER_SCOPED.contains(&(group, kind)) {
        Some(Scope::Cluster)
    } else if group.is_empty() || BUILTIN_GROUPS.contains(&group) {
        Some(Scope::Namespaced)
    } else {
        None
    }
}

const WORKLOADS: &[(&str, &str)] = &[("apps", "Deployment"), ("apps", "StatefulSet"), ("apps", "DaemonSet")];

/// The rules for one release: cluster-wide, and per namespace the release writes to.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRbac {
    pub cluster: Vec<PolicyRule>,
    pub namespaces: BTreeMap<String, Vec<PolicyRule>>,
}

fn rule(group: &str, resources: &[&str], verbs: &[&str], names: Vec<String>) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        resource_names: Some(names).filter(|n| !n.is_empty()),
        non_resource_urls: None,
    }
}

impl AgentRbac {
    /// The rules `set`'s objects need (see the module documentation).
    pub fn for_release(set: &ManifestSet) -> AgentRbac {
        // (group, plural) → names, for cluster-scoped objects; namespace → (group, plural) → names.
        let mut cluster: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        let mut namespaced: BTreeMap<String, BTreeMap<(String, String), BTreeSet<String>>> = BTreeMap::new();
        let mut workload_namespaces = BTreeSet::new();
        let plurals: BTreeMap<(String, String), String> = set
            .crds()
            .iter()
            .map(|crd| ((crd.spec.group.clone(), crd.spec.names.kind.clone()), crd.spec.names.plural.clone()))
            .collect();
        for m in set.iter() {
            let plural =
                plurals.get(&(m.gvk.group.clone(), m.gvk.kind.clone())).cloned().unwrap_or_else(|| plural_of(&m.gvk));
            let resource = (m.gvk.group.clone(), plural);
            match (&m.scope, &m.key) {
                (Scope::Namespaced, ObjectKey { namespace: Some(ns), name, .. }) => {
                    if WORKLOADS.contains(&(m.gvk.group.as_str(), m.gvk.kind.as_str())) {
                        workload_namespaces.insert(ns.clone());
                    }
                    namespaced.entry(ns.clone()).or_default().entry(resource).or_default().insert(name.clone());
                }
                (_, key) => {
                    cluster.entry(resource).or_default().insert(key.name.clone());
                }
            }
        }

        let mut cluster_rules: Vec<PolicyRule> = cluster
            .into_iter()
            .map(|((group, resource), names)| {
                let verbs: &[&str] = match (group.as_str(), resource.as_str()) {
                    ("", "namespaces") => &["get", "create", "patch"],
                    ("apiextensions.k8s.io", _) => &["get", "list", "watch", "create", "patch", "delete"],
                    ("rbac.authorization.k8s.io", "clusterroles") => {
                        &["get", "create", "patch", "delete", "escalate", "bind"]
                    }
                    _ => &["get", "create", "patch", "delete"],
                };
                rule(&group, &[&resource], verbs, names.into_iter().collect())
            })
            .collect();
        cluster_rules.push(rule("", &["nodes"], &["get", "list"], Vec::new()));
        cluster_rules.push(rule("rbac.authorization.k8s.io", &["clusterroles", "roles"], &["get"], Vec::new()));
        let mut custom: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for crd in set.crds() {
            custom.entry(&crd.spec.group).or_default().insert(&crd.spec.names.plural);
        }
        for (group, plurals) in custom {
            let plurals: Vec<&str> = plurals.into_iter().collect();
            cluster_rules.push(rule(
                group,
                &plurals,
                &["get", "list", "watch", "create", "update", "patch"],
                Vec::new(),
            ));
        }

        let namespaces = namespaced
            .into_iter()
            .map(|(ns, resources)| {
                // Resources granted alike share a rule, as a person would write them.
                let mut plain: BTreeMap<(String, &[&str]), Vec<String>> = BTreeMap::new();
                let mut rules = Vec::new();
                for ((group, resource), names) in resources {
                    match (group.as_str(), resource.as_str()) {
                        ("rbac.authorization.k8s.io", "roles") => rules.push(rule(
                            &group,
                            &[&resource],
                            &["get", "create", "patch", "delete", "escalate", "bind"],
                            names.into_iter().collect(),
                        )),
                        ("rbac.authorization.k8s.io", "rolebindings") => rules.push(rule(
                            &group,
                            &[&resource],
                            &["get", "create", "patch", "delete"],
                            names.into_iter().collect(),
                        )),
                        ("apps", "deployments" | "statefulsets" | "daemonsets") => plain
                            .entry((group, &["get", "list", "watch", "create", "patch", "delete"]))
                            .or_default()
                            .push(resource),
                        _ => plain.entry((group, &["get", "create", "patch", "delete"])).or_default().push(resource),
                    }
                }
                if workload_namespaces.contains(&ns) {
                    plain.entry(("apps".into(), &["get", "list", "watch"])).or_default().push("replicasets".into());
                    plain.entry((String::new(), &["get", "list", "watch"])).or_default().push("pods".into());
                }
                for ((group, verbs), resources) in plain {
                    let resources: Vec<&str> = resources.iter().map(String::as_str).collect();
                    rules.push(rule(&group, &resources, verbs, Vec::new()));
                }
                (ns, rules)
            })
            .collect();
        AgentRbac { cluster: cluster_rules, namespaces }
    }

    /// ClusterRole, ClusterRoleBinding, and a Role and RoleBinding per namespace, all named
    /// [`AGENT_ROLE`] and bound to ServiceAccount `agent_namespace/`[`AGENT_ROLE`], as YAML
    /// documents (`deploy/rbac-operator.yaml`'s shape). Each of those namespaces comes first as
    /// a Namespace object: a Role can only be created in a namespace that exists, and on a
    /// cluster where the release never ran nothing else has created it yet — so the output
    /// applies as it is (`kubectl apply -f`), before the agent's first pass.
    pub fn to_yaml(&self, agent_namespace: &str) -> String {
        let labels = serde_json::json!({"app.kubernetes.io/name": AGENT_ROLE, super::LABEL_PART_OF: "fleetgate"});
        let subjects =
            serde_json::json!([{"kind": "ServiceAccount", "name": AGENT_ROLE, "namespace": agent_namespace}]);
        let meta = |ns: Option<&str>| {
            let mut m = serde_json::json!({"name": AGENT_ROLE, "labels": labels});
            if let Some(ns) = ns {
                m["namespace"] = ns.into();
            }
            m
        };
        let namespaces = self.namespaces.keys().map(|ns| {
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": {super::LABEL_PART_OF: "fleetgate"}}})
        });
        let mut docs: Vec<serde_json::Value> = namespaces.collect();
        docs.extend([
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": meta(None), "rules": self.cluster}),
            serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": meta(None), "subjects": subjects,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": AGENT_ROLE}}),
        ]);
        for (ns, rules) in &self.namespaces {
            docs.push(serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": meta(Some(ns)), "rules": rules}));
            docs.push(serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": meta(Some(ns)), "subjects": subjects,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AGENT_ROLE}}));
        }
        docs.iter()
            .map(|d| serde_saphyr::to_string(d).expect("RBAC objects serialize"))
            .collect::<Vec<_>>()
            .join("---\n")
    }
}

/// The resource name of a built-in kind (Kubernetes' own lower-case plural guess, which matches
/// every built-in kind a release carries).
fn plural_of(gvk: &GroupVersionKind) -> String {
    ApiResource::from_gvk(gvk).plural
}

/// Every [`Grant`] of a list of rules: two rule lists grant the
/// same when these sets are equal, however the rules are grouped.
fn grants(namespace: &str, rules: &[PolicyRule]) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for r in rules {
        let names = r.resource_names.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| vec![String::new()]);
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    for n in &names {
                        out.insert((namespace.to_string(), g.clone(), res.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
    out
}

/// One grant: (namespace or "" for cluster-wide, API group, resource, verb, name or "").
pub type Grant = (String, String, String, String, String);

/// The grants of every ClusterRole and Role in YAML `text` (other documents are skipped), to
/// compare RBAC files however their rules are grouped.
pub fn yaml_grants(file: &str, text: &str) -> Result<BTreeSet<Grant>, ParseError> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
    let mut out = BTreeSet::new();
    let as_yaml = |e: serde_json::Error| ParseError::Invalid { at: Location::file(file), message: e.to_string() };
    for v in parse_multi(file, text)? {
        match v["kind"].as_str() {
            Some("ClusterRole") => {
                let r: ClusterRole = serde_json::from_value(v).map_err(as_yaml)?;
                out.extend(grants("", &r.rules.unwrap_or_default()));
            }
            Some("Role") => {
                let r: Role = serde_json::from_value(v).map_err(as_yaml)?;
                out.extend(grants(r.metadata.namespace.as_deref().unwrap_or_default(), &r.rules.unwrap_or_default()));
            }
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifests::tests::release;

    /// The template Operator's manifest files, as a release holds them.
    fn template_set() -> ManifestSet {
        let files: Vec<(String, String)> = fleetgate_testenv::template_operator_files()
            .into_iter()
            .map(|(p, b)| (p, String::from_utf8(b).unwrap()))
            .collect();
        let refs: Vec<(&str, &str)> = files.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
        ManifestSet::from_release(&release(&refs), &builtin_scope).unwrap()
    }

    #[test]
    fn the_template_release_needs_exactly_what_deploy_grants() {
        let generated = AgentRbac::for_release(&template_set()).to_yaml("fleetgate-system");
        let shipped = include_str!("../../deploy/rbac-operator.yaml");
        let (g, s) = (yaml_grants("generated", &generated).unwrap(), yaml_grants("shipped", shipped).unwrap());
        let missing: Vec<_> = g.difference(&s).collect();
        let extra: Vec<_> = s.difference(&g).collect();
        assert!(missing.is_empty() && extra.is_empty(), "deploy/ lacks {missing:#?}\ndeploy/ grants more: {extra:#?}");
    }

    #[test]
    fn the_output_creates_each_namespace_before_the_role_in_it() {
        let yaml = AgentRbac::for_release(&template_set()).to_yaml("fleetgate-system");
        let kinds: Vec<(String, String)> = parse_multi("rbac.yaml", &yaml)
            .unwrap()
            .into_iter()
            .map(|v| (v["kind"].as_str().unwrap().to_string(), v["metadata"]["name"].as_str().unwrap().to_string()))
            .collect();
        let namespace = kinds.iter().position(|k| k == &("Namespace".to_string(), "redis-system".to_string()));
        let role = kinds.iter().position(|(kind, _)| kind == "Role");
        assert!(matches!((namespace, role), (Some(n), Some(r)) if n < r), "{kinds:?}");
    }

    #[test]
    fn cluster_scoped_objects_are_granted_by_name_and_escalation_only_for_own_roles() {
        let rbac = AgentRbac::for_release(&template_set());
        for r in &rbac.cluster {
            let resources = r.resources.clone().unwrap_or_default();
            // Reading every role is what admission needs to judge a binding by the bound role.
            let reads_roles = resources == ["clusterroles", "roles"] && r.verbs == ["get"];
            if resources != ["nodes"] && resources != ["redisclusters"] && !reads_roles {
                assert!(r.resource_names.is_some(), "{r:?}");
            }
            if r.verbs.iter().any(|v| v == "escalate" || v == "bind") {
                assert_eq!(r.resource_names.as_deref(), Some(&["redis-operator".to_string()][..]));
            }
            assert!(!r.verbs.iter().any(|v| v == "*") && !resources.iter().any(|x| x == "*"), "{r:?}");
        }
        assert_eq!(rbac.namespaces.keys().collect::<Vec<_>>(), ["redis-system"]);
    }
}
