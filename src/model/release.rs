//! `release.yaml` (kind `Release`): the artifact mapping of the release a tagged commit carries.

use super::{Document, DocumentHead, Location, ParseError, parse_document, parse_yaml};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub type Release = Document<ReleaseSpec>;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseSpec {
    /// The fleet this release belongs to (`fleet.yaml` `metadata.name`). Signed with the release,
    /// so a tag cut for another fleet that trusts the same key is refused here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<String>,
    /// The release's place in the fleet's history: strictly greater than every earlier release's
    /// (`release create` writes one more than the highest so far). Agents refuse to move to a
    /// lower one than they last ran successfully unless the move is signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// Earlier releases this one withdraws: no agent applies a revoked release again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revokes: Vec<String>,
    /// The Operator's source commit this release was built from.
    pub git_commit: String,
    /// The operator's own (manager) image; at least one container runs it.
    pub image: ImageRef,
    /// Further images the release runs or passes to the manager (webhook server, sidecar,
    /// an operand image given as an argument). Every container image must be `image` or one of
    /// these; each of these must be run by a container or appear in a container's args or env.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<NamedImage>,
    pub chart_version: String,
    /// The Helm chart the manifests were rendered from, when `release create --chart` rendered
    /// them; `chart_version` then equals `chart.version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart: Option<ChartSource>,
    /// The headline API version: the one the operator's primary CRD serves (real operators
    /// serve several versions across their CRDs; `crds` records each CRD's).
    pub crd_version: String,
    /// Served and storage versions of every CRD of the release, recorded by `release create`.
    /// When present, it must equal what the manifests' CRDs say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crds: Vec<CrdVersions>,
    /// Intentional breaking CRD changes this release accepts: `RULE` or `RULE:PATH`, as
    /// `fleetgate check-crd --accept` takes them. Signed with the release, so only a release
    /// key holder can accept one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accept_crd_changes: Vec<String>,
    /// The clusters this release may run on; any other cluster refuses it.
    pub target_clusters: Vec<String>,
    /// Explicit rollback target; default is the cluster's last-known-good release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires: Option<Requirements>,
    /// Folder (relative to the repo root) holding the rendered manifests.
    #[serde(default = "default_manifests")]
    pub manifests: String,
    /// The namespace of namespaced objects whose manifest names none, as `kubectl apply -n NS`
    /// gives it to an upstream `install.yaml`. Signed with the release (`release create` writes
    /// the fleet's `operator.namespace` unless told otherwise), so nothing unsigned moves objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy_timestamp: Option<String>,
    /// Renderings of the release for different kinds of cluster, in the order they are tried
    /// (see [`super::select_variant`]). Empty: every cluster runs `manifests`. With variants, each
    /// cluster runs the one its own facts select; `manifests`, `image` and `images` stay the base
    /// rendering, which tools that read one rendering (CRD baselines, `agent rbac`) read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<super::Variant>,
}

pub fn default_manifests() -> String {
    "operator/".to_string()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageRef {
    pub repository: String,
    pub tag: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

impl ImageRef {
    /// `repository:tag[@digest]`, the form manifests use.
    pub fn reference(&self) -> String {
        match &self.digest {
            Some(d) => format!("{}:{}@{}", self.repository, self.tag, d),
            None => format!("{}:{}", self.repository, self.tag),
        }
    }
}

/// One further image of a release, with the name people use for it (`webhook`, `sidecar`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamedImage {
    pub name: String,
    pub repository: String,
    pub tag: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

impl NamedImage {
    pub fn image(&self) -> ImageRef {
        ImageRef { repository: self.repository.clone(), tag: self.tag.clone(), digest: self.digest.clone() }
    }
}

/// The name `spec.image` goes by among a release's images.
pub const PRIMARY_IMAGE_NAME: &str = "operator";

impl ReleaseSpec {
    /// Every image of the release, the operator's own first, each with its name.
    pub fn all_images(&self) -> Vec<(String, ImageRef)> {
        std::iter::once((PRIMARY_IMAGE_NAME.to_string(), self.image.clone()))
            .chain(self.images.iter().map(|i| (i.name.clone(), i.image())))
            .collect()
    }
}

/// Which chart, and which values, a release's manifests were rendered from. The rendered output
/// is what is signed and applied; this records how to reproduce it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ChartSource {
    /// `name` of the chart's Chart.yaml.
    pub name: String,
    /// `version` of the chart's Chart.yaml.
    pub version: String,
    /// `sha256:<hex>` over the values files and `--set` values, in the order given.
    pub values_digest: String,
}

/// The versions one CRD serves and stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CrdVersions {
    /// The CRD's name (`<plural>.<group>`).
    pub name: String,
    /// Served versions, in the CRD's order.
    pub served: Vec<String>,
    /// The one storage version.
    pub storage: String,
}

/// What a cluster must offer to run the release.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Requirements {
    /// A semver range over the server's version, e.g. `>=1.28`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<String>,
    /// Node architectures the images are built for; every node must be one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub architectures: Vec<String>,
}

/// `requires.kubernetes` that is not a version range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("requires.kubernetes {range:?} is not a version range (expected e.g. `>=1.28`, `>=1.28, <1.33`): {reason}")]
pub struct BadVersionRange {
    pub range: String,
    pub reason: String,
}

/// Parses a Kubernetes version range (`>=1.28`, `~1.30`, `>=1.28, <1.33`).
pub fn parse_version_range(range: &str) -> Result<semver::VersionReq, BadVersionRange> {
    semver::VersionReq::parse(range).map_err(|e| BadVersionRange { range: range.to_string(), reason: e.to_string() })
}

/// The document kind of [`Release`].
const RELEASE_KIND: &str = "Release";

/// Keys of the seed's ConfigMap form (`data:` of a `v1` ConfigMap). The first eight are the seed's;
/// `image.repository`, `image.digest`, `requires.kubernetes`, `requires.architectures`,
/// `manifests`, `fleet`, `sequence` and `revokes` are fleetgate's additions so the ConfigMap form can say everything the typed one can.
pub mod seed_keys {
    pub const RELEASE_ID: &str = "release.id";
    pub const GIT_COMMIT: &str = "git.commit";
    pub const IMAGE_TAG: &str = "image.tag";
    pub const CHART_VERSION: &str = "chart.version";
    pub const CRD_VERSION: &str = "crd.version";
    pub const TARGET_CLUSTERS: &str = "target.clusters";
    pub const DEPLOY_TIMESTAMP: &str = "deploy.timestamp";
    pub const ROLLBACK_TO: &str = "rollback.to";
    pub const IMAGE_REPOSITORY: &str = "image.repository";
    pub const IMAGE_DIGEST: &str = "image.digest";
    pub const REQUIRES_KUBERNETES: &str = "requires.kubernetes";
    pub const REQUIRES_ARCHITECTURES: &str = "requires.architectures";
    pub const MANIFESTS: &str = "manifests";
    pub const FLEET: &str = "fleet";
    pub const SEQUENCE: &str = "sequence";
    pub const REVOKES: &str = "revokes";
    pub const NAMESPACE: &str = "namespace";

    pub(super) const REQUIRED: [&str; 6] =
        [RELEASE_ID, GIT_COMMIT, IMAGE_TAG, CHART_VERSION, CRD_VERSION, TARGET_CLUSTERS];
    pub(super) const ALL: [&str; 17] = [
        RELEASE_ID,
        GIT_COMMIT,
        IMAGE_TAG,
        CHART_VERSION,
        CRD_VERSION,
        TARGET_CLUSTERS,
        DEPLOY_TIMESTAMP,
        ROLLBACK_TO,
        IMAGE_REPOSITORY,
        IMAGE_DIGEST,
        REQUIRES_KUBERNETES,
        REQUIRES_ARCHITECTURES,
        MANIFESTS,
        FLEET,
        SEQUENCE,
        REVOKES,
        NAMESPACE,
    ];
}

/// Reads `release.yaml` in either form: the typed `kind: Release` document, or the seed's
/// `v1` ConfigMap whose `data` holds `release.id`, `git.commit`, `image.tag`, … .
///
/// The seed's form names only the image tag. Its repository comes from the `image.repository`
/// key when present, else from `default_repository` (the fleet's `spec.operator.image`); with
/// neither, the release is refused because no image could be checked against the manifests.
/// Unknown `data` keys are errors, like unknown fields of the typed form.
pub fn parse_release(file: &str, text: &str, default_repository: Option<&str>) -> Result<Release, ParseError> {
    let head: DocumentHead = parse_yaml(file, text)?;
    if head.api_version == "v1" && head.kind == "ConfigMap" {
        let cm: SeedConfigMap = parse_yaml(file, text)?;
        return from_seed(file, text, cm.data, default_repository);
    }
    parse_document(file, text, RELEASE_KIND)
}

/// The seed's ConfigMap: only `data` carries the release; the ConfigMap's own name (e.g.
/// `release-manifest-20250315`) and namespace are not the release's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SeedConfigMap {
    #[serde(rename = "apiVersion")]
    _api_version: IgnoredAny,
    #[serde(rename = "kind")]
    _kind: IgnoredAny,
    #[serde(rename = "metadata", default)]
    _metadata: Option<IgnoredAny>,
    #[serde(default)]
    data: BTreeMap<String, String>,
}

fn from_seed(
    file: &str,
    text: &str,
    mut data: BTreeMap<String, String>,
    default_repository: Option<&str>,
) -> Result<Release, ParseError> {
    use seed_keys::*;
    let invalid =
        |key: &str, message: String| ParseError::Invalid { at: Location::of_path(file, text, &["data", key]), message };
    if let Some(unknown) = data.keys().find(|k| !ALL.contains(&k.as_str())) {
        return Err(invalid(
            unknown,
            format!("unknown key {unknown:?} in the release ConfigMap; expected one of {}", ALL.join(", ")),
        ));
    }
    let missing: Vec<&str> = REQUIRED.iter().copied().filter(|k| !data.contains_key(*k)).collect();
    if !missing.is_empty() {
        return Err(ParseError::Invalid {
            at: Location::of_key(file, text, "data"),
            message: format!("the release ConfigMap lacks {}", missing.join(", ")),
        });
    }
    let mut take = |k: &str| data.remove(k).map(|v| v.trim().to_string());
    let list = |v: Option<String>| -> Vec<String> {
        v.map(|s| s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect())
            .unwrap_or_default()
    };
    let id = take(RELEASE_ID).unwrap_or_default();
    let repository = match take(IMAGE_REPOSITORY).or_else(|| default_repository.map(str::to_string)) {
        Some(r) => r,
        None => {
            return Err(invalid(
                IMAGE_TAG,
                format!(
                    "the release ConfigMap names {IMAGE_TAG} but no image repository: add the key {IMAGE_REPOSITORY}, \
                     or set spec.operator.image in fleet.yaml"
                ),
            ));
        }
    };
    let kubernetes = take(REQUIRES_KUBERNETES);
    let architectures = list(take(REQUIRES_ARCHITECTURES));
    let requires =
        (kubernetes.is_some() || !architectures.is_empty()).then_some(Requirements { kubernetes, architectures });
    let sequence = match take(SEQUENCE) {
        Some(v) => Some(
            v.parse::<u64>().map_err(|e| invalid(SEQUENCE, format!("{SEQUENCE} {v:?} is not a whole number: {e}")))?,
        ),
        None => None,
    };
    let spec = ReleaseSpec {
        fleet: take(FLEET),
        sequence,
        revokes: list(take(REVOKES)),
        git_commit: take(GIT_COMMIT).unwrap_or_default(),
        image: ImageRef { repository, tag: take(IMAGE_TAG).unwrap_or_default(), digest: take(IMAGE_DIGEST) },
        images: Vec::new(),
        chart_version: take(CHART_VERSION).unwrap_or_default(),
        chart: None,
        crd_version: take(CRD_VERSION).unwrap_or_default(),
        crds: Vec::new(),
        accept_crd_changes: Vec::new(),
        target_clusters: list(take(TARGET_CLUSTERS)),
        rollback_to: take(ROLLBACK_TO),
        requires,
        manifests: take(MANIFESTS).unwrap_or_else(default_manifests),
        namespace: take(NAMESPACE),
        deploy_timestamp: take(DEPLOY_TIMESTAMP),
        variants: Vec::new(),
    };
    Ok(Document::new(RELEASE_KIND, id, spec))
}

/// The seed's ConfigMap `data` for `release` (with fleetgate's extra keys where set): the form the
/// applied mapping is kept in, in the spoke, as ConfigMap `release-manifest-<id>`.
pub fn release_seed_data(release: &Release) -> BTreeMap<String, String> {
    use seed_keys::*;
    let s = &release.spec;
    let mut d = BTreeMap::new();
    let mut put = |k: &str, v: &str| {
        d.insert(k.to_string(), v.to_string());
    };
    put(RELEASE_ID, release.name());
    if let Some(f) = &s.fleet {
        put(FLEET, f);
    }
    if let Some(n) = s.sequence {
        put(SEQUENCE, &n.to_string());
    }
    if !s.revokes.is_empty() {
        put(REVOKES, &s.revokes.join(","));
    }
    put(GIT_COMMIT, &s.git_commit);
    put(IMAGE_REPOSITORY, &s.image.repository);
    put(IMAGE_TAG, &s.image.tag);
    if let Some(digest) = &s.image.digest {
        put(IMAGE_DIGEST, digest);
    }
    put(CHART_VERSION, &s.chart_version);
    put(CRD_VERSION, &s.crd_version);
    put(TARGET_CLUSTERS, &s.target_clusters.join(","));
    if let Some(ns) = &s.namespace {
        put(NAMESPACE, ns);
    }
    if let Some(t) = &s.deploy_timestamp {
        put(DEPLOY_TIMESTAMP, t);
    }
    if let Some(r) = &s.rollback_to {
        put(ROLLBACK_TO, r);
    }
    if let Some(req) = &s.requires {
        if let Some(k) = &req.kubernetes {
            put(REQUIRES_KUBERNETES, k);
        }
        if !req.architectures.is_empty() {
            put(REQUIRES_ARCHITECTURES, &req.architectures.join(","));
        }
    }
    put(MANIFESTS, &s.manifests);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    /// The seed's example, verbatim.
    const SEED: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: release-manifest-20250315
  namespace: operator-cd
data:
  release.id: "rel-20250315-001"
  git.commit: "a1b2c3d4e5f6"
  image.tag: "v1.2.3-build.456"
  chart.version: "1.2.3"
  crd.version: "v1alpha2"
  target.clusters: "cluster-a,cluster-b,cluster-c"
  deploy.timestamp: "2025-03-15T10:30:00Z"
  rollback.to: "rel-20250310-002"
"#;

    const REPO: &str = "registry.example.com/redis-operator";

    #[test]
    fn the_seeds_configmap_form_parses() {
        let r = parse_release("release.yaml", SEED, Some(REPO)).unwrap();
        assert_eq!(r.name(), "rel-20250315-001");
        assert_eq!(r.kind, RELEASE_KIND);
        let s = &r.spec;
        assert_eq!(s.git_commit, "a1b2c3d4e5f6");
        assert_eq!(s.image.reference(), format!("{REPO}:v1.2.3-build.456"));
        assert_eq!(s.chart_version, "1.2.3");
        assert_eq!(s.crd_version, "v1alpha2");
        assert_eq!(s.target_clusters, ["cluster-a", "cluster-b", "cluster-c"]);
        assert_eq!(s.deploy_timestamp.as_deref(), Some("2025-03-15T10:30:00Z"));
        assert_eq!(s.rollback_to.as_deref(), Some("rel-20250310-002"));
        assert_eq!(s.manifests, "operator/");
        assert_eq!(s.requires, None);
    }

    #[test]
    fn the_configmap_form_round_trips_through_seed_data() {
        let mut r = parse_release("release.yaml", SEED, Some(REPO)).unwrap();
        r.spec.requires = Some(Requirements { kubernetes: Some(">=1.28".into()), architectures: vec!["amd64".into()] });
        r.spec.image.digest = Some(format!("sha256:{}", "a".repeat(64)));
        let cm = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "release-manifest-rel-20250315-001"},
            "data": release_seed_data(&r),
        });
        let text = serde_saphyr::to_string(&cm).unwrap();
        assert_eq!(parse_release("cm.yaml", &text, None).unwrap(), r);
    }

    #[rstest]
    #[case::no_repository(SEED, None, "image.repository")]
    #[case::unknown_key(&SEED.replace("rollback.to", "rollback.too"), Some(REPO), "rollback.too")]
    #[case::missing_keys(&SEED.replace("  git.commit: \"a1b2c3d4e5f6\"\n", "").replace("  crd.version: \"v1alpha2\"\n", ""), Some(REPO), "git.commit, crd.version")]
    #[case::typed_unknown_field(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Release\nmetadata: {name: r}\nspec:\n  gitComit: abc\n",
        None,
        "gitComit"
    )]
    #[case::other_kind("apiVersion: v1\nkind: Secret\nmetadata: {name: r}\n", None, "kind Release")]
    fn refusals_say_what_is_wrong(#[case] text: &str, #[case] repo: Option<&str>, #[case] needle: &str) {
        let err = parse_release("release.yaml", text, repo).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
        assert_eq!(err.location().file, "release.yaml");
    }

    #[test]
    fn unknown_configmap_keys_are_located() {
        let text = SEED.replace("rollback.to", "rollback.too");
        let err = parse_release("release.yaml", &text, Some(REPO)).unwrap_err();
        assert_eq!(err.location().line, Some(15), "{err}");
    }
}
