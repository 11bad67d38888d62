//! [`init_fleet_repo`]: a new fleet repo from the model's template — write the files, `git init`
//! on branch `main`, first commit.

use crate::model::{TEMPLATE_FILES, TemplateError, write_template};
use git2::{Oid, Repository, RepositoryInitOptions, Signature};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("creating the Git repository")]
    Git(#[from] git2::Error),
}

/// A new fleet repo in `dir`: the template's files, `git init` on branch `main`, and a first
/// commit of all of them (author from the Git configuration, else `fleetgate`). Returns the commit.
pub fn init_fleet_repo(dir: &Path) -> Result<Oid, InitError> {
    write_template(dir)?;
    let repo = Repository::init_opts(dir, RepositoryInitOptions::new().initial_head("main"))?;
    let mut index = repo.index()?;
    for (rel, _) in TEMPLATE_FILES {
        index.add_path(Path::new(rel))?;
    }
    index.write()?;
    let tree = repo.find_tree(index.write_tree()?)?;
    let sig = repo.signature().or_else(|_| Signature::now("fleetgate", "fleetgate@localhost"))?;
    let commit = repo.commit(Some("HEAD"), &sig, &sig, "Fleet repo from the fleetgate template", &tree, &[])?;
    Ok(commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_commits_every_file_on_main_and_refuses_a_used_directory() {
        let dir = tempfile::tempdir().unwrap();
        let repo_dir = dir.path().join("fleet");
        let commit = init_fleet_repo(&repo_dir).unwrap();
        let repo = Repository::open(&repo_dir).unwrap();
        assert_eq!(repo.head().unwrap().name().unwrap(), "refs/heads/main");
        let tree = repo.find_commit(commit).unwrap().tree().unwrap();
        for (rel, _) in TEMPLATE_FILES {
            assert!(tree.get_path(Path::new(rel)).is_ok(), "{rel} not committed");
        }
        assert!(matches!(init_fleet_repo(&repo_dir), Err(InitError::Template(TemplateError::NotEmpty(_)))));
    }
}
