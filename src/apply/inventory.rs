//! The in-cluster record of what fleetgate applied: the inventory ConfigMap (current release,
//! its objects, and the previous release's leftovers awaiting prune) and the
//! `release-manifest-<id>` ConfigMaps (the seed's mapping form).
//!
//! The inventory also lists the objects fleetgate adopted (they existed before it applied them,
//! see `Engine::apply`), so prune can leave them in place, and what fleetgate last sent and the
//! server stored for each object (sealed records, see `unchanged`), so an apply can leave alone
//! what it would not change.
//!
//! Both live in the agent's namespace. The inventory keeps the objects as a JSON list; at about
//! 100 bytes an entry a ConfigMap holds several thousand, far beyond an Operator's release.

use super::{AppliedRecord, ApplyError, ApplyOptions, LABEL_INVENTORY, SealedRecords, api_message, kube_err};
use crate::manifests::{ManifestSet, ObjectKey, Phase, api_version};
use crate::model::release_seed_data;
use crate::release::VerifiedRelease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use std::collections::{BTreeMap, BTreeSet};

/// Label on `release-manifest-<id>` ConfigMaps (value `true`), to list them.
const LABEL_RELEASE_MANIFEST: &str = "fleetgate.io/release-manifest";
/// Prefix of the ConfigMaps holding the applied mapping of each release.
const RELEASE_MANIFEST_PREFIX: &str = "release-manifest-";

const KEY_RELEASE: &str = "release";
const KEY_PREVIOUS: &str = "previousRelease";
const KEY_OBJECTS: &str = "objects";
const KEY_PENDING: &str = "pendingPrune";
const KEY_ADOPTED: &str = "adopted";
const KEY_APPLIED: &str = "applied";
const KEY_APPLIED_MAC: &str = "appliedMac";

/// One object fleetgate applied, with the API version it was applied as.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct InventoryEntry {
    pub group: String,
    pub version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl InventoryEntry {
    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            group: self.group.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    pub fn api_version(&self) -> String {
        api_version(&self.group, &self.version)
    }

    pub fn phase(&self) -> Phase {
        Phase::of(&self.group, &self.kind)
    }
}

/// What the inventory ConfigMap says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// The release last applied.
    pub release: String,
    /// The release before it, if any.
    pub previous_release: Option<String>,
    /// The objects of `release`, sorted.
    pub objects: Vec<InventoryEntry>,
    /// Objects of earlier releases that `release` no longer has; [`Engine::prune`](super::Engine::prune)
    /// deletes them. Kept here so a prune interrupted by a restart resumes.
    pub pending_prune: Vec<InventoryEntry>,
    /// Objects that existed before fleetgate first applied them (adopted): prune never deletes
    /// them.
    pub adopted: Vec<ObjectKey>,
    /// What the last apply sent and the server stored, per object it wrote or left alone.
    #[serde(skip)]
    pub applied: SealedRecords,
}

impl super::Engine {
    /// What the inventory records; None when this engine never applied anything here.
    pub async fn inventory(&self) -> Result<Option<Inventory>, ApplyError> {
        read(&self.client, &self.options).await
    }
}

/// Name of the inventory ConfigMap: `<inventory>-inventory`.
pub fn inventory_name(options: &ApplyOptions) -> String {
    format!("{}-inventory", options.inventory)
}

fn configmaps(client: &Client, options: &ApplyOptions) -> Api<ConfigMap> {
    Api::namespaced(client.clone(), &options.agent_namespace)
}

fn unreadable(options: &ApplyOptions, reason: String) -> ApplyError {
    ApplyError::Inventory { namespace: options.agent_namespace.clone(), name: inventory_name(options), reason }
}

/// Reads the inventory; None when nothing was applied yet.
pub(crate) async fn read(client: &Client, options: &ApplyOptions) -> Result<Option<Inventory>, ApplyError> {
    let name = inventory_name(options);
    let Some(cm) = configmaps(client, options).get_opt(&name).await.map_err(kube_err(format!("reading {name}")))?
    else {
        return Ok(None);
    };
    let data = cm.data.unwrap_or_default();
    let list = |key: &str| -> Result<Vec<InventoryEntry>, ApplyError> {
        match data.get(key) {
            None => Ok(Vec::new()),
            Some(text) => serde_json::from_str(text).map_err(|e| unreadable(options, format!("{key}: {e}"))),
        }
    };
    Ok(Some(Inventory {
        release: data.get(KEY_RELEASE).cloned().ok_or_else(|| unreadable(options, format!("no {KEY_RELEASE} key")))?,
        previous_release: data.get(KEY_PREVIOUS).filter(|s| !s.is_empty()).cloned(),
        objects: list(KEY_OBJECTS)?,
        pending_prune: list(KEY_PENDING)?,
        adopted: match data.get(KEY_ADOPTED) {
            None => Vec::new(),
            Some(text) => serde_json::from_str(text).map_err(|e| unreadable(options, format!("{KEY_ADOPTED}: {e}")))?,
        },
        // Unreadable records only cost the shortcut: every object is applied.
        applied: SealedRecords {
            records: data
                .get(KEY_APPLIED)
                .and_then(|t| serde_json::from_str::<Vec<AppliedRecord>>(t).ok())
                .unwrap_or_default(),
            mac: data.get(KEY_APPLIED_MAC).cloned().unwrap_or_default(),
        },
    }))
}

/// Records `set` as the current release. Whatever the previous inventory held (objects and
/// still-pending prunes) that `set` does not contain becomes pending prune. `adopted` are the
/// objects of `set` this apply takes over rather than creates; `applied` the records of the
/// objects it leaves alone. Writes nothing when that is what `previous` says already.
pub(crate) async fn write(
    client: &Client,
    options: &ApplyOptions,
    set: &ManifestSet,
    previous: Option<&Inventory>,
    adopted: &BTreeSet<ObjectKey>,
    applied: SealedRecords,
) -> Result<Inventory, ApplyError> {
    let objects: Vec<InventoryEntry> = set
        .iter()
        .map(|m| InventoryEntry {
            group: m.gvk.group.clone(),
            version: m.gvk.version.clone(),
            kind: m.gvk.kind.clone(),
            namespace: m.key.namespace.clone(),
            name: m.key.name.clone(),
        })
        .collect();
    let inventory = Inventory { applied, ..next_inventory(set.release_id(), objects, previous, adopted) };
    if previous != Some(&inventory) {
        store(client, options, &inventory).await?;
    }
    Ok(inventory)
}

/// The inventory after applying `release` with `objects` over `previous`, adopting `adopted`.
/// An adopted object stays adopted.
fn next_inventory(
    release: &str,
    mut objects: Vec<InventoryEntry>,
    previous: Option<&Inventory>,
    adopted: &BTreeSet<ObjectKey>,
) -> Inventory {
    objects.sort();
    let keep: BTreeSet<ObjectKey> = objects.iter().map(InventoryEntry::key).collect();
    let mut pending: BTreeMap<ObjectKey, InventoryEntry> = BTreeMap::new();
    if let Some(p) = previous {
        for e in p.objects.iter().chain(&p.pending_prune) {
            if !keep.contains(&e.key()) {
                pending.insert(e.key(), e.clone());
            }
        }
    }
    let previous_release = match previous {
        Some(p) if p.release != release => Some(p.release.clone()),
        Some(p) => p.previous_release.clone(),
        None => None,
    };
    // Kept for good (a short list): an adopted object prune retained and a later release brings
    // back still carries fleetgate's label, but fleetgate still did not create it.
    let adopted =
        previous.iter().flat_map(|p| &p.adopted).chain(adopted).cloned().collect::<BTreeSet<_>>().into_iter().collect();
    Inventory {
        release: release.to_string(),
        previous_release,
        objects,
        pending_prune: pending.into_values().collect(),
        adopted,
        applied: SealedRecords::default(),
    }
}

/// Writes `inventory` (server-side apply, so an unchanged inventory changes nothing).
pub(crate) async fn store(client: &Client, options: &ApplyOptions, inventory: &Inventory) -> Result<(), ApplyError> {
    let name = inventory_name(options);
    let json = |v: &[InventoryEntry]| serde_json::to_string(v).expect("inventory entries serialize");
    let data = BTreeMap::from([
        (KEY_RELEASE.to_string(), inventory.release.clone()),
        (KEY_PREVIOUS.to_string(), inventory.previous_release.clone().unwrap_or_default()),
        (KEY_OBJECTS.to_string(), json(&inventory.objects)),
        (KEY_PENDING.to_string(), json(&inventory.pending_prune)),
        (KEY_ADOPTED.to_string(), serde_json::to_string(&inventory.adopted).expect("object keys serialize")),
        (KEY_APPLIED.to_string(), serde_json::to_string(&inventory.applied.records).expect("records serialize")),
        (KEY_APPLIED_MAC.to_string(), inventory.applied.mac.clone()),
    ]);
    apply_configmap(client, options, &name, &[], data, "writing inventory").await
}

/// Server-side applies ConfigMap `name` in the agent namespace with `data`, labelled as this
/// inventory's ([`ApplyOptions::own_labels`] with `extra_labels`); `action` names it in errors.
async fn apply_configmap(
    client: &Client,
    options: &ApplyOptions,
    name: &str,
    extra_labels: &[(&str, &str)],
    data: BTreeMap<String, String>,
    action: &str,
) -> Result<(), ApplyError> {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(options.agent_namespace.clone()),
            labels: Some(options.own_labels(extra_labels)),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    configmaps(client, options)
        .patch(name, &PatchParams::apply(crate::FIELD_MANAGER).force(), &Patch::Apply(&cm))
        .await
        .map_err(kube_err(format!("{action} {}/{name}", options.agent_namespace)))?;
    Ok(())
}

/// Name of the ConfigMap holding the applied mapping of release `id`.
pub fn release_manifest_name(id: &str) -> String {
    format!("{RELEASE_MANIFEST_PREFIX}{id}")
}

/// Writes ConfigMap `release-manifest-<id>` (the seed's keys, `deploy.timestamp` = now) unless
/// it already records this release, then deletes the oldest beyond the configured history.
pub(crate) async fn write_release_manifest(
    client: &Client,
    options: &ApplyOptions,
    release: &VerifiedRelease,
) -> Result<(), ApplyError> {
    let api = configmaps(client, options);
    let name = release_manifest_name(release.id());
    let existing = api.get_opt(&name).await.map_err(kube_err(format!("reading {name}")))?;
    let recorded = existing.as_ref().and_then(|cm| cm.data.as_ref()?.get(crate::model::seed_keys::RELEASE_ID).cloned());
    if recorded.as_deref() == Some(release.id()) {
        // Re-applying a release keeps its first deploy time and changes nothing.
        return Ok(());
    }
    let mut mapping = release.release().clone();
    mapping.spec.deploy_timestamp = Some(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    let data = release_seed_data(&mapping);
    apply_configmap(client, options, &name, &[(LABEL_RELEASE_MANIFEST, "true")], data, "writing").await?;

    let selector = format!("{LABEL_INVENTORY}={},{LABEL_RELEASE_MANIFEST}=true", options.inventory);
    let mut all =
        api.list(&ListParams::default().labels(&selector)).await.map_err(kube_err("listing release manifests"))?.items;
    all.sort_by(|a, b| b.metadata.creation_timestamp.cmp(&a.metadata.creation_timestamp));
    for old in all.iter().skip(options.release_manifest_history.max(1)) {
        let old_name = old.metadata.name.clone().unwrap_or_default();
        if old_name != name
            && let Err(e) = api.delete(&old_name, &DeleteParams::default()).await
            && !super::is_not_found(&e)
        {
            tracing::warn!(configmap = %old_name, error = %api_message(&e), "could not delete an old release manifest");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: &str, name: &str) -> InventoryEntry {
        InventoryEntry {
            group: String::new(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: Some("n".into()),
            name: name.into(),
        }
    }

    fn none() -> BTreeSet<ObjectKey> {
        BTreeSet::new()
    }

    #[test]
    fn adopted_objects_stay_adopted() {
        let a = entry("ConfigMap", "a");
        let v1 = next_inventory("rel-1", vec![a.clone(), entry("ConfigMap", "b")], None, &BTreeSet::from([a.key()]));
        assert_eq!(v1.adopted, [a.key()]);
        // Dropped by rel-2: pending prune, still adopted (prune retains it).
        let v2 = next_inventory("rel-2", vec![entry("ConfigMap", "b")], Some(&v1), &none());
        assert_eq!((v2.pending_prune.clone(), v2.adopted.clone()), (vec![a.clone()], vec![a.key()]));
        // Retained by prune and brought back by rel-3: still not fleetgate's to delete.
        let retained = Inventory { pending_prune: Vec::new(), ..v2 };
        let v3 = next_inventory("rel-3", vec![a.clone()], Some(&retained), &none());
        assert_eq!(v3.adopted, [a.key()]);
    }

    #[test]
    fn dropped_objects_become_pending_and_stay_pending_until_pruned() {
        let v1 = next_inventory("rel-1", vec![entry("ConfigMap", "a"), entry("ConfigMap", "b")], None, &none());
        assert!(v1.pending_prune.is_empty());
        assert_eq!(v1.previous_release, None);

        let v2 = next_inventory("rel-2", vec![entry("ConfigMap", "a"), entry("Secret", "c")], Some(&v1), &none());
        assert_eq!(v2.pending_prune, vec![entry("ConfigMap", "b")]);
        assert_eq!(v2.previous_release.as_deref(), Some("rel-1"));

        // A third release before the prune ran: b is still pending; c is dropped too.
        let v3 = next_inventory("rel-3", vec![entry("ConfigMap", "a")], Some(&v2), &none());
        assert_eq!(v3.pending_prune, vec![entry("ConfigMap", "b"), entry("Secret", "c")]);

        // Re-adding a pending object takes it off the list.
        let v4 = next_inventory("rel-4", vec![entry("ConfigMap", "a"), entry("ConfigMap", "b")], Some(&v3), &none());
        assert_eq!(v4.pending_prune, vec![entry("Secret", "c")]);
    }

    #[test]
    fn reapplying_keeps_the_previous_release() {
        let v1 = next_inventory("rel-1", vec![entry("ConfigMap", "a")], None, &none());
        let v2 = next_inventory("rel-2", vec![entry("ConfigMap", "a")], Some(&v1), &none());
        let again = next_inventory("rel-2", vec![entry("ConfigMap", "a")], Some(&v2), &none());
        assert_eq!(again, v2);
    }
}
