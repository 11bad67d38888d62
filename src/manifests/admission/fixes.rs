//! What policy change would admit what admission refused: from violations to the `spec:` lines
//! of each refusing policy, in the policy's own YAML (`allowedRbac: [wildcard, nodesProxy]`).
//!
//! Each line is a whole field (the policy's current entries plus the new ones), so it replaces
//! that field of the policy's `spec`. A reason no policy field lifts — the [`super::FIXED_RULES`],
//! a webhook that calls a URL or intercepts a protected namespace — yields no line: only a
//! change of the manifests admits it. Pure functions over values; the caller says which file
//! holds each policy.

use super::{AdmissionError, AdmissionPolicy, PolicyOrigin, Reason};
use crate::model::ReleaseAdmissionPolicySpec;

/// The lines one policy needs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PolicyFix {
    pub policy: PolicyOrigin,
    pub lines: Vec<String>,
}

impl AdmissionPolicy {
    /// For every policy that refused something `err` lists and could admit it: its lines.
    pub fn fixes(&self, err: &AdmissionError) -> Vec<PolicyFix> {
        self.policies
            .iter()
            .filter_map(|(origin, spec)| {
                let name = origin.to_string();
                let reasons = err.violations.iter().filter(|v| v.policy == name).map(|v| &v.reason);
                let lines = lines(spec, reasons);
                (!lines.is_empty()).then(|| PolicyFix { policy: origin.clone(), lines })
            })
            .collect()
    }
}

/// Whether some policy field lifts `reason`.
pub fn liftable(reason: &Reason) -> bool {
    lift(&mut ReleaseAdmissionPolicySpec::default(), reason)
}

/// Widens `spec` just enough that it no longer refuses for `reason`; false when no field can.
fn lift(spec: &mut ReleaseAdmissionPolicySpec, reason: &Reason) -> bool {
    fn add<T: PartialEq + Clone>(list: &mut Vec<T>, item: &T) {
        if !list.contains(item) {
            list.push(item.clone());
        }
    }
    match reason {
        // An absent list refuses nothing: there is nothing to add to.
        Reason::Namespace(ns) => spec.allowed_namespaces.iter_mut().for_each(|l| add(l, ns)),
        Reason::Webhook(finding) => match &finding.service_namespace {
            Some(ns) => spec.allowed_namespaces.iter_mut().for_each(|l| add(l, ns)),
            None => return false,
        },
        Reason::ClusterScopedKind(kind) => spec.allowed_cluster_scoped_kinds.iter_mut().for_each(|l| add(l, kind)),
        Reason::PrivilegedRole(_) => spec.allow_cluster_admin_bindings = true,
        Reason::Rbac { grant, .. } | Reason::BoundLiveRole { grant, .. } => add(&mut spec.allowed_rbac, grant),
        Reason::PodSecurity { lifted_by, .. } => {
            spec.pod_security = Some(spec.pod_security_level().min(*lifted_by));
        }
        Reason::Unmanaged => spec.adopt = true,
        Reason::BindingSubject(_) | Reason::CrdGroupServed { .. } | Reason::BoundRoleMissing { .. } => return false,
    }
    true
}

/// The `spec:` fields of `spec` that must change to admit every liftable one of `reasons`, one
/// line each, in the order the policy documents list them.
pub fn lines<'r>(spec: &ReleaseAdmissionPolicySpec, reasons: impl IntoIterator<Item = &'r Reason>) -> Vec<String> {
    let mut after = spec.clone();
    for r in reasons {
        lift(&mut after, r);
    }
    let mut out = Vec::new();
    if after.allowed_namespaces != spec.allowed_namespaces {
        out.push(format!("allowedNamespaces: {}", flow(after.allowed_namespaces.iter().flatten())));
    }
    if after.allowed_cluster_scoped_kinds != spec.allowed_cluster_scoped_kinds {
        out.push(format!("allowedClusterScopedKinds: {}", flow(after.allowed_cluster_scoped_kinds.iter().flatten())));
    }
    if after.allow_cluster_admin_bindings != spec.allow_cluster_admin_bindings {
        out.push("allowClusterAdminBindings: true".into());
    }
    if after.allowed_rbac != spec.allowed_rbac {
        out.push(format!("allowedRbac: {}", flow(after.allowed_rbac.iter().map(|g| g.as_str()))));
    }
    if after.pod_security_level() != spec.pod_security_level() {
        out.push(format!("podSecurity: {}", after.pod_security_level()));
    }
    if after.adopt != spec.adopt {
        out.push("adopt: true".into());
    }
    out
}

/// A YAML flow sequence, each entry quoted as serde would (`*` alone is an alias otherwise).
fn flow<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    let scalar = |s: &str| match serde_saphyr::to_string(&s) {
        Ok(text) => text.trim_end().to_string(),
        Err(_) => format!("{s:?}"),
    };
    let items: Vec<String> = items.into_iter().map(|s| scalar(s.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifests::admission::{PodFinding, WebhookFinding};
    use crate::model::{PodSecurityLevel, RbacGrant};
    use rstest::rstest;

    fn strict() -> ReleaseAdmissionPolicySpec {
        ReleaseAdmissionPolicySpec {
            allowed_namespaces: Some(vec!["redis-system".into()]),
            allowed_cluster_scoped_kinds: Some(vec!["ClusterRole.rbac.authorization.k8s.io".into()]),
            pod_security: Some(PodSecurityLevel::Restricted),
            ..Default::default()
        }
    }

    fn rbac(grant: RbacGrant) -> Reason {
        Reason::Rbac { rule: Some(0), grant, what: String::new() }
    }

    fn pods(lifted_by: PodSecurityLevel) -> Reason {
        let finding = PodFinding { template: "spec".into(), container: None, field: "f".into(), value: "v".into() };
        Reason::PodSecurity { level: PodSecurityLevel::Restricted, finding, lifted_by }
    }

    fn webhook(service_namespace: Option<&str>) -> Reason {
        Reason::Webhook(WebhookFinding {
            webhook: "w".into(),
            problem: "p".into(),
            service_namespace: service_namespace.map(Into::into),
        })
    }

    #[rstest]
    #[case::namespace(vec![Reason::Namespace("kube-system".into())], &["allowedNamespaces: [redis-system, kube-system]"])]
    #[case::star_is_quoted(vec![Reason::Namespace("*".into())], &["allowedNamespaces: [redis-system, \"*\"]"])]
    #[case::kind(vec![Reason::ClusterScopedKind("PersistentVolume".into())], &["allowedClusterScopedKinds: [ClusterRole.rbac.authorization.k8s.io, PersistentVolume]"])]
    #[case::every_grant_once(
        vec![rbac(RbacGrant::Wildcard), rbac(RbacGrant::NodesProxy), rbac(RbacGrant::Wildcard)],
        &["allowedRbac: [wildcard, nodesProxy]"]
    )]
    #[case::cluster_admin(vec![Reason::PrivilegedRole("edit".into())], &["allowClusterAdminBindings: true"])]
    #[case::pods_take_the_most_permissive_needed(
        vec![pods(PodSecurityLevel::Baseline), pods(PodSecurityLevel::Privileged)],
        &["podSecurity: privileged"]
    )]
    #[case::pods_baseline(vec![pods(PodSecurityLevel::Baseline)], &["podSecurity: baseline"])]
    #[case::webhook_service_namespace(vec![webhook(Some("hooks"))], &["allowedNamespaces: [redis-system, hooks]"])]
    #[case::webhook_url_has_no_line(vec![webhook(None)], &[])]
    #[case::fixed_rules_have_no_line(
        vec![Reason::BindingSubject("Group system:masters".into()), Reason::CrdGroupServed { group: "apps".into(), by: "x".into() }],
        &[]
    )]
    #[case::fields_in_document_order(
        vec![rbac(RbacGrant::Bind), Reason::ClusterScopedKind("StorageClass.storage.k8s.io".into()), Reason::Namespace("a".into())],
        &["allowedNamespaces: [redis-system, a]", "allowedClusterScopedKinds: [ClusterRole.rbac.authorization.k8s.io, StorageClass.storage.k8s.io]", "allowedRbac: [bind]"]
    )]
    fn lines_admit_the_reasons(#[case] reasons: Vec<Reason>, #[case] expected: &[&str]) {
        assert_eq!(lines(&strict(), &reasons), expected);
    }

    #[test]
    fn lines_parse_back_into_a_policy_that_admits() {
        let reasons = [
            Reason::Namespace("kube-system".into()),
            rbac(RbacGrant::Wildcard),
            pods(PodSecurityLevel::Privileged),
            Reason::ClusterScopedKind("PersistentVolume".into()),
        ];
        let yaml = lines(&strict(), &reasons).join("\n");
        let spec: ReleaseAdmissionPolicySpec = serde_saphyr::from_str(&yaml).unwrap();
        assert!(spec.allows_namespace("kube-system") && spec.allows_namespace("redis-system"));
        assert!(spec.allows_cluster_scoped_kind("", "PersistentVolume"));
        assert!(spec.allows_rbac(RbacGrant::Wildcard));
        assert_eq!(spec.pod_security_level(), PodSecurityLevel::Privileged);
    }

    #[test]
    fn only_policy_fields_lift() {
        assert!(liftable(&rbac(RbacGrant::Escalate)));
        assert!(liftable(&webhook(Some("hooks"))));
        assert!(!liftable(&webhook(None)));
        assert!(!liftable(&Reason::BindingSubject("Group system:masters".into())));
    }
}
