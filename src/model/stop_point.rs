//! Named stop points, so a test can `kill -9` the agent at an exact instant
//! (`tests/agent/agent_kill_matrix.rs`). Inert unless the process was started with
//! `FLEETGATE_TEST_STOP_AT=<point>` and `FLEETGATE_TEST_STOP_DIR=<dir>`: read once, at the first
//! point reached. When the named point is reached, the agent writes the marker file `<dir>/<point>`
//! (holding its pid) and that task never continues; the rest of the process (Lease renewal,
//! HTTP) runs on, as in an agent busy mid-step, until the test kills it.
//!
//! It sits in `model`, the lowest layer, because `apply` places points too. The points, each
//! between two persisted steps (docs/RELIABILITY.md, "kill -9 matrix"):
//!
//! | point | where |
//! |---|---|
//! | `step.<step>.after-persist` | a step's state (with its status, as undelivered) written, the status not pushed yet |
//! | `status.push.negotiated` | inside libgit2's push of a status note that moves the notes ref: the server has advertised its refs, the pack is not sent |
//! | `status.<state>.after-push` | a status (`pending`, `success`, `failure`, `error`) pushed to Git, still undelivered in the state |
//! | `snapshot.after-chunks` | a snapshot's chunk Secrets written, its index Secret not yet |
//! | `snapshot.after-save` | the snapshot complete, the apply not yet recorded (`StartApply`) |
//! | `apply.after-first-phase` | the first phase of the release's objects applied, the rest not |
//! | `apply.after-all` | every object applied, nothing pruned yet |
//! | `bake.started` | the bake's first gate round about to run |
//! | `rollback.after-apply` | the rollback target applied, not pruned, snapshot not restored |
//! | `restore.after-first-phase` | the first phase of a snapshot's objects restored, the rest not |
//! | `write-back.before-push` | a rollback's verdict persisted and its status pushed, the write-back not pushed |
//!
//! `<step>` names a step of `agent::report` (`Step::name`): `begin`, `start-apply`, `applied`,
//! `passed`, `failed`, `rolled-back`, and the others.
//!
//! A process-wide setting, not a value passed down: it is set by the environment of the
//! process alone, and threading it through every stage for a test would clutter each signature.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The point to stop at.
pub const STOP_AT_VAR: &str = "FLEETGATE_TEST_STOP_AT";
/// Where the marker file is written.
pub const STOP_DIR_VAR: &str = "FLEETGATE_TEST_STOP_DIR";

struct Armed {
    point: String,
    dir: PathBuf,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let point = std::env::var(STOP_AT_VAR).ok().filter(|p| !p.is_empty())?;
            let dir = std::env::var_os(STOP_DIR_VAR).map_or_else(std::env::temp_dir, PathBuf::from);
            tracing::warn!(point, dir = %dir.display(), "test stop point armed ({STOP_AT_VAR}): this agent halts there");
            Some(Armed { point, dir })
        })
        .as_ref()
}

/// Passes `point`; when it is the armed one, writes its marker and never returns.
pub async fn reached(point: &str) {
    if mark(point) {
        std::future::pending::<()>().await;
    }
}

/// [`reached`] on a thread that may block (inside a libgit2 callback): when `point` is the armed
/// one, parks that thread for good.
pub fn reached_blocking(point: &str) {
    if mark(point) {
        loop {
            std::thread::park();
        }
    }
}

/// Whether `point` is the armed one; if so, its marker is written.
fn mark(point: &str) -> bool {
    let Some(armed) = armed() else { return false };
    if armed.point != point {
        return false;
    }
    let marker = armed.dir.join(point);
    // Written aside and renamed: whoever sees the marker sees the pid in it.
    let partial = armed.dir.join(format!(".{point}.partial"));
    let written =
        std::fs::write(&partial, std::process::id().to_string()).and_then(|()| std::fs::rename(&partial, &marker));
    if let Err(e) = written {
        tracing::error!(marker = %marker.display(), error = %e, "could not write the stop point's marker");
    }
    tracing::warn!(point, "test stop point reached; halting here until killed");
    true
}
