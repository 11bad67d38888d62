//! Bounded waits for tests: each fails the test, naming what it waited for, when time runs out.

use std::future::Future;
use std::time::Duration;

/// Fails the test with `what` when `fut` takes longer than `secs`.
pub async fn within<T>(what: &str, secs: u64, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {secs}s: {what}"))
}

/// Polls `check` every 500 ms until it returns `Some`, failing the test with `what` after `secs`.
pub async fn eventually<T, F, Fut>(what: &str, secs: u64, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_every(what, secs, Duration::from_millis(500), check).await
}

/// [`eventually`], polling every `poll` (for a test that reports how long the wait took).
pub async fn eventually_every<T, F, Fut>(what: &str, secs: u64, poll: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    within(what, secs, async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(poll).await;
        }
    })
    .await
}
