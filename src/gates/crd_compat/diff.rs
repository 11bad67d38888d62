//! The schema rules: one node of the old schema against the same node of the new one, both in
//! normal form, then their children. Each rule asks whether a value valid under the old node
//! could be refused (or pruned) under the new one.
//!
//! Where the old node lists its values (an `enum`, or `boolean`), a new constraint is judged on
//! those values: adding `maxLength: 5` to an enum of short words refuses nothing.

use super::normal::{Bound, Node, Ty, number};
use super::{Checker, Rule, child_path};
use serde_json::Value;
use std::collections::BTreeSet;

/// What kind of JSON value a constraint is about: a constraint on a node that cannot hold such a
/// value never applies.
#[derive(Clone, Copy)]
enum Kind {
    Number,
    Text,
    List,
    Map,
}

fn may_hold(ty: &Ty, kind: Kind) -> bool {
    match ty {
        Ty::Any => true,
        Ty::IntOrString => matches!(kind, Kind::Number | Kind::Text),
        Ty::Named(t) => match kind {
            Kind::Number => t == "integer" || t == "number",
            Kind::Text => t == "string",
            Kind::List => t == "array",
            Kind::Map => t == "object",
        },
    }
}

/// A type change that accepts everything the old type did.
fn widened(old: &Ty, new: &Node) -> bool {
    (new.ty == Ty::Any && new.preserve_unknown)
        || (new.ty == Ty::IntOrString && (old.is("integer") || old.is("string")))
        || (new.ty.is("number") && old.is("integer"))
}

/// The values the old node can hold, when it names them.
fn old_values(old: &Node) -> Option<Vec<Value>> {
    match &old.enum_ {
        Some(e) => Some(e.iter().filter_map(|v| serde_json::from_str(v).ok()).collect()),
        None if old.ty.is("boolean") => Some(vec![Value::Bool(true), Value::Bool(false)]),
        None => None,
    }
}

fn list(values: &BTreeSet<String>) -> String {
    if values.is_empty() { "none".into() } else { values.iter().cloned().collect::<Vec<_>>().join(", ") }
}

fn shown(limit: Option<i64>) -> String {
    limit.map_or_else(|| "none".into(), |n| n.to_string())
}

fn shown_bound(b: Option<Bound>) -> String {
    b.map_or_else(|| "none".into(), |b| b.to_string())
}

fn within_max(b: Bound, v: &Value) -> bool {
    v.as_f64().is_none_or(|n| n < b.value || (n == b.value && !b.exclusive))
}

fn within_min(b: Bound, v: &Value) -> bool {
    v.as_f64().is_none_or(|n| n > b.value || (n == b.value && !b.exclusive))
}

/// Is `n` a whole multiple of `m`? (Tolerant of binary fractions such as 0.1.)
fn multiple(n: f64, m: f64) -> bool {
    m != 0.0 && ((n / m) - (n / m).round()).abs() < 1e-9
}

fn chars(v: &Value) -> Option<i64> {
    v.as_str().map(|s| s.chars().count() as i64)
}

impl Checker {
    pub(super) fn schema(&mut self, version: &str, path: &str, old: &Node, new: &Node) {
        if old.ty != new.ty && !widened(&old.ty, new) {
            self.changed(Rule::TypeChanged, version, path, "type changed", old.ty.to_string(), new.ty.to_string(), "");
            // Below a type change the old and new children describe different things.
            return;
        }
        if old.nullable && !new.nullable {
            // The server does not refuse a null there: it prunes it (then applies the default),
            // on write and on read. Stored nulls are lost, which clients can tell from absent.
            self.changed(
                Rule::NullableRemoved,
                version,
                path,
                "nullable",
                "true".into(),
                "false".into(),
                "the server drops stored nulls (or replaces them with the default)",
            );
        }
        if old.preserve_unknown && !new.preserve_unknown {
            self.changed(
                Rule::PreserveUnknownFieldsRemoved,
                version,
                path,
                "x-kubernetes-preserve-unknown-fields",
                "true".into(),
                "false".into(),
                "the server prunes the fields the schema does not name",
            );
        }
        self.required(version, path, old, new);
        self.enums(version, path, old, new);
        self.bounds(version, path, old, new);
        self.text(version, path, old, new);
        self.counts(version, path, old, new);
        self.rules(version, path, old, new);
        self.combinators(version, path, old, new);
        self.list_type(version, path, old, new);
        if old.default != new.default {
            let shown = |d: &Option<String>| d.clone().unwrap_or_else(|| "none".into());
            self.changed(
                Rule::DefaultChanged,
                version,
                path,
                "default",
                shown(&old.default),
                shown(&new.default),
                "objects without the field read differently",
            );
        }
        self.children(version, path, old, new);
    }

    fn required(&mut self, version: &str, path: &str, old: &Node, new: &Node) {
        for added in new.required.difference(&old.required) {
            // The server applies defaults before it validates (and when it reads from etcd), so a
            // required field with a default is filled in, never missing. crdify and crd-schema-checker
            // report it regardless.
            if new.properties.get(added).is_some_and(|p| p.default.is_some()) {
                continue;
            }
            self.field(
                Rule::RequiredAdded,
                version,
                &child_path(path, added),
                "new required field; existing objects without it would stop validating".into(),
            );
        }
    }

    fn enums(&mut self, version: &str, path: &str, old: &Node, new: &Node) {
        let Some(n) = &new.enum_ else { return };
        match &old.enum_ {
            Some(o) => {
                let removed: BTreeSet<String> = o.difference(n).cloned().collect();
                if !removed.is_empty() {
                    let why = format!("values removed: {}; objects using them would stop validating", list(&removed));
                    self.changed(Rule::EnumValuesRemoved, version, path, "enum", list(o), list(n), &why);
                }
            }
            None => {
                let all_listed = old_values(old).is_some_and(|vs| vs.iter().all(|v| n.contains(&v.to_string())));
                if !all_listed {
                    self.changed(
                        Rule::EnumAdded,
                        version,
                        path,
                        "enum added",
                        "none".into(),
                        list(n),
                        "other values stop validating",
                    );
                }
            }
        }
    }

    /// Does every value the old node names pass `check`? False when it names none.
    fn all_pass(old: &Node, check: impl Fn(&Value) -> bool) -> bool {
        old_values(old).is_some_and(|vs| vs.iter().all(check))
    }

    fn bounds(&mut self, version: &str, path: &str, old: &Node, new: &Node) {
        if !may_hold(&new.ty, Kind::Number) {
            return;
        }
        if let Some(nm) = new.maximum
            && old.maximum.is_none_or(|om| nm.tighter_max(om))
            && !Self::all_pass(old, |v| within_max(nm, v))
        {
            let what = if old.maximum.is_some() { "maximum lowered" } else { "maximum added" };
            self.changed(Rule::MaximumLowered, version, path, what, shown_bound(old.maximum), nm.to_string(), "");
        }
        if let Some(nm) = new.minimum
            && old.minimum.is_none_or(|om| nm.tighter_min(om))
            && !Self::all_pass(old, |v| within_min(nm, v))
        {
            let what = if old.minimum.is_some() { "minimum raised" } else { "minimum added" };
            self.changed(Rule::MinimumRaised, version, path, what, shown_bound(old.minimum), nm.to_string(), "");
        }
        for &m in &new.multiple_of {
            // Multiples of 6 are multiples of 3: a new divisor of an old multipleOf refuses nothing.
            let implied = old.multiple_of.iter().any(|&o| multiple(o, m));
            if !implied && !Self::all_pass(old, |v| v.as_f64().is_none_or(|n| multiple(n, m))) {
                let old_shown = if old.multiple_of.is_empty() {
                    "none".into()
                } else {
                    old.multiple_of.iter().map(|&o| number(o)).collect::<Vec<_>>().join(", ")
                };
                self.changed(Rule::MultipleOfChanged, version, path, "multipleOf", old_shown, number(m), "");
            }
        }
    }

    fn text(&mut self, version: &str, path: &str, old: &Node, new: &Node) {
        if !may_hold(&new.ty, Kind::Text) {
            return;
        }
        self.limit(
            version,
            path,
            old,
            (Rule::MaxLengthLowered, "maxLength"),
            old.max_length,
            new.max_length,
            true,
            chars,
        );
        self.limit(
            version,
            path,
            old,
            (Rule::MinLengthRaised, "minLength"),
            old.min_length,
            new.min_length,
            false,
            chars,
        );
        let added: Vec<&String> = new.patterns.difference(&old.patterns).collect();
        for p in added {
            let re = regex::Regex::new(p).ok();
            let matches = |v: &Value| v.as_str().is_none_or(|s| re.as_ref().is_some_and(|re| re.is_match(s)));
            if !Self::all_pass(old, matches) {
                let what = if old.patterns.is_empty() { "pattern added" } else { "pattern changed" };
                self.changed(Rule::PatternChanged, version, path, what, list(&old.patterns), p.clone(), "");
            }
        }
        // Every format counts, also those the server does not check: which ones it checks has
        // changed between Kubernetes versions.
        for f in new.formats.difference(&old.formats) {
            let what = if old.formats.is_empty() { "format added" } else { "format changed" };
            self.changed(Rule::FormatChanged, version, path, what, list(&old.formats), f.clone(), "");
        }
    }

    fn counts(&mut self, version: &str, path: &str, old: &Node, new: &Node) {
        let items = |v: &Value| v.as_array().map(|a| a.len() as i64);
        let props = |v: &Value| v.as_object().map(|m| m.len() as i64);
        if may_hold(&new.ty, Kind::List) {
            self.limit(
                version,
                path,
                old,
                (Rule::MaxItemsLowered, "maxItems"),
                old.max_items,
                new.max_items,
                true,
                items,
            );
            self.limit(
                version,
                path,
                old,
                (Rule::MinItemsRaised, "minItems"),
                old.min_items,
                new.min_items,
                false,
                items,
            );
        }
        if may_hold(&new.ty, Kind::Map) {
            let (o, n) = (old.max_properties, new.max_properties);
            self.limit(version, path, old, (Rule::MaxPropertiesLowered, "maxProperties"), o, n, true, props);
            let (o, n) = (old.min_properties, new.min_properties);
            self.limit(version, path, old, (Rule::MinPropertiesRaised, "minProperties"), o, n, false, props);
        }
    }

    /// A length or count limit: `upper` for max*, else min* (where none is 0).
    #[allow(clippy::too_many_arguments)]
    fn limit(
        &mut self,
        version: &str,
        path: &str,
        old_node: &Node,
        (rule, name): (Rule, &str),
        old: Option<i64>,
        new: Option<i64>,
        upper: bool,
        size: impl Fn(&Value) -> Option<i64>,
    ) {
        let Some(n) = new else { return };
        let tighter = if upper { old.is_none_or(|o| n < o) } else { n > old.unwrap_or(0) };
        let fits = |v: &Value| size(v).is_none_or(|s| if upper { s <= n } else { s >= n });
        if !tighter || Self::all_pass(old_node, fits) {
            return;
        }
        let verb = match (old, upper) {
            (None, _) => "added",
            (Some(_), true) => "lowered",
            (Some(_), false) => "raised",
        };
        self.changed(rule, version, path, &format!("{name} {verb}"), shown(old), n.to_string(), "");
    }

    fn rules(&mut self, version: &str, path: &str, old: &Node, new: &Node) {
        let removed: BTreeSet<String> = old.rules.difference(&new.rules).cloned().collect();
        for r in new.rules.difference(&old.rules) {
            let what = if removed.is_empty() {
                "x-kubernetes-validations rule added"
            } else {
                "x-kubernetes-validations rules changed"
            };
            let old_shown =
                if removed.is_empty() { "none".into() } else { removed.iter().cloned().collect::<Vec<_>>().join("; ") };
            self.changed(Rule::ValidationRuleAdded, version, path, what, old_shown, r.clone(), "");
        }
    }

    fn combinators(&mut self, version: &str, path: &str, old: &Node, new: &Node) {
        let branches = |groups: &[Vec<Node>]| {
            if groups.is_empty() {
                "none".to_string()
            } else {
                groups.iter().map(|g| format!("{} branches", g.len())).collect::<Vec<_>>().join(" and ")
            }
        };
        // An anyOf that keeps every branch of an old one and adds more accepts more.
        let implied = |g: &Vec<Node>| old.any_of.iter().any(|og| og.iter().all(|b| g.contains(b)));
        if new.any_of.iter().any(|g| !implied(g)) {
            let what = if old.any_of.is_empty() { "anyOf added" } else { "anyOf changed" };
            self.changed(Rule::AnyOfChanged, version, path, what, branches(&old.any_of), branches(&new.any_of), "");
        }
        // A new oneOf branch may match what another matched already, and oneOf then refuses it.
        let same = |g: &Vec<Node>| old.one_of.iter().any(|og| og.len() == g.len() && og.iter().all(|b| g.contains(b)));
        if new.one_of.iter().any(|g| !same(g)) {
            let what = if old.one_of.is_empty() { "oneOf added" } else { "oneOf changed" };
            self.changed(Rule::OneOfChanged, version, path, what, branches(&old.one_of), branches(&new.one_of), "");
        }
        if new.not.iter().any(|n| !old.not.contains(n)) {
            let what = if old.not.is_empty() { "not added" } else { "not changed" };
            let count = |n: &[Node]| if n.is_empty() { "none".to_string() } else { format!("{} schemas", n.len()) };
            self.changed(Rule::NotChanged, version, path, what, count(&old.not), count(&new.not), "");
        }
    }

    fn list_type(&mut self, version: &str, path: &str, old: &Node, new: &Node) {
        // atomic < set (items unique) < map (keys present and unique).
        let rank = |t: Option<&str>| match t {
            Some("set") => 1,
            Some("map") => 2,
            _ => 0,
        };
        let (o, n) = (old.list_type.as_deref(), new.list_type.as_deref());
        let keys_changed = o == Some("map") && n == Some("map") && old.list_map_keys != new.list_map_keys;
        if rank(n) > rank(o) || keys_changed {
            let shown = |t: Option<&str>, keys: &[String]| match t {
                Some("map") => format!("map (keys {})", keys.join(", ")),
                Some(t) => t.to_string(),
                None => "atomic".to_string(),
            };
            self.changed(
                Rule::ListTypeChanged,
                version,
                path,
                "x-kubernetes-list-type",
                shown(o, &old.list_map_keys),
                shown(n, &new.list_map_keys),
                "lists with duplicates stop validating",
            );
        }
    }

    fn children(&mut self, version: &str, path: &str, old: &Node, new: &Node) {
        for (key, o) in &old.properties {
            let p = child_path(path, key);
            match new.properties.get(key) {
                Some(n) => self.schema(version, &p, o, n),
                // Still kept, only no longer typed: nothing is pruned or refused.
                None if new.preserve_unknown => {}
                None => self.field(Rule::FieldRemoved, version, &p, "field removed".into()),
            }
        }
        // Fields an x-kubernetes-preserve-unknown-fields node kept may hold anything; a schema
        // for them now constrains stored data.
        if old.preserve_unknown {
            for (key, n) in new.properties.iter().filter(|(k, _)| !old.properties.contains_key(*k)) {
                self.schema(version, &child_path(path, key), &Node::anything(), n);
            }
        }
        if let (Some(o), Some(n)) = (&old.items, &new.items) {
            self.schema(version, &format!("{path}[*]"), o, n);
        }
        let values = format!("{path}.*");
        match (&old.additional, &new.additional) {
            (Some(o), Some(n)) => self.schema(version, &values, o, n),
            (Some(_), None) if !new.preserve_unknown => self.field(
                Rule::FieldRemoved,
                version,
                &values,
                "map values removed from the schema; the server prunes them".into(),
            ),
            (None, Some(n)) if old.preserve_unknown => self.schema(version, &values, &Node::anything(), n),
            _ => {}
        }
    }
}
