//! The people's side against a real forge: Gitea (built by `hack/gitea-binary.sh`) serves the fleet
//! repo, `fleetgate promote --open-pr` opens real pull requests there, Gitea's API merges them,
//! Gitea's own push webhook (signed with its secret) wakes the canary's agent, and Gitea's status
//! API then shows `fleetgate/cluster-a` on the release commit, on the head of the promotion PR and,
//! after a rollback, on the agent's write-back commit. `fleetgate rollback --open-pr` opens the
//! revert PR. A webhook call signed with another secret is refused and wakes nothing.
//!
//! One Gitea and one control plane for the whole file: one test, in phases.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::AgentSettings;
use fleetgate::model::ForgeKind;
use fleetgate::status::ForgeSettings;
use fleetgate_testenv::Gitea;
use fleetgate_testenv::wait::eventually_every;
use serde_json::Value;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const REPO: &str = "fleet";
const WEBHOOK_SECRET: &str = "gitea-hook-secret-4f1c";
/// Far longer than any wait below: only the webhook can explain a prompt wake.
const POLL: Duration = Duration::from_secs(300);
const CONTEXT: &str = "fleetgate/cluster-a";

/// `fleetgate ARGS --repo WORK --trusted-keys KEY` plus the Gitea forge flags.
fn fleetgate(fleet: &Fleet, gitea: &Gitea, token_file: &std::path::Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(args)
        .arg("--repo")
        .arg(&fleet.work)
        .args(["--forge-kind", "gitea", "--forge-url", &gitea.url(), "--forge-repository", &gitea.repository(REPO)])
        .arg("--forge-token-file")
        .arg(token_file)
        .env("NO_COLOR", "1")
        .env("GNUPGHOME", fleet.gpg.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fleetgate {args:?}: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

/// The one open PR whose head branch starts with `prefix`.
async fn open_pull(gitea: &Gitea, prefix: &str) -> Value {
    let pulls = gitea.pulls(REPO, "open").await.unwrap();
    let mut found: Vec<Value> =
        pulls.into_iter().filter(|p| p["head"]["ref"].as_str().is_some_and(|r| r.starts_with(prefix))).collect();
    assert_eq!(found.len(), 1, "one open PR from {prefix}*: {found:?}");
    found.remove(0)
}

/// `fleetgate/cluster-a`'s newest status on `sha` as Gitea's API lists it, once it is `state`;
/// on timeout the failure shows the last statuses seen.
async fn status_on(gitea: &Gitea, sha: &str, state: &str, what: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut last = Vec::new();
    loop {
        if let Ok(statuses) = gitea.statuses(REPO, sha).await {
            if let Some(s) = statuses.iter().find(|s| s["context"] == CONTEXT && s["status"] == state) {
                return s.clone();
            }
            last = statuses;
        }
        assert!(Instant::now() < deadline, "no {CONTEXT} {state} on the {what} {sha} within 240 s; last: {last:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn webhook_wakes(http: &reqwest::Client, addr: std::net::SocketAddr) -> u64 {
    let text = http.get(format!("http://{addr}/metrics")).send().await.unwrap().text().await.unwrap();
    let series = "fleetgate_triggers_total{cluster=\"cluster-a\",source=\"webhook\"}";
    text.lines().find_map(|l| l.strip_prefix(series)).map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_prs_merged_in_gitea_wake_the_agent_and_carry_its_statuses() {
    if Gitea::binary().is_none() {
        eprintln!("{}", Gitea::skip_message());
        return;
    }
    let started = Instant::now();
    let fleet = Fleet::start("forge-gitea", true).await;
    let gitea = within("gitea starts", 90, Gitea::start()).await.unwrap_or_else(|e| panic!("{e:#}"));
    let clone_url = gitea.create_repo(REPO).await.unwrap();
    // From here on the fleet repo lives in Gitea: the working clone pushes there with the token.
    fleet.git(&["remote", "set-url", "origin", &gitea.push_url(REPO)]);
    fleet.git(&["push", "-q", "origin", "main"]);
    let token_file = fleet.dir.path().join("gitea-token");
    std::fs::write(&token_file, gitea.token()).unwrap();
    let secret_file = fleet.dir.path().join("webhook-secret");
    std::fs::write(&secret_file, WEBHOOK_SECRET).unwrap();

    // rel-1 runs before the story starts (asked for fleet-wide, directly on main).
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let settings = AgentSettings {
        repo: Some(clone_url),
        // The agent's own token pushes its status notes and write-back commit over HTTP.
        git_token_file: Some(token_file.clone()),
        forge: ForgeSettings {
            kind: Some(ForgeKind::Gitea),
            url: Some(gitea.url()),
            repository: Some(gitea.repository(REPO)),
            token_file: Some(token_file.clone()),
            ..Default::default()
        },
        webhook_secret_file: Some(secret_file),
        interval: Some(POLL),
        write_back: Some(true),
        ..fleet.settings()
    };
    let agent = fleet.agent_with(settings).await;
    let addr = agent.services().http_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = agent.run(async {
        let _ = stopped.await;
    });
    let story = async {
        let http = fleetgate::http::client_builder().build().unwrap();
        eventually("rel-1 runs", 120, || async { (fleet.state().await.current() == Some("rel-1")).then_some(()) })
            .await;
        gitea.add_push_webhook(REPO, &format!("http://{addr}/hooks/git"), Some(WEBHOOK_SECRET)).await.unwrap();

        // rel-2 through a PR that Gitea merges with a merge commit.
        fleet.git(&["pull", "-q", "--ff-only", "origin", "main"]);
        let rel2 = fleet.release("rel-2", |_| {});
        let out = fleetgate(
            &fleet,
            &gitea,
            &token_file,
            &[
                "promote",
                "rel-2",
                "--cluster",
                "cluster-a",
                "--open-pr",
                "--trusted-keys",
                fleet.trusted.to_str().unwrap(),
            ],
        );
        println!("{}", String::from_utf8_lossy(&out.stdout));
        let pr = open_pull(&gitea, "promote/rel-2").await;
        let (number, pr_head) = (pr["number"].as_u64().unwrap(), pr["head"]["sha"].as_str().unwrap().to_string());
        assert_eq!(pr["base"]["ref"], "main");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(pr["html_url"].as_str().unwrap()),
            "promote prints the PR URL"
        );
        let wakes = webhook_wakes(&http, addr).await;
        let merged = Instant::now();
        gitea.merge_pull(REPO, number, "merge").await.unwrap();
        let merge = gitea.pull(REPO, number).await.unwrap()["merge_commit_sha"].as_str().unwrap().to_string();
        assert_ne!(merge, pr_head, "a merge commit, so the PR head is its second parent");
        eventually_every("the agent starts rel-2", 120, Duration::from_millis(100), || async {
            (fleet.state().await.desired() == Some("rel-2")).then_some(())
        })
        .await;
        let took = merged.elapsed();
        println!("merge in Gitea → agent at work on rel-2: {took:?} (poll interval {POLL:?})");
        // Not a performance bound: the poll would take 300 s, so only the webhook explains this.
        assert!(took < Duration::from_secs(60), "{took:?}");
        // Counted when the loop takes the wake: a pass that was still writing rel-1's statuses at
        // the merge takes it only when it ends.
        eventually("Gitea's delivery woke the agent", 30, || async {
            (webhook_wakes(&http, addr).await > wakes).then_some(())
        })
        .await;
        let on_head = status_on(&gitea, &pr_head, "success", "promotion PR head").await;
        status_on(&gitea, &rel2, "success", "release commit").await;
        assert!(on_head["description"].as_str().unwrap().starts_with("all gates passed"), "{on_head}");

        // The revert PR of that promotion.
        fleet.git(&["pull", "-q", "--ff-only", "origin", "main"]);
        let out = fleetgate(&fleet, &gitea, &token_file, &["rollback", "--cluster", "cluster-a", "--open-pr"]);
        println!("{}", String::from_utf8_lossy(&out.stdout));
        fleet.git(&["checkout", "-q", "main"]);
        let revert = open_pull(&gitea, "rollback/").await;
        assert_eq!(revert["base"]["ref"], "main");
        let diff = gitea.pull_diff(REPO, revert["number"].as_u64().unwrap()).await.unwrap();
        assert!(diff.contains("clusters/cluster-a.yaml"), "{diff}");
        assert!(
            diff.lines().any(|l| l.starts_with('-') && l.trim_start_matches('-').trim() == "release: rel-2"),
            "{diff}"
        );
        gitea
            .api(
                reqwest::Method::PATCH,
                &format!("/repos/{}/pulls/{}", gitea.repository(REPO), revert["number"]),
                Some(serde_json::json!({"state": "closed"})),
            )
            .await
            .unwrap();

        // rel-3 crash-loops: through a merged PR, rolled back, written back.
        fleet.git(&["pull", "-q", "--ff-only", "origin", "main"]);
        fleet.set_gates("20s", STRICT_RESTARTS);
        let rel3 = fleet.release("rel-3", crash_looping);
        fleetgate(
            &fleet,
            &gitea,
            &token_file,
            &[
                "promote",
                "rel-3",
                "--cluster",
                "cluster-a",
                "--open-pr",
                "--trusted-keys",
                fleet.trusted.to_str().unwrap(),
            ],
        );
        let pr = open_pull(&gitea, "promote/rel-3").await;
        let pr_head = pr["head"]["sha"].as_str().unwrap().to_string();
        gitea.merge_pull(REPO, pr["number"].as_u64().unwrap(), "merge").await.unwrap();
        eventually("the agent starts rel-3", 60, || async {
            (fleet.state().await.desired() == Some("rel-3")).then_some(())
        })
        .await;
        let failure = status_on(&gitea, &rel3, "failure", "release commit").await;
        let description = failure["description"].as_str().unwrap();
        assert!(
            description.starts_with("rolled back to rel-2: pod-restarts"),
            "the gate and its figure: {description}"
        );
        let on_head = status_on(&gitea, &pr_head, "failure", "promotion PR head").await;
        assert_eq!(on_head["description"], failure["description"]);
        // The agent posts the failure before it pushes the write-back (`step`: status, then
        // notification, then write-back), so the tip may still be the merge for a moment.
        eventually("the agent's write-back is the tip", 60, || async {
            fleet.git(&["pull", "-q", "--ff-only", "origin", "main"]);
            (fleet.git(&["log", "-1", "--format=%s"]) == "fleetgate: roll cluster-a back to rel-2").then_some(())
        })
        .await;
        let write_back = fleet.tip();
        let on_write_back = status_on(&gitea, &write_back, "failure", "write-back commit").await;
        assert_eq!(on_write_back["description"], failure["description"]);
        assert_eq!(fleet.state().await.current(), Some("rel-2"));

        // A delivery signed with another secret is refused and wakes nothing.
        let wakes = webhook_wakes(&http, addr).await;
        let body = r#"{"ref":"refs/heads/main"}"#;
        let refused = http
            .post(format!("http://{addr}/hooks/git"))
            .header("content-type", "application/json")
            .header("x-gitea-event", "push")
            .header("x-gitea-signature", "9".repeat(64))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 401, "{}", refused.text().await.unwrap());
        assert_eq!(webhook_wakes(&http, addr).await, wakes);
        let _ = stop.send(());
    };
    let ((), _) = tokio::join!(story, run);
    println!("wall time: {:?}", started.elapsed());
}
