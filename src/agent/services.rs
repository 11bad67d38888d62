//! [`AgentServices`]: everything the reconcile loop needs besides the pipeline stages, started in
//! one call from an [`AgentConfig`] — Kubernetes client, state store (loaded), leader election,
//! triggers (poll, webhook, ref watcher), metrics, Events, notifier, the heartbeat and the HTTP
//! server — and stopped in one call, releasing the Lease so a standby takes over at once.

use super::config::AgentConfig;
use super::events::EventRecorder;
use super::lease::{LeaderElector, LeaderHandle, LeaseConfig};
use super::metrics::Metrics;
use super::notifier::{Notifier, NotifyError};
use super::server::{Health, HttpServer, ServerError, ServerState, WebhookConfig};
use super::state::{StateError, StateStore};
use super::triggers::{RefWatcher, TriggerError, TriggerSender, Triggers, Wake};
use crate::model::error_chain;
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] super::config::ConfigError),
    #[error("agent state (is the state namespace created and does the agent's RBAC allow configmaps there?)")]
    State(#[source] StateError),
    /// The state or its key refused as not the agent's own: no RBAC hint, the error says it all.
    #[error(transparent)]
    StateRefused(StateError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Watch(#[from] TriggerError),
    #[error(transparent)]
    Notifier(#[from] NotifyError),
    #[error("the forge given with --forge-* cannot be used")]
    Forge(#[from] crate::status::ForgeError),
    #[error("this cluster's status key")]
    Identity(#[from] super::identity::IdentityError),
    #[error(
        "no fleet name given and none pinned in the state ConfigMap {configmap}: pass --fleet NAME (`fleet:` in the \
         config file), the metadata.name of the fleet repo's fleet.yaml; or --pin-first-fleet to take the name of the \
         first release this agent accepts, which lets whoever pushes first choose it (docs/SECURITY.md)"
    )]
    FleetNotGiven { configmap: String },
}

impl From<StateError> for StartError {
    fn from(e: StateError) -> StartError {
        if e.is_unauthenticated() { StartError::StateRefused(e) } else { StartError::State(e) }
    }
}

/// The running infrastructure of one agent. Fields are public so the loop can borrow them
/// independently (`&mut services.triggers` while reading `services.store`).
pub struct AgentServices {
    pub config: AgentConfig,
    pub client: kube::Client,
    /// Loaded once at start; the loop reads and changes state through it.
    pub store: StateStore,
    pub leader: LeaderHandle,
    pub triggers: Triggers,
    /// For anything else that should wake the loop.
    pub trigger_sender: TriggerSender,
    pub metrics: Arc<Metrics>,
    pub events: EventRecorder,
    /// None without `--notify-url`.
    pub notifier: Option<Notifier>,
    /// Signs this cluster's status entries (and only this cluster's).
    pub status_signer: crate::status::StatusSigner,
    /// Seals the state and the status outbox ([`StateStore::key`]).
    pub state_key: crate::apply::AgentKey,
    pub health: Health,
    server: HttpServer,
    _ref_watcher: Option<RefWatcher>,
    annotation_watch: tokio::task::JoinHandle<()>,
    /// None with heartbeats off; stops when dropped.
    _heartbeat: Option<super::heartbeat::Heartbeating>,
    leader_gauge: tokio::task::JoinHandle<()>,
    /// The one pending [`Self::wake_at`], and when it fires.
    wake_timer: Option<(chrono::DateTime<chrono::Utc>, tokio::task::JoinHandle<()>)>,
}

impl AgentServices {
    /// Connects to the cluster, loads (or creates) the state ConfigMap, starts leader election,
    /// the triggers and the HTTP server. Fails early, with what to fix, when any of them cannot start.
    pub async fn start(config: AgentConfig) -> Result<AgentServices, StartError> {
        let client = config.kube.client().await?;
        let status_signer = super::identity::load_or_create(
            &client,
            &config.state_namespace,
            &config.cluster,
            config.status_key.as_deref(),
        )
        .await?;
        let store = StateStore::new(client.clone(), &config.state_namespace, &config.cluster);
        let state = store.load().await?;
        let state_key = store.key().await?;
        // Without a name, the first tip this agent reads would choose the fleet: a pusher could
        // make a fresh agent adopt another fleet's releases signed by the same key.
        if config.fleet.is_none() && state.trust().fleet.is_none() && !config.pin_first_fleet {
            return Err(StartError::FleetNotGiven { configmap: store.name().to_string() });
        }
        let metrics = Arc::new(Metrics::new(&config.cluster));
        metrics.observe_state(&state);

        let leader = match &config.leader_election {
            Some(settings) => LeaderElector::new(
                client.clone(),
                LeaseConfig {
                    namespace: config.state_namespace.clone(),
                    name: config.lease_name(),
                    identity: config.identity.clone(),
                    lease_duration: settings.lease_duration,
                },
            )
            .spawn(),
            None => LeaderHandle::always_leading(),
        };
        let leader_gauge = {
            let mut rx = leader.subscribe();
            let metrics = metrics.clone();
            tokio::spawn(async move {
                loop {
                    metrics.set_leader(rx.borrow_and_update().is_leading());
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            })
        };

        let (triggers, trigger_sender) = Triggers::new(config.interval);
        let ref_watcher = match config.repo.local_path() {
            Some(path) => {
                let watcher = RefWatcher::start(path, trigger_sender.clone())?;
                tracing::info!(watched = ?watcher.watched(), "watching the local repo's refs");
                Some(watcher)
            }
            None => None,
        };

        let annotation_watch = super::triggers::watch_annotations(
            kube::Api::namespaced(client.clone(), &config.state_namespace),
            store.name(),
            &[super::state::PAUSED_ANNOTATION, super::state::RECONCILE_REQUEST_ANNOTATION],
            trigger_sender.clone(),
        );

        let heartbeat = super::heartbeat::spawn(
            &config,
            config.fleet.clone().or_else(|| state.trust().fleet.clone()),
            status_signer.clone(),
            leader.subscribe(),
        );

        let health = Health::new(leader.subscribe());
        let webhook = WebhookConfig::with_secret_file(&config.branch, config.webhook_secret_file.as_deref())?;
        let server = HttpServer::start(
            config.listen,
            ServerState { metrics: metrics.clone(), health: health.clone(), triggers: trigger_sender.clone(), webhook },
        )
        .await?;

        let events = EventRecorder::new(client.clone(), &config.identity);
        if let Some(report) = store.take_migration_report()
            && let Ok(regarding) = store.object_ref().await
            && let Err(e) =
                events.publish(&regarding, super::state::Severity::Warning, "StateMigrated", "Load", &report).await
        {
            tracing::warn!(error = %error_chain(&e), "could not record an Event");
        }
        let notifier = (!config.notify.is_empty())
            .then(|| Notifier::new(config.notify.clone(), &config.cluster, config.notify_timeout))
            .transpose()?
            .map(|n| n.counting(metrics.notifications()));
        // Obtains the token once now, so a missing Secret (or a GitHub App that cannot mint) stops the Pod at start, not at the first
        // status; each status reads it again (a rotated token is picked up).
        if let Some(forge) = &config.forge {
            crate::status::ForgeBackend::from_config(forge).await?;
        }
        Ok(AgentServices {
            config,
            client,
            store,
            leader,
            triggers,
            trigger_sender,
            metrics,
            events,
            notifier,
            status_signer,
            state_key,
            health,
            server,
            _ref_watcher: ref_watcher,
            wake_timer: None,
            annotation_watch,
            _heartbeat: heartbeat,
            leader_gauge,
        })
    }

    /// Records a Warning Event on the state ConfigMap (a configuration problem someone must fix);
    /// failing to record it is only logged.
    pub async fn record_warning(&self, reason: &str, action: &str, note: &str) {
        self.record(super::state::Severity::Warning, reason, action, note).await;
    }

    /// Records a Normal Event on the state ConfigMap (a deliberate state, such as a pause).
    pub async fn record_normal(&self, reason: &str, action: &str, note: &str) {
        self.record(super::state::Severity::Normal, reason, action, note).await;
    }

    async fn record(&self, severity: super::state::Severity, reason: &str, action: &str, note: &str) {
        let recorded = match self.store.object_ref().await {
            Ok(regarding) => {
                self.events.publish(&regarding, severity, reason, action, note).await.map_err(|e| error_chain(&e))
            }
            Err(e) => Err(error_chain(&e)),
        };
        if let Err(e) = recorded {
            tracing::warn!(error = %e, reason, "could not record an Event");
        }
    }

    /// The address the HTTP server listens on (useful with `--listen 127.0.0.1:0`).
    pub fn http_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Wakes the loop at `at` (a wave gate that opens with time), sooner than the next poll would;
    /// a later call replaces the pending one, so a gate waited on every poll keeps one timer.
    pub fn wake_at(&mut self, at: chrono::DateTime<chrono::Utc>) {
        if self.wake_timer.as_ref().is_some_and(|(t, h)| *t == at && !h.is_finished()) {
            return;
        }
        if let Some((_, h)) = self.wake_timer.take() {
            h.abort();
        }
        let sender = self.trigger_sender.clone();
        let wait = (at - chrono::Utc::now()).to_std().unwrap_or_default();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            sender.fire(super::triggers::TriggerSource::Timer);
        });
        self.wake_timer = Some((at, timer));
    }

    /// Waits for the next wake-up and counts its sources in `fleetgate_triggers_total`.
    pub async fn next_wake(&mut self) -> Wake {
        let wake = self.triggers.next().await;
        for source in &wake.sources {
            self.metrics.record_trigger(*source);
        }
        wake
    }

    /// Releases the Lease (a standby takes over at once) and stops the HTTP server.
    pub async fn shutdown(self) {
        self.leader.step_down().await;
        self.leader_gauge.abort();
        self.annotation_watch.abort();
        self.server.stop().await;
    }
}
