//! Commit statuses: what each cluster reports about each release, where it is written, and what
//! readers make of it.
//!
//! * [`model`](Status) — a status (`fleetgate/<cluster>`, state, one-line description, gate
//!   figures, timestamps, rollback target, agent version) and the versioned note that keeps a
//!   release's history on one cluster ([`StatusNote`]).
//! * [`identity`] — each cluster's status key, the canonical form entries are signed over, and
//!   the check readers make before they believe an entry ([`StatusKeys::verify`]).
//! * [`VerifiedNotes`] — a reader's memory of notes already verified, so the next read skips
//!   their signature checks.
//! * [`notes`] — the Git backend (default, the source of truth): `refs/notes/fleetgate/<cluster>`,
//!   written and pushed by that cluster alone, with fetch-merge-retry when the remote refuses.
//! * [`forge`] — GitHub, Gitea/Forgejo and GitLab commit-status APIs, mirrors of the notes.
//! * [`StatusBackend`] / [`Publisher`] — one trait over both; the publisher writes Git first.
//! * [`heartbeat`] — each agent's signed heartbeat (`refs/fleetgate/heartbeat/<cluster>`, one
//!   force-updated ref, no history) and the verified beats readers fold into LAST SEEN and `stale`.
//! * [`waves`] — wave gating and pacing as a pure function ([`may_start`]).
//! * [`matrix`] / [`FleetView`] — the cluster × release view `fleetgate status` prints.
//! * [`html`] — that view as one self-contained page (`fleetgate status -o html`).
//! * [`live`] — that page served read-only and kept current (`fleetgate status --serve ADDR`).
//! * [`wait`] — whether a release reached `success` on the clusters waited for (`fleetgate wait`).
//! * [`audit`] — every entry each cluster wrote, from its notes ref's history (`fleetgate audit`).
//!
//! The note format and the `fleetgate status -o json` format are documented in docs/STATUS.md.

pub mod audit;
mod backend;
pub mod forge;
pub mod github_app;
pub mod heartbeat;
pub mod html;
pub mod identity;
pub mod live;
pub mod matrix;
mod memo;
mod model;
pub mod notes;
mod parse;
mod view;
pub mod wait;
pub mod waves;
mod write_back_tip;

pub use backend::{GitNotesBackend, Publisher, StatusBackend, StatusError};
pub use forge::{
    FORGE_TOKEN_ENV, ForgeApproval, ForgeBackend, ForgeConfig, ForgeError, ForgeSettings, OpenPull, Token, TokenSource,
};
pub use github_app::GithubApp;
pub use heartbeat::{Heartbeat, HeartbeatError};
pub use html::{CommitUrl, CommitUrlError, HtmlOptions, render_html};
pub use identity::{KeyError, STATUS_NAMESPACE, StatusIdentity, StatusKey, StatusKeys, StatusSigner, Unverified};
pub use matrix::{Matrix, Origin, ReleaseRef, RenderOptions, render_release, render_table};
pub use memo::{MemoError, VerifiedBeats, VerifiedNotes};
pub use model::{
    AWAITING_APPROVAL_PREFIX, GateFigure, NoteParseError, PAUSED_PREFIX, State, Status, StatusNote, StatusSet,
    UnverifiedStatus, context, running, truncate,
};
pub use notes::{GitRemote, NotesError, Written, notes_ref, read_all, read_all_remembering, sync, write};
pub use view::{FleetView, ViewError};
pub use waves::{Decision, Member, Move, awaiting_approval, may_start, members, members_placed_by};
pub use write_back_tip::check_tip;
