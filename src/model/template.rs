//! The built-in fleet repo template (`fleet-repo-template/`, embedded in the binary so
//! `fleetgate init` works from any directory): its files and [`write_template`]. The Git side
//! (`git init`, first commit) is `source::init_fleet_repo`.

use std::path::{Path, PathBuf};

/// Every file of the template: path relative to the repo root → content. A unit test keeps this
/// list equal to the folder, so a file added there cannot be forgotten here.
pub const TEMPLATE_FILES: &[(&str, &str)] = &[
    ("README.md", include_str!("../../fleet-repo-template/README.md")),
    ("clusters/cluster-a.yaml", include_str!("../../fleet-repo-template/clusters/cluster-a.yaml")),
    ("clusters/cluster-b.yaml", include_str!("../../fleet-repo-template/clusters/cluster-b.yaml")),
    ("clusters/cluster-c.yaml", include_str!("../../fleet-repo-template/clusters/cluster-c.yaml")),
    ("fleet.yaml", include_str!("../../fleet-repo-template/fleet.yaml")),
    (
        "operator/crds/redisclusters.cache.example.com.yaml",
        include_str!("../../fleet-repo-template/operator/crds/redisclusters.cache.example.com.yaml"),
    ),
    ("operator/deployment.yaml", include_str!("../../fleet-repo-template/operator/deployment.yaml")),
    ("operator/namespace.yaml", include_str!("../../fleet-repo-template/operator/namespace.yaml")),
    ("operator/rbac/clusterrole.yaml", include_str!("../../fleet-repo-template/operator/rbac/clusterrole.yaml")),
    (
        "operator/rbac/clusterrolebinding.yaml",
        include_str!("../../fleet-repo-template/operator/rbac/clusterrolebinding.yaml"),
    ),
    (
        "operator/rbac/leader-election.yaml",
        include_str!("../../fleet-repo-template/operator/rbac/leader-election.yaml"),
    ),
    ("operator/rbac/serviceaccount.yaml", include_str!("../../fleet-repo-template/operator/rbac/serviceaccount.yaml")),
    ("operator/service.yaml", include_str!("../../fleet-repo-template/operator/service.yaml")),
    ("operator/webhook.yaml", include_str!("../../fleet-repo-template/operator/webhook.yaml")),
    ("policies/admission.yaml", include_str!("../../fleet-repo-template/policies/admission.yaml")),
    ("policies/gates.yaml", include_str!("../../fleet-repo-template/policies/gates.yaml")),
    ("release.yaml", include_str!("../../fleet-repo-template/release.yaml")),
];

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("{0} exists and is not empty; choose a new or empty directory")]
    NotEmpty(PathBuf),
    #[error("writing {path}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// Writes the template's files under `dir` (which may exist but must be empty).
pub fn write_template(dir: &Path) -> Result<(), TemplateError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TemplateError::Io { path, source }
    };
    if dir.exists() && std::fs::read_dir(dir).map_err(io(dir))?.next().is_some() {
        return Err(TemplateError::NotEmpty(dir.to_path_buf()));
    }
    for (rel, content) in TEMPLATE_FILES {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, content).map_err(io(&path))?;
    }
    Ok(())
}

/// For unit tests: the template's files in a fresh temporary directory (no Git repo).
#[cfg(test)]
pub(crate) fn template_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_template(dir.path()).unwrap();
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_list_is_the_whole_template_folder() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fleet-repo-template");
        let mut on_disk = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    on_disk.push(p.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/"));
                }
            }
        }
        on_disk.sort();
        let listed: Vec<String> = TEMPLATE_FILES.iter().map(|(p, _)| p.to_string()).collect();
        assert_eq!(listed, on_disk, "fleet-repo-template/ and TEMPLATE_FILES disagree");
    }
}
