//! What an apply, prune or restore did to each object: the [`ChangeSet`].

use crate::manifests::{ObjectKey, Phase, Source};
use std::fmt;

/// What happened to one object.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "action", content = "reason")]
pub enum Action {
    /// It did not exist and was created.
    Created,
    /// It existed and the apply changed it.
    Configured,
    /// It existed and the apply changed nothing (same resourceVersion).
    Unchanged,
    /// A previous release had it, this one does not: deleted.
    Pruned,
    /// A previous release had it, this one does not, but it was kept (the reason says why).
    Retained(String),
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Created => f.write_str("created"),
            Action::Configured => f.write_str("configured"),
            Action::Unchanged => f.write_str("unchanged"),
            Action::Pruned => f.write_str("pruned"),
            Action::Retained(why) => write!(f, "retained ({why})"),
        }
    }
}

/// One object's outcome.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ObjectChange {
    pub object: ObjectKey,
    pub phase: Phase,
    pub action: Action,
}

/// The outcome of one apply (plus the prune that follows it, when the caller adds it).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangeSet {
    pub release: String,
    /// In the order they were applied (by phase); pruned objects last.
    pub changes: Vec<ObjectChange>,
    /// Objects whose dry run waited for an earlier phase to be applied (see [`DeferredDryRun`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dry_run_deferred: Vec<DeferredDryRun>,
}

/// An object the server could not dry-run before an earlier phase was applied: an object in a
/// namespace the release creates (after [`Phase::Namespaces`]), or a custom resource of a CRD
/// the release creates or changes (after [`Phase::Crds`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeferredDryRun {
    pub object: ObjectKey,
    pub after: Phase,
}

impl ChangeSet {
    pub fn new(release: &str) -> Self {
        ChangeSet { release: release.to_string(), ..Default::default() }
    }

    /// The objects that ended with `action`.
    pub fn with(&self, action: &Action) -> Vec<&ObjectKey> {
        self.changes.iter().filter(|c| &c.action == action).map(|c| &c.object).collect()
    }

    /// Whether the cluster changed at all.
    pub fn changed_anything(&self) -> bool {
        self.changes.iter().any(|c| !matches!(c.action, Action::Unchanged | Action::Retained(_)))
    }

    /// `3 created, 1 configured, 10 unchanged, 1 pruned`.
    pub fn summary(&self) -> String {
        let count = |pred: &dyn Fn(&Action) -> bool| self.changes.iter().filter(|c| pred(&c.action)).count();
        let parts = [
            (count(&|a| *a == Action::Created), "created"),
            (count(&|a| *a == Action::Configured), "configured"),
            (count(&|a| *a == Action::Unchanged), "unchanged"),
            (count(&|a| *a == Action::Pruned), "pruned"),
            (count(&|a| matches!(a, Action::Retained(_))), "retained"),
        ];
        let text: Vec<String> = parts.iter().filter(|(n, _)| *n > 0).map(|(n, w)| format!("{n} {w}")).collect();
        if text.is_empty() { "no objects".to_string() } else { text.join(", ") }
    }
}

/// One object the API server refused, with its message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ObjectFailure {
    pub object: ObjectKey,
    pub source: Source,
    pub message: String,
}

impl fmt::Display for ObjectFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.object, self.source, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(name: &str, action: Action) -> ObjectChange {
        ObjectChange {
            object: ObjectKey {
                group: String::new(),
                kind: "ConfigMap".into(),
                namespace: Some("n".into()),
                name: name.into(),
            },
            phase: Phase::Config,
            action,
        }
    }

    #[test]
    fn summary_counts_each_action() {
        let mut cs = ChangeSet::new("rel-1");
        assert_eq!(cs.summary(), "no objects");
        cs.changes = vec![
            change("a", Action::Created),
            change("b", Action::Unchanged),
            change("c", Action::Unchanged),
            change("d", Action::Retained("crd".into())),
        ];
        assert_eq!(cs.summary(), "1 created, 2 unchanged, 1 retained");
        assert!(cs.changed_anything());
        cs.changes.remove(0);
        assert!(!cs.changed_anything());
    }
}
