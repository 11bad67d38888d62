//! Attack: a signed release whose gate policy points a `customResources` gate at `kind: Secret`
//! with `expression: self.data`. Before issue #12 the non-bool result (the Secret's data) was
//! echoed into the agent's log, the failure note in Git and the Events.
//!
//! Now a gate may read only kinds of the release's own CRDs (or kinds the agent allows), so the
//! release is refused before anything is applied, with a configuration error naming the gate.
//! With Secret allow-listed (`--allow-gate-kind Secret`) the release applies, and the non-bool
//! result is a configuration error naming gate and expression that rolls it back. Either way the
//! Secret's value appears in no log line, no Git object and no Event.

use crate::agent_support;

use agent_support::*;
use base64::Engine as _;
use fleetgate::agent::{AgentSettings, Outcome};
use fleetgate::status::{State, Status};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

const VALUE: &str = "s3cr3t-do-not-leak-7f3a";

const SECRET_GATE: &str = "    - name: peek-secrets\n      customResources:\n        apiVersion: v1\n        kind: Secret\n        \
                           namespace: redis-system\n        expression: self.data\n";

/// A fleet whose operator namespace holds a Secret with [`VALUE`], and a signed release `rel-1`
/// (promoted) whose policy has [`SECRET_GATE`]; returns the release commit.
async fn fleet_with_a_secret_gate(name: &str) -> (Fleet, String) {
    // deploy/ creates the operator namespace.
    let fleet = Fleet::start(name, true).await;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "redis-password", "namespace": OPERATOR_NS},
        "stringData": {"password": VALUE},
    }))
    .unwrap();
    Api::<Secret>::namespaced(fleet.cluster.client(), OPERATOR_NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    // The policy is committed before the release is cut, so it is in the signed tag's tree too.
    fleet.set_gates("3s", &format!("{QUICK_GATES}{SECRET_GATE}"));
    let commit = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    (fleet, commit)
}

/// The value is nowhere: not in plain text, not base64 as the API serves it.
async fn assert_leaked_nowhere(fleet: &Fleet, logs: &LogCapture) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(VALUE);
    let logged = logs.text();
    assert!(logged.contains("rel-1"), "the capture sees the agent's log");
    let events = fleet.events_json().await;
    assert!(events.contains("rel-1"), "the agent emitted Events about rel-1: {events}");
    for (place, text) in
        [("the agent's log", &logged), ("the fleet repo", &fleet.repo_objects()), ("the Events", &events)]
    {
        assert!(!text.contains(VALUE) && !text.contains(&encoded), "the Secret's value is in {place}");
    }
}

fn last_failure(statuses: &[Status]) -> &Status {
    let status = statuses.last().expect("a status for rel-1");
    assert_eq!(status.state, State::Failure, "{status:?}");
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cel_gate_on_a_secret_is_refused_and_leaks_nothing() {
    let logs = LogCapture::install();
    let (fleet, commit) = fleet_with_a_secret_gate("attack-cel").await;
    let mut agent = fleet.agent().await;
    let outcome = within("rel-1", 240, agent.reconcile()).await.unwrap();
    assert_leaked_nowhere(&fleet, &logs).await;

    // Refused before apply, naming the gate and the kind; nothing of the Operator was created.
    let statuses = fleet.statuses(&commit);
    let Outcome::Blocked { release, reason } = &outcome else {
        panic!("expected the release to be refused before apply, got {outcome:?}; statuses: {statuses:?}")
    };
    assert_eq!(release, "rel-1");
    assert!(reason.contains("gate \"peek-secrets\" reads Secret"), "{reason}");
    let status = last_failure(&statuses);
    assert!(status.description.contains("peek-secrets"), "{}", status.description);
    assert_eq!(status.applied_at, None);
    assert_eq!(fleet.operator_image().await, None, "the Operator was never applied");
    assert_eq!(within("again", 30, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-1".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_secrets_allowed_the_non_bool_result_is_a_configuration_error_and_leaks_nothing() {
    let logs = LogCapture::install();
    let (fleet, commit) = fleet_with_a_secret_gate("attack-cel-allowed").await;
    // A spoke that allow-lists Secret gates also lets its agent read them: deploy/ does not.
    grant_secret_reads(&fleet).await;
    let settings = AgentSettings { allow_gate_kinds: vec!["Secret".into()], ..fleet.settings() };
    let mut agent = fleet.agent_with(settings).await;
    let outcome = within("rel-1", 240, agent.reconcile()).await.unwrap();
    assert_leaked_nowhere(&fleet, &logs).await;

    assert_eq!(outcome, Outcome::RolledBack { release: "rel-1".into(), to: None });
    let statuses = fleet.statuses(&commit);
    let status = last_failure(&statuses);
    assert!(
        status.description.ends_with(
            "configuration error: gate \"peek-secrets\": CEL expression `self.data` returned a map, not a bool"
        ),
        "{}",
        status.description
    );
    let gate = status.gates.iter().find(|g| g.name == "peek-secrets").expect("the gate's figure");
    assert_eq!((gate.observed.as_str(), gate.verdict.as_str()), ("", "fail"));
    assert_eq!(fleet.state().await.rejected()["rel-1"].failure.reason, "GateFailed");
}

/// A Role and RoleBinding in the operator namespace letting the agent's ServiceAccount read Secrets.
async fn grant_secret_reads(fleet: &Fleet) {
    use kube::api::{DynamicObject, Patch, PatchParams};
    use kube::discovery::ApiResource;
    for (kind, body) in [
        (
            "Role",
            serde_json::json!({"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]}),
        ),
        (
            "RoleBinding",
            serde_json::json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-secrets"},
                "subjects": [{"kind": "ServiceAccount", "name": "fleetgate-agent", "namespace": AGENT_NS}],
            }),
        ),
    ] {
        let mut obj = body;
        obj["apiVersion"] = "rbac.authorization.k8s.io/v1".into();
        obj["kind"] = kind.into();
        obj["metadata"] = serde_json::json!({"name": "read-secrets", "namespace": OPERATOR_NS});
        let gvk = kube::api::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind);
        let api: Api<DynamicObject> =
            Api::namespaced_with(fleet.cluster.client(), OPERATOR_NS, &ApiResource::from_gvk(&gvk));
        let obj: DynamicObject = serde_json::from_value(obj).unwrap();
        api.patch("read-secrets", &PatchParams::apply("test"), &Patch::Apply(&obj)).await.unwrap();
    }
}
