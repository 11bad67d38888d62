//! Who should run what, as Git says it at one commit: `fleet.yaml` `spec.release` plus per-cluster
//! pins in `clusters/<name>.yaml`. Promotion and rollback are both a [`DesiredChange`] to these
//! files; the edits keep the files' comments and layout (a line edit, checked by re-parsing).

use super::{RelengError, Target};
use crate::model::RepoTree;
use crate::model::{self, CLUSTERS_DIR, ConfigError, FLEET_FILE, FleetConfig, MAX_YAML_BYTES};
use std::collections::BTreeMap;

/// `fleet.yaml` and every `clusters/*.yaml` at one commit: the checked configuration (the same
/// loading `validate` and the agent use) plus the files' text, which edits keep intact.
#[derive(Debug, Clone)]
pub struct FleetState {
    pub config: FleetConfig,
    fleet_text: String,
    /// Cluster name → (path, text).
    cluster_files: BTreeMap<String, (String, String)>,
}

impl FleetState {
    /// Loads the configuration of `tree`; an invalid one is a configuration error listing every
    /// finding (as `fleetgate validate` would).
    pub fn load(tree: &dyn RepoTree) -> Result<FleetState, RelengError> {
        let config = FleetConfig::load(tree).map_err(|e| match e {
            ConfigError::Invalid { .. } => RelengError::Usage(format!(
                "{e}
fix these (`fleetgate validate` shows them) and run again"
            )),
            ConfigError::Read(r) => RelengError::Tree(r),
        })?;
        let text = |path: &str| -> Result<Option<String>, RelengError> { Ok(tree.read_text(path, MAX_YAML_BYTES)?) };
        let fleet_text = text(FLEET_FILE)?.unwrap_or_default();
        let mut cluster_files = BTreeMap::new();
        for name in config.clusters.keys() {
            // Validation ties each cluster's name to its file name.
            for ext in ["yaml", "yml"] {
                let path = format!("{CLUSTERS_DIR}/{name}.{ext}");
                if let Some(t) = text(&path)? {
                    cluster_files.insert(name.clone(), (path, t));
                    break;
                }
            }
        }
        Ok(FleetState { config, fleet_text, cluster_files })
    }

    /// The release cluster `name` should run: its pin, else the fleet's.
    pub fn effective(&self, name: &str) -> Option<&str> {
        self.config.desired_release(name).map(|(r, _)| r)
    }

    /// The fleet-wide release (`fleet.yaml` `spec.release`).
    pub fn fleet_release(&self) -> Option<&str> {
        self.config.fleet.spec.release.as_deref()
    }

    /// Every cluster's desired release (None: nothing to run yet).
    pub fn assignments(&self) -> BTreeMap<String, Option<String>> {
        self.config.clusters.keys().map(|n| (n.clone(), self.effective(n).map(str::to_string))).collect()
    }

    /// Cluster `name`'s wave (named or selected, [`FleetConfig::wave_of`]).
    pub fn wave_of(&self, name: &str) -> &str {
        self.config.wave_of(name).unwrap_or_default()
    }

    /// Position of cluster `name`'s wave (clusters naming an unknown wave sort last).
    pub fn cluster_wave_index(&self, name: &str) -> usize {
        self.config.wave_position(name)
    }

    /// The clusters `target` names, in wave order then name ([`FleetConfig::select`]).
    pub fn select(&self, target: &Target) -> Result<Vec<String>, RelengError> {
        Ok(self.config.select(target)?)
    }

    /// What `change` makes of every cluster's desired release.
    pub fn assignments_after(&self, change: &DesiredChange) -> BTreeMap<String, Option<String>> {
        let fleet = match &change.fleet_release {
            Some(v) => v.clone(),
            None => self.config.fleet.spec.release.clone(),
        };
        self.config
            .clusters
            .iter()
            .map(|(n, c)| {
                let pin = match change.pins.get(n) {
                    Some(v) => v.clone(),
                    None => c.spec.release.clone(),
                };
                (n.clone(), pin.or_else(|| fleet.clone()))
            })
            .collect()
    }

    /// The smallest change that puts every cluster of `want` on its release:
    /// * `fleet_wide = Some(r)`: `fleet.yaml` says `r` and every pin goes (the whole fleet follows);
    /// * otherwise per cluster: nothing when it already runs the release, dropping its pin when the
    ///   fleet's release is the wanted one, else pinning it.
    pub fn plan(&self, want: &BTreeMap<String, String>, fleet_wide: Option<&str>) -> DesiredChange {
        let mut change = DesiredChange::default();
        if let Some(r) = fleet_wide {
            if self.fleet_release() != Some(r) {
                change.fleet_release = Some(Some(r.to_string()));
            }
            for (n, c) in &self.config.clusters {
                if c.spec.release.is_some() {
                    change.pins.insert(n.clone(), None);
                }
            }
            return change;
        }
        for (n, r) in want {
            if self.effective(n) == Some(r.as_str()) {
                continue;
            }
            let pin = if self.fleet_release() == Some(r.as_str()) { None } else { Some(r.clone()) };
            change.pins.insert(n.clone(), pin);
        }
        change
    }

    /// The file contents `change` produces: path → new text, only for files that change.
    pub fn render(&self, change: &DesiredChange) -> Result<BTreeMap<String, String>, RelengError> {
        let mut out = BTreeMap::new();
        if let Some(r) = &change.fleet_release {
            let mut doc = self.config.fleet.clone();
            doc.spec.release = r.clone();
            let value = r.as_deref().map(scalar);
            out.insert(
                FLEET_FILE.to_string(),
                edit_spec(&self.fleet_text, &doc, "release", value.as_deref(), FLEET_FILE)?,
            );
        }
        for (n, pin) in &change.pins {
            let (path, text) = self
                .cluster_files
                .get(n)
                .ok_or_else(|| RelengError::Usage(format!("no file for cluster {n} under {CLUSTERS_DIR}/")))?;
            let mut doc = self.config.clusters[n].clone();
            doc.spec.release = pin.clone();
            let value = pin.as_deref().map(scalar);
            out.insert(path.clone(), edit_spec(text, &doc, "release", value.as_deref(), path)?);
        }
        Ok(out)
    }

    /// The file contents that set `spec.paused` to `paused` in `fleet.yaml` (`clusters` empty) or
    /// in each named cluster's file: path → new text, only for files that change. `false`
    /// removes the key (the default).
    pub fn render_paused(&self, clusters: &[String], paused: bool) -> Result<BTreeMap<String, String>, RelengError> {
        let value = paused.then_some("true");
        let mut out = BTreeMap::new();
        if clusters.is_empty() {
            if self.config.fleet.spec.paused != paused {
                let mut doc = self.config.fleet.clone();
                doc.spec.paused = paused;
                out.insert(FLEET_FILE.to_string(), edit_spec(&self.fleet_text, &doc, "paused", value, FLEET_FILE)?);
            }
            return Ok(out);
        }
        for n in clusters {
            let (path, text) = self
                .cluster_files
                .get(n)
                .ok_or_else(|| RelengError::Usage(format!("no file for cluster {n} under {CLUSTERS_DIR}/")))?;
            if self.config.clusters[n].spec.paused != paused {
                let mut doc = self.config.clusters[n].clone();
                doc.spec.paused = paused;
                out.insert(path.clone(), edit_spec(text, &doc, "paused", value, path)?);
            }
        }
        Ok(out)
    }
}

/// A change to desired releases. `Some(None)` removes a value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredChange {
    pub fleet_release: Option<Option<String>>,
    /// Cluster name → new pin (`None`: drop the pin, follow the fleet).
    pub pins: BTreeMap<String, Option<String>>,
}

impl DesiredChange {
    pub fn is_empty(&self) -> bool {
        self.fleet_release.is_none() && self.pins.is_empty()
    }
}

/// Sets `spec.<key>` to the YAML scalar `value` (or removes it) in a document's text, keeping
/// everything else byte for byte. The result must parse to `expected`; when a line edit cannot
/// guarantee that (flow-style `spec: {…}`, multi-line values), the document is written out whole.
fn edit_spec<S>(
    text: &str,
    expected: &model::Document<S>,
    key: &str,
    value: Option<&str>,
    file: &str,
) -> Result<String, RelengError>
where
    S: serde::Serialize + serde::de::DeserializeOwned + PartialEq,
{
    if let Some(edited) = line_edit(text, key, value) {
        let parsed: Result<model::Document<S>, _> = model::parse_document(file, &edited, &expected.kind);
        if parsed.as_ref().is_ok_and(|d| d == expected) {
            return Ok(edited);
        }
    }
    serde_saphyr::to_string(expected).map_err(|e| RelengError::Usage(format!("{file}: cannot write the document: {e}")))
}

/// The YAML scalar for `value`, quoted when a plain scalar would read as something else.
fn scalar(value: &str) -> String {
    serde_saphyr::to_string(&value).map(|s| s.trim_end().to_string()).unwrap_or_else(|_| format!("{value:?}"))
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_blank_or_comment(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

/// The line-level edit behind [`edit_spec`] (`value` is YAML already); `None` when the layout is
/// not the plain block style it understands.
fn line_edit(text: &str, key: &str, value: Option<&str>) -> Option<String> {
    let field = format!("{key}:");
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let spec = lines.iter().position(|l| {
        let t = l.trim_end();
        t == "spec:" || (t.starts_with("spec:") && t[5..].trim_start().starts_with('#'))
    })?;
    // The block: following lines until the next top-level key or document marker.
    let mut end = lines.len();
    let mut child_indent = None;
    for (i, l) in lines.iter().enumerate().skip(spec + 1) {
        if is_blank_or_comment(l) {
            continue;
        }
        if indent_of(l) == 0 {
            end = i;
            break;
        }
        child_indent.get_or_insert(indent_of(l));
    }
    let indent = child_indent.unwrap_or(2);
    let newline = if text.contains("\r\n") { "\r\n" } else { "\n" };
    let mut found = None;
    for (i, l) in lines.iter().enumerate().take(end).skip(spec + 1) {
        if indent_of(l) == indent && l.trim_start().starts_with(&field) {
            found = Some(i);
            break;
        }
    }
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    match (found, value) {
        (Some(i), _) => {
            // A value continued on more-indented lines is beyond a line edit.
            if let Some(next) = lines.get(i + 1)
                && !is_blank_or_comment(next)
                && indent_of(next) > indent
                && i + 1 < end
            {
                return None;
            }
            let rest = lines[i].trim_start()[field.len()..].trim_end();
            let comment = rest.find(" #").map(|p| rest[p..].to_string()).unwrap_or_default();
            match value {
                Some(v) => out[i] = format!("{}{field} {v}{comment}{newline}", " ".repeat(indent)),
                None => {
                    out.remove(i);
                }
            }
        }
        (None, Some(v)) => {
            let line = format!("{}{field} {v}{newline}", " ".repeat(indent));
            // Next to a commented-out example (`# release: …`, as the template has), else first.
            let example = (spec + 1..end).find(|&i| {
                indent_of(lines[i]) == indent
                    && lines[i].trim_start().trim_start_matches('#').trim_start().starts_with(&field)
            });
            let at = example.unwrap_or(spec);
            if !out[at].ends_with('\n') {
                out[at].push_str(newline);
            }
            out.insert(at + 1, line);
        }
        (None, None) => {}
    }
    Some(out.concat())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Cluster;
    use crate::model::DirTree;
    use rstest::rstest;

    const FLEET: &str = "apiVersion: fleetgate.io/v1alpha1\nkind: Fleet\nmetadata:\n  name: redis\nspec:\n  # operator identity\n  operator: {name: redis-operator, namespace: redis-system}\n  release: rel-1   # fleet-wide\n  waves: [canary, prod]\n";

    fn cluster(name: &str, wave: &str, pin: Option<&str>) -> String {
        let pin = pin.map(|p| format!("  release: {p}\n")).unwrap_or_default();
        format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  wave: {wave}\n{pin}"
        )
    }

    fn write_repo(dir: &std::path::Path, clusters: &[(&str, &str, Option<&str>)], flow: Option<(&str, &str)>) {
        std::fs::create_dir_all(dir.join("clusters")).unwrap();
        std::fs::write(dir.join(FLEET_FILE), FLEET).unwrap();
        for (n, w, p) in clusters {
            std::fs::write(dir.join(format!("clusters/{n}.yaml")), cluster(n, w, *p)).unwrap();
        }
        if let Some((name, text)) = flow {
            std::fs::write(dir.join(format!("clusters/{name}.yaml")), text).unwrap();
        }
    }

    fn state(clusters: &[(&str, &str, Option<&str>)]) -> FleetState {
        let dir = tempfile::tempdir().unwrap();
        write_repo(dir.path(), clusters, None);
        FleetState::load(&DirTree::new(dir.path())).unwrap()
    }

    fn release_edit(text: &str, value: Option<&str>) -> Option<String> {
        line_edit(text, "release", value.map(scalar).as_deref())
    }

    #[test]
    fn pausing_adds_and_resuming_removes_the_key() {
        let st = state(&[("a", "canary", None), ("b", "prod", None)]);
        let fleet = st.render_paused(&[], true).unwrap();
        assert!(fleet[FLEET_FILE].contains("\n  paused: true\n"), "{}", fleet[FLEET_FILE]);
        let one = st.render_paused(&["b".to_string()], true).unwrap();
        assert_eq!(one.keys().collect::<Vec<_>>(), ["clusters/b.yaml"]);
        assert!(one["clusters/b.yaml"].contains("  paused: true\n"));
        // Already as asked: no file changes.
        assert!(st.render_paused(&["a".to_string()], false).unwrap().is_empty());
        let text = one["clusters/b.yaml"].clone();
        let resumed = line_edit(&text, "paused", None).unwrap();
        assert!(!resumed.contains("paused"), "{resumed}");
    }

    #[rstest]
    #[case::replace_keeps_comment(Some("rel-2"), "  release: rel-2 # fleet-wide\n")]
    #[case::quotes_ambiguous(Some("1.0"), "  release: \"1.0\" # fleet-wide\n")]
    fn line_edit_replaces_in_place(#[case] value: Option<&str>, #[case] want_line: &str) {
        let out = release_edit(FLEET, value).unwrap();
        assert!(out.contains(want_line), "{out}");
        assert!(out.contains("  # operator identity\n"), "comments stay: {out}");
        assert_eq!(out.lines().count(), FLEET.lines().count());
    }

    #[test]
    fn line_edit_removes_and_inserts() {
        let removed = release_edit(FLEET, None).unwrap();
        assert!(!removed.contains("release:"), "{removed}");
        let text = cluster("a", "canary", None);
        let inserted = release_edit(&text, Some("rel-3")).unwrap();
        assert_eq!(inserted, text.replace("spec:\n", "spec:\n  release: rel-3\n"));
    }

    #[test]
    fn inserts_next_to_a_commented_example() {
        let text = "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: a\nspec:\n  wave: canary\n  # Pin it:\n  # release: rel-0\nstatus: {}\n";
        let out = release_edit(text, Some("rel-3")).unwrap();
        assert!(out.ends_with("  # release: rel-0\n  release: rel-3\nstatus: {}\n"), "{out}");
    }

    #[test]
    fn flow_style_spec_falls_back_to_rewriting() {
        let text = "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: a}\nspec: {wave: canary}\n";
        assert!(release_edit(text, Some("rel-1")).is_none());
        let dir = tempfile::tempdir().unwrap();
        write_repo(dir.path(), &[], Some(("a", text)));
        let st = FleetState::load(&DirTree::new(dir.path())).unwrap();
        let change = DesiredChange { fleet_release: None, pins: [("a".to_string(), Some("rel-9".to_string()))].into() };
        let out = st.render(&change).unwrap();
        let doc: Cluster = model::parse_document("a", &out["clusters/a.yaml"], "Cluster").unwrap();
        assert_eq!(doc.spec.release.as_deref(), Some("rel-9"));
    }

    #[test]
    fn plan_pins_only_clusters_that_need_it() {
        let st = state(&[("a", "canary", None), ("b", "canary", Some("rel-2")), ("c", "prod", Some("rel-0"))]);
        let want: BTreeMap<_, _> = ["a", "b", "c"].iter().map(|n| (n.to_string(), "rel-2".to_string())).collect();
        let change = st.plan(&want, None);
        assert_eq!(change.fleet_release, None);
        assert_eq!(
            change.pins,
            [("a".to_string(), Some("rel-2".to_string())), ("c".to_string(), Some("rel-2".to_string()))].into()
        );
        // Going back to the fleet's release drops pins instead of pinning.
        let back: BTreeMap<_, _> = [("b".to_string(), "rel-1".to_string())].into();
        assert_eq!(st.plan(&back, None).pins, [("b".to_string(), None)].into());
    }

    #[test]
    fn fleet_wide_plan_sets_fleet_and_drops_every_pin() {
        let st = state(&[("a", "canary", Some("rel-2")), ("b", "prod", None)]);
        let change = st.plan(&BTreeMap::new(), Some("rel-2"));
        assert_eq!(change.fleet_release, Some(Some("rel-2".to_string())));
        assert_eq!(change.pins, [("a".to_string(), None)].into());
        let after = st.assignments_after(&change);
        assert!(after.values().all(|r| r.as_deref() == Some("rel-2")), "{after:?}");
    }

    #[test]
    fn select_orders_by_wave_and_names_unknowns() {
        let st = state(&[("z", "canary", None), ("a", "prod", None), ("m", "canary", None)]);
        assert_eq!(st.select(&Target::Fleet).unwrap(), ["m", "z", "a"]);
        assert_eq!(st.select(&Target::Wave("canary".into())).unwrap(), ["m", "z"]);
        let err = st.select(&Target::Cluster("nope".into())).unwrap_err().to_string();
        assert!(err.contains("a, m, z"), "{err}");
        let err = st.select(&Target::Wave("qa".into())).unwrap_err().to_string();
        assert!(err.contains("canary, prod"), "{err}");
    }
}
