//! The Git backend: statuses as Git notes, one notes ref per cluster
//! (`refs/notes/fleetgate/<cluster>`), one note per release commit holding that release's history on
//! that cluster (a [`StatusNote`]).
//!
//! Each cluster's agent pushes only its own ref, so agents never contend with each other. The ref
//! can still be written by two writers of the same cluster (a re-install with a fresh clone, two
//! replicas during a leader hand-over): a push the remote refuses is answered by fetching the ref,
//! merging both histories (a union of entries; see [`StatusNote::merge`]) into a merge commit whose
//! parents are both tips, and pushing again — a bounded number of times.
//!
//! Readers fetch `refs/notes/fleetgate/*` into `refs/fleetgate/notes-remote/*` and fold each into the
//! local `refs/notes/fleetgate/<cluster>` (fast-forward, or the same merge), so a local entry that
//! was never pushed is never lost, and a plain `git log --notes='fleetgate/*'` shows them.

use super::identity::{KeyError, StatusIdentity, StatusKeys};
use super::memo::{self, Listing, NoteContext, NoteRead, Remembered, VerifiedNotes};
use super::model::{NoteParseError, Status, StatusNote, StatusSet, latest_per_release};
use crate::model::error_chain;
use git2::{ErrorCode, Oid, RemoteCallbacks, Repository, Signature};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::source::{Credentials, explain_refusal, fast_forward_notes_ref, tracked_notes};
/// Prefix of every cluster's notes ref; the remote's copies are kept under
/// [`NOTES_TRACKING_PREFIX`] (the same layout the source mirror uses).
pub use crate::source::{NOTES_PREFIX, NOTES_TRACKING_PREFIX};
/// Pushes of one write before giving up on a ref someone else keeps rewriting.
pub const MAX_PUSH_ATTEMPTS: u32 = 6;

/// `refs/notes/fleetgate/<cluster>`.
pub fn notes_ref(cluster: &str) -> String {
    format!("{NOTES_PREFIX}{cluster}")
}

/// The remote statuses are pushed to and fetched from: a URL (or local path) and how to reach it
/// (credentials, host checks, proxy: [`Credentials`], the same as the source's).
#[derive(Debug, Clone)]
pub struct GitRemote {
    url: String,
    access: Credentials,
}

impl GitRemote {
    pub fn new(url: impl Into<String>) -> GitRemote {
        GitRemote { url: url.into(), access: Credentials::default() }
    }

    /// The URL as errors show it: without the password or token of its user info.
    fn shown_url(&self) -> String {
        crate::model::redact_userinfo(&self.url)
    }

    pub fn with_access(mut self, access: Credentials) -> GitRemote {
        self.access = access;
        self
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn callbacks(&self) -> RemoteCallbacks<'_> {
        self.access.callbacks(&self.url)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NotesError {
    #[error("cluster name {0:?} cannot be part of a Git ref name; use letters, digits, '-', '_' and '.'")]
    InvalidCluster(String),
    #[error("commit {0:?} is not a full hexadecimal Git object id")]
    InvalidCommit(String),
    #[error("fetching status notes from {url}")]
    Fetch { url: String, source: git2::Error },
    #[error("pushing {refname} to {url}")]
    Push { url: String, refname: String, source: git2::Error },
    #[error(
        "{url} refused {refname} {attempts} times although every refusal was merged and retried \
         (someone else keeps rewriting it); last refusal: {last}"
    )]
    Contended { url: String, refname: String, attempts: u32, last: String },
    #[error("local repository")]
    Repo(#[from] git2::Error),
    #[error("signing the status entry")]
    Sign(#[from] KeyError),
}

/// What a successful [`write`] took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Pushes made; more than 1 means the remote refused and the histories were merged.
    pub attempts: u32,
}

fn check_cluster(cluster: &str) -> Result<(), NotesError> {
    let ok = !cluster.is_empty()
        && !cluster.starts_with('.')
        && cluster.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !cluster.contains("..")
        && !cluster.ends_with(".lock")
        && git2::Reference::is_valid_name(&notes_ref(cluster));
    if ok { Ok(()) } else { Err(NotesError::InvalidCluster(cluster.to_string())) }
}

fn parse_commit(commit: &str) -> Result<Oid, NotesError> {
    if commit.len() != 40 || !commit.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(NotesError::InvalidCommit(commit.to_string()));
    }
    Oid::from_str(commit).map_err(|_| NotesError::InvalidCommit(commit.to_string()))
}

fn signature(cluster: &str) -> Result<Signature<'static>, git2::Error> {
    Signature::now(&format!("fleetgate/{cluster}"), "fleetgate@localhost")
}

/// Signs `status` as `identity` with the next sequence number of its cluster, appends it to its
/// release commit's note in `refs/notes/fleetgate/<cluster>` and pushes the ref to `remote`. A
/// refused push (someone else wrote the ref) is fetched, merged and retried up to
/// [`MAX_PUSH_ATTEMPTS`] times.
///
/// Writing a status again after its push failed pushes the entry the first write left in the
/// local note instead of signing it twice (see the status outbox, `agent::state::outbox`).
///
/// The sequence is one more than the highest this key signed in the cluster's local notes; the
/// caller syncs them first (the agent's source mirror fetches every notes ref each pass), so an
/// agent with a fresh cache continues its count. Entries this key does not verify (forgeries
/// with huge numbers) do not move it.
///
/// Blocking (network I/O); call it from `spawn_blocking` in async code.
///
/// # Errors
/// Invalid cluster name or commit id, a local repository failure, a fetch/push transport failure,
/// or [`NotesError::Contended`] when every attempt was refused.
pub fn write(
    repo: &Repository,
    remote: &GitRemote,
    status: &Status,
    identity: &StatusIdentity,
) -> Result<Written, NotesError> {
    check_cluster(&status.cluster)?;
    let commit = parse_commit(&status.commit)?;
    let refname = notes_ref(&status.cluster);
    // A write whose push failed left its signed entry in the local note: push that, do not sign
    // the same statement again under a new sequence (the status outbox retries writes).
    if !written_locally(repo, &refname, commit, status)? {
        let mut signed = status.clone();
        let sequence = last_sequence(repo, &refname, &identity.keys_for(&status.cluster))? + 1;
        identity.signer.sign(&mut signed, &identity.fleet, sequence)?;
        append_local(repo, &refname, &status.cluster, commit, &signed)?;
    }
    let mut last = String::new();
    for attempt in 1..=MAX_PUSH_ATTEMPTS {
        match push(repo, remote, &format!("{refname}:{refname}"), Some("status.push.negotiated"))? {
            None => {
                record_pushed(repo, &status.cluster, &refname)?;
                return Ok(Written { attempts: attempt });
            }
            Some(refusal) => {
                tracing::debug!(%refname, attempt, %refusal, "status notes push refused; merging and retrying");
                last = refusal;
            }
        }
        if attempt < MAX_PUSH_ATTEMPTS {
            backoff(attempt);
            sync(repo, remote)?;
        }
    }
    Err(NotesError::Contended { url: remote.shown_url(), refname, attempts: MAX_PUSH_ATTEMPTS, last })
}

/// After an accepted push the remote holds the local tip: the tracking ref says so, as git's
/// remote-tracking refs do, so the source's next sync does not take the agent's own status for a
/// sibling's move and fetch for it.
fn record_pushed(repo: &Repository, cluster: &str, refname: &str) -> Result<(), git2::Error> {
    let tip = repo.refname_to_id(refname)?;
    repo.reference(&format!("{NOTES_TRACKING_PREFIX}{cluster}"), tip, true, "fleetgate: pushed status notes")?;
    Ok(())
}

/// Short, growing, jittered pauses: two writers that collided should not collide again in lockstep.
fn backoff(attempt: u32) {
    use rand::Rng;
    let base = 20u64 << attempt.min(5);
    let jitter = rand::rng().random_range(0..=base);
    std::thread::sleep(Duration::from_millis(base + jitter));
}

/// The highest sequence `keys` verify among the entries of `refname` (0 when none).
fn last_sequence(repo: &Repository, refname: &str, keys: &StatusKeys) -> Result<u64, NotesError> {
    let cluster = &refname[NOTES_PREFIX.len()..];
    let notes = match repo.notes(Some(refname)) {
        Ok(notes) => notes,
        Err(e) if e.code() == ErrorCode::NotFound => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut last = 0;
    for item in notes {
        let (blob, annotated) = item?;
        let text = String::from_utf8_lossy(repo.find_blob(blob)?.content()).into_owned();
        let Some(note) = parse_or_warn(&text, refname, annotated) else { continue };
        for entry in &note.entries {
            if let Some(n) = entry.sequence
                && n > last
                && keys.verify(cluster, &annotated.to_string(), entry).is_ok()
            {
                last = n;
            }
        }
    }
    Ok(last)
}

fn read_note(repo: &Repository, refname: &str, commit: Oid) -> Result<Option<String>, git2::Error> {
    match repo.find_note(Some(refname), commit) {
        Ok(note) => Ok(Some(String::from_utf8_lossy(note.message_bytes()).into_owned())),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn parse_or_warn(text: &str, refname: &str, commit: Oid) -> Option<StatusNote> {
    match StatusNote::parse(text) {
        Ok(note) => Some(note),
        Err(e) => {
            warn_unreadable(refname, commit, &e);
            None
        }
    }
}

fn warn_unreadable(refname: &str, commit: Oid, e: &NoteParseError) {
    tracing::warn!(%refname, %commit, error = %error_chain(e), "ignoring a note that is not a readable fleetgate status note");
}

/// Whether the local note of `commit` already holds `status` as signed by a previous write (the
/// same entry but for the fields signing fills in).
fn written_locally(repo: &Repository, refname: &str, commit: Oid, status: &Status) -> Result<bool, git2::Error> {
    let unsigned = |s: &Status| Status { fleet: None, sequence: None, signature: None, ..s.clone() };
    let wanted = unsigned(status);
    let note = read_note(repo, refname, commit)?.and_then(|text| parse_or_warn(&text, refname, commit));
    Ok(note.is_some_and(|n| n.entries.iter().any(|e| e.signature.is_some() && unsigned(e) == wanted)))
}

fn append_local(
    repo: &Repository,
    refname: &str,
    cluster: &str,
    commit: Oid,
    status: &Status,
) -> Result<(), NotesError> {
    let mut note = read_note(repo, refname, commit)?
        .and_then(|text| parse_or_warn(&text, refname, commit))
        .unwrap_or_else(|| StatusNote::new(cluster));
    if note.append(status) {
        let sig = signature(cluster)?;
        repo.note(&sig, &sig, Some(refname), commit, &note.to_text(), true)?;
    }
    Ok(())
}

/// Pushes one ref by its refspec (`SRC:DST`, `+` to force). `Ok(None)`: accepted. `Ok(Some(reason))`:
/// refused — either libgit2 saw the push is not a fast-forward, or the server refused the ref,
/// which git2 reports only through the `push_update_reference` callback (the push call itself
/// returns Ok).
/// `stop_at` names the stop point reached once the push is negotiated and moves the ref (tests
/// kill the process there).
pub(super) fn push(
    repo: &Repository,
    remote: &GitRemote,
    spec: &str,
    stop_at: Option<&'static str>,
) -> Result<Option<String>, NotesError> {
    let refname = spec.trim_start_matches('+').split(':').next_back().unwrap_or(spec);
    let refused: RefCell<Option<String>> = RefCell::new(None);
    let mut r = repo.remote_anonymous(&remote.url)?;
    let mut cbs = remote.callbacks();
    cbs.push_update_reference(|name, status| {
        if let Some(msg) = status {
            *refused.borrow_mut() = Some(format!("{name}: {msg}"));
        }
        Ok(())
    });
    cbs.push_negotiation(|updates| {
        // Only a push that moves the ref: re-delivering an entry the note already holds sends nothing.
        if let Some(point) = stop_at
            && updates.iter().any(|u| u.src() != u.dst())
        {
            crate::model::stop_point::reached_blocking(point);
        }
        Ok(())
    });
    let mut opts = remote.access.push_options(cbs);
    let result = r.push(&[spec], Some(&mut opts));
    drop(opts);
    match result {
        Ok(()) => Ok(refused.into_inner()),
        Err(e) if e.code() == ErrorCode::NotFastForward => Ok(Some(e.message().to_string())),
        Err(e) => {
            Err(NotesError::Push { url: remote.shown_url(), refname: refname.to_string(), source: explain_refusal(e) })
        }
    }
}

/// Fetches every cluster's notes ref from `remote` and folds each into the local
/// `refs/notes/fleetgate/<cluster>`: a fast-forward where one side is behind, a merge of both
/// histories where they diverged. Local entries that were never pushed are kept.
///
/// # Errors
/// A fetch transport failure or a local repository failure.
pub fn sync(repo: &Repository, remote: &GitRemote) -> Result<(), NotesError> {
    let fetch_err = |source| NotesError::Fetch { url: remote.shown_url(), source: explain_refusal(source) };
    let mut r = repo.remote_anonymous(&remote.url).map_err(fetch_err)?;
    let mut opts = remote.access.fetch_options(remote.callbacks());
    opts.update_fetchhead(false);
    // The tracking refs mirror the remote exactly; refs deleted there are dropped here too.
    opts.prune(git2::FetchPrune::On);
    r.fetch(&[format!("+{NOTES_PREFIX}*:{NOTES_TRACKING_PREFIX}*")], Some(&mut opts), None).map_err(fetch_err)?;
    for (cluster, theirs) in tracked_notes(repo)? {
        if check_cluster(&cluster).is_err() {
            continue;
        }
        integrate(repo, &cluster, &format!("{NOTES_TRACKING_PREFIX}{cluster}"), theirs)?;
    }
    Ok(())
}

/// Folds the remote's notes of `cluster` (`tracking_ref`, tip `theirs`) into the local ref: the
/// mirror's fast-forward where one side is behind, a merge of both histories where they diverged.
fn integrate(repo: &Repository, cluster: &str, tracking_ref: &str, theirs: Oid) -> Result<(), NotesError> {
    if let Some(ours) = fast_forward_notes_ref(repo, cluster, theirs)? {
        let local_ref = notes_ref(cluster);
        let merged = merge_notes(repo, cluster, &local_ref, ours, tracking_ref, theirs)?;
        repo.reference(&local_ref, merged, true, "fleetgate: status notes merged")?;
    }
    Ok(())
}

/// A notes commit whose parents are both tips and whose tree holds, for every annotated commit, the
/// union of both histories.
fn merge_notes(
    repo: &Repository,
    cluster: &str,
    ours_ref: &str,
    ours: Oid,
    theirs_ref: &str,
    theirs: Oid,
) -> Result<Oid, NotesError> {
    // annotated commit → (blob of ours, blob of theirs)
    let mut sides: BTreeMap<Oid, (Option<Oid>, Option<Oid>)> = BTreeMap::new();
    for item in repo.notes(Some(ours_ref))? {
        let (blob, annotated) = item?;
        sides.entry(annotated).or_default().0 = Some(blob);
    }
    for item in repo.notes(Some(theirs_ref))? {
        let (blob, annotated) = item?;
        sides.entry(annotated).or_default().1 = Some(blob);
    }
    let mut tree = repo.treebuilder(None)?;
    for (annotated, pair) in sides {
        let blob = match pair {
            (Some(a), Some(b)) if a != b => {
                let read = |id: Oid, side: &str| -> Result<Option<StatusNote>, git2::Error> {
                    let text = String::from_utf8_lossy(repo.find_blob(id)?.content()).into_owned();
                    Ok(parse_or_warn(&text, side, annotated))
                };
                match (read(a, ours_ref)?, read(b, theirs_ref)?) {
                    (Some(x), Some(y)) => repo.blob(x.merge(&y).to_text().as_bytes())?,
                    (Some(_), None) => a,
                    (None, _) => b,
                }
            }
            (Some(a), _) => a,
            (None, Some(b)) => b,
            (None, None) => continue,
        };
        tree.insert(annotated.to_string(), blob, 0o100644)?;
    }
    let tree = repo.find_tree(tree.write()?)?;
    let sig = signature(cluster)?;
    let parents = [&repo.find_commit(ours)?, &repo.find_commit(theirs)?];
    Ok(repo.commit(None, &sig, &sig, "Notes merged by fleetgate", &tree, &parents)?)
}

/// Reads the local notes of every cluster (`refs/notes/fleetgate/*`) on the given release commits.
/// Call [`sync`] first to see what the remote has. Notes that cannot be read are skipped with a
/// warning. Each entry is verified with `keys` ([`StatusKeys::verify`]: that cluster's key, this
/// fleet, the commit the note is attached to); the rest are kept apart as unverified, with why.
/// Every verified entry is kept, signature included: the whole history, which decisions read.
///
/// # Errors
/// A local repository failure.
pub fn read_all(repo: &Repository, commits: &[Oid], keys: &StatusKeys) -> Result<StatusSet, NotesError> {
    read(repo, commits, keys, None)
}

/// The view's read (`fleetgate status`): like [`read_all`], except that of the verified entries
/// only each cluster's latest per release is kept, without its signature (see
/// [`super::model::latest_per_release`]) — all a view shows — and that notes `memo` saw fully
/// verified before are taken from it (see [`VerifiedNotes`]: their blobs are neither read nor
/// parsed, their signatures not checked again). `memo` then holds what this read found verified.
/// Unverified entries are all kept, as [`read_all`] keeps them.
///
/// # Errors
/// A local repository failure.
pub fn read_all_remembering(
    repo: &Repository,
    commits: &[Oid],
    keys: &StatusKeys,
    memo: &mut VerifiedNotes,
) -> Result<StatusSet, NotesError> {
    read(repo, commits, keys, Some(memo))
}

/// [`read_all`] without `memo`, [`read_all_remembering`] with it.
///
/// A big fleet's refs are read on two threads (each with its own handle on the repository):
/// parsing and signature checks are most of the work and every ref is independent.
fn read(
    repo: &Repository,
    commits: &[Oid],
    keys: &StatusKeys,
    memo: Option<&mut VerifiedNotes>,
) -> Result<StatusSet, NotesError> {
    // Each ref with its tip as listed: looking a ref up again by name costs libgit2 a stat of
    // its loose file and of packed-refs, per cluster.
    let refs: Vec<(String, Option<Oid>)> = repo
        .references_glob(&format!("{NOTES_PREFIX}*"))?
        .filter_map(|r| r.ok())
        .filter_map(|r| r.name().ok().map(|name| (name.to_string(), r.target())))
        .collect();
    // Two release tags on one commit name it once here; its notes are read once.
    let asked: HashMap<Oid, String> = commits.iter().map(|c| (*c, c.to_string())).collect();
    let workers = if refs.len() < PARALLEL_REFS {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(READ_THREADS))
    };
    let recall = memo.as_deref();
    let parts: Vec<Found> = if workers == 1 {
        vec![read_refs(repo, &refs, &asked, keys, recall)?]
    } else {
        let path = repo.path();
        let asked = &asked;
        std::thread::scope(|s| {
            let handles: Vec<_> = refs
                .chunks(refs.len().div_ceil(workers))
                .map(|part| s.spawn(move || read_refs(&Repository::open(path)?, part, asked, keys, recall)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                .collect::<Result<_, _>>()
        })?
    };
    let mut set = StatusSet::new();
    let mut verified_notes = Vec::new();
    for part in parts {
        set.absorb(part.found);
        verified_notes.extend(part.verified_notes);
    }
    if let Some(memo) = memo {
        memo.replace(verified_notes);
    }
    Ok(set)
}

/// Fewer notes refs than this are read on the calling thread (an agent's read, a test).
const PARALLEL_REFS: usize = 64;
/// The machines fleetgate is measured on have two cores; more threads than that only contend.
const READ_THREADS: usize = 2;

/// What [`read_refs`] found: the entries (verified ones each note's latest per release only, for
/// a view; the others with why they are not believed), and the notes whose every entry verified.
/// Built on the reading thread, so the entries are sorted into the set there too.
struct Found {
    view: bool,
    found: StatusSet,
    verified_notes: Vec<Remembered>,
}

impl Found {
    /// Checks every entry of `note`, found in `cluster`'s notes on `commit`: the verified entries
    /// this read keeps, if every entry verified (a note to remember then).
    fn check(
        &mut self,
        keys: &StatusKeys,
        refname: &str,
        cluster: &str,
        commit: &str,
        note: StatusNote,
    ) -> Option<Vec<Status>> {
        let mut all_verified = !note.entries.is_empty();
        let mut verified = Vec::with_capacity(note.entries.len());
        for entry in note.entries {
            match keys.verify(cluster, commit, &entry) {
                Ok(()) => verified.push(entry),
                Err(reason) => {
                    tracing::debug!(%refname, %commit, %reason, "status entry not verified");
                    all_verified = false;
                    self.found.insert_unverified(cluster, entry, reason);
                }
            }
        }
        let kept = match self.view {
            true => latest_per_release(verified),
            false => verified,
        };
        match all_verified {
            true => Some(kept),
            false => {
                self.keep(kept);
                None
            }
        }
    }

    fn keep(&mut self, entries: Vec<Status>) {
        entries.into_iter().for_each(|s| self.found.insert(s));
    }

    /// Keeps the remembered entries of every note `known` lists on an asked commit, if each is
    /// remembered whole; false, keeping nothing, when one must be read again.
    fn take(&mut self, known: &Listing<'_>, cluster: &str, asked: &HashMap<Oid, String>, fleet: &str) -> bool {
        let mut taken = Vec::new();
        for note in known.notes() {
            let Some(commit_hex) = asked.get(&note.commit()) else { continue };
            match note.statuses(&NoteContext { cluster, commit: commit_hex, fleet }) {
                Some(entries) => taken.push(entries),
                None => return false,
            }
        }
        // In release order each entry lands at the end of the cluster's list, not among it.
        taken.sort_by(|a: &Vec<Status>, b| a.first().map(|s| &s.release).cmp(&b.first().map(|s| &s.release)));
        taken.into_iter().for_each(|entries| self.keep(entries));
        true
    }
}

/// Reads and verifies the notes of `refs` on the `asked` commits (each with its hex name); a
/// view's read when `memo` is given, remembering nothing otherwise.
fn read_refs(
    repo: &Repository,
    refs: &[(String, Option<Oid>)],
    asked: &HashMap<Oid, String>,
    keys: &StatusKeys,
    memo: Option<&VerifiedNotes>,
) -> Result<Found, NotesError> {
    let mut out = Found { view: memo.is_some(), found: StatusSet::new(), verified_notes: Vec::new() };
    let fleet = keys.fleet();
    for (refname, tip) in refs {
        let cluster = &refname[NOTES_PREFIX.len()..];
        let tip = match tip {
            Some(tip) => *tip,
            None => repo.find_reference(refname)?.peel_to_commit()?.id(),
        };
        // Without a registered key nothing verifies, and nothing is remembered.
        let record = memo.zip(keys.get(cluster)).map(|(_, key)| memo::record(keys, cluster, key));
        let known = memo.zip(record.as_ref()).and_then(|(m, r)| m.recall(r));
        // A ref that has not moved has the tree the memory lists.
        if let (Some(record), Some(known)) = (record, &known)
            && known.tip() == tip
            && out.take(known, cluster, asked, fleet)
        {
            out.verified_notes.push(known.keep(record));
            continue;
        }
        let tree = repo.find_commit(tip)?.tree()?;
        // Notes written by fleetgate sit flat in the tree, named by the annotated commit, and
        // walking the tree is much cheaper than `find_note` per commit (which re-reads the ref
        // each time). A tree with subtrees uses git's fan-out layout: leave those to libgit2 (and
        // out of the memory).
        if tree.iter().any(|e| e.kind() == Some(git2::ObjectType::Tree)) {
            for (commit, commit_hex) in asked {
                if let Some(note) =
                    read_note(repo, refname, *commit)?.and_then(|text| parse_or_warn(&text, refname, *commit))
                    && let Some(entries) = out.check(keys, refname, cluster, commit_hex, note)
                {
                    out.keep(entries);
                }
            }
            continue;
        }
        let mut notes = Vec::with_capacity(tree.len());
        for entry in tree.iter() {
            let Some(commit) = entry.name().ok().filter(|n| n.len() == 40).and_then(|n| Oid::from_str(n).ok()) else {
                continue;
            };
            let blob = entry.id();
            // A note on a commit not asked about is listed, not read.
            let entries = match asked.get(&commit) {
                None => None,
                Some(commit_hex) => {
                    let context = NoteContext { cluster, commit: commit_hex, fleet };
                    let remembered = known.as_ref().and_then(|k| k.note(commit)).filter(|n| n.blob() == blob);
                    match remembered.and_then(|n| n.statuses(&context)) {
                        Some(entries) => Some(entries),
                        None => match read_blob(repo, blob, refname, commit)? {
                            Some(note) => out.check(keys, refname, cluster, commit_hex, note),
                            None => None,
                        },
                    }
                }
            };
            notes.push(NoteRead { commit, blob, entries });
        }
        if let Some(record) = record {
            out.verified_notes.push(Remembered::notes(record, tip, &notes, cluster, fleet));
        }
        notes.into_iter().filter_map(|n| n.entries).for_each(|entries| out.keep(entries));
    }
    Ok(out)
}

/// The note in `blob`, parsed where libgit2 keeps it (only a note that is not UTF-8 is copied,
/// with replacement characters); `None` for one that does not parse (warned).
fn read_blob(repo: &Repository, blob: Oid, refname: &str, commit: Oid) -> Result<Option<StatusNote>, git2::Error> {
    let blob = repo.find_blob(blob)?;
    Ok(match std::str::from_utf8(blob.content()) {
        Ok(text) => parse_or_warn(text, refname, commit),
        Err(_) => parse_or_warn(&String::from_utf8_lossy(blob.content()), refname, commit),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{State, Unverified};

    fn repo() -> (tempfile::TempDir, Repository) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        (dir, repo)
    }

    /// A fleet repo URL with a token in its user info, to a Git server that is not there: the
    /// fetch's and the push's errors name the server, never the token.
    #[test]
    fn errors_never_show_the_token_of_the_url() {
        let (_dir, repo) = repo();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let remote = GitRemote::new(format!("http://fleetgate:s3cret-token@127.0.0.1:{port}/fleet.git"));
        let fetch = crate::model::error_chain(&sync(&repo, &remote).unwrap_err());
        let status = crate::status::Status::new("cluster-a", "rel-1", "0".repeat(40), State::Success, "ok");
        let identity = StatusIdentity::new("fleet", crate::status::StatusSigner::generate("t").unwrap());
        let push = crate::model::error_chain(&write(&repo, &remote, &status, &identity).unwrap_err());
        for text in [fetch, push] {
            assert!(text.contains(&format!("http://fleetgate:…@127.0.0.1:{port}/fleet.git")), "{text}");
            assert!(!text.contains("s3cret-token"), "{text}");
        }
    }

    #[test]
    fn cluster_names_must_make_valid_refs() {
        assert!(check_cluster("cluster-a").is_ok());
        assert!(check_cluster("eu_west.1").is_ok());
        for bad in ["", "a/b", "..", "a..b", "x.lock", "a b", ".hidden", "a~1"] {
            assert!(check_cluster(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn commit_ids_must_be_full() {
        assert!(parse_commit(&"a".repeat(40)).is_ok());
        assert!(parse_commit("abc123").is_err());
    }

    #[test]
    fn a_write_retried_after_a_failed_push_pushes_the_entry_it_left_instead_of_a_second_one() {
        let (remote_dir, _) = repo();
        let (_d, repo) = repo();
        let me = StatusIdentity::new("f", crate::status::StatusSigner::generate("a").unwrap());
        let commit = "1".repeat(40);
        let status = Status::new("a", "rel-1", commit.clone(), State::Failure, "rolled back to rel-0");
        let unreachable = GitRemote::new(remote_dir.path().join("gone").display().to_string());
        let err = write(&repo, &unreachable, &status, &me).unwrap_err();
        assert!(matches!(err, NotesError::Push { .. }), "{err:?}");
        write(&repo, &GitRemote::new(remote_dir.path().display().to_string()), &status, &me).unwrap();
        let remote = Repository::open_bare(remote_dir.path()).unwrap();
        let set = read_all(&remote, &[Oid::from_str(&commit).unwrap()], &me.keys_for("a")).unwrap();
        let sequences: Vec<_> = set.history("a", "rel-1").iter().map(|s| s.sequence).collect();
        assert_eq!(sequences, [Some(1)], "one entry, signed once");
    }

    #[test]
    fn diverged_local_histories_merge_into_one_note() {
        let (_d, repo) = repo();
        let commit = Oid::from_str(&"1".repeat(40)).unwrap();
        let sig = signature("a").unwrap();
        let me = StatusIdentity::new("f", crate::status::StatusSigner::generate("a").unwrap());
        let entry = |state, secs: i64| {
            let mut s = Status::new("a", "rel-1", commit.to_string(), state, "x");
            s.reported_at = chrono::DateTime::from_timestamp(1_750_000_000 + secs, 0).unwrap();
            me.signer.sign(&mut s, "f", secs as u64).unwrap();
            s
        };
        let other = Oid::from_str(&"2".repeat(40)).unwrap();
        let mut base = StatusNote::new("a");
        base.append(&entry(State::Pending, 1));
        repo.note(&sig, &sig, Some("refs/notes/fleetgate/a"), commit, &base.to_text(), true).unwrap();
        let root = repo.refname_to_id("refs/notes/fleetgate/a").unwrap();
        // "theirs": from the same root, success on the commit and a note on another commit.
        repo.reference("refs/fleetgate/notes-remote/a", root, true, "t").unwrap();
        let mut theirs = base.clone();
        theirs.append(&entry(State::Success, 9));
        repo.note(&sig, &sig, Some("refs/fleetgate/notes-remote/a"), commit, &theirs.to_text(), true).unwrap();
        repo.note(&sig, &sig, Some("refs/fleetgate/notes-remote/a"), other, &StatusNote::new("a").to_text(), true)
            .unwrap();
        // "ours": an error entry in between.
        let mut ours = base.clone();
        ours.append(&entry(State::Error, 5));
        repo.note(&sig, &sig, Some("refs/notes/fleetgate/a"), commit, &ours.to_text(), true).unwrap();

        let theirs_tip = repo.refname_to_id("refs/fleetgate/notes-remote/a").unwrap();
        integrate(&repo, "a", "refs/fleetgate/notes-remote/a", theirs_tip).unwrap();
        let tip = repo.refname_to_id("refs/notes/fleetgate/a").unwrap();
        assert!(repo.graph_descendant_of(tip, theirs_tip).unwrap());
        let set = read_all(&repo, &[commit, other], &me.keys_for("a")).unwrap();
        let states: Vec<_> = set.history("a", "rel-1").iter().map(|s| s.state).collect();
        assert_eq!(states, [State::Pending, State::Error, State::Success]);
        assert!(repo.find_note(Some("refs/notes/fleetgate/a"), other).is_ok());
    }

    /// git switches big notes trees to a fan-out layout (`ab/cdef…`); readers must find those too.
    #[test]
    fn fanned_out_notes_trees_are_read() {
        let (_d, repo) = repo();
        let commit = Oid::from_str("ab0123456789abcdef0123456789abcdef012345").unwrap();
        let me = StatusIdentity::new("f", crate::status::StatusSigner::generate("a").unwrap());
        let mut entry = Status::new("a", "rel-1", commit.to_string(), State::Success, "ok");
        me.signer.sign(&mut entry, "f", 1).unwrap();
        let mut note = StatusNote::new("a");
        note.append(&entry);
        let blob = repo.blob(note.to_text().as_bytes()).unwrap();
        let mut sub = repo.treebuilder(None).unwrap();
        sub.insert(&commit.to_string()[2..], blob, 0o100644).unwrap();
        let sub = sub.write().unwrap();
        let mut root = repo.treebuilder(None).unwrap();
        root.insert("ab", sub, 0o040000).unwrap();
        let tree = repo.find_tree(root.write().unwrap()).unwrap();
        let sig = signature("a").unwrap();
        let tip = repo.commit(None, &sig, &sig, "Notes added by 'git notes add'", &tree, &[]).unwrap();
        repo.reference("refs/notes/fleetgate/a", tip, true, "t").unwrap();
        let set = read_all(&repo, &[commit], &me.keys_for("a")).unwrap();
        assert_eq!(set.latest("a", "rel-1").unwrap().state, State::Success);
    }

    /// One signed note of cluster `a` on `commit`, written as fleetgate writes it.
    fn signed_note(repo: &Repository, me: &StatusIdentity, commit: Oid, description: &str) -> StatusNote {
        let mut entry = Status::new("a", "rel-1", commit.to_string(), State::Success, description);
        me.signer.sign(&mut entry, &me.fleet, 1).unwrap();
        let mut note = StatusNote::new("a");
        note.append(&entry);
        let sig = signature("a").unwrap();
        repo.note(&sig, &sig, Some("refs/notes/fleetgate/a"), commit, &note.to_text(), true).unwrap();
        note
    }

    /// The attack on the memory: a note verified once, then rewritten by someone without the key
    /// (the signature kept, the text changed). The rewritten note is another blob, so it is
    /// checked again, and not believed.
    #[test]
    fn a_remembered_note_is_not_checked_again_but_a_rewritten_one_is() {
        let (_d, repo) = repo();
        let commit = Oid::from_str(&"1".repeat(40)).unwrap();
        let me = StatusIdentity::new("f", crate::status::StatusSigner::generate("a").unwrap());
        let mut note = signed_note(&repo, &me, commit, "all gates passed");
        let mut memo = VerifiedNotes::new();
        let set = read_all_remembering(&repo, &[commit], &me.keys_for("a"), &mut memo).unwrap();
        assert_eq!(set.latest("a", "rel-1").unwrap().state, State::Success);
        let set = read_all_remembering(&repo, &[commit], &me.keys_for("a"), &mut memo).unwrap();
        assert_eq!(set.latest("a", "rel-1").unwrap().state, State::Success, "remembered");

        note.entries[0].state = State::Failure;
        note.entries[0].description = "rolled back".into();
        let sig = signature("a").unwrap();
        repo.note(&sig, &sig, Some("refs/notes/fleetgate/a"), commit, &note.to_text(), true).unwrap();
        let set = read_all_remembering(&repo, &[commit], &me.keys_for("a"), &mut memo).unwrap();
        assert!(set.latest("a", "rel-1").is_none());
        let unverified = set.unverified("a", "rel-1");
        assert_eq!(unverified.len(), 1);
        assert_eq!(unverified[0].reason, Unverified::BadSignature);
    }

    /// Deletes the loose object `id` (what `repo.note` writes): a read that needs it fails.
    fn remove_object(repo: &Repository, id: Oid) {
        let hex = id.to_string();
        std::fs::remove_file(repo.path().join("objects").join(&hex[..2]).join(&hex[2..])).unwrap();
    }

    /// A notes ref that moved (its agent wrote a status) is walked again and only its notes whose
    /// blob changed are read; one that has not moved is taken from the memory whole, its commit,
    /// tree and notes not read at all. Both shown by deleting what must not be read.
    #[test]
    fn a_moved_notes_ref_is_read_only_where_it_changed_and_an_unmoved_one_not_at_all() {
        let (_d, repo) = repo();
        let asked = ["1", "2", "3"].map(|n| Oid::from_str(&n.repeat(40)).unwrap());
        let me = StatusIdentity::new("f", crate::status::StatusSigner::generate("a").unwrap());
        let keys = me.keys_for("a");
        signed_note(&repo, &me, asked[0], "first passed");
        signed_note(&repo, &me, asked[1], "second passed");
        let mut memo = VerifiedNotes::new();
        read_all_remembering(&repo, &asked, &keys, &mut memo).unwrap();
        let descriptions = |set: &StatusSet| -> Vec<String> {
            asked
                .iter()
                .filter_map(|c| set.history("a", "rel-1").iter().find(|s| s.commit == c.to_string()))
                .map(|s| s.description.clone())
                .collect()
        };

        signed_note(&repo, &me, asked[2], "third passed");
        let tip = repo.refname_to_id("refs/notes/fleetgate/a").unwrap();
        let tree = repo.find_commit(tip).unwrap().tree().unwrap();
        let blob = |commit: Oid| tree.get_name(&commit.to_string()).unwrap().id();
        remove_object(&repo, blob(asked[0]));
        remove_object(&repo, blob(asked[1]));
        assert!(read_all(&repo, &asked, &keys).is_err(), "the unchanged notes are gone");
        let set = read_all_remembering(&repo, &asked, &keys, &mut memo).unwrap();
        assert_eq!(descriptions(&set), ["first passed", "second passed", "third passed"]);

        remove_object(&repo, blob(asked[2]));
        remove_object(&repo, tree.id());
        remove_object(&repo, tip);
        let set = read_all_remembering(&repo, &asked, &keys, &mut memo).unwrap();
        assert_eq!(descriptions(&set), ["first passed", "second passed", "third passed"]);
        assert!(set.unverified("a", "rel-1").is_empty());
    }

    /// A remembered note gives the view what a read of its blob gives it: the latest entry, its
    /// unknown fields and a newer writer's state included, without the signature it verified
    /// with; [`read_all`] keeps the whole history, signatures included.
    #[test]
    fn a_remembered_note_gives_back_what_its_blob_holds() {
        let (_d, repo) = repo();
        let commit = Oid::from_str(&"1".repeat(40)).unwrap();
        let me = StatusIdentity::new("f", crate::status::StatusSigner::generate("a").unwrap());
        let mut note = StatusNote::new("a");
        for (sequence, state) in [(1, State::Pending), (2, State::Unknown)] {
            let mut entry = Status::new("a", "rel-1", commit.to_string(), state, "x");
            entry.extra.insert("canaryScore".into(), serde_json::json!({"value": 0.97, "window": ["5m", null]}));
            me.signer.sign(&mut entry, "f", sequence).unwrap();
            note.append(&entry);
        }
        let sig = signature("a").unwrap();
        repo.note(&sig, &sig, Some("refs/notes/fleetgate/a"), commit, &note.to_text(), true).unwrap();
        let mut memo = VerifiedNotes::new();
        let read = read_all_remembering(&repo, &[commit], &me.keys_for("a"), &mut memo).unwrap();
        let recalled = read_all_remembering(&repo, &[commit], &me.keys_for("a"), &mut memo).unwrap();
        let latest = Status { signature: None, ..note.entries[1].clone() };
        assert_eq!(read.history("a", "rel-1"), [latest.clone()]);
        assert_eq!(recalled.history("a", "rel-1"), [latest]);
        assert_eq!(read_all(&repo, &[commit], &me.keys_for("a")).unwrap().history("a", "rel-1"), note.entries);
    }

    /// A note with one entry that does not verify (a forgery appended by a pusher) is never
    /// remembered: every read checks it again, reports the forgery and believes only the rest.
    #[test]
    fn a_note_with_an_unverified_entry_is_checked_on_every_read() {
        let (_d, repo) = repo();
        let commit = Oid::from_str(&"1".repeat(40)).unwrap();
        let me = StatusIdentity::new("f", crate::status::StatusSigner::generate("a").unwrap());
        let mut note = signed_note(&repo, &me, commit, "applying");
        let mut forged = note.entries[0].clone();
        (forged.state, forged.description, forged.sequence) = (State::Success, "all gates passed".into(), Some(2));
        note.append(&forged);
        let sig = signature("a").unwrap();
        repo.note(&sig, &sig, Some("refs/notes/fleetgate/a"), commit, &note.to_text(), true).unwrap();
        let mut memo = VerifiedNotes::new();
        for read in 1..=3 {
            let set = read_all_remembering(&repo, &[commit], &me.keys_for("a"), &mut memo).unwrap();
            assert_eq!(set.latest("a", "rel-1").unwrap().description, "applying", "read {read}");
            let unverified = set.unverified("a", "rel-1");
            assert_eq!(unverified.len(), 1, "read {read}");
            assert_eq!(unverified[0].reason, Unverified::BadSignature, "read {read}");
        }
    }

    /// A note remembered as verified under one key (or fleet) is checked again under another:
    /// re-registering a cluster's key is not undone by the memory.
    #[test]
    fn a_remembered_note_does_not_vouch_for_another_key_or_fleet() {
        let (_d, repo) = repo();
        let commit = Oid::from_str(&"1".repeat(40)).unwrap();
        let me = StatusIdentity::new("f", crate::status::StatusSigner::generate("a").unwrap());
        signed_note(&repo, &me, commit, "ok");
        let mut memo = VerifiedNotes::new();
        read_all_remembering(&repo, &[commit], &me.keys_for("a"), &mut memo).unwrap();
        let other = StatusIdentity::new("f", crate::status::StatusSigner::generate("a").unwrap());
        let set = read_all_remembering(&repo, &[commit], &other.keys_for("a"), &mut memo).unwrap();
        assert_eq!(set.unverified("a", "rel-1")[0].reason, Unverified::OtherKey("a".into()));
        read_all_remembering(&repo, &[commit], &me.keys_for("a"), &mut memo).unwrap();
        let other_fleet = StatusIdentity::new("g", me.signer.clone());
        let set = read_all_remembering(&repo, &[commit], &other_fleet.keys_for("a"), &mut memo).unwrap();
        assert!(matches!(set.unverified("a", "rel-1")[0].reason, Unverified::WrongFleet { .. }));
    }

    /// A malformed note (another tool's, a truncated write) is skipped; the cluster's other notes
    /// and the other clusters' notes are still read, on the threads of a big fleet too.
    #[test]
    fn a_malformed_note_is_skipped_and_the_rest_read() {
        let (_d, repo) = repo();
        let good = Oid::from_str(&"1".repeat(40)).unwrap();
        let bad = Oid::from_str(&"2".repeat(40)).unwrap();
        let me = StatusIdentity::new("f", crate::status::StatusSigner::generate("a").unwrap());
        let sig = signature("a").unwrap();
        let mut keys = StatusKeys::new("f");
        for i in 0..PARALLEL_REFS + 1 {
            let cluster = format!("c{i}");
            let mut entry = Status::new(&cluster, "rel-1", good.to_string(), State::Success, "ok");
            me.signer.sign(&mut entry, "f", 1).unwrap();
            let mut note = StatusNote::new(&cluster);
            note.append(&entry);
            let refname = notes_ref(&cluster);
            repo.note(&sig, &sig, Some(&refname), good, &note.to_text(), true).unwrap();
            repo.note(&sig, &sig, Some(&refname), bad, &note.to_text()[..50], true).unwrap();
            keys.insert(&cluster, me.signer.public());
        }
        let set = read_all(&repo, &[good, bad], &keys).unwrap();
        for i in 0..PARALLEL_REFS + 1 {
            assert_eq!(set.latest(&format!("c{i}"), "rel-1").unwrap().state, State::Success, "c{i}");
        }
    }
}
