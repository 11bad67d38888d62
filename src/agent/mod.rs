//! The agent: the reconcile loop of one spoke cluster, its persisted state machine, automatic
//! rollback, triggers and HTTP endpoints.
//!
//! Infrastructure the loop is built on, each a small API of its own:
//!
//! * [`config`] — flags, environment and config file resolved into one validated [`AgentConfig`].
//! * [`state`] — [`AgentState`] (phases Idle → Verifying → Applying → Baking, or → RollingBack,
//!   each carrying its operation; current, last-known-good, rejected releases, tag pins) with pure
//!   transitions ([`state::machine`]), persisted by [`StateStore`] ([`state::store`]) in the
//!   ConfigMap `fleetgate-state-<cluster>` with optimistic concurrency.
//! * [`report`] — the pure function from each step of a pass to its report (transition, status,
//!   notification, write-back), which the loop in [`reconcile`] persists and writes.
//! * [`identity`] — the agent's own status key (a file, or a Secret generated on first start).
//! * `heartbeat` — the leader's signed heartbeat every `heartbeatInterval`, so readers tell a
//!   dead agent from an idle one.
//! * [`lease`] — leader election over a `coordination.k8s.io/v1` Lease.
//! * [`triggers`] — poll interval with jitter, webhook and ref watcher merged into one coalescing
//!   receiver.
//! * [`server`] — `/healthz`, `/readyz`, `/metrics`, `POST /hooks/git`.
//! * [`metrics`], [`events`], [`notifier`] — telling people: Prometheus, Kubernetes Events, and
//!   each release transition in the background to Slack, Teams or a signed webhook.
//! * `forge_mirror` — a status also on the promotion PR's head and the write-back commit, on the
//!   agent's forge.
//! * [`plans`] — spoke plans: after a pass, the open promotion pull requests that move this
//!   cluster, judged by its pre-apply checks and a dry run, posted as `fleetgate/plan/<cluster>`.
//! * [`services`] — starts and stops all of the above as one [`AgentServices`].
//! * [`process`] — the process the agent runs in: its tokio runtime and malloc settings.

pub mod config;
mod drift;
pub mod events;
mod forge_mirror;
mod heartbeat;
pub mod identity;
pub mod lease;
pub mod lkg;
pub mod metrics;
pub mod notifier;
mod outbox;
pub mod plans;
pub mod process;
pub mod reconcile;
pub mod report;
mod rollback;
pub mod server;
pub mod services;
pub mod state;
pub mod triggers;
pub mod write_back;

pub use config::{AgentConfig, AgentSettings};
pub use reconcile::{Agent, AgentStartError, Outcome, ReconcileError};
pub use services::AgentServices;
pub use state::{AgentState, StateStore};
