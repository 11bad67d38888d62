//! Spoke plans (docs/PLAN.md "Spoke plans") against real components: a real Gitea
//! (`hack/gitea-binary.sh`; skipped without it) serves the fleet repo and its pull requests, a test
//! cluster runs the canary's agent as deployed (deploy/'s ServiceAccount and RBAC), releases are
//! signed with a real GnuPG key and promoted with the real `fleetgate promote --open-pr`.
//!
//! The canary runs rel-1. Three promotion PRs are open: rel-2 for the canary (one Service more,
//! the webhook configuration dropped, a new image), rel-3 for the canary (a privileged container
//! the agents' admission baseline refuses, signed anyway), and rel-2 for cluster-b only. After a
//! pass the agent plans them: `fleetgate/plan/cluster-a` on the rel-2 head is `success` with what
//! the apply would do (1 created, 1 changed, 1 pruned), on the rel-3 head `failure` naming
//! admission, and the cluster-b PR gets no status from it. Nothing is applied. Planning again
//! posts nothing new; a push to a PR makes a new head, which gets its own plan. `fleetgate plan
//! --post -o json` on the same heads puts `fleetgate/plan` beside the spoke's.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::AgentSettings;
use fleetgate::agent::plans::{Planned, SpokePlan};
use fleetgate::model::ForgeKind;
use fleetgate::status::ForgeSettings;
use fleetgate_testenv::Gitea;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

const REPO: &str = "fleet";
const CONTEXT: &str = "fleetgate/plan/cluster-a";

const METRICS_SERVICE: &str = "apiVersion: v1
kind: Service
metadata:
  name: redis-operator-metrics
  namespace: redis-system
spec:
  selector:
    app.kubernetes.io/name: redis-operator
  ports:
    - {name: metrics, port: 8080, targetPort: metrics}
";

/// `fleetgate ARGS --repo WORK` with the Gitea forge flags.
fn fleetgate(fleet: &Fleet, gitea: &Gitea, token: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(args)
        .arg("--repo")
        .arg(&fleet.work)
        .args(["--forge-kind", "gitea", "--forge-url", &gitea.url(), "--forge-repository", &gitea.repository(REPO)])
        .arg("--forge-token-file")
        .arg(token)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// `fleetgate promote ID --cluster CLUSTER --open-pr` (`--fleet` for `fleet`); the PR's number
/// and head.
async fn open_promotion(fleet: &Fleet, gitea: &Gitea, token: &Path, id: &str, target: &str) -> (u64, String) {
    let keys = fleet.trusted.to_str().unwrap();
    let to: &[&str] = if target == "fleet" { &["--fleet"] } else { &["--cluster", target] };
    let args = [&["promote", id][..], to, &["--open-pr", "--trusted-keys", keys]].concat();
    let out = fleetgate(fleet, gitea, token, &args);
    assert!(out.status.success(), "promote {id}: {}", String::from_utf8_lossy(&out.stderr));
    let branch = format!("promote/{id}-{target}");
    let pulls = gitea.pulls(REPO, "open").await.unwrap();
    let pr =
        pulls.iter().find(|p| p["head"]["ref"] == branch.as_str()).unwrap_or_else(|| panic!("{branch}: {pulls:#?}"));
    (pr["number"].as_u64().unwrap(), pr["head"]["sha"].as_str().unwrap().to_string())
}

/// Every status Gitea holds for `context` on `sha`, oldest first.
async fn statuses_of(gitea: &Gitea, sha: &str, context: &str) -> Vec<Value> {
    let path = format!("/repos/{}/statuses/{sha}", gitea.repository(REPO));
    let all = gitea.api(reqwest::Method::GET, &path, None).await.unwrap();
    let mut found: Vec<Value> = all.as_array().unwrap().iter().filter(|s| s["context"] == context).cloned().collect();
    found.reverse();
    found
}

fn plan_of(planned: &[Planned], head: &str) -> SpokePlan {
    planned.iter().find(|p| p.head == head).unwrap_or_else(|| panic!("{head} planned: {planned:#?}")).plan.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_prs_carry_the_plan_the_cluster_they_move_makes_of_them_before_the_merge() {
    if Gitea::binary().is_none() {
        eprintln!("{}", Gitea::skip_message());
        return;
    }
    let fleet = Fleet::start("spoke-plans", false).await;
    let gitea = within("gitea starts", 90, Gitea::start()).await.unwrap_or_else(|e| panic!("{e:#}"));
    let clone_url = gitea.create_repo(REPO).await.unwrap();
    // The fleet repo lives in Gitea: pushes and the agent's fetches (pull request heads included).
    fleet.git(&["remote", "set-url", "origin", &gitea.push_url(REPO)]);
    fleet.git(&["push", "-q", "origin", "main"]);
    let token = fleet.dir.path().join("gitea-token");
    std::fs::write(&token, gitea.token()).unwrap();

    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    fleet.release("rel-2", |render| {
        std::fs::write(render.join("metrics-service.yaml"), METRICS_SERVICE).unwrap();
        std::fs::remove_file(render.join("webhook.yaml")).unwrap();
    });
    fleet.release_with(&["--allow-admission", "signed to show the spoke refusing it"], "rel-3", |render| {
        let path = render.join("deployment.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let privileged = text.replace("allowPrivilegeEscalation: false", "privileged: true");
        std::fs::write(&path, privileged).unwrap();
    });

    let settings = AgentSettings {
        repo: Some(clone_url),
        git_token_file: Some(token.clone()),
        forge: ForgeSettings {
            kind: Some(ForgeKind::Gitea),
            url: Some(gitea.url()),
            repository: Some(gitea.repository(REPO)),
            token_file: Some(token.clone()),
            ..Default::default()
        },
        plan_pull_requests: Some(true),
        ..fleet.settings()
    };
    let mut agent = fleet.agent_with(settings.clone()).await;
    assert_eq!(
        within("rel-1 applies", 180, agent.reconcile()).await.unwrap(),
        fleetgate::agent::Outcome::Succeeded("rel-1".into())
    );

    let (good, good_head) = open_promotion(&fleet, &gitea, &token, "rel-2", "cluster-a").await;
    let (_, bad_head) = open_promotion(&fleet, &gitea, &token, "rel-3", "cluster-a").await;
    let (other, other_head) = open_promotion(&fleet, &gitea, &token, "rel-2", "cluster-b").await;

    let planned = within("the agent plans the open PRs", 180, agent.plan_pull_requests()).await;
    assert_eq!(planned.len(), 3, "{planned:#?}");
    match plan_of(&planned, &good_head) {
        SpokePlan::Applies { release, created, changed, pruned, unchanged } => {
            assert_eq!((release.as_str(), created, changed, pruned), ("rel-2", 1, 1, 1), "{planned:#?}");
            assert!(unchanged >= 5, "the CRDs, RBAC, Namespace and Service stay: {unchanged}");
        }
        other => panic!("rel-2 applies: {other:?}"),
    }
    match plan_of(&planned, &bad_head) {
        SpokePlan::Refused { release, reason } => {
            assert_eq!(release.as_deref(), Some("rel-3"));
            assert!(reason.starts_with("admission: ") && reason.contains("privileged"), "{reason}");
        }
        other => panic!("rel-3 is refused: {other:?}"),
    }
    assert_eq!(plan_of(&planned, &other_head), SpokePlan::Unchanged, "cluster-a does not move");

    let on_good = statuses_of(&gitea, &good_head, CONTEXT).await;
    assert_eq!(on_good.len(), 1, "{on_good:#?}");
    assert_eq!(on_good[0]["status"], "success");
    let described = on_good[0]["description"].as_str().unwrap();
    assert!(described.starts_with("rel-2 applies here: 1 created, 1 changed, 1 pruned, "), "{described}");
    let on_bad = statuses_of(&gitea, &bad_head, CONTEXT).await;
    assert_eq!(on_bad.len(), 1, "{on_bad:#?}");
    assert_eq!(on_bad[0]["status"], "failure");
    let described = on_bad[0]["description"].as_str().unwrap();
    assert!(described.starts_with("rel-3 refused here: admission: "), "{described}");
    assert_eq!(statuses_of(&gitea, &other_head, CONTEXT).await, Vec::<Value>::new(), "no status where nothing moves");

    // Planned, not applied: the cluster runs rel-1 as it did.
    assert_eq!(fleet.state().await.current(), Some("rel-1"));
    let client = fleet.cluster.client();
    let services: Api<Service> = Api::namespaced(client.clone(), OPERATOR_NS);
    assert!(services.get_opt("redis-operator-metrics").await.unwrap().is_none(), "rel-2's Service is not created");
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(client);
    assert!(webhooks.get_opt("redis-operator").await.unwrap().is_some(), "rel-1's webhook is not pruned");
    assert_eq!(fleet.operator_image().await.as_deref(), Some(image_of("rel-1").as_str()));

    // Each head once: planning again posts nothing.
    let again = within("the agent lists the PRs again", 60, agent.plan_pull_requests()).await;
    assert_eq!(again, Vec::new(), "every head was planned already");
    assert_eq!(statuses_of(&gitea, &good_head, CONTEXT).await.len(), 1);
    assert_eq!(statuses_of(&gitea, &bad_head, CONTEXT).await.len(), 1);

    // The CI side on the same heads: `fleetgate/plan` beside the spoke's.
    let keys = fleet.trusted.to_str().unwrap();
    for (branch, code, verdict, state) in
        [("promote/rel-3-cluster-a", 1, "refused", "failure"), ("promote/rel-2-cluster-a", 0, "ok", "success")]
    {
        let args = ["plan", "--base", "main", "--head", branch, "--trusted-keys", keys, "--post", "-o", "json"];
        let out = fleetgate(&fleet, &gitea, &token, &args);
        assert_eq!(out.status.code(), Some(code), "{branch}: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["verdict"], verdict, "{v:#}");
        assert_eq!(v["clusters"][0]["cluster"], "cluster-a", "{v:#}");
        let head = v["head"]["commit"].as_str().unwrap().to_string();
        let posted = statuses_of(&gitea, &head, "fleetgate/plan").await;
        assert_eq!(posted.last().map(|s| s["status"].clone()), Some(Value::from(state)), "{posted:#?}");
    }

    // A push to the rel-2 PR: a new head, planned once more.
    fleet.git(&["checkout", "-q", "promote/rel-2-cluster-a"]);
    fleet.edit("clusters/cluster-a.yaml", "  wave: canary\n", "  wave: canary # reviewed\n");
    fleet.git(&["commit", "-qam", "review"]);
    let new_head = fleet.tip();
    fleet.git(&["push", "-q", "origin", "promote/rel-2-cluster-a"]);
    fleet.git(&["checkout", "-q", "main"]);
    let replanned = within("the new head is planned", 120, async {
        loop {
            // Gitea moves the PR's head in the background after the push.
            let head = gitea.pull(REPO, good).await.unwrap()["head"]["sha"].as_str().unwrap().to_string();
            if head == new_head {
                break agent.plan_pull_requests().await;
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    })
    .await;
    assert_eq!(replanned.iter().map(|p| p.head.as_str()).collect::<Vec<_>>(), [new_head.as_str()], "{replanned:#?}");
    let on_new = statuses_of(&gitea, &new_head, CONTEXT).await;
    assert_eq!(on_new.len(), 1, "{on_new:#?}");
    assert!(on_new[0]["description"].as_str().unwrap().starts_with("rel-2 applies here: 1 created"), "{on_new:#?}");

    // Restarted, in its loop: the first pass, then the open PRs. A fleet-wide promotion opened
    // meanwhile gets its plan; the heads planned before carry theirs on the forge already.
    drop(agent);
    let (_, fleet_head) = open_promotion(&fleet, &gitea, &token, "rel-2", "fleet").await;
    let restarted = fleet.agent_with(settings.clone()).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = restarted.run(async {
        let _ = stopped.await;
    });
    let story = async {
        let on_fleet = eventually("the agent's loop plans the fleet-wide PR", 120, || async {
            Some(statuses_of(&gitea, &fleet_head, CONTEXT).await).filter(|s| !s.is_empty())
        })
        .await;
        let described = on_fleet[0]["description"].as_str().unwrap();
        assert!(described.starts_with("rel-2 applies here: 1 created, 1 changed, 1 pruned, "), "{described}");
        let _ = stop.send(());
    };
    let ((), _) = tokio::join!(story, run);

    // Restarted again: nothing left to plan but the PR that does not move the cluster.
    let mut again = fleet.agent_with(settings).await;
    let planned = within("a restarted agent lists the PRs", 60, again.plan_pull_requests()).await;
    assert_eq!(planned, [Planned { pull: other, head: other_head.clone(), plan: SpokePlan::Unchanged }]);
    for head in [&new_head, &bad_head, &fleet_head] {
        assert_eq!(statuses_of(&gitea, head, CONTEXT).await.len(), 1, "{head} is not planned twice");
    }
    println!(
        "{CONTEXT} on the promotion PRs:\n  rel-2: {}\n  rel-3: {}",
        on_new[0]["description"], on_bad[0]["description"]
    );
}
