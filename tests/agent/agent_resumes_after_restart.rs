//! An agent that dies mid-operation leaves its phase in the state ConfigMap; the next agent picks
//! the operation up from there. Each phase is set up as a killed agent would have left it (the
//! transitions persisted, the work after them not done), then a new agent — fresh Git cache, only
//! the ConfigMap survives — runs one pass:
//!
//! * Verifying → nothing was applied: deferred, and the next pass starts over and succeeds;
//! * Applying → applies again and bakes;
//! * Baking → bakes on from the persisted `appliedAt` without applying again;
//! * RollingBack → rolls back again and reports the failure that was persisted.

use crate::agent_support;

use agent_support::*;
use chrono::Utc;
use fleetgate::agent::Outcome;
use fleetgate::agent::state::{Failure, Phase};
use fleetgate::status::{GateFigure, State};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_in_each_phase_finishes_what_the_last_one_started() {
    let fleet = Fleet::start("agent-resume", true).await;
    let commits: Vec<String> =
        ["rel-1", "rel-2", "rel-3", "rel-4"].iter().map(|id| fleet.release(id, |_| {})).collect();
    let store = fleet.store();

    // Verifying: killed after `begin`, before anything was applied.
    fleet.promote("rel-1");
    within("persist Verifying", 30, async {
        store.load().await.unwrap();
        store
            .update(|s| {
                s.observe_desired(Some("rel-1"), false);
                s.begin("rel-1", &commits[0], Utc::now())
            })
            .await
            .unwrap();
    })
    .await;
    let mut agent = fleet.agent().await;
    assert_eq!(within("resume Verifying", 60, agent.reconcile()).await.unwrap(), Outcome::UpToDate);
    let state = fleet.state().await;
    assert_eq!(state.phase(), Phase::Idle);
    assert!(state.rejected().is_empty(), "a restart while verifying rejects nothing");
    assert_eq!(fleet.operator_image().await, None, "nothing applied while verifying");
    assert_eq!(within("start over", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    drop(agent);

    // Applying: killed after `start_apply`, before rel-2 reached the cluster.
    fleet.promote("rel-2");
    within("persist Applying", 30, async {
        store.load().await.unwrap();
        store
            .update(|s| {
                s.observe_desired(Some("rel-2"), false);
                s.begin("rel-2", &commits[1], Utc::now())?;
                s.start_apply(Some("rel-1"), None)
            })
            .await
            .unwrap();
    })
    .await;
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
    let mut agent = fleet.agent().await;
    assert_eq!(within("resume Applying", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-2".into()));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-2")), "the resumed apply applied rel-2");
    assert_eq!(fleet.statuses(&commits[1]).last().map(|s| s.state), Some(State::Success));
    drop(agent);

    // Baking: killed mid-bake of rel-3, whose bake time has run out since. The new agent judges
    // the gates once and finishes — it does not apply again (the cluster still runs rel-2's
    // objects here, which only a re-apply would change).
    fleet.promote("rel-3");
    within("persist Baking", 30, async {
        store.load().await.unwrap();
        store
            .update(|s| {
                s.observe_desired(Some("rel-3"), false);
                s.begin("rel-3", &commits[2], Utc::now())?;
                s.start_apply(Some("rel-2"), None)?;
                s.applied(Utc::now() - chrono::Duration::minutes(5))
            })
            .await
            .unwrap();
    })
    .await;
    let mut agent = fleet.agent().await;
    let started = Instant::now();
    assert_eq!(within("resume Baking", 60, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-3".into()));
    assert!(started.elapsed() < Duration::from_secs(3), "the bake started over: {:?}", started.elapsed());
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-2")), "a resumed bake applies nothing");
    let success = fleet.statuses(&commits[2]).pop().unwrap();
    assert_eq!(success.state, State::Success);
    let state = fleet.state().await;
    assert_eq!((state.current(), state.last_known_good()), (Some("rel-3"), Some("rel-3")));
    drop(agent);

    // RollingBack: killed after rel-4's gate failed, before the rollback to rel-3 was applied.
    fleet.promote("rel-4");
    let failing =
        GateFigure { name: "pod-restarts".into(), observed: "5".into(), threshold: "3".into(), verdict: "fail".into() };
    within("persist RollingBack", 30, async {
        store.load().await.unwrap();
        store
            .update(|s| {
                s.observe_desired(Some("rel-4"), false);
                s.begin("rel-4", &commits[3], Utc::now())?;
                s.start_apply(Some("rel-3"), None)?;
                s.applied(Utc::now())?;
                s.start_rollback(Failure::new("GateFailed", "pod-restarts 5 > 3"), vec![failing.clone()], Utc::now())
            })
            .await
            .unwrap();
    })
    .await;
    let mut agent = fleet.agent().await;
    assert_eq!(
        within("resume RollingBack", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-4".into(), to: Some("rel-3".into()) }
    );
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-3")), "the rollback applied rel-3");
    let failure = fleet.statuses(&commits[3]).pop().unwrap();
    assert_eq!(failure.state, State::Failure);
    assert_eq!(failure.description, "rolled back to rel-3: pod-restarts 5 > 3");
    assert_eq!(failure.rollback_to.as_deref(), Some("rel-3"));
    assert_eq!(failure.gates, [failing]);
    let state = fleet.state().await;
    assert_eq!(state.current(), Some("rel-3"));
    assert_eq!(within("after the rollback", 30, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-4".into()));
}
