//! Notes already verified: a reader's memory of which note blobs had every entry verify, so the
//! next read of the same blob skips the Ed25519 checks (tens of microseconds per entry, most of
//! `fleetgate status`'s time over a big fleet; docs/BENCHMARKS.md, "Status matrix").
//!
//! A record is a SHA-256 over everything [`StatusKeys::verify`] depends on: the note blob's Git
//! object id (its content, as Git names it — fetching re-hashes every object it receives, with
//! libgit2's collision detection), the cluster whose notes hold it, the commit it is attached to,
//! the fleet, the cluster's key, and this build's version (another build may check differently).
//! A hit therefore means "this exact note was verified against this exact key", and a changed note,
//! another key, another fleet or another build misses and is checked in full. Only notes whose
//! every entry verified are remembered: anything unverified is checked, and reported, each time.
//!
//! `fleetgate status` keeps the memory in `$XDG_CACHE_HOME/fleetgate/status/verified-notes`
//! (written with mode 0600); it holds exactly what the last read used, so it never grows past one
//! fleet's notes. Whoever can write that file can make this user's `fleetgate status` believe a
//! note, as whoever can write the user's `fleetgate` binary can.

use super::identity::{StatusKey, StatusKeys};
use git2::Oid;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One remembered note (see the module docs for what it covers).
pub(crate) type Record = [u8; 32];

/// The notes a reader found fully verified; see the module docs.
#[derive(Debug, Default)]
pub struct VerifiedNotes {
    known: HashSet<Record>,
    /// What the last read used: remembered hits and newly verified notes.
    used: Vec<Record>,
    file: Option<PathBuf>,
}

/// A memory file that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing the verified-notes memory {path}")]
pub struct MemoError {
    path: PathBuf,
    source: std::io::Error,
}

impl VerifiedNotes {
    /// An empty memory kept in this process only (an agent, `--watch`, a test).
    pub fn new() -> VerifiedNotes {
        VerifiedNotes::default()
    }

    /// The memory kept in `path`; a missing or unreadable file is an empty memory (it is only a
    /// cache), a trailing partial record is ignored.
    pub fn open(path: impl Into<PathBuf>) -> VerifiedNotes {
        let file = path.into();
        let bytes = std::fs::read(&file).unwrap_or_default();
        let known = bytes.chunks_exact(32).map(|c| c.try_into().expect("32-byte chunks")).collect();
        VerifiedNotes { known, used: Vec::new(), file: Some(file) }
    }

    /// `$XDG_CACHE_HOME/fleetgate/status/verified-notes`, else under `~/.cache`; `None` without
    /// either (no memory across runs then).
    pub fn default_path() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(base.join("fleetgate").join("status").join("verified-notes"))
    }

    pub(crate) fn knows(&self, record: &Record) -> bool {
        self.known.contains(record)
    }

    /// Makes the records of the read that just finished the whole memory.
    pub(crate) fn replace(&mut self, used: Vec<Record>) {
        self.known = used.iter().copied().collect();
        self.used = used;
    }

    /// Writes the memory to its file (if it has one), replacing it atomically.
    ///
    /// # Errors
    /// The file or its directory could not be written.
    pub fn save(&self) -> Result<(), MemoError> {
        let Some(path) = &self.file else { return Ok(()) };
        let err = |source| MemoError { path: path.clone(), source };
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(err)?;
        // tempfile creates the file with mode 0600.
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(err)?;
        tmp.write_all(&self.used.concat()).map_err(err)?;
        tmp.persist(path).map_err(|e| err(e.error))?;
        Ok(())
    }
}

/// The record of the note `blob` in `cluster`'s notes on `commit`, checked against `key` for the
/// fleet of `keys`.
pub(crate) fn record(keys: &StatusKeys, cluster: &str, commit: &str, blob: Oid, key: &StatusKey) -> Record {
    let mut h = Sha256::new();
    // The text fields are NUL-terminated (none can contain NUL) and the rest have fixed lengths,
    // so no two tuples hash the same input.
    for part in [
        b"fleetgate-verified-note-v1",
        crate::VERSION.as_bytes(),
        keys.fleet().as_bytes(),
        cluster.as_bytes(),
        commit.as_bytes(),
    ] {
        h.update(part);
        h.update([0]);
    }
    h.update(blob.as_bytes());
    h.update(key.public_key().key_data().ed25519().expect("status keys are Ed25519").0);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_file_round_trips_and_a_torn_or_missing_file_is_only_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status").join("verified-notes");
        assert!(!VerifiedNotes::open(&path).knows(&[1; 32]));
        let mut memo = VerifiedNotes::open(&path);
        memo.replace(vec![[1; 32], [2; 32]]);
        memo.save().unwrap();
        assert!(VerifiedNotes::open(&path).knows(&[2; 32]));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);

        let mut torn = std::fs::read(&path).unwrap();
        torn.truncate(40);
        std::fs::write(&path, torn).unwrap();
        let memo = VerifiedNotes::open(&path);
        assert!(memo.knows(&[1; 32]) && !memo.knows(&[2; 32]));
    }

    #[test]
    fn a_read_replaces_what_was_remembered() {
        let mut memo = VerifiedNotes::new();
        memo.replace(vec![[1; 32]]);
        memo.replace(vec![[2; 32]]);
        assert!(!memo.knows(&[1; 32]) && memo.knows(&[2; 32]));
        memo.save().unwrap();
    }
}
