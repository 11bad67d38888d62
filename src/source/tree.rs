//! [`GitTree`]: the model's [`RepoTree`] over a Git tree (of a branch tip or a release tag).

use crate::model::{EntryKind, RepoTree, TreeEntry, TreeError, clean_tree_path as clean};
use std::path::Path;

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
