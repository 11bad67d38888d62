//! CRD compatibility: would replacing one CustomResourceDefinition with another break objects that
//! exist or clients that use a served version? Pure: two CRDs (and the versions objects are stored
//! in) in, findings out.
//!
//! Owns the rules ([`Rule`], one per class of breaking change, each with a stable kebab-case name),
//! their findings ([`Finding`]: severity, CRD, version, JSON path, old and new value) and the
//! acceptance of intentional breaking changes ([`Acceptance`], `RULE[:[CRD:]PATH]`).
//!
//! Version-level rules live here: a stored version no longer served, a served version removed,
//! the storage version moved without a conversion able to read the old one, the scope or the
//! resource changed. Schema rules (in a version served by both) compare the schemas in normal
//! form ([`normal`]: `allOf` folded, enum-only `anyOf`/`oneOf` turned into enums, documentation
//! dropped), so equivalent rewrites are not reported; [`diff`] holds them. Every schema rule asks
//! one question: could an object valid under the old schema be refused (or lose data) under the
//! new one? `default` changes are the one warning: nothing is refused, but what clients read
//! changes.

mod accept;
mod diff;
mod normal;

pub use accept::acceptances_for;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion, JSONSchemaProps,
};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Severity {
    /// Existing objects or clients would break: the verdict is incompatible unless accepted.
    Incompatible,
    /// Worth a look, never blocks (a changed `default`).
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Incompatible => "incompatible",
            Severity::Warning => "warning",
        })
    }
}

/// Declares [`Rule`] with each variant's stable name and severity, so the three cannot drift apart.
macro_rules! rules {
    ($($(#[$doc:meta])* $variant:ident = $name:literal, $severity:ident;)*) => {
        /// Which compatibility rule a finding breaks. The kebab-case names are stable: they are
        /// what JSON output carries and what [`Acceptance`] strings (`--accept`, a release's
        /// `acceptCrdChanges`) name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Rule {
            $($(#[$doc])* $variant,)*
        }

        impl Rule {
            /// Every rule, in declaration order.
            pub const ALL: &[Rule] = &[$(Rule::$variant),*];

            /// The stable kebab-case name, e.g. `maximum-lowered`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Rule::$variant => $name,)*
                }
            }

            pub fn severity(self) -> Severity {
                match self {
                    $(Rule::$variant => Severity::$severity,)*
                }
            }
        }
    };
}

rules! {
    /// The two CRDs describe different resources (group or plural differ).
    DifferentResource = "different-resource", Incompatible;
    /// A CRD of the old set is missing from the new one (its objects would be deleted).
    CrdRemoved = "crd-removed", Incompatible;
    /// `Namespaced` ↔ `Cluster`.
    ScopeChanged = "scope-changed", Incompatible;
    /// A version in `status.storedVersions` is not served any more: stored objects become unreadable.
    StoredVersionNotServed = "stored-version-not-served", Incompatible;
    /// A served version was removed or set to `served: false`: its clients break.
    ServedVersionRemoved = "served-version-removed", Incompatible;
    /// The storage version moved with neither a conversion webhook nor an equivalent schema.
    StorageVersionUnconvertible = "storage-version-unconvertible", Incompatible;
    /// A property disappears (the server prunes its data), or map values lose their schema.
    FieldRemoved = "field-removed", Incompatible;
    /// A node's type changes other than by widening.
    TypeChanged = "type-changed", Incompatible;
    /// A property becomes required (without a default to fill it in).
    RequiredAdded = "required-added", Incompatible;
    /// Values are removed from an enum.
    EnumValuesRemoved = "enum-values-removed", Incompatible;
    /// An enum is put on a node that had none.
    EnumAdded = "enum-added", Incompatible;
    /// `maximum` lowered, added, or made exclusive.
    MaximumLowered = "maximum-lowered", Incompatible;
    /// `minimum` raised, added, or made exclusive.
    MinimumRaised = "minimum-raised", Incompatible;
    /// A `multipleOf` that the old one does not imply.
    MultipleOfChanged = "multiple-of-changed", Incompatible;
    MaxLengthLowered = "max-length-lowered", Incompatible;
    MinLengthRaised = "min-length-raised", Incompatible;
    MaxItemsLowered = "max-items-lowered", Incompatible;
    MinItemsRaised = "min-items-raised", Incompatible;
    MaxPropertiesLowered = "max-properties-lowered", Incompatible;
    MinPropertiesRaised = "min-properties-raised", Incompatible;
    /// A `pattern` added or changed.
    PatternChanged = "pattern-changed", Incompatible;
    /// A `format` added or changed.
    FormatChanged = "format-changed", Incompatible;
    /// An `anyOf` added, or changed other than by adding branches.
    AnyOfChanged = "any-of-changed", Incompatible;
    /// A `oneOf` added or changed.
    OneOfChanged = "one-of-changed", Incompatible;
    /// A `not` added or changed.
    NotChanged = "not-changed", Incompatible;
    /// `nullable: true` removed: the server prunes stored nulls (it does not refuse them).
    NullableRemoved = "nullable-removed", Incompatible;
    /// An `x-kubernetes-validations` rule added or changed.
    ValidationRuleAdded = "validation-rule-added", Incompatible;
    /// `x-kubernetes-preserve-unknown-fields` removed: the server prunes what it kept.
    PreserveUnknownFieldsRemoved = "preserve-unknown-fields-removed", Incompatible;
    /// `x-kubernetes-list-type` made stricter (`atomic` → `set` → `map`) or its map keys changed.
    ListTypeChanged = "list-type-changed", Incompatible;
    /// A `default` added, removed or changed: objects read differently, nothing is refused.
    DefaultChanged = "default-changed", Warning;
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Rule {
    type Err = String;

    fn from_str(s: &str) -> Result<Rule, String> {
        Rule::ALL.iter().copied().find(|r| r.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Rule::ALL.iter().map(|r| r.name()).collect();
            format!("unknown CRD compatibility rule {s:?}; known rules: {}", names.join(", "))
        })
    }
}

impl Serialize for Rule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Rule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Rule, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// One reason the new CRD is not a safe replacement for the old one, or (a
/// [`Severity::Warning`]) one change worth knowing about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub rule: Rule,
    pub severity: Severity,
    /// An [`Acceptance`] covers it: still listed, no longer blocking.
    #[serde(default)]
    pub accepted: bool,
    /// `metadata.name` of the CRD.
    pub crd: String,
    /// The API version concerned, when the finding is about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// JSON path: inside the custom resource for schema findings (`.spec.size`), inside the CRD
    /// otherwise (`.spec.scope`).
    pub path: String,
    /// What the old CRD said (`10`, `none`), when the finding compares two values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_value: Option<String>,
    pub message: String,
}

impl Finding {
    /// Does this finding make the verdict incompatible? (Incompatible and not accepted.)
    pub fn blocks(&self) -> bool {
        self.severity == Severity::Incompatible && !self.accepted
    }
}

/// `redisclusters.cache.example.com v1alpha1 .spec.size: maximum lowered 10 → 5`.
impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.crd)?;
        if let Some(v) = &self.version {
            write!(f, " {v}")?;
        }
        write!(f, " {}: {}", self.path, self.message)
    }
}

/// No finding blocks: the verdict is compatible (warnings and accepted findings allowed).
pub fn is_compatible(findings: &[Finding]) -> bool {
    !findings.iter().any(Finding::blocks)
}

/// An intentional breaking change, accepted by rule and optionally by CRD and JSON path.
///
/// String form (`--accept`, a release's `spec.acceptCrdChanges`): `RULE`, `RULE:PATH` or
/// `RULE:CRD:PATH` — `field-removed`, `maximum-lowered:.spec.replicas`,
/// `field-removed:redisclusters.cache.example.com:.spec.legacy`. PATH starts with `.` or `[` and
/// is the path findings print; it covers that node and everything below it (`.spec.storage`
/// covers `.spec.storage.class`), in every version. Without a CRD it applies to every CRD
/// compared, which is the usual case of a release holding one operator's CRDs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Acceptance {
    pub rule: Rule,
    pub crd: Option<String>,
    pub path: Option<String>,
}

impl Acceptance {
    /// A release's `spec.acceptCrdChanges`, every entry parsed; the first bad one is the error.
    pub fn parse_all(entries: &[String]) -> Result<Vec<Acceptance>, String> {
        entries.iter().map(|e| e.parse().map_err(|why| format!("spec.acceptCrdChanges: {why}"))).collect()
    }

    pub fn matches(&self, f: &Finding) -> bool {
        let under = |p: &str| {
            f.path == p || (f.path.starts_with(p) && matches!(f.path.as_bytes().get(p.len()), Some(b'.' | b'[')))
        };
        f.rule == self.rule && self.crd.as_ref().is_none_or(|c| *c == f.crd) && self.path.as_deref().is_none_or(under)
    }
}

impl FromStr for Acceptance {
    type Err = String;

    fn from_str(s: &str) -> Result<Acceptance, String> {
        let (rule, rest) = match s.split_once(':') {
            Some((r, rest)) => (r, Some(rest)),
            None => (s, None),
        };
        let rule = rule.parse()?;
        let is_path = |p: &str| p.starts_with('.') || p.starts_with('[');
        let (crd, path) = match rest {
            None => (None, None),
            Some(p) if is_path(p) => (None, Some(p)),
            Some(rest) => match rest.split_once(':') {
                Some((crd, p)) if !crd.is_empty() && is_path(p) => (Some(crd), Some(p)),
                _ => {
                    return Err(format!(
                        "{s:?}: write RULE, RULE:PATH or RULE:CRD:PATH, where PATH starts with '.' (like .spec.replicas)"
                    ));
                }
            },
        };
        Ok(Acceptance { rule, crd: crd.map(str::to_string), path: path.map(str::to_string) })
    }
}

impl TryFrom<String> for Acceptance {
    type Error = String;

    fn try_from(s: String) -> Result<Acceptance, String> {
        s.parse()
    }
}

impl From<Acceptance> for String {
    fn from(a: Acceptance) -> String {
        a.to_string()
    }
}

impl fmt::Display for Acceptance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rule.name())?;
        if let Some(c) = &self.crd {
            write!(f, ":{c}")?;
        }
        if let Some(p) = &self.path {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// A live CRD a rollback (automatic, or a move back through Git) keeps as it is, because its
/// target's CRD is narrower: objects are stored in versions the target's CRD does not list (the
/// API server refuses such a CRD), or replacing it would break objects that exist — a field the
/// server would prune from stored data, a tighter constraint, a served version gone. A CRD is
/// never narrowed under stored data; the rollback keeps the live (newer) CRD and rolls back the
/// rest, and says so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptCrd {
    pub name: String,
    /// The stored versions the target's CRD lacks.
    pub stored: Vec<String>,
    /// What the target's CRD would break, one finding each (`field-removed .spec.paused`).
    pub narrower: Vec<String>,
}

/// Findings named in a [`KeptCrd`]'s text at most; the rest are counted.
const KEPT_NAMED: usize = 3;

impl fmt::Display for KeptCrd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kept CRD {} as it is: ", self.name)?;
        if !self.stored.is_empty() {
            return write!(
                f,
                "objects are stored in {}, which the rollback target does not define",
                self.stored.join(", ")
            );
        }
        let named = self.narrower.iter().take(KEPT_NAMED).cloned().collect::<Vec<_>>().join("; ");
        write!(f, "the rollback target's is narrower ({named}")?;
        if self.narrower.len() > KEPT_NAMED {
            write!(f, "; {} more", self.narrower.len() - KEPT_NAMED)?;
        }
        f.write_str(") and the live one is never narrowed under stored objects")
    }
}

/// The CRDs of `target` (a rollback target's) that must not replace their `live` counterparts
/// ([`KeptCrd`]): every one whose replacement finds something incompatible.
pub fn crds_to_keep(live: &[CustomResourceDefinition], target: &[CustomResourceDefinition]) -> Vec<KeptCrd> {
    let mut out = Vec::new();
    for t in target {
        let Some(l) = live.iter().find(|l| name_of(l) == name_of(t)) else { continue };
        let defined: Vec<&str> = t.spec.versions.iter().map(|v| v.name.as_str()).collect();
        let in_storage = stored_versions(l);
        let stored: Vec<String> = in_storage.iter().filter(|v| !defined.contains(&v.as_str())).cloned().collect();
        // One line per rule and path: the same field usually goes in every version.
        let narrower: std::collections::BTreeSet<String> =
            check(l, t, &in_storage).iter().map(|f| format!("{} {}", f.rule.name(), f.path)).collect();
        let narrower: Vec<String> = narrower.into_iter().collect();
        if !stored.is_empty() || !narrower.is_empty() {
            out.push(KeptCrd { name: name_of(t), stored, narrower });
        }
    }
    out
}

/// The versions objects of `crd` may be stored in: `status.storedVersions`, or the storage version
/// when the CRD carries no status (a file rather than a live object).
pub fn stored_versions(crd: &CustomResourceDefinition) -> Vec<String> {
    match crd.status.as_ref().and_then(|s| s.stored_versions.clone()) {
        Some(v) if !v.is_empty() => v,
        _ => crd.spec.versions.iter().filter(|v| v.storage).map(|v| v.name.clone()).collect(),
    }
}

/// The blocking findings for replacing `old` with `new`, where objects exist in `stored_versions`:
/// empty means compatible. [`check_with`] also returns warnings and takes acceptances.
pub fn check(
    old: &CustomResourceDefinition,
    new: &CustomResourceDefinition,
    stored_versions: &[String],
) -> Vec<Finding> {
    blocking(check_with(old, new, stored_versions, &[]))
}

/// Every finding for replacing `old` with `new` — incompatible ones (marked `accepted` when one of
/// `accept` matches) and warnings. The verdict is [`is_compatible`].
pub fn check_with(
    old: &CustomResourceDefinition,
    new: &CustomResourceDefinition,
    stored_versions: &[String],
    accept: &[Acceptance],
) -> Vec<Finding> {
    let mut c = Checker { crd: name_of(old), out: Vec::new() };
    let (os, ns) = (&old.spec, &new.spec);
    if os.group != ns.group || os.names.plural != ns.names.plural {
        c.crd_finding(
            Rule::DifferentResource,
            ".spec.group",
            format!("{}.{} and {}.{} are different resources", os.names.plural, os.group, ns.names.plural, ns.group),
        );
        return c.finish(accept);
    }
    if os.scope != ns.scope {
        c.crd_finding(Rule::ScopeChanged, ".spec.scope", format!("scope changed from {} to {}", os.scope, ns.scope));
    }

    let served_new = |name: &str| ns.versions.iter().find(|v| v.name == name && v.served);
    let presence = |name: &str| match ns.versions.iter().find(|v| v.name == name) {
        Some(_) => "is no longer served (served: false)",
        None => "was removed",
    };
    for stored in stored_versions {
        if served_new(stored).is_none() {
            c.version_finding(
                Rule::StoredVersionNotServed,
                stored,
                format!("stored version {stored} {}; objects stored as {stored} could not be read", presence(stored)),
            );
        }
    }
    for ov in os.versions.iter().filter(|v| v.served) {
        match served_new(&ov.name) {
            // Reported above, as the stronger finding.
            None if stored_versions.contains(&ov.name) => {}
            None => c.version_finding(
                Rule::ServedVersionRemoved,
                &ov.name,
                format!("served version {} {}; its clients would break", ov.name, presence(&ov.name)),
            ),
            Some(nv) => {
                if let (Some(o), Some(n)) = (schema_of(ov), schema_of(nv)) {
                    c.schema(&ov.name, "", &normal::normalise(o), &normal::normalise(n));
                }
            }
        }
    }

    let storage = |versions: &[CustomResourceDefinitionVersion]| versions.iter().find(|v| v.storage).cloned();
    if let (Some(o), Some(n)) = (storage(&os.versions), storage(&ns.versions))
        && o.name != n.name
    {
        let webhook = ns.conversion.as_ref().is_some_and(|cv| cv.strategy == "Webhook");
        let same = schema_of(&o).map(normal::normalise) == schema_of(&n).map(normal::normalise);
        if !webhook && !same {
            c.out.push(Finding {
                rule: Rule::StorageVersionUnconvertible,
                severity: Rule::StorageVersionUnconvertible.severity(),
                accepted: false,
                crd: c.crd.clone(),
                version: Some(n.name.clone()),
                path: ".spec.conversion".into(),
                old_value: Some(o.name.clone()),
                new_value: Some(n.name.clone()),
                message: format!(
                    "storage version changed from {} to {} with conversion strategy {} and a different schema; \
                     add a Webhook conversion or keep the schemas identical",
                    o.name,
                    n.name,
                    ns.conversion.as_ref().map(|cv| cv.strategy.as_str()).unwrap_or("None")
                ),
            });
        }
    }
    c.finish(accept)
}

/// The blocking findings for replacing a set of CRDs with another, pairing them by name. Stored
/// versions come from each old CRD ([`stored_versions`]). A CRD only in `new` is additive; one only
/// in `old` is [`Rule::CrdRemoved`]. [`check_all_with`] also returns warnings and takes acceptances.
pub fn check_all(old: &[CustomResourceDefinition], new: &[CustomResourceDefinition]) -> Vec<Finding> {
    blocking(check_all_with(old, new, &[]))
}

/// Every finding of [`check_all`], warnings and accepted findings included.
pub fn check_all_with(
    old: &[CustomResourceDefinition],
    new: &[CustomResourceDefinition],
    accept: &[Acceptance],
) -> Vec<Finding> {
    let mut out = Vec::new();
    for o in old {
        match new.iter().find(|n| name_of(n) == name_of(o)) {
            Some(n) => out.extend(check_with(o, n, &stored_versions(o), accept)),
            None => {
                let mut c = Checker { crd: name_of(o), out: Vec::new() };
                c.crd_finding(Rule::CrdRemoved, ".", "CRD removed; pruning it deletes every object of it".into());
                out.extend(c.finish(accept));
            }
        }
    }
    out
}

fn blocking(findings: Vec<Finding>) -> Vec<Finding> {
    findings.into_iter().filter(Finding::blocks).collect()
}

fn name_of(crd: &CustomResourceDefinition) -> String {
    crd.metadata.name.clone().unwrap_or_else(|| format!("{}.{}", crd.spec.names.plural, crd.spec.group))
}

fn schema_of(v: &CustomResourceDefinitionVersion) -> Option<&JSONSchemaProps> {
    v.schema.as_ref()?.open_api_v3_schema.as_ref()
}

/// `.spec.size`, `.metadata.labels["app.kubernetes.io/name"]`.
pub(crate) fn child_path(parent: &str, key: &str) -> String {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        format!("{parent}.{key}")
    } else {
        format!("{parent}[{key:?}]")
    }
}

pub(crate) fn shown_path(path: &str) -> &str {
    if path.is_empty() { "." } else { path }
}

/// Collects the findings of one CRD pair.
struct Checker {
    crd: String,
    out: Vec<Finding>,
}

impl Checker {
    fn push(
        &mut self,
        rule: Rule,
        version: Option<&str>,
        path: &str,
        values: Option<(String, String)>,
        message: String,
    ) {
        let (old_value, new_value) = values.map_or((None, None), |(o, n)| (Some(o), Some(n)));
        self.out.push(Finding {
            rule,
            severity: rule.severity(),
            accepted: false,
            crd: self.crd.clone(),
            version: version.map(str::to_string),
            path: path.into(),
            old_value,
            new_value,
            message,
        });
    }

    fn crd_finding(&mut self, rule: Rule, path: &str, message: String) {
        self.push(rule, None, path, None, message);
    }

    fn version_finding(&mut self, rule: Rule, version: &str, message: String) {
        self.push(rule, Some(version), ".spec.versions", None, message);
    }

    /// A schema finding at `path` (empty: the root) in `version`.
    fn field(&mut self, rule: Rule, version: &str, path: &str, message: String) {
        self.push(rule, Some(version), shown_path(path), None, message);
    }

    /// A schema finding comparing two values; the message reads `{what} old → new[; why]`.
    #[allow(clippy::too_many_arguments)]
    fn changed(&mut self, rule: Rule, version: &str, path: &str, what: &str, old: String, new: String, why: &str) {
        let mut message = format!("{what} {old} → {new}");
        if !why.is_empty() {
            message = format!("{message}; {why}");
        }
        self.push(rule, Some(version), shown_path(path), Some((old, new)), message);
    }

    fn finish(mut self, accept: &[Acceptance]) -> Vec<Finding> {
        for f in &mut self.out {
            f.accepted = f.severity == Severity::Incompatible && accept.iter().any(|a| a.matches(f));
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_quote_keys_that_are_not_plain_names() {
        assert_eq!(
            child_path(".metadata.labels", "app.kubernetes.io/name"),
            ".metadata.labels[\"app.kubernetes.io/name\"]"
        );
        assert_eq!(child_path("", "spec"), ".spec");
        assert_eq!(shown_path(""), ".");
    }

    fn crd(versions: &[&str], stored: Option<&[&str]>) -> CustomResourceDefinition {
        let versions: Vec<serde_json::Value> = versions
            .iter()
            .enumerate()
            .map(|(i, v)| serde_json::json!({"name": v, "served": true, "storage": i == versions.len() - 1}))
            .collect();
        let mut crd = serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"kind": "Widget", "plural": "widgets"}, "versions": versions}
        });
        if let Some(stored) = stored {
            crd["status"] = serde_json::json!({"storedVersions": stored});
        }
        serde_json::from_value(crd).unwrap()
    }

    /// `crd(["v1"], stored)` whose v1 schema has `spec` with `fields`, each a string.
    fn crd_with_fields(fields: &[&str]) -> CustomResourceDefinition {
        let mut crd = crd(&["v1"], Some(&["v1"]));
        let properties: serde_json::Map<String, serde_json::Value> =
            fields.iter().map(|f| (f.to_string(), serde_json::json!({"type": "string"}))).collect();
        let schema = serde_json::json!({"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": properties}}}});
        crd.spec.versions[0].schema = Some(serde_json::from_value(schema).unwrap());
        crd
    }

    #[test]
    fn a_rollback_keeps_a_live_crd_whose_stored_version_the_target_lacks() {
        // The failed release added v1beta1 as storage; objects were written in it.
        let live = [crd(&["v1alpha1", "v1beta1"], Some(&["v1alpha1", "v1beta1"]))];
        let kept = crds_to_keep(&live, &[crd(&["v1alpha1"], None)]);
        assert_eq!(kept.len(), 1);
        assert_eq!(
            (kept[0].name.as_str(), kept[0].stored.as_slice()),
            ("widgets.example.com", &["v1beta1".to_string()][..])
        );
        assert!(kept[0].to_string().contains("stored in v1beta1"), "{}", kept[0]);
        // The target still defines every version: nothing to keep.
        assert!(crds_to_keep(&live, &[crd(&["v1beta1", "v1alpha1"], None)]).is_empty());
        // A CRD the cluster does not have is not kept.
        assert!(crds_to_keep(&[], &[crd(&["v1alpha1"], None)]).is_empty());
    }

    #[test]
    fn a_rollback_keeps_a_live_crd_the_target_would_narrow() {
        // Nothing stored in the new version yet, but its clients would lose it.
        let served = crds_to_keep(&[crd(&["v1alpha1", "v1beta1"], Some(&["v1alpha1"]))], &[crd(&["v1alpha1"], None)]);
        assert_eq!(served.len(), 1);
        assert!(served[0].stored.is_empty());
        assert!(served[0].narrower.iter().any(|n| n.starts_with("served-version-removed")), "{:?}", served[0]);
        // The newer release added an optional field: going back would prune it from stored objects.
        let kept = crds_to_keep(&[crd_with_fields(&["size", "paused"])], &[crd_with_fields(&["size"])]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].narrower, ["field-removed .spec.paused"]);
        let text = kept[0].to_string();
        assert!(
            text.contains("widgets.example.com") && text.contains("narrower (field-removed .spec.paused)"),
            "{text}"
        );
        // A target as wide as the live CRD, or wider, replaces it.
        assert!(crds_to_keep(&[crd_with_fields(&["size"])], &[crd_with_fields(&["size", "paused"])]).is_empty());
    }
}
