//! Smoke tests of the test-cluster harness against real processes: etcd, kube-apiserver and, with
//! workloads, kube-controller-manager, kube-scheduler and kwok. Every wait has a timeout.

use fleetgate_testenv::wait::{eventually, within};
use fleetgate_testenv::{ClusterOptions, TEST_FAIL_LABEL, TestCluster};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;
use std::path::Path;

async fn start(opts: ClusterOptions) -> TestCluster {
    TestCluster::start(opts).await.unwrap_or_else(|e| panic!("{e:#}"))
}

fn deployment(name: &str, replicas: i32, fail: bool) -> Deployment {
    let mut labels = json!({ "app": name });
    if fail {
        labels[TEST_FAIL_LABEL] = json!("true");
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "replicas": replicas,
            "progressDeadlineSeconds": 15,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": labels },
                "spec": { "containers": [{ "name": "app", "image": "registry.invalid/app:1" }] },
            },
        },
    }))
    .unwrap()
}

fn condition(d: &Deployment, type_: &str) -> Option<(String, Option<String>)> {
    let c = d.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone()))
}

#[tokio::test]
async fn crd_becomes_established_then_accepts_a_custom_resource() {
    let cluster = start(ClusterOptions::new("crd")).await;
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "widgets.smoke.fleetgate.io" },
        "spec": {
            "group": "smoke.fleetgate.io",
            "scope": "Namespaced",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget" },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object", "properties": {
                    "spec": { "type": "object", "properties": { "size": { "type": "integer" } } },
                } } },
            }],
        },
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    within(
        "CRD Established",
        60,
        await_condition(crds, "widgets.smoke.fleetgate.io", conditions::is_crd_established()),
    )
    .await
    .unwrap();

    let gvk = GroupVersionKind::gvk("smoke.fleetgate.io", "v1", "Widget");
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), "default", &ApiResource::from_gvk_with_plural(&gvk, "widgets"));
    let mut widget = DynamicObject::new("w1", &ApiResource::from_gvk_with_plural(&gvk, "widgets"));
    widget.data = json!({ "spec": { "size": 3 } });
    // The serving endpoint for a new CRD can lag a moment behind Established.
    eventually("creating a Widget", 30, || async { widgets.create(&PostParams::default(), &widget).await.ok() }).await;
    let got = widgets.get("w1").await.unwrap();
    assert_eq!(got.data["spec"]["size"], 3);
}

#[tokio::test]
async fn deployment_becomes_available_with_ready_pods() {
    let cluster = start(ClusterOptions::new("ready").with_workloads(true)).await;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), "default");
    deployments.create(&PostParams::default(), &deployment("web", 2, false)).await.unwrap();

    eventually("Deployment web Available with 2 ready replicas", 120, || async {
        let d = deployments.get("web").await.ok()?;
        let ready = d.status.as_ref()?.ready_replicas == Some(2);
        (ready && condition(&d, "Available").map(|c| c.0).as_deref() == Some("True")).then_some(())
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    let list = pods.list(&ListParams::default().labels("app=web")).await.unwrap();
    assert_eq!(list.items.len(), 2);
    for pod in list.items {
        let status = pod.status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let ready = status.conditions.unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "True");
        assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some(fleetgate_testenv::FAKE_NODE_NAME));
    }

    // A rolling update replaces the pods: old ones terminate (kwok's pod-delete stage) and the new
    // ReplicaSet's pods become Ready.
    let image = json!({ "spec": { "template": { "spec": { "containers": [
        { "name": "app", "image": "registry.invalid/app:2" }
    ] } } } });
    deployments.patch("web", &PatchParams::default(), &Patch::Strategic(&image)).await.unwrap();
    eventually("web rolled out to app:2", 120, || async {
        let d = deployments.get("web").await.ok()?;
        let s = d.status.as_ref()?;
        let done = s.observed_generation == d.metadata.generation
            && s.updated_replicas == Some(2)
            && s.available_replicas == Some(2)
            && s.replicas == Some(2);
        let list = pods.list(&ListParams::default().labels("app=web")).await.ok()?;
        let all_new = list.items.iter().all(|p| {
            p.spec.as_ref().is_some_and(|s| s.containers[0].image.as_deref() == Some("registry.invalid/app:2"))
        });
        (done && list.items.len() == 2 && all_new).then_some(())
    })
    .await;
}

#[tokio::test]
async fn deployment_with_failure_label_never_becomes_available() {
    let cluster = start(ClusterOptions::new("fail").with_workloads(true)).await;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), "default");
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    deployments.create(&PostParams::default(), &deployment("broken", 1, true)).await.unwrap();

    // Both signals a health gate reads: restarts climb, and the rollout misses its deadline.
    let restarts = eventually("restartCount >= 3 on a pod of broken", 90, || async {
        let list = pods.list(&ListParams::default().labels("app=broken")).await.ok()?;
        let max = list
            .items
            .iter()
            .flat_map(|p| p.status.as_ref()?.container_statuses.clone())
            .flatten()
            .map(|c| c.restart_count)
            .max()?;
        (max >= 3).then_some(max)
    })
    .await;
    assert!(restarts >= 3);
    eventually("broken reports ProgressDeadlineExceeded", 90, || async {
        let d = deployments.get("broken").await.ok()?;
        let progressing = condition(&d, "Progressing")?;
        (progressing.0 == "False" && progressing.1.as_deref() == Some("ProgressDeadlineExceeded")).then_some(())
    })
    .await;

    let d = deployments.get("broken").await.unwrap();
    assert_ne!(condition(&d, "Available").map(|c| c.0).as_deref(), Some("True"));
    assert_eq!(d.status.as_ref().unwrap().ready_replicas.unwrap_or(0), 0);
    let list = pods.list(&ListParams::default().labels("app=broken")).await.unwrap();
    for pod in list.items {
        let status = pod.status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"), "crash-looping pods stay Running");
        let ready = status.conditions.unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "False");
    }

    // Rolling back to a template without the label recovers: the way rollback tests use it.
    let healthy = json!({ "spec": { "template": { "metadata": { "labels": { TEST_FAIL_LABEL: null } } } } });
    deployments.patch("broken", &PatchParams::default(), &Patch::Strategic(&healthy)).await.unwrap();
    eventually("broken Available after dropping the failure label", 120, || async {
        let d = deployments.get("broken").await.ok()?;
        (condition(&d, "Available").map(|c| c.0).as_deref() == Some("True")
            && d.status.as_ref()?.ready_replicas == Some(1))
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn two_clusters_are_independent() {
    let (a, b) = tokio::join!(start(ClusterOptions::new("one")), start(ClusterOptions::new("two")));
    assert_ne!(a.server_url(), b.server_url());
    assert_ne!(a.dir(), b.dir());

    let in_a: Api<ConfigMap> = Api::namespaced(a.client(), "default");
    let in_b: Api<ConfigMap> = Api::namespaced(b.client(), "default");
    let cm = |value: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "only-in-a" },
            "data": { "where": value },
        }))
        .unwrap()
    };
    in_a.create(&PostParams::default(), &cm("a")).await.unwrap();
    assert!(in_b.get_opt("only-in-a").await.unwrap().is_none(), "object created in a is visible in b");

    // Same name in b is a different object; a keeps its own.
    in_b.create(&PostParams::default(), &cm("b")).await.unwrap();
    assert_eq!(in_a.get("only-in-a").await.unwrap().data.unwrap()["where"], "a");
    assert_eq!(in_b.get("only-in-a").await.unwrap().data.unwrap()["where"], "b");

    // Each kubeconfig points at its own server.
    let kc = std::fs::read_to_string(b.kubeconfig_path()).unwrap();
    assert!(kc.contains(b.server_url()) && !kc.contains(a.server_url()));

    // Stopping one leaves the other serving.
    let a_dir = a.dir().to_path_buf();
    a.stop();
    assert!(!a_dir.exists(), "stop removes the cluster's directory");
    assert!(in_b.get_opt("only-in-a").await.unwrap().is_some());
}

#[test]
fn a_panicking_test_leaves_no_processes_or_directory() {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let cluster = start(ClusterOptions::new("panics").with_workloads(true)).await;
            let pids: Vec<u32> = cluster.processes().iter().map(|(_, pid)| *pid).collect();
            tx.send((pids, cluster.dir().to_path_buf())).unwrap();
            panic!("deliberate panic while the cluster runs");
        })
    })
    .join();
    assert!(outcome.is_err(), "the thread should have panicked");
    let (pids, dir) = rx.recv().unwrap();
    assert_eq!(pids.len(), 5, "etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok");
    for pid in pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "process {pid} outlived the panic");
    }
    assert!(!dir.exists(), "{} outlived the panic", dir.display());
}
