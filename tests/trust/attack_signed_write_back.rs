//! Attack on signed write-back: whoever holds a cluster's status key (a compromised cluster) can
//! SSH-sign commits as that cluster's agent. With `promotions: signed`, such a commit is accepted
//! as the tip only as a write-back: it changes nothing but that cluster's own pin, to a release the
//! cluster reported running. A commit signed with cluster-a's key that also edits another file,
//! pins cluster-b, pins cluster-a to a release it never ran, or changes more than the pin, is
//! refused, each with its own error, and the cluster stays where it is. So is a well-formed pin on
//! top of an unsigned commit (which it would otherwise launder). The well-formed pin on the
//! accepted tip, signed the same way, is accepted — so the refusals come from the rules, not from
//! the signature.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::{AgentSettings, Outcome};
use fleetgate::model::{PromotionMode, error_chain};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_signed_with_a_cluster_key_are_only_accepted_as_its_own_pin_to_a_release_it_ran() {
    let fleet = Fleet::start("atk-signed-wb", false).await;
    fleet.release("rel-1", |_| {});
    fleet.release("rel-2", |_| {});
    fleet.promote_signed("rel-1");
    let accepted = fleet.tip();
    let settings = AgentSettings { promotions: Some(PromotionMode::Signed), ..fleet.settings() };
    let mut agent = fleet.agent_with(settings).await;
    assert_eq!(within("rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    let pin_a = |release: &str| {
        fleet.edit("clusters/cluster-a.yaml", "  # release: rel-20250315-001", &format!("  release: {release}"))
    };
    let attacks: [(&str, &dyn Fn(), &str); 4] = [
        (
            "also edits another file",
            &|| {
                pin_a("rel-1");
                std::fs::write(fleet.work.join("NOTES.md"), "not a pin\n").unwrap();
            },
            "but changes NOTES.md",
        ),
        (
            "pins another cluster",
            &|| fleet.edit("clusters/cluster-b.yaml", "  wave: wave-1", "  wave: wave-1\n  release: rel-1"),
            "but pins cluster cluster-b",
        ),
        (
            "pins a release the cluster never ran",
            &|| pin_a("rel-2"),
            "pins it to rel-2, a release cluster-a never reported running",
        ),
        (
            "changes more than the pin",
            &|| {
                pin_a("rel-1");
                fleet.edit("clusters/cluster-a.yaml", "  wave: canary", "  wave: wave-2");
            },
            "changes more of clusters/cluster-a.yaml than spec.release",
        ),
    ];
    for (attack, edit, expected) in attacks {
        edit();
        fleet.commit_signed_by_cluster_and_push(CLUSTER, &format!("fleetgate: {attack}"));
        let err = within(attack, 60, agent.pass()).await.unwrap_err();
        assert_eq!(err.reason(), "PromotionRefused", "{attack}: {err:?}");
        let message = error_chain(&err);
        assert!(message.contains("signed by the status key of cluster cluster-a"), "{attack}: {message}");
        assert!(message.contains(expected), "{attack}: {message}");
        assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")), "{attack}: the cluster stays on rel-1");
        fleet.force_push(&accepted);
    }
    let events = fleet.events_json().await;
    assert!(events.contains("PromotionRefused"), "no Event says why: {events}");

    // A well-formed pin, but on top of an unsigned commit that registers the pusher's own key
    // for a new cluster: the write-back would launder it. Refused, naming the parent.
    std::fs::write(
        fleet.work.join("clusters/cluster-x.yaml"),
        format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: cluster-x\nspec:\n  wave: canary\n  statusKey: {}\n",
            fleet.status_public_key("cluster-x")
        ),
    )
    .unwrap();
    fleet.commit_and_push("unsigned: a new cluster with the pusher's status key");
    let unsigned = fleet.tip();
    pin_a("rel-1");
    fleet.commit_signed_by_cluster_and_push(CLUSTER, "fleetgate: roll cluster-a back to rel-1");
    let err = within("laundering write-back", 60, agent.pass()).await.unwrap_err();
    let message = error_chain(&err);
    assert!(message.contains(&format!("its parent {} was never acceptable", &unsigned[..12])), "{message}");
    assert!(!fleet.state().await.trust().status_keys.contains_key("cluster-x"), "the pusher's key was pinned");
    fleet.force_push(&accepted);

    // The same key, a well-formed write-back: the cluster's own pin, to the release it ran.
    pin_a("rel-1");
    fleet.commit_signed_by_cluster_and_push(CLUSTER, "fleetgate: roll cluster-a back to rel-1");
    assert_eq!(within("write-back", 60, agent.reconcile()).await.unwrap(), Outcome::UpToDate);
    assert_eq!(fleet.state().await.trust().accepted_tip.as_deref(), Some(fleet.tip().as_str()));
}
