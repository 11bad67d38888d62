//! Custom-resource health: a CEL expression over each object (`self` is the whole object), and the
//! share of objects for which it holds.
//!
//! A gate reads every object of its kind and reports on each, so what it says ends up in logs,
//! Events and statuses in Git. Two rules keep object data out of there: a gate may read only kinds
//! of the release's own CRDs or kinds the agent allows ([`check_gate_kinds`]), and nothing a gate
//! reports quotes a value read from an object — a non-bool result is a configuration error that
//! names the gate and the expression ([`CelGateError`]), and evaluation errors are re-worded to
//! name types instead of values (cel's own messages print the values involved).

use super::workload::list_detail;
use super::{GateEvaluation, Threshold};
use crate::model::{GateCheck, GatePolicySpec, Quantity};
use cel::ExecutionError;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;
use std::fmt;

/// A `customResources` gate that cannot judge objects as written. It names the gate and the
/// expression, never what the expression returned: that is object data (`self.data` of a Secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelGateError {
    #[error("configuration error: gate {gate:?}: CEL expression `{expression}` does not compile: {message}")]
    DoesNotCompile { gate: String, expression: String, message: String },
    #[error("configuration error: gate {gate:?}: CEL expression `{expression}` returned a {got}, not a bool")]
    NotABool { gate: String, expression: String, got: String },
}

/// What the expression says about one object.
#[derive(Debug, Clone, PartialEq)]
enum Health {
    Healthy,
    /// Why not, in words that quote only the expression and CEL type names.
    Unhealthy(String),
    /// The expression returned a value of this CEL type instead of a bool.
    NotABool(String),
}

fn health(program: &cel::Program, expression: &str, object: &Value) -> Health {
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("self", to_cel(object));
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(true)) => Health::Healthy,
        Ok(cel::Value::Bool(false)) => Health::Unhealthy("expression is false".into()),
        Ok(other) => Health::NotABool(other.type_of().to_string()),
        Err(e) => Health::Unhealthy(failure_reason(&e, expression)),
    }
}

/// Why evaluating `expression` failed, quoting only what the expression spells (keys, names,
/// functions, operators) and CEL type names: cel's own messages print the values involved
/// (`Unsupported binary operator '+': String("…"), Int(1)`), and those are object data.
fn failure_reason(err: &ExecutionError, expression: &str) -> String {
    use ExecutionError as E;
    let ty = |v: &cel::Value| v.type_of().to_string();
    match err {
        // The usual case: an object with no `status` yet. A key computed from the object
        // (`self.data[self.spec.key]`) is data itself, so only keys the expression spells are shown.
        E::NoSuchKey(key) if spelled_in(expression, key) => format!("No such key: {key}"),
        E::NoSuchKey(_) => "No such key (computed from the object, not shown)".into(),
        E::UndeclaredReference(name) if spelled_in(expression, name) => format!("Undeclared reference to '{name}'"),
        E::NoSuchOverload(o) => format!("found no matching overload for '{}'", o.function()),
        E::InvalidArgumentCount { .. } | E::MissingArgumentOrTarget => err.to_string(),
        // `want` is a type; `got` is sometimes the value itself.
        E::UnexpectedType { want, .. } => format!("Unexpected type: want '{want}'"),
        E::UnsupportedTargetType { target } => format!("Invalid argument type: {}", ty(target)),
        E::NotSupportedAsMethod { method, target } => format!("Method '{method}' not supported on type {}", ty(target)),
        E::UnsupportedKeyType(v) => format!("Unable to use a {} as a key", ty(v)),
        E::ValuesNotComparable(a, b) => format!("a {} can not be compared to a {}", ty(a), ty(b)),
        E::UnsupportedBinaryOperator(op, a, b) => format!("Unsupported binary operator '{op}': {}, {}", ty(a), ty(b)),
        E::Overflow(op, a, b) => format!("Overflow from binary operator '{op}': {}, {}", ty(a), ty(b)),
        E::UnsupportedIndex(index, target) => format!("Cannot use a {} to index a {}", ty(index), ty(target)),
        // The message of a function (a regex that does not compile, …) may quote its arguments.
        E::FunctionError { function, .. } => format!("Error executing function '{function}'"),
        E::DivisionByZero(_) => "Division by zero".into(),
        E::RemainderByZero(_) => "Remainder by zero".into(),
        E::IndexOutOfBounds(_) => "Index out of bounds".into(),
        E::DuplicateKey(_) => "Failed with repeated key".into(),
        // Deprecated, internal or future variants may carry values too.
        _ => "evaluation failed".into(),
    }
}

/// Whether `word` occurs in `expression` as a whole token (not inside a longer name), so echoing
/// it tells nothing the policy's author did not write.
fn spelled_in(expression: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    !word.is_empty()
        && expression.match_indices(word).any(|(at, _)| {
            let before = expression[..at].chars().next_back();
            let after = expression[at + word.len()..].chars().next();
            !before.is_some_and(ident) && !after.is_some_and(ident)
        })
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
/// there is nothing unhealthy to hold the release back. An expression that does not compile, or
/// returns anything but a bool for any object, fails the gate as a configuration error.
pub(crate) fn judge_objects(gate: &str, expression: &str, min_ratio: Quantity, objects: &[Value]) -> GateEvaluation {
    let threshold = Threshold::AtLeast { limit: Quantity::percent(min_ratio.value) };
    let misconfigured = |error: CelGateError| GateEvaluation::misconfigured(gate, &error, threshold.clone());
    let program = match cel::Program::compile(expression) {
        Ok(p) => p,
        Err(e) => {
            return misconfigured(CelGateError::DoesNotCompile {
                gate: gate.into(),
                expression: expression.into(),
                message: e.to_string(),
            });
        }
    };
    let mut unhealthy = Vec::new();
    for o in objects {
        match health(&program, expression, o) {
            Health::Healthy => {}
            Health::Unhealthy(reason) => unhealthy.push(format!("{}: {reason}", object_key(o))),
            Health::NotABool(got) => {
                return misconfigured(CelGateError::NotABool { gate: gate.into(), expression: expression.into(), got });
            }
        }
    }
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

/// `customResources` gates that read kinds they may not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateKindError {
    #[error(
        "customResources gates may read only kinds of the release's own CRDs or kinds the agent allows \
         (--allow-gate-kind): {}",
        .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    NotAllowed(Vec<ForeignGateKind>),
}

/// One gate reading a kind that is neither the release's nor allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignGateKind {
    pub gate: String,
    /// `Kind.group`, or `Kind` for the core group: the form `--allow-gate-kind` takes.
    pub kind: String,
}

impl fmt::Display for ForeignGateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gate {:?} reads {}", self.gate, self.kind)
    }
}

/// Checks that every `customResources` gate of `policy` reads a kind one of `release_crds`
/// defines (same group and kind: a CRD of kind `Secret` in another group does not admit core
/// Secrets) or a kind in `allowed` (`Kind.group`, `Kind` for the core group).
///
/// A gate reads every object of its kind with the agent's permissions and reports on each, so
/// whoever writes the policy could otherwise read anything the agent can (Secrets included): the
/// release's own custom resources are what these gates are for, anything else is the spoke's
/// decision.
pub fn check_gate_kinds(
    policy: &GatePolicySpec,
    release_crds: &[CustomResourceDefinition],
    allowed: &[String],
) -> Result<(), GateKindError> {
    let foreign: Vec<ForeignGateKind> = policy
        .gates
        .iter()
        .filter_map(|g| match &g.check {
            GateCheck::CustomResources(c) => Some((g, c)),
            _ => None,
        })
        .filter_map(|(g, c)| {
            // `validate` refuses an apiVersion with more than one `/`; `v1` is the core group.
            let group = c.api_version.rsplit_once('/').map_or("", |(group, _)| group);
            let own = release_crds.iter().any(|crd| crd.spec.group == group && crd.spec.names.kind == c.kind);
            let kind = qualified_kind(&c.kind, group);
            (!own && !allowed.contains(&kind)).then(|| ForeignGateKind { gate: g.name.clone(), kind })
        })
        .collect();
    if foreign.is_empty() { Ok(()) } else { Err(GateKindError::NotAllowed(foreign)) }
}

/// `Secret`, `Deployment.apps`, `RedisCluster.cache.example.com`.
fn qualified_kind(kind: &str, group: &str) -> String {
    if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CustomResourcesGate, Gate, PodRestartsGate};
    use rstest::rstest;
    use serde_json::json;

    const READY: &str = "self.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')";
    const SECRET: &str = "s3cr3t-do-not-leak-7f3a";

    fn redis(name: &str, status: Option<&str>) -> Value {
        let mut o = json!({"apiVersion": "cache.example.com/v1", "kind": "RedisCluster", "metadata": {"name": name, "namespace": "demo"}, "spec": {"size": 3}});
        if let Some(s) = status {
            o["status"] = json!({"conditions": [{"type": "Ready", "status": s}]});
        }
        o
    }

    /// A Secret as the API returns it (base64 in `data`), with the plain value beside it so that
    /// expressions can operate on it as a string.
    fn secret() -> Value {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "demo"},
               "data": {"password": b64, "plain": SECRET, "list": [SECRET]}})
    }

    fn leaks(e: &GateEvaluation) -> bool {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
        let shown = format!("{e} {}", serde_json::to_string(e).unwrap());
        shown.contains(SECRET) || shown.contains(&b64) || shown.contains("7f3a")
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

    #[rstest]
    #[case::map("self.data", "map")]
    #[case::string("self.data.plain", "string")]
    #[case::int("self.spec.size", "int")]
    fn a_non_bool_result_is_a_configuration_error_that_never_shows_the_value(
        #[case] expression: &str,
        #[case] got: &str,
    ) {
        let objects = [redis("a", Some("True")), secret()];
        let e = judge_objects("peek", expression, Quantity::percent(0.0), &objects);
        assert!(e.is_fail(), "a configuration error fails whatever the ratio: {e}");
        assert_eq!(e.observed, None);
        assert_eq!(
            e.detail.as_deref(),
            Some(
                format!(
                    "configuration error: gate \"peek\": CEL expression `{expression}` returned a {got}, not a bool"
                )
                .as_str()
            )
        );
        assert!(!leaks(&e), "{e}");
    }

    #[test]
    fn an_expression_that_does_not_compile_is_a_configuration_error() {
        let e = judge_objects("broken", "self.status.(", Quantity::percent(1.0), &[redis("a", None)]);
        assert!(e.is_fail(), "{e}");
        let detail = e.detail.unwrap();
        assert!(
            detail
                .starts_with("configuration error: gate \"broken\": CEL expression `self.status.(` does not compile: "),
            "{detail}"
        );
    }

    /// Every evaluation error cel can be led into by data: the reason names types, never values.
    #[rstest]
    #[case::binary_operator("self.data.plain + 1 == 2", "Unsupported binary operator 'add': string, int")]
    #[case::comparison("self.data.plain > 1", "found no matching overload for '_>_'")]
    #[case::computed_key("self.data[self.data.plain] == 'x'", "No such key (computed from the object, not shown)")]
    #[case::spelled_key("self.data.token == 'x'", "No such key: token")]
    #[case::conversion("int(self.data.plain) == 1", "Error executing function 'int'")]
    #[case::regex("'x'.matches(self.data.plain + '(')", "Error executing function 'matches'")]
    #[case::method("self.data.list[0].exists(x, x)", "Unexpected type: want 'iterable'")]
    #[case::index("self.data.list[self.data.plain] == 'x'", "found no matching overload for '_[_]'")]
    #[case::division("size(self.data.list) / 0 == 1", "Division by zero")]
    #[case::bounds("self.data.list[5] == 'x'", "Index out of bounds")]
    fn evaluation_errors_never_quote_object_values(#[case] expression: &str, #[case] want: &str) {
        let e = judge_objects("peek", expression, Quantity::percent(1.0), &[secret()]);
        assert!(e.is_fail(), "{e}");
        assert!(!leaks(&e), "{expression}: {e}");
        assert_eq!(e.detail.as_deref(), Some(format!("0/1 healthy; demo/db: {want}").as_str()), "{expression}");
    }

    #[rstest]
    #[case("self.status.ready", "status", true)]
    #[case("self.data['token'] == 'x'", "token", true)]
    #[case("self.metadata.name == 'b'", "a", false)]
    #[case("self.statuses", "status", false)]
    #[case("self.status", "", false)]
    fn keys_are_shown_only_when_the_expression_spells_them(
        #[case] expression: &str,
        #[case] word: &str,
        #[case] spelled: bool,
    ) {
        assert_eq!(spelled_in(expression, word), spelled, "{expression} / {word}");
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

    fn crd(group: &str, kind: &str) -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{}s.{group}", kind.to_lowercase())},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": format!("{}s", kind.to_lowercase())},
                     "versions": [{"name": "v1", "served": true, "storage": true}]},
        }))
        .unwrap()
    }

    fn gates(kinds: &[(&str, &str, &str)]) -> GatePolicySpec {
        let mut gates: Vec<Gate> = kinds
            .iter()
            .map(|(name, api_version, kind)| Gate {
                name: (*name).into(),
                on_unknown: None,
                select: None,
                check: GateCheck::CustomResources(CustomResourcesGate {
                    api_version: (*api_version).into(),
                    kind: (*kind).into(),
                    namespace: None,
                    expression: "true".into(),
                    min_healthy_ratio: Quantity::percent(1.0),
                }),
            })
            .collect();
        gates.push(Gate {
            name: "restarts".into(),
            on_unknown: None,
            select: None,
            check: GateCheck::PodRestarts(PodRestartsGate { max: 3 }),
        });
        GatePolicySpec {
            bake_time: std::time::Duration::from_secs(60),
            rollback_bake_time: None,
            interval: std::time::Duration::from_secs(5),
            call_timeout: std::time::Duration::from_secs(5),
            on_unknown: Default::default(),
            prometheus: None,
            select: None,
            gates,
        }
    }

    fn allow(kinds: &[&str]) -> Vec<String> {
        kinds.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn gates_may_read_the_releases_own_kinds() {
        let policy = gates(&[("ready", "cache.example.com/v1alpha1", "RedisCluster")]);
        assert_eq!(check_gate_kinds(&policy, &[crd("cache.example.com", "RedisCluster")], &[]), Ok(()));
    }

    #[test]
    fn other_kinds_are_refused_naming_every_gate() {
        let policy = gates(&[
            ("peek", "v1", "Secret"),
            ("ready", "cache.example.com/v1", "RedisCluster"),
            ("apps", "apps/v1", "Deployment"),
        ]);
        let err = check_gate_kinds(&policy, &[crd("cache.example.com", "RedisCluster")], &[]).unwrap_err();
        assert_eq!(
            err,
            GateKindError::NotAllowed(vec![
                ForeignGateKind { gate: "peek".into(), kind: "Secret".into() },
                ForeignGateKind { gate: "apps".into(), kind: "Deployment.apps".into() },
            ])
        );
        assert_eq!(
            err.to_string(),
            "customResources gates may read only kinds of the release's own CRDs or kinds the agent allows \
             (--allow-gate-kind): gate \"peek\" reads Secret; gate \"apps\" reads Deployment.apps"
        );
    }

    #[test]
    fn a_crd_of_the_same_kind_in_another_group_does_not_admit_the_built_in() {
        let policy = gates(&[("peek", "v1", "Secret")]);
        let err = check_gate_kinds(&policy, &[crd("evil.example.com", "Secret")], &[]);
        assert!(matches!(err, Err(GateKindError::NotAllowed(ref f)) if f[0].kind == "Secret"), "{err:?}");
    }

    #[test]
    fn the_agents_allow_list_admits_kinds_by_kind_and_group() {
        let policy = gates(&[("peek", "v1", "Secret"), ("apps", "apps/v1", "Deployment")]);
        assert_eq!(check_gate_kinds(&policy, &[], &allow(&["Secret", "Deployment.apps"])), Ok(()));
        // `Deployment` alone names the core group, which has none.
        let err = check_gate_kinds(&policy, &[], &allow(&["Secret", "Deployment"])).unwrap_err();
        assert_eq!(
            err,
            GateKindError::NotAllowed(vec![ForeignGateKind { gate: "apps".into(), kind: "Deployment.apps".into() }])
        );
    }
}
