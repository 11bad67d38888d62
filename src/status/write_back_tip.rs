//! Write-back tips in signed promotion mode: a branch tip no promotion key signed is still
//! accepted when it is an agent's write-back (release::promotion's module docs have the rules):
//! SSH-signed by cluster C's status key, changing nothing but `clusters/C.yaml`'s release pin, to
//! a release C's verified statuses say it ran. It lives here, above `release`, because judging it
//! takes the clusters' status keys and their notes.

use super::{State, Status, StatusKey, StatusKeys, read_all};
use crate::model::{CLUSTERS_DIR, FleetConfig, PromotionMode};
use crate::release::{GIT_NAMESPACE, Keyring, PromotionError, TipTrust, WriteBack, check_descends};
use crate::source::{Checkout, SourceError, short};
use ssh_key::SshSig;

/// Judges the checkout's tip under `mode`: [`crate::release::check_tip`], and in signed mode a
/// tip no promotion key signed is judged as a write-back with `clusters`, the pinned status keys.
pub fn check_tip(
    checkout: &Checkout,
    mode: PromotionMode,
    keyring: &Keyring,
    accepted: Option<&str>,
    clusters: &StatusKeys,
) -> Result<TipTrust, PromotionError> {
    match crate::release::check_tip(checkout, mode, keyring, accepted) {
        Err(PromotionError::UnsignedTip { commit, problem }) => {
            let tip = checkout.tip();
            let Some((cluster, keys)) = write_back_signer(checkout, tip, clusters)? else {
                return Err(PromotionError::UnsignedTip { commit, problem });
            };
            let trust = check_write_back(checkout, tip, &cluster, &keys)?;
            check_descends(checkout, mode, accepted)?;
            check_beneath(checkout, tip, &cluster, keyring, accepted, clusters)?;
            Ok(trust)
        }
        judged => judged,
    }
}

/// How many write-backs in a row (several clusters rolling back at once) are followed down to
/// the commit they were written on.
const MAX_WRITE_BACK_CHAIN: usize = 32;

/// A write-back is accepted only on top of a commit that was itself acceptable: the accepted tip,
/// a commit a promotion key signed that descends from it, or another write-back on such a commit.
/// Otherwise an unsigned commit (a new cluster with the pusher's own status key, weaker settings)
/// could be laundered by a write-back signed on top of it.
fn check_beneath(
    checkout: &Checkout,
    commit: git2::Oid,
    cluster: &str,
    keyring: &Keyring,
    accepted: Option<&str>,
    clusters: &StatusKeys,
) -> Result<(), PromotionError> {
    let parent_of = |c: git2::Oid| -> Result<git2::Oid, PromotionError> {
        let found = checkout.repo().find_commit(c).map_err(SourceError::from)?;
        Ok(found.parent_id(0).map_err(SourceError::from)?)
    };
    let mut parent = parent_of(commit)?;
    for _ in 0..MAX_WRITE_BACK_CHAIN {
        if accepted.is_some_and(|a| parent.to_string() == a) {
            return Ok(());
        }
        let signed = crate::release::verify_commit(checkout, parent, keyring).is_ok();
        if signed && crate::release::descends_from(checkout, parent, accepted) {
            return Ok(());
        }
        let Some((by, keys)) = write_back_signer(checkout, parent, clusters)? else { break };
        if check_write_back(checkout, parent, &by, &keys).is_err() {
            break;
        }
        parent = parent_of(parent)?;
    }
    Err(PromotionError::WriteBackOnUnacceptedParent {
        commit: short(commit),
        cluster: cluster.to_string(),
        parent: short(parent),
    })
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
                && let Ok(key) = StatusKey::parse(&text)
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
    let statuses = |id: &str| -> Result<Vec<Status>, PromotionError> {
        let Some(tag) = checkout.tag(id)? else { return Ok(Vec::new()) };
        let set = read_all(checkout.repo(), &[tag.commit], keys).map_err(|e| PromotionError::Statuses(Box::new(e)))?;
        Ok(set.history(cluster, id).to_vec())
    };
    if statuses(release)?.iter().any(|s| s.state == State::Success) {
        return Ok(true);
    }
    let Some(wb) = trailers.filter(|wb| wb.rolled_back_to == release) else { return Ok(false) };
    Ok(statuses(&wb.release)?.iter().any(|s| s.state == State::Failure && s.rollback_to.as_deref() == Some(release)))
}

#[cfg(test)]
mod tests {
    use super::cluster_of;

    #[test]
    fn cluster_files_name_their_cluster() {
        assert_eq!(cluster_of("clusters/cluster-a.yaml"), Some("cluster-a"));
        assert_eq!(cluster_of("clusters/x/cluster-a.yaml"), None);
        assert_eq!(cluster_of("fleet.yaml"), None);
    }
}
