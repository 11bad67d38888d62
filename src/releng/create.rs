//! `release create`: one signed, tagged commit that carries a release — the rendered manifests
//! under `operator/` and the mapping in `release.yaml` — after the same mapping checks `validate`
//! runs and a CRD compatibility check against what the target clusters last ran successfully
//! ([`super::baseline`]). An incompatible CRD change goes through only when the release accepts
//! it (`spec.acceptCrdChanges`, signed, and honoured by every agent's CRD gate).
//!
//! Variants ([`VariantInput`], `--variant`) are further renderings of the same release under
//! `variants/<name>/`, listed in `release.yaml` `spec.variants` with their selectors and images
//! and signed with it: each is checked like the base (mapping, admission), and each must carry
//! exactly the base's CRDs.
//!
//! Admission runs before anything is signed, as the agents will judge the release: their
//! baseline ([`CreateRequest::admission_baseline`]) narrowed by the branch's
//! `ReleaseAdmissionPolicy` documents (the tag's tree carries the same `policies/`), without a
//! cluster. A refusal lists every rule every object breaks and the policy lines that would admit
//! them; `allow_admission` signs anyway and records the reason and the violations in the tag.
//!
//! Order matters for safety: the commit and the signed tag object are written first (unreferenced),
//! then the branch moves, then the tag reference appears. A failure at any step before leaves the
//! repo's references untouched. Re-running with the same inputs finds the tag and reports
//! "already released"; the same id with other content is refused.

use super::baseline::{self, CrdBaseline};
use super::chart::{self, ChartInput, RenderTarget};
use super::checks::{self, CrdVerdict};
use super::repo::{FleetRepo, ReleaseTag, TreeEdit};
use super::sign::{self, Signer};
use super::successes::Successes;
use super::{AdmissionFix, Refusal, RelengError, check_release_id};
use crate::apply::{admission_offline, roles_judged_live};
use crate::manifests::AdmissionError;
use crate::manifests::admission::{AdmissionPolicy, ObjectRefusal, PolicyOrigin};
use crate::model::{
    self, AdmissionBaseline, ChartSource, CrdVersions, Document, FleetConfig, ImageRef, NamedImage, RELEASE_FILE,
    Release, ReleaseSpec, Requirements, Variant, VariantSelector, default_manifests,
};
use crate::release::{ReleaseContent, UnverifiedRelease, mapping};
use crate::status::{self, State};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Which clusters a release may run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    List(Vec<String>),
    /// Every cluster in `clusters/` at the time of the release.
    All,
}

/// The inputs of one release, as the pipeline knows them.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub id: String,
    /// Folder of rendered manifests; it becomes `operator/`. Not read when `chart` is set.
    pub manifests: PathBuf,
    /// A Helm chart to render into `operator/` instead (see [`chart`]), named
    /// `spec.operator.name` in namespace `spec.operator.namespace` of the branch's fleet.yaml.
    /// Its Chart.yaml version is the release's chart version: `chart_version` must then be empty.
    pub chart: Option<ChartInput>,
    pub image: ImageRef,
    /// Further images (`spec.images`).
    pub images: Vec<NamedImage>,
    pub chart_version: String,
    pub crd_version: String,
    /// Breaking CRD changes the release accepts (`RULE[:PATH]`, `spec.acceptCrdChanges`).
    pub accept_crd_changes: Vec<String>,
    /// The Operator's source commit.
    pub git_commit: String,
    pub targets: Targets,
    /// Default: the newest earlier release some cluster reported `success` for (not revoked).
    pub rollback_to: Option<String>,
    /// Earlier releases this one withdraws (`spec.revokes`).
    pub revokes: Vec<String>,
    /// Namespace of namespaced objects whose manifest names none (`spec.namespace`); default
    /// the fleet's `operator.namespace`.
    pub namespace: Option<String>,
    pub requires: Option<Requirements>,
    /// Branch to commit on; default: the branch HEAD points at.
    pub branch: Option<String>,
    /// The agents' admission baseline the release is judged by before it is signed.
    pub admission_baseline: AdmissionBaseline,
    /// Sign although admission refuses, for this reason (recorded in the tag message).
    pub allow_admission: Option<String>,
    /// Variants of the release (`spec.variants`), in the order clusters try them. Empty: one
    /// rendering for every cluster, as before.
    pub variants: Vec<VariantInput>,
}

/// One variant to render (`--variant NAME=FILE|DIR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantInput {
    pub name: String,
    /// With `chart`: a values file merged over the base values (after them, before `--set`);
    /// without: the folder of the variant's rendered manifests.
    pub source: PathBuf,
    /// Which clusters run it; `None` on the last variant makes it the default.
    pub selector: Option<VariantSelector>,
    /// The variant's manager image; default: the release's.
    pub image: Option<ImageRef>,
    /// Further images that replace the release's of the same name in this variant.
    pub images: Vec<NamedImage>,
    /// Images per architecture: image name (`operator` or a further image's) → architecture →
    /// the digest of that architecture's image in the multi-arch index the image pins.
    pub platforms: BTreeMap<String, BTreeMap<String, String>>,
}

/// Where variant NAME's manifests go in the release commit.
pub fn variant_dir(name: &str) -> String {
    format!("{VARIANTS_DIR}{name}/")
}

/// The folder holding every variant's manifests (`variants/<name>/`).
pub const VARIANTS_DIR: &str = "variants/";

/// A release signed although admission refused it (`--allow-admission`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdmissionOverride {
    pub reason: String,
    /// The violations it was signed with, as admission words them.
    pub violations: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CreateOutcome {
    /// A new commit (or the existing branch tip, when it already carried exactly this content) was tagged.
    Created,
    /// The tag exists with exactly this content; nothing was written.
    AlreadyReleased,
}

/// What `release create` did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateReport {
    pub outcome: CreateOutcome,
    pub id: String,
    pub branch: String,
    pub commit: String,
    /// The annotated tag object.
    pub tag: String,
    pub signer: String,
    pub previous: Option<String>,
    /// Clusters that reported `success` for the default rollback target (empty when it was given
    /// or none succeeded).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rollback_succeeded_on: Vec<String>,
    pub mapping: ReleaseSpec,
    /// What the CRDs were compared with: each target cluster's last-known-good release, else the
    /// previous release. Empty for a first release.
    pub crd_baselines: Vec<CrdBaseline>,
    /// The verdict over every baseline.
    pub crd_compatibility: CrdVerdict,
    /// Number of manifest files under `operator/`.
    pub manifest_files: usize,
    /// Set when the release was signed although admission refused it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admission_override: Option<AdmissionOverride>,
    /// Roles the release's bindings grant that it does not define: the agents judge those
    /// bindings by the rules the cluster has for each role, when they apply.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub roles_judged_live: Vec<String>,
}

/// Parses `--image REPO:TAG[@DIGEST]` with the image rules `validate` applies.
pub fn parse_image(s: &str) -> Result<ImageRef, RelengError> {
    let bad = |why: &str| RelengError::Usage(format!("--image {s:?}: {why}; expected REPOSITORY:TAG[@sha256:HEX]"));
    let parts = mapping::parse_image(s);
    let tag = parts.tag.ok_or_else(|| bad("no tag"))?;
    if !model::is_image_repository(parts.repository) {
        return Err(bad("not an image repository"));
    }
    if !model::is_image_tag(tag) {
        return Err(bad("not an image tag"));
    }
    if let Some(d) = parts.digest
        && !model::is_digest(d)
    {
        return Err(bad("the digest is not sha256:<64 hex> or sha512:<128 hex>"));
    }
    Ok(ImageRef {
        repository: parts.repository.to_string(),
        tag: tag.to_string(),
        digest: parts.digest.map(str::to_string),
    })
}

/// Parses `--extra-image NAME=REPO:TAG[@DIGEST]` (one of `spec.images`).
pub fn parse_named_image(s: &str) -> Result<NamedImage, RelengError> {
    let Some((name, reference)) = s.split_once('=') else {
        return Err(RelengError::Usage(format!("--extra-image {s:?}: expected NAME=REPOSITORY:TAG[@sha256:HEX]")));
    };
    let image = parse_image(reference)?;
    Ok(NamedImage { name: name.to_string(), repository: image.repository, tag: image.tag, digest: image.digest })
}

/// The variants of `--variant NAME=FILE|DIR` (in order), with their `--variant-selector
/// NAME=YAML`, `--variant-image NAME[.IMAGE]=REF` and `--variant-platform
/// NAME[.IMAGE]=ARCH@DIGEST` settings.
pub fn parse_variants(
    variants: &[String],
    selectors: &[String],
    images: &[String],
    platforms: &[String],
) -> Result<Vec<VariantInput>, RelengError> {
    let split = |flag: &str, s: &str, expected: &str| {
        s.split_once('=')
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .ok_or_else(|| RelengError::Usage(format!("{flag} {s:?}: expected {expected}")))
    };
    let mut out: Vec<VariantInput> = Vec::new();
    for v in variants {
        let (name, source) = split("--variant", v, "NAME=VALUES.yaml (with --chart) or NAME=DIR")?;
        out.push(VariantInput {
            name,
            source: source.into(),
            selector: None,
            image: None,
            images: Vec::new(),
            platforms: BTreeMap::new(),
        });
    }
    let unknown = |flag: &str, name: &str| {
        RelengError::Usage(format!("{flag} {name}=…: there is no --variant {name}=… to apply it to"))
    };
    for s in selectors {
        let (name, yaml) = split("--variant-selector", s, "NAME={matchLabels: {KEY: VALUE}}")?;
        let selector: VariantSelector = serde_saphyr::from_str(&yaml).map_err(|e| {
            RelengError::Usage(format!(
                "--variant-selector {name}={yaml}: {e}; expected YAML such as {{matchLabels: {{region: eu}}, architectures: [arm64], kubernetes: \">=1.30\"}}"
            ))
        })?;
        let target = out.iter_mut().find(|v| v.name == name).ok_or_else(|| unknown("--variant-selector", &name))?;
        target.selector = Some(selector);
    }
    for i in images {
        let (key, reference) = split("--variant-image", i, "NAME=IMAGE or NAME.IMAGE=IMAGE")?;
        let (name, image_name) = match key.split_once('.') {
            Some((n, i)) => (n.to_string(), Some(i.to_string())),
            None => (key.clone(), None),
        };
        let image = parse_image(&reference)?;
        let target = out.iter_mut().find(|v| v.name == name).ok_or_else(|| unknown("--variant-image", &name))?;
        match image_name {
            None => target.image = Some(image),
            Some(n) => target.images.push(NamedImage {
                name: n,
                repository: image.repository,
                tag: image.tag,
                digest: image.digest,
            }),
        }
    }
    for p in platforms {
        let expected = "NAME[.IMAGE]=ARCH@sha256:DIGEST";
        let (key, value) = split("--variant-platform", p, expected)?;
        let (name, image) = key.split_once('.').unwrap_or((&key, model::PRIMARY_IMAGE_NAME));
        let Some((arch, digest)) = value.split_once('@') else {
            return Err(RelengError::Usage(format!("--variant-platform {p:?}: expected {expected}")));
        };
        let target = out.iter_mut().find(|v| v.name == name).ok_or_else(|| unknown("--variant-platform", name))?;
        target.platforms.entry(image.to_string()).or_default().insert(arch.to_string(), digest.to_string());
    }
    Ok(out)
}

/// Reads every regular file under `dir` as `<prefix><relative path>` → bytes (with executable
/// bits); `prefix` is `operator/` or a variant's folder. Symbolic links are refused: a release
/// must carry its content, not point elsewhere.
pub fn read_manifests(dir: &Path, prefix: &str) -> Result<BTreeMap<String, (Vec<u8>, bool)>, RelengError> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    let io = |p: &Path, source| RelengError::Io { path: p.display().to_string(), source };
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(|e| io(&d, e))? {
            let entry = entry.map_err(|e| io(&d, e))?;
            let path = entry.path();
            let ft = entry.file_type().map_err(|e| io(&path, e))?;
            let rel = path.strip_prefix(dir).unwrap_or(&path);
            let rel = rel
                .to_str()
                .ok_or_else(|| RelengError::Usage(format!("{}: file names must be UTF-8", path.display())))?
                .replace(std::path::MAIN_SEPARATOR, "/");
            if ft.is_symlink() {
                return Err(RelengError::Usage(format!(
                    "{}: symbolic links are not allowed in manifests",
                    path.display()
                )));
            } else if ft.is_dir() {
                if rel == ".git" {
                    continue;
                }
                stack.push(path);
            } else if ft.is_file() {
                let bytes = std::fs::read(&path).map_err(|e| io(&path, e))?;
                #[cfg(unix)]
                let exec = {
                    use std::os::unix::fs::PermissionsExt;
                    entry.metadata().map(|m| m.permissions().mode() & 0o111 != 0).unwrap_or(false)
                };
                #[cfg(not(unix))]
                let exec = false;
                out.insert(format!("{prefix}{rel}"), (bytes, exec));
            }
        }
    }
    if out.is_empty() {
        return Err(RelengError::Usage(format!(
            "{} holds no files; pass --manifests with the folder your pipeline rendered the Operator into",
            dir.display()
        )));
    }
    Ok(out)
}

/// Manifest files of one rendering: `<folder>/<path>` → (bytes, executable).
type Rendering = BTreeMap<String, (Vec<u8>, bool)>;

/// What goes under `operator/` (and `variants/`): the base rendering, the chart it was rendered
/// from, if any, and each variant with its rendering.
struct Content {
    manifests: Rendering,
    chart: Option<ChartSource>,
    variants: Vec<(Variant, Rendering)>,
}

/// The release's manifests: read from `req.manifests` (and each variant's folder), or rendered
/// from `req.chart` (with each variant's values on top) for the operator identity in the
/// fleet.yaml at `tip`.
fn content(repo: &FleetRepo, req: &CreateRequest, tip: &git2::Commit<'_>) -> Result<Content, RelengError> {
    check_variant_inputs(req)?;
    let Some(input) = &req.chart else {
        let variants = req
            .variants
            .iter()
            .map(|v| Ok((variant(req, v, None)?, read_manifests(&v.source, &variant_dir(&v.name))?)))
            .collect::<Result<_, RelengError>>()?;
        return Ok(Content { manifests: read_manifests(&req.manifests, &default_manifests())?, chart: None, variants });
    };
    if !req.chart_version.is_empty() {
        return Err(RelengError::Usage(
            "pass --chart or --chart-version, not both: with --chart, the version is Chart.yaml's".into(),
        ));
    }
    let fleet = repo.fleet_state(&tip.tree()?, &format!("commit {}", tip.id()))?;
    let operator = &fleet.config.fleet.spec.operator;
    let target = RenderTarget {
        release_name: operator.name.clone(),
        namespace: operator.namespace.clone(),
        kube_version: chart::kube_version(req.requires.as_ref()),
    };
    let helm = chart::find_helm()?;
    let render = |input: &ChartInput, prefix: &str| -> Result<(ChartSource, Rendering), RelengError> {
        let rendered = chart::render(&helm, input, &target)?;
        let files =
            rendered.files.into_iter().map(|(path, bytes)| (format!("{prefix}{path}"), (bytes, false))).collect();
        Ok((rendered.source, files))
    };
    let (source, manifests) = render(input, &default_manifests())?;
    let mut variants = Vec::new();
    for v in &req.variants {
        // Helm merges values files in order and `--set` after them: the variant's file lands
        // on the base values, and `--set` holds for every variant.
        let values = input.values.iter().cloned().chain([v.source.clone()]).collect();
        let (rendered, files) = render(&ChartInput { values, ..input.clone() }, &variant_dir(&v.name))?;
        variants.push((variant(req, v, Some(rendered.values_digest))?, files));
    }
    Ok(Content { manifests, chart: Some(source), variants })
}

/// Variant names become folders: refuse bad or repeated ones before anything is read.
fn check_variant_inputs(req: &CreateRequest) -> Result<(), RelengError> {
    for (i, v) in req.variants.iter().enumerate() {
        if !model::is_dns_label(&v.name) {
            return Err(RelengError::Usage(format!(
                "--variant {}=…: a variant name must be a DNS-1123 label (lowercase letters, digits, '-')",
                v.name
            )));
        }
        if req.variants[..i].iter().any(|o| o.name == v.name) {
            return Err(RelengError::Usage(format!("--variant {} is given twice", v.name)));
        }
    }
    Ok(())
}

/// `spec.variants` entry of `input`: the release's images, with the variant's replacements.
fn variant(req: &CreateRequest, input: &VariantInput, values_digest: Option<String>) -> Result<Variant, RelengError> {
    let mut images = req.images.clone();
    for replacement in &input.images {
        match images.iter_mut().find(|i| i.name == replacement.name) {
            Some(slot) => *slot = replacement.clone(),
            None => {
                return Err(RelengError::Usage(format!(
                    "--variant-image {}.{}=…: the release has no further image {:?} (--extra-image NAME=IMAGE names them)",
                    input.name, replacement.name, replacement.name
                )));
            }
        }
    }
    Ok(Variant {
        name: input.name.clone(),
        selector: input.selector.clone(),
        image: input.image.clone().unwrap_or_else(|| req.image.clone()),
        images,
        manifests: variant_dir(&input.name),
        values_digest,
        platforms: input.platforms.clone(),
    })
}

/// The release document `release.yaml` will hold.
/// `crds` are the served and storage versions of the manifests' CRDs, recorded as `spec.crds`.
fn release_document(
    req: &CreateRequest,
    content: &Content,
    place: Place,
    rollback_to: Option<String>,
    crds: Vec<CrdVersions>,
) -> Release {
    Document::new(
        "Release",
        req.id.clone(),
        ReleaseSpec {
            fleet: Some(place.fleet),
            sequence: Some(place.sequence),
            revokes: req.revokes.clone(),
            git_commit: req.git_commit.clone(),
            image: req.image.clone(),
            images: req.images.clone(),
            chart_version: content.chart.as_ref().map_or_else(|| req.chart_version.clone(), |c| c.version.clone()),
            chart: content.chart.clone(),
            crd_version: req.crd_version.clone(),
            crds,
            accept_crd_changes: req.accept_crd_changes.clone(),
            target_clusters: place.targets,
            rollback_to,
            requires: req.requires.clone(),
            manifests: default_manifests(),
            namespace: Some(place.namespace),
            deploy_timestamp: None,
            variants: content.variants.iter().map(|(v, _)| v.clone()).collect(),
        },
    )
}

/// `release.yaml` text: a header comment, then the document.
fn release_yaml(doc: &Release) -> Result<String, RelengError> {
    let body = serde_saphyr::to_string(doc).map_err(|e| RelengError::Usage(format!("writing {RELEASE_FILE}: {e}")))?;
    Ok(format!("# Written by `fleetgate release create`; the signed tag {} vouches for it.\n{body}", doc.name()))
}

/// The human-readable mapping used in commit and tag messages and PR bodies.
pub fn mapping_lines(spec: &ReleaseSpec) -> Vec<String> {
    let mut lines = vec![
        format!("git commit:    {}", spec.git_commit),
        format!("image:         {}", spec.image.reference()),
        match &spec.chart {
            Some(c) => format!("chart:         {} {} (values {})", c.name, c.version, c.values_digest),
            None => format!("chart version: {}", spec.chart_version),
        },
        format!("CRD version:   {}", spec.crd_version),
        format!("targets:       {}", spec.target_clusters.join(", ")),
        format!("rollback to:   {}", spec.rollback_to.as_deref().unwrap_or("(the cluster's last good release)")),
    ];
    // Further images right after the operator's own.
    for (k, i) in spec.images.iter().enumerate() {
        lines.insert(2 + k, format!("image {:<7} {}", format!("{}:", i.name), i.image().reference()));
    }
    for c in &spec.crds {
        lines.push(format!("CRD:           {} served [{}], storage {}", c.name, c.served.join(", "), c.storage));
    }
    for a in &spec.accept_crd_changes {
        lines.push(format!("accepts:       {a}"));
    }
    if let Some(r) = &spec.requires {
        if let Some(k) = &r.kubernetes {
            lines.push(format!("requires:      kubernetes {k}"));
        }
        if !r.architectures.is_empty() {
            lines.push(format!("architectures: {}", r.architectures.join(", ")));
        }
    }
    for v in &spec.variants {
        let selects = v.selector.as_ref().map_or_else(|| "the default".to_string(), |s| format!("selects {s}"));
        lines.push(format!("variant {}:    {} ({selects}), manifests {}", v.name, v.image.reference(), v.manifests));
        for i in v.images.iter().filter(|i| !spec.images.contains(i)) {
            lines.push(format!("variant {}:    image {}: {}", v.name, i.name, i.image().reference()));
        }
        for (image, per_arch) in &v.platforms {
            for (arch, digest) in per_arch {
                lines.push(format!("variant {}:    image {image} for {arch}: {digest}", v.name));
            }
        }
    }
    lines
}

/// Where a new release sits: its fleet, its place in the fleet's history, the clusters it targets.
struct Place {
    fleet: String,
    sequence: u64,
    targets: Vec<String>,
    /// `spec.namespace`: the request's, else the fleet's operator namespace.
    namespace: String,
}

/// What a computed release would put in the repo, before anything is written.
struct Plan {
    tree: git2::Oid,
    operator_tree: Option<git2::Oid>,
    variants_tree: Option<git2::Oid>,
    release: Release,
    release_text: String,
    previous: Option<ReleaseTag>,
    /// Clusters that reported `success` for the default rollback target.
    rollback_succeeded_on: Vec<String>,
    files: BTreeMap<String, Vec<u8>>,
    /// Each variant's manifest files, in the release's order.
    variant_files: Vec<(String, BTreeMap<String, Vec<u8>>)>,
    /// What the base commit's registered clusters ran successfully.
    successes: Successes,
    /// The base commit's configuration (its admission policies judge the release).
    config: FleetConfig,
}

/// The newest earlier release, not revoked, that some cluster reported `success` for (verified
/// statuses from the local notes refs), with those clusters. None when none succeeded anywhere yet: each
/// agent then returns to its own last-known-good release. A release that only failed, or never
/// ran, is never the default.
fn default_rollback_target(
    repo: &FleetRepo,
    from: git2::Oid,
    req: &CreateRequest,
    tags: &[ReleaseTag],
) -> Result<(Option<String>, Vec<String>), RelengError> {
    // An agent would refuse to roll back onto a withdrawn release.
    let revoked: BTreeSet<&str> =
        tags.iter().flat_map(|t| t.release.spec.revokes.iter()).chain(&req.revokes).map(String::as_str).collect();
    let candidates = repo.releases_back_from(from, |id| id == req.id || revoked.contains(id))?;
    let commits: Vec<git2::Oid> = candidates.iter().map(|c| c.commit).collect();
    // Only statuses signed by a cluster key the base commit registers count.
    let base = repo.git().find_commit(from)?.tree()?;
    let keys = status::StatusKeys::registered(&repo.fleet_state(&base, "the release's base commit")?.config);
    let statuses = status::read_all(repo.git(), &commits, &keys).map_err(RelengError::StatusRead)?;
    for candidate in candidates {
        let mut on: Vec<String> = statuses
            .for_release(&candidate.id)
            .filter(|s| s.state == State::Success)
            .map(|s| s.cluster.clone())
            .collect();
        if !on.is_empty() {
            on.sort();
            return Ok((Some(candidate.id), on));
        }
    }
    Ok((None, Vec::new()))
}

fn plan(
    repo: &FleetRepo,
    req: &CreateRequest,
    base: &git2::Commit<'_>,
    content: &Content,
) -> Result<Plan, RelengError> {
    let manifests = &content.manifests;
    let base_tree = base.tree()?;
    let previous = repo.previous_release(base.id(), |id| id == req.id)?;
    let fleet = repo.fleet_state(&base_tree, &format!("commit {}", base.id()))?;
    let targets = match &req.targets {
        Targets::All => fleet.config.clusters.keys().cloned().collect::<Vec<_>>(),
        Targets::List(list) => {
            let unknown: Vec<&String> = list.iter().filter(|c| fleet.config.cluster(c).is_none()).collect();
            if !unknown.is_empty() {
                return Err(crate::model::SelectError::UnknownCluster {
                    name: unknown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                    known: fleet.config.known_clusters(),
                }
                .into());
            }
            let mut l = list.clone();
            l.sort();
            l.dedup();
            l
        }
    };
    if targets.is_empty() {
        return Err(RelengError::Usage(
            "the release targets no cluster; pass --targets a,b or --all (with clusters/*.yaml present)".into(),
        ));
    }
    let tags = repo.release_tags()?;
    for r in &req.revokes {
        if !tags.iter().any(|t| &t.id == r) {
            return Err(RelengError::UnknownRelease(r.clone()));
        }
    }
    let own = tags.iter().find(|t| t.id == req.id);
    // One more than every other release's, so agents can order releases by signed content alone.
    // A release cut again keeps its number, so the same content yields the same document.
    let sequence = match own.and_then(|t| t.release.spec.sequence) {
        Some(n) => n,
        None => tags.iter().filter_map(|t| t.release.spec.sequence).max().unwrap_or(0) + 1,
    };
    let (rollback_to, rollback_succeeded_on) = match (&req.rollback_to, own) {
        (Some(r), _) => {
            if repo.release_tag(r)?.is_none() {
                return Err(RelengError::UnknownRelease(r.clone()));
            }
            (Some(r.clone()), Vec::new())
        }
        // Cut again: the target it was cut with (statuses have moved on; the document must not).
        (None, Some(own)) => (own.release.spec.rollback_to.clone(), Vec::new()),
        (None, None) => default_rollback_target(repo, base.id(), req, &tags)?,
    };
    let successes = Successes::read(repo, &fleet.config, &tags)?;
    let namespace = req.namespace.clone().unwrap_or_else(|| fleet.config.fleet.spec.operator.namespace.clone());
    let place = Place { fleet: fleet.config.fleet.name().to_string(), sequence, targets, namespace };
    let bytes =
        |r: &Rendering| -> BTreeMap<String, Vec<u8>> { r.iter().map(|(p, (b, _))| (p.clone(), b.clone())).collect() };
    let files = bytes(manifests);
    let variant_files = content.variants.iter().map(|(v, r)| (v.name.clone(), bytes(r))).collect();
    let release = release_document(req, content, place, rollback_to, mapping::crd_versions(&files));
    let release_text = release_yaml(&release)?;

    let mut edit = TreeEdit::new(repo.git(), Some(&base_tree))?;
    edit.remove_dir(&default_manifests())?;
    // Variants of an earlier release must not linger beside this one's.
    edit.remove_dir(VARIANTS_DIR)?;
    for (path, (bytes, exec)) in manifests.iter().chain(content.variants.iter().flat_map(|(_, r)| r)) {
        edit.put(path, bytes, *exec)?;
    }
    edit.put(RELEASE_FILE, release_text.as_bytes(), false)?;
    let tree = edit.write()?;
    let new_tree = repo.git().find_tree(tree)?;
    let operator_tree = repo.subtree_id(&new_tree, &default_manifests());
    let variants_tree = repo.subtree_id(&new_tree, VARIANTS_DIR);
    Ok(Plan {
        tree,
        operator_tree,
        variants_tree,
        release,
        release_text,
        previous,
        rollback_succeeded_on,
        files,
        variant_files,
        successes,
        config: fleet.config,
    })
}

/// Cuts release `req.id` on its branch, signed by `signer`. See the module docs for the order of
/// writes and the idempotency rule.
///
/// Refusals: the id is tagged with other content; the mapping disagrees with the manifests; the
/// CRDs are incompatible with a baseline in a way the release does not accept. Errors: bad inputs, an
/// unknown cluster in the targets, a dirty work tree, signing or Git failures.
pub fn create(repo: &FleetRepo, req: &CreateRequest, signer: &mut Signer) -> Result<CreateReport, RelengError> {
    check_release_id(&req.id)?;
    let branch = match &req.branch {
        Some(b) => b.clone(),
        None => repo.head_branch()?,
    };
    let tip = repo.branch_tip(&branch)?;
    let content = content(repo, req, &tip)?;
    // Rendering straight into the repo's own operator/ is a natural pipeline step; allow exactly that.
    let in_repo_operator =
        repo.git().workdir().and_then(|w| w.join("operator").canonicalize().ok()).is_some_and(|op| {
            req.chart.is_none() && req.manifests.canonicalize().ok().as_deref() == Some(op.as_path())
        });
    let allowed: &[&str] = if in_repo_operator { &["operator/", RELEASE_FILE] } else { &[] };

    if let Some(existing) = repo.release_tag(&req.id)? {
        return already_released(repo, req, &branch, &existing, &content, signer);
    }
    if repo.git().find_reference(&format!("refs/tags/{}", req.id)).is_ok() {
        return Err(Refusal::IdReused {
            id: req.id.clone(),
            differences: "the tag exists but its commit carries no release.yaml for this id".into(),
        }
        .into());
    }

    let plan = plan(repo, req, &tip, &content)?;
    check_mapping(repo, &plan)?;
    let (admission_override, roles_judged_live) = check_admission(req, &plan)?;
    let (baselines, verdict) = crd_verdict(repo, &plan)?;
    if !verdict.compatible {
        return Err(Refusal::IncompatibleCrds {
            baselines: baselines.iter().filter(|b| !b.verdict.compatible).map(ToString::to_string).collect(),
            findings: verdict.findings.clone(),
            accept: verdict.accept.clone(),
        }
        .into());
    }
    repo.ensure_clean(allowed)?;

    let who = repo.identity(Some(signer))?;
    let lines = mapping_lines(&plan.release.spec);
    // Re-running after a crash between commit and tag: the tip already is this release's commit.
    let tip_is_release = tip.tree_id() == plan.tree;
    let commit = if tip_is_release {
        tip.id()
    } else {
        let message = format!("release {}: {}\n\n{}\n", req.id, plan.release.spec.image.reference(), lines.join("\n"));
        repo.commit(Some(signer), &who, &message, plan.tree, &[&tip])?
    };
    let tag_message = tag_message(&req.id, &lines, &verdict, &baselines, admission_override.as_ref());
    let tag = sign::write_signed_tag(repo.git(), signer, commit, &req.id, &who, &tag_message)?;
    if !tip_is_release {
        repo.set_branch(&branch, commit, Some(tip.id()), &format!("fleetgate release create {}", req.id))?;
    }
    repo.git()
        .reference(&format!("refs/tags/{}", req.id), tag, false, &format!("fleetgate release create {}", req.id))
        .map_err(|e| RelengError::Usage(format!("could not create tag {}: {e}; run the command again", req.id)))?;

    Ok(CreateReport {
        outcome: CreateOutcome::Created,
        id: req.id.clone(),
        branch,
        commit: commit.to_string(),
        tag: tag.to_string(),
        signer: signer.fingerprint().to_string(),
        previous: plan.previous.map(|p| p.id),
        rollback_succeeded_on: plan.rollback_succeeded_on,
        mapping: plan.release.spec,
        crd_baselines: baselines,
        crd_compatibility: verdict,
        manifest_files: plan.files.len(),
        admission_override,
        roles_judged_live,
    })
}

fn tag_message(
    id: &str,
    lines: &[String],
    verdict: &CrdVerdict,
    baselines: &[CrdBaseline],
    admission: Option<&AdmissionOverride>,
) -> String {
    let mut m = format!("Release {id}\n\n{}\n", lines.join("\n"));
    let against = match baselines {
        [] => "(first release)".to_string(),
        b => b.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
    };
    m.push_str(&format!("\nCRD compatibility against {against}: {}\n", verdict.summary()));
    for f in &verdict.findings {
        m.push_str(&format!("  - {f}\n"));
    }
    if let Some(a) = admission {
        m.push_str(&format!("\nAdmission refused, signed anyway (--allow-admission): {}\n", a.reason));
        for v in &a.violations {
            m.push_str(&format!("  - {v}\n"));
        }
    }
    m
}

/// Admission of the planned release as an agent would judge it (see the module docs): the base
/// rendering and every variant, each as the clusters that run it receive it.
/// `None`: admitted; `Some`: refused and overridden by `req.allow_admission`. With the roles
/// bindings grant outside the release, which only the agents can judge.
fn check_admission(req: &CreateRequest, plan: &Plan) -> Result<(Option<AdmissionOverride>, Vec<String>), RelengError> {
    let renderings = std::iter::once((None, plan.release.spec.clone(), &plan.files)).chain(
        plan.release
            .spec
            .variants
            .iter()
            .zip(&plan.variant_files)
            .map(|(v, (_, files))| (Some(v.name.as_str()), plan.release.spec.for_variant(v), files)),
    );
    let mut violations = Vec::new();
    let mut live = BTreeSet::new();
    for (variant, spec, files) in renderings {
        let release = Document { spec, ..plan.release.clone() };
        let content = ReleaseContent { release, files: files.clone(), variants: BTreeMap::new() };
        let release = UnverifiedRelease::new(plan.release.name(), content);
        live.extend(roles_judged_live(&release)?);
        let Some(refused) = admission(&req.admission_baseline, &plan.config, &release)? else { continue };
        if req.allow_admission.is_none() {
            return Err(Refusal::Admission { objects: refused.objects, fixes: refused.fixes }.into());
        }
        let named = |v: String| match variant {
            Some(name) => format!("variant {name}: {v}"),
            None => v,
        };
        violations.extend(refused.error.violations.iter().map(ToString::to_string).map(named));
    }
    let overridden = req
        .allow_admission
        .as_ref()
        .filter(|_| !violations.is_empty())
        .map(|reason| AdmissionOverride { reason: reason.clone(), violations });
    Ok((overridden, live.into_iter().collect()))
}

/// What admission refused in a release, as [`admission`] reports it.
pub(super) struct AdmissionRefused {
    pub error: AdmissionError,
    /// Every refused object, each rule it breaks once.
    pub objects: Vec<ObjectRefusal>,
    /// The policy lines that would admit them, where a person adds them.
    pub fixes: Vec<AdmissionFix>,
}

/// Admission of `release` as an agent would judge it: `baseline` narrowed by the policies of
/// `config`. `None`: admitted.
pub(super) fn admission(
    baseline: &AdmissionBaseline,
    config: &FleetConfig,
    release: &UnverifiedRelease,
) -> Result<Option<AdmissionRefused>, RelengError> {
    let policy = AdmissionPolicy::effective(baseline.spec.clone(), &config.admission_policies);
    // Namespace-less objects go where the agents put them: the release's spec.namespace.
    let Err(refused) = admission_offline(&policy, release)? else { return Ok(None) };
    let fixes = policy
        .fixes(&refused)
        .into_iter()
        .map(|f| AdmissionFix {
            file: match &f.policy {
                PolicyOrigin::Baseline => baseline.describe(),
                PolicyOrigin::Repo(name) => config.admission_policy_files.get(name).cloned().unwrap_or_default(),
            },
            policy: f.policy.to_string(),
            lines: f.lines,
        })
        .collect();
    Ok(Some(AdmissionRefused { objects: refused.by_object(), error: refused, fixes }))
}

fn check_mapping(repo: &FleetRepo, plan: &Plan) -> Result<(), RelengError> {
    let findings = checks::release_findings(repo, plan.tree, plan.release.name())?;
    if findings.is_empty() { Ok(()) } else { Err(Refusal::MappingInconsistent { findings }.into()) }
}

/// The release's CRDs against each of its baselines, and the verdict over all of them.
fn crd_verdict(repo: &FleetRepo, plan: &Plan) -> Result<(Vec<CrdBaseline>, CrdVerdict), RelengError> {
    let spec = &plan.release.spec;
    let baselines = baseline::crd_baselines(
        repo,
        &plan.successes,
        &spec.target_clusters,
        plan.release.name(),
        plan.previous.as_ref(),
        &plan.files,
        &spec.accept_crd_changes,
    )?;
    let verdict = CrdVerdict::combined(baselines.iter().map(|b| &b.verdict));
    Ok((baselines, verdict))
}

/// The tag exists: same content → report it; other content → refuse, naming what differs.
fn already_released(
    repo: &FleetRepo,
    req: &CreateRequest,
    branch: &str,
    existing: &ReleaseTag,
    content: &Content,
    signer: &Signer,
) -> Result<CreateReport, RelengError> {
    let commit = repo.git().find_commit(existing.commit)?;
    // Recompute against the state the release was cut from: its first parent.
    let base = commit.parent(0).unwrap_or_else(|_| commit.clone());
    let plan = plan(repo, req, &base, content)?;
    let tree = commit.tree()?;
    let mut differences = Vec::new();
    if repo.subtree_id(&tree, &default_manifests()) != plan.operator_tree {
        differences.push("operator/ manifests differ".to_string());
    }
    if repo.subtree_id(&tree, VARIANTS_DIR) != plan.variants_tree {
        differences.push(format!("{VARIANTS_DIR} manifests differ"));
    }
    let existing_text = repo.file_at(&tree, RELEASE_FILE)?.unwrap_or_default();
    if existing_text != plan.release_text.as_bytes() {
        let mut fields = Vec::new();
        let (a, b) = (&existing.release.spec, &plan.release.spec);
        if a.image != b.image {
            fields.push(format!("image {} vs {}", a.image.reference(), b.image.reference()));
        }
        for (name, x, y) in [
            ("gitCommit", &a.git_commit, &b.git_commit),
            ("chartVersion", &a.chart_version, &b.chart_version),
            ("crdVersion", &a.crd_version, &b.crd_version),
        ] {
            if x != y {
                fields.push(format!("{name} {x} vs {y}"));
            }
        }
        if a.target_clusters != b.target_clusters {
            fields.push(format!(
                "targetClusters [{}] vs [{}]",
                a.target_clusters.join(", "),
                b.target_clusters.join(", ")
            ));
        }
        if a.rollback_to != b.rollback_to {
            fields.push(format!("rollbackTo {:?} vs {:?}", a.rollback_to, b.rollback_to));
        }
        if a.requires != b.requires {
            fields.push("requires differs".to_string());
        }
        if a.variants != b.variants {
            let names = |s: &ReleaseSpec| s.variants.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(", ");
            fields.push(format!("variants [{}] vs [{}] (or their selectors, images)", names(a), names(b)));
        }
        if a.chart != b.chart {
            let show = |c: &Option<ChartSource>| {
                c.as_ref()
                    .map_or("none".to_string(), |c| format!("{} {} values {}", c.name, c.version, c.values_digest))
            };
            fields.push(format!("chart {} vs {}", show(&a.chart), show(&b.chart)));
        }
        if fields.is_empty() {
            fields.push("release.yaml text differs".to_string());
        }
        differences.push(format!("release.yaml: {}", fields.join("; ")));
    }
    if !differences.is_empty() {
        return Err(Refusal::IdReused { id: req.id.clone(), differences: differences.join("; ") }.into());
    }
    let (baselines, verdict) = crd_verdict(repo, &plan)?;
    Ok(CreateReport {
        outcome: CreateOutcome::AlreadyReleased,
        id: req.id.clone(),
        branch: branch.to_string(),
        commit: existing.commit.to_string(),
        tag: existing.tag.map(|t| t.to_string()).unwrap_or_default(),
        signer: signer.fingerprint().to_string(),
        previous: plan.previous.map(|p| p.id),
        rollback_succeeded_on: plan.rollback_succeeded_on,
        mapping: existing.release.spec.clone(),
        crd_baselines: baselines,
        crd_compatibility: verdict,
        manifest_files: plan.files.len(),
        admission_override: None,
        roles_judged_live: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("reg.example.com/redis-operator:v1.2.3", "reg.example.com/redis-operator", "v1.2.3", None)]
    #[case("localhost:5000/op:1.0", "localhost:5000/op", "1.0", None)]
    #[case(
        "r/op:v1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "r/op",
        "v1",
        Some("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
    )]
    fn images_parse(#[case] s: &str, #[case] repo: &str, #[case] tag: &str, #[case] digest: Option<&str>) {
        let i = parse_image(s).unwrap();
        assert_eq!((i.repository.as_str(), i.tag.as_str(), i.digest.as_deref()), (repo, tag, digest));
        assert_eq!(i.reference(), s);
    }

    #[test]
    fn variant_flags_parse_in_order_with_their_selectors_and_images() {
        let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let v = parse_variants(
            &["eu=values-eu.yaml".into(), "rest=values-rest.yaml".into()],
            &["eu={matchLabels: {region: eu}, kubernetes: \">=1.30\"}".into()],
            &["eu=eu.example.com/op:v1".into(), "eu.webhook=eu.example.com/wh:v1".into()],
            &[format!("rest=amd64@{}", digest('a')), format!("rest=arm64@{}", digest('b'))],
        )
        .unwrap();
        let rest: Vec<(&str, &str)> =
            v[1].platforms["operator"].iter().map(|(a, d)| (a.as_str(), d.as_str())).collect();
        assert_eq!(rest, [("amd64", digest('a').as_str()), ("arm64", digest('b').as_str())]);
        assert_eq!(v.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["eu", "rest"]);
        let selector = v[0].selector.as_ref().unwrap();
        assert_eq!((selector.to_string().as_str(), v[1].selector.is_none()), ("region=eu, kubernetes >=1.30", true));
        assert_eq!(v[0].image.as_ref().unwrap().reference(), "eu.example.com/op:v1");
        assert_eq!((v[0].images[0].name.as_str(), v[0].source.to_str()), ("webhook", Some("values-eu.yaml")));
    }

    #[rstest]
    #[case(&["eu"], &[], &[], "expected NAME=VALUES.yaml")]
    #[case(&["eu=a.yaml"], &["us={matchLabels: {region: us}}"], &[], "there is no --variant us")]
    #[case(&["eu=a.yaml"], &["eu={matchLables: {region: eu}}"], &[], "unknown field `matchLables`")]
    #[case(&["eu=a.yaml"], &[], &["eu=op"], "no tag")]
    fn bad_variant_flags_are_usage_errors(
        #[case] variants: &[&str],
        #[case] selectors: &[&str],
        #[case] images: &[&str],
        #[case] needle: &str,
    ) {
        let own = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = parse_variants(&own(variants), &own(selectors), &own(images), &[]).unwrap_err();
        assert!(matches!(&e, RelengError::Usage(m) if m.contains(needle)), "{needle}: {e}");
    }

    #[rstest]
    #[case("localhost:5000/op")]
    #[case("op:")]
    #[case("op:v1@sha256:xyz")]
    #[case(":v1")]
    #[case("Reg/Op:v1")]
    fn bad_images_are_usage_errors(#[case] s: &str) {
        assert!(matches!(parse_image(s), Err(RelengError::Usage(_))), "{s}");
    }
}
