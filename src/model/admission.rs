//! `ReleaseAdmissionPolicy`: bounds on what a release may touch (namespaces, cluster-scoped kinds,
//! RBAC by its rules, the Pod Security level of pod templates, adoption of existing objects).
//!
//! The agent's configuration carries the baseline; a fleet repo may add policies under
//! `policies/` that only ever narrow it: an object is admitted when *every* policy admits it, so a
//! repo can never widen what the agent allows. The check itself lives in
//! `manifests::admission`, over a parsed `ManifestSet`. Commands that judge a release before
//! an agent does (`release create`, `validate`) take the agents' baseline as an
//! [`AdmissionBaseline`]: a file, or the one `deploy/config.yaml` ships to every spoke.

use super::{Document, ParseError, parse_document};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub type ReleaseAdmissionPolicy = Document<ReleaseAdmissionPolicySpec>;

/// The document kind of [`ReleaseAdmissionPolicy`].
pub const RELEASE_ADMISSION_POLICY_KIND: &str = "ReleaseAdmissionPolicy";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseAdmissionPolicySpec {
    /// Namespaces a release may put namespaced objects into (and may create as `Namespace`
    /// objects). An entry ending in `*` is a prefix (`team-*`); `*` alone is any namespace.
    /// Absent: this policy does not restrict namespaces. Present but empty: no namespace at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_namespaces: Option<Vec<String>>,
    /// Cluster-scoped kinds a release may create, as `Kind.group` (`Kind` alone for the core
    /// group), e.g. `CustomResourceDefinition.apiextensions.k8s.io`, `ClusterRole.rbac.authorization.k8s.io`.
    /// `Namespace` objects are judged by `allowedNamespaces` instead. Absent: no restriction
    /// from this policy. Present but empty: no cluster-scoped object at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_cluster_scoped_kinds: Option<Vec<String>>,
    /// Whether a RoleBinding or ClusterRoleBinding may grant the built-in `cluster-admin`,
    /// `admin` or `edit` ClusterRole. Default false: every policy must say true for such a
    /// binding to pass.
    #[serde(default)]
    pub allow_cluster_admin_bindings: bool,
    /// Grants a (Cluster)Role of the release may contain although they widen what its holder can
    /// do beyond listed objects (see [`RbacGrant`]). Default none; like the flags above, a grant
    /// passes only when every policy lists it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_rbac: Vec<RbacGrant>,
    /// The Pod Security Standards level every pod template must meet. Absent: `baseline`. Each
    /// policy judges by its own level, so the strictest one decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecurityLevel>,
    /// Whether the release may take over objects that exist in the cluster but were not applied
    /// by fleetgate (not in its inventory) without each carrying `fleetgate.io/adopt: "true"`.
    /// Default false: every policy must say true.
    #[serde(default)]
    pub adopt: bool,
}

/// A grant in a Role or ClusterRole that admission refuses unless `allowedRbac` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RbacGrant {
    /// `*` in verbs, in apiGroups, or in resources (for groups the release's own CRDs do not
    /// define alone), or in nonResourceURLs: grants whatever the cluster serves, now or later.
    Wildcard,
    /// Verb `escalate`: create or change roles with more than the holder has.
    Escalate,
    /// Verb `bind`: bind roles the holder does not hold.
    Bind,
    /// Verb `impersonate`: act as another user, group or ServiceAccount.
    Impersonate,
    /// `secrets` in a ClusterRole: every Secret of every namespace it is bound in.
    ClusterSecrets,
    /// `nodes/proxy`: the kubelet API (exec into any pod on the node).
    NodesProxy,
    /// `serviceaccounts/token`: tokens of other ServiceAccounts.
    ServiceAccountTokens,
    /// A ClusterRole with an `aggregationRule`: its rules are whatever the cluster's labelled
    /// ClusterRoles say, which the release cannot be judged by.
    Aggregation,
    /// `pods/exec`, `pods/attach`, `pods/portforward`: a shell in (or a tunnel into) a running
    /// container, with whatever that container holds.
    PodExec,
    /// Creating Pods, or the workloads that make them, in a ClusterRole: a Pod can run as any
    /// ServiceAccount of its namespace and mount its token, so this grants every such identity.
    ClusterPods,
    /// Approving or signing CertificateSigningRequests: a client certificate for any user or group
    /// the signer serves (`system:masters` included).
    CertificateApproval,
    /// Writing admission webhook or admission policy configurations: see, change or refuse every
    /// request the API server admits.
    AdmissionConfig,
}

impl RbacGrant {
    /// The value as written in `allowedRbac`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RbacGrant::Wildcard => "wildcard",
            RbacGrant::Escalate => "escalate",
            RbacGrant::Bind => "bind",
            RbacGrant::Impersonate => "impersonate",
            RbacGrant::ClusterSecrets => "clusterSecrets",
            RbacGrant::NodesProxy => "nodesProxy",
            RbacGrant::ServiceAccountTokens => "serviceAccountTokens",
            RbacGrant::Aggregation => "aggregation",
            RbacGrant::PodExec => "podExec",
            RbacGrant::ClusterPods => "clusterPods",
            RbacGrant::CertificateApproval => "certificateApproval",
            RbacGrant::AdmissionConfig => "admissionConfig",
        }
    }
}

/// A Pod Security Standards level (<https://kubernetes.io/docs/concepts/security/pod-security-standards/>).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PodSecurityLevel {
    /// No check.
    Privileged,
    /// Prevents known privilege escalations: no host namespaces, host paths, host ports,
    /// privileged containers, added capabilities beyond the default set, unsafe sysctls …
    #[default]
    Baseline,
    /// Baseline plus current hardening: non-root, no privilege escalation, drop ALL, seccomp.
    Restricted,
}

impl std::fmt::Display for PodSecurityLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PodSecurityLevel::Privileged => "privileged",
            PodSecurityLevel::Baseline => "baseline",
            PodSecurityLevel::Restricted => "restricted",
        })
    }
}

impl ReleaseAdmissionPolicySpec {
    /// The Pod Security level this policy requires (`baseline` when it names none).
    pub fn pod_security_level(&self) -> PodSecurityLevel {
        self.pod_security.unwrap_or_default()
    }

    /// Whether `allowedRbac` lists `grant`.
    pub fn allows_rbac(&self, grant: RbacGrant) -> bool {
        self.allowed_rbac.contains(&grant)
    }

    /// Whether `namespace` is within `allowedNamespaces` (always, when the field is absent).
    pub fn allows_namespace(&self, namespace: &str) -> bool {
        match &self.allowed_namespaces {
            None => true,
            Some(list) => list.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => namespace.starts_with(prefix),
                None => p == namespace,
            }),
        }
    }

    /// Whether the cluster-scoped kind `kind` of API group `group` is allowed (`Kind.group`,
    /// or `Kind` for the core group; kinds compare exactly, groups case-insensitively).
    pub fn allows_cluster_scoped_kind(&self, group: &str, kind: &str) -> bool {
        match &self.allowed_cluster_scoped_kinds {
            None => true,
            Some(list) => list.iter().any(|entry| {
                let (k, g) = entry.split_once('.').unwrap_or((entry.as_str(), ""));
                k == kind && g.eq_ignore_ascii_case(group)
            }),
        }
    }
}

/// The agents' baseline policy as a command that judges releases for them knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionBaseline {
    pub spec: ReleaseAdmissionPolicySpec,
    /// The file it was read from; None for the one `deploy/config.yaml` ships.
    pub file: Option<PathBuf>,
}

/// Where `deploy/config.yaml` keeps the baseline: its ConfigMap's key of that name.
const SHIPPED_KEY: &str = "admission-policy.yaml";

/// Why a baseline file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error("reading admission policy {}", path.display())]
    Unreadable { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Parse(#[from] ParseError),
}

impl AdmissionBaseline {
    /// The baseline `deploy/config.yaml` ships (its `admission-policy.yaml`): what a spoke set up
    /// from `deploy/` judges by. Compiled in; a unit test keeps it parseable.
    pub fn shipped() -> Self {
        let config: serde_json::Value = serde_saphyr::from_str(include_str!("../../deploy/config.yaml"))
            .expect("deploy/config.yaml is YAML (tested)");
        let text = config["data"][SHIPPED_KEY].as_str().expect("deploy/config.yaml holds the baseline (tested)");
        let doc: ReleaseAdmissionPolicy = parse_document("deploy/config.yaml", text, RELEASE_ADMISSION_POLICY_KIND)
            .expect("deploy/config.yaml's baseline parses (tested)");
        AdmissionBaseline { spec: doc.spec, file: None }
    }

    /// A `ReleaseAdmissionPolicy` file, as the agent's `admissionPolicy` setting names one.
    pub fn read(path: &Path) -> Result<Self, BaselineError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| BaselineError::Unreadable { path: path.to_path_buf(), source })?;
        let doc: ReleaseAdmissionPolicy =
            parse_document(&path.display().to_string(), &text, RELEASE_ADMISSION_POLICY_KIND)?;
        Ok(AdmissionBaseline { spec: doc.spec, file: Some(path.to_path_buf()) })
    }

    /// `--admission-policy FILE` when given, else [`AdmissionBaseline::shipped`].
    pub fn read_or_shipped(file: Option<&Path>) -> Result<Self, BaselineError> {
        file.map_or_else(|| Ok(Self::shipped()), Self::read)
    }

    /// Where a person changes it, for messages.
    pub fn describe(&self) -> String {
        match &self.file {
            Some(f) => format!("the agents' baseline: {} (each spoke's admissionPolicy file)", f.display()),
            None => format!(
                "the agents' baseline: deploy/config.yaml, key {SHIPPED_KEY} (each spoke's admissionPolicy file; \
                 pass --admission-policy FILE when your spokes use another)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(None, "anything", true)]
    #[case(Some(vec![]), "redis-system", false)]
    #[case(Some(vec!["redis-system".into()]), "redis-system", true)]
    #[case(Some(vec!["redis-system".into()]), "redis-system-2", false)]
    #[case(Some(vec!["team-*".into()]), "team-a", true)]
    #[case(Some(vec!["team-*".into()]), "teams", false)]
    #[case(Some(vec!["*".into()]), "kube-system", true)]
    fn namespaces(#[case] list: Option<Vec<String>>, #[case] ns: &str, #[case] allowed: bool) {
        let spec = ReleaseAdmissionPolicySpec { allowed_namespaces: list, ..Default::default() };
        assert_eq!(spec.allows_namespace(ns), allowed);
    }

    #[rstest]
    #[case("CustomResourceDefinition.apiextensions.k8s.io", "apiextensions.k8s.io", "CustomResourceDefinition", true)]
    #[case("CustomResourceDefinition.apiextensions.k8s.io", "apiextensions.k8s.io", "ClusterRole", false)]
    #[case("ClusterRole.rbac.authorization.k8s.io", "rbac.authorization.k8s.io", "ClusterRole", true)]
    #[case("PersistentVolume", "", "PersistentVolume", true)]
    #[case("PersistentVolume", "storage.k8s.io", "PersistentVolume", false)]
    fn cluster_scoped_kinds(#[case] entry: &str, #[case] group: &str, #[case] kind: &str, #[case] allowed: bool) {
        let spec = ReleaseAdmissionPolicySpec {
            allowed_cluster_scoped_kinds: Some(vec![entry.to_string()]),
            ..Default::default()
        };
        assert_eq!(spec.allows_cluster_scoped_kind(group, kind), allowed);
    }

    #[test]
    fn reference_policy_parses() {
        let text = include_str!("../../policies/admission-policy.yaml");
        let policy: ReleaseAdmissionPolicy =
            parse_document("policies/admission-policy.yaml", text, RELEASE_ADMISSION_POLICY_KIND).unwrap();
        assert!(!policy.spec.allow_cluster_admin_bindings);
        assert!(policy.spec.allows_namespace("redis-system"));
        assert_eq!(policy.spec.pod_security_level(), PodSecurityLevel::Baseline);
        assert!(!policy.spec.adopt && policy.spec.allowed_rbac == [RbacGrant::ClusterPods]);
    }

    #[test]
    fn the_shipped_baseline_is_deploys() {
        let shipped = AdmissionBaseline::shipped();
        assert_eq!(shipped.spec.allowed_namespaces, Some(vec!["redis-system".to_string()]));
        assert!(shipped.spec.allows_cluster_scoped_kind("apiextensions.k8s.io", "CustomResourceDefinition"));
        assert_eq!(shipped.spec.pod_security_level(), PodSecurityLevel::Baseline);
        assert!(shipped.describe().contains("deploy/config.yaml"));
    }

    #[test]
    fn content_fields_parse() {
        let text = "apiVersion: fleetgate.io/v1alpha1\nkind: ReleaseAdmissionPolicy\nmetadata: {name: p}\nspec: {allowedRbac: [clusterSecrets, nodesProxy], podSecurity: restricted, adopt: true}\n";
        let policy: ReleaseAdmissionPolicy = parse_document("p.yaml", text, RELEASE_ADMISSION_POLICY_KIND).unwrap();
        assert_eq!(policy.spec.allowed_rbac, [RbacGrant::ClusterSecrets, RbacGrant::NodesProxy]);
        assert!(policy.spec.allows_rbac(RbacGrant::NodesProxy) && !policy.spec.allows_rbac(RbacGrant::Wildcard));
        assert_eq!(policy.spec.pod_security_level(), PodSecurityLevel::Restricted);
        assert!(policy.spec.adopt);
        let bad = text.replace("nodesProxy", "everything");
        assert!(parse_document::<ReleaseAdmissionPolicySpec>("p.yaml", &bad, RELEASE_ADMISSION_POLICY_KIND).is_err());
    }

    #[test]
    fn unknown_fields_are_errors() {
        let text = "apiVersion: fleetgate.io/v1alpha1\nkind: ReleaseAdmissionPolicy\nmetadata: {name: p}\nspec: {allowedNamespace: [a]}\n";
        let err =
            parse_document::<ReleaseAdmissionPolicySpec>("p.yaml", text, RELEASE_ADMISSION_POLICY_KIND).unwrap_err();
        assert!(err.to_string().contains("allowedNamespace"), "{err}");
    }
}
