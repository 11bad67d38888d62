//! What wakes the reconcile loop: the poll interval (±10 % jitter, so a fleet of agents does not hit
//! the Git server in step), `POST /hooks/git`, for a local-path repo a file-system watcher on the
//! repo's refs, and a watch on the agent's state ConfigMap for what people write on it
//! (`fleetgate reconcile`'s request, the pause annotation). All sources feed one [`Triggers`] receiver that coalesces them: however many fire
//! while the loop is busy (a push updating several refs, a webhook and the watcher for the same
//! push), the loop wakes once, with every source that fired listed in the [`Wake`].
//!
//! The poll deadline restarts after every wake, so a sync caused by a webhook also counts as the
//! poll: the loop syncs at least every interval, and not twice in a row for one change.

use crate::model::error_chain;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Jitter applied to every poll wait: ±10 %.
pub const POLL_JITTER: f64 = 0.10;
/// After the first event of a burst, wait this long for the rest before waking the loop.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TriggerSource {
    /// The first sync after start.
    Startup,
    /// The poll interval elapsed.
    Poll,
    /// `POST /hooks/git`.
    Webhook,
    /// The local repo's refs changed on disk.
    GitRefs,
    /// Someone annotated the state ConfigMap: `fleetgate reconcile`, or a pause set or lifted.
    Request,
    /// A wave gate that opens with time is due: a soak ended, a window opened.
    Timer,
}

impl TriggerSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerSource::Startup => "startup",
            TriggerSource::Poll => "poll",
            TriggerSource::Webhook => "webhook",
            TriggerSource::GitRefs => "git-refs",
            TriggerSource::Request => "request",
            TriggerSource::Timer => "timer",
        }
    }
}

/// One wake-up of the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wake {
    /// Every source that fired since the previous wake.
    pub sources: BTreeSet<TriggerSource>,
    /// When the earliest of them fired (for push-to-work latency).
    pub first_fired: Instant,
}

#[derive(Debug, Default)]
struct Pending {
    sources: BTreeSet<TriggerSource>,
    first_fired: Option<Instant>,
}

#[derive(Debug, Default)]
struct Shared {
    pending: Mutex<Pending>,
    notify: Notify,
}

/// Fires triggers; cheap to clone (the webhook handler and the watcher each hold one).
#[derive(Debug, Clone)]
pub struct TriggerSender {
    shared: Arc<Shared>,
}

impl TriggerSender {
    pub fn fire(&self, source: TriggerSource) {
        {
            let mut p = self.shared.pending.lock().expect("trigger lock poisoned");
            p.sources.insert(source);
            p.first_fired.get_or_insert_with(Instant::now);
        }
        // Stores a permit when the loop is not waiting, so no fire is lost.
        self.shared.notify.notify_one();
    }
}

/// The loop's receiving end.
#[derive(Debug)]
pub struct Triggers {
    shared: Arc<Shared>,
    interval: Duration,
    next_poll: Instant,
}

impl Triggers {
    /// A receiver polling every `interval` ±10 %, with [`TriggerSource::Startup`] already pending so
    /// the first [`next`](Self::next) returns at once.
    pub fn new(interval: Duration) -> (Triggers, TriggerSender) {
        let shared = Arc::new(Shared::default());
        let sender = TriggerSender { shared: shared.clone() };
        sender.fire(TriggerSource::Startup);
        let triggers = Triggers { shared, interval, next_poll: Instant::now() + jittered(interval, rand::random()) };
        (triggers, sender)
    }

    /// Waits for the next wake: a fired source (plus [`DEBOUNCE`] to gather its burst) or the poll
    /// deadline. Restarts the poll deadline. Cancel-safe: dropping the future loses no fired source.
    pub async fn next(&mut self) -> Wake {
        loop {
            let polled = tokio::select! {
                _ = self.shared.notify.notified() => {
                    // Dropped during the debounce (the caller's select! took another branch): give
                    // the permit back so the pending sources wake the next call.
                    let restore = RestorePermit(&self.shared.notify);
                    tokio::time::sleep(DEBOUNCE).await;
                    std::mem::forget(restore);
                    false
                }
                _ = tokio::time::sleep_until(self.next_poll) => true,
            };
            let now = Instant::now();
            let mut wake = {
                let mut p = self.shared.pending.lock().expect("trigger lock poisoned");
                Wake { sources: std::mem::take(&mut p.sources), first_fired: p.first_fired.take().unwrap_or(now) }
            };
            if polled {
                wake.sources.insert(TriggerSource::Poll);
            }
            // A fire during the previous debounce leaves a permit whose sources that wake already
            // took; such an empty wake is skipped.
            if !wake.sources.is_empty() {
                self.next_poll = now + jittered(self.interval, rand::random());
                return wake;
            }
        }
    }
}

struct RestorePermit<'a>(&'a Notify);

impl Drop for RestorePermit<'_> {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

/// `interval` scaled by a factor in [1 - 10 %, 1 + 10 %]; `unit` is uniform in [0, 1).
fn jittered(interval: Duration, unit: f64) -> Duration {
    interval.mul_f64(1.0 + POLL_JITTER * (2.0 * unit - 1.0))
}

#[derive(Debug, thiserror::Error)]
pub enum TriggerError {
    #[error("{path} is not a Git repository")]
    NotARepo { path: PathBuf, source: git2::Error },
    #[error("watching {path} for ref changes")]
    Watch { path: PathBuf, source: notify::Error },
}

/// Watches the state ConfigMap `name` and fires [`TriggerSource::Request`] whenever the
/// annotations people set on it (`keys`) change — not on the agent's own state writes. The watch
/// restarts with backoff when the API server drops it; the task ends when the sender's loop does.
pub fn watch_annotations(
    api: kube::Api<k8s_openapi::api::core::v1::ConfigMap>,
    name: &str,
    keys: &'static [&'static str],
    sender: TriggerSender,
) -> tokio::task::JoinHandle<()> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut last: Option<Vec<Option<String>>> = None;
        let mut objects = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
        while let Some(item) = objects.next().await {
            let cm = match item {
                Ok(cm) => cm,
                Err(e) => {
                    tracing::debug!(error = %error_chain(&e), "state ConfigMap watch");
                    continue;
                }
            };
            let annotations = cm.metadata.annotations.unwrap_or_default();
            let now: Vec<Option<String>> = keys.iter().map(|k| annotations.get(*k).cloned()).collect();
            // The first sight is the state at start, which the startup pass reads anyway.
            if last.as_ref().is_some_and(|l| *l != now) {
                tracing::info!(annotations = ?now, "state ConfigMap annotations changed");
                sender.fire(TriggerSource::Request);
            }
            last = Some(now);
        }
    })
}

/// Keeps a file-system watcher on a local repo's refs alive; dropping it stops watching.
pub struct RefWatcher {
    _watcher: notify::RecommendedWatcher,
    watched: Vec<PathBuf>,
}

impl RefWatcher {
    /// Watches `repo` (a work tree, a `.git` dir or a bare repo): `refs/` recursively, plus
    /// `packed-refs` and `HEAD`. Any change fires [`TriggerSource::GitRefs`]. Lock files and other
    /// files of the Git dir (index, objects) are ignored, so only ref updates wake the loop.
    pub fn start(repo: &Path, sender: TriggerSender) -> Result<RefWatcher, TriggerError> {
        use notify::{RecursiveMode, Watcher};
        let opened = git2::Repository::open(repo)
            .map_err(|source| TriggerError::NotARepo { path: repo.to_path_buf(), source })?;
        // Linked work trees keep HEAD in their own git dir and refs in the common dir.
        let git_dir = canonical(opened.path());
        let common_dir = canonical(opened.commondir());
        let refs = common_dir.join("refs");
        let filter = RefFilter { refs: refs.clone(), dirs: vec![git_dir.clone(), common_dir.clone()] };
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            Ok(event) if !event.kind.is_access() && event.paths.iter().any(|p| filter.matches(p)) => {
                tracing::debug!(paths = ?event.paths, "git refs changed");
                sender.fire(TriggerSource::GitRefs);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %error_chain(&e), "git refs watcher"),
        })
        .map_err(|source| TriggerError::Watch { path: repo.to_path_buf(), source })?;
        let mut watched = vec![(refs, RecursiveMode::Recursive), (common_dir.clone(), RecursiveMode::NonRecursive)];
        if git_dir != common_dir {
            watched.push((git_dir, RecursiveMode::NonRecursive));
        }
        for (path, mode) in &watched {
            watcher.watch(path, *mode).map_err(|source| TriggerError::Watch { path: path.clone(), source })?;
        }
        Ok(RefWatcher { _watcher: watcher, watched: watched.into_iter().map(|(p, _)| p).collect() })
    }

    /// The directories being watched.
    pub fn watched(&self) -> &[PathBuf] {
        &self.watched
    }
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Which changed paths are ref updates.
struct RefFilter {
    refs: PathBuf,
    /// Git dirs whose `HEAD` and `packed-refs` count.
    dirs: Vec<PathBuf>,
}

impl RefFilter {
    fn matches(&self, path: &Path) -> bool {
        // `git update-ref` writes `<ref>.lock` and renames it over `<ref>`; the rename's target is
        // the real change, the lock file alone is not (it may still be aborted).
        if path.extension().is_some_and(|e| e == "lock") {
            return false;
        }
        if path.starts_with(&self.refs) {
            return true;
        }
        let in_git_dir = path.parent().is_some_and(|parent| self.dirs.iter().any(|d| d == parent));
        in_git_dir && path.file_name().is_some_and(|n| n == "HEAD" || n == "packed-refs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(0.0, 9_000)]
    #[case(0.5, 10_000)]
    #[case(0.999_999_9, 10_999)]
    fn jitter_stays_within_ten_percent(#[case] unit: f64, #[case] millis: u128) {
        assert_eq!(jittered(Duration::from_secs(10), unit).as_millis(), millis);
    }

    #[rstest]
    #[case("/r/refs/heads/main", true)]
    #[case("/r/refs/tags/rel-1", true)]
    #[case("/r/refs/heads/main.lock", false)]
    #[case("/r/packed-refs", true)]
    #[case("/r/HEAD", true)]
    #[case("/r/index", false)]
    #[case("/r/objects/ab/cdef", false)]
    #[case("/r/logs/HEAD", false)]
    #[case("/w/HEAD", true)]
    fn ref_filter(#[case] path: &str, #[case] expected: bool) {
        let f = RefFilter { refs: "/r/refs".into(), dirs: vec!["/r".into(), "/w".into()] };
        assert_eq!(f.matches(Path::new(path)), expected);
    }

    #[tokio::test(start_paused = true)]
    async fn startup_fires_at_once_then_polls_with_jitter() {
        let (mut triggers, _sender) = Triggers::new(Duration::from_secs(10));
        let start = Instant::now();
        let wake = triggers.next().await;
        assert_eq!(wake.sources, BTreeSet::from([TriggerSource::Startup]));
        assert!(start.elapsed() <= DEBOUNCE + Duration::from_millis(1));
        let before = Instant::now();
        let wake = triggers.next().await;
        assert_eq!(wake.sources, BTreeSet::from([TriggerSource::Poll]));
        let waited = before.elapsed();
        assert!(waited >= Duration::from_secs(9) && waited <= Duration::from_secs(11), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_wakes_once_with_every_source() {
        let (mut triggers, sender) = Triggers::new(Duration::from_secs(10));
        triggers.next().await; // startup
        let fired = Instant::now();
        for _ in 0..5 {
            sender.fire(TriggerSource::GitRefs);
        }
        sender.fire(TriggerSource::Webhook);
        let wake = triggers.next().await;
        assert_eq!(wake.sources, BTreeSet::from([TriggerSource::Webhook, TriggerSource::GitRefs]));
        assert_eq!(wake.first_fired, fired);
        // Nothing left over: the next wake is the poll, about an interval later.
        let before = Instant::now();
        let wake = triggers.next().await;
        assert_eq!(wake.sources, BTreeSet::from([TriggerSource::Poll]));
        assert!(before.elapsed() >= Duration::from_secs(9));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fire_during_the_debounce_joins_that_wake_and_leaves_no_empty_wake() {
        let (mut triggers, sender) = Triggers::new(Duration::from_secs(10));
        triggers.next().await;
        sender.fire(TriggerSource::GitRefs);
        let late = sender.clone();
        let (wake, ()) = tokio::join!(triggers.next(), async move {
            tokio::time::sleep(DEBOUNCE / 2).await;
            late.fire(TriggerSource::Webhook);
        });
        assert_eq!(wake.sources, BTreeSet::from([TriggerSource::Webhook, TriggerSource::GitRefs]));
        let wake = triggers.next().await;
        assert_eq!(wake.sources, BTreeSet::from([TriggerSource::Poll]));
    }

    #[tokio::test(start_paused = true)]
    async fn cancelling_during_the_debounce_loses_nothing() {
        let (mut triggers, sender) = Triggers::new(Duration::from_secs(10));
        triggers.next().await;
        sender.fire(TriggerSource::Webhook);
        assert!(tokio::time::timeout(DEBOUNCE / 2, triggers.next()).await.is_err());
        let started = Instant::now();
        let wake = triggers.next().await;
        assert_eq!(wake.sources, BTreeSet::from([TriggerSource::Webhook]));
        assert!(started.elapsed() <= DEBOUNCE + Duration::from_millis(1));
    }

    #[tokio::test(start_paused = true)]
    async fn fires_while_busy_are_kept_for_the_next_wake() {
        let (mut triggers, sender) = Triggers::new(Duration::from_secs(10));
        triggers.next().await;
        // The loop is busy (not waiting) when these fire.
        sender.fire(TriggerSource::Webhook);
        tokio::time::sleep(Duration::from_secs(3)).await;
        sender.fire(TriggerSource::GitRefs);
        let wake = triggers.next().await;
        assert_eq!(wake.sources, BTreeSet::from([TriggerSource::Webhook, TriggerSource::GitRefs]));
    }
}
