//! `fleetgate status` end to end: a fleet repo served by a real `git daemon`, release tags,
//! statuses written by agents as Git notes, and the command's table, details, JSON and watch mode;
//! and `fleetgate wait`, which reads the same statuses until a release succeeds, fails or times
//! out (real signed releases in a local fleet repo, statuses added as agents sign them).

use crate::releng_common;
use crate::status_support;

use fleetgate::status::{self, GitRemote, Matrix, State, Status};
use status_support::{NEW, OLD, fleet, identity, run, stdout};
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn the_matrix_fits_80_columns_and_says_where_each_release_stands() {
    let f = fleet();
    let out = run(&["status", "--repo", &f.url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    println!("{text}");
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "wider than 80 columns: {line:?}");
    }
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("fleet redis-fleet · main @ "), "{text}");
    assert!(text.contains("CLUSTER      RUNNING           LAST SEEN  rel-20250315-001  rel-20250301-001"), "{text}");
    // What each runs (cluster-b rolled back), how long ago it reported, then its cells.
    let row = |name: &str| *lines.iter().find(|l| l.starts_with(&format!("  {name}  "))).unwrap();
    assert!(row("cluster-b").starts_with(&format!("  cluster-b  {OLD}  ")), "{text}");
    assert!(row("cluster-b").ends_with("  failure*          success"), "{text}");
    assert!(row("cluster-a").starts_with(&format!("  cluster-a  {NEW}  ")), "{text}");
    assert!(row("cluster-c").ends_with("  —*                success"), "{text}");
    assert!(row("cluster-d").ends_with("  —                 success*"), "{text}");
    assert!(row("cluster-d").contains(" s ago ") || row("cluster-d").contains(" m ago "), "{text}");
    // The failure comes first in its wave.
    assert!(text.find("  cluster-b  ").unwrap() < text.find("  cluster-a  ").unwrap(), "{text}");
    assert!(text.contains("rel-20250315-001  1/3 clusters success, 1 failure, 1 not started"), "{text}");
    assert!(text.contains("rel-20250301-001  4/4 clusters success"), "{text}");
    assert!(!text.contains("not-a-release") && !text.contains("docs-1"), "{text}");

    // A local path works the same as a URL (compared as JSON: the table's ages tick on).
    let local = run(&["status", "--repo", f.daemon.path("fleet.git").to_str().unwrap(), "-o", "json"]);
    assert_eq!(stdout(&local), stdout(&run(&["status", "--repo", &f.url, "-o", "json"])));
}

#[test]
fn release_details_explain_every_cluster_and_a_failure_exits_1() {
    let f = fleet();
    let out = run(&["status", NEW, "--repo", &f.url]);
    let text = stdout(&out);
    println!("{text}");
    assert_eq!(out.status.code(), Some(1), "{text}");
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "wider than 80 columns: {line:?}");
    }
    let b = text.lines().find(|l| l.starts_with("  cluster-b  failure   ")).expect("cluster-b's row");
    assert!(b.contains(" ago ") && b.ends_with("rolled back to rel-20250301-001: error-rate"), "{text}");
    assert!(text.contains("cluster-c  —         —          blocked: cluster-b in earlier wave canary"), "{text}");
    assert!(text.contains("cluster-d  —         —          not targeted: desires rel-20250301-001"), "{text}");

    let ok = run(&["status", OLD, "--repo", &f.url]);
    assert_eq!(ok.status.code(), Some(0));

    let missing = run(&["status", "rel-19990101-001", "--repo", &f.url]);
    assert_eq!(missing.status.code(), Some(2));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("no release tag rel-19990101-001") && err.contains(NEW), "{err}");
}

#[test]
fn json_output_is_the_documented_matrix() {
    let f = fleet();
    let out = run(&["status", "--repo", &f.url, "-o", "json"]);
    assert!(out.status.success());
    let m: Matrix = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(m.schema, 1);
    assert_eq!(m.fleet, "redis-fleet");
    assert_eq!(m.releases.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), [NEW, OLD]);
    assert_eq!((m.releases[0].commit.as_str(), m.releases[1].commit.as_str()), (f.new.as_str(), f.old.as_str()));
    assert_eq!(m.waves.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(), ["canary", "prod"]);
    // The failure first in its wave.
    let b = &m.waves[0].clusters[0];
    assert_eq!((b.name.as_str(), b.cells[0].state), ("cluster-b", Some(State::Failure)));
    assert_eq!(b.cells[0].status.as_ref().unwrap().rollback_to.as_deref(), Some(OLD));
    let c = &m.waves[1].clusters[0];
    assert_eq!(c.cells[0].state, None);
    assert!(!c.cells[0].gate.as_ref().unwrap().allowed);
    let raw: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        raw["releases"][0]["summary"],
        serde_json::json!({"clusters": 3, "success": 1, "failure": 1, "error": 0, "pending": 0, "notStarted": 1})
    );

    let yaml = run(&["status", OLD, "--repo", &f.url, "-o", "yaml"]);
    let one: Matrix = serde_saphyr::from_slice(&yaml.stdout).unwrap();
    assert_eq!(one.releases.len(), 1);
}

#[test]
fn watch_refreshes_until_stopped() {
    let f = fleet();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["status", "--repo", &f.url, "-o", "json", "--watch", "--interval", "300ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let first: Matrix = serde_json::from_str(&rx.recv_timeout(Duration::from_secs(30)).unwrap()).unwrap();
    assert_eq!(first.releases[0].summary.success, 1);
    // A cluster reports meanwhile; the next refresh shows it.
    let agent = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(agent.path()).unwrap();
    let s = Status::new("cluster-a", NEW, &f.new, State::Error, "could not reach the API server");
    status::sync(&repo, &GitRemote::new(&f.url)).unwrap();
    status::write(&repo, &GitRemote::new(&f.url), &s, &identity("cluster-a")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let line = rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())).expect("a refresh");
        let m: Matrix = serde_json::from_str(&line).unwrap();
        if m.releases[0].summary.error == 1 {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// On call: only what is wrong, one wave, one label, what runs and when each agent was last heard
/// from — relative in the table, exact in `-o wide` and `-o json`; a typo is an error, not an
/// empty table.
#[test]
fn filters_narrow_the_fleet_and_times_are_exact_for_machines() {
    let f = fleet();
    let failing = run(&["status", "--repo", &f.url, "--state", "failure", "--state", "error"]);
    let text = stdout(&failing);
    println!("{text}");
    assert!(failing.status.success(), "{}", String::from_utf8_lossy(&failing.stderr));
    assert!(
        text.contains("\ncanary\n  cluster-b  ") && !text.contains("cluster-a") && !text.contains("\nprod"),
        "{text}"
    );

    let out = run(&["status", "--repo", &f.url, "--wave", "prod", "-o", "json"]);
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let waves = m["waves"].as_array().unwrap();
    assert_eq!(waves.len(), 1, "{m:#}");
    let prod: Vec<&str> =
        waves[0]["clusters"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(prod, ["cluster-c", "cluster-d"]);
    // cluster-c desires NEW and has not started it: it still runs OLD.
    assert_eq!(waves[0]["clusters"][0]["running"], OLD);

    // Labels from clusters/*.yaml; with a release, the state on that release counts.
    let eu = run(&["status", NEW, "--repo", &f.url, "-l", "region=eu", "--state", "not-started", "-o", "json"]);
    let m: Matrix = serde_json::from_slice(&eu.stdout).unwrap();
    let names: Vec<&str> = m.waves.iter().flat_map(|w| &w.clusters).map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["cluster-c"]);
    assert_eq!(m.waves[0].clusters[0].labels.get("region").map(String::as_str), Some("eu"));

    // -o json has the exact time the table shows as an age; -o wide shows it too.
    let json = run(&["status", "--repo", &f.url, "--cluster", "cluster-b", "-o", "json"]);
    let m: Matrix = serde_json::from_slice(&json.stdout).unwrap();
    let b = &m.waves[0].clusters[0];
    assert_eq!((b.name.as_str(), b.running.as_deref()), ("cluster-b", Some(OLD)));
    let seen = b.last_seen.expect("cluster-b reported").to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let wide = stdout(&run(&["status", "--repo", &f.url, "--cluster", "cluster-b", "-o", "wide"]));
    println!("{wide}");
    assert!(wide.contains(&format!("  cluster-b  {OLD}  {seen}  failure*")), "{wide}");

    let typo = run(&["status", "--repo", &f.url, "--cluster", "cluster-z"]);
    assert_eq!(typo.status.code(), Some(2));
    let err = String::from_utf8_lossy(&typo.stderr);
    assert!(err.contains("no cluster cluster-z in this fleet; its clusters: cluster-a, cluster-b"), "{err}");
    let bad = run(&["status", "--repo", &f.url, "--state", "broken"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected one of success, failure"));
}

/// A description with terminal controls (what a forged or careless status could carry) reaches
/// the table as visible text, never as an escape sequence; JSON keeps it exactly, escaped.
#[test]
fn control_characters_in_descriptions_never_reach_the_terminal() {
    let f = fleet();
    let agent = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(agent.path()).unwrap();
    repo.remote_anonymous(&f.url).unwrap().fetch(&["+refs/tags/*:refs/tags/*"], None, None).unwrap();
    let description = "\x1b[2J\x1b[32mall gates passed\x1b[0m\rsuccess\x07";
    let status = Status::new("cluster-c", NEW, &f.new, State::Failure, description);
    status::write(&repo, &GitRemote::new(&f.url), &status, &identity("cluster-c")).unwrap();

    let out = run(&["status", NEW, "--repo", &f.url]);
    let text = stdout(&out);
    println!("{text}");
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "a control character reached the terminal: {text:?}");
    // Shown as escapes (wrapped at spaces like any description); the CR became a space.
    for shown in [r"\u{1b}[2J\u{1b}[32mall", r"passed\u{1b}[0m", r"success\u{7}"] {
        assert!(text.contains(shown), "{shown} not in {text}");
    }

    let json = run(&["status", NEW, "--repo", &f.url, "-o", "json"]);
    assert!(!json.stdout.contains(&0x1b), "JSON output carries a raw ESC");
    let m: Matrix = serde_json::from_slice(&json.stdout).unwrap();
    let c = m.waves[1].clusters.iter().find(|c| c.name == "cluster-c").unwrap();
    // What the note holds (the status model already makes a description one line), ESC and all.
    assert!(status.description.contains('\x1b'), "{:?}", status.description);
    assert_eq!(c.cells[0].status.as_ref().unwrap().description, status.description);
}

/// A fleet repo (cluster-a in canary, cluster-b and cluster-c in prod) whose agents' status keys
/// are registered and whose `main` asks every cluster for rel-1, a signed release.
fn fleet_on_rel1() -> releng_common::Fixture {
    use fleetgate::releng::{Target, promote};
    let f = releng_common::Fixture::new();
    for c in ["cluster-a", "cluster-b", "cluster-c"] {
        let key = identity(c).signer.public().to_string();
        fleetgate::releng::register::register(&f.open(), "main", c, &key, None).unwrap();
    }
    f.release("rel-1", "v1.0.0");
    let req = promote::PromoteRequest {
        id: "rel-1".into(),
        target: Target::Fleet,
        base: "main".into(),
        branch: None,
        force: false,
    };
    let branch = promote::promote(&f.open(), &req, Some(&f.trust()), None).unwrap().branch;
    f.git(&["merge", "-q", "--ff-only", &branch]);
    f.git(&["branch", "-q", "-D", &branch]);
    f.git(&["tag", "-a", "approve/rel-1/prod", "-m", "CAB-1: approved", "rel-1^{commit}"]);
    f
}

fn wait_cmd(f: &releng_common::Fixture, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetgate"));
    cmd.arg("wait")
        .args(args)
        .args(["--repo", f.repo.to_str().unwrap()])
        .env("NO_COLOR", "1")
        .env_remove("FLEETGATE_REPO");
    cmd
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn states(j: &serde_json::Value) -> Vec<(String, String)> {
    j["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["cluster"].as_str().unwrap().to_string(), c["state"].as_str().unwrap().to_string()))
        .collect()
}

/// CI promotes, then waits: cluster-b has succeeded already, cluster-c reports while the wait
/// runs; the wait prints each change on stderr and exits 0 with the final states.
#[test]
fn wait_exits_0_once_every_cluster_of_the_wave_reports_success() {
    let f = fleet_on_rel1();
    status_support::report(&f.repo, "cluster-b", "rel-1", State::Success);
    let mut child = wait_cmd(&f, &["rel-1", "--wave", "prod", "--interval", "300ms", "--timeout", "60s", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap();
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    // cluster-c reports only once the wait has read the fleet without it.
    let first = rx.iter().find(|l| l.starts_with("cluster-c: ")).expect("a first line about cluster-c");
    assert_eq!(first, "cluster-c: not started");
    status_support::report(&f.repo, "cluster-c", "rel-1", State::Pending);
    std::thread::sleep(Duration::from_secs(1));
    status_support::report(&f.repo, "cluster-c", "rel-1", State::Success);
    let out = child.wait_with_output().unwrap();
    let err = reader.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("cluster-b: success\n"), "{err}");
    assert!(err.lines().any(|l| l.starts_with("cluster-c: ") && l.ends_with("→ success")), "{err}");
    assert!(err.contains("rel-1 reached success on 2 cluster(s)"), "{err}");
    let j = json_of(&out);
    assert_eq!(j["result"], "succeeded");
    assert_eq!(
        states(&j),
        [("cluster-b".to_string(), "success".to_string()), ("cluster-c".to_string(), "success".to_string())]
    );
    // An approval tag on the release's commit is not a release: the matrix has one column.
    let out = f.fleetgate(&["status", "--repo", "fleet", "-o", "json"]);
    let m: Matrix = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(m.releases.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["rel-1"]);
}

/// One cluster of the fleet reports failure: the wait ends at once with exit 1 and says which.
#[test]
fn wait_exits_1_when_a_cluster_reports_failure() {
    let f = fleet_on_rel1();
    status_support::report(&f.repo, "cluster-b", "rel-1", State::Success);
    status_support::report(&f.repo, "cluster-a", "rel-1", State::Failure);
    let out =
        wait_cmd(&f, &["rel-1", "--fleet", "--interval", "300ms", "--timeout", "60s", "-o", "json"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cluster-a: failure (reported by the test)\n"), "{err}");
    let j = json_of(&out);
    assert_eq!(j["result"], "failed");
    assert_eq!(states(&j)[0], ("cluster-a".to_string(), "failure".to_string()));
}

/// Nothing reports within the timeout: exit 124, naming what it still waited for; a cluster the
/// fleet does not have is a usage error (exit 2), as is a wait without a target.
#[test]
fn wait_exits_124_on_timeout_and_2_on_usage_errors() {
    let f = fleet_on_rel1();
    let out =
        wait_cmd(&f, &["rel-1", "--cluster", "cluster-c", "--interval", "1s", "--timeout", "3s"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{err}");
    assert!(err.contains("cluster-c: not started\n"), "{err}");
    assert!(err.contains("timed out after 3s; still waiting for cluster-c (not started)"), "{err}");
    let text = stdout(&out);
    assert!(text.starts_with("CLUSTER ") && text.contains("\ncluster-c            prod       not started"), "{text}");

    let out = wait_cmd(&f, &["rel-1", "--cluster", "nope", "--timeout", "3s"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown cluster nope; the fleet has: cluster-a, cluster-b, cluster-c"), "{err}");
    assert_eq!(wait_cmd(&f, &["rel-1"]).output().unwrap().status.code(), Some(2), "no target");
    let out = wait_cmd(&f, &["rel-9", "--fleet"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no release tag rel-9"));
}
