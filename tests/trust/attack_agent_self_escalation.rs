//! The attack on the agent's own RBAC (issue 33): deploy/'s RBAC lets the agent `escalate` and
//! `bind` the Operator's ClusterRole and write the Operator's ClusterRoleBinding, by name — so its
//! token (stolen from the Pod, or driven by a release) could widen that role to `*` and bind it to
//! itself: cluster admin in two calls. deploy/agent-guard.yaml, a ValidatingAdmissionPolicy the
//! API server enforces, refuses the second call. Performed here with the agent's real
//! ServiceAccount token against a real kube-apiserver with deploy/ applied.

use crate::agent_support;

use agent_support::*;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

fn binding_to(namespace: &str, name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "redis-operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "redis-operator"},
        "subjects": [{"kind": "ServiceAccount", "namespace": namespace, "name": name}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_token_cannot_bind_a_widened_role_to_itself() {
    let fleet = Fleet::start("self-escalation", false).await;
    let agent = fleet.agent_identity.client();
    let apply = PatchParams::apply("attacker").force();
    let bindings: Api<ClusterRoleBinding> = Api::all(agent.clone());
    // The API server enforces a new admission policy once it has loaded it, a moment after it is
    // created: wait for that with dry runs (they write nothing) before attacking.
    let probe = PatchParams::apply("attacker").force().dry_run();
    eventually("the guard is in force", 30, || async {
        let tried =
            bindings.patch("redis-operator", &probe, &Patch::Apply(&binding_to(AGENT_NS, "fleetgate-agent"))).await;
        tried.is_err().then_some(())
    })
    .await;

    // Step 1 goes through: `escalate` on the Operator's own ClusterRole is what applying its
    // releases needs, so the role can be widened (admission in the agent refuses such a release;
    // a stolen token skips the agent).
    let roles: Api<ClusterRole> = Api::all(agent.clone());
    let widened = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "redis-operator"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
    });
    roles.patch("redis-operator", &apply, &Patch::Apply(&widened)).await.expect("escalate on its own role");

    // Step 2, binding it to the agent itself, is refused by the API server's admission.
    let refused = bindings
        .patch("redis-operator", &apply, &Patch::Apply(&binding_to(AGENT_NS, "fleetgate-agent")))
        .await
        .expect_err("the guard refuses a binding to the agent");
    let message = refused.to_string();
    assert!(
        message.contains("fleetgate-agent-guard") && message.contains("may not bind a role to itself"),
        "{message}"
    );
    // Nor to every ServiceAccount of its namespace.
    let group = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "redis-operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "redis-operator"},
        "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:serviceaccounts:fleetgate-system"}],
    });
    bindings.patch("redis-operator", &apply, &Patch::Apply(&group)).await.expect_err("nor to its namespace's group");
    let admin: Api<ClusterRoleBinding> = Api::all(fleet.cluster.client());
    assert!(admin.get_opt("redis-operator").await.unwrap().is_none(), "no binding was made");

    // The same binding for the Operator's own ServiceAccount — what its releases do — passes.
    bindings
        .patch("redis-operator", &apply, &Patch::Apply(&binding_to(OPERATOR_NS, "redis-operator")))
        .await
        .expect("the Operator's binding is the agent's job");

    // And the guard itself is out of the agent's reach.
    let own: Api<ClusterRole> = Api::all(agent);
    let refused = own
        .patch(
            "fleetgate-agent",
            &apply,
            &Patch::Apply(&json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "fleetgate-agent"}, "rules": [],
            })),
        )
        .await
        .expect_err("its own role is not the agent's to change");
    assert!(refused.to_string().contains("forbidden") || refused.to_string().contains("Forbidden"), "{refused}");
}
