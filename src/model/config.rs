//! [`FleetConfig`]: the whole configuration one commit of a fleet repo carries — `fleet.yaml`,
//! `clusters/*.yaml`, `policies/*.yaml` — loaded from any [`RepoTree`] and checked as a whole
//! (every document parses, names are valid and match their files, every cluster's wave exists).
//! Loading reports every finding at once; a config with any finding is not returned.

use super::{
    Cluster, ClusterIdentity, ClusterSpec, DEFAULT_ENDPOINT, DocumentHead, Finding, Fleet, FleetSpec, GatePolicy,
    GatePolicySpec, Location, MAX_YAML_BYTES, Placed, Placement, RELEASE_ADMISSION_POLICY_KIND, ReleaseAdmissionPolicy,
    ReleaseAdmissionPolicySpec, Rule, SpokeRef, assign, check_cluster, check_fleet, join_findings, parse_document,
    parse_yaml,
};
use super::{EntryKind, RepoTree, TreeError};
use serde::Serialize;
use std::collections::BTreeMap;

pub const FLEET_FILE: &str = "fleet.yaml";
pub const CLUSTERS_DIR: &str = "clusters";
const POLICIES_DIR: &str = "policies";
pub const RELEASE_FILE: &str = "release.yaml";
/// Entries a folder of documents (`clusters/`, `policies/`) may hold: each file is read and
/// parsed on every pass, and whoever can push decides how many there are.
const MAX_FOLDER_ENTRIES: usize = 2000;
/// The document kind of [`GatePolicy`].
const GATE_POLICY_KIND: &str = "GatePolicy";

/// A commit's fleet configuration, every document valid and every reference resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetConfig {
    pub fleet: Fleet,
    /// By cluster name.
    pub clusters: BTreeMap<String, Cluster>,
    pub gate_policies: Vec<GatePolicy>,
    pub admission_policies: Vec<ReleaseAdmissionPolicy>,
    /// Admission policy name → its file under `policies/`: where a person would change it.
    pub admission_policy_files: BTreeMap<String, String>,
}

/// Which document of the fleet repo pauses a cluster ([`FleetConfig::paused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PausedBy {
    /// `fleet.yaml` `spec.paused`.
    Fleet,
    /// `clusters/<name>.yaml` `spec.paused`.
    Cluster,
}

impl PausedBy {
    /// The setting, as a person would look for it.
    pub fn setting(self, cluster: &str) -> String {
        match self {
            PausedBy::Fleet => format!("{FLEET_FILE} spec.paused"),
            PausedBy::Cluster => format!("{CLUSTERS_DIR}/{cluster}.yaml spec.paused"),
        }
    }
}

/// Where a cluster's desired release id comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReleaseOrigin {
    /// `clusters/<name>.yaml` `spec.release`.
    ClusterPin,
    /// `fleet.yaml` `spec.release`.
    Fleet,
    /// Named by the caller: a rollback target, a release given on the command line.
    Requested,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("the fleet configuration in {tree} has {} problem(s):\n{}", findings.len(), join_findings(findings))]
    Invalid { tree: String, findings: Vec<Finding> },
    #[error(transparent)]
    Read(#[from] TreeError),
}

impl ConfigError {
    /// Every finding (empty for a read failure).
    pub fn findings(&self) -> &[Finding] {
        match self {
            ConfigError::Invalid { findings, .. } => findings,
            ConfigError::Read(_) => &[],
        }
    }
}

impl FleetConfig {
    /// Loads and checks the configuration in `tree`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] with every finding; [`ConfigError::Read`] when the tree itself
    /// cannot be read (a Git or I/O failure, worth retrying).
    pub fn load(tree: &dyn RepoTree) -> Result<FleetConfig, ConfigError> {
        let mut findings = Vec::new();
        let fleet = load_fleet(tree, &mut findings)?;
        let clusters = load_clusters(tree, fleet.as_ref(), &mut findings)?;
        let (gate_policies, admission) = load_policies(tree, &mut findings)?;
        let admission_policy_files = admission.iter().map(|(path, p)| (p.name().to_string(), path.clone())).collect();
        let admission_policies = admission.into_iter().map(|(_, p)| p).collect();
        match fleet {
            Some(fleet) if findings.is_empty() => {
                Ok(FleetConfig { fleet, clusters, gate_policies, admission_policies, admission_policy_files })
            }
            _ => Err(ConfigError::Invalid { tree: tree.describe(), findings }),
        }
    }

    pub fn cluster(&self, name: &str) -> Option<&Cluster> {
        self.clusters.get(name)
    }

    /// The desired release id of `cluster`: its own pin, else the fleet's. None when neither is
    /// set (or the cluster is unknown).
    pub fn desired_release(&self, cluster: &str) -> Option<(&str, ReleaseOrigin)> {
        let c = self.clusters.get(cluster)?;
        match (&c.spec.release, &self.fleet.spec.release) {
            (Some(r), _) => Some((r, ReleaseOrigin::ClusterPin)),
            (None, Some(r)) => Some((r, ReleaseOrigin::Fleet)),
            (None, None) => None,
        }
    }

    /// Why Git holds `cluster` where it is, when it does: `fleet.yaml` `spec.paused` (the whole
    /// fleet) or its own `clusters/<name>.yaml` `spec.paused`.
    pub fn paused(&self, cluster: &str) -> Option<PausedBy> {
        if self.fleet.spec.paused {
            return Some(PausedBy::Fleet);
        }
        self.clusters.get(cluster).filter(|c| c.spec.paused).map(|_| PausedBy::Cluster)
    }

    /// `name` (the agent's own cluster name) as this configuration describes it, for gate
    /// selectors: with its wave ([`Self::wave_of`]) and the `metadata.labels` of
    /// `clusters/<name>.yaml` when there is one.
    pub fn cluster_identity<'a>(&'a self, name: &'a str) -> ClusterIdentity<'a> {
        let c = self.clusters.get(name);
        ClusterIdentity { name, wave: self.wave_of(name), labels: c.map(|c| &c.metadata.labels) }
    }

    /// Every cluster's wave ([`assign`]: named, selected, else the last), by cluster name.
    pub fn placements(&self) -> BTreeMap<String, Placement> {
        let ids: Vec<ClusterIdentity<'_>> = self
            .clusters
            .values()
            .map(|c| ClusterIdentity { name: c.name(), wave: c.spec.wave.as_deref(), labels: Some(&c.metadata.labels) })
            .collect();
        assign(self.fleet.name(), &self.fleet.spec.waves, &ids)
    }

    /// The wave `cluster` is in; None for a cluster this configuration does not describe.
    pub fn wave_of(&self, cluster: &str) -> Option<&str> {
        let at = self.placements().get(cluster)?.wave;
        Some(self.fleet.spec.waves[at].name.as_str())
    }

    /// The gate policy `cluster` runs: the first policy (in file order) whose `select` matches
    /// it, keeping only the gates whose own `select` matches; None when no policy selects it.
    /// Called on the configuration the policies are trusted from, so the wave and labels are
    /// that tree's too.
    pub fn gate_policy_for(&self, cluster: &str) -> Option<GatePolicySpec> {
        let identity = self.cluster_identity(cluster);
        self.gate_policies.iter().find(|p| p.spec.selects(&identity)).map(|p| p.spec.for_cluster(&identity))
    }

    /// Position of `cluster`'s wave in the rollout order.
    pub fn wave_index(&self, cluster: &str) -> Option<usize> {
        self.placements().get(cluster).map(|p| p.wave)
    }

    /// Clusters of `wave`, by name.
    pub fn clusters_in_wave(&self, wave: &str) -> Vec<&Cluster> {
        let Some((at, _)) = self.fleet.spec.wave(wave) else { return Vec::new() };
        let placements = self.placements();
        self.clusters.values().filter(|c| placements.get(c.name()).is_some_and(|p| p.wave == at)).collect()
    }

    /// Clusters whose wave is probably not what was meant ([`Rule::Wave`]): in no wave (so with
    /// the last), or naming one wave in `spec.wave` while another's selector matches them too.
    /// Not load errors: agents place such clusters by the documented rules.
    pub fn membership_findings(&self) -> Vec<Finding> {
        let waves = &self.fleet.spec.waves;
        let mut out = Vec::new();
        for (name, placed) in self.placements() {
            let file = format!("{CLUSTERS_DIR}/{name}.yaml");
            let wave = &waves[placed.wave].name;
            let labels = self.clusters.get(&name).map(|c| &c.metadata.labels);
            let identity = ClusterIdentity { name: &name, wave: None, labels };
            let message = match placed.by {
                Placed::Unmatched => format!(
                    "cluster {name} is in no wave: it names none (spec.wave) and no wave's selector matches it; \
                     it rolls out with the last wave, {wave}"
                ),
                Placed::Named => {
                    let also: Vec<&str> = waves
                        .iter()
                        .filter(|w| w.name != *wave && w.selector.as_ref().is_some_and(|s| s.matches(&identity)))
                        .map(|w| w.name.as_str())
                        .collect();
                    if also.is_empty() {
                        continue;
                    }
                    format!(
                        "cluster {name} names wave {wave} (spec.wave), but the selector of wave {} matches it too; \
                         it is in {wave}: remove spec.wave or change its labels",
                        also.join(", ")
                    )
                }
                Placed::Selected => continue,
            };
            out.push(Finding::in_file(Rule::Wave, &file, message));
        }
        out
    }

    /// Every release id the configuration asks for (fleet-wide and pins), deduplicated.
    pub fn referenced_releases(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = self
            .fleet
            .spec
            .release
            .iter()
            .chain(self.clusters.values().filter_map(|c| c.spec.release.as_ref()))
            .map(String::as_str)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// A setting in the repo that names a credential or a network destination — the old forms of
/// `fleet.yaml` `spec.status.forge` / `notify` and of a GatePolicy's `prometheus` — which only the
/// spoke may configure. Agents ignore it (and say so in a Warning Event); `fleetgate validate`
/// reports it with its line ([`spoke_setting_findings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpokeSetting {
    /// The document's file, when known (`fleet.yaml`); a policy is named in `message`.
    pub document: String,
    /// The key that holds it, to locate its line.
    pub key: &'static str,
    /// What is ignored and where the setting belongs now. Never the value: a webhook URL is a
    /// secret, and this text goes into Events.
    pub message: String,
}

impl FleetSpec {
    /// The settings of `fleet.yaml` that belong to the spoke (see [`SpokeSetting`]).
    pub fn spoke_settings(&self) -> Vec<SpokeSetting> {
        let status = &self.status;
        let mut out = Vec::new();
        if status.forge.as_ref().is_some_and(SpokeRef::is_legacy) {
            out.push(SpokeSetting {
                document: FLEET_FILE.to_string(),
                key: "forge",
                message: "spec.status.forge names a forge URL, repository or token, which is ignored: the forge is \
                          the agent's configuration (--forge-kind, --forge-url, --forge-repository, \
                          --forge-token-file; `forge:` in its config file) and `fleetgate promote --open-pr`'s \
                          flags; here only `forge: true` or `forge: false`"
                    .to_string(),
            });
        }
        if let Some(n) = &status.notify
            && n.name().is_none()
        {
            out.push(SpokeSetting {
                document: FLEET_FILE.to_string(),
                key: "notify",
                message: format!(
                    "spec.status.notify is not an endpoint name, so it is ignored and `{DEFAULT_ENDPOINT}` is used: \
                     notification URLs are the agent's configuration (--notify-url NAME=URL); here only a \
                     name such as `notify: oncall`"
                ),
            });
        }
        out
    }
}

impl GatePolicy {
    /// The settings of this policy that belong to the spoke (see [`SpokeSetting`]).
    pub fn spoke_settings(&self, file: &str) -> Vec<SpokeSetting> {
        match &self.spec.prometheus {
            Some(p) if p.name().is_none() => vec![SpokeSetting {
                document: file.to_string(),
                key: "prometheus",
                message: format!(
                    "GatePolicy {}: spec.prometheus names a URL, which is ignored and `{DEFAULT_ENDPOINT}` is used: \
                     Prometheus endpoints are the agent's configuration (--prometheus NAME=URL); here only a \
                     name such as `prometheus: {DEFAULT_ENDPOINT}`",
                    self.name()
                ),
            }],
            _ => Vec::new(),
        }
    }
}

impl FleetConfig {
    /// Every setting of this configuration that belongs to the spoke and is therefore ignored.
    pub fn spoke_settings(&self) -> Vec<SpokeSetting> {
        let mut out = self.fleet.spec.spoke_settings();
        out.extend(self.gate_policies.iter().flat_map(|p| p.spoke_settings(POLICIES_DIR)));
        out
    }
}

/// [`SpokeSetting`]s of the configuration in `tree` as findings (rule `spoke-setting`) at their
/// file and line. Documents that do not parse are skipped: [`FleetConfig::load`] reports them.
pub fn spoke_setting_findings(tree: &dyn RepoTree) -> Result<Vec<Finding>, TreeError> {
    let mut out = Vec::new();
    let mut ignored = Vec::new();
    let mut push = |settings: Vec<SpokeSetting>, text: &str| {
        out.extend(
            settings.into_iter().map(|s| Finding::at_key(Rule::SpokeSetting, &s.document, text, s.key, s.message)),
        )
    };
    if let Some(text) = read(tree, FLEET_FILE, &mut ignored)?
        && let Ok(fleet) = parse_document::<FleetSpec>(FLEET_FILE, &text, "Fleet")
    {
        push(fleet.spec.spoke_settings(), &text);
    }
    for path in yaml_files(tree, POLICIES_DIR, &mut ignored)? {
        let Some(text) = read(tree, &path, &mut ignored)? else { continue };
        if let Ok(policy) = parse_document::<GatePolicySpec>(&path, &text, GATE_POLICY_KIND) {
            push(policy.spoke_settings(&path), &text);
        }
    }
    Ok(out)
}

/// Reads `path` as text; content problems become findings, read failures errors.
fn read(tree: &dyn RepoTree, path: &str, findings: &mut Vec<Finding>) -> Result<Option<String>, TreeError> {
    match tree.read_text(path, MAX_YAML_BYTES) {
        Ok(t) => Ok(t),
        Err(e) => {
            findings.push(e.into_finding()?);
            Ok(None)
        }
    }
}

fn load_fleet(tree: &dyn RepoTree, findings: &mut Vec<Finding>) -> Result<Option<Fleet>, TreeError> {
    let Some(text) = read(tree, FLEET_FILE, findings)? else {
        if !findings.iter().any(|f| f.at.file == FLEET_FILE) {
            findings.push(Finding::in_file(
                Rule::Schema,
                FLEET_FILE,
                format!(
                    "{} has no fleet.yaml; is this a fleet repo? (`fleetgate init DIR` creates one)",
                    tree.describe()
                ),
            ));
        }
        return Ok(None);
    };
    match parse_document::<FleetSpec>(FLEET_FILE, &text, "Fleet") {
        Ok(fleet) => {
            findings.extend(check_fleet(&fleet, FLEET_FILE, &text));
            Ok(Some(fleet))
        }
        Err(e) => {
            findings.push(e.into());
            Ok(None)
        }
    }
}

/// The YAML files of a folder (`*.yaml`, `*.yml`); subfolders and links are findings, other files
/// (a README) are ignored.
fn yaml_files(tree: &dyn RepoTree, dir: &str, findings: &mut Vec<Finding>) -> Result<Vec<String>, TreeError> {
    let Some(entries) = tree.list(dir)? else { return Ok(Vec::new()) };
    if entries.len() > MAX_FOLDER_ENTRIES {
        findings.push(Finding::in_file(
            Rule::Limit,
            dir,
            format!(
                "{dir}/ holds {} entries, over the limit of {MAX_FOLDER_ENTRIES}; none of them was read",
                entries.len()
            ),
        ));
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for e in entries {
        let path = format!("{dir}/{}", e.name);
        let yaml = e.name.ends_with(".yaml") || e.name.ends_with(".yml");
        match e.kind {
            EntryKind::File if yaml => out.push(path),
            EntryKind::File => {}
            _ => findings.push(Finding::in_file(
                Rule::Schema,
                &path,
                format!("{dir}/ holds only YAML files; {path} is not one (links and subfolders are not read)"),
            )),
        }
    }
    Ok(out)
}

fn load_clusters(
    tree: &dyn RepoTree,
    fleet: Option<&Fleet>,
    findings: &mut Vec<Finding>,
) -> Result<BTreeMap<String, Cluster>, TreeError> {
    let mut clusters: BTreeMap<String, Cluster> = BTreeMap::new();
    for path in yaml_files(tree, CLUSTERS_DIR, findings)? {
        let Some(text) = read(tree, &path, findings)? else { continue };
        let cluster = match parse_document::<ClusterSpec>(&path, &text, "Cluster") {
            Ok(c) => c,
            Err(e) => {
                findings.push(e.into());
                continue;
            }
        };
        findings.extend(check_cluster(&cluster, &path, &text));
        if let (Some(f), Some(wave)) = (fleet, &cluster.spec.wave)
            && f.spec.wave(wave).is_none()
        {
            findings.push(Finding::at_key(
                Rule::Reference,
                &path,
                &text,
                "wave",
                format!("wave {wave:?} is not one of fleet.yaml spec.waves [{}]", f.spec.wave_names().join(", ")),
            ));
        }
        if clusters.contains_key(cluster.name()) {
            findings.push(Finding::at_key(
                Rule::Duplicate,
                &path,
                &text,
                "name",
                format!("cluster {:?} is defined twice", cluster.name()),
            ));
            continue;
        }
        clusters.insert(cluster.name().to_string(), cluster);
    }
    Ok(clusters)
}

/// An admission policy and the path of its file.
type PolicyInFile = (String, ReleaseAdmissionPolicy);

fn load_policies(
    tree: &dyn RepoTree,
    findings: &mut Vec<Finding>,
) -> Result<(Vec<GatePolicy>, Vec<PolicyInFile>), TreeError> {
    let (mut gates, mut admission) = (Vec::new(), Vec::new());
    for path in yaml_files(tree, POLICIES_DIR, findings)? {
        let Some(text) = read(tree, &path, findings)? else { continue };
        let kind = match parse_yaml::<DocumentHead>(&path, &text) {
            Ok(h) => h.kind,
            Err(e) => {
                findings.push(e.into());
                continue;
            }
        };
        if kind == GATE_POLICY_KIND {
            match parse_document::<GatePolicySpec>(&path, &text, GATE_POLICY_KIND) {
                Ok(p) => {
                    if let Err(problems) = p.spec.validate() {
                        findings.extend(
                            problems
                                .into_iter()
                                .map(|pr| Finding::new(Rule::Schema, Location::file(&path), pr.to_string())),
                        );
                    }
                    gates.push(p);
                }
                Err(e) => findings.push(e.into()),
            }
        } else if kind == RELEASE_ADMISSION_POLICY_KIND {
            match parse_document::<ReleaseAdmissionPolicySpec>(&path, &text, RELEASE_ADMISSION_POLICY_KIND) {
                Ok(p) => admission.push((path.clone(), p)),
                Err(e) => findings.push(e.into()),
            }
        } else {
            findings.push(Finding::at_key(
                Rule::Schema,
                &path,
                &text,
                "kind",
                format!("policies/ holds {GATE_POLICY_KIND} and {RELEASE_ADMISSION_POLICY_KIND} documents, not kind {kind:?}"),
            ));
        }
    }
    Ok((gates, admission))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DirTree, rendezvous, template_dir};
    use rstest::rstest;

    #[test]
    fn the_template_loads_clean() {
        let dir = template_dir();
        let config = FleetConfig::load(&DirTree::new(dir.path())).unwrap();
        assert_eq!(config.fleet.spec.wave_names(), ["canary", "wave-1", "wave-2"]);
        let waves: Vec<usize> = config.clusters.keys().map(|c| config.wave_index(c).unwrap()).collect();
        assert_eq!(waves, [0, 1, 2]);
        assert_eq!(config.gate_policies.len(), 1);
        assert_eq!(config.admission_policies.len(), 1);
        assert_eq!(config.desired_release("cluster-a"), None);
        assert!(config.referenced_releases().is_empty());
    }

    #[test]
    fn each_cluster_runs_the_first_policy_that_selects_it() {
        let dir = template_dir();
        let policy = |name: &str, select: &str, bake: &str| {
            format!(
                "apiVersion: fleetgate.io/v1alpha1\nkind: GatePolicy\nmetadata: {{name: {name}}}\nspec:\n  bakeTime: {bake}\n  interval: 1s\n{select}  gates:\n    - name: restarts\n      podRestarts: {{max: 3}}\n    - name: prod-only\n      select: {{matchLabels: {{env: production}}}}\n      podRestarts: {{max: 0}}\n"
            )
        };
        std::fs::remove_file(dir.path().join("policies/gates.yaml")).unwrap();
        std::fs::write(
            dir.path().join("policies/a-canary.yaml"),
            policy("canary", "  select: {waves: [canary]}\n", "1m"),
        )
        .unwrap();
        std::fs::write(dir.path().join("policies/b-rest.yaml"), policy("rest", "", "30m")).unwrap();
        let config = FleetConfig::load(&DirTree::new(dir.path())).unwrap();
        let got = |c: &str| {
            let p = config.gate_policy_for(c).unwrap();
            (p.bake_time.as_secs(), p.gates.into_iter().map(|g| g.name).collect::<Vec<_>>())
        };
        assert_eq!(got("cluster-a"), (60, vec!["restarts".to_string()]));
        // cluster-b is labelled env: production in the template.
        assert_eq!(got("cluster-b"), (1800, vec!["restarts".to_string(), "prod-only".to_string()]));
        // A cluster this tree does not describe gets only what selects it by nothing or by name.
        assert_eq!(got("cluster-z"), (1800, vec!["restarts".to_string()]));
    }

    #[test]
    fn a_folder_of_too_many_files_is_refused_unread() {
        let dir = template_dir();
        for i in 0..=MAX_FOLDER_ENTRIES {
            std::fs::write(dir.path().join(format!("clusters/junk-{i}.yaml")), "not: read").unwrap();
        }
        let err = FleetConfig::load(&DirTree::new(dir.path())).unwrap_err();
        let limits: Vec<&Finding> = err.findings().iter().filter(|f| f.rule == Rule::Limit).collect();
        assert_eq!(limits.len(), 1, "{err}");
        assert!(limits[0].message.contains("clusters/ holds 2004 entries, over the limit of 2000"), "{err}");
    }

    #[test]
    fn pins_override_the_fleet_release() {
        let dir = template_dir();
        let fleet = dir.path().join("fleet.yaml");
        let text = std::fs::read_to_string(&fleet).unwrap().replace("# release: rel-20250315-001", "release: rel-1");
        std::fs::write(&fleet, text).unwrap();
        std::fs::write(dir.path().join("clusters/cluster-a.yaml"), "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {name: cluster-a}\nspec: {wave: canary, release: rel-2}\n").unwrap();
        let config = FleetConfig::load(&DirTree::new(dir.path())).unwrap();
        assert_eq!(config.desired_release("cluster-a"), Some(("rel-2", ReleaseOrigin::ClusterPin)));
        assert_eq!(config.desired_release("cluster-b"), Some(("rel-1", ReleaseOrigin::Fleet)));
        assert_eq!(config.desired_release("nope"), None);
        assert_eq!(config.referenced_releases(), ["rel-1", "rel-2"]);
    }

    #[rstest]
    #[case::unknown_wave("clusters/cluster-b.yaml", "wave: wave-1", "wave: wave-9", vec![(Rule::Reference, Some(10))])]
    #[case::name_not_file("clusters/cluster-b.yaml", "name: cluster-b", "name: cluster-x", vec![(Rule::Naming, Some(5))])]
    #[case::duplicate_name("clusters/cluster-b.yaml", "name: cluster-b", "name: cluster-a", vec![(Rule::Naming, Some(5)), (Rule::Duplicate, Some(5))])]
    #[case::fleet_typo("fleet.yaml", "  rollout:", "  rolout:", vec![(Rule::Schema, Some(39))])]
    #[case::duplicate_wave("fleet.yaml", "[canary, wave-1, wave-2]", "[canary, wave-1, wave-1]", vec![(Rule::Duplicate, Some(25)), (Rule::Reference, Some(10))])]
    #[case::gate_typo("policies/gates.yaml", "bakeTime: 10m", "bakeTim: 10m", vec![(Rule::Schema, Some(11))])]
    #[case::gate_unusable("policies/gates.yaml", "interval: 15s", "interval: 1h", vec![(Rule::Schema, None)])]
    #[case::admission_typo("policies/admission.yaml", "allowedNamespaces", "allowedNamespace", vec![(Rule::Schema, Some(9))])]
    #[case::wrong_kind_in_policies("policies/admission.yaml", "kind: ReleaseAdmissionPolicy", "kind: NetworkPolicy", vec![(Rule::Schema, Some(4))])]
    fn broken_configs(
        #[case] file: &str,
        #[case] from: &str,
        #[case] to: &str,
        #[case] expected: Vec<(Rule, Option<u32>)>,
    ) {
        let dir = template_dir();
        let path = dir.path().join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{file} lacks {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        let err = FleetConfig::load(&DirTree::new(dir.path())).unwrap_err();
        let got: Vec<(Rule, Option<u32>)> = err.findings().iter().map(|f| (f.rule, f.at.line)).collect();
        assert_eq!(got, expected, "{err}");
        assert!(err.findings().iter().all(|f| f.at.file == file || expected.len() > 1), "{err}");
    }

    #[test]
    fn settings_that_belong_to_the_spoke_still_load_and_are_found_at_their_line() {
        let dir = template_dir();
        let edit = |file: &str, from: &str, to: &str| {
            let path = dir.path().join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(text.contains(from), "{file} lacks {from:?}");
            std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        };
        edit(
            FLEET_FILE,
            "    forge: true\n",
            "    forge:\n      kind: gitea\n      url: http://127.0.0.1:1\n      repository: o/r\n      tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
        );
        edit(FLEET_FILE, "notify: default", "notify: https://hooks.slack.com/services/T/B/secret");
        edit("policies/gates.yaml", "  prometheus: default\n", "  prometheus:\n    url: http://127.0.0.1:1\n");
        let tree = DirTree::new(dir.path());
        let config = FleetConfig::load(&tree).expect("old forms still load");
        assert_eq!(
            config.spoke_settings().iter().map(|s| s.key).collect::<Vec<_>>(),
            ["forge", "notify", "prometheus"]
        );
        assert!(config.fleet.spec.status.forge_enabled());
        assert_eq!(config.fleet.spec.status.notify_endpoint(), DEFAULT_ENDPOINT);
        assert_eq!(config.gate_policies[0].spec.prometheus_endpoint(), DEFAULT_ENDPOINT);

        let findings = spoke_setting_findings(&tree).unwrap();
        let fleet_text = std::fs::read_to_string(dir.path().join(FLEET_FILE)).unwrap();
        let line_of = |text: &str, needle: &str| text.lines().position(|l| l.contains(needle)).map(|i| i as u32 + 1);
        let gates_text = std::fs::read_to_string(dir.path().join("policies/gates.yaml")).unwrap();
        let got: Vec<(Rule, &str, Option<u32>)> =
            findings.iter().map(|f| (f.rule, f.at.file.as_str(), f.at.line)).collect();
        assert_eq!(
            got,
            [
                (Rule::SpokeSetting, FLEET_FILE, line_of(&fleet_text, "forge:")),
                (Rule::SpokeSetting, FLEET_FILE, line_of(&fleet_text, "notify:")),
                (Rule::SpokeSetting, "policies/gates.yaml", line_of(&gates_text, "  prometheus:")),
            ]
        );
        assert!(findings[0].message.contains("--forge-url"), "{}", findings[0]);
        assert!(findings[1].message.contains("--notify-url NAME=URL"), "{}", findings[1]);
        assert!(findings[2].message.contains("--prometheus NAME=URL"), "{}", findings[2]);
        // The values are never repeated: a webhook URL is a secret, and these messages go to Events.
        assert!(findings.iter().all(|f| !f.message.contains("secret") && !f.message.contains("127.0.0.1")));
    }

    #[test]
    fn the_template_names_no_destination() {
        assert_eq!(spoke_setting_findings(&DirTree::new(template_dir().path())).unwrap(), []);
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let dir = template_dir();
        std::fs::remove_file(dir.path().join("fleet.yaml")).unwrap();
        std::fs::write(dir.path().join("clusters/bad.yaml"), "kind: [").unwrap();
        std::fs::create_dir(dir.path().join("clusters/old")).unwrap();
        let err = FleetConfig::load(&DirTree::new(dir.path())).unwrap_err();
        let files: Vec<&str> = err.findings().iter().map(|f| f.at.file.as_str()).collect();
        assert_eq!(files, ["fleet.yaml", "clusters/old", "clusters/bad.yaml"], "{err}");
    }

    /// The template with `waves` replaced and cluster-b and cluster-c no longer naming a wave.
    fn selector_waves(waves: &str) -> tempfile::TempDir {
        let dir = template_dir();
        let fleet = dir.path().join(FLEET_FILE);
        let text = std::fs::read_to_string(&fleet).unwrap().replace("  waves: [canary, wave-1, wave-2]\n", waves);
        std::fs::write(&fleet, text).unwrap();
        for c in ["cluster-b", "cluster-c"] {
            let path = dir.path().join(format!("{CLUSTERS_DIR}/{c}.yaml"));
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::write(
                &path,
                text.replace("spec:\n  wave: wave-1\n", "spec: {}\n").replace("spec:\n  wave: wave-2\n", "spec: {}\n"),
            )
            .unwrap();
        }
        dir
    }

    #[test]
    fn waves_select_by_labels_and_percent() {
        let dir = selector_waves(
            "  waves:\n    - canary\n    - name: prod-half\n      selector: {matchLabels: {env: production}}\n      percent: 50\n      maxUnavailable: 1\n      soak: 10m\n      windows: [{days: [Mon-Fri], start: '09:00', end: '17:00'}]\n    - prod-rest\n",
        );
        let config = FleetConfig::load(&DirTree::new(dir.path())).unwrap();
        let half = &config.fleet.spec.waves[1];
        assert_eq!(
            half.summary().unwrap(),
            "env=production, 50 %; maxUnavailable 1; soak 10m; Mon-Fri 09:00-17:00 UTC"
        );
        let waves: Vec<Option<&str>> =
            ["cluster-a", "cluster-b", "cluster-c"].iter().map(|c| config.wave_of(c)).collect();
        // Of the two production clusters one is chosen; the other matches nothing else: the last wave.
        let chosen = if rendezvous("redis-fleet", "prod-half", "cluster-b")
            > rendezvous("redis-fleet", "prod-half", "cluster-c")
        {
            1
        } else {
            2
        };
        let mut expected = vec![Some("canary"), Some("prod-rest"), Some("prod-rest")];
        expected[chosen] = Some("prod-half");
        assert_eq!(waves, expected);
        assert_eq!(config.cluster_identity("cluster-b").wave, expected[1]);
        assert_eq!(config.clusters_in_wave("prod-half").len(), 1);
        let findings = config.membership_findings();
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0].rule, Rule::Wave);
        assert!(
            findings[0].message.contains("is in no wave") && findings[0].message.contains("the last wave, prod-rest"),
            "{}",
            findings[0]
        );
    }

    #[test]
    fn a_cluster_naming_one_wave_and_selected_by_another_is_reported() {
        let dir = selector_waves(
            "  waves:\n    - name: canary\n      selector: {matchLabels: {env: staging}}\n    - name: prod\n      selector: {matchLabels: {env: production}}\n",
        );
        let path = dir.path().join("clusters/cluster-b.yaml");
        let text = std::fs::read_to_string(&path).unwrap().replace("spec: {}", "spec: {wave: canary}");
        std::fs::write(&path, text).unwrap();
        let config = FleetConfig::load(&DirTree::new(dir.path())).unwrap();
        assert_eq!(config.wave_of("cluster-b"), Some("canary"), "spec.wave wins");
        let messages: Vec<String> = config.membership_findings().into_iter().map(|f| f.message).collect();
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(
            messages[0].contains("names wave canary (spec.wave), but the selector of wave prod matches it too"),
            "{}",
            messages[0]
        );
    }

    #[rstest]
    #[case::percent_zero("percent: 0", "percent must be 1 to 100, not 0")]
    #[case::max_unavailable_zero("maxUnavailable: 0", "maxUnavailable must be at least 1")]
    #[case::waves_in_selector(
        "selector: {waves: [canary]}",
        "a wave's selector takes labels or cluster names, not waves"
    )]
    #[case::typo("soke: 1m", "spec.waves[1]: unknown field `soke`")]
    #[case::bad_window("windows: [{start: '25:00', end: '17:00'}]", "\"25:00\" is not a time of day")]
    fn bad_wave_definitions_are_findings(#[case] field: &str, #[case] expected: &str) {
        let dir = selector_waves(&format!("  waves:\n    - canary\n    - name: prod\n      {field}\n"));
        let err = FleetConfig::load(&DirTree::new(dir.path())).unwrap_err();
        assert!(err.findings().iter().any(|f| f.message.contains(expected)), "{err}");
    }
}
