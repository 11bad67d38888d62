//! Webhook reachability: a server-side dry-run create of a sample object. The API server runs every
//! mutating and validating admission webhook registered for the kind, so a webhook that is down,
//! unreachable or denying valid objects fails the gate; nothing is stored.

use super::{GateError, GateEvaluation, Threshold, Verdict, call};
use crate::model::error_chain;
use kube::api::{Api, DynamicObject, GroupVersionKind, PostParams};
use kube::discovery::Scope;
use serde_json::Value;
use std::time::Duration;

/// Dry-run creates `sample` (in `default_namespace` when it names none and the kind is namespaced).
pub(crate) async fn probe(
    client: &kube::Client,
    gate: &str,
    sample: &Value,
    default_namespace: &str,
    timeout: Duration,
) -> GateEvaluation {
    let s = |p: &str| sample.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
    let (api_version, kind, name) = (s("/apiVersion"), s("/kind"), s("/metadata/name"));
    let namespace =
        Some(s("/metadata/namespace")).filter(|n| !n.is_empty()).unwrap_or_else(|| default_namespace.to_string());
    let threshold = Threshold::Expect { what: format!("dry-run create of {kind} {name} accepted") };
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    let gvk = GroupVersionKind::gvk(group, version, &kind);

    let (resource, caps) =
        match call(format!("discovering {api_version} {kind}"), timeout, kube::discovery::pinned_kind(client, &gvk))
            .await
        {
            Ok(found) => found,
            Err(e) => return GateEvaluation::unknown(gate, error_chain(&e), threshold),
        };
    let mut object: DynamicObject = match serde_json::from_value(sample.clone()) {
        Ok(o) => o,
        Err(e) => return GateEvaluation::unknown(gate, format!("the sample is not an object: {e}"), threshold),
    };
    let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
        object.metadata.namespace = Some(namespace.clone());
        Api::namespaced_with(client.clone(), &namespace, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    let params = PostParams { dry_run: true, field_manager: Some(crate::FIELD_MANAGER.to_string()) };
    let outcome = call(format!("dry-run create of {kind} {name}"), timeout, api.create(&params, &object)).await;
    let (verdict, detail) = match outcome {
        Ok(_) => (Verdict::Pass, None),
        // Storage refused the name after admission had let the object through.
        Err(GateError::Kube { source: kube::Error::Api(status), .. }) if status.reason == "AlreadyExists" => {
            (Verdict::Pass, Some("admitted; an object of that name already exists".to_string()))
        }
        Err(GateError::Kube { source: kube::Error::Api(status), .. }) => {
            (Verdict::Fail, Some(format!("HTTP {} {}: {}", status.code, status.reason, status.message)))
        }
        Err(e) => (Verdict::Unknown { reason: error_chain(&e) }, None),
    };
    GateEvaluation { gate: gate.to_string(), verdict, observed: None, threshold, detail }
}
