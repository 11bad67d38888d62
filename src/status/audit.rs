//! The audit log (`fleetgate audit`): every status entry each cluster's agent wrote, read from the
//! history of its notes ref rather than from the notes' current text.
//!
//! Each status write is one notes commit on `refs/notes/fleetgate/<cluster>`, so the ref's
//! history is an append-only log: a record is an entry that a notes commit added — present in
//! its note of a release commit but in none of its parents' notes of that release commit (a
//! merge of two writers' histories adds nothing of its own). Every record is checked the way
//! `fleetgate status` checks an entry ([`StatusKeys::verify`]: the cluster's registered key, this
//! fleet, the commit the note is attached to). A record that does not verify — unsigned, signed
//! by another key, or rewritten after signing (a rewrite is a new entry in a later notes commit)
//! — is kept, with why, never dropped.

use super::identity::{StatusKeys, Unverified};
use super::model::{Status, StatusNote};
use super::notes::{NOTES_PREFIX, NotesError};
use chrono::{DateTime, Utc};
use git2::{Oid, Repository, Sort};
use serde::{Deserialize, Serialize};

/// One entry as a notes commit added it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The cluster whose notes ref holds it.
    pub cluster: String,
    /// The notes commit that added it.
    pub notes_commit: String,
    /// Whether the cluster's registered key verifies it.
    pub verified: bool,
    /// Why it does not verify.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unverified: Option<String>,
    pub status: Status,
}

impl Record {
    /// When the entry says it was written (`reportedAt`): signed when verified, a claim otherwise.
    pub fn at(&self) -> DateTime<Utc> {
        self.status.reported_at
    }
}

/// Which records [`read_log`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this cluster's.
    pub cluster: Option<String>,
    /// Only those reported at or after this time.
    pub since: Option<DateTime<Utc>>,
}

/// Every record of every cluster's notes ref in `repo` that `filter` admits, each verified with
/// `keys`: per cluster in the order its history recorded them (oldest first), clusters merged by
/// reported time (a stable sort, so one cluster's order is kept where its clock went backwards).
///
/// # Errors
/// A local repository failure. A note that does not parse is skipped with a warning (as
/// [`super::read_all`] does), its commit's other notes are still read.
pub fn read_log(repo: &Repository, keys: &StatusKeys, filter: &Filter) -> Result<Vec<Record>, NotesError> {
    let mut refs: Vec<String> = repo
        .references_glob(&format!("{NOTES_PREFIX}*"))?
        .filter_map(Result::ok)
        .filter_map(|r| r.name().ok().map(str::to_string))
        .collect();
    refs.sort();
    let mut records = Vec::new();
    for refname in refs {
        let cluster = &refname[NOTES_PREFIX.len()..];
        if filter.cluster.as_deref().is_some_and(|c| c != cluster) {
            continue;
        }
        records.extend(
            cluster_log(repo, &refname, cluster, keys)?
                .into_iter()
                .filter(|r| filter.since.is_none_or(|since| r.at() >= since)),
        );
    }
    records.sort_by_key(Record::at);
    Ok(records)
}

/// The records of one notes ref, oldest first.
fn cluster_log(repo: &Repository, refname: &str, cluster: &str, keys: &StatusKeys) -> Result<Vec<Record>, NotesError> {
    let mut walk = repo.revwalk()?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)?;
    walk.push(repo.find_reference(refname)?.peel_to_commit()?.id())?;
    let mut records = Vec::new();
    for id in walk {
        let commit = repo.find_commit(id?)?;
        let tree = commit.tree()?;
        let parents: Vec<git2::Tree<'_>> = commit.parents().map(|p| p.tree()).collect::<Result<_, _>>()?;
        let diff = repo.diff_tree_to_tree(parents.first(), Some(&tree), None)?;
        for delta in diff.deltas() {
            let (Some(path), new) = (delta.new_file().path(), delta.new_file().id()) else { continue };
            if new.is_zero() {
                continue;
            }
            // Notes sit at `<commit hex>` or, fanned out, `ab/cdef…`.
            let annotated = path.to_string_lossy().replace('/', "");
            let before: Vec<Status> =
                parents.iter().filter_map(|p| note_at(repo, p, path, refname)).flat_map(|n| n.entries).collect();
            let Some(note) = read_blob(repo, new, refname, &annotated) else { continue };
            for entry in note.entries.into_iter().filter(|e| !before.contains(e)) {
                let verdict: Result<(), Unverified> = keys.verify(cluster, &annotated, &entry);
                records.push(Record {
                    cluster: cluster.to_string(),
                    notes_commit: commit.id().to_string(),
                    verified: verdict.is_ok(),
                    unverified: verdict.err().map(|why| why.to_string()),
                    status: entry,
                });
            }
        }
    }
    Ok(records)
}

fn note_at(repo: &Repository, tree: &git2::Tree<'_>, path: &std::path::Path, refname: &str) -> Option<StatusNote> {
    let entry = tree.get_path(path).ok()?;
    read_blob(repo, entry.id(), refname, &path.to_string_lossy())
}

fn read_blob(repo: &Repository, blob: Oid, refname: &str, annotated: &str) -> Option<StatusNote> {
    let blob = repo.find_blob(blob).ok()?;
    match StatusNote::parse(&String::from_utf8_lossy(blob.content())) {
        Ok(note) => Some(note),
        Err(e) => {
            tracing::warn!(%refname, commit = %annotated, error = %e, "status note unreadable; skipped");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{State, StatusIdentity, StatusSigner};

    /// Appends `entries` to the note of `on` in `cluster`'s notes ref: one notes commit.
    fn write(repo: &Repository, cluster: &str, on: Oid, entries: &[Status]) {
        let refname = format!("{NOTES_PREFIX}{cluster}");
        let mut note = match repo.find_note(Some(&refname), on) {
            Ok(n) => StatusNote::parse(n.message().unwrap()).unwrap(),
            Err(_) => StatusNote::new(cluster),
        };
        note.entries.extend_from_slice(entries);
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        repo.note(&sig, &sig, Some(&refname), on, &note.to_text(), true).unwrap();
    }

    #[test]
    fn each_notes_commit_adds_records_and_a_rewrite_is_a_new_unverified_one() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let tree = repo.find_tree(repo.treebuilder(None).unwrap().write().unwrap()).unwrap();
        let rel = repo.commit(None, &sig, &sig, "rel-1", &tree, &[]).unwrap();
        let signer = StatusSigner::generate("a").unwrap();
        let me = StatusIdentity::new("fleet", signer.clone());
        let signed = |state, description: &str, sequence| {
            let mut s = Status::new("a", "rel-1", rel.to_string(), state, description);
            signer.sign(&mut s, "fleet", sequence).unwrap();
            s
        };
        let pending = signed(State::Pending, "applying", 1);
        write(&repo, "a", rel, std::slice::from_ref(&pending));
        let success = signed(State::Success, "all gates passed", 2);
        write(&repo, "a", rel, std::slice::from_ref(&success));
        // Someone without the key rewrites the success into a failure (signature kept).
        let refname = format!("{NOTES_PREFIX}a");
        let mut note = StatusNote::parse(repo.find_note(Some(&refname), rel).unwrap().message().unwrap()).unwrap();
        note.entries[1].description = "rolled back".into();
        repo.note(&sig, &sig, Some(&refname), rel, &note.to_text(), true).unwrap();

        let keys = me.keys_for("a");
        let log = read_log(&repo, &keys, &Filter::default()).unwrap();
        let seen: Vec<(&str, bool)> = log.iter().map(|r| (r.status.description.as_str(), r.verified)).collect();
        assert_eq!(seen, [("applying", true), ("all gates passed", true), ("rolled back", false)]);
        assert_eq!(
            log[2].unverified.as_deref(),
            Some("the signature does not match the entry (changed after signing)")
        );

        let other = Filter { cluster: Some("b".into()), since: None };
        assert!(read_log(&repo, &keys, &other).unwrap().is_empty());
        let later = Filter { cluster: None, since: Some(Utc::now() + chrono::Duration::hours(1)) };
        assert!(read_log(&repo, &keys, &later).unwrap().is_empty());
    }
}
