//! Mapping consistency: does `release.yaml` agree with the manifests it ships? Pure functions over
//! a release and its files, so every rule is table-tested; [`read_manifests`] gathers the files
//! from a [`RepoTree`] with the path and size rules applied on the way.
//!
//! Rules (each breach is a [`Finding`]; all are reported, not only the first):
//! * the release id equals its tag;
//! * every container and init container image of every Pod template (Deployment, StatefulSet,
//!   DaemonSet, ReplicaSet, Job, CronJob, Pod) equals `spec.image` — repository and tag, and the
//!   digest when the release names one (a manifest must not pin a digest the release does not);
//!   and at least one container runs it;
//! * every CRD serves `spec.crdVersion` and has exactly one storage version;
//! * the manifests folder and every file in it stay inside the repo (no `..`, no absolute path,
//!   no symbolic link pointing out), files are under the size limit, and there are not too many.

use crate::model::{Finding, Location, MAX_YAML_BYTES, Release, Rule, parse_multi, safe_relative_path};
use crate::source::{EntryKind, RepoTree, TreeError};
use serde_yaml_ng::Value;
use std::collections::BTreeMap;

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
            findings.push(Finding::in_file(Rule::ManifestPath, &dir, "the manifests folder is a symbolic link; name the real folder"));
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
            self.findings.push(Finding::in_file(Rule::Limit, dir, format!("folders nest deeper than {MAX_DEPTH}; not read")));
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

/// Why `image` does not equal the release's image, or None when it does.
pub fn image_mismatch(release: &Release, image: &str) -> Option<String> {
    let want = &release.spec.image;
    let got = parse_image(image);
    let expected = want.reference();
    if got.repository != want.repository {
        return Some(format!("image {image:?} is not from repository {:?} (release.yaml says {expected})", want.repository));
    }
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
        (None, Some(g)) => {
            Some(format!("image {image:?} pins digest {g} but release.yaml names none; add spec.image.digest"))
        }
        _ => None,
    }
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
    let mut operator_containers = 0;
    let mut crds = 0;
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
                for list in ["initContainers", "containers"] {
                    for c in pod.get(list).and_then(Value::as_sequence).into_iter().flatten() {
                        let name = str_at(c, "name").unwrap_or("?");
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
                        operator_containers += 1;
                        if let Some(why) = image_mismatch(release, image) {
                            let at = Location::of_text(path, text, image);
                            out.push(Finding::new(Rule::Image, at, format!("{kind} container {name:?}: {why}")));
                        }
                    }
                }
            }
            if kind == "CustomResourceDefinition" && api.starts_with("apiextensions.k8s.io/") {
                crds += 1;
                out.extend(check_crd(release, path, text, obj));
            }
        }
    }
    if operator_containers == 0 {
        out.push(Finding::in_file(
            Rule::Image,
            &release.spec.manifests,
            format!("no container in the manifests runs the release's image {}", release.spec.image.reference()),
        ));
    }
    if crds == 0 {
        out.push(Finding::in_file(
            Rule::CrdVersion,
            &release.spec.manifests,
            format!("release.yaml names crdVersion {} but the manifests hold no CustomResourceDefinition", release.spec.crd_version),
        ));
    }
    out
}

fn flatten_lists<'v>(v: &'v Value, out: &mut Vec<&'v Value>) {
    match (str_at(v, "kind"), v.get("items").and_then(Value::as_sequence)) {
        (Some(k), Some(items)) if k.ends_with("List") => items.iter().for_each(|i| flatten_lists(i, out)),
        _ => out.push(v),
    }
}

fn check_crd(release: &Release, path: &str, text: &str, crd: &Value) -> Vec<Finding> {
    let mut out = Vec::new();
    let name = crd.get("metadata").and_then(|m| str_at(m, "name")).unwrap_or("?");
    let at = Location::of_text(path, text, name);
    let versions = crd.get("spec").and_then(|s| s.get("versions")).and_then(Value::as_sequence);
    let versions: Vec<&Value> = versions.into_iter().flatten().collect();
    let want = &release.spec.crd_version;
    match versions.iter().find(|v| str_at(v, "name") == Some(want)) {
        None => {
            let names: Vec<&str> = versions.iter().filter_map(|v| str_at(v, "name")).collect();
            out.push(Finding::new(
                Rule::CrdVersion,
                at.clone(),
                format!("CRD {name} has versions [{}] but not crdVersion {want}", names.join(", ")),
            ));
        }
        Some(v) if v.get("served").and_then(Value::as_bool) != Some(true) => {
            out.push(Finding::new(Rule::CrdVersion, at.clone(), format!("CRD {name} does not serve crdVersion {want}")));
        }
        Some(_) => {}
    }
    let storage = versions.iter().filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true)).count();
    if storage != 1 {
        out.push(Finding::new(
            Rule::CrdVersion,
            at,
            format!("CRD {name} marks {storage} versions as storage; exactly one must be"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Document, ImageRef, ReleaseSpec};
    use rstest::rstest;

    fn release(digest: Option<&str>) -> Release {
        Document::new(
            "Release",
            "rel-1",
            ReleaseSpec {
                git_commit: "a1b2c3d4e5f6".into(),
                image: ImageRef {
                    repository: "registry.example.com/redis-operator".into(),
                    tag: "v1.2.3".into(),
                    digest: digest.map(str::to_string),
                },
                chart_version: "1.2.3".into(),
                crd_version: "v1alpha2".into(),
                target_clusters: vec!["a".into()],
                rollback_to: None,
                requires: None,
                manifests: "operator/".into(),
                deploy_timestamp: None,
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
        let why = image_mismatch(&release(digest), image);
        assert_eq!(why.is_none(), agrees, "{why:?}");
    }

    fn deployment(image: &str, init: Option<&str>) -> String {
        let init = init.map(|i| format!("      initContainers:\n      - name: init\n        image: {i}\n")).unwrap_or_default();
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
        let files: BTreeMap<String, Vec<u8>> = files.iter().map(|(p, t)| (p.to_string(), t.clone().into_bytes())).collect();
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
}
