//! Shared set-up of the gates' cluster tests: real clusters, CRD fixtures installed and
//! established, policies from YAML, and bounded waits.

use fleetgate::gates::{Baseline, GateRunner, OperatorTarget};
use fleetgate::model::{GatePolicy, GatePolicySpec, parse_document};
pub use fleetgate_testenv::wait::{eventually, within};
use fleetgate_testenv::{ClusterOptions, TestCluster};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::runtime::wait::{await_condition, conditions};

pub const OPERATOR_NS: &str = "redis-operator";

/// Starts a cluster with the operator namespace created.
pub async fn start(opts: ClusterOptions) -> TestCluster {
    let cluster = TestCluster::start(opts).await.unwrap_or_else(|e| panic!("{e:#}"));
    cluster.create_namespace(OPERATOR_NS).await.expect("operator namespace");
    cluster
}

/// A CRD from `tests/testdata/crds/<name>.yaml`.
pub fn crd_fixture(name: &str) -> CustomResourceDefinition {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/crds").join(format!("{name}.yaml"));
    serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Creates a CRD and waits until it is Established.
pub async fn install_crd(client: &kube::Client, crd: &CustomResourceDefinition) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.create(&PostParams::default(), crd).await.expect("create CRD");
    let name = crd.metadata.name.clone().unwrap();
    within("CRD established", 30, await_condition(api, &name, conditions::is_crd_established())).await.unwrap();
}

/// A GatePolicy spec from its `gates:` list (indented by four spaces) and timing.
pub fn policy(bake: &str, interval: &str, gates: &str) -> GatePolicySpec {
    let text = format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: GatePolicy\nmetadata: {{name: t}}\nspec:\n  bakeTime: {bake}\n  \
         interval: {interval}\n  callTimeout: 5s\n  gates:\n{gates}"
    );
    let p: GatePolicy = parse_document("policy.yaml", &text, "GatePolicy").unwrap_or_else(|e| panic!("{e}\n{text}"));
    p.spec
}

/// A runner for the operator selected by `selector` in [`OPERATOR_NS`], baking from now.
pub fn runner(cluster: &TestCluster, policy: GatePolicySpec, selector: &str, baseline: Baseline) -> GateRunner {
    let target = OperatorTarget { namespace: OPERATOR_NS.into(), selector: selector.into() };
    GateRunner::new(policy, None, cluster.client(), target, chrono::Utc::now(), baseline).unwrap()
}
