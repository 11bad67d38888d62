//! Admission of a release without a cluster, as an agent set up from deploy/ would judge it:
//! what `release create`, `validate` and `plan` check before anything is signed or merged.

use super::builtin_scope;
use crate::manifests::admission::{AdmissionPolicy, LiveApi, roles_outside};
use crate::manifests::{AdmissionError, ManifestError, ManifestSet};
use crate::release::ReleaseFiles;

/// The agent namespace assumed offline (deploy/'s): webhooks must not intercept it.
const DEPLOYED_AGENT_NAMESPACE: &str = "fleetgate-system";

/// Admission by `policy` without a cluster, as an agent set up from deploy/ would judge
/// `release`: scopes from the built-in table and the release's CRDs, namespace-less objects in
/// the release's `spec.namespace`. What needs the live API (served groups beyond the built-in
/// ones, adoption) is the agent's alone. The outer error: the manifests do not parse.
pub fn admission_offline(
    policy: &AdmissionPolicy,
    release: &dyn ReleaseFiles,
) -> Result<Result<(), AdmissionError>, ManifestError> {
    let set = ManifestSet::from_release(release, &builtin_scope)?;
    Ok(policy.check(&set, &LiveApi::offline(Vec::new(), DEPLOYED_AGENT_NAMESPACE)))
}

/// The roles `release`'s bindings grant that it does not define (`ClusterRole NAME`, `Role
/// NAMESPACE/NAME`): [`admission_offline`] cannot judge those bindings, the agent judges them by
/// the rules the cluster has for each role.
pub fn roles_judged_live(release: &dyn ReleaseFiles) -> Result<Vec<String>, ManifestError> {
    let set = ManifestSet::from_release(release, &builtin_scope)?;
    Ok(roles_outside(&set).iter().map(ToString::to_string).collect())
}
