//! When a [`super::Source`] fetches status notes on their own, without a branch or tag change.
//!
//! Every status any cluster pushes moves one `refs/notes/fleetgate/<cluster>` ref, so a mirror that
//! fetched whenever any notes ref moved would fetch about once a poll during a rollout, on every
//! agent of the fleet (measured: ~10 fetches per agent per change with 100 agents). Statuses only
//! matter to an agent while it waits at a wave gate, and the gate can only open once every
//! cluster it waits for has written a new status. So:
//!
//! * A change of the branch or of a tag is fetched at once, with every notes ref in the same fetch
//!   (a new release is gated on fresh statuses; write-back tips are judged with them).
//! * [`NotesSchedule::All`] — the default (one-shot readers, tools): any moved notes ref is fetched.
//! * [`NotesSchedule::Fresh`] — an agent's start: like `All` until the first fetch (its mirror may be
//!   stale; the status sequence of its own cluster continues from the local notes), then `Idle`.
//! * Not waiting ([`NotesSchedule::Idle`]): moved notes refs are not fetched.
//! * Waiting on clusters `W` ([`NotesSchedule::Waiting`]): the notes are fetched once every cluster of `W`
//!   moved its ref since the mirror last fetched it — sooner the gate cannot open — or, whatever
//!   moved, when the wait's own backoff is up (from [`REFRESH_FIRST`], doubling to
//!   [`REFRESH_MAX`]): a safety net for a gate that waits on something no single ref shows (a
//!   release halted by failures, a status that arrives unverified).
//!
//! The agent says it waits each pass it waits ([`NotesSchedule::wait_on`]); a sync after a pass
//! that did not renew the wait falls back to `Idle`. Own pushes do not count as moves: the status
//! module records a pushed tip as the remote's ([`super::NOTES_TRACKING_PREFIX`]).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The first safety-net refresh of a waiting agent's notes after it starts waiting.
pub const REFRESH_FIRST: Duration = Duration::from_secs(30);
/// The longest pause between safety-net refreshes while waiting.
pub const REFRESH_MAX: Duration = Duration::from_secs(600);

/// Which moved notes refs a sync fetches (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NotesSchedule {
    /// Any moved notes ref is fetched.
    #[default]
    All,
    /// `All` until the first fetch, then `Idle`.
    Fresh,
    /// Moved notes refs are left on the remote until the branch or a tag moves.
    Idle,
    /// Waiting at a wave gate for `on`.
    Waiting {
        on: BTreeSet<String>,
        /// The next fetch whatever moved, and the pause after it.
        refresh_at: Instant,
        backoff: Duration,
        /// Whether the agent renewed the wait since the last sync.
        renewed: bool,
    },
}

impl NotesSchedule {
    /// The agent waits for the clusters `on` (those that must write a new status before the gate
    /// can open; empty when no single cluster's status can open it). A wait that continues keeps
    /// its backoff.
    pub fn wait_on(&mut self, on: BTreeSet<String>, now: Instant) {
        let (refresh_at, backoff) = match self {
            NotesSchedule::Waiting { refresh_at, backoff, .. } => (*refresh_at, *backoff),
            _ => (now + REFRESH_FIRST, REFRESH_FIRST),
        };
        *self = NotesSchedule::Waiting { on, refresh_at, backoff, renewed: true };
    }

    /// Whether this sync fetches the notes, given the clusters whose notes refs differ between
    /// the remote and the mirror. Called once per sync: a wait not renewed since the last call
    /// ends here (the schedule becomes `Idle`).
    pub fn due(&mut self, moved: &BTreeSet<String>, now: Instant) -> bool {
        if let NotesSchedule::Waiting { renewed: false, .. } = self {
            *self = NotesSchedule::Idle;
        }
        match self {
            NotesSchedule::All | NotesSchedule::Fresh => !moved.is_empty(),
            NotesSchedule::Idle => false,
            NotesSchedule::Waiting { on, refresh_at, backoff, renewed } => {
                *renewed = false;
                if moved.is_empty() {
                    return false;
                }
                if !on.is_empty() && on.iter().all(|c| moved.contains(c)) {
                    return true;
                }
                if now < *refresh_at {
                    return false;
                }
                *backoff = (*backoff * 2).min(REFRESH_MAX);
                *refresh_at = now + *backoff;
                true
            }
        }
    }

    /// After a fetch that brought the notes (any reason): a fresh agent's first look is over.
    pub fn fetched(&mut self) {
        if *self == NotesSchedule::Fresh {
            *self = NotesSchedule::Idle;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_fresh_process_fetches_any_moved_notes_once_then_idles() {
        let now = Instant::now();
        let mut s = NotesSchedule::Fresh;
        assert!(s.due(&set(&["x"]), now));
        s.fetched();
        assert!(!s.due(&set(&["x"]), now), "an idle agent fetched a sibling's status");
        let mut tool = NotesSchedule::default();
        tool.fetched();
        assert!(tool.due(&set(&["x"]), now), "a tool's source missed a status");
    }

    #[test]
    fn a_waiting_agent_fetches_once_every_cluster_it_waits_for_moved() {
        let now = Instant::now();
        let mut s = NotesSchedule::Idle;
        s.wait_on(set(&["a", "b"]), now);
        assert!(!s.due(&set(&["a", "z"]), now), "fetched while b, which the gate needs, had not moved");
        s.wait_on(set(&["a", "b"]), now);
        assert!(s.due(&set(&["a", "b", "z"]), now));
        // The gate now waits only for b (a reported success): b's next move is enough.
        s.wait_on(set(&["b"]), now);
        assert!(s.due(&set(&["b"]), now));
    }

    #[test]
    fn a_wait_not_renewed_by_the_last_pass_ends() {
        let now = Instant::now();
        let mut s = NotesSchedule::Idle;
        s.wait_on(set(&["a"]), now);
        assert!(!s.due(&BTreeSet::new(), now));
        // The agent started (or the release changed): it did not say it waits any more.
        assert!(!s.due(&set(&["a"]), now));
        assert_eq!(s, NotesSchedule::Idle);
    }

    #[test]
    fn the_safety_net_refreshes_with_a_doubling_backoff_whatever_moved() {
        let start = Instant::now();
        let mut s = NotesSchedule::Idle;
        // Halted by failures: no single cluster opens the gate.
        s.wait_on(BTreeSet::new(), start);
        let moved = set(&["z"]);
        assert!(!s.due(&moved, start + REFRESH_FIRST / 2));
        let mut at = start + REFRESH_FIRST;
        let mut pauses = Vec::new();
        for _ in 0..8 {
            s.wait_on(BTreeSet::new(), at);
            assert!(s.due(&moved, at), "no refresh at {:?}", at - start);
            let NotesSchedule::Waiting { refresh_at, .. } = s else { unreachable!() };
            pauses.push(refresh_at - at);
            s.wait_on(BTreeSet::new(), at);
            assert!(!s.due(&moved, at + Duration::from_secs(1)), "refreshed again at once");
            at = refresh_at;
        }
        assert_eq!(pauses[0], REFRESH_FIRST * 2);
        assert_eq!(*pauses.last().unwrap(), REFRESH_MAX);
        // Nothing moved: nothing to fetch, however late.
        s.wait_on(BTreeSet::new(), at);
        assert!(!s.due(&BTreeSet::new(), at + REFRESH_MAX * 10));
    }
}
