//! Attack: someone who can push to the fleet repo, but holds no key, relabels a production
//! cluster as a canary on the branch tip (`clusters/C.yaml` is unsigned), hoping to de-select the
//! strict gates that only production clusters run, and promotes a release whose Operator
//! crash-loops. Gate selectors are matched against the cluster's wave and labels in the same
//! signed tree the policy comes from (the release tag's, with `promotions: unsigned`), so the
//! production gate still applies and the cluster goes back to the previous release.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;

/// A strict restart gate for production, a toothless one for canaries.
const BY_TIER: &str = "    - name: prod-restarts\n      select: {matchLabels: {tier: prod}}\n      podRestarts: {max: 1}\n    \
                       - name: canary-restarts\n      select: {matchLabels: {tier: canary}}\n      podRestarts: {max: 1000000}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relabeling_a_prod_cluster_on_the_unsigned_tip_keeps_its_prod_gates() {
    let fleet = Fleet::start("atk-relabel", true).await;
    fleet.edit("clusters/cluster-a.yaml", "    env: staging\n", "    env: staging\n    tier: prod\n");
    fleet.set_gates("20s", BY_TIER);
    let rel1 = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    let passed = fleet.statuses(&rel1).pop().unwrap();
    let names: Vec<&str> = passed.gates.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["prod-restarts"], "only the gate selecting tier=prod runs on cluster-a");

    // rel-2 is cut with cluster-a labelled tier=prod in its signed tree...
    let rel2 = fleet.release("rel-2", crash_looping);
    // ...and the pusher relabels it a canary on the tip before promoting it.
    fleet.edit("clusters/cluster-a.yaml", "tier: prod", "tier: canary");
    fleet.promote("rel-2");

    assert_eq!(
        within("rel-2", 240, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) }
    );
    fleet.assert_rolled_back_by_restarts(&rel2, "prod-restarts").await;
}
