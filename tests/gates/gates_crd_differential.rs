//! Beyond the peers: `crd_compat::check` against a real API server. A seeded generator makes
//! random schema changes of a base CRD schema (bounds tightened and loosened, enum values added
//! and removed, patterns, formats, required fields, type changes, CEL rules, combinators,
//! equivalent rewrites…) and objects valid under the old schema. Each case installs the old
//! schema, creates the objects, updates the CRD to the new schema, and asks the server whether
//! each stored object would still be accepted: a dry-run *create* of its content under a new name.
//! (Not an update: validation ratcheting lets an update keep fields that no longer validate, as
//! long as they do not change, which would hide exactly the breakage we look for.)
//!
//! The assertion: whenever the server refuses an object, `check` must not say "compatible".
//! The other direction (check says incompatible, no sampled object was refused) is counted, not
//! failed: a few samples cannot prove a tightening harmless.

#[allow(unused_imports)] // the shared support re-exports waits this test does not use
use crate::gates_support;

use fleetgate::gates::{crd_compat, schema};
use fleetgate_testenv::ClusterOptions;
use gates_support::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Defaults of the run; `CRD_DIFF_SEED` and `CRD_DIFF_CASES` override them to explore further.
const SEED: u64 = 0x0001_5c4d_d1ff;
const CASES: usize = 84;

fn setting<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
const WORKERS: usize = 4;
const OBJECTS_PER_CASE: usize = 6;

/// The schema of `.spec` every case starts from.
fn base_spec() -> Value {
    json!({
        "type": "object",
        "properties": {
            "replicas": {"type": "integer", "minimum": 0, "maximum": 10},
            "ratio": {"type": "number"},
            "name": {"type": "string", "minLength": 1, "maxLength": 20},
            "mode": {"type": "string", "enum": ["a", "b", "c"]},
            "note": {"type": "string", "nullable": true},
            "port": {"x-kubernetes-int-or-string": true},
            "flag": {"type": "boolean"},
            "tags": {"type": "array", "maxItems": 5, "items": {"type": "string"}},
            "labels": {"type": "object", "maxProperties": 4, "additionalProperties": {"type": "string"}},
            "nested": {"type": "object", "properties": {"level": {"type": "integer"}, "code": {"type": "string"}}},
            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }
    })
}

const NUMBERS: &[&str] = &["replicas", "ratio"];
const STRINGS: &[&str] = &["name", "mode", "note"];
const WORDS: &[&str] = &[
    "a",
    "b",
    "c",
    "x",
    "ab",
    "abc",
    "bb",
    "Hello",
    "a-b",
    "",
    "2024-01-01",
    "a@b.io",
    "123e4567-e89b-12d3-a456-426614174000",
    "abcdefghijklmnopqrstu",
];
const PATTERNS: &[&str] = &["^[a-z]+$", "^[a-z0-9-]*$", "^a", "^.{0,3}$"];
const FORMATS: &[&str] = &["date", "uuid", "email"];

/// A field of `.spec`, as a mutable schema node.
fn prop<'a>(spec: &'a mut Value, name: &str) -> &'a mut serde_json::Map<String, Value> {
    spec["properties"][name].as_object_mut().unwrap()
}

/// Applies one random change to `spec` and says which.
fn mutate(spec: &mut Value, rng: &mut StdRng) -> String {
    let n: i64 = rng.random_range(-1..12);
    match rng.random_range(0..24) {
        0 => {
            let f = *NUMBERS.choose(rng).unwrap();
            prop(spec, f).insert("maximum".into(), json!(n));
            format!("{f}.maximum = {n}")
        }
        1 => {
            let f = *NUMBERS.choose(rng).unwrap();
            prop(spec, f).insert("minimum".into(), json!(n - 1));
            format!("{f}.minimum = {}", n - 1)
        }
        2 => {
            let f = *NUMBERS.choose(rng).unwrap();
            let p = prop(spec, f);
            let key = if rng.random_bool(0.5) { "maximum" } else { "minimum" };
            p.remove(key);
            p.remove(&format!("exclusive{}", if key == "maximum" { "Maximum" } else { "Minimum" }));
            format!("{f}.{key} removed")
        }
        3 => {
            let p = prop(spec, "replicas");
            let (bound, flag) =
                if rng.random_bool(0.5) { ("maximum", "exclusiveMaximum") } else { ("minimum", "exclusiveMinimum") };
            if !p.contains_key(bound) {
                p.insert(bound.into(), json!(5));
            }
            let on = rng.random_bool(0.7);
            p.insert(flag.into(), json!(on));
            format!("replicas.{flag} = {on}")
        }
        4 => {
            let m = *[2, 3, 5].choose(rng).unwrap();
            prop(spec, "replicas").insert("multipleOf".into(), json!(m));
            format!("replicas.multipleOf = {m}")
        }
        5 => {
            let f = *STRINGS.choose(rng).unwrap();
            let len = rng.random_range(1..25);
            prop(spec, f).insert("maxLength".into(), json!(len));
            format!("{f}.maxLength = {len}")
        }
        6 => {
            let f = *STRINGS.choose(rng).unwrap();
            let len = rng.random_range(0..4);
            prop(spec, f).insert("minLength".into(), json!(len));
            format!("{f}.minLength = {len}")
        }
        7 => {
            let f = *STRINGS.choose(rng).unwrap();
            let p = *PATTERNS.choose(rng).unwrap();
            prop(spec, f).insert("pattern".into(), json!(p));
            format!("{f}.pattern = {p}")
        }
        8 => {
            let f = *STRINGS.choose(rng).unwrap();
            let fm = *FORMATS.choose(rng).unwrap();
            prop(spec, f).insert("format".into(), json!(fm));
            format!("{f}.format = {fm}")
        }
        9 => {
            let f = *STRINGS.choose(rng).unwrap();
            let k = rng.random_range(1..5);
            let values: Vec<&str> = WORDS.choose_multiple(rng, k).copied().collect();
            prop(spec, f).insert("enum".into(), json!(values));
            format!("{f}.enum = {values:?}")
        }
        10 => {
            let p = prop(spec, "mode");
            let mut values: Vec<Value> = p.get("enum").and_then(Value::as_array).cloned().unwrap_or_default();
            if rng.random_bool(0.5) && values.len() > 1 {
                let i = rng.random_range(0..values.len());
                values.remove(i);
            } else {
                values.push(json!(*WORDS.choose(rng).unwrap()));
                values.dedup();
            }
            p.insert("enum".into(), json!(values));
            format!("mode.enum = {values:?}")
        }
        11 => {
            // Equivalent rewrite: the enum as an allOf of itself twice, or as an anyOf of singletons.
            let p = prop(spec, "mode");
            let Some(values) = p.remove("enum") else { return "mode: no enum to rewrite".into() };
            if rng.random_bool(0.5) {
                p.insert("allOf".into(), json!([{"enum": values}, {"enum": values}]));
                "mode.enum rewritten as allOf".into()
            } else {
                let singles: Vec<Value> = values.as_array().unwrap().iter().map(|v| json!({"enum": [v]})).collect();
                p.insert("anyOf".into(), json!(singles));
                "mode.enum rewritten as anyOf".into()
            }
        }
        12 => {
            // Equivalent rewrite of a maximum: allOf of it and a looser one.
            let p = prop(spec, "replicas");
            let Some(max) = p.remove("maximum") else { return "replicas: no maximum to rewrite".into() };
            let looser = max.as_f64().unwrap() + 3.0;
            let exclusive = p.remove("exclusiveMaximum").unwrap_or(json!(false));
            p.insert("allOf".into(), json!([{"maximum": max, "exclusiveMaximum": exclusive}, {"maximum": looser}]));
            "replicas.maximum rewritten as allOf".into()
        }
        13 => {
            let f = *["replicas", "name", "mode", "tags", "flag"].choose(rng).unwrap();
            let defaulted = rng.random_bool(0.4);
            if defaulted {
                let d = match f {
                    "replicas" => json!(1),
                    "name" => json!("ab"),
                    "mode" => json!("a"),
                    "tags" => json!([]),
                    _ => json!(true),
                };
                prop(spec, f).insert("default".into(), d);
            }
            let req = spec.as_object_mut().unwrap().entry("required").or_insert(json!([]));
            if !req.as_array().unwrap().contains(&json!(f)) {
                req.as_array_mut().unwrap().push(json!(f));
            }
            format!("{f} required{}", if defaulted { " with a default" } else { "" })
        }
        14 => {
            spec.as_object_mut().unwrap().remove("required");
            "required removed".into()
        }
        15 => {
            let (f, to) = *[
                ("replicas", "string"),
                ("replicas", "number"),
                ("ratio", "integer"),
                ("name", "integer"),
                ("flag", "string"),
            ]
            .choose(rng)
            .unwrap();
            let p = prop(spec, f);
            p.retain(|k, _| k == "description");
            p.insert("type".into(), json!(to));
            format!("{f}.type = {to}")
        }
        16 => {
            let (f, rule) = match rng.random_range(0..4) {
                0 => ("replicas", format!("self <= {n}")),
                1 => ("name", format!("self.size() < {}", n.max(1))),
                2 => ("tags", format!("self.size() <= {}", n.max(0))),
                _ => ("labels", format!("self.size() <= {}", n.max(0))),
            };
            prop(spec, f).insert("x-kubernetes-validations".into(), json!([{"rule": rule}]));
            format!("{f} rule {rule}")
        }
        17 => {
            let rule = if rng.random_bool(0.5) {
                "!has(self.name) || self.name != 'x'"
            } else {
                "!has(self.replicas) || self.replicas != 3"
            };
            spec.as_object_mut().unwrap().insert("x-kubernetes-validations".into(), json!([{"rule": rule}]));
            format!("spec rule {rule}")
        }
        18 => {
            let on = rng.random_bool(0.5);
            prop(spec, "note").insert("nullable".into(), json!(on));
            format!("note.nullable = {on}")
        }
        19 => {
            let (key, k) = if rng.random_bool(0.5) {
                ("maxItems", rng.random_range(0..7))
            } else {
                ("minItems", rng.random_range(0..3))
            };
            prop(spec, "tags").insert(key.into(), json!(k));
            format!("tags.{key} = {k}")
        }
        20 => {
            let on = rng.random_bool(0.6);
            prop(spec, "tags").insert("x-kubernetes-list-type".into(), json!(if on { "set" } else { "atomic" }));
            format!("tags list-type {}", if on { "set" } else { "atomic" })
        }
        21 => {
            let (key, k) = if rng.random_bool(0.5) {
                ("maxProperties", rng.random_range(0..6))
            } else {
                ("minProperties", rng.random_range(0..3))
            };
            prop(spec, "labels").insert(key.into(), json!(k));
            format!("labels.{key} = {k}")
        }
        22 => match rng.random_range(0..3) {
            0 => {
                prop(spec, "replicas").insert("oneOf".into(), json!([{"maximum": 3}, {"minimum": 7}]));
                "replicas.oneOf added".into()
            }
            1 => {
                spec.as_object_mut()
                    .unwrap()
                    .insert("anyOf".into(), json!([{"required": ["name"]}, {"required": ["mode"]}]));
                "spec.anyOf required added".into()
            }
            _ => {
                prop(spec, "name").insert("not".into(), json!({"enum": ["x"]}));
                "name.not added".into()
            }
        },
        _ => {
            let p = prop(spec, "extra");
            if rng.random_bool(0.5) {
                p.remove("x-kubernetes-preserve-unknown-fields");
                "extra preserve-unknown-fields removed".into()
            } else {
                p.insert("properties".into(), json!({"size": {"type": "integer"}}));
                "extra.size typed".into()
            }
        }
    }
}

/// A random object body (`.spec`) for the base fields; validity is decided afterwards.
fn random_spec(rng: &mut StdRng) -> Value {
    let mut spec = serde_json::Map::new();
    let word = |rng: &mut StdRng| json!(*WORDS.choose(rng).unwrap());
    let mut maybe = |rng: &mut StdRng, key: &str, v: Value| {
        if rng.random_bool(0.7) {
            spec.insert(key.into(), v);
        }
    };
    let n = json!(rng.random_range(-1..13));
    maybe(rng, "replicas", n);
    let r = json!(*[0.5, 1.0, 2.5, 7.0, 10.5].choose(rng).unwrap());
    maybe(rng, "ratio", r);
    let w = word(rng);
    maybe(rng, "name", w);
    let m = json!(*["a", "b", "c", "x", "ab"].choose(rng).unwrap());
    maybe(rng, "mode", m);
    let note = if rng.random_bool(0.3) { Value::Null } else { word(rng) };
    maybe(rng, "note", note);
    let port = if rng.random_bool(0.5) { json!(rng.random_range(1..100)) } else { json!("http") };
    maybe(rng, "port", port);
    let flag = json!(rng.random_bool(0.5));
    maybe(rng, "flag", flag);
    let len = rng.random_range(0..7);
    let tags: Vec<Value> = (0..len).map(|_| json!(*["a", "b", "ab"].choose(rng).unwrap())).collect();
    maybe(rng, "tags", json!(tags));
    let len = rng.random_range(0..6);
    let labels: serde_json::Map<String, Value> = (0..len).map(|i| (format!("k{i}"), json!("v"))).collect();
    maybe(rng, "labels", Value::Object(labels));
    let nested = json!({"level": rng.random_range(0..5), "code": word(rng)});
    maybe(rng, "nested", nested);
    let extra = if rng.random_bool(0.5) { json!({"size": "big", "k": 1}) } else { json!({"size": 3}) };
    maybe(rng, "extra", extra);
    Value::Object(spec)
}

/// Marks a schema revision: a root field accepting only `rev`, so a dry-run create that sets it
/// succeeds exactly when the server validates with this revision.
const PROBE: &str = "fleetgateProbe";

fn crd(worker: usize, spec: &Value, rev: Option<&str>) -> CustomResourceDefinition {
    let mut root = json!({"type": "object", "properties": {"spec": spec}});
    if let Some(rev) = rev {
        root["properties"][PROBE] = json!({"type": "string", "enum": [rev]});
    }
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.w{worker}.diff.fleetgate.test")},
        "spec": {
            "group": format!("w{worker}.diff.fleetgate.test"),
            "names": {"kind": "Widget", "plural": "widgets"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": root}}],
        },
    }))
    .unwrap()
}

struct Worker {
    n: usize,
    crds: Api<CustomResourceDefinition>,
    objects: Api<DynamicObject>,
}

fn object(worker: usize, name: &str, body: serde_json::Map<String, Value>) -> DynamicObject {
    let mut v = json!({
        "apiVersion": format!("w{worker}.diff.fleetgate.test/v1"),
        "kind": "Widget",
        "metadata": {"name": name},
    });
    v.as_object_mut().unwrap().extend(body);
    serde_json::from_value(v).unwrap()
}

impl Worker {
    /// Replaces the worker's CRD with `spec` as revision `rev` and waits until the server
    /// validates with it; the server's message when it refuses the CRD.
    async fn install(&self, spec: &Value, rev: &str) -> Result<(), String> {
        let mut new = crd(self.n, spec, Some(rev));
        let name = new.metadata.name.clone().unwrap();
        new.metadata.resource_version = self.crds.get(&name).await.unwrap().metadata.resource_version;
        self.crds.replace(&name, &PostParams::default(), &new).await.map_err(|e| e.to_string())?;
        // Wait until the server validates with this revision.
        let probe = object(self.n, "probe", [(PROBE.to_string(), json!(rev))].into_iter().collect());
        let dry = PostParams { dry_run: true, ..PostParams::default() };
        let started = Instant::now();
        loop {
            if self.objects.create(&dry, &probe).await.is_ok() {
                return Ok(());
            }
            assert!(started.elapsed() < Duration::from_secs(30), "revision {rev} never became live");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What one case found.
#[derive(Debug, Default)]
struct Outcome {
    skipped: bool,
    objects: usize,
    refused: Vec<String>,
    compatible: bool,
    /// The rules of the blocking findings.
    rules: Vec<String>,
}

async fn run_case(w: &Worker, case: usize, old: &Value, new: &Value, bodies: &[Value]) -> Outcome {
    let mut out = Outcome::default();
    if w.install(old, &format!("c{case}-old")).await.is_err() {
        out.skipped = true;
        return out;
    }
    let mut stored = Vec::new();
    for (i, spec) in bodies.iter().enumerate() {
        let name = format!("c{case}-o{i}");
        let obj = object(w.n, &name, [("spec".to_string(), spec.clone())].into_iter().collect());
        // The server is the judge of validity under the old schema too (CEL rules, formats).
        if let Ok(created) = w.objects.create(&PostParams::default(), &obj).await {
            stored.push(created);
        }
    }
    out.objects = stored.len();
    if w.install(new, &format!("c{case}-new")).await.is_err() {
        out.skipped = true;
        return out;
    }
    let (old_crd, new_crd) = (crd(w.n, old, None), crd(w.n, new, None));
    let findings = crd_compat::check_with(&old_crd, &new_crd, &["v1".into()], &[]);
    out.compatible = crd_compat::is_compatible(&findings);
    out.rules = findings.iter().filter(|f| f.blocks()).map(|f| f.rule.to_string()).collect();
    let dry = PostParams { dry_run: true, ..PostParams::default() };
    for s in stored {
        // The stored content (pruned and defaulted under the old schema) under a new name.
        let name = format!("{}-again", s.metadata.name.clone().unwrap());
        let obj = object(w.n, &name, s.data.as_object().cloned().unwrap_or_default());
        if let Err(e) = w.objects.create(&dry, &obj).await {
            out.refused.push(format!("{}: {e}", serde_json::to_string(&s.data).unwrap()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_never_calls_a_change_compatible_that_the_server_refuses_objects_under() {
    let started = Instant::now();
    let cluster = start(ClusterOptions::new("crd-diff")).await;
    let client = cluster.client();
    let ns = OPERATOR_NS;

    // Cases are drawn up front so the run is the same whatever the workers' timing.
    let (seed, count) = (setting("CRD_DIFF_SEED", SEED), setting("CRD_DIFF_CASES", CASES));
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cases = Vec::new();
    for _ in 0..count {
        let mut old = base_spec();
        let mut changes = Vec::new();
        for _ in 0..rng.random_range(0..3) {
            changes.push(format!("old: {}", mutate(&mut old, &mut rng)));
        }
        let mut new = old.clone();
        for _ in 0..rng.random_range(1..3) {
            changes.push(format!("new: {}", mutate(&mut new, &mut rng)));
        }
        // Objects valid under the old schema as far as local validation can tell; the server
        // has the last word when they are created.
        let old_root: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps =
            serde_json::from_value(json!({"type": "object", "properties": {"spec": old}})).unwrap();
        let bodies: Vec<Value> = (0..60)
            .map(|_| random_spec(&mut rng))
            .filter(|spec| schema::validate(&old_root, &json!({"spec": spec})).is_empty())
            .take(OBJECTS_PER_CASE)
            .collect();
        cases.push((changes, old, new, bodies));
    }

    let workers: Vec<Worker> = (0..WORKERS)
        .map(|n| {
            let ar = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(&format!("w{n}.diff.fleetgate.test"), "v1", "Widget"),
                "widgets",
            );
            Worker { n, crds: Api::all(client.clone()), objects: Api::namespaced_with(client.clone(), ns, &ar) }
        })
        .collect();
    for w in &workers {
        install_crd(&client, &crd(w.n, &base_spec(), None)).await;
    }
    let runs = workers.iter().map(|w| {
        let cases = &cases;
        async move {
            let mut outcomes = Vec::new();
            for (i, (_, old, new, bodies)) in cases.iter().enumerate().filter(|(i, _)| i % WORKERS == w.n) {
                outcomes.push((i, run_case(w, i, old, new, bodies).await));
            }
            outcomes
        }
    });
    let mut outcomes: Vec<(usize, Outcome)> =
        within("differential cases", 60 + 3 * count as u64, futures::future::join_all(runs))
            .await
            .into_iter()
            .flatten()
            .collect();
    outcomes.sort_by_key(|(i, _)| *i);

    let mut missed = Vec::new();
    let (mut skipped, mut objects, mut refusing, mut incompatible, mut stricter) = (0, 0, 0, 0, 0);
    // Rules behind "incompatible" verdicts that no sampled object confirmed: where check is
    // stricter than the samples (pruning rules, or tightenings the samples happen to miss).
    let mut unconfirmed = std::collections::BTreeMap::<String, usize>::new();
    for (i, o) in &outcomes {
        if o.skipped {
            skipped += 1;
            continue;
        }
        objects += o.objects;
        refusing += usize::from(!o.refused.is_empty());
        incompatible += usize::from(!o.compatible);
        if !o.compatible && o.refused.is_empty() {
            stricter += 1;
            for r in o.rules.iter().collect::<std::collections::BTreeSet<_>>() {
                *unconfirmed.entry(r.clone()).or_default() += 1;
            }
        }
        if o.compatible && !o.refused.is_empty() {
            missed.push(format!("case {i} {:?}\n  refused: {}", cases[*i].0, o.refused.join("\n  refused: ")));
        }
    }
    println!(
        "seed {seed}, {count} cases in {:.1}s: {skipped} refused by the server as CRDs, {objects} objects, \
         {refusing} cases with refused objects, {incompatible} judged incompatible, \
         {stricter} of them with no sampled object refused (their rules: {unconfirmed:?})",
        started.elapsed().as_secs_f64()
    );
    assert!(missed.is_empty(), "check said compatible, the server refused objects:\n{}", missed.join("\n"));
    // The generator must exercise both verdicts for the run to mean anything.
    assert!(refusing >= 10 && incompatible < count - skipped, "too few interesting cases");
}
