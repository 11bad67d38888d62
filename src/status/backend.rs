//! One trait over every place a status can be written, and the [`Publisher`] the agent uses: Git
//! notes always (the source of truth wave gating reads), then the configured forge, if any.

use super::forge::{ForgeBackend, ForgeError};
use super::identity::StatusIdentity;
use super::model::Status;
use super::notes::{self, GitRemote, NotesError};
use futures::future::BoxFuture;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("writing the status note")]
    Notes(#[from] NotesError),
    /// Only ever returned after the Git note was written.
    #[error("the status note is in Git, but mirroring it to the forge failed")]
    Forge(#[from] ForgeError),
    #[error("the status writer stopped before it finished: {0}")]
    Interrupted(String),
}

/// A place statuses are written to.
pub trait StatusBackend: Send + Sync {
    /// Short name for logs and metrics: `git`, `github`, `gitea`, `gitlab`.
    fn name(&self) -> &'static str;
    /// Writes `status` (its `cluster` and `commit` say where).
    fn publish<'a>(&'a self, status: &'a Status) -> BoxFuture<'a, Result<(), StatusError>>;
}

/// Git notes pushed to the fleet repo from a local clone (the agent's bare state clone), each
/// entry signed as the agent's identity.
#[derive(Debug, Clone)]
pub struct GitNotesBackend {
    repo: PathBuf,
    remote: GitRemote,
    identity: StatusIdentity,
}

impl GitNotesBackend {
    pub fn new(repo: impl Into<PathBuf>, remote: GitRemote, identity: StatusIdentity) -> GitNotesBackend {
        GitNotesBackend { repo: repo.into(), remote, identity }
    }
}

impl StatusBackend for GitNotesBackend {
    fn name(&self) -> &'static str {
        "git"
    }

    fn publish<'a>(&'a self, status: &'a Status) -> BoxFuture<'a, Result<(), StatusError>> {
        let (path, remote, status, identity) =
            (self.repo.clone(), self.remote.clone(), status.clone(), self.identity.clone());
        Box::pin(async move {
            // The caller's span (an agent pass: cluster, release, pass id) goes along to the thread.
            let span = tracing::Span::current();
            tokio::task::spawn_blocking(move || -> Result<(), StatusError> {
                let _entered = span.enter();
                let repo = git2::Repository::open(&path).map_err(NotesError::Repo)?;
                notes::write(&repo, &remote, &status, &identity)?;
                Ok(())
            })
            .await
            .map_err(|e| StatusError::Interrupted(e.to_string()))?
        })
    }
}

impl StatusBackend for ForgeBackend {
    fn name(&self) -> &'static str {
        match self.kind() {
            crate::model::ForgeKind::Github => "github",
            crate::model::ForgeKind::Gitea => "gitea",
            crate::model::ForgeKind::Gitlab => "gitlab",
        }
    }

    fn publish<'a>(&'a self, status: &'a Status) -> BoxFuture<'a, Result<(), StatusError>> {
        Box::pin(async move { Ok(self.send(status).await?) })
    }
}

/// Git notes first, then the forge: a forge failure never loses a status, and wave gating (which
/// reads only Git) is never ahead of or behind what the agent decided.
#[derive(Debug, Clone)]
pub struct Publisher {
    git: GitNotesBackend,
    forge: Option<ForgeBackend>,
}

impl Publisher {
    pub fn new(git: GitNotesBackend, forge: Option<ForgeBackend>) -> Publisher {
        Publisher { git, forge }
    }

    /// Whether statuses are mirrored to a forge.
    pub fn has_forge(&self) -> bool {
        self.forge.is_some()
    }

    /// Mirrors `status` onto another `commit` of the forge's repo (a promotion PR's head, a
    /// write-back commit) so the forge shows it there too; nothing without a forge. Forge only:
    /// the Git note stays on the release commit, the one place readers and wave gating trust.
    pub async fn mirror_on(&self, status: &Status, commit: &str) -> Result<(), StatusError> {
        let Some(forge) = &self.forge else { return Ok(()) };
        let mirrored = Status { commit: commit.to_string(), ..status.clone() };
        forge.publish(&mirrored).await
    }
}

impl StatusBackend for Publisher {
    fn name(&self) -> &'static str {
        match self.forge.as_ref().map(ForgeBackend::kind) {
            None => "git",
            Some(crate::model::ForgeKind::Github) => "git+github",
            Some(crate::model::ForgeKind::Gitea) => "git+gitea",
            Some(crate::model::ForgeKind::Gitlab) => "git+gitlab",
        }
    }

    fn publish<'a>(&'a self, status: &'a Status) -> BoxFuture<'a, Result<(), StatusError>> {
        Box::pin(async move {
            self.git.publish(status).await?;
            if let Some(forge) = &self.forge {
                forge.publish(status).await?;
            }
            Ok(())
        })
    }
}
