//! `fleetgate cluster register`: records a cluster's status key (`spec.statusKey` of
//! `clusters/<name>.yaml`) in a commit on the base branch, so readers believe that cluster's
//! signed statuses. Signed with a promotion key, the commit is also what lets an agent that
//! pinned an earlier key accept the new one (docs/SECURITY.md).

use super::RelengError;
use super::repo::{FleetRepo, TreeEdit};
use super::sign::Signer;
use crate::model::{self, CLUSTERS_DIR, Cluster};
use crate::status::StatusKey;
use git2::Oid;

/// What [`register`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registered {
    /// The file already registers that key.
    Unchanged,
    /// A new commit on the base branch.
    Committed(Oid),
}

/// Sets `clusters/<cluster>.yaml` `spec.statusKey` to `key` on branch `base`, in a commit signed
/// by `signer` when given. The rest of the file is kept byte for byte where a line edit can be
/// shown (by parsing it back) to change only the key; otherwise the document is written out whole.
///
/// # Errors
/// A key that is not an OpenSSH Ed25519 public key, a cluster without a file, a work tree with
/// other changes, or a branch that moved meanwhile.
pub fn register(
    repo: &FleetRepo,
    base: &str,
    cluster: &str,
    key: &str,
    signer: Option<&mut Signer>,
) -> Result<Registered, RelengError> {
    let key = StatusKey::parse(key).map_err(|e| RelengError::Usage(format!("--status-key: {e}")))?;
    repo.ensure_clean(&[])?;
    let tip = repo.branch_tip(base)?;
    let tree = tip.tree()?;
    let path = format!("{CLUSTERS_DIR}/{cluster}.yaml");
    let text = repo
        .file_at(&tree, &path)?
        .ok_or_else(|| RelengError::Usage(format!("no {path} on {base}; add the cluster first")))?;
    let text = String::from_utf8_lossy(&text).into_owned();
    let mut doc: Cluster =
        model::parse_document(&path, &text, "Cluster").map_err(|e| RelengError::Usage(format!("{path}: {e}")))?;
    let value = key.to_openssh();
    if doc.spec.status_key.as_deref().and_then(|k| StatusKey::parse(k).ok()).as_ref() == Some(&key) {
        return Ok(Registered::Unchanged);
    }
    doc.spec.status_key = Some(value.clone());
    let edited = match line_edit(&text, &value) {
        Some(edited)
            if model::parse_document::<model::ClusterSpec>(&path, &edited, "Cluster").ok() == Some(doc.clone()) =>
        {
            edited
        }
        _ => serde_saphyr::to_string(&doc).map_err(|e| RelengError::Usage(format!("{path}: cannot write: {e}")))?,
    };
    let mut edit = TreeEdit::new(repo.git(), Some(&tree))?;
    edit.put(&path, edited.as_bytes(), false)?;
    let new_tree = edit.write()?;
    let who = repo.identity(signer.as_deref())?;
    let message =
        format!("cluster {cluster}: register status key {}\n\nFleetgate-Status-Key: {value}\n", key.fingerprint());
    let commit = repo.commit(signer, &who, &message, new_tree, &[&tip])?;
    repo.set_branch(base, commit, Some(tip.id()), &format!("fleetgate cluster register {cluster}"))?;
    Ok(Registered::Committed(commit))
}

/// `statusKey: VALUE` in a block-style `spec:` (two-space indent): replaces the line, or adds it
/// right after `spec:`. `None` for other layouts.
fn line_edit(text: &str, value: &str) -> Option<String> {
    let line = format!("  statusKey: {value}\n");
    let mut lines: Vec<String> = text.split_inclusive('\n').map(str::to_string).collect();
    if let Some(i) = lines.iter().position(|l| l.starts_with("  statusKey:")) {
        lines[i] = line;
    } else {
        let spec = lines.iter().position(|l| l.trim_end() == "spec:")?;
        lines.insert(spec + 1, line);
    }
    Some(lines.concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_goes_under_spec_and_replaces_an_old_one() {
        let text = "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: a\nspec:\n  wave: canary\n";
        let once = line_edit(text, "ssh-ed25519 AAAA1").unwrap();
        assert!(once.contains("spec:\n  statusKey: ssh-ed25519 AAAA1\n  wave: canary\n"), "{once}");
        let twice = line_edit(&once, "ssh-ed25519 AAAA2").unwrap();
        assert_eq!(twice.matches("statusKey").count(), 1);
        assert!(twice.contains("statusKey: ssh-ed25519 AAAA2"));
        assert!(line_edit("spec: {wave: canary}\n", "k").is_none());
    }
}
