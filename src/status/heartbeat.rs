//! Liveness: each agent's signed heartbeat, one force-updated ref per cluster
//! (`refs/fleetgate/heartbeat/<cluster>`), and what readers make of it.
//!
//! Agents write statuses only on transitions, so a dead agent would look like a healthy idle one.
//! A heartbeat says "this cluster's agent was alive at `at` and beats every `intervalSeconds`".
//! It is a parentless commit of the empty tree whose message is the [`Heartbeat`] as JSON; each
//! beat force-pushes a new root commit over the ref, so the ref never grows a history (the
//! previous beat is unreachable and the server's gc drops it) and no branch, tag or notes history
//! gains a commit.
//!
//! A heartbeat is signed with the cluster's status key ([`super::identity`]) in its own sshsig
//! namespace, [`HEARTBEAT_NAMESPACE`], so a heartbeat signature never verifies as a status entry
//! and the other way round. Readers ([`read`]) believe a heartbeat only when it names their fleet
//! and the cluster of its ref and verifies against that cluster's registered key; anything else is
//! ignored (logged), so a forged heartbeat cannot make a dead agent look alive. A replayed older
//! heartbeat can only make a cluster look *less* alive.

use super::identity::{KeyError, StatusIdentity, StatusKeys, Unverified};
use super::memo::{self, Record, Remembered, VerifiedBeats};
use super::notes::{GitRemote, NotesError, push};
use chrono::{DateTime, Utc};
use git2::{Oid, Repository};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

pub use crate::source::HEARTBEAT_PREFIX;

/// The sshsig namespace of heartbeat signatures (statuses use [`super::STATUS_NAMESPACE`]).
pub const HEARTBEAT_NAMESPACE: &str = "fleetgate-heartbeat";

/// First line of the canonical form a heartbeat is signed over.
const CANONICAL_HEADER: &str = "fleetgate-heartbeat-v1\n";

/// A cluster is stale once it has not been heard from for this many of its heartbeat intervals
/// (unless the reader gives its own allowance, `fleetgate status --stale-after`).
pub const STALE_FACTOR: u32 = 3;

/// `refs/fleetgate/heartbeat/<cluster>`.
pub fn heartbeat_ref(cluster: &str) -> String {
    format!("{HEARTBEAT_PREFIX}{cluster}")
}

/// One beat of one cluster's agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    pub fleet: String,
    pub cluster: String,
    /// When it was sent, on the agent's clock.
    pub at: DateTime<Utc>,
    /// How often the agent beats; readers allow [`STALE_FACTOR`] times this.
    pub interval_seconds: u64,
    pub agent_version: String,
    /// sshsig over [`Heartbeat::canonical_form`], namespace [`HEARTBEAT_NAMESPACE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

impl Heartbeat {
    /// The bytes the signature covers: a header line and compact JSON of every field but the
    /// signature, in declaration order.
    pub fn canonical_form(&self) -> Vec<u8> {
        let unsigned = Heartbeat { signature: None, ..self.clone() };
        let mut out = CANONICAL_HEADER.as_bytes().to_vec();
        out.extend(serde_json::to_vec(&unsigned).expect("a heartbeat always serializes"));
        out
    }

    /// A beat of `cluster` now, signed as `identity`.
    pub fn signed(identity: &StatusIdentity, cluster: &str, interval: Duration) -> Result<Heartbeat, KeyError> {
        let mut beat = Heartbeat {
            fleet: identity.fleet.clone(),
            cluster: cluster.to_string(),
            at: Utc::now(),
            interval_seconds: interval.as_secs().max(1),
            agent_version: crate::VERSION.to_string(),
            signature: None,
        };
        beat.signature = Some(identity.signer.sign_ssh(HEARTBEAT_NAMESPACE, &beat.canonical_form())?);
        Ok(beat)
    }

    /// Whether this beat, found in `cluster`'s heartbeat ref, was sent by that cluster's agent for
    /// the fleet of `keys` and not changed since.
    pub fn verify(&self, cluster: &str, keys: &StatusKeys) -> Result<(), Unverified> {
        let Some(armored) = &self.signature else { return Err(Unverified::Unsigned) };
        if self.cluster != cluster {
            return Err(Unverified::WrongCluster { cluster: cluster.to_string(), named: self.cluster.clone() });
        }
        if self.fleet != keys.fleet() {
            return Err(Unverified::WrongFleet { fleet: keys.fleet().to_string(), named: Some(self.fleet.clone()) });
        }
        keys.verify_signed(cluster, HEARTBEAT_NAMESPACE, &self.canonical_form(), armored)
    }

    /// How long after [`Heartbeat::at`] the cluster counts as not heard from.
    pub fn allowance(&self) -> Duration {
        Duration::from_secs(self.interval_seconds) * STALE_FACTOR
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HeartbeatError {
    #[error("signing the heartbeat")]
    Sign(#[from] KeyError),
    #[error("the local heartbeat repository")]
    Repo(#[from] git2::Error),
    #[error(transparent)]
    Push(#[from] NotesError),
    #[error("{url} refused the heartbeat ref: {reason} (does the Git credential allow pushing refs/fleetgate/*?)")]
    Refused { url: String, reason: String },
}

/// Sends one beat of `cluster`: [`record`]s it in `repo` (any bare repository of the agent's; the
/// beat needs nothing from the fleet's history) and force-pushes the heartbeat ref to `remote`.
///
/// Blocking (network I/O); call it from `spawn_blocking` in async code.
///
/// # Errors
/// Signing, the local repository, the push's transport, or a remote that refuses the ref.
pub fn beat(
    repo: &Repository,
    remote: &GitRemote,
    identity: &StatusIdentity,
    cluster: &str,
    interval: Duration,
) -> Result<Heartbeat, HeartbeatError> {
    let beat = record(repo, identity, cluster, interval)?;
    let refname = heartbeat_ref(cluster);
    match push(repo, remote, &format!("+{refname}:{refname}"), None)? {
        None => Ok(beat),
        Some(reason) => Err(HeartbeatError::Refused { url: remote.url().to_string(), reason }),
    }
}

/// Writes a beat of `cluster` now, signed as `identity`, as a new root commit in `repo` and points
/// `repo`'s heartbeat ref of `cluster` at it (replacing the previous beat).
///
/// # Errors
/// Signing or the local repository.
pub fn record(
    repo: &Repository,
    identity: &StatusIdentity,
    cluster: &str,
    interval: Duration,
) -> Result<Heartbeat, HeartbeatError> {
    let beat = Heartbeat::signed(identity, cluster, interval)?;
    let message = serde_json::to_string_pretty(&beat).expect("a heartbeat always serializes");
    let sig = git2::Signature::new(
        &format!("fleetgate/{cluster}"),
        "fleetgate@localhost",
        &git2::Time::new(beat.at.timestamp(), 0),
    )?;
    let tree = repo.find_tree(repo.treebuilder(None)?.write()?)?;
    let commit = repo.commit(None, &sig, &sig, &message, &tree, &[])?;
    repo.reference(&heartbeat_ref(cluster), commit, true, "fleetgate: heartbeat")?;
    Ok(beat)
}

/// The verified heartbeat of every cluster whose ref `repo` holds (a reader's mirror fetches
/// them: [`crate::source::Source::with_heartbeats`]). Refs that are not a readable heartbeat, or
/// whose heartbeat does not verify with `keys`, are left out with a warning.
///
/// # Errors
/// A local repository failure.
pub fn read(repo: &Repository, keys: &StatusKeys) -> Result<BTreeMap<String, Heartbeat>, git2::Error> {
    read_remembering(repo, keys, &mut VerifiedBeats::default())
}

/// [`read`], taking from `memo` the beats verified before (no signature check) and leaving in it
/// the ones verified now. A beat is remembered under its commit id, the cluster, the fleet and
/// the cluster's key ([`super::memo`]): a moved ref or another registered key is checked again.
/// A refreshing reader (`--watch`, `--serve`) and, through the memory's file, the next one-shot
/// `fleetgate status` check only the beats that moved since.
///
/// # Errors
/// A local repository failure.
pub fn read_remembering(
    repo: &Repository,
    keys: &StatusKeys,
    memo: &mut VerifiedBeats,
) -> Result<BTreeMap<String, Heartbeat>, git2::Error> {
    // Remembered beats are taken as they are; the others are read here and their signatures
    // checked below, on two threads for a big fleet (one Ed25519 check each is most of the work).
    let mut known = BTreeMap::new();
    let mut unchecked = Vec::new();
    for r in repo.references_glob(&format!("{HEARTBEAT_PREFIX}*"))? {
        let r = r?;
        let (Ok(name), Some(target)) = (r.name(), r.target()) else { continue };
        let cluster = name[HEARTBEAT_PREFIX.len()..].to_string();
        // Without a registered key nothing verifies, and nothing is remembered.
        let record = keys.get(&cluster).map(|key| memo::beat_record(keys, &cluster, target, key));
        if let Some((beat, remembered)) = record.as_ref().and_then(|r| memo.recall(r, &cluster, keys.fleet())) {
            known.insert(cluster, (beat, Some(remembered)));
            continue;
        }
        match parse(repo, target) {
            Ok(beat) => unchecked.push((cluster, record, beat)),
            Err(why) => tracing::warn!(refname = name, %why, "ignoring a heartbeat"),
        }
    }
    let check = |batch: &[(String, Option<Record>, Heartbeat)]| -> Vec<Result<(), Unverified>> {
        batch.iter().map(|(cluster, _, beat)| beat.verify(cluster, keys)).collect()
    };
    let verdicts = if unchecked.len() < PARALLEL_BEATS {
        check(&unchecked)
    } else {
        let (a, b) = unchecked.split_at(unchecked.len() / 2);
        std::thread::scope(|s| {
            let first = s.spawn(|| check(a));
            let second = check(b);
            let mut all = first.join().expect("a signature check does not panic");
            all.extend(second);
            all
        })
    };
    for ((cluster, record, beat), verdict) in unchecked.into_iter().zip(verdicts) {
        match verdict {
            Ok(()) => {
                let remembered = record.map(|r| Remembered::beat(r, &beat));
                known.insert(cluster, (beat, remembered));
            }
            Err(why) => tracing::warn!(refname = %heartbeat_ref(&cluster), %why, "ignoring a heartbeat"),
        }
    }
    // By cluster, so an unchanged fleet's memory is used in the order it is stored (no rewrite).
    let mut used = Vec::with_capacity(known.len());
    let out = known
        .into_iter()
        .map(|(cluster, (beat, remembered))| {
            used.extend(remembered);
            (cluster, beat)
        })
        .collect();
    memo.replace(used);
    Ok(out)
}

/// From this many unchecked heartbeats on, their signatures are checked on two threads.
const PARALLEL_BEATS: usize = 64;

fn parse(repo: &Repository, target: Oid) -> Result<Heartbeat, String> {
    let commit = repo.find_commit(target).map_err(|_| "not a commit".to_string())?;
    serde_json::from_slice(commit.message_bytes()).map_err(|e| format!("not a fleetgate heartbeat ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::StatusSigner;

    fn identity() -> StatusIdentity {
        StatusIdentity::new("redis-fleet", StatusSigner::generate("cluster-a").unwrap())
    }

    /// `repo` without the object of `cluster`'s beat (opened again: libgit2 caches objects), so
    /// a read can only take the beat from a memory.
    fn forget_object(repo: Repository, cluster: &str) -> Repository {
        let oid = repo.refname_to_id(&heartbeat_ref(cluster)).unwrap();
        let hex = oid.to_string();
        std::fs::remove_file(repo.path().join("objects").join(&hex[..2]).join(&hex[2..])).unwrap();
        let repo = Repository::open_bare(repo.path()).unwrap();
        assert!(parse(&repo, oid).is_err());
        repo
    }

    /// A one-shot reader's memory: what the last run saved to `dir`.
    fn read_with_file(repo: &Repository, keys: &StatusKeys, dir: &std::path::Path) -> BTreeMap<String, Heartbeat> {
        let mut memo = super::super::VerifiedNotes::open(dir.join("verified-notes"));
        let beats = read_remembering(repo, keys, &mut memo.beats).unwrap();
        memo.save().unwrap();
        beats
    }

    #[test]
    fn a_beat_verified_by_the_last_run_is_taken_from_the_memory_file() {
        let repo_dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(repo_dir.path()).unwrap();
        let cache = tempfile::tempdir().unwrap();
        let id = identity();
        let keys = id.keys_for("cluster-a");
        record(&repo, &id, "cluster-a", Duration::from_secs(60)).unwrap();
        let first = read_with_file(&repo, &keys, cache.path());
        assert_eq!(first.len(), 1);
        let file = cache.path().join("verified-heartbeats");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        // The beat's commit gone: the next run can only have it from the memory, whole.
        let repo = forget_object(repo, "cluster-a");
        assert_eq!(read_with_file(&repo, &keys, cache.path()), first);
        // Nothing moved: the file is not rewritten.
        use std::os::unix::fs::MetadataExt;
        let inode = std::fs::metadata(&file).unwrap().ino();
        assert_eq!(read_with_file(&repo, &keys, cache.path()), first);
        assert_eq!(std::fs::metadata(&file).unwrap().ino(), inode, "rewritten although nothing moved");
    }

    #[test]
    fn a_moved_ref_or_another_key_is_checked_again_not_taken_from_the_memory() {
        let repo_dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(repo_dir.path()).unwrap();
        let cache = tempfile::tempdir().unwrap();
        let id = identity();
        let keys = id.keys_for("cluster-a");
        record(&repo, &id, "cluster-a", Duration::from_secs(60)).unwrap();
        assert_eq!(read_with_file(&repo, &keys, cache.path()).len(), 1);
        // Another key registered for the cluster now: the memory proves nothing for it.
        assert!(read_with_file(&repo, &identity().keys_for("cluster-a"), cache.path()).is_empty());
        // Verified again with the right key, then a forged beat moves the ref: it is checked.
        assert_eq!(read_with_file(&repo, &keys, cache.path()).len(), 1);
        record(&repo, &identity(), "cluster-a", Duration::from_secs(60)).unwrap();
        assert!(read_with_file(&repo, &keys, cache.path()).is_empty());
        // The agent's next beat moves it again: checked, believed, its own time.
        let next = record(&repo, &id, "cluster-a", Duration::from_secs(60)).unwrap();
        assert_eq!(read_with_file(&repo, &keys, cache.path())["cluster-a"], next);
        // In memory (`--watch`) the same.
        let mut memo = VerifiedBeats::default();
        assert_eq!(read_remembering(&repo, &keys, &mut memo).unwrap().len(), 1);
        assert!(read_remembering(&repo, &identity().keys_for("cluster-a"), &mut memo).unwrap().is_empty());
        record(&repo, &identity(), "cluster-a", Duration::from_secs(60)).unwrap();
        assert!(read_remembering(&repo, &keys, &mut memo).unwrap().is_empty());
    }

    /// A damaged memory file, or one others can write, is not believed: the beats it held are
    /// read and checked again.
    #[test]
    fn a_corrupted_or_exposed_memory_file_is_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let repo_dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(repo_dir.path()).unwrap();
        let cache = tempfile::tempdir().unwrap();
        let id = identity();
        let keys = id.keys_for("cluster-a");
        record(&repo, &id, "cluster-a", Duration::from_secs(60)).unwrap();
        read_with_file(&repo, &keys, cache.path());
        let file = cache.path().join("verified-heartbeats");
        let good = std::fs::read(&file).unwrap();
        let repo = forget_object(repo, "cluster-a");
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        for (what, bytes, mode) in [
            ("a flipped byte", flipped, 0o600),
            ("torn", good[..good.len() - 1].to_vec(), 0o600),
            ("mode 0666", good.clone(), 0o666),
        ] {
            std::fs::write(&file, bytes).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            // Only the memory could give the beat (its object is gone): it is not believed.
            assert!(read_with_file(&repo, &keys, cache.path()).is_empty(), "{what}");
        }
        // The same bytes, intact and private: believed (the cases above fail for their damage).
        std::fs::write(&file, &good).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_with_file(&repo, &keys, cache.path()).len(), 1);
    }

    #[test]
    fn a_big_fleets_beats_are_checked_on_two_threads_and_a_forgery_among_them_is_left_out() {
        let repo_dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(repo_dir.path()).unwrap();
        let mut keys = StatusKeys::new("redis-fleet");
        for i in 0..PARALLEL_BEATS + 6 {
            let id = identity();
            let cluster = format!("c-{i:03}");
            record(&repo, &id, &cluster, Duration::from_secs(60)).unwrap();
            // c-007's registered key is not the one that signed its beat.
            keys.insert(&cluster, if i == 7 { identity().signer.public() } else { id.signer.public() });
        }
        let beats = read(&repo, &keys).unwrap();
        assert_eq!(beats.len(), PARALLEL_BEATS + 5);
        assert!(!beats.contains_key("c-007") && beats.contains_key("c-006") && beats.contains_key("c-069"));
    }

    #[test]
    fn a_signed_heartbeat_verifies_after_a_json_round_trip() {
        let id = identity();
        let beat = Heartbeat::signed(&id, "cluster-a", Duration::from_secs(120)).unwrap();
        let again: Heartbeat = serde_json::from_str(&serde_json::to_string_pretty(&beat).unwrap()).unwrap();
        assert_eq!(again.verify("cluster-a", &id.keys_for("cluster-a")), Ok(()));
        assert_eq!(again.allowance(), Duration::from_secs(360));
    }

    #[test]
    fn a_forged_or_replanted_heartbeat_is_not_believed() {
        let id = identity();
        let keys = id.keys_for("cluster-a");
        let beat = Heartbeat::signed(&id, "cluster-a", Duration::from_secs(60)).unwrap();
        let moved = Heartbeat { at: beat.at + chrono::Duration::hours(1), ..beat.clone() };
        assert_eq!(moved.verify("cluster-a", &keys), Err(Unverified::BadSignature));
        let unsigned = Heartbeat { signature: None, ..beat.clone() };
        assert_eq!(unsigned.verify("cluster-a", &keys), Err(Unverified::Unsigned));
        let other = Heartbeat::signed(&identity(), "cluster-a", Duration::from_secs(60)).unwrap();
        assert_eq!(other.verify("cluster-a", &keys), Err(Unverified::OtherKey("cluster-a".into())));
        assert!(matches!(beat.verify("cluster-b", &keys), Err(Unverified::WrongCluster { .. })));
        assert!(matches!(
            beat.verify("cluster-a", &StatusKeys::new("other-fleet")),
            Err(Unverified::WrongFleet { .. })
        ));
        // A status signature (another namespace) over the same bytes is no heartbeat signature.
        let as_status = Heartbeat {
            signature: Some(id.signer.sign_ssh(super::super::STATUS_NAMESPACE, &beat.canonical_form()).unwrap()),
            ..beat
        };
        assert!(matches!(as_status.verify("cluster-a", &keys), Err(Unverified::Namespace(_))));
    }
}
