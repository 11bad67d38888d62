//! Write-back (`--write-back`, on unless switched off): after a rollback, push a commit to the
//! tracked branch that pins this cluster to the release it was rolled back to, so Git again says
//! what runs. The message says why, with trailers a pipeline (and `fleetgate rollback`) can read
//! ([`crate::release::WriteBack`]: `Fleetgate-Release`, `Fleetgate-Reason`, `Fleetgate-Failure` —
//! the gate with its figure and threshold — and `Fleetgate-Rolled-Back-To`).
//!
//! The commit is SSH-signed (namespace `git`, a `gpgsig` header as Git writes for `gpg.format=ssh`)
//! with this cluster's status key, so a fleet with `promotions: signed` accepts it as a write-back
//! of this cluster ([`crate::status::check_tip`]) and `git verify-commit` can check it against the
//! registered `statusKey`.
//!
//! The commit is built in the agent's bare mirror on top of the freshly fetched tip and pushed from
//! a private ref; a non-fast-forward (someone pushed meanwhile) fetches and tries again, bounded.
//! The edit is the same line edit `fleetgate rollback` makes ([`crate::releng::FleetState`]).
//!
//! The pin is owed until Git no longer needs it: the rollback's verdict persists it in the state
//! ([`AgentState::pending_write_back`](super::state::AgentState::pending_write_back)), and a push
//! that fails (Git away, the agent killed before it) is tried again at the start of each pass that
//! reaches Git. Trying again is safe because each attempt re-reads the fresh tip: a pin already
//! there is not written twice, and a tip that no longer asks for the failed release (someone
//! promoted a fix, or reverted by hand) is left alone.

use super::reconcile::Agent;
use super::state::{Failure, WriteBack};
use crate::model::{FleetConfig, error_chain, stop_point};
use crate::release::WriteBack as Trailers;
use crate::releng::{FleetState, SignError, Signer, sign};
use crate::source::{Credentials, Source, explain_refusal};
use crate::status::{Status, StatusSigner};
use git2::{Oid, Repository};
use std::collections::BTreeMap;

const ATTEMPTS: u32 = 4;
/// Where the commit waits in the mirror while it is pushed.
const PUSH_REF: &str = "refs/fleetgate/write-back";

#[derive(Debug, thiserror::Error)]
pub enum WriteBackError {
    #[error("fleet repo")]
    Source(#[from] crate::source::SourceError),
    #[error("reading the fleet configuration at the tip")]
    Config(#[from] crate::releng::RelengError),
    #[error("git")]
    Git(#[from] git2::Error),
    #[error("signing the write-back commit with the status key")]
    Sign(#[from] SignError),
    #[error("the remote refused the write-back commit on {branch}: {message}")]
    Rejected { branch: String, message: String },
    #[error("gave up after {ATTEMPTS} attempts: the branch kept moving")]
    KeptMoving,
}

/// What became of a write-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteBackOutcome {
    /// The pin was pushed in this commit.
    Pushed(Oid),
    /// The tip already asks for the rolled-back-to release (an earlier attempt, or a person).
    AlreadyAsked,
    /// The tip asks for neither the failed release nor the target: Git has moved on, and a pin
    /// now would undo someone's later promotion.
    MovedOn,
}

impl Agent {
    /// Pushes the write-back `wb` and takes it out of the state once Git no longer needs it; the
    /// rollback's status, when given with its configuration, is mirrored to the forge on the new
    /// commit. A failure is logged and leaves it in the state for the next pass (the rollback
    /// itself happened).
    pub(super) async fn write_back(&mut self, wb: &WriteBack, mirror: Option<(&FleetConfig, &Status)>) {
        stop_point::reached("write-back.before-push").await;
        let cluster = self.services.config.cluster.clone();
        let credentials = self.services.config.git_credentials.to_source().unwrap_or_default();
        let signer = &self.services.status_signer;
        let result = tokio::task::block_in_place(|| {
            write_back(&mut self.source, &credentials, signer, &cluster, &wb.failed, &wb.target, &wb.failure)
        });
        match result {
            Ok(outcome) => {
                match outcome {
                    WriteBackOutcome::Pushed(commit) => {
                        tracing::info!(%commit, release = %wb.target, "wrote the rollback back to Git");
                        if let Some((config, status)) = mirror {
                            self.mirror_on_write_back(config, status, commit).await;
                        }
                    }
                    WriteBackOutcome::AlreadyAsked => {
                        tracing::info!(release = %wb.target, "Git already asks for the rolled-back-to release");
                    }
                    WriteBackOutcome::MovedOn => tracing::info!(
                        failed = %wb.failed,
                        release = %wb.target,
                        "Git no longer asks for the failed release: the write-back is dropped"
                    ),
                }
                if let Err(e) = self
                    .update(|s| {
                        s.written_back(wb);
                        Ok(())
                    })
                    .await
                {
                    // Still in the state: the next pass tries again and finds Git already asks.
                    tracing::warn!(error = %error_chain(&e), "could not mark the write-back done in the state");
                }
            }
            Err(e) => tracing::error!(
                error = %error_chain(&e),
                "write-back failed; Git still asks for {}; trying again next pass", wb.failed
            ),
        }
    }

    /// At the start of a pass that reached Git: pushes the write-back a rollback still owes
    /// (its push failed, or the agent was killed before it).
    pub(super) async fn deliver_write_back(&mut self) {
        let pending = match self.services.store.load().await {
            Ok(state) => state.pending_write_back().cloned(),
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "could not read the write-back owed to Git");
                return;
            }
        };
        let Some(wb) = pending else { return };
        tracing::info!(failed = %wb.failed, release = %wb.target, "writing back a rollback decided before");
        self.write_back(&wb, None).await;
    }
}

/// Pins `cluster` to `target` on the source's tracked branch, on top of its freshly fetched tip,
/// in a commit signed with `signer` (the cluster's status key), while that tip still asks for
/// `failed`; says what it did.
///
/// # Errors
/// [`WriteBackError::KeptMoving`] after [`ATTEMPTS`] non-fast-forward refusals; the others as named.
pub fn write_back(
    source: &mut Source,
    credentials: &Credentials,
    signer: &StatusSigner,
    cluster: &str,
    failed: &str,
    target: &str,
    failure: &Failure,
) -> Result<WriteBackOutcome, WriteBackError> {
    let branch = source.branch().to_string();
    let mut signer = Signer::ssh(signer.private_key().clone(), &format!("status key of {cluster}"))?;
    let trailers = Trailers {
        release: failed.to_string(),
        reason: failure.reason.clone(),
        failure: Some(failure.message.clone()),
        rolled_back_to: target.to_string(),
    }
    .trailers();
    for _ in 0..ATTEMPTS {
        source.sync()?;
        let checkout = source.checkout()?;
        let tree = checkout.tip_tree()?;
        let state = FleetState::load(&tree)?;
        match state.effective(cluster) {
            Some(asked) if asked == target => return Ok(WriteBackOutcome::AlreadyAsked),
            Some(asked) if asked == failed => {}
            _ => return Ok(WriteBackOutcome::MovedOn),
        }
        let change = state.plan(&BTreeMap::from([(cluster.to_string(), target.to_string())]), None);
        if change.is_empty() {
            return Ok(WriteBackOutcome::AlreadyAsked);
        }
        let files = state.render(&change)?;
        let repo = checkout.repo();
        let message = format!(
            "fleetgate: roll {cluster} back to {target}\n\n\
             The agent of {cluster} rolled {failed} back to {target}: {}\n\n{trailers}",
            failure.message
        );
        let commit = commit_files(repo, &mut signer, checkout.tip(), &files, &message)?;
        match push(repo, source.url(), credentials, commit, &branch) {
            Ok(()) => return Ok(WriteBackOutcome::Pushed(commit)),
            Err(PushOutcome::NotFastForward) => continue,
            Err(PushOutcome::Failed(e)) => return Err(e),
        }
    }
    Err(WriteBackError::KeptMoving)
}

fn commit_files(
    repo: &Repository,
    signer: &mut Signer,
    parent: Oid,
    files: &BTreeMap<String, String>,
    message: &str,
) -> Result<Oid, WriteBackError> {
    let parent = repo.find_commit(parent)?;
    let mut update = git2::build::TreeUpdateBuilder::new();
    for (path, text) in files {
        update.upsert(path, repo.blob(text.as_bytes())?, git2::FileMode::Blob);
    }
    let tree = repo.find_tree(update.create_updated(repo, &parent.tree()?)?)?;
    let who = git2::Signature::now("fleetgate agent", "agent@fleetgate.invalid")?;
    Ok(sign::write_commit(repo, Some(signer), &who, message, &tree, &[&parent])?)
}

enum PushOutcome {
    NotFastForward,
    Failed(WriteBackError),
}

fn push(repo: &Repository, url: &str, credentials: &Credentials, commit: Oid, branch: &str) -> Result<(), PushOutcome> {
    let failed = |e: git2::Error| PushOutcome::Failed(e.into());
    repo.reference(PUSH_REF, commit, true, "fleetgate write-back").map_err(failed)?;
    let mut remote = repo.remote_anonymous(url).map_err(failed)?;
    let mut rejection: Option<String> = None;
    let mut callbacks = credentials.callbacks(url);
    // A refused ref is reported only here, not as an error of push().
    callbacks.push_update_reference(|_refname, status| {
        rejection = status.map(str::to_string);
        Ok(())
    });
    let mut options = credentials.push_options(callbacks);
    let result = remote.push(&[format!("{PUSH_REF}:refs/heads/{branch}")], Some(&mut options));
    drop(options);
    match (result, rejection) {
        (Err(e), _) if e.code() == git2::ErrorCode::NotFastForward => Err(PushOutcome::NotFastForward),
        (Err(e), _) => Err(failed(explain_refusal(e))),
        (Ok(()), Some(message)) if message.contains("fast-forward") || message.contains("fetch first") => {
            Err(PushOutcome::NotFastForward)
        }
        (Ok(()), Some(message)) => {
            Err(PushOutcome::Failed(WriteBackError::Rejected { branch: branch.to_string(), message }))
        }
        (Ok(()), None) => Ok(()),
    }
}
