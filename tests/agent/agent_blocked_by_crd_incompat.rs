//! A release whose CRD would break the live one is blocked by the pre-apply CRD compatibility
//! gate: nothing is applied, the live CRD keeps its schema, and the `failure` status names the
//! gate and what it found.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate::status::State;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::runtime::wait::{await_condition, conditions};

const CRD: &str = "redisclusters.cache.example.com";

fn size_type(crd: &CustomResourceDefinition) -> Option<String> {
    let schema = crd.spec.versions[0].schema.as_ref()?.open_api_v3_schema.as_ref()?;
    let spec = schema.properties.as_ref()?.get("spec")?;
    spec.properties.as_ref()?.get("size")?.type_.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_type_change_blocks_the_release_before_anything_is_applied() {
    let fleet = Fleet::start("agent-crd", false).await;
    // The live CRD, as an earlier install of the Operator left it.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fleet-repo-template/operator/crds/redisclusters.cache.example.com.yaml");
    let live: CustomResourceDefinition = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(fleet.cluster.client());
    crds.create(&PostParams::default(), &live).await.unwrap();
    within("CRD established", 30, await_condition(crds.clone(), CRD, conditions::is_crd_established())).await.unwrap();

    // rel-1 turns spec.size from an integer into a string: every stored object would break.
    let commit = fleet.release("rel-1", |dir| {
        let file = dir.join("crds/redisclusters.cache.example.com.yaml");
        let text = std::fs::read_to_string(&file).unwrap();
        let changed = text.replace("size:\n                  type: integer", "size:\n                  type: string");
        assert_ne!(changed, text, "the fixture's size field moved");
        std::fs::write(&file, changed).unwrap();
    });
    fleet.promote("rel-1");

    let mut agent = fleet.agent().await;
    let outcome = within("reconcile", 60, agent.reconcile()).await.unwrap();
    let Outcome::Blocked { release, reason } = &outcome else { panic!("expected a block, got {outcome:?}") };
    assert_eq!(release, "rel-1");
    assert!(reason.starts_with("crd-compatibility: CRD incompatible: redisclusters.cache.example.com"), "{reason}");
    assert!(reason.contains(".spec.size"), "{reason}");

    let statuses = fleet.statuses(&commit);
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    let status = &statuses[0];
    assert_eq!(status.state, State::Failure);
    assert_eq!(status.description, format!("blocked before apply by {reason}"));
    assert_eq!(status.gates.len(), 1);
    assert_eq!((status.gates[0].name.as_str(), status.gates[0].verdict.as_str()), ("crd-compatibility", "fail"));
    assert_eq!(status.applied_at, None);

    // Nothing applied: the live CRD keeps its integer, the Operator was never created.
    assert_eq!(size_type(&crds.get(CRD).await.unwrap()).as_deref(), Some("integer"));
    assert!(!fleet.namespace_applied(OPERATOR_NS).await);
    let state = fleet.state().await;
    assert_eq!(state.current(), None);
    assert_eq!(state.rejected()["rel-1"].failure.reason, "CrdIncompatible");
    assert_eq!(within("again", 30, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-1".into()));
}
