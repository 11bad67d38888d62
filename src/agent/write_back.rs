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

use super::reconcile::Agent;
use super::state::Failure;
use crate::model::error_chain;
use crate::release::WriteBack;
use crate::releng::{FleetState, SignError, Signer, sign};
use crate::source::{Credentials, Source, explain_refusal};
use crate::status::StatusSigner;
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

impl Agent {
    /// Pushes the write-back commit and returns it; failures are logged (the rollback itself
    /// already happened).
    pub(super) async fn write_back(&mut self, failed: &str, target: &str, failure: &Failure) -> Option<Oid> {
        let cluster = self.services.config.cluster.clone();
        let credentials = self.services.config.git_credentials.to_source().unwrap_or_default();
        let signer = &self.services.status_signer;
        let result = tokio::task::block_in_place(|| {
            write_back(&mut self.source, &credentials, signer, &cluster, failed, target, failure)
        });
        match result {
            Ok(Some(commit)) => {
                tracing::info!(%commit, release = target, "wrote the rollback back to Git");
                Some(commit)
            }
            Ok(None) => {
                tracing::info!(release = target, "Git already asks for the rolled-back-to release");
                None
            }
            Err(e) => {
                tracing::error!(error = %error_chain(&e), "write-back failed; Git still asks for {failed}");
                None
            }
        }
    }
}

/// Pins `cluster` to `target` on the source's tracked branch, on top of its freshly fetched tip,
/// in a commit signed with `signer` (the cluster's status key); returns the pushed commit, or None
/// when Git already asks for `target`.
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
) -> Result<Option<Oid>, WriteBackError> {
    let branch = source.branch().to_string();
    let mut signer = Signer::ssh(signer.private_key().clone(), &format!("status key of {cluster}"))?;
    let trailers = WriteBack {
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
        let change = state.plan(&BTreeMap::from([(cluster.to_string(), target.to_string())]), None);
        if change.is_empty() {
            return Ok(None);
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
            Ok(()) => return Ok(Some(commit)),
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
    let mut options = credentials.push_options(url, callbacks);
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
