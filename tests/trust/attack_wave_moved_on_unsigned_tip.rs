//! Attack: someone who can push to the fleet repo, but holds no key, wants a release on the last
//! production cluster early. On the unsigned branch tip they move cluster-c from the last wave
//! into the canary wave and delete the soak that holds it after wave-1. Waves, their membership
//! and their pacing come from the same signed tree as the policies (the release tag's, with
//! `promotions: unsigned`), so cluster-c still waits for every earlier wave and then for the soak.
//!
//! Real components: a kube-apiserver the agent runs against as its ServiceAccount, the fleet repo
//! on a `git daemon`, a GnuPG-signed release tag; the earlier waves' successes are signed with
//! their clusters' registered status keys.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate::status::{State, Status};

const SIGNED_WAVES: &str = "  waves:\n    - canary\n    - name: wave-1\n      soak: 1h\n    - wave-2\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_cluster_to_an_earlier_wave_on_the_unsigned_tip_changes_nothing() {
    let fleet = Fleet::start("atk-wave-move", false).await;
    fleet.edit("fleet.yaml", "  waves: [canary, wave-1, wave-2]\n", SIGNED_WAVES);
    fleet.commit_and_push("wave-1 soaks for an hour");
    let commit = fleet.release("rel-1", |_| {});
    // Unsigned: cluster-c joins the canaries, and the soak is gone.
    fleet.edit("fleet.yaml", "    - name: wave-1\n      soak: 1h\n", "    - wave-1\n");
    fleet.edit("clusters/cluster-c.yaml", "wave: wave-2", "wave: canary");
    fleet.promote("rel-1");

    let mut agent = fleet.agent_with(fleet.settings_for("cluster-c")).await;
    let wait = |outcome: Outcome| match outcome {
        Outcome::Waiting { reason, .. } => reason,
        other => panic!("cluster-c must wait, got {other:?}"),
    };
    let reason = wait(within("cluster-c pass", 90, agent.reconcile()).await.unwrap());
    assert_eq!(reason, "waiting for wave canary: cluster-a no status yet");

    // The earlier waves succeed: the signed soak still holds cluster-c.
    for cluster in [CLUSTER, "cluster-b"] {
        let done = Status::new(cluster, "rel-1", &commit, State::Success, "all gates passed for 3s");
        fleet.write_status_as(&fleet.status_identity(cluster), &done);
    }
    let reason = wait(within("cluster-c pass", 90, agent.reconcile()).await.unwrap());
    assert!(reason.starts_with("wave wave-1 soaks until ") && reason.ends_with("left)"), "{reason}");
}
