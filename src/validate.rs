//! `fleetgate validate` as a library call: every check a fleet repo's CI should run, over the
//! branch tip and every release tag (or one), collecting **all** findings.
//!
//! * the branch tip's configuration ([`FleetConfig::load`]): schemas, names, waves, policies;
//!   every release a cluster or the fleet asks for exists as a tag and targets those clusters;
//!   no setting names a credential or destination that is the spoke's (a forge, token or
//!   notification URL, a Prometheus URL: [`spoke_setting_findings`], rule `spoke-setting`);
//! * the branch tip's `release.yaml` (the release being prepared): document rules, mapping
//!   consistency, targets that are known clusters, CRD compatibility with the newest release tag
//!   when its id is not tagged yet;
//! * every release tag (a tag whose tree holds `release.yaml`): annotated, self-named, signed by a
//!   trusted key (when keys are given), release id = tag, mapping consistency, and CRD
//!   compatibility with the release tagged before it, and what the agents' admission baseline
//!   narrowed by the tag's own admission policies can decide about its objects without a cluster
//!   ([`admission_findings`], rule `admission`): the same effective policy an agent applies.
//!
//! Findings inside a tag's tree are located as `<tag>:<path>` (what `git show` takes).

use crate::apply::{admission_offline, roles_judged_live};
use crate::gates::crd_compat;
use crate::manifests::admission::AdmissionPolicy;
use crate::manifests::crds_in_files;
use crate::model::error_chain;
use crate::model::{
    ConfigError, Finding, FleetConfig, Location, PromotionMode, RELEASE_FILE, Release, Rule, ordering_findings,
};
use crate::model::{ReleaseAdmissionPolicySpec, RepoTree, TreeError, spoke_setting_findings};
use crate::release::{Keyring, ReleaseContent, UnverifiedRelease, read_release, split_signed_tag, verify_commit};
use crate::source::{Checkout, GitTree, SourceError, TagRef};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// What happened to a release tag's signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum SignatureVerdict {
    /// Signed by this trusted key.
    Valid { signer: String },
    /// Refused; the reason is also a finding.
    Refused { reason: String },
    /// No trusted keys were given.
    NotChecked,
}

/// One release tag and what was found in it.
#[derive(Debug, Clone, Serialize)]
pub struct ReleaseCheck {
    pub id: String,
    pub commit: String,
    pub signature: SignatureVerdict,
    pub findings: Vec<Finding>,
    /// Roles the release's bindings grant that it does not define: the agents judge those
    /// bindings by the rules the cluster has for each role, when they apply.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub roles_judged_live: Vec<String>,
}

/// The branch tip's own `release.yaml`.
#[derive(Debug, Clone, Serialize)]
pub struct TipRelease {
    pub id: String,
    /// True when a tag of that id exists.
    pub tagged: bool,
    pub findings: Vec<Finding>,
}

/// Everything `fleetgate validate` found.
#[derive(Debug, Clone, Serialize)]
pub struct ValidationReport {
    pub branch: String,
    pub commit: String,
    /// Findings about the branch tip's configuration (fleet, clusters, policies, references).
    pub config: Vec<Finding>,
    /// Counts for the summary line, when the configuration loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<ConfigSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tip_release: Option<TipRelease>,
    /// Release tags, oldest first.
    pub releases: Vec<ReleaseCheck>,
    /// False when no trusted keys were given (signatures are then "not checked").
    pub signatures_checked: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConfigSummary {
    pub clusters: usize,
    pub waves: usize,
    pub gate_policies: usize,
    pub admission_policies: usize,
}

impl ValidationReport {
    pub fn findings(&self) -> impl Iterator<Item = &Finding> {
        self.config
            .iter()
            .chain(self.tip_release.iter().flat_map(|t| t.findings.iter()))
            .chain(self.releases.iter().flat_map(|r| r.findings.iter()))
    }

    pub fn is_clean(&self) -> bool {
        self.findings().next().is_none()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error("release {0} has no tag in the repo")]
    NoSuchRelease(String),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Tree(#[from] TreeError),
}

/// Validates the checkout: branch tip plus every release tag, or only `only` (and the tag
/// before it, for CRD compatibility). `keyring` None leaves signatures unchecked. Admission
/// judges by `baseline` (the agents') narrowed by each tag's own policies.
pub fn validate_repo(
    checkout: &Checkout,
    keyring: Option<&Keyring>,
    only: Option<&str>,
    baseline: &ReleaseAdmissionPolicySpec,
) -> Result<ValidationReport, ValidateError> {
    let tip_tree = checkout.tip_tree()?;
    let (config, mut config_findings) = match FleetConfig::load(&tip_tree) {
        Ok(c) => (Some(c), Vec::new()),
        Err(ConfigError::Invalid { findings, .. }) => (None, findings),
        Err(ConfigError::Read(e)) => return Err(e.into()),
    };
    config_findings.extend(spoke_setting_findings(&tip_tree)?);

    // Release tags, oldest first (tagger time, then name).
    let mut tags = Vec::new();
    for tag in checkout.release_tags()? {
        tags.push((checkout.tag_time(&tag)?, tag));
    }
    tags.sort_by(|(ta, a), (tb, b)| ta.cmp(tb).then(a.name.cmp(&b.name)));
    let tags: Vec<TagRef> = tags.into_iter().map(|(_, t)| t).collect();
    let wanted: BTreeSet<usize> = match only {
        None => (0..tags.len()).collect(),
        Some(id) => {
            let i =
                tags.iter().position(|t| t.name == id).ok_or_else(|| ValidateError::NoSuchRelease(id.to_string()))?;
            BTreeSet::from([i])
        }
    };

    let mut releases = Vec::new();
    let mut contents: BTreeMap<usize, ReleaseContent> = BTreeMap::new();
    for &i in &wanted {
        let (check, content) = check_tag(checkout, &tags[i], keyring, baseline)?;
        releases.push(check);
        if let Some(c) = content {
            contents.insert(i, c);
        }
    }
    // CRD compatibility with the release before each checked one.
    for (n, &i) in wanted.iter().enumerate() {
        if i == 0 {
            continue;
        }
        let prev = match contents.get(&(i - 1)) {
            Some(c) => Some(c.clone()),
            None => release_content(checkout, &tags[i - 1])?,
        };
        if let (Some(prev), Some(next)) = (prev, contents.get(&i)) {
            let prefix = format!("{}:", tags[i].name);
            releases[n].findings.extend(crd_findings(&tags[i - 1].name, &prev, next, &prefix));
        }
    }

    // Release order is a property of the whole history: checked on full runs only.
    if only.is_none() {
        let all: BTreeMap<&str, &Release> = contents.values().map(|c| (c.release.name(), &c.release)).collect();
        for (n, &i) in wanted.iter().enumerate() {
            if let Some(c) = contents.get(&i) {
                let file = format!("{}:{RELEASE_FILE}", tags[i].name);
                releases[n].findings.extend(ordering_findings(&c.release, &all, &file));
            }
        }
    }

    let tip_release =
        if only.is_none() { check_tip_release(checkout, &tip_tree, config.as_ref(), &tags)? } else { None };

    if let Some(c) = &config {
        config_findings.extend(reference_findings(checkout, c, &tip_tree)?);
        config_findings.extend(status_key_findings(c, &tip_tree));
        config_findings.extend(c.membership_findings());
        if let Some(k) = keyring
            && c.fleet.spec.promotions == PromotionMode::Signed
            && let Err(e) = verify_commit(checkout, checkout.tip(), k)
        {
            config_findings.push(Finding::in_file(
                Rule::Signature,
                "fleet.yaml",
                format!("promotions are signed, but {}", error_chain(&e)),
            ));
        }
    }
    let summary = config.as_ref().map(|c| ConfigSummary {
        clusters: c.clusters.len(),
        waves: c.fleet.spec.waves.len(),
        gate_policies: c.gate_policies.len(),
        admission_policies: c.admission_policies.len(),
    });
    Ok(ValidationReport {
        branch: checkout.branch().to_string(),
        commit: checkout.tip().to_string(),
        config: config_findings,
        summary,
        tip_release,
        releases,
        signatures_checked: keyring.is_some(),
    })
}

/// Prefixes the file of every finding with `prefix` (`rel-1:`).
fn located(prefix: &str, findings: Vec<Finding>) -> Vec<Finding> {
    findings
        .into_iter()
        .map(|mut f| {
            f.at.file = format!("{prefix}{}", f.at.file);
            f
        })
        .collect()
}

fn release_content(checkout: &Checkout, tag: &TagRef) -> Result<Option<ReleaseContent>, ValidateError> {
    let tree = checkout.tag_tree(tag)?;
    Ok(read_release(&tree, Some(&tag.name))?.0)
}

fn check_tag(
    checkout: &Checkout,
    tag: &TagRef,
    keyring: Option<&Keyring>,
    baseline: &ReleaseAdmissionPolicySpec,
) -> Result<(ReleaseCheck, Option<ReleaseContent>), ValidateError> {
    let at = Location::file(&format!("refs/tags/{}", tag.name));
    let mut findings = Vec::new();
    let signature = match tag.object {
        None => {
            let reason = "a lightweight tag; releases must be annotated, signed tags (git tag -s)".to_string();
            findings.push(Finding::new(Rule::Signature, at.clone(), reason.clone()));
            SignatureVerdict::Refused { reason }
        }
        Some(object) => {
            let name = checkout.tag_object_name(object)?;
            if name != tag.name {
                findings.push(Finding::new(
                    Rule::ReleaseId,
                    at.clone(),
                    format!("the tag object is named {name:?}; a signed tag cannot be reused under another name"),
                ));
            }
            match keyring {
                None => SignatureVerdict::NotChecked,
                Some(k) => {
                    let raw = checkout.raw_object(object)?;
                    match split_signed_tag(&raw).and_then(|(payload, sig)| k.verify_detached(payload, sig)) {
                        Ok(signer) => SignatureVerdict::Valid { signer },
                        Err(p) => {
                            findings.push(Finding::new(Rule::Signature, at.clone(), p.to_string()));
                            SignatureVerdict::Refused { reason: p.to_string() }
                        }
                    }
                }
            }
        }
    };
    let tree = checkout.tag_tree(tag)?;
    let (content, content_findings) = read_release(&tree, Some(&tag.name))?;
    findings.extend(located(&format!("{}:", tag.name), content_findings));
    if let Some(c) = &content {
        findings.extend(located(&format!("{}:", tag.name), admission_findings(&tree, &tag.name, c, baseline)));
    }
    let roles_judged_live = content
        .as_ref()
        .and_then(|c| roles_judged_live(&UnverifiedRelease::new(&tag.name, c.clone())).ok())
        .unwrap_or_default();
    let check =
        ReleaseCheck { id: tag.name.clone(), commit: tag.commit.to_string(), signature, findings, roles_judged_live };
    Ok((check, content))
}

/// [`admission_offline`] of a release tag: `baseline` narrowed by the policies of the tag's own
/// tree, as findings. Unreadable manifests and configuration are reported by the other checks.
fn admission_findings(
    tree: &dyn RepoTree,
    id: &str,
    content: &ReleaseContent,
    baseline: &ReleaseAdmissionPolicySpec,
) -> Vec<Finding> {
    let Ok(config) = FleetConfig::load(tree) else { return Vec::new() };
    let release = UnverifiedRelease::new(id, content.clone());
    let policy = AdmissionPolicy::effective(baseline.clone(), &config.admission_policies);
    let Ok(Err(refused)) = admission_offline(&policy, &release) else {
        return Vec::new();
    };
    // One finding per object and rule, naming every policy that refuses it.
    refused
        .by_object()
        .into_iter()
        .flat_map(|o| {
            o.rules.into_iter().map(move |r| {
                let message = format!("{}: {} — refused by {}", o.object, r.reason, r.policies.join(", "));
                Finding::in_file(Rule::Admission, &o.source.file, message)
            })
        })
        .collect()
}

fn check_tip_release(
    checkout: &Checkout,
    tip_tree: &GitTree<'_>,
    config: Option<&FleetConfig>,
    tags: &[TagRef],
) -> Result<Option<TipRelease>, ValidateError> {
    if tip_tree.entry(RELEASE_FILE)?.is_none() {
        return Ok(None);
    }
    let (content, mut findings) = read_release(tip_tree, None)?;
    let Some(content) = content else {
        return Ok(Some(TipRelease { id: String::new(), tagged: false, findings }));
    };
    let id = content.release.name().to_string();
    let tagged = tags.iter().any(|t| t.name == id);
    if let Some(c) = config {
        for target in &content.release.spec.target_clusters {
            if c.cluster(target).is_none() {
                findings.push(Finding::in_file(
                    Rule::Reference,
                    RELEASE_FILE,
                    format!("targetClusters names {target}, which has no clusters/{target}.yaml"),
                ));
            }
        }
    }
    if !tagged && let Some(newest) = tags.last() {
        // The release being prepared, against the newest release: what the fleet would see next.
        if let Some(prev) = release_content(checkout, newest)? {
            findings.extend(crd_findings(&newest.name, &prev, &content, ""));
        }
    }
    Ok(Some(TipRelease { id, tagged, findings }))
}

/// A `statusKey` that is not an OpenSSH Ed25519 public key registers nothing: that cluster's
/// statuses would all read as unverified and never open a wave.
fn status_key_findings(config: &FleetConfig, tip_tree: &dyn RepoTree) -> Vec<Finding> {
    use crate::model::{CLUSTERS_DIR, MAX_YAML_BYTES};
    let mut out = Vec::new();
    for (name, cluster) in &config.clusters {
        let Some(key) = &cluster.spec.status_key else { continue };
        if let Err(e) = crate::status::StatusKey::parse(key) {
            let file = format!("{CLUSTERS_DIR}/{name}.yaml");
            let text = tip_tree.read_text(&file, MAX_YAML_BYTES).ok().flatten().unwrap_or_default();
            out.push(Finding::at_key(Rule::Schema, &file, &text, "statusKey", format!("statusKey: {e}")));
        }
    }
    out
}

/// Every release the configuration asks for exists as a tag and targets the clusters asking.
fn reference_findings(
    checkout: &Checkout,
    config: &FleetConfig,
    tip_tree: &GitTree<'_>,
) -> Result<Vec<Finding>, ValidateError> {
    use crate::model::{CLUSTERS_DIR, FLEET_FILE, MAX_YAML_BYTES};
    let mut out = Vec::new();
    let mut askers: BTreeMap<&str, Vec<(&str, String)>> = BTreeMap::new();
    for name in config.clusters.keys() {
        if let Some((id, origin)) = config.desired_release(name) {
            let file = match origin {
                crate::model::ReleaseOrigin::ClusterPin => format!("{CLUSTERS_DIR}/{name}.yaml"),
                _ => FLEET_FILE.to_string(),
            };
            askers.entry(id).or_default().push((name.as_str(), file));
        }
    }
    if let Some(id) = &config.fleet.spec.release {
        askers.entry(id.as_str()).or_default();
    }
    for (id, clusters) in askers {
        let text_of = |file: &str| tip_tree.read_text(file, MAX_YAML_BYTES).ok().flatten().unwrap_or_default();
        let Some(tag) = checkout.tag(id)? else {
            let file = clusters.first().map_or(FLEET_FILE.to_string(), |(_, f)| f.clone());
            out.push(Finding::at_key(
                Rule::Reference,
                &file,
                &text_of(&file),
                "release",
                format!("release {id} has no tag; push the signed tag before promoting it"),
            ));
            continue;
        };
        let Some(content) = release_content(checkout, &tag)? else { continue };
        for (cluster, file) in clusters {
            if !content.release.spec.target_clusters.iter().any(|t| t == cluster) {
                out.push(Finding::at_key(
                    Rule::Reference,
                    &file,
                    &text_of(&file),
                    "release",
                    format!("cluster {cluster} is asked to run {id}, but {id} does not target it (targetClusters)"),
                ));
            }
        }
    }
    Ok(out)
}

/// CRD compatibility of release `next` against release `prev_id`, with the breaking changes
/// `next` accepts; findings located in the new CRD's file (prefixed with `prefix`).
fn crd_findings(prev_id: &str, prev: &ReleaseContent, next: &ReleaseContent, prefix: &str) -> Vec<Finding> {
    let next_files = &next.files;
    let at = format!("{prefix}{}", prev.release.spec.manifests);
    let accept = match crd_compat::Acceptance::parse_all(&next.release.spec.accept_crd_changes) {
        Ok(accept) => accept,
        Err(why) => return vec![Finding::in_file(Rule::CrdCompatibility, &format!("{prefix}{RELEASE_FILE}"), why)],
    };
    let (old, new) = match (crds_in_files(&prev.files), crds_in_files(next_files)) {
        (Ok(old), Ok(new)) => (old, new),
        // An unreadable CRD of the new release is a finding of its own; of the old one, a reason
        // why the comparison could not be made.
        (_, Err(e)) => return vec![Finding::in_file(Rule::CrdCompatibility, &at, error_chain(&e))],
        (Err(e), _) => {
            return vec![Finding::in_file(
                Rule::CrdCompatibility,
                &at,
                format!("against {prev_id}: {}", error_chain(&e)),
            )];
        }
    };
    let old: Vec<CustomResourceDefinition> = old.into_iter().map(|c| c.crd).collect();
    let new: Vec<(String, CustomResourceDefinition)> = new.into_iter().map(|c| (c.file, c.crd)).collect();
    let new_crds: Vec<CustomResourceDefinition> = new.iter().map(|(_, c)| c.clone()).collect();
    crd_compat::check_all_with(&old, &new_crds, &accept)
        .into_iter()
        .filter(crd_compat::Finding::blocks)
        .map(|f| {
            let message = format!("against {prev_id}: {f}");
            let Some((path, _)) = new.iter().find(|(_, c)| c.metadata.name.as_deref() == Some(f.crd.as_str())) else {
                return Finding::in_file(Rule::CrdCompatibility, &at, message);
            };
            // Point at the version the finding is about, else at the CRD's name.
            let text = String::from_utf8_lossy(&next_files[path]);
            let needle = f.version.as_ref().map_or_else(|| f.crd.clone(), |v| format!("name: {v}"));
            let mut at = Location::of_text(path, &text, &needle);
            at.file = format!("{prefix}{path}");
            Finding::new(Rule::CrdCompatibility, at, message)
        })
        .collect()
}
