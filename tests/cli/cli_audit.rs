//! `fleetgate audit` end to end: a fleet repo served by a real `git daemon` with statuses its
//! agents wrote as Git notes (tests/status_support), plus a status rewritten by someone without
//! the cluster's key and one written unsigned; the command prints every record of the notes
//! refs' history, filtered by `--cluster` and `--since`, and marks the two as unverified.

use crate::status_support;

use fleetgate::status::{self, GitRemote, State, Status, StatusNote};
use fleetgate_testenv::git_in;
use status_support::{NEW, OLD, fleet, identity, run, stdout};
use std::process::Output;

fn json(out: &Output) -> Vec<serde_json::Value> {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

/// The status_support fleet, plus: a signed record of cluster-d reported in 2025, cluster-b's
/// failure rewritten to read as a pass (signature kept), and an unsigned entry in cluster-c's
/// notes.
fn audited_fleet() -> status_support::Fleet {
    let f = fleet();
    let agent = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(agent.path()).unwrap();
    repo.remote_anonymous(&f.url).unwrap().fetch(&["+refs/*:refs/*"], None, None).unwrap();
    let old_time = chrono::DateTime::parse_from_rfc3339("2025-03-02T09:00:00Z").unwrap().to_utc();
    let late = Status { reported_at: old_time, ..Status::new("cluster-d", OLD, &f.old, State::Success, "re-checked") };
    status::write(&repo, &GitRemote::new(&f.url), &late, &identity("cluster-d")).unwrap();

    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    git_in(w, &["init", "-q", "--bare"]);
    git_in(w, &["fetch", "-q", &f.url, "+refs/*:refs/*"]);
    let note = git_in(w, &["notes", "--ref=fleetgate/cluster-b", "show", &f.new]);
    let forged = note.replace("rolled back to rel-20250301-001: error-rate 7.3 % > 5 %", "all gates passed");
    assert_ne!(forged, note);
    git_in(w, &["notes", "--ref=fleetgate/cluster-b", "add", "-f", "-m", &forged, &f.new]);
    let mut unsigned = StatusNote::new("cluster-c");
    unsigned.append(&Status::new("cluster-c", NEW, &f.new, State::Success, "trust me"));
    git_in(w, &["notes", "--ref=fleetgate/cluster-c", "add", "-f", "-m", &unsigned.to_text(), &f.new]);
    git_in(w, &["push", "-q", &f.url, "refs/notes/fleetgate/cluster-b", "refs/notes/fleetgate/cluster-c"]);
    f
}

#[test]
fn every_record_is_listed_and_the_forged_ones_are_marked_unverified() {
    let f = audited_fleet();
    let out = run(&["audit", "--repo", &f.url]);
    let text = stdout(&out);
    println!("{text}");
    assert_eq!(
        out.status.code(),
        Some(1),
        "unverified records make it exit 1: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("TIME (UTC)") && lines[0].ends_with("DESCRIPTION"), "{text}");
    // The 2025 record comes first (oldest), then the status_support writes in order.
    assert!(lines[1].starts_with("2025-03-02 09:00:00  cluster-d  rel-20250301-001  success  yes"), "{text}");
    let rows = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(rows("  yes  "), 8, "4 × OLD, cluster-a pending and success, cluster-b failure, cluster-d late: {text}");
    assert_eq!(rows("  NO  "), 2, "{text}");
    let forged = lines.iter().position(|l| l.contains("cluster-b") && l.contains("NO")).expect("the forged record");
    assert!(lines[forged].ends_with("all gates passed"), "{text}");
    assert_eq!(lines[forged + 1], "  ↳ unverified: the signature does not match the entry (changed after signing)");
    let unsigned = lines.iter().position(|l| l.contains("trust me")).expect("the unsigned record");
    assert!(lines[unsigned + 1].starts_with("  ↳ unverified: unsigned"), "{text}");
    // The original failure is still there: the log is the history, not the note's current text.
    assert!(text.contains("rolled back to rel-20250301-001: error-rate 7.3 % > 5 %"), "{text}");
}

#[test]
fn cluster_and_since_filter_and_json_carries_each_record() {
    let f = audited_fleet();
    let out = run(&["audit", "--repo", &f.url, "--cluster", "cluster-a", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let records = json(&out);
    let seen: Vec<(&str, &str, &str)> = records
        .iter()
        .map(|r| {
            (
                r["cluster"].as_str().unwrap(),
                r["status"]["release"].as_str().unwrap(),
                r["status"]["state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(seen, [("cluster-a", OLD, "success"), ("cluster-a", NEW, "pending"), ("cluster-a", NEW, "success")]);
    assert!(records.iter().all(|r| r["verified"] == true && r["notesCommit"].as_str().unwrap().len() == 40));

    let recent = json(&run(&["audit", "--repo", &f.url, "--cluster", "cluster-d", "--since", "1h", "-o", "json"]));
    assert_eq!(recent.len(), 1, "the 2025 record is older: {recent:?}");
    let all_d =
        json(&run(&["audit", "--repo", &f.url, "--cluster", "cluster-d", "--since", "2025-01-01", "-o", "json"]));
    assert_eq!(all_d.len(), 2, "{all_d:?}");

    let b = json(&run(&["audit", "--repo", &f.url, "--cluster", "cluster-b", "-o", "json"]));
    assert_eq!(b.iter().map(|r| r["verified"].as_bool().unwrap()).collect::<Vec<_>>(), [true, true, false]);
    assert_eq!(b[2]["unverified"], "the signature does not match the entry (changed after signing)");

    let bad = run(&["audit", "--repo", &f.url, "--since", "last tuesday"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not an RFC 3339 time"));
}
