//! CRD compatibility: a table of CRD pairs (fixtures in `tests/testdata/crds/`, each a one-change
//! variant of `base.yaml`) with the findings each must produce, and the `fleetgate check-crd`
//! command's exit codes and JSON, run as the built binary.

use fleetgate::gates::crd_compat::{self, Rule};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use rstest::rstest;
use std::path::PathBuf;
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/crds").join(format!("{name}.yaml"))
}

fn load(name: &str) -> CustomResourceDefinition {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
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
#[case::enum_added("base", "enum-added", &["v1alpha1"], &[(Rule::EnumValuesRemoved, "v1alpha1", ".spec.image")])]
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
    assert!(out.contains("requiredAdded") && out.contains("v1alpha1") && out.contains(".spec.image"), "{out}");
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
    assert_eq!(f["rule"], "storedVersionNotServed");
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
    assert_eq!(v["findings"][0]["rule"], "servedVersionRemoved", "{out}");
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
