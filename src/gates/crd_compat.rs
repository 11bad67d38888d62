//! CRD compatibility: would replacing one CustomResourceDefinition with another break objects that
//! exist or clients that use a served version? Pure: two CRDs (and the versions objects are stored
//! in) in, findings out.
//!
//! Incompatible: a stored version no longer served; a served version removed; in a version served
//! by both, a field removed, a type changed, a new `required` field, enum values removed (or an
//! enum added to a free field); the storage version changed without a conversion able to read the
//! old one (a `Webhook` conversion, or an identical schema under `None`); the scope changed.
//! Compatible: new optional fields, new versions, looser or equal schemas, a type widened to
//! `x-kubernetes-int-or-string` from integer or string, or to an untyped
//! `x-kubernetes-preserve-unknown-fields` field.
//! Not judged here: tightened numeric/length bounds, new patterns, `x-kubernetes-validations`
//! rules; those are caught for live objects by [`super::schema`] validation.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion, JSONSchemaProps, JSONSchemaPropsOrArray,
    JSONSchemaPropsOrBool,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// Which compatibility rule a finding breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Rule {
    /// The two CRDs describe different resources (group or plural differ).
    DifferentResource,
    /// A CRD of the old set is missing from the new one (its objects would be deleted).
    CrdRemoved,
    ScopeChanged,
    /// A version in `status.storedVersions` is not served any more: stored objects become unreadable.
    StoredVersionNotServed,
    /// A served version was removed or set to `served: false`: its clients break.
    ServedVersionRemoved,
    FieldRemoved,
    TypeChanged,
    RequiredAdded,
    EnumValuesRemoved,
    /// The storage version moved with neither a conversion webhook nor an identical schema.
    StorageVersionUnconvertible,
}

/// One reason the new CRD is not a safe replacement for the old one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub rule: Rule,
    /// `metadata.name` of the CRD.
    pub crd: String,
    /// The API version concerned, when the finding is about one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// JSON path: inside the custom resource for schema findings (`.spec.size`), inside the CRD
    /// otherwise (`.spec.scope`).
    pub path: String,
    pub message: String,
}

/// `redisclusters.cache.example.com v1alpha1 .spec.size: field removed`.
impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.crd)?;
        if let Some(v) = &self.version {
            write!(f, " {v}")?;
        }
        write!(f, " {}: {}", self.path, self.message)
    }
}

/// The versions objects of `crd` may be stored in: `status.storedVersions`, or the storage version
/// when the CRD carries no status (a file rather than a live object).
pub fn stored_versions(crd: &CustomResourceDefinition) -> Vec<String> {
    match crd.status.as_ref().and_then(|s| s.stored_versions.clone()) {
        Some(v) if !v.is_empty() => v,
        _ => crd.spec.versions.iter().filter(|v| v.storage).map(|v| v.name.clone()).collect(),
    }
}

/// Findings for replacing `old` with `new`, where objects exist in `stored_versions`.
pub fn check(
    old: &CustomResourceDefinition,
    new: &CustomResourceDefinition,
    stored_versions: &[String],
) -> Vec<Finding> {
    let mut c = Checker { crd: name_of(old), out: Vec::new() };
    let (os, ns) = (&old.spec, &new.spec);
    if os.group != ns.group || os.names.plural != ns.names.plural {
        c.crd_finding(
            Rule::DifferentResource,
            ".spec.group",
            format!("{}.{} and {}.{} are different resources", os.names.plural, os.group, ns.names.plural, ns.group),
        );
        return c.out;
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
                    c.schema(&ov.name, "", o, n);
                }
            }
        }
    }

    let storage = |versions: &[CustomResourceDefinitionVersion]| versions.iter().find(|v| v.storage).cloned();
    if let (Some(o), Some(n)) = (storage(&os.versions), storage(&ns.versions))
        && o.name != n.name
    {
        let webhook = ns.conversion.as_ref().is_some_and(|cv| cv.strategy == "Webhook");
        let same = schema_of(&o).map(without_docs) == schema_of(&n).map(without_docs);
        if !webhook && !same {
            c.out.push(Finding {
                rule: Rule::StorageVersionUnconvertible,
                crd: c.crd.clone(),
                version: Some(n.name.clone()),
                path: ".spec.conversion".into(),
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
    c.out
}

/// Findings for replacing a set of CRDs with another, pairing them by name. Stored versions come
/// from each old CRD ([`stored_versions`]). A CRD only in `new` is additive; one only in `old` is
/// [`Rule::CrdRemoved`].
pub fn check_all(old: &[CustomResourceDefinition], new: &[CustomResourceDefinition]) -> Vec<Finding> {
    let mut out = Vec::new();
    for o in old {
        match new.iter().find(|n| name_of(n) == name_of(o)) {
            Some(n) => out.extend(check(o, n, &stored_versions(o))),
            None => out.push(Finding {
                rule: Rule::CrdRemoved,
                crd: name_of(o),
                version: None,
                path: ".".into(),
                message: "CRD removed; pruning it deletes every object of it".into(),
            }),
        }
    }
    out
}

fn name_of(crd: &CustomResourceDefinition) -> String {
    crd.metadata.name.clone().unwrap_or_else(|| format!("{}.{}", crd.spec.names.plural, crd.spec.group))
}

fn schema_of(v: &CustomResourceDefinitionVersion) -> Option<&JSONSchemaProps> {
    v.schema.as_ref()?.open_api_v3_schema.as_ref()
}

/// The schema with documentation stripped: descriptions do not change what validates.
fn without_docs(s: &JSONSchemaProps) -> JSONSchemaProps {
    let mut s = s.clone();
    strip_docs(&mut s);
    s
}

fn strip_docs(s: &mut JSONSchemaProps) {
    s.description = None;
    s.title = None;
    s.example = None;
    s.external_docs = None;
    for p in s.properties.iter_mut().flat_map(|m| m.values_mut()) {
        strip_docs(p);
    }
    match &mut s.items {
        Some(JSONSchemaPropsOrArray::Schema(i)) => strip_docs(i),
        Some(JSONSchemaPropsOrArray::Schemas(is)) => is.iter_mut().for_each(strip_docs),
        None => {}
    }
    if let Some(JSONSchemaPropsOrBool::Schema(a)) = &mut s.additional_properties {
        strip_docs(a);
    }
    for list in [&mut s.all_of, &mut s.any_of, &mut s.one_of].into_iter().flatten() {
        list.iter_mut().for_each(strip_docs);
    }
    if let Some(n) = &mut s.not {
        strip_docs(n);
    }
}

/// The type a schema node accepts, for comparison: `integer`, `int-or-string`, `any`, ….
fn type_name(s: &JSONSchemaProps) -> &str {
    if s.x_kubernetes_int_or_string == Some(true) {
        "int-or-string"
    } else {
        match s.type_.as_deref() {
            Some(t) if !t.is_empty() => t,
            _ => "any",
        }
    }
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

struct Checker {
    crd: String,
    out: Vec<Finding>,
}

impl Checker {
    fn crd_finding(&mut self, rule: Rule, path: &str, message: String) {
        self.out.push(Finding { rule, crd: self.crd.clone(), version: None, path: path.into(), message });
    }

    fn version_finding(&mut self, rule: Rule, version: &str, message: String) {
        self.out.push(Finding {
            rule,
            crd: self.crd.clone(),
            version: Some(version.into()),
            path: ".spec.versions".into(),
            message,
        });
    }

    fn field(&mut self, rule: Rule, version: &str, path: &str, message: String) {
        self.out.push(Finding {
            rule,
            crd: self.crd.clone(),
            version: Some(version.into()),
            path: shown_path(path).into(),
            message,
        });
    }

    fn schema(&mut self, version: &str, path: &str, old: &JSONSchemaProps, new: &JSONSchemaProps) {
        let (ot, nt) = (type_name(old), type_name(new));
        if ot != nt {
            let widened = (nt == "any" && new.x_kubernetes_preserve_unknown_fields == Some(true))
                || (nt == "int-or-string" && matches!(ot, "integer" | "string"));
            if !widened {
                self.field(Rule::TypeChanged, version, path, format!("type changed from {ot} to {nt}"));
            }
            // Below a type change the old and new children describe different things.
            return;
        }

        let required = |s: &JSONSchemaProps| s.required.iter().flatten().cloned().collect::<BTreeSet<_>>();
        for added in required(new).difference(&required(old)) {
            self.field(
                Rule::RequiredAdded,
                version,
                &child_path(path, added),
                "new required field; existing objects without it would stop validating".into(),
            );
        }

        self.enums(version, path, old, new);

        if let Some(old_props) = &old.properties {
            for (key, o) in old_props {
                let p = child_path(path, key);
                match new.properties.as_ref().and_then(|m| m.get(key)) {
                    Some(n) => self.schema(version, &p, o, n),
                    None => self.field(Rule::FieldRemoved, version, &p, "field removed".into()),
                }
            }
        }
        if let (Some(JSONSchemaPropsOrArray::Schema(o)), Some(JSONSchemaPropsOrArray::Schema(n))) =
            (&old.items, &new.items)
        {
            self.schema(version, &format!("{path}[*]"), o, n);
        }
        if let (Some(JSONSchemaPropsOrBool::Schema(o)), Some(JSONSchemaPropsOrBool::Schema(n))) =
            (&old.additional_properties, &new.additional_properties)
        {
            self.schema(version, &format!("{path}.*"), o, n);
        }
    }

    fn enums(&mut self, version: &str, path: &str, old: &JSONSchemaProps, new: &JSONSchemaProps) {
        let values =
            |s: &JSONSchemaProps| s.enum_.as_ref().map(|e| e.iter().map(|j| j.0.to_string()).collect::<BTreeSet<_>>());
        match (values(old), values(new)) {
            (Some(o), Some(n)) => {
                let removed: Vec<String> = o.difference(&n).cloned().collect();
                if !removed.is_empty() {
                    self.field(
                        Rule::EnumValuesRemoved,
                        version,
                        path,
                        format!(
                            "enum values removed: {}; objects using them would stop validating",
                            removed.join(", ")
                        ),
                    );
                }
            }
            (None, Some(n)) => self.field(
                Rule::EnumValuesRemoved,
                version,
                path,
                format!(
                    "enum added to a free field: only {} validate now",
                    n.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ),
            _ => {}
        }
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
}
