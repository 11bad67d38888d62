//! Approvals (`spec.waves[].approval: required`), against real components: a test cluster the
//! agent applies to as the `fleetgate-agent` ServiceAccount, the fleet repo on a `git daemon`,
//! GnuPG keys made for the test (the release key, and an approver's key the agent is given with
//! `--approver-keys`), approval tags written by real `git tag -s` and by `fleetgate approve`.
//!
//! wave-1 (cluster-b) requires an approval of rel-1. Its agent waits — status `pending` saying how
//! to approve, nothing applied — while an unsigned push drops the requirement on the branch tip,
//! and while a pusher without an approver's key tries tags that must not count: unsigned, signed
//! by the release key, on another commit, an approval of another wave under this wave's name.
//! Each is ignored and says why. `fleetgate approve` with the approver's key makes it start, and
//! the status of the start records who approved, why, and for which wave (`fleetgate audit`).
//!
//! With a forge (a local server holding GitHub's side of the contract: a token it checks, the pull
//! requests of a commit, their reviews), an approving review of the promotion PR at its head by a
//! login of the agent's `--approver` list approves too; other logins, reviews of an older head and
//! comments do not. The same through a real Gitea (`hack/gitea-binary.sh`; skipped without it): a
//! second Gitea user's review of the promotion PR, merged with a merge commit.

use crate::agent_support;

use agent_support::*;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use fleetgate::agent::{Agent, AgentSettings, Outcome};
use fleetgate::model::ForgeKind;
use fleetgate::status::{ForgeSettings, State, Status};
use serde_json::{Value, json};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_fleetgate");
const WAVES: &str = "  waves:\n    - canary\n    - name: wave-1\n      approval: required\n    - wave-2\n";
const TAG: &str = "approve/rel-1/wave-1";

async fn waiting(agent: &mut Agent, what: &str) -> String {
    match within(what, 120, agent.reconcile()).await.unwrap() {
        Outcome::Waiting { reason, .. } => reason,
        other => panic!("{what}: expected to wait, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wave_that_requires_approval_starts_only_on_an_approvers_signed_tag() {
    let fleet = Fleet::start("approvals", false).await;
    fleet.edit("fleet.yaml", "  waves: [canary, wave-1, wave-2]\n", WAVES);
    fleet.commit_and_push("wave-1 needs an approval");
    let commit = fleet.release("rel-1", |_| {});
    // An unsigned push drops the requirement: the release's signed tree still has it.
    fleet.edit("fleet.yaml", "      approval: required\n", "");
    fleet.promote("rel-1");
    let done = Status::new(CLUSTER, "rel-1", &commit, State::Success, "all gates passed for 3s");
    fleet.write_status_as(&fleet.status_identity(CLUSTER), &done);

    let approver = fleet.gpg.generate_key("Ana Approver", "ana@example.com").unwrap();
    let approvers = fleet.gpg.write_public_key(&approver, &fleet.dir.path().join("approvers.asc")).unwrap();
    let settings = AgentSettings { approver_keys: vec![approvers], ..fleet.settings_for("cluster-b") };
    let mut agent = fleet.agent_with(settings).await;

    let asked = "waiting for approval of wave wave-1 (fleetgate approve rel-1 --wave wave-1)";
    assert_eq!(waiting(&mut agent, "no approval yet").await, asked);
    let latest = fleet.statuses_of("cluster-b", &commit).pop().expect("cluster-b says why it waits");
    assert_eq!((latest.state, latest.description.as_str()), (State::Pending, asked));
    assert!(!fleet.namespace_applied(OPERATOR_NS).await, "nothing is applied while waiting");
    let shown = fleet.status_json("rel-1");
    let cell = shown.waves[1].clusters.iter().find(|c| c.name == "cluster-b").unwrap().cells[0].clone();
    assert_eq!(cell.status.map(|s| s.description).as_deref(), Some(asked), "fleetgate status shows the wait");

    // Tags a pusher can make without an approver's key, each pushed in place of the last.
    let git = |args: &[&str]| fleet.git(args);
    let signed_by = |fpr: &str, args: &[&str]| {
        fleet.gpg.run_git(&fleet.work, fpr, args).unwrap();
    };
    let push_tag = || git(&["push", "-q", "-f", "origin", &format!("refs/tags/{TAG}")]);
    let tip = fleet.tip();
    let attacks: Vec<(&str, Box<dyn Fn() + '_>, &str)> = vec![
        (
            "an unsigned tag",
            Box::new(|| {
                git(&["tag", "-f", "-a", "-m", "lgtm", TAG, &commit]);
            }),
            "tag approve/rel-1/wave-1 is ignored: not signed",
        ),
        (
            "a tag signed by the release key, which is no approver's",
            Box::new(|| signed_by(&fleet.fpr, &["tag", "-f", "-s", "-m", "lgtm", TAG, &commit])),
            "which is not among the trusted keys (approvals count only when signed by a key in --approver-keys)",
        ),
        (
            "an approver's tag on another commit",
            Box::new(|| signed_by(&approver, &["tag", "-f", "-s", "-m", "lgtm", TAG, &tip])),
            "tag approve/rel-1/wave-1 points to commit",
        ),
        (
            "an approver's approval of the canary wave under wave-1's name",
            Box::new(|| {
                signed_by(&approver, &["tag", "-f", "-s", "-m", "canary only", "approve/rel-1/canary", &commit]);
                let object = git(&["rev-parse", "refs/tags/approve/rel-1/canary"]);
                git(&["update-ref", &format!("refs/tags/{TAG}"), &object]);
            }),
            "points to a tag object named \"approve/rel-1/canary\"",
        ),
    ];
    for (what, make, why) in &attacks {
        make();
        push_tag();
        let reason = waiting(&mut agent, what).await;
        assert!(reason.starts_with(asked) && reason.contains(why), "{what}: {reason}");
        assert!(!fleet.namespace_applied(OPERATOR_NS).await, "{what} applied rel-1");
    }
    let events = fleet.events_json().await;
    assert!(events.contains("ApprovalIgnored"), "each ignored approval is a Warning Event: {events}");

    // The approver approves: `fleetgate approve` replaces the attacker's tag (deleted first, as
    // its error says) and pushes.
    git(&["tag", "-d", TAG]);
    git(&["push", "-q", "origin", &format!(":refs/tags/{TAG}")]);
    let out = Command::new(BIN)
        .args(["approve", "rel-1", "--wave", "wave-1", "-m", "CAB-1234: approved for today", "--sign-key", &approver])
        .arg("--gpg-home")
        .arg(fleet.gpg.path())
        .arg("--repo")
        .arg(&fleet.work)
        .arg("--push")
        // No Git identity of the machine's: the tagger is the approver's key's user id.
        .env("HOME", fleet.dir.path())
        .env("XDG_CONFIG_HOME", fleet.dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "fleetgate approve: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Approved rel-1 for wave wave-1"));

    assert_eq!(within("approved pass", 180, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    assert!(fleet.namespace_applied(OPERATOR_NS).await);
    let started = fleet
        .statuses_of("cluster-b", &commit)
        .into_iter()
        .find(|s| s.approval.is_some())
        .expect("the start records the approval");
    let approval = started.approval.unwrap();
    assert!(approval.by.starts_with("Ana Approver <ana@example.com> (key "), "{approval:?}");
    assert!(approval.by.contains(&approver.to_ascii_uppercase()), "{approval:?}");
    assert_eq!(
        (approval.why.as_str(), approval.wave.as_str(), approval.via.as_str()),
        ("CAB-1234: approved for today", "wave-1", "tag approve/rel-1/wave-1")
    );
    assert!(
        started.description.starts_with("applying rel-1 (from nothing), approved by Ana Approver"),
        "{}",
        started.description
    );

    let audit = Command::new(BIN).args(["audit", "--repo", &fleet.url, "--cluster", "cluster-b"]).output().unwrap();
    let audit = String::from_utf8_lossy(&audit.stdout);
    assert!(
        audit.contains("↳ approved for wave wave-1 by Ana Approver <ana@example.com>")
            && audit.contains("(tag approve/rel-1/wave-1): CAB-1234: approved for today"),
        "fleetgate audit shows who, scope and why:\n{audit}"
    );
}

const TOKEN: &str = "ghp_approvals";
const REPOSITORY: &str = "octo/fleet";
const PULL: u64 = 7;
/// A PR with the same head into another branch: its approvals approve nothing on `main`.
const OTHER_BRANCH_PULL: u64 = 8;

/// GitHub's side: the promotion PR (number 7 into `main`, head `head`) and its reviews, and PR 8
/// with the same head into `hotfix`, approved by a listed login; statuses accepted.
#[derive(Clone, Default)]
struct GitHub {
    head: Arc<Mutex<String>>,
    reviews: Arc<Mutex<Vec<Value>>>,
}

impl GitHub {
    fn answer(&self, method: &Method, path: &str, auth: Option<&str>) -> (StatusCode, Value) {
        if auth != Some(&format!("Bearer {TOKEN}")) {
            return (StatusCode::UNAUTHORIZED, json!({"message": "Bad credentials"}));
        }
        let head = self.head.lock().unwrap().clone();
        let repo = format!("/repos/{REPOSITORY}");
        match (method.as_str(), path.strip_prefix(&repo)) {
            ("POST", Some(p)) if p.starts_with("/statuses/") => (StatusCode::CREATED, json!({})),
            ("GET", Some(p)) if p == format!("/commits/{head}/pulls") => {
                let pull = |number, base| json!({"number": number, "head": {"sha": head}, "base": {"ref": base}});
                (StatusCode::OK, json!([pull(OTHER_BRANCH_PULL, "hotfix"), pull(PULL, "main")]))
            }
            ("GET", Some(p)) if p.starts_with("/commits/") && p.ends_with("/pulls") => (StatusCode::OK, json!([])),
            ("GET", Some(p)) if p == format!("/pulls/{PULL}/reviews") => {
                (StatusCode::OK, Value::Array(self.reviews.lock().unwrap().clone()))
            }
            ("GET", Some(p)) if p == format!("/pulls/{OTHER_BRANCH_PULL}/reviews") => (
                StatusCode::OK,
                json!([{"user": {"login": "ana"}, "state": "APPROVED", "commit_id": head, "body": "ok for hotfix"}]),
            ),
            _ => (StatusCode::NOT_FOUND, json!({"message": "Not Found"})),
        }
    }

    async fn serve(&self) -> String {
        let github = self.clone();
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap| {
            let github = github.clone();
            async move {
                let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
                let (code, body) = github.answer(&method, uri.path(), auth);
                (code, axum::Json(body))
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        base
    }

    fn review(&self, login: &str, state: &str, commit: &str, body: &str) {
        let review = json!({"user": {"login": login}, "state": state, "commit_id": commit, "body": body});
        self.reviews.lock().unwrap().push(review);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approvers_review_of_the_promotion_pr_at_its_head_approves_too() {
    let fleet = Fleet::start("approvals-forge", false).await;
    fleet.edit("fleet.yaml", "  waves: [canary, wave-1, wave-2]\n", WAVES);
    fleet.commit_and_push("wave-1 needs an approval");
    let commit = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let head = fleet.tip();
    let done = Status::new(CLUSTER, "rel-1", &commit, State::Success, "all gates passed for 3s");
    fleet.write_status_as(&fleet.status_identity(CLUSTER), &done);

    let github = GitHub::default();
    *github.head.lock().unwrap() = head.clone();
    // None of these counts: a login the agent does not list, an approval of an older head, a comment,
    // and (PR 8) an approval at this head of a PR into another branch.
    github.review("mallory", "APPROVED", &head, "looks fine to me");
    github.review("ana", "APPROVED", &commit, "approved an earlier head");
    github.review("ana", "COMMENTED", &head, "will look tomorrow");
    let url = github.serve().await;
    let token = fleet.dir.path().join("forge-token");
    std::fs::write(&token, TOKEN).unwrap();
    let forge = ForgeSettings {
        kind: Some(ForgeKind::Github),
        url: Some(url),
        repository: Some(REPOSITORY.into()),
        token_file: Some(token),
        ..Default::default()
    };
    let settings = AgentSettings { forge, approvers: vec!["ana".into()], ..fleet.settings_for("cluster-b") };
    let mut agent = fleet.agent_with(settings).await;

    let asked = "waiting for approval of wave wave-1 (fleetgate approve rel-1 --wave wave-1)";
    assert_eq!(waiting(&mut agent, "no approval by a listed login at the head").await, asked);
    assert!(!fleet.namespace_applied(OPERATOR_NS).await, "nothing is applied while waiting");

    github.review("ana", "APPROVED", &head, "LGTM for wave-1");
    assert_eq!(within("approved pass", 180, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    let approval = fleet
        .statuses_of("cluster-b", &commit)
        .into_iter()
        .find_map(|s| s.approval)
        .expect("the start records the approval");
    let via = format!("GitHub review of pull request #{PULL} at {}", &head[..12]);
    assert_eq!(
        (approval.by.as_str(), approval.why.as_str(), approval.wave.as_str(), approval.via.as_str()),
        ("ana (GitHub login)", "LGTM for wave-1", "wave-1", via.as_str())
    );
}

/// The same through a real Gitea: a promotion PR reviewed by a second Gitea user and merged with
/// a merge commit (so the PR's head is the merge's second parent). An agent that lists another
/// login waits; one that lists the reviewer starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gitea_review_of_the_promotion_pr_by_a_listed_login_approves() {
    use fleetgate_testenv::Gitea;
    use reqwest::Method;
    if Gitea::binary().is_none() {
        eprintln!("{}", Gitea::skip_message());
        return;
    }
    let fleet = Fleet::start("approvals-gitea", false).await;
    let gitea = within("gitea starts", 90, Gitea::start()).await.unwrap_or_else(|e| panic!("{e:#}"));
    gitea.create_repo("fleet").await.unwrap();
    let repository = gitea.repository("fleet");
    fleet.edit("fleet.yaml", "  waves: [canary, wave-1, wave-2]\n", WAVES);
    fleet.commit_and_push("wave-1 needs an approval");
    let commit = fleet.release("rel-1", |_| {});
    // The agents read the git daemon; the promotion goes through a PR in Gitea, then back.
    fleet.git(&["remote", "add", "gitea", &gitea.push_url("fleet")]);
    fleet.git(&["push", "-q", "gitea", "main"]);
    let user = json!({"username": "ana", "email": "ana@example.com", "password": "ana-pass-1234", "must_change_password": false});
    gitea.api(Method::POST, "/admin/users", Some(user)).await.unwrap();
    gitea
        .api(Method::PUT, &format!("/repos/{repository}/collaborators/ana"), Some(json!({"permission": "write"})))
        .await
        .unwrap();
    fleet.git(&["checkout", "-q", "-b", "promote/rel-1"]);
    fleet.write_fleet_release("rel-1");
    fleet.git(&["commit", "-q", "-am", "promote rel-1 to the fleet"]);
    let head = fleet.tip();
    fleet.git(&["push", "-q", "gitea", "promote/rel-1"]);
    let pr = json!({"head": "promote/rel-1", "base": "main", "title": "promote rel-1"});
    // Gitea indexes a pushed branch in the background: until then a PR from it is a 404.
    let pr = within("Gitea knows the pushed branch", 60, async {
        loop {
            match gitea.api(Method::POST, &format!("/repos/{repository}/pulls"), Some(pr.clone())).await {
                Ok(pr) => return pr,
                Err(e) if e.to_string().contains("HTTP 404") => tokio::time::sleep(Duration::from_millis(250)).await,
                Err(e) => panic!("{e:#}"),
            }
        }
    })
    .await;
    let number = pr["number"].as_u64().unwrap();
    // ana approves (the admin's token acting as ana: Gitea's sudo).
    let review = json!({"event": "APPROVED", "body": "CAB-77: fine for wave-1", "commit_id": head});
    gitea
        .api(Method::POST, &format!("/repos/{repository}/pulls/{number}/reviews?sudo=ana"), Some(review))
        .await
        .unwrap();
    gitea.merge_pull("fleet", number, "merge").await.unwrap();
    fleet.git(&["checkout", "-q", "main"]);
    fleet.git(&["pull", "-q", "--ff-only", "gitea", "main"]);
    fleet.git(&["push", "-q", "origin", "main"]);
    let done = Status::new(CLUSTER, "rel-1", &commit, State::Success, "all gates passed for 3s");
    fleet.write_status_as(&fleet.status_identity(CLUSTER), &done);

    let token = fleet.dir.path().join("gitea-token");
    std::fs::write(&token, gitea.token()).unwrap();
    let listing = |login: &str| AgentSettings {
        forge: ForgeSettings {
            kind: Some(ForgeKind::Gitea),
            url: Some(gitea.url()),
            repository: Some(repository.clone()),
            token_file: Some(token.clone()),
            ..Default::default()
        },
        approvers: vec![login.into()],
        ..fleet.settings_for("cluster-b")
    };
    let mut agent = fleet.agent_with(listing("bob")).await;
    let asked = "waiting for approval of wave wave-1 (fleetgate approve rel-1 --wave wave-1)";
    assert_eq!(waiting(&mut agent, "ana's review, an agent listing bob").await, asked);
    drop(agent);

    let mut agent = fleet.agent_with(listing("ana")).await;
    assert_eq!(within("ana listed", 180, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    let approval =
        fleet.statuses_of("cluster-b", &commit).into_iter().find_map(|s| s.approval).expect("the start records it");
    assert_eq!(
        (approval.by.as_str(), approval.why.as_str(), approval.via),
        (
            "ana (Gitea login)",
            "CAB-77: fine for wave-1",
            format!("Gitea review of pull request #{number} at {}", &head[..12])
        )
    );
}
