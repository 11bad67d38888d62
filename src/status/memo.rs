//! Notes already verified: a reader's memory of the note blobs whose every entry verified, and of
//! the entries themselves, so the next read of the same blob neither reads nor parses it nor
//! checks its Ed25519 signatures again (tens of microseconds per entry, most of `fleetgate
//! status`'s time over a big fleet; docs/BENCHMARKS.md, "Status matrix").
//!
//! A note is remembered under a record: a SHA-256 over everything [`StatusKeys::verify`] depends
//! on — the note blob's Git object id (its content, as Git names it — fetching re-hashes every
//! object it receives, with libgit2's collision detection), the cluster whose notes hold it, the
//! commit it is attached to, the fleet, the cluster's key, and this build's version (another build
//! may check or encode differently). A hit therefore means "this exact note was verified against
//! this exact key", and a changed note, another key, another fleet or another build misses and is
//! read and checked in full. Only notes whose every entry verified are remembered: anything
//! unverified is checked, and reported, each time.
//!
//! With each record the memory keeps what a view keeps of the note (each release's latest entry,
//! without its signature: [`super::notes::read_all_remembering`]), decoded, in a compact binary
//! form (see [`encode`]): every field, unknown ones as their JSON text, so a hit gives back
//! exactly what a read of the blob gives the view.
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
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// One remembered note's or heartbeat's key (see the module docs for what it covers).
pub(crate) type Record = [u8; 32];

/// First bytes of the notes' file; changed with the layout or the encoding.
const MAGIC: &[u8] = b"fleetgate verified notes v5\n";
/// First bytes of the heartbeats' file.
const BEATS_MAGIC: &[u8] = b"fleetgate verified heartbeats v1\n";
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

/// What the read that just finished found fully verified: a note (or heartbeat) of the memory it
/// used, or one it verified itself, encoded.
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
    /// `entries`, all verified, of the note `record` stands for.
    pub(crate) fn new(record: Record, note: &NoteContext<'_>, entries: &[Status]) -> Remembered {
        Remembered { record, entries: Encoded::New(encode(note, entries)) }
    }

    /// `beat`, verified, of the heartbeat commit `record` stands for.
    pub(crate) fn beat(record: Record, beat: &Heartbeat) -> Remembered {
        Remembered { record, entries: Encoded::New(encode_beat(beat)) }
    }
}

/// What the record of a note covers that its verified entries repeat (they name the cluster
/// whose notes hold them, the fleet, and — up to case — the commit), so it is stored once.
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

    /// The entries of the note `record` stands for, if it is remembered, and how to remember it
    /// again. Entries that do not decode (which the checksum makes a bug, not corruption) are a
    /// miss: the note is read and checked again.
    pub(crate) fn recall(&self, record: &Record, note: &NoteContext<'_>) -> Option<(Vec<Status>, Remembered)> {
        let (range, bytes) = self.notes.get(record)?;
        let Some(entries) = decode(bytes, note) else {
            tracing::debug!(
                cluster = note.cluster,
                commit = note.commit,
                "a remembered note does not decode; checking it again"
            );
            return None;
        };
        Some((entries, Remembered { record: *record, entries: Encoded::Kept(range) }))
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
        let beat = decode_beat(bytes).filter(|b| b.cluster == cluster && b.fleet == fleet)?;
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

/// The record of the note `blob` in `cluster`'s notes on `commit`, checked against `key` for the
/// fleet of `keys`.
pub(crate) fn record(keys: &StatusKeys, cluster: &str, commit: &str, blob: Oid, key: &StatusKey) -> Record {
    record_of(crate::VERSION, keys.fleet(), cluster, commit, blob, key)
}

fn record_of(version: &str, fleet: &str, cluster: &str, commit: &str, blob: Oid, key: &StatusKey) -> Record {
    digest(&["fleetgate-verified-note-v2", version, fleet, cluster, commit], blob, key)
}

/// The record of the heartbeat commit `beat` in `cluster`'s heartbeat ref, checked against `key`
/// for the fleet of `keys`.
pub(crate) fn beat_record(keys: &StatusKeys, cluster: &str, beat: Oid, key: &StatusKey) -> Record {
    beat_record_of(crate::VERSION, keys.fleet(), cluster, beat, key)
}

fn beat_record_of(version: &str, fleet: &str, cluster: &str, beat: Oid, key: &StatusKey) -> Record {
    digest(&["fleetgate-verified-heartbeat-v1", version, fleet, cluster], beat, key)
}

/// SHA-256 over `texts` (the first names what is remembered), an object id and a key.
fn digest(texts: &[&str], object: Oid, key: &StatusKey) -> Record {
    let mut h = Sha256::new();
    // The text fields are NUL-terminated (none can contain NUL) and the rest have fixed lengths,
    // so no two tuples hash the same input.
    for part in texts {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.update(object.as_bytes());
    h.update(key.public_key().key_data().ed25519().expect("status keys are Ed25519").0);
    h.finalize().into()
}

/// A verified heartbeat, every field (as [`encode`] writes them).
fn encode_beat(beat: &Heartbeat) -> Vec<u8> {
    let Heartbeat { fleet, cluster, at, interval_seconds, agent_version, signature } = beat;
    let mut w = Writer(Vec::with_capacity(512));
    for text in [fleet, cluster, agent_version] {
        w.text(text);
    }
    w.time(at);
    w.int(*interval_seconds);
    w.optional(signature.as_deref(), Writer::text);
    w.0
}

/// [`encode_beat`]'s beat back; `None` for bytes it did not write.
fn decode_beat(bytes: &[u8]) -> Option<Heartbeat> {
    let mut r = Reader(bytes);
    let (fleet, cluster, agent_version) = (r.text()?, r.text()?, r.text()?);
    let beat = Heartbeat {
        fleet,
        cluster,
        agent_version,
        at: r.time()?,
        interval_seconds: r.int()?,
        signature: r.optional(Reader::text)?,
    };
    r.0.is_empty().then_some(beat)
}

/// The entries of one note, every field: integers as LEB128, text as its length and UTF-8 bytes,
/// a value the note's [`NoteContext`] already holds as a one-byte mark, unknown fields as the
/// JSON text of the map. Reading it back costs a copy per string, where parsing the note's JSON
/// costs several times that (docs/BENCHMARKS.md).
fn encode(note: &NoteContext<'_>, entries: &[Status]) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(entries.len() * 512));
    w.int(entries.len() as u64);
    for s in entries {
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
        w.byte(match state {
            State::Pending => 0,
            State::Success => 1,
            State::Failure => 2,
            State::Error => 3,
            State::Unknown => 4,
        });
        w.same_or_text(Some(cluster), note.cluster);
        w.text(description);
        w.text(release);
        w.same_or_text(Some(commit), note.commit);
        w.int(gates.len() as u64);
        for GateFigure { name, observed, threshold, verdict } in gates {
            for text in [name, observed, threshold, verdict] {
                w.text(text);
            }
        }
        for at in [started_at, applied_at, decided_at] {
            w.optional(at.as_ref(), Writer::time);
        }
        w.optional(rollback_to.as_deref(), Writer::text);
        w.optional(approval.as_ref(), |w, ApprovalRecord { by, why, wave, via }| {
            for text in [by, why, wave, via] {
                w.text(text);
            }
        });
        w.optional(variant.as_deref(), Writer::text);
        w.optional(target_url.as_deref(), Writer::text);
        w.text(agent_version);
        w.time(reported_at);
        w.same_or_text(fleet.as_deref(), note.fleet);
        w.optional(*sequence, Writer::int);
        w.optional(signature.as_deref(), Writer::text);
        match extra.is_empty() {
            true => w.text(""),
            false => w.text(&serde_json::to_string(extra).expect("JSON values always serialize")),
        }
    }
    w.0
}

/// [`encode`]'s entries back; `None` for bytes it did not write.
fn decode(bytes: &[u8], note: &NoteContext<'_>) -> Option<Vec<Status>> {
    let mut r = Reader(bytes);
    let count = r.int()?;
    let mut entries = Vec::with_capacity(usize::try_from(count).ok()?.min(bytes.len()));
    for _ in 0..count {
        let state = match r.byte()? {
            0 => State::Pending,
            1 => State::Success,
            2 => State::Failure,
            3 => State::Error,
            4 => State::Unknown,
            _ => return None,
        };
        let cluster = r.same_or_text(note.cluster)??;
        let description = r.text()?;
        let release = r.text()?;
        let commit = r.same_or_text(note.commit)??;
        let gates = (0..r.int()?)
            .map(|_| {
                Some(GateFigure { name: r.text()?, observed: r.text()?, threshold: r.text()?, verdict: r.text()? })
            })
            .collect::<Option<Vec<_>>>()?;
        let started_at = r.optional(Reader::time)?;
        let applied_at = r.optional(Reader::time)?;
        let decided_at = r.optional(Reader::time)?;
        let rollback_to = r.optional(Reader::text)?;
        let approval =
            r.optional(|r| Some(ApprovalRecord { by: r.text()?, why: r.text()?, wave: r.text()?, via: r.text()? }))?;
        let variant = r.optional(Reader::text)?;
        let target_url = r.optional(Reader::text)?;
        let agent_version = r.text()?;
        let reported_at = r.time()?;
        let fleet = r.same_or_text(note.fleet)?;
        let sequence = r.optional(Reader::int)?;
        let signature = r.optional(Reader::text)?;
        let extra = match r.text()? {
            json if json.is_empty() => BTreeMap::new(),
            json => serde_json::from_str(&json).ok()?,
        };
        entries.push(Status {
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
        });
    }
    r.0.is_empty().then_some(entries)
}

struct Writer(Vec<u8>);

impl Writer {
    fn byte(&mut self, b: u8) {
        self.0.push(b);
    }

    fn int(&mut self, mut n: u64) {
        while n >= 0x80 {
            self.0.push(n as u8 | 0x80);
            n >>= 7;
        }
        self.0.push(n as u8);
    }

    fn text(&mut self, s: &str) {
        self.int(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }

    fn time(&mut self, at: &DateTime<Utc>) {
        // Zig-zag, so times before 1970 stay short too.
        let secs = at.timestamp();
        self.int(((secs << 1) ^ (secs >> 63)) as u64);
        self.int(u64::from(at.timestamp_subsec_nanos()));
    }

    /// 0 for none, 1 then the value.
    fn optional<T>(&mut self, value: Option<T>, put: impl FnOnce(&mut Writer, T)) {
        match value {
            None => self.byte(0),
            Some(v) => {
                self.byte(1);
                put(self, v);
            }
        }
    }

    /// 0 for none, 1 for `same`, 2 then another text.
    fn same_or_text(&mut self, value: Option<&str>, same: &str) {
        match value {
            None => self.byte(0),
            Some(v) if v == same => self.byte(1),
            Some(v) => {
                self.byte(2);
                self.text(v);
            }
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }

    fn int(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            n |= u64::from(b & 0x7f).checked_shl(shift)?;
            if b < 0x80 {
                return Some(n);
            }
        }
        None
    }

    fn text(&mut self) -> Option<String> {
        let len = usize::try_from(self.int()?).ok()?;
        let (text, rest) = self.0.split_at_checked(len)?;
        self.0 = rest;
        std::str::from_utf8(text).ok().map(str::to_owned)
    }

    fn time(&mut self) -> Option<DateTime<Utc>> {
        let zigzag = self.int()?;
        let secs = (zigzag >> 1) as i64 ^ -((zigzag & 1) as i64);
        DateTime::from_timestamp(secs, u32::try_from(self.int()?).ok()?)
    }

    /// [`Writer::optional`]'s value: `None` when the bytes are not one, else whether it was given.
    fn optional<T>(&mut self, get: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        match self.byte()? {
            0 => Some(None),
            1 => get(self).map(Some),
            _ => None,
        }
    }

    /// [`Writer::same_or_text`]'s value, as [`Reader::optional`] gives it.
    fn same_or_text(&mut self, same: &str) -> Option<Option<String>> {
        match self.byte()? {
            0 => Some(None),
            1 => Some(Some(same.to_string())),
            2 => self.text().map(Some),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::StatusSigner;
    use std::os::unix::fs::PermissionsExt;

    const HEADER_LEN: usize = MAGIC.len() + 32;
    const NOTE: NoteContext<'static> = NoteContext { cluster: "a", commit: "c0ffee", fleet: "f" };

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
        assert_eq!(decode(&encode(&NOTE, &entries), &NOTE), Some(entries));
        assert_eq!(decode(&encode(&NOTE, &[]), &NOTE), Some(vec![]));
    }

    #[test]
    fn bytes_encode_did_not_write_do_not_decode() {
        let encoded = encode(&NOTE, &[everything()]);
        for cut in [0, 1, encoded.len() / 2, encoded.len() - 1] {
            assert_eq!(decode(&encoded[..cut], &NOTE), None, "cut at {cut}");
        }
        let mut longer = encoded.clone();
        longer.push(0);
        assert_eq!(decode(&longer, &NOTE), None);
        let mut bad_state = encoded;
        bad_state[1] = 9;
        assert_eq!(decode(&bad_state, &NOTE), None);
    }

    /// A memory holding one note (record `[n; 32]`) of one entry saying `description`.
    fn remembering(memo: &mut VerifiedNotes, notes: &[(u8, &str)]) {
        let used = notes
            .iter()
            .map(|(n, description)| {
                let entry = Status::new("a", "rel-1", "c0ffee", State::Success, description);
                Remembered::new([*n; 32], &NOTE, &[entry])
            })
            .collect();
        memo.replace(used);
    }

    fn described(memo: &VerifiedNotes, n: u8) -> Option<String> {
        memo.recall(&[n; 32], &NOTE).map(|(entries, _)| entries[0].description.clone())
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
        let used = [1, 2].map(|n| memo.recall(&[n; 32], &NOTE).unwrap().1).into();
        memo.replace(used);
        std::fs::remove_file(&path).unwrap();
        memo.save().unwrap();
        assert!(!path.exists(), "rewritten although nothing changed");
        // One of them only: the memory is what this read used.
        let used = vec![memo.recall(&[2; 32], &NOTE).unwrap().1];
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
            ("another format", [b"fleetgate verified notes v3\n", &good[MAGIC.len()..]].concat()),
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
    fn a_record_covers_the_blob_cluster_commit_fleet_key_and_version() {
        let key = StatusSigner::generate("a").unwrap().public();
        let other_key = StatusSigner::generate("a").unwrap().public();
        let blob = Oid::from_str(&"1".repeat(40)).unwrap();
        let other_blob = Oid::from_str(&"2".repeat(40)).unwrap();
        let base = record_of("1.0", "f", "a", "c", blob, &key);
        for changed in [
            record_of("1.1", "f", "a", "c", blob, &key),
            record_of("1.0", "g", "a", "c", blob, &key),
            record_of("1.0", "f", "b", "c", blob, &key),
            record_of("1.0", "f", "a", "d", blob, &key),
            record_of("1.0", "f", "a", "c", other_blob, &key),
            record_of("1.0", "f", "a", "c", blob, &other_key),
            // Moving text between fields is another input too.
            record_of("1.0", "fa", "", "c", blob, &key),
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
            record_of("1.0", "f", "a", "", beat, &key),
        ] {
            assert_ne!(changed, base);
        }
    }

    #[test]
    fn a_remembered_beat_comes_back_whole() {
        let id = crate::status::StatusIdentity::new("f", StatusSigner::generate("a").unwrap());
        let beat = Heartbeat::signed(&id, "a", std::time::Duration::from_secs(60)).unwrap();
        assert_eq!(decode_beat(&encode_beat(&beat)), Some(beat.clone()));
        let unsigned = Heartbeat { signature: None, ..beat.clone() };
        assert_eq!(decode_beat(&encode_beat(&unsigned)), Some(unsigned));
        let encoded = encode_beat(&beat);
        assert_eq!(decode_beat(&encoded[..encoded.len() - 1]), None);
        let mut memo = VerifiedBeats::default();
        memo.replace(vec![Remembered::beat([1; 32], &beat)]);
        assert_eq!(memo.recall(&[1; 32], "a", "f").map(|(b, _)| b), Some(beat));
        // Under another cluster's or fleet's name it is no proof.
        assert!(memo.recall(&[1; 32], "b", "f").is_none() && memo.recall(&[1; 32], "a", "g").is_none());
    }
}
