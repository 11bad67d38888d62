//! A signed release cannot talk its way around admission: the policy judges what each object
//! *does* — a CRD in a group the cluster already serves, RBAC by its rules and subjects, Pod
//! Security of every pod template, where webhooks send objects and what they intercept, taking
//! over live objects fleetgate did not apply — not what it is called.
//!
//! Every case runs through the apply engine's own entry points (`admit`, then `dry_run`, then
//! `apply`, as the agent's pre-apply stage does) against a real API server: the release is
//! refused, the cluster is exactly as it was (every object and its resourceVersion), and the
//! reason names the object, its source file and the rule. Positive cases: the compliant
//! release is admitted, and the adopt annotation lets a release take over a live object — which
//! prune then leaves in place when a later release drops it.
//!
//! One case runs through a real agent (as its ServiceAccount, deploy/'s RBAC) to show what the
//! refusal looks like from outside: the `failure` status and the Event. Another runs there
//! because only the agent knows the cluster: a binding of a role the release does not define is
//! judged by the rules that role has in the cluster.

use crate::agent_support;
use crate::apply_support;

use apply_support::{OPERATOR_NS, apply, cluster_state, get, policy_spec, release, start, without};
use fleetgate::apply::{Action, ApplyError, Engine};
use fleetgate::manifests::admission::AdmissionPolicy;
use fleetgate::model::{PodSecurityLevel, RbacGrant};
use fleetgate::release::VerifiedRelease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(240);

fn cluster_role(rules: &str) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: redis-operator-extra}}\nrules:\n{rules}"
    )
}

fn binding(subject: &str, role_ref: &str) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: redis-operator-extra, namespace: redis-system}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, {role_ref}}}\nsubjects: [{subject}]\n"
    )
}

const OPERATOR_SA: &str = "{kind: ServiceAccount, name: redis-operator, namespace: redis-system}";
const OWN_ROLE: &str = "kind: Role, name: redis-operator-leader-election";

/// A Deployment whose one container `worker` has `container` (YAML flow mapping entries) and whose
/// pod spec has `pod`.
fn deployment(container: &str, pod: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: worker, namespace: redis-system}}\nspec:\n  selector: {{matchLabels: {{app: worker}}}}\n  template:\n    metadata: {{labels: {{app: worker}}}}\n    spec:\n      {pod}\n      containers: [{{name: worker, image: 'registry.example.com/redis-operator:v1.2.3-build.456'{container}}}]\n"
    )
}

fn webhook(client_config: &str, selector: &str) -> String {
    format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata: {{name: redis-operator-pods}}\nwebhooks:\n  - name: pods.cache.example.com\n    admissionReviewVersions: [v1]\n    sideEffects: None\n    clientConfig: {client_config}\n    {selector}\n    rules: [{{apiGroups: [''], apiVersions: [v1], operations: [CREATE], resources: [pods]}}]\n"
    )
}

const SERVICE: &str = "{service: {name: redis-operator, namespace: redis-system, port: 443}}";

/// A namespaced CRD that claims the kind of a built-in, cluster-scoped API.
const CRD_IN_BUILTIN_GROUP: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: mutatingwebhookconfigurations.admissionregistration.k8s.io}
spec:
  group: admissionregistration.k8s.io
  names: {kind: MutatingWebhookConfiguration, plural: mutatingwebhookconfigurations}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
";

/// A CRD in a group another owner's CRD (created by the test, not by fleetgate) already serves.
const CRD_IN_FOREIGN_GROUP: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: things.foreign.example.com}
spec:
  group: foreign.example.com
  names: {kind: Thing, plural: things}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]
";

const UNMANAGED: &str = "apiVersion: v1
kind: ConfigMap
metadata: {name: preexisting, namespace: redis-system}
data: {owner: fleetgate}
";

const ADOPTED: &str = "apiVersion: v1
kind: ConfigMap
metadata: {name: preexisting, namespace: redis-system, annotations: {fleetgate.io/adopt: 'true'}}
data: {owner: fleetgate}
";

/// One refused release: the extra file added to the compliant fixture, the policy level, the
/// object and the rule the refusal must name.
struct Case {
    name: &'static str,
    file: &'static str,
    yaml: String,
    pod_security: Option<PodSecurityLevel>,
    /// The baseline's `allowedRbac` for this case, when not the reference policy's.
    allowed_rbac: Option<Vec<RbacGrant>>,
    object: &'static str,
    rule: &'static str,
}

fn case(name: &'static str, yaml: impl Into<String>, object: &'static str, rule: &'static str) -> Case {
    Case { name, file: "operator/extra.yaml", yaml: yaml.into(), pod_security: None, allowed_rbac: None, object, rule }
}

fn cases() -> Vec<Case> {
    const CR: &str = "ClusterRole.rbac.authorization.k8s.io redis-operator-extra";
    const RB: &str = "RoleBinding.rbac.authorization.k8s.io redis-system/redis-operator-extra";
    const WORKER: &str = "Deployment.apps redis-system/worker";
    const HOOK: &str = "MutatingWebhookConfiguration.admissionregistration.k8s.io redis-operator-pods";
    let excluded = "namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [fleetgate-system, kube-system]}]}";
    vec![
        case(
            "crd-in-builtin-group",
            CRD_IN_BUILTIN_GROUP,
            "CustomResourceDefinition.apiextensions.k8s.io mutatingwebhookconfigurations.admissionregistration.k8s.io",
            "defines a CustomResourceDefinition in API group admissionregistration.k8s.io, which the cluster already serves (a built-in API group) — refused by fleetgate's fixed rules",
        ),
        case(
            "crd-in-served-group",
            CRD_IN_FOREIGN_GROUP,
            "CustomResourceDefinition.apiextensions.k8s.io things.foreign.example.com",
            "which the cluster already serves (it serves resource gadgets there, which is not a CRD of this release or of fleetgate)",
        ),
        case(
            "wildcard-role",
            cluster_role("  - {apiGroups: [apps], resources: [deployments], verbs: ['*']}\n"),
            CR,
            "rules[0] grants verbs: [*] and allowedRbac does not list wildcard",
        ),
        case(
            "escalate",
            cluster_role(
                "  - {apiGroups: [rbac.authorization.k8s.io], resources: [clusterroles], verbs: [escalate]}\n",
            ),
            CR,
            "rules[0] grants verb escalate and allowedRbac does not list escalate",
        ),
        case(
            "bind",
            cluster_role("  - {apiGroups: [rbac.authorization.k8s.io], resources: [clusterroles], verbs: [bind]}\n"),
            CR,
            "rules[0] grants verb bind and allowedRbac does not list bind",
        ),
        case(
            "impersonate",
            cluster_role("  - {apiGroups: [''], resources: [serviceaccounts], verbs: [impersonate]}\n"),
            CR,
            "rules[0] grants verb impersonate and allowedRbac does not list impersonate",
        ),
        case(
            "cluster-secrets",
            cluster_role(
                "  - {apiGroups: [''], resources: [configmaps], verbs: [get]}\n  - {apiGroups: [''], resources: [secrets], verbs: [get, list]}\n",
            ),
            CR,
            "rules[1] grants secrets in a ClusterRole and allowedRbac does not list clusterSecrets",
        ),
        case(
            "nodes-proxy",
            cluster_role("  - {apiGroups: [''], resources: [nodes/proxy], verbs: [get]}\n"),
            CR,
            "rules[0] grants nodes/proxy and allowedRbac does not list nodesProxy",
        ),
        case(
            "serviceaccount-token",
            cluster_role("  - {apiGroups: [''], resources: [serviceaccounts/token], verbs: [create]}\n"),
            CR,
            "rules[0] grants serviceaccounts/token and allowedRbac does not list serviceAccountTokens",
        ),
        case(
            "pod-exec",
            cluster_role("  - {apiGroups: [''], resources: [pods/exec], verbs: [create]}\n"),
            CR,
            "rules[0] grants pods/exec and allowedRbac does not list podExec",
        ),
        // The reference policy lists clusterPods (the template Operator makes StatefulSets): a
        // baseline that does not.
        Case {
            allowed_rbac: Some(Vec::new()),
            ..case(
                "cluster-pods",
                cluster_role("  - {apiGroups: [batch], resources: [jobs], verbs: [create]}\n"),
                CR,
                "rules[0] grants create jobs.batch in a ClusterRole and allowedRbac does not list clusterPods",
            )
        },
        case(
            "csr-approval",
            cluster_role(
                "  - {apiGroups: [certificates.k8s.io], resources: [certificatesigningrequests/approval], verbs: [update]}\n",
            ),
            CR,
            "rules[0] grants certificatesigningrequests/approval.certificates.k8s.io and allowedRbac does not list certificateApproval",
        ),
        case(
            "admission-config",
            cluster_role(
                "  - {apiGroups: [admissionregistration.k8s.io], resources: [validatingadmissionpolicies], verbs: [delete]}\n",
            ),
            CR,
            "rules[0] grants writes validatingadmissionpolicies.admissionregistration.k8s.io and allowedRbac does not list admissionConfig",
        ),
        case(
            "bind-system-authenticated",
            binding("{kind: Group, name: 'system:authenticated', apiGroup: rbac.authorization.k8s.io}", OWN_ROLE),
            RB,
            "binds subject Group system:authenticated, which no policy may allow",
        ),
        case(
            "bind-system-masters",
            binding("{kind: Group, name: 'system:masters', apiGroup: rbac.authorization.k8s.io}", OWN_ROLE),
            RB,
            "binds subject Group system:masters, which no policy may allow",
        ),
        case(
            "bind-admin",
            binding(OPERATOR_SA, "kind: ClusterRole, name: admin"),
            RB,
            "binds ClusterRole admin and allowClusterAdminBindings is false",
        ),
        case(
            "bind-edit",
            binding(OPERATOR_SA, "kind: ClusterRole, name: edit"),
            RB,
            "binds ClusterRole edit and allowClusterAdminBindings is false",
        ),
        case(
            "privileged",
            deployment(", securityContext: {privileged: true}", ""),
            WORKER,
            "pod template spec.template.spec: container worker: securityContext.privileged is true, which Pod Security level baseline forbids",
        ),
        case(
            "host-path",
            deployment("", "volumes: [{name: root, hostPath: {path: /}}]"),
            WORKER,
            "pod template spec.template.spec: volumes[root].hostPath is set (hostPath volumes are forbidden), which Pod Security level baseline forbids",
        ),
        case(
            "host-network",
            deployment("", "hostNetwork: true"),
            WORKER,
            "pod template spec.template.spec: hostNetwork is true, which Pod Security level baseline forbids",
        ),
        case(
            "added-capability",
            deployment(", securityContext: {capabilities: {add: [SYS_ADMIN]}}", ""),
            WORKER,
            "container worker: securityContext.capabilities.add adds SYS_ADMIN, beyond the baseline set, which Pod Security level baseline forbids",
        ),
        Case {
            pod_security: Some(PodSecurityLevel::Restricted),
            ..case(
                "restricted",
                deployment("", ""),
                WORKER,
                "container worker: securityContext.allowPrivilegeEscalation must be false, which Pod Security level restricted forbids",
            )
        },
        case(
            "webhook-url",
            webhook("{url: 'https://collector.example.net/pods'}", excluded),
            HOOK,
            "webhook pods.cache.example.com: clientConfig.url \"https://collector.example.net/pods\" is refused: a webhook may only call a Service",
        ),
        case(
            "webhook-intercepts-kube-system",
            webhook(
                SERVICE,
                "namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [fleetgate-system]}]}",
            ),
            HOOK,
            "webhook pods.cache.example.com: namespaceSelector does not exclude namespace kube-system",
        ),
        Case {
            file: "operator/preexisting.yaml",
            ..case(
                "adopt-unmanaged",
                UNMANAGED,
                "ConfigMap redis-system/preexisting",
                "exists in the cluster but not in fleetgate's inventory, and a forced apply would take it over",
            )
        },
    ]
}

fn policy(level: Option<PodSecurityLevel>, allowed_rbac: Option<Vec<RbacGrant>>) -> AdmissionPolicy {
    let spec = policy_spec();
    let allowed_rbac = allowed_rbac.unwrap_or(spec.allowed_rbac.clone());
    AdmissionPolicy::baseline(fleetgate::model::ReleaseAdmissionPolicySpec {
        pod_security: level,
        allowed_rbac,
        ..spec
    })
}

/// The pre-apply stage of one pass (admit, then the dry run that sees the live objects), then
/// the apply: the first refusal.
async fn refusal(engine: &Engine, release: &VerifiedRelease, policy: &AdmissionPolicy) -> ApplyError {
    let admitted = match engine.admit(release, policy).await {
        Ok(admitted) => admitted,
        Err(e) => return e,
    };
    if let Err(e) = engine.dry_run(&admitted).await {
        return e;
    }
    engine.apply(admitted).await.expect_err("the release is refused")
}

#[tokio::test]
async fn releases_are_judged_by_what_their_objects_do() {
    tokio::time::timeout(TIMEOUT, async {
        let (cluster, engine) = start("admission-content").await;
        let client = cluster.client();

        // The compliant release is admitted and applied.
        let v1 = release("v1", "rel-v1", &[]);
        apply(&engine, &v1, &policy(None, None)).await.expect("the compliant release applies");

        // Live objects fleetgate did not apply: another owner's CRD, and a ConfigMap.
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let foreign =
            serde_saphyr::from_str(&CRD_IN_FOREIGN_GROUP.replace("things", "gadgets").replace("Thing", "Gadget"))
                .expect("foreign CRD");
        crds.create(&PostParams::default(), &foreign).await.expect("foreign CRD created");
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), OPERATOR_NS);
        configmaps
            .create(&PostParams::default(), &serde_saphyr::from_str(UNMANAGED).unwrap())
            .await
            .expect("unmanaged ConfigMap created");
        wait_served(&client, "foreign.example.com", "gadgets").await;

        let before = cluster_state(&client).await;
        let mut failed = Vec::new();
        for case in cases() {
            let bad = release("v1", &format!("rel-{}", case.name), &[(case.file, &case.yaml)]);
            let err = refusal(&engine, &bad, &policy(case.pod_security, case.allowed_rbac.clone())).await;
            let text = err.to_string();
            let expected = format!("{} ({} (document 1)): ", case.object, case.file);
            let named = matches!(err, ApplyError::Admission(_)) && text.contains(&expected) && text.contains(case.rule);
            if !named {
                failed.push(format!("{}: expected «{expected}…{}», got: {text}", case.name, case.rule));
            }
        }
        assert!(failed.is_empty(), "{} case(s) not refused as expected:\n{}", failed.len(), failed.join("\n"));
        assert_eq!(cluster_state(&client).await, before, "no refused release changed anything");
        assert_eq!(engine.inventory().await.unwrap().unwrap().release, "rel-v1");

        // The adopt annotation lets the release take the ConfigMap over …
        let v2 = release("v1", "rel-v2", &[("operator/preexisting.yaml", ADOPTED)]);
        apply(&engine, &v2, &policy(None, None)).await.expect("the annotated object is adopted");
        let taken = get(&client, "v1", "ConfigMap", Some(OPERATOR_NS), "preexisting").await.unwrap();
        assert_eq!(
            taken.metadata.labels.unwrap_or_default().get("fleetgate.io/inventory"),
            Some(&engine.options().inventory)
        );
        assert_eq!(taken.data["data"]["owner"], "fleetgate");
        let inventory = engine.inventory().await.unwrap().unwrap();
        assert_eq!(
            inventory.adopted.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["ConfigMap redis-system/preexisting"]
        );

        // … and when a later release drops it, prune leaves it: fleetgate did not create it.
        let v3 = without(&v2, "rel-v3", &["operator/preexisting.yaml"]);
        apply(&engine, &v3, &policy(None, None)).await.expect("v3 applies");
        let pruned = engine.prune().await.expect("prune");
        let kept = pruned.iter().find(|c| c.object.name == "preexisting").expect("prune reports the adopted object");
        assert!(matches!(&kept.action, Action::Retained(why) if why.contains("adopted")), "{:?}", kept.action);
        assert!(get(&client, "v1", "ConfigMap", Some(OPERATOR_NS), "preexisting").await.is_some());

        // A release that drops the Operator's ClusterRole but keeps binding it: the role is live
        // now, but prune deletes it after the apply, which would leave the binding to whoever
        // creates a role of that name next.
        let before = cluster_state(&client).await;
        let dropped = without(&v3, "rel-v4", &["operator/rbac/clusterrole.yaml"]);
        let text = refusal(&engine, &dropped, &policy(None, None)).await.to_string();
        assert!(
            text.contains(
                "ClusterRoleBinding.rbac.authorization.k8s.io redis-operator (operator/rbac/clusterrolebinding.yaml \
                 (document 1)): binds ClusterRole redis-operator, which the release does not define and prune deletes \
                 once it is applied (an earlier release defined it): whoever creates it later would decide what the \
                 binding grants"
            ),
            "{text}"
        );
        assert_eq!(cluster_state(&client).await, before, "the refused release changed nothing");
    })
    .await
    .expect("test finishes in time");
}

/// Waits until discovery serves `plural` in `group` (a CRD just created).
async fn wait_served(client: &kube::Client, group: &str, plural: &str) {
    for _ in 0..120 {
        let discovery = kube::Discovery::new(client.clone()).run_aggregated().await.expect("discovery");
        let served =
            discovery.get(group).is_some_and(|g| g.recommended_resources().iter().any(|(ar, _)| ar.plural == plural));
        if served {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("{plural}.{group} is not served within 30 s");
}

/// The template fleet's release with a privileged DaemonSet added: the agent refuses it before
/// apply, the status says `failure` naming the object and the rule, and an Event says so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_refuses_a_privileged_daemonset_with_a_failure_status_and_an_event() {
    use agent_support::{Fleet, image_of, within};
    use fleetgate::agent::Outcome;
    use fleetgate::status::State;

    const DAEMONSET: &str = "apiVersion: apps/v1
kind: DaemonSet
metadata: {name: node-agent, namespace: redis-system}
spec:
  selector: {matchLabels: {app: node-agent}}
  template:
    metadata: {labels: {app: node-agent}}
    spec:
      containers:
        - name: probe
          image: IMAGE
          securityContext: {privileged: true}
";
    let fleet = Fleet::start("agent-adm", false).await;
    let daemonset = DAEMONSET.replace("IMAGE", &image_of("rel-1"));
    // `release create` refuses it too; the pipeline signs it anyway, on purpose.
    let allow = ["--allow-admission", "the agent must refuse it on its own"];
    let commit =
        fleet.release_with(&allow, "rel-1", |dir| std::fs::write(dir.join("node-agent.yaml"), daemonset).unwrap());
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    let outcome = within("reconcile", 60, agent.reconcile()).await.unwrap();
    let Outcome::Blocked { release, reason } = &outcome else { panic!("expected a block, got {outcome:?}") };
    assert_eq!(release, "rel-1");
    let rule = "DaemonSet.apps redis-system/node-agent (operator/node-agent.yaml (document 1)): pod template \
                spec.template.spec: container probe: securityContext.privileged is true, which Pod Security level \
                baseline forbids";
    assert!(reason.starts_with("admission: ") && reason.contains(rule), "{reason}");

    let statuses = fleet.statuses(&commit);
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    assert_eq!(statuses[0].state, State::Failure);
    assert!(statuses[0].description.contains("securityContext.privileged"), "{}", statuses[0].description);
    assert_eq!(statuses[0].applied_at, None);
    let events = fleet.events_json().await;
    assert!(events.contains("AdmissionRefused") && events.contains("redis-system/node-agent"), "{events}");

    // Nothing applied: not the Operator, not the namespace's fields, not the DaemonSet.
    assert_eq!(fleet.operator_image().await, None);
    assert!(!fleet.namespace_applied(apply_support::OPERATOR_NS).await);
    assert_eq!(fleet.state().await.rejected()["rel-1"].failure.reason, "AdmissionRefused");
}

/// The template Operator's release without the roles it defines (`rbac/clusterrole.yaml`, the
/// Role of `rbac/leader-election.yaml`): its bindings then grant whatever roles of those names the
/// cluster has. `release create`'s `edit` closure.
fn without_roles(dir: &std::path::Path) {
    std::fs::remove_file(dir.join("rbac/clusterrole.yaml")).unwrap();
    let leader = dir.join("rbac/leader-election.yaml");
    let text = std::fs::read_to_string(&leader).unwrap();
    let (_, binding) = text.split_once("\n---\n").expect("the Role, then its RoleBinding");
    assert!(binding.contains("kind: RoleBinding"), "{binding}");
    std::fs::write(&leader, binding).unwrap();
}

/// The attack: a signed release that defines no role but binds roles the cluster has — the
/// Operator's own role names, which deploy/'s RBAC lets the agent bind, so the API server lets
/// the agent's token write the bindings. The agent, as its ServiceAccount, judges each binding
/// by the live role's rules: refused before anything is applied (status `failure`, Event
/// `AdmissionRefused`, no binding in the cluster) when the live role grants `*` or `escalate` or
/// does not exist; applied when its rules are within the policy, once the refusal's hint is
/// followed for the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_of_a_live_role_is_judged_by_the_rules_the_cluster_has_for_it() {
    use agent_support::{Fleet, within};
    use fleetgate::agent::Outcome;
    use fleetgate::status::State;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};

    const CRB: &str = "ClusterRoleBinding.rbac.authorization.k8s.io redis-operator (operator/rbac/clusterrolebinding.yaml (document 1))";
    const RB: &str = "RoleBinding.rbac.authorization.k8s.io redis-system/redis-operator-leader-election \
                      (operator/rbac/leader-election.yaml (document 1))";
    const LEADER: &str = "redis-operator-leader-election";

    tokio::time::timeout(Duration::from_secs(400), async {
        let fleet = Fleet::start("agent-bind", false).await;
        let admin = fleet.cluster.client();
        let cluster_roles: Api<ClusterRole> = Api::all(admin.clone());
        let roles: Api<Role> = Api::namespaced(admin.clone(), OPERATOR_NS);
        let crbs: Api<ClusterRoleBinding> = Api::all(admin.clone());
        let rbs: Api<RoleBinding> = Api::namespaced(admin.clone(), OPERATOR_NS);
        let mut agent = fleet.agent().await;

        // Each refused release: blocked before apply, status `failure` and an Event naming the
        // binding and the live role, neither binding in the cluster.
        let refused = async |agent: &mut fleetgate::agent::Agent, id: &str, text: &str| {
            let commit = fleet.release(id, without_roles);
            fleet.promote(id);
            let outcome = within(id, 60, agent.reconcile()).await.unwrap();
            let Outcome::Blocked { release, reason } = &outcome else {
                panic!("{id}: expected a block, got {outcome:?}")
            };
            assert_eq!(release, id);
            assert!(reason.starts_with("admission: ") && reason.contains(text), "{id}: {reason}");
            let statuses = fleet.statuses(&commit);
            assert_eq!(statuses.len(), 1, "{statuses:?}");
            assert_eq!(statuses[0].state, State::Failure);
            assert!(statuses[0].description.contains(text), "{id}: {}", statuses[0].description);
            assert_eq!(statuses[0].applied_at, None);
            assert_eq!(fleet.state().await.rejected()[id].failure.reason, "AdmissionRefused");
            assert!(crbs.get_opt("redis-operator").await.unwrap().is_none(), "{id}: a ClusterRoleBinding was written");
            assert!(rbs.get_opt(LEADER).await.unwrap().is_none(), "{id}: a RoleBinding was written");
            assert_eq!(fleet.operator_image().await, None, "{id}: the Operator was applied");
        };

        // No such roles yet: whoever creates them later would decide what the bindings grant.
        refused(
            &mut agent,
            "rel-1",
            &format!(
                "{CRB}: binds ClusterRole redis-operator, which neither the release defines nor the cluster has: \
                 whoever creates it later would decide what the binding grants; define the role in the release, or \
                 bind one the cluster has — refused by fleetgate's fixed rules"
            ),
        )
        .await;
        // Without a cluster, `validate` cannot judge these bindings, and says who does.
        let validate = std::process::Command::new(env!("CARGO_BIN_EXE_fleetgate"))
            .args(["validate", "--release", "rel-1", "--repo"])
            .arg(&fleet.work)
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&validate.stdout);
        assert!(validate.status.success(), "{printed}{}", String::from_utf8_lossy(&validate.stderr));
        assert!(
            printed.contains(&format!(
                "rel-1: bindings of ClusterRole redis-operator, Role redis-system/{LEADER}, which the release does \
                 not define, are judged by the agents against the cluster's roles"
            )),
            "{printed}"
        );

        // A live ClusterRole granting everything, and a live Role granting `escalate` (created by an
        // admin here; anyone who may write them, the agent's own token included for these names).
        let star: ClusterRole = serde_saphyr::from_str(
            "metadata: {name: redis-operator}\nrules: [{apiGroups: ['*'], resources: ['*'], verbs: ['*']}]\n",
        )
        .unwrap();
        cluster_roles.create(&PostParams::default(), &star).await.unwrap();
        let escalate: Role = serde_saphyr::from_str(&format!(
            "metadata: {{name: {LEADER}, namespace: redis-system}}\n\
             rules:\n\
             - {{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}}\n\
             - {{apiGroups: [rbac.authorization.k8s.io], resources: [roles], verbs: [get, escalate]}}\n"
        ))
        .unwrap();
        roles.create(&PostParams::default(), &escalate).await.unwrap();
        refused(
            &mut agent,
            "rel-2",
            &format!(
                "{CRB}: binds ClusterRole redis-operator, which the release does not define: its rules[0] in the \
                 cluster grant verbs: [*], which allowedRbac does not list; allow it by adding wildcard to \
                 allowedRbac in the admission policy, or bind a role the release defines — refused by agent baseline"
            ),
        )
        .await;
        let events = fleet.events_json().await;
        assert!(events.contains("AdmissionRefused") && events.contains("ClusterRole redis-operator"), "{events}");

        // The ClusterRole now within the policy; the Role still grants `escalate`.
        let mut plain = cluster_roles.get("redis-operator").await.unwrap();
        plain.rules =
            serde_saphyr::from_str("[{apiGroups: [''], resources: [configmaps], verbs: [get, list]}]").unwrap();
        cluster_roles.replace("redis-operator", &PostParams::default(), &plain).await.unwrap();
        let escalate_refused = format!(
            "{RB}: binds Role redis-system/{LEADER}, which the release does not define: its rules[1] in the cluster \
             grant verb escalate, which allowedRbac does not list; allow it by adding escalate to allowedRbac in the \
             admission policy, or bind a role the release defines — refused by agent baseline"
        );
        refused(&mut agent, "rel-3", &escalate_refused).await;

        // The hint followed — escalate added to allowedRbac in the agent's baseline and in the
        // repo's policy, which the next release's tree carries — lets the release through: both
        // bindings written by the agent's token, so admission was all that stood in the way.
        let policy = std::fs::read_to_string(fleet.work.join("policies/admission.yaml")).unwrap();
        let allowing = policy.replace("allowedRbac: [clusterPods]", "allowedRbac: [clusterPods, escalate]");
        assert_ne!(allowing, policy);
        std::fs::write(fleet.work.join("policies/admission.yaml"), &allowing).unwrap();
        let baseline = fleet.dir.path().join("baseline.yaml");
        std::fs::write(&baseline, &allowing).unwrap();
        fleet.commit_and_push("admission: allow escalate");
        fleet.release("rel-4", without_roles);
        fleet.promote("rel-4");
        drop(agent);
        let settings = fleetgate::agent::AgentSettings { admission_policy: Some(baseline), ..fleet.settings() };
        let mut agent = fleet.agent_with(settings).await;
        assert_eq!(within("rel-4", 90, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-4".into()));
        assert_eq!(crbs.get("redis-operator").await.unwrap().role_ref.name, "redis-operator");
        assert_eq!(rbs.get(LEADER).await.unwrap().role_ref.name, LEADER);
    })
    .await
    .expect("test finishes in time");
}
