//! The branch tip as a decision. With `promotions: signed` the tip must be a commit signed by a
//! trusted promotion key that descends from the last tip the agent accepted: a force-push to an
//! older (signed) commit would otherwise replay an old configuration. With `promotions: unsigned`
//! the tip is anyone's push, and a signature on it still counts as a *signed decision* (it may
//! move a cluster back to an older release, or clear a rejection).
//!
//! One more commit is accepted as a signed-mode tip without a promotion key: an agent's
//! **write-back** ([`WriteBack`]'s trailers), SSH-signed in namespace `git` by the status key of
//! cluster C (the key pinned for C, or on first sight the one its parent registers). It must,
//! relative to its single parent, change nothing but `clusters/C.yaml`'s `spec.release`, to a
//! release C ran: a verified `success` status of C for it, or a verified `failure` of C for the
//! release named by `Fleetgate-Release` that says C rolled back to it. Each other shape is refused
//! with its own [`PromotionError`]. A write-back is not a signed decision: it cannot change keys,
//! settings or other clusters, and the safety settings still come from the release's signed tree.

use super::trust::{GIT_NAMESPACE, Keyring, SignatureProblem};
use super::verify::{VerifyError, verify_commit};
use crate::model::{CLUSTERS_DIR, ErrorClass, FleetConfig, PromotionMode};
use crate::source::{Checkout, SourceError, short};
use crate::status::{State, StatusKeys};
use ssh_key::SshSig;

/// How far this pass trusts the branch tip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TipTrust {
    /// Anyone's push: it chooses among signed releases; settings come from the release's tag.
    Unsigned,
    /// Signed by promotion key `signer` (and, in signed mode, descending from the accepted tip).
    Signed { signer: String },
    /// In signed mode: the write-back of `cluster`'s agent, pinning it to `release` (module docs).
    WriteBack { cluster: String, release: String },
}

impl TipTrust {
    pub fn is_signed(&self) -> bool {
        matches!(self, TipTrust::Signed { .. })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PromotionError {
    #[error(
        "promotions are signed, but the branch tip {commit} is not signed by a promotion key ({problem}); sign promotion commits (git commit -S, `fleetgate promote --sign-key`, or a forge that signs merges)"
    )]
    UnsignedTip { commit: String, problem: SignatureProblem },
    #[error(
        "the branch tip {tip} does not descend from {accepted}, the last tip this agent accepted: a force-push to an older or unrelated commit is refused; push a new signed commit on top of {accepted}"
    )]
    NotDescendant { tip: String, accepted: String },
    #[error(
        "the branch tip {commit} is signed by the status key of cluster {cluster} but is a merge; a write-back has exactly one parent"
    )]
    WriteBackMerge { commit: String, cluster: String },
    #[error(
        "the branch tip {commit} is signed by the status key of cluster {cluster} but pins cluster {other} (clusters/{other}.yaml); an agent's write-back may pin its own cluster only"
    )]
    WriteBackOtherCluster { commit: String, cluster: String, other: String },
    #[error(
        "the branch tip {commit} is signed by the status key of cluster {cluster} but changes {path}; a write-back changes nothing but clusters/{cluster}.yaml"
    )]
    WriteBackOtherFile { commit: String, cluster: String, path: String },
    #[error(
        "the branch tip {commit} is signed by the status key of cluster {cluster} but changes more of clusters/{cluster}.yaml than spec.release ({what}); a write-back only pins the release"
    )]
    WriteBackNotAPin { commit: String, cluster: String, what: String },
    #[error(
        "the branch tip {commit} is signed by the status key of cluster {cluster} and pins it to {release}, a release {cluster} never reported running (no verified success, and no verified rollback to it); a write-back pins only a release the cluster runs"
    )]
    WriteBackUnrunRelease { commit: String, cluster: String, release: String },
    #[error("reading the statuses a write-back is checked against")]
    Statuses(#[from] crate::status::NotesError),
    #[error(transparent)]
    Source(#[from] SourceError),
}

impl PromotionError {
    pub fn class(&self) -> ErrorClass {
        match self {
            PromotionError::UnsignedTip { problem, .. } => problem.class(),
            PromotionError::Source(e) => e.class(),
            PromotionError::Statuses(_) => ErrorClass::Retryable,
            // A write-back whose status note has not arrived yet is re-judged every pass anyway.
            _ => ErrorClass::Stalling,
        }
    }
}

/// The trailers of an agent's write-back commit (`--write-back`); `fleetgate rollback` reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteBack {
    /// `Fleetgate-Release`: the release the agent rolled back.
    pub release: String,
    /// `Fleetgate-Reason`: why (the failure category, e.g. `GateFailed`).
    pub reason: String,
    /// `Fleetgate-Failure`: the failed gate with its figure and threshold (absent before it existed).
    pub failure: Option<String>,
    /// `Fleetgate-Rolled-Back-To`: the release the agent went back to, now pinned.
    pub rolled_back_to: String,
}

impl WriteBack {
    pub const RELEASE: &'static str = "Fleetgate-Release";
    pub const REASON: &'static str = "Fleetgate-Reason";
    pub const FAILURE: &'static str = "Fleetgate-Failure";
    pub const ROLLED_BACK_TO: &'static str = "Fleetgate-Rolled-Back-To";

    /// The trailers of a commit message, when it is a write-back (release and target named).
    pub fn parse(message: &str) -> Option<WriteBack> {
        let trailer = |key: &str| {
            message.lines().rev().find_map(|l| l.strip_prefix(key)?.strip_prefix(':').map(|v| v.trim().to_string()))
        };
        Some(WriteBack {
            release: trailer(Self::RELEASE)?,
            reason: trailer(Self::REASON).unwrap_or_default(),
            failure: trailer(Self::FAILURE),
            rolled_back_to: trailer(Self::ROLLED_BACK_TO)?,
        })
    }

    /// The trailer block, one per line (single-line values: a newline would end the trailer).
    pub fn trailers(&self) -> String {
        let one_line = |v: &str| v.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut out = format!("{}: {}\n{}: {}\n", Self::RELEASE, self.release, Self::REASON, one_line(&self.reason));
        if let Some(f) = &self.failure {
            out.push_str(&format!("{}: {}\n", Self::FAILURE, one_line(f)));
        }
        out.push_str(&format!("{}: {}\n", Self::ROLLED_BACK_TO, self.rolled_back_to));
        out
    }
}

/// The mode an agent applies: its own setting wins; else once it accepted a signed-mode tip it
/// stays signed (a push that writes `promotions: unsigned` cannot leave signed mode); else what
/// the tip's `fleet.yaml` says.
pub fn effective_mode(agent: Option<PromotionMode>, was_signed: bool, tip_says: PromotionMode) -> PromotionMode {
    match agent {
        Some(mode) => mode,
        None if was_signed => PromotionMode::Signed,
        None => tip_says,
    }
}

/// Judges the checkout's tip under `mode`. `accepted` is the last tip accepted in signed mode;
/// `clusters` are the pinned status keys write-backs are checked with (module docs).
pub fn check_tip(
    checkout: &Checkout,
    mode: PromotionMode,
    keyring: &Keyring,
    accepted: Option<&str>,
    clusters: &StatusKeys,
) -> Result<TipTrust, PromotionError> {
    let tip = checkout.tip();
    let trust = match verify_commit(checkout, tip, keyring) {
        Ok(signer) => TipTrust::Signed { signer },
        Err(VerifyError::CommitSignature { problem, .. }) if mode == PromotionMode::Signed => {
            match write_back_signer(checkout, tip, clusters)? {
                Some((cluster, keys)) => check_write_back(checkout, tip, &cluster, &keys)?,
                None => return Err(PromotionError::UnsignedTip { commit: short(tip), problem }),
            }
        }
        Err(VerifyError::CommitSignature { .. }) => TipTrust::Unsigned,
        Err(VerifyError::Source(e)) => return Err(e.into()),
        Err(other) => unreachable!("verify_commit returns signature or source errors only: {other}"),
    };
    if mode == PromotionMode::Signed
        && let Some(accepted) = accepted
        && !descends(checkout, tip, accepted)
    {
        return Err(PromotionError::NotDescendant { tip: short(tip), accepted: accepted.chars().take(12).collect() });
    }
    Ok(trust)
}

/// The cluster whose status key made `commit`'s SSH signature (valid, namespace `git`), with the
/// keys it was found in: `pinned`, completed on first sight by what the parent registers. None
/// when no cluster key signed it.
fn write_back_signer(
    checkout: &Checkout,
    commit: git2::Oid,
    pinned: &StatusKeys,
) -> Result<Option<(String, StatusKeys)>, PromotionError> {
    let (signature, payload) = match checkout.repo().extract_signature(&commit, None) {
        Ok(pair) => pair,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(None),
        Err(e) => return Err(SourceError::from(e).into()),
    };
    let Ok(sig) = SshSig::from_pem(&*signature) else { return Ok(None) };
    if sig.namespace() != GIT_NAMESPACE {
        return Ok(None);
    }
    let mut keys = pinned.clone();
    if let Some(parent) = checkout.repo().find_commit(commit).map_err(SourceError::from)?.parents().next()
        && let Some(config) = config_at(checkout, parent.id())
    {
        for (cluster, text) in StatusKeys::registrations(&config) {
            if keys.get(&cluster).is_none()
                && let Ok(key) = crate::status::StatusKey::parse(&text)
            {
                keys.insert(&cluster, key);
            }
        }
    }
    let found =
        keys.iter().find(|(_, key)| key.public_key().key_data() == sig.public_key()).map(|(c, k)| (c, k.clone()));
    let Some((cluster, key)) = found else { return Ok(None) };
    if key.public_key().verify(GIT_NAMESPACE, &payload, &sig).is_err() {
        return Ok(None);
    }
    let cluster = cluster.to_string();
    Ok(Some((cluster, keys)))
}

fn config_at(checkout: &Checkout, commit: git2::Oid) -> Option<FleetConfig> {
    let tree = checkout.commit_tree(commit, &format!("commit {}", short(commit))).ok()?;
    FleetConfig::load(&tree).ok()
}

/// The rules of a write-back signed by `cluster` (module docs).
fn check_write_back(
    checkout: &Checkout,
    commit: git2::Oid,
    cluster: &str,
    keys: &StatusKeys,
) -> Result<TipTrust, PromotionError> {
    let repo = checkout.repo();
    let at = short(commit);
    let git = |e: git2::Error| PromotionError::Source(e.into());
    let tip = repo.find_commit(commit).map_err(git)?;
    if tip.parent_count() != 1 {
        return Err(PromotionError::WriteBackMerge { commit: at, cluster: cluster.into() });
    }
    let parent = tip.parent(0).map_err(git)?;
    let diff = repo.diff_tree_to_tree(Some(&parent.tree().map_err(git)?), Some(&tip.tree().map_err(git)?), None);
    let paths: Vec<String> = diff
        .map_err(git)?
        .deltas()
        .filter_map(|d| d.new_file().path().or(d.old_file().path()).map(|p| p.to_string_lossy().into_owned()))
        .collect();
    let own = |p: &str| cluster_of(p).is_some_and(|c| c == cluster);
    if let Some(other) = paths.iter().filter_map(|p| cluster_of(p)).find(|c| *c != cluster) {
        return Err(PromotionError::WriteBackOtherCluster { commit: at, cluster: cluster.into(), other: other.into() });
    }
    if let Some(path) = paths.iter().find(|p| !own(p.as_str())) {
        return Err(PromotionError::WriteBackOtherFile { commit: at, cluster: cluster.into(), path: path.clone() });
    }
    let not_a_pin = |what: &str| PromotionError::WriteBackNotAPin {
        commit: short(commit),
        cluster: cluster.into(),
        what: what.to_string(),
    };
    let (Some(before), Some(after)) = (config_at(checkout, parent.id()), config_at(checkout, commit)) else {
        return Err(not_a_pin("the fleet configuration does not load"));
    };
    let (Some(was), Some(now)) = (before.clusters.get(cluster), after.clusters.get(cluster)) else {
        return Err(not_a_pin("the cluster is added or removed"));
    };
    let Some(release) = now.spec.release.clone() else { return Err(not_a_pin("the pin is removed")) };
    let mut unpinned = now.clone();
    unpinned.spec.release = was.spec.release.clone();
    if &unpinned != was {
        return Err(not_a_pin("other fields change"));
    }
    if !ran(checkout, cluster, &release, WriteBack::parse(tip.message().unwrap_or_default()).as_ref(), keys)? {
        return Err(PromotionError::WriteBackUnrunRelease { commit: at, cluster: cluster.into(), release });
    }
    Ok(TipTrust::WriteBack { cluster: cluster.to_string(), release })
}

/// `clusters/<name>.yaml` → `name`.
fn cluster_of(path: &str) -> Option<&str> {
    let file = path.strip_prefix(CLUSTERS_DIR)?.strip_prefix('/')?;
    file.strip_suffix(".yaml").or_else(|| file.strip_suffix(".yml")).filter(|c| !c.contains('/'))
}

/// Whether `cluster` reported running `release`: a verified success for it, or a verified failure
/// of the write-back's rolled-back release that names `release` as where it went back to.
fn ran(
    checkout: &Checkout,
    cluster: &str,
    release: &str,
    trailers: Option<&WriteBack>,
    keys: &StatusKeys,
) -> Result<bool, PromotionError> {
    let statuses = |id: &str| -> Result<Vec<crate::status::Status>, PromotionError> {
        let Some(tag) = checkout.tag(id)? else { return Ok(Vec::new()) };
        let set = crate::status::read_all(checkout.repo(), &[tag.commit], keys)?;
        Ok(set.history(cluster, id).to_vec())
    };
    if statuses(release)?.iter().any(|s| s.state == State::Success) {
        return Ok(true);
    }
    let Some(wb) = trailers.filter(|wb| wb.rolled_back_to == release) else { return Ok(false) };
    Ok(statuses(&wb.release)?.iter().any(|s| s.state == State::Failure && s.rollback_to.as_deref() == Some(release)))
}

/// `tip` is `accepted` or one of its descendants. An accepted commit the mirror no longer has
/// (history rewritten and collected) is not an ancestor.
fn descends(checkout: &Checkout, tip: git2::Oid, accepted: &str) -> bool {
    let Ok(accepted) = git2::Oid::from_str(accepted) else { return false };
    tip == accepted || checkout.repo().graph_descendant_of(tip, accepted).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_back_trailers_round_trip_and_name_the_cluster_files() {
        let wb = WriteBack {
            release: "rel-2".into(),
            reason: "GateFailed".into(),
            failure: Some("pod-restarts observed 4\n> threshold 3".into()),
            rolled_back_to: "rel-1".into(),
        };
        let message = format!("fleetgate: roll c back to rel-1\n\nbody\n\n{}", wb.trailers());
        let parsed = WriteBack::parse(&message).unwrap();
        assert_eq!(parsed.failure.as_deref(), Some("pod-restarts observed 4 > threshold 3"));
        assert_eq!((parsed.release.as_str(), parsed.rolled_back_to.as_str()), ("rel-2", "rel-1"));
        assert_eq!(WriteBack::parse("promote rel-2\n\nFleetgate-Release: rel-2\n"), None);
        assert_eq!(cluster_of("clusters/cluster-a.yaml"), Some("cluster-a"));
        assert_eq!(cluster_of("clusters/x/cluster-a.yaml"), None);
        assert_eq!(cluster_of("fleet.yaml"), None);
    }

    #[test]
    fn the_agents_setting_wins_and_signed_mode_is_sticky() {
        use PromotionMode::*;
        assert_eq!(effective_mode(Some(Unsigned), true, Signed), Unsigned);
        assert_eq!(effective_mode(Some(Signed), false, Unsigned), Signed);
        assert_eq!(effective_mode(None, true, Unsigned), Signed);
        assert_eq!(effective_mode(None, false, Signed), Signed);
        assert_eq!(effective_mode(None, false, Unsigned), Unsigned);
    }
}
