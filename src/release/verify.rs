//! Verification: from a [`DesiredRelease`] to a [`VerifiedRelease`], or a specific refusal.
//!
//! In order, stopping at the first failure:
//! 1. the tag is annotated (a lightweight tag carries no signature) and names itself `id`;
//! 2. the tag still points where it pointed when first verified ([`TagPins`]);
//! 3. the tag's signature verifies with a trusted key (every signature, fully valid);
//!    the pin is recorded now, on first sight of a good signature;
//! 4. `release.yaml` and the manifests are read from the **tag's tree**, the release names the
//!    expected fleet, targets the cluster, and the mapping agrees with the manifests (every
//!    finding reported at once).
//!
//! Whether the branch tip may choose this release at all (promotion mode, downgrades,
//! revocations) is [`super::promotion`]'s and [`super::history`]'s concern.

use super::VerifiedRelease;
use super::mapping::{ManifestFiles, check_mapping, check_variant_crds, read_manifests};
use super::pins::{PinError, TagPins};
use super::resolve::DesiredRelease;
use super::trust::{Keyring, SignatureProblem, split_signed_tag};
use crate::model::{
    Document, ErrorClass, FLEET_FILE, Finding, FleetConfig, FleetSpec, MAX_YAML_BYTES, NoVariant, RELEASE_FILE,
    Release, check_release, join_findings, parse_document, parse_release,
};
use crate::model::{RepoTree, TreeError};
use crate::source::{Checkout, SourceError, short};
use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("tag {tag} is a lightweight tag; releases must be annotated, signed tags (git tag -s)")]
    Lightweight { tag: String },
    #[error(
        "ref refs/tags/{tag} points to a tag object named {object_name:?}; a signed tag cannot be reused under another name"
    )]
    TagNameMismatch { tag: String, object_name: String },
    #[error(
        "tag {tag} moved: first verified at commit {pinned}, now points to {now}; a release id names one content forever"
    )]
    MovedTag { tag: String, pinned: String, now: String },
    #[error("tag {tag} is not signed; sign release tags with a trusted key (git tag -s)")]
    Unsigned { tag: String },
    #[error("tag {tag} is signed in {format} format; fleetgate verifies OpenPGP and SSH signatures only")]
    UnsupportedSignature { tag: String, format: String },
    #[error("tag {tag} is signed by key {fingerprint}, which is not among the trusted keys")]
    UntrustedKey { tag: String, fingerprint: String },
    #[error("tag {tag} has a bad signature: {detail}")]
    BadSignature { tag: String, detail: String },
    #[error("tag {tag}: {problem}")]
    InvalidSignature { tag: String, problem: SignatureProblem },
    #[error("the branch tip {commit} must be signed by a trusted key: {problem}")]
    CommitSignature { commit: String, problem: SignatureProblem },
    #[error(
        "release {release} belongs to fleet {}, not {expected}; a tag signed for another fleet cannot run here",
        found.as_deref().unwrap_or("(none named)")
    )]
    OtherFleet { release: String, found: Option<String>, expected: String },
    #[error(
        "release {release} is revoked by the signed release {by}; promote a newer release (fleetgate promote), revoked releases never run again"
    )]
    Revoked { release: String, by: String },
    #[error(
        "release {release} (sequence {}) is older than {newest} (sequence {newest_sequence}), the newest release this cluster ran successfully; moving back needs a signed decision: promote {newest}'s rollbackTo, cut a newer release, or sign the promotion commit with a promotion key (fleetgate promote --sign-key)",
        sequence.map_or_else(|| "none".to_string(), |s| s.to_string())
    )]
    Downgrade { release: String, sequence: Option<u64>, newest: String, newest_sequence: u64 },
    #[error("release {release} does not target cluster {cluster} (targetClusters: {})", targets.join(", "))]
    NotTargeted { release: String, cluster: String, targets: Vec<String> },
    #[error("release {release} at {commit} is inconsistent:\n{}", join_findings(findings))]
    MappingMismatch { release: String, commit: String, findings: Vec<Finding> },
    #[error("release {release} has no variant for this cluster")]
    NoVariant { release: String, source: NoVariant },
    #[error("the fleet configuration in release {release}'s signed tree is invalid")]
    SignedConfig { release: String, source: crate::model::ConfigError },
    #[error(transparent)]
    Pins(#[from] PinError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Tree(#[from] TreeError),
}

impl VerifyError {
    /// Stalling (wait for Git to change) for everything about the content, its signatures and
    /// targeting; retryable for failures to read the repo, store pins or run gpg.
    pub fn class(&self) -> ErrorClass {
        match self {
            VerifyError::Source(e) => e.class(),
            VerifyError::Tree(_) | VerifyError::Pins(_) => ErrorClass::Retryable,
            VerifyError::SignedConfig { source: crate::model::ConfigError::Read(_), .. } => ErrorClass::Retryable,
            VerifyError::InvalidSignature { problem, .. } | VerifyError::CommitSignature { problem, .. } => {
                problem.class()
            }
            _ => ErrorClass::Stalling,
        }
    }

    fn tag_signature(tag: &str, problem: SignatureProblem) -> VerifyError {
        let tag = tag.to_string();
        match problem {
            SignatureProblem::Missing => VerifyError::Unsigned { tag },
            SignatureProblem::UnsupportedFormat { format } => VerifyError::UnsupportedSignature { tag, format },
            SignatureProblem::UntrustedKey { fingerprint } => VerifyError::UntrustedKey { tag, fingerprint },
            SignatureProblem::Bad { detail } => VerifyError::BadSignature { tag, detail },
            problem => VerifyError::InvalidSignature { tag, problem },
        }
    }
}

/// A release's `release.yaml` and manifest files as read from one tree.
#[derive(Debug, Clone, PartialEq)]
pub struct ReleaseContent {
    pub release: Release,
    /// Manifest files of the base rendering (`spec.manifests`), path relative to the repo root → bytes.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Manifest files of each variant (`spec.variants`), by variant name.
    pub variants: BTreeMap<String, ManifestFiles>,
}

/// Reads `release.yaml` and its manifests from `tree` and checks them (document rules and the
/// mapping; `tag` is the tag the tree belongs to, None for an untagged commit). Returns the
/// content when `release.yaml` could be read at all, and every finding. Errors only when the
/// tree itself cannot be read.
pub fn read_release(
    tree: &dyn RepoTree,
    tag: Option<&str>,
) -> Result<(Option<ReleaseContent>, Vec<Finding>), TreeError> {
    let mut findings = Vec::new();
    let text = match tree.read_text(RELEASE_FILE, MAX_YAML_BYTES) {
        Ok(Some(t)) => t,
        Ok(None) => {
            findings.push(Finding::in_file(
                crate::model::Rule::Schema,
                RELEASE_FILE,
                format!("{} has no {RELEASE_FILE}; a release commit carries its mapping there", tree.describe()),
            ));
            return Ok((None, findings));
        }
        Err(e) => {
            findings.push(e.into_finding()?);
            return Ok((None, findings));
        }
    };
    // Releases in the seed's ConfigMap form take their image repository from the same commit's
    // fleet.yaml; problems of that file are reported by the configuration check, not here.
    let fleet = tree
        .read_text(FLEET_FILE, MAX_YAML_BYTES)
        .ok()
        .flatten()
        .and_then(|t| parse_document::<FleetSpec>(FLEET_FILE, &t, "Fleet").ok());
    let default_repository = fleet.as_ref().and_then(|f| f.spec.operator.image.as_deref());
    let release = match parse_release(RELEASE_FILE, &text, default_repository) {
        Ok(r) => r,
        Err(e) => {
            findings.push(e.into());
            return Ok((None, findings));
        }
    };
    findings.extend(check_release(&release, RELEASE_FILE, &text));
    if let (Some(fleet), Some(named)) = (&fleet, &release.spec.fleet)
        && fleet.name() != named
    {
        findings.push(Finding::new(
            crate::model::Rule::Fleet,
            crate::model::Location::of_path(RELEASE_FILE, &text, &["spec", "fleet"]),
            format!(
                "release.yaml names fleet {named:?}, but fleet.yaml of the same commit is fleet {:?}",
                fleet.name()
            ),
        ));
    }
    let (files, read_findings) = read_manifests(tree, &release.spec.manifests)?;
    findings.extend(read_findings);
    findings.extend(check_mapping(tag, &release, RELEASE_FILE, &text, &files));
    let mut variants = BTreeMap::new();
    for variant in &release.spec.variants {
        // Each variant is a whole rendering: its mapping is checked like the base's.
        let rendering = Document { spec: release.spec.for_variant(variant), ..release.clone() };
        let (variant_files, read_findings) = read_manifests(tree, &variant.manifests)?;
        let variant_findings =
            read_findings.into_iter().chain(check_mapping(None, &rendering, RELEASE_FILE, &text, &variant_files));
        let named = |f: Finding| Finding { message: format!("variant {}: {}", variant.name, f.message), ..f };
        findings.extend(variant_findings.map(named));
        findings.extend(check_variant_crds(&release.spec.manifests, &files, &variant.name, &variant_files));
        variants.insert(variant.name.clone(), variant_files);
    }
    Ok((Some(ReleaseContent { release, files, variants }), findings))
}

/// Verifies `desired` for its cluster: its tag signed by a key of `trust`, naming `fleet`. See the
/// module documentation for the order of checks. `fleet` None takes the name in the branch tip's
/// `fleet.yaml` — what a command run by a person uses; an agent passes the name it pinned (or was
/// given with `--fleet`), so a pusher cannot rename the fleet to fit a foreign tag.
///
/// # Errors
/// A specific [`VerifyError`] per refusal; [`VerifyError::class`] says whether retrying helps.
pub fn verify(
    checkout: &Checkout,
    desired: &DesiredRelease,
    trust: &Keyring,
    fleet: Option<&str>,
    pins: &mut TagPins,
) -> Result<VerifiedRelease, VerifyError> {
    let tag = &desired.tag;
    let id = &desired.id;
    let Some(object) = tag.object else {
        return Err(VerifyError::Lightweight { tag: id.clone() });
    };
    let object_name = checkout.tag_object_name(object)?;
    if object_name != *id {
        return Err(VerifyError::TagNameMismatch { tag: id.clone(), object_name });
    }
    let commit = tag.commit.to_string();
    if let Some(pinned) = pins.get(id)
        && pinned != commit
    {
        return Err(VerifyError::MovedTag { tag: id.clone(), pinned: pinned.to_string(), now: commit });
    }
    let signer = verify_tag_signature(checkout, id, object, trust)?;
    pins.pin(id, &commit)?;

    let tree = checkout.tag_tree(tag)?;
    let (content, findings) = read_release(&tree, Some(id))?;
    let mapping_error =
        |findings| VerifyError::MappingMismatch { release: id.clone(), commit: short(tag.commit), findings };
    let Some(content) = content else { return Err(mapping_error(findings)) };
    let expected = fleet.unwrap_or(desired.config.fleet.name());
    if content.release.spec.fleet.as_deref() != Some(expected) {
        return Err(VerifyError::OtherFleet {
            release: id.clone(),
            found: content.release.spec.fleet.clone(),
            expected: expected.to_string(),
        });
    }
    let targets = &content.release.spec.target_clusters;
    if !targets.contains(&desired.cluster) {
        return Err(VerifyError::NotTargeted {
            release: id.clone(),
            cluster: desired.cluster.clone(),
            targets: targets.clone(),
        });
    }
    if !findings.is_empty() {
        return Err(mapping_error(findings));
    }
    Ok(VerifiedRelease::new(id.clone(), commit, Some(signer), content))
}

/// Checks the signature of tag object `object` (named `id`); returns the signer's fingerprint.
pub fn verify_tag_signature(
    checkout: &Checkout,
    id: &str,
    object: git2::Oid,
    keyring: &Keyring,
) -> Result<String, VerifyError> {
    let (_, signer) = tag_signer(checkout, object, keyring)?;
    signer.map_err(|p| VerifyError::tag_signature(id, p))
}

/// The signed text of tag object `object` (header and message, without the signature) and the
/// fingerprint of the `keyring` key that signed it, or why no such key did. Errors only when the
/// object cannot be read.
pub fn tag_signer(
    checkout: &Checkout,
    object: git2::Oid,
    keyring: &Keyring,
) -> Result<(String, Result<String, SignatureProblem>), SourceError> {
    let raw = checkout.raw_object(object)?;
    Ok(match split_signed_tag(&raw) {
        Ok((payload, signature)) => {
            (String::from_utf8_lossy(payload).into_owned(), keyring.verify_detached(payload, signature))
        }
        Err(problem) => (String::from_utf8_lossy(&raw).into_owned(), Err(problem)),
    })
}

/// The fleet configuration in the tree of a verified release's tag: what `promotions: unsigned`
/// reads every safety setting from, since the branch tip may be anyone's push.
/// `commit` is the release's verified tag commit (`VerifiedRelease::commit`, `Operation::commit`).
pub fn signed_config(checkout: &Checkout, release: &str, commit: &str) -> Result<FleetConfig, VerifyError> {
    let commit = git2::Oid::from_str(commit).map_err(SourceError::from)?;
    let tree = checkout.commit_tree(commit, &format!("tag {release} ({})", short(commit)))?;
    FleetConfig::load(&tree).map_err(|e| VerifyError::SignedConfig { release: release.to_string(), source: e })
}

/// Checks that `commit` carries a trusted OpenPGP signature; returns the signer's fingerprint.
pub fn verify_commit(checkout: &Checkout, commit: git2::Oid, keyring: &Keyring) -> Result<String, VerifyError> {
    let fail = |problem| VerifyError::CommitSignature { commit: short(commit), problem };
    let (signature, payload) = match checkout.repo().extract_signature(&commit, None) {
        Ok(pair) => pair,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Err(fail(SignatureProblem::Missing)),
        Err(e) => return Err(SourceError::from(e).into()),
    };
    keyring.verify_detached(&payload, &signature).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DirTree, template_dir};
    use crate::model::{Rule, seed_keys};
    use crate::source::{Checkout, init_fleet_repo};

    fn rules(dir: &std::path::Path) -> Vec<(Rule, String)> {
        let (_, findings) = read_release(&DirTree::new(dir), Some("rel-20250315-001")).unwrap();
        findings.into_iter().map(|f| (f.rule, f.at.file)).collect()
    }

    #[test]
    fn the_template_release_is_consistent() {
        let dir = template_dir();
        // Files that are not manifests are not part of the release.
        std::fs::write(dir.path().join("operator/README.md"), "notes").unwrap();
        let (content, findings) = read_release(&DirTree::new(dir.path()), Some("rel-20250315-001")).unwrap();
        assert_eq!(findings, []);
        let content = content.unwrap();
        assert_eq!(content.files.len(), 9, "{:?}", content.files.keys());
        assert!(!content.files.contains_key("operator/README.md"));
    }

    #[test]
    fn the_seeds_configmap_form_takes_its_repository_from_fleet_yaml() {
        let dir = template_dir();
        let data: String = [
            (seed_keys::RELEASE_ID, "rel-20250315-001"),
            (seed_keys::GIT_COMMIT, "a1b2c3d4e5f6"),
            (seed_keys::IMAGE_TAG, "v1.2.3-build.456"),
            (seed_keys::CHART_VERSION, "1.2.3"),
            (seed_keys::CRD_VERSION, "v1alpha2"),
            (seed_keys::TARGET_CLUSTERS, "cluster-a,cluster-b,cluster-c"),
            (seed_keys::FLEET, "redis-fleet"),
            (seed_keys::SEQUENCE, "1"),
        ]
        .iter()
        .map(|(k, v)| format!("  {k}: \"{v}\"\n"))
        .collect();
        let cm =
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: release-manifest-20250315\ndata:\n{data}");
        std::fs::write(dir.path().join("release.yaml"), cm).unwrap();
        assert_eq!(rules(dir.path()), []);
    }

    #[cfg(unix)]
    #[test]
    fn links_out_of_the_repo_oversized_files_and_alias_bombs_are_findings() {
        let dir = template_dir();
        let op = dir.path().join("operator");
        std::os::unix::fs::symlink("/etc/passwd", op.join("abs.yaml")).unwrap();
        std::os::unix::fs::symlink("../../outside.yaml", op.join("rel.yaml")).unwrap();
        std::os::unix::fs::symlink("../release.yaml", op.join("inside.yaml")).unwrap();
        std::fs::write(op.join("big.yaml"), "#".repeat(crate::model::MAX_YAML_BYTES + 1)).unwrap();
        let mut bomb = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\nl0: &l0 lol\n");
        for i in 1..=9 {
            bomb.push_str(&format!("l{i}: &l{i} [{}]\n", vec![format!("*l{}", i - 1); 10].join(", ")));
        }
        std::fs::write(op.join("bomb.yaml"), bomb).unwrap();
        assert_eq!(
            rules(dir.path()),
            [
                (Rule::ManifestPath, "operator/abs.yaml".to_string()),
                (Rule::Limit, "operator/big.yaml".to_string()),
                (Rule::ManifestPath, "operator/rel.yaml".to_string()),
                (Rule::Limit, "operator/bomb.yaml".to_string()),
            ]
        );
    }

    #[test]
    fn a_manifests_path_that_leaves_the_repo_is_refused_before_reading() {
        let dir = template_dir();
        let path = dir.path().join("release.yaml");
        let text = std::fs::read_to_string(&path).unwrap().replace("manifests: operator/", "manifests: ../operator/");
        std::fs::write(&path, text).unwrap();
        let found = rules(dir.path());
        assert!(
            found.iter().all(|(r, _)| *r == Rule::ManifestPath || *r == Rule::Image || *r == Rule::CrdVersion),
            "{found:?}"
        );
        assert_eq!(found.iter().filter(|(r, _)| *r == Rule::ManifestPath).count(), 2, "{found:?}");
    }

    #[test]
    fn git_symlinks_pointing_out_of_the_repo_are_findings() {
        let dir = tempfile::tempdir().unwrap();
        init_fleet_repo(dir.path()).unwrap();
        let repo = git2::Repository::open(dir.path()).unwrap();
        // Add operator/evil.yaml as a symlink blob to ../../../etc/passwd in a new commit.
        let head = repo.head().unwrap().peel_to_commit().unwrap();
        let link = repo.blob(b"../../../etc/passwd").unwrap();
        let op = head.tree().unwrap().get_path(std::path::Path::new("operator")).unwrap();
        let mut op_tree = repo.treebuilder(Some(&repo.find_tree(op.id()).unwrap())).unwrap();
        op_tree.insert("evil.yaml", link, 0o120000).unwrap();
        let op_id = op_tree.write().unwrap();
        let mut root = repo.treebuilder(Some(&head.tree().unwrap())).unwrap();
        root.insert("operator", op_id, 0o040000).unwrap();
        let tree = repo.find_tree(root.write().unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@x").unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "evil link", &tree, &[&head]).unwrap();

        let checkout = Checkout::open_local(dir.path(), Some("main")).unwrap();
        let (content, findings) = read_release(&checkout.tip_tree().unwrap(), None).unwrap();
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!((findings[0].rule, findings[0].at.file.as_str()), (Rule::ManifestPath, "operator/evil.yaml"));
        assert!(!content.unwrap().files.contains_key("operator/evil.yaml"));
    }
}
