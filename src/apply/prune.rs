//! Prune: delete what earlier releases applied and the current one dropped (the inventory's
//! pending list), newest phase first (webhooks before the services they call, namespaces last).
//!
//! Prune only ever deletes what fleetgate created: entries of its own inventory, still carrying
//! its inventory label, and not adopted (an object that existed before fleetgate first applied
//! it stays when a release drops it).

use super::phases::Resolver;
use super::{
    Action, ApplyError, Engine, InventoryEntry, LABEL_INVENTORY, ObjectChange, api_message, inventory, is_not_found,
    is_unreachable,
};
use crate::manifests::{CRD_GROUP, ObjectKey};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use std::collections::BTreeSet;

/// What prune does with one pending object, decided before any API call.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Plan {
    Delete,
    Retain(String),
}

pub(super) fn plan(
    entry: &InventoryEntry,
    release: &str,
    in_use: &BTreeSet<String>,
    adopted: &[ObjectKey],
    prune_crds: bool,
) -> Plan {
    if adopted.contains(&entry.key()) {
        return Plan::Retain("fleetgate adopted it and did not create it: it stays when a release drops it".into());
    }
    if entry.group == CRD_GROUP && entry.kind == "CustomResourceDefinition" && !prune_crds {
        return Plan::Retain("CRD pruning is off: deleting a CRD deletes every custom resource of it".into());
    }
    if entry.group.is_empty() && entry.kind == "Namespace" && in_use.contains(&entry.name) {
        return Plan::Retain(format!("release {release} still has objects in it"));
    }
    Plan::Delete
}

impl Engine {
    /// Deletes the objects the inventory marks as pending prune: objects of earlier releases
    /// that the current release no longer contains. Call it after [`apply`](Self::apply)
    /// succeeded.
    ///
    /// Kept, and reported as [`Action::Retained`]: adopted objects; CRDs unless `prune_crds`; Namespaces that
    /// still hold objects of the current release; objects that no longer carry this engine's
    /// inventory label (someone else took them over). Objects already gone are dropped from the
    /// list silently. Objects whose deletion fails stay pending and fail the call.
    pub async fn prune(&self) -> Result<Vec<ObjectChange>, ApplyError> {
        let Some(mut inv) = inventory::read(&self.client, &self.options).await? else {
            return Ok(Vec::new());
        };
        if inv.pending_prune.is_empty() {
            return Ok(Vec::new());
        }
        let resolver = Resolver::new(self.client.clone()).await?;
        let in_use: BTreeSet<String> = inv.objects.iter().filter_map(|e| e.namespace.clone()).collect();
        let mut pending = inv.pending_prune.clone();
        pending.sort_by_key(|e| std::cmp::Reverse((e.phase(), e.key())));

        let mut changes = Vec::new();
        let mut failed = Vec::new();
        for entry in pending {
            let key = entry.key();
            let action = match plan(&entry, &inv.release, &in_use, &inv.adopted, self.options.prune_crds) {
                Plan::Retain(why) => Some(Action::Retained(why)),
                Plan::Delete => match self.delete(&resolver, &entry).await {
                    Ok(action) => action,
                    // The server, not the object: everything stays pending and a later prune
                    // (once the server answers) deletes it; deleted ones are gone by then.
                    Err(source) if is_unreachable(&source) => {
                        return Err(ApplyError::Kube { action: format!("pruning {key}"), source });
                    }
                    Err(e) => {
                        failed.push((key.clone(), api_message(&e)));
                        continue;
                    }
                },
            };
            if let Some(action) = action {
                changes.push(ObjectChange { phase: entry.phase(), object: key, action });
            }
        }
        inv.pending_prune.retain(|e| failed.iter().any(|(k, _)| *k == e.key()));
        inventory::store(&self.client, &self.options, &inv).await?;
        if failed.is_empty() { Ok(changes) } else { Err(ApplyError::Prune { failures: failed, pruned: changes }) }
    }

    /// Deletes one object if it is still ours. None: it is gone already.
    async fn delete(&self, resolver: &Resolver, entry: &InventoryEntry) -> Result<Option<Action>, kube::Error> {
        let Some(api) = api_for(resolver, entry) else {
            // The kind is not served any more (its CRD is gone): so is the object.
            return Ok(None);
        };
        let Some(live) = api.get_opt(&entry.name).await? else {
            return Ok(None);
        };
        if live.labels().get(LABEL_INVENTORY) != Some(&self.options.inventory) {
            return Ok(Some(Action::Retained(format!(
                "it no longer carries {LABEL_INVENTORY}={}",
                self.options.inventory
            ))));
        }
        match api.delete(&entry.name, &DeleteParams::background()).await {
            Ok(_) => Ok(Some(Action::Pruned)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The endpoint of an inventory entry: its recorded version, or any served version of its kind.
pub(crate) fn api_for(resolver: &Resolver, entry: &InventoryEntry) -> Option<Api<DynamicObject>> {
    let d = resolver.discovery();
    let gvk = GroupVersionKind::gvk(&entry.group, &entry.version, &entry.kind);
    let (ar, caps) = d.resolve_gvk(&gvk).or_else(|| d.get(&entry.group)?.recommended_kind(&entry.kind))?;
    let client = resolver.client().clone();
    Some(match (caps.scope, &entry.namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client, ns, &ar),
        _ => Api::all_with(client, &ar),
    })
}

/// Keys of failed deletions, for error messages.
pub(crate) fn describe(failures: &[(ObjectKey, String)]) -> String {
    failures.iter().map(|(k, m)| format!("{k}: {m}")).collect::<Vec<_>>().join("\n  ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(group: &str, kind: &str, name: &str) -> InventoryEntry {
        InventoryEntry {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: None,
            name: name.into(),
        }
    }

    #[test]
    fn crds_and_used_namespaces_are_retained() {
        let in_use = BTreeSet::from(["redis-system".to_string()]);
        let crd = entry(CRD_GROUP, "CustomResourceDefinition", "widgets.example.com");
        assert!(matches!(plan(&crd, "rel-2", &in_use, &[], false), Plan::Retain(_)));
        assert_eq!(plan(&crd, "rel-2", &in_use, &[], true), Plan::Delete);
        assert!(matches!(plan(&entry("", "Namespace", "redis-system"), "rel-2", &in_use, &[], true), Plan::Retain(_)));
        assert_eq!(plan(&entry("", "Namespace", "old"), "rel-2", &in_use, &[], false), Plan::Delete);
        assert_eq!(plan(&entry("", "ConfigMap", "c"), "rel-2", &in_use, &[], false), Plan::Delete);
    }

    #[test]
    fn adopted_objects_are_retained() {
        let cm = entry("", "ConfigMap", "c");
        let adopted = [cm.key()];
        assert!(
            matches!(plan(&cm, "rel-2", &BTreeSet::new(), &adopted, true), Plan::Retain(why) if why.contains("adopted"))
        );
    }
}
