//! Notes already verified: a reader's memory of the note blobs whose every entry verified, and of
//! the entries themselves, so the next read of the same blob neither reads nor parses it nor
//! checks its Ed25519 signatures again (tens of microseconds per entry, most of `fleetgate
//! status`'s time over a big fleet; docs/BENCHMARKS.md, "Status matrix").
//!
//! A cluster's notes are remembered under one record: a SHA-256 over what [`StatusKeys::verify`]
//! depends on beyond the note itself — the cluster whose notes ref holds them, the fleet, the
//! cluster's key, and this build's version (another build may check or encode differently). With
//! it, a [`Listing`]: the tip of the cluster's notes ref they were read at, and every note of that
//! tip's tree — the commit it is attached to, its blob's Git object id (its content, as Git names
//! it — fetching re-hashes every object it receives, with libgit2's collision detection) and, when
//! every entry of the note verified, the entries. A note is believed from the memory only when its
//! blob is the one listed, checked against this exact key; another key, fleet or build misses
//! everything, and a changed note is read and checked in full. Only notes whose every entry
//! verified carry their entries: anything unverified is checked, and reported, each time.
//!
//! A tip is a commit id, so a ref that has not moved has the very tree listed: a reader takes the
//! listing as it is, reading neither the ref's commit nor its tree nor any blob (at 10,000 × 20,
//! walking 10,000 trees was over a third of a remembered read's CPU). A ref that moved (its agent
//! wrote a status) is walked, and only its notes whose blob changed are read and checked.
//!
//! The entries are what a view keeps of a note (each release's latest entry, without its
//! signature: [`super::notes::read_all_remembering`]), decoded, in a compact binary form (serde's
//! derives on [`Entry`], in postcard's format: varints and length-prefixed text): every field,
//! unknown ones as their JSON text, so a hit gives back exactly what a read of the blob gives the
//! view.
//!
//! `fleetgate status` keeps the memory in `$XDG_CACHE_HOME/fleetgate/status/verified-notes`: a
//! header, a SHA-256 of the rest, then the records. It is written (mode 0600, in a 0700
//! directory) only when a read used something else than the file holds, and it holds exactly
//! what the last read used, so it never grows past one fleet's notes. A file that is not exactly
//! that — torn, corrupted, of another format, not owned by this user or open to others — is
//! ignored as a whole (nothing from it is believed) and rewritten by the next save. The checksum
//! is integrity, not authenticity: whoever can write that file can make this user's `fleetgate
//! status` believe a note, as whoever can write the user's `fleetgate` binary can.
//!
//! Heartbeats verified before ([`VerifiedBeats`]) are kept the same way, in a file of their own
//! next to it (`verified-heartbeats`: a beat moves every interval, and rewriting the notes' file
//! for that would cost more than the checks it saves). A beat is remembered under a SHA-256 over
//! its commit id, the cluster, the fleet, the cluster's key and this build's version, with the
//! beat itself; a moved ref (a new beat) or another key misses and is checked in full.

use super::heartbeat::Heartbeat;
use super::identity::{StatusKey, StatusKeys};
use super::model::{GateFigure, State, Status};
use crate::model::ApprovalRecord;
use chrono::{DateTime, Utc};
use git2::Oid;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// One remembered cluster's notes' or heartbeat's key (see the module docs for what it covers).
pub(crate) type Record = [u8; 32];

/// First bytes of the notes' file; changed with the layout or the encoding. The encoding is the
/// serde form of [`Entry`] and [`Beat`] and of what they hold (`State`, `GateFigure`,
/// `ApprovalRecord`): postcard writes no field names, so a field added, removed or moved there
/// changes it (`the_encoding_is_pinned` then fails as a reminder).
const MAGIC: &[u8] = b"fleetgate verified notes v7\n";
/// First bytes of the heartbeats' file.
const BEATS_MAGIC: &[u8] = b"fleetgate verified heartbeats v2\n";
/// The heartbeats' file, in the directory of the notes' file.
const BEATS_FILE: &str = "verified-heartbeats";

/// The notes a reader found fully verified, with their entries, and the heartbeats it found
/// verified; see the module docs.
#[derive(Debug)]
pub struct VerifiedNotes {
    notes: Store,
    /// Heartbeats verified before ([`super::heartbeat::read_remembering`]).
    pub beats: VerifiedBeats,
}

impl Default for VerifiedNotes {
    fn default() -> VerifiedNotes {
        VerifiedNotes { notes: Store::new(MAGIC), beats: VerifiedBeats::default() }
    }
}

/// Heartbeats a reader found verified, each with the beat; see the module docs.
#[derive(Debug)]
pub struct VerifiedBeats(Store);

impl Default for VerifiedBeats {
    fn default() -> VerifiedBeats {
        VerifiedBeats(Store::new(BEATS_MAGIC))
    }
}

/// One memory file's content: a header (its magic and a SHA-256 of the rest), then per record
/// the record, the length of its encoded value (little-endian u64) and the value.
#[derive(Debug)]
struct Store {
    magic: &'static [u8],
    /// What the file holds (or will hold); the header's checksum is filled in by [`Store::save`].
    bytes: Vec<u8>,
    /// Where each record's value is in `bytes`.
    known: HashMap<Record, Range<usize>>,
    file: Option<PathBuf>,
    /// `bytes` differs from the file's content.
    changed: bool,
}

/// A memory file that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing the verified-status memory {path}")]
pub struct MemoError {
    path: PathBuf,
    source: std::io::Error,
}

/// What the read that just finished remembers: a cluster's notes (or a heartbeat) of the memory it
/// used, or what it read and verified itself, encoded.
pub(crate) struct Remembered {
    record: Record,
    entries: Encoded,
}

enum Encoded {
    /// At this range of the memory's bytes.
    Kept(Range<usize>),
    New(Vec<u8>),
}

impl Remembered {
    /// The notes of `cluster`'s notes ref (whose record is `record`) at `tip`, as a read found them.
    pub(crate) fn notes(record: Record, tip: Oid, notes: &[NoteRead], cluster: &str, fleet: &str) -> Remembered {
        Remembered { record, entries: Encoded::New(encode_listing(tip, notes, cluster, fleet)) }
    }

    /// `beat`, verified, of the heartbeat commit `record` stands for.
    pub(crate) fn beat(record: Record, beat: &Heartbeat) -> Remembered {
        Remembered { record, entries: Encoded::New(encode_beat(beat)) }
    }
}

/// A note of a cluster's notes ref as a read found it: the commit it is attached to, its blob, and
/// its entries (what a view keeps of them) when every one verified.
pub(crate) struct NoteRead {
    pub commit: Oid,
    pub blob: Oid,
    pub entries: Option<Vec<Status>>,
}

/// A cluster's notes as the memory holds them (see the module docs).
pub(crate) struct Listing<'m> {
    form: ListingForm<'m>,
    /// Where it is in the memory's bytes.
    range: Range<usize>,
}

impl<'m> Listing<'m> {
    /// The tip of the notes ref the listing was read at.
    pub(crate) fn tip(&self) -> Oid {
        Oid::from_bytes(&self.form.tip).expect("an object id is 20 bytes")
    }

    /// Every note of the tip's tree.
    pub(crate) fn notes(&self) -> &[Listed<'m>] {
        &self.form.notes
    }

    /// The note on `commit`, if the tip's tree has one.
    pub(crate) fn note(&self, commit: Oid) -> Option<&Listed<'m>> {
        self.form.notes.iter().find(|n| n.commit == *commit.as_bytes())
    }

    /// The listing remembered again as it is (its ref has not moved).
    pub(crate) fn keep(&self, record: Record) -> Remembered {
        Remembered { record, entries: Encoded::Kept(self.range.clone()) }
    }
}

impl Listed<'_> {
    pub(crate) fn commit(&self) -> Oid {
        Oid::from_bytes(&self.commit).expect("an object id is 20 bytes")
    }

    pub(crate) fn blob(&self) -> Oid {
        Oid::from_bytes(&self.blob).expect("an object id is 20 bytes")
    }

    /// The note's entries, if every one verified when it was read; `None` otherwise, or when they
    /// do not decode (which the checksum makes a bug, not corruption: the note is read again).
    pub(crate) fn statuses(&self, note: &NoteContext<'_>) -> Option<Vec<Status>> {
        let entries: Option<Vec<Status>> = self.entries.as_ref()?.iter().map(|e| e.clone().status(note)).collect();
        if entries.is_none() {
            tracing::debug!(
                cluster = note.cluster,
                commit = note.commit,
                "a remembered note does not decode; checking it again"
            );
        }
        entries
    }
}

/// What a listed note's place says that its verified entries repeat (they name the cluster whose
/// notes hold them, the fleet, and — up to case — the commit), so it is stored once.
pub(crate) struct NoteContext<'a> {
    pub cluster: &'a str,
    pub commit: &'a str,
    pub fleet: &'a str,
}

impl VerifiedNotes {
    /// An empty memory kept in this process only (an agent, `--watch`, a test).
    pub fn new() -> VerifiedNotes {
        VerifiedNotes::default()
    }

    /// The memory kept in `path` (and its heartbeats in `verified-heartbeats` next to it). A
    /// missing file is an empty memory; one that is unreadable or not exactly what
    /// [`VerifiedNotes::save`] writes is ignored (it is only a cache) and replaced by the next
    /// save.
    pub fn open(path: impl Into<PathBuf>) -> VerifiedNotes {
        let file = path.into();
        let beats = file.with_file_name(BEATS_FILE);
        VerifiedNotes { notes: Store::open(file, MAGIC), beats: VerifiedBeats(Store::open(beats, BEATS_MAGIC)) }
    }

    /// `$XDG_CACHE_HOME/fleetgate/status/verified-notes`, else under `~/.cache`; `None` without
    /// either (no memory across runs then).
    pub fn default_path() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("fleetgate").join("status").join("verified-notes"))
    }

    /// The notes of the cluster `record` stands for, if they are remembered. A listing that does
    /// not decode (which the checksum makes a bug, not corruption) is a miss: every note is read
    /// and checked again.
    pub(crate) fn recall(&self, record: &Record) -> Option<Listing<'_>> {
        let (range, bytes) = self.notes.get(record)?;
        let Some(form) = from_bytes(bytes) else {
            tracing::debug!("a remembered listing of notes does not decode; checking them again");
            return None;
        };
        Some(Listing { form, range })
    }

    /// Makes the notes of the read that just finished the whole memory of notes.
    pub(crate) fn replace(&mut self, used: Vec<Remembered>) {
        self.notes.replace(used);
    }

    /// Writes the memory to its files (if it has them and they do not hold it already),
    /// replacing them atomically.
    ///
    /// # Errors
    /// A file or its directory could not be written.
    pub fn save(&mut self) -> Result<(), MemoError> {
        self.notes.save()?;
        self.beats.0.save()
    }
}

impl VerifiedBeats {
    /// The beat `record` stands for, if it is remembered, and how to remember it again; one that
    /// does not decode, or names another cluster or fleet, is a miss.
    pub(crate) fn recall(&self, record: &Record, cluster: &str, fleet: &str) -> Option<(Heartbeat, Remembered)> {
        let (range, bytes) = self.0.get(record)?;
        let beat = decode_beat(bytes, cluster, fleet)?;
        Some((beat, Remembered { record: *record, entries: Encoded::Kept(range) }))
    }

    /// Makes the beats of the read that just finished the whole memory of beats.
    pub(crate) fn replace(&mut self, used: Vec<Remembered>) {
        self.0.replace(used);
    }
}

impl Store {
    fn new(magic: &'static [u8]) -> Store {
        Store { magic, bytes: vec![0; magic.len() + 32], known: HashMap::new(), file: None, changed: false }
    }

    fn header_len(&self) -> usize {
        self.magic.len() + 32
    }

    fn open(file: PathBuf, magic: &'static [u8]) -> Store {
        let mut store = Store::new(magic);
        match load(&file, magic) {
            Ok(Some((bytes, known))) => (store.bytes, store.known) = (bytes, known),
            Ok(None) => {}
            Err(why) => {
                tracing::info!(path = %file.display(), why, "ignoring the verified-status memory; what it held is checked again");
                store.changed = true;
            }
        }
        store.file = Some(file);
        store
    }

    /// Where `record`'s value is, and the value.
    fn get(&self, record: &Record) -> Option<(Range<usize>, &[u8])> {
        let range = self.known.get(record)?;
        Some((range.clone(), &self.bytes[range.clone()]))
    }

    fn replace(&mut self, used: Vec<Remembered>) {
        let header_len = self.header_len();
        // The common case, the same records as last time: every remembered one used, in the
        // order it is stored, and nothing new.
        let mut end = header_len;
        let same = used.iter().all(|r| match &r.entries {
            Encoded::Kept(range) if range.start == end + 40 => {
                end = range.end;
                true
            }
            _ => false,
        });
        if same && end == self.bytes.len() {
            return;
        }
        let mut bytes = Vec::with_capacity(self.bytes.len());
        bytes.resize(header_len, 0);
        let mut known = HashMap::with_capacity(used.len());
        for r in &used {
            let entries = match &r.entries {
                Encoded::Kept(range) => &self.bytes[range.clone()],
                Encoded::New(encoded) => encoded,
            };
            bytes.extend_from_slice(&r.record);
            bytes.extend_from_slice(&(entries.len() as u64).to_le_bytes());
            let start = bytes.len();
            bytes.extend_from_slice(entries);
            known.insert(r.record, start..bytes.len());
        }
        (self.bytes, self.known, self.changed) = (bytes, known, true);
    }

    fn save(&mut self) -> Result<(), MemoError> {
        let Some(path) = &self.file else { return Ok(()) };
        if !self.changed {
            return Ok(());
        }
        let err = |source| MemoError { path: path.clone(), source };
        let dir = path.parent().unwrap_or(Path::new("."));
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(err)?;
        }
        let body = &self.bytes[self.header_len()..];
        // tempfile creates the file with mode 0600.
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(err)?;
        tmp.write_all(self.magic).map_err(err)?;
        tmp.write_all(&Sha256::digest(body)).map_err(err)?;
        tmp.write_all(body).map_err(err)?;
        tmp.persist(path).map_err(|e| err(e.error))?;
        self.changed = false;
        Ok(())
    }
}

/// The file's bytes and where each record's value is in them; `None` without a file; why it is
/// not believed otherwise.
fn load(path: &Path, magic: &[u8]) -> Result<Option<(Vec<u8>, HashMap<Record, Range<usize>>)>, &'static str> {
    use std::os::unix::fs::MetadataExt;
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(_) => return Err("unreadable"),
    };
    let meta = file.metadata().map_err(|_| "unreadable")?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if meta.uid() != unsafe { libc::geteuid() } {
        return Err("owned by another user");
    }
    if meta.mode() & 0o077 != 0 {
        return Err("open to other users than its owner (not mode 0600)");
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_end(&mut bytes).map_err(|_| "unreadable")?;
    let header_len = magic.len() + 32;
    if bytes.len() < header_len || !bytes.starts_with(magic) {
        return Err("not a memory this build writes");
    }
    if Sha256::digest(&bytes[header_len..])[..] != bytes[magic.len()..header_len] {
        return Err("its checksum does not match (torn or corrupted)");
    }
    let known = index(&bytes, header_len).ok_or("its records do not add up")?;
    Ok(Some((bytes, known)))
}

/// Where each record's value is in a memory's bytes (after the header).
fn index(bytes: &[u8], header_len: usize) -> Option<HashMap<Record, Range<usize>>> {
    let mut known = HashMap::new();
    let mut at = header_len;
    while at < bytes.len() {
        let record: Record = bytes.get(at..at + 32)?.try_into().ok()?;
        let len = u64::from_le_bytes(bytes.get(at + 32..at + 40)?.try_into().ok()?);
        let end = (at + 40).checked_add(usize::try_from(len).ok()?)?;
        bytes.get(at + 40..end)?;
        known.insert(record, at + 40..end);
        at = end;
    }
    Some(known)
}

/// The record of `cluster`'s notes, checked against `key` for the fleet of `keys`.
pub(crate) fn record(keys: &StatusKeys, cluster: &str, key: &StatusKey) -> Record {
    record_of(crate::VERSION, keys.fleet(), cluster, key)
}

fn record_of(version: &str, fleet: &str, cluster: &str, key: &StatusKey) -> Record {
    digest(&["fleetgate-verified-notes-v3", version, fleet, cluster], None, key)
}

/// The record of the heartbeat commit `beat` in `cluster`'s heartbeat ref, checked against `key`
/// for the fleet of `keys`.
pub(crate) fn beat_record(keys: &StatusKeys, cluster: &str, beat: Oid, key: &StatusKey) -> Record {
    beat_record_of(crate::VERSION, keys.fleet(), cluster, beat, key)
}

fn beat_record_of(version: &str, fleet: &str, cluster: &str, beat: Oid, key: &StatusKey) -> Record {
    digest(&["fleetgate-verified-heartbeat-v1", version, fleet, cluster], Some(beat), key)
}

/// SHA-256 over `texts` (the first names what is remembered), an object id if given, and a key.
fn digest(texts: &[&str], object: Option<Oid>, key: &StatusKey) -> Record {
    let mut h = Sha256::new();
    // The text fields are NUL-terminated (none can contain NUL) and the rest have fixed lengths,
    // so no two tuples hash the same input.
    for part in texts {
        h.update(part.as_bytes());
        h.update([0]);
    }
    if let Some(object) = object {
        h.update(object.as_bytes());
    }
    h.update(key.public_key().key_data().ed25519().expect("status keys are Ed25519").0);
    h.finalize().into()
}

/// A remembered heartbeat, every field: [`Heartbeat`]'s own serde form skips an absent
/// signature, which a format without field names cannot read back.
#[derive(Serialize, Deserialize)]
struct Beat<'a> {
    fleet: &'a str,
    cluster: &'a str,
    at: Time,
    interval_seconds: u64,
    agent_version: &'a str,
    #[serde(borrow)]
    signature: Option<&'a str>,
}

/// A verified heartbeat, every field.
fn encode_beat(beat: &Heartbeat) -> Vec<u8> {
    let Heartbeat { fleet, cluster, at, interval_seconds, agent_version, signature } = beat;
    to_bytes(&Beat {
        fleet,
        cluster,
        at: Time::from(at),
        interval_seconds: *interval_seconds,
        agent_version,
        signature: signature.as_deref(),
    })
}

/// [`encode_beat`]'s beat back if it is `cluster`'s in `fleet`; `None` for bytes it did not write.
fn decode_beat(bytes: &[u8], cluster: &str, fleet: &str) -> Option<Heartbeat> {
    let beat: Beat<'_> = from_bytes(bytes)?;
    if beat.cluster != cluster || beat.fleet != fleet {
        return None;
    }
    Some(Heartbeat {
        fleet: beat.fleet.to_owned(),
        cluster: beat.cluster.to_owned(),
        at: beat.at.into_time()?,
        interval_seconds: beat.interval_seconds,
        agent_version: beat.agent_version.to_owned(),
        signature: beat.signature.map(str::to_owned),
    })
}

/// One entry of a remembered note, every field of [`Status`] (whose own serde form skips absent
/// fields and flattens unknown ones, which a format without field names cannot read back): text
/// the note's [`NoteContext`] already holds as [`Context::Same`], times as [`Time`], unknown
/// fields as the JSON text of their map. Its text borrows both ways: encoding copies nothing
/// before writing, decoding copies each text once, into the [`Status`] — where parsing the note's
/// JSON costs several times that (docs/BENCHMARKS.md).
#[derive(Clone, Serialize, Deserialize)]
struct Entry<'a> {
    state: State,
    #[serde(borrow)]
    cluster: Context<'a>,
    description: &'a str,
    release: &'a str,
    #[serde(borrow)]
    commit: Context<'a>,
    gates: Cow<'a, [GateFigure]>,
    started_at: Option<Time>,
    applied_at: Option<Time>,
    decided_at: Option<Time>,
    #[serde(borrow)]
    rollback_to: Option<&'a str>,
    approval: Option<Cow<'a, ApprovalRecord>>,
    #[serde(borrow)]
    variant: Option<&'a str>,
    #[serde(borrow)]
    target_url: Option<&'a str>,
    agent_version: &'a str,
    reported_at: Time,
    #[serde(borrow)]
    fleet: Context<'a>,
    sequence: Option<u64>,
    #[serde(borrow)]
    signature: Option<&'a str>,
    /// Empty for none.
    #[serde(borrow)]
    extra: Cow<'a, str>,
}

/// A text of an entry that its note's [`NoteContext`] may already hold: one byte but for
/// another text (an absent fleet too, where `Option<Context>` would take two).
#[derive(Clone, Serialize, Deserialize)]
enum Context<'a> {
    Absent,
    Same,
    Other(&'a str),
}

impl<'a> Context<'a> {
    fn of(value: Option<&'a str>, same: &str) -> Context<'a> {
        match value {
            None => Context::Absent,
            Some(v) if v == same => Context::Same,
            Some(v) => Context::Other(v),
        }
    }

    fn text(&self, same: &str) -> Option<String> {
        match self {
            Context::Absent => None,
            Context::Same => Some(same.to_owned()),
            Context::Other(value) => Some((*value).to_owned()),
        }
    }
}

/// A time as seconds since 1970 and nanoseconds: two varints, where chrono's serde form is an
/// RFC 3339 string to format and parse.
#[derive(Clone, Copy, Serialize, Deserialize)]
struct Time(i64, u32);

impl From<&DateTime<Utc>> for Time {
    fn from(at: &DateTime<Utc>) -> Time {
        Time(at.timestamp(), at.timestamp_subsec_nanos())
    }
}

impl Time {
    fn into_time(self) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp(self.0, self.1)
    }

    /// An optional time back: `None` when it is given but out of range.
    fn optional(at: Option<Time>) -> Option<Option<DateTime<Utc>>> {
        match at {
            None => Some(None),
            Some(at) => at.into_time().map(Some),
        }
    }
}

impl<'a> Entry<'a> {
    fn of(note: &NoteContext<'_>, s: &'a Status) -> Entry<'a> {
        let Status {
            cluster,
            state,
            description,
            release,
            commit,
            gates,
            started_at,
            applied_at,
            decided_at,
            rollback_to,
            approval,
            variant,
            target_url,
            agent_version,
            reported_at,
            fleet,
            sequence,
            signature,
            extra,
        } = s;
        Entry {
            state: *state,
            cluster: Context::of(Some(cluster), note.cluster),
            description,
            release,
            commit: Context::of(Some(commit), note.commit),
            gates: Cow::Borrowed(gates),
            started_at: started_at.as_ref().map(Time::from),
            applied_at: applied_at.as_ref().map(Time::from),
            decided_at: decided_at.as_ref().map(Time::from),
            rollback_to: rollback_to.as_deref(),
            approval: approval.as_ref().map(Cow::Borrowed),
            variant: variant.as_deref(),
            target_url: target_url.as_deref(),
            agent_version,
            reported_at: Time::from(reported_at),
            fleet: Context::of(fleet.as_deref(), note.fleet),
            sequence: *sequence,
            signature: signature.as_deref(),
            extra: match extra.is_empty() {
                true => Cow::Borrowed(""),
                false => Cow::Owned(serde_json::to_string(extra).expect("JSON values always serialize")),
            },
        }
    }

    /// The status back; `None` for a time or unknown fields that do not parse.
    fn status(self, note: &NoteContext<'_>) -> Option<Status> {
        let owned = |text: Option<&str>| text.map(str::to_owned);
        Some(Status {
            cluster: self.cluster.text(note.cluster)?,
            state: self.state,
            description: self.description.to_owned(),
            release: self.release.to_owned(),
            commit: self.commit.text(note.commit)?,
            gates: self.gates.into_owned(),
            started_at: Time::optional(self.started_at)?,
            applied_at: Time::optional(self.applied_at)?,
            decided_at: Time::optional(self.decided_at)?,
            rollback_to: owned(self.rollback_to),
            approval: self.approval.map(Cow::into_owned),
            variant: owned(self.variant),
            target_url: owned(self.target_url),
            agent_version: self.agent_version.to_owned(),
            reported_at: self.reported_at.into_time()?,
            fleet: self.fleet.text(note.fleet),
            sequence: self.sequence,
            signature: owned(self.signature),
            extra: match &*self.extra {
                "" => BTreeMap::new(),
                json => serde_json::from_str(json).ok()?,
            },
        })
    }
}

/// A [`Listing`] as it is stored: object ids as their 20 bytes.
#[derive(Serialize, Deserialize)]
struct ListingForm<'a> {
    tip: [u8; 20],
    #[serde(borrow)]
    notes: Vec<Listed<'a>>,
}

/// A note of a [`Listing`]: the commit it is attached to, its blob, and its entries when every one
/// verified (`None`: in the tree, but not believed, or not read).
#[derive(Serialize, Deserialize)]
pub(crate) struct Listed<'a> {
    commit: [u8; 20],
    blob: [u8; 20],
    #[serde(borrow)]
    entries: Option<Vec<Entry<'a>>>,
}

/// The notes of `cluster`'s notes ref at `tip`, every field of their entries (see [`Entry`]).
fn encode_listing(tip: Oid, notes: &[NoteRead], cluster: &str, fleet: &str) -> Vec<u8> {
    let id = |oid: Oid| <[u8; 20]>::try_from(oid.as_bytes()).expect("an object id is 20 bytes");
    let hexes: Vec<String> = notes.iter().map(|n| n.commit.to_string()).collect();
    let notes = notes
        .iter()
        .zip(&hexes)
        .map(|(n, commit)| {
            let note = NoteContext { cluster, commit, fleet };
            Listed {
                commit: id(n.commit),
                blob: id(n.blob),
                entries: n.entries.as_ref().map(|e| e.iter().map(|s| Entry::of(&note, s)).collect()),
            }
        })
        .collect();
    to_bytes(&ListingForm { tip: id(tip), notes })
}

fn to_bytes(value: &impl Serialize) -> Vec<u8> {
    postcard::to_allocvec(value).expect("the memory's records always serialize")
}

/// `bytes` as exactly one `T` (postcard's `from_bytes` would ignore bytes after it).
fn from_bytes<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<T> {
    match postcard::take_from_bytes(bytes) {
        Ok((value, [])) => Some(value),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::StatusSigner;
    use std::os::unix::fs::PermissionsExt;

    const HEADER_LEN: usize = MAGIC.len() + 32;

    fn oid(n: u8) -> Oid {
        Oid::from_bytes(&[n; 20]).unwrap()
    }

    /// `entries` as the one note (on commit `oid(1)`, blob `oid(2)`) of cluster `a`'s notes at tip
    /// `oid(9)`, encoded.
    fn listed(entries: &[Status]) -> Vec<u8> {
        let note = NoteRead { commit: oid(1), blob: oid(2), entries: Some(entries.to_vec()) };
        encode_listing(oid(9), &[note], "a", "f")
    }

    /// [`listed`]'s entries back; `None` for bytes it did not write.
    fn unlisted(bytes: &[u8]) -> Option<Vec<Status>> {
        let form: ListingForm<'_> = from_bytes(bytes)?;
        let [note] = &form.notes[..] else { return None };
        assert_eq!((form.tip, note.commit, note.blob), ([9; 20], [1; 20], [2; 20]));
        note.statuses(&NoteContext { cluster: "a", commit: &oid(1).to_string(), fleet: "f" })
    }

    /// A status with every field set, some to values the note's context does not hold.
    fn everything() -> Status {
        let at = |s: &str| Some(s.parse::<DateTime<Utc>>().unwrap());
        let mut s = Status::new("a", "rel-2", "C0FFEE", State::Failure, "rolled back: é ✓ \u{1b}[2J")
            .with_gates(vec![GateFigure {
                name: "error-rate".into(),
                observed: "7.3 %".into(),
                threshold: "5 %".into(),
                verdict: "fail".into(),
            }])
            .rolled_back_to("rel-1")
            .approved(ApprovalRecord {
                by: "Ana <ana@example.com> (key 3AF1)".into(),
                why: "CAB-1234\nsecond line".into(),
                wave: "prod".into(),
                via: "tag approve/rel-2/prod".into(),
            })
            .of_variant(Some("eu".into()))
            .with_target_url("https://example.com/x");
        (s.started_at, s.applied_at, s.decided_at) =
            (at("1969-07-20T20:17:40.5Z"), at("2025-01-01T00:01:00Z"), at("2025-01-01T00:11:00.123456789Z"));
        (s.fleet, s.sequence, s.signature) =
            (Some("g".into()), Some(u64::MAX), Some("-----BEGIN SSH SIGNATURE-----".into()));
        s.extra.insert("canaryScore".into(), serde_json::json!({"value": 0.97, "window": ["5m", null]}));
        s
    }

    #[test]
    fn every_field_of_every_entry_comes_back() {
        let plain = Status {
            fleet: Some("f".into()),
            sequence: Some(1),
            ..Status::new("a", "rel-1", "c0ffee", State::Unknown, "ok")
        };
        let unsigned =
            Status { cluster: "b".into(), fleet: None, ..Status::new("a", "rel-1", "c0ffee", State::Pending, "") };
        let entries = vec![everything(), plain, unsigned];
        assert_eq!(unlisted(&listed(&entries)), Some(entries));
        assert_eq!(unlisted(&listed(&[])), Some(vec![]));
        // A note that did not verify is listed without entries.
        let unbelieved = NoteRead { commit: oid(1), blob: oid(2), entries: None };
        let bytes = encode_listing(oid(9), &[unbelieved], "a", "f");
        assert_eq!(unlisted(&bytes), None);
    }

    #[test]
    fn bytes_encode_did_not_write_do_not_decode() {
        let encoded = listed(&[everything()]);
        for cut in [0, 1, encoded.len() / 2, encoded.len() - 1] {
            assert_eq!(unlisted(&encoded[..cut]), None, "cut at {cut}");
        }
        let mut longer = encoded.clone();
        longer.push(0);
        assert_eq!(unlisted(&longer), None);
        // After the tip, the count of notes, the note's commit and blob, the mark of its entries
        // and their count, and the entry's state: the mark of the entry's cluster, 1 (the note's)
        // or 2 (another, then its text); 0 (absent) is no cluster, 7 no mark.
        for mark in [0, 7] {
            let mut bad_mark = encoded.clone();
            bad_mark[20 + 1 + 40 + 1 + 1 + 1] = mark;
            assert_eq!(unlisted(&bad_mark), None, "mark {mark}");
        }
    }

    /// postcard writes no field names: a field of [`Entry`] or [`Beat`], or of what they hold,
    /// added, removed or moved changes what a file's bytes mean, and a file of the same magic
    /// would be misread. When this fails, bump [`MAGIC`] (or [`BEATS_MAGIC`]) and take the new
    /// bytes.
    #[test]
    fn the_encoding_is_pinned() {
        let hex = |bytes: Vec<u8>| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let at = "2025-01-01T00:12:00Z".parse::<DateTime<Utc>>().unwrap();
        let entry = Status { reported_at: at, agent_version: "1.0".into(), ..everything() };
        assert_eq!(
            hex(listed(&[entry])),
            concat!(
                // The listing: its tip, one note, the note's commit and blob, entries present.
                "0909090909090909090909090909090909090909",
                "01",
                "0101010101010101010101010101010101010101",
                "0202020202020202020202020202020202020202",
                "01",
                // Its entries.
                "01020118726f6c6c6564206261636b3a20c3a920e29c93201b5b324a0572656c2d320206433046464545010a6572726f",
                "722d7261746505372e33202503352025046661696c01b7a8c30d80cab5ee0101f896a4f70c0001a8a0a4f70c959aef3a",
                "010572656c2d310120416e61203c616e61406578616d706c652e636f6d3e20286b6579203341463129144341422d3132",
                "33340a7365636f6e64206c696e650470726f641674616720617070726f76652f72656c2d322f70726f64010265750115",
                "68747470733a2f2f6578616d706c652e636f6d2f7803312e30a0a1a4f70c0002016701ffffffffffffffffff01011d2d",
                "2d2d2d2d424547494e20535348205349474e41545552452d2d2d2d2d337b2263616e61727953636f7265223a7b227661",
                "6c7565223a302e39372c2277696e646f77223a5b22356d222c6e756c6c5d7d7d",
            )
        );
        let beat = Heartbeat {
            fleet: "f".into(),
            cluster: "a".into(),
            at,
            interval_seconds: 60,
            agent_version: "1.0".into(),
            signature: Some("sig".into()),
        };
        assert_eq!(hex(encode_beat(&beat)), "01660161a0a1a4f70c003c03312e300103736967");
    }

    /// A memory holding, per `(n, description)`, a cluster's notes (record `[n; 32]`): one note of
    /// one entry saying `description`.
    fn remembering(memo: &mut VerifiedNotes, notes: &[(u8, &str)]) {
        let used = notes
            .iter()
            .map(|(n, description)| {
                let entry = Status::new("a", "rel-1", oid(1).to_string(), State::Success, *description);
                let note = NoteRead { commit: oid(1), blob: oid(2), entries: Some(vec![entry]) };
                Remembered::notes([*n; 32], oid(9), &[note], "a", "f")
            })
            .collect();
        memo.replace(used);
    }

    fn described(memo: &VerifiedNotes, n: u8) -> Option<String> {
        let listing = memo.recall(&[n; 32])?;
        let note = NoteContext { cluster: "a", commit: &oid(1).to_string(), fleet: "f" };
        Some(listing.note(oid(1))?.statuses(&note)?[0].description.clone())
    }

    #[test]
    fn the_memory_file_round_trips_with_mode_0600_and_is_rewritten_only_when_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status").join("verified-notes");
        assert_eq!(described(&VerifiedNotes::open(&path), 1), None);
        let mut memo = VerifiedNotes::open(&path);
        remembering(&mut memo, &[(1, "one"), (2, "two")]);
        memo.save().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);

        let mut memo = VerifiedNotes::open(&path);
        assert_eq!((described(&memo, 1).as_deref(), described(&memo, 2).as_deref()), (Some("one"), Some("two")));
        // The same notes read again: nothing to write.
        let used = [1, 2].map(|n| memo.recall(&[n; 32]).unwrap().keep([n; 32])).into();
        memo.replace(used);
        std::fs::remove_file(&path).unwrap();
        memo.save().unwrap();
        assert!(!path.exists(), "rewritten although nothing changed");
        // One of them only: the memory is what this read used.
        let used = vec![memo.recall(&[2; 32]).unwrap().keep([2; 32])];
        memo.replace(used);
        memo.save().unwrap();
        let memo = VerifiedNotes::open(&path);
        assert_eq!((described(&memo, 1), described(&memo, 2).as_deref()), (None, Some("two")));
    }

    /// Torn, flipped, foreign or open to others: nothing of the file is believed, and the next
    /// save replaces it with a good one.
    #[test]
    fn a_damaged_or_exposed_memory_file_is_ignored_whole_and_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("verified-notes");
        let mut memo = VerifiedNotes::open(&path);
        remembering(&mut memo, &[(1, "one"), (2, "two")]);
        memo.save().unwrap();
        let good = std::fs::read(&path).unwrap();
        let at = good.windows(3).position(|w| w == b"two").unwrap();
        let mut flipped = good.clone();
        flipped[at] = b'T';
        let damaged: Vec<(&str, Vec<u8>)> = vec![
            ("torn", good[..good.len() - 3].to_vec()),
            ("a flipped byte", flipped),
            ("the previous format", [b"fleetgate verified notes v6\n", &good[MAGIC.len()..]].concat()),
            ("empty", Vec::new()),
            ("a record past the end", {
                let mut bad = good[..HEADER_LEN].to_vec();
                bad.extend([7; 32]);
                bad.extend(u64::MAX.to_le_bytes());
                let sum = Sha256::digest(&bad[HEADER_LEN..]);
                bad[MAGIC.len()..HEADER_LEN].copy_from_slice(&sum);
                bad
            }),
        ];
        for (what, bytes) in damaged {
            std::fs::write(&path, bytes).unwrap();
            let mut memo = VerifiedNotes::open(&path);
            assert_eq!((described(&memo, 1), described(&memo, 2)), (None, None), "{what}");
            memo.replace(Vec::new());
            memo.save().unwrap();
            assert!(std::fs::read(&path).unwrap().starts_with(MAGIC), "{what}: not rebuilt");
            assert!(VerifiedNotes::open(&path).notes.known.is_empty(), "{what}");
        }

        std::fs::write(&path, &good).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(described(&VerifiedNotes::open(&path), 1), None, "a memory others can read or write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(described(&VerifiedNotes::open(&path), 1).as_deref(), Some("one"));
    }

    #[test]
    fn a_record_covers_the_cluster_fleet_key_and_version() {
        let key = StatusSigner::generate("a").unwrap().public();
        let other_key = StatusSigner::generate("a").unwrap().public();
        let base = record_of("1.0", "f", "a", &key);
        for changed in [
            record_of("1.1", "f", "a", &key),
            record_of("1.0", "g", "a", &key),
            record_of("1.0", "f", "b", &key),
            record_of("1.0", "f", "a", &other_key),
            // Moving text between fields is another input too.
            record_of("1.0", "fa", "", &key),
        ] {
            assert_ne!(changed, base);
        }
    }

    #[test]
    fn a_beat_record_covers_the_commit_cluster_fleet_key_and_version_and_is_no_note_record() {
        let key = StatusSigner::generate("a").unwrap().public();
        let other_key = StatusSigner::generate("a").unwrap().public();
        let beat = Oid::from_str(&"1".repeat(40)).unwrap();
        let other_beat = Oid::from_str(&"2".repeat(40)).unwrap();
        let base = beat_record_of("1.0", "f", "a", beat, &key);
        for changed in [
            beat_record_of("1.1", "f", "a", beat, &key),
            beat_record_of("1.0", "g", "a", beat, &key),
            beat_record_of("1.0", "f", "b", beat, &key),
            beat_record_of("1.0", "f", "a", other_beat, &key),
            beat_record_of("1.0", "f", "a", beat, &other_key),
            record_of("1.0", "f", "a", &key),
        ] {
            assert_ne!(changed, base);
        }
    }

    #[test]
    fn a_remembered_beat_comes_back_whole() {
        let id = crate::status::StatusIdentity::new("f", StatusSigner::generate("a").unwrap());
        let beat = Heartbeat::signed(&id, "a", std::time::Duration::from_secs(60)).unwrap();
        assert_eq!(decode_beat(&encode_beat(&beat), "a", "f"), Some(beat.clone()));
        let unsigned = Heartbeat { signature: None, ..beat.clone() };
        assert_eq!(decode_beat(&encode_beat(&unsigned), "a", "f"), Some(unsigned));
        let encoded = encode_beat(&beat);
        assert_eq!(decode_beat(&encoded[..encoded.len() - 1], "a", "f"), None);
        assert_eq!(decode_beat(&[encoded.as_slice(), &[0]].concat(), "a", "f"), None);
        let mut memo = VerifiedBeats::default();
        memo.replace(vec![Remembered::beat([1; 32], &beat)]);
        assert_eq!(memo.recall(&[1; 32], "a", "f").map(|(b, _)| b), Some(beat));
        // Under another cluster's or fleet's name it is no proof.
        assert!(memo.recall(&[1; 32], "b", "f").is_none() && memo.recall(&[1; 32], "a", "g").is_none());
    }
}
