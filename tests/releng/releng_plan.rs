//! `fleetgate plan` on a real repository with real signed releases and signed statuses: a
//! promotion branch that moves two clusters (one into a wave that requires approval) gets
//! `needs`, exit 0; one whose release breaks admission gets `refused`, exit 1; `-o json` says the
//! same for machines; with `--post`, a real Gitea shows `fleetgate/plan` on the head and one
//! comment on the pull request, edited in place.

use crate::releng_common;
use crate::status_support;

use fleetgate::status::State;
use fleetgate_testenv::Gitea;
use releng_common::*;

/// The fixture's fleet with wave prod requiring approval, every agent's status key registered,
/// rel-1 running everywhere (signed successes), and rel-2 cut, compatible.
fn fleet_on_rel_1() -> Fixture {
    let f = Fixture::new();
    let fleet = FLEET.replace("waves: [canary, prod]", "waves: [canary, {name: prod, approval: required}]");
    std::fs::write(
        f.repo.join("fleet.yaml"),
        fleet.replace("  # release: rel-0\n", "  # release: rel-0\n  release: rel-1\n"),
    )
    .unwrap();
    f.git(&["commit", "-qam", "prod needs approval; the fleet runs rel-1"]);
    f.release("rel-1", "v1.0.0");
    for c in ["cluster-a", "cluster-b", "cluster-c"] {
        status_support::report(&f.repo, c, "rel-1", State::Success);
    }
    f.release("rel-2", "v1.1.0");
    f
}

/// A branch off `main` pinning each of `clusters` to `release`, as a promotion PR would.
fn promotion_branch(f: &Fixture, branch: &str, clusters: &[&str], release: &str) {
    f.git(&["checkout", "-q", "-b", branch, "main"]);
    for c in clusters {
        let path = f.repo.join(format!("clusters/{c}.yaml"));
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            text.replace("  # release: rel-0\n", &format!("  # release: rel-0\n  release: {release}\n")),
        )
        .unwrap();
    }
    f.git(&["commit", "-qam", &format!("promote {release} to {}", clusters.join(", "))]);
    f.git(&["checkout", "-q", "main"]);
}

fn plan(f: &Fixture, head: &str, extra: &[&str]) -> std::process::Output {
    let repo = f.repo.to_str().unwrap();
    let keys = f.keys.to_str().unwrap();
    let mut args = vec!["plan", "--repo", repo, "--base", "main", "--head", head, "--trusted-keys", keys, "--offline"];
    args.extend_from_slice(extra);
    f.fleetgate(&args)
}

#[test]
fn a_promotion_into_a_wave_that_requires_approval_plans_as_needs_with_each_cluster_in_wave_order() {
    let f = fleet_on_rel_1();
    promotion_branch(&f, "promote/rel-2", &["cluster-b", "cluster-a"], "rel-2");

    let out = plan(&f, "promote/rel-2", &["-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "needs merges: {}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["verdict"], "needs", "{v:#}");
    assert_eq!(v["head"]["commit"], f.git(&["rev-parse", "promote/rel-2"]));
    let clusters = v["clusters"].as_array().unwrap();
    let moves: Vec<(&str, &str, &str, &str)> = clusters
        .iter()
        .map(|c| {
            (
                c["cluster"].as_str().unwrap(),
                c["wave"].as_str().unwrap(),
                c["from"].as_str().unwrap(),
                c["to"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        moves,
        [("cluster-a", "canary", "rel-1", "rel-2"), ("cluster-b", "prod", "rel-1", "rel-2")],
        "cluster-c stays"
    );
    for c in clusters {
        assert_eq!(c["lastKnownGood"], "rel-1", "{c:#}");
        assert_eq!(c["signer"], f.fpr.as_str(), "{c:#}");
        assert_eq!(
            (c["crd"]["compared"].as_bool(), c["crd"]["compatible"].as_bool()),
            (Some(true), Some(true)),
            "{c:#}"
        );
        assert_eq!(c["crdBaselines"][0]["release"], "rel-1", "against what the cluster last ran: {c:#}");
        assert_eq!(c["refused"], serde_json::json!([]), "{c:#}");
    }
    assert_eq!(clusters[0]["needs"], serde_json::json!([]), "canary needs nothing");
    assert_eq!(
        clusters[1]["needs"],
        serde_json::json!([{"code": "approval", "release": "rel-2", "wave": "prod", "tagged": false}])
    );

    let out = plan(&f, "promote/rel-2", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("needs:   approval of rel-2 for wave prod: `fleetgate approve rel-2 --wave prod`"), "{text}");
    assert!(text.contains("verdict    needs"), "{text}");
    let a = text.find("cluster-a").unwrap();
    assert!(a < text.find("cluster-b").unwrap(), "wave order: {text}");
}

#[test]
fn a_promotion_whose_release_breaks_admission_is_refused_with_exit_1() {
    let f = fleet_on_rel_1();
    // rel-3 runs a privileged pod: signed on purpose, refused by every agent's baseline.
    let m = f.manifests("render-rel-3", "v1.2.0", "v1alpha2", &["size"], &[]);
    let deployment = std::fs::read_to_string(m.join("deployment.yaml")).unwrap();
    std::fs::write(
        m.join("deployment.yaml"),
        deployment.replace("          image:", "          securityContext: {privileged: true}\n          image:"),
    )
    .unwrap();
    let mut req = f.request("rel-3", &m, "v1.2.0");
    req.allow_admission = Some("signed to show the plan refusing it".into());
    f.create(&req).unwrap();
    promotion_branch(&f, "promote/rel-3", &["cluster-a"], "rel-3");

    let out = plan(&f, "promote/rel-3", &["-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!((v["result"].as_str(), v["verdict"].as_str()), (Some("refused"), Some("refused")), "{v:#}");
    let c = &v["clusters"][0];
    assert_eq!((c["cluster"].as_str(), c["to"].as_str()), (Some("cluster-a"), Some("rel-3")));
    let refused = c["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{c:#}");
    assert_eq!(refused[0]["code"], "admission");
    let why = refused[0]["objects"][0]["rules"][0]["reason"].to_string();
    assert!(why.contains("privileged"), "{why}");
    assert!(refused[0]["fixes"][0]["lines"].to_string().contains("podSecurity: privileged"), "{:#}", refused[0]);

    let out = plan(&f, "promote/rel-3", &[]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(text.contains("refused: admission refuses Deployment.apps redis-system/redis-operator"), "{text}");
    assert!(text.contains("verdict    refused"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn posting_sets_fleetgate_plan_on_the_head_and_keeps_one_pull_request_comment_up_to_date() {
    if Gitea::binary().is_none() {
        eprintln!("{}", Gitea::skip_message());
        return;
    }
    let gitea = Gitea::start().await.unwrap_or_else(|e| panic!("{e:#}"));
    gitea.create_repo("fleet").await.unwrap();
    let f = fleet_on_rel_1();
    promotion_branch(&f, "promote/rel-2", &["cluster-a", "cluster-b"], "rel-2");
    f.git(&["remote", "add", "origin", &gitea.push_url("fleet")]);
    f.git(&["push", "-q", "origin", "main", "promote/rel-2"]);
    let head = f.git(&["rev-parse", "promote/rel-2"]);
    let pulls = format!("/repos/{}/pulls", gitea.repository("fleet"));
    let body = serde_json::json!({"head": "promote/rel-2", "base": "main", "title": "Promote rel-2"});
    // Gitea indexes a pushed branch in the background: a pull request from it 404s until then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let pr = loop {
        match gitea.api(reqwest::Method::POST, &pulls, Some(body.clone())).await {
            Ok(pr) => break pr,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("not yet: {e:#}");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{e:#}"),
        }
    };
    let number = pr["number"].as_u64().unwrap();
    let token = f.dir.path().join("gitea-token");
    std::fs::write(&token, gitea.token()).unwrap();
    let (url, repository) = (gitea.url(), gitea.repository("fleet"));
    let forge = ["--post", "--forge-kind", "gitea", "--forge-url", &url, "--forge-repository", &repository];
    let post = || {
        let mut args = forge.to_vec();
        args.extend(["--forge-token-file", token.to_str().unwrap(), "-o", "json"]);
        let out = plan(&f, "promote/rel-2", &args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        json(&out)
    };

    let v = post();
    assert_eq!(v["posted"]["pullRequests"], serde_json::json!([number]), "{v:#}");
    let statuses = gitea.statuses("fleet", &head).await.unwrap();
    let plan_status = statuses.iter().find(|s| s["context"] == "fleetgate/plan").expect("fleetgate/plan on the head");
    assert_eq!(plan_status["status"], "success", "needs still merges: {plan_status:#}");
    let description = plan_status["description"].as_str().unwrap();
    assert!(description.starts_with("needs: cluster-b: approval of rel-2 for wave prod"), "{description}");
    let comments_path = format!("/repos/{repository}/issues/{number}/comments");
    let comments = gitea.api(reqwest::Method::GET, &comments_path, None).await.unwrap();
    let comments = comments.as_array().unwrap();
    assert_eq!(comments.len(), 1, "{comments:#?}");
    let comment = comments[0]["body"].as_str().unwrap();
    assert!(comment.contains("### fleetgate plan: **needs**"), "{comment}");
    assert!(comment.contains("| cluster-b | prod | rel-1 | rel-2 | compatible | needs |"), "{comment}");
    let id = comments[0]["id"].clone();

    // The next push's run edits that comment instead of adding one.
    post();
    let again = gitea.api(reqwest::Method::GET, &comments_path, None).await.unwrap();
    assert_eq!(again.as_array().map(Vec::len), Some(1), "{again:#}");
    assert_eq!(again[0]["id"], id);
}
