//! Waves as `fleet.yaml` defines them, against real components: a test cluster (etcd +
//! kube-apiserver) the agents apply to as the `fleetgate-agent` ServiceAccount, the fleet repo on a
//! `git daemon`, releases signed with a throw-away GnuPG key. Other clusters' statuses are either
//! their own agents' (one pass at a time, each applying to its own test cluster) or written by the
//! test with that cluster's registered status key, as its agent would.
//!
//! * a percentage wave takes its rendezvous share of the labelled clusters, `fleetgate status`
//!   shows who is where, and a soak holds the next wave until its time has passed, when the
//!   waiting agent's own timer wakes it (its poll is an hour away);
//! * `maxUnavailable: 1` with two agents in a wave: exactly one starts, the other waits for it.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::{Agent, AgentSettings, Outcome};
use fleetgate::model::rendezvous;
use fleetgate::status::{State, Status};
use std::time::Duration;

const TEMPLATE_WAVES: &str = "  waves: [canary, wave-1, wave-2]\n";

/// The template's production clusters (labelled `env: production`).
const PROD: [&str; 2] = ["cluster-b", "cluster-c"];

/// The template with `waves` in place of its wave list, and its production clusters naming no
/// wave (their labels place them). Not pushed.
fn define_waves(fleet: &Fleet, waves: &str) {
    fleet.edit("fleet.yaml", TEMPLATE_WAVES, waves);
    fleet.edit("clusters/cluster-b.yaml", "  wave: wave-1\n", "");
    fleet.edit("clusters/cluster-c.yaml", "  wave: wave-2\n", "");
}

/// The production cluster a wave of `fleet` called `wave` ranks first, and the other.
fn ranked(wave: &str) -> (&'static str, &'static str) {
    let [b, c] = PROD;
    if rendezvous(FLEET_NAME, wave, b) > rendezvous(FLEET_NAME, wave, c) { (b, c) } else { (c, b) }
}

async fn pass(agent: &mut Agent, what: &str) -> Outcome {
    within(what, 120, agent.reconcile()).await.unwrap()
}

fn waiting_reason(outcome: Outcome) -> String {
    match outcome {
        Outcome::Waiting { reason, .. } => reason,
        other => panic!("expected to wait, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percentage_wave_takes_its_share_and_waits_out_the_canary_soak() {
    let fleet = Fleet::start("waves-soak", false).await;
    define_waves(
        &fleet,
        "  waves:\n    - name: canary\n      soak: 15s\n    - name: prod-half\n      selector: {matchLabels: {env: production}}\n      \
         percent: 50\n    - name: prod-rest\n      selector: {matchLabels: {env: production}}\n",
    );
    fleet.commit_and_push("waves by label and percentage");
    let commit = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let (chosen, rest) = ranked("prod-half");

    // What a person sees before anything ran: the computed membership, with each wave's settings.
    let view = fleet.status_json("rel-1");
    let waves: Vec<(&str, Option<&str>, Vec<&str>)> = view
        .waves
        .iter()
        .map(|w| (w.name.as_str(), w.settings.as_deref(), w.clusters.iter().map(|c| c.name.as_str()).collect()))
        .collect();
    assert_eq!(
        waves,
        [
            ("canary", Some("soak 15s"), vec![CLUSTER]),
            ("prod-half", Some("env=production, 50 %"), vec![chosen]),
            ("prod-rest", Some("env=production"), vec![rest]),
        ]
    );

    let mut canary = fleet.agent().await;
    let (_half_spoke, half_settings) = fleet.spoke("waves-soak-half", chosen).await;
    // Its poll is an hour away: only the timer a waiting pass sets can wake it when the soak ends.
    let mut half = fleet.agent_with(AgentSettings { interval: Some(Duration::from_secs(3600)), ..half_settings }).await;
    assert_eq!(pass(&mut canary, "canary rel-1").await, Outcome::Succeeded("rel-1".into()));
    let canary_done = fleet.statuses(&commit).pop().unwrap();
    assert_eq!(canary_done.state, State::Success);
    let soaked = canary_done.reported_at + chrono::Duration::seconds(15);

    let reason = waiting_reason(pass(&mut half, "prod-half during the soak").await);
    let until = soaked.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(reason.starts_with(&format!("wave canary soaks until {until} (")) && reason.ends_with("left)"), "{reason}");
    let shown = fleet.status_json("rel-1");
    let cell = &shown.waves[1].clusters[0].cells[0];
    assert_eq!(cell.gate.as_ref().map(|g| g.retry_at), Some(Some(soaked)), "{cell:?}");

    // prod-rest waits for prod-half, which has not started.
    let (_rest_spoke, rest_settings) = fleet.spoke("waves-soak-rest", rest).await;
    let mut last = fleet.agent_with(rest_settings).await;
    assert_eq!(
        waiting_reason(pass(&mut last, "prod-rest").await),
        format!("waiting for wave prod-half: {chosen} no status yet")
    );

    // Once the soak is over the chosen production cluster starts, never before, woken by the
    // timer its waiting passes set: its loop runs with nothing else to wake it.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let succeeded = async {
        within("the soak ends", 90, async {
            while !fleet.status_json("rel-1").waves[1].clusters[0].cells[0]
                .status
                .as_ref()
                .is_some_and(|s| s.state == State::Success)
            {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
        .await;
        stop.send(()).unwrap();
    };
    // The agent's loop is not Send (libgit2 handles): it runs beside the watch, in this task.
    let (services, ()) = tokio::join!(
        half.run(async {
            stopped.await.ok();
        }),
        succeeded
    );
    let metrics = services.metrics.encode();
    let wakes: Vec<&str> = metrics.lines().filter(|l| l.starts_with("fleetgate_triggers_total{")).collect();
    assert!(wakes.iter().any(|l| l.contains("source=\"timer\"")), "{wakes:?}");
    assert!(!wakes.iter().any(|l| l.contains("source=\"poll\"")), "{wakes:?}");
    let shown = fleet.status_json("rel-1");
    let success = shown.waves[1].clusters[0].cells[0].status.clone().unwrap();
    assert_eq!(success.state, State::Success);
    assert!(
        success.reported_at >= soaked,
        "{chosen} finished at {} before the soak ended at {soaked}",
        success.reported_at
    );

    // prod-half has no soak of its own: the rest follows at once.
    assert_eq!(pass(&mut last, "prod-rest after prod-half").await, Outcome::Succeeded("rel-1".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_unavailable_one_lets_one_of_two_agents_start() {
    let fleet = Fleet::start("waves-seats", false).await;
    define_waves(
        &fleet,
        "  waves:\n    - canary\n    - name: prod\n      selector: {matchLabels: {env: production}}\n      maxUnavailable: 1\n",
    );
    // A bake long enough for the second agent to see the first one mid-release.
    fleet.set_gates("8s", QUICK_GATES);
    let commit = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    // The canary's agent reports success (signed with its registered key) without running here.
    let done = Status::new(CLUSTER, "rel-1", &commit, State::Success, "all gates passed for 8s");
    fleet.write_status_as(&fleet.status_identity(CLUSTER), &done);

    let (first, second) = ranked("prod");
    let mut a = fleet.agent_with(fleet.settings_for(first)).await;
    let (_second_spoke, second_settings) = fleet.spoke("waves-seats-2", second).await;
    let mut b = fleet.agent_with(second_settings).await;
    // Both read the same statuses (none in prod): only the first in rendezvous order may start.
    assert_eq!(
        waiting_reason(pass(&mut b, "second, nobody started").await),
        format!("wave prod has maxUnavailable 1: {first} goes first")
    );

    // While the first applies and bakes (status pending), the second still waits, now for it.
    let (first_outcome, seen) = tokio::join!(
        pass(&mut a, "first rel-1"),
        within("the first one mid-release", 90, async {
            loop {
                let reason = waiting_reason(b.reconcile().await.unwrap());
                if reason.ends_with("mid-release") {
                    return reason;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    );
    assert_eq!(first_outcome, Outcome::Succeeded("rel-1".into()));
    assert_eq!(seen, format!("wave prod has maxUnavailable 1: {first} mid-release"));

    // The first finished: the seat is free.
    assert_eq!(pass(&mut b, "second rel-1").await, Outcome::Succeeded("rel-1".into()));
}
