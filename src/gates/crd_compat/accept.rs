//! The [`Acceptance`]s that would accept a set of blocking findings, compacted so a person can
//! read and pass them: what `release create` prints when it refuses an incompatible CRD change.
//!
//! An acceptance's PATH covers its node and everything below it ([`Acceptance::matches`]), so the
//! findings of one rule in one CRD are accepted at their deepest common subtree: a field removed
//! from every container list of an embedded PodTemplate (`.spec.template.spec.containers[*].x`,
//! `….initContainers[*].x`, in every version) is one acceptance at `.spec.template.spec`. The
//! subtree is never wider than a second-level node (`.spec.template`, `.spec.replicas`): findings
//! under different second-level nodes are different decisions and get one acceptance each. The
//! same rule at the same path in several CRDs is one acceptance without a CRD (`RULE:PATH`
//! applies to every CRD compared). Every acceptance returned matches at least one finding, and
//! together they match every one.

use super::{Acceptance, Finding, Rule};
use std::collections::{BTreeMap, BTreeSet};

/// How deep a compacted subtree may climb at most: `.spec.template` is two segments.
const BROADEST_DEPTH: usize = 2;

/// Acceptances that accept every finding of `findings` that blocks, compacted (see the module
/// docs), in rule then path order. Findings that do not block are left alone.
pub fn acceptances_for(findings: &[Finding]) -> Vec<Acceptance> {
    // Rule → CRD → paths.
    let mut by_rule: BTreeMap<Rule, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for f in findings.iter().filter(|f| f.blocks()) {
        by_rule.entry(f.rule).or_default().entry(f.crd.as_str()).or_default().insert(f.path.as_str());
    }
    let mut out = Vec::new();
    for (rule, crds) in by_rule {
        // Path → the CRDs that need it.
        let mut at: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
        for (crd, paths) in crds {
            for path in compact(&paths) {
                at.entry(path).or_default().insert(crd);
            }
        }
        for (path, crds) in at {
            if crds.len() > 1 {
                out.push(Acceptance { rule, crd: None, path: Some(path) });
            } else {
                out.extend(crds.into_iter().map(|c| Acceptance {
                    rule,
                    crd: Some(c.to_string()),
                    path: Some(path.clone()),
                }));
            }
        }
    }
    out
}

/// The subtrees that cover `paths`: per second-level node, the deepest common one.
fn compact(paths: &BTreeSet<&str>) -> Vec<String> {
    let mut groups: BTreeMap<Vec<&str>, Vec<Vec<&str>>> = BTreeMap::new();
    for p in paths {
        let segments = segments(p);
        let key = segments.iter().take(BROADEST_DEPTH).copied().collect();
        groups.entry(key).or_default().push(segments);
    }
    groups
        .into_values()
        .map(|members| {
            let mut common = members[0].clone();
            for m in &members[1..] {
                let shared = common.iter().zip(m).take_while(|(a, b)| a == b).count();
                common.truncate(shared);
            }
            // The CRD itself (`crd-removed`) and the schema root are written `.`.
            if common.is_empty() { ".".to_string() } else { common.concat() }
        })
        .collect()
}

/// `.spec.template["a.b"][*]` → `.spec`, `.template`, `["a.b"]`, `[*]`; `.` → nothing.
fn segments(path: &str) -> Vec<&str> {
    let bytes = path.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if i > start && (bytes[i] == b'.' || bytes[i] == b'[') {
            out.push(&path[start..i]);
            start = i;
        }
        if bytes[i] == b'[' && bytes.get(i + 1) == Some(&b'"') {
            // A quoted key: skip to its closing `"]`, past escaped quotes.
            i += 2;
            while i < bytes.len() && !(bytes[i] == b'"' && bytes.get(i + 1) == Some(&b']')) {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 2;
            continue;
        }
        i += 1;
    }
    if start < bytes.len() && &path[start..] != "." {
        out.push(&path[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::crd_compat::Severity;

    fn finding(rule: Rule, crd: &str, version: &str, path: &str) -> Finding {
        Finding {
            rule,
            severity: rule.severity(),
            accepted: false,
            crd: crd.into(),
            version: Some(version.into()),
            path: path.into(),
            old_value: None,
            new_value: None,
            message: "test".into(),
        }
    }

    fn strings(a: &[Acceptance]) -> Vec<String> {
        a.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn segments_split_on_dots_and_brackets_but_not_inside_quoted_keys() {
        assert_eq!(segments(".spec.template[*].x"), [".spec", ".template", "[*]", ".x"]);
        assert_eq!(
            segments(".metadata.labels[\"app.kubernetes.io/na\\\"me\"].v"),
            [".metadata", ".labels", "[\"app.kubernetes.io/na\\\"me\"]", ".v"]
        );
        assert_eq!(segments(".values.*"), [".values", ".*"]);
        assert!(segments(".").is_empty());
    }

    #[test]
    fn a_field_removed_all_over_one_pod_template_is_one_acceptance_that_matches_every_finding() {
        let crd = "redisclusters.cache.example.com";
        let mut findings = Vec::new();
        for version in ["v1beta1", "v1"] {
            for list in ["containers", "initContainers", "ephemeralContainers"] {
                findings.push(finding(
                    Rule::FieldRemoved,
                    crd,
                    version,
                    &format!(".spec.podTemplate.spec.{list}[*].resources.claims"),
                ));
            }
        }
        // Another decision elsewhere in the spec, and one in another CRD at the same place.
        findings.push(finding(Rule::FieldRemoved, crd, "v1", ".spec.legacy"));
        findings.push(finding(Rule::RequiredAdded, crd, "v1", ".spec.shards"));
        findings.push(finding(Rule::RequiredAdded, "backups.cache.example.com", "v1", ".spec.shards"));
        // Already accepted, and a warning: neither needs an acceptance.
        findings.push(Finding { accepted: true, ..finding(Rule::MaximumLowered, crd, "v1", ".spec.size") });
        findings.push(finding(Rule::DefaultChanged, crd, "v1", ".spec.mode"));
        assert_eq!(Rule::DefaultChanged.severity(), Severity::Warning);

        let accept = acceptances_for(&findings);
        assert_eq!(
            strings(&accept),
            [
                format!("field-removed:{crd}:.spec.legacy"),
                format!("field-removed:{crd}:.spec.podTemplate.spec"),
                "required-added:.spec.shards".to_string(),
            ]
        );
        // Each parses back to itself, matches a finding, and together they accept every one.
        for a in &accept {
            assert_eq!(&a.to_string().parse::<Acceptance>().unwrap(), a);
            assert!(findings.iter().any(|f| a.matches(f)), "{a} matches nothing");
        }
        assert!(findings.iter().filter(|f| f.blocks()).all(|f| accept.iter().any(|a| a.matches(f))));
    }

    #[test]
    fn separate_second_level_nodes_and_whole_crds_stay_separate() {
        let crd = "widgets.example.com";
        let findings = [
            finding(Rule::FieldRemoved, crd, "v1", ".spec.replicas"),
            finding(Rule::FieldRemoved, crd, "v1", ".status.ready"),
            finding(Rule::FieldRemoved, crd, "v1", ".spec.master.template.spec.x"),
            finding(Rule::FieldRemoved, crd, "v1", ".spec.master.template.spec.y"),
            Finding { version: None, ..finding(Rule::CrdRemoved, "gone.example.com", "v1", ".") },
        ];
        assert_eq!(
            strings(&acceptances_for(&findings)),
            [
                "crd-removed:gone.example.com:.".to_string(),
                format!("field-removed:{crd}:.spec.master.template.spec"),
                format!("field-removed:{crd}:.spec.replicas"),
                format!("field-removed:{crd}:.status.ready"),
            ]
        );
        assert!(acceptances_for(&findings).iter().all(|a| findings.iter().any(|f| a.matches(f))));
    }
}
