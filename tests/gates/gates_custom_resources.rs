//! Gates over custom resources in a real API server: health by a CEL expression over each object
//! (ready, not ready, missing status), no object data in what a gate reports even over an
//! allow-listed Secret, and webhook reachability by a server-side dry-run create.

use crate::gates_support;

use base64::Engine as _;
use fleetgate::gates::{GateEvaluation, GateRunner};
use fleetgate_testenv::ClusterOptions;
use gates_support::*;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;

fn redis_api(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cache.example.com", "v1alpha1", "RedisCluster"),
        "redisclusters",
    );
    Api::namespaced_with(client.clone(), OPERATOR_NS, &ar)
}

async fn create_redis(api: &Api<DynamicObject>, name: &str, ready: Option<&str>) {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha1",
        "kind": "RedisCluster",
        "metadata": {"name": name},
        "spec": {"size": 3},
    }))
    .unwrap();
    // Discovery of a just-established CRD can lag for a moment.
    eventually("create RedisCluster", 30, || async { api.create(&PostParams::default(), &obj).await.ok() }).await;
    if let Some(status) = ready {
        set_ready(api, name, status).await;
    }
}

async fn set_ready(api: &Api<DynamicObject>, name: &str, status: &str) {
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": status, "reason": "Test"}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch status");
}

fn health_gate(ratio: &str) -> String {
    format!(
        "    - name: redis-ready\n      customResources:\n        apiVersion: cache.example.com/v1alpha1\n        \
         kind: RedisCluster\n        expression: \"self.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')\"\n        \
         minHealthyRatio: {ratio}\n"
    )
}

/// Evaluates until the (single) gate has a verdict other than unknown.
async fn settled(r: &GateRunner) -> GateEvaluation {
    eventually("a pass/fail verdict", 30, || async {
        let e = r.evaluate().await.remove(0);
        (!e.is_unknown()).then_some(e)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cel_health_over_ready_not_ready_and_status_less_objects() {
    let cluster = start(ClusterOptions::new("gates-cel")).await;
    let client = cluster.client();
    install_crd(&client, &crd_fixture("base")).await;
    let api = redis_api(&client);
    create_redis(&api, "a", Some("True")).await;
    create_redis(&api, "b", Some("False")).await;
    create_redis(&api, "c", None).await;

    let strict = runner(&cluster, policy("1m", "5s", &health_gate("100%")), "", Default::default());
    let e = settled(&strict).await;
    assert!(e.is_fail(), "{e}");
    assert_eq!(
        e.to_string(),
        "redis-ready 33.3 % < 100 % — 1/3 healthy; redis-operator/b: expression is false; redis-operator/c: No such key: status"
    );

    let lenient = runner(&cluster, policy("1m", "5s", &health_gate("30%")), "", Default::default());
    let e = settled(&lenient).await;
    assert!(e.is_pass(), "{e}");
    assert_eq!(
        e.to_string(),
        "redis-ready 33.3 % ≥ 30 % — 1/3 healthy; redis-operator/b: expression is false; redis-operator/c: No such key: status"
    );

    set_ready(&api, "b", "True").await;
    set_ready(&api, "c", "True").await;
    let e = settled(&strict).await;
    assert_eq!(e.to_string(), "redis-ready 100 % ≥ 100 % — 3/3 healthy");
}

/// What an agent that allow-lists `Secret` (`--allow-gate-kind Secret`) would run: a gate over
/// Secrets reports nothing of their data, whatever its expression does with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_over_secrets_never_reports_their_data() {
    const VALUE: &str = "s3cr3t-do-not-leak-7f3a";
    let cluster = start(ClusterOptions::new("gates-secret")).await;
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "redis-password"},
        "stringData": {"password": VALUE},
    }))
    .unwrap();
    Api::<Secret>::namespaced(cluster.client(), OPERATOR_NS).create(&PostParams::default(), &secret).await.unwrap();
    let gate = |name: &str, expression: &str| {
        format!(
            "    - name: {name}\n      customResources:\n        apiVersion: v1\n        kind: Secret\n        \
             namespace: {OPERATOR_NS}\n        expression: {expression:?}\n"
        )
    };
    let gates = [
        gate("data", "self.data"),
        gate("password", "self.data.password"),
        gate("computed-key", "self.data[self.data.password] == 'x'"),
        gate("arithmetic", "self.data.password + 1 == 2"),
    ];
    let r = runner(&cluster, policy("1m", "5s", &gates.concat()), "", Default::default());
    let evaluations = r.evaluate().await;

    let encoded = base64::engine::general_purpose::STANDARD.encode(VALUE);
    for e in &evaluations {
        let shown = format!("{e} {}", serde_json::to_string(e).unwrap());
        assert!(!shown.contains(VALUE) && !shown.contains(&encoded), "{shown}");
        assert!(e.is_fail(), "{e}");
    }
    let detail = |i: usize| evaluations[i].detail.as_deref().unwrap_or_default().to_string();
    assert_eq!(detail(0), "configuration error: gate \"data\": CEL expression `self.data` returned a map, not a bool");
    assert_eq!(
        detail(1),
        "configuration error: gate \"password\": CEL expression `self.data.password` returned a string, not a bool"
    );
    assert_eq!(
        detail(2),
        "0/1 healthy; redis-operator/redis-password: No such key (computed from the object, not shown)"
    );
    assert_eq!(detail(3), "0/1 healthy; redis-operator/redis-password: Unsupported binary operator 'add': string, int");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_gate_passes_through_admission_and_fails_when_the_webhook_is_unreachable() {
    let cluster = start(ClusterOptions::new("gates-hook")).await;
    let client = cluster.client();
    install_crd(&client, &crd_fixture("base")).await;
    let gate = "    - name: webhook-reachable\n      webhook:\n        sample:\n          apiVersion: cache.example.com/v1alpha1\n          \
                kind: RedisCluster\n          metadata: {name: fleetgate-probe}\n          spec: {size: 1}\n";
    let r = runner(&cluster, policy("1m", "5s", gate), "", Default::default());

    let e = settled(&r).await;
    assert!(e.is_pass(), "{e}");
    assert_eq!(e.to_string(), "webhook-reachable ok: dry-run create of RedisCluster fleetgate-probe accepted");
    let stored = redis_api(&client).get_opt("fleetgate-probe").await.unwrap();
    assert!(stored.is_none(), "a dry run stores nothing");

    // A validating webhook for the kind whose endpoint refuses connections.
    let hook: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "redis-operator"},
        "webhooks": [{
            "name": "vrediscluster.cache.example.com",
            "clientConfig": {"url": "https://127.0.0.1:1/validate"},
            "rules": [{"apiGroups": ["cache.example.com"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"], "resources": ["redisclusters"]}],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 2,
        }],
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone()).create(&PostParams::default(), &hook).await.unwrap();

    let e = eventually("the webhook gate fails", 30, || async {
        let e = r.evaluate().await.remove(0);
        e.is_fail().then_some(e)
    })
    .await;
    let shown = e.to_string();
    assert!(
        shown.starts_with("webhook-reachable failed (want dry-run create of RedisCluster fleetgate-probe accepted) — HTTP 500 InternalError: "),
        "{shown}"
    );
    assert!(shown.contains("failed calling webhook \"vrediscluster.cache.example.com\""), "{shown}");
}
