//! Schemas in normal form: what a node accepts, with the ways of writing it forgotten.
//!
//! `allOf` is folded into its parent (bounds take the tighter value, enums intersect, patterns,
//! formats, required names and CEL rules accumulate), an `anyOf` or `oneOf` of one branch, of
//! identical branches, or of enum-only branches becomes the equivalent constraint on the parent,
//! and documentation (`description`, `title`, `example`, `externalDocs`) is dropped. Two schemas
//! that normalise equal accept the same objects; the comparison in [`super::diff`] works on this
//! form so that equivalent rewrites are not reported.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The type a node accepts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) enum Ty {
    /// No `type`: anything (with `x-kubernetes-preserve-unknown-fields`), or a value-validation
    /// branch inside `allOf`/`anyOf`/`oneOf`/`not`, which structural schemas leave untyped.
    #[default]
    Any,
    IntOrString,
    Named(String),
}

impl Ty {
    fn of(s: &JSONSchemaProps) -> Ty {
        if s.x_kubernetes_int_or_string == Some(true) {
            return Ty::IntOrString;
        }
        match s.type_.as_deref() {
            Some(t) if !t.is_empty() => Ty::Named(t.to_string()),
            _ => Ty::Any,
        }
    }

    pub(super) fn is(&self, name: &str) -> bool {
        matches!(self, Ty::Named(t) if t == name)
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Any => f.write_str("any"),
            Ty::IntOrString => f.write_str("int-or-string"),
            Ty::Named(t) => f.write_str(t),
        }
    }
}

/// A numeric bound: `maximum`/`minimum` with its `exclusiveMaximum`/`exclusiveMinimum` flag.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Bound {
    pub value: f64,
    pub exclusive: bool,
}

impl Bound {
    fn new(value: Option<f64>, exclusive: Option<bool>) -> Option<Bound> {
        value.map(|value| Bound { value, exclusive: exclusive == Some(true) })
    }

    /// Does `self`, as a maximum, refuse something `other` accepts?
    pub fn tighter_max(self, other: Bound) -> bool {
        self.value < other.value || (self.value == other.value && self.exclusive && !other.exclusive)
    }

    /// Does `self`, as a minimum, refuse something `other` accepts?
    pub fn tighter_min(self, other: Bound) -> bool {
        self.value > other.value || (self.value == other.value && self.exclusive && !other.exclusive)
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", number(self.value), if self.exclusive { " (exclusive)" } else { "" })
    }
}

/// `10`, not `10.0`, for the integral bounds most schemas carry.
pub(super) fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 { format!("{}", n as i64) } else { n.to_string() }
}

/// One schema node in normal form.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Node {
    pub ty: Ty,
    pub nullable: bool,
    pub preserve_unknown: bool,
    /// Allowed values as compact JSON, when restricted.
    pub enum_: Option<BTreeSet<String>>,
    pub maximum: Option<Bound>,
    pub minimum: Option<Bound>,
    /// Every `multipleOf` that applies (an `allOf` may add several).
    pub multiple_of: Vec<f64>,
    pub max_length: Option<i64>,
    pub min_length: Option<i64>,
    pub max_items: Option<i64>,
    pub min_items: Option<i64>,
    pub max_properties: Option<i64>,
    pub min_properties: Option<i64>,
    /// Every pattern the value must match.
    pub patterns: BTreeSet<String>,
    pub formats: BTreeSet<String>,
    pub required: BTreeSet<String>,
    pub properties: BTreeMap<String, Node>,
    pub items: Option<Box<Node>>,
    pub additional: Option<Box<Node>>,
    /// `x-kubernetes-validations` rule expressions (messages and reasons do not change what
    /// validates).
    pub rules: BTreeSet<String>,
    /// Conjunction of `anyOf` groups; each group is a disjunction of branches.
    pub any_of: Vec<Vec<Node>>,
    pub one_of: Vec<Vec<Node>>,
    pub not: Vec<Node>,
    /// The default as compact JSON.
    pub default: Option<String>,
    /// `x-kubernetes-list-type` (`None` is `atomic`) and its map keys.
    pub list_type: Option<String>,
    pub list_map_keys: Vec<String>,
}

impl Node {
    /// An untyped node keeping unknown fields: what a field of an
    /// `x-kubernetes-preserve-unknown-fields` object was before the schema named it.
    pub fn anything() -> Node {
        Node { preserve_unknown: true, ..Node::default() }
    }

    /// Does this node restrict nothing but the set of values?
    fn enum_only(&self) -> bool {
        self.enum_.is_some() && Node { enum_: None, ..self.clone() } == Node::default()
    }

    /// Adds `other`'s constraints to this node's: the node then accepts what both accepted.
    fn conjoin(&mut self, other: Node) {
        if self.ty == Ty::Any {
            self.ty = other.ty;
        }
        // `nullable` stays the parent's: structural schemas forbid it inside value validations.
        self.preserve_unknown |= other.preserve_unknown;
        self.enum_ = match (self.enum_.take(), other.enum_) {
            (Some(a), Some(b)) => Some(a.intersection(&b).cloned().collect()),
            (a, b) => a.or(b),
        };
        self.maximum = tighter(self.maximum, other.maximum, Bound::tighter_max);
        self.minimum = tighter(self.minimum, other.minimum, Bound::tighter_min);
        self.multiple_of.extend(other.multiple_of);
        self.multiple_of.sort_by(f64::total_cmp);
        self.multiple_of.dedup();
        self.max_length = min_of(self.max_length, other.max_length);
        self.min_length = self.min_length.max(other.min_length);
        self.max_items = min_of(self.max_items, other.max_items);
        self.min_items = self.min_items.max(other.min_items);
        self.max_properties = min_of(self.max_properties, other.max_properties);
        self.min_properties = self.min_properties.max(other.min_properties);
        self.patterns.extend(other.patterns);
        self.formats.extend(other.formats);
        self.required.extend(other.required);
        for (key, node) in other.properties {
            match self.properties.get_mut(&key) {
                Some(mine) => mine.conjoin(node),
                None => {
                    self.properties.insert(key, node);
                }
            }
        }
        self.items = conjoin_boxed(self.items.take(), other.items);
        self.additional = conjoin_boxed(self.additional.take(), other.additional);
        self.rules.extend(other.rules);
        for group in other.any_of {
            self.add_any_of(group);
        }
        for group in other.one_of {
            self.add_one_of(group);
        }
        self.not.extend(other.not);
        self.default = self.default.take().or(other.default);
        if self.list_type.is_none() {
            self.list_type = other.list_type;
            self.list_map_keys = other.list_map_keys;
        }
    }

    /// Does one of `branches` accept every value this node's type allows? Then the disjunction
    /// says nothing: the usual `anyOf: [{type: integer}, {type: string}]` beside
    /// `x-kubernetes-int-or-string`.
    fn always_met(&self, branches: &[Node]) -> bool {
        let types: BTreeSet<String> = branches
            .iter()
            .filter(|b| Node { ty: Ty::Any, ..(*b).clone() } == Node::default())
            .map(|b| b.ty.to_string())
            .collect();
        let has = |t: &str| types.contains(t) || types.contains("any");
        match &self.ty {
            Ty::Any => has("any"),
            Ty::IntOrString => (has("integer") || has("number")) && has("string"),
            Ty::Named(t) => has(t) || (t == "integer" && has("number")),
        }
    }

    fn add_any_of(&mut self, mut branches: Vec<Node>) {
        dedup(&mut branches);
        if self.always_met(&branches) {
            return;
        }
        if branches.len() == 1 {
            return self.conjoin(branches.remove(0));
        }
        if !branches.is_empty() && branches.iter().all(Node::enum_only) {
            let union = branches.into_iter().flat_map(|b| b.enum_.unwrap_or_default()).collect();
            return self.conjoin(Node { enum_: Some(union), ..Node::default() });
        }
        if !self.any_of.contains(&branches) {
            self.any_of.push(branches);
        }
    }

    fn add_one_of(&mut self, branches: Vec<Node>) {
        if branches.len() == 1 {
            return self.conjoin(branches.into_iter().next().unwrap_or_default());
        }
        if !branches.is_empty() && branches.iter().all(Node::enum_only) {
            // A value listed by two branches matches two of them, which oneOf refuses.
            let mut seen: BTreeMap<String, usize> = BTreeMap::new();
            for v in branches.into_iter().flat_map(|b| b.enum_.unwrap_or_default()) {
                *seen.entry(v).or_default() += 1;
            }
            let once = seen.into_iter().filter(|(_, n)| *n == 1).map(|(v, _)| v).collect();
            return self.conjoin(Node { enum_: Some(once), ..Node::default() });
        }
        if !self.one_of.contains(&branches) {
            self.one_of.push(branches);
        }
    }
}

fn dedup(branches: &mut Vec<Node>) {
    let mut unique: Vec<Node> = Vec::with_capacity(branches.len());
    for b in branches.drain(..) {
        if !unique.contains(&b) {
            unique.push(b);
        }
    }
    *branches = unique;
}

fn tighter(a: Option<Bound>, b: Option<Bound>, is_tighter: fn(Bound, Bound) -> bool) -> Option<Bound> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if is_tighter(b, a) { b } else { a }),
        (a, b) => a.or(b),
    }
}

fn min_of(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn conjoin_boxed(a: Option<Box<Node>>, b: Option<Box<Node>>) -> Option<Box<Node>> {
    match (a, b) {
        (Some(mut a), Some(b)) => {
            a.conjoin(*b);
            Some(a)
        }
        (a, b) => a.or(b),
    }
}

fn json(v: &serde_json::Value) -> String {
    v.to_string()
}

/// The normal form of `s`.
pub(super) fn normalise(s: &JSONSchemaProps) -> Node {
    let mut n = Node {
        ty: Ty::of(s),
        nullable: s.nullable == Some(true),
        preserve_unknown: s.x_kubernetes_preserve_unknown_fields == Some(true),
        enum_: s.enum_.as_ref().map(|e| e.iter().map(|j| json(&j.0)).collect()),
        maximum: Bound::new(s.maximum, s.exclusive_maximum),
        minimum: Bound::new(s.minimum, s.exclusive_minimum),
        multiple_of: s.multiple_of.into_iter().collect(),
        max_length: s.max_length,
        min_length: s.min_length,
        max_items: s.max_items,
        min_items: s.min_items,
        max_properties: s.max_properties,
        min_properties: s.min_properties,
        patterns: s.pattern.iter().cloned().collect(),
        formats: s.format.iter().filter(|f| !f.is_empty()).cloned().collect(),
        required: s.required.iter().flatten().cloned().collect(),
        properties: s.properties.iter().flatten().map(|(k, v)| (k.clone(), normalise(v))).collect(),
        items: match &s.items {
            Some(JSONSchemaPropsOrArray::Schema(i)) => Some(Box::new(normalise(i))),
            // Tuple items are not structural; the API server refuses them in a CRD.
            Some(JSONSchemaPropsOrArray::Schemas(_)) | None => None,
        },
        additional: match &s.additional_properties {
            Some(JSONSchemaPropsOrBool::Schema(a)) => Some(Box::new(normalise(a))),
            Some(JSONSchemaPropsOrBool::Bool(true)) => Some(Box::new(Node::anything())),
            Some(JSONSchemaPropsOrBool::Bool(false)) | None => None,
        },
        rules: s.x_kubernetes_validations.iter().flatten().map(|r| r.rule.trim().to_string()).collect(),
        any_of: Vec::new(),
        one_of: Vec::new(),
        not: s.not.iter().map(|n| normalise(n)).collect(),
        default: s.default.as_ref().map(|d| json(&d.0)),
        list_type: s.x_kubernetes_list_type.clone().filter(|t| t != "atomic"),
        list_map_keys: s.x_kubernetes_list_map_keys.clone().unwrap_or_default(),
    };
    for sub in s.all_of.iter().flatten() {
        n.conjoin(normalise(sub));
    }
    if let Some(any) = &s.any_of {
        n.add_any_of(any.iter().map(normalise).collect());
    }
    if let Some(one) = &s.one_of {
        n.add_one_of(one.iter().map(normalise).collect());
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn norm(v: serde_json::Value) -> Node {
        normalise(&serde_json::from_value(v).unwrap())
    }

    #[test]
    fn all_of_takes_the_tighter_bound_and_intersects_enums() {
        assert_eq!(
            norm(json!({"type": "integer", "allOf": [{"maximum": 5}, {"maximum": 3}]})),
            norm(json!({"type": "integer", "maximum": 3}))
        );
        assert_eq!(
            norm(json!({"type": "string", "allOf": [{"enum": ["a", "b"]}, {"enum": ["b", "a"]}]})),
            norm(json!({"type": "string", "enum": ["a", "b"]}))
        );
    }

    #[test]
    fn enum_only_any_of_is_the_union_and_one_of_the_values_listed_once() {
        assert_eq!(
            norm(json!({"type": "string", "anyOf": [{"enum": ["a"]}, {"enum": ["b"]}]})),
            norm(json!({"type": "string", "enum": ["a", "b"]}))
        );
        assert_eq!(
            norm(json!({"type": "string", "oneOf": [{"enum": ["a", "b"]}, {"enum": ["b", "c"]}]})),
            norm(json!({"type": "string", "enum": ["a", "c"]}))
        );
    }

    #[test]
    fn an_any_of_of_the_node_s_own_types_says_nothing() {
        assert_eq!(
            norm(json!({"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]})),
            norm(json!({"x-kubernetes-int-or-string": true}))
        );
    }

    #[test]
    fn documentation_is_not_part_of_the_normal_form() {
        assert_eq!(
            norm(json!({"type": "string", "description": "x", "title": "t", "example": "e"})),
            norm(json!({"type": "string"}))
        );
    }
}
