//! With `promotions: signed`, an automatic rollback's write-back lands and the fleet keeps going:
//! the canary's agent signs the commit with its status key (SSH, namespace `git`), and the signed
//! mode accepts it as the tip — in the same agent and in the next wave's — because it changes
//! nothing but the canary's pin, to the release the canary reported rolling back to. A signed
//! promotion on top of it then applies.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::{AgentSettings, Outcome};
use fleetgate::model::PromotionMode;
use fleetgate_testenv::git_in;

const WAVE_1: &str = "cluster-b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_fleets_write_back_is_accepted_and_a_later_signed_promotion_applies() {
    let fleet = Fleet::start("wb-signed", true).await;
    let signed = |cluster: &str| AgentSettings {
        promotions: Some(PromotionMode::Signed),
        write_back: Some(true),
        ..fleet.settings_for(cluster)
    };
    fleet.release("rel-1", |_| {});
    fleet.promote_signed("rel-1");
    let mut canary = fleet.agent_with(signed(CLUSTER)).await;
    assert_eq!(within("rel-1", 120, canary.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    fleet.set_gates("4s", FAILING_GATES);
    fleet.release("rel-2", |_| {});
    fleet.promote_signed("rel-2");
    let promotion = fleet.tip();
    assert_eq!(
        within("rel-2", 240, canary.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) }
    );

    // The write-back landed on top of the signed promotion, signed by the canary's status key.
    fleet.git(&["pull", "-q", "--ff-only", "origin", "main"]);
    assert_eq!(fleet.git(&["rev-parse", "HEAD~1"]), promotion);
    assert_eq!(git_in(&fleet.work, &["diff", "--name-only", "HEAD~1", "HEAD"]), "clusters/cluster-a.yaml");
    let message = fleet.git(&["log", "-1", "--format=%B"]);
    assert!(message.contains("Fleetgate-Release: rel-2"), "{message}");
    assert!(message.contains("Fleetgate-Failure: canary-probe"), "the trailers name the failed gate: {message}");
    assert!(message.contains("Fleetgate-Rolled-Back-To: rel-1"), "{message}");
    let signers = fleet.dir.path().join("allowed_signers");
    std::fs::write(&signers, format!("cluster-a {}\n", fleet.status_public_key(CLUSTER))).unwrap();
    let allowed = format!("gpg.ssh.allowedSignersFile={}", signers.display());
    fleet.git(&["-c", &allowed, "verify-commit", "HEAD"]);

    // The same agent accepts its own write-back as the tip: Git says what runs.
    assert_eq!(within("after", 60, canary.reconcile()).await.unwrap(), Outcome::UpToDate);
    let write_back = fleet.tip();
    assert_eq!(fleet.state().await.trust().accepted_tip.as_deref(), Some(write_back.as_str()));

    // So does the next wave's agent, seeing it first: it waits, since the canary failed rel-2.
    let mut wave_1 = fleet.agent_with(signed(WAVE_1)).await;
    match within("wave-1", 60, wave_1.reconcile()).await {
        Ok(Outcome::Waiting { release, reason }) => {
            assert_eq!(release, "rel-2");
            assert!(reason.contains("cluster-a"), "{reason}");
        }
        other => panic!("wave-1 must accept the write-back and wait, got {other:?}"),
    }

    // The fleet keeps going: a signed promotion of a good release on top of the write-back (the
    // canary's pin dropped), which the next wave accepts (waiting for the canary) and the canary runs.
    fleet.set_gates("3s", QUICK_GATES);
    fleet.release("rel-3", |_| {});
    fleet.edit("clusters/cluster-a.yaml", "release: rel-1", "# release: rel-1");
    fleet.promote_signed("rel-3");
    match within("wave-1 rel-3", 60, wave_1.reconcile()).await {
        Ok(Outcome::Waiting { release, .. }) => assert_eq!(release, "rel-3"),
        other => panic!("wave-1 must accept the signed promotion on top of the write-back, got {other:?}"),
    }
    assert_eq!(within("rel-3", 120, canary.reconcile()).await.unwrap(), Outcome::Succeeded("rel-3".into()));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-3")));
}
