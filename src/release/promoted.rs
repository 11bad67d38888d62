//! Which commit promoted a cluster to its desired release: the head of the promotion PR, where a
//! forge shows a PR's commit statuses. The agent mirrors its status there too
//! (`agent::forge_mirror`), so reviewers see each cluster's health on the PR page.
//!
//! The walk follows the tracked branch's first-parent history from the tip back to the newest
//! commit whose first parent asked this cluster for another release (or none). That commit is the
//! PR's head when the forge fast-forwarded or rebased the PR onto the branch; when it merged with a
//! merge commit, the PR's head is that merge's second parent — provided that head itself asks the
//! cluster for the release. A merge whose own tree makes the promotion while its second parent is
//! some other PR's head (a docs fix a person approved) has no promotion head: approvals of that
//! PR are bound to what it changes, never to what a merge adds around it. Git history is only read
//! here: what is read chooses a commit of this repo to post on, never where a status (or a token)
//! goes.

use crate::model::{CLUSTERS_DIR, FLEET_FILE, FleetConfig};
use crate::source::{Checkout, SourceError};
use git2::{Commit, Oid};

/// How far back the walk goes: a promotion older than this many first-parent commits gets no
/// status on its PR (the release commit still has it).
const MAX_PROMOTION_HISTORY: usize = 500;

/// The head commit of the change that made the branch tip ask `cluster` for `release`; None when
/// the tip asks it for another release (or none), or the change is older than
/// [`MAX_PROMOTION_HISTORY`] commits.
///
/// # Errors
/// Git could not read a commit or tree of the history.
pub fn promotion_head(checkout: &Checkout, cluster: &str, release: &str) -> Result<Option<Oid>, SourceError> {
    let repo = checkout.repo();
    let mut commit = repo.find_commit(checkout.tip())?;
    if desired_at(checkout, &commit, cluster)?.as_deref() != Some(release) {
        return Ok(None);
    }
    for _ in 0..MAX_PROMOTION_HISTORY {
        let Ok(parent) = commit.parent(0) else {
            // The first commit asked for it already.
            return Ok(Some(commit.id()));
        };
        if decision_files(&commit)? != decision_files(&parent)?
            && desired_at(checkout, &parent, cluster)?.as_deref() != Some(release)
        {
            if commit.parent_count() == 1 {
                return Ok(Some(commit.id()));
            }
            let head = repo.find_commit(commit.parent_id(1)?)?;
            let promotes = desired_at(checkout, &head, cluster)?.as_deref() == Some(release);
            return Ok(promotes.then_some(head.id()));
        }
        commit = parent;
    }
    Ok(None)
}

/// The ids of `fleet.yaml` and `clusters/`: where they are the same, the desired releases are.
fn decision_files(commit: &Commit<'_>) -> Result<(Option<Oid>, Option<Oid>), SourceError> {
    let tree = commit.tree()?;
    let id = |name: &str| tree.get_name(name).map(|e| e.id());
    Ok((id(FLEET_FILE), id(CLUSTERS_DIR)))
}

/// The release `commit` asks `cluster` for; None where it asks none or its configuration does not
/// load (such a commit decides nothing).
fn desired_at(checkout: &Checkout, commit: &Commit<'_>, cluster: &str) -> Result<Option<String>, SourceError> {
    let tree = checkout.commit_tree(commit.id(), "promotion history")?;
    Ok(FleetConfig::load(&tree).ok().and_then(|c| c.desired_release(cluster).map(|(id, _)| id.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A fleet repo from the template with cluster-a unpinned and the fleet at `rel-0`.
    fn repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        crate::source::init_fleet_repo(dir.path()).unwrap();
        set_fleet(dir.path(), "rel-0");
        git(dir.path(), &["commit", "-qam", "fleet at rel-0"]);
        dir
    }

    fn set_fleet(dir: &Path, id: &str) {
        let path = dir.join(FLEET_FILE);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut done = false;
        let text: Vec<String> = text
            .lines()
            .map(|l| {
                let bare = l.trim_start().trim_start_matches("# ");
                if !done && l.starts_with("  ") && !l.starts_with("   ") && bare.starts_with("release: ") {
                    done = true;
                    format!("  release: {id}")
                } else {
                    l.to_string()
                }
            })
            .collect();
        assert!(done);
        std::fs::write(path, text.join("\n") + "\n").unwrap();
    }

    fn head(dir: &Path) -> Option<String> {
        let checkout = Checkout::open_local(dir, Some("main")).unwrap();
        promotion_head(&checkout, "cluster-a", "rel-1").unwrap().map(|o| o.to_string())
    }

    /// A PR branch `pr` off main: the promotion, then an unrelated commit (its head).
    fn pr_branch(dir: &Path) -> String {
        git(dir, &["checkout", "-qb", "pr"]);
        set_fleet(dir, "rel-1");
        git(dir, &["commit", "-qam", "promote rel-1"]);
        std::fs::write(dir.join("NOTES.md"), "why\n").unwrap();
        git(dir, &["add", "NOTES.md"]);
        git(dir, &["commit", "-qm", "notes"]);
        let pr_head = git(dir, &["rev-parse", "HEAD"]);
        git(dir, &["checkout", "-q", "main"]);
        pr_head
    }

    #[test]
    fn a_merge_commit_points_at_the_pr_head() {
        let dir = repo();
        let pr_head = pr_branch(dir.path());
        // main moved on meanwhile, so the merge is a real one.
        std::fs::write(dir.path().join("OTHER.md"), "x\n").unwrap();
        git(dir.path(), &["add", "OTHER.md"]);
        git(dir.path(), &["commit", "-qm", "other"]);
        git(dir.path(), &["merge", "-q", "--no-ff", "-m", "Merge pr", "pr"]);
        // Later commits on main that decide nothing do not move it.
        std::fs::write(dir.path().join("LATER.md"), "y\n").unwrap();
        git(dir.path(), &["add", "LATER.md"]);
        git(dir.path(), &["commit", "-qm", "later"]);
        assert_eq!(head(dir.path()), Some(pr_head));
    }

    #[test]
    fn a_merge_that_promotes_on_its_own_over_another_prs_head_has_no_promotion_head() {
        let dir = repo();
        // An approved docs fix, merged by a commit whose own tree also promotes rel-1.
        git(dir.path(), &["checkout", "-qb", "docs"]);
        std::fs::write(dir.path().join("NOTES.md"), "typo fixed\n").unwrap();
        git(dir.path(), &["add", "NOTES.md"]);
        git(dir.path(), &["commit", "-qm", "docs: fix a typo"]);
        git(dir.path(), &["checkout", "-q", "main"]);
        git(dir.path(), &["merge", "-q", "--no-ff", "--no-commit", "docs"]);
        set_fleet(dir.path(), "rel-1");
        git(dir.path(), &["commit", "-qam", "Merge docs"]);
        assert_eq!(head(dir.path()), None, "the docs PR's approvals must not approve rel-1");
    }

    #[test]
    fn a_fast_forward_or_rebase_points_at_the_commit_that_changed_the_release() {
        let dir = repo();
        pr_branch(dir.path());
        git(dir.path(), &["merge", "-q", "--ff-only", "pr"]);
        let promotion = git(dir.path(), &["rev-parse", "HEAD~1"]);
        assert_eq!(head(dir.path()), Some(promotion));
    }

    #[test]
    fn a_cluster_pin_counts_and_another_release_gets_none() {
        let dir = repo();
        let path = dir.path().join("clusters/cluster-a.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        // The template leaves the pin commented out.
        let text = text.replace("spec:\n", "spec:\n  release: rel-1\n");
        std::fs::write(&path, text).unwrap();
        git(dir.path(), &["commit", "-qam", "pin cluster-a"]);
        let pin = git(dir.path(), &["rev-parse", "HEAD"]);
        assert_eq!(head(dir.path()), Some(pin));
        let checkout = Checkout::open_local(dir.path(), Some("main")).unwrap();
        assert_eq!(promotion_head(&checkout, "cluster-a", "rel-0").unwrap(), None, "the tip asks for rel-1");
    }
}
