//! [`RepoTree`]: read-only access to one snapshot of a fleet repo — a Git tree (of a branch tip or
//! a release tag) or a directory. Everything above `source` reads the repo through it, so the same
//! loading and checking code serves the agent (Git), `fleetgate validate` and tests (directories).
//!
//! Paths are `/`-separated and relative to the repo root; a path that could leave the root
//! (absolute, `..`) is refused before any lookup. Reads take a byte limit that is checked against
//! the object's size *before* its content is loaded. Symbolic links are never followed here:
//! reading one returns [`TreeError::Symlink`] with its target, and the caller decides whether the
//! target stays inside the repo.

use crate::model::{Finding, Location, Rule, safe_relative_path};
use std::path::{Path, PathBuf};

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
            Some(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| TreeError::NotUtf8 { path: path.to_string() }),
        }
    }
}

fn clean(path: &str) -> Result<String, TreeError> {
    safe_relative_path(path).map_err(TreeError::UnsafePath)
}

/// Longest symlink target read (a target is a path; anything longer is not one).
const MAX_LINK: usize = 4096;

/// A Git tree (of a commit or a tag) inside a repository.
pub struct GitTree<'r> {
    repo: &'r git2::Repository,
    tree: git2::Tree<'r>,
    label: String,
}

impl<'r> GitTree<'r> {
    pub fn new(repo: &'r git2::Repository, tree: git2::Tree<'r>, label: impl Into<String>) -> Self {
        GitTree { repo, tree, label: label.into() }
    }

    fn err(&self, path: &str, e: impl std::fmt::Display) -> TreeError {
        TreeError::Read { tree: self.label.clone(), path: path.to_string(), message: e.to_string() }
    }

    fn lookup(&self, path: &str) -> Result<Option<git2::TreeEntry<'static>>, TreeError> {
        match self.tree.get_path(Path::new(path)) {
            Ok(e) => Ok(Some(e)),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
            Err(e) => Err(self.err(path, e)),
        }
    }

    fn kind(mode: i32) -> EntryKind {
        match mode & 0o170000 {
            0o040000 => EntryKind::Dir,
            0o120000 => EntryKind::Symlink,
            0o100000 => EntryKind::File,
            _ => EntryKind::Other,
        }
    }

    fn blob_size(&self, path: &str, id: git2::Oid) -> Result<u64, TreeError> {
        let odb = self.repo.odb().map_err(|e| self.err(path, e))?;
        let (size, _) = odb.read_header(id).map_err(|e| self.err(path, e))?;
        Ok(size as u64)
    }

    fn to_entry(&self, path: &str, e: &git2::TreeEntry<'_>) -> Result<TreeEntry, TreeError> {
        let kind = Self::kind(e.filemode());
        let size = if kind == EntryKind::File { self.blob_size(path, e.id())? } else { 0 };
        Ok(TreeEntry { name: String::from_utf8_lossy(e.name_bytes()).into_owned(), kind, size })
    }

    fn blob(&self, path: &str, id: git2::Oid, limit: usize) -> Result<Vec<u8>, TreeError> {
        let size = self.blob_size(path, id)?;
        if size > limit as u64 {
            return Err(TreeError::TooLarge { path: path.to_string(), size, limit });
        }
        let blob = self.repo.find_blob(id).map_err(|e| self.err(path, e))?;
        Ok(blob.content().to_vec())
    }
}

impl RepoTree for GitTree<'_> {
    fn describe(&self) -> String {
        self.label.clone()
    }

    fn entry(&self, path: &str) -> Result<Option<TreeEntry>, TreeError> {
        let path = clean(path)?;
        if path.is_empty() {
            return Ok(Some(TreeEntry { name: String::new(), kind: EntryKind::Dir, size: 0 }));
        }
        match self.lookup(&path)? {
            None => Ok(None),
            Some(e) => self.to_entry(&path, &e).map(Some),
        }
    }

    fn read(&self, path: &str, limit: usize) -> Result<Option<Vec<u8>>, TreeError> {
        let path = clean(path)?;
        let Some(e) = self.lookup(&path)? else { return Ok(None) };
        match Self::kind(e.filemode()) {
            EntryKind::File => self.blob(&path, e.id(), limit).map(Some),
            EntryKind::Symlink => {
                let target = self.blob(&path, e.id(), MAX_LINK)?;
                Err(TreeError::Symlink { path, target: String::from_utf8_lossy(&target).into_owned() })
            }
            _ => Err(TreeError::NotAFile { path }),
        }
    }

    fn list(&self, dir: &str) -> Result<Option<Vec<TreeEntry>>, TreeError> {
        let dir = clean(dir)?;
        let tree = if dir.is_empty() {
            self.tree.clone()
        } else {
            match self.lookup(&dir)? {
                Some(e) if Self::kind(e.filemode()) == EntryKind::Dir => {
                    self.repo.find_tree(e.id()).map_err(|e| self.err(&dir, e))?
                }
                Some(_) => return Err(TreeError::NotAFile { path: dir }),
                None => return Ok(None),
            }
        };
        let mut out = Vec::with_capacity(tree.len());
        for e in tree.iter() {
            let name = String::from_utf8_lossy(e.name_bytes());
            let path = if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") };
            out.push(self.to_entry(&path, &e)?);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Some(out))
    }
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
        let path = clean(path)?;
        let name = path.rsplit('/').next().unwrap_or_default().to_string();
        Ok(self.meta(&path)?.map(|m| Self::to_entry(name, &m)))
    }

    fn read(&self, path: &str, limit: usize) -> Result<Option<Vec<u8>>, TreeError> {
        let path = clean(path)?;
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
        let dir = clean(dir)?;
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
