//! The `ReleaseAdmissionPolicy` check: pure, over a [`ManifestSet`], before anything touches a
//! cluster.
//!
//! The effective policy is the agent's baseline narrowed by the repo's policies: an object is
//! admitted only when every policy admits it, so a repo policy can never widen the baseline.
//! Each violation names the object, where it came from, the policy that refused it and why.

use super::{Manifest, ManifestSet, ObjectKey, Source};
use crate::model::{ReleaseAdmissionPolicy, ReleaseAdmissionPolicySpec};
use kube::discovery::Scope;
use std::fmt;

/// The ClusterRole no release may bind unless every policy allows it.
pub const CLUSTER_ADMIN: &str = "cluster-admin";
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// The baseline from the agent's configuration plus the repo policies that narrow it.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionPolicy {
    /// (origin, spec) — origin names the policy in violations.
    policies: Vec<(String, ReleaseAdmissionPolicySpec)>,
}

impl AdmissionPolicy {
    /// The agent configuration's baseline: the upper bound of what any release may do.
    pub fn baseline(spec: ReleaseAdmissionPolicySpec) -> Self {
        AdmissionPolicy { policies: vec![("agent baseline".to_string(), spec)] }
    }

    /// Adds a repo policy. It can only narrow: every policy must admit an object.
    pub fn narrowed_by(mut self, policy: &ReleaseAdmissionPolicy) -> Self {
        self.policies.push((format!("ReleaseAdmissionPolicy {}", policy.name()), policy.spec.clone()));
        self
    }

    /// Checks every object of `set`; returns every violation at once.
    pub fn check(&self, set: &ManifestSet) -> Result<(), AdmissionError> {
        let violations: Vec<Violation> = set
            .iter()
            .flat_map(|m| {
                self.policies.iter().filter_map(move |(origin, spec)| {
                    refusal(spec, m).map(|reason| Violation {
                        object: m.key.clone(),
                        source: m.source.clone(),
                        policy: origin.clone(),
                        reason,
                    })
                })
            })
            .collect();
        if violations.is_empty() { Ok(()) } else { Err(AdmissionError { violations }) }
    }
}

/// Why one policy refuses one object (the first rule it breaks).
fn refusal(spec: &ReleaseAdmissionPolicySpec, m: &Manifest) -> Option<Reason> {
    let key = &m.key;
    if key.is("", "Namespace") {
        return (!spec.allows_namespace(&key.name)).then(|| Reason::Namespace(key.name.clone()));
    }
    match (&m.scope, &key.namespace) {
        (Scope::Namespaced, Some(ns)) if !spec.allows_namespace(ns) => return Some(Reason::Namespace(ns.clone())),
        (Scope::Cluster, _) if !spec.allows_cluster_scoped_kind(&key.group, &key.kind) => {
            return Some(Reason::ClusterScopedKind(key.group_kind()));
        }
        _ => {}
    }
    (!spec.allow_cluster_admin_bindings && binds_cluster_admin(m)).then_some(Reason::ClusterAdminBinding)
}

fn binds_cluster_admin(m: &Manifest) -> bool {
    if !(m.key.is(RBAC_GROUP, "RoleBinding") || m.key.is(RBAC_GROUP, "ClusterRoleBinding")) {
        return false;
    }
    let role_ref = m.object.data.get("roleRef");
    let field = |f: &str| role_ref.and_then(|r| r.get(f)).and_then(|v| v.as_str()).unwrap_or("");
    field("kind") == "ClusterRole" && field("name") == CLUSTER_ADMIN
}

/// What rule an object breaks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "rule", content = "value")]
pub enum Reason {
    /// The object is in (or is) a namespace outside `allowedNamespaces`.
    Namespace(String),
    /// The object is of a cluster-scoped kind outside `allowedClusterScopedKinds`.
    ClusterScopedKind(String),
    /// The object binds the `cluster-admin` ClusterRole and `allowClusterAdminBindings` is false.
    ClusterAdminBinding,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Namespace(ns) => write!(f, "namespace {ns} is not in allowedNamespaces"),
            Reason::ClusterScopedKind(k) => write!(f, "cluster-scoped kind {k} is not in allowedClusterScopedKinds"),
            Reason::ClusterAdminBinding => {
                write!(f, "binds ClusterRole {CLUSTER_ADMIN} and allowClusterAdminBindings is false")
            }
        }
    }
}

/// One object one policy refuses.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Violation {
    pub object: ObjectKey,
    pub source: Source,
    pub policy: String,
    pub reason: Reason,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {} — refused by {}", self.object, self.source, self.reason, self.policy)
    }
}

/// The release is refused as a whole; every violation is listed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("release refused by admission policy ({} violation(s)):\n  {}", .violations.len(), .violations.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("\n  "))]
pub struct AdmissionError {
    pub violations: Vec<Violation>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifests::tests::{release, scopes};
    use crate::model::Document;
    use rstest::rstest;

    fn spec(namespaces: Option<&[&str]>, kinds: Option<&[&str]>, admin: bool) -> ReleaseAdmissionPolicySpec {
        let owned = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        ReleaseAdmissionPolicySpec {
            allowed_namespaces: namespaces.map(owned),
            allowed_cluster_scoped_kinds: kinds.map(owned),
            allow_cluster_admin_bindings: admin,
        }
    }

    fn set(yaml: &str) -> ManifestSet {
        ManifestSet::from_release(&release(&[("operator/x.yaml", yaml)]), Some("redis-system"), &scopes).unwrap()
    }

    const CONFIGMAP: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n";
    const OTHER_NS: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: kube-system}\n";
    const NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: redis-a}\n";
    const CLUSTER_ROLE: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\n";
    const ADMIN_CRB: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: b}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\nsubjects: [{kind: ServiceAccount, name: op, namespace: redis-system}]\n";
    const ADMIN_RB: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: b}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\n";
    const VIEW_RB: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: b}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}\n";

    const CRB: &str = "ClusterRoleBinding.rbac.authorization.k8s.io";
    const CR: &str = "ClusterRole.rbac.authorization.k8s.io";

    #[rstest]
    #[case::default_namespace_allowed(CONFIGMAP, spec(Some(&["redis-system"]), Some(&[]), false), None)]
    #[case::other_namespace(OTHER_NS, spec(Some(&["redis-*"]), None, false), Some(Reason::Namespace("kube-system".into())))]
    #[case::namespace_object_by_name(NAMESPACE, spec(Some(&["redis-*"]), Some(&[]), false), None)]
    #[case::namespace_object_refused(NAMESPACE, spec(Some(&["redis-system"]), None, false), Some(Reason::Namespace("redis-a".into())))]
    #[case::cluster_kind_allowed(CLUSTER_ROLE, spec(None, Some(&[CR]), false), None)]
    #[case::cluster_kind_refused(CLUSTER_ROLE, spec(None, Some(&[CRB]), false), Some(Reason::ClusterScopedKind(CR.into())))]
    #[case::no_kinds_field_means_any(CLUSTER_ROLE, spec(Some(&[]), None, false), None)]
    #[case::cluster_admin_crb(ADMIN_CRB, spec(None, None, false), Some(Reason::ClusterAdminBinding))]
    #[case::cluster_admin_crb_allowed(ADMIN_CRB, spec(None, None, true), None)]
    #[case::cluster_admin_rolebinding(ADMIN_RB, spec(None, None, false), Some(Reason::ClusterAdminBinding))]
    #[case::view_rolebinding(VIEW_RB, spec(None, None, false), None)]
    fn one_policy(#[case] yaml: &str, #[case] policy: ReleaseAdmissionPolicySpec, #[case] expected: Option<Reason>) {
        let result = AdmissionPolicy::baseline(policy).check(&set(yaml));
        assert_eq!(result.err().map(|e| e.violations[0].reason.clone()), expected);
    }

    #[rstest]
    // The repo lists a namespace the baseline does not: still refused, by the baseline.
    #[case::repo_cannot_widen_namespaces(OTHER_NS, spec(Some(&["redis-*"]), None, false), spec(Some(&["*"]), None, false), Some("agent baseline"))]
    #[case::repo_cannot_allow_cluster_admin(
        ADMIN_CRB,
        spec(None, None, false),
        spec(None, None, true),
        Some("agent baseline")
    )]
    #[case::repo_narrows_namespaces(CONFIGMAP, spec(Some(&["*"]), None, false), spec(Some(&["other"]), None, false), Some("ReleaseAdmissionPolicy repo"))]
    #[case::repo_narrows_kinds(CLUSTER_ROLE, spec(None, None, false), spec(None, Some(&[CRB]), false), Some("ReleaseAdmissionPolicy repo"))]
    #[case::repo_silent_on_field_keeps_baseline(CLUSTER_ROLE, spec(None, Some(&[CR]), false), spec(Some(&["redis-system"]), None, false), None)]
    #[case::cluster_admin_needs_both(ADMIN_CRB, spec(None, None, true), spec(None, None, true), None)]
    fn repo_policy_only_narrows(
        #[case] yaml: &str,
        #[case] baseline: ReleaseAdmissionPolicySpec,
        #[case] repo: ReleaseAdmissionPolicySpec,
        #[case] refused_by: Option<&str>,
    ) {
        let repo = Document::new("ReleaseAdmissionPolicy", "repo", repo);
        let result = AdmissionPolicy::baseline(baseline).narrowed_by(&repo).check(&set(yaml));
        assert_eq!(result.err().map(|e| e.violations[0].policy.clone()).as_deref(), refused_by);
    }

    #[test]
    fn names_every_offending_object() {
        let yaml = [OTHER_NS, CLUSTER_ROLE, ADMIN_CRB].join("---\n");
        let err = AdmissionPolicy::baseline(spec(Some(&["redis-system"]), Some(&[CRB]), false))
            .check(&set(&yaml))
            .unwrap_err();
        let named: Vec<String> = err.violations.iter().map(|v| v.object.to_string()).collect();
        assert_eq!(
            named,
            [
                "ClusterRole.rbac.authorization.k8s.io r",
                "ClusterRoleBinding.rbac.authorization.k8s.io b",
                "ConfigMap kube-system/c",
            ]
        );
        let text = err.to_string();
        assert!(text.contains("3 violation(s)"), "{text}");
        assert!(text.contains("ConfigMap kube-system/c (operator/x.yaml (document 1)): namespace kube-system is not in allowedNamespaces — refused by agent baseline"), "{text}");
    }
}
