//! Variants of one release (`release.yaml` `spec.variants`): named renderings of the same release
//! for different kinds of cluster — another image registry, another size — signed with it, under
//! one id and one sequence. This module owns their shape, their checks on their own, and the
//! choice a spoke makes among them from facts it owns ([`select_variant`]): its live facts
//! ([`ClusterFacts`]: server version, node architectures) and the labels of its agent's own
//! configuration. Nothing on the branch (not `clusters/*.yaml` labels) takes part in the choice.
//!
//! ```text
//! variants (in order) ──► the first that fits: its selector matches, and each image it pins per
//!                         architecture has every node's architecture ──► that variant
//!                         (a last variant without a selector fits every cluster: the default)
//!                         none fits: NoVariant (names the facts and what every variant asks)
//! ```

use super::{Finding, ImageRef, KNOWN_ARCHITECTURES, NamedImage, ReleaseSpec, Rule, parse_version_range};
use super::{is_digest, is_dns_label, is_label_key, is_label_value, safe_relative_path};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One rendering of a release for the clusters its selector matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Variant {
    /// A DNS-1123 label (`eu`, `arm`), shown in statuses.
    pub name: String,
    /// Which clusters run it. Only the last variant may leave it out (unless it pins images per
    /// architecture, which choose by themselves): it is then the default, run by every cluster no
    /// earlier variant matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<VariantSelector>,
    /// The variant's manager image (`spec.image` of the variant).
    pub image: ImageRef,
    /// The variant's further images (`spec.images` of the variant).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<NamedImage>,
    /// Folder (relative to the repo root) holding the variant's rendered manifests.
    pub manifests: String,
    /// `sha256:<hex>` over the chart values the variant was rendered with (the base values, then
    /// its own file, then `--set`), when `release create --chart` rendered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values_digest: Option<String>,
    /// Images per architecture: for an image of the variant (`operator` or a further image's
    /// name) pinned to a multi-arch index by digest, the digest of each architecture's image in
    /// that index. The variant runs only on clusters whose every node's architecture is listed
    /// for each such image (the node pulls its own architecture's image from the index).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub platforms: BTreeMap<String, BTreeMap<String, String>>,
}

impl Variant {
    /// Whether this variant may run on a cluster with `facts`: its selector matches (none: any
    /// cluster) and, for every image it pins per architecture, every node's architecture has one.
    pub fn fits(&self, facts: &ClusterFacts, labels: &BTreeMap<String, String>) -> bool {
        let built_for = |archs: &BTreeMap<String, String>| facts.architectures.iter().all(|a| archs.contains_key(a));
        self.selector.as_ref().is_none_or(|s| s.matches(facts, labels)) && self.platforms.values().all(built_for)
    }

    /// What the variant asks of a cluster, for people: its selector, and the architectures its
    /// images are built for (`region=eu; images for amd64|arm64`).
    pub fn asks(&self) -> String {
        let mut parts: Vec<String> = self.selector.iter().map(ToString::to_string).collect();
        // The architectures every image pinned per architecture has.
        let archs = self.platforms.values().fold(None::<Vec<&str>>, |common, per_arch| {
            let these = per_arch.keys().map(String::as_str);
            Some(match common {
                None => these.collect(),
                Some(common) => common.into_iter().filter(|a| per_arch.contains_key(*a)).collect(),
            })
        });
        if let Some(archs) = archs {
            parts.push(format!("images for {}", archs.join("|")));
        }
        if parts.is_empty() { "any cluster".to_string() } else { parts.join("; ") }
    }
}

/// What a cluster must be to run a variant: every given part must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VariantSelector {
    /// Labels of the agent's own configuration (`labels:`, `--label KEY=VALUE`); all must match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Node architectures the variant's images are built for: every node must be one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub architectures: Vec<String>,
    /// A semver range over the API server's version, e.g. `>=1.30`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<String>,
}

impl VariantSelector {
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.architectures.is_empty() && self.kubernetes.is_none()
    }

    /// Whether a cluster with `facts` and agent `labels` is one this selector picks. A server
    /// version or range that cannot be read matches no range (`release create` refuses bad ranges).
    pub fn matches(&self, facts: &ClusterFacts, labels: &BTreeMap<String, String>) -> bool {
        let labels_match = self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v));
        let archs_match =
            self.architectures.is_empty() || facts.architectures.iter().all(|a| self.architectures.contains(a));
        let version_match = match &self.kubernetes {
            None => true,
            Some(range) => match (parse_version_range(range), parse_server_version(&facts.server_version)) {
                (Ok(req), Ok(found)) => req.matches(&found),
                _ => false,
            },
        };
        labels_match && archs_match && version_match
    }
}

/// `region=eu, architectures arm64, kubernetes >=1.30`; `any cluster` when empty.
impl fmt::Display for VariantSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self.match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if !self.architectures.is_empty() {
            parts.push(format!("architectures {}", self.architectures.join("|")));
        }
        if let Some(k) = &self.kubernetes {
            parts.push(format!("kubernetes {k}"));
        }
        if parts.is_empty() { f.write_str("any cluster") } else { f.write_str(&parts.join(", ")) }
    }
}

/// What the agent knows about its cluster from the cluster itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClusterFacts {
    /// The API server's `gitVersion`, e.g. `v1.36.3`, `v1.29.4-eks-036c24b`, `v1.30.2+k3s1`.
    pub server_version: String,
    /// The architectures of the cluster's nodes (`kubernetes.io/arch`); duplicates are fine.
    pub architectures: Vec<String>,
}

/// The API server reports a version that is not `MAJOR.MINOR[.PATCH]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the API server reports version {version:?}, which is not MAJOR.MINOR[.PATCH]")]
pub struct BadServerVersion {
    pub version: String,
}

/// `v1.29.4-eks-036c24b` → 1.29.4. Vendor suffixes are dropped: they are builds of that
/// version, and semver would otherwise treat them as pre-releases that `>=1.28` does not match.
pub fn parse_server_version(version: &str) -> Result<semver::Version, BadServerVersion> {
    let bad = || BadServerVersion { version: version.to_string() };
    let v = version.trim().strip_prefix('v').unwrap_or(version.trim());
    let core = v.split(['-', '+']).next().unwrap_or_default();
    let mut nums = core.split('.').map(|n| n.parse::<u64>());
    let major = nums.next().ok_or_else(bad)?.map_err(|_| bad())?;
    let minor = nums.next().ok_or_else(bad)?.map_err(|_| bad())?;
    let patch = nums.next().transpose().map_err(|_| bad())?.unwrap_or(0);
    if nums.next().is_some() {
        return Err(bad());
    }
    Ok(semver::Version::new(major, minor, patch))
}

/// No variant of a release fits a cluster: what the cluster is, and what each variant asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no variant fits this cluster (Kubernetes {server_version}, node architectures [{}], agent labels {{{}}}); \
     the variants select: {}. Give the agent the labels one of them matches (--label KEY=VALUE, config `labels`), \
     or cut a release with a variant for this cluster",
    architectures.join(", "),
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", "),
    selectors.join("; ")
)]
pub struct NoVariant {
    pub server_version: String,
    pub architectures: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// `NAME: SELECTOR` of every variant, in order.
    pub selectors: Vec<String>,
}

/// The variant of `spec` a cluster with `facts` and agent `labels` runs: the first whose
/// selector matches, else the last when it has no selector (the default). `Ok(None)`: the
/// release has no variants (every cluster runs `spec.manifests`).
pub fn select_variant<'r>(
    spec: &'r ReleaseSpec,
    facts: &ClusterFacts,
    labels: &BTreeMap<String, String>,
) -> Result<Option<&'r Variant>, NoVariant> {
    if spec.variants.is_empty() {
        return Ok(None);
    }
    let chosen = spec.variants.iter().find(|v| v.fits(facts, labels));
    chosen.map(Some).ok_or_else(|| NoVariant {
        server_version: facts.server_version.clone(),
        architectures: facts.architectures.clone(),
        labels: labels.clone(),
        selectors: spec.variants.iter().map(|v| format!("{}: {}", v.name, v.asks())).collect(),
    })
}

impl ReleaseSpec {
    /// The release as `variant` renders it: its images and manifests in place of the base's,
    /// and no variants (a selected release is one rendering).
    pub fn for_variant(&self, variant: &Variant) -> ReleaseSpec {
        ReleaseSpec {
            image: variant.image.clone(),
            images: variant.images.clone(),
            manifests: variant.manifests.clone(),
            variants: Vec::new(),
            ..self.clone()
        }
    }
}

/// Checks of `spec.variants` on their own (names, selectors, folders); each variant's images are
/// checked with the release's, and its manifests against its mapping by `release::mapping`.
/// `at` locates a finding by the key it is about.
pub fn check_variants(spec: &ReleaseSpec, mut at: impl FnMut(Rule, &str, String) -> Finding) -> Vec<Finding> {
    let mut out = Vec::new();
    let base = safe_relative_path(&spec.manifests).ok();
    let last = spec.variants.len().saturating_sub(1);
    for (i, v) in spec.variants.iter().enumerate() {
        let name = &v.name;
        if !is_dns_label(name) {
            out.push(at(Rule::Naming, "variants", format!("variant name {name:?} is not a DNS-1123 label")));
        }
        if spec.variants[..i].iter().any(|o| &o.name == name) {
            out.push(at(Rule::Duplicate, "variants", format!("variant {name:?} is listed twice")));
        }
        match safe_relative_path(&v.manifests) {
            Ok(p) if p.is_empty() => {
                out.push(at(Rule::ManifestPath, "manifests", format!("variant {name}: manifests names the repo root")))
            }
            Ok(p) => {
                let nested =
                    |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/"));
                let others = spec.variants[..i].iter().filter_map(|o| safe_relative_path(&o.manifests).ok());
                if base.as_deref().is_some_and(|b| nested(&p, b)) || others.into_iter().any(|o| nested(&p, &o)) {
                    out.push(at(
                        Rule::ManifestPath,
                        "manifests",
                        format!("variant {name}: manifests {p}/ overlaps another rendering's folder; each variant needs its own"),
                    ));
                }
            }
            Err(e) => out.push(at(Rule::ManifestPath, "manifests", format!("variant {name}: manifests: {e}"))),
        }
        let Some(selector) = &v.selector else {
            // One that pins images per architecture still chooses: by the nodes' architectures.
            if i != last && v.platforms.is_empty() {
                out.push(at(
                    Rule::Variant,
                    "variants",
                    format!(
                        "variant {name} has no selector but is not the last variant: only the last may leave it out (the \
                         default), since no variant after it could ever be chosen"
                    ),
                ));
            }
            continue;
        };
        if selector.is_empty() {
            out.push(at(
                Rule::Variant,
                "selector",
                format!(
                    "variant {name}: an empty selector matches every cluster; leave the selector out on the last variant \
                     to make it the default"
                ),
            ));
        }
        if spec.variants[..i].iter().any(|o| o.selector.as_ref() == Some(selector)) {
            out.push(at(
                Rule::Variant,
                "selector",
                format!(
                    "variant {name}: an earlier variant has the same selector ({selector}), so it could never be chosen"
                ),
            ));
        }
        for (k, val) in &selector.match_labels {
            if !is_label_key(k) || !is_label_value(val) {
                out.push(at(
                    Rule::Variant,
                    "matchLabels",
                    format!("variant {name}: {k}={val} is not a Kubernetes label (KEY=VALUE, e.g. region=eu)"),
                ));
            }
        }
        for a in selector.architectures.iter().filter(|a| !KNOWN_ARCHITECTURES.contains(&a.as_str())) {
            out.push(at(
                Rule::Variant,
                "architectures",
                format!(
                    "variant {name}: architecture {a:?} is unknown; expected one of {}",
                    KNOWN_ARCHITECTURES.join(", ")
                ),
            ));
        }
        if let Some(Err(e)) = selector.kubernetes.as_deref().map(parse_version_range) {
            out.push(at(Rule::Variant, "kubernetes", format!("variant {name}: {e}")));
        }
    }
    for v in &spec.variants {
        out.extend(check_platforms(spec, v).into_iter().map(|m| at(Rule::Variant, "platforms", m)));
    }
    out
}

/// A variant's images per architecture: each names one of its images, pinned to an index by
/// digest, each architecture known and each digest a digest.
fn check_platforms(spec: &ReleaseSpec, v: &Variant) -> Vec<String> {
    let images = spec.for_variant(v).all_images();
    let mut out = Vec::new();
    for (image, per_arch) in &v.platforms {
        let name = &v.name;
        match images.iter().find(|(n, _)| n == image) {
            None => {
                out.push(format!("variant {name}: platforms names image {image:?}, which the variant does not run"))
            }
            Some((_, i)) if i.digest.is_none() => out.push(format!(
                "variant {name}: image {image} lists images per architecture but pins no digest; pin the multi-arch \
                 index (REPOSITORY:TAG@sha256:…) they belong to"
            )),
            Some(_) => {}
        }
        if per_arch.is_empty() {
            out.push(format!("variant {name}: image {image} lists no architecture"));
        }
        for (arch, digest) in per_arch {
            if !KNOWN_ARCHITECTURES.contains(&arch.as_str()) {
                out.push(format!("variant {name}: image {image}: architecture {arch:?} is unknown"));
            }
            if !is_digest(digest) {
                out.push(format!("variant {name}: image {image} for {arch}: {digest:?} is not sha256:<64 hex>"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::parse_release;
    use rstest::rstest;

    const RELEASE: &str = "apiVersion: fleetgate.io/v1alpha1
kind: Release
metadata: {name: rel-1}
spec:
  fleet: f
  sequence: 1
  gitCommit: a1b2c3d4e5f6
  image: {repository: registry.example.com/op, tag: v1}
  chartVersion: 1.0.0
  crdVersion: v1
  targetClusters: [a]
  variants:
";

    fn spec(variants: &str) -> ReleaseSpec {
        parse_release("release.yaml", &format!("{RELEASE}{variants}"), None).unwrap().spec
    }

    fn variant(name: &str, selector: &str) -> String {
        let selector = if selector.is_empty() { String::new() } else { format!("      selector: {selector}\n") };
        format!(
            "    - name: {name}\n{selector}      image: {{repository: {name}.registry.example.com/op, tag: v1}}\n      manifests: variants/{name}/\n"
        )
    }

    fn facts(version: &str, archs: &[&str]) -> ClusterFacts {
        ClusterFacts { server_version: version.into(), architectures: archs.iter().map(|s| s.to_string()).collect() }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// eu by label, arm by architecture, new by version, then the default.
    fn four() -> ReleaseSpec {
        spec(
            &[
                variant("eu", "{matchLabels: {region: eu}}"),
                variant("arm", "{architectures: [arm64]}"),
                variant("new", "{kubernetes: \">=1.36\"}"),
                variant("rest", ""),
            ]
            .concat(),
        )
    }

    #[rstest]
    #[case::label(&[("region", "eu")], "v1.30.0", &["arm64"], "eu")]
    #[case::first_match_wins(&[("region", "eu")], "v1.36.1", &["amd64"], "eu")]
    #[case::other_label_value(&[("region", "us")], "v1.30.0", &["arm64"], "arm")]
    #[case::every_node_must_be_arm(&[], "v1.30.0", &["amd64", "arm64"], "rest")]
    #[case::vendor_version(&[], "v1.36.2-eks-036c24b", &["amd64"], "new")]
    #[case::default(&[], "v1.30.0", &["amd64"], "rest")]
    fn the_first_matching_variant_runs_else_the_default(
        #[case] l: &[(&str, &str)],
        #[case] version: &str,
        #[case] archs: &[&str],
        #[case] expected: &str,
    ) {
        let s = four();
        let chosen = select_variant(&s, &facts(version, archs), &labels(l)).unwrap().unwrap();
        assert_eq!(chosen.name, expected);
    }

    #[test]
    fn without_a_default_a_cluster_no_selector_matches_gets_no_variant_naming_its_facts_and_the_selectors() {
        let s =
            spec(&[variant("eu", "{matchLabels: {region: eu}}"), variant("arm", "{architectures: [arm64]}")].concat());
        let e = select_variant(&s, &facts("v1.31.0", &["amd64"]), &labels(&[("region", "us")])).unwrap_err();
        let text = e.to_string();
        for needle in ["Kubernetes v1.31.0", "[amd64]", "{region=us}", "eu: region=eu; arm: architectures arm64"] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
    }

    #[test]
    fn a_release_without_variants_selects_none_and_a_variant_spec_is_one_rendering() {
        let plain = parse_release("r", &RELEASE.replace("  variants:\n", ""), None).unwrap().spec;
        assert_eq!(select_variant(&plain, &facts("v1.30.0", &[]), &BTreeMap::new()), Ok(None));
        let s = four();
        let eu = s.for_variant(&s.variants[0]);
        assert_eq!(
            (eu.image.repository.as_str(), eu.manifests.as_str()),
            ("eu.registry.example.com/op", "variants/eu/")
        );
        assert!(eu.variants.is_empty());
        assert_eq!((eu.sequence, eu.git_commit.as_str()), (s.sequence, s.git_commit.as_str()));
    }

    fn problems(variants: &str) -> Vec<String> {
        let s = spec(variants);
        check_variants(&s, |rule, _, m| Finding::in_file(rule, "release.yaml", m))
            .into_iter()
            .map(|f| f.message)
            .collect()
    }

    #[rstest]
    #[case::default_not_last(&[variant("all", ""), variant("eu", "{matchLabels: {region: eu}}")].concat(), "only the last may leave it out")]
    #[case::empty_selector(&variant("eu", "{}"), "an empty selector matches every cluster")]
    #[case::same_selector(&[variant("eu", "{matchLabels: {region: eu}}"), variant("eu2", "{matchLabels: {region: eu}}")].concat(), "could never be chosen")]
    #[case::bad_label(&variant("eu", "{matchLabels: {\"re gion\": eu}}"), "is not a Kubernetes label")]
    #[case::bad_arch(&variant("eu", "{architectures: [arm65]}"), "architecture \"arm65\" is unknown")]
    #[case::bad_range(&variant("eu", "{kubernetes: newest}"), "is not a version range")]
    #[case::bad_name(&variant("EU", "{matchLabels: {region: eu}}"), "not a DNS-1123 label")]
    #[case::twice(&[variant("eu", "{matchLabels: {region: eu}}"), variant("eu", "")].concat(), "listed twice")]
    #[case::overlapping(&variant("eu", "{matchLabels: {region: eu}}").replace("variants/eu/", "operator/eu"), "overlaps")]
    fn invalid_variants_are_findings(#[case] variants: &str, #[case] needle: &str) {
        let found = problems(variants);
        assert!(found.iter().any(|m| m.contains(needle)), "{needle}: {found:?}");
    }

    #[test]
    fn valid_variants_have_no_findings() {
        assert_eq!(
            problems(&[variant("eu", "{matchLabels: {region: eu}}"), variant("rest", "")].concat()),
            Vec::<String>::new()
        );
        assert_eq!(check_variants(&four(), |rule, _, m| Finding::in_file(rule, "release.yaml", m)), []);
    }

    #[test]
    fn a_variant_with_images_per_architecture_runs_only_where_every_node_has_its_image() {
        let d = |c: &str| format!("sha256:{}", c.repeat(64));
        let multi = format!(
            "    - name: multi\n      image: {{repository: r.example.com/op, tag: v1, digest: \"{}\"}}\n      \
             manifests: variants/multi/\n      platforms:\n        operator: {{amd64: \"{}\", arm64: \"{}\"}}\n",
            d("0"),
            d("a"),
            d("b")
        );
        let s = spec(&[multi.clone(), variant("other", "")].concat());
        assert_eq!(check_variants(&s, |rule, _, m| Finding::in_file(rule, "release.yaml", m)), []);
        let pick = |archs: &[&str]| {
            select_variant(&s, &facts("v1.30.0", archs), &BTreeMap::new()).unwrap().unwrap().name.clone()
        };
        assert_eq!(pick(&["amd64", "arm64"]), "multi");
        assert_eq!(pick(&["s390x", "amd64"]), "other", "a node of an architecture the index lacks");
        let only = spec(&multi);
        let e = select_variant(&only, &facts("v1.30.0", &["s390x"]), &BTreeMap::new()).unwrap_err();
        assert!(e.to_string().contains("the variants select: multi: images for amd64|arm64"), "{e}");

        // An index is pinned by digest; architectures and digests are checked.
        let unpinned = multi.replace(&format!(", digest: \"{}\"", d("0")), "");
        assert!(problems(&unpinned).iter().any(|m| m.contains("pins no digest")), "{:?}", problems(&unpinned));
        let bad = multi.replace("arm64:", "arm65:").replace(&d("a"), "sha256:xyz").replace("operator:", "webhook:");
        let found = problems(&bad);
        for needle in
            ["names image \"webhook\", which the variant does not run", "\"arm65\" is unknown", "\"sha256:xyz\" is not"]
        {
            assert!(found.iter().any(|m| m.contains(needle)), "{needle}: {found:?}");
        }
    }
}
