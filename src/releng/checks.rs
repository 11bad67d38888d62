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
use crate::release::{Keyring, TagPins, VerifyError, read_release, resolve_release, verify};
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
    /// The `--accept-crd-change` values that would accept every blocking finding, compacted
    /// ([`crd_compat::acceptances_for`]); empty when compatible, or when a finding is not a CRD
    /// change (a manifest that does not parse, a bad acceptance), which only a fix can clear.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub accept: Vec<String>,
    /// The blocking findings, typed: what [`CrdVerdict::combined`] compacts acceptances from.
    #[serde(skip)]
    blocking: Vec<crd_compat::Finding>,
}

impl CrdVerdict {
    pub fn first_release() -> CrdVerdict {
        CrdVerdict { compatible: true, compared: false, findings: Vec::new(), accept: Vec::new(), blocking: Vec::new() }
    }

    /// Findings that are not CRD changes (nothing to accept): the verdict is incompatible.
    fn unreadable(findings: Vec<String>) -> CrdVerdict {
        CrdVerdict { compatible: false, compared: true, findings, accept: Vec::new(), blocking: Vec::new() }
    }

    fn of(blocking: Vec<crd_compat::Finding>, untyped: Vec<String>) -> CrdVerdict {
        let mut findings = untyped.clone();
        for f in blocking.iter().map(ToString::to_string) {
            if !findings.contains(&f) {
                findings.push(f);
            }
        }
        // Only a verdict whose every finding can be accepted gets a suggestion: half a fix is none.
        let accept = if untyped.is_empty() {
            crd_compat::acceptances_for(&blocking).iter().map(ToString::to_string).collect()
        } else {
            Vec::new()
        };
        CrdVerdict { compatible: findings.is_empty(), compared: true, findings, accept, blocking }
    }

    /// One verdict over several comparisons (a release against each of its baselines): compatible
    /// when every one is, the findings of all (each once), acceptances compacted over all of them.
    pub fn combined<'a>(verdicts: impl IntoIterator<Item = &'a CrdVerdict>) -> CrdVerdict {
        let (mut blocking, mut untyped, mut compared) = (Vec::new(), Vec::new(), false);
        for v in verdicts {
            compared |= v.compared;
            blocking.extend(v.blocking.iter().cloned());
            let typed: Vec<String> = v.blocking.iter().map(ToString::to_string).collect();
            for f in &v.findings {
                if !typed.contains(f) && !untyped.contains(f) {
                    untyped.push(f.clone());
                }
            }
        }
        if !compared {
            return CrdVerdict::first_release();
        }
        CrdVerdict::of(blocking, untyped)
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
        Err(why) => return CrdVerdict::unreadable(vec![why]),
    };
    let (old, new) = match (crds_in_files(old), crds_in_files(new)) {
        (Ok(old), Ok(new)) => (old, new),
        (old, new) => {
            return CrdVerdict::unreadable(
                [old.err(), new.err()].into_iter().flatten().map(|e| error_chain(&e)).collect(),
            );
        }
    };
    let typed = |crds: Vec<FileCrd>| crds.into_iter().map(|c| c.crd).collect::<Vec<_>>();
    let blocking =
        crd_compat::check_all_with(&typed(old), &typed(new), &accept).into_iter().filter(|f| f.blocks()).collect();
    CrdVerdict::of(blocking, Vec::new())
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
    trust: &Keyring,
) -> Result<String, RelengError> {
    let checkout = Checkout::open_local(repo.path(), Some(base))
        .map_err(|e| RelengError::Verify { id: id.to_string(), source: Box::new(e.into()) })?;
    verify_release_in(&checkout, id, cluster, trust)
}

/// [`verify_release`] against the configuration at `checkout`'s tip (any commit, e.g. a pull
/// request's head).
pub fn verify_release_in(checkout: &Checkout, id: &str, cluster: &str, trust: &Keyring) -> Result<String, RelengError> {
    let env = |source: VerifyError| RelengError::Verify { id: id.to_string(), source: Box::new(source) };
    let desired = resolve_release(checkout, cluster, id).map_err(|e| RelengError::Resolve {
        id: id.to_string(),
        base: checkout.branch().to_string(),
        source: Box::new(e),
    })?;
    match verify(checkout, &desired, trust, None, &mut TagPins::in_memory()) {
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
