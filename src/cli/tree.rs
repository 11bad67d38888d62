//! `fleetgate tree --cluster NAME`: the objects the release a cluster's agent last applied put in
//! the cluster, as its inventory ConfigMap records them ([`crate::apply::inventory`]), like `flux
//! tree`: the release, then its objects by namespace (cluster-scoped first), with the objects of
//! earlier releases still awaiting prune marked. `-o json|yaml` prints the inventory's entries.
//!
//! The cluster is reached through the global `--kubeconfig` / `--context`. Reads only. Exit 2 when
//! there is no inventory (wrong cluster, namespace or context, or nothing applied yet).

use super::args::{AgentRef, KubeArgs};
use super::output::{OutputFormat, terminal_text};
use crate::apply::{ApplyOptions, Engine, Inventory, InventoryEntry, inventory_name};
use anyhow::Context as _;
use std::collections::BTreeMap;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub agent: AgentRef,
    /// The global `--kubeconfig` / `--context` (set by [`super::run`]).
    #[arg(skip)]
    pub kube: KubeArgs,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let client =
        args.kube.access().client().await.context("connecting to the cluster (check --kubeconfig and --context)")?;
    let options = ApplyOptions::for_cluster(&args.agent.namespace, &args.agent.cluster);
    let inventory = Engine::new(client, options.clone()).inventory().await.context("reading the agent's inventory")?;
    let Some(inventory) = inventory else {
        anyhow::bail!(
            "no inventory ConfigMap {}/{}: check that --cluster names a cluster whose agent has applied a \
             release, that --namespace is its agent's namespace, and that --kubeconfig/--context reach that cluster",
            args.agent.namespace,
            inventory_name(&options)
        );
    };
    if !args.output.print_machine(&inventory)? {
        print!("{}", tree(&inventory));
    }
    Ok(ExitCode::SUCCESS)
}

/// One object's line: `Kind/name`, marked when it awaits prune or was adopted.
struct Leaf<'a> {
    entry: &'a InventoryEntry,
    mark: Option<&'static str>,
}

/// The release line, then one branch per namespace (cluster-scoped objects first, under
/// `(cluster)`), each object as `Kind/name`.
fn tree(inventory: &Inventory) -> String {
    let mut namespaces: BTreeMap<Option<&str>, Vec<Leaf>> = BTreeMap::new();
    let current = inventory.objects.iter().map(|entry| {
        let adopted = inventory.adopted.contains(&entry.key());
        Leaf { entry, mark: adopted.then_some("adopted") }
    });
    let pending = inventory.pending_prune.iter().map(|entry| Leaf { entry, mark: Some("pending prune") });
    for leaf in current.chain(pending) {
        namespaces.entry(leaf.entry.namespace.as_deref()).or_default().push(leaf);
    }
    let mut out = format!("release {}", terminal_text(&inventory.release));
    if let Some(previous) = &inventory.previous_release {
        out.push_str(&format!(" (previous {})", terminal_text(previous)));
    }
    out.push('\n');
    // BTreeMap orders None (cluster-scoped) before every namespace.
    let count = namespaces.len();
    for (i, (namespace, mut leaves)) in namespaces.into_iter().enumerate() {
        let last = i + 1 == count;
        let name = namespace.map_or_else(|| "(cluster)".to_string(), terminal_text);
        out.push_str(&format!("{}{name}\n", if last { "└── " } else { "├── " }));
        leaves.sort_by(|a, b| (&a.entry.kind, &a.entry.name).cmp(&(&b.entry.kind, &b.entry.name)));
        let indent = if last { "    " } else { "│   " };
        for (j, leaf) in leaves.iter().enumerate() {
            let branch = if j + 1 == leaves.len() { "└── " } else { "├── " };
            let object = terminal_text(&format!("{}/{}", leaf.entry.kind, leaf.entry.name));
            let mark = leaf.mark.map(|m| format!(" ({m})")).unwrap_or_default();
            out.push_str(&format!("{indent}{branch}{object}{mark}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(group: &str, kind: &str, namespace: Option<&str>, name: &str) -> InventoryEntry {
        InventoryEntry {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: namespace.map(str::to_string),
            name: name.into(),
        }
    }

    #[test]
    fn objects_hang_under_their_namespace_cluster_scoped_first() {
        let operator = entry("apps", "Deployment", Some("redis-system"), "redis-operator");
        let inventory = Inventory {
            release: "rel-2".into(),
            previous_release: Some("rel-1".into()),
            objects: vec![
                operator.clone(),
                entry("", "ServiceAccount", Some("redis-system"), "redis-operator"),
                entry("apiextensions.k8s.io", "CustomResourceDefinition", None, "redisclusters.cache.example.com"),
            ],
            pending_prune: vec![entry("", "ConfigMap", Some("redis-system"), "old-settings")],
            adopted: vec![operator.key()],
            applied: Default::default(),
        };
        assert_eq!(
            tree(&inventory),
            "release rel-2 (previous rel-1)
├── (cluster)
│   └── CustomResourceDefinition/redisclusters.cache.example.com
└── redis-system
    ├── ConfigMap/old-settings (pending prune)
    ├── Deployment/redis-operator (adopted)
    └── ServiceAccount/redis-operator
"
        );
    }
}
