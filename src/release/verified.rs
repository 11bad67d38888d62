//! [`VerifiedRelease`]: a release whose tag signature, tag pin and mapping consistency all passed.
//! Its fields are private and its normal constructor is crate-private, so content that did not go
//! through verification cannot reach a cluster by mistake.

use crate::model::Release;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub struct VerifiedRelease {
    id: String,
    commit: String,
    signer: Option<String>,
    release: Release,
    /// Manifest files of the release, keyed by path relative to the repo root, sorted.
    files: BTreeMap<String, Vec<u8>>,
}

impl VerifiedRelease {
    pub(crate) fn new(
        id: String,
        commit: String,
        signer: Option<String>,
        release: Release,
        files: BTreeMap<String, Vec<u8>>,
    ) -> Self {
        VerifiedRelease { id, commit, signer, release, files }
    }

    /// Wraps content that was **not** verified. For tests of later stages and for tools that
    /// verified by other means; the agent never calls it.
    #[doc(hidden)]
    pub fn assume_verified(release: Release, commit: impl Into<String>, files: BTreeMap<String, Vec<u8>>) -> Self {
        VerifiedRelease { id: release.metadata.name.clone(), commit: commit.into(), signer: None, release, files }
    }

    /// The release id (equal to its tag name).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The tagged commit's id (hex).
    pub fn commit(&self) -> &str {
        &self.commit
    }

    /// Fingerprint of the key that signed the tag (None only for `assume_verified`).
    pub fn signer(&self) -> Option<&str> {
        self.signer.as_deref()
    }

    pub fn release(&self) -> &Release {
        &self.release
    }

    /// Manifest files (path relative to the repo root → bytes), in path order.
    pub fn files(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.files
    }
}
