//! The status model: what one cluster says about one release, the note that keeps the history of
//! those statements on a release commit, and the set of statuses a reader collects.
//!
//! Forward compatibility is a design rule here: readers ignore fields they do not know, and keep
//! them (`extra`) when they rewrite a note, so a newer agent's additions survive an older agent's
//! merge. `schema` is bumped only for changes an older reader cannot safely ignore (schema 2:
//! signed entries, which an older reader would take on trust like any other).
//!
//! A [`StatusSet`] keeps what a reader believes apart from what it only shows: entries verified
//! against their cluster's key (see [`super::identity`]), ordered by their signed sequence, and
//! the rest with the reason each is unverified.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, hash_map};
use std::fmt;

use super::identity::Unverified;
use crate::model::ApprovalRecord;

/// The note format this build writes and the highest it reads (1: unsigned entries, still read
/// and shown as unverified; 2: signed entries).
const SCHEMA: u32 = 2;

/// How the `pending` status of a paused agent begins (`reconcile::Agent::pause` writes it; the
/// matrix reads it to mark clusters paused on the spoke, which Git does not know of).
pub const PAUSED_PREFIX: &str = "paused by ";

/// How the `pending` status of a cluster whose wave waits for an approval begins (the agent
/// writes it, [`super::waves::awaiting_approval`]); like a pause, it is not mid-release.
pub const AWAITING_APPROVAL_PREFIX: &str = "waiting for approval of wave ";

/// The status context of a cluster, as forges show it: `fleetgate/<cluster>`.
pub fn context(cluster: &str) -> String {
    format!("fleetgate/{cluster}")
}

/// Where a release stands on one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Accepted and in progress: waiting for its wave, applying, or baking.
    Pending,
    /// Applied and every gate passed for the whole bake time.
    Success,
    /// A gate failed; the cluster was rolled back (the description says to what and why).
    Failure,
    /// The agent could not finish (e.g. the release could not be verified or applied) — not a
    /// verdict on the release's health.
    Error,
    /// A state written by a newer fleetgate that this build does not know.
    #[serde(other)]
    Unknown,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Success => "success",
            State::Failure => "failure",
            State::Error => "error",
            State::Unknown => "unknown",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One gate's figure as reported: plain strings, so the status format does not depend on how
/// gates are evaluated (e.g. `error-rate`, `7.3 %`, `≤ 5 %`, `fail`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateFigure {
    pub name: String,
    #[serde(default)]
    pub observed: String,
    #[serde(default)]
    pub threshold: String,
    #[serde(default)]
    pub verdict: String,
}

/// What one cluster reports about one release at one moment. A note keeps a list of these.
/// (`Deserialize` is in [`super::parse`]: it keeps `extra` without serde's flatten.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub cluster: String,
    pub state: State,
    /// One line a person understands at a glance, e.g. "rolled back to rel-7: error-rate 7.3 % > 5 %".
    pub description: String,
    /// Release id (the tag name).
    pub release: String,
    /// The release's commit (full hex object id) — the commit the note is attached to.
    pub commit: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<GateFigure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<DateTime<Utc>>,
    /// The release this cluster was rolled back to, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_to: Option<String>,
    /// Who approved the release for the cluster's wave, when its wave requires approval: set on
    /// the entry of the release's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalRecord>,
    /// The variant of the release the cluster runs (`release.yaml` `spec.variants`), chosen by
    /// the cluster's own facts; absent for a release without variants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Link shown by forges next to the status (optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_url: Option<String>,
    #[serde(default)]
    pub agent_version: String,
    /// When the agent says it wrote this entry: shown, never trusted for order (a clock can be
    /// wrong, a forger can write 2099); histories are ordered by `sequence`.
    pub reported_at: DateTime<Utc>,
    /// The fleet the writing agent belongs to (signed: a status cannot be replayed into another
    /// fleet that has a cluster of the same name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<String>,
    /// Per-cluster counter, one more than the highest this cluster's agent signed before: the
    /// order of its statements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// The agent's SSH signature (armored, namespace `fleetgate-status`) over the entry's
    /// canonical form ([`super::identity::canonical_form`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// Fields written by a newer fleetgate, kept verbatim when this build rewrites the note.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Status {
    /// A status reported now by this build. The description is folded onto one line.
    pub fn new(
        cluster: impl Into<String>,
        release: impl Into<String>,
        commit: impl Into<String>,
        state: State,
        description: impl AsRef<str>,
    ) -> Status {
        Status {
            cluster: cluster.into(),
            state,
            description: one_line(description.as_ref()),
            release: release.into(),
            commit: commit.into(),
            gates: Vec::new(),
            started_at: None,
            applied_at: None,
            decided_at: None,
            rollback_to: None,
            approval: None,
            variant: None,
            target_url: None,
            agent_version: crate::VERSION.to_string(),
            reported_at: Utc::now(),
            fleet: None,
            sequence: None,
            signature: None,
            extra: BTreeMap::new(),
        }
    }

    pub fn with_gates(mut self, gates: Vec<GateFigure>) -> Status {
        self.gates = gates;
        self
    }

    pub fn started(mut self, at: DateTime<Utc>) -> Status {
        self.started_at = Some(at);
        self
    }

    pub fn applied(mut self, at: DateTime<Utc>) -> Status {
        self.applied_at = Some(at);
        self
    }

    pub fn decided(mut self, at: DateTime<Utc>) -> Status {
        self.decided_at = Some(at);
        self
    }

    pub fn rolled_back_to(mut self, release: impl Into<String>) -> Status {
        self.rollback_to = Some(release.into());
        self
    }

    pub fn of_variant(mut self, variant: Option<String>) -> Status {
        self.variant = variant;
        self
    }

    pub fn approved(mut self, approval: ApprovalRecord) -> Status {
        self.approval = Some(approval);
        self
    }

    pub fn with_target_url(mut self, url: impl Into<String>) -> Status {
        self.target_url = Some(url.into());
        self
    }

    /// `fleetgate/<cluster>`.
    pub fn context(&self) -> String {
        context(&self.cluster)
    }

    /// The release its cluster runs once it wrote this entry, when the entry settles that: the
    /// release itself after `success`, the rollback target after a rollback. `None` while a
    /// release is on its way (`pending`) or when the agent could not finish (`error`): then the
    /// cluster still runs what an earlier entry settled.
    pub fn settles_on(&self) -> Option<&str> {
        match self.state {
            State::Success => Some(&self.release),
            State::Failure => self.rollback_to.as_deref(),
            State::Pending | State::Error | State::Unknown => None,
        }
    }

    /// Orders one cluster's entries across releases: by the signed sequence, its agent's own
    /// order, and by `reportedAt` only where a sequence is missing (unsigned schema-1 entries).
    pub fn recency(&self) -> (Option<u64>, DateTime<Utc>) {
        (self.sequence, self.reported_at)
    }
}

/// What a cluster runs, from its latest entry per release, newest first
/// ([`StatusSet::latest_per_release`]): the release the first settling entry names
/// ([`Status::settles_on`]).
pub fn running<'a>(newest_first: &[&'a Status]) -> Option<&'a str> {
    newest_first.iter().find_map(|s| s.settles_on())
}

/// Collapses whitespace runs (newlines included) into single spaces.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Cuts `text` to at most `max` characters, ending with `…` when it was cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let mut out: String = text.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// The content of one Git note: the history of one release commit on one cluster.
/// (`Deserialize` is in [`super::parse`], like [`Status`]'s.)
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusNote {
    pub schema: u32,
    /// `fleetgate/<cluster>`.
    pub context: String,
    /// Oldest first; the last entry is the cluster's current word on the release.
    pub entries: Vec<Status>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A note that is not a status note this build can read.
#[derive(Debug, thiserror::Error)]
pub enum NoteParseError {
    #[error("not JSON of a fleetgate status note")]
    Json(#[from] serde_json::Error),
    #[error("note schema {found} is newer than this fleetgate understands (schema {SCHEMA}); upgrade fleetgate")]
    NewerSchema { found: u32 },
}

impl StatusNote {
    pub fn new(cluster: &str) -> StatusNote {
        StatusNote { schema: SCHEMA, context: context(cluster), entries: Vec::new(), extra: BTreeMap::new() }
    }

    pub fn parse(text: &str) -> Result<StatusNote, NoteParseError> {
        let note: StatusNote = serde_json::from_str(text)?;
        if note.schema > SCHEMA {
            return Err(NoteParseError::NewerSchema { found: note.schema });
        }
        Ok(note)
    }

    /// Pretty JSON with a trailing newline: readable in `git log --notes`.
    pub fn to_text(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a status note always serializes");
        text.push('\n');
        text
    }

    /// Appends `status` unless an identical entry is already there (a retried write).
    /// Returns whether the note changed.
    pub fn append(&mut self, status: &Status) -> bool {
        if self.entries.contains(status) {
            return false;
        }
        self.entries.push(status.clone());
        sort_history(&mut self.entries);
        true
    }

    /// The union of two histories of the same note (two writers of one cluster's ref): every
    /// entry of either, once, in [`sort_history`] order.
    pub fn merge(mut self, other: &StatusNote) -> StatusNote {
        self.schema = self.schema.max(other.schema);
        for entry in &other.entries {
            if !self.entries.contains(entry) {
                self.entries.push(entry.clone());
            }
        }
        for (k, v) in &other.extra {
            self.extra.entry(k.clone()).or_insert_with(|| v.clone());
        }
        sort_history(&mut self.entries);
        self
    }
}

/// Signed entries by sequence, after the unsigned ones (schema 1, kept in their written order);
/// `reportedAt` only breaks ties between equal sequences (two replicas during a hand-over).
/// Stable, so entries that tie on both keep their write order.
fn sort_history(entries: &mut [Status]) {
    entries.sort_by_key(history_order);
}

/// What a view keeps of one note whose entries all verified: each release's last entry (in
/// history order), without its signature (checked; the note keeps it). `fleetgate status` shows
/// nothing more, and a fleet's notes hold ten times that (every entry's history, every armored
/// signature).
pub(crate) fn latest_per_release(mut entries: Vec<Status>) -> Vec<Status> {
    sort_history(&mut entries);
    let mut latest: Vec<Status> = Vec::with_capacity(1);
    for entry in entries.into_iter().rev() {
        if !latest.iter().any(|l| l.release == entry.release) {
            latest.push(Status { signature: None, ..entry });
        }
    }
    latest
}

/// An entry a reader found but does not believe, with the reason.
#[derive(Debug, Clone, PartialEq)]
pub struct UnverifiedStatus {
    pub status: Status,
    pub reason: Unverified,
}

/// Every status a reader collected, by cluster and release: the verified histories (oldest first,
/// by sequence), which every decision reads, and the unverified entries, which are only shown.
#[derive(Debug, Clone, Default)]
pub struct StatusSet {
    /// Each cluster's verified entries sorted by release, each release's history oldest first: a
    /// history is a run of one list, so a fleet's read allocates per cluster, not per cluster
    /// and release (200,000 maps' keys and lists at 10,000 × 20).
    by_cluster: HashMap<String, Vec<Status>>,
    unverified: HashMap<String, HashMap<String, Vec<UnverifiedStatus>>>,
}

/// Where `release`'s history is in a cluster's entries (sorted by release).
fn history_range(entries: &[Status], release: &str) -> std::ops::Range<usize> {
    let start = entries.partition_point(|s| s.release.as_str() < release);
    start..start + entries[start..].partition_point(|s| s.release == release)
}

/// The order of one release's history: by the signed sequence; unsequenced (older) entries first,
/// among themselves in the order they were added.
fn history_order(s: &Status) -> (Option<u64>, Option<DateTime<Utc>>) {
    (s.sequence, s.sequence.map(|_| s.reported_at))
}

impl StatusSet {
    pub fn new() -> StatusSet {
        StatusSet::default()
    }

    /// Adds an entry the caller verified (see [`super::identity::StatusKeys::verify`]).
    pub fn insert(&mut self, status: Status) {
        // The cluster's name is copied only when it is seen first: a reader inserts every entry
        // of the fleet here (and a name seen before is hashed once).
        let entries = match self.by_cluster.get_mut(&status.cluster) {
            Some(entries) => entries,
            None => self.by_cluster.entry(status.cluster.clone()).or_default(),
        };
        let range = history_range(entries, &status.release);
        let history = &entries[range.clone()];
        if !history.contains(&status) {
            let order = history_order(&status);
            let at = range.start + history.partition_point(|s| history_order(s) <= order);
            entries.insert(at, status);
        }
    }

    /// Adds every entry of `other`. A reader that split the fleet's notes refs between threads
    /// merges what each found: clusters one part alone holds (every cluster, as each has one ref)
    /// move over whole instead of being inserted entry by entry again.
    pub fn absorb(&mut self, other: StatusSet) {
        for (cluster, entries) in other.by_cluster {
            match self.by_cluster.entry(cluster) {
                hash_map::Entry::Vacant(free) => {
                    free.insert(entries);
                }
                hash_map::Entry::Occupied(_) => entries.into_iter().for_each(|s| self.insert(s)),
            }
        }
        for (cluster, releases) in other.unverified {
            for u in releases.into_values().flatten() {
                self.insert_unverified(&cluster, u.status, u.reason);
            }
        }
    }

    /// Adds an entry found in `cluster`'s notes that did not verify; it is shown, never believed.
    pub fn insert_unverified(&mut self, cluster: &str, status: Status, reason: Unverified) {
        let list = self.unverified.entry(cluster.to_string()).or_default().entry(status.release.clone()).or_default();
        if !list.iter().any(|u| u.status == status) {
            list.push(UnverifiedStatus { status, reason });
        }
    }

    /// The cluster's current (verified) word on the release.
    pub fn latest(&self, cluster: &str, release: &str) -> Option<&Status> {
        self.history(cluster, release).last()
    }

    /// Moves the cluster's verified entries out of the set, sorted by release, each release's
    /// history oldest first; for [`super::Matrix::build`], which owns the set and reads nothing of
    /// it after.
    pub(super) fn take_cluster(&mut self, cluster: &str) -> Vec<Status> {
        self.by_cluster.remove(cluster).unwrap_or_default()
    }

    /// Everything the cluster verifiably said about the release, oldest first.
    pub fn history(&self, cluster: &str, release: &str) -> &[Status] {
        self.by_cluster.get(cluster).map_or(&[], |entries| &entries[history_range(entries, release)])
    }

    /// Entries in the cluster's notes on the release that did not verify, in the note's order.
    pub fn unverified(&self, cluster: &str, release: &str) -> &[UnverifiedStatus] {
        self.unverified.get(cluster).and_then(|r| r.get(release)).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The cluster's latest verified entry on each release it reported on, newest first
    /// ([`Status::recency`]).
    pub fn latest_per_release(&self, cluster: &str) -> Vec<&Status> {
        let entries = self.by_cluster.get(cluster).map_or(&[][..], Vec::as_slice);
        // Each history's last entry: the one the next entry's release differs from.
        let mut latest: Vec<&Status> = entries
            .iter()
            .enumerate()
            .filter(|(i, s)| entries.get(i + 1).is_none_or(|next| next.release != s.release))
            .map(|(_, s)| s)
            .collect();
        latest.sort_by_key(|s| std::cmp::Reverse(s.recency()));
        latest
    }

    /// What the cluster runs by its own verified word: the release its newest settling entry
    /// ([`Status::settles_on`]) names. A `pending` entry on a newer release does not change it
    /// (the cluster is on its way there), nor does an `error` (the agent could not finish).
    /// `None` when nothing it said settles it yet.
    pub fn running(&self, cluster: &str) -> Option<&str> {
        running(&self.latest_per_release(cluster))
    }

    /// Latest verified status of every cluster that reported on `release`, in no particular order.
    pub fn for_release<'a>(&'a self, release: &'a str) -> impl Iterator<Item = &'a Status> + 'a {
        self.by_cluster.values().filter_map(move |entries| entries[history_range(entries, release)].last())
    }

    /// No entries at all, verified or not.
    pub fn is_empty(&self) -> bool {
        self.by_cluster.is_empty() && self.unverified.is_empty()
    }
}

impl FromIterator<Status> for StatusSet {
    fn from_iter<I: IntoIterator<Item = Status>>(iter: I) -> StatusSet {
        let mut set = StatusSet::new();
        for s in iter {
            set.insert(s);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_750_000_000 + secs, 0).unwrap()
    }

    /// An entry as the agent writes it: its sequence follows its time, unless a test says otherwise.
    fn status(state: State, secs: i64) -> Status {
        let mut s = Status::new("cluster-a", "rel-8", "a".repeat(40), state, format!("{state} at {secs}"));
        s.reported_at = at(secs);
        s.sequence = Some(secs as u64);
        s
    }

    /// cluster-a's entry on `release` at `secs` (its sequence).
    fn on(release: &str, state: State, secs: i64) -> Status {
        Status { release: release.into(), ..status(state, secs) }
    }

    #[rstest::rstest]
    // Succeeded on rel-8: runs it.
    #[case(&[("rel-7", State::Success, 1), ("rel-8", State::Success, 3)], Some("rel-8"))]
    // Rolled back from rel-8 to rel-7: runs the target, whatever rel-7's own entry says.
    #[case(&[("rel-7", State::Success, 1), ("rel-8", State::Pending, 2), ("rel-8", State::Failure, 3)], Some("rel-7"))]
    // On its way to rel-8, or failed to finish it: still runs rel-7.
    #[case(&[("rel-7", State::Success, 1), ("rel-8", State::Pending, 2)], Some("rel-7"))]
    #[case(&[("rel-7", State::Success, 1), ("rel-8", State::Error, 2)], Some("rel-7"))]
    // Back to rel-7 by Git after rel-8 succeeded: rel-7's newer success counts, not its older one.
    #[case(&[("rel-7", State::Success, 1), ("rel-8", State::Success, 2), ("rel-7", State::Success, 3)], Some("rel-7"))]
    // Nothing settled yet.
    #[case(&[("rel-8", State::Pending, 1)], None)]
    #[case(&[], None)]
    fn a_cluster_runs_what_its_newest_settling_entry_names(
        #[case] entries: &[(&str, State, i64)],
        #[case] expected: Option<&str>,
    ) {
        let mut set = StatusSet::new();
        for (release, state, secs) in entries {
            let mut s = on(release, *state, *secs);
            if *state == State::Failure {
                s.rollback_to = Some("rel-7".into());
            }
            set.insert(s);
        }
        assert_eq!(set.running("cluster-a"), expected);
    }

    #[test]
    fn histories_inserted_in_any_order_keep_to_their_release_and_their_sequence() {
        let entries = [
            on("rel-8", State::Success, 6),
            on("rel-10", State::Pending, 7),
            on("rel-7", State::Pending, 1),
            on("rel-8", State::Pending, 5),
            on("rel-7", State::Success, 2),
            on("rel-10", State::Failure, 8),
            on("rel-7", State::Success, 2),
        ];
        let mut set = StatusSet::new();
        entries.into_iter().for_each(|s| set.insert(s));
        let seqs = |release: &str| set.history("cluster-a", release).iter().map(|s| s.sequence).collect::<Vec<_>>();
        // The repeated entry is kept once; each history is in sequence order.
        assert_eq!(seqs("rel-7"), [Some(1), Some(2)]);
        assert_eq!(seqs("rel-8"), [Some(5), Some(6)]);
        assert_eq!(seqs("rel-10"), [Some(7), Some(8)]);
        assert_eq!(seqs("rel-9"), []);
        assert_eq!(set.latest("cluster-a", "rel-10").map(|s| s.state), Some(State::Failure));
        let newest_first: Vec<_> = set.latest_per_release("cluster-a").iter().map(|s| s.sequence).collect();
        assert_eq!(newest_first, [Some(8), Some(6), Some(2)]);
        assert_eq!(set.for_release("rel-8").map(|s| s.sequence).collect::<Vec<_>>(), [Some(6)]);
        let taken: Vec<_> = set.take_cluster("cluster-a").iter().map(|s| (s.release.clone(), s.sequence)).collect();
        assert_eq!(taken.len(), 6);
        assert!(set.is_empty());
    }

    #[test]
    fn the_signed_sequence_orders_entries_across_releases_not_the_clock() {
        let mut set = StatusSet::new();
        // A clock running days ahead on the older entry does not make it the newer word.
        set.insert(Status { reported_at: at(1_000_000), ..on("rel-7", State::Success, 1) });
        set.insert(on("rel-8", State::Success, 2));
        let order: Vec<&str> = set.latest_per_release("cluster-a").iter().map(|s| s.release.as_str()).collect();
        assert_eq!(order, ["rel-8", "rel-7"]);
        assert_eq!(set.running("cluster-a"), Some("rel-8"));
    }

    #[test]
    fn descriptions_are_one_line() {
        let s = Status::new("c", "r", "x", State::Failure, "rolled back to rel-7:\n  error-rate 7.3 % > 5 %\n");
        assert_eq!(s.description, "rolled back to rel-7: error-rate 7.3 % > 5 %");
        assert_eq!(s.context(), "fleetgate/c");
        assert_eq!(s.agent_version, crate::VERSION);
    }

    #[test]
    fn unknown_fields_and_states_do_not_break_readers_and_survive_rewrites() {
        let text = r#"{"schema":1,"context":"fleetgate/a","futureNoteField":{"x":1},"entries":[
            {"cluster":"a","state":"warning","description":"d","release":"r","commit":"c",
             "reportedAt":"2025-03-15T10:00:00Z","futureField":[1,2]}]}"#;
        let note = StatusNote::parse(text).unwrap();
        assert_eq!(note.entries[0].state, State::Unknown);
        assert_eq!(note.entries[0].extra["futureField"], serde_json::json!([1, 2]));
        let again = StatusNote::parse(&note.to_text()).unwrap();
        assert_eq!(again.extra["futureNoteField"], serde_json::json!({"x": 1}));
        assert_eq!(again.entries[0].extra["futureField"], serde_json::json!([1, 2]));
    }

    #[test]
    fn newer_schemas_are_refused_with_a_hint() {
        let err = StatusNote::parse(r#"{"schema":3,"context":"fleetgate/a","entries":[]}"#).unwrap_err();
        assert!(err.to_string().contains("upgrade fleetgate"), "{err}");
    }

    #[test]
    fn merge_is_a_union_ordered_by_sequence() {
        let mut ours = StatusNote::new("cluster-a");
        ours.append(&status(State::Pending, 1));
        ours.append(&status(State::Success, 30));
        let mut theirs = StatusNote::new("cluster-a");
        theirs.append(&status(State::Pending, 1));
        theirs.append(&status(State::Error, 20));
        let merged = ours.merge(&theirs);
        let states: Vec<_> = merged.entries.iter().map(|s| s.state).collect();
        assert_eq!(states, [State::Pending, State::Error, State::Success]);
    }

    /// A clock (or a forger) that says 2099 does not make an entry the newest: the sequence does.
    #[test]
    fn a_future_report_time_never_hides_a_later_entry() {
        let mut future = status(State::Success, 1);
        future.reported_at = "2099-01-01T00:00:00Z".parse().unwrap();
        let failure = status(State::Failure, 2);
        let set: StatusSet = [future.clone(), failure.clone()].into_iter().collect();
        assert_eq!(set.latest("cluster-a", "rel-8").unwrap().state, State::Failure);
        let mut note = StatusNote::new("cluster-a");
        note.append(&failure);
        note.append(&future);
        assert_eq!(note.entries.last().unwrap().state, State::Failure);
    }

    #[test]
    fn unverified_entries_are_kept_apart_and_never_latest() {
        let mut set = StatusSet::new();
        set.insert(status(State::Pending, 1));
        set.insert_unverified("cluster-a", status(State::Success, 99), Unverified::Unsigned);
        assert_eq!(set.latest("cluster-a", "rel-8").unwrap().state, State::Pending);
        assert_eq!(set.unverified("cluster-a", "rel-8").len(), 1);
        assert_eq!(set.for_release("rel-8").count(), 1);
    }

    /// Two readers' parts merged hold what one reader inserting every entry holds: a cluster
    /// both parts hold is merged entry by entry, in order and without duplicates.
    #[test]
    fn absorbing_a_set_is_inserting_its_entries() {
        let b = |s: Status| Status { cluster: "cluster-b".into(), ..s };
        let first = [on("rel-7", State::Success, 1), on("rel-8", State::Pending, 2), b(on("rel-8", State::Success, 5))];
        let second = [on("rel-8", State::Failure, 3), on("rel-8", State::Pending, 2), on("rel-9", State::Pending, 4)];
        let mut merged: StatusSet = first.iter().cloned().collect();
        let mut other: StatusSet = second.iter().cloned().collect();
        other.insert_unverified("cluster-c", on("rel-8", State::Success, 9), Unverified::Unsigned);
        merged.absorb(other);
        let all: StatusSet = first.iter().chain(&second).cloned().collect();
        for (cluster, release) in
            [("cluster-a", "rel-7"), ("cluster-a", "rel-8"), ("cluster-a", "rel-9"), ("cluster-b", "rel-8")]
        {
            assert_eq!(merged.history(cluster, release), all.history(cluster, release), "{cluster} {release}");
        }
        assert_eq!(merged.history("cluster-a", "rel-8").len(), 2, "the entry both parts hold is kept once");
        assert_eq!(merged.unverified("cluster-c", "rel-8").len(), 1);
    }

    #[test]
    fn appending_the_same_entry_twice_is_a_no_op() {
        let mut note = StatusNote::new("cluster-a");
        assert!(note.append(&status(State::Pending, 1)));
        assert!(!note.append(&status(State::Pending, 1)));
        assert_eq!(note.entries.len(), 1);
    }

    #[test]
    fn status_set_keeps_history_per_cluster_and_release() {
        let set: StatusSet = [status(State::Success, 9), status(State::Pending, 2)].into_iter().collect();
        assert_eq!(set.history("cluster-a", "rel-8").len(), 2);
        assert_eq!(set.latest("cluster-a", "rel-8").unwrap().state, State::Success);
        assert!(set.latest("cluster-a", "rel-9").is_none());
        assert_eq!(set.for_release("rel-8").count(), 1);
    }

    #[test]
    fn truncation_marks_the_cut() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
    }
    /// Two tags on one commit share its note: each release keeps its own latest entry, and the
    /// order is the history's (sequence), not the note's or the clock's.
    #[test]
    fn a_view_keeps_each_releases_latest_entry_without_its_signature() {
        let entry = |release: &str, state, sequence, secs| {
            let mut s = Status::new("a", release, "c0ffee", state, "x");
            (s.sequence, s.reported_at, s.signature) = (Some(sequence), at(secs), Some("sig".into()));
            s
        };
        let note = vec![
            entry("rel-2", State::Success, 4, 0),
            entry("rel-1", State::Pending, 1, 30),
            entry("rel-2", State::Pending, 3, 50),
            entry("rel-1", State::Failure, 2, 10),
        ];
        let latest = latest_per_release(note);
        let shown: Vec<_> = latest.iter().map(|s| (s.release.as_str(), s.state, s.signature.is_none())).collect();
        assert_eq!(shown, [("rel-2", State::Success, true), ("rel-1", State::Failure, true)]);
    }
}
