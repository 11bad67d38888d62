//! Mapping consistency: does `release.yaml` agree with the manifests it ships? Pure functions over
//! a release and its files, so every rule is table-tested; [`read_manifests`] gathers the files
//! from a [`RepoTree`] with the path and size rules applied on the way.
//!
//! Rules (each breach is a [`Finding`]; all are reported, not only the first):
//! * the release id equals its tag;
//! * every container, init container and ephemeral container image of every Pod template
//!   (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob, Pod) is one of the release's
//!   images (`spec.image`, `spec.images`) — repository and tag, and the digest when the release
//!   names one (a manifest must not pin a digest the release does not); at least one container
//!   runs `spec.image`, and every image of `spec.images` is run by a container or passed in a
//!   container's command, args or env (an operand image given to the manager);
//! * every CRD has exactly one storage version; some CRD serves the headline `spec.crdVersion`;
//!   `spec.crds`, when recorded, equals every CRD's served and storage versions;
//! * the manifests folder and every file in it stay inside the repo (no `..`, no absolute path,
//!   no symbolic link pointing out), files are under the size limit, and there are not too many.

use crate::model::{
    CrdVersions, Finding, ImageRef, Location, MAX_YAML_BYTES, PRIMARY_IMAGE_NAME, Release, Rule, is_crd, parse_multi,
    safe_relative_path,
};
use crate::model::{EntryKind, RepoTree, TreeError};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// At most this many manifest files per release.
pub const MAX_MANIFEST_FILES: usize = 2000;
/// At most this many bytes of manifests per release.
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024 * 1024;
/// Symbolic links are followed at most this many hops (inside the repo).
const MAX_LINK_HOPS: usize = 8;
/// Folders are walked at most this deep.
const MAX_DEPTH: usize = 16;

/// Manifest files are YAML or JSON; anything else in the folder (a README) is not applied.
pub fn is_manifest_file(name: &str) -> bool {
    name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json")
}

/// Manifest files: path relative to the repo root → bytes.
pub type ManifestFiles = BTreeMap<String, Vec<u8>>;

/// The manifest files under `dir`, and findings for what could not be taken. Errors only when
/// the tree itself cannot be read.
pub fn read_manifests(tree: &dyn RepoTree, dir: &str) -> Result<(ManifestFiles, Vec<Finding>), TreeError> {
    let mut files = BTreeMap::new();
    let mut findings = Vec::new();
    let dir = match safe_relative_path(dir) {
        Ok(d) if !d.is_empty() => d,
        Ok(_) => {
            findings.push(Finding::in_file(Rule::ManifestPath, dir, "the manifests folder must not be the repo root"));
            return Ok((files, findings));
        }
        Err(e) => {
            findings.push(Finding::in_file(Rule::ManifestPath, dir, e));
            return Ok((files, findings));
        }
    };
    match tree.entry(&dir)? {
        Some(e) if e.kind == EntryKind::Dir => {}
        Some(e) if e.kind == EntryKind::Symlink => {
            findings.push(Finding::in_file(
                Rule::ManifestPath,
                &dir,
                "the manifests folder is a symbolic link; name the real folder",
            ));
            return Ok((files, findings));
        }
        Some(_) => {
            findings.push(Finding::in_file(Rule::ManifestPath, &dir, "the manifests path is not a folder"));
            return Ok((files, findings));
        }
        None => {
            findings.push(Finding::in_file(
                Rule::ManifestPath,
                &dir,
                format!("the manifests folder {dir}/ does not exist in {}", tree.describe()),
            ));
            return Ok((files, findings));
        }
    }
    let mut walk = Walk { tree, files: &mut files, findings: &mut findings, total: 0 };
    walk.dir(&dir, 0)?;
    Ok((files, findings))
}

struct Walk<'a> {
    tree: &'a dyn RepoTree,
    files: &'a mut BTreeMap<String, Vec<u8>>,
    findings: &'a mut Vec<Finding>,
    total: u64,
}

impl Walk<'_> {
    fn dir(&mut self, dir: &str, depth: usize) -> Result<(), TreeError> {
        if depth > MAX_DEPTH {
            self.findings.push(Finding::in_file(
                Rule::Limit,
                dir,
                format!("folders nest deeper than {MAX_DEPTH}; not read"),
            ));
            return Ok(());
        }
        for e in self.tree.list(dir)?.unwrap_or_default() {
            let path = format!("{dir}/{}", e.name);
            match e.kind {
                EntryKind::Dir => self.dir(&path, depth + 1)?,
                EntryKind::File | EntryKind::Symlink if is_manifest_file(&e.name) => self.file(&path)?,
                EntryKind::File | EntryKind::Symlink => {}
                EntryKind::Other => self.findings.push(Finding::in_file(
                    Rule::ManifestPath,
                    &path,
                    "a submodule or special file in the manifests folder; not read",
                )),
            }
        }
        Ok(())
    }

    fn file(&mut self, path: &str) -> Result<(), TreeError> {
        if self.files.len() >= MAX_MANIFEST_FILES {
            self.findings.push(Finding::in_file(
                Rule::Limit,
                path,
                format!("more than {MAX_MANIFEST_FILES} manifest files; the rest is not read"),
            ));
            return Ok(());
        }
        let mut target = path.to_string();
        for _ in 0..=MAX_LINK_HOPS {
            match self.tree.read(&target, MAX_YAML_BYTES) {
                Ok(Some(bytes)) => {
                    self.total += bytes.len() as u64;
                    if self.total > MAX_MANIFEST_BYTES {
                        self.findings.push(Finding::in_file(
                            Rule::Limit,
                            path,
                            format!("the release's manifests exceed {MAX_MANIFEST_BYTES} bytes in total"),
                        ));
                    } else {
                        self.files.insert(path.to_string(), bytes);
                    }
                    return Ok(());
                }
                Ok(None) => {
                    self.findings.push(Finding::in_file(
                        Rule::ManifestPath,
                        path,
                        format!("symbolic link to {target}, which does not exist"),
                    ));
                    return Ok(());
                }
                Err(TreeError::Symlink { path: link, target: to }) => match resolve_link(&link, &to) {
                    Some(next) => target = next,
                    None => {
                        self.findings.push(Finding::in_file(
                            Rule::ManifestPath,
                            path,
                            format!("symbolic link to {to:?} points outside the repo"),
                        ));
                        return Ok(());
                    }
                },
                Err(e) => {
                    let mut f = e.into_finding()?;
                    f.at = Location::file(path);
                    self.findings.push(f);
                    return Ok(());
                }
            }
        }
        self.findings.push(Finding::in_file(
            Rule::ManifestPath,
            path,
            format!("more than {MAX_LINK_HOPS} chained symbolic links"),
        ));
        Ok(())
    }
}

/// Where the link at `link` (repo-relative) pointing to `target` lands, repo-relative; None when
/// it leaves the repo (absolute target, or `..` above the root).
pub fn resolve_link(link: &str, target: &str) -> Option<String> {
    if target.starts_with('/') || target.contains('\\') {
        return None;
    }
    let mut parts: Vec<&str> = link.split('/').collect();
    parts.pop();
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    Some(parts.join("/"))
}

/// An image reference split into repository, tag and digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageParts<'a> {
    pub repository: &'a str,
    pub tag: Option<&'a str>,
    pub digest: Option<&'a str>,
}

pub fn parse_image(image: &str) -> ImageParts<'_> {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    match name[slash..].rfind(':') {
        Some(i) => ImageParts { repository: &name[..slash + i], tag: Some(&name[slash + i + 1..]), digest },
        None => ImageParts { repository: name, tag: None, digest },
    }
}

/// Which of the release's images `image` is (its name), or why it is none of them.
pub fn match_image(release: &Release, image: &str) -> Result<String, String> {
    let images = release.spec.all_images();
    let got = parse_image(image);
    let mut why = None;
    for (name, want) in images.iter().filter(|(_, w)| w.repository == got.repository) {
        match image_mismatch(want, image, &got) {
            None => return Ok(name.clone()),
            Some(w) => {
                why.get_or_insert(w);
            }
        }
    }
    Err(why.unwrap_or_else(|| {
        let listed: Vec<String> = images.iter().map(|(n, i)| format!("{n} {}", i.reference())).collect();
        format!("image {image:?} is not one of the release's images ({})", listed.join(", "))
    }))
}

/// Why `image` (of `want`'s repository) is not `want`, or None when it is.
fn image_mismatch(want: &ImageRef, image: &str, got: &ImageParts<'_>) -> Option<String> {
    let expected = want.reference();
    match (got.tag, got.digest) {
        (None, None) => return Some(format!("image {image:?} has no tag (that means :latest); expected {expected}")),
        (Some(t), _) if t != want.tag => {
            return Some(format!("image {image:?} has tag {t:?}, release.yaml says {:?} ({expected})", want.tag));
        }
        _ => {}
    }
    match (&want.digest, got.digest) {
        (Some(w), Some(g)) if w != g => Some(format!("image {image:?} has digest {g}, release.yaml says {w}")),
        (Some(w), None) => Some(format!("image {image:?} is not pinned to digest {w} that release.yaml names")),
        (None, Some(g)) => Some(format!("image {image:?} pins digest {g} but release.yaml names none; add its digest")),
        _ => None,
    }
}

/// Every string a container passes to its process (command, args, env values): where operators
/// take the images of their operands or helpers.
fn container_strings(c: &Value) -> Vec<&str> {
    let list = |k: &str| c.get(k).and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
    let env = c.get("env").and_then(Value::as_array).into_iter().flatten().filter_map(|e| str_at(e, "value"));
    list("command").chain(list("args")).chain(env).collect()
}

/// The pod spec inside a workload object, if it is one.
fn pod_spec<'v>(kind: &str, obj: &'v Value) -> Option<&'v Value> {
    let spec = obj.get("spec")?;
    match kind {
        "Pod" => Some(spec),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" | "ReplicationController" => {
            spec.get("template")?.get("spec")
        }
        "CronJob" => spec.get("jobTemplate")?.get("spec")?.get("template")?.get("spec"),
        _ => None,
    }
}

fn str_at<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

/// Checks `release` (read from `release_file` with text `release_text`) against its manifest
/// `files`. `tag` is the tag the release was read from (None for an untagged commit, e.g. the
/// branch tip in `fleetgate validate`).
pub fn check_mapping(
    tag: Option<&str>,
    release: &Release,
    release_file: &str,
    release_text: &str,
    files: &BTreeMap<String, Vec<u8>>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(tag) = tag
        && release.name() != tag
    {
        out.push(Finding::at_key(
            Rule::ReleaseId,
            release_file,
            release_text,
            "name",
            format!("release id {:?} does not equal its tag {tag:?}", release.name()),
        ));
    }
    // Names of the release's images some container runs, and every string containers pass on.
    let mut run: BTreeSet<String> = BTreeSet::new();
    let mut passed: Vec<String> = Vec::new();
    let mut crds: Vec<CrdVersions> = Vec::new();
    let mut mismatches = 0;
    for (path, bytes) in files {
        let Ok(text) = std::str::from_utf8(bytes) else {
            out.push(Finding::in_file(Rule::Schema, path, "not UTF-8 text"));
            continue;
        };
        let docs = match parse_multi(path, text) {
            Ok(d) => d,
            Err(e) => {
                out.push(e.into());
                continue;
            }
        };
        let mut objects = Vec::new();
        for d in &docs {
            flatten_lists(d, &mut objects);
        }
        for (i, obj) in objects.into_iter().enumerate() {
            let (Some(api), Some(kind)) = (str_at(obj, "apiVersion"), str_at(obj, "kind")) else {
                out.push(Finding::in_file(Rule::Schema, path, format!("object {} has no apiVersion or kind", i + 1)));
                continue;
            };
            if let Some(pod) = pod_spec(kind, obj) {
                for list in ["initContainers", "containers", "ephemeralContainers"] {
                    for c in pod.get(list).and_then(Value::as_array).into_iter().flatten() {
                        let name = str_at(c, "name").unwrap_or("?");
                        passed.extend(container_strings(c).into_iter().map(str::to_string));
                        let Some(image) = str_at(c, "image") else {
                            out.push(Finding::at_key(
                                Rule::Image,
                                path,
                                text,
                                "containers",
                                format!("{kind} container {name:?} has no image"),
                            ));
                            continue;
                        };
                        match match_image(release, image) {
                            Ok(image_name) => {
                                run.insert(image_name);
                            }
                            Err(why) => {
                                mismatches += 1;
                                let at = Location::of_text(path, text, image);
                                out.push(Finding::new(Rule::Image, at, format!("{kind} container {name:?}: {why}")));
                            }
                        }
                    }
                }
            }
            if is_crd(api, kind) {
                let (versions, findings) = check_crd(path, text, obj);
                out.extend(findings);
                crds.push(versions);
            }
        }
    }
    // A container with another image already says what is wrong; this is for manifests that
    // run none of the release's own image at all.
    if !run.contains(PRIMARY_IMAGE_NAME) && mismatches == 0 {
        out.push(Finding::in_file(
            Rule::Image,
            &release.spec.manifests,
            format!("no container in the manifests runs the release's image {}", release.spec.image.reference()),
        ));
    }
    for (i, named) in release.spec.images.iter().enumerate().filter(|(_, n)| !run.contains(&n.name)) {
        let reference = named.image().reference();
        if !passed.iter().any(|p| p.contains(&reference)) {
            out.push(Finding::new(
                Rule::Image,
                Location::of_path(release_file, release_text, &["spec", "images", &i.to_string()]),
                format!(
                    "image {:?} ({reference}) is run by no container and passed in no container's command, args or env",
                    named.name
                ),
            ));
        }
    }
    out.extend(check_crd_versions(release, release_file, release_text, &crds));
    out
}

/// The release's CRD versions against its CRDs: some CRD serves the headline `crdVersion`, and
/// `spec.crds`, when recorded, equals every CRD's served and storage versions.
fn check_crd_versions(release: &Release, file: &str, text: &str, crds: &[CrdVersions]) -> Vec<Finding> {
    let mut out = Vec::new();
    let want = &release.spec.crd_version;
    let shown = |list: &[CrdVersions]| {
        list.iter().map(|c| format!("{} [{}]", c.name, c.served.join(", "))).collect::<Vec<_>>().join(", ")
    };
    if crds.is_empty() {
        out.push(Finding::in_file(
            Rule::CrdVersion,
            &release.spec.manifests,
            format!("release.yaml names crdVersion {want} but the manifests hold no CustomResourceDefinition"),
        ));
    } else if !crds.iter().any(|c| c.served.contains(want)) {
        out.push(Finding::at_key(
            Rule::CrdVersion,
            file,
            text,
            "crdVersion",
            format!("no CRD serves crdVersion {want}; the CRDs serve {}", shown(crds)),
        ));
    }
    if release.spec.crds.is_empty() {
        return out;
    }
    let mut recorded = release.spec.crds.clone();
    let mut actual = crds.to_vec();
    recorded.sort_by(|a, b| a.name.cmp(&b.name));
    actual.sort_by(|a, b| a.name.cmp(&b.name));
    if recorded != actual {
        out.push(Finding::at_key(
            Rule::CrdVersion,
            file,
            text,
            "crds",
            format!(
                "spec.crds records {} but the manifests' CRDs are {}; re-run `fleetgate release create`",
                shown(&recorded),
                shown(&actual)
            ),
        ));
    }
    out
}

fn flatten_lists<'v>(v: &'v Value, out: &mut Vec<&'v Value>) {
    match (str_at(v, "kind"), v.get("items").and_then(Value::as_array)) {
        (Some(k), Some(items)) if k.ends_with("List") => items.iter().for_each(|i| flatten_lists(i, out)),
        _ => out.push(v),
    }
}

/// One CRD's served and storage versions, and its own findings (exactly one storage version).
fn check_crd(path: &str, text: &str, crd: &Value) -> (CrdVersions, Vec<Finding>) {
    let name = crd.get("metadata").and_then(|m| str_at(m, "name")).unwrap_or("?");
    let at = Location::of_text(path, text, name);
    let versions = crd.get("spec").and_then(|s| s.get("versions")).and_then(Value::as_array);
    let versions: Vec<&Value> = versions.into_iter().flatten().collect();
    let flag = |v: &Value, k: &str| v.get(k).and_then(Value::as_bool) == Some(true);
    let served: Vec<String> =
        versions.iter().filter(|v| flag(v, "served")).filter_map(|v| str_at(v, "name")).map(str::to_string).collect();
    let storage: Vec<&str> = versions.iter().filter(|v| flag(v, "storage")).filter_map(|v| str_at(v, "name")).collect();
    let mut findings = Vec::new();
    if storage.len() != 1 {
        findings.push(Finding::new(
            Rule::CrdVersion,
            at,
            format!("CRD {name} marks {} versions as storage; exactly one must be", storage.len()),
        ));
    }
    let storage = storage.first().copied().unwrap_or_default().to_string();
    (CrdVersions { name: name.to_string(), served, storage }, findings)
}

/// The served and storage versions of every CRD among `files`, as `spec.crds` records them.
pub fn crd_versions(files: &BTreeMap<String, Vec<u8>>) -> Vec<CrdVersions> {
    let mut out = Vec::new();
    each_crd(files, |path, text, obj| out.push(check_crd(path, text, obj).0));
    out
}

/// Calls `f` with the path, text and object of every CRD among `files` (lists flattened; files
/// that are not UTF-8 or not YAML are skipped: the mapping checks report those).
fn each_crd(files: &ManifestFiles, mut f: impl FnMut(&str, &str, &Value)) {
    for (path, bytes) in files {
        let Ok(text) = std::str::from_utf8(bytes) else { continue };
        for doc in parse_multi(path, text).unwrap_or_default() {
            let mut objects = Vec::new();
            flatten_lists(&doc, &mut objects);
            for obj in objects {
                if is_crd(str_at(obj, "apiVersion").unwrap_or(""), str_at(obj, "kind").unwrap_or("")) {
                    f(path, text, obj);
                }
            }
        }
    }
}

/// Every CRD among `files` by name, as parsed (what is compared, not its text: comments and key
/// order do not make two CRDs differ).
fn crds_by_name(files: &ManifestFiles) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    each_crd(files, |_, _, obj| {
        let name = obj.get("metadata").and_then(|m| str_at(m, "name")).unwrap_or("?");
        out.insert(name.to_string(), obj.clone());
    });
    out
}

/// A variant's CRDs against the base rendering's (in `base_dir`): a CRD is one cluster-wide
/// definition, so every variant of a release must carry exactly the base's CRDs. Each difference
/// names the CRD and both renderings.
pub fn check_variant_crds(base_dir: &str, base: &ManifestFiles, variant: &str, files: &ManifestFiles) -> Vec<Finding> {
    let (want, got) = (crds_by_name(base), crds_by_name(files));
    let names: BTreeSet<&String> = want.keys().chain(got.keys()).collect();
    let base_dir = base_dir.trim_end_matches('/');
    let mut out = Vec::new();
    for name in names {
        let problem = match (want.get(name), got.get(name)) {
            (Some(a), Some(b)) if a == b => continue,
            (Some(_), Some(_)) => {
                format!("CRD {name} differs between the base rendering ({base_dir}/) and variant {variant}")
            }
            (Some(_), None) => {
                format!("CRD {name} is in the base rendering ({base_dir}/) but not in variant {variant}")
            }
            (None, _) => format!("CRD {name} is in variant {variant} but not in the base rendering ({base_dir}/)"),
        };
        out.push(Finding::in_file(
            Rule::Variant,
            base_dir,
            format!(
                "{problem}; CRDs must be the same in every variant of a release (one definition per cluster): render \
                 them from values every variant shares"
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Document, NamedImage, ReleaseSpec};
    use rstest::rstest;

    fn release(digest: Option<&str>) -> Release {
        Document::new(
            "Release",
            "rel-1",
            ReleaseSpec {
                fleet: Some("redis-fleet".into()),
                sequence: Some(1),
                revokes: Vec::new(),
                git_commit: "a1b2c3d4e5f6".into(),
                image: ImageRef {
                    repository: "registry.example.com/redis-operator".into(),
                    tag: "v1.2.3".into(),
                    digest: digest.map(str::to_string),
                },
                images: Vec::new(),
                chart_version: "1.2.3".into(),
                chart: None,
                crd_version: "v1alpha2".into(),
                crds: Vec::new(),
                accept_crd_changes: Vec::new(),
                target_clusters: vec!["a".into()],
                rollback_to: None,
                requires: None,
                manifests: "operator/".into(),
                namespace: None,
                deploy_timestamp: None,
                variants: Vec::new(),
            },
        )
    }

    const D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const E: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    #[rstest]
    #[case("localhost:5000/op:v1", "localhost:5000/op", Some("v1"), None)]
    #[case("localhost:5000/op", "localhost:5000/op", None, None)]
    #[case("op@sha256:ab", "op", None, Some("sha256:ab"))]
    #[case("r.io/a/op:v1@sha256:ab", "r.io/a/op", Some("v1"), Some("sha256:ab"))]
    fn images_split(#[case] s: &str, #[case] repo: &str, #[case] tag: Option<&str>, #[case] digest: Option<&str>) {
        assert_eq!(parse_image(s), ImageParts { repository: repo, tag, digest });
    }

    #[rstest]
    #[case(None, "registry.example.com/redis-operator:v1.2.3", true)]
    #[case(None, "registry.example.com/redis-operator:v1.2.4", false)]
    #[case(None, "docker.io/redis-operator:v1.2.3", false)]
    #[case(None, "registry.example.com/redis-operator", false)]
    #[case(None, &format!("registry.example.com/redis-operator:v1.2.3@{D}"), false)]
    #[case(Some(D), &format!("registry.example.com/redis-operator:v1.2.3@{D}"), true)]
    #[case(Some(D), &format!("registry.example.com/redis-operator@{D}"), true)]
    #[case(Some(D), &format!("registry.example.com/redis-operator:v1.2.3@{E}"), false)]
    #[case(Some(D), "registry.example.com/redis-operator:v1.2.3", false)]
    fn image_agreement(#[case] digest: Option<&str>, #[case] image: &str, #[case] agrees: bool) {
        let matched = match_image(&release(digest), image);
        assert_eq!(matched.is_ok(), agrees, "{matched:?}");
    }

    fn deployment(image: &str, init: Option<&str>) -> String {
        let init = init
            .map(|i| format!("      initContainers:\n      - name: init\n        image: {i}\n"))
            .unwrap_or_default();
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: op}}\nspec:\n  template:\n    spec:\n{init}      containers:\n      - name: manager\n        image: {image}\n"
        )
    }

    fn crd(versions: &[(&str, bool, bool)]) -> String {
        let mut s = String::from(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: redisclusters.cache.example.com}\nspec:\n  versions:\n",
        );
        for (n, served, storage) in versions {
            s.push_str(&format!("  - {{name: {n}, served: {served}, storage: {storage}}}\n"));
        }
        s
    }

    const GOOD: &str = "registry.example.com/redis-operator:v1.2.3";

    fn rules(files: &[(&str, String)], tag: Option<&str>) -> Vec<Rule> {
        let files: BTreeMap<String, Vec<u8>> =
            files.iter().map(|(p, t)| (p.to_string(), t.clone().into_bytes())).collect();
        let mut r: Vec<Rule> = check_mapping(tag, &release(None), "release.yaml", "metadata:\n  name: rel-1\n", &files)
            .into_iter()
            .map(|f| f.rule)
            .collect();
        r.sort();
        r
    }

    #[rstest]
    #[case::consistent(vec![("operator/d.yaml", deployment(GOOD, None)), ("operator/crd.yaml", crd(&[("v1alpha1", true, false), ("v1alpha2", true, true)]))], Some("rel-1"), vec![])]
    #[case::wrong_tag(vec![("operator/d.yaml", deployment(GOOD, None)), ("operator/crd.yaml", crd(&[("v1alpha2", true, true)]))], Some("rel-2"), vec![Rule::ReleaseId])]
    #[case::untagged_commit(vec![("operator/d.yaml", deployment(GOOD, None)), ("operator/crd.yaml", crd(&[("v1alpha2", true, true)]))], None, vec![])]
    #[case::wrong_image(vec![("operator/d.yaml", deployment("registry.example.com/redis-operator:v9", None)), ("operator/crd.yaml", crd(&[("v1alpha2", true, true)]))], None, vec![Rule::Image])]
    #[case::wrong_init_image(vec![("operator/d.yaml", deployment(GOOD, Some("busybox:1"))), ("operator/crd.yaml", crd(&[("v1alpha2", true, true)]))], None, vec![Rule::Image])]
    #[case::no_workload(vec![("operator/crd.yaml", crd(&[("v1alpha2", true, true)]))], None, vec![Rule::Image])]
    #[case::crd_lacks_version(vec![("operator/d.yaml", deployment(GOOD, None)), ("operator/crd.yaml", crd(&[("v1alpha1", true, true)]))], None, vec![Rule::CrdVersion])]
    #[case::crd_not_served(vec![("operator/d.yaml", deployment(GOOD, None)), ("operator/crd.yaml", crd(&[("v1alpha1", true, true), ("v1alpha2", false, false)]))], None, vec![Rule::CrdVersion])]
    #[case::two_storage(vec![("operator/d.yaml", deployment(GOOD, None)), ("operator/crd.yaml", crd(&[("v1alpha1", true, true), ("v1alpha2", true, true)]))], None, vec![Rule::CrdVersion])]
    #[case::no_crd(vec![("operator/d.yaml", deployment(GOOD, None))], None, vec![Rule::CrdVersion])]
    #[case::all_at_once(vec![("operator/d.yaml", deployment("x:1", Some("y:2"))), ("operator/bad.yaml", "a: [".to_string())], Some("rel-2"), vec![Rule::Schema, Rule::ReleaseId, Rule::Image, Rule::Image, Rule::CrdVersion])]
    fn mapping(#[case] files: Vec<(&str, String)>, #[case] tag: Option<&str>, #[case] expected: Vec<Rule>) {
        let mut expected = expected;
        expected.sort();
        assert_eq!(rules(&files, tag), expected);
    }

    const WEBHOOK: &str = "registry.example.com/redis-webhook:v1.2.3";
    const SENTINEL: &str = "registry.example.com/redis-sentinel:7.2";

    /// A real operator's shape: the manager, a webhook server, and an operand image passed to
    /// the manager as an argument; CRDs serving different versions.
    fn multi(images: &[(&str, &str)], crds: Vec<CrdVersions>) -> Release {
        let mut r = release(None);
        r.spec.images = images
            .iter()
            .map(|(name, reference)| {
                let p = parse_image(reference);
                NamedImage {
                    name: name.to_string(),
                    repository: p.repository.into(),
                    tag: p.tag.unwrap().into(),
                    digest: None,
                }
            })
            .collect();
        r.spec.crds = crds;
        r
    }

    fn manager_with_arg(arg: &str) -> String {
        deployment(GOOD, None) + &format!("        args: [\"--leader-elect\", \"{arg}\"]\n")
    }

    fn second_crd(name: &str, versions: &[(&str, bool, bool)]) -> String {
        crd(versions).replace("redisclusters.cache.example.com", name)
    }

    fn versions(name: &str, served: &[&str], storage: &str) -> CrdVersions {
        CrdVersions {
            name: name.into(),
            served: served.iter().map(|v| v.to_string()).collect(),
            storage: storage.into(),
        }
    }

    #[rstest]
    #[case::three_images(&[("webhook", WEBHOOK), ("sentinel", SENTINEL)], vec![("operator/d.yaml", manager_with_arg(&format!("--sentinel-image={SENTINEL}"))), ("operator/w.yaml", deployment(WEBHOOK, None))], vec![])]
    #[case::unlisted_image(&[], vec![("operator/d.yaml", deployment(GOOD, None)), ("operator/w.yaml", deployment(WEBHOOK, None))], vec![Rule::Image])]
    #[case::listed_but_unused(&[("webhook", WEBHOOK), ("sentinel", SENTINEL)], vec![("operator/d.yaml", deployment(GOOD, None)), ("operator/w.yaml", deployment(WEBHOOK, None))], vec![Rule::Image])]
    #[case::wrong_tag_of_second_image(&[("webhook", WEBHOOK)], vec![("operator/d.yaml", deployment(GOOD, None)), ("operator/w.yaml", deployment("registry.example.com/redis-webhook:v0", None))], vec![Rule::Image, Rule::Image])]
    #[case::only_the_webhook_runs(&[("webhook", WEBHOOK)], vec![("operator/w.yaml", deployment(WEBHOOK, None))], vec![Rule::Image])]
    fn several_images(
        #[case] images: &[(&str, &str)],
        #[case] mut files: Vec<(&str, String)>,
        #[case] expected: Vec<Rule>,
    ) {
        files.push(("operator/crd.yaml", crd(&[("v1alpha2", true, true)])));
        let files: BTreeMap<String, Vec<u8>> =
            files.iter().map(|(p, t)| (p.to_string(), t.clone().into_bytes())).collect();
        let got: Vec<Rule> = check_mapping(None, &multi(images, vec![]), "release.yaml", "", &files)
            .into_iter()
            .map(|f| f.rule)
            .collect();
        assert_eq!(got, expected);
    }

    #[rstest]
    // Stable kinds at v1, a newer kind at v1alpha1: the headline crdVersion (v1alpha2 here) need
    // only be served by one of them.
    #[case::headline_served_by_one(vec![], vec![])]
    #[case::recorded_and_equal(vec![versions("redisclusters.cache.example.com", &["v1alpha1", "v1alpha2"], "v1alpha2"), versions("backups.cache.example.com", &["v1"], "v1")], vec![])]
    #[case::recorded_storage_differs(vec![versions("redisclusters.cache.example.com", &["v1alpha1", "v1alpha2"], "v1alpha1"), versions("backups.cache.example.com", &["v1"], "v1")], vec![Rule::CrdVersion])]
    #[case::recorded_crd_missing(vec![versions("redisclusters.cache.example.com", &["v1alpha1", "v1alpha2"], "v1alpha2")], vec![Rule::CrdVersion])]
    fn crd_versions_per_crd(#[case] recorded: Vec<CrdVersions>, #[case] expected: Vec<Rule>) {
        let files: BTreeMap<String, Vec<u8>> = [
            ("operator/d.yaml", deployment(GOOD, None)),
            ("operator/crd.yaml", crd(&[("v1alpha1", true, false), ("v1alpha2", true, true)])),
            ("operator/backup.yaml", second_crd("backups.cache.example.com", &[("v1", true, true)])),
        ]
        .iter()
        .map(|(p, t)| (p.to_string(), t.clone().into_bytes()))
        .collect();
        let got: Vec<Rule> = check_mapping(None, &multi(&[], recorded), "release.yaml", "", &files)
            .into_iter()
            .map(|f| f.rule)
            .collect();
        assert_eq!(got, expected);
        let computed = crd_versions(&files);
        assert_eq!(computed.len(), 2);
        assert!(check_mapping(None, &multi(&[], computed), "release.yaml", "", &files).is_empty());
    }

    #[test]
    fn image_findings_point_at_the_line() {
        let files = BTreeMap::from([("operator/d.yaml".to_string(), deployment("x:1", None).into_bytes())]);
        let f = check_mapping(None, &release(None), "release.yaml", "", &files);
        let img = f.iter().find(|f| f.rule == Rule::Image).unwrap();
        assert_eq!(img.at.line, Some(9), "{img}");
    }

    #[rstest]
    #[case("operator/a.yaml", "b.yaml", Some("operator/b.yaml"))]
    #[case("operator/a.yaml", "../crds/c.yaml", Some("crds/c.yaml"))]
    #[case("operator/a.yaml", "../../etc/passwd", None)]
    #[case("operator/a.yaml", "/etc/passwd", None)]
    fn links(#[case] link: &str, #[case] target: &str, #[case] expected: Option<&str>) {
        assert_eq!(resolve_link(link, target).as_deref(), expected);
    }

    #[test]
    fn a_variant_must_carry_the_base_renderings_crds_exactly() {
        let files = |pairs: &[(&str, &str)]| -> ManifestFiles {
            pairs.iter().map(|(p, t)| (p.to_string(), t.as_bytes().to_vec())).collect()
        };
        let v1 = crd(&[("v1", true, true)]);
        let base = files(&[("operator/crd.yaml", &v1), ("operator/d.yaml", &deployment("op:v1", None))]);
        // Same CRD, other file, other formatting: the same definition.
        let same = files(&[(
            "variants/eu/all.yaml",
            &format!(
                "# eu\n{}",
                v1.replace("{name: v1, served: true, storage: true}", "{storage: true, served: true, name: v1}")
            ),
        )]);
        assert_eq!(check_variant_crds("operator/", &base, "eu", &same), []);
        let other = files(&[("variants/eu/crd.yaml", &crd(&[("v1", true, true), ("v2", true, false)]))]);
        let found = check_variant_crds("operator/", &base, "eu", &other);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].rule, Rule::Variant);
        assert!(
            found[0].message.starts_with(
                "CRD redisclusters.cache.example.com differs between the base rendering (operator/) and variant eu"
            ),
            "{}",
            found[0].message
        );
        let none = check_variant_crds("operator/", &base, "eu", &files(&[]));
        assert!(none[0].message.contains("is in the base rendering (operator/) but not in variant eu"), "{none:?}");
    }
}
