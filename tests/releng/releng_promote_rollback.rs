//! `promote` then `rollback` on a real repository with real signed releases: what `main` says
//! after each step, when a rollback is a true revert and when an explicit change, where each
//! cluster goes (its own last success, from its agent's signed statuses), and every refusal with
//! its specific reason.

use crate::releng_common;
use crate::status_support;

use fleetgate::releng::promote::{self, PromoteOutcome, PromoteReport, PromoteRequest};
use fleetgate::releng::rollback::{self, RollbackMethod, RollbackRequest};
use fleetgate::releng::{Refusal, RelengError, Target};
use fleetgate::status::{self, GitRemote, State, Status};
use releng_common::*;

fn promote_req(id: &str, target: Target) -> PromoteRequest {
    PromoteRequest { id: id.into(), target, base: "main".into(), branch: None, force: false }
}

fn run_promote(f: &Fixture, req: &PromoteRequest) -> Result<PromoteReport, RelengError> {
    promote::promote(&f.open(), req, Some(&f.trust()), None)
}

fn rollback_req(target: Target) -> RollbackRequest {
    RollbackRequest {
        target,
        to: None,
        reason: Some("error rate 7 % on canary".into()),
        base: "main".into(),
        branch: None,
        staged: false,
        dry_run: false,
    }
}

/// Desired release of each cluster on `main`, as `name=release` (or `name=-`).
fn desired(f: &Fixture) -> String {
    let fleet = f.show("main", "fleet.yaml");
    let fleet_rel = fleet.lines().find_map(|l| l.strip_prefix("  release: ")).map(str::to_string);
    ["cluster-a", "cluster-b", "cluster-c"]
        .iter()
        .map(|c| {
            let text = f.show("main", &format!("clusters/{c}.yaml"));
            let pin = text.lines().find_map(|l| l.strip_prefix("  release: ")).map(str::to_string);
            format!("{c}={}", pin.or(fleet_rel.clone()).unwrap_or_else(|| "-".into()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Registers every cluster's status key on `main`, as `cluster register` does when a cluster joins.
fn register_agents(f: &Fixture) {
    for c in ["cluster-a", "cluster-b", "cluster-c"] {
        let key = status_support::identity(c).signer.public().to_string();
        fleetgate::releng::register::register(&f.open(), "main", c, &key, None).unwrap();
    }
}

/// Each of `clusters` reports `success` for release `id`, signed by its agent's key.
fn succeeded(f: &Fixture, clusters: &[&str], id: &str) {
    for c in clusters {
        status_support::report(&f.repo, c, id, State::Success);
    }
}

/// Merges `branch` into `main` the way a forge's merge button does (a merge commit).
fn merge(f: &Fixture, branch: &str) {
    f.git(&["merge", "-q", "--no-ff", "-m", &format!("Merge {branch}"), branch]);
}

#[test]
fn promote_then_rollback_leaves_main_as_expected() {
    let f = Fixture::new();
    register_agents(&f);
    let registered = f.show("main", "clusters/cluster-a.yaml");
    f.release("rel-1", "v1.0.0");
    // The whole fleet on rel-1.
    let r = run_promote(&f, &promote_req("rel-1", Target::Fleet)).unwrap();
    assert_eq!(r.outcome, PromoteOutcome::Prepared);
    assert_eq!(r.branch, "promote/rel-1-fleet");
    assert_eq!(r.signer.as_deref(), Some(f.fpr.as_str()));
    assert_eq!(r.clusters.len(), 3);
    assert!(r.clusters.iter().all(|m| m.from.is_none() && m.to == "rel-1"));
    assert_eq!(desired(&f), "cluster-a=- cluster-b=- cluster-c=-", "main is untouched until the PR merges");
    merge(&f, "promote/rel-1-fleet");
    assert_eq!(desired(&f), "cluster-a=rel-1 cluster-b=rel-1 cluster-c=rel-1");
    succeeded(&f, &["cluster-a", "cluster-b", "cluster-c"], "rel-1");
    // Comments survive the edit and the value sits next to its commented example.
    let fleet = f.show("main", "fleet.yaml");
    assert!(fleet.starts_with("# The fleet.\n"), "{fleet}");
    assert!(fleet.contains("  # release: rel-0\n  release: rel-1\n"), "{fleet}");

    // rel-2 to the canary wave.
    f.release("rel-2", "v1.1.0");
    let r = run_promote(&f, &promote_req("rel-2", Target::Wave("canary".into()))).unwrap();
    assert_eq!(r.branch, "promote/rel-2-wave-canary");
    assert_eq!(r.clusters.len(), 1);
    assert_eq!((r.clusters[0].cluster.as_str(), r.clusters[0].from.as_deref()), ("cluster-a", Some("rel-1")));
    assert!(r.earlier_waves.is_empty(), "canary is the first wave");
    assert_eq!(r.crd_compatibility.len(), 1);
    assert!(r.crd_compatibility[0].verdict.compatible && r.crd_compatibility[0].verdict.compared);
    let message = f.git(&["log", "-1", "--format=%B", "promote/rel-2-wave-canary"]);
    assert!(message.starts_with("promote rel-2 to wave canary\n"), "{message}");
    assert!(message.contains("cluster-a (wave canary): rel-1 -> rel-2"), "{message}");
    assert!(
        message.contains("image:         registry.example.com/redis-operator:v1.1.0"),
        "lists the mapping: {message}"
    );
    // Re-running finds the branch prepared.
    let again = run_promote(&f, &promote_req("rel-2", Target::Wave("canary".into()))).unwrap();
    assert_eq!(again.outcome, PromoteOutcome::AlreadyPrepared);
    merge(&f, "promote/rel-2-wave-canary");
    assert_eq!(desired(&f), "cluster-a=rel-2 cluster-b=rel-1 cluster-c=rel-1");
    let promoted = f.git(&["rev-parse", "main"]);

    // Roll the canary back: the merge of exactly that promotion is reverted.
    let rb = rollback::rollback(&f.open(), &rollback_req(Target::Wave("canary".into())), None).unwrap();
    assert_eq!(rb.method, RollbackMethod::Revert);
    assert_eq!(rb.reverted.as_deref(), Some(promoted.as_str()));
    assert_eq!(rb.branch, "main");
    assert_eq!(f.git(&["rev-parse", "main"]), rb.commit);
    assert_eq!(desired(&f), "cluster-a=rel-1 cluster-b=rel-1 cluster-c=rel-1");
    assert_eq!(f.show("main", "clusters/cluster-a.yaml"), registered, "byte for byte back");
    let message = f.git(&["log", "-1", "--format=%B", "main"]);
    assert!(message.starts_with("Revert \"Merge promote/rel-2-wave-canary\"\n\nThis reverts commit "), "{message}");
    assert!(message.contains("cluster-a (wave canary): rel-2 -> rel-1"), "{message}");
    assert!(message.contains("Reason: error rate 7 % on canary"), "{message}");
    assert_eq!(f.git(&["status", "--porcelain"]), "", "the work tree followed main");

    // Rolling back again would mean going forward to rel-2: refused, with what to do.
    match rollback::rollback(&f.open(), &rollback_req(Target::Wave("canary".into())), None) {
        Err(RelengError::Refused(Refusal::NothingToRollBack(why))) => {
            assert!(why.contains("cluster-a was already rolled back by commit"), "{why}");
            assert!(why.contains("--to ID"), "{why}");
        }
        other => panic!("expected nothing-to-roll-back, got {other:?}"),
    }
}

#[test]
fn rolling_back_part_of_a_promotion_is_an_explicit_change() {
    let f = Fixture::new();
    register_agents(&f);
    f.release("rel-1", "v1.0.0");
    merge(&f, &run_promote(&f, &promote_req("rel-1", Target::Fleet)).unwrap().branch);
    succeeded(&f, &["cluster-a", "cluster-b", "cluster-c"], "rel-1");
    f.release("rel-2", "v1.1.0");
    // prod holds two clusters; promote both, roll back one.
    let r = promote::promote(
        &f.open(),
        &PromoteRequest { force: true, ..promote_req("rel-2", Target::Wave("prod".into())) },
        Some(&f.trust()),
        None,
    )
    .unwrap();
    assert_eq!(r.clusters.len(), 2);
    merge(&f, &r.branch);
    assert_eq!(desired(&f), "cluster-a=rel-1 cluster-b=rel-2 cluster-c=rel-2");
    let rb = rollback::rollback(&f.open(), &rollback_req(Target::Cluster("cluster-b".into())), None).unwrap();
    assert_eq!(rb.method, RollbackMethod::Explicit);
    assert_eq!(desired(&f), "cluster-a=rel-1 cluster-b=rel-1 cluster-c=rel-2");
    let message = f.git(&["log", "-1", "--format=%B", "main"]);
    assert!(message.starts_with("rollback cluster cluster-b: rel-2 -> rel-1\n"), "{message}");
    // The fleet says rel-1, so cluster-b loses its pin instead of being pinned to rel-1.
    assert!(!f.show("main", "clusters/cluster-b.yaml").contains("\n  release:"));

    // --to on a branch for a PR: main stays, the branch carries the change.
    let before = f.git(&["rev-parse", "main"]);
    let req = RollbackRequest {
        to: Some("rel-1".into()),
        branch: Some("rollback/prod".into()),
        ..rollback_req(Target::Wave("prod".into()))
    };
    let rb = rollback::rollback(&f.open(), &req, None).unwrap();
    assert_eq!(rb.branch, "rollback/prod");
    assert_eq!(rb.clusters.len(), 1, "only cluster-c still runs rel-2");
    assert_eq!(f.git(&["rev-parse", "main"]), before);
    assert!(!f.show("rollback/prod", "clusters/cluster-c.yaml").contains("\n  release:"));
}

#[test]
fn promotion_refuses_unsigned_untargeted_and_failed_releases() {
    let f = Fixture::new();
    f.release("rel-1", "v1.0.0");
    merge(&f, &run_promote(&f, &promote_req("rel-1", Target::Fleet)).unwrap().branch);

    // Unsigned: rel-2's tag replaced by a lightweight one on the same commit.
    f.release("rel-2", "v1.1.0");
    f.git(&["tag", "-f", "rel-2", "rel-2^{commit}"]);
    match run_promote(&f, &promote_req("rel-2", Target::Cluster("cluster-a".into()))) {
        Err(e @ RelengError::Refused(Refusal::Unsigned { .. })) => {
            let text = e.to_string();
            assert!(text.contains("rel-2 is a lightweight tag"), "{text}");
            assert!(text.contains("--force"), "says how to override: {text}");
        }
        other => panic!("expected unsigned, got {other:?}"),
    }
    assert!(f.git(&["branch", "--list", "promote/rel-2*"]).is_empty(), "no branch for a refused promotion");

    // Signed, but by a key the agents do not trust.
    let other = fleetgate_testenv::GpgHome::new().unwrap();
    let other_fpr = other.generate_key("Intruder", "intruder@example.com").unwrap();
    let m = f.manifests("render-3", "v1.2.0", "v1alpha2", &["size"], &[]);
    let mut intruder = fleetgate::releng::Signer::open(&other_fpr, Some(other.path())).unwrap();
    fleetgate::releng::create::create(&f.open(), &f.request("rel-3", &m, "v1.2.0"), &mut intruder).unwrap();
    match run_promote(&f, &promote_req("rel-3", Target::Cluster("cluster-a".into()))) {
        Err(e @ RelengError::Refused(Refusal::Unsigned { .. })) => {
            let text = e.to_string();
            assert!(
                text.contains(&format!("signed by key {other_fpr}, which is not among the trusted keys")),
                "{text}"
            );
        }
        other => panic!("expected unsigned, got {other:?}"),
    }
    // --force goes on and records what it overrode.
    let forced = promote::promote(
        &f.open(),
        &PromoteRequest { force: true, ..promote_req("rel-3", Target::Cluster("cluster-a".into())) },
        Some(&f.trust()),
        None,
    )
    .unwrap();
    assert_eq!(forced.outcome, PromoteOutcome::Prepared);
    assert_eq!(forced.signer, None);
    assert!(matches!(forced.overridden.as_slice(), [Refusal::Unsigned { .. }]), "{:?}", forced.overridden);
    assert!(f.git(&["log", "-1", "--format=%B", &forced.branch]).contains("Forced past: release rel-3 is not signed"));

    // Not targeted: rel-4 names only cluster-a and cluster-b.
    let m = f.manifests("render-4", "v1.3.0", "v1alpha2", &["size"], &[]);
    let mut req = f.request("rel-4", &m, "v1.3.0");
    req.targets = fleetgate::releng::create::Targets::List(vec!["cluster-a".into(), "cluster-b".into()]);
    f.create(&req).unwrap();
    match run_promote(&f, &promote_req("rel-4", Target::Wave("prod".into()))) {
        Err(RelengError::Refused(Refusal::NotTargeted { clusters, targets, .. })) => {
            assert_eq!(clusters, ["cluster-c"]);
            assert_eq!(targets, ["cluster-a", "cluster-b"]);
        }
        other => panic!("expected not-targeted, got {other:?}"),
    }

    // Failed on an earlier wave: cluster-a (canary) reported failure for rel-4.
    let tag_commit = f.git(&["rev-parse", "rel-4^{commit}"]);
    let remote = f.dir.path().join("statuses.git");
    git_in(f.dir.path(), &["init", "-q", "--bare", remote.to_str().unwrap()]);
    let failure =
        Status::new("cluster-a", "rel-4", &tag_commit, State::Failure, "rolled back to rel-1: error-rate 7.3 % > 5 %");
    let canary = status_support::identity("cluster-a");
    // Unregistered, the failure is not believed and blocks nothing; `cluster register` fixes that.
    status::write(f.open().git(), &GitRemote::new(remote.to_str().unwrap()), &failure, &canary).unwrap();
    let unblocked = run_promote(&f, &promote_req("rel-4", Target::Cluster("cluster-b".into()))).unwrap();
    f.git(&["branch", "-D", &unblocked.branch]);
    let key = canary.signer.public().to_string();
    let registered = fleetgate::releng::register::register(&f.open(), "main", "cluster-a", &key, None).unwrap();
    assert!(matches!(registered, fleetgate::releng::register::Registered::Committed(_)));
    assert!(f.show("main", "clusters/cluster-a.yaml").contains(&format!("\n  statusKey: {key}\n  wave: canary\n")));
    assert_eq!(
        fleetgate::releng::register::register(&f.open(), "main", "cluster-a", &key, None).unwrap(),
        fleetgate::releng::register::Registered::Unchanged
    );
    match run_promote(&f, &promote_req("rel-4", Target::Cluster("cluster-b".into()))) {
        Err(e @ RelengError::Refused(Refusal::FailedEarlierWave { .. })) => {
            let text = e.to_string();
            assert!(text.contains("cluster-a (wave canary): rolled back to rel-1: error-rate 7.3 % > 5 %"), "{text}");
        }
        other => panic!("expected failed-earlier-wave, got {other:?}"),
    }
    // The canary is not an earlier wave of itself.
    let r = run_promote(&f, &promote_req("rel-4", Target::Cluster("cluster-a".into()))).unwrap();
    assert_eq!(r.outcome, PromoteOutcome::Prepared);

    // Without trusted keys there is nothing to check the signature with: a usage error.
    match promote::promote(&f.open(), &promote_req("rel-4", Target::Cluster("cluster-b".into())), None, None) {
        Err(RelengError::Usage(msg)) => assert!(msg.contains("--trusted-keys"), "{msg}"),
        other => panic!("expected a usage error, got {other:?}"),
    }
}

#[test]
fn fleet_promotion_drops_pins_and_the_command_line_prints_and_exits() {
    let f = Fixture::new();
    register_agents(&f);
    f.release("rel-1", "v1.0.0");
    merge(&f, &run_promote(&f, &promote_req("rel-1", Target::Fleet)).unwrap().branch);
    succeeded(&f, &["cluster-a", "cluster-b", "cluster-c"], "rel-1");
    f.release("rel-2", "v1.1.0");
    merge(&f, &run_promote(&f, &promote_req("rel-2", Target::Cluster("cluster-a".into()))).unwrap().branch);
    assert!(f.show("main", "clusters/cluster-a.yaml").contains("  release: rel-2"));

    let keys = f.keys.to_str().unwrap().to_string();
    let out = f.fleetgate(&["promote", "rel-2", "--fleet", "--repo", "fleet", "--trusted-keys", &keys]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("Prepared the promotion of rel-2 to the fleet on branch promote/rel-2-fleet"), "{text}");
    assert!(text.contains("cluster-b            wave prod       rel-1 -> rel-2"), "{text}");
    assert!(
        !text.contains("-> rel-2\n    cluster-a") && !text.contains("cluster-a            wave canary     rel-"),
        "cluster-a already runs rel-2: {text}"
    );
    assert!(
        text.contains("statuses of rel-2 on earlier waves\n    cluster-a            wave canary     no status\n"),
        "{text}"
    );
    assert!(
        text.contains("Next: review and merge it into main: git -C fleet merge --ff-only promote/rel-2-fleet"),
        "{text}"
    );
    f.git(&["merge", "-q", "--ff-only", "promote/rel-2-fleet"]);
    assert_eq!(desired(&f), "cluster-a=rel-2 cluster-b=rel-2 cluster-c=rel-2");
    assert!(!f.show("main", "clusters/cluster-a.yaml").contains("\n  release:"), "the pin is gone");

    // Nothing left to do: exit 0 and say so.
    let out =
        f.fleetgate(&["promote", "rel-2", "--wave", "prod", "--repo", "fleet", "--trusted-keys", &keys, "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json(&out)["outcome"], "already-promoted");

    // Refusal: exit 1 with the code; usage errors: exit 2.
    let out = f.fleetgate(&["promote", "rel-2", "--cluster", "nope", "--repo", "fleet", "--trusted-keys", &keys]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unknown cluster nope; the fleet has: cluster-a, cluster-b, cluster-c"),
        "{}",
        stderr(&out)
    );
    let out = f.fleetgate(&["promote", "rel-2", "--cluster", "cluster-a", "--wave", "prod", "--repo", "fleet"]);
    assert_eq!(out.status.code(), Some(2), "two targets is a usage error");
    let out = f.fleetgate(&["promote", "rel-9", "--fleet", "--repo", "fleet", "--trusted-keys", &keys, "-o", "json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json(&out)["result"], "error");

    // Rollback from the command line: every cluster goes back to its last success, rel-1 for all,
    // so fleet.yaml says rel-1.
    let out = f.fleetgate(&["rollback", "--fleet", "--repo", "fleet", "--reason", "p99 latency", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let j = json(&out);
    assert_eq!(j["method"], "explicit", "two promotion commits are behind the fleet's state");
    assert_eq!(j["reason"], "p99 latency");
    assert_eq!(desired(&f), "cluster-a=rel-1 cluster-b=rel-1 cluster-c=rel-1");
    let out = f.fleetgate(&["rollback", "--fleet", "--repo", "fleet"]);
    assert_eq!(out.status.code(), Some(1), "a second rollback is refused");
    assert!(stderr(&out).starts_with("refused: cluster-a was already rolled back"), "{}", stderr(&out));
}

/// `rollback --list` and `rollback --dry-run`: what each cluster can go back to, and what a
/// rollback will do there — where it goes and why, whether its agent sees a rollback, the CRDs
/// kept because the target's are narrower, what is restored — for people and pipelines, with
/// nothing written; then the rollback itself prints the same before it commits.
#[test]
fn rollback_lists_candidates_and_previews_before_writing() {
    let f = Fixture::new();
    register_agents(&f);
    f.release("rel-1", "v1.0.0");
    merge(&f, &run_promote(&f, &promote_req("rel-1", Target::Fleet)).unwrap().branch);
    succeeded(&f, &["cluster-a", "cluster-b", "cluster-c"], "rel-1");
    // rel-2 adds an optional field to the CRD, as nearly every operator upgrade does.
    let m2 = f.manifests("render-2", "v1.1.0", "v1alpha2", &["size", "shards"], &[]);
    f.create(&f.request("rel-2", &m2, "v1.1.0")).unwrap();
    merge(&f, &run_promote(&f, &promote_req("rel-2", Target::Wave("canary".into()))).unwrap().branch);
    status_support::report(&f.repo, "cluster-a", "rel-2", State::Success);

    // Candidates: newest first, the desired one marked.
    let out = f.fleetgate(&["rollback", "--list", "--repo", "fleet"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let table = stdout(&out);
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["CLUSTER", "WAVE", "RELEASE", "SUCCEEDED", "NOTE"], "{table}");
    let cells = |r: &Vec<&str>| (r[0].to_string(), r[2].to_string(), r[5..].join(" "));
    assert_eq!(
        rows[1..].iter().map(cells).collect::<Vec<_>>(),
        [
            ("cluster-a".into(), "rel-2".into(), "desired now".into()),
            ("cluster-a".into(), "rel-1".into(), String::new()),
            ("cluster-b".into(), "rel-1".into(), "desired now".into()),
            ("cluster-c".into(), "rel-1".into(), "desired now".into()),
        ],
        "{table}"
    );
    let j = json(&f.fleetgate(&["rollback", "--list", "--cluster", "cluster-a", "--repo", "fleet", "-o", "json"]));
    let clusters = j["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 1);
    assert_eq!((clusters[0]["cluster"].as_str(), clusters[0]["desired"].as_str()), (Some("cluster-a"), Some("rel-2")));
    let releases: Vec<&str> =
        clusters[0]["candidates"].as_array().unwrap().iter().map(|c| c["release"].as_str().unwrap()).collect();
    assert_eq!(releases, ["rel-2", "rel-1"]);
    assert_eq!(clusters[0]["candidates"][0]["desired"], true);

    // The dry run says everything and writes nothing.
    let before = (f.git(&["rev-parse", "main"]), f.git(&["for-each-ref"]));
    let out = f.fleetgate(&["rollback", "--cluster", "cluster-a", "--repo", "fleet", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let crd = "redisclusters.cache.example.com";
    for line in [
        "Would roll back cluster cluster-a\n".to_string(),
        "  cluster-a (wave canary): rel-2 -> rel-1\n".into(),
        "      why       last success here at ".into(),
        "      agent     a rollback: rel-1 succeeded here (".into(),
        format!("      keeps     CRD {crd} (rel-2's is wider):\n                  - v1alpha2 .spec.shards: field removed\n"),
        "      restores  custom resources from the snapshot taken before rel-2 was applied (the cluster ran rel-1 then)\n".into(),
        "Next: nothing was written; to roll back: fleetgate rollback --cluster cluster-a --repo fleet\n".into(),
    ] {
        assert!(text.contains(&line), "missing {line:?} in:\n{text}");
    }
    assert_eq!((f.git(&["rev-parse", "main"]), f.git(&["for-each-ref"])), before, "a dry run writes nothing");
    assert_eq!(desired(&f), "cluster-a=rel-2 cluster-b=rel-1 cluster-c=rel-1");

    let out = f.fleetgate(&["rollback", "--cluster", "cluster-a", "--repo", "fleet", "--dry-run", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let j = json(&out);
    assert_eq!(j["dryRun"], true);
    assert!(j.get("commit").is_none(), "no commit on a dry run: {j}");
    let p = &j["preview"][0];
    assert_eq!(
        (p["cluster"].as_str(), p["from"].as_str(), p["to"].as_str()),
        (Some("cluster-a"), Some("rel-2"), Some("rel-1"))
    );
    assert_eq!(p["succeededHere"]["release"], "rel-1");
    assert_eq!(p["widerCrds"][0]["name"], crd);
    assert_eq!(p["restores"], true);
    assert_eq!((f.git(&["rev-parse", "main"]), f.git(&["for-each-ref"])), before);

    // A move to a release that never succeeded on the cluster is a promotion for its agent: the
    // narrower CRD is what its CRD gate blocks, and there is nothing to restore.
    let out = f.fleetgate(&["rollback", "--cluster", "cluster-b", "--to", "rel-2", "--repo", "fleet", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("  cluster-b (wave prod): rel-1 -> rel-2\n      why       asked for (--to)\n"), "{text}");
    assert!(text.contains("      agent     a promotion: rel-2 never succeeded here"), "{text}");
    assert!(text.contains("      blocks    no CRD: rel-2's CRDs take everything rel-1's do\n"), "{text}");
    assert!(text.contains("      restores  nothing: rel-2 never succeeded here"), "{text}");

    // The rollback itself: the same preview first, then the commit.
    let out = f.fleetgate(&["rollback", "--cluster", "cluster-a", "--repo", "fleet", "--reason", "p99"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let preview =
        text.find("Rolling back cluster cluster-a\n  cluster-a (wave canary): rel-2 -> rel-1\n").expect(&text);
    let done = text.find("Rolled back cluster cluster-a on branch main").expect(&text);
    assert!(preview < done, "{text}");
    assert_eq!(desired(&f), "cluster-a=rel-1 cluster-b=rel-1 cluster-c=rel-1");
}

/// A fleet-wide rollback is immediate by default; `--staged` rolls back the first wave and names
/// the command for each later one, which finishes the job.
#[test]
fn a_staged_fleet_rollback_goes_wave_by_wave() {
    let f = Fixture::new();
    register_agents(&f);
    f.release("rel-1", "v1.0.0");
    merge(&f, &run_promote(&f, &promote_req("rel-1", Target::Fleet)).unwrap().branch);
    succeeded(&f, &["cluster-a", "cluster-b", "cluster-c"], "rel-1");
    f.release("rel-2", "v1.1.0");
    merge(&f, &run_promote(&f, &promote_req("rel-2", Target::Fleet)).unwrap().branch);

    let out = f.fleetgate(&["rollback", "--wave", "prod", "--staged", "--repo", "fleet"]);
    assert_eq!(out.status.code(), Some(2), "--staged is for the fleet: {}", stderr(&out));

    let out = f.fleetgate(&["rollback", "--fleet", "--staged", "--repo", "fleet", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let j = json(&out);
    assert_eq!(desired(&f), "cluster-a=rel-1 cluster-b=rel-2 cluster-c=rel-2", "only the first wave went back");
    assert_eq!(j["clusters"].as_array().unwrap().len(), 1);
    assert_eq!(j["later"][0]["wave"], "prod");
    let args: Vec<String> =
        j["later"][0]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
    assert_eq!(args, ["rollback", "--fleet", "--to", "rel-1"]);
    assert!(
        f.git(&["log", "-1", "--format=%B", "main"])
            .contains("Later, wave prod: fleetgate rollback --fleet --to rel-1")
    );

    // The printed step, run as it is: the whole fleet on rel-1, pins gone.
    let mut step: Vec<&str> = args.iter().map(String::as_str).collect();
    step.extend(["--repo", "fleet"]);
    let out = f.fleetgate(&step);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(desired(&f), "cluster-a=rel-1 cluster-b=rel-1 cluster-c=rel-1");
    assert!(!f.show("main", "clusters/cluster-a.yaml").contains("\n  release:"), "the first wave's pin is gone");
    assert!(f.show("main", "fleet.yaml").contains("  release: rel-1\n"));
}

/// Clusters of one fleet ran different histories: the canary succeeded on rel-2 and rel-3 (rel-3
/// revoked since), cluster-b only ever on rel-1, cluster-c on nothing before rel-4. A fleet-wide
/// rollback sends each to its own last success — never to a release it did not run, which its
/// agent would judge as a promotion — and leaves cluster-c where it is, saying how to move it.
#[test]
fn a_fleet_rollback_sends_each_cluster_to_its_own_last_success() {
    let f = Fixture::new();
    register_agents(&f);
    f.release("rel-1", "v1.0.0");
    merge(&f, &run_promote(&f, &promote_req("rel-1", Target::Fleet)).unwrap().branch);
    succeeded(&f, &["cluster-a", "cluster-b"], "rel-1");
    status_support::report(&f.repo, "cluster-c", "rel-1", State::Error);
    for (id, tag) in [("rel-2", "v1.1.0"), ("rel-3", "v1.2.0")] {
        f.release(id, tag);
        merge(&f, &run_promote(&f, &promote_req(id, Target::Wave("canary".into()))).unwrap().branch);
        succeeded(&f, &["cluster-a"], id);
    }
    let m4 = f.manifests("render-rel-4", "v1.3.0", "v1alpha2", &["size"], &[]);
    f.create(&fleetgate::releng::create::CreateRequest {
        revokes: vec!["rel-3".into()],
        ..f.request("rel-4", &m4, "v1.3.0")
    })
    .unwrap();
    merge(&f, &run_promote(&f, &promote_req("rel-4", Target::Fleet)).unwrap().branch);
    assert_eq!(desired(&f), "cluster-a=rel-4 cluster-b=rel-4 cluster-c=rel-4");
    status_support::report(&f.repo, "cluster-c", "rel-4", State::Pending);

    // The dry run: per cluster from → to and why, cluster-c left alone; nothing written.
    let before = (f.git(&["rev-parse", "main"]), f.git(&["for-each-ref"]));
    let out = f.fleetgate(&["rollback", "--fleet", "--repo", "fleet", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    for line in [
        "Would roll back the fleet\n",
        "  cluster-a (wave canary): rel-4 -> rel-2\n      why       last success here at ",
        "; skipped rel-3 (revoked)\n      agent     a rollback: rel-2 succeeded here (",
        "  cluster-b (wave prod): rel-4 -> rel-1\n      why       last success here at ",
        "      agent     a rollback: rel-1 succeeded here (",
        "  cluster-c (wave prod): stays on rel-4\n      why       no release other than rel-4 succeeded on cluster-c",
        "to move it anyway: fleetgate rollback --cluster cluster-c --to ID\n",
        "Next: nothing was written; to roll back: fleetgate rollback --fleet --repo fleet\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert!(!text.contains("a promotion:"), "every move is a rollback for its agent:\n{text}");
    assert_eq!((f.git(&["rev-parse", "main"]), f.git(&["for-each-ref"])), before, "a dry run writes nothing");

    let out = f.fleetgate(&["rollback", "--fleet", "--repo", "fleet", "--dry-run", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let j = json(&out);
    let moves: Vec<(&str, &str, &str, &str)> = j["preview"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["cluster"].as_str().unwrap(),
                p["from"].as_str().unwrap(),
                p["to"].as_str().unwrap(),
                p["succeededHere"]["release"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(moves, [("cluster-a", "rel-4", "rel-2", "rel-2"), ("cluster-b", "rel-4", "rel-1", "rel-1")]);
    assert!(j["preview"][0]["why"].as_str().unwrap().starts_with("last success here at "), "{j}");
    let left = j["leftAlone"].as_array().unwrap();
    assert_eq!(left.len(), 1, "{j}");
    assert_eq!((left[0]["cluster"].as_str(), left[0]["current"].as_str()), (Some("cluster-c"), Some("rel-4")));
    assert!(left[0]["why"].as_str().unwrap().contains("--to ID"), "{j}");
    assert_eq!((f.git(&["rev-parse", "main"]), f.git(&["for-each-ref"])), before);

    // Alone, cluster-c is refused with the same reason.
    let out = f.fleetgate(&["rollback", "--cluster", "cluster-c", "--repo", "fleet"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("refused: no release other than rel-4 succeeded on cluster-c"),
        "{}",
        stderr(&out)
    );

    // The write: each cluster pinned to its own target, fleet.yaml (and so cluster-c) unchanged.
    let out = f.fleetgate(&["rollback", "--fleet", "--repo", "fleet", "--reason", "INC-7", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let j = json(&out);
    assert_eq!(j["method"], "explicit");
    assert_eq!(j["leftAlone"][0]["cluster"], "cluster-c");
    assert_eq!(desired(&f), "cluster-a=rel-2 cluster-b=rel-1 cluster-c=rel-4");
    assert!(f.show("main", "fleet.yaml").contains("  release: rel-4\n"));
    assert!(f.show("main", "clusters/cluster-a.yaml").contains("\n  release: rel-2"));
    assert!(f.show("main", "clusters/cluster-b.yaml").contains("\n  release: rel-1"));
    let message = f.git(&["log", "-1", "--format=%B", "main"]);
    assert!(message.starts_with("rollback the fleet: 2 clusters\n"), "{message}");
    assert!(message.contains("cluster-a (wave canary): rel-4 -> rel-2"), "{message}");
    assert!(message.contains("cluster-b (wave prod): rel-4 -> rel-1"), "{message}");
    assert!(
        message.contains("Left alone: cluster-c (wave prod) stays on rel-4: no release other than rel-4"),
        "{message}"
    );
}
