//! The checks the release commands borrow from the rest of fleetgate, adapted to what they need:
//! release and mapping rules ([`crate::release::read_release`], what `validate` and the agent run),
//! CRD compatibility between releases ([`crate::gates::crd_compat`] over the CRDs
//! `crate::manifests::crds_in_files` finds, as `validate` does), and tag signature
//! verification (the agent's own [`crate::release::verify`]). No rule lives here.

use super::repo::FleetRepo;
use super::{Refusal, RelengError};
use crate::gates::crd_compat;
use crate::manifests::{FileCrd, crds_in_files};
use crate::model::error_chain;
use crate::release::{TagPins, TrustConfig, VerifyError, read_release, resolve_release, verify};
use crate::source::{Checkout, GitTree};
use serde::Serialize;
use std::collections::BTreeMap;

/// The CRD compatibility verdict of a release against the one it replaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CrdVerdict {
    pub compatible: bool,
    /// False when there was nothing to compare with (a first release, or clusters running nothing).
    pub compared: bool,
    pub findings: Vec<String>,
}

impl CrdVerdict {
    pub fn first_release() -> CrdVerdict {
        CrdVerdict { compatible: true, compared: false, findings: Vec::new() }
    }

    /// `compatible`, `INCOMPATIBLE (2 findings)`, `nothing to compare with`.
    pub fn summary(&self) -> String {
        match (self.compared, self.compatible) {
            (false, _) => "nothing to compare with".to_string(),
            (true, true) => "compatible".to_string(),
            (true, false) => format!("INCOMPATIBLE ({} finding(s))", self.findings.len()),
        }
    }
}

/// Is replacing the CRDs in `old` with those in `new` safe for objects that exist, given the
/// breaking changes the new release accepts (`accept`, its `spec.acceptCrdChanges`)?
pub fn crd_compatibility(
    old: &BTreeMap<String, Vec<u8>>,
    new: &BTreeMap<String, Vec<u8>>,
    accept: &[String],
) -> CrdVerdict {
    let accept = match crd_compat::Acceptance::parse_all(accept) {
        Ok(accept) => accept,
        Err(why) => return CrdVerdict { compatible: false, compared: true, findings: vec![why] },
    };
    let (old, new) = match (crds_in_files(old), crds_in_files(new)) {
        (Ok(old), Ok(new)) => (old, new),
        (old, new) => {
            let findings = [old.err(), new.err()].into_iter().flatten().map(|e| error_chain(&e)).collect();
            return CrdVerdict { compatible: false, compared: true, findings };
        }
    };
    let typed = |crds: Vec<FileCrd>| crds.into_iter().map(|c| c.crd).collect::<Vec<_>>();
    let findings: Vec<String> = crd_compat::check_all_with(&typed(old), &typed(new), &accept)
        .iter()
        .filter(|f| f.blocks())
        .map(|f| f.to_string())
        .collect();
    CrdVerdict { compatible: findings.is_empty(), compared: true, findings }
}

/// Every finding `validate` and the agent would report about the release in `tree` once it is
/// tagged `id`: `release.yaml`'s own rules, the manifests' path and size rules, and the mapping
/// ([`crate::release::read_release`]).
pub fn release_findings(repo: &FleetRepo, tree: git2::Oid, id: &str) -> Result<Vec<String>, RelengError> {
    let tree = GitTree::new(repo.git(), repo.git().find_tree(tree)?, format!("release {id}"));
    let (_, findings) = read_release(&tree, Some(id))?;
    Ok(findings.iter().map(|f| f.to_string()).collect())
}

/// Runs the agent's own verification ([`crate::release::verify`]) of release `id` for `cluster`
/// (one the release targets) against the configuration of branch `base`: an annotated tag named
/// `id`, signed by a key of `trust`, whose tree's mapping is consistent. Returns the signer's
/// fingerprint.
///
/// Signature problems become [`Refusal::Unsigned`], mapping problems
/// [`Refusal::MappingInconsistent`]; failures to read the repo are errors.
pub fn verify_release(
    repo: &FleetRepo,
    base: &str,
    id: &str,
    cluster: &str,
    trust: &TrustConfig,
) -> Result<String, RelengError> {
    let env = |source: VerifyError| RelengError::Verify { id: id.to_string(), source: Box::new(source) };
    let checkout = Checkout::open_local(repo.path(), Some(base)).map_err(|e| env(e.into()))?;
    let desired = resolve_release(&checkout, cluster, id).map_err(|e| RelengError::Resolve {
        id: id.to_string(),
        base: base.to_string(),
        source: Box::new(e),
    })?;
    match verify(&checkout, &desired, trust, &mut TagPins::in_memory()) {
        Ok(v) => Ok(v.signer().unwrap_or_default().to_string()),
        Err(VerifyError::MappingMismatch { findings, .. }) => {
            Err(Refusal::MappingInconsistent { findings: findings.iter().map(|f| f.to_string()).collect() }.into())
        }
        Err(
            e @ (VerifyError::Lightweight { .. }
            | VerifyError::TagNameMismatch { .. }
            | VerifyError::Unsigned { .. }
            | VerifyError::UnsupportedSignature { .. }
            | VerifyError::UntrustedKey { .. }
            | VerifyError::BadSignature { .. }
            | VerifyError::InvalidSignature { .. }),
        ) => Err(Refusal::Unsigned { id: id.to_string(), reason: error_chain(&e) }.into()),
        Err(e) => Err(env(e)),
    }
}
