//! Leader election over a `coordination.k8s.io/v1` Lease (`fleetgate-agent-<cluster>` in the state
//! namespace), so only one agent per cluster works at a time.
//!
//! The algorithm is client-go's: a candidate takes the Lease when it is free (no holder) or when
//! the record has not changed for `lease_duration` **as measured on the candidate's own monotonic
//! clock since it first saw that record** — never by comparing the holder's `renewTime` with local
//! wall time, so clock skew between nodes cannot cause two leaders. Every write carries the read
//! `resourceVersion`; a conflict means someone else wrote first.
//!
//! The leader renews every `lease_duration / 7` (about 2 s for the default 15 s). If it cannot
//! renew for `2/3` of the lease duration it steps down ([`Leadership::Unknown`]) — before any
//! standby may take over — and the reconcile loop must stop work (see [`LeaderHandle::until_not_leading`]).
//! On a graceful stop ([`LeaderHandle::step_down`]) the leader clears the holder so a standby takes
//! over at its next retry instead of waiting a full lease duration.

use crate::model::error_chain;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// Who leads, as far as this candidate knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    /// Not yet determined, or this candidate lost contact with the API server while leading.
    Unknown,
    /// This candidate holds the Lease: it may work.
    Leading,
    /// Another candidate holds the Lease (`holder`), or it is being handed over (`None`).
    Following { holder: Option<String> },
}

impl Leadership {
    pub fn is_leading(&self) -> bool {
        matches!(self, Leadership::Leading)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Unique per process (see `AgentConfig::identity`).
    pub identity: String,
    pub lease_duration: Duration,
}

impl LeaseConfig {
    /// How often the leader renews and a standby retries.
    pub fn retry_period(&self) -> Duration {
        self.lease_duration / 7
    }

    /// How long the leader keeps leading without a successful renewal.
    pub fn renew_deadline(&self) -> Duration {
        self.lease_duration * 2 / 3
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{action} Lease {namespace}/{name}")]
    Kube { action: &'static str, namespace: String, name: String, source: Box<kube::Error> },
    #[error("Lease {namespace}/{name}: the API server did not answer within {after:?}")]
    Timeout { namespace: String, name: String, after: Duration },
}

/// One candidate. [`try_acquire_or_renew`](Self::try_acquire_or_renew) is one round; [`spawn`](Self::spawn)
/// runs rounds in the background and publishes the outcome.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The holder record last seen and when (monotonic) it was first seen.
    observed: Option<(Record, Instant)>,
}

/// The parts of a Lease that change when its holder renews or changes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    duration_seconds: Option<i32>,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Record {
        Record {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            renew_time: spec.renew_time.clone(),
            duration_seconds: spec.lease_duration_seconds,
        }
    }
}

impl LeaderElector {
    pub fn new(client: Client, config: LeaseConfig) -> LeaderElector {
        LeaderElector { api: Api::namespaced(client, &config.namespace), config, observed: None }
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// One election round: creates the Lease if missing, renews it if held, takes it if free or
    /// expired, otherwise reports who holds it.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Leadership, LeaseError> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let Some(lease) = self.api.get_opt(&self.config.name).await.map_err(|e| self.kube_error("reading", e))? else {
            let spec = self.spec_held_since(now.clone(), 0);
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(spec.clone()),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.observed = Some((Record::of(&spec), Instant::now()));
                    Ok(Leadership::Leading)
                }
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(Leadership::Following { holder: None }),
                Err(e) => Err(self.kube_error("creating", e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = Record::of(&spec);
        let first_seen = match &self.observed {
            Some((seen, at)) if *seen == record => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((record.clone(), at));
                at
            }
        };
        let mine = record.holder.as_deref() == Some(self.config.identity.as_str());
        let their_duration = spec.lease_duration_seconds.map(|s| Duration::from_secs(s.max(0) as u64));
        let expired = first_seen.elapsed() >= their_duration.unwrap_or(self.config.lease_duration);
        if record.holder.is_some() && !mine && !expired {
            return Ok(Leadership::Following { holder: record.holder });
        }
        let new_spec = if mine {
            LeaseSpec { renew_time: Some(now), lease_duration_seconds: Some(self.duration_seconds()), ..spec }
        } else {
            let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(record.holder.is_some());
            LeaseSpec {
                preferred_holder: spec.preferred_holder,
                strategy: spec.strategy,
                ..self.spec_held_since(now, transitions)
            }
        };
        let updated = Lease { metadata: lease.metadata, spec: Some(new_spec.clone()) };
        match self.api.replace(&self.config.name, &PostParams::default(), &updated).await {
            Ok(_) => {
                if !mine {
                    tracing::info!(lease = %self.config.name, previous = ?record.holder, "acquired leadership");
                }
                self.observed = Some((Record::of(&new_spec), Instant::now()));
                Ok(Leadership::Leading)
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(Leadership::Following { holder: None }),
            Err(e) => Err(self.kube_error("updating", e)),
        }
    }

    /// Clears the holder if this candidate holds the Lease, so a standby takes over at once.
    pub async fn release(&mut self) -> Result<(), LeaseError> {
        let Some(lease) = self.api.get_opt(&self.config.name).await.map_err(|e| self.kube_error("reading", e))? else {
            return Ok(());
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let released = LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..spec
        };
        let updated = Lease { metadata: lease.metadata, spec: Some(released) };
        match self.api.replace(&self.config.name, &PostParams::default(), &updated).await {
            Ok(_) => Ok(()),
            // Someone else wrote first: the Lease is no longer ours to release.
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(()),
            Err(e) => Err(self.kube_error("releasing", e)),
        }
    }

    /// Runs election rounds every retry period in a background task until the handle steps down or
    /// is dropped. Dropping the handle stops renewing without releasing (like a crash).
    pub fn spawn(mut self) -> LeaderHandle {
        let (tx, rx) = watch::channel(Leadership::Unknown);
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let retry = self.config.retry_period();
            let deadline = self.config.renew_deadline();
            let mut last_renewal: Option<Instant> = None;
            loop {
                let round =
                    tokio::time::timeout(retry.max(Duration::from_millis(500)), self.try_acquire_or_renew()).await;
                let round = round.unwrap_or_else(|_| {
                    Err(LeaseError::Timeout {
                        namespace: self.config.namespace.clone(),
                        name: self.config.name.clone(),
                        after: retry,
                    })
                });
                match round {
                    Ok(Leadership::Leading) => {
                        last_renewal = Some(Instant::now());
                        tx.send_if_modified(|l| replace_if_changed(l, Leadership::Leading));
                    }
                    Ok(other) => {
                        if last_renewal.take().is_some() {
                            tracing::warn!(lease = %self.config.name, now = ?other, "lost leadership");
                        }
                        tx.send_if_modified(|l| replace_if_changed(l, other));
                    }
                    Err(e) => {
                        tracing::warn!(error = %error_chain(&e), "leader election round failed");
                        if last_renewal.is_some_and(|t| t.elapsed() >= deadline) {
                            tracing::warn!(lease = %self.config.name, "could not renew within {deadline:?}; stepping down");
                            last_renewal = None;
                            tx.send_if_modified(|l| replace_if_changed(l, Leadership::Unknown));
                        }
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(retry) => {}
                    _ = &mut stop_rx => {
                        tx.send_replace(Leadership::Unknown);
                        if let Err(e) = self.release().await {
                            tracing::warn!(error = %error_chain(&e), "releasing the Lease failed; a standby takes over after it expires");
                        }
                        return;
                    }
                }
            }
        });
        LeaderHandle { rx, stop: Some(stop_tx), task: Some(task) }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    fn spec_held_since(&self, now: MicroTime, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.duration_seconds()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    fn kube_error(&self, action: &'static str, source: kube::Error) -> LeaseError {
        LeaseError::Kube {
            action,
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source: Box::new(source),
        }
    }
}

fn replace_if_changed(current: &mut Leadership, new: Leadership) -> bool {
    if *current == new {
        false
    } else {
        *current = new;
        true
    }
}

/// The running election (or a fixed "always leading" when election is off). Cheap to query; the
/// reconcile loop waits for [`until_leading`](Self::until_leading) before working and races its work
/// against [`until_not_leading`](Self::until_not_leading).
#[derive(Debug)]
pub struct LeaderHandle {
    rx: watch::Receiver<Leadership>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl LeaderHandle {
    /// For `--leader-elect=false`: always leading.
    pub fn always_leading() -> LeaderHandle {
        let (tx, rx) = watch::channel(Leadership::Leading);
        // The receiver keeps the last value after the sender is gone.
        drop(tx);
        LeaderHandle { rx, stop: None, task: None }
    }

    pub fn current(&self) -> Leadership {
        self.rx.borrow().clone()
    }

    pub fn is_leading(&self) -> bool {
        self.rx.borrow().is_leading()
    }

    /// A receiver for observers (readiness, metrics).
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.rx.clone()
    }

    /// Resolves once this candidate leads (at once if it already does).
    pub async fn until_leading(&self) {
        let mut rx = self.rx.clone();
        // An error means the election task ended; its last value stays, so wait forever unless leading.
        if rx.wait_for(Leadership::is_leading).await.is_err() && !self.is_leading() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once this candidate no longer leads (never, with election off).
    pub async fn until_not_leading(&self) {
        let mut rx = self.rx.clone();
        if rx.wait_for(|l| !l.is_leading()).await.is_err() && self.is_leading() {
            std::future::pending::<()>().await;
        }
    }

    /// Stops renewing and releases the Lease if held, so a standby takes over at once.
    pub async fn step_down(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for LeaderHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
