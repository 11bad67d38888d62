//! The objects an apply can leave alone, and the records that prove it.
//!
//! For every object it writes, the engine records in the inventory what it sent (a SHA-256 of
//! the object, labels included) and what the server stored (uid and resourceVersion). An object
//! of the next release with the same hash whose live uid and resourceVersion are still the
//! recorded ones is exactly what applying it again would leave: the release asks for the same
//! fields, and nobody wrote the object since (every write — a drifting edit, a removed label, a
//! controller's status update — moves its resourceVersion; a deleted and re-created object has
//! another uid). Such an object is neither dry-run nor applied (reported
//! [`Action::Unchanged`](super::Action::Unchanged)), and the snapshot taken before the release
//! leaves it out: the release does not change it, so a restore has nothing to bring back.
//!
//! Everything else takes the full path (dry run, then a forced server-side apply): objects
//! without a record (new ones; an inventory written before records existed), changed ones,
//! written ones, and every custom resource of a CRD the release writes (their dry run checks
//! them against the new schema; see the `apply` module docs).
//!
//! The live versions come from one metadata LIST per kind and namespace, restricted to this
//! inventory's label, instead of one request per object.
//!
//! The records are authenticated by an HMAC under the agent key
//! ([`AgentKey`](super::AgentKey)): whoever may edit the inventory ConfigMap but cannot read the
//! agent key cannot make the engine skip an object they changed. Records that do not verify are
//! ignored (every object takes the full path) with a warning.

use super::phases::Resolver;
use super::{AgentKey, ApplyError, Engine, Inventory, LABEL_INVENTORY, kube_err};
use crate::manifests::{CRD_GROUP, CRD_KIND, Manifest, ManifestSet, ObjectKey};
use futures::{StreamExt, TryStreamExt, stream};
use kube::api::{ListParams, ObjectMeta};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// What the records' MAC is computed under (the agent key authenticates other stores too).
const RECORDS_DOMAIN: &str = "fleetgate applied records v1";

/// What fleetgate sent for one object and what the server stored.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedRecord {
    #[serde(flatten)]
    pub object: ObjectKey,
    /// SHA-256 (hex) of the object as applied.
    pub hash: String,
    pub uid: String,
    pub resource_version: String,
}

/// The records of an inventory with their MAC, as the inventory ConfigMap stores them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SealedRecords {
    /// Sorted by object.
    pub records: Vec<AppliedRecord>,
    /// Hex HMAC-SHA256 of the inventory id and the records; empty when there are none.
    pub mac: String,
}

impl SealedRecords {
    /// `records` sealed under `key` for inventory `inventory`.
    pub(crate) fn seal(key: &AgentKey, inventory: &str, records: impl IntoIterator<Item = AppliedRecord>) -> Self {
        let mut records: Vec<AppliedRecord> = records.into_iter().collect();
        records.sort();
        if records.is_empty() {
            return SealedRecords::default();
        }
        let mac = key.mac(RECORDS_DOMAIN, &[inventory.as_bytes(), &canonical(&records)]);
        SealedRecords { records, mac }
    }

    /// The records by object when their MAC verifies under `key`; None otherwise.
    pub(crate) fn verified(&self, key: &AgentKey, inventory: &str) -> Option<Records> {
        key.verify(RECORDS_DOMAIN, &[inventory.as_bytes(), &canonical(&self.records)], &self.mac)
            .then(|| self.records.iter().map(|r| (r.object.clone(), r.clone())).collect())
    }
}

/// The records' bytes the MAC covers: their JSON as this engine writes it.
fn canonical(records: &[AppliedRecord]) -> Vec<u8> {
    serde_json::to_vec(records).expect("records serialize")
}

/// Records by object.
pub(crate) type Records = BTreeMap<ObjectKey, AppliedRecord>;

/// SHA-256 (hex) of `m` as it is sent to the server.
pub(crate) fn object_hash(m: &Manifest) -> String {
    let digest = Sha256::digest(serde_json::to_vec(&m.object).expect("objects serialize"));
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl Engine {
    /// The records of `previous` of the objects of `set`, if they verify under `key` (the agent
    /// key, if it exists yet: without it no record verifies); else none.
    pub(crate) fn trusted_records(
        &self,
        set: &ManifestSet,
        previous: Option<&Inventory>,
        key: Option<&AgentKey>,
    ) -> Records {
        let (Some(previous), Some(key)) = (previous, key) else { return Records::new() };
        if previous.applied.records.is_empty() {
            return Records::new();
        }
        let Some(mut records) = previous.applied.verified(key, &self.options.inventory) else {
            tracing::warn!(
                inventory = %self.options.inventory,
                "the inventory's applied records do not verify under the agent key; every object is applied"
            );
            return Records::new();
        };
        records.retain(|k, _| set.get(k).is_some());
        records
    }

    /// The objects of `set` that applying it would leave as they are (see the module docs), with
    /// their records; `records` are the trusted ones ([`trusted_records`](Self::trusted_records)).
    pub(crate) async fn unchanged(
        &self,
        resolver: &Resolver,
        set: &ManifestSet,
        records: &Records,
    ) -> Result<Records, ApplyError> {
        if records.is_empty() {
            return Ok(Records::new());
        }
        let candidates: Vec<&Manifest> =
            set.iter().filter(|m| records.get(&m.key).is_some_and(|r| r.hash == object_hash(m))).collect();
        let live = self.live_versions(resolver, &candidates).await?;
        let mut unchanged: Records = candidates
            .iter()
            .filter_map(|m| {
                let r = &records[&m.key];
                (live.get(&m.key) == Some(&(r.uid.clone(), r.resource_version.clone())))
                    .then(|| (m.key.clone(), r.clone()))
            })
            .collect();
        // A custom resource is left alone only with its CRD, when the release has that CRD.
        let written_kinds: BTreeSet<(String, String)> = set
            .crds()
            .iter()
            .filter(|c| {
                let name = c.metadata.name.clone().unwrap_or_default();
                !unchanged.keys().any(|k| k.group == CRD_GROUP && k.kind == CRD_KIND && k.name == name)
            })
            .map(|c| (c.spec.group.clone(), c.spec.names.kind.clone()))
            .collect();
        unchanged.retain(|k, _| !written_kinds.contains(&(k.group.clone(), k.kind.clone())));
        Ok(unchanged)
    }

    /// The live (uid, resourceVersion) of those of `objects` that exist and carry this
    /// inventory's label: one metadata LIST per kind and namespace with more than one of them,
    /// a metadata GET for the others (cluster-scoped objects too: the shipped RBAC grants those
    /// by name, and LIST cannot be granted by name).
    async fn live_versions(&self, resolver: &Resolver, objects: &[&Manifest]) -> Result<LiveVersions, ApplyError> {
        let mut groups: BTreeMap<(&str, &str, &str, Option<&str>), Vec<&Manifest>> = BTreeMap::new();
        for m in objects {
            let gvk = &m.gvk;
            let group = (gvk.group.as_str(), gvk.version.as_str(), gvk.kind.as_str(), m.key.namespace.as_deref());
            groups.entry(group).or_default().push(m);
        }
        let inventory = &self.options.inventory;
        let selector = format!("{LABEL_INVENTORY}={inventory}");
        let mut live = LiveVersions::new();
        let mut one_by_one = Vec::new();
        for ((group, _, kind, namespace), members) in groups {
            // Not served: nothing of it exists, so nothing of it is left alone.
            let Ok(api) = resolver.api(members[0]) else { continue };
            if namespace.is_none() || members.len() == 1 {
                one_by_one.extend(members);
                continue;
            }
            match api.list_metadata(&ListParams::default().labels(&selector)).await {
                Ok(list) => {
                    for item in list.items {
                        let key = ObjectKey {
                            group: group.to_string(),
                            kind: kind.to_string(),
                            namespace: namespace.map(str::to_string),
                            name: item.metadata.name.clone().unwrap_or_default(),
                        };
                        live.insert(key, version(&item.metadata));
                    }
                }
                // RBAC that grants reading these objects by name only: read them so.
                Err(kube::Error::Api(s)) if s.code == 403 => one_by_one.extend(members),
                Err(e) => return Err(kube_err(format!("listing {kind} objects of inventory {inventory}"))(e)),
            }
        }
        let read: Vec<Option<(ObjectKey, (String, String))>> = stream::iter(one_by_one)
            .map(|m| async move {
                let Ok(api) = resolver.api(m) else { return Ok(None) };
                let meta = api.get_metadata_opt(&m.key.name).await.map_err(kube_err(format!("reading {}", m.key)))?;
                Ok::<_, ApplyError>(
                    meta.filter(|o| o.metadata.labels.as_ref().and_then(|l| l.get(LABEL_INVENTORY)) == Some(inventory))
                        .map(|o| (m.key.clone(), version(&o.metadata))),
                )
            })
            .buffer_unordered(self.options.concurrency.max(1))
            .try_collect()
            .await?;
        live.extend(read.into_iter().flatten());
        Ok(live)
    }
}

/// Live (uid, resourceVersion) by object.
type LiveVersions = BTreeMap<ObjectKey, (String, String)>;

fn version(meta: &ObjectMeta) -> (String, String) {
    (meta.uid.clone().unwrap_or_default(), meta.resource_version.clone().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, rv: &str) -> AppliedRecord {
        AppliedRecord {
            object: ObjectKey {
                group: String::new(),
                kind: "ConfigMap".into(),
                namespace: Some("n".into()),
                name: name.into(),
            },
            hash: "ab".repeat(32),
            uid: format!("uid-{name}"),
            resource_version: rv.into(),
        }
    }

    #[test]
    fn sealed_records_verify_only_unchanged_and_under_their_inventory() {
        let key = AgentKey::from_bytes(vec![7; 32]);
        let sealed = SealedRecords::seal(&key, "fleetgate-a", [record("b", "2"), record("a", "1")]);
        assert_eq!(sealed.records.iter().map(|r| r.object.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(sealed.verified(&key, "fleetgate-a").map(|r| r.len()), Some(2));

        // The resourceVersion moved to what an edit left: the MAC no longer covers it.
        let mut forged = sealed.clone();
        forged.records[0].resource_version = "9".into();
        assert!(forged.verified(&key, "fleetgate-a").is_none());
        assert!(SealedRecords { mac: String::new(), ..sealed.clone() }.verified(&key, "fleetgate-a").is_none());
        assert!(sealed.verified(&key, "fleetgate-b").is_none(), "another inventory's records");
        assert!(sealed.verified(&AgentKey::from_bytes(vec![8; 32]), "fleetgate-a").is_none(), "another key");
    }

    #[test]
    fn the_stored_form_reads_back_as_it_was_sealed() {
        let key = AgentKey::from_bytes(vec![7; 32]);
        let sealed = SealedRecords::seal(&key, "inv", [record("a", "1")]);
        let text = String::from_utf8(canonical(&sealed.records)).unwrap();
        assert_eq!(
            text,
            format!(
                r#"[{{"group":"","kind":"ConfigMap","namespace":"n","name":"a","hash":"{}","uid":"uid-a","resourceVersion":"1"}}]"#,
                "ab".repeat(32)
            )
        );
        let back: Vec<AppliedRecord> = serde_json::from_str(&text).unwrap();
        assert!(SealedRecords { records: back, mac: sealed.mac }.verified(&key, "inv").is_some());
    }
}
