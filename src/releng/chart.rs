//! Rendering a Helm chart into a release's manifests (`fleetgate release create --chart`).
//!
//! The agent never runs Helm: the pipeline renders, and the rendered output is what is signed and
//! applied. This module owns that rendering step: finding `helm` (`FLEETGATE_HELM`, else `PATH`),
//! reading the chart's identity (`helm show chart`, which reads a folder and a `.tgz` alike),
//! `helm template` with CRDs included, a fixed release name and namespace and, when the release
//! names one, the Kubernetes version, and the split of Helm's one output stream into one file per
//! template source path — so the same chart and values always give a byte-identical tree.
//!
//! The values digest covers every values file and `--set` value in the order given (Helm merges
//! them in that order, so order is part of what was rendered).

use crate::model::{ChartSource, Requirements, parse_version_range, safe_relative_path};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The environment variable naming the `helm` binary; without it, `helm` is looked up on `PATH`.
pub const HELM_ENV: &str = "FLEETGATE_HELM";

/// What to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChartInput {
    /// A chart folder (with `Chart.yaml`) or a packaged chart (`.tgz`).
    pub chart: PathBuf,
    /// Values files (`--values`), merged in order.
    pub values: Vec<PathBuf>,
    /// `KEY=VALUE` overrides (`--set`), applied in order after the files.
    pub set: Vec<String>,
}

/// Where and for which cluster version the chart is rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderTarget {
    /// Helm's release name (`.Release.Name`): the fleet's `spec.operator.name`.
    pub release_name: String,
    /// `.Release.Namespace`: the fleet's `spec.operator.namespace`.
    pub namespace: String,
    /// `--kube-version` (`.Capabilities.KubeVersion`), when the release requires one.
    pub kube_version: Option<String>,
}

/// A rendered chart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// Chart name, version and values digest, for `release.yaml` `spec.chart`.
    pub source: ChartSource,
    /// Template source path inside the chart (`crds/widgets.yaml`, `templates/deployment.yaml`)
    /// → that source's rendered documents.
    pub files: BTreeMap<String, Vec<u8>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error(
        "helm not found ({looked}); install helm (https://helm.sh/docs/intro/install/) or set {HELM_ENV} to its path"
    )]
    HelmNotFound { looked: String },
    #[error("running {helm}")]
    Run { helm: String, source: std::io::Error },
    #[error("helm could not render {chart}:\n{stderr}")]
    Render { chart: String, stderr: String },
    #[error("bad Chart.yaml in {chart}: {reason}")]
    BadChart { chart: String, reason: String },
    #[error("reading values file {path}")]
    Values { path: String, source: std::io::Error },
    #[error("--set {0:?}: expected KEY=VALUE")]
    BadSet(String),
    #[error("helm's output for {chart} cannot be taken as manifests: {reason}")]
    Output { chart: String, reason: String },
}

/// The `helm` binary to run: `$FLEETGATE_HELM`, else the first `helm` on `PATH`.
pub fn find_helm() -> Result<PathBuf, ChartError> {
    if let Some(p) = std::env::var_os(HELM_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(ChartError::HelmNotFound { looked: format!("{HELM_ENV}={} is not a file", p.display()) })
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("helm"))
        .find(|p| is_executable(p))
        .ok_or_else(|| ChartError::HelmNotFound { looked: format!("{HELM_ENV} is unset and PATH has no helm") })
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

/// `--kube-version` for a release's requirements: the version named by the range's lower bound
/// (`>=1.28` → `v1.28.0`), so templates that branch on `.Capabilities.KubeVersion` render for the
/// oldest cluster the release claims to support. No range, or one without a lower bound: `None`
/// (Helm's default).
pub fn kube_version(requires: Option<&Requirements>) -> Option<String> {
    use semver::Op;
    let range = parse_version_range(requires?.kubernetes.as_deref()?).ok()?;
    range
        .comparators
        .iter()
        .filter(|c| matches!(c.op, Op::GreaterEq | Op::Greater | Op::Exact | Op::Tilde | Op::Caret | Op::Wildcard))
        .map(|c| (c.major, c.minor.unwrap_or(0), c.patch.unwrap_or(0)))
        .max()
        .map(|(major, minor, patch)| format!("v{major}.{minor}.{patch}"))
}

/// `sha256:<hex>` over the values, in order: each file as `file\0<len>\0<bytes>`, each `--set` as
/// `set\0<len>\0<text>`. Lengths keep one input's bytes from passing for two; file names are left
/// out, so moving a values file does not change what was rendered.
pub fn values_digest(input: &ChartInput) -> Result<String, ChartError> {
    let mut h = Sha256::new();
    for path in &input.values {
        let bytes =
            std::fs::read(path).map_err(|source| ChartError::Values { path: path.display().to_string(), source })?;
        h.update(format!("file\0{}\0", bytes.len()));
        h.update(&bytes);
    }
    for s in &input.set {
        h.update(format!("set\0{}\0", s.len()));
        h.update(s.as_bytes());
    }
    Ok(format!("sha256:{}", hex(&h.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Renders `input` for `target` with the `helm` at `helm`.
pub fn render(helm: &Path, input: &ChartInput, target: &RenderTarget) -> Result<Rendered, ChartError> {
    let chart = input.chart.display().to_string();
    if let Some(bad) = input.set.iter().find(|s| !s.contains('=')) {
        return Err(ChartError::BadSet(bad.clone()));
    }
    let values_digest = values_digest(input)?;
    let (name, version) = chart_identity(helm, &input.chart)?;

    let mut cmd = Command::new(helm);
    cmd.arg("template").arg(&target.release_name).arg(&input.chart).args([
        "--namespace",
        &target.namespace,
        "--include-crds",
    ]);
    if let Some(v) = &target.kube_version {
        cmd.args(["--kube-version", v]);
    }
    for f in &input.values {
        cmd.arg("--values").arg(f);
    }
    for s in &input.set {
        cmd.args(["--set", s]);
    }
    let stdout = run(helm, &mut cmd, &chart)?;
    let files =
        split_by_source(&stdout, &name).map_err(|reason| ChartError::Output { chart: chart.clone(), reason })?;
    Ok(Rendered { source: ChartSource { name, version, values_digest }, files })
}

/// Runs `cmd`; its stdout on success, else helm's stderr as the error.
fn run(helm: &Path, cmd: &mut Command, chart: &str) -> Result<String, ChartError> {
    let out = cmd.output().map_err(|source| ChartError::Run { helm: helm.display().to_string(), source })?;
    if !out.status.success() {
        return Err(ChartError::Render {
            chart: chart.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim_end().to_string(),
        });
    }
    String::from_utf8(out.stdout)
        .map_err(|_| ChartError::Output { chart: chart.to_string(), reason: "it is not UTF-8".into() })
}

/// Name and version from the chart's Chart.yaml, as Helm reads it (`helm show chart` handles a
/// folder and a packaged chart alike).
fn chart_identity(helm: &Path, chart: &Path) -> Result<(String, String), ChartError> {
    let shown = chart.display().to_string();
    let bad = |reason: String| ChartError::BadChart { chart: shown.clone(), reason };
    let mut cmd = Command::new(helm);
    cmd.args(["show", "chart"]).arg(chart);
    let text = match run(helm, &mut cmd, &shown) {
        Ok(t) => t,
        Err(ChartError::Render { stderr, .. }) => return Err(bad(stderr)),
        Err(e) => return Err(e),
    };
    #[derive(serde::Deserialize)]
    struct ChartYaml {
        name: Option<String>,
        version: Option<String>,
    }
    let meta: ChartYaml = crate::model::parse_yaml("Chart.yaml", &text).map_err(|e| bad(e.to_string()))?;
    let name = meta.name.filter(|n| !n.is_empty()).ok_or_else(|| bad("no name".into()))?;
    let version = meta.version.filter(|v| !v.is_empty()).ok_or_else(|| bad("no version".into()))?;
    if semver::Version::parse(&version).is_err() {
        return Err(bad(format!("version {version:?} is not semantic versioning (Helm requires it)")));
    }
    Ok((name, version))
}

/// Splits `helm template` output at its `# Source: <chart>/<path>` comments into one file per
/// source path (without the chart name); documents of one source are joined with `---` in
/// Helm's order. Every path must be a safe relative path.
fn split_by_source(stdout: &str, chart: &str) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut docs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for doc in split_documents(stdout) {
        let mut lines = doc.lines();
        let Some(source) = lines.find_map(|l| l.strip_prefix("# Source: ")) else {
            if doc.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#')) {
                continue;
            }
            return Err(format!(
                "a document has no `# Source:` line:\n{}",
                doc.lines().take(5).collect::<Vec<_>>().join("\n")
            ));
        };
        let rel = source
            .trim()
            .strip_prefix(chart)
            .and_then(|s| s.strip_prefix('/'))
            .ok_or_else(|| format!("source {source:?} is not inside chart {chart}"))?;
        let rel = safe_relative_path(rel).map_err(|e| format!("source {source:?}: {e}"))?;
        docs.entry(rel).or_default().push(doc.trim_end().to_string());
    }
    if docs.is_empty() {
        return Err("the chart rendered no documents".into());
    }
    Ok(docs.into_iter().map(|(path, ds)| (path, format!("{}\n", ds.join("\n---\n")).into_bytes())).collect())
}

/// The documents of a YAML stream, split at `---` lines (Helm writes each document after one).
fn split_documents(stream: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut pos = 0;
    for line in stream.split_inclusive('\n') {
        if line.trim_end() == "---" || line.starts_with("--- ") {
            out.push(&stream[start..pos]);
            start = pos + line.len();
        }
        pos += line.len();
    }
    out.push(&stream[start..]);
    out.into_iter().filter(|d| !d.trim().is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(">=1.28", Some("v1.28.0"))]
    #[case(">=1.28, <1.33", Some("v1.28.0"))]
    #[case("~1.30.2", Some("v1.30.2"))]
    #[case("<1.33", None)]
    #[case("not a range", None)]
    fn the_kube_version_is_the_ranges_lower_bound(#[case] range: &str, #[case] want: Option<&str>) {
        let req = Requirements { kubernetes: Some(range.into()), architectures: Vec::new() };
        assert_eq!(kube_version(Some(&req)).as_deref(), want);
    }

    #[test]
    fn no_requirement_leaves_helms_default() {
        assert_eq!(kube_version(None), None);
        assert_eq!(kube_version(Some(&Requirements::default())), None);
    }

    const OUTPUT: &str = "---\n# Source: op/crds/b.yaml\napiVersion: v1\nkind: B\n---\n# Source: op/crds/a.yaml\nkind: A\n\
                          ---\n# Source: op/templates/rbac.yaml\nkind: Role\n---\n# Source: op/templates/rbac.yaml\n\
                          kind: RoleBinding\n";

    #[test]
    fn output_splits_into_one_sorted_file_per_source() {
        let files = split_by_source(OUTPUT, "op").unwrap();
        let got: Vec<(&str, String)> =
            files.iter().map(|(p, b)| (p.as_str(), String::from_utf8(b.clone()).unwrap())).collect();
        assert_eq!(
            got,
            [
                ("crds/a.yaml", "# Source: op/crds/a.yaml\nkind: A\n".to_string()),
                ("crds/b.yaml", "# Source: op/crds/b.yaml\napiVersion: v1\nkind: B\n".to_string()),
                (
                    "templates/rbac.yaml",
                    "# Source: op/templates/rbac.yaml\nkind: Role\n---\n# Source: op/templates/rbac.yaml\nkind: RoleBinding\n"
                        .to_string()
                ),
            ]
        );
    }

    #[rstest]
    #[case::outside_the_chart("---\n# Source: other/templates/x.yaml\nkind: X\n", "not inside chart")]
    #[case::escaping("---\n# Source: op/../x.yaml\nkind: X\n", "op/../x.yaml")]
    #[case::unlabelled("---\nkind: X\n", "no `# Source:`")]
    #[case::empty("---\n# just a comment\n", "no documents")]
    fn unusable_output_is_refused(#[case] out: &str, #[case] needle: &str) {
        let err = split_by_source(out, "op").unwrap_err();
        assert!(err.contains(needle), "{err}");
    }

    #[test]
    fn the_values_digest_follows_content_and_order() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
        std::fs::write(&a, "x: 1\n").unwrap();
        std::fs::write(&b, "x: 2\n").unwrap();
        let input = |values: Vec<PathBuf>, set: &[&str]| ChartInput {
            chart: PathBuf::from("chart"),
            values,
            set: set.iter().map(|s| s.to_string()).collect(),
        };
        let ab = values_digest(&input(vec![a.clone(), b.clone()], &["y=1"])).unwrap();
        assert!(ab.starts_with("sha256:") && ab.len() == 7 + 64, "{ab}");
        assert_eq!(ab, values_digest(&input(vec![a.clone(), b.clone()], &["y=1"])).unwrap());
        assert_ne!(ab, values_digest(&input(vec![b.clone(), a.clone()], &["y=1"])).unwrap(), "order counts");
        assert_ne!(ab, values_digest(&input(vec![a.clone(), b.clone()], &["y=2"])).unwrap());
        assert_ne!(
            values_digest(&input(vec![], &["a=1", "b=2"])).unwrap(),
            values_digest(&input(vec![], &["a=1b=2"])).unwrap(),
            "lengths separate inputs"
        );
        let missing = values_digest(&input(vec![dir.path().join("nope.yaml")], &[])).unwrap_err();
        assert!(matches!(missing, ChartError::Values { .. }), "{missing}");
    }
}
