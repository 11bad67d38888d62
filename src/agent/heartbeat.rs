//! The agent's heartbeat: while this replica leads, every `heartbeatInterval` (and once at start)
//! it publishes the cluster's signed heartbeat ([`crate::status::heartbeat`]) from a small bare
//! repository of its own (`<stateDir>/heartbeat.git`), so a beat never touches the fleet mirror
//! the reconcile loop works in. A standby does not beat: liveness is the leader's.

use super::config::AgentConfig;
use super::lease::Leadership;
use crate::model::error_chain;
use crate::status::{GitRemote, HeartbeatError, StatusIdentity, heartbeat};
use std::time::Duration;
use tokio::sync::watch;

/// Starts the heartbeat task; `None` when heartbeats are off (`heartbeatInterval: 0s`) or the
/// fleet is not known yet (an agent pinning its first fleet beats from its next start).
pub fn spawn(
    config: &AgentConfig,
    fleet: Option<String>,
    signer: crate::status::StatusSigner,
    leader: watch::Receiver<Leadership>,
) -> Option<Heartbeating> {
    let interval = config.heartbeat_interval?;
    let Some(fleet) = fleet else {
        tracing::warn!("no heartbeat until the fleet is pinned: pass --fleet NAME");
        return None;
    };
    let remote = GitRemote::new(config.repo.url());
    let remote = match config.git_credentials.to_source() {
        Ok(creds) => remote.with_access(creds),
        Err(_) => remote,
    };
    let beater = Beater {
        repo_dir: config.state_dir.join("heartbeat.git"),
        remote,
        identity: StatusIdentity::new(fleet, signer),
        cluster: config.cluster.clone(),
        interval,
    };
    Some(Heartbeating(tokio::spawn(beater.run(leader))))
}

/// The running heartbeat task; dropping it (with the agent's services) stops the beats, so an
/// agent that is gone stops looking alive.
pub struct Heartbeating(tokio::task::JoinHandle<()>);

impl Drop for Heartbeating {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Beater {
    repo_dir: std::path::PathBuf,
    remote: GitRemote,
    identity: StatusIdentity,
    cluster: String,
    interval: Duration,
}

impl Beater {
    async fn run(self, mut leader: watch::Receiver<Leadership>) {
        let mut ticks = tokio::time::interval(self.interval);
        // A beat held up by a slow server is not made up for in a burst.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let beater = std::sync::Arc::new(self);
        loop {
            ticks.tick().await;
            // A standby beats from the moment it leads, not an interval later.
            if leader.wait_for(Leadership::is_leading).await.is_err() {
                return;
            }
            let b = beater.clone();
            match tokio::task::spawn_blocking(move || b.beat()).await {
                Ok(Ok(at)) => tracing::debug!(%at, "heartbeat published"),
                Ok(Err(e)) => {
                    tracing::warn!(error = %error_chain(&e), "heartbeat not published; trying again next interval")
                }
                Err(e) => tracing::warn!(error = %e, "heartbeat task failed"),
            }
        }
    }

    fn beat(&self) -> Result<chrono::DateTime<chrono::Utc>, HeartbeatError> {
        let repo = match git2::Repository::open_bare(&self.repo_dir) {
            Ok(repo) => repo,
            Err(_) => git2::Repository::init_bare(&self.repo_dir)?,
        };
        Ok(heartbeat::beat(&repo, &self.remote, &self.identity, &self.cluster, self.interval)?.at)
    }
}
