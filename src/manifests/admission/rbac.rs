//! RBAC by content: what a Role or ClusterRole grants (wildcards, `escalate`, `bind`,
//! `impersonate`, cluster-wide Secrets, `nodes/proxy`, `serviceaccounts/token`, aggregation,
//! exec into pods, creating pods cluster-wide, CSR approval and signing, writing admission
//! configuration — every grant of power is refused unless a policy names it) and
//! whom a RoleBinding or ClusterRoleBinding grants to (everyone, anonymous, `system:masters`) and
//! what: the built-in `cluster-admin`, `admin`, `edit` roles by name, a role the release defines
//! by that role's rules, and any other role by the rules the cluster has for it
//! ([`bound_live_role_refusals`]), the same rule-by-rule judgement ([`refused_grants`]).
//!
//! Matching follows the API server's RBAC authorizer: a rule grants a resource when its
//! apiGroups hold the group or `*` and its resources hold the resource, `*`, or `*/<subresource>`.

use super::Reason;
use crate::manifests::{Manifest, ObjectKey};
use crate::model::{RbacGrant, ReleaseAdmissionPolicySpec};
use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt;

pub(super) const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Built-in ClusterRoles no binding may grant unless every policy allows cluster-admin bindings:
/// each grants (nearly) everything in the namespaces it is bound in, or the whole cluster.
pub const PRIVILEGED_ROLES: [&str; 3] = ["cluster-admin", "admin", "edit"];

/// Subjects no binding may name, whatever the policy: everyone, every unauthenticated request,
/// the anonymous user, and the group that bypasses authorization.
pub const FORBIDDEN_SUBJECTS: [&str; 4] =
    ["system:authenticated", "system:unauthenticated", "system:anonymous", "system:masters"];

/// Kinds whose creation runs a Pod: (API group, resource).
const POD_MAKERS: [(&str, &str); 8] = [
    ("", "pods"),
    ("", "replicationcontrollers"),
    ("apps", "deployments"),
    ("apps", "daemonsets"),
    ("apps", "statefulsets"),
    ("apps", "replicasets"),
    ("batch", "jobs"),
    ("batch", "cronjobs"),
];

const ADMISSION_GROUP: &str = "admissionregistration.k8s.io";

/// What decides admission of every request: webhooks and admission policies.
const ADMISSION_CONFIGS: [&str; 6] = [
    "validatingwebhookconfigurations",
    "mutatingwebhookconfigurations",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicybindings",
];

/// `.group` for a resource named in a finding (nothing for the core group).
fn group_suffix(group: &str) -> String {
    if group.is_empty() { String::new() } else { format!(".{group}") }
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

/// One rule of a role, as lists of strings.
struct Rule<'v> {
    groups: Vec<&'v str>,
    resources: Vec<&'v str>,
    verbs: Vec<&'v str>,
    urls: Vec<&'v str>,
}

impl<'v> Rule<'v> {
    fn of(v: &'v Value) -> Self {
        Rule {
            groups: strings(v.get("apiGroups")),
            resources: strings(v.get("resources")),
            verbs: strings(v.get("verbs")),
            urls: strings(v.get("nonResourceURLs")),
        }
    }

    /// Whether the rule grants some verb on `resource` (`name` or `name/subresource`) of `group`.
    fn grants(&self, group: &str, resource: &str) -> bool {
        let sub = resource.split_once('/').map(|(_, s)| s);
        !self.verbs.is_empty()
            && self.groups.iter().any(|g| *g == group || *g == "*")
            && self
                .resources
                .iter()
                .any(|r| *r == "*" || *r == resource || sub.is_some_and(|s| r.strip_prefix("*/") == Some(s)))
    }

    /// Whether the rule grants one of `verbs` (or `*`) on `resource` of `group`.
    fn grants_verb(&self, group: &str, resource: &str, verbs: &[&str]) -> bool {
        self.grants(group, resource) && self.verbs.iter().any(|v| *v == "*" || verbs.contains(v))
    }

    /// Why the rule is a wildcard grant, if it is. `*` resources within groups the release's own
    /// CRDs define (and only those; see `SetFacts`) grant a known set: the operator's API, not
    /// the cluster's.
    fn wildcard(&self, own_groups: &BTreeSet<&str>) -> Option<String> {
        if self.verbs.contains(&"*") {
            return Some("verbs: [*]".into());
        }
        if self.groups.contains(&"*") {
            return Some("apiGroups: [*]".into());
        }
        if self.urls.contains(&"*") {
            return Some("nonResourceURLs: [*]".into());
        }
        let only_own = !self.groups.is_empty() && self.groups.iter().all(|g| own_groups.contains(g));
        let wild = self.resources.iter().find(|r| **r == "*" || r.starts_with("*/"));
        match wild {
            Some(r) if !only_own => Some(format!("resources: [{r}] in apiGroups {:?}", self.groups)),
            _ => None,
        }
    }

    /// Every grant of [`RbacGrant`] this rule makes (role kind decides `clusterSecrets`), with
    /// the part of the rule that makes it.
    fn findings(&self, cluster_role: bool, own_groups: &BTreeSet<&str>) -> Vec<(RbacGrant, String)> {
        let mut out = Vec::new();
        if let Some(what) = self.wildcard(own_groups) {
            out.push((RbacGrant::Wildcard, what));
        }
        for (verb, grant) in
            [("escalate", RbacGrant::Escalate), ("bind", RbacGrant::Bind), ("impersonate", RbacGrant::Impersonate)]
        {
            if self.verbs.contains(&verb) {
                out.push((grant, format!("verb {verb}")));
            }
        }
        if cluster_role && self.grants("", "secrets") {
            out.push((RbacGrant::ClusterSecrets, "secrets in a ClusterRole".into()));
        }
        if self.grants("", "nodes/proxy") {
            out.push((RbacGrant::NodesProxy, "nodes/proxy".into()));
        }
        if self.grants("", "serviceaccounts/token") {
            out.push((RbacGrant::ServiceAccountTokens, "serviceaccounts/token".into()));
        }
        if let Some(r) = ["pods/exec", "pods/attach", "pods/portforward"].into_iter().find(|r| self.grants("", r)) {
            out.push((RbacGrant::PodExec, r.into()));
        }
        let creates = |&&(group, resource): &&(&str, &str)| self.grants_verb(group, resource, &["create"]);
        if cluster_role && let Some((g, r)) = POD_MAKERS.iter().find(creates) {
            out.push((RbacGrant::ClusterPods, format!("create {r}{} in a ClusterRole", group_suffix(g))));
        }
        let approves = |r: &&&str| self.grants_verb("certificates.k8s.io", r, &["update", "patch", "approve", "sign"]);
        if let Some(r) = ["certificatesigningrequests/approval", "signers"].iter().find(approves) {
            out.push((RbacGrant::CertificateApproval, format!("{r}.certificates.k8s.io")));
        }
        let writes = |r: &&&str| self.grants_verb(ADMISSION_GROUP, r, &["create", "update", "patch", "delete"]);
        if let Some(r) = ADMISSION_CONFIGS.iter().find(writes) {
            out.push((RbacGrant::AdmissionConfig, format!("writes {r}.{ADMISSION_GROUP}")));
        }
        out
    }
}

/// Every grant of `rules` (a ClusterRole's when `cluster_role`, else a Role's) that `spec` does
/// not allow, rule by rule: (index in `rules`, grant, the part of the rule that makes it).
fn refused_grants<'a>(
    spec: &'a ReleaseAdmissionPolicySpec,
    rules: &'a [Value],
    cluster_role: bool,
    own_groups: &'a BTreeSet<&str>,
) -> impl Iterator<Item = (usize, RbacGrant, String)> + 'a {
    rules.iter().enumerate().flat_map(move |(i, rule)| {
        Rule::of(rule)
            .findings(cluster_role, own_groups)
            .into_iter()
            .filter(|(grant, _)| !spec.allows_rbac(*grant))
            .map(move |(grant, what)| (i, grant, what))
    })
}

/// Every grant of Role or ClusterRole `m` that `spec` does not allow, rule by rule: opting in to
/// what an operator needs takes one policy change, not one release per grant.
pub(super) fn role_refusals(
    spec: &ReleaseAdmissionPolicySpec,
    m: &Manifest,
    own_groups: &BTreeSet<&str>,
) -> Vec<Reason> {
    let cluster_role = m.key.is(RBAC_GROUP, "ClusterRole");
    if !(cluster_role || m.key.is(RBAC_GROUP, "Role")) {
        return Vec::new();
    }
    let aggregated = cluster_role && m.object.data.get("aggregationRule").is_some_and(|a| !a.is_null());
    let aggregation = (aggregated && !spec.allows_rbac(RbacGrant::Aggregation)).then(|| Reason::Rbac {
        rule: None,
        grant: RbacGrant::Aggregation,
        what: "aggregationRule".into(),
    });
    let rules = m.object.data.get("rules").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let by_rule = refused_grants(spec, rules, cluster_role, own_groups).map(|(i, grant, what)| Reason::Rbac {
        rule: Some(i),
        grant,
        what,
    });
    aggregation.into_iter().chain(by_rule).collect()
}

/// Every grant that `spec` does not allow of `role`, a role a binding names and the release does
/// not define, by `rules`: what the cluster has for it. Judged like a role of the release, rule by
/// rule. Its `aggregationRule` is not a grant here: the live rules are what it aggregated.
pub(super) fn bound_live_role_refusals(
    spec: &ReleaseAdmissionPolicySpec,
    role: &BoundRole,
    rules: &[Value],
    own_groups: &BTreeSet<&str>,
) -> Vec<Reason> {
    refused_grants(spec, rules, role.is_cluster_role(), own_groups)
        .map(|(rule, grant, what)| Reason::BoundLiveRole { role: role.to_string(), rule, grant, what })
        .collect()
}

/// The role a RoleBinding or ClusterRoleBinding grants: a ClusterRole, or a Role in the
/// binding's namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BoundRole {
    /// The Role's namespace; None for a ClusterRole.
    pub namespace: Option<String>,
    pub name: String,
}

impl BoundRole {
    pub fn is_cluster_role(&self) -> bool {
        self.namespace.is_none()
    }

    /// The role as an object.
    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            group: RBAC_GROUP.into(),
            kind: if self.is_cluster_role() { "ClusterRole" } else { "Role" }.into(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// The role `m` binds, if `m` is a binding with a `roleRef` the API server would accept.
    pub fn of(m: &Manifest) -> Option<BoundRole> {
        if !is_binding(m) {
            return None;
        }
        let role_ref = m.object.data.get("roleRef")?;
        let field = |f: &str| role_ref.get(f).and_then(Value::as_str).unwrap_or("");
        let name = field("name").to_string();
        match field("kind") {
            "ClusterRole" => Some(BoundRole { namespace: None, name }),
            "Role" if m.key.is(RBAC_GROUP, "RoleBinding") => {
                Some(BoundRole { namespace: Some(m.key.namespace.clone()?), name })
            }
            _ => None,
        }
    }

    /// The role `m` is, if `m` is a Role or ClusterRole.
    pub fn defined_by(m: &Manifest) -> Option<BoundRole> {
        let name = m.key.name.clone();
        if m.key.is(RBAC_GROUP, "ClusterRole") {
            Some(BoundRole { namespace: None, name })
        } else if m.key.is(RBAC_GROUP, "Role") {
            Some(BoundRole { namespace: Some(m.key.namespace.clone()?), name })
        } else {
            None
        }
    }
}

impl fmt::Display for BoundRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            None => write!(f, "ClusterRole {}", self.name),
            Some(ns) => write!(f, "Role {ns}/{}", self.name),
        }
    }
}

/// The role binding `m` grants when it must be judged by what the cluster has: a role outside
/// `defined` (the roles of the release) and not one of [`PRIVILEGED_ROLES`], refused by name.
pub(super) fn role_outside(m: &Manifest, defined: &BTreeSet<BoundRole>) -> Option<BoundRole> {
    BoundRole::of(m).filter(|r| {
        let privileged = r.is_cluster_role() && PRIVILEGED_ROLES.contains(&r.name.as_str());
        !privileged && !defined.contains(r)
    })
}

/// A RoleBinding or ClusterRoleBinding to a subject no policy may allow.
pub(super) fn forbidden_subject(m: &Manifest) -> Option<Reason> {
    if !is_binding(m) {
        return None;
    }
    let subjects = m.object.data.get("subjects").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    subjects.iter().find_map(|s| {
        let name = s.get("name").and_then(Value::as_str).unwrap_or("");
        let kind = s.get("kind").and_then(Value::as_str).unwrap_or("");
        FORBIDDEN_SUBJECTS.contains(&name).then(|| Reason::BindingSubject(format!("{kind} {name}")))
    })
}

/// A binding of a built-in privileged ClusterRole that `spec` does not allow.
pub(super) fn privileged_role_refusal(spec: &ReleaseAdmissionPolicySpec, m: &Manifest) -> Option<Reason> {
    if spec.allow_cluster_admin_bindings {
        return None;
    }
    BoundRole::of(m)
        .filter(|r| r.is_cluster_role() && PRIVILEGED_ROLES.contains(&r.name.as_str()))
        .map(|r| Reason::PrivilegedRole(r.name))
}

fn is_binding(m: &Manifest) -> bool {
    m.key.is(RBAC_GROUP, "RoleBinding") || m.key.is(RBAC_GROUP, "ClusterRoleBinding")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    #[rstest]
    #[case::plain(json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}), true, vec![])]
    #[case::star_verbs(json!({"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["*"]}), false, vec![RbacGrant::Wildcard])]
    #[case::star_groups(json!({"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]}), false, vec![RbacGrant::Wildcard])]
    #[case::star_resources(json!({"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}), true, vec![RbacGrant::Wildcard, RbacGrant::ClusterSecrets, RbacGrant::NodesProxy, RbacGrant::ServiceAccountTokens, RbacGrant::PodExec])]
    #[case::star_in_own_group(json!({"apiGroups": ["example.com"], "resources": ["*", "*/status"], "verbs": ["get"]}), true, vec![])]
    #[case::star_in_own_and_core(json!({"apiGroups": ["example.com", ""], "resources": ["*"], "verbs": ["get"]}), false, vec![RbacGrant::Wildcard, RbacGrant::NodesProxy, RbacGrant::ServiceAccountTokens, RbacGrant::PodExec])]
    #[case::star_urls(json!({"nonResourceURLs": ["*"], "verbs": ["get"]}), true, vec![RbacGrant::Wildcard])]
    #[case::escalate_bind(json!({"apiGroups": [RBAC_GROUP], "resources": ["roles"], "verbs": ["escalate", "bind"]}), false, vec![RbacGrant::Escalate, RbacGrant::Bind])]
    #[case::impersonate(json!({"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"]}), true, vec![RbacGrant::Impersonate])]
    #[case::secrets_cluster(json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}), true, vec![RbacGrant::ClusterSecrets])]
    #[case::secrets_role(json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}), false, vec![])]
    #[case::secrets_other_group(json!({"apiGroups": ["example.com"], "resources": ["secrets"], "verbs": ["get"]}), true, vec![])]
    #[case::nodes_proxy(json!({"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}), true, vec![RbacGrant::NodesProxy])]
    #[case::any_proxy(json!({"apiGroups": [""], "resources": ["*/proxy"], "verbs": ["get"]}), true, vec![RbacGrant::Wildcard, RbacGrant::NodesProxy])]
    #[case::nodes_only(json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}), true, vec![])]
    #[case::sa_token(json!({"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}), false, vec![RbacGrant::ServiceAccountTokens])]
    #[case::no_verbs(json!({"apiGroups": [""], "resources": ["secrets"], "verbs": []}), true, vec![])]
    #[case::exec(json!({"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]}), false, vec![RbacGrant::PodExec])]
    #[case::portforward(json!({"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get"]}), false, vec![RbacGrant::PodExec])]
    #[case::pods_read(json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}), true, vec![])]
    #[case::pods_created_in_a_role(json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}), false, vec![])]
    #[case::pods_created_cluster_wide(json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}), true, vec![RbacGrant::ClusterPods])]
    #[case::statefulsets_cluster_wide(json!({"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["*"]}), true, vec![RbacGrant::Wildcard, RbacGrant::ClusterPods])]
    #[case::csr_approval(json!({"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval"], "verbs": ["update"]}), true, vec![RbacGrant::CertificateApproval])]
    #[case::csr_read(json!({"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["get"]}), true, vec![])]
    #[case::signers(json!({"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "verbs": ["sign"]}), true, vec![RbacGrant::CertificateApproval])]
    #[case::webhook_config(json!({"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"], "verbs": ["patch"]}), true, vec![RbacGrant::AdmissionConfig])]
    #[case::webhook_config_read(json!({"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"], "verbs": ["get", "list", "watch"]}), true, vec![])]
    fn rule_findings(#[case] rule: Value, #[case] cluster_role: bool, #[case] expected: Vec<RbacGrant>) {
        let own = BTreeSet::from(["example.com"]);
        let found: Vec<RbacGrant> = Rule::of(&rule).findings(cluster_role, &own).into_iter().map(|(g, _)| g).collect();
        assert_eq!(found, expected);
    }

    fn role(yaml: &str) -> crate::manifests::ManifestSet {
        use crate::manifests::tests::{release_in, scopes};
        crate::manifests::ManifestSet::from_release(&release_in(Some("ns"), &[("operator/r.yaml", yaml)]), &scopes)
            .unwrap()
    }

    #[test]
    fn a_live_role_is_judged_rule_by_rule_as_its_kind() {
        let rules = [
            json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}),
            json!({"apiGroups": [RBAC_GROUP], "resources": ["clusterroles"], "verbs": ["escalate", "bind"]}),
        ];
        let spec = ReleaseAdmissionPolicySpec { allowed_rbac: vec![RbacGrant::Bind], ..Default::default() };
        let cluster_role = BoundRole { namespace: None, name: "r".into() };
        let reason = |rule, grant, what: &str| Reason::BoundLiveRole {
            role: "ClusterRole r".into(),
            rule,
            grant,
            what: what.into(),
        };
        assert_eq!(
            bound_live_role_refusals(&spec, &cluster_role, &rules, &BTreeSet::new()),
            [
                reason(0, RbacGrant::ClusterSecrets, "secrets in a ClusterRole"),
                reason(1, RbacGrant::Escalate, "verb escalate")
            ]
        );
        // Secrets in a Role reach its namespace only, as for a Role of the release.
        let role = BoundRole { namespace: Some("ns".into()), name: "r".into() };
        let found = bound_live_role_refusals(&spec, &role, &rules, &BTreeSet::new());
        assert_eq!(found.len(), 1);
        assert!(
            matches!(&found[0], Reason::BoundLiveRole { role, rule: 1, grant: RbacGrant::Escalate, .. } if role == "Role ns/r")
        );
    }

    #[rstest]
    #[case::cluster_role_binding("ClusterRoleBinding", "{name: b}", "ClusterRole", Some(BoundRole { namespace: None, name: "x".into() }))]
    #[case::role_binding_of_a_cluster_role("RoleBinding", "{name: b}", "ClusterRole", Some(BoundRole { namespace: None, name: "x".into() }))]
    #[case::role_binding_of_a_role("RoleBinding", "{name: b, namespace: team}", "Role", Some(BoundRole { namespace: Some("team".into()), name: "x".into() }))]
    #[case::role_binding_default_namespace("RoleBinding", "{name: b}", "Role", Some(BoundRole { namespace: Some("ns".into()), name: "x".into() }))]
    // The API server refuses a ClusterRoleBinding of a Role: nothing to judge.
    #[case::cluster_role_binding_of_a_role("ClusterRoleBinding", "{name: b}", "Role", None)]
    fn the_role_a_binding_grants(
        #[case] kind: &str,
        #[case] meta: &str,
        #[case] ref_kind: &str,
        #[case] expected: Option<BoundRole>,
    ) {
        let set = role(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: {kind}\nmetadata: {meta}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: {ref_kind}, name: x}}\n"
        ));
        assert_eq!(BoundRole::of(set.iter().next().unwrap()), expected);
    }

    #[test]
    fn every_refused_grant_of_every_rule_is_reported() {
        let set = role(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\nrules:\n\
             - {apiGroups: ['*'], resources: [pods], verbs: [get, impersonate]}\n\
             - {apiGroups: [apps], resources: [deployments], verbs: [get]}\n\
             - {apiGroups: [''], resources: [nodes/proxy, serviceaccounts/token], verbs: [get]}\n",
        );
        let m = set.iter().next().unwrap();
        let spec = ReleaseAdmissionPolicySpec { allowed_rbac: vec![RbacGrant::Impersonate], ..Default::default() };
        let found: Vec<(Option<usize>, RbacGrant)> = role_refusals(&spec, m, &BTreeSet::new())
            .into_iter()
            .map(|r| match r {
                Reason::Rbac { rule, grant, .. } => (rule, grant),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            found,
            [
                (Some(0), RbacGrant::Wildcard),
                (Some(2), RbacGrant::NodesProxy),
                (Some(2), RbacGrant::ServiceAccountTokens)
            ]
        );
    }
}
