//! The Git plumbing the release commands share (git2 only): opening the fleet repo, reading files
//! and release tags from trees, building new trees without touching the work tree, committing,
//! moving branches with compare-and-swap, and keeping a checked-out work tree in step.

use super::RelengError;
use super::desired::FleetState;
use super::sign::{self, Signer};
use crate::model::{self, FLEET_FILE, RELEASE_FILE, Release};
use crate::source::GitTree;
use git2::{Commit, Index, IndexEntry, IndexTime, ObjectType, Oid, Repository, Signature, Tree};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A release tag found in the repo: an annotated (normally signed) tag whose commit carries a
/// `release.yaml` naming the same id.
#[derive(Debug, Clone)]
pub struct ReleaseTag {
    pub id: String,
    /// The tag object; `None` for a lightweight tag (which can never be signed).
    pub tag: Option<Oid>,
    pub commit: Oid,
    pub release: Release,
}

/// An open fleet repo.
pub struct FleetRepo {
    git: Repository,
    path: PathBuf,
}

impl FleetRepo {
    /// Opens the repository at `path` (a clone, bare or not).
    pub fn open(path: &Path) -> Result<FleetRepo, RelengError> {
        let git = Repository::open(path)
            .map_err(|source| RelengError::NotARepo { path: path.display().to_string(), source })?;
        Ok(FleetRepo { git, path: path.to_path_buf() })
    }

    pub fn git(&self) -> &Repository {
        &self.git
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The branch HEAD points at (e.g. `main`), also when it has no commit yet.
    pub fn head_branch(&self) -> Result<String, RelengError> {
        let head = self.git.find_reference("HEAD")?;
        match head.symbolic_target()? {
            Some(t) if t.starts_with("refs/heads/") => Ok(t.trim_start_matches("refs/heads/").to_string()),
            _ => Err(RelengError::Usage("HEAD is detached; pass --branch NAME or check out a branch".into())),
        }
    }

    /// The tip commit of local branch `name`.
    pub fn branch_tip(&self, name: &str) -> Result<Commit<'_>, RelengError> {
        let r = self
            .git
            .find_reference(&format!("refs/heads/{name}"))
            .map_err(|_| RelengError::NoSuchBranch(name.to_string()))?;
        Ok(r.peel_to_commit()?)
    }

    pub fn branch_exists(&self, name: &str) -> bool {
        self.git.find_reference(&format!("refs/heads/{name}")).is_ok()
    }

    /// Whether `remote` is a remote of this clone, or a URL (which needs none).
    pub fn has_remote(&self, remote: &str) -> bool {
        self.git.find_remote(remote).is_ok() || remote.contains("://")
    }

    /// The tip of branch `name`, if it exists.
    pub fn branch_oid(&self, name: &str) -> Option<Oid> {
        self.git.refname_to_id(&format!("refs/heads/{name}")).ok()
    }

    /// The bytes of `path` (slash-separated, relative to the root) in `tree`.
    pub fn file_at(&self, tree: &Tree<'_>, path: &str) -> Result<Option<Vec<u8>>, RelengError> {
        match tree.get_path(Path::new(path)) {
            Ok(entry) if entry.kind() == Some(ObjectType::Blob) => {
                Ok(Some(self.git.find_blob(entry.id())?.content().to_vec()))
            }
            Ok(_) => Ok(None),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Every file under folder `dir` of `tree`, keyed by path relative to the repo root.
    pub fn files_under(&self, tree: &Tree<'_>, dir: &str) -> Result<BTreeMap<String, Vec<u8>>, RelengError> {
        let dir = dir.trim_end_matches('/');
        let mut out = BTreeMap::new();
        let sub = match tree.get_path(Path::new(dir)) {
            Ok(e) if e.kind() == Some(ObjectType::Tree) => self.git.find_tree(e.id())?,
            _ => return Ok(out),
        };
        let mut err = None;
        sub.walk(git2::TreeWalkMode::PreOrder, |root, entry| {
            if entry.kind() == Some(ObjectType::Blob) {
                let path = format!("{dir}/{root}{}", entry.name().unwrap_or_default());
                match self.git.find_blob(entry.id()) {
                    Ok(b) => {
                        out.insert(path, b.content().to_vec());
                    }
                    Err(e) => {
                        err = Some(e);
                        return git2::TreeWalkResult::Abort;
                    }
                }
            }
            git2::TreeWalkResult::Ok
        })?;
        match err {
            Some(e) => Err(e.into()),
            None => Ok(out),
        }
    }

    /// The id of the subtree at `dir` of `tree`, if there is one.
    pub fn subtree_id(&self, tree: &Tree<'_>, dir: &str) -> Option<Oid> {
        tree.get_path(Path::new(dir.trim_end_matches('/')))
            .ok()
            .filter(|e| e.kind() == Some(ObjectType::Tree))
            .map(|e| e.id())
    }

    /// `release.yaml` of `tree`, if present, in either of its forms (the seed's ConfigMap form
    /// takes its image repository from the same tree's `fleet.yaml`).
    pub fn release_at(&self, tree: &Tree<'_>) -> Result<Option<Release>, RelengError> {
        let Some(bytes) = self.file_at(tree, RELEASE_FILE)? else { return Ok(None) };
        let text =
            String::from_utf8(bytes).map_err(|_| RelengError::Usage(format!("{RELEASE_FILE} is not UTF-8 text")))?;
        // Only the seed's ConfigMap form needs it: the image repository from fleet.yaml.
        let default_repository = self
            .file_at(tree, FLEET_FILE)?
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|t| model::parse_document::<model::FleetSpec>(FLEET_FILE, &t, "Fleet").ok())
            .and_then(|f| f.spec.operator.image);
        Ok(Some(model::parse_release(RELEASE_FILE, &text, default_repository.as_deref())?))
    }

    /// The checked fleet configuration (and its files' text) of `tree`.
    pub fn fleet_state(&self, tree: &Tree<'_>, label: &str) -> Result<FleetState, RelengError> {
        FleetState::load(&GitTree::new(&self.git, tree.clone(), label))
    }

    /// The author/committer/tagger identity: Git's `user.name`/`user.email`, else the signing
    /// key's user id, else an error telling how to set one.
    pub fn identity(&self, signer: Option<&Signer>) -> Result<Signature<'static>, RelengError> {
        if let Ok(sig) = self.git.signature() {
            return Ok(sig.to_owned());
        }
        if let Some((name, email)) = signer.and_then(Signer::identity) {
            return Ok(Signature::now(&name, &email)?);
        }
        Err(RelengError::Usage(
            "no Git identity: run `git config user.name NAME` and `git config user.email EMAIL` in the repo (or sign with a key that has a user id)"
                .into(),
        ))
    }

    /// Refuses to go on when the work tree of a non-bare repo has changes to tracked files,
    /// except under the `allowed` path prefixes. Untracked files are ignored.
    pub fn ensure_clean(&self, allowed: &[&str]) -> Result<(), RelengError> {
        if self.git.is_bare() {
            return Ok(());
        }
        let mut opts = git2::StatusOptions::new();
        opts.include_untracked(false).include_ignored(false);
        let statuses = self.git.statuses(Some(&mut opts))?;
        let dirty: Vec<String> = statuses
            .iter()
            .filter(|s| s.status() != git2::Status::CURRENT)
            .filter_map(|s| s.path().ok().map(str::to_string))
            .filter(|p| !allowed.iter().any(|a| p == a.trim_end_matches('/') || p.starts_with(a)))
            .collect();
        if dirty.is_empty() { Ok(()) } else { Err(RelengError::DirtyWorktree { paths: dirty }) }
    }

    /// Writes a commit (signed when `signer` is given) with `parent` as its only parent.
    pub fn commit(
        &self,
        signer: Option<&mut Signer>,
        who: &Signature<'_>,
        message: &str,
        tree: Oid,
        parents: &[&Commit<'_>],
    ) -> Result<Oid, RelengError> {
        let tree = self.git.find_tree(tree)?;
        Ok(sign::write_commit(&self.git, signer, who, message, &tree, parents)?)
    }

    /// Commits `tree` as one change on top of `tip`, the tip of `base`: on `base` itself (whose
    /// work tree must be clean, as the branch moves under it) or, with `branch`, on that new branch
    /// (which must not exist yet), for a PR into `base`. `log` is the reflog line.
    pub fn commit_change(
        &self,
        signer: Option<&mut Signer>,
        tip: &Commit<'_>,
        (base, branch): (&str, Option<&str>),
        message: &str,
        tree: Oid,
        log: &str,
    ) -> Result<Oid, RelengError> {
        match branch {
            None => self.ensure_clean(&[])?,
            Some(b) if self.branch_exists(b) => {
                return Err(super::Refusal::BranchExists { branch: b.to_string() }.into());
            }
            Some(_) => {}
        }
        let who = self.identity(signer.as_deref())?;
        let commit = self.commit(signer, &who, message, tree, &[tip])?;
        match branch {
            None => self.set_branch(base, commit, Some(tip.id()), log)?,
            Some(b) => self.set_branch(b, commit, None, log)?,
        }
        Ok(commit)
    }

    /// Moves branch `name` from `old` (None: the branch must not exist) to `new`, failing if
    /// someone moved it meanwhile. When the branch is checked out in a work tree, the work tree
    /// and index follow (the caller checked that nothing but fleetgate's own files were dirty).
    pub fn set_branch(&self, name: &str, new: Oid, old: Option<Oid>, log: &str) -> Result<(), RelengError> {
        let refname = format!("refs/heads/{name}");
        match old {
            Some(old) => {
                self.git.reference_matching(&refname, new, true, old, log).map_err(|e| {
                    RelengError::Usage(format!(
                        "branch {name} moved while fleetgate worked ({e}); run the command again"
                    ))
                })?;
            }
            None => {
                self.git.reference(&refname, new, false, log).map_err(|e| {
                    if e.code() == git2::ErrorCode::Exists {
                        RelengError::Usage(format!(
                            "branch {name} appeared while fleetgate worked; run the command again"
                        ))
                    } else {
                        e.into()
                    }
                })?;
            }
        }
        if !self.git.is_bare() && self.head_branch().ok().as_deref() == Some(name) {
            // A hard reset to the new tip rewrites index and work tree together (a forced
            // checkout alone leaves the index behind for files already present untracked).
            self.git.reset(self.git.find_commit(new)?.as_object(), git2::ResetType::Hard, None)?;
        }
        Ok(())
    }

    /// Every release tag of the repo (tags whose commit's `release.yaml` names the tag).
    pub fn release_tags(&self) -> Result<Vec<ReleaseTag>, RelengError> {
        let mut out = Vec::new();
        for name in self.git.tag_names(None)?.iter().flatten().flatten() {
            if let Some(t) = self.release_tag(name)? {
                out.push(t);
            }
        }
        Ok(out)
    }

    /// The release tag `id`, if the tag exists and its commit's `release.yaml` names `id`.
    pub fn release_tag(&self, id: &str) -> Result<Option<ReleaseTag>, RelengError> {
        let Ok(r) = self.git.find_reference(&format!("refs/tags/{id}")) else { return Ok(None) };
        let target = r.target().ok_or_else(|| git2::Error::from_str("symbolic tag reference"))?;
        let tag = self.git.find_tag(target).ok().map(|t| t.id());
        let Ok(commit) = r.peel_to_commit() else { return Ok(None) };
        // A tag whose commit has no (or a malformed) release.yaml is not a release.
        let Ok(Some(release)) = self.release_at(&commit.tree()?) else { return Ok(None) };
        if release.metadata.name != id {
            return Ok(None);
        }
        Ok(Some(ReleaseTag { id: id.to_string(), tag, commit: commit.id(), release }))
    }

    /// The nearest release at or before `from` in history (other than those `skip` names): the
    /// release a new one follows.
    pub fn previous_release(&self, from: Oid, skip: impl Fn(&str) -> bool) -> Result<Option<ReleaseTag>, RelengError> {
        Ok(self.releases_back_from(from, skip)?.into_iter().next())
    }

    /// Every release at or before `from` in history (other than those `skip` names), nearest first.
    pub fn releases_back_from(&self, from: Oid, skip: impl Fn(&str) -> bool) -> Result<Vec<ReleaseTag>, RelengError> {
        let mut by_commit: BTreeMap<Oid, Vec<ReleaseTag>> = BTreeMap::new();
        for t in self.release_tags()? {
            if !skip(&t.id) {
                by_commit.entry(t.commit).or_default().push(t);
            }
        }
        let mut found = Vec::new();
        if by_commit.is_empty() {
            return Ok(found);
        }
        let mut walk = self.git.revwalk()?;
        walk.push(from)?;
        walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::TIME)?;
        for oid in walk {
            if let Some(mut tags) = by_commit.remove(&oid?) {
                // Two release tags on one commit: the later id first (ids sort by date by convention).
                tags.sort_by(|a, b| b.id.cmp(&a.id));
                found.extend(tags);
            }
        }
        Ok(found)
    }
}

/// A new tree built from a base tree in memory: files put, folders removed, nothing on disk.
pub struct TreeEdit<'r> {
    repo: &'r Repository,
    index: Index,
}

impl<'r> TreeEdit<'r> {
    pub fn new(repo: &'r Repository, base: Option<&Tree<'_>>) -> Result<TreeEdit<'r>, RelengError> {
        let mut index = Index::new()?;
        if let Some(t) = base {
            index.read_tree(t)?;
        }
        Ok(TreeEdit { repo, index })
    }

    /// Puts `bytes` at `path` (slash-separated, relative to the root).
    pub fn put(&mut self, path: &str, bytes: &[u8], executable: bool) -> Result<(), RelengError> {
        let id = self.repo.blob(bytes)?;
        let t = IndexTime::new(0, 0);
        let entry = IndexEntry {
            ctime: t,
            mtime: t,
            dev: 0,
            ino: 0,
            mode: if executable { 0o100755 } else { 0o100644 },
            uid: 0,
            gid: 0,
            file_size: bytes.len() as u32,
            id,
            flags: 0,
            flags_extended: 0,
            path: path.as_bytes().to_vec(),
        };
        self.index.add(&entry)?;
        Ok(())
    }

    /// Removes folder `dir` and everything under it.
    pub fn remove_dir(&mut self, dir: &str) -> Result<(), RelengError> {
        self.index.remove_dir(Path::new(dir.trim_end_matches('/')), 0)?;
        Ok(())
    }

    pub fn write(mut self) -> Result<Oid, RelengError> {
        Ok(self.index.write_tree_to(self.repo)?)
    }
}
