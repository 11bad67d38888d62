//! `spec.requires` against a live cluster: a pure check the agent calls with the facts it read from
//! the API server (`/version` and the nodes' `kubernetes.io/arch`), so it is tested without one.

use crate::model::parse_server_version;
use crate::model::{BadServerVersion, BadVersionRange, ClusterFacts, ErrorClass, Requirements, parse_version_range};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    #[error("the release requires Kubernetes {required}, the cluster runs {found}")]
    KubernetesVersion { required: String, found: String },
    #[error("the release's images are built for [{}], but the cluster has nodes of {}", supported.join(", "), unsupported.join(", "))]
    Architecture { supported: Vec<String>, unsupported: Vec<String> },
    #[error(transparent)]
    BadRange(#[from] BadVersionRange),
    #[error(transparent)]
    BadServerVersion(#[from] BadServerVersion),
}

impl RequirementError {
    /// A cluster that does not meet a release's requirements will not start meeting them by
    /// retrying: every variant is stalling.
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Stalling
    }
}

/// Ok when the cluster meets every requirement; else the first unmet one.
pub fn check_requirements(requires: &Requirements, facts: &ClusterFacts) -> Result<(), RequirementError> {
    if let Some(range) = &requires.kubernetes {
        let req = parse_version_range(range)?;
        let found = parse_server_version(&facts.server_version)?;
        if !req.matches(&found) {
            return Err(RequirementError::KubernetesVersion {
                required: range.clone(),
                found: facts.server_version.clone(),
            });
        }
    }
    if !requires.architectures.is_empty() {
        let mut unsupported: Vec<String> =
            facts.architectures.iter().filter(|a| !requires.architectures.contains(a)).cloned().collect();
        unsupported.sort();
        unsupported.dedup();
        if !unsupported.is_empty() {
            return Err(RequirementError::Architecture { supported: requires.architectures.clone(), unsupported });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn req(k: Option<&str>, archs: &[&str]) -> Requirements {
        Requirements { kubernetes: k.map(str::to_string), architectures: archs.iter().map(|s| s.to_string()).collect() }
    }

    fn facts(v: &str, archs: &[&str]) -> ClusterFacts {
        ClusterFacts { server_version: v.to_string(), architectures: archs.iter().map(|s| s.to_string()).collect() }
    }

    #[rstest]
    #[case(None, &[], "v1.20.0", &["s390x"], Ok(()))]
    #[case(Some(">=1.28"), &[], "v1.36.3", &["amd64"], Ok(()))]
    #[case(Some(">=1.28"), &[], "v1.29.4-eks-036c24b", &["amd64"], Ok(()))]
    #[case(Some(">=1.28"), &[], "v1.30.2+k3s1", &["amd64"], Ok(()))]
    #[case(Some(">=1.28"), &[], "v1.27.9", &["amd64"], Err("KubernetesVersion"))]
    #[case(Some(">=1.28, <1.33"), &[], "v1.33.0", &["amd64"], Err("KubernetesVersion"))]
    #[case(Some(">=1.28"), &[], "1.31", &[], Ok(()))]
    #[case(Some("newest"), &[], "v1.31.0", &[], Err("BadRange"))]
    #[case(Some(">=1.28"), &[], "unknown", &[], Err("BadServerVersion"))]
    #[case(None, &["amd64", "arm64"], "v1.31.0", &["amd64", "arm64", "amd64"], Ok(()))]
    #[case(None, &["amd64"], "v1.31.0", &["amd64", "arm64"], Err("Architecture"))]
    fn requirements(
        #[case] k: Option<&str>,
        #[case] archs: &[&str],
        #[case] version: &str,
        #[case] nodes: &[&str],
        #[case] expected: Result<(), &str>,
    ) {
        let got = check_requirements(&req(k, archs), &facts(version, nodes));
        let variant = got.clone().map_err(|e| format!("{e:?}").split([' ', '{', '(']).next().unwrap().to_string());
        assert_eq!(variant, expected.map_err(str::to_string), "{got:?}");
    }

    #[test]
    fn architecture_error_names_the_offenders() {
        let e =
            check_requirements(&req(None, &["amd64"]), &facts("v1.31.0", &["arm64", "s390x", "arm64"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the release's images are built for [amd64], but the cluster has nodes of arm64, s390x"
        );
    }
}
