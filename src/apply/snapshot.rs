//! Snapshots: before release N+1 replaces N, the live state of N — each of its objects reduced
//! to the fields fleetgate applied (live values), and every custom resource of its CRDs
//! (metadata labels/annotations and everything but `status`) — is stored in the agent's
//! namespace, so a rollback restores state, not only an image. Taken before applying N+1
//! ([`Engine::snapshot_before`]), it leaves out the objects of N that N+1 leaves alone (see
//! `unchanged`): N+1 does not change them, so there is nothing of them to bring back.
//!
//! Storage: Secrets (a snapshot can hold Secrets of the release), the JSON gzipped and split into
//! chunks `<inventory>-snapshot-<id>-<n>` of at most [`CHUNK_BYTES`] ([`super::chunked`]; the
//! CRDs of a big operator are megabytes of schema, which gzip shrinks about tenfold, and every
//! byte is base64 in the API server's JSON and then in etcd), then an index Secret
//! `<inventory>-snapshot-<id>` with the chunk count and an HMAC-SHA256 of the id, the release and
//! the whole JSON, written last so a snapshot interrupted half way is never listed (its chunks
//! are deleted when the next snapshot is stored). Only the newest `snapshot_history` snapshots
//! are kept.
//!
//! Authentication: the MAC's key ([`AgentKey`]) is Secret `<inventory>-snapshot-key`, generated
//! on first use in the agent's namespace; only the agent (and cluster admins) can read it. A
//! hash alone would not do: whoever may edit the snapshot Secrets could recompute it. A snapshot
//! whose MAC does not verify is refused ([`ApplyError::SnapshotUnauthenticated`]).
//!
//! Restore re-applies a snapshot with server-side apply (forced, field manager `fleetgate`) in
//! the usual phases, after a dry run of all of it. It does not restore `status` (controllers own
//! it). It runs the release admission policy on what it restores, like an apply does, except
//! for custom resources of the snapshot's CRDs: those are the users' data, which no release
//! policy describes.

use super::chunked::{ChunkError, Existing, read_chunks, write_chunks};
use super::phases::Resolver;
use super::prune::api_for;
use super::unchanged::Records;
use super::{
    AdmittedSet, ApplyError, ChangeSet, Engine, InventoryEntry, LABEL_INVENTORY, LABEL_RELEASE, api_message, fields,
    inventory, kube_err,
};
use crate::manifests::admission::AdmissionPolicy;
use crate::manifests::{CRD_GROUP, CRD_KIND, CrdNames, ManifestSet, Source, typed_crd};
use futures::{StreamExt, TryStreamExt, stream};
use hmac::{Hmac, Mac};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, ObjectMeta, PostParams};
use serde_json::Value;
use sha2::Sha256;
use std::collections::{BTreeMap, BTreeSet};

/// Label carrying the snapshot id on its index and chunk Secrets.
pub const LABEL_SNAPSHOT: &str = "fleetgate.io/snapshot";
/// Label (value `true`) marking a snapshot's index Secret.
const LABEL_INDEX: &str = "fleetgate.io/snapshot-index";
const ANN_CHUNKS: &str = "fleetgate.io/snapshot-chunks";
const ANN_MAC: &str = "fleetgate.io/snapshot-hmac-sha256";
const ANN_OBJECTS: &str = "fleetgate.io/snapshot-objects";
const ANN_CREATED: &str = "fleetgate.io/snapshot-created";
const DATA_KEY: &str = "objects.json";
/// Data key of the agent key Secret.
const KEY_DATA: &str = "key";
/// What a snapshot's MAC is computed under (the agent key authenticates other stores too).
const SNAPSHOT_DOMAIN: &str = "fleetgate snapshot v1";

/// A secret key of the agent (32 random bytes in a Secret of its namespace): HMAC-SHA256 over
/// what the agent stores in the cluster and reads back with trust. Secret
/// `<inventory>-snapshot-key` authenticates snapshots, applied records and the last-known-good
/// store; `fleetgate-state-key-<cluster>` the agent's state and status outbox. Each store MACs
/// under its own `domain`, so a MAC of one is never a MAC of the other.
#[derive(Clone)]
pub struct AgentKey(zeroize::Zeroizing<Vec<u8>>);

impl std::fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentKey(..)")
    }
}

impl AgentKey {
    pub fn from_bytes(bytes: Vec<u8>) -> AgentKey {
        AgentKey(zeroize::Zeroizing::new(bytes))
    }

    fn hmac(&self, domain: &str, parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        // Length-prefixed parts: ("ab", "c") and ("a", "bc") MAC differently.
        for part in std::iter::once(domain.as_bytes()).chain(parts.iter().copied()) {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }

    /// Hex HMAC-SHA256 of `parts` under `domain`.
    pub fn mac(&self, domain: &str, parts: &[&[u8]]) -> String {
        self.hmac(domain, parts).finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `hex` is the MAC of `parts` under `domain` (compared in constant time).
    pub fn verify(&self, domain: &str, parts: &[&[u8]], hex: &str) -> bool {
        let Some(bytes) = decode_hex(hex) else { return false };
        self.hmac(domain, parts).verify_slice(&bytes).is_ok()
    }
}

/// Why an [`AgentKey`] Secret could not be read or made.
#[derive(Debug, thiserror::Error)]
pub enum AgentKeyError {
    #[error("{action} Secret {name} (does the agent's RBAC allow get and create on secrets in its namespace?)")]
    Kube { action: &'static str, name: String, source: Box<kube::Error> },
    #[error(
        "the agent key Secret {name} holds no 32-byte key; delete it to have a new one made (what it authenticated then no longer verifies)"
    )]
    Short { name: String },
}

impl From<AgentKeyError> for ApplyError {
    fn from(e: AgentKeyError) -> ApplyError {
        match e {
            AgentKeyError::Kube { action, name, source } => {
                ApplyError::Kube { action: format!("{action} Secret {name}"), source: *source }
            }
            AgentKeyError::Short { name } => {
                let reason = AgentKeyError::Short { name: name.clone() }.to_string();
                ApplyError::Snapshot { id: name, reason }
            }
        }
    }
}

impl AgentKey {
    /// The key in Secret `name` of `secrets`' namespace; None when there is no such Secret.
    pub async fn read(secrets: &Api<Secret>, name: &str) -> Result<Option<AgentKey>, AgentKeyError> {
        let secret = secrets.get_opt(name).await.map_err(|e| AgentKeyError::Kube {
            action: "reading",
            name: name.to_string(),
            source: Box::new(e),
        })?;
        secret.map(|s| Self::from_secret(s, name)).transpose()
    }

    /// The key held by `secret` (named `name`, for the error).
    pub fn from_secret(secret: Secret, name: &str) -> Result<AgentKey, AgentKeyError> {
        let bytes = secret.data.and_then(|mut d| d.remove(KEY_DATA)).map(|b| b.0).unwrap_or_default();
        if bytes.len() < 32 {
            return Err(AgentKeyError::Short { name: name.to_string() });
        }
        Ok(AgentKey::from_bytes(bytes))
    }

    /// Makes Secret `name` with a new key (32 random bytes) labelled `labels`; when another
    /// replica made it first, that one's key.
    pub async fn create(
        secrets: &Api<Secret>,
        name: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<AgentKey, AgentKeyError> {
        let key: [u8; 32] = rand::random();
        let secret = Secret {
            metadata: ObjectMeta { name: Some(name.to_string()), labels: Some(labels), ..Default::default() },
            data: Some(BTreeMap::from([(KEY_DATA.to_string(), ByteString(key.to_vec()))])),
            ..Default::default()
        };
        let kube = |action| move |e| AgentKeyError::Kube { action, name: name.to_string(), source: Box::new(e) };
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(created) => Self::from_secret(created, name),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                Self::from_secret(secrets.get(name).await.map_err(kube("reading"))?, name)
            }
            Err(e) => Err(kube("creating")(e)),
        }
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

/// A stored snapshot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    /// `s<unix milliseconds>`; later snapshots have larger ids.
    pub id: String,
    /// The release whose state it holds.
    pub release: String,
    /// RFC 3339.
    pub created: String,
    pub objects: usize,
    pub chunks: usize,
}

impl Engine {
    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.options.agent_namespace)
    }

    fn index_name(&self, id: &str) -> String {
        format!("{}-snapshot-{id}", self.options.inventory)
    }

    fn agent_key_name(&self) -> String {
        format!("{}-snapshot-key", self.options.inventory)
    }

    /// The agent key if it exists; None before anything needed it.
    pub(crate) async fn existing_agent_key(&self) -> Result<Option<AgentKey>, ApplyError> {
        AgentKey::read(&self.secrets(), &self.agent_key_name()).await.map_err(ApplyError::from)
    }

    /// The agent key, created (32 random bytes) when it does not exist yet.
    pub async fn agent_key(&self) -> Result<AgentKey, ApplyError> {
        if let Some(key) = self.existing_agent_key().await? {
            return Ok(key);
        }
        AgentKey::create(&self.secrets(), &self.agent_key_name(), self.options.own_labels(&[]))
            .await
            .map_err(ApplyError::from)
    }

    /// Stores a snapshot of every object of the release the inventory records (None when
    /// nothing was applied yet), then deletes snapshots beyond `snapshot_history`.
    pub async fn snapshot(&self) -> Result<Option<SnapshotInfo>, ApplyError> {
        let resolver = Resolver::new(self.client.clone()).await?;
        self.take_snapshot(&resolver, None).await
    }

    /// [`snapshot`](Self::snapshot) as the agent takes it right before applying `next`: without
    /// the objects applying `next` leaves alone (see the module docs). The custom resources of
    /// the release's CRDs are all in it, as always.
    pub async fn snapshot_before(&self, next: &AdmittedSet<'_>) -> Result<Option<SnapshotInfo>, ApplyError> {
        self.take_snapshot(&next.resolver, Some(&next.set)).await
    }

    async fn take_snapshot(
        &self,
        resolver: &Resolver,
        next: Option<&ManifestSet>,
    ) -> Result<Option<SnapshotInfo>, ApplyError> {
        let Some(inv) = inventory::read(&self.client, &self.options).await? else {
            return Ok(None);
        };
        let key = self.agent_key().await?;
        let leave = match next {
            Some(set) => self.unchanged(resolver, set, &self.trusted_records(set, Some(&inv), Some(&key))).await?,
            None => Records::new(),
        };
        // The CRDs left out are the ones `next` has as they are live: their names come from it.
        let crds_left_out: Vec<CrdNames> = next
            .iter()
            .flat_map(|set| set.crds())
            .filter(|c| {
                let name = c.metadata.name.as_deref().unwrap_or_default();
                leave.keys().any(|k| k.group == CRD_GROUP && k.kind == CRD_KIND && k.name == name)
            })
            .map(CrdNames::of)
            .collect();
        let entries: Vec<&InventoryEntry> = inv.objects.iter().filter(|e| !leave.contains_key(&e.key())).collect();
        let id = format!("s{}", chrono::Utc::now().timestamp_millis());
        let objects = self.live_state(&id, resolver, &entries, crds_left_out).await?;
        let info = self.store_snapshot(&key, &id, &inv.release, &objects).await?;
        // Boxed: the agent's pass holds this future; inline it outgrows a debug test thread's stack.
        Box::pin(self.trim_snapshots()).await?;
        Ok(Some(info))
    }

    /// The live objects of `entries` (fleetgate's fields, read `concurrency` at a time) and every
    /// custom resource of the CRDs among them and of `more_crds` (all but status).
    async fn live_state(
        &self,
        id: &str,
        resolver: &Resolver,
        entries: &[&InventoryEntry],
        more_crds: Vec<CrdNames>,
    ) -> Result<Vec<Value>, ApplyError> {
        let read: Vec<(&InventoryEntry, Value)> = stream::iter(entries.iter().copied())
            .map(|e| async move {
                let Some(api) = api_for(resolver, e) else { return Ok(None) };
                let live = api.get_opt(&e.name).await.map_err(kube_err(format!("reading {}", e.key())))?;
                Ok::<_, ApplyError>(live.map(|o| (e, serde_json::to_value(&o).expect("objects serialize"))))
            })
            .buffered(self.options.concurrency.max(1))
            .try_filter_map(|found| async move { Ok(found) })
            .try_collect()
            .await?;
        let mut crds = more_crds;
        let mut out = Vec::new();
        for (e, value) in read {
            if e.group == CRD_GROUP && e.kind == CRD_KIND {
                let crd = typed_crd(&value).map_err(|reason| ApplyError::Snapshot {
                    id: id.to_string(),
                    reason: format!("live CRD {}: {reason}", e.name),
                })?;
                crds.push(CrdNames::of(&crd));
            }
            out.push(fields::managed_fields(&value, crate::FIELD_MANAGER));
        }
        // Listed `concurrency` at a time, like the objects above: an operator has tens of CRDs.
        let lists: Vec<(CrdNames, Vec<DynamicObject>)> = stream::iter(crds)
            .map(|crd| async move {
                let Some((ar, _)) = resolver.discovery().get(&crd.group).and_then(|g| g.recommended_kind(&crd.kind))
                else {
                    return Ok(None);
                };
                let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
                let list = api.list(&ListParams::default()).await.map_err(kube_err(format!("listing {}", crd.name)))?;
                Ok::<_, ApplyError>(Some((crd, list.items)))
            })
            .buffered(self.options.concurrency.max(1))
            .try_filter_map(|found| async move { Ok(found) })
            .try_collect()
            .await?;
        for (crd, items) in lists {
            for cr in items {
                let key = (cr.metadata.namespace.clone(), cr.metadata.name.clone());
                // A CR that is also a release object is stored whole (not only fleetgate's fields).
                out.retain(|o| {
                    !(o.get("kind").and_then(Value::as_str) == Some(crd.kind.as_str())
                        && o.pointer("/metadata/namespace").and_then(Value::as_str) == key.0.as_deref()
                        && o.pointer("/metadata/name").and_then(Value::as_str) == key.1.as_deref())
                });
                out.push(custom_resource_state(serde_json::to_value(&cr).expect("objects serialize")));
            }
        }
        Ok(out)
    }

    async fn store_snapshot(
        &self,
        key: &AgentKey,
        id: &str,
        release: &str,
        objects: &[Value],
    ) -> Result<SnapshotInfo, ApplyError> {
        let json = serde_json::to_vec(objects).expect("objects serialize");
        let mac = key.mac(SNAPSHOT_DOMAIN, &[id.as_bytes(), release.as_bytes(), &json]);
        let stored = gzip(&json);
        let created = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let api = self.secrets();
        let chunk_labels = self.options.own_labels(&[(LABEL_SNAPSHOT, id)]);
        let chunks = write_chunks(&api, &self.index_name(id), DATA_KEY, &stored, &chunk_labels, Existing::Fail)
            .await
            .map_err(kube_err(format!("storing snapshot {id}")))?;
        crate::model::stop_point::reached("snapshot.after-chunks").await;
        let info = SnapshotInfo {
            id: id.to_string(),
            release: release.to_string(),
            created: created.clone(),
            objects: objects.len(),
            chunks,
        };
        let index_labels =
            self.options.own_labels(&[(LABEL_SNAPSHOT, id), (LABEL_INDEX, "true"), (LABEL_RELEASE, release)]);
        let index = Secret {
            metadata: ObjectMeta {
                name: Some(self.index_name(id)),
                labels: Some(index_labels),
                annotations: Some(BTreeMap::from([
                    (ANN_CHUNKS.to_string(), chunks.to_string()),
                    (ANN_MAC.to_string(), mac),
                    (ANN_OBJECTS.to_string(), objects.len().to_string()),
                    (ANN_CREATED.to_string(), created),
                ])),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &index).await.map_err(kube_err(format!("storing snapshot {id}")))?;
        Ok(info)
    }

    /// The complete snapshots of this inventory, newest first.
    pub async fn snapshots(&self) -> Result<Vec<SnapshotInfo>, ApplyError> {
        let selector = format!("{LABEL_INVENTORY}={},{LABEL_INDEX}=true", self.options.inventory);
        let list = self
            .secrets()
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .map_err(kube_err("listing snapshots"))?;
        let mut out: Vec<SnapshotInfo> = list
            .items
            .iter()
            .filter_map(|s| {
                let labels = s.metadata.labels.as_ref()?;
                let ann = s.metadata.annotations.as_ref()?;
                Some(SnapshotInfo {
                    id: labels.get(LABEL_SNAPSHOT)?.clone(),
                    release: labels.get(LABEL_RELEASE).cloned().unwrap_or_default(),
                    created: ann.get(ANN_CREATED).cloned().unwrap_or_default(),
                    objects: ann.get(ANN_OBJECTS)?.parse().ok()?,
                    chunks: ann.get(ANN_CHUNKS)?.parse().ok()?,
                })
            })
            .collect();
        out.sort_by_key(|s| std::cmp::Reverse(snapshot_order(&s.id)));
        Ok(out)
    }

    /// Deletes the snapshots beyond `snapshot_history`, and the chunks of any snapshot whose index
    /// was never written (an agent killed while storing it): never listed, nothing else would
    /// ever delete them. Called right after a snapshot is stored, by the only agent that writes
    /// them (the Lease holder), so no chunk set of a snapshot still being written is taken.
    async fn trim_snapshots(&self) -> Result<(), ApplyError> {
        let api = self.secrets();
        let complete = self.snapshots().await?;
        for old in complete.iter().skip(self.options.snapshot_history.max(1)) {
            api.delete(&self.index_name(&old.id), &DeleteParams::default())
                .await
                .map_err(kube_err(format!("deleting snapshot {}", old.id)))?;
            self.delete_snapshot_secrets(&old.id).await?;
        }
        let selector = format!("{LABEL_INVENTORY}={},{LABEL_SNAPSHOT}", self.options.inventory);
        let stored = api
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .map_err(kube_err("listing snapshot chunks"))?;
        let orphaned: BTreeSet<String> = stored
            .items
            .iter()
            .filter_map(|s| s.metadata.labels.as_ref()?.get(LABEL_SNAPSHOT).cloned())
            .filter(|id| !complete.iter().any(|c| &c.id == id))
            .collect();
        for id in orphaned {
            tracing::warn!(snapshot = %id, "deleting the chunks of a snapshot that was never completed");
            self.delete_snapshot_secrets(&id).await?;
        }
        Ok(())
    }

    /// Deletes every Secret labelled as part of snapshot `id`.
    async fn delete_snapshot_secrets(&self, id: &str) -> Result<(), ApplyError> {
        let labels = format!("{LABEL_INVENTORY}={},{LABEL_SNAPSHOT}={id}", self.options.inventory);
        self.secrets()
            .delete_collection(&DeleteParams::default(), &ListParams::default().labels(&labels))
            .await
            .map_err(kube_err(format!("deleting snapshot {id}")))?;
        Ok(())
    }

    /// Reads a snapshot back: its objects, authenticated by their MAC under the agent key.
    ///
    /// # Errors
    /// [`ApplyError::SnapshotUnauthenticated`] when the MAC does not verify (the content, its
    /// release label or its MAC was changed, or it was stored under another key).
    pub async fn read_snapshot(&self, id: &str) -> Result<Vec<DynamicObject>, ApplyError> {
        let bad = |reason: String| ApplyError::Snapshot { id: id.to_string(), reason };
        let api = self.secrets();
        let index = api
            .get_opt(&self.index_name(id))
            .await
            .map_err(kube_err(format!("reading snapshot {id}")))?
            .ok_or_else(|| bad("no such snapshot (see Engine::snapshots for the stored ones)".into()))?;
        let release = index.metadata.labels.unwrap_or_default().remove(LABEL_RELEASE).unwrap_or_default();
        let ann = index.metadata.annotations.unwrap_or_default();
        let chunks: usize =
            ann.get(ANN_CHUNKS).and_then(|c| c.parse().ok()).ok_or_else(|| bad("index has no chunk count".into()))?;
        let stored = read_chunks(&api, &self.index_name(id), DATA_KEY, chunks).await.map_err(|e| match e {
            ChunkError::Missing(name) => bad(format!("chunk {name} is missing or empty")),
            ChunkError::Api { name, source } => bad(format!("chunk {name}: {}", api_message(&source))),
        })?;
        let json = gunzip(stored, MAX_SNAPSHOT_BYTES).map_err(bad)?;
        let mac = ann.get(ANN_MAC).map(String::as_str).unwrap_or_default();
        if !self.agent_key().await?.verify(SNAPSHOT_DOMAIN, &[id.as_bytes(), release.as_bytes(), &json], mac) {
            return Err(ApplyError::SnapshotUnauthenticated { id: id.to_string(), release });
        }
        serde_json::from_slice(&json).map_err(|e| bad(format!("unreadable content: {e}")))
    }

    /// Re-applies snapshot `id`: admission by `policy` of everything but the custom resources of
    /// the snapshot's CRDs, a dry run of all of it, then the phases. Returns what changed.
    ///
    /// CustomResourceDefinitions are not restored: a restore follows the apply of the rollback
    /// target, which already decided every CRD — including keeping a live CRD that cannot go back
    /// (a storage version the failed release introduced) — and restoring the older CRD from the
    /// snapshot would undo that decision, or be refused by the API server.
    ///
    /// # Errors
    /// [`ApplyError::SnapshotUnauthenticated`] for a snapshot whose MAC does not verify,
    /// [`ApplyError::Admission`] when the policy refuses an object of it; nothing is restored then.
    pub async fn restore(&self, id: &str, policy: &AdmissionPolicy) -> Result<ChangeSet, ApplyError> {
        let (crds, objects): (Vec<_>, Vec<_>) = self
            .read_snapshot(id)
            .await?
            .into_iter()
            .partition(|o| o.types.as_ref().is_some_and(|t| crate::model::is_crd(&t.api_version, &t.kind)));
        let custom_kinds: BTreeSet<(String, String)> = crds
            .iter()
            .filter_map(|c| typed_crd(&serde_json::to_value(c).expect("objects serialize")).ok())
            .map(|c| {
                let names = CrdNames::of(&c);
                (names.group, names.kind)
            })
            .collect();
        let mut resolver = Resolver::new(self.client.clone()).await?;
        let sourced: Vec<(Source, DynamicObject)> = objects
            .into_iter()
            .enumerate()
            .map(|(i, o)| (Source { file: format!("snapshot {id}"), document: i + 1 }, o))
            .collect();
        let is_custom = |o: &DynamicObject| {
            o.types.as_ref().is_some_and(|t| {
                let group = t.api_version.rsplit_once('/').map_or("", |(g, _)| g);
                custom_kinds.contains(&(group.to_string(), t.kind.clone()))
            })
        };
        let judged = sourced.iter().filter(|(_, o)| !is_custom(o)).cloned().collect();
        let judged = ManifestSet::from_objects(id, judged, None, resolver.discovery())?;
        policy.check(&judged, &self.live_api(&resolver, &judged).await?)?;
        let set = ManifestSet::from_objects(id, sourced, None, resolver.discovery())?;
        // Everything of it is written: no record describes what a snapshot holds.
        let (before, deferred) = self.dry_run_first(&resolver, &set, &Records::new()).await?;
        let mut changes = ChangeSet::new(id);
        self.apply_phases("restore", &mut resolver, &set, &Records::new(), before, deferred, &mut changes).await?;
        Ok(changes)
    }
}

/// Sort key of snapshot ids `s<millis>`.
fn snapshot_order(id: &str) -> u64 {
    id.trim_start_matches('s').parse().unwrap_or(0)
}

/// A custom resource as it is restored: everything but status and server-set metadata.
fn custom_resource_state(mut cr: Value) -> Value {
    if let Value::Object(m) = &mut cr {
        m.remove("status");
        if let Some(Value::Object(meta)) = m.get_mut("metadata") {
            meta.retain(|k, _| matches!(k.as_str(), "name" | "namespace" | "labels" | "annotations"));
            if let Some(Value::Object(ann)) = meta.get_mut("annotations") {
                ann.remove("kubectl.kubernetes.io/last-applied-configuration");
            }
        }
    }
    cr
}

/// Largest snapshot [`gunzip`] gives back: a chunk Secret edited into a decompression bomb is
/// refused before it takes the agent's memory (real snapshots are tens of MB at most).
const MAX_SNAPSHOT_BYTES: u64 = 512 << 20;

/// A snapshot's JSON as it is stored: gzipped (level 1: most of the gain for little CPU). The MAC
/// stays over the JSON itself, so how it is stored is not something an editor can exploit.
fn gzip(json: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(json.len() / 8), flate2::Compression::fast());
    enc.write_all(json).expect("writing to memory");
    enc.finish().expect("writing to memory")
}

/// The JSON of stored snapshot bytes: gunzipped (refused past `limit` bytes), or as they are for
/// a snapshot written before they were gzipped (JSON never starts with gzip's magic bytes).
fn gunzip(stored: Vec<u8>, limit: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    if !stored.starts_with(&[0x1f, 0x8b]) {
        return Ok(stored);
    }
    let mut json = Vec::with_capacity(stored.len() * 8);
    let mut decoder = flate2::bufread::GzDecoder::new(stored.as_slice());
    (&mut decoder)
        .take(limit + 1)
        .read_to_end(&mut json)
        .map_err(|e| format!("its gzipped content does not decompress: {e}"))?;
    if json.len() as u64 > limit {
        return Err(format!("it decompresses to more than {limit} bytes"));
    }
    // Nothing the agent wrote follows the stream: bytes there were added by someone else.
    let trailing = decoder.into_inner().len();
    if trailing > 0 {
        return Err(format!("{trailing} bytes follow its gzipped content"));
    }
    Ok(json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn custom_resources_lose_status_and_server_metadata() {
        let cr = json!({
            "apiVersion": "cache.example.com/v1alpha2", "kind": "RedisCluster",
            "metadata": {"name": "a", "namespace": "n", "uid": "u", "resourceVersion": "7", "generation": 2,
                         "creationTimestamp": "2025-01-01T00:00:00Z", "managedFields": [], "labels": {"x": "y"},
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "me"}},
            "spec": {"replicas": 3},
            "status": {"phase": "Ready"}
        });
        assert_eq!(
            custom_resource_state(cr),
            json!({
                "apiVersion": "cache.example.com/v1alpha2", "kind": "RedisCluster",
                "metadata": {"name": "a", "namespace": "n", "labels": {"x": "y"}, "annotations": {"keep": "me"}},
                "spec": {"replicas": 3}
            })
        );
    }

    #[test]
    fn stored_snapshots_are_gzipped_and_older_plain_ones_still_read() {
        let json =
            serde_json::to_vec(&json!([{"kind": "CustomResourceDefinition", "spec": "x".repeat(100_000)}])).unwrap();
        let stored = gzip(&json);
        assert!(stored.len() * 20 < json.len(), "{} bytes stored for {}", stored.len(), json.len());
        assert_eq!(gunzip(stored, MAX_SNAPSHOT_BYTES).unwrap(), json);
        assert_eq!(gunzip(json.clone(), MAX_SNAPSHOT_BYTES).unwrap(), json, "written before gzip");
    }

    #[test]
    fn a_snapshot_that_decompresses_past_the_limit_or_not_at_all_or_with_bytes_after_it_is_refused() {
        let bomb = gzip(&vec![b' '; 1 << 20]);
        let why = gunzip(bomb, 1 << 16).unwrap_err();
        assert!(why.contains("more than 65536 bytes"), "{why}");
        let mut torn = gzip(b"[1,2,3]");
        torn.truncate(torn.len() - 6);
        let why = gunzip(torn, MAX_SNAPSHOT_BYTES).unwrap_err();
        assert!(why.contains("does not decompress"), "{why}");
        let mut appended = gzip(b"[1,2,3]");
        appended.push(b' ');
        let why = gunzip(appended, MAX_SNAPSHOT_BYTES).unwrap_err();
        assert!(why.contains("1 bytes follow its gzipped content"), "{why}");
    }

    #[test]
    fn snapshot_ids_sort_by_time() {
        let mut ids = vec!["s999", "s1000", "s20"];
        ids.sort_by_key(|i| std::cmp::Reverse(snapshot_order(i)));
        assert_eq!(ids, ["s1000", "s999", "s20"]);
    }
}
