//! Pushing what a release command made (a branch, a tag) to a remote with git2, and telling a
//! refused reference apart from a transport failure: git2 reports a ref the server refuses only
//! through the `push_update_reference` callback, so every ref's answer is checked.

use super::RelengError;
use super::repo::FleetRepo;
use git2::{Cred, CredentialType, PushOptions, RemoteCallbacks};
use serde::Serialize;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// What was pushed where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pushed {
    pub remote: String,
    pub refs: Vec<String>,
}

/// Credentials the way `git` finds them: the SSH agent for SSH URLs, Git's credential helpers for
/// HTTPS, nothing for `git://` and local paths. libgit2 asks again after a rejection; the callback
/// gives up after a few tries instead of looping.
pub fn git_credentials()
-> impl Fn(&str, Option<&str>, CredentialType) -> Result<Cred, git2::Error> + Send + Sync + 'static {
    let tries = AtomicU32::new(0);
    move |url, user, allowed| {
        if tries.fetch_add(1, Ordering::Relaxed) >= 3 {
            return Err(git2::Error::from_str(
                "the remote rejected the credentials from the SSH agent / credential helper",
            ));
        }
        if allowed.contains(CredentialType::SSH_KEY) {
            return Cred::ssh_key_from_agent(user.unwrap_or("git"));
        }
        if allowed.contains(CredentialType::USER_PASS_PLAINTEXT) {
            return Cred::credential_helper(&git2::Config::open_default()?, url, user);
        }
        if allowed.contains(CredentialType::USERNAME) {
            return Cred::username(user.unwrap_or("git"));
        }
        Cred::default()
    }
}

/// Pushes `refs` (full names, e.g. `refs/heads/main`, `refs/tags/rel-1`) to `remote` (a remote
/// name such as `origin`, or a URL), without force: a remote branch that moved elsewhere is
/// refused, and the error says so.
pub fn push(repo: &FleetRepo, remote: &str, refs: &[String]) -> Result<Pushed, RelengError> {
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
    let refused: RefCell<Vec<String>> = RefCell::new(Vec::new());
    let mut cbs = RemoteCallbacks::new();
    let creds = git_credentials();
    cbs.credentials(move |url, user, allowed| creds(url, user, allowed));
    cbs.push_update_reference(|refname, status| {
        if let Some(msg) = status {
            refused.borrow_mut().push(format!("{refname}: {msg}"));
        }
        Ok(())
    });
    let mut opts = PushOptions::new();
    opts.remote_callbacks(cbs);
    let specs: Vec<String> = refs.iter().map(|r| format!("{r}:{r}")).collect();
    let pushed = r.push(&specs, Some(&mut opts));
    drop(opts);
    pushed.map_err(|e| {
        let hint = if e.code() == git2::ErrorCode::NotFastForward {
            " (the remote has commits you do not: fetch, rebase or re-run on top of them)"
        } else {
            ""
        };
        RelengError::Push { remote: url.clone(), reason: format!("{}{hint}", e.message()) }
    })?;
    let refused = refused.into_inner();
    if !refused.is_empty() {
        return Err(RelengError::Push { remote: url, reason: format!("the remote refused {}", refused.join("; ")) });
    }
    Ok(Pushed { remote: remote.to_string(), refs: refs.to_vec() })
}
