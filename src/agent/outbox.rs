//! Status delivery through the outbox ([`super::state::outbox`]): a status that cannot reach Git
//! because Git is out of reach waits in the cluster and is written, in order, when Git answers
//! again — at the start of the next pass that can sync, or before the next status. The loop never
//! waits for it: a queued status is a Warning Event, and the pass goes on.
//!
//! A status is kept in the state ConfigMap with the step that decided it until it is written or
//! queued here ([`AgentState::unreported`](super::state::AgentState::unreported)); what an agent
//! killed in between left there is delivered at the start of the next agent's first pass.
//!
//! An outbox entry whose MAC does not verify ([`super::state::outbox`]) is never signed nor
//! written: it is dropped with an error log and a Warning Event `OutboxEntryRefused`.

use super::reconcile::Agent;
use super::state::{Outbox, StateError};
use crate::model::{error_chain, stop_point};
use crate::source::Checkout;
use crate::status::{NotesError, Publisher, Status, StatusBackend, StatusError};

/// What became of a status.
#[derive(Debug)]
pub(super) enum Delivery {
    Written,
    /// Git is out of reach; the status waits in the outbox (`why` says what failed).
    Queued {
        why: String,
    },
}

/// Whether `e` means the Git server could not be reached (worth waiting for), not that the
/// status itself cannot be written.
fn git_unreachable(e: &StatusError) -> bool {
    matches!(e, StatusError::Notes(NotesError::Push { .. } | NotesError::Fetch { .. }))
}

impl Agent {
    fn outbox(&self) -> Outbox {
        let config = &self.services.config;
        Outbox::new(
            self.services.client.clone(),
            &config.state_namespace,
            &config.cluster,
            self.services.state_key.clone(),
        )
    }

    /// The verified waiting statuses of `outbox`; entries refused as not the agent's own are
    /// reported (they were taken out of the outbox).
    async fn waiting(&self, outbox: &Outbox) -> Result<Vec<Status>, StateError> {
        let (waiting, refused) = outbox.load().await?;
        for r in refused {
            let note = format!(
                "dropped an entry of the status outbox {} ({}): {}; it is not delivered",
                outbox.name(),
                r.entry,
                r.reason
            );
            tracing::error!(outbox = outbox.name(), "{note}");
            self.services.record_warning("OutboxEntryRefused", "Deliver", &note).await;
        }
        Ok(waiting)
    }

    /// Writes the statuses waiting in `outbox` (oldest first) until one cannot reach Git;
    /// returns whether none is left waiting. A status Git refuses for another reason than being
    /// out of reach is dropped with a log line: retrying would not help, and it must not hold
    /// back the ones after it.
    async fn drain(&self, outbox: &Outbox, publisher: &Publisher, waiting: Vec<Status>) -> bool {
        for status in waiting {
            match publisher.publish(&status).await {
                Ok(()) => {
                    tracing::info!(release = %status.release, state = status.state.as_str(), "queued status written: {}", status.description)
                }
                Err(e) if git_unreachable(&e) => return false,
                Err(e) => {
                    tracing::error!(release = %status.release, error = %error_chain(&e), "dropping a queued status Git cannot take")
                }
            }
            if let Err(e) = outbox.pop(&status).await {
                tracing::warn!(error = %error_chain(&e), outbox = outbox.name(), "could not take a written status out of the outbox");
                return false;
            }
        }
        true
    }

    /// Writes `status` after the statuses already waiting, or queues it when Git is out of reach;
    /// then marks it to be taken out of the state's undelivered statuses by the next state write
    /// ([`Agent::delivered`]; whatever became of it: a refused status would be refused again, and
    /// retried later it could land after newer ones).
    ///
    /// # Errors
    /// The status could be neither written nor queued.
    pub(super) async fn deliver(&self, publisher: &Publisher, status: &Status) -> Result<Delivery, StatusError> {
        // Boxed: every step awaits this; inline, the futures of a pass outgrow a debug build's
        // test thread stack.
        let delivery = Box::pin(self.write_or_queue(publisher, status)).await;
        if matches!(delivery, Ok(Delivery::Written)) {
            stop_point::reached(&format!("status.{}.after-push", status.state.as_str())).await;
        }
        self.keep_delivered(vec![status.clone()]);
        delivery
    }

    /// The statuses delivered since the last state write, to take out of it with the next one.
    pub(super) fn take_delivered(&self) -> Vec<Status> {
        std::mem::take(&mut *self.delivered.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Puts back statuses a failed state write did not take out.
    pub(super) fn keep_delivered(&self, statuses: Vec<Status>) {
        self.delivered.lock().unwrap_or_else(|p| p.into_inner()).extend(statuses);
    }

    async fn write_or_queue(&self, publisher: &Publisher, status: &Status) -> Result<Delivery, StatusError> {
        let outbox = self.outbox();
        let waiting = match Box::pin(self.waiting(&outbox)).await {
            Ok(waiting) => waiting,
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), outbox = outbox.name(), "the status outbox is unreadable; writing without it");
                Vec::new()
            }
        };
        let failed = if waiting.is_empty() || self.drain(&outbox, publisher, waiting).await {
            match publisher.publish(status).await {
                Ok(()) => return Ok(Delivery::Written),
                Err(e) if git_unreachable(&e) => Some(e),
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let why = failed
            .as_ref()
            .map_or_else(|| "earlier statuses are still waiting for Git".to_string(), |e| error_chain(e));
        match outbox.push(status).await {
            Ok(()) => Ok(Delivery::Queued { why }),
            Err(queue) => {
                let queue = format!("could not queue the status in {}: {}", outbox.name(), error_chain(&queue));
                Err(failed.unwrap_or(StatusError::Interrupted(queue)))
            }
        }
    }

    /// Takes the delivered statuses out of the state's undelivered ones. Should this write fail,
    /// the state still holds them and the next pass delivers them again, which adds nothing to a
    /// note that already holds those entries.
    async fn flush_delivered(&self) {
        let delivered = self.take_delivered();
        if delivered.is_empty() {
            return;
        }
        let marked = self
            .services
            .store
            .update(|s| {
                delivered.iter().for_each(|d| s.reported(d));
                Ok(())
            })
            .await;
        if let Err(e) = marked {
            tracing::warn!(error = %error_chain(&e), "could not mark delivered statuses in the state");
        }
    }

    /// At the start of a pass: takes what this agent delivered out of the state, and delivers the
    /// statuses a step decided and persisted but that an agent killed right after never pushed
    /// nor queued (after the outbox's, which are older).
    pub(super) async fn deliver_unreported(&self, checkout: &Checkout) {
        self.flush_delivered().await;
        let unreported = match self.services.store.load().await {
            Ok(state) => state.unreported().to_vec(),
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "could not read the statuses left undelivered");
                return;
            }
        };
        if unreported.is_empty() {
            return;
        }
        let Ok(config) = self.config_at_tip(checkout) else { return };
        let publisher = self.publisher(&config).await;
        for status in unreported {
            match self.deliver(&publisher, &status).await {
                Ok(_) => {
                    tracing::info!(release = %status.release, state = status.state.as_str(), "status decided before a restart delivered: {}", status.description)
                }
                Err(e) => {
                    tracing::warn!(release = %status.release, error = %error_chain(&e), "a status decided before a restart is still undelivered");
                    break;
                }
            }
        }
        self.flush_delivered().await;
    }

    /// At the start of a pass whose sync reached Git: writes what the outbox holds.
    pub(super) async fn deliver_waiting(&self, checkout: &Checkout) {
        let outbox = self.outbox();
        let waiting = match Box::pin(self.waiting(&outbox)).await {
            Ok(w) if w.is_empty() => return,
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), outbox = outbox.name(), "the status outbox is unreadable");
                return;
            }
        };
        let Ok(config) = self.config_at_tip(checkout) else { return };
        let count = waiting.len();
        let publisher = self.publisher(&config).await;
        if self.drain(&outbox, &publisher, waiting).await {
            tracing::info!(count, "Git answers again: every queued status written");
        }
    }
}
