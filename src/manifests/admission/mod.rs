//! The `ReleaseAdmissionPolicy` check: over a [`ManifestSet`] and what the live API serves
//! ([`LiveApi`]), before anything touches a cluster. It judges objects by content, not by name:
//!
//! * scope comes from live discovery (see [`ManifestSet::from_release`]), and a release's CRD may
//!   not define kinds in an API group the cluster already serves with resources that are neither
//!   the release's nor fleetgate's CRDs (a built-in group such as `admissionregistration.k8s.io`);
//! * namespaces and cluster-scoped kinds against the allow-lists;
//! * (Cluster)Roles by their rules and bindings by subject and role ([`rbac`]): a binding of a
//!   role the release does not define is judged by the rules the cluster has for that role
//!   ([`LiveApi::with_roles`]; [`roles_outside`] says which roles those are), and refused when
//!   the cluster has none, or prune deletes it after the apply;
//! * pod templates against a Pod Security Standards level ([`pod_security`]);
//! * admission webhook configurations by target and namespace selector ([`webhooks`]);
//! * adoption: [`AdmissionPolicy::unmanaged`] says whether a live object fleetgate did not
//!   apply may be taken over (the apply engine asks it once it has seen the live objects).
//!
//! The effective policy is the agent's baseline narrowed by the repo's policies: an object is
//! admitted only when every policy admits it, so a repo policy can never widen the baseline.
//! Rules no policy can lift (subjects such as `system:masters`, CRDs in served groups) are
//! reported as refused by [`FIXED_RULES`]. Each violation names the object, where it came from,
//! the policy that refused it and the rule. An object is judged by every rule at once (every
//! refused grant of every RBAC rule, every webhook, its namespace or kind, its pod template), so
//! one refusal says everything a release would have to change; [`fixes`] turns the violations
//! into the policy lines that would admit them.

pub mod fixes;
mod pod_security;
mod rbac;
mod webhooks;

pub use pod_security::PodFinding;
pub use rbac::{BoundRole, FORBIDDEN_SUBJECTS, PRIVILEGED_ROLES};
pub use webhooks::{NAMESPACE_NAME_LABEL, WebhookFinding};

use super::{CRD_GROUP, CRD_KIND, Manifest, ManifestSet, ObjectKey, Source};
use crate::model::{PodSecurityLevel, RbacGrant, ReleaseAdmissionPolicy, ReleaseAdmissionPolicySpec};
use kube::discovery::Scope;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Annotation on an object of a release that lets the release take over the live object of
/// that name although fleetgate did not apply it (value `"true"`).
pub const ANNOTATION_ADOPT: &str = "fleetgate.io/adopt";

/// The "policy" named by violations of rules no policy can lift.
pub const FIXED_RULES: &str = "fleetgate's fixed rules";

/// What admission needs to know about the live cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveApi {
    /// API group → resources (plural names) the cluster serves in it.
    served: BTreeMap<String, BTreeSet<String>>,
    /// Names of the CRDs fleetgate applied here before (its inventory).
    fleetgate_crds: BTreeSet<String>,
    /// Namespaces no webhook may intercept: the agent's and `kube-system`.
    protected_namespaces: Vec<String>,
    /// The cluster's roles that bindings name outside their release ([`roles_outside`]): role →
    /// its `rules`, absent when the cluster has no such role. None without a cluster: those
    /// bindings are judged when the agent applies.
    roles: Option<BTreeMap<BoundRole, Vec<serde_json::Value>>>,
    /// Roles the cluster has now that prune deletes once the release is applied (an earlier
    /// release of fleetgate's defined them): a binding of one would outlive its role.
    pruned_roles: BTreeSet<BoundRole>,
}

impl LiveApi {
    /// From a discovery of the cluster, the CRDs in fleetgate's inventory and the agent's namespace.
    pub fn from_discovery(
        discovery: &kube::Discovery,
        fleetgate_crds: impl IntoIterator<Item = String>,
        agent_namespace: &str,
    ) -> Self {
        let served = discovery
            .groups()
            .map(|g| {
                let plurals = g.versions().flat_map(|v| g.versioned_resources(v)).map(|(ar, _)| ar.plural).collect();
                (g.name().to_string(), plurals)
            })
            .collect();
        LiveApi { served, ..LiveApi::offline(fleetgate_crds, agent_namespace) }
    }

    /// Without a cluster (`fleetgate validate`, unit tests): only the built-in groups are known.
    pub fn offline(fleetgate_crds: impl IntoIterator<Item = String>, agent_namespace: &str) -> Self {
        LiveApi {
            served: BTreeMap::new(),
            fleetgate_crds: fleetgate_crds.into_iter().collect(),
            protected_namespaces: vec![agent_namespace.to_string(), "kube-system".to_string()],
            roles: None,
            pruned_roles: BTreeSet::new(),
        }
    }

    /// With what the cluster has of the roles [`roles_outside`] names: role → its `rules`. A role
    /// left out is one the cluster does not have, or that is in `pruned` (prune deletes it after
    /// the apply), and a binding of it is refused.
    pub fn with_roles(self, roles: BTreeMap<BoundRole, Vec<serde_json::Value>>, pruned: BTreeSet<BoundRole>) -> Self {
        LiveApi { roles: Some(roles), pruned_roles: pruned, ..self }
    }

    /// Who else serves API `group`, if anyone: the built-in API, or a resource the cluster serves
    /// in it that is neither one of `release_crds` nor a CRD fleetgate applied.
    fn serves_otherwise(&self, group: &str, release_crds: &BTreeSet<String>) -> Option<String> {
        if group.is_empty() || super::BUILTIN_GROUPS.contains(&group) {
            return Some("a built-in API group".into());
        }
        let foreign = self.served.get(group)?.iter().find(|plural| {
            let crd = format!("{plural}.{group}");
            !release_crds.contains(&crd) && !self.fleetgate_crds.contains(&crd)
        })?;
        Some(format!("it serves resource {foreign} there, which is not a CRD of this release or of fleetgate"))
    }
}

/// The baseline from the agent's configuration plus the repo policies that narrow it.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionPolicy {
    /// (origin, spec) — origin names the policy in violations.
    policies: Vec<(PolicyOrigin, ReleaseAdmissionPolicySpec)>,
}

/// Which policy refused: the agent's baseline, or a repo `ReleaseAdmissionPolicy` by name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "camelCase")]
pub enum PolicyOrigin {
    Baseline,
    Repo(String),
}

impl fmt::Display for PolicyOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyOrigin::Baseline => f.write_str("agent baseline"),
            PolicyOrigin::Repo(name) => write!(f, "ReleaseAdmissionPolicy {name}"),
        }
    }
}

/// What the rules of one object need from the set they belong to.
struct SetFacts<'s> {
    /// API groups the set's CRDs define, and those of CRDs fleetgate applied here before.
    own_groups: BTreeSet<&'s str>,
    /// Names of the set's CRDs.
    crd_names: BTreeSet<String>,
    /// The (Cluster)Roles the set defines: a binding of one is judged by the role's own rules.
    roles: BTreeSet<BoundRole>,
}

/// The roles bindings of `set` grant that `set` does not define (nor are refused by name, see
/// [`PRIVILEGED_ROLES`]): what the agent reads from the cluster for [`LiveApi::with_roles`].
pub fn roles_outside(set: &ManifestSet) -> BTreeSet<BoundRole> {
    let defined = defined_roles(set);
    set.iter().filter_map(|m| rbac::role_outside(m, &defined)).collect()
}

fn defined_roles(set: &ManifestSet) -> BTreeSet<BoundRole> {
    set.iter().filter_map(BoundRole::defined_by).collect()
}

impl AdmissionPolicy {
    /// The agent configuration's baseline: the upper bound of what any release may do.
    pub fn baseline(spec: ReleaseAdmissionPolicySpec) -> Self {
        AdmissionPolicy { policies: vec![(PolicyOrigin::Baseline, spec)] }
    }

    /// The effective policy of a release: `baseline` narrowed by every one of `repo` (the
    /// `ReleaseAdmissionPolicy` documents of the release's tree).
    pub fn effective(baseline: ReleaseAdmissionPolicySpec, repo: &[ReleaseAdmissionPolicy]) -> Self {
        repo.iter().fold(AdmissionPolicy::baseline(baseline), |p, r| p.narrowed_by(r))
    }

    /// Adds a repo policy. It can only narrow: every policy must admit an object.
    pub fn narrowed_by(mut self, policy: &ReleaseAdmissionPolicy) -> Self {
        self.policies.push((PolicyOrigin::Repo(policy.name().to_string()), policy.spec.clone()));
        self
    }

    /// Checks every object of `set` against the fixed rules and every policy; returns every
    /// violation at once.
    pub fn check(&self, set: &ManifestSet, live: &LiveApi) -> Result<(), AdmissionError> {
        // A CRD fleetgate applied before and the release dropped is still live (CRD prune is
        // off by default): its group is still the release's own.
        let applied_groups = live.fleetgate_crds.iter().filter_map(|name| name.split_once('.').map(|(_, g)| g));
        let facts = SetFacts {
            own_groups: set.crds().iter().map(|c| c.spec.group.as_str()).chain(applied_groups).collect(),
            crd_names: set.crds().iter().filter_map(|c| c.metadata.name.clone()).collect(),
            roles: defined_roles(set),
        };
        let violation = |m: &Manifest, policy: String, reason: Reason| Violation {
            object: m.key.clone(),
            source: m.source.clone(),
            policy,
            reason,
        };
        let violations: Vec<Violation> = set
            .iter()
            .flat_map(|m| {
                let fixed = fixed_refusals(m, live, &facts).map(|r| violation(m, FIXED_RULES.to_string(), r));
                let by_policy = self.policies.iter().flat_map(|(origin, spec)| {
                    refusals(spec, m, live, &facts)
                        .into_iter()
                        .map(move |reason| violation(m, origin.to_string(), reason))
                });
                fixed.into_iter().chain(by_policy).collect::<Vec<_>>()
            })
            .collect();
        if violations.is_empty() { Ok(()) } else { Err(AdmissionError { violations }) }
    }

    /// Whether the release may take over live object `m` that fleetgate did not apply: when `m`
    /// carries [`ANNOTATION_ADOPT`] `"true"`, or every policy says `adopt: true`. Otherwise the
    /// violation, naming the first policy that does not.
    pub fn unmanaged(&self, m: &Manifest) -> Option<Violation> {
        let annotated = m.object.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_ADOPT));
        if annotated.is_some_and(|v| v == "true") {
            return None;
        }
        let (origin, _) = self.policies.iter().find(|(_, spec)| !spec.adopt)?;
        Some(Violation {
            object: m.key.clone(),
            source: m.source.clone(),
            policy: origin.to_string(),
            reason: Reason::Unmanaged,
        })
    }
}

/// The rules no policy can lift that `m` breaks.
fn fixed_refusals(m: &Manifest, live: &LiveApi, facts: &SetFacts) -> impl Iterator<Item = Reason> {
    let crd_group = m.key.is(CRD_GROUP, CRD_KIND).then(|| {
        let group = m.object.data.get("spec").and_then(|s| s.get("group")).and_then(|g| g.as_str()).unwrap_or("");
        live.serves_otherwise(group, &facts.crd_names).map(|by| Reason::CrdGroupServed { group: group.to_string(), by })
    });
    // A binding of a role nobody has yet grants whatever whoever creates it later writes into it.
    let missing = live.roles.as_ref().and_then(|roles| {
        rbac::role_outside(m, &facts.roles)
            .filter(|r| !roles.contains_key(r))
            .map(|r| Reason::BoundRoleMissing { pruned: live.pruned_roles.contains(&r), role: r.to_string() })
    });
    crd_group.flatten().into_iter().chain(rbac::forbidden_subject(m)).chain(missing)
}

/// Every rule of one policy that one object breaks.
fn refusals(spec: &ReleaseAdmissionPolicySpec, m: &Manifest, live: &LiveApi, facts: &SetFacts) -> Vec<Reason> {
    let key = &m.key;
    if key.is("", "Namespace") {
        return (!spec.allows_namespace(&key.name)).then(|| Reason::Namespace(key.name.clone())).into_iter().collect();
    }
    let place = match (&m.scope, &key.namespace) {
        (Scope::Namespaced, Some(ns)) if !spec.allows_namespace(ns) => Some(Reason::Namespace(ns.clone())),
        (Scope::Cluster, _) if !spec.allows_cluster_scoped_kind(&key.group, &key.kind) => {
            Some(Reason::ClusterScopedKind(key.group_kind()))
        }
        _ => None,
    };
    let level = spec.pod_security_level();
    let pods = pod_security::check(level, m).map(|finding| {
        // The strictest level that admits the template: what a policy would have to say.
        let lifted_by =
            if level == PodSecurityLevel::Restricted && pod_security::check(PodSecurityLevel::Baseline, m).is_none() {
                PodSecurityLevel::Baseline
            } else {
                PodSecurityLevel::Privileged
            };
        Reason::PodSecurity { level, finding, lifted_by }
    });
    let live_role = rbac::role_outside(m, &facts.roles)
        .and_then(|r| live.roles.as_ref()?.get(&r).map(|rules| (r, rules)))
        .map(|(r, rules)| rbac::bound_live_role_refusals(spec, &r, rules, &facts.own_groups));
    place
        .into_iter()
        .chain(rbac::privileged_role_refusal(spec, m))
        .chain(rbac::role_refusals(spec, m, &facts.own_groups))
        .chain(live_role.into_iter().flatten())
        .chain(pods)
        .chain(webhooks::check(spec, m, &live.protected_namespaces, &facts.own_groups).into_iter().map(Reason::Webhook))
        .collect()
}

/// What rule an object breaks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "rule", content = "value")]
pub enum Reason {
    /// The object is in (or is) a namespace outside `allowedNamespaces`.
    Namespace(String),
    /// The object is of a cluster-scoped kind outside `allowedClusterScopedKinds`.
    ClusterScopedKind(String),
    /// The object binds a ClusterRole of [`PRIVILEGED_ROLES`] and `allowClusterAdminBindings`
    /// is false.
    PrivilegedRole(String),
    /// The binding names a subject of [`FORBIDDEN_SUBJECTS`] (`Kind name`).
    BindingSubject(String),
    /// A (Cluster)Role grants what `allowedRbac` does not list; `rule` is the index in `rules`
    /// (None for the role as a whole: an aggregationRule).
    Rbac { rule: Option<usize>, grant: RbacGrant, what: String },
    /// The binding grants `role` (`ClusterRole NAME`, `Role NAMESPACE/NAME`), which the release
    /// does not define, and the cluster's rules of that role grant what `allowedRbac` does not
    /// list; `rule` is the index in the live role's `rules`.
    BoundLiveRole { role: String, rule: usize, grant: RbacGrant, what: String },
    /// The binding grants `role`, which neither the release defines nor the cluster has (or will
    /// have: `pruned`, an earlier release defined it and prune deletes it after this one).
    BoundRoleMissing { role: String, pruned: bool },
    /// A pod template breaks the Pod Security level (`finding` is the first field that does);
    /// `lifted_by` is the strictest level that admits the template.
    PodSecurity { level: PodSecurityLevel, finding: PodFinding, lifted_by: PodSecurityLevel },
    /// An admission webhook calls a URL, a Service outside the bounds, or intercepts a protected
    /// namespace.
    Webhook(WebhookFinding),
    /// A CRD in an API group the cluster already serves otherwise.
    CrdGroupServed { group: String, by: String },
    /// The object exists, fleetgate did not apply it, and neither the object nor every policy
    /// allows adopting it.
    Unmanaged,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Namespace(ns) => write!(f, "namespace {ns} is not in allowedNamespaces"),
            Reason::ClusterScopedKind(k) => write!(f, "cluster-scoped kind {k} is not in allowedClusterScopedKinds"),
            Reason::PrivilegedRole(role) => {
                write!(f, "binds ClusterRole {role} and allowClusterAdminBindings is false")
            }
            Reason::BindingSubject(s) => write!(f, "binds subject {s}, which no policy may allow"),
            Reason::Rbac { rule, grant, what } => {
                match rule {
                    Some(i) => write!(f, "rules[{i}] grants {what}")?,
                    None => write!(f, "has an {what}")?,
                }
                write!(f, " and allowedRbac does not list {}", grant.as_str())
            }
            Reason::BoundLiveRole { role, rule, grant, what } => write!(
                f,
                "binds {role}, which the release does not define: its rules[{rule}] in the cluster grant {what}, \
                 which allowedRbac does not list; allow it by adding {} to allowedRbac in the admission policy, or \
                 bind a role the release defines",
                grant.as_str()
            ),
            Reason::BoundRoleMissing { role, pruned } => {
                write!(f, "binds {role}, which ")?;
                if *pruned {
                    f.write_str("the release does not define and prune deletes once it is applied (an earlier release defined it)")?;
                } else {
                    f.write_str("neither the release defines nor the cluster has")?;
                }
                f.write_str(
                    ": whoever creates it later would decide what the binding grants; define the role in the \
                     release, or bind one the cluster has",
                )
            }
            Reason::PodSecurity { level, finding, .. } => {
                write!(f, "{finding}, which Pod Security level {level} forbids")
            }
            Reason::Webhook(finding) => write!(f, "{finding}"),
            Reason::CrdGroupServed { group, by } => write!(
                f,
                "defines a CustomResourceDefinition in API group {group}, which the cluster already serves ({by})"
            ),
            Reason::Unmanaged => write!(
                f,
                "exists in the cluster but not in fleetgate's inventory, and a forced apply would take it over: \
                 annotate it {ANNOTATION_ADOPT}: \"true\" in the release, or set adopt: true in every policy"
            ),
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

/// One object's refusals: each rule it breaks once, with every policy that refuses it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ObjectRefusal {
    pub object: ObjectKey,
    pub source: Source,
    pub rules: Vec<RuleRefusal>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RuleRefusal {
    pub reason: Reason,
    /// The policies that refuse it, as violations name them.
    pub policies: Vec<String>,
}

impl AdmissionError {
    /// The violations grouped by object (in the order admission met them), each rule once.
    pub fn by_object(&self) -> Vec<ObjectRefusal> {
        let mut out: Vec<ObjectRefusal> = Vec::new();
        for v in &self.violations {
            let i = match out.iter().position(|o| o.object == v.object) {
                Some(i) => i,
                None => {
                    out.push(ObjectRefusal { object: v.object.clone(), source: v.source.clone(), rules: Vec::new() });
                    out.len() - 1
                }
            };
            let rules = &mut out[i].rules;
            match rules.iter_mut().find(|r| r.reason == v.reason) {
                Some(r) => r.policies.push(v.policy.clone()),
                None => rules.push(RuleRefusal { reason: v.reason.clone(), policies: vec![v.policy.clone()] }),
            }
        }
        out
    }
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
            ..Default::default()
        }
    }

    fn set(yaml: &str) -> ManifestSet {
        ManifestSet::from_release(&release(&[("operator/x.yaml", yaml)]), &scopes).unwrap()
    }

    fn live() -> LiveApi {
        LiveApi::offline(["widgets.owned.example.com".to_string()], "fleetgate-system")
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
    #[case::cluster_admin_crb(ADMIN_CRB, spec(None, None, false), Some(Reason::PrivilegedRole("cluster-admin".into())))]
    #[case::cluster_admin_crb_allowed(ADMIN_CRB, spec(None, None, true), None)]
    #[case::cluster_admin_rolebinding(ADMIN_RB, spec(None, None, false), Some(Reason::PrivilegedRole("cluster-admin".into())))]
    #[case::view_rolebinding(VIEW_RB, spec(None, None, false), None)]
    fn one_policy(#[case] yaml: &str, #[case] policy: ReleaseAdmissionPolicySpec, #[case] expected: Option<Reason>) {
        let result = AdmissionPolicy::baseline(policy).check(&set(yaml), &live());
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
        let result = AdmissionPolicy::baseline(baseline).narrowed_by(&repo).check(&set(yaml), &live());
        assert_eq!(result.err().map(|e| e.violations[0].policy.clone()).as_deref(), refused_by);
    }

    #[test]
    fn names_every_offending_object() {
        let yaml = [OTHER_NS, CLUSTER_ROLE, ADMIN_CRB].join("---\n");
        let err = AdmissionPolicy::baseline(spec(Some(&["redis-system"]), Some(&[CRB]), false))
            .check(&set(&yaml), &live())
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

    fn crd(group: &str, plural: &str) -> String {
        format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: {plural}.{group}}}\nspec:\n  group: {group}\n  names: {{kind: Thing, plural: {plural}}}\n  scope: Namespaced\n  versions: [{{name: v1, served: true, storage: true}}]\n"
        )
    }

    fn served(groups: &[(&str, &[&str])]) -> LiveApi {
        let mut live = live();
        live.served = groups.iter().map(|(g, r)| (g.to_string(), r.iter().map(|s| s.to_string()).collect())).collect();
        live
    }

    #[rstest]
    #[case::builtin_group("admissionregistration.k8s.io", "mutatingwebhookconfigurations", served(&[]), true)]
    #[case::served_by_builtin("example.io", "things", served(&[("example.io", &["gadgets"])]), true)]
    #[case::new_group("example.io", "things", served(&[("other.io", &["gadgets"])]), false)]
    #[case::update_of_own_crd("example.io", "things", served(&[("example.io", &["things"])]), false)]
    #[case::fleetgate_applied_before("owned.example.com", "things", served(&[("owned.example.com", &["owned", "things"])]), true)]
    fn crd_groups(#[case] group: &str, #[case] plural: &str, #[case] live: LiveApi, #[case] refused: bool) {
        let result = AdmissionPolicy::baseline(spec(None, None, false)).check(&set(&crd(group, plural)), &live);
        let reasons: Vec<Reason> =
            result.err().map(|e| e.violations.into_iter().map(|v| v.reason).collect()).unwrap_or_default();
        assert_eq!(reasons.iter().any(|r| matches!(r, Reason::CrdGroupServed { .. })), refused, "{reasons:?}");
    }

    #[test]
    fn fleetgate_crds_in_the_inventory_count_as_ours() {
        let mut live = served(&[("owned.example.com", &["things", "owned"])]);
        live.fleetgate_crds.insert("owned.owned.example.com".into());
        let result =
            AdmissionPolicy::baseline(spec(None, None, false)).check(&set(&crd("owned.example.com", "things")), &live);
        assert_eq!(result, Ok(()));
    }

    #[test]
    fn a_webhook_on_the_kinds_of_a_crd_fleetgate_applied_needs_no_selector() {
        let hook = |group: &str| {
            format!(
                "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {{name: vw}}\nwebhooks: [{{name: w.example.com, clientConfig: {{service: {{name: op, namespace: redis-system}}}}, rules: [{{apiGroups: [{group}], apiVersions: [v1], operations: [CREATE], resources: [widgets]}}]}}]\n"
            )
        };
        let policy = AdmissionPolicy::baseline(spec(None, None, false));
        // The release dropped the CRD, which stays live (and in the inventory): still its own kinds.
        assert_eq!(policy.check(&set(&hook("owned.example.com")), &live()), Ok(()));
        let err = policy.check(&set(&hook("apps")), &live()).unwrap_err();
        assert!(err.to_string().contains("namespaceSelector does not exclude namespace fleetgate-system"), "{err}");
    }

    const MASTERS_CRB: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: b}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: op}\nsubjects: [{kind: Group, name: system:masters}]\n";
    const EDIT_RB: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: b}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}\n";
    const SECRETS_CR: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\nrules: [{apiGroups: [''], resources: [secrets], verbs: [get]}]\n";
    const AGGREGATED_CR: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\naggregationRule: {clusterRoleSelectors: [{matchLabels: {a: b}}]}\n";
    const PRIVILEGED_POD: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    spec:\n      containers: [{name: manager, image: i, securityContext: {privileged: true}}]\n";
    const URL_WEBHOOK: &str = "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {name: vw}\nwebhooks: [{name: w.example.com, clientConfig: {url: 'https://x.example/'}}]\n";

    #[rstest]
    #[case::masters_cannot_be_allowed(
        MASTERS_CRB,
        spec(None, None, true),
        FIXED_RULES,
        "binds subject Group system:masters, which no policy may allow"
    )]
    #[case::edit_binding(
        EDIT_RB,
        spec(None, None, false),
        "agent baseline",
        "binds ClusterRole edit and allowClusterAdminBindings is false"
    )]
    #[case::cluster_secrets(
        SECRETS_CR,
        spec(None, None, false),
        "agent baseline",
        "rules[0] grants secrets in a ClusterRole and allowedRbac does not list clusterSecrets"
    )]
    #[case::aggregation(
        AGGREGATED_CR,
        spec(None, None, false),
        "agent baseline",
        "has an aggregationRule and allowedRbac does not list aggregation"
    )]
    #[case::privileged_pod(
        PRIVILEGED_POD,
        spec(None, None, false),
        "agent baseline",
        "pod template spec.template.spec: container manager: securityContext.privileged is true, which Pod Security level baseline forbids"
    )]
    #[case::url_webhook(
        URL_WEBHOOK,
        spec(None, None, false),
        "agent baseline",
        "webhook w.example.com: clientConfig.url \"https://x.example/\" is refused"
    )]
    fn content_rules_name_the_rule(
        #[case] yaml: &str,
        #[case] policy: ReleaseAdmissionPolicySpec,
        #[case] by: &str,
        #[case] text: &str,
    ) {
        let err = AdmissionPolicy::baseline(policy).check(&set(yaml), &live()).unwrap_err();
        assert_eq!(err.violations[0].policy, by);
        assert!(err.violations[0].to_string().contains(text), "{}", err.violations[0]);
    }

    #[test]
    fn an_object_is_judged_by_every_rule_at_once() {
        let role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\nrules:\n\
                    - {apiGroups: ['*'], resources: [pods], verbs: [get]}\n\
                    - {apiGroups: [''], resources: [nodes/proxy], verbs: [get]}\n";
        let pod = PRIVILEGED_POD.replace("{name: d}", "{name: d, namespace: kube-system}");
        let yaml = [role, pod.as_str()].join("---\n");
        let policy = AdmissionPolicy::baseline(spec(Some(&["redis-system"]), Some(&[CRB]), false));
        let err = policy.check(&set(&yaml), &live()).unwrap_err();
        let texts: Vec<String> = err.violations.iter().map(|v| format!("{}: {}", v.object, v.reason)).collect();
        assert_eq!(texts.len(), 5, "{texts:#?}");
        for text in [
            "ClusterRole.rbac.authorization.k8s.io r: cluster-scoped kind",
            "ClusterRole.rbac.authorization.k8s.io r: rules[0] grants apiGroups: [*]",
            "ClusterRole.rbac.authorization.k8s.io r: rules[1] grants nodes/proxy",
            "Deployment.apps kube-system/d: namespace kube-system",
            "Deployment.apps kube-system/d: pod template spec.template.spec: container manager: securityContext.privileged",
        ] {
            assert!(texts.iter().any(|t| t.starts_with(text)), "{text} not in {texts:#?}");
        }
        let grouped = err.by_object();
        assert_eq!(grouped.iter().map(|o| o.rules.len()).collect::<Vec<_>>(), [3, 2]);
        // One policy change admits all of it.
        let fixes = policy.fixes(&err);
        assert_eq!(fixes.len(), 1);
        assert_eq!(fixes[0].policy, PolicyOrigin::Baseline);
        assert_eq!(
            fixes[0].lines,
            [
                "allowedNamespaces: [redis-system, kube-system]",
                "allowedClusterScopedKinds: [ClusterRoleBinding.rbac.authorization.k8s.io, ClusterRole.rbac.authorization.k8s.io]",
                "allowedRbac: [wildcard, nodesProxy]",
                "podSecurity: privileged",
            ]
        );
    }

    #[test]
    fn allowances_need_every_policy() {
        let mut allowing = spec(None, None, false);
        allowing.allowed_rbac = vec![RbacGrant::ClusterSecrets];
        allowing.pod_security = Some(PodSecurityLevel::Privileged);
        let both = AdmissionPolicy::baseline(allowing.clone());
        assert_eq!(both.check(&set(SECRETS_CR), &live()), Ok(()));
        assert_eq!(both.check(&set(PRIVILEGED_POD), &live()), Ok(()));
        // A repo policy that is silent keeps the default: refused by the repo policy.
        let repo = Document::new("ReleaseAdmissionPolicy", "repo", spec(None, None, false));
        let narrowed = AdmissionPolicy::baseline(allowing).narrowed_by(&repo);
        for yaml in [SECRETS_CR, PRIVILEGED_POD] {
            let err = narrowed.check(&set(yaml), &live()).unwrap_err();
            assert_eq!(
                err.violations.iter().map(|v| v.policy.as_str()).collect::<Vec<_>>(),
                ["ReleaseAdmissionPolicy repo"]
            );
        }
    }

    const ESCALATOR_CRB: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: b}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: escalator}\nsubjects: [{kind: ServiceAccount, name: op, namespace: redis-system}]\n";
    const LEADER_RB: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: b}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: leader}\nsubjects: [{kind: ServiceAccount, name: op}]\n";

    fn escalator() -> BoundRole {
        BoundRole { namespace: None, name: "escalator".into() }
    }

    fn live_with(roles: &[(BoundRole, serde_json::Value)]) -> LiveApi {
        let roles = roles.iter().map(|(r, rules)| (r.clone(), rules.as_array().unwrap().clone())).collect();
        live().with_roles(roles, BTreeSet::new())
    }

    #[test]
    fn a_binding_of_a_role_outside_the_release_is_judged_by_the_live_role() {
        let escalate = serde_json::json!([
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["escalate"]},
        ]);
        let policy = AdmissionPolicy::baseline(spec(None, None, false));
        let binding = set(ESCALATOR_CRB);
        assert_eq!(roles_outside(&binding), BTreeSet::from([escalator()]));

        let err = policy.check(&binding, &live_with(&[(escalator(), escalate.clone())])).unwrap_err();
        assert_eq!(
            err.violations.iter().map(|v| (v.policy.as_str(), v.reason.clone())).collect::<Vec<_>>(),
            [(
                "agent baseline",
                Reason::BoundLiveRole {
                    role: "ClusterRole escalator".into(),
                    rule: 1,
                    grant: RbacGrant::Escalate,
                    what: "verb escalate".into()
                }
            )]
        );
        let text = err.violations[0].to_string();
        assert!(
            text.starts_with(
                "ClusterRoleBinding.rbac.authorization.k8s.io b (operator/x.yaml (document 1)): binds \
                              ClusterRole escalator, which the release does not define: its rules[1] in the cluster \
                              grant verb escalate, which allowedRbac does not list; allow it by adding escalate to \
                              allowedRbac in the admission policy, or bind a role the release defines"
            ),
            "{text}"
        );
        // The hint, followed, admits it: the line `release create` would print, and the policy with it.
        assert_eq!(policy.fixes(&err)[0].lines, ["allowedRbac: [escalate]"]);
        let mut allowing = spec(None, None, false);
        allowing.allowed_rbac = vec![RbacGrant::Escalate];
        assert_eq!(AdmissionPolicy::baseline(allowing).check(&binding, &live_with(&[(escalator(), escalate)])), Ok(()));

        // A live role that grants nothing refused is admitted; one the cluster lacks is refused by
        // the fixed rules; without a cluster (offline) the binding is left to the agent.
        let plain = serde_json::json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]);
        assert_eq!(policy.check(&binding, &live_with(&[(escalator(), plain)])), Ok(()));
        let missing = policy.check(&binding, &live_with(&[])).unwrap_err();
        assert_eq!(
            missing.violations.iter().map(|v| (v.policy.as_str(), v.reason.clone())).collect::<Vec<_>>(),
            [(FIXED_RULES, Reason::BoundRoleMissing { role: "ClusterRole escalator".into(), pruned: false })]
        );
        assert!(!fixes::liftable(&missing.violations[0].reason));
        // A live role prune deletes after the apply is as good as missing.
        let pruned = live().with_roles(BTreeMap::new(), BTreeSet::from([escalator()]));
        let err = policy.check(&binding, &pruned).unwrap_err();
        assert_eq!(
            err.violations[0].reason,
            Reason::BoundRoleMissing { role: "ClusterRole escalator".into(), pruned: true }
        );
        assert!(err.to_string().contains("prune deletes once it is applied"), "{err}");
        assert_eq!(policy.check(&binding, &live()), Ok(()));
    }

    #[test]
    fn a_role_binding_names_a_role_of_its_own_namespace() {
        let leader = BoundRole { namespace: Some("redis-system".into()), name: "leader".into() };
        let binding = set(LEADER_RB);
        assert_eq!(roles_outside(&binding), BTreeSet::from([leader.clone()]));
        let star = serde_json::json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
        let err = AdmissionPolicy::baseline(spec(None, None, false))
            .check(&binding, &live_with(&[(leader, star)]))
            .unwrap_err();
        assert!(err.to_string().contains("binds Role redis-system/leader, which the release does not define: its rules[0] in the cluster grant verbs: [*]"), "{err}");
        // The same name in another namespace is another role: the cluster lacks it.
        let elsewhere = BoundRole { namespace: Some("other".into()), name: "leader".into() };
        let err = AdmissionPolicy::baseline(spec(None, None, false))
            .check(&binding, &live_with(&[(elsewhere, serde_json::json!([]))]))
            .unwrap_err();
        assert_eq!(
            err.violations[0].reason,
            Reason::BoundRoleMissing { role: "Role redis-system/leader".into(), pruned: false }
        );
    }

    #[test]
    fn roles_the_release_defines_and_roles_refused_by_name_are_not_read_from_the_cluster() {
        let own = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: leader}\nrules: []\n";
        let own_cluster = CLUSTER_ROLE.replace("{name: r}", "{name: escalator}");
        let admin = ADMIN_CRB.replace("{name: b}", "{name: admin}");
        let edit = EDIT_RB.replace("{name: b}", "{name: edit}");
        let yaml = [own, LEADER_RB, own_cluster.as_str(), ESCALATOR_CRB, &admin, &edit].join("---\n");
        let release = set(&yaml);
        assert_eq!(roles_outside(&release), BTreeSet::new());
        // Judged by the release's own roles, whatever a role of that name in the cluster says.
        let star = serde_json::json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
        let policy = AdmissionPolicy::baseline(spec(None, None, true));
        assert_eq!(policy.check(&release, &live_with(&[(escalator(), star)])), Ok(()));
    }

    #[test]
    fn adoption_needs_the_annotation_or_every_policy() {
        let plain = set(CONFIGMAP);
        let annotated =
            set("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, annotations: {fleetgate.io/adopt: 'true'}}\n");
        let mut adopting = spec(None, None, false);
        adopting.adopt = true;
        let strict = AdmissionPolicy::baseline(spec(None, None, false));
        let m = plain.iter().next().unwrap();
        assert_eq!(strict.unmanaged(m).map(|v| v.reason), Some(Reason::Unmanaged));
        assert_eq!(strict.unmanaged(annotated.iter().next().unwrap()), None);
        assert_eq!(AdmissionPolicy::baseline(adopting.clone()).unmanaged(m), None);
        let repo = Document::new("ReleaseAdmissionPolicy", "repo", spec(None, None, false));
        let refused = AdmissionPolicy::baseline(adopting).narrowed_by(&repo).unmanaged(m).unwrap();
        assert_eq!(refused.policy, "ReleaseAdmissionPolicy repo");
        assert!(refused.to_string().contains("ConfigMap redis-system/c (operator/x.yaml (document 1)): exists in the cluster but not in fleetgate's inventory"), "{refused}");
    }
}
