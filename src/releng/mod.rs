//! Release engineering in Git: the three things people do, one call each, correct by construction.
//!
//! * [`create`] — cut a release: replace `operator/` with rendered manifests (or a Helm chart it
//!   renders, [`chart`]), write `release.yaml`, check the mapping and CRD compatibility against
//!   what the target clusters last ran successfully ([`baseline`], from [`successes`]), commit,
//!   and tag with a gpgme signature ([`sign`]).
//! * [`promote`] — a branch whose one commit moves clusters (a cluster, a wave, the fleet) to a
//!   release, after checking the tag's signature, its targets and earlier waves' statuses.
//! * [`rollback`] — a commit that puts clusters back: a real revert of the promotion when that
//!   commit is exactly the promotion of those clusters, otherwise an explicit change.
//!
//! [`approve`] writes the signed tag that approves a release for a wave that requires it.
//! [`plan`] says, on a promotion pull request before it is merged, what each moving cluster's
//! agent will make of it (refuse, wait for people, or go), and posts that on the forge.
//!
//! [`push`] sends the results to a remote and [`forge_pr`] opens the pull/merge request;
//! [`publish`] is promote and rollback with both, as the commands run them. Everything
//! works on the object database (no work tree needed); a checked-out branch that moves is checked
//! out again. Desired releases are edited in place, comments kept ([`desired`]).

pub mod approve;
pub mod baseline;
pub mod chart;
pub mod checks;
pub mod create;
pub mod desired;
pub mod forge_pr;
pub mod pause;
pub mod plan;
pub mod promote;
pub mod publish;
pub mod push;
pub mod register;
pub mod repo;
pub mod rollback;
pub mod rollback_preview;
pub mod sign;
pub mod successes;

pub use crate::model::Target;
pub use desired::{DesiredChange, FleetState};
pub use repo::{FleetRepo, ReleaseTag};
pub use sign::{SignError, Signer};

use crate::manifests::admission::{ObjectRefusal, fixes};
use serde::Serialize;

/// Why a command declined to act. Each is specific enough to act on; `--force` (promote)
/// overrides the ones that say so, `--accept-crd-change` (release create) accepts the CRD
/// changes an [`Refusal::IncompatibleCrds`] lists, and `--allow-admission REASON` (release
/// create) signs a release [`Refusal::Admission`] refused, recording why.
#[derive(Debug, Clone, PartialEq, Serialize, thiserror::Error)]
#[serde(tag = "code", rename_all = "kebab-case")]
pub enum Refusal {
    #[error(
        "release id {id} is already tagged with different content ({differences}); pick a new id — a release id names one content forever"
    )]
    IdReused { id: String, differences: String },
    #[error("the mapping in release.yaml disagrees with the manifests:\n{}", bullet(findings))]
    MappingInconsistent { findings: Vec<String> },
    #[error("{}", incompatible_crds(baselines, findings, accept))]
    IncompatibleCrds {
        /// The baselines the CRDs break, as `rel-1 (last-known-good of cluster-a)`.
        baselines: Vec<String>,
        findings: Vec<String>,
        /// The `--accept-crd-change` values that would accept every finding (empty: only a fix can).
        accept: Vec<String>,
    },
    #[error("{}", admission_refused(objects, fixes))]
    Admission {
        /// Every refused object, each rule it breaks once, with the policies that refuse it.
        objects: Vec<ObjectRefusal>,
        /// The lines that would admit them, per refusing policy.
        fixes: Vec<AdmissionFix>,
    },
    #[error(
        "release {id} is not signed by a trusted key: {reason}; re-cut it with `fleetgate release create --sign-key …`, or pass --force"
    )]
    Unsigned { id: String, reason: String },
    #[error("release {id} does not target {}; its targetClusters are [{}] — cut a release that names them, or pass --force", clusters.join(", "), targets.join(", "))]
    NotTargeted { id: String, clusters: Vec<String>, targets: Vec<String> },
    #[error(
        "release {id} already failed on an earlier wave:\n{}\nroll those clusters back and cut a fixed release, or pass --force",
        bullet(failures)
    )]
    FailedEarlierWave { id: String, failures: Vec<String> },
    #[error(
        "branch {branch} already exists with other content; delete it (`git branch -D {branch}`) or pass --branch NAME"
    )]
    BranchExists { branch: String },
    #[error("{0}")]
    NothingToRollBack(String),
}

/// Policy lines that would admit what admission refused, and where a person adds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdmissionFix {
    /// The policy, as violations name it.
    pub policy: String,
    /// Where it lives: a repo file, or a description of the agents' baseline.
    pub file: String,
    /// `spec:` fields in the policy's YAML; each replaces the field of that name.
    pub lines: Vec<String>,
}

fn admission_refused(objects: &[ObjectRefusal], fixes: &[AdmissionFix]) -> String {
    let count: usize = objects.iter().map(|o| o.rules.len()).sum();
    let mut m = format!(
        "the manifests break the admission policy the agents would judge them by ({count} rule(s) in {} object(s)); nothing was committed or signed:\n",
        objects.len()
    );
    for o in objects {
        m.push_str(&format!("  {} ({}):\n", o.object, o.source));
        for r in &o.rules {
            let unliftable =
                if fixes::liftable(&r.reason) { "" } else { " (no policy lifts this: change the manifest)" };
            m.push_str(&format!("    - {} — refused by {}{unliftable}\n", r.reason, r.policies.join(", ")));
        }
    }
    if !fixes.is_empty() {
        m.push_str("to admit them, set these fields under spec: (each line replaces the field of that name)\n");
        for f in fixes {
            m.push_str(&format!("  in {} ({}):\n", f.file, f.policy));
            for line in &f.lines {
                m.push_str(&format!("    {line}\n"));
            }
        }
    }
    m.push_str(
        "or sign it anyway on purpose: run again adding --allow-admission REASON (recorded in the signed tag; \
         agents still refuse what their policies refuse)",
    );
    m
}

fn bullet(items: &[String]) -> String {
    items.iter().map(|i| format!("  - {i}")).collect::<Vec<_>>().join("\n")
}

fn incompatible_crds(baselines: &[String], findings: &[String], accept: &[String]) -> String {
    let mut m = format!("CRDs are incompatible with {}:\n{}\n", baselines.join(", "), bullet(findings));
    if accept.is_empty() {
        m.push_str("fix the CRDs (or the --accept-crd-change values)");
    } else {
        let flags: Vec<String> = accept.iter().map(|a| format!("--accept-crd-change {}", shell_word(a))).collect();
        m.push_str(&format!(
            "fix the CRDs, or accept these changes on purpose: run again adding\n  {}\n\
             (signed into release.yaml as spec.acceptCrdChanges; every agent's CRD gate honours them)",
            flags.join(" ")
        ));
    }
    m
}

/// `s` as one shell word: as is when it holds nothing a POSIX shell would act on, else in
/// single quotes.
pub fn shell_word(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_.,:/=@+%".contains(c);
    if !s.is_empty() && s.chars().all(plain) { s.to_string() } else { format!("'{}'", s.replace('\'', "'\\''")) }
}

impl Refusal {
    /// A stable machine-readable code, e.g. `unsigned`, `failed-earlier-wave`.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::IdReused { .. } => "id-reused",
            Refusal::MappingInconsistent { .. } => "mapping-inconsistent",
            Refusal::IncompatibleCrds { .. } => "incompatible-crds",
            Refusal::Admission { .. } => "admission",
            Refusal::Unsigned { .. } => "unsigned",
            Refusal::NotTargeted { .. } => "not-targeted",
            Refusal::FailedEarlierWave { .. } => "failed-earlier-wave",
            Refusal::BranchExists { .. } => "branch-exists",
            Refusal::NothingToRollBack(_) => "nothing-to-roll-back",
        }
    }
}

/// Everything that can stop a release command. [`RelengError::is_refusal`] separates "refused on
/// purpose" (exit 1) from usage/configuration/environment problems (exit 2). A message never
/// repeats its `source()`: print the chain (as the command line does).
#[derive(Debug, thiserror::Error)]
pub enum RelengError {
    /// Not a `source()`: the refusal is the whole message.
    #[error("refused: {0}")]
    Refused(Refusal),
    #[error("{path} is not a Git repository; pass --repo with the path of a clone of the fleet repo")]
    NotARepo { path: String, source: git2::Error },
    #[error("branch {0} does not exist; pass --base/--branch with an existing branch (`git branch` lists them)")]
    NoSuchBranch(String),
    #[error("release {0} has no release tag here; cut it with `fleetgate release create`, or `git fetch --tags`")]
    UnknownRelease(String),
    #[error(transparent)]
    Select(#[from] crate::model::SelectError),
    #[error("the work tree has uncommitted changes to {}; commit or stash them first", paths.join(", "))]
    DirtyWorktree { paths: Vec<String> },
    /// The command was asked for something that cannot be done as asked.
    #[error("{0}")]
    Usage(String),
    #[error(
        "--open-pr needs a forge: pass --forge-kind, --forge-url and --forge-repository (token from --forge-token-file or $FLEETGATE_FORGE_TOKEN), or push and open the PR by hand"
    )]
    NoForge,
    #[error("cannot fetch statuses from {remote} (pass --offline to use the local ones)")]
    StatusFetch { remote: String, source: crate::status::NotesError },
    #[error("reading statuses from Git notes")]
    StatusRead(#[source] crate::status::NotesError),
    #[error("loading --trusted-keys")]
    TrustedKeys(#[from] crate::release::TrustError),
    #[error("verifying release {id}")]
    Verify { id: String, source: Box<crate::release::VerifyError> },
    #[error("reading release {id} for branch {base}")]
    Resolve { id: String, base: String, source: Box<crate::release::ResolveError> },
    #[error(transparent)]
    Tree(#[from] crate::model::TreeError),
    #[error(transparent)]
    Model(#[from] crate::model::ParseError),
    #[error(transparent)]
    Sign(#[from] SignError),
    #[error("push to {remote} failed: {reason}")]
    Push { remote: String, reason: String },
    #[error(transparent)]
    Forge(#[from] forge_pr::ForgeError),
    #[error("publishing the plan on the forge")]
    PlanPost(#[source] crate::status::ForgeError),
    #[error(transparent)]
    Chart(#[from] chart::ChartError),
    #[error(transparent)]
    Manifests(#[from] crate::manifests::ManifestError),
    #[error(transparent)]
    AdmissionBaseline(#[from] crate::model::BaselineError),
    #[error("reading {path}")]
    Io { path: String, source: std::io::Error },
    #[error("git")]
    Git(#[from] git2::Error),
}

impl From<Refusal> for RelengError {
    fn from(r: Refusal) -> Self {
        RelengError::Refused(r)
    }
}

impl RelengError {
    pub fn is_refusal(&self) -> bool {
        matches!(self, RelengError::Refused(_))
    }

    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            RelengError::Refused(r) => Some(r),
            _ => None,
        }
    }
}

/// Refuses ids `validate` would refuse ([`crate::model::is_release_id`]), before anything is written.
pub fn check_release_id(id: &str) -> Result<(), RelengError> {
    if !crate::model::is_release_id(id) {
        return Err(RelengError::Usage(format!(
            "{id:?} cannot be a release id: use lowercase letters, digits, '-' and '.' (at most 63), e.g. rel-20250315-001"
        )));
    }
    Ok(())
}
