//! `fleetgate approve`: approve a release for a wave whose `approval: required` holds it — the
//! annotated tag `approve/<release>/<wave>` ([`crate::model::approval_tag`]) on the release's
//! commit, signed like a release tag ([`super::sign::write_signed_tag`]), its message saying why.
//! An agent counts it only when an approver's key of its own configuration signed it
//! (`release::check_approval`).

use super::repo::FleetRepo;
use super::{RelengError, Signer, sign};
use crate::model::{ApprovalSetting, approval_tag};
use serde::Serialize;

/// What to approve.
#[derive(Debug, Clone)]
pub struct ApproveRequest {
    pub release: String,
    pub wave: String,
    /// Why (the tag's message); a default names the release and wave.
    pub why: Option<String>,
    /// The branch the agents follow, whose `fleet.yaml` lists the wave.
    pub base: String,
}

/// The approval written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApproveReport {
    pub release: String,
    pub wave: String,
    /// The tag's name, `approve/<release>/<wave>`.
    pub tag: String,
    /// The tag object.
    pub object: String,
    /// The release's commit it points to.
    pub commit: String,
    pub signer: String,
    pub message: String,
    /// Whether `fleet.yaml` on the base branch has the wave require approval (else the tag is
    /// only a record: nothing waits for it).
    pub required: bool,
}

/// Writes the signed approval tag of `req.release` for `req.wave`.
///
/// Refusals (usage errors): no such release tag, a wave `fleet.yaml` does not list, an approval
/// tag that exists already (delete it first to approve again: a tag, once fetched, is not
/// replaced quietly).
pub fn approve(repo: &FleetRepo, req: &ApproveRequest, signer: &mut Signer) -> Result<ApproveReport, RelengError> {
    let release = repo.release_tag(&req.release)?.ok_or_else(|| RelengError::UnknownRelease(req.release.clone()))?;
    let tip = repo.branch_tip(&req.base)?;
    let config = repo.fleet_state(&tip.tree()?, &req.base)?.config;
    let Some((_, wave)) = config.fleet.spec.wave(&req.wave) else {
        return Err(crate::model::SelectError::UnknownWave {
            name: req.wave.clone(),
            known: config.fleet.spec.wave_names().join(", "),
        }
        .into());
    };
    let name = approval_tag(&req.release, &req.wave);
    let refname = format!("refs/tags/{name}");
    if repo.git().find_reference(&refname).is_ok() {
        return Err(RelengError::Usage(format!(
            "{name} exists already; to approve again, delete it first (`git tag -d {name}` and `git push --delete origin {name}`)"
        )));
    }
    let message = req.why.clone().unwrap_or_else(|| format!("approve {} for wave {}", req.release, req.wave));
    let who = repo.identity(Some(signer))?;
    let object = sign::write_signed_tag(repo.git(), signer, release.commit, &name, &who, &message)?;
    repo.git().reference(&refname, object, false, &format!("fleetgate approve {} --wave {}", req.release, req.wave))?;
    Ok(ApproveReport {
        release: req.release.clone(),
        wave: req.wave.clone(),
        tag: name,
        object: object.to_string(),
        commit: release.commit.to_string(),
        signer: signer.fingerprint().to_string(),
        message,
        required: wave.approval == ApprovalSetting::Required,
    })
}
