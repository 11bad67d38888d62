//! Deployment-available and pod-restart gates against a real cluster with workloads (kube-apiserver,
//! kube-controller-manager, kube-scheduler, kwok): a healthy operator Deployment passes both; pods
//! that kwok makes crash-loop (label `fleetgate.io/test-fail`) fail both, with the figures.

use crate::gates_support;

use fleetgate::gates::{BakeVerdict, OperatorTarget, Verdict, sample_baseline};
use fleetgate_testenv::{ClusterOptions, TEST_FAIL_LABEL};
use gates_support::*;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, PostParams};
use serde_json::json;

const GATES: &str = "    - name: deployment-available\n      deploymentAvailable: {}\n    \
                     - name: pod-restarts\n      podRestarts: {max: 3}\n";

fn deployment(name: &str, replicas: i32, fail: bool, progress_deadline: i32) -> Deployment {
    let mut pod_labels = json!({"app.kubernetes.io/name": name});
    if fail {
        pod_labels[TEST_FAIL_LABEL] = json!("true");
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": OPERATOR_NS, "labels": {"app.kubernetes.io/name": name}},
        "spec": {
            "replicas": replicas,
            "progressDeadlineSeconds": progress_deadline,
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {"containers": [{"name": "manager", "image": "registry.invalid/redis-operator:1"}]},
            },
        },
    }))
    .unwrap()
}

async fn apply(client: &kube::Client, d: &Deployment) {
    Api::<Deployment>::namespaced(client.clone(), OPERATOR_NS)
        .create(&PostParams::default(), d)
        .await
        .expect("create Deployment");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_deployment_passes_availability_and_restarts() {
    let cluster = start(ClusterOptions::new("gates-ok").with_workloads(true)).await;
    let selector = "app.kubernetes.io/name=redis-operator";
    let spec = policy("12s", "1s", GATES);
    let target = OperatorTarget { namespace: OPERATOR_NS.into(), selector: selector.into() };
    let baseline = sample_baseline(&spec, None, &cluster.client(), &target).await.unwrap();
    apply(&cluster.client(), &deployment("redis-operator", 2, false, 60)).await;

    let r = runner(&cluster, spec, selector, baseline);
    let mut rounds = Vec::new();
    let verdict = within("bake", 60, r.run(|round| rounds.push(round.clone()))).await;
    let shown: Vec<String> = verdict.evaluations().iter().map(ToString::to_string).collect();
    assert!(verdict.passed(), "{verdict}");
    assert_eq!(shown, ["deployment-available 100 % ≥ 100 %", "pod-restarts 0 ≤ 3"]);
    // The bake lasts its 12 s, one round a second (plus the final one).
    assert!(rounds.len() >= 10, "{} rounds", rounds.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_looping_pods_fail_restarts_and_availability_with_their_figures() {
    let cluster = start(ClusterOptions::new("gates-fail").with_workloads(true)).await;
    let client = cluster.client();
    let selector = "app.kubernetes.io/name=redis-operator";
    let target = OperatorTarget { namespace: OPERATOR_NS.into(), selector: selector.into() };
    let spec = policy("5m", "1s", GATES);
    let baseline = sample_baseline(&spec, None, &client, &target).await.unwrap();
    apply(&client, &deployment("redis-operator", 2, true, 10)).await;

    // Fail fast: long before the 5 min bake is over.
    let r = runner(&cluster, spec, selector, baseline);
    let verdict = within("bake fails fast", 90, r.run(|_| {})).await;
    let BakeVerdict::Failed { gate, at_bake_end: false, .. } = &verdict else { panic!("{verdict}") };
    assert!(["pod-restarts", "deployment-available"].contains(&gate.gate.as_str()), "{verdict}");

    // Once the progress deadline has passed, both gates fail in one round, each with its figure.
    let evals = eventually("both gates fail", 60, || async {
        let evals = r.evaluate().await;
        evals.iter().all(|e| e.verdict == Verdict::Fail).then_some(evals)
    })
    .await;
    let available = evals[0].to_string();
    assert!(
        available.starts_with(
            "deployment-available 0 % < 100 % — redis-operator/redis-operator: ProgressDeadlineExceeded (2/2 updated, 0/2 available)"
        ),
        "{available}"
    );
    let restarts = &evals[1];
    let count = restarts.observed.unwrap().value;
    assert!(count > 3.0, "{restarts}");
    let shown = restarts.to_string();
    assert!(shown.starts_with(&format!("pod-restarts {count} > 3 — redis-operator/redis-operator-")), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_that_never_completes_fails_at_the_end_of_the_bake() {
    let cluster = start(ClusterOptions::new("gates-slow").with_workloads(true)).await;
    // Pods never become ready, and the progress deadline is far away: the gate stays unknown.
    apply(&cluster.client(), &deployment("redis-operator", 1, true, 600)).await;
    let spec =
        policy("4s", "1s", "    - name: deployment-available\n      deploymentAvailable: {names: [redis-operator]}\n");
    let r = runner(&cluster, spec, "", Default::default());
    let verdict = within("bake", 30, r.run(|_| {})).await;
    let BakeVerdict::Failed { gate, at_bake_end: true, .. } = &verdict else { panic!("{verdict}") };
    assert_eq!(gate.verdict, Verdict::Unknown { reason: "rollout in progress".into() });
    assert!(
        verdict.to_string().starts_with(
            "gate deployment-available failed: deployment-available unknown (rollout in progress; observed 0 %; threshold ≥ 100 %) — redis-operator/redis-operator:"
        ),
        "{verdict}"
    );
    assert!(verdict.to_string().ends_with("at the end of the bake time"), "{verdict}");
}
