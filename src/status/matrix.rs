//! The fleet status view: clusters (grouped by wave) × releases (newest first), built and rendered
//! by pure functions over the fleet, the releases and the statuses, so the view is unit-testable
//! and its speed measurable without Git.
//!
//! [`Matrix`] is also the documented `fleetgate status -o json` format (docs/STATUS.md): fields are
//! only ever added to it within `schema: 1`.
//!
//! States, summaries and gate decisions come from verified entries only; entries that did not
//! verify are listed beside them (`unverified`, each `"verified": false` with its reason) so a
//! person sees a forgery, and nothing counts it.

use super::heartbeat::Heartbeat;
use super::model::{GateFigure, PAUSED_PREFIX, State, Status, StatusSet, UnverifiedStatus, running, truncate};
use super::waves::{Decision, Member, Move, may_start};
use crate::model::{ApprovalRecord, Fleet};
use chrono::{DateTime, Utc};
use owo_colors::OwoColorize;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

/// A release tag: its id (the tag name), its commit, and when it was cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseRef {
    pub id: String,
    pub commit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
}

/// Where the fleet was read: the tracked branch and its tip.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub branch: String,
    pub revision: String,
}

/// The version of the `-o json` document (independent of the note schema).
pub const VIEW_SCHEMA: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Matrix {
    pub schema: u32,
    pub fleet: String,
    pub branch: String,
    pub revision: String,
    /// Newest first.
    pub releases: Vec<ReleaseColumn>,
    /// In rollout order; clusters naming a wave fleet.yaml does not list come last.
    pub waves: Vec<WaveRows>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseColumn {
    pub id: String,
    pub commit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
    pub summary: Summary,
}

/// Counts for one release over the clusters it concerns: those that desire it or reported on it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub clusters: usize,
    pub success: usize,
    pub failure: usize,
    pub error: usize,
    pub pending: usize,
    /// Desire the release but have not reported on it yet.
    pub not_started: usize,
    /// Reported a state this build does not know.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unknown: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Summary {
    /// "7/10 clusters success, 1 failure, 2 pending".
    pub fn sentence(&self) -> String {
        if self.clusters == 0 {
            return "no cluster desires it or reported on it".to_string();
        }
        let noun = if self.clusters == 1 { "cluster" } else { "clusters" };
        let mut s = format!("{}/{} {noun} success", self.success, self.clusters);
        for (n, what) in [
            (self.failure, "failure"),
            (self.error, "error"),
            (self.pending, "pending"),
            (self.not_started, "not started"),
            (self.unknown, "unknown"),
        ] {
            if n > 0 {
                let _ = write!(s, ", {n} {what}");
            }
        }
        s
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaveRows {
    pub name: String,
    /// How the wave selects and paces ([`crate::model::Wave::summary`]); absent for a plain wave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<String>,
    pub clusters: Vec<ClusterRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRow {
    pub name: String,
    /// Its `metadata.labels` at the branch tip (`-l key=value` selects by them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub desired_release: Option<String>,
    /// What it runs by its own verified word ([`StatusSet::running`]): differs from the desired
    /// release while one is on its way, after a rollback, a block or a pause. `None` before any
    /// release settled there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<String>,
    /// When its agent was last heard from: the newest of its verified heartbeat's `at` and the
    /// `reportedAt` of its newest verified entry (the agent's clock), `None` when never heard from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<DateTime<Utc>>,
    /// Its newest verified heartbeat ([`super::heartbeat`]): when it was sent and the interval
    /// its agent beats at. `None` when it has none (an agent that predates heartbeats, or off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<HeartbeatSeen>,
    /// How long it may go unheard before it is stale: `--stale-after`, else
    /// [`super::heartbeat::STALE_FACTOR`] × its heartbeat's interval; `None` when neither exists
    /// (it is never judged stale then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_after_seconds: Option<u64>,
    /// Not heard from (`lastSeen`) for longer than `staleAfterSeconds`: its agent may be down.
    /// Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
    /// Why the cluster is held where it is, when it is: the setting in Git that pauses it, else
    /// its agent's own `pending` status saying it is paused (a flag or annotation on the spoke).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// One per release, in the order of [`Matrix::releases`].
    pub cells: Vec<Cell>,
}

/// A verified heartbeat as the view shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatSeen {
    pub at: DateTime<Utc>,
    pub interval_seconds: u64,
}

impl ClusterRow {
    /// The cluster's newest verified status over all releases, in its agent's own order
    /// ([`Status::recency`]).
    pub fn newest_status(&self) -> Option<&Status> {
        self.cells.iter().filter_map(|c| c.status.as_ref()).max_by_key(|s| s.recency())
    }

    /// The row at a glance, what `--state` selects and the order puts first: its state on the
    /// release in `column` when one is focused (`fleetgate status RELEASE`), else on its desired
    /// release, else (nothing desired) its newest entry's. `None`: not reported on it.
    pub fn glance(&self, column: Option<usize>) -> Option<State> {
        match column.and_then(|i| self.cells.get(i)).or_else(|| self.cells.iter().find(|c| c.desired)) {
            Some(cell) => cell.state,
            None => self.newest_status().map(|s| s.state),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cell {
    pub release: String,
    /// The cluster's latest state for the release; `null` when it never reported on it.
    pub state: Option<State>,
    /// The release is the one this cluster should run.
    pub desired: bool,
    /// The latest status in full (its history stays in Git).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// For the desired release without a final state: may the cluster start it now, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<Decision>,
    /// Entries in the cluster's notes on the release that did not verify: shown, never counted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unverified: Vec<UnverifiedEntry>,
}

/// An entry that did not verify, as `-o json` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnverifiedEntry {
    /// Always `false`: says in the document itself that nothing was believed.
    pub verified: bool,
    /// Why it is not believed.
    pub reason: String,
    pub status: Status,
}

impl From<&UnverifiedStatus> for UnverifiedEntry {
    fn from(u: &UnverifiedStatus) -> UnverifiedEntry {
        UnverifiedEntry { verified: false, reason: u.reason.to_string(), status: u.status.clone() }
    }
}

impl Cell {
    /// The cell as the table shows it: the state, `*` on the desired release, and the variant the
    /// cluster ran (`success* eu`).
    fn text(&self) -> String {
        let mut text = self.shown_state().to_string();
        if self.desired {
            text.push('*');
        }
        if let Some(variant) = self.status.as_ref().and_then(|s| s.variant.as_deref()) {
            text.push(' ');
            text.push_str(variant);
        }
        text
    }

    /// The state shown: the verified one, else `unverified` where only unverified entries exist.
    fn shown_state(&self) -> &'static str {
        match (self.state, self.unverified.is_empty()) {
            (Some(state), _) => state.as_str(),
            (None, false) => "unverified",
            (None, true) => "—",
        }
    }
}

impl Matrix {
    /// Builds the view as of `now`. Cells of a cluster's desired release that has no final state
    /// yet carry the wave-gating decision (computed once per wave and release — it depends only on
    /// the wave — except in a wave with `maxUnavailable`, where each cluster has its seat).
    ///
    /// Each cell's entry is moved out of `statuses`, not copied: at fleet scale (200,000 cells)
    /// the copies, and then freeing both, were much of `fleetgate status` (docs/BENCHMARKS.md).
    /// So every decision that reads the set is taken first, and the entries are moved in last.
    pub fn build(
        fleet: &Fleet,
        members: &[Member],
        releases: &[ReleaseRef],
        mut statuses: StatusSet,
        origin: &Origin,
        now: DateTime<Utc>,
    ) -> Matrix {
        let mut columns: Vec<ReleaseColumn> = releases
            .iter()
            .map(|r| ReleaseColumn {
                id: r.id.clone(),
                commit: r.commit.clone(),
                created_at: r.created_at,
                summary: Summary::default(),
            })
            .collect();
        let mut waves: Vec<WaveRows> = fleet
            .spec
            .waves
            .iter()
            .map(|w| WaveRows { name: w.name.clone(), settings: w.summary(), clusters: Vec::new() })
            .collect();
        let mut gate_cache: HashMap<(&str, &str, Option<&str>), Decision> = HashMap::new();
        let column_of: HashMap<&str, usize> = releases.iter().enumerate().map(|(i, r)| (r.id.as_str(), i)).collect();
        let mut sorted: Vec<&Member> = members.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        let mut latest: Vec<Option<&Status>> = Vec::with_capacity(columns.len());
        for m in sorted {
            // One sort of the cluster's entries serves its cells, what it runs and when it was seen.
            let newest_first = statuses.latest_per_release(&m.name);
            latest.clear();
            latest.resize(columns.len(), None);
            for s in &newest_first {
                if let Some(&i) = column_of.get(s.release.as_str()) {
                    latest[i] = Some(s);
                }
            }
            let cells: Vec<Cell> = columns
                .iter_mut()
                .zip(&latest)
                .zip(releases)
                .map(|((col, status), release)| {
                    let state = status.map(|s| s.state);
                    let desired = m.desired_release.as_deref() == Some(col.id.as_str());
                    if desired || state.is_some() {
                        let s = &mut col.summary;
                        s.clusters += 1;
                        match state {
                            None => s.not_started += 1,
                            Some(State::Success) => s.success += 1,
                            Some(State::Failure) => s.failure += 1,
                            Some(State::Error) => s.error += 1,
                            Some(State::Pending) => s.pending += 1,
                            Some(State::Unknown) => s.unknown += 1,
                        }
                    }
                    let gate = (desired && matches!(state, None | Some(State::Pending))).then(|| {
                        let seated = fleet.spec.wave(&m.wave).is_some_and(|(_, w)| w.max_unavailable.is_some());
                        gate_cache
                            .entry((m.wave.as_str(), release.id.as_str(), seated.then_some(m.name.as_str())))
                            .or_insert_with(|| {
                                may_start(fleet, members, &statuses, &m.name, &col.id, now, Move::Forward)
                            })
                            .clone()
                    });
                    let unverified = statuses.unverified(&m.name, &col.id).iter().map(UnverifiedEntry::from).collect();
                    // The entry itself is moved in below, once nothing reads the set any more.
                    Cell { release: col.id.clone(), state, desired, status: None, gate, unverified }
                })
                .collect();
            let paused = m.paused.clone().or_else(|| {
                let held = latest[cells.iter().position(|c| c.desired)?]?;
                let by = held.description.strip_prefix(PAUSED_PREFIX).filter(|_| held.state == State::Pending)?;
                Some(by.split(';').next().unwrap_or_default().to_string())
            });
            let row = ClusterRow {
                name: m.name.clone(),
                labels: m.labels.clone(),
                desired_release: m.desired_release.clone(),
                running: running(&newest_first).map(str::to_string),
                last_seen: newest_first.first().map(|s| s.reported_at),
                heartbeat: None,
                stale_after_seconds: None,
                stale: false,
                paused,
                cells,
            };
            match waves.iter_mut().find(|w| w.name == m.wave) {
                Some(w) => w.clusters.push(row),
                None => waves.push(WaveRows { name: m.wave.clone(), settings: None, clusters: vec![row] }),
            }
        }
        for row in waves.iter_mut().flat_map(|w| &mut w.clusters) {
            // Newest first within each release's history: the first entry met is the cell's.
            for status in statuses.take_cluster(&row.name).into_iter().rev() {
                if let Some(cell) = column_of.get(status.release.as_str()).map(|&i| &mut row.cells[i])
                    && cell.status.is_none()
                {
                    cell.status = Some(status);
                }
            }
        }
        Matrix {
            schema: VIEW_SCHEMA,
            fleet: fleet.name().to_string(),
            branch: origin.branch.clone(),
            revision: origin.revision.clone(),
            releases: columns,
            waves,
        }
    }

    /// The same view restricted to one release, or `None` when it is not among the columns.
    pub fn only(&self, release: &str) -> Option<Matrix> {
        let idx = self.releases.iter().position(|r| r.id == release)?;
        let mut m = self.clone();
        m.releases = vec![self.releases[idx].clone()];
        for wave in &mut m.waves {
            for row in &mut wave.clusters {
                row.cells = vec![row.cells[idx].clone()];
            }
        }
        Some(m)
    }

    /// Folds each cluster's verified heartbeat into its LAST SEEN and judges it stale when it was
    /// last seen longer than its allowance before `now`: `stale_after` when given, else
    /// [`STALE_FACTOR`](super::heartbeat::STALE_FACTOR) × the interval its heartbeat announces.
    /// A cluster with neither an allowance nor a LAST SEEN is never stale.
    pub fn judge_liveness(
        &mut self,
        heartbeats: &BTreeMap<String, Heartbeat>,
        stale_after: Option<std::time::Duration>,
        now: DateTime<Utc>,
    ) {
        for row in self.waves.iter_mut().flat_map(|w| &mut w.clusters) {
            let beat = heartbeats.get(&row.name);
            row.heartbeat = beat.map(|b| HeartbeatSeen { at: b.at, interval_seconds: b.interval_seconds });
            row.last_seen = row.last_seen.max(beat.map(|b| b.at));
            let allowance = stale_after.or_else(|| beat.map(Heartbeat::allowance));
            row.stale_after_seconds = allowance.map(|a| a.as_secs());
            row.stale = match (allowance, row.last_seen) {
                (Some(a), Some(seen)) => (now - seen).to_std().is_ok_and(|gone| gone > a),
                _ => false,
            };
        }
    }

    pub fn cluster_count(&self) -> usize {
        self.waves.iter().map(|w| w.clusters.len()).sum()
    }

    /// Keeps the clusters `filter` selects (waves left empty go) and, in each wave, puts first
    /// those that need someone: stale ones ([`Matrix::judge_liveness`]) and a `failure` or `error`
    /// at a glance ([`ClusterRow::glance`] on `release`, else on the desired one); the rest keep
    /// their order by name. Release summaries
    /// still count the whole fleet.
    pub fn select(&mut self, filter: &RowFilter, release: Option<&str>) -> Result<(), FilterError> {
        filter.check(self)?;
        let column = release.and_then(|r| self.releases.iter().position(|c| c.id == r));
        for wave in &mut self.waves {
            let name = &wave.name;
            wave.clusters.retain(|row| filter.admits(name, row, column));
            wave.clusters.sort_by_key(|row| !(row.stale || needs_attention(row.glance(column))));
        }
        if !filter.is_empty() {
            self.waves.retain(|w| !w.clusters.is_empty());
        }
        Ok(())
    }

    /// Calls `f` on every string the matrix holds (ids, names, descriptions, reasons, gate
    /// figures, the strings of unknown fields), so a caller rewrites the text others wrote in
    /// place — `fleetgate status` makes the table renderers' input terminal-safe this way —
    /// instead of rebuilding the matrix through another representation. Every type is taken
    /// apart field by field (`Texts`): a field added to one does not compile until it is
    /// visited or said to hold no text.
    pub fn for_each_text_mut(&mut self, mut f: impl FnMut(&mut String)) {
        self.visit(&mut f);
    }
}

/// A failure or an error: someone should look, so the row goes first.
fn needs_attention(glance: Option<State>) -> bool {
    matches!(glance, Some(State::Failure | State::Error))
}

/// Which clusters `fleetgate status` shows. Every criterion given must hold; the values of one
/// criterion are alternatives (`--cluster a --cluster b` shows both).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowFilter {
    pub waves: Vec<String>,
    pub clusters: Vec<String>,
    pub states: Vec<StateFilter>,
    /// `key=value` pairs the cluster's labels must all carry.
    pub labels: Vec<(String, String)>,
}

/// A `--state` value: a status state, `not-started` (no verified status on the release), or
/// `stale` (not heard from within its allowance, whatever its state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    Is(State),
    NotStarted,
    Stale,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("--state {0:?}: expected one of success, failure, error, pending, unknown, not-started, stale")]
    State(String),
    #[error("-l {0:?}: expected key=value (a label of clusters/<name>.yaml)")]
    Label(String),
    #[error("no wave {wave} in this fleet; its waves: {}", known.join(", "))]
    UnknownWave { wave: String, known: Vec<String> },
    #[error("no cluster {cluster} in this fleet; its clusters: {}", known.join(", "))]
    UnknownCluster { cluster: String, known: Vec<String> },
}

impl std::str::FromStr for StateFilter {
    type Err = FilterError;

    fn from_str(s: &str) -> Result<StateFilter, FilterError> {
        Ok(match s {
            "success" => StateFilter::Is(State::Success),
            "failure" => StateFilter::Is(State::Failure),
            "error" => StateFilter::Is(State::Error),
            "pending" => StateFilter::Is(State::Pending),
            "unknown" => StateFilter::Is(State::Unknown),
            "not-started" => StateFilter::NotStarted,
            "stale" => StateFilter::Stale,
            other => return Err(FilterError::State(other.to_string())),
        })
    }
}

/// Parses `-l key=value`.
pub fn parse_label(s: &str) -> Result<(String, String), FilterError> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(FilterError::Label(s.to_string())),
    }
}

impl RowFilter {
    pub fn is_empty(&self) -> bool {
        self.waves.is_empty() && self.clusters.is_empty() && self.states.is_empty() && self.labels.is_empty()
    }

    /// A wave or cluster the fleet does not have is a typo, not an empty answer.
    fn check(&self, m: &Matrix) -> Result<(), FilterError> {
        let waves: Vec<String> = m.waves.iter().map(|w| w.name.clone()).collect();
        if let Some(w) = self.waves.iter().find(|w| !waves.contains(w)) {
            return Err(FilterError::UnknownWave { wave: w.clone(), known: waves });
        }
        let clusters: Vec<String> = m.waves.iter().flat_map(|w| &w.clusters).map(|c| c.name.clone()).collect();
        if let Some(c) = self.clusters.iter().find(|c| !clusters.contains(c)) {
            return Err(FilterError::UnknownCluster { cluster: c.clone(), known: clusters });
        }
        Ok(())
    }

    fn admits(&self, wave: &str, row: &ClusterRow, column: Option<usize>) -> bool {
        let glance = row.glance(column);
        (self.waves.is_empty() || self.waves.iter().any(|w| w == wave))
            && (self.clusters.is_empty() || self.clusters.contains(&row.name))
            && (self.states.is_empty()
                || self.states.iter().any(|s| match s {
                    StateFilter::Is(state) => glance == Some(*state),
                    StateFilter::NotStarted => glance.is_none(),
                    StateFilter::Stale => row.stale,
                }))
            && self.labels.iter().all(|(k, v)| row.labels.get(k) == Some(v))
    }
}

/// How long before `now` `then` was, as a person takes it in at a glance: `42 s ago`, `3 m ago`,
/// `5 h ago`, `12 d ago`. A time after `now` (the writer's clock ahead of the reader's) reads
/// `in 2 m` rather than pretending to be the past.
pub fn age(then: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let secs = (now - then).num_seconds();
    let n = secs.unsigned_abs();
    let amount = match n {
        0..60 => format!("{n} s"),
        60..3_600 => format!("{} m", n / 60),
        3_600..86_400 => format!("{} h", n / 3_600),
        _ => format!("{} d", n / 86_400),
    };
    if secs < 0 { format!("in {amount}") } else { format!("{amount} ago") }
}

/// Values whose strings [`Matrix::for_each_text_mut`] visits.
trait Texts {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String));
}

impl Texts for String {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        f(self);
    }
}

impl<T: Texts> Texts for Option<T> {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        if let Some(v) = self {
            v.visit(f);
        }
    }
}

impl<T: Texts> Texts for Vec<T> {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        self.iter_mut().for_each(|v| v.visit(f));
    }
}

/// The strings of a newer writer's fields (values, not keys: keys are never shown).
impl Texts for serde_json::Value {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        match self {
            serde_json::Value::String(s) => f(s),
            serde_json::Value::Array(items) => items.visit(f),
            serde_json::Value::Object(map) => map.values_mut().for_each(|v| v.visit(f)),
            serde_json::Value::Null | serde_json::Value::Bool(_) | serde_json::Value::Number(_) => {}
        }
    }
}

impl Texts for Matrix {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        let Matrix { schema: _, fleet, branch, revision, releases, waves } = self;
        [fleet, branch, revision].into_iter().for_each(|s| f(s));
        releases.visit(f);
        waves.visit(f);
    }
}

impl Texts for ReleaseColumn {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        let ReleaseColumn { id, commit, created_at: _, summary } = self;
        [id, commit].into_iter().for_each(|s| f(s));
        summary.visit(f);
    }
}

impl Texts for Summary {
    fn visit(&mut self, _: &mut dyn FnMut(&mut String)) {
        let Summary { clusters: _, success: _, failure: _, error: _, pending: _, not_started: _, unknown: _ } = self;
    }
}

impl Texts for WaveRows {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        let WaveRows { name, settings, clusters } = self;
        f(name);
        settings.visit(f);
        clusters.visit(f);
    }
}

impl Texts for ClusterRow {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        let ClusterRow {
            name,
            labels,
            desired_release,
            running,
            last_seen: _,
            heartbeat: _,
            stale_after_seconds: _,
            stale: _,
            paused,
            cells,
        } = self;
        f(name);
        labels.values_mut().for_each(|v| f(v));
        desired_release.visit(f);
        running.visit(f);
        paused.visit(f);
        cells.visit(f);
    }
}

impl Texts for Cell {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        let Cell { release, state: _, desired: _, status, gate, unverified } = self;
        f(release);
        status.visit(f);
        gate.visit(f);
        unverified.visit(f);
    }
}

impl Texts for Decision {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        let Decision { allowed: _, reason, waits_for, retry_at: _ } = self;
        f(reason);
        waits_for.visit(f);
    }
}

impl Texts for UnverifiedEntry {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        let UnverifiedEntry { verified: _, reason, status } = self;
        f(reason);
        status.visit(f);
    }
}

impl Texts for Status {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        let Status {
            cluster,
            state: _,
            description,
            release,
            commit,
            gates,
            started_at: _,
            applied_at: _,
            decided_at: _,
            rollback_to,
            approval,
            variant,
            target_url,
            agent_version,
            reported_at: _,
            fleet,
            sequence: _,
            signature,
            extra,
        } = self;
        [cluster, description, release, commit, agent_version].into_iter().for_each(|s| f(s));
        if let Some(ApprovalRecord { by, why, wave, via }) = approval {
            [by, why, wave, via].into_iter().for_each(|s| f(s));
        }
        [rollback_to, variant, target_url, fleet, signature].into_iter().for_each(|s| s.visit(f));
        gates.visit(f);
        extra.values_mut().for_each(|v| v.visit(f));
    }
}

impl Texts for GateFigure {
    fn visit(&mut self, f: &mut dyn FnMut(&mut String)) {
        let GateFigure { name, observed, threshold, verdict } = self;
        [name, observed, threshold, verdict].into_iter().for_each(|s| f(s));
    }
}

/// How to render for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderOptions {
    /// Terminal columns; every line fits in it.
    pub width: usize,
    pub colours: bool,
    /// The reader's clock, for relative ages.
    pub now: DateTime<Utc>,
    /// Exact RFC 3339 times instead of relative ages (`-o wide`).
    pub exact_times: bool,
}

impl RenderOptions {
    /// `t` as this rendering shows times; `never` when there is none.
    fn when(&self, t: Option<DateTime<Utc>>) -> String {
        match t {
            None => "never".to_string(),
            Some(t) if self.exact_times => t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            Some(t) => age(t, self.now),
        }
    }

    /// Columns a time takes: an RFC 3339 second, or the longest common age (`120 d ago`).
    fn time_width(&self) -> usize {
        if self.exact_times { 20 } else { 9 }
    }
}

const MIN_CELL: usize = 8;
const MAX_HEADER: usize = 16;
const MAX_NAME: usize = 28;

fn paint(text: &str, state: Option<State>, colours: bool) -> String {
    if !colours {
        return text.to_string();
    }
    match state {
        Some(State::Success) => text.green().to_string(),
        Some(State::Failure) => text.red().bold().to_string(),
        Some(State::Error) => text.magenta().to_string(),
        Some(State::Pending) => text.yellow().to_string(),
        Some(State::Unknown) | None => text.dimmed().to_string(),
    }
}

fn pad(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n >= width { text.to_string() } else { format!("{text}{}", " ".repeat(width - n)) }
}

/// Column headers: the full ids, or — when that leaves out releases the abbreviated form would
/// show — the ids without their common prefix ("…15-001" for "rel-20250315-001").
fn headers(ids: &[&str], budget: usize) -> Vec<String> {
    let fit = |hs: &[String]| {
        let mut used = 0;
        hs.iter()
            .take_while(|h| {
                used += h.chars().count().max(MIN_CELL) + 2;
                used <= budget
            })
            .count()
    };
    let full: Vec<String> = ids.iter().map(|id| truncate(id, MAX_HEADER)).collect();
    if ids.len() < 2 {
        return full;
    }
    let mut prefix: Vec<char> = ids[0].chars().collect();
    for id in &ids[1..] {
        let common = prefix.iter().zip(id.chars()).take_while(|(a, b)| **a == *b).count();
        prefix.truncate(common);
    }
    // Every header keeps at least three characters of its own.
    let shortest = ids.iter().map(|id| id.chars().count()).min().unwrap_or(0);
    let cut = prefix.len().min(shortest.saturating_sub(3));
    if cut < 2 {
        return full;
    }
    let short: Vec<String> =
        ids.iter().map(|id| truncate(&format!("…{}", id.chars().skip(cut).collect::<String>()), MAX_HEADER)).collect();
    if fit(&short) > fit(&full) { short } else { full }
}

/// Wraps `text` to `width`, continuation lines indented by `indent`.
fn wrap(text: &str, width: usize, indent: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split(' ') {
        let cur = lines.last_mut().expect("never empty");
        let len = cur.chars().count();
        if len > indent && len + 1 + word.chars().count() > width {
            lines.push(format!("{}{word}", " ".repeat(indent)));
        } else {
            if !cur.is_empty() {
                cur.push(' ');
            }
            cur.push_str(word);
        }
    }
    lines.into_iter().map(|l| truncate(&l, width)).collect()
}

fn title(m: &Matrix) -> String {
    let rev: String = m.revision.chars().take(7).collect();
    let waves = m.waves.len();
    format!(
        "fleet {} · {} @ {rev} · {} clusters in {waves} wave{}",
        m.fleet,
        m.branch,
        m.cluster_count(),
        if waves == 1 { "" } else { "s" }
    )
}

fn name_width(m: &Matrix, width: usize) -> usize {
    let longest = m.waves.iter().flat_map(|w| &w.clusters).map(|c| c.name.chars().count() + 2).max().unwrap_or(0);
    let longest_wave = m.waves.iter().map(|w| w.name.chars().count()).max().unwrap_or(0);
    longest.max(longest_wave).max("CLUSTER".len()).min(MAX_NAME).min(width / 3)
}

/// A wave's line: its name, bold, and how it selects and paces (`prod (tier=prod, 25 %; soak 10m)`).
fn wave_heading(wave: &WaveRows, opts: RenderOptions) -> String {
    let line = match &wave.settings {
        Some(settings) => format!("{} ({settings})", wave.name),
        None => wave.name.clone(),
    };
    let line = truncate(&line, opts.width);
    if opts.colours { line.bold().to_string() } else { line }
}

/// The matrix as a table: one column per release that fits in `opts.width` (newest first), a
/// summary line per shown release, and a note of what did not fit.
pub fn render_table(m: &Matrix, opts: RenderOptions) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", truncate(&title(m), opts.width));
    if m.releases.is_empty() {
        let _ = writeln!(out, "\nno release tags yet (a release is a tag on a commit with release.yaml)");
        return out;
    }
    let name_w = name_width(m, opts.width);
    let ids: Vec<&str> = m.releases.iter().map(|r| r.id.as_str()).collect();
    let seen_w = opts.time_width();
    // RUNNING takes at most a header's width; the release columns get what is left.
    let heads = headers(&ids, opts.width.saturating_sub(name_w + 2 + MAX_HEADER + 2 + seen_w));
    // What a cluster runs, named as its release's column is (`…15-001` when headers are short).
    let running = |row: &ClusterRow| match &row.running {
        Some(r) => ids.iter().position(|id| id == r).map_or_else(|| truncate(r, MAX_HEADER), |i| heads[i].clone()),
        None => "—".to_string(),
    };
    let rows = m.waves.iter().flat_map(|w| &w.clusters);
    let running_w = rows.map(|r| running(r).chars().count()).max().unwrap_or(0).max("RUNNING".len());
    let mut widths = Vec::new();
    let mut used = name_w + 2 + running_w + 2 + seen_w;
    for (i, h) in heads.iter().enumerate() {
        let widest = m.waves.iter().flat_map(|w| &w.clusters).filter_map(|r| r.cells.get(i));
        let widest = widest.map(|c| c.text().chars().count()).max().unwrap_or(0);
        let w = h.chars().count().max(MIN_CELL).max(widest);
        if used + 2 + w > opts.width {
            break;
        }
        used += 2 + w;
        widths.push(w);
    }
    let shown = widths.len().max(1);

    let mut line = format!("{}  {}  {}", pad("CLUSTER", name_w), pad("RUNNING", running_w), pad("LAST SEEN", seen_w));
    for (h, w) in heads.iter().zip(&widths) {
        let _ = write!(line, "  {}", pad(h, *w));
    }
    let _ = writeln!(
        out,
        "\n{}",
        if opts.colours { line.trim_end().bold().to_string() } else { line.trim_end().to_string() }
    );
    for wave in &m.waves {
        let _ = writeln!(out, "{}", wave_heading(wave, opts));
        for row in &wave.clusters {
            let mut line = format!(
                "{}  {}  {}",
                pad(&format!("  {}", truncate(&row.name, name_w - 2)), name_w),
                pad(&running(row), running_w),
                pad(&opts.when(row.last_seen), seen_w)
            );
            for (cell, w) in row.cells.iter().zip(&widths) {
                let text = cell.text();
                let padded = pad(&text, *w);
                let _ = write!(line, "  {}{}", paint(&text, cell.state, opts.colours), &padded[text.len()..]);
            }
            if row.stale {
                let _ = write!(line, "  {}", paint("(stale)", Some(State::Failure), opts.colours));
            }
            if row.paused.is_some() {
                let _ = write!(line, "  {}", paint("(paused)", Some(State::Pending), opts.colours));
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    out.push('\n');
    let id_w = m.releases[..shown].iter().map(|r| r.id.chars().count()).max().unwrap_or(0).min(opts.width / 2);
    for r in &m.releases[..shown] {
        let text = format!("{}  {}", pad(&truncate(&r.id, id_w), id_w), r.summary.sentence());
        for l in wrap(&text, opts.width, id_w + 2) {
            let _ = writeln!(out, "{l}");
        }
    }
    let hidden = m.releases.len() - shown;
    let mut notes = vec!["* desired release".to_string(), "`fleetgate status RELEASE` for details".to_string()];
    let unverified: usize = m
        .waves
        .iter()
        .flat_map(|w| &w.clusters)
        .flat_map(|c| &c.cells[..shown.min(c.cells.len())])
        .map(|c| c.unverified.len())
        .sum();
    // By reason, so a paused fleet of a thousand clusters is one short note.
    let mut paused: Vec<(&str, Vec<&str>)> = Vec::new();
    for c in m.waves.iter().flat_map(|w| &w.clusters) {
        let Some(why) = c.paused.as_deref() else { continue };
        match paused.iter_mut().find(|(w, _)| *w == why) {
            Some((_, names)) => names.push(&c.name),
            None => paused.push((why, vec![&c.name])),
        }
    }
    if !paused.is_empty() {
        let total = m.cluster_count();
        let groups: Vec<String> = paused
            .iter()
            .map(|(why, names)| match names.len() {
                n if n == total && n > 1 => format!("all {n} clusters ({why})"),
                n if n > 3 => format!("{} and {} more ({why})", names[..3].join(", "), n - 3),
                _ => format!("{} ({why})", names.join(", ")),
            })
            .collect();
        notes.push(format!("paused: {}", groups.join(", ")));
    }
    let stale = m.waves.iter().flat_map(|w| &w.clusters).filter(|c| c.stale).count();
    if stale > 0 {
        notes.push(format!(
            "{stale} stale (not heard from within {} × its heartbeat interval or --stale-after)",
            super::heartbeat::STALE_FACTOR
        ));
    }
    if unverified > 0 {
        notes.push(format!(
            "{unverified} unverified status entr{} (not counted)",
            if unverified == 1 { "y" } else { "ies" }
        ));
    }
    if hidden > 0 {
        notes.push(format!("{hidden} older release{} not shown (-o json has all)", if hidden == 1 { "" } else { "s" }));
    }
    for l in wrap(&notes.join(" · "), opts.width, 0) {
        let _ = writeln!(out, "{l}");
    }
    out
}

/// `variant eu: ` before a status's description, when the cluster ran a variant.
fn variant_of(s: &Status) -> String {
    s.variant.as_deref().map(|v| format!("variant {v}: ")).unwrap_or_default()
}

/// One release in detail: per cluster its state and description, or — where it has not reported
/// yet — whether it may start and why.
pub fn render_release(m: &Matrix, release: &str, opts: RenderOptions) -> Option<String> {
    let idx = m.releases.iter().position(|r| r.id == release)?;
    let col = &m.releases[idx];
    let mut out = String::new();
    let rev: String = col.commit.chars().take(7).collect();
    let head = format!("release {} · commit {rev} · {}", col.id, col.summary.sentence());
    for l in wrap(&head, opts.width, 2) {
        let _ = writeln!(out, "{l}");
    }
    let name_w = name_width(m, opts.width);
    const STATE_W: usize = 8;
    // How long ago the cluster said it (exact with `-o wide`), before what it said.
    let age_w = opts.time_width();
    let desc_at = name_w + STATE_W + age_w + 6;
    let desc_w = opts.width.saturating_sub(desc_at).max(10);
    let header =
        format!("{}  {}  {}  DESCRIPTION", pad("CLUSTER", name_w), pad("STATE", STATE_W), pad("REPORTED", age_w));
    let _ = writeln!(out, "\n{}", if opts.colours { header.bold().to_string() } else { header });
    for wave in &m.waves {
        let _ = writeln!(out, "{}", wave_heading(wave, opts));
        for row in &wave.clusters {
            let cell = &row.cells[idx];
            let description = match (&cell.status, &cell.gate, &row.desired_release) {
                (Some(s), Some(g), _) if !g.allowed => format!("{}{} ({})", variant_of(s), s.description, g.reason),
                (Some(s), _, _) => format!("{}{}", variant_of(s), s.description),
                (None, _, _) if cell.desired && row.paused.is_some() => row.paused.clone().unwrap_or_default(),
                (None, Some(g), _) if g.allowed => format!("may start: {}", g.reason),
                (None, Some(g), _) => g.reason.clone(),
                (None, None, Some(other)) => format!("not targeted: desires {other}"),
                (None, None, None) => "not targeted: no desired release".to_string(),
            };
            let text = cell.shown_state();
            // Descriptions carry the figures that matter ("7.3 % > 5 %"): wrap them, never cut.
            let mut lines: Vec<String> = wrap(&description, desc_w, 0);
            for u in &cell.unverified {
                let claim = format!(
                    "unverified {} \"{}\" (reportedAt {}): {}",
                    u.status.state,
                    u.status.description,
                    u.status.reported_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    u.reason
                );
                lines.extend(wrap(&claim, desc_w, 2));
            }
            let mut lines = lines.into_iter();
            let reported = match &cell.status {
                Some(s) => opts.when(Some(s.reported_at)),
                None => "—".to_string(),
            };
            let _ = writeln!(
                out,
                "{}  {}{}  {}  {}",
                pad(&format!("  {}", truncate(&row.name, name_w - 2)), name_w),
                paint(text, cell.state, opts.colours),
                " ".repeat(STATE_W.saturating_sub(text.chars().count())),
                pad(&reported, age_w),
                lines.next().unwrap_or_default()
            );
            for more in lines {
                let _ = writeln!(out, "{}{more}", " ".repeat(desc_at));
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Document, FleetSpec, OperatorIdentity, RolloutSettings};

    fn fleet() -> Fleet {
        Document::new(
            "Fleet",
            "redis-fleet",
            FleetSpec {
                operator: OperatorIdentity {
                    name: "redis-operator".into(),
                    namespace: "redis-system".into(),
                    image: None,
                },
                release: Some("rel-20250315-001".into()),
                waves: vec!["canary".into(), "early".into(), "prod".into()],
                rollout: RolloutSettings { max_failed_clusters: 2 },
                promotions: Default::default(),
                status: Default::default(),
                paused: false,
            },
        )
    }

    fn releases(n: usize) -> Vec<ReleaseRef> {
        (0..n)
            .map(|i| ReleaseRef {
                id: format!("rel-202503{:02}-001", 15 - i),
                commit: format!("{i:040x}"),
                created_at: None,
            })
            .collect()
    }

    /// When the example's newest statuses were written; renderings look from 3 minutes later.
    fn t0() -> DateTime<Utc> {
        "2025-03-15T12:00:00Z".parse().unwrap()
    }

    fn example() -> Matrix {
        let members = vec![
            Member::new("cluster-a", "canary", Some("rel-20250315-001")),
            Member::new("cluster-b", "canary", Some("rel-20250315-001")),
            Member::new("eu-west-prod-1", "prod", Some("rel-20250315-001")),
            Member::new("us-east-prod-2", "prod", Some("rel-20250314-001")),
            Member::new("cluster-c", "early", Some("rel-20250315-001")),
        ];
        let rels = releases(8);
        let mut set = StatusSet::new();
        // Older releases were reported earlier, in the agents' order and on their clocks.
        let mut put = |c: &str, r: usize, st: State, d: &str| {
            let mut s = Status::new(c, &rels[r].id, &rels[r].commit, st, d);
            (s.sequence, s.reported_at) = (Some(100 - r as u64), t0() - chrono::Duration::hours(r as i64));
            if st == State::Failure {
                s.rollback_to = Some(rels[1].id.clone());
            }
            set.insert(s);
        };
        put("cluster-a", 0, State::Success, "all 4 gates passed over 10m bake");
        put("cluster-b", 0, State::Failure, "rolled back to rel-20250314-001: error-rate 7.3 % > 5 %");
        for r in 1..8 {
            for c in ["cluster-a", "cluster-b", "cluster-c", "eu-west-prod-1", "us-east-prod-2"] {
                put(c, r, State::Success, "all gates passed");
            }
        }
        let origin = Origin { branch: "main".into(), revision: "0123456789abcdef".into() };
        Matrix::build(&fleet(), &members, &rels, set, &origin, Utc::now())
    }

    fn plain(width: usize) -> RenderOptions {
        RenderOptions { width, colours: false, now: t0() + chrono::Duration::minutes(3), exact_times: false }
    }

    #[test]
    fn paused_clusters_are_marked_from_git_and_from_their_agents_status() {
        let rels = releases(1);
        let members = vec![
            Member { paused: Some("fleet.yaml spec.paused".into()), ..Member::new("a", "canary", Some(&rels[0].id)) },
            Member::new("b", "canary", Some(&rels[0].id)),
            Member::new("c", "canary", Some(&rels[0].id)),
        ];
        let mut set = StatusSet::new();
        let held =
            format!("{PAUSED_PREFIX}the agent's --paused flag: INC-7; holding {} here, running rel-0", rels[0].id);
        set.insert(Status::new("b", &rels[0].id, &rels[0].commit, State::Pending, &held));
        set.insert(Status::new("c", &rels[0].id, &rels[0].commit, State::Pending, "applying"));
        let origin = Origin { branch: "main".into(), revision: "0123456789abcdef".into() };
        let m = Matrix::build(&fleet(), &members, &rels, set, &origin, Utc::now());
        let paused: Vec<Option<&str>> = m.waves[0].clusters.iter().map(|c| c.paused.as_deref()).collect();
        assert_eq!(paused, [Some("fleet.yaml spec.paused"), Some("the agent's --paused flag: INC-7"), None]);
        let table = render_table(&m, plain(200));
        assert_eq!(table.matches("(paused)").count(), 2, "{table}");
        assert!(table.contains("paused: a (fleet.yaml spec.paused), b (the agent's --paused flag: INC-7)"), "{table}");
        let detail = render_release(&m, &rels[0].id, plain(100)).unwrap();
        assert!(detail.contains("fleet.yaml spec.paused"), "{detail}");
    }

    #[test]
    fn the_variant_each_cluster_ran_shows_in_its_cell_and_before_its_description() {
        let rels = releases(2);
        let members = vec![
            Member::new("a", "canary", Some(&rels[0].id)),
            Member::new("b", "canary", Some(&rels[0].id)),
            Member::new("c", "canary", Some(&rels[0].id)),
        ];
        let mut set = StatusSet::new();
        let ran = |c: &str, variant: Option<&str>| {
            Status::new(c, &rels[0].id, &rels[0].commit, State::Success, "all gates passed")
                .of_variant(variant.map(str::to_string))
        };
        set.insert(ran("a", Some("eu")));
        set.insert(ran("b", Some("us-east-mirror")));
        set.insert(ran("c", None));
        let origin = Origin { branch: "main".into(), revision: "0123456789abcdef".into() };
        let m = Matrix::build(&fleet(), &members, &rels, set, &origin, Utc::now());
        let table = render_table(&m, plain(120));
        let row = |name: &str| table.lines().find(|l| l.starts_with(&format!("  {name} "))).unwrap().to_string();
        assert!(row("a").contains("success* eu "), "{table}");
        assert!(row("b").contains("success* us-east-mirror "), "{table}");
        // The column is as wide as its widest cell: the next column starts at the same place.
        let next = |name: &str| row(name).find("—").unwrap();
        assert_eq!((next("a"), next("c")), (next("b"), next("b")), "{table}");
        let detail = render_release(&m, &rels[0].id, plain(100)).unwrap();
        assert!(detail.contains("variant eu: all gates passed"), "{detail}");
        assert!(detail.contains("  c ") && !detail.contains("variant : "), "{detail}");
    }

    fn names(m: &Matrix) -> Vec<(&str, &str)> {
        m.waves.iter().flat_map(|w| w.clusters.iter().map(move |c| (w.name.as_str(), c.name.as_str()))).collect()
    }

    #[test]
    fn failures_come_first_in_their_wave_and_the_rest_keep_name_order() {
        let mut m = example();
        m.select(&RowFilter::default(), None).unwrap();
        assert_eq!(
            names(&m),
            [
                ("canary", "cluster-b"),
                ("canary", "cluster-a"),
                ("early", "cluster-c"),
                ("prod", "eu-west-prod-1"),
                ("prod", "us-east-prod-2")
            ]
        );
        // Focused on the older release, where cluster-b succeeded: name order again.
        let mut m = example();
        m.select(&RowFilter::default(), Some("rel-20250314-001")).unwrap();
        assert_eq!(names(&m)[..2], [("canary", "cluster-a"), ("canary", "cluster-b")]);
    }

    #[test]
    fn a_cluster_unheard_past_its_allowance_is_stale_and_comes_first() {
        let now = t0() + chrono::Duration::minutes(10);
        let beat = |cluster: &str, ago: i64, interval_seconds: u64| {
            let at = now - chrono::Duration::minutes(ago);
            let beat = Heartbeat {
                fleet: "redis-fleet".into(),
                cluster: cluster.into(),
                at,
                interval_seconds,
                agent_version: "test".into(),
                signature: None,
            };
            (cluster.to_string(), beat)
        };
        // Every 2 minutes, so 6 minutes allowed: heard 1 minute ago, and 7 minutes ago.
        let beats: BTreeMap<String, Heartbeat> =
            [beat("eu-west-prod-1", 1, 120), beat("us-east-prod-2", 7, 120)].into_iter().collect();
        let mut m = example();
        m.judge_liveness(&beats, None, now);
        let row = |m: &Matrix, name: &str| {
            m.waves.iter().flat_map(|w| &w.clusters).find(|c| c.name == name).cloned().unwrap()
        };
        let eu = row(&m, "eu-west-prod-1");
        // The heartbeat is newer than its last status (an hour before t0): LAST SEEN is the beat.
        assert_eq!(
            (eu.last_seen, eu.stale, eu.stale_after_seconds),
            (Some(now - chrono::Duration::minutes(1)), false, Some(360))
        );
        let us = row(&m, "us-east-prod-2");
        assert_eq!((us.stale, us.heartbeat.map(|h| h.interval_seconds)), (true, Some(120)));
        // Without a heartbeat there is no allowance: cluster-c, silent for an hour, is not judged.
        let c = row(&m, "cluster-c");
        assert_eq!((c.stale, c.stale_after_seconds, c.heartbeat), (false, None, None));
        let mut shown = m.clone();
        shown.select(&RowFilter::default(), None).unwrap();
        assert_eq!(names(&shown)[3..], [("prod", "us-east-prod-2"), ("prod", "eu-west-prod-1")]);
        let mut only = m.clone();
        only.select(&RowFilter { states: vec!["stale".parse().unwrap()], ..Default::default() }, None).unwrap();
        assert_eq!(names(&only), [("prod", "us-east-prod-2")]);
        let table = render_table(&m, RenderOptions { now, ..plain(200) });
        assert!(table.lines().any(|l| l.contains("us-east-prod-2") && l.ends_with("(stale)")), "{table}");
        assert!(table.contains("1 stale (not heard from"), "{table}");
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["waves"][2]["clusters"][1]["stale"], true);
        assert_eq!(json["waves"][2]["clusters"][1]["heartbeat"]["at"], "2025-03-15T12:03:00Z");
        // A reader's own allowance applies to every cluster, with or without heartbeats.
        m.judge_liveness(&beats, Some(std::time::Duration::from_secs(30 * 60)), now);
        let stale: Vec<String> =
            m.waves.iter().flat_map(|w| &w.clusters).filter(|c| c.stale).map(|c| c.name.clone()).collect();
        assert_eq!(stale, ["cluster-c"]);
    }

    #[rstest::rstest]
    #[case(RowFilter { waves: vec!["prod".into()], ..Default::default() }, &["eu-west-prod-1", "us-east-prod-2"])]
    #[case(RowFilter { clusters: vec!["cluster-c".into(), "cluster-a".into()], ..Default::default() }, &["cluster-a", "cluster-c"])]
    #[case(RowFilter { states: vec![StateFilter::Is(State::Failure)], ..Default::default() }, &["cluster-b"])]
    // On its desired release: us-east-prod-2 succeeded on rel-…14 it is pinned to.
    #[case(RowFilter { states: vec!["success".parse().unwrap()], ..Default::default() }, &["cluster-a", "us-east-prod-2"])]
    #[case(RowFilter { states: vec!["not-started".parse().unwrap()], ..Default::default() }, &["cluster-c", "eu-west-prod-1"])]
    #[case(RowFilter { labels: vec![("region".into(), "eu".into())], ..Default::default() }, &["cluster-a", "eu-west-prod-1"])]
    // Criteria together: every one must hold.
    #[case(RowFilter { labels: vec![("region".into(), "eu".into())], waves: vec!["prod".into()], ..Default::default() }, &["eu-west-prod-1"])]
    #[case(RowFilter { states: vec![StateFilter::Is(State::Error)], ..Default::default() }, &[])]
    fn filters_keep_the_clusters_that_match_every_criterion(#[case] filter: RowFilter, #[case] expected: &[&str]) {
        let mut m = example();
        for row in m.waves.iter_mut().flat_map(|w| &mut w.clusters) {
            if ["cluster-a", "eu-west-prod-1"].contains(&row.name.as_str()) {
                row.labels.insert("region".into(), "eu".into());
            }
        }
        m.select(&filter, None).unwrap();
        let mut shown: Vec<&str> = names(&m).into_iter().map(|(_, c)| c).collect();
        shown.sort();
        assert_eq!(shown, expected);
        // Waves with nothing left are not shown.
        assert!(m.waves.iter().all(|w| !w.clusters.is_empty()));
    }

    #[test]
    fn filters_name_what_the_fleet_does_not_have() {
        let err = example().select(&RowFilter { waves: vec!["canery".into()], ..Default::default() }, None);
        assert_eq!(err.unwrap_err().to_string(), "no wave canery in this fleet; its waves: canary, early, prod");
        let err = example().select(&RowFilter { clusters: vec!["cluster-z".into()], ..Default::default() }, None);
        assert!(
            err.unwrap_err().to_string().starts_with("no cluster cluster-z in this fleet; its clusters: cluster-a")
        );
        assert_eq!("broken".parse::<StateFilter>(), Err(FilterError::State("broken".into())));
        assert_eq!(parse_label("tier=prod"), Ok(("tier".into(), "prod".into())));
        assert_eq!(parse_label("tier"), Err(FilterError::Label("tier".into())));
    }

    #[rstest::rstest]
    #[case(0, "0 s ago")]
    #[case(59, "59 s ago")]
    #[case(180, "3 m ago")]
    #[case(3_599, "59 m ago")]
    #[case(7_200, "2 h ago")]
    #[case(86_400 * 12 + 5, "12 d ago")]
    #[case(-120, "in 2 m")]
    fn ages_read_at_a_glance(#[case] secs: i64, #[case] expected: &str) {
        assert_eq!(age(t0(), t0() + chrono::Duration::seconds(secs)), expected);
    }

    #[test]
    fn rows_say_what_runs_and_when_the_agent_was_heard_from() {
        let m = example();
        let row = |name: &str| m.waves.iter().flat_map(|w| &w.clusters).find(|c| c.name == name).unwrap();
        // Rolled back from rel-…15 to rel-…14: runs the target, desires the failed one.
        let b = row("cluster-b");
        assert_eq!(
            (b.running.as_deref(), b.desired_release.as_deref()),
            (Some("rel-20250314-001"), Some("rel-20250315-001"))
        );
        assert_eq!(b.last_seen, Some(t0()));
        assert_eq!(row("cluster-a").running.as_deref(), Some("rel-20250315-001"));
        // Desires rel-…15, has not started it: still runs what succeeded last.
        let c = row("cluster-c");
        assert_eq!(
            (c.running.as_deref(), c.last_seen),
            (Some("rel-20250314-001"), Some(t0() - chrono::Duration::hours(1)))
        );
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["waves"][0]["clusters"][1]["running"], "rel-20250314-001");
        assert_eq!(v["waves"][0]["clusters"][1]["lastSeen"], "2025-03-15T12:00:00Z");

        let table = render_table(&m, plain(80));
        println!("{table}");
        assert!(table.contains("CLUSTER           RUNNING  LAST SEEN  …15-001"), "{table}");
        assert!(table.contains("  cluster-b       …14-001  3 m ago    failure*  success"), "{table}");
        assert!(table.contains("  cluster-c       …14-001  1 h ago    —*        success"), "{table}");
        let wide = render_table(&m, RenderOptions { exact_times: true, ..plain(300) });
        assert!(wide.contains("  cluster-b       rel-20250314-001  2025-03-15T12:00:00Z  failure*"), "{wide}");
    }

    #[test]
    fn each_cell_holds_the_latest_entry_of_its_release() {
        let rels = releases(2);
        let members = vec![Member::new("a", "canary", Some(&rels[0].id))];
        let mut set = StatusSet::new();
        let entry = |release: &ReleaseRef, sequence: u64, state: State| {
            let mut s = Status::new("a", &release.id, &release.commit, state, format!("{state} {sequence}"));
            s.sequence = Some(sequence);
            s
        };
        // Inserted out of order, and one on a release the view does not show.
        let gone = ReleaseRef { id: "rel-gone".into(), commit: "f".repeat(40), created_at: None };
        for s in
            [entry(&rels[0], 4, State::Failure), entry(&gone, 9, State::Success), entry(&rels[1], 2, State::Success)]
        {
            set.insert(s);
        }
        set.insert(entry(&rels[0], 3, State::Pending));
        set.insert(entry(&rels[1], 1, State::Pending));
        let origin = Origin { branch: "main".into(), revision: "0".repeat(40) };
        let m = Matrix::build(&fleet(), &members, &rels, set, &origin, Utc::now());
        let cells = &m.waves[0].clusters[0].cells;
        let shown: Vec<_> =
            cells.iter().map(|c| (c.state, c.status.as_ref().map(|s| s.description.as_str()))).collect();
        assert_eq!(shown, [(Some(State::Failure), Some("failure 4")), (Some(State::Success), Some("success 2"))]);
    }

    #[test]
    fn summary_sentences_read_naturally() {
        let s = Summary { clusters: 10, success: 7, failure: 1, pending: 2, ..Default::default() };
        assert_eq!(s.sentence(), "7/10 clusters success, 1 failure, 2 pending");
    }

    #[test]
    fn build_counts_and_gates() {
        let m = example();
        let newest = &m.releases[0].summary;
        assert_eq!((newest.clusters, newest.success, newest.failure, newest.not_started), (4, 1, 1, 2));
        let c = &m.waves[1].clusters[0];
        assert_eq!(c.name, "cluster-c");
        let gate = c.cells[0].gate.as_ref().unwrap();
        assert!(!gate.allowed);
        assert!(gate.reason.starts_with("blocked: cluster-b in earlier wave canary failed"), "{}", gate.reason);
        assert_eq!(m.waves.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(), ["canary", "early", "prod"]);
    }

    #[test]
    fn table_fits_80_columns_and_names_what_it_leaves_out() {
        let text = render_table(&example(), plain(80));
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "too wide: {line:?}");
        }
        assert!(text.contains("…15-001"), "{text}");
        assert!(text.contains("  cluster-b       …14-001  3 m ago    failure*  success"), "{text}");
        assert!(text.contains("rel-20250315-001  1/4 clusters success, 1 failure, 2 not started"), "{text}");
        assert!(text.contains("4 older releases\nnot shown (-o json has all)"), "{text}");
        println!("{text}");
    }

    #[test]
    fn wide_terminals_show_full_ids() {
        let text = render_table(&example(), plain(200));
        assert!(text.contains("rel-20250315-001  rel-20250314-001"), "{text}");
        assert!(!text.contains("not shown"), "{text}");
    }

    #[test]
    fn colours_only_when_asked() {
        assert!(!render_table(&example(), plain(80)).contains('\u{1b}'));
        let coloured = render_table(&example(), RenderOptions { colours: true, ..plain(80) });
        assert!(coloured.contains('\u{1b}'));
    }

    #[test]
    fn release_details_show_descriptions_and_gate_reasons() {
        let text = render_release(&example(), "rel-20250315-001", plain(80)).unwrap();
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "too wide: {line:?}");
        }
        // Wrapped under the description column, never cut.
        assert!(
            text.contains(
                "  cluster-b       failure   3 m ago    rolled back to rel-20250314-001:\n                                       error-rate 7.3 % > 5 %\n"
            ),
            "{text}"
        );
        assert!(text.contains("  cluster-c       —         —          blocked: cluster-b"), "{text}");
        assert!(text.contains("blocked: cluster-b in earlier wave canary"), "{text}");
        assert!(text.contains("not targeted: desires rel-20250314-001"), "{text}");
        assert!(render_release(&example(), "rel-0", plain(80)).is_none());
        println!("{text}");
    }

    #[test]
    fn only_keeps_one_release() {
        let m = example().only("rel-20250314-001").unwrap();
        assert_eq!(m.releases.len(), 1);
        assert!(m.waves.iter().flat_map(|w| &w.clusters).all(|c| c.cells.len() == 1));
    }

    /// Every string of a matrix with every field filled is visited: after the visit, the only
    /// strings left in its JSON are the ones serde makes of states and times.
    #[test]
    fn every_string_of_the_matrix_is_visited() {
        let mut m = example();
        m.waves[0].settings = Some("tier=canary".into());
        let row = &mut m.waves[0].clusters[0];
        row.paused = Some("INC-7".into());
        let cell = &mut row.cells[0];
        cell.gate = Some(Decision {
            allowed: false,
            reason: "r".into(),
            waits_for: vec!["w".into()],
            retry_at: Some(Utc::now()),
        });
        let status = cell.status.as_mut().unwrap();
        status.gates.push(GateFigure {
            name: "g".into(),
            observed: "o".into(),
            threshold: "t".into(),
            verdict: "v".into(),
        });
        (status.rollback_to, status.target_url, status.fleet) = (Some("r".into()), Some("u".into()), Some("f".into()));
        (status.started_at, status.applied_at, status.decided_at) =
            (Some(Utc::now()), Some(Utc::now()), Some(Utc::now()));
        (status.sequence, status.signature) = (Some(1), Some("s".into()));
        status.approval =
            Some(ApprovalRecord { by: "b".into(), why: "\u{1b}[2J".into(), wave: "w".into(), via: "v".into() });
        status.extra.insert("later".into(), serde_json::json!({"x": ["y", 1, null, {"z": "w"}]}));
        let unverified = UnverifiedEntry { verified: false, reason: "bad".into(), status: status.clone() };
        cell.unverified.push(unverified);
        m.releases[0].created_at = Some(Utc::now());

        m.for_each_text_mut(|s| *s = "·".into());
        fn strings<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
            match v {
                serde_json::Value::String(s) => out.push(s),
                serde_json::Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
                serde_json::Value::Object(map) => map.values().for_each(|v| strings(v, out)),
                _ => {}
            }
        }
        let v = serde_json::to_value(&m).unwrap();
        let mut left = Vec::new();
        strings(&v, &mut left);
        let states = ["pending", "success", "failure", "error", "unknown"];
        for s in left {
            assert!(s == "·" || states.contains(&s) || s.parse::<DateTime<Utc>>().is_ok(), "{s:?} not visited");
        }
        assert!(v.to_string().contains(r#""later":{"x":["·",1,null,{"z":"·"}]}"#), "{v}");
    }

    #[test]
    fn json_is_stable() {
        let m = example();
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["schema"], 1);
        assert_eq!(v["releases"][0]["summary"]["notStarted"], 2);
        assert_eq!(v["waves"][0]["clusters"][1]["cells"][0]["state"], "failure");
        assert_eq!(v["waves"][2]["clusters"][0]["cells"][0]["gate"]["allowed"], false);
        let back: Matrix = serde_json::from_value(v).unwrap();
        assert_eq!(back, m);
    }
}
