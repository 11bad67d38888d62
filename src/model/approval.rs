//! Approvals of a release for a wave (`spec.waves[].approval: required`): what one is called in
//! Git, and the record of who gave it that a cluster's status keeps (the audit's who, why and
//! scope).
//!
//! An approval is an annotated tag `approve/<release>/<wave>` on the release's commit, signed by
//! a key of the approvers' keyring (the agent's own configuration, never the repo); its message
//! says why. `release::approval` verifies one; `fleetgate approve` writes one.

use serde::{Deserialize, Serialize};

/// The first part of every approval tag's name.
const APPROVAL_TAG_PREFIX: &str = "approve/";

/// Whether tag `name` is an approval (`approve/…`): it sits on a release's commit, so it carries
/// that release's `release.yaml`, but it is not a release.
pub fn is_approval_tag(name: &str) -> bool {
    name.starts_with(APPROVAL_TAG_PREFIX)
}

/// `approve/<release>/<wave>`: the one tag that can approve `release` for `wave`.
pub fn approval_tag(release: &str, wave: &str) -> String {
    format!("{APPROVAL_TAG_PREFIX}{release}/{wave}")
}

/// Who approved a release for a wave, why, and through what: kept in the status entry of the
/// release's start, signed with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRecord {
    /// The approver: the tagger and the key that signed (`Ana <ana@example.com> (key 3AF…)`).
    pub by: String,
    /// Why, in the approver's words (the tag's message).
    pub why: String,
    /// The scope: the wave approved.
    pub wave: String,
    /// Where the approval is (`tag approve/rel-2/prod`).
    pub via: String,
}

impl ApprovalRecord {
    /// `approved by Ana <ana@example.com> (key 3AF…): CAB-1234`, one line.
    pub fn summary(&self) -> String {
        let why = self.why.split_whitespace().collect::<Vec<_>>().join(" ");
        if why.is_empty() { format!("approved by {}", self.by) } else { format!("approved by {}: {why}", self.by) }
    }
}

/// The tagger (`Name <email>`) and the message of an annotated tag object's unsigned text (the
/// payload the signature covers: header lines, a blank line, the message).
pub fn tagger_and_message(payload: &str) -> (Option<String>, String) {
    let (header, message) = payload.split_once("\n\n").unwrap_or((payload, ""));
    let tagger = header.lines().find_map(|l| l.strip_prefix("tagger ")).map(|t| match t.rfind('>') {
        Some(end) => t[..=end].to_string(),
        None => t.to_string(),
    });
    (tagger, message.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_payload_gives_tagger_and_message() {
        let payload = "object 0123\ntype commit\ntag approve/rel-2/prod\ntagger Ana Lyst <ana@example.com> 1700000000 +0100\n\nCAB-1234: change approved\n\nrisk low\n";
        let (tagger, message) = tagger_and_message(payload);
        assert_eq!(tagger.as_deref(), Some("Ana Lyst <ana@example.com>"));
        assert_eq!(message, "CAB-1234: change approved\n\nrisk low");
        assert_eq!(tagger_and_message("object 0123\ntype commit\n"), (None, String::new()));
    }

    #[test]
    fn the_summary_is_one_line() {
        let r = ApprovalRecord {
            by: "Ana <ana@example.com> (key ABC)".into(),
            why: "CAB-1234\nrisk low".into(),
            wave: "prod".into(),
            via: approval_tag("rel-2", "prod"),
        };
        assert_eq!(r.summary(), "approved by Ana <ana@example.com> (key ABC): CAB-1234 risk low");
        assert_eq!(r.via, "approve/rel-2/prod");
    }
}
