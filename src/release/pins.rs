//! [`TagPins`]: the commit each release tag pointed to when it was first verified. A tag that later
//! points elsewhere is refused ([`super::VerifyError::MovedTag`]) even when the new target is
//! signed too: a release id names one content, forever.
//!
//! Pins persist as a small JSON file (normally `<state dir>/tag-pins.json`, next to the source's
//! mirror), written atomically (temp file + rename) so a crash never leaves half a file. They are
//! also serializable, so the agent may keep them in its in-cluster state as well.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagPins {
    /// Tag name → commit id (hex).
    pins: BTreeMap<String, String>,
    #[serde(skip)]
    file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("reading tag pins {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("tag pins {path} are not valid JSON; move the file away to re-pin from scratch")]
    Corrupt { path: PathBuf, source: serde_json::Error },
    #[error("writing tag pins {path}")]
    Write { path: PathBuf, source: std::io::Error },
}

impl TagPins {
    /// Pins kept only in memory (tests, one-shot validation).
    pub fn in_memory() -> TagPins {
        TagPins::default()
    }

    /// Pins backed by `path` (created on the first pin when missing).
    pub fn load(path: impl Into<PathBuf>) -> Result<TagPins, PinError> {
        let path = path.into();
        let pins = match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| PinError::Corrupt { path: path.clone(), source })?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => return Err(PinError::Read { path, source }),
        };
        Ok(TagPins { pins, file: Some(path) })
    }

    /// The commit `tag` is pinned to, if it was seen before.
    pub fn get(&self, tag: &str) -> Option<&str> {
        self.pins.get(tag).map(String::as_str)
    }

    /// Every pin, by tag name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pins.iter().map(|(t, c)| (t.as_str(), c.as_str()))
    }

    /// Records `tag → commit` (a no-op when already pinned to it) and persists it.
    /// Crate-private: only verification decides what gets pinned.
    pub(crate) fn pin(&mut self, tag: &str, commit: &str) -> Result<(), PinError> {
        if self.get(tag) == Some(commit) {
            return Ok(());
        }
        self.pins.insert(tag.to_string(), commit.to_string());
        match &self.file {
            Some(path) => write_atomic(path, &self.pins),
            None => Ok(()),
        }
    }
}

fn write_atomic(path: &Path, pins: &BTreeMap<String, String>) -> Result<(), PinError> {
    let err = |source| PinError::Write { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(pins).expect("a map of strings serializes");
    std::fs::write(&tmp, bytes).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_survive_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/tag-pins.json");
        let mut pins = TagPins::load(&path).unwrap();
        assert_eq!(pins.get("rel-1"), None);
        pins.pin("rel-1", "abc").unwrap();
        let again = TagPins::load(&path).unwrap();
        assert_eq!(again.get("rel-1"), Some("abc"));
        assert_eq!(again.iter().count(), 1);
    }

    #[test]
    fn a_corrupt_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tag-pins.json");
        std::fs::write(&path, "{not json").unwrap();
        assert!(matches!(TagPins::load(&path), Err(PinError::Corrupt { .. })));
    }
}
