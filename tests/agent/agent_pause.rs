//! The emergency brake against a real cluster, the agent running as its ServiceAccount: a pause in
//! Git (`fleetgate pause --fleet`, a commit setting `fleet.yaml` `spec.paused`), the annotation on
//! the agent's state ConfigMap, and the agent's own `--paused` flag each hold the cluster on the
//! release it runs while Git asks for another; the agent says so once in a `pending` status on the
//! held release, `fleetgate status` marks the cluster paused, and a resume lets the release go.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::{AgentSettings, Outcome};
use fleetgate::status::State;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_fleetgate");

fn fleetgate(args: &[&str]) -> Output {
    let out = fleetgate_unchecked(args);
    assert!(
        out.status.success(),
        "fleetgate {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn fleetgate_unchecked(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("COLUMNS", "120")
        .env("NO_COLOR", "1")
        .env_remove("FLEETGATE_REPO")
        .env_remove("FLEETGATE_PAUSED")
        .output()
        .unwrap()
}

/// [`fleetgate_unchecked`] off the test's task: the agent's loop runs beside it on the same task
/// and must not wait while the command does.
async fn fleetgate_beside_agent(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || fleetgate_unchecked(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl annotate cm fleetgate-state-cluster-a fleetgate.io/paused=VALUE --overwrite`, as the
/// on-call engineer (an admin, not the agent) does it.
async fn annotate(fleet: &Fleet, value: &str) {
    let api: Api<ConfigMap> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    let patch = serde_json::json!({"metadata": {"annotations": {"fleetgate.io/paused": value}}});
    api.patch(&format!("fleetgate-state-{CLUSTER}"), &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
}

async fn paused_reason(agent: &mut fleetgate::agent::Agent, release: &str) -> String {
    match within("paused pass", 60, agent.reconcile()).await.unwrap() {
        Outcome::Paused { release: held, reason } => {
            assert_eq!(held, release);
            reason
        }
        other => panic!("expected the agent to hold {release}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_fleet_starts_nothing_until_it_is_resumed() {
    let fleet = Fleet::start("pause-git", false).await;
    let mut agent = fleet.agent().await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    // The brake as people pull it: one command, one commit on main, pushed.
    let work = fleet.work.to_str().unwrap();
    let paused = fleetgate(&["pause", "--fleet", "--repo", work, "--reason", "INC-42 database migration", "--push"]);
    assert!(stdout(&paused).contains("Paused the fleet"), "{}", stdout(&paused));
    let fleet_yaml = std::fs::read_to_string(fleet.work.join("fleet.yaml")).unwrap();
    assert!(fleet_yaml.contains("\n  paused: true\n"), "{fleet_yaml}");
    assert!(fleet.git(&["log", "-1", "--format=%B"]).contains("INC-42 database migration"));

    let rel2 = fleet.release("rel-2", |_| {});
    fleet.promote("rel-2");
    let reason = paused_reason(&mut agent, "rel-2").await;
    assert_eq!(reason, "paused by fleet.yaml spec.paused");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")), "nothing of rel-2 applied");
    assert_eq!(fleet.state().await.current(), Some("rel-1"));

    // One pending status on the held release says why, and a second paused pass adds none.
    let said = fleet.statuses(&rel2);
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(said[0].state, State::Pending);
    assert!(said[0].description.contains("holding rel-2 here, running rel-1"), "{}", said[0].description);
    paused_reason(&mut agent, "rel-2").await;
    assert_eq!(fleet.statuses(&rel2).len(), 1, "a paused agent repeats nothing");

    let table = stdout(&fleetgate(&["status", "--repo", &fleet.url]));
    assert!(table.contains("(paused)"), "{table}");
    assert!(table.contains("paused: all 3 clusters (fleet.yaml spec.paused)"), "{table}");
    let events = fleet.events_json().await;
    assert!(events.contains("\"Paused\""), "{events}");

    let resumed = fleetgate(&["resume", "--fleet", "--repo", work, "--push"]);
    assert!(stdout(&resumed).contains("Resumed the fleet"), "{}", stdout(&resumed));
    assert_eq!(within("rel-2", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-2".into()));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-2")));
    assert!(fleet.events_json().await.contains("\"Resumed\""));
    // Resuming what is not paused writes nothing.
    let again = fleetgate(&["resume", "--fleet", "--repo", work]);
    assert!(stdout(&again).contains("Nothing to do"), "{}", stdout(&again));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spokes_own_brake_holds_whatever_git_says() {
    let fleet = Fleet::start("pause-local", false).await;
    let mut agent = fleet.agent().await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    // The annotation: no commit, no restart; even a signed promotion does not lift it.
    annotate(&fleet, "INC-7 disk pressure").await;
    let rel2 = fleet.release("rel-2", |_| {});
    fleet.promote_signed("rel-2");
    let reason = paused_reason(&mut agent, "rel-2").await;
    assert!(
        reason.contains("annotation fleetgate.io/paused on ConfigMap fleetgate-state-cluster-a: INC-7 disk pressure"),
        "{reason}"
    );
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    // The agent's own state writes keep the annotation.
    let api: Api<ConfigMap> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    let cm = api.get(&format!("fleetgate-state-{CLUSTER}")).await.unwrap();
    assert_eq!(cm.data.unwrap()["desired"], "rel-2");
    assert_eq!(cm.metadata.annotations.unwrap()["fleetgate.io/paused"], "INC-7 disk pressure");
    // Git does not know of this pause; the agent's status tells `fleetgate status`.
    let table = stdout(&fleetgate(&["status", "--repo", &fleet.url]));
    assert!(table.contains("(paused)"), "{table}");
    assert!(fleet.statuses(&rel2)[0].description.contains("INC-7 disk pressure"));

    annotate(&fleet, "false").await;
    assert_eq!(within("rel-2", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-2".into()));

    // The flag: an agent started with --paused holds the next release.
    fleet.release("rel-3", |_| {});
    fleet.promote("rel-3");
    let settings = AgentSettings { paused: Some("maintenance window".into()), ..fleet.settings() };
    let mut frozen = fleet.agent_with(settings).await;
    let reason = paused_reason(&mut frozen, "rel-3").await;
    assert_eq!(reason, "paused by the agent's --paused flag: maintenance window");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-2")));
}

/// `fleetgate reconcile` and the pause annotation wake a running agent at once (it watches its
/// state ConfigMap), with a poll interval long enough that only the watch explains the wake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_and_the_pause_annotation_wake_a_running_agent() {
    let logs = LogCapture::install();
    let fleet = Fleet::start("pause-wake", false).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let settings = AgentSettings { interval: Some(std::time::Duration::from_secs(600)), ..fleet.settings() };
    let agent = fleet.agent_with(settings).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = agent.run(async {
        let _ = stopped.await;
    });
    let story = async {
        // The startup pass applies and bakes rel-1.
        eventually("rel-1 baked", 180, || async {
            let state = fleet.state().await;
            (state.current() == Some("rel-1") && state.operation().is_none()).then_some(())
        })
        .await;

        let kubeconfig = fleet.cluster.kubeconfig_path().to_str().unwrap().to_string();
        let reconcile = |extra: &'static [&'static str]| {
            let mut args = vec!["reconcile", "--cluster", CLUSTER, "--kubeconfig", &kubeconfig, "--timeout", "60s"];
            args.extend_from_slice(extra);
            async move { stdout(&fleetgate_beside_agent(&args).await) }
        };
        let json = reconcile(&["-o", "json"]).await;
        let report: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(report["handled"], true, "{json}\n{}", logs.text());
        assert_eq!((report["phase"].as_str(), report["current"].as_str()), (Some("Idle"), Some("rel-1")), "{json}");

        // rel-2 is promoted while the annotation pauses the agent; lifting it wakes the agent, which
        // then starts rel-2 without waiting for its 10-minute poll.
        annotate(&fleet, "hold").await;
        fleet.release("rel-2", |_| {});
        fleet.promote("rel-2");
        let human = reconcile(&[]).await;
        assert!(human.contains("running    rel-1") && human.contains("desired    rel-2"), "{human}");
        annotate(&fleet, "false").await;
        eventually("rel-2 applied after the pause is lifted", 120, || async {
            (fleet.state().await.current() == Some("rel-2")).then_some(())
        })
        .await;

        // An unknown cluster: a clear error, exit 1 or 2, nothing created.
        let out =
            fleetgate_beside_agent(&["reconcile", "--cluster", "nope", "--kubeconfig", &kubeconfig, "--timeout", "5s"])
                .await;
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("no ConfigMap fleetgate-state-nope"), "{out:?}");
        let _ = stop.send(());
    };
    // The agent's loop and the story side by side (the loop holds a Git repository: not Send).
    tokio::join!(run, story);
}
