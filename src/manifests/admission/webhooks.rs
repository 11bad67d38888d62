//! Admission webhook configurations by content: where each webhook sends objects and which
//! namespaces it intercepts.
//!
//! The rules, for every webhook of a Validating- or MutatingWebhookConfiguration:
//! * `clientConfig.url` is refused: a webhook may only call a Service, and that Service's
//!   namespace must be in `allowedNamespaces`, so a release cannot send the cluster's objects to
//!   an address outside the bounds it was given.
//! * It must not intercept the protected namespaces (the agent's own and `kube-system`): a broken
//!   or hostile webhook there stops the agent from rolling back and the cluster's own controllers.
//!   It passes when its `namespaceSelector` excludes each protected namespace by the label
//!   `kubernetes.io/metadata.name` (set by the API server on every namespace, immutable): a
//!   `NotIn` listing it, an `In` not listing it, a `DoesNotExist`, or a `matchLabels` value other
//!   than its name. Other labels do not count: anyone who can label a namespace could change
//!   them. A webhook whose rules name only API groups the release's own CRDs define (or CRDs
//!   fleetgate applied before) is exempt: it sees only the operator's own kinds, which neither
//!   the agent nor kube-system depend on.

use crate::manifests::Manifest;
use crate::model::ReleaseAdmissionPolicySpec;
use serde_json::Value;
use std::collections::BTreeSet;

/// The label the API server puts on every namespace, with the namespace's name as value.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
const GROUP: &str = "admissionregistration.k8s.io";

/// What is wrong with one webhook of a configuration.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WebhookFinding {
    pub webhook: String,
    pub problem: String,
    /// Set when the problem is the called Service's namespace, outside `allowedNamespaces`:
    /// listing it there lifts the finding. Every other problem only a manifest change lifts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_namespace: Option<String>,
}

impl std::fmt::Display for WebhookFinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "webhook {}: {}", self.webhook, self.problem)
    }
}

/// Every webhook of `m` that breaks a rule of the module docs (the first rule each breaks).
pub(super) fn check(
    spec: &ReleaseAdmissionPolicySpec,
    m: &Manifest,
    protected: &[String],
    own_groups: &BTreeSet<&str>,
) -> Vec<WebhookFinding> {
    if !(m.key.is(GROUP, "ValidatingWebhookConfiguration") || m.key.is(GROUP, "MutatingWebhookConfiguration")) {
        return Vec::new();
    }
    let hooks = m.object.data.get("webhooks").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    hooks
        .iter()
        .filter_map(|hook| {
            let name = hook.get("name").and_then(Value::as_str).unwrap_or("").to_string();
            let (problem, service_namespace) = problem(spec, hook, protected, own_groups)?;
            Some(WebhookFinding { webhook: name, problem, service_namespace })
        })
        .collect()
}

fn problem(
    spec: &ReleaseAdmissionPolicySpec,
    hook: &Value,
    protected: &[String],
    own_groups: &BTreeSet<&str>,
) -> Option<(String, Option<String>)> {
    // What is wrong, and the Service namespace that lifts it when that is what is wrong.
    let client = hook.get("clientConfig");
    if let Some(url) = client.and_then(|c| c.get("url")).and_then(Value::as_str) {
        return Some((format!("clientConfig.url {url:?} is refused: a webhook may only call a Service"), None));
    }
    let service_ns = client.and_then(|c| c.get("service")).and_then(|s| s.get("namespace")).and_then(Value::as_str);
    match service_ns {
        None => return Some(("clientConfig has no service".into(), None)),
        Some(ns) if !spec.allows_namespace(ns) => {
            return Some((format!("clientConfig.service.namespace {ns} is not in allowedNamespaces"), Some(ns.into())));
        }
        Some(_) => {}
    }
    if only_own_groups(hook, own_groups) {
        return None;
    }
    let selector = hook.get("namespaceSelector").unwrap_or(&Value::Null);
    protected.iter().find(|ns| !excludes(selector, ns)).map(|ns| {
        let problem = format!(
            "namespaceSelector does not exclude namespace {ns} (require {NAMESPACE_NAME_LABEL} NotIn [{}])",
            protected.join(", ")
        );
        (problem, None)
    })
}

/// Whether every rule of `hook` names only groups of the release's own CRDs.
fn only_own_groups(hook: &Value, own_groups: &BTreeSet<&str>) -> bool {
    let rules = hook.get("rules").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    !rules.is_empty()
        && rules.iter().all(|r| {
            let groups: Vec<&str> = r
                .get("apiGroups")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            !groups.is_empty() && groups.iter().all(|g| own_groups.contains(g))
        })
}

/// Whether a namespace selector is certain not to match namespace `ns` (see the module docs).
fn excludes(selector: &Value, ns: &str) -> bool {
    let by_label = selector.get("matchLabels").and_then(|l| l.get(NAMESPACE_NAME_LABEL)).and_then(Value::as_str);
    if by_label.is_some_and(|v| v != ns) {
        return true;
    }
    let exprs = selector.get("matchExpressions").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    exprs.iter().filter(|e| e.get("key").and_then(Value::as_str) == Some(NAMESPACE_NAME_LABEL)).any(|e| {
        let values: Vec<&str> = e
            .get("values")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        match e.get("operator").and_then(Value::as_str) {
            Some("NotIn") => values.contains(&ns),
            Some("In") => !values.contains(&ns),
            Some("DoesNotExist") => true,
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    fn hook(client: Value, selector: Value, groups: &[&str]) -> Value {
        json!({"name": "h.example.com", "clientConfig": client, "namespaceSelector": selector,
               "rules": [{"apiGroups": groups, "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["*"]}]})
    }

    fn service(ns: &str) -> Value {
        json!({"service": {"name": "op", "namespace": ns}})
    }

    fn not_in(values: &[&str]) -> Value {
        json!({"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": values}]})
    }

    #[rstest]
    #[case::excluded(hook(service("op"), not_in(&["fleetgate-system", "kube-system"]), &[""]), None)]
    #[case::url(hook(json!({"url": "https://evil.example/"}), not_in(&["fleetgate-system", "kube-system"]), &[""]), Some("clientConfig.url"))]
    #[case::service_elsewhere(hook(service("default"), not_in(&["fleetgate-system", "kube-system"]), &[""]), Some("clientConfig.service.namespace default"))]
    #[case::no_selector(hook(service("op"), Value::Null, &[""]), Some("does not exclude namespace fleetgate-system"))]
    #[case::half_excluded(hook(service("op"), not_in(&["fleetgate-system"]), &["apps"]), Some("does not exclude namespace kube-system"))]
    #[case::other_label(hook(service("op"), json!({"matchLabels": {"team": "a"}}), &[""]), Some("does not exclude"))]
    #[case::in_list(hook(service("op"), json!({"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": ["op"]}]}), &[""]), None)]
    #[case::match_label(hook(service("op"), json!({"matchLabels": {NAMESPACE_NAME_LABEL: "op"}}), &[""]), None)]
    #[case::own_kinds_only(hook(service("op"), Value::Null, &["example.com"]), None)]
    #[case::own_and_core(hook(service("op"), Value::Null, &["example.com", ""]), Some("does not exclude"))]
    #[case::star_group(hook(service("op"), Value::Null, &["*"]), Some("does not exclude"))]
    fn webhook_rules(#[case] hook: Value, #[case] expected: Option<&str>) {
        let spec = ReleaseAdmissionPolicySpec { allowed_namespaces: Some(vec!["op".into()]), ..Default::default() };
        let protected = ["fleetgate-system".to_string(), "kube-system".to_string()];
        let found = problem(&spec, &hook, &protected, &BTreeSet::from(["example.com"]));
        match expected {
            None => assert_eq!(found, None),
            Some(text) => assert!(found.as_ref().is_some_and(|(f, _)| f.contains(text)), "{found:?}"),
        }
        // Only a Service outside allowedNamespaces is a finding a policy lifts.
        let lifted_by = found.and_then(|(_, ns)| ns);
        assert_eq!(lifted_by.is_some(), expected.is_some_and(|t| t.starts_with("clientConfig.service")));
    }
}
