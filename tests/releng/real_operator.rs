//! A real-shaped operator end to end: the generated fixture chart (ten CRDs of 0.3–1 MB embedding
//! the API server's own PodSpec schema, two groups, two versions, three images, RBAC, Services) is
//! released with `fleetgate release create --chart` (the real helm), checked by `fleetgate
//! validate`, applied by the agent's loop against a real cluster with workloads (kwok), upgraded
//! with CRD changes (a new optional field, a new served version), and a release whose manager pods
//! crash-loop fails its gate and is rolled back with the custom resources and objects back as
//! they were. Each step's wall time is printed (docs/BENCHMARKS.md, "Real-shaped operator").

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate_testenv::TEST_FAIL_LABEL;
use fleetgate_testenv::operator_fixture::{
    CHART_NAME, CoreSchemas, CrdGeneration, FixtureChart, FixtureImages, KINDS, WORKLOADS_GROUP, helm_binary,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fleetgate");
/// Both Deployments available and no crash loop, over a 5 s bake: a crash-looping manager is a
/// rollout that never completes, which fails when the bake ends.
const GATES: &str = "    - name: deployment-available\n      deploymentAvailable: {}\n    \
                     - name: pod-restarts\n      podRestarts: {max: 3}\n";

/// Wall times of the steps, printed at the end.
struct Clock(Vec<(String, Duration)>, Instant);

impl Clock {
    fn lap(&mut self, step: &str) {
        let now = Instant::now();
        self.0.push((step.to_string(), now - self.1));
        eprintln!("[real-operator] {step}: {:.1} s", (now - self.1).as_secs_f64());
        self.1 = now;
    }
}

fn images(manager: &str) -> FixtureImages {
    FixtureImages { manager_tag: manager.into(), proxy_tag: "v0.16.0".into(), webhook_tag: "v1.0.0".into() }
}

/// `fleetgate release create --chart DIR [--set …] --push` signed by the fleet's key.
fn release(fleet: &Fleet, id: &str, chart: &Path, images: &FixtureImages, set: &[&str]) {
    let mut cmd = Command::new(BIN);
    cmd.args(["release", "create", "--repo"]).arg(&fleet.work).args(["--id", id, "--chart"]).arg(chart);
    for s in set {
        cmd.args(["--set", s]);
    }
    cmd.args(images.release_args())
        .args(["--crd-version", "v1", "--git-commit", "a1b2c3d4e5f6", "--all", "--requires-kubernetes", ">=1.30"])
        .args(["--sign-key", &fleet.fpr, "--gpg-home"])
        .arg(fleet.gpg.path())
        .arg("--push")
        .env("FLEETGATE_HELM", helm_binary().unwrap_or_else(|e| panic!("{e:#}")));
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "release create {id}: {}", String::from_utf8_lossy(&out.stderr));
}

fn validate(fleet: &Fleet, id: &str) {
    let out = Command::new(BIN)
        .args(["validate", "--repo"])
        .arg(&fleet.work)
        .arg("--trusted-keys")
        .arg(&fleet.trusted)
        .args(["--release", id])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "validate {id}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn resource(kind: &str, plural: &str, version: &str) -> ApiResource {
    ApiResource {
        group: WORKLOADS_GROUP.into(),
        version: version.into(),
        api_version: format!("{WORKLOADS_GROUP}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn manager(fleet: &Fleet) -> Deployment {
    let api: Api<Deployment> = Api::namespaced(fleet.cluster.client(), OPERATOR_NS);
    api.get("redis-operator-manager").await.unwrap()
}

fn first_image(d: &Deployment) -> String {
    d.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0].image.clone().unwrap()
}

/// Grants the agent what `fleetgate agent rbac` says release `id` needs, in place of deploy/'s
/// template-Operator RBAC: what a spoke running this Operator installs.
async fn grant(fleet: &Fleet, id: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["agent", "rbac", "--release", id, "--repo"])
        .arg(&fleet.work)
        .output()
        .unwrap();
    assert!(out.status.success(), "agent rbac {id}: {}", String::from_utf8_lossy(&out.stderr));
    let rbac = String::from_utf8(out.stdout).unwrap();
    let manifests = deploy_manifests().replace_file("rbac-operator.yaml", &rbac).unwrap();
    fleet.cluster.deploy_agent(&manifests).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_shaped_operator_chart_is_released_upgraded_and_rolled_back() {
    let mut clock = Clock(Vec::new(), Instant::now());
    let fleet = Fleet::start("real-op", true).await;
    fleet.set_gates("5s", GATES);
    clock.lap("start cluster (with kwok), git daemon, gpg");

    let core = within("read PodSpec from /openapi/v3", 30, CoreSchemas::fetch(&fleet.cluster.client())).await.unwrap();
    let charts = fleet.dir.path().join("charts");
    let v1 = charts.join("v1");
    FixtureChart { version: "1.0.0".into(), generation: CrdGeneration::Initial, images: images("v1.0.0") }
        .write(&v1, &core)
        .unwrap();
    let v2 = charts.join("v2");
    FixtureChart { version: "1.1.0".into(), generation: CrdGeneration::Upgraded, images: images("v1.1.0") }
        .write(&v2, &core)
        .unwrap();
    clock.lap("generate the chart (both versions)");

    // Every CRD is real-sized; the largest parses quickly with fleetgate's YAML limits in place.
    let mut largest = (0usize, String::new());
    for dir in [&v1, &v2] {
        for entry in std::fs::read_dir(dir.join("crds")).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            eprintln!("[real-operator] {}: {} bytes", path.strip_prefix(&charts).unwrap().display(), text.len());
            assert!((300_000..=1_000_000).contains(&text.len()), "{}: {} bytes", path.display(), text.len());
            assert!(text.contains("*emphasis*") || text.contains("*Active*"), "markdown in descriptions");
            if text.len() > largest.0 {
                largest = (text.len(), text);
            }
        }
    }
    let parse = Instant::now();
    let docs = fleetgate::model::parse_multi("largest-crd.yaml", &largest.1).expect("the largest CRD parses");
    let parse = parse.elapsed();
    assert_eq!(docs.len(), 1);
    eprintln!("[real-operator] largest CRD: {} bytes, parsed in {:.0} ms", largest.0, parse.as_secs_f64() * 1e3);
    assert!(parse < Duration::from_secs(5), "a 1 MB CRD parses fast: {parse:?}");

    release(&fleet, "rel-1", &v1, &images("v1.0.0"), &[]);
    grant(&fleet, "rel-1").await;
    clock.lap("release create --chart rel-1");
    validate(&fleet, "rel-1");
    clock.lap("validate rel-1");

    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("apply rel-1", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    clock.lap("agent: apply + bake rel-1");
    let crds: Api<CustomResourceDefinition> = Api::all(fleet.cluster.client());
    for k in KINDS {
        crds.get(&k.crd_name()).await.unwrap_or_else(|e| panic!("{}: {e}", k.crd_name()));
    }
    assert_eq!(first_image(&manager(&fleet).await), "registry.example.com/fixture/manager:v1.0.0");

    // Custom resources the operator's users create: one served at v1 with a full pod template,
    // one of a newer kind at v1alpha1.
    let pipelines: Api<DynamicObject> =
        Api::namespaced_with(fleet.cluster.client(), OPERATOR_NS, &resource("Pipeline", "pipelines", "v1"));
    let canaries_alpha: Api<DynamicObject> =
        Api::namespaced_with(fleet.cluster.client(), OPERATOR_NS, &resource("Canary", "canaries", "v1alpha1"));
    let pipeline: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{WORKLOADS_GROUP}/v1"), "kind": "Pipeline",
        "metadata": {"name": "nightly", "namespace": OPERATOR_NS},
        "spec": {"replicas": 2, "mode": "Active", "template": {"metadata": {"labels": {"app": "nightly"}}, "spec": {
            "containers": [{"name": "run", "image": "example.com/run:1", "ports": [{"containerPort": 80}],
                            "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}}]}}},
    }))
    .unwrap();
    let canary: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{WORKLOADS_GROUP}/v1alpha1"), "kind": "Canary",
        "metadata": {"name": "first", "namespace": OPERATOR_NS},
        "spec": {"mode": "Standby", "workload": {"name": "probe", "image": "example.com/probe:1"}},
    }))
    .unwrap();
    pipelines.create(&PostParams::default(), &pipeline).await.expect("a Pipeline validates against the v1 schema");
    canaries_alpha.create(&PostParams::default(), &canary).await.unwrap();
    clock.lap("create custom resources");

    release(&fleet, "rel-2", &v2, &images("v1.1.0"), &[]);
    grant(&fleet, "rel-2").await;
    clock.lap("release create --chart rel-2 (CRD changes)");
    validate(&fleet, "rel-2");
    clock.lap("validate rel-2");
    fleet.promote("rel-2");
    assert_eq!(within("apply rel-2", 120, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-2".into()));
    clock.lap("agent: apply + bake rel-2");
    let canary_crd = crds.get(&format!("canaries.{WORKLOADS_GROUP}")).await.unwrap();
    let served: Vec<&str> = canary_crd.spec.versions.iter().filter(|v| v.served).map(|v| v.name.as_str()).collect();
    assert_eq!(served, ["v1beta1", "v1alpha1"], "the new served version is live");
    let canaries_beta: Api<DynamicObject> =
        Api::namespaced_with(fleet.cluster.client(), OPERATOR_NS, &resource("Canary", "canaries", "v1beta1"));
    canaries_beta.get("first").await.expect("the existing Canary is served at v1beta1");
    let mut paused = pipelines.get("nightly").await.unwrap();
    paused.data["spec"]["paused"] = json!(true);
    pipelines.replace("nightly", &PostParams::default(), &paused).await.expect("the new optional field is accepted");
    assert_eq!(first_image(&manager(&fleet).await), "registry.example.com/fixture/manager:v1.1.0");

    // rel-3: the same chart with a manager whose pods crash-loop.
    let failing = format!("podLabels.{}=true", TEST_FAIL_LABEL.replace('.', "\\."));
    release(&fleet, "rel-3", &v2, &images("v1.1.1"), &["manager.image.tag=v1.1.1", &failing]);
    clock.lap("release create --chart rel-3 (--set)");
    fleet.promote("rel-3");
    assert_eq!(
        within("fail and roll back rel-3", 180, agent.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-3".into(), to: Some("rel-2".into()) }
    );
    clock.lap("agent: apply rel-3, gate fails, roll back to rel-2");
    let m = manager(&fleet).await;
    assert_eq!(first_image(&m), "registry.example.com/fixture/manager:v1.1.0", "the manager is rel-2's again");
    let labels = m.spec.unwrap().template.metadata.unwrap().labels.unwrap_or_default();
    assert!(!labels.contains_key(TEST_FAIL_LABEL), "{labels:?}");
    let nightly = pipelines.get("nightly").await.expect("the Pipeline survived the rollback");
    assert_eq!(nightly.data["spec"]["paused"], json!(true));
    assert_eq!(nightly.data["spec"]["template"]["spec"]["containers"][0]["image"], "example.com/run:1");
    canaries_beta.get("first").await.expect("the Canary survived the rollback");
    let release_yaml = fleet.git(&["show", "rel-3:release.yaml"]);
    assert!(release_yaml.contains(&format!("name: {CHART_NAME}")) && release_yaml.contains("valuesDigest"));

    eprintln!("[real-operator] steps:");
    for (step, d) in &clock.0 {
        eprintln!("[real-operator]   {:>6.1} s  {step}", d.as_secs_f64());
    }
}
