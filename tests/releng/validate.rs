//! `fleetgate validate` as a fleet repo's CI runs it: the built binary over real repos (a fresh
//! `fleetgate init`, and repos with real signed release tags), checking exit codes, findings with
//! file and line, signatures and CRD compatibility between consecutive releases.

use crate::fleet_support;

use fleet_support::{FleetRemote, RELEASE};
use fleetgate_testenv::git_in;
use std::path::Path;
use std::process::{Command, Output};

fn fleetgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(args)
        .env("NO_COLOR", "1")
        .current_dir(std::env::temp_dir())
        .output()
        .expect("run fleetgate")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

#[test]
fn init_then_validate_is_clean_and_says_there_are_no_releases_yet() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("x");
    let repo = repo.to_str().unwrap();

    let out = fleetgate(&["init", repo]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(Path::new(repo).join(".git").is_dir());

    let out = fleetgate(&["validate", "--repo", repo]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("no signed releases yet"), "{t}");
    assert!(t.contains("not checked (no --trusted-keys)"), "{t}");

    let report = json(&fleetgate(&["validate", "--repo", repo, "-o", "json"]));
    assert_eq!(report["releases"], serde_json::json!([]));
    assert_eq!(report["tip_release"]["id"], RELEASE);
    assert_eq!(report["summary"]["clusters"], 3);

    // A second init into the same directory is refused as a usage error.
    let out = fleetgate(&["init", repo]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("not empty"), "{}", text(&out));
}

#[test]
fn every_finding_is_reported_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("x");
    assert!(fleetgate(&["init", repo.to_str().unwrap()]).status.success());
    let edit = |file: &str, from: &str, to: &str| replace_in(&repo, file, from, to);
    edit("clusters/cluster-b.yaml", "wave: wave-1", "wave: wave-7");
    edit("policies/gates.yaml", "bakeTime: 10m", "bakeTime: 10m\n  bakeTimes: 5m");
    edit("operator/deployment.yaml", "redis-operator:v1.2.3-build.456", "redis-operator:v1.2.2");
    git_in(&repo, &["commit", "-q", "-a", "-m", "broken"]);

    let out = fleetgate(&["validate", "--repo", repo.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = text(&out);
    for expected in ["clusters/cluster-b.yaml:10", "policies/gates.yaml:12", "operator/deployment.yaml:29"] {
        assert!(t.contains(expected), "missing {expected} in:\n{t}");
    }

    let report = json(&fleetgate(&["validate", "--repo", repo.to_str().unwrap(), "-o", "json"]));
    let rules: Vec<&str> = report["config"]
        .as_array()
        .unwrap()
        .iter()
        .chain(report["tip_release"]["findings"].as_array().unwrap())
        .map(|f| f["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["reference", "schema", "image"], "{report:#}");
}

/// Settings that belong to the spoke (a forge with its token, a notification URL, a Prometheus
/// URL) still parse, and each is reported where it is written, saying which agent flag it belongs
/// to now.
#[test]
fn destinations_and_credentials_in_the_repo_are_findings_at_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("x");
    assert!(fleetgate(&["init", repo.to_str().unwrap()]).status.success());
    let edit = |file: &str, from: &str, to: &str| replace_in(&repo, file, from, to);
    edit(
        "fleet.yaml",
        "    forge: true\n",
        "    forge:\n      kind: github\n      url: https://api.github.com\n      repository: acme/fleet\n      \
         tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
    );
    edit("fleet.yaml", "    notify: default\n", "    notify:\n      url: https://hooks.slack.com/services/T/B/XXXX\n");
    edit("policies/gates.yaml", "  prometheus: default\n", "  prometheus:\n    url: http://prometheus:9090\n");
    git_in(&repo, &["commit", "-q", "-a", "-m", "old forms"]);
    let line = |file: &str, needle: &str| {
        let t = std::fs::read_to_string(repo.join(file)).unwrap();
        format!("{file}:{}", t.lines().position(|l| l.starts_with(needle)).unwrap() + 1)
    };
    let expected = [
        (line("fleet.yaml", "    forge:"), "--forge-url"),
        (line("fleet.yaml", "    notify:"), "--notify-url NAME=URL"),
        (line("policies/gates.yaml", "  prometheus:"), "--prometheus NAME=URL"),
    ];

    let out = fleetgate(&["validate", "--repo", repo.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = text(&out);
    for (at, flag) in &expected {
        let finding = t.lines().find(|l| l.contains(at.as_str())).unwrap_or_else(|| panic!("no {at} in:\n{t}"));
        assert!(finding.contains("[spoke-setting]") && finding.contains(flag), "{finding}");
    }
    assert!(!t.contains("XXXX"), "a webhook URL is a secret: {t}");

    let report = json(&fleetgate(&["validate", "--repo", repo.to_str().unwrap(), "-o", "json"]));
    let rules: Vec<&str> = report["config"].as_array().unwrap().iter().map(|f| f["rule"].as_str().unwrap()).collect();
    assert_eq!(rules, ["spoke-setting"; 3], "{report:#}");
}

#[test]
fn signed_releases_are_checked_against_trusted_keys_over_git() {
    let remote = FleetRemote::new();
    remote.signed_tag(RELEASE);
    let keys = remote.trusted.to_str().unwrap();

    let out = fleetgate(&["validate", "--repo", &remote.url, "--trusted-keys", keys, "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report = json(&out);
    assert_eq!(report["signatures_checked"], true);
    assert_eq!(report["releases"][0]["id"], RELEASE);
    assert_eq!(report["releases"][0]["signature"]["state"], "valid");
    assert_eq!(report["releases"][0]["signature"]["signer"], remote.fpr.as_str());

    // Without keys the same repo is clean too, signatures "not checked".
    let out = fleetgate(&["validate", "--repo", &remote.url]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("not checked"), "{}", text(&out));

    // A second release signed by a key nobody trusts is a finding.
    remote.git(&["commit", "-q", "--allow-empty", "-m", "next"]);
    remote.git(&["tag", "-a", "rel-20250316-001", "-m", "unsigned"]);
    remote.git(&["push", "-q", "origin", "main", "refs/tags/rel-20250316-001"]);
    let out = fleetgate(&["validate", "--repo", &remote.url, "--trusted-keys", keys]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("refs/tags/rel-20250316-001  [signature] not signed"), "{t}");
    // ...and its release.yaml still says rel-20250315-001.
    assert!(t.contains("rel-20250316-001:release.yaml:11  [release-id]"), "{t}");

    // --release limits the check to one tag.
    let out = fleetgate(&["validate", "--repo", &remote.url, "--trusted-keys", keys, "--release", RELEASE]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = fleetgate(&["validate", "--repo", &remote.url, "--release", "rel-nope"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn crd_changes_that_break_stored_objects_are_found_between_consecutive_releases() {
    let remote = FleetRemote::new();
    remote.signed_tag(RELEASE);
    // The next release stops serving v1alpha1 and drops a field of v1alpha2.
    let next = "rel-20250316-001";
    remote.edit("release.yaml", RELEASE, next);
    remote.edit("release.yaml", "sequence: 1", "sequence: 2");
    remote.edit(
        "operator/crds/redisclusters.cache.example.com.yaml",
        "    - name: v1alpha1\n      served: true",
        "    - name: v1alpha1\n      served: false",
    );
    remote.edit(
        "operator/crds/redisclusters.cache.example.com.yaml",
        "                readyShards: {type: integer}\n",
        "",
    );
    remote.commit_all("next release");
    remote.signed_tag(next);

    let out = fleetgate(&[
        "validate",
        "--repo",
        &remote.url,
        "--trusted-keys",
        remote.trusted.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = json(&out);
    let findings = report["releases"][1]["findings"].as_array().unwrap();
    assert!(!findings.is_empty(), "{report:#}");
    assert!(findings.iter().all(|f| f["rule"] == "crd-compatibility"), "{report:#}");
    assert!(
        findings.iter().all(|f| f["file"] == format!("{next}:operator/crds/redisclusters.cache.example.com.yaml")
            && f["line"].as_u64().is_some()),
        "{report:#}"
    );
    assert!(report["releases"][0]["findings"].as_array().unwrap().is_empty(), "{report:#}");
}

#[test]
fn content_the_release_own_admission_policy_refuses_is_a_finding() {
    let remote = FleetRemote::new();
    remote.edit(
        "operator/deployment.yaml",
        "            allowPrivilegeEscalation: false\n",
        "            allowPrivilegeEscalation: false\n            privileged: true\n",
    );
    remote.commit_all("a privileged operator");
    remote.signed_tag(RELEASE);
    let out = fleetgate(&["validate", "--repo", &remote.url, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report = json(&out);
    let findings = report["releases"][0]["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{report:#}");
    assert_eq!(findings[0]["rule"], "admission");
    assert_eq!(findings[0]["file"], format!("{RELEASE}:operator/deployment.yaml"));
    let message = findings[0]["message"].as_str().unwrap();
    assert!(
        message.contains("Deployment.apps redis-system/redis-operator: pod template spec.template.spec: container manager: securityContext.privileged is true, which Pod Security level baseline forbids"),
        "{message}"
    );
}

/// The policies that refuse `id`'s content, as `fleetgate validate --release ID` reports them
/// (with `--admission-policy FILE` when given), and as the agent's own call judges the same tag:
/// the baseline narrowed by the tag's policies, `AdmissionPolicy::check` over its manifests.
fn refused_by(remote: &FleetRemote, id: &str, baseline: Option<&Path>) -> (Vec<String>, Vec<String>) {
    use fleetgate::manifests::ManifestSet;
    use fleetgate::manifests::admission::{AdmissionPolicy, LiveApi};
    use fleetgate::model::{AdmissionBaseline, FleetConfig};
    use fleetgate::release::{UnverifiedRelease, read_release};

    let mut args: Vec<&str> = vec!["validate", "--repo", remote.url.as_str(), "--release", id, "-o", "json"];
    let file = baseline.map(|b| b.to_str().unwrap());
    args.extend(file.iter().flat_map(|f| ["--admission-policy", *f]));
    let report = json(&fleetgate(&args));
    let findings = report["releases"][0]["findings"].as_array().unwrap();
    let mut by_validate: Vec<String> = findings
        .iter()
        .filter(|f| f["rule"] == "admission")
        .flat_map(|f| {
            let message = f["message"].as_str().unwrap();
            let policies = message.rsplit_once(" — refused by ").unwrap().1;
            policies.split(", ").map(str::to_string).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(findings.len(), usize::from(!by_validate.is_empty()), "only admission findings: {report:#}");

    let checkout = fleetgate::source::Checkout::open_local(&remote.work, Some("main")).unwrap();
    let tree = checkout.tag_tree(&checkout.tag(id).unwrap().unwrap()).unwrap();
    let content = read_release(&tree, Some(id)).unwrap().0.unwrap();
    let config = FleetConfig::load(&tree).unwrap();
    let spec = AdmissionBaseline::read_or_shipped(baseline).unwrap().spec;
    let policy = config.admission_policies.iter().fold(AdmissionPolicy::baseline(spec), |p, r| p.narrowed_by(r));
    let release = UnverifiedRelease::new(id, content);
    let set = ManifestSet::from_release(&release, &fleetgate::apply::builtin_scope).unwrap();
    let verdict = policy.check(&set, &LiveApi::offline(Vec::new(), "fleetgate-system"));
    let mut by_agent: Vec<String> = verdict.err().into_iter().flat_map(|e| e.violations).map(|v| v.policy).collect();
    by_validate.sort();
    by_agent.sort();
    (by_validate, by_agent)
}

/// A release the agents' baseline refuses is a finding although its own policy admits it, and
/// one its own policy refuses is a finding although the baseline admits it: validate judges by
/// the same effective policy as the agent, baseline from `--admission-policy` (default deploy/'s).
#[test]
fn validate_and_the_agent_judge_by_the_baseline_narrowed_by_the_release_policies() {
    const NARROWED: &str = "rel-20250316-001";
    let remote = FleetRemote::new();
    remote.edit(
        "operator/deployment.yaml",
        "            allowPrivilegeEscalation: false\n",
        "            allowPrivilegeEscalation: false\n            privileged: true\n",
    );
    // RELEASE: its own policy allows privileged pods; deploy/'s baseline does not.
    remote.edit("policies/admission.yaml", "podSecurity: baseline", "podSecurity: privileged");
    remote.commit_all("a privileged operator, allowed by the repo");
    remote.signed_tag(RELEASE);
    // NARROWED: the same pods, its own policy refuses them.
    remote.edit("policies/admission.yaml", "podSecurity: privileged", "podSecurity: baseline");
    remote.edit("release.yaml", &format!("name: {RELEASE}"), &format!("name: {NARROWED}"));
    remote.edit("release.yaml", "sequence: 1", "sequence: 2");
    remote.commit_all("the repo narrows");
    remote.signed_tag(NARROWED);
    let permissive = remote.dir.path().join("permissive-baseline.yaml");
    std::fs::write(
        &permissive,
        "apiVersion: fleetgate.io/v1alpha1\nkind: ReleaseAdmissionPolicy\nmetadata: {name: permissive}\nspec: {podSecurity: privileged, allowedRbac: [clusterPods]}\n",
    )
    .unwrap();

    let baseline = "agent baseline".to_string();
    let repo = "ReleaseAdmissionPolicy redis-operator".to_string();
    for (id, file, expected) in [
        (RELEASE, None, vec![baseline.clone()]),
        (RELEASE, Some(permissive.as_path()), vec![]),
        (NARROWED, None, vec![baseline.clone(), repo.clone()]),
        (NARROWED, Some(permissive.as_path()), vec![repo.clone()]),
    ] {
        let mut expected = expected;
        expected.sort();
        let (by_validate, by_agent) = refused_by(&remote, id, file);
        assert_eq!(by_validate, expected, "{id} with {file:?}: validate");
        assert_eq!(by_agent, expected, "{id} with {file:?}: the agent");
    }
}

#[test]
fn unreadable_keys_and_repos_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = fleetgate(&["validate", "--repo", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let repo = dir.path().join("x");
    assert!(fleetgate(&["init", repo.to_str().unwrap()]).status.success());
    let out = fleetgate(&["validate", "--repo", repo.to_str().unwrap(), "--trusted-keys", "/nonexistent.asc"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("/nonexistent.asc"), "{}", text(&out));
}

/// Replaces the first `from` in `repo`'s `file` by `to`; the file must contain it.
fn replace_in(repo: &Path, file: &str, from: &str, to: &str) {
    let p = repo.join(file);
    let t = std::fs::read_to_string(&p).unwrap();
    assert!(t.contains(from), "{file} lacks {from}");
    std::fs::write(&p, t.replacen(from, to, 1)).unwrap();
}
