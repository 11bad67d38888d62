//! The status outbox: ConfigMap `fleetgate-outbox-<cluster>` in the state namespace, key
//! `statuses` (a JSON list, oldest first) — the statuses that could not be written to Git when
//! they were made (the Git server out of reach, typically during the rollback that most needs
//! reporting). The agent publishes them in order once Git answers again; kept in the cluster, so
//! a restarted agent (a fresh Git cache) still has them.
//!
//! Bounded by [`OUTBOX_CAPACITY`]: when full, the oldest `pending` entry goes first (a later
//! entry of the same release says more), else the oldest entry; each drop is logged.
//!
//! Authenticated: the agent signs a status only when it delivers it, so an entry anyone with
//! ConfigMap write could add would be signed as this cluster's word. Each entry carries
//! `hmacSha256`, HMAC-SHA256 under the agent's state key ([`super::StateStore::key`]) of the
//! outbox's namespace, name and the status as JSON. An entry whose MAC does not verify (an
//! earlier agent's unsealed entry included) is never delivered: [`Outbox::load`] drops it and
//! returns it as [`Refused`] for the caller to report.

use super::store::StateError;
use crate::apply::AgentKey;
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
const MAC_DOMAIN: &str = "fleetgate outbox v1";

/// One stored entry: the status and its MAC.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Sealed {
    status: Status,
    #[serde(rename = "hmacSha256")]
    mac: String,
}

/// An entry of the outbox that was not delivered because it is not the agent's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// What the entry says, as far as it can be read (`release state: description`).
    pub entry: String,
    pub reason: String,
}

/// The outbox of one cluster's agent.
#[derive(Debug, Clone)]
pub struct Outbox {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    key: AgentKey,
}

impl Outbox {
    /// The outbox of `cluster`'s agent, sealed with `key` (the state's, [`super::StateStore::key`]).
    pub fn new(client: Client, namespace: &str, cluster: &str, key: AgentKey) -> Outbox {
        Outbox {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: format!("fleetgate-outbox-{cluster}"),
            key,
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

    /// The ConfigMap, its verified statuses and its refused entries.
    async fn read(&self) -> Result<Option<(ConfigMap, Vec<Status>, Vec<Refused>)>, StateError> {
        let Some(cm) = self.api.get_opt(&self.name).await.map_err(self.kube("reading"))? else { return Ok(None) };
        let text = cm.data.as_ref().and_then(|d| d.get(KEY)).map_or("[]", String::as_str);
        let (statuses, refused) = open(&self.key, &self.namespace, &self.name, text).map_err(|problem| {
            StateError::Corrupt { namespace: self.namespace.clone(), name: self.name.clone(), problem }
        })?;
        Ok(Some((cm, statuses, refused)))
    }

    /// The waiting statuses, oldest first, and the entries refused because their MAC does not
    /// verify — taken out of the outbox now, for the caller to report; they are never delivered.
    pub async fn load(&self) -> Result<(Vec<Status>, Vec<Refused>), StateError> {
        let Some((_, statuses, refused)) = self.read().await? else { return Ok(Default::default()) };
        if !refused.is_empty() {
            // Every write keeps only the verified entries.
            self.change(|_| {}).await?;
        }
        Ok((statuses, refused))
    }

    /// Changes the list of verified statuses under optimistic concurrency (the ConfigMap's
    /// resourceVersion); refused entries are left out of what is written.
    async fn change(&self, f: impl Fn(&mut Vec<Status>)) -> Result<(), StateError> {
        for _ in 0..ATTEMPTS {
            let (existing, mut statuses) = match self.read().await? {
                Some((cm, s, _)) => (Some(cm), s),
                None => (None, Vec::new()),
            };
            f(&mut statuses);
            let sealed: Vec<Sealed> =
                statuses.iter().map(|s| seal(&self.key, &self.namespace, &self.name, s)).collect();
            let data = BTreeMap::from([(KEY.to_string(), serde_json::to_string(&sealed).expect("statuses serialize"))]);
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

/// What an entry's MAC covers: the outbox's `namespace` and `name`, and the status as JSON.
fn mac_parts<'a>(namespace: &'a str, name: &'a str, json: &'a [u8]) -> [&'a [u8]; 3] {
    [namespace.as_bytes(), name.as_bytes(), json]
}

fn seal(key: &AgentKey, namespace: &str, name: &str, status: &Status) -> Sealed {
    let json = serde_json::to_vec(status).expect("statuses serialize");
    Sealed { status: status.clone(), mac: key.mac(MAC_DOMAIN, &mac_parts(namespace, name, &json)) }
}

/// The entries of `text` (outbox `namespace/name`) whose MAC verifies, and the others, refused.
fn open(key: &AgentKey, namespace: &str, name: &str, text: &str) -> Result<(Vec<Status>, Vec<Refused>), String> {
    let entries: Vec<serde_json::Value> = serde_json::from_str(text).map_err(|e| format!("key {KEY}: {e}"))?;
    let mut statuses = Vec::new();
    let mut refused = Vec::new();
    for entry in entries {
        match serde_json::from_value::<Sealed>(entry.clone()) {
            Ok(sealed) => {
                let json = serde_json::to_vec(&sealed.status).expect("statuses serialize");
                if key.verify(MAC_DOMAIN, &mac_parts(namespace, name, &json), &sealed.mac) {
                    statuses.push(sealed.status);
                } else {
                    refused.push(Refused {
                        entry: describe(&sealed.status),
                        reason: "its hmacSha256 does not verify under the agent's state key: someone other than the \
                                 agent wrote it"
                            .into(),
                    });
                }
            }
            Err(_) => refused.push(Refused {
                entry: serde_json::from_value::<Status>(entry.clone())
                    .map_or_else(|_| entry.to_string(), |s| describe(&s)),
                reason: "it carries no hmacSha256 (written by an agent before the outbox was sealed, or by someone \
                         else)"
                    .into(),
            }),
        }
    }
    Ok((statuses, refused))
}

/// `rel-2 success: all gates passed`.
fn describe(status: &Status) -> String {
    format!("{} {}: {}", status.release, status.state.as_str(), status.description)
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

    /// What a ConfigMap writer without the key can put in the outbox is never taken as the
    /// agent's: an entry of an earlier agent (no MAC), an entry whose status was edited after
    /// sealing, one sealed under another key, one copied from another outbox.
    #[test]
    fn only_entries_sealed_by_the_agent_are_waiting() {
        let key = AgentKey::from_bytes(vec![7; 32]);
        let (ns, name) = ("fleetgate-system", "fleetgate-outbox-cluster-a");
        let real = status("rel-1", State::Failure);
        let mut edited = seal(&key, ns, name, &status("rel-2", State::Failure));
        edited.status.state = State::Success;
        let entries = serde_json::json!([
            seal(&key, ns, name, &real),
            status("rel-3", State::Success),
            edited,
            seal(&AgentKey::from_bytes(vec![8; 32]), ns, name, &status("rel-4", State::Success)),
            seal(&key, ns, "fleetgate-outbox-cluster-b", &status("rel-5", State::Success)),
        ]);
        let (waiting, refused) = open(&key, ns, name, &entries.to_string()).unwrap();
        assert_eq!(waiting, [real]);
        let entries: Vec<&str> = refused.iter().map(|r| r.entry.as_str()).collect();
        assert_eq!(entries, ["rel-3 success: d", "rel-2 success: d", "rel-4 success: d", "rel-5 success: d"]);
        assert!(refused[0].reason.contains("carries no hmacSha256"), "{}", refused[0].reason);
        assert!(refused[1].reason.contains("does not verify"), "{}", refused[1].reason);
        assert!(open(&key, ns, name, "{").unwrap_err().contains("statuses"));
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
