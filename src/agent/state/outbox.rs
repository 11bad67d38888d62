//! The status outbox: ConfigMap `fleetgate-outbox-<cluster>` in the state namespace, key
//! `statuses` (a JSON list, oldest first) — the statuses that could not be written to Git when
//! they were made (the Git server out of reach, typically during the rollback that most needs
//! reporting). The agent publishes them in order once Git answers again; kept in the cluster, so
//! a restarted agent (a fresh Git cache) still has them.
//!
//! Bounded by [`OUTBOX_CAPACITY`]: when full, the oldest `pending` entry goes first (a later
//! entry of the same release says more), else the oldest entry; each drop is logged.

use super::store::StateError;
use crate::status::{State, Status};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use std::collections::BTreeMap;

/// Statuses the outbox holds at most.
pub const OUTBOX_CAPACITY: usize = 100;
const KEY: &str = "statuses";
/// Attempts of a read-modify-write before giving up on a ConfigMap someone keeps changing.
const ATTEMPTS: u32 = 5;

/// The outbox of one cluster's agent.
#[derive(Debug, Clone)]
pub struct Outbox {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
}

impl Outbox {
    pub fn new(client: Client, namespace: &str, cluster: &str) -> Outbox {
        Outbox {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: format!("fleetgate-outbox-{cluster}"),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn kube(&self, action: &'static str) -> impl FnOnce(kube::Error) -> StateError + '_ {
        move |source| StateError::Kube {
            action,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: Box::new(source),
        }
    }

    async fn read(&self) -> Result<Option<(ConfigMap, Vec<Status>)>, StateError> {
        let Some(cm) = self.api.get_opt(&self.name).await.map_err(self.kube("reading"))? else { return Ok(None) };
        let text = cm.data.as_ref().and_then(|d| d.get(KEY)).map_or("[]", String::as_str);
        let statuses = serde_json::from_str(text).map_err(|e| StateError::Corrupt {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            problem: format!("key {KEY}: {e}"),
        })?;
        Ok(Some((cm, statuses)))
    }

    /// The waiting statuses, oldest first.
    pub async fn load(&self) -> Result<Vec<Status>, StateError> {
        Ok(self.read().await?.map(|(_, s)| s).unwrap_or_default())
    }

    /// Changes the list under optimistic concurrency (the ConfigMap's resourceVersion).
    async fn change(&self, f: impl Fn(&mut Vec<Status>)) -> Result<(), StateError> {
        for _ in 0..ATTEMPTS {
            let (existing, mut statuses) = match self.read().await? {
                Some((cm, s)) => (Some(cm), s),
                None => (None, Vec::new()),
            };
            f(&mut statuses);
            let data =
                BTreeMap::from([(KEY.to_string(), serde_json::to_string(&statuses).expect("statuses serialize"))]);
            let written = match existing {
                Some(mut cm) => {
                    cm.data = Some(data);
                    self.api.replace(&self.name, &PostParams::default(), &cm).await.map(drop)
                }
                None => {
                    let cm = ConfigMap {
                        metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                        data: Some(data),
                        ..Default::default()
                    };
                    self.api.create(&PostParams::default(), &cm).await.map(drop)
                }
            };
            match written {
                Ok(()) => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(self.kube("writing")(e)),
            }
        }
        Err(StateError::Contended { namespace: self.namespace.clone(), name: self.name.clone(), attempts: ATTEMPTS })
    }

    /// Queues `status` after the ones waiting.
    pub async fn push(&self, status: &Status) -> Result<(), StateError> {
        self.change(|statuses| {
            statuses.push(status.clone());
            bound(statuses);
        })
        .await
    }

    /// Removes the oldest waiting status, once it was written (`written` is that status).
    pub async fn pop(&self, written: &Status) -> Result<(), StateError> {
        self.change(|statuses| {
            if statuses.first() == Some(written) {
                statuses.remove(0);
            }
        })
        .await
    }
}

/// Drops entries beyond [`OUTBOX_CAPACITY`]: the oldest `pending` first, else the oldest.
fn bound(statuses: &mut Vec<Status>) {
    while statuses.len() > OUTBOX_CAPACITY {
        let at = statuses.iter().position(|s| s.state == State::Pending).unwrap_or(0);
        let dropped = statuses.remove(at);
        tracing::warn!(release = %dropped.release, state = dropped.state.as_str(), "status outbox full; dropping its oldest entry");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(release: &str, state: State) -> Status {
        Status::new("cluster-a", release, "0".repeat(40), state, "d")
    }

    #[test]
    fn a_full_outbox_drops_pending_before_verdicts() {
        let mut statuses: Vec<Status> =
            (0..OUTBOX_CAPACITY).map(|i| status(&format!("rel-{i}"), State::Failure)).collect();
        statuses.insert(3, status("rel-p", State::Pending));
        bound(&mut statuses);
        assert_eq!(statuses.len(), OUTBOX_CAPACITY);
        assert!(statuses.iter().all(|s| s.state == State::Failure));
        statuses.push(status("rel-last", State::Success));
        bound(&mut statuses);
        assert_eq!((statuses[0].release.as_str(), statuses.last().unwrap().release.as_str()), ("rel-1", "rel-last"));
    }
}
