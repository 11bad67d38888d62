//! Test-only pause points: with `FLEETGATE_TEST_PAUSE_AT=<point>` (or `<point>#<n>`, the n-th
//! time the point is reached) set, the process writes the point's name to the file
//! `FLEETGATE_TEST_PAUSE_MARKER` names and then blocks its thread forever, so a test can
//! `kill -9` it at exactly that instant (`tests/agent_kill_matrix.rs`). Unset, [`at`] is one
//! load of a cached `None`.
//!
//! Compiled in always rather than behind a cargo feature: the kill tests run the real `fleetgate`
//! binary Cargo builds for integration tests, which a test-only feature would have to be enabled
//! for in every build (and a feature-only code path is one the shipped binary never exercised).
//! It is no attack surface: only whoever sets the agent's environment (the spoke's admin) can set
//! it, and all it can do is stop the agent.
//!
//! The points (the reconcile loop, apply, snapshot, rollback, status and write-back code each call
//! [`at`] once): `phase:<Phase>` right after a step persisted that phase (before its status,
//! Event or write-back), `snapshot:chunks-written` (chunks stored, index not yet),
//! `apply:object-applied` (each object a server-side apply wrote), `rollback:target-applied`
//! (target applied and pruned, snapshot not restored yet), `bake:round` (each gate round),
//! `notes:written-locally` (status signed into the local note, not pushed), `notes:pushed` (note
//! pushed, forge not yet mirrored), `write-back:committed` (commit built, not pushed).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The variable naming the point (`<point>` or `<point>#<n>`).
pub const PAUSE_AT_ENV: &str = "FLEETGATE_TEST_PAUSE_AT";
/// The variable naming the marker file written on pausing.
pub const PAUSE_MARKER_ENV: &str = "FLEETGATE_TEST_PAUSE_MARKER";

struct Armed {
    point: String,
    nth: usize,
    marker: Option<String>,
    hits: AtomicUsize,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var(PAUSE_AT_ENV).ok().filter(|s| !s.is_empty())?;
            let (point, nth) = match spec.rsplit_once('#') {
                Some((point, n)) => (point.to_string(), n.parse().unwrap_or(1)),
                None => (spec, 1),
            };
            Some(Armed { point, nth, marker: std::env::var(PAUSE_MARKER_ENV).ok(), hits: AtomicUsize::new(0) })
        })
        .as_ref()
}

/// Pauses forever if `point` is the armed point reached for the armed time; else returns.
pub fn at(point: &str) {
    let Some(armed) = armed().filter(|a| a.point == point) else { return };
    if armed.hits.fetch_add(1, Ordering::SeqCst) + 1 != armed.nth {
        return;
    }
    tracing::warn!(point, "{PAUSE_AT_ENV}: pausing here until killed");
    if let Some(marker) = &armed.marker {
        // Written whole under another name, then renamed: a test never reads half a marker.
        let partial = format!("{marker}.partial");
        if std::fs::write(&partial, point).and_then(|()| std::fs::rename(&partial, marker)).is_err() {
            tracing::error!(marker, "could not write the pause marker");
        }
    }
    // Blocks this thread (a runtime worker, or a blocking-pool thread): the work of the pass it
    // carries stops here, while the rest of the process (Lease renewal, probes) runs on.
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
