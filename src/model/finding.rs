//! [`Finding`]: one problem found in a fleet repo, with where it is and which rule it breaks.
//! Validation collects every finding instead of stopping at the first, so one `fleetgate validate`
//! run shows a repo author everything to fix.

use super::{Location, ParseError};
use serde::Serialize;
use std::fmt;

/// The rule a finding breaks (stable, kebab-case in JSON output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// The file is not valid YAML or not the document it claims to be (unknown field, wrong kind).
    Schema,
    /// A file over the size limit, an alias bomb, too many files.
    Limit,
    /// A name that is not allowed (cluster, wave, release id) or does not match its file name.
    Naming,
    /// Two documents claim the same name.
    Duplicate,
    /// A reference to something that does not exist (wave, cluster, release tag).
    Reference,
    /// The release id does not equal its tag.
    ReleaseId,
    /// A container image disagrees with `spec.image`.
    Image,
    /// A CRD does not serve `spec.crdVersion`, or its versions are inconsistent.
    CrdVersion,
    /// The manifests path leaves the repo (`..`, absolute, symlink escaping).
    ManifestPath,
    /// `spec.requires` cannot be understood.
    Requires,
    /// A tag or commit signature problem.
    Signature,
    /// A CRD change between consecutive releases that would break stored objects.
    CrdCompatibility,
    /// A credential or network destination (forge, token, notification or Prometheus URL) the
    /// repo names, which is the spoke's to configure; agents ignore it.
    SpokeSetting,
    /// A release that does not name this repo's fleet (`spec.fleet` vs `fleet.yaml` `metadata.name`).
    Fleet,
    /// Release order: a missing or repeated `sequence`, a `rollbackTo` or `revokes` that is not older.
    Ordering,
    /// An object the release's own admission policies refuse by content, decided without a
    /// cluster (RBAC, Pod Security, webhooks, CRDs in built-in groups).
    Admission,
    /// Wave membership that is probably not what was meant: a cluster in no wave (it rolls out
    /// with the last), or one that names a wave while another wave's selector matches it.
    Wave,
    /// A release's variants: a selector that cannot be understood or a variant that could never
    /// be chosen, a variant whose CRDs differ from the release's.
    Variant,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The serde name is the one people see in JSON; show the same one in text.
        let s = serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        f.write_str(&s)
    }
}

/// One problem, where it is, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub rule: Rule,
    #[serde(flatten)]
    pub at: Location,
    pub message: String,
}

impl Finding {
    pub fn new(rule: Rule, at: Location, message: impl Into<String>) -> Self {
        Finding { rule, at, message: message.into() }
    }

    /// A finding about a whole file (no line).
    pub fn in_file(rule: Rule, file: &str, message: impl Into<String>) -> Self {
        Finding::new(rule, Location::file(file), message)
    }

    /// A finding about the first mapping key `key` of `text` (e.g. `wave`), or the whole file.
    pub fn at_key(rule: Rule, file: &str, text: &str, key: &str, message: impl Into<String>) -> Self {
        Finding::new(rule, Location::of_key(file, text, key), message)
    }
}

impl From<ParseError> for Finding {
    fn from(e: ParseError) -> Self {
        let rule = match e {
            ParseError::TooLarge { .. } | ParseError::AliasBomb { .. } | ParseError::Limit { .. } => Rule::Limit,
            _ => Rule::Schema,
        };
        let at = e.location().clone();
        // The location is carried separately; keep only the message part of the error.
        let text = e.to_string();
        let prefix = format!("{at}: ");
        let message = text.strip_prefix(&prefix).map(str::to_string).unwrap_or(text);
        Finding { rule, at, message }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: [{}] {}", self.at, self.rule, self.message)
    }
}

/// Findings shown as one error message, one per line.
pub fn join_findings(findings: &[Finding]) -> String {
    findings.iter().map(|f| format!("  - {f}")).collect::<Vec<_>>().join("\n")
}
