//! Custom-resource health: a CEL expression over each object (`self` is the whole object), and the
//! share of objects for which it holds.

use super::workload::list_detail;
use super::{GateEvaluation, Threshold};
use crate::model::Quantity;
use serde_json::Value;

/// Why one object is not healthy, or `None` when the expression holds for it.
///
/// A missing field the expression reads (an object with no `status` yet) makes the object
/// unhealthy with the evaluator's reason, e.g. `No such key: status`.
pub fn unhealthy_reason(program: &cel::Program, object: &Value) -> Option<String> {
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("self", to_cel(object));
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(true)) => None,
        Ok(cel::Value::Bool(false)) => Some("expression is false".into()),
        Ok(other) => Some(format!("expression returned {other:?}, not a bool")),
        Err(e) => Some(e.to_string()),
    }
}

/// JSON to CEL the way Kubernetes does it: integers are `int` (cel's own serde conversion makes
/// positive ones `uint`, which `self.spec.size > 2` would then not compare with).
fn to_cel(v: &Value) -> cel::Value {
    use std::sync::Arc;
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => cel::Value::Map(cel::objects::Map {
            map: Arc::new(map.iter().map(|(k, v)| (cel::objects::Key::from(k.as_str()), to_cel(v))).collect()),
        }),
    }
}

/// Judges the objects of one kind: healthy share against `min_ratio`. No objects at all passes:
/// there is nothing unhealthy to hold the release back.
pub(crate) fn judge_objects(gate: &str, expression: &str, min_ratio: Quantity, objects: &[Value]) -> GateEvaluation {
    let threshold = Threshold::AtLeast { limit: Quantity::percent(min_ratio.value) };
    let program = match cel::Program::compile(expression) {
        Ok(p) => p,
        Err(e) => return GateEvaluation::unknown(gate, format!("CEL expression does not compile: {e}"), threshold),
    };
    let unhealthy: Vec<String> = objects
        .iter()
        .filter_map(|o| unhealthy_reason(&program, o).map(|r| format!("{}: {r}", object_key(o))))
        .collect();
    let total = objects.len();
    let share = if total == 0 { 1.0 } else { (total - unhealthy.len()) as f64 / total as f64 };
    let mut detail = vec![format!("{}/{total} healthy", total - unhealthy.len())];
    detail.extend(list_detail(&unhealthy));
    GateEvaluation::compare(gate, Quantity::percent(share), threshold, Some(detail.join("; ")))
}

fn object_key(o: &Value) -> String {
    let s = |p: &str| o.pointer(p).and_then(Value::as_str).unwrap_or("");
    match s("/metadata/namespace") {
        "" => s("/metadata/name").to_string(),
        ns => format!("{ns}/{}", s("/metadata/name")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const READY: &str = "self.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')";

    fn redis(name: &str, status: Option<&str>) -> Value {
        let mut o = json!({"apiVersion": "cache.example.com/v1", "kind": "RedisCluster", "metadata": {"name": name, "namespace": "demo"}, "spec": {"size": 3}});
        if let Some(s) = status {
            o["status"] = json!({"conditions": [{"type": "Ready", "status": s}]});
        }
        o
    }

    #[test]
    fn ready_not_ready_and_missing_status() {
        let objects = [redis("a", Some("True")), redis("b", Some("False")), redis("c", None)];
        let e = judge_objects("ready", READY, Quantity::percent(1.0), &objects);
        assert!(e.is_fail());
        assert_eq!(
            e.to_string(),
            "ready 33.3 % < 100 % — 1/3 healthy; demo/b: expression is false; demo/c: No such key: status"
        );
        let e = judge_objects("ready", READY, Quantity::percent(0.3), &objects);
        assert!(e.is_pass(), "{e}");
    }

    #[test]
    fn no_objects_pass() {
        let e = judge_objects("ready", READY, Quantity::percent(1.0), &[]);
        assert!(e.is_pass());
        assert_eq!(e.to_string(), "ready 100 % ≥ 100 % — 0/0 healthy");
    }

    #[test]
    fn a_non_bool_expression_is_reported_per_object() {
        let e = judge_objects("ready", "self.spec.size", Quantity::percent(1.0), &[redis("a", None)]);
        assert!(e.to_string().contains("expression returned Int(3), not a bool"), "{e}");
    }

    #[test]
    fn integers_compare_with_int_literals() {
        let e = judge_objects(
            "big",
            "self.spec.size > 2 && self.spec.size * 2 == 6",
            Quantity::percent(1.0),
            &[redis("a", None)],
        );
        assert!(e.is_pass(), "{e}");
    }
}
