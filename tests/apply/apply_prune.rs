//! Prune against a real API server: what a release drops is deleted after the apply, except a
//! CRD (deleting it deletes every custom resource) unless CRD pruning is on, and a Namespace the
//! current release still has objects in.

use crate::apply_support;

use apply_support::{OPERATOR_NS, apply, get, policy, release, start, without};
use fleetgate::apply::{Action, Engine, ObjectChange};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);
const CRD: &str = "redisclusters.cache.example.com";

fn outcome(changes: &[ObjectChange], name: &str) -> Action {
    changes.iter().find(|c| c.object.name == name).unwrap_or_else(|| panic!("{name} in {changes:#?}")).action.clone()
}

#[tokio::test]
async fn crds_are_pruned_only_when_allowed_and_used_namespaces_never() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("prune-crd").await;
        let client = cluster.client();
        let v1 = release("v1", "rel-v1", &[]);
        let dropped =
            ["operator/crds/redisclusters.cache.example.com.yaml", "operator/sample.yaml", "operator/namespace.yaml"];
        let slim = without(&v1, "rel-slim", &dropped);
        apply(&engine, &v1, &policy()).await.expect("v1 applies");

        // Default: the CRD stays, the namespace (still holding the Deployment) stays, the
        // custom resource of the release goes.
        apply(&engine, &slim, &policy()).await.expect("slim applies");
        let pruned = engine.prune().await.expect("prune");
        assert_eq!(pruned.len(), 3, "{pruned:#?}");
        assert!(matches!(outcome(&pruned, CRD), Action::Retained(why) if why.contains("CRD pruning is off")));
        assert!(
            matches!(outcome(&pruned, OPERATOR_NS), Action::Retained(why) if why.contains("rel-slim still has objects"))
        );
        assert_eq!(outcome(&pruned, "sample"), Action::Pruned);
        assert!(get(&client, "apiextensions.k8s.io/v1", "CustomResourceDefinition", None, CRD).await.is_some());
        assert!(get(&client, "v1", "Namespace", None, OPERATOR_NS).await.is_some());
        let inventory = engine.inventory().await.unwrap().unwrap();
        assert!(inventory.pending_prune.is_empty(), "retained objects leave the pending list");

        // With CRD pruning on, the same step deletes the CRD.
        apply(&engine, &v1, &policy()).await.expect("v1 again");
        let mut options = engine.options().clone();
        options.prune_crds = true;
        let pruning = Engine::new(client.clone(), options);
        apply(&pruning, &slim, &policy()).await.expect("slim again");
        let pruned = pruning.prune().await.expect("prune with CRDs");
        assert_eq!(outcome(&pruned, CRD), Action::Pruned);
        loop {
            if get(&client, "apiextensions.k8s.io/v1", "CustomResourceDefinition", None, CRD).await.is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("test finishes in time");
}
