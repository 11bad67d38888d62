//! Pre-apply gates against a real API server: the release's CRDs against the live ones (with the
//! server's own `status.storedVersions`), the live custom resources against the new schemas, and
//! the release's `requires` against the server version and node architectures.

use crate::gates_support;

use fleetgate::gates::crd_compat::Rule;
use fleetgate::gates::{PreapplyBlock, PreapplyReport, preapply, read_cluster_facts};
use fleetgate::model::Requirements;
use fleetgate_testenv::ClusterOptions;
use gates_support::*;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::json;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(5);

async fn check(client: &kube::Client, new: &str) -> PreapplyReport {
    let crds: Vec<CustomResourceDefinition> = vec![crd_fixture(new)];
    within("preapply", 30, preapply(client, &crds, None, &[], TIMEOUT)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_crds_are_checked_against_the_live_crd_and_its_objects() {
    let cluster = start(ClusterOptions::new("gates-pre")).await;
    let client = cluster.client();
    install_crd(&client, &crd_fixture("base")).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cache.example.com", "v1alpha1", "RedisCluster"),
        "redisclusters",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), OPERATOR_NS, &ar);
    for (name, spec) in [
        ("with-image", json!({"size": 3, "mode": "cluster", "image": "redis:7"})),
        ("without-image", json!({"size": 1, "mode": "standalone"})),
    ] {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cache.example.com/v1alpha1", "kind": "RedisCluster", "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap();
        eventually("create RedisCluster", 30, || async { api.create(&PostParams::default(), &obj).await.ok() }).await;
    }

    // Additive: nothing to report.
    let report = check(&client, "add-optional-field").await;
    assert!(report.passed(), "{:?}", report.blocked);

    // A new required field: the CRD finding, and the one live object that lacks the field.
    let report = check(&client, "required-added").await;
    let blocked = report.blocked.expect("blocked");
    assert_eq!(blocked.gate(), "crd-compatibility");
    assert_eq!(
        blocked.problems(),
        [
            "CRD incompatible: redisclusters.cache.example.com v1alpha1 .spec.image: new required field; existing objects without it would stop validating",
            "redisclusters.cache.example.com v1alpha1 redis-operator/without-image would not validate: .spec.image: required field is missing",
        ]
    );

    // An enum value removed: the object that uses it is named.
    let report = check(&client, "enum-value-removed").await;
    let Some(PreapplyBlock::CrdIncompatible { findings, invalid_objects }) = report.blocked else {
        panic!("expected a CRD incompatibility: {:?}", report.blocked)
    };
    assert_eq!(findings.iter().map(|f| f.rule).collect::<Vec<_>>(), [Rule::EnumValuesRemoved]);
    assert_eq!(invalid_objects.len(), 1);
    assert_eq!(invalid_objects[0].object, "redis-operator/with-image");
    assert_eq!(invalid_objects[0].violations[0].to_string(), ".spec.mode: is not one of \"standalone\"");

    // The live CRD's storedVersions ([v1alpha1], written by the server) drive the version rules.
    let live =
        Api::<CustomResourceDefinition>::all(client.clone()).get("redisclusters.cache.example.com").await.unwrap();
    assert_eq!(live.status.unwrap().stored_versions.unwrap(), ["v1alpha1"]);
    let report = check(&client, "storage-moved-none").await;
    let Some(PreapplyBlock::CrdIncompatible { findings, .. }) = report.blocked else {
        panic!("expected a CRD incompatibility: {:?}", report.blocked)
    };
    assert_eq!(findings.iter().map(|f| f.rule).collect::<Vec<_>>(), [Rule::StorageVersionUnconvertible]);
    let report = check(&client, "storage-moved-webhook").await;
    assert!(!matches!(report.blocked, Some(PreapplyBlock::CrdIncompatible { .. })), "{:?}", report.blocked);

    // A CRD the cluster does not have yet is new: nothing to break.
    let report = check(&client, "other-resource").await;
    assert!(report.passed(), "{:?}", report.blocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_requirements_are_checked_against_server_version_and_node_architectures() {
    let cluster = start(ClusterOptions::new("gates-req")).await;
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, arch) in [("node-a", "amd64"), ("node-b", "arm64"), ("node-c", "amd64")] {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/arch": arch}},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }

    let facts = read_cluster_facts(&client, TIMEOUT).await.unwrap();
    assert!(facts.server_version.starts_with("v1.36."), "{facts:?}");
    assert_eq!(facts.architectures, ["amd64", "arm64"]);

    let requires = |k: Option<&str>, archs: &[&str]| Requirements {
        kubernetes: k.map(str::to_string),
        architectures: archs.iter().map(|a| a.to_string()).collect(),
    };
    let run = |r: Requirements| {
        let client = client.clone();
        async move { preapply(&client, &[], Some(&r), &[], TIMEOUT).await.unwrap() }
    };
    let report = run(requires(Some(">=1.30"), &["amd64", "arm64"])).await;
    assert!(report.passed(), "{:?}", report.blocked);

    let report = run(requires(Some(">=1.40"), &[])).await;
    let problems = report.blocked.as_ref().map(PreapplyBlock::problems);
    assert_eq!(
        problems,
        Some(vec![format!("the release requires Kubernetes >=1.40, the cluster runs {}", facts.server_version)])
    );

    let report = run(requires(None, &["amd64"])).await;
    let Some(PreapplyBlock::Requirement { error }) = &report.blocked else { panic!("{:?}", report.blocked) };
    assert_eq!(error.to_string(), "the release's images are built for [amd64], but the cluster has nodes of arm64");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["cluster"]["architectures"], json!(["amd64", "arm64"]));
    assert_eq!(json["blocked"]["gate"], "requirements");
}
