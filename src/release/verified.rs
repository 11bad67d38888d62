//! [`VerifiedRelease`]: a release whose tag signature, tag pin and mapping consistency all passed.
//! Its fields are private and its normal constructor is crate-private, so content that did not go
//! through verification cannot reach a cluster by mistake.
//!
//! [`UnverifiedRelease`] is the same content read from a tag without those checks: enough to
//! show something (a drift report), never accepted by `apply`. Both are [`ReleaseFiles`], which is
//! all that reading manifests needs.

use super::verify::{ReleaseContent, VerifyError};
use crate::model::{ClusterFacts, Release, select_variant};
use std::collections::BTreeMap;

/// A release's manifest files under its id: what manifests are parsed from. Deliberately not a
/// proof of anything; `apply` asks for a [`VerifiedRelease`] itself.
pub trait ReleaseFiles {
    /// The release id (its tag name).
    fn id(&self) -> &str;
    /// Manifest files (path relative to the repo root → bytes), in path order.
    fn files(&self) -> &BTreeMap<String, Vec<u8>>;
    /// Where namespaced objects without `metadata.namespace` go (`spec.namespace`).
    fn default_namespace(&self) -> Option<&str>;
}

#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedRelease {
    id: String,
    commit: String,
    signer: Option<String>,
    /// The release document and its manifest files (each variant's until one is selected).
    content: ReleaseContent,
    /// The variant this value is, once selected ([`Self::for_cluster`]).
    variant: Option<String>,
}

impl VerifiedRelease {
    pub(crate) fn new(id: String, commit: String, signer: Option<String>, content: ReleaseContent) -> Self {
        VerifiedRelease { id, commit, signer, content, variant: None }
    }

    /// Wraps content that was **not** verified, for tests of the later stages (the apply engine's
    /// integration tests enable the `test-support` feature); no build that ships has it.
    #[cfg(any(test, feature = "test-support"))]
    pub fn assume_verified(release: Release, commit: impl Into<String>, files: BTreeMap<String, Vec<u8>>) -> Self {
        let id = release.metadata.name.clone();
        let content = ReleaseContent { release, files, variants: BTreeMap::new() };
        VerifiedRelease { id, commit: commit.into(), signer: None, content, variant: None }
    }

    /// The release id (equal to its tag name).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The tagged commit's id (hex).
    pub fn commit(&self) -> &str {
        &self.commit
    }

    /// Fingerprint of the key that signed the tag (None only in tests' `assume_verified`).
    pub fn signer(&self) -> Option<&str> {
        self.signer.as_deref()
    }

    pub fn release(&self) -> &Release {
        &self.content.release
    }

    /// Manifest files (path relative to the repo root → bytes), in path order.
    pub fn files(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.content.files
    }

    /// The variant this release is, once [`Self::for_cluster`] selected one.
    pub fn variant(&self) -> Option<&str> {
        self.variant.as_deref()
    }

    /// The release as the cluster with `facts` and agent `labels` runs it
    /// ([`ReleaseContent::for_cluster`]) — still verified, since every variant was verified with
    /// the release. A release without variants, or one already selected, is returned as it is.
    ///
    /// # Errors
    /// [`VerifyError::NoVariant`] when no variant fits (it names the facts and every selector).
    pub fn for_cluster(self, facts: &ClusterFacts, labels: &BTreeMap<String, String>) -> Result<Self, VerifyError> {
        let (content, variant) = self.content.for_cluster(&self.id, facts, labels)?;
        Ok(VerifiedRelease { content, variant: variant.or(self.variant), ..self })
    }
}

impl ReleaseContent {
    /// The content as the cluster with `facts` and agent `labels` runs it: the variant they select
    /// ([`select_variant`]), with its images, mapping and manifests in place of the base
    /// rendering's, and its name. Content without variants is returned as it is (no name).
    ///
    /// # Errors
    /// [`VerifyError::NoVariant`] (of release `id`) when no variant fits.
    pub fn for_cluster(
        mut self,
        id: &str,
        facts: &ClusterFacts,
        labels: &BTreeMap<String, String>,
    ) -> Result<(ReleaseContent, Option<String>), VerifyError> {
        let chosen = match select_variant(&self.release.spec, facts, labels) {
            Ok(Some(v)) => v.clone(),
            Ok(None) => return Ok((self, None)),
            Err(source) => return Err(VerifyError::NoVariant { release: id.to_string(), source }),
        };
        self.release.spec = self.release.spec.for_variant(&chosen);
        self.files = self.variants.remove(&chosen.name).unwrap_or_default();
        self.variants.clear();
        Ok((self, Some(chosen.name)))
    }
}

impl ReleaseFiles for VerifiedRelease {
    fn id(&self) -> &str {
        &self.id
    }

    fn files(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.content.files
    }

    fn default_namespace(&self) -> Option<&str> {
        self.content.release.spec.namespace.as_deref()
    }
}

/// A release as its tag holds it, signature not checked. Anyone may build one: it carries no
/// claim, and nothing that changes a cluster takes it.
#[derive(Debug, Clone)]
pub struct UnverifiedRelease {
    id: String,
    content: ReleaseContent,
}

impl UnverifiedRelease {
    /// The content of tag `id`, as [`super::read_release`] read it.
    pub fn new(id: impl Into<String>, content: ReleaseContent) -> Self {
        UnverifiedRelease { id: id.into(), content }
    }

    pub fn release(&self) -> &Release {
        &self.content.release
    }

    /// The release as a cluster with `facts` and agent `labels` runs it, and the variant's name
    /// ([`ReleaseContent::for_cluster`]).
    ///
    /// # Errors
    /// [`VerifyError::NoVariant`] when no variant fits.
    pub fn for_cluster(
        self,
        facts: &ClusterFacts,
        labels: &BTreeMap<String, String>,
    ) -> Result<(Self, Option<String>), VerifyError> {
        let (content, variant) = self.content.for_cluster(&self.id, facts, labels)?;
        Ok((UnverifiedRelease { content, ..self }, variant))
    }
}

impl ReleaseFiles for UnverifiedRelease {
    fn id(&self) -> &str {
        &self.id
    }

    fn files(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.content.files
    }

    fn default_namespace(&self) -> Option<&str> {
        self.content.release.spec.namespace.as_deref()
    }
}
