//! [`RepoTree`]: read-only access to one snapshot of a fleet repo — a Git tree (of a branch tip or
//! a release tag) or a directory. It lives with the model, the lowest layer: everything that loads or checks documents reads the
//! repo through it, and `source` implements it for Git (`source::GitTree`), so the same
//! loading and checking code serves the agent (Git), `fleetgate validate` and tests (directories).
//!
//! Paths are `/`-separated and relative to the repo root; a path that could leave the root
//! (absolute, `..`) is refused before any lookup. Reads take a byte limit that is checked against
//! the object's size *before* its content is loaded. Symbolic links are never followed here:
//! reading one returns [`TreeError::Symlink`] with its target, and the caller decides whether the
//! target stays inside the repo.

use super::{Finding, Location, Rule, safe_relative_path};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// A Git submodule (gitlink) or a special file; never read.
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub name: String,
    pub kind: EntryKind,
    /// Bytes of a file (0 for anything else).
    pub size: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("{path}: {size} bytes, over the {limit}-byte limit")]
    TooLarge { path: String, size: u64, limit: usize },
    #[error("{path} is a symbolic link to {target:?}")]
    Symlink { path: String, target: String },
    #[error("{path} is not a regular file")]
    NotAFile { path: String },
    #[error("{path} is not UTF-8 text")]
    NotUtf8 { path: String },
    #[error("path {0}")]
    UnsafePath(String),
    #[error("reading {path} from {tree}: {message}")]
    Read { tree: String, path: String, message: String },
}

impl TreeError {
    /// Content problems (too large, a symlink, not text, an unsafe path) become findings about the
    /// file; a failure to read the repository itself stays an error (it is not the author's fault
    /// and retrying may help).
    pub fn into_finding(self) -> Result<Finding, TreeError> {
        let (rule, path) = match &self {
            TreeError::TooLarge { path, .. } => (Rule::Limit, path.clone()),
            TreeError::Symlink { path, .. } => (Rule::ManifestPath, path.clone()),
            TreeError::NotAFile { path } | TreeError::NotUtf8 { path } => (Rule::Schema, path.clone()),
            TreeError::UnsafePath(_) => (Rule::ManifestPath, String::new()),
            TreeError::Read { .. } => return Err(self),
        };
        Ok(Finding::new(rule, Location::file(&path), self.to_string()))
    }
}

/// One snapshot of a fleet repo.
pub trait RepoTree {
    /// What this snapshot is, for messages (`tag rel-1 (3f2a…)`, `directory /x`).
    fn describe(&self) -> String;
    /// The entry at `path`, or None when nothing is there.
    fn entry(&self, path: &str) -> Result<Option<TreeEntry>, TreeError>;
    /// The bytes of the regular file at `path` (None when absent), refusing files over `limit`.
    fn read(&self, path: &str, limit: usize) -> Result<Option<Vec<u8>>, TreeError>;
    /// The entries of directory `path` (`""` is the root), sorted by name; None when absent.
    fn list(&self, dir: &str) -> Result<Option<Vec<TreeEntry>>, TreeError>;

    /// [`RepoTree::read`] as UTF-8 text.
    fn read_text(&self, path: &str, limit: usize) -> Result<Option<String>, TreeError> {
        match self.read(path, limit)? {
            None => Ok(None),
            Some(bytes) => {
                String::from_utf8(bytes).map(Some).map_err(|_| TreeError::NotUtf8 { path: path.to_string() })
            }
        }
    }
}

/// `path` as a safe repo-relative path, or the error a tree returns for it.
pub(crate) fn clean_tree_path(path: &str) -> Result<String, TreeError> {
    safe_relative_path(path).map_err(TreeError::UnsafePath)
}

/// A directory on disk (a working copy, a test fixture). `.git` is never listed.
pub struct DirTree {
    root: PathBuf,
}

impl DirTree {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirTree { root: root.into() }
    }

    fn err(&self, path: &str, e: impl std::fmt::Display) -> TreeError {
        TreeError::Read { tree: self.describe(), path: path.to_string(), message: e.to_string() }
    }

    fn meta(&self, path: &str) -> Result<Option<std::fs::Metadata>, TreeError> {
        match std::fs::symlink_metadata(self.root.join(path)) {
            Ok(m) => Ok(Some(m)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err(path, e)),
        }
    }

    fn to_entry(name: String, m: &std::fs::Metadata) -> TreeEntry {
        let t = m.file_type();
        let kind = if t.is_symlink() {
            EntryKind::Symlink
        } else if t.is_dir() {
            EntryKind::Dir
        } else if t.is_file() {
            EntryKind::File
        } else {
            EntryKind::Other
        };
        TreeEntry { name, kind, size: if kind == EntryKind::File { m.len() } else { 0 } }
    }
}

impl RepoTree for DirTree {
    fn describe(&self) -> String {
        format!("directory {}", self.root.display())
    }

    fn entry(&self, path: &str) -> Result<Option<TreeEntry>, TreeError> {
        let path = clean_tree_path(path)?;
        let name = path.rsplit('/').next().unwrap_or_default().to_string();
        Ok(self.meta(&path)?.map(|m| Self::to_entry(name, &m)))
    }

    fn read(&self, path: &str, limit: usize) -> Result<Option<Vec<u8>>, TreeError> {
        let path = clean_tree_path(path)?;
        let Some(m) = self.meta(&path)? else { return Ok(None) };
        let t = m.file_type();
        if t.is_symlink() {
            let target = std::fs::read_link(self.root.join(&path)).map_err(|e| self.err(&path, e))?;
            return Err(TreeError::Symlink { path, target: target.to_string_lossy().into_owned() });
        }
        if !t.is_file() {
            return Err(TreeError::NotAFile { path });
        }
        if m.len() > limit as u64 {
            return Err(TreeError::TooLarge { path, size: m.len(), limit });
        }
        std::fs::read(self.root.join(&path)).map(Some).map_err(|e| self.err(&path, e))
    }

    fn list(&self, dir: &str) -> Result<Option<Vec<TreeEntry>>, TreeError> {
        let dir = clean_tree_path(dir)?;
        match self.meta(&dir)? {
            None => return Ok(None),
            Some(m) if !m.is_dir() => return Err(TreeError::NotAFile { path: dir }),
            Some(_) => {}
        }
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.root.join(&dir)).map_err(|e| self.err(&dir, e))? {
            let e = e.map_err(|e| self.err(&dir, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if dir.is_empty() && name == ".git" {
                continue;
            }
            let m = std::fs::symlink_metadata(e.path()).map_err(|e| self.err(&dir, e))?;
            out.push(Self::to_entry(name, &m));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Some(out))
    }
}
