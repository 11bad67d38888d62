//! Attack: someone who can push to the fleet repo, but holds no key, makes the gates toothless on
//! the branch tip (a one-second bake, a restart limit nobody reaches) and promotes a release whose
//! Operator crash-loops. With `promotions: unsigned` the tip only chooses *which* signed release
//! runs; the gates come from the release tag's own signed tree, so the crash loop still fails them
//! and the cluster goes back to the previous release.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;

const TOOTHLESS: &str = "    - name: pod-restarts\n      podRestarts: {max: 1000000}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gates_weakened_on_the_unsigned_tip_still_roll_a_crash_loop_back() {
    let fleet = Fleet::start("atk-gates", true).await;
    fleet.set_gates("20s", STRICT_RESTARTS);
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    // The release manager cuts rel-2 under the strict gates (they are in its signed tree)...
    let rel2 = fleet.release("rel-2", crash_looping);
    // ...and the pusher weakens them on the tip before promoting it.
    fleet.set_gates("1s", TOOTHLESS);
    fleet.promote("rel-2");

    assert_eq!(
        within("rel-2", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) }
    );
    fleet.assert_rolled_back_by_restarts(&rel2, "pod-restarts").await;
}
