//! Real operators' manifests exactly as upstream publishes them, for tests that must meet what
//! people really install: `hack/upstream-operators.sh` takes each operator's source module from
//! the Go module proxy and keeps the published files in the cache (never in the repo).

use std::path::PathBuf;

/// An upstream operator at one version, as the script knows it (`argo-cd`, `prometheus-operator`).
#[derive(Debug, Clone, Copy)]
pub struct Upstream {
    pub name: &'static str,
    pub version: &'static str,
    /// The published file, relative to the module root.
    pub file: &'static str,
}

impl Upstream {
    /// Argo CD's `manifests/install.yaml`: ~60 objects without `metadata.namespace` (installed with
    /// `kubectl apply -n argocd`), three images, CRDs of up to 1.5 MB, wildcard ClusterRoles.
    pub const fn argo_cd(version: &'static str) -> Upstream {
        Upstream { name: "argo-cd", version, file: "manifests/install.yaml" }
    }

    /// prometheus-operator's `bundle.yaml`: ten CRDs of up to 1.5 MB in one 4 MB file.
    pub const fn prometheus_operator(version: &'static str) -> Upstream {
        Upstream { name: "prometheus-operator", version, file: "bundle.yaml" }
    }

    /// `name vX.Y.Z`, as test output names it.
    pub fn label(&self) -> String {
        format!("{} {}", self.name, self.version)
    }

    /// The published file in the cache, fetched first if it is not there yet.
    pub fn fetch(&self) -> anyhow::Result<PathBuf> {
        let pin = format!("{}@{}", self.name, self.version);
        let dir = crate::cluster::run_hack_script(
            "upstream-operators.sh",
            &[&pin],
            "set FLEETGATE_REPO to the fleetgate checkout",
        )?;
        Ok(dir.join(self.file))
    }
}
