//! Withdraw: what a failed *first* release leaves behind when there is nothing to roll back to.
//! Its workloads and webhook configurations go (a crash-looping controller or a webhook whose
//! service is down can break the whole cluster); its CRDs and custom resources stay, because
//! deleting a CRD deletes every object of it, and those are the users' data.

use super::{ApplyError, Engine, InventoryEntry, ObjectChange, inventory};

/// Kinds a withdrawn release loses: what runs code, and what intercepts API requests.
const WITHDRAWN: [(&str, &str); 9] = [
    ("apps", "Deployment"),
    ("apps", "StatefulSet"),
    ("apps", "DaemonSet"),
    ("apps", "ReplicaSet"),
    ("batch", "Job"),
    ("batch", "CronJob"),
    ("", "Pod"),
    ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"),
    ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"),
];

fn withdrawn(entry: &InventoryEntry) -> bool {
    WITHDRAWN.iter().any(|(group, kind)| entry.group == *group && entry.kind == *kind)
}

impl Engine {
    /// Moves the current release's workloads and webhook configurations from the inventory to
    /// its pending-prune list and prunes them (so a restart mid-way resumes it); everything else
    /// the release applied stays, recorded as before.
    pub async fn withdraw(&self) -> Result<Vec<ObjectChange>, ApplyError> {
        let Some(mut inv) = inventory::read(&self.client, &self.options).await? else {
            return Ok(Vec::new());
        };
        let (gone, kept): (Vec<InventoryEntry>, Vec<InventoryEntry>) = inv.objects.drain(..).partition(withdrawn);
        inv.objects = kept;
        if !gone.is_empty() {
            for entry in gone {
                if !inv.pending_prune.contains(&entry) {
                    inv.pending_prune.push(entry);
                }
            }
            inventory::store(&self.client, &self.options, &inv).await?;
        }
        self.prune().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(group: &str, kind: &str) -> InventoryEntry {
        InventoryEntry {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: None,
            name: "x".into(),
        }
    }

    #[test]
    fn workloads_and_webhooks_go_crds_custom_resources_and_the_rest_stay() {
        for (group, kind) in WITHDRAWN {
            assert!(withdrawn(&entry(group, kind)), "{group}/{kind}");
        }
        for (group, kind) in [
            ("apiextensions.k8s.io", "CustomResourceDefinition"),
            ("cache.example.com", "RedisCluster"),
            ("", "Namespace"),
            ("", "Service"),
            ("", "ConfigMap"),
            ("rbac.authorization.k8s.io", "ClusterRole"),
            ("example.com", "Deployment"),
        ] {
            assert!(!withdrawn(&entry(group, kind)), "{group}/{kind}");
        }
    }
}
