//! Semantic checks of single documents, after they parsed: names, versions, images, paths.
//! Each check returns every finding (never only the first); cross-document references are
//! checked by [`super::FleetConfig`], and the release's agreement with its manifests by
//! `release::mapping`.

use super::{Cluster, Finding, Fleet, ImageRef, Location, PRIMARY_IMAGE_NAME, Release, ReleaseSpec, Rule};
use std::collections::BTreeMap;

/// Node architectures Kubernetes reports (`kubernetes.io/arch`); anything else is a typo.
pub const KNOWN_ARCHITECTURES: [&str; 7] = ["amd64", "arm64", "arm", "ppc64le", "s390x", "386", "riscv64"];

/// A DNS-1123 label: what cluster, wave and operator names must be (they appear in status
/// contexts, Kubernetes object names and label values).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A Kubernetes label value: at most 63 characters, alphanumerics at both ends, `-_.` inside.
pub fn is_label_value(v: &str) -> bool {
    let ok_end = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    v.len() <= 63
        && (v.is_empty()
            || (ok_end(v.chars().next())
                && ok_end(v.chars().last())
                && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))))
}

/// A Kubernetes label key: a name (a non-empty [label value](is_label_value)), optionally after a
/// DNS prefix and `/` (`region`, `topology.example.com/region`).
pub fn is_label_key(k: &str) -> bool {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| !p.is_empty() && p.len() <= 253 && p.split('.').all(is_dns_label));
    prefix_ok && !name.is_empty() && is_label_value(name)
}

/// A release id: lowercase letters, digits, `-` and `.`, starting and ending alphanumeric, at
/// most 63 characters — valid as a Git tag, a Kubernetes label value, and in a ConfigMap name
/// (`release-manifest-<id>`).
pub fn is_release_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
        && !s.contains("..")
}

/// A Kubernetes API version name: `v1`, `v1alpha2`, `v2beta1`.
fn is_api_version_name(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('v') else { return false };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || rest.starts_with('0') {
        return false;
    }
    let rest = &rest[digits..];
    if rest.is_empty() {
        return true;
    }
    let tail = rest.strip_prefix("alpha").or_else(|| rest.strip_prefix("beta"));
    matches!(tail, Some(t) if !t.is_empty() && !t.starts_with('0') && t.bytes().all(|b| b.is_ascii_digit()))
}

/// An OCI digest fleetgate accepts: `sha256:` + 64 hex, or `sha512:` + 128 hex.
pub fn is_digest(s: &str) -> bool {
    let hex = |h: &str, n: usize| h.len() == n && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    match s.split_once(':') {
        Some(("sha256", h)) => hex(h, 64),
        Some(("sha512", h)) => hex(h, 128),
        _ => false,
    }
}

/// An image tag as the OCI distribution spec allows it.
pub fn is_image_tag(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && (s.as_bytes()[0].is_ascii_alphanumeric() || s.as_bytes()[0] == b'_')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// An image repository: `[registry[:port]/]path`, no tag, no digest, no whitespace, path in
/// lowercase (only a registry host may carry capitals).
pub fn is_image_repository(s: &str) -> bool {
    let (host, path) = match s.split_once('/') {
        Some((h, p)) if h.contains('.') || h.contains(':') || h == "localhost" => (h, p),
        _ => ("", s),
    };
    !path.is_empty()
        && !s.contains('@')
        && !path.contains(':')
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'))
        && path.split('/').all(|c| {
            !c.is_empty()
                && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
        })
}

/// Normalises a repo-relative path, refusing anything that could leave the repo: absolute paths,
/// `..` components, backslashes (a Windows-style escape), NUL. Returns the path without `.`
/// components or trailing slash (`""` is the repo root).
pub fn safe_relative_path(path: &str) -> Result<String, String> {
    if path.starts_with('/') {
        return Err(format!("{path:?} is absolute; paths are relative to the repo root"));
    }
    if path.contains('\\') || path.contains('\0') {
        return Err(format!("{path:?} contains a backslash or NUL"));
    }
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(format!("{path:?} contains `..`; paths must stay inside the repo")),
            c => parts.push(c),
        }
    }
    Ok(parts.join("/"))
}

/// Checks of `fleet.yaml` on its own.
pub fn check_fleet(fleet: &Fleet, file: &str, text: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    let s = &fleet.spec;
    let mut bad =
        |rule, path: &[&str], msg: String| out.push(Finding::new(rule, Location::of_path(file, text, path), msg));
    if !is_dns_label(fleet.name()) {
        bad(Rule::Naming, &["metadata", "name"], format!("fleet name {:?} is not a DNS-1123 label", fleet.name()));
    }
    if !is_dns_label(&s.operator.name) {
        bad(
            Rule::Naming,
            &["operator", "name"],
            format!("operator name {:?} is not a DNS-1123 label", s.operator.name),
        );
    }
    if !is_dns_label(&s.operator.namespace) {
        bad(
            Rule::Naming,
            &["operator", "namespace"],
            format!("operator namespace {:?} is not a DNS-1123 label", s.operator.namespace),
        );
    }
    if let Some(image) = &s.operator.image
        && !is_image_repository(image)
    {
        bad(
            Rule::Image,
            &["operator", "image"],
            format!("operator image {image:?} is not a repository (no tag, no digest)"),
        );
    }
    if s.waves.is_empty() {
        bad(Rule::Schema, &["spec", "waves"], "spec.waves is empty; name at least one wave".to_string());
    }
    for (i, wave) in s.waves.iter().enumerate() {
        let w = &wave.name;
        let at = ["spec", "waves", &i.to_string()];
        if !is_dns_label(w) {
            bad(Rule::Naming, &at, format!("wave {w:?} is not a DNS-1123 label"));
        }
        if s.waves[..i].iter().any(|x| x.name == *w) {
            bad(Rule::Duplicate, &at, format!("wave {w:?} is listed twice"));
        }
        for problem in wave.problems() {
            bad(Rule::Schema, &at, problem);
        }
    }
    if let Some(r) = &s.release
        && !is_release_id(r)
    {
        bad(Rule::Naming, &["spec", "release"], format!("release {r:?} is not a valid release id"));
    }
    if s.rollout.max_failed_clusters == 0 {
        bad(
            Rule::Schema,
            &["rollout", "maxFailedClusters"],
            "rollout.maxFailedClusters must be at least 1".to_string(),
        );
    }
    out
}

/// Checks of `clusters/<name>.yaml` on its own (its wave is checked against the fleet elsewhere).
pub fn check_cluster(cluster: &Cluster, file: &str, text: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    if !is_dns_label(cluster.name()) {
        out.push(Finding::new(
            Rule::Naming,
            Location::of_path(file, text, &["metadata", "name"]),
            format!("cluster name {:?} is not a DNS-1123 label", cluster.name()),
        ));
    }
    let expected = format!("clusters/{}.yaml", cluster.name());
    if file != expected && file != format!("clusters/{}.yml", cluster.name()) {
        out.push(Finding::new(
            Rule::Naming,
            Location::of_path(file, text, &["metadata", "name"]),
            format!("cluster {:?} must live in {expected}", cluster.name()),
        ));
    }
    if let Some(r) = &cluster.spec.release
        && !is_release_id(r)
    {
        out.push(Finding::new(
            Rule::Naming,
            Location::of_path(file, text, &["spec", "release"]),
            format!("release {r:?} is not a valid release id"),
        ));
    }
    out
}

/// Release order across the fleet's releases (`all`: id → release): a `sequence` another release
/// also has, and a `rollbackTo` or `revokes` naming a release that is not older. `file` is where
/// `release`'s findings are reported.
pub fn ordering_findings(release: &Release, all: &BTreeMap<&str, &Release>, file: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    let id = release.name();
    let Some(sequence) = release.spec.sequence else { return out };
    let mut bad = |message: String| out.push(Finding::in_file(Rule::Ordering, file, message));
    for (other, r) in all {
        if *other != id && r.spec.sequence == Some(sequence) {
            bad(format!("sequence {sequence} is also {other}'s; every release needs its own"));
        }
    }
    let older = |what: &str, target: &str| -> Option<String> {
        let r = all.get(target)?;
        match r.spec.sequence {
            Some(s) if s < sequence => None,
            s => Some(format!(
                "{what} {target} (sequence {}) is not older than {id} (sequence {sequence})",
                s.map_or_else(|| "none".to_string(), |s| s.to_string())
            )),
        }
    };
    if let Some(m) = release.spec.rollback_to.as_deref().and_then(|t| older("rollbackTo", t)) {
        bad(m);
    }
    for r in &release.spec.revokes {
        if let Some(m) = older("revokes", r) {
            bad(m);
        }
    }
    out
}

/// Checks of a release document on its own: id, commit, image, versions, targets, requirements,
/// manifests path, timestamp.
pub fn check_release(release: &Release, file: &str, text: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    let s = &release.spec;
    let mut bad =
        |rule, path: &[&str], msg: String| out.push(Finding::new(rule, Location::of_path(file, text, path), msg));
    let id = release.name();
    if !is_release_id(id) {
        bad(
            Rule::Naming,
            &["metadata", "name"],
            format!(
                "release id {id:?} must be lowercase letters, digits, `-` and `.` (at most 63), e.g. rel-20250315-001"
            ),
        );
    }
    let hex = |c: &str| (7..=64).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(&s.git_commit) {
        bad(
            Rule::Schema,
            &["spec", "gitCommit"],
            format!("gitCommit {:?} is not a hex commit id (7 to 64 digits)", s.git_commit),
        );
    }
    for (entry, variant, name, image) in images_in(s) {
        let what = if name == PRIMARY_IMAGE_NAME { "image".to_string() } else { format!("image {name:?}") };
        let what = match variant {
            Some(v) => format!("variant {v}: {what}"),
            None => what,
        };
        let at = |field| -> Vec<&str> { entry.iter().map(String::as_str).chain([field]).collect() };
        if !is_image_repository(&image.repository) {
            bad(
                Rule::Image,
                &at("repository"),
                format!("{what} repository {:?} is not a repository (no tag, no digest, no spaces)", image.repository),
            );
        }
        if !is_image_tag(&image.tag) {
            bad(Rule::Image, &at("tag"), format!("{what} tag {:?} is not a valid tag", image.tag));
        }
        if let Some(d) = &image.digest
            && !is_digest(d)
        {
            bad(Rule::Image, &at("digest"), format!("{what} digest {d:?} is not sha256:<64 hex> or sha512:<128 hex>"));
        }
    }
    for (i, named) in s.images.iter().enumerate() {
        let at = ["spec", "images", &i.to_string(), "name"];
        if !is_dns_label(&named.name) || named.name == PRIMARY_IMAGE_NAME {
            bad(
                Rule::Naming,
                &at,
                format!(
                    "image name {:?} must be a DNS-1123 label other than {PRIMARY_IMAGE_NAME:?} (spec.image's)",
                    named.name
                ),
            );
        }
        if s.images[..i].iter().any(|o| o.name == named.name) {
            bad(Rule::Duplicate, &at, format!("image name {:?} is listed twice", named.name));
        }
    }
    for (i, crd) in s.crds.iter().enumerate() {
        let at = ["spec", "crds", &i.to_string()];
        if s.crds[..i].iter().any(|o| o.name == crd.name) {
            bad(Rule::Duplicate, &at, format!("CRD {} is listed twice", crd.name));
        }
        if let Some(v) = crd.served.iter().chain([&crd.storage]).find(|v| !is_api_version_name(v)) {
            bad(Rule::CrdVersion, &at, format!("CRD {}: {v:?} is not a version name like v1alpha2", crd.name));
        }
    }
    if semver::Version::parse(&s.chart_version).is_err() {
        bad(
            Rule::Schema,
            &["spec", "chartVersion"],
            format!("chartVersion {:?} is not a semantic version", s.chart_version),
        );
    }
    if !is_api_version_name(&s.crd_version) {
        bad(
            Rule::CrdVersion,
            &["spec", "crdVersion"],
            format!("crdVersion {:?} is not a version name like v1alpha2", s.crd_version),
        );
    }
    match &s.fleet {
        None => bad(
            Rule::Fleet,
            &["spec"],
            "release.yaml names no fleet; add `fleet: <fleet.yaml metadata.name>` (release create writes it)"
                .to_string(),
        ),
        Some(f) if !is_dns_label(f) => {
            bad(Rule::Naming, &["spec", "fleet"], format!("fleet {f:?} is not a DNS-1123 label"))
        }
        Some(_) => {}
    }
    if let Some(ns) = s.namespace.as_deref().filter(|ns| !is_dns_label(ns)) {
        bad(Rule::Naming, &["spec", "namespace"], format!("namespace {ns:?} is not a DNS-1123 label"));
    }
    if s.sequence.is_none() {
        bad(
            Rule::Ordering,
            &["spec"],
            "release.yaml has no sequence; add `sequence: N`, higher than every earlier release's (release create writes it)"
                .to_string(),
        );
    }
    for (i, r) in s.revokes.iter().enumerate() {
        let at = ["spec", "revokes", &i.to_string()];
        if !is_release_id(r) {
            bad(Rule::Naming, &at, format!("revokes {r:?}: not a valid release id"));
        } else if r == id {
            bad(Rule::Reference, &at, "revokes names the release itself".to_string());
        } else if s.rollback_to.as_deref() == Some(r.as_str()) {
            bad(Rule::Reference, &at, format!("{r} is both revoked and the rollbackTo target"));
        }
        if s.revokes[..i].contains(r) {
            bad(Rule::Duplicate, &at, format!("{r} is revoked twice"));
        }
    }
    if s.target_clusters.is_empty() {
        bad(
            Rule::Reference,
            &["spec", "targetClusters"],
            "targetClusters is empty; the release could run nowhere".to_string(),
        );
    }
    for (i, c) in s.target_clusters.iter().enumerate() {
        let at = ["spec", "targetClusters", &i.to_string()];
        if !is_dns_label(c) {
            bad(Rule::Naming, &at, format!("target cluster {c:?} is not a DNS-1123 label"));
        }
        if s.target_clusters[..i].contains(c) {
            bad(Rule::Duplicate, &at, format!("target cluster {c:?} is listed twice"));
        }
    }
    if let Some(r) = &s.rollback_to {
        if !is_release_id(r) {
            bad(Rule::Naming, &["spec", "rollbackTo"], format!("rollbackTo {r:?} is not a valid release id"));
        } else if r == id {
            bad(Rule::Reference, &["spec", "rollbackTo"], "rollbackTo names the release itself".to_string());
        }
    }
    if let Some(req) = &s.requires {
        if let Some(k) = &req.kubernetes
            && let Err(e) = super::parse_version_range(k)
        {
            bad(Rule::Requires, &["requires", "kubernetes"], e.to_string());
        }
        for a in &req.architectures {
            if !KNOWN_ARCHITECTURES.contains(&a.as_str()) {
                bad(
                    Rule::Requires,
                    &["requires", "architectures"],
                    format!("architecture {a:?} is unknown; expected one of {}", KNOWN_ARCHITECTURES.join(", ")),
                );
            }
        }
    }
    match safe_relative_path(&s.manifests) {
        Ok(p) if p.is_empty() => bad(
            Rule::ManifestPath,
            &["spec", "manifests"],
            "manifests names the repo root; name the folder of rendered manifests, e.g. operator/".to_string(),
        ),
        Ok(_) => {}
        Err(e) => bad(Rule::ManifestPath, &["spec", "manifests"], format!("manifests: {e}")),
    }
    if let Some(t) = &s.deploy_timestamp
        && chrono::DateTime::parse_from_rfc3339(t).is_err()
    {
        bad(Rule::Schema, &["spec", "deployTimestamp"], format!("deployTimestamp {t:?} is not an RFC 3339 time"));
    }
    out.extend(super::check_variants(s, |rule, key, msg| Finding::at_key(rule, file, text, key, msg)));
    out
}

/// A release's images, its own and then each variant's: where each is written in release.yaml
/// (the path of its entry), the variant it is for, its name and the image.
fn images_in(s: &ReleaseSpec) -> Vec<(Vec<String>, Option<&str>, String, ImageRef)> {
    let spec = |more: &[&str]| ["spec"].iter().chain(more).map(|p| p.to_string()).collect::<Vec<_>>();
    let entries = std::iter::once((spec(&[]), None, &s.image, &s.images)).chain(
        s.variants
            .iter()
            .enumerate()
            .map(|(j, v)| (spec(&["variants", &j.to_string()]), Some(v.name.as_str()), &v.image, &v.images)),
    );
    let mut out = Vec::new();
    for (entry, variant, image, named) in entries {
        let at = |more: &[&str]| entry.iter().cloned().chain(more.iter().map(|m| m.to_string())).collect::<Vec<_>>();
        out.push((at(&["image"]), variant, PRIMARY_IMAGE_NAME.to_string(), image.clone()));
        for (i, n) in named.iter().enumerate() {
            out.push((at(&["images", &i.to_string()]), variant, n.name.clone(), n.image()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("cluster-a", true)]
    #[case("a", true)]
    #[case("Cluster-A", false)]
    #[case("-a", false)]
    #[case("a-", false)]
    #[case("a_b", false)]
    #[case("", false)]
    fn dns_labels(#[case] s: &str, #[case] ok: bool) {
        assert_eq!(is_dns_label(s), ok, "{s}");
    }

    #[test]
    fn label_values_and_keys() {
        assert!(is_label_value("rel-20250315-001"));
        assert!(!is_label_value("rel/1"));
        assert!(!is_label_value("-rel"));
        assert!(!is_label_value(&"a".repeat(64)));
        assert!(is_label_key("region") && is_label_key("topology.example.com/region"));
        assert!(!is_label_key("") && !is_label_key("/region") && !is_label_key("a/b/c") && !is_label_key("re gion"));
    }

    #[rstest]
    #[case("rel-20250315-001", true)]
    #[case("v1.2.3", true)]
    #[case("rel..1", false)]
    #[case("Rel-1", false)]
    #[case("rel-1.", false)]
    #[case("rel/1", false)]
    fn release_ids(#[case] s: &str, #[case] ok: bool) {
        assert_eq!(is_release_id(s), ok, "{s}");
    }

    #[rstest]
    #[case("v1", true)]
    #[case("v1alpha2", true)]
    #[case("v2beta1", true)]
    #[case("v1alpha", false)]
    #[case("v0", false)]
    #[case("1", false)]
    #[case("v1gamma1", false)]
    fn api_version_names(#[case] s: &str, #[case] ok: bool) {
        assert_eq!(is_api_version_name(s), ok, "{s}");
    }

    #[rstest]
    #[case("registry.example.com/redis-operator", true)]
    #[case("localhost:5000/redis-operator", true)]
    #[case("redis", true)]
    #[case("redis:7", false)]
    #[case("redis@sha256:00", false)]
    #[case("with space/x", false)]
    fn image_repositories(#[case] s: &str, #[case] ok: bool) {
        assert_eq!(is_image_repository(s), ok, "{s}");
    }

    #[rstest]
    #[case("operator/", Ok("operator"))]
    #[case("./operator/./crds", Ok("operator/crds"))]
    #[case("../other", Err(()))]
    #[case("operator/../../etc", Err(()))]
    #[case("/etc", Err(()))]
    #[case("op\\..\\x", Err(()))]
    fn relative_paths(#[case] p: &str, #[case] expected: Result<&str, ()>) {
        assert_eq!(safe_relative_path(p).map_err(|_| ()), expected.map(str::to_string));
    }
}

#[cfg(test)]
mod release_tests {
    use super::*;
    use crate::model::parse_release;
    use rstest::rstest;

    const BASE: &str = "apiVersion: fleetgate.io/v1alpha1
kind: Release
metadata:
  name: rel-20250315-001
spec:
  gitCommit: a1b2c3d4e5f6
  image:
    repository: registry.example.com/redis-operator
    tag: v1.2.3-build.456
  chartVersion: 1.2.3
  crdVersion: v1alpha2
  targetClusters: [cluster-a, cluster-b]
  requires:
    kubernetes: \">=1.28\"
    architectures: [amd64, arm64]
  manifests: operator/
  fleet: redis-fleet
  sequence: 3
  revokes: [rel-20250310-001]
";

    fn findings(text: &str) -> Vec<(Rule, Option<u32>)> {
        let r = parse_release("release.yaml", text, None).unwrap();
        check_release(&r, "release.yaml", text).into_iter().map(|f| (f.rule, f.at.line)).collect()
    }

    #[rstest]
    #[case::clean("", "", vec![])]
    #[case::bad_id("rel-20250315-001", "Rel_1", vec![(Rule::Naming, Some(4))])]
    #[case::bad_commit("a1b2c3d4e5f6", "not-hex", vec![(Rule::Schema, Some(6))])]
    #[case::tagged_repository("registry.example.com/redis-operator", "registry.example.com/redis-operator:v1", vec![(Rule::Image, Some(8))])]
    #[case::bad_chart("chartVersion: 1.2.3", "chartVersion: one", vec![(Rule::Schema, Some(10))])]
    #[case::bad_crd_version("v1alpha2", "alpha2", vec![(Rule::CrdVersion, Some(11))])]
    #[case::no_targets("[cluster-a, cluster-b]", "[]", vec![(Rule::Reference, Some(12))])]
    #[case::duplicate_target("[cluster-a, cluster-b]", "[cluster-a, cluster-a]", vec![(Rule::Duplicate, Some(12))])]
    #[case::bad_range("\">=1.28\"", "\"newest\"", vec![(Rule::Requires, Some(14))])]
    #[case::unknown_arch("[amd64, arm64]", "[amd64, x86]", vec![(Rule::Requires, Some(15))])]
    #[case::escaping_manifests("manifests: operator/", "manifests: ../operator/", vec![(Rule::ManifestPath, Some(16))])]
    #[case::absolute_manifests("manifests: operator/", "manifests: /etc", vec![(Rule::ManifestPath, Some(16))])]
    #[case::no_fleet("  fleet: redis-fleet\n", "", vec![(Rule::Fleet, Some(5))])]
    #[case::no_sequence("  sequence: 3\n", "", vec![(Rule::Ordering, Some(5))])]
    #[case::revokes_itself("[rel-20250310-001]", "[rel-20250315-001]", vec![(Rule::Reference, Some(19))])]
    #[case::several_at_once("chartVersion: 1.2.3\n  crdVersion: v1alpha2", "chartVersion: x\n  crdVersion: y", vec![(Rule::Schema, Some(10)), (Rule::CrdVersion, Some(11))])]
    fn release_rules(#[case] from: &str, #[case] to: &str, #[case] expected: Vec<(Rule, Option<u32>)>) {
        let text = if from.is_empty() { BASE.to_string() } else { BASE.replacen(from, to, 1) };
        assert_eq!(findings(&text), expected);
    }

    #[test]
    fn release_order_findings() {
        let text = |id: &str, sequence: u64, extra: &str| {
            BASE.replace("rel-20250315-001", id)
                .replace("sequence: 3", &format!("sequence: {sequence}"))
                .replace("  revokes: [rel-20250310-001]\n", extra)
        };
        let parse = |t: String| parse_release("release.yaml", &t, None).unwrap();
        let r1 = parse(text("rel-1", 1, ""));
        let r2 = parse(text("rel-2", 2, "  rollbackTo: rel-3\n"));
        let r3 = parse(text("rel-3", 2, "  revokes: [rel-1]\n"));
        let all = BTreeMap::from([("rel-1", &r1), ("rel-2", &r2), ("rel-3", &r3)]);
        let messages =
            |r: &Release| -> Vec<String> { ordering_findings(r, &all, "x").into_iter().map(|f| f.message).collect() };
        assert_eq!(messages(&r1), Vec::<String>::new());
        assert_eq!(
            messages(&r2),
            [
                "sequence 2 is also rel-3's; every release needs its own",
                "rollbackTo rel-3 (sequence 2) is not older than rel-2 (sequence 2)"
            ]
        );
        assert_eq!(messages(&r3), ["sequence 2 is also rel-2's; every release needs its own"]);
    }
}
