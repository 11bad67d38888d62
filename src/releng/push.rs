//! Pushing what a release command made (a branch, a tag) to a remote with git2, and telling a
//! refused reference apart from a transport failure: git2 reports a ref the server refuses only
//! through the `push_update_reference` callback, so every ref's answer is checked.

use super::RelengError;
use super::repo::FleetRepo;
use crate::source::{Credentials, explain_refusal};
use serde::Serialize;
use std::cell::RefCell;

/// What was pushed where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pushed {
    pub remote: String,
    pub refs: Vec<String>,
}

/// Pushes `refs` (full names, e.g. `refs/heads/main`, `refs/tags/rel-1`) to `remote` (a remote
/// name such as `origin`, or a URL), without force: a remote branch that moved elsewhere is
/// refused, and the error says so. `access` says how to reach it ([`Credentials::callbacks`]).
pub fn push(repo: &FleetRepo, remote: &str, refs: &[String], access: &Credentials) -> Result<Pushed, RelengError> {
    let git = repo.git();
    let mut r = match git.find_remote(remote) {
        Ok(r) => r,
        Err(_) if remote.contains("://") || remote.contains('/') || remote.contains(':') => {
            git.remote_anonymous(remote)?
        }
        Err(_) => {
            return Err(RelengError::Usage(format!(
                "no remote named {remote}; add it (`git remote add {remote} URL`) or pass --remote NAME|URL"
            )));
        }
    };
    let url = r.url().unwrap_or(remote).to_string();
    // What errors show: the URL without the token of its user info.
    let shown = crate::model::redact_userinfo(&url);
    let refused: RefCell<Vec<String>> = RefCell::new(Vec::new());
    let mut cbs = access.callbacks(&url);
    cbs.push_update_reference(|refname, status| {
        if let Some(msg) = status {
            refused.borrow_mut().push(format!("{refname}: {msg}"));
        }
        Ok(())
    });
    let mut opts = access.push_options(cbs);
    let specs: Vec<String> = refs.iter().map(|r| format!("{r}:{r}")).collect();
    let pushed = r.push(&specs, Some(&mut opts));
    drop(opts);
    pushed.map_err(|e| {
        let e = explain_refusal(e);
        let hint = if e.code() == git2::ErrorCode::NotFastForward {
            " (the remote has commits you do not: fetch, rebase or re-run on top of them)"
        } else {
            ""
        };
        RelengError::Push { remote: shown.clone(), reason: format!("{}{hint}", e.message()) }
    })?;
    let refused = refused.into_inner();
    if !refused.is_empty() {
        return Err(RelengError::Push { remote: shown, reason: format!("the remote refused {}", refused.join("; ")) });
    }
    Ok(Pushed { remote: crate::model::redact_userinfo(remote), refs: refs.to_vec() })
}
