//! Local validation of a custom resource against a CRD version's structural schema — what the API
//! server would say about the object once the new CRD is in place, decided before it is.
//!
//! Pre-apply cannot ask the server: a dry run validates against the CRD that is live, not the one
//! about to replace it. So this checks, per node: type (with `nullable`,
//! `x-kubernetes-int-or-string`), `required`, `enum`, numeric bounds, string length and `pattern`,
//! item counts, property counts, and `allOf`/`anyOf`/`oneOf`/`not`; it descends through
//! `properties`, `items` and `additionalProperties`. Unknown fields are not violations (the server
//! prunes them). `metadata`, `apiVersion` and `kind` at the root are the server's own business, and
//! `x-kubernetes-validations` (CEL rules) are not evaluated here: they run on the object's next write.

use super::crd_compat::{child_path, shown_path};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// One reason an object would not validate. It names the path and the schema's rule, never the
/// object's value there: violations end up in statuses in Git, and custom resources can hold
/// anything (a password in a spec field fails a `pattern` like any other string).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// JSON path in the object, e.g. `.spec.size`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every violation of `schema` (a version's `openAPIV3Schema`) by `object` (a whole custom resource).
pub fn validate(schema: &JSONSchemaProps, object: &Value) -> Vec<Violation> {
    let mut out = Vec::new();
    node(schema, object, "", true, &mut out);
    out
}

fn violation(out: &mut Vec<Violation>, path: &str, message: String) {
    out.push(Violation { path: shown_path(path).to_string(), message });
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(s: &JSONSchemaProps, v: &Value) -> bool {
    if s.x_kubernetes_int_or_string == Some(true) {
        return matches!(json_type(v), "integer" | "string");
    }
    match s.type_.as_deref() {
        None | Some("") => true,
        Some("number") => matches!(json_type(v), "integer" | "number"),
        // JSON has one number type: 3.0 is an integer to the API server.
        Some("integer") => v.as_f64().is_some_and(|f| f.fract() == 0.0),
        Some(t) => json_type(v) == t,
    }
}

fn node(s: &JSONSchemaProps, v: &Value, path: &str, root: bool, out: &mut Vec<Violation>) {
    if v.is_null() {
        if s.nullable != Some(true) && !(s.type_.is_none() && s.x_kubernetes_int_or_string != Some(true)) {
            violation(out, path, "must not be null".into());
        }
        return;
    }
    if !type_ok(s, v) {
        let want =
            if s.x_kubernetes_int_or_string == Some(true) { "int-or-string" } else { s.type_.as_deref().unwrap_or("") };
        violation(out, path, format!("must be of type {want}, is {}", json_type(v)));
        return;
    }
    if let Some(values) = &s.enum_
        && !values.iter().any(|e| e.0 == *v)
    {
        let allowed: Vec<String> = values.iter().map(|e| e.0.to_string()).collect();
        violation(out, path, format!("is not one of {}", allowed.join(", ")));
    }
    bounds(s, v, path, out);
    combinators(s, v, path, out);

    match v {
        Value::Object(map) => {
            for r in s.required.iter().flatten() {
                let server_owned = root && is_server_field(r);
                if !map.contains_key(r) && !server_owned {
                    violation(out, &child_path(path, r), "required field is missing".into());
                }
            }
            for (key, value) in map {
                if root && is_server_field(key) {
                    continue;
                }
                let p = child_path(path, key);
                match s.properties.as_ref().and_then(|ps| ps.get(key)) {
                    Some(ps) => node(ps, value, &p, false, out),
                    None => {
                        if let Some(JSONSchemaPropsOrBool::Schema(ap)) = &s.additional_properties {
                            node(ap, value, &p, false, out);
                        }
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(is)) = &s.items {
                for (i, item) in items.iter().enumerate() {
                    node(is, item, &format!("{path}[{i}]"), false, out);
                }
            }
        }
        _ => {}
    }
}

/// Root fields the API server validates itself, whatever the CRD schema says.
fn is_server_field(key: &str) -> bool {
    matches!(key, "apiVersion" | "kind" | "metadata")
}

fn bounds(s: &JSONSchemaProps, v: &Value, path: &str, out: &mut Vec<Violation>) {
    if let Some(n) = v.as_f64() {
        if let Some(min) = s.minimum {
            let exclusive = s.exclusive_minimum == Some(true);
            if n < min || (exclusive && n == min) {
                violation(
                    out,
                    path,
                    format!("is below the minimum {}{min}", if exclusive { "(exclusive) " } else { "" }),
                );
            }
        }
        if let Some(max) = s.maximum {
            let exclusive = s.exclusive_maximum == Some(true);
            if n > max || (exclusive && n == max) {
                violation(
                    out,
                    path,
                    format!("is above the maximum {}{max}", if exclusive { "(exclusive) " } else { "" }),
                );
            }
        }
        if let Some(m) = s.multiple_of
            && m != 0.0
            && (n / m).fract().abs() > 1e-9
        {
            violation(out, path, format!("is not a multiple of {m}"));
        }
    }
    if let Some(text) = v.as_str() {
        let len = text.chars().count() as i64;
        if s.min_length.is_some_and(|m| len < m) {
            violation(out, path, format!("is {len} characters, shorter than {}", s.min_length.unwrap_or_default()));
        }
        if s.max_length.is_some_and(|m| len > m) {
            violation(out, path, format!("is {len} characters, longer than {}", s.max_length.unwrap_or_default()));
        }
        if let Some(p) = &s.pattern {
            match regex::Regex::new(p) {
                Ok(re) if !re.is_match(text) => violation(out, path, format!("does not match pattern {p:?}")),
                Ok(_) => {}
                // A pattern the API server accepted but Rust's regex cannot read is not the
                // object's fault; say so instead of guessing.
                Err(e) => violation(out, path, format!("pattern {p:?} cannot be checked locally: {e}")),
            }
        }
    }
    if let Some(items) = v.as_array() {
        let n = items.len() as i64;
        if s.min_items.is_some_and(|m| n < m) {
            violation(out, path, format!("has {n} items, fewer than {}", s.min_items.unwrap_or_default()));
        }
        if s.max_items.is_some_and(|m| n > m) {
            violation(out, path, format!("has {n} items, more than {}", s.max_items.unwrap_or_default()));
        }
    }
    if let Some(map) = v.as_object() {
        let n = map.len() as i64;
        if s.min_properties.is_some_and(|m| n < m) {
            violation(out, path, format!("has {n} properties, fewer than {}", s.min_properties.unwrap_or_default()));
        }
        if s.max_properties.is_some_and(|m| n > m) {
            violation(out, path, format!("has {n} properties, more than {}", s.max_properties.unwrap_or_default()));
        }
    }
}

fn combinators(s: &JSONSchemaProps, v: &Value, path: &str, out: &mut Vec<Violation>) {
    let passes = |sub: &JSONSchemaProps| {
        let mut scratch = Vec::new();
        node(sub, v, path, false, &mut scratch);
        scratch.is_empty()
    };
    for sub in s.all_of.iter().flatten() {
        node(sub, v, path, false, out);
    }
    if let Some(any) = &s.any_of
        && !any.iter().any(passes)
    {
        violation(out, path, "matches none of the anyOf schemas".into());
    }
    if let Some(one) = &s.one_of {
        let n = one.iter().filter(|sub| passes(sub)).count();
        if n != 1 {
            violation(out, path, format!("matches {n} of the oneOf schemas, not exactly one"));
        }
    }
    if let Some(not) = &s.not
        && passes(not)
    {
        violation(out, path, "matches the schema under `not`".into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    fn schema() -> JSONSchemaProps {
        serde_json::from_value(json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "integer", "minimum": 1, "maximum": 9},
                        "mode": {"type": "string", "enum": ["standalone", "cluster"]},
                        "image": {"type": "string", "pattern": "^[a-z0-9./-]+:[a-z0-9.]+$", "maxLength": 40},
                        "port": {"x-kubernetes-int-or-string": true},
                        "note": {"type": "string", "nullable": true},
                        "ports": {"type": "array", "maxItems": 2, "items": {"type": "object", "required": ["port"], "properties": {"port": {"type": "integer"}}}},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                    }
                },
                "status": {"type": "object"}
            }
        }))
        .unwrap()
    }

    fn object(spec: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "cache.example.com/v1", "kind": "RedisCluster", "metadata": {"name": "a", "labels": {"x": "y"}}, "spec": spec})
    }

    #[rstest]
    #[case::valid(json!({"size": 3, "mode": "cluster", "image": "redis:7", "port": "http", "note": null, "ports": [{"port": 1}], "labels": {"a": "b"}, "extra": {"any": [1]}, "unknown": 1}), &[])]
    #[case::integral_float(json!({"size": 3.0}), &[])]
    #[case::missing_required(json!({"mode": "cluster"}), &[".spec.size: required field is missing"])]
    #[case::wrong_type(json!({"size": "three"}), &[".spec.size: must be of type integer, is string"])]
    #[case::not_in_enum(json!({"size": 1, "mode": "sentinel"}), &[".spec.mode: is not one of \"standalone\", \"cluster\""])]
    #[case::below_minimum(json!({"size": 0}), &[".spec.size: is below the minimum 1"])]
    #[case::pattern(json!({"size": 1, "image": "Redis"}), &[".spec.image: does not match pattern \"^[a-z0-9./-]+:[a-z0-9.]+$\""])]
    #[case::int_or_string(json!({"size": 1, "port": true}), &[".spec.port: must be of type int-or-string, is boolean"])]
    #[case::null_not_allowed(json!({"size": 1, "mode": null}), &[".spec.mode: must not be null"])]
    #[case::items(json!({"size": 1, "ports": [{"port": "x"}, {}, {"port": 2}]}), &[".spec.ports: has 3 items, more than 2", ".spec.ports[0].port: must be of type integer, is string", ".spec.ports[1].port: required field is missing"])]
    #[case::map_values(json!({"size": 1, "labels": {"app.kubernetes.io/name": 3}}), &[".spec.labels[\"app.kubernetes.io/name\"]: must be of type string, is integer"])]
    fn objects_are_checked_like_the_api_server_would(#[case] spec: serde_json::Value, #[case] want: &[&str]) {
        let got: Vec<String> = validate(&schema(), &object(spec)).iter().map(ToString::to_string).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_missing_spec_is_reported_at_the_root() {
        let got = validate(&schema(), &json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"}}));
        assert_eq!(got, vec![Violation { path: ".spec".into(), message: "required field is missing".into() }]);
    }
}
