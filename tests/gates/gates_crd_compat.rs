//! CRD compatibility: a table of CRD pairs (fixtures in `tests/testdata/crds/`, each a one-change
//! variant of `base.yaml`) with the findings each must produce; a table of schema pairs (plain
//! values) covering every schema rule both ways — caught when tightened, silent when loosened or
//! rewritten equivalently; acceptances; and the `fleetgate check-crd` command's exit codes and
//! JSON, run as the built binary.

use fleetgate::gates::crd_compat::{self, Acceptance, Rule, Severity};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use rstest::rstest;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/crds").join(format!("{name}.yaml"))
}

fn load(name: &str) -> CustomResourceDefinition {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

const NONE: &[(Rule, &str, &str)] = &[];

#[rstest]
#[case::identical("base", "base", &["v1alpha1"], NONE)]
#[case::optional_field_added("base", "add-optional-field", &["v1alpha1"], NONE)]
#[case::version_added("base", "add-version", &["v1alpha1"], NONE)]
#[case::description_changed("base", "description-changed", &["v1alpha1"], NONE)]
#[case::enum_value_added("base", "enum-value-added", &["v1alpha1"], NONE)]
#[case::widened_to_int_or_string("base", "size-int-or-string", &["v1alpha1"], NONE)]
#[case::field_removed("base", "field-removed", &["v1alpha1"], &[(Rule::FieldRemoved, "v1alpha1", ".spec.image")])]
#[case::nested_field_removed("base", "nested-field-removed", &["v1alpha1"], &[(Rule::FieldRemoved, "v1alpha1", ".spec.storage.class")])]
#[case::item_field_removed("base", "item-field-removed", &["v1alpha1"], &[(Rule::FieldRemoved, "v1alpha1", ".spec.ports[*].name")])]
#[case::type_changed("base", "type-changed", &["v1alpha1"], &[(Rule::TypeChanged, "v1alpha1", ".spec.size")])]
#[case::narrowed_from_int_or_string("size-int-or-string", "base", &["v1alpha1"], &[(Rule::TypeChanged, "v1alpha1", ".spec.size")])]
#[case::map_value_type_changed("base", "map-value-type-changed", &["v1alpha1"], &[(Rule::TypeChanged, "v1alpha1", ".spec.labels.*")])]
#[case::required_added("base", "required-added", &["v1alpha1"], &[(Rule::RequiredAdded, "v1alpha1", ".spec.image")])]
#[case::enum_value_removed("base", "enum-value-removed", &["v1alpha1"], &[(Rule::EnumValuesRemoved, "v1alpha1", ".spec.mode")])]
#[case::enum_added("base", "enum-added", &["v1alpha1"], &[(Rule::EnumAdded, "v1alpha1", ".spec.image")])]
#[case::optional_field_dropped_again("add-optional-field", "base", &["v1alpha1"], &[(Rule::FieldRemoved, "v1alpha1", ".spec.replicas")])]
#[case::scope_changed("base", "scope-cluster", &["v1alpha1"], &[(Rule::ScopeChanged, "", ".spec.scope")])]
#[case::different_resource("base", "other-resource", &["v1alpha1"], &[(Rule::DifferentResource, "", ".spec.group")])]
#[case::stored_version_unserved("two-versions", "v1alpha1-unserved", &["v1alpha1", "v1alpha2"], &[(Rule::StoredVersionNotServed, "v1alpha1", ".spec.versions")])]
#[case::stored_version_dropped("two-versions", "v1alpha1-dropped", &["v1alpha1", "v1alpha2"], &[(Rule::StoredVersionNotServed, "v1alpha1", ".spec.versions")])]
#[case::served_version_dropped("two-versions", "v1alpha1-dropped", &["v1alpha2"], &[(Rule::ServedVersionRemoved, "v1alpha1", ".spec.versions")])]
#[case::unserving_a_never_stored_version("two-versions", "v1alpha1-unserved", &["v1alpha2"], &[(Rule::ServedVersionRemoved, "v1alpha1", ".spec.versions")])]
#[case::storage_moved_without_conversion("base", "storage-moved-none", &["v1alpha1"], &[(Rule::StorageVersionUnconvertible, "v1alpha2", ".spec.conversion")])]
#[case::storage_moved_with_webhook("base", "storage-moved-webhook", &["v1alpha1"], NONE)]
#[case::storage_moved_same_schema("base", "storage-moved-same-schema", &["v1alpha1"], NONE)]
fn crd_pairs(#[case] old: &str, #[case] new: &str, #[case] stored: &[&str], #[case] want: &[(Rule, &str, &str)]) {
    let stored: Vec<String> = stored.iter().map(|s| s.to_string()).collect();
    let findings = crd_compat::check(&load(old), &load(new), &stored);
    let got: Vec<(Rule, String, String)> =
        findings.iter().map(|f| (f.rule, f.version.clone().unwrap_or_default(), f.path.clone())).collect();
    let want: Vec<(Rule, String, String)> = want.iter().map(|(r, v, p)| (*r, v.to_string(), p.to_string())).collect();
    assert_eq!(got, want, "{old} -> {new}: {findings:#?}");
    for f in &findings {
        assert_eq!(f.crd, "redisclusters.cache.example.com");
        assert!(!f.message.is_empty());
    }
}

/// A one-version CRD (`widgets.table.example.com`, v1) whose `.spec` schema is `spec`.
fn crd_with_spec(spec: Value) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.table.example.com"},
        "spec": {
            "group": "table.example.com",
            "names": {"kind": "Widget", "plural": "widgets"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}},
            }],
        },
    }))
    .unwrap()
}

/// `.spec` with one property `f` of schema `f`.
fn field(f: Value) -> Value {
    json!({"type": "object", "properties": {"f": f}})
}

fn int(extra: Value) -> Value {
    merged(json!({"type": "integer"}), extra)
}

fn string(extra: Value) -> Value {
    merged(json!({"type": "string"}), extra)
}

fn array(extra: Value) -> Value {
    merged(json!({"type": "array", "items": {"type": "string"}}), extra)
}

fn map(extra: Value) -> Value {
    merged(json!({"type": "object", "additionalProperties": {"type": "string"}}), extra)
}

fn merged(mut base: Value, extra: Value) -> Value {
    base.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    base
}

const F: &str = ".spec.f";

/// Every schema rule, each caught when it tightens and silent when it loosens or the schema is
/// rewritten equivalently. `old` and `new` are `.spec.f`'s schema unless a row builds `.spec`.
/// Rows where a peer tool decides differently say so.
#[rstest]
// maximum (and exclusiveMaximum)
#[case::maximum_lowered(field(int(json!({"maximum": 10}))), field(int(json!({"maximum": 5}))), &[(Rule::MaximumLowered, F)])]
#[case::maximum_raised(field(int(json!({"maximum": 5}))), field(int(json!({"maximum": 10}))), &[])]
#[case::maximum_added(field(int(json!({}))), field(int(json!({"maximum": 5}))), &[(Rule::MaximumLowered, F)])]
#[case::maximum_removed(field(int(json!({"maximum": 5}))), field(int(json!({}))), &[])]
#[case::maximum_made_exclusive(field(int(json!({"maximum": 5}))), field(int(json!({"maximum": 5, "exclusiveMaximum": true}))), &[(Rule::MaximumLowered, F)])]
#[case::maximum_made_inclusive(field(int(json!({"maximum": 5, "exclusiveMaximum": true}))), field(int(json!({"maximum": 5}))), &[])]
// allOf: the tighter bound counts. crdify compares the top-level maximum only.
#[case::all_of_maxima_is_the_smaller(field(int(json!({"allOf": [{"maximum": 5}, {"maximum": 3}]}))), field(int(json!({"maximum": 3}))), &[])]
#[case::all_of_maxima_then_lower(field(int(json!({"allOf": [{"maximum": 5}, {"maximum": 3}]}))), field(int(json!({"maximum": 2}))), &[(Rule::MaximumLowered, F)])]
// minimum (and exclusiveMinimum)
#[case::minimum_raised(field(int(json!({"minimum": 1}))), field(int(json!({"minimum": 3}))), &[(Rule::MinimumRaised, F)])]
#[case::minimum_lowered(field(int(json!({"minimum": 3}))), field(int(json!({"minimum": 1}))), &[])]
#[case::minimum_added(field(int(json!({}))), field(int(json!({"minimum": 0}))), &[(Rule::MinimumRaised, F)])]
#[case::minimum_made_exclusive(field(int(json!({"minimum": 1}))), field(int(json!({"minimum": 1, "exclusiveMinimum": true}))), &[(Rule::MinimumRaised, F)])]
// multipleOf
#[case::multiple_of_added(field(int(json!({}))), field(int(json!({"multipleOf": 2}))), &[(Rule::MultipleOfChanged, F)])]
#[case::multiple_of_coarser(field(int(json!({"multipleOf": 3}))), field(int(json!({"multipleOf": 6}))), &[(Rule::MultipleOfChanged, F)])]
#[case::multiple_of_finer(field(int(json!({"multipleOf": 6}))), field(int(json!({"multipleOf": 3}))), &[])]
// maxLength / minLength
#[case::max_length_lowered(field(string(json!({"maxLength": 10}))), field(string(json!({"maxLength": 5}))), &[(Rule::MaxLengthLowered, F)])]
#[case::max_length_raised(field(string(json!({"maxLength": 5}))), field(string(json!({"maxLength": 10}))), &[])]
#[case::max_length_added(field(string(json!({}))), field(string(json!({"maxLength": 63}))), &[(Rule::MaxLengthLowered, F)])]
// Beyond the peers: every value of the enum is short enough. crdify reports it (a maxLength added).
#[case::max_length_added_to_a_short_enum(field(string(json!({"enum": ["a", "bb"]}))), field(string(json!({"enum": ["a", "bb"], "maxLength": 5}))), &[])]
#[case::min_length_raised(field(string(json!({"minLength": 1}))), field(string(json!({"minLength": 3}))), &[(Rule::MinLengthRaised, F)])]
#[case::min_length_lowered(field(string(json!({"minLength": 3}))), field(string(json!({"minLength": 1}))), &[])]
// minLength 0 refuses nothing; crdify reports any minimum added.
#[case::min_length_zero_added(field(string(json!({}))), field(string(json!({"minLength": 0}))), &[])]
// maxItems / minItems
#[case::max_items_lowered(field(array(json!({"maxItems": 10}))), field(array(json!({"maxItems": 2}))), &[(Rule::MaxItemsLowered, F)])]
#[case::max_items_raised(field(array(json!({"maxItems": 2}))), field(array(json!({"maxItems": 10}))), &[])]
#[case::min_items_raised(field(array(json!({}))), field(array(json!({"minItems": 1}))), &[(Rule::MinItemsRaised, F)])]
#[case::min_items_lowered(field(array(json!({"minItems": 2}))), field(array(json!({"minItems": 1}))), &[])]
// maxProperties / minProperties
#[case::max_properties_lowered(field(map(json!({"maxProperties": 5}))), field(map(json!({"maxProperties": 4}))), &[(Rule::MaxPropertiesLowered, F)])]
#[case::max_properties_removed(field(map(json!({"maxProperties": 5}))), field(map(json!({}))), &[])]
#[case::min_properties_raised(field(map(json!({"minProperties": 1}))), field(map(json!({"minProperties": 2}))), &[(Rule::MinPropertiesRaised, F)])]
#[case::min_properties_lowered(field(map(json!({"minProperties": 2}))), field(map(json!({}))), &[])]
// pattern
#[case::pattern_added(field(string(json!({}))), field(string(json!({"pattern": "^[a-z]+$"}))), &[(Rule::PatternChanged, F)])]
#[case::pattern_changed(field(string(json!({"pattern": "^[a-z]+$"}))), field(string(json!({"pattern": "^[a-z0-9]+$"}))), &[(Rule::PatternChanged, F)])]
#[case::pattern_removed(field(string(json!({"pattern": "^[a-z]+$"}))), field(string(json!({}))), &[])]
#[case::pattern_every_enum_value_matches(field(string(json!({"enum": ["ab", "cd"]}))), field(string(json!({"enum": ["ab", "cd"], "pattern": "^[a-z]+$"}))), &[])]
// format: crdify has no format rule.
#[case::format_added(field(string(json!({}))), field(string(json!({"format": "date-time"}))), &[(Rule::FormatChanged, F)])]
#[case::format_changed(field(string(json!({"format": "date"}))), field(string(json!({"format": "date-time"}))), &[(Rule::FormatChanged, F)])]
#[case::format_removed(field(string(json!({"format": "date"}))), field(string(json!({}))), &[])]
// enum. crdify by default also reports values added (additionPolicy: Disallow); adding a value
// refuses no existing object, so it is compatible here.
#[case::enum_value_removed(field(string(json!({"enum": ["a", "b"]}))), field(string(json!({"enum": ["a"]}))), &[(Rule::EnumValuesRemoved, F)])]
#[case::enum_value_added(field(string(json!({"enum": ["a"]}))), field(string(json!({"enum": ["a", "b"]}))), &[])]
#[case::enum_added(field(string(json!({}))), field(string(json!({"enum": ["a"]}))), &[(Rule::EnumAdded, F)])]
#[case::enum_removed(field(string(json!({"enum": ["a"]}))), field(string(json!({}))), &[])]
#[case::enum_of_both_booleans_added(field(json!({"type": "boolean"})), field(json!({"type": "boolean", "enum": [true, false]})), &[])]
// The reported false alarm: an allOf of two identical enums became that enum.
#[case::all_of_identical_enums_to_one(field(string(json!({"allOf": [{"enum": ["a", "b"]}, {"enum": ["a", "b"]}]}))), field(string(json!({"enum": ["a", "b"]}))), &[])]
#[case::one_enum_to_all_of_identical_enums(field(string(json!({"enum": ["a", "b"]}))), field(string(json!({"allOf": [{"enum": ["a", "b"]}, {"enum": ["b", "a"]}]}))), &[])]
#[case::all_of_narrower_enum(field(string(json!({"enum": ["a", "b"]}))), field(string(json!({"allOf": [{"enum": ["a", "b"]}, {"enum": ["a"]}]}))), &[(Rule::EnumValuesRemoved, F)])]
// anyOf / oneOf / not
#[case::any_of_of_enums_is_their_union(field(string(json!({"enum": ["a", "b"]}))), field(string(json!({"anyOf": [{"enum": ["a"]}, {"enum": ["b"]}]}))), &[])]
#[case::any_of_added(field(int(json!({}))), field(int(json!({"anyOf": [{"maximum": 3}, {"minimum": 7}]}))), &[(Rule::AnyOfChanged, F)])]
#[case::any_of_branch_added(field(int(json!({"anyOf": [{"maximum": 3}, {"minimum": 7}]}))), field(int(json!({"anyOf": [{"maximum": 3}, {"minimum": 7}, {"multipleOf": 5}]}))), &[])]
#[case::any_of_removed(field(int(json!({"anyOf": [{"maximum": 3}, {"minimum": 7}]}))), field(int(json!({}))), &[])]
#[case::one_of_added(field(int(json!({}))), field(int(json!({"oneOf": [{"maximum": 3}, {"minimum": 7}]}))), &[(Rule::OneOfChanged, F)])]
#[case::one_of_of_disjoint_enums_is_their_union(field(string(json!({"enum": ["a", "b"]}))), field(string(json!({"oneOf": [{"enum": ["a"]}, {"enum": ["b"]}]}))), &[])]
#[case::not_added(field(string(json!({}))), field(string(json!({"not": {"enum": ["x"]}}))), &[(Rule::NotChanged, F)])]
#[case::int_or_string_any_of_types_is_no_constraint(field(json!({"x-kubernetes-int-or-string": true})), field(json!({"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]})), &[])]
// nullable
#[case::nullable_removed(field(string(json!({"nullable": true}))), field(string(json!({}))), &[(Rule::NullableRemoved, F)])]
#[case::nullable_added(field(string(json!({}))), field(string(json!({"nullable": true}))), &[])]
// x-kubernetes-validations
#[case::validation_rule_added(field(int(json!({}))), field(int(json!({"x-kubernetes-validations": [{"rule": "self <= 5"}]}))), &[(Rule::ValidationRuleAdded, F)])]
#[case::validation_rule_changed(field(int(json!({"x-kubernetes-validations": [{"rule": "self <= 5"}]}))), field(int(json!({"x-kubernetes-validations": [{"rule": "self <= 4"}]}))), &[(Rule::ValidationRuleAdded, F)])]
#[case::validation_rule_removed(field(int(json!({"x-kubernetes-validations": [{"rule": "self <= 5"}]}))), field(int(json!({}))), &[])]
#[case::validation_message_changed(field(int(json!({"x-kubernetes-validations": [{"rule": "self <= 5", "message": "too big"}]}))), field(int(json!({"x-kubernetes-validations": [{"rule": "self <= 5", "message": "at most 5"}]}))), &[])]
// x-kubernetes-preserve-unknown-fields
#[case::preserve_unknown_fields_removed(field(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})), field(json!({"type": "object"})), &[(Rule::PreserveUnknownFieldsRemoved, F)])]
#[case::preserve_unknown_fields_added(field(json!({"type": "object"})), field(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})), &[])]
// crdify reports a field removed; its data is still kept, only untyped.
#[case::field_dropped_under_preserve_unknown_fields(field(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"a": {"type": "string"}}})), field(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})), &[])]
// Beyond the peers: what a preserving object kept at `a` may be anything, so typing it is a type change.
#[case::field_typed_under_preserve_unknown_fields(field(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})), field(json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"a": {"type": "string"}}})), &[(Rule::TypeChanged, ".spec.f.a")])]
#[case::map_values_dropped(field(map(json!({}))), field(json!({"type": "object"})), &[(Rule::FieldRemoved, ".spec.f.*")])]
// default: a warning here; crdify reports default changes as errors by default.
#[case::default_changed(field(int(json!({"default": 1}))), field(int(json!({"default": 2}))), &[(Rule::DefaultChanged, F)])]
#[case::default_added(field(int(json!({}))), field(int(json!({"default": 2}))), &[(Rule::DefaultChanged, F)])]
#[case::default_same(field(int(json!({"default": 1, "description": "one"}))), field(int(json!({"default": 1}))), &[])]
// description, title, example
#[case::documentation_only(field(string(json!({"description": "old"}))), field(string(json!({"description": "new", "title": "F", "example": "x"}))), &[])]
// required
#[case::required_added(json!({"type": "object", "properties": {"f": {"type": "string"}}}), json!({"type": "object", "required": ["f"], "properties": {"f": {"type": "string"}}}), &[(Rule::RequiredAdded, F)])]
// The server defaults before it validates, so a defaulted required field is never missing;
// crdify reports every new required field.
#[case::required_added_with_default(json!({"type": "object", "properties": {"f": {"type": "string"}}}), json!({"type": "object", "required": ["f"], "properties": {"f": {"type": "string", "default": "x"}}}), &[(Rule::DefaultChanged, F)])]
#[case::required_removed(json!({"type": "object", "required": ["f"], "properties": {"f": {"type": "string"}}}), json!({"type": "object", "properties": {"f": {"type": "string"}}}), &[])]
#[case::required_in_all_of_is_required(json!({"type": "object", "required": ["f"], "properties": {"f": {"type": "string"}}}), json!({"type": "object", "allOf": [{"required": ["f"]}], "properties": {"f": {"type": "string"}}}), &[])]
// type
#[case::type_changed(field(int(json!({}))), field(string(json!({}))), &[(Rule::TypeChanged, F)])]
// Every integer is a number; crdify reports any type change.
#[case::integer_widened_to_number(field(int(json!({}))), field(json!({"type": "number"})), &[])]
#[case::number_narrowed_to_integer(field(json!({"type": "number"})), field(int(json!({}))), &[(Rule::TypeChanged, F)])]
#[case::widened_but_bound_lowered(field(int(json!({"maximum": 9}))), field(json!({"type": "number", "maximum": 5})), &[(Rule::MaximumLowered, F)])]
// x-kubernetes-list-type
#[case::list_type_set_added(field(array(json!({}))), field(array(json!({"x-kubernetes-list-type": "set"}))), &[(Rule::ListTypeChanged, F)])]
#[case::list_type_set_removed(field(array(json!({"x-kubernetes-list-type": "set"}))), field(array(json!({"x-kubernetes-list-type": "atomic"}))), &[])]
fn schema_pairs(#[case] old: Value, #[case] new: Value, #[case] want: &[(Rule, &str)]) {
    let (old, new) = (crd_with_spec(old), crd_with_spec(new));
    let stored = ["v1".to_string()];
    let findings = crd_compat::check_with(&old, &new, &stored, &[]);
    let got: Vec<(Rule, &str)> = findings.iter().map(|f| (f.rule, f.path.as_str())).collect();
    assert_eq!(got, want, "{findings:#?}");
    for f in &findings {
        assert_eq!(f.severity, f.rule.severity());
        assert!(!f.accepted);
        assert!(f.old_value.is_some() || matches!(f.rule, Rule::RequiredAdded | Rule::FieldRemoved), "{f:?}");
    }
    let compatible = want.iter().all(|(r, _)| r.severity() == Severity::Warning);
    assert_eq!(crd_compat::is_compatible(&findings), compatible, "{findings:#?}");
    // `check` keeps only what blocks: warnings never reach callers that treat any finding as a refusal.
    assert_eq!(crd_compat::check(&old, &new, &stored).is_empty(), compatible);
}

#[test]
fn check_all_reports_a_removed_crd_and_pairs_the_rest_by_name() {
    let old = vec![load("base"), load("other-resource")];
    let new = vec![load("field-removed")];
    let findings = crd_compat::check_all(&old, &new);
    let rules: Vec<(Rule, &str)> = findings.iter().map(|f| (f.rule, f.crd.as_str())).collect();
    assert_eq!(
        rules,
        vec![
            (Rule::FieldRemoved, "redisclusters.cache.example.com"),
            (Rule::CrdRemoved, "redisclusters.cache.other.io")
        ]
    );
}

#[test]
fn stored_versions_default_to_the_storage_version_without_a_status() {
    assert_eq!(crd_compat::stored_versions(&load("two-versions")), vec!["v1alpha2".to_string()]);
    let mut live = load("two-versions");
    live.status =
        Some(serde_json::from_value(serde_json::json!({"storedVersions": ["v1alpha1", "v1alpha2"]})).unwrap());
    assert_eq!(crd_compat::stored_versions(&live), vec!["v1alpha1".to_string(), "v1alpha2".to_string()]);
}

fn check_crd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .arg("check-crd")
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (out.status.code().unwrap(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

fn path(name: &str) -> String {
    fixture(name).display().to_string()
}

#[test]
fn cli_exits_0_for_a_compatible_pair() {
    let (code, out, err) = check_crd(&[&path("base"), &path("add-optional-field")]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("compatible:"), "{out}");
}

#[test]
fn cli_exits_1_and_lists_findings_for_an_incompatible_pair() {
    let (code, out, err) = check_crd(&[&path("base"), &path("required-added")]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.starts_with("incompatible: 1 finding"), "{out}");
    assert!(out.contains("required-added") && out.contains("v1alpha1") && out.contains(".spec.image"), "{out}");
}

#[test]
fn cli_json_carries_the_verdict_and_every_finding() {
    let (code, out, _) = check_crd(&[
        &path("two-versions"),
        &path("v1alpha1-dropped"),
        "--stored-versions",
        "v1alpha1,v1alpha2",
        "-o",
        "json",
    ]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["compatible"], false);
    assert_eq!(v["findings"].as_array().unwrap().len(), 1);
    let f = &v["findings"][0];
    assert_eq!(f["rule"], "stored-version-not-served");
    assert_eq!(f["severity"], "incompatible");
    assert_eq!(f["accepted"], false);
    assert_eq!(f["version"], "v1alpha1");
    assert_eq!(f["path"], ".spec.versions");
    assert_eq!(f["crd"], "redisclusters.cache.example.com");

    let (code, out, _) = check_crd(&[&path("base"), &path("base"), "-o", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["compatible"], true);
    assert_eq!(v["findings"], serde_json::json!([]));
}

#[test]
fn cli_stored_versions_flag_decides_which_rule_applies() {
    let (code, out, _) = check_crd(&[&path("two-versions"), &path("v1alpha1-unserved"), "-o", "json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["findings"][0]["rule"], "served-version-removed", "{out}");
}

#[test]
fn cli_exits_2_for_a_missing_file() {
    let (code, out, err) = check_crd(&["/nonexistent/old.yaml", &path("base")]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("cannot read /nonexistent/old.yaml"), "{err}");
}

#[rstest]
#[case::yaml_syntax("a: [\n", "old.yaml")]
#[case::not_a_crd("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "holds no CustomResourceDefinition")]
#[case::malformed_crd(
    "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: x}\nspec: 3\n",
    "not a valid apiextensions.k8s.io/v1 CustomResourceDefinition"
)]
fn cli_exits_2_for_unreadable_input(#[case] text: &str, #[case] want: &str) {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.yaml");
    std::fs::write(&old, text).unwrap();
    let (code, out, err) = check_crd(&[old.to_str().unwrap(), &path("base")]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains(want), "{err}");
}

#[test]
fn cli_refuses_stored_versions_with_several_crds() {
    let dir = tempfile::tempdir().unwrap();
    let both = dir.path().join("both.yaml");
    let text = format!(
        "{}\n---\n{}",
        std::fs::read_to_string(fixture("base")).unwrap(),
        std::fs::read_to_string(fixture("other-resource")).unwrap()
    );
    std::fs::write(&both, text).unwrap();
    let (code, _, err) = check_crd(&[both.to_str().unwrap(), both.to_str().unwrap(), "--stored-versions", "v1alpha1"]);
    assert_eq!(code, 2);
    assert!(err.contains("--stored-versions needs exactly one CRD"), "{err}");
    let (code, out, _) = check_crd(&[both.to_str().unwrap(), both.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
}

#[rstest]
#[case::rule_only("field-removed", Rule::FieldRemoved, None, None)]
#[case::rule_and_path("maximum-lowered:.spec.replicas", Rule::MaximumLowered, None, Some(".spec.replicas"))]
#[case::quoted_key(
    "field-removed:.metadata.labels[\"a:b\"]",
    Rule::FieldRemoved,
    None,
    Some(".metadata.labels[\"a:b\"]")
)]
#[case::with_crd(
    "field-removed:redisclusters.cache.example.com:.spec.image",
    Rule::FieldRemoved,
    Some("redisclusters.cache.example.com"),
    Some(".spec.image")
)]
fn acceptances_parse_and_print_back(
    #[case] text: &str,
    #[case] rule: Rule,
    #[case] crd: Option<&str>,
    #[case] path: Option<&str>,
) {
    let a: Acceptance = text.parse().unwrap();
    assert_eq!(a, Acceptance { rule, crd: crd.map(str::to_string), path: path.map(str::to_string) });
    assert_eq!(a.to_string(), text);
    let back: Acceptance = serde_json::from_value(serde_json::to_value(&a).unwrap()).unwrap();
    assert_eq!(back, a);
}

#[rstest]
#[case::unknown_rule("maximum-dropped", "unknown CRD compatibility rule \"maximum-dropped\"")]
#[case::camel_case("fieldRemoved", "unknown CRD compatibility rule")]
#[case::path_without_dot("field-removed:spec.image", "PATH starts with '.'")]
#[case::empty_crd("field-removed::.spec.image", "PATH starts with '.'")]
fn bad_acceptances_say_what_is_wrong(#[case] text: &str, #[case] want: &str) {
    let err = text.parse::<Acceptance>().unwrap_err();
    assert!(err.contains(want), "{err}");
}

#[test]
fn rule_names_are_kebab_case_and_serialize_as_themselves() {
    for r in Rule::ALL {
        let name = r.name();
        assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '-'), "{name}");
        assert_eq!(serde_json::to_value(r).unwrap(), json!(name));
        assert_eq!(name.parse::<Rule>().unwrap(), *r);
    }
}

#[test]
fn an_accepted_finding_is_listed_but_does_not_block() {
    let (old, new) = (load("base"), load("nested-field-removed"));
    let stored = ["v1alpha1".to_string()];
    let accept = |s: &str| vec![s.parse::<Acceptance>().unwrap()];
    for covering in [
        "field-removed",
        "field-removed:.spec.storage",
        "field-removed:redisclusters.cache.example.com:.spec.storage.class",
    ] {
        let findings = crd_compat::check_with(&old, &new, &stored, &accept(covering));
        assert_eq!(findings.len(), 1, "{covering}");
        assert!(findings[0].accepted, "{covering}");
        assert!(crd_compat::is_compatible(&findings), "{covering}");
    }
    // Another rule, a sibling path, a path prefix that is not a parent, or another CRD: still blocking.
    for other in [
        "type-changed",
        "field-removed:.spec.size",
        "field-removed:.spec.stor",
        "field-removed:other.example.com:.spec.storage",
    ] {
        let findings = crd_compat::check_with(&old, &new, &stored, &accept(other));
        assert!(!findings[0].accepted && !crd_compat::is_compatible(&findings), "{other}");
    }
    // Warnings are never "accepted": they do not block in the first place.
    let findings = crd_compat::check_with(&load("base"), &load("size-default"), &stored, &accept("default-changed"));
    assert_eq!(
        (findings[0].rule, findings[0].severity, findings[0].accepted),
        (Rule::DefaultChanged, Severity::Warning, false)
    );
}

#[test]
fn findings_name_old_and_new_values() {
    let old = crd_with_spec(field(int(json!({"maximum": 10}))));
    let new = crd_with_spec(field(int(json!({"maximum": 5}))));
    let f = &crd_compat::check(&old, &new, &["v1".into()])[0];
    assert_eq!(f.to_string(), "widgets.table.example.com v1 .spec.f: maximum lowered 10 → 5");
    assert_eq!((f.old_value.as_deref(), f.new_value.as_deref()), (Some("10"), Some("5")));
}

#[test]
fn cli_accept_turns_an_incompatible_pair_compatible_and_says_so() {
    let (code, out, err) =
        check_crd(&[&path("base"), &path("required-added"), "--accept", "required-added:.spec.image"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("compatible:"), "{out}");
    assert!(out.contains("required-added") && out.contains("accepted") && out.contains(".spec.image"), "{out}");

    let (code, out, err) = check_crd(&[
        &path("base"),
        &path("required-added"),
        "--accept",
        "required-added:.spec.image",
        "--accept",
        "field-removed",
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["compatible"], true);
    assert_eq!(v["findings"][0]["accepted"], true);
    assert_eq!(v["findings"][0]["severity"], "incompatible");
    assert_eq!(v["unusedAcceptances"], json!(["field-removed"]));
    assert!(err.contains("--accept field-removed matched no finding"), "{err}");
}

#[test]
fn cli_lists_warnings_and_exits_0() {
    let (code, out, err) = check_crd(&[&path("base"), &path("size-default")]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("compatible:") && out.contains("default-changed") && out.contains("warning"), "{out}");
    let (code, out, _) = check_crd(&[&path("base"), &path("size-default"), "-o", "json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["findings"][0]["severity"], "warning");
    assert_eq!(v["findings"][0]["newValue"], "3");
}

#[test]
fn cli_exits_2_for_a_bad_accept() {
    let (code, _, err) = check_crd(&[&path("base"), &path("base"), "--accept", "fieldRemoved"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown CRD compatibility rule"), "{err}");
}
