//! Drift: live objects compared with a release's desired objects, field by field, over only the
//! fields the release sets (server defaults, status, managedFields, resourceVersion, uid and
//! the like never count), shown as unified diffs. Applying the release again corrects it.
//!
//! A drift check only shows, so it also compares with a release whose signature was not checked
//! ([`DriftInput::read`] without trust): an [`UnverifiedRelease`], which `apply` never takes.

use super::phases::Resolver;
use super::{ApplyError, Engine, fields, kube_err};
use crate::manifests::{Manifest, ManifestSet, ObjectKey};
use crate::model::{ClusterFacts, Finding, TreeError};
use crate::release::{
    Keyring, ReleaseFiles, ResolveError, TagPins, UnverifiedRelease, VerifiedRelease, VerifyError, read_release,
    resolve, resolve_release, verify,
};
use crate::source::{Checkout, SourceError};
use futures::{StreamExt, stream};
use serde_json::Value;
use similar::TextDiff;
use std::collections::BTreeMap;

/// How one desired object compares with the cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum DriftState {
    InSync,
    /// The object does not exist (or its kind is not served).
    Missing,
    /// Fields differ; `diff` is a unified diff from desired to live, over the release's fields.
    Drifted {
        diff: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ObjectDrift {
    pub object: ObjectKey,
    #[serde(flatten)]
    pub state: DriftState,
}

/// Every object of a release and how it compares with the cluster, in apply order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DriftReport {
    pub release: String,
    pub objects: Vec<ObjectDrift>,
}

impl DriftReport {
    pub fn has_drift(&self) -> bool {
        self.objects.iter().any(|o| o.state != DriftState::InSync)
    }

    /// The objects that are missing or drifted.
    pub fn drifted(&self) -> impl Iterator<Item = &ObjectDrift> {
        self.objects.iter().filter(|o| o.state != DriftState::InSync)
    }
}

/// Compares one desired object with its live counterpart (None: it does not exist).
pub fn compare(desired: &Manifest, live: Option<&Value>) -> DriftState {
    let Some(live) = live else { return DriftState::Missing };
    let want = serde_json::to_value(&desired.object).expect("objects serialize");
    let have = fields::project_like(live, &want);
    if have == want {
        return DriftState::InSync;
    }
    let (a, b) = (to_yaml(&want), to_yaml(&have));
    let diff = TextDiff::from_lines(&a, &b)
        .unified_diff()
        .context_radius(3)
        .header(&format!("desired {}", desired.key), &format!("live {}", desired.key))
        .to_string();
    DriftState::Drifted { diff }
}

fn to_yaml(v: &Value) -> String {
    serde_saphyr::to_string(v).expect("JSON values serialize as YAML")
}

/// The release a cluster should run, read from a checkout for a drift check.
#[derive(Debug)]
pub struct DriftInput {
    pub release: DriftRelease,
}

/// Verified when trusted keys were given, else as the tag holds it.
#[derive(Debug)]
pub enum DriftRelease {
    Verified(VerifiedRelease),
    /// `findings` are the content's problems (mapping, rules), for the reader to see.
    Unverified {
        release: UnverifiedRelease,
        findings: Vec<Finding>,
    },
}

impl DriftRelease {
    pub fn files(&self) -> &dyn ReleaseFiles {
        match self {
            DriftRelease::Verified(r) => r,
            DriftRelease::Unverified { release, .. } => release,
        }
    }

    pub fn is_verified(&self) -> bool {
        matches!(self, DriftRelease::Verified(_))
    }

    /// Whether the release has variants (`spec.variants`), of which a cluster runs one.
    pub fn has_variants(&self) -> bool {
        let release = match self {
            DriftRelease::Verified(r) => r.release(),
            DriftRelease::Unverified { release, .. } => release.release(),
        };
        !release.spec.variants.is_empty()
    }

    /// The release as a cluster with `facts` and agent `labels` runs it (the variant they select,
    /// as the agent selects it), and that variant's name.
    ///
    /// # Errors
    /// [`VerifyError::NoVariant`] when no variant fits.
    pub fn for_cluster(
        self,
        facts: &ClusterFacts,
        labels: &BTreeMap<String, String>,
    ) -> Result<(DriftRelease, Option<String>), VerifyError> {
        Ok(match self {
            DriftRelease::Verified(r) => {
                let r = r.for_cluster(facts, labels)?;
                let variant = r.variant().map(str::to_string);
                (DriftRelease::Verified(r), variant)
            }
            DriftRelease::Unverified { release, findings } => {
                let (release, variant) = release.for_cluster(facts, labels)?;
                (DriftRelease::Unverified { release, findings }, variant)
            }
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DriftInputError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error("release {id} has no readable release.yaml")]
    NoRelease { id: String, findings: Vec<Finding> },
}

impl DriftInput {
    /// The release `cluster` should run per the checkout's branch tip (or release `id`), verified
    /// with `trust` when given — exactly as the agent would — else read from its tag unchecked.
    ///
    /// # Errors
    /// Resolution and verification failures as they are; [`DriftInputError::NoRelease`] (with
    /// the findings that say why) when the tag's release.yaml cannot be read.
    pub fn read(
        checkout: &Checkout,
        cluster: &str,
        id: Option<&str>,
        trust: Option<&Keyring>,
    ) -> Result<DriftInput, DriftInputError> {
        let desired = match id {
            Some(id) => resolve_release(checkout, cluster, id)?,
            None => resolve(checkout, cluster)?,
        };
        let release = match trust {
            // One comparison, no agent state: pins start empty.
            Some(trust) => DriftRelease::Verified(verify(checkout, &desired, trust, None, &mut TagPins::in_memory())?),
            None => {
                let (content, findings) = read_release(&checkout.tag_tree(&desired.tag)?, Some(&desired.id))?;
                let Some(content) = content else {
                    return Err(DriftInputError::NoRelease { id: desired.id, findings });
                };
                DriftRelease::Unverified { release: UnverifiedRelease::new(desired.id, content), findings }
            }
        };
        Ok(DriftInput { release })
    }
}

impl Engine {
    /// Compares every object of `release` (with the labels an apply gives it) with the
    /// cluster. Changes nothing; [`apply`](Self::apply) the release again to correct drift.
    pub async fn drift(&self, release: &dyn ReleaseFiles) -> Result<DriftReport, ApplyError> {
        let resolver = Resolver::new(self.client.clone()).await?;
        let mut set = ManifestSet::from_release(release, resolver.discovery())?;
        set.add_labels(&self.labels());
        let results: Vec<Result<ObjectDrift, ApplyError>> = stream::iter(set.iter())
            .map(|m| {
                let resolver = &resolver;
                async move {
                    let live = match resolver.api(m) {
                        Err(_) => None,
                        Ok(api) => api.get_opt(&m.key.name).await.map_err(kube_err(format!("reading {}", m.key)))?,
                    };
                    let live = live.map(|o| serde_json::to_value(o).expect("objects serialize"));
                    Ok(ObjectDrift { object: m.key.clone(), state: compare(m, live.as_ref()) })
                }
            })
            .buffered(self.options.concurrency.max(1))
            .collect()
            .await;
        Ok(DriftReport { release: release.id().to_string(), objects: results.into_iter().collect::<Result<_, _>>()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifests::tests::{release, scopes};
    use serde_json::json;

    fn desired() -> Manifest {
        let r = release(&[(
            "operator/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: n}\ndata: {level: info, mode: fast}\n",
        )]);
        ManifestSet::from_release(&r, &scopes).unwrap().iter().next().unwrap().clone()
    }

    #[test]
    fn server_fields_are_not_drift() {
        let live = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "n", "uid": "x", "resourceVersion": "9",
                         "creationTimestamp": "2025-01-01T00:00:00Z", "managedFields": [{"manager": "fleetgate"}]},
            "data": {"level": "info", "mode": "fast"}
        });
        assert_eq!(compare(&desired(), Some(&live)), DriftState::InSync);
        assert_eq!(compare(&desired(), None), DriftState::Missing);
    }

    #[test]
    fn a_changed_field_shows_as_exactly_that_line() {
        let live = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "n", "uid": "x"},
            "data": {"level": "debug", "mode": "fast"}
        });
        let DriftState::Drifted { diff } = compare(&desired(), Some(&live)) else { panic!("expected drift") };
        let changed: Vec<&str> = diff
            .lines()
            .filter(|l| (l.starts_with('-') || l.starts_with('+')) && !l.starts_with("---") && !l.starts_with("+++"))
            .collect();
        assert_eq!(changed, ["-  level: info", "+  level: debug"], "{diff}");
        assert!(diff.starts_with("--- desired ConfigMap n/c\n+++ live ConfigMap n/c\n"), "{diff}");
    }
}
