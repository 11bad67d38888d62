//! Projections of a live object onto a field set, so comparisons and snapshots see only the
//! fields that matter and not what the server filled in:
//!
//! * [`managed_fields`] — onto the fields a manager owns according to `metadata.managedFields`
//!   (`FieldsV1`); snapshots keep exactly what fleetgate applied, with its live values.
//! * [`project_like`] — onto the shape of a desired object; drift compares only what the
//!   release says, so server defaults never count as drift.

use serde_json::{Map, Value};

/// The union of the `FieldsV1` sets `manager` owns through server-side apply on `obj`.
pub(crate) fn applied_field_set(obj: &Value, manager: &str) -> Map<String, Value> {
    let mut union = Map::new();
    let entries = obj.pointer("/metadata/managedFields").and_then(Value::as_array).into_iter().flatten();
    for e in entries {
        let is_ours = e.get("manager").and_then(Value::as_str) == Some(manager)
            && e.get("operation").and_then(Value::as_str) == Some("Apply");
        if let (true, Some(Value::Object(fs))) = (is_ours, e.get("fieldsV1")) {
            merge_sets(&mut union, fs);
        }
    }
    union
}

fn merge_sets(into: &mut Map<String, Value>, from: &Map<String, Value>) {
    for (k, v) in from {
        match (into.get_mut(k), v) {
            (Some(Value::Object(a)), Value::Object(b)) => merge_sets(a, b),
            _ => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

/// `obj` reduced to the fields `manager` applied (apiVersion, kind, name and namespace are
/// always kept, so the result can be applied again).
pub(crate) fn managed_fields(obj: &Value, manager: &str) -> Value {
    let set = applied_field_set(obj, manager);
    let mut out = project(obj, &set);
    if let Value::Object(out) = &mut out {
        for k in ["apiVersion", "kind"] {
            if let Some(v) = obj.get(k) {
                out.insert(k.to_string(), v.clone());
            }
        }
        let meta = out.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
        for k in ["name", "namespace"] {
            if let (Some(v), Value::Object(meta)) = (obj.pointer(&format!("/metadata/{k}")), &mut *meta) {
                meta.insert(k.to_string(), v.clone());
            }
        }
    }
    out
}

/// `value` reduced to the fields of a `FieldsV1` set. An empty set below a field means the
/// field is owned as a whole (a scalar, or an atomic map or list).
fn project(value: &Value, set: &Map<String, Value>) -> Value {
    match value {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, sub) in set {
                let Some(name) = k.strip_prefix("f:") else { continue };
                if let Some(child) = m.get(name) {
                    out.insert(name.to_string(), project_child(child, sub));
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => {
            let mut out = Vec::new();
            for (i, item) in items.iter().enumerate() {
                for (k, sub) in set {
                    if let Some(key) = k.strip_prefix("k:") {
                        let Ok(Value::Object(key)) = serde_json::from_str::<Value>(key) else { continue };
                        if key.iter().all(|(f, v)| item.get(f) == Some(v)) {
                            let mut projected = project_child(item, sub);
                            if let Value::Object(p) = &mut projected {
                                p.extend(key.clone());
                            }
                            out.push(projected);
                        }
                    } else if let Some(v) = k.strip_prefix("v:") {
                        if serde_json::from_str::<Value>(v).ok().as_ref() == Some(item) {
                            out.push(item.clone());
                        }
                    } else if let Some(n) = k.strip_prefix("i:")
                        && n.parse::<usize>() == Ok(i)
                    {
                        out.push(project_child(item, sub));
                    }
                }
            }
            Value::Array(out)
        }
        scalar => scalar.clone(),
    }
}

fn project_child(child: &Value, sub: &Value) -> Value {
    match sub.as_object() {
        Some(s) if s.keys().any(|k| k != ".") => project(child, s),
        _ => child.clone(),
    }
}

/// Fields that identify an item of a list of objects (containers, env, ports, volumes …), tried
/// in this order, so a reordered or extended list still compares item by item.
const MERGE_KEYS: [&str; 6] = ["name", "mountPath", "containerPort", "port", "devicePath", "ip"];

/// `live` reduced to the shape of `desired`: keys `desired` does not have are dropped (server
/// defaults, status, managedFields …), list items are matched by their merge key (or
/// position), and live list items `desired` does not have are kept (they are drift). A desired
/// empty value (`{}`, `[]`, null) that the server left out counts as equal, and so does a
/// number the server returned as the same text.
pub(crate) fn project_like(live: &Value, desired: &Value) -> Value {
    match (live, desired) {
        (Value::Object(l), Value::Object(d)) => {
            let mut out = Map::new();
            for (k, dv) in d {
                match l.get(k) {
                    Some(lv) => {
                        out.insert(k.clone(), project_like(lv, dv));
                    }
                    None if is_empty(dv) => {
                        out.insert(k.clone(), dv.clone());
                    }
                    None => {}
                }
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(d)) => {
            let mut used = vec![false; l.len()];
            let mut out = Vec::new();
            for (i, dv) in d.iter().enumerate() {
                let by_key = MERGE_KEYS.iter().find_map(|k| dv.get(*k).map(|v| (*k, v)));
                let found = match by_key {
                    Some((k, v)) => l.iter().enumerate().position(|(j, lv)| !used[j] && lv.get(k) == Some(v)),
                    None => (i < l.len() && !used[i]).then_some(i),
                };
                if let Some(j) = found {
                    used[j] = true;
                    out.push(project_like(&l[j], dv));
                }
            }
            out.extend(l.iter().zip(&used).filter(|(_, u)| !**u).map(|(lv, _)| lv.clone()));
            Value::Array(out)
        }
        (Value::String(s), Value::Number(n)) if *s == n.to_string() => desired.clone(),
        _ => live.clone(),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn live_deployment() -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "op", "namespace": "ns", "uid": "u-1", "resourceVersion": "42", "generation": 3,
                "labels": {"app": "op", "fleetgate.io/release": "rel-1"},
                "annotations": {"deployment.kubernetes.io/revision": "3"},
                "managedFields": [
                    {"manager": "fleetgate", "operation": "Apply", "apiVersion": "apps/v1", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}, "f:fleetgate.io/release": {}}},
                                  "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                                      "k:{\"name\":\"manager\"}": {".": {}, "f:name": {}, "f:image": {}, "f:args": {}}}}}}}},
                    {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
                     "fieldsV1": {"f:metadata": {"f:annotations": {"f:deployment.kubernetes.io/revision": {}}}}},
                    {"manager": "kubectl-edit", "operation": "Update", "apiVersion": "apps/v1",
                     "fieldsV1": {"f:spec": {"f:paused": {}}}}
                ]
            },
            "spec": {
                "replicas": 2, "paused": true, "progressDeadlineSeconds": 600,
                "template": {"spec": {"containers": [
                    {"name": "sidecar", "image": "s:1"},
                    {"name": "manager", "image": "op:v1", "args": ["--a"], "terminationMessagePath": "/dev/termination-log"}
                ], "restartPolicy": "Always"}}
            },
            "status": {"replicas": 2}
        })
    }

    #[test]
    fn managed_fields_keep_exactly_what_fleetgate_applied() {
        assert_eq!(
            managed_fields(&live_deployment(), "fleetgate"),
            json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "op", "namespace": "ns", "labels": {"app": "op", "fleetgate.io/release": "rel-1"}},
                "spec": {"replicas": 2, "template": {"spec": {"containers": [
                    {"name": "manager", "image": "op:v1", "args": ["--a"]}
                ]}}}
            })
        );
    }

    #[test]
    fn set_valued_list_items() {
        let obj = json!({"spec": {"finalizers": ["a", "b", "c"]}, "metadata": {"managedFields": [
            {"manager": "m", "operation": "Apply", "fieldsV1": {"f:spec": {"f:finalizers": {"v:\"a\"": {}, "v:\"c\"": {}}}}}
        ]}});
        assert_eq!(managed_fields(&obj, "m")["spec"], json!({"finalizers": ["a", "c"]}));
    }

    #[test]
    fn project_like_drops_server_defaults_and_keeps_changes() {
        let desired = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "op", "namespace": "ns", "labels": {"app": "op"}},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "manager", "image": "op:v1", "resources": {}}]}}}
        });
        let projected = project_like(&live_deployment(), &desired);
        assert_eq!(
            projected,
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "op", "namespace": "ns", "labels": {"app": "op"}},
                "spec": {"replicas": 2, "template": {"spec": {"containers": [
                    {"name": "manager", "image": "op:v1", "resources": {}},
                    {"name": "sidecar", "image": "s:1"}
                ]}}}
            }),
            "replicas changed and the added sidecar show; defaults, status and the empty resources do not"
        );
    }

    #[test]
    fn project_like_numbers_as_text_and_positional_lists() {
        let desired = json!({"data": {"n": 1}, "args": ["a", "b"]});
        let live = json!({"data": {"n": "1"}, "args": ["a", "c", "d"]});
        assert_eq!(project_like(&live, &desired), json!({"data": {"n": 1}, "args": ["a", "c", "d"]}));
    }
}
