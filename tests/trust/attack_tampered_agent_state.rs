//! The ConfigMap writer (docs/SECURITY.md): a ServiceAccount allowed to write ConfigMaps in the
//! agent's namespace, and nothing else, attacks what the agent keeps there. It forges an outbox
//! entry (a `success` the agent would sign on delivery) and edits the trust memory (a rejection
//! cleared, `newest` rewound, another cluster's status key re-pinned), writes back a sealed copy
//! saved before a rejection, then deletes the state and writes one in the format of the agent
//! before states were sealed. The agent signs nothing
//! forged, applies nothing, and says why, naming the ConfigMap. An agent upgraded over a real
//! previous-version state migrates it once, keeping only what makes it stricter.
//!
//! Real components: a kube-apiserver with deploy/ applied (the agent runs as its ServiceAccount),
//! the attacker's own ServiceAccount with a TokenRequest token, the fleet repo on a `git daemon`,
//! releases signed with `gpg`.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::{AgentServices, Outcome};
use fleetgate::model::error_chain;
use fleetgate::status::{State, Status};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, PostParams};
use std::collections::BTreeMap;

const STATE: &str = "fleetgate-state-cluster-a";
const OUTBOX: &str = "fleetgate-outbox-cluster-a";
const STATE_KEY: &str = "fleetgate-state-key-cluster-a";

/// A client as ServiceAccount `cm-writer`, which may do anything to ConfigMaps in the agent's
/// namespace and nothing else.
async fn configmap_writer(fleet: &Fleet) -> kube::Client {
    let admin = fleet.cluster.client();
    let meta =
        |name: &str| ObjectMeta { name: Some(name.into()), namespace: Some(AGENT_NS.into()), ..Default::default() };
    let pp = PostParams::default();
    Api::<ServiceAccount>::namespaced(admin.clone(), AGENT_NS)
        .create(&pp, &ServiceAccount { metadata: meta("cm-writer"), ..Default::default() })
        .await
        .unwrap();
    let rule = PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["configmaps".into()]),
        verbs: ["get", "list", "watch", "create", "update", "patch", "delete"].map(String::from).to_vec(),
        ..Default::default()
    };
    Api::<Role>::namespaced(admin.clone(), AGENT_NS)
        .create(&pp, &Role { metadata: meta("cm-writer"), rules: Some(vec![rule]) })
        .await
        .unwrap();
    let binding = RoleBinding {
        metadata: meta("cm-writer"),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "cm-writer".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "cm-writer".into(),
            namespace: Some(AGENT_NS.into()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, AGENT_NS).create(&pp, &binding).await.unwrap();
    let writer = fleet.cluster.service_account_identity(AGENT_NS, "cm-writer").await.unwrap().client();
    // It really holds no more: the agent's keys are out of its reach.
    let denied = Api::<Secret>::namespaced(writer.clone(), AGENT_NS).get(STATE_KEY).await.unwrap_err();
    assert!(matches!(denied, kube::Error::Api(ref e) if e.code == 403), "{denied}");
    writer
}

/// Writes `data` into ConfigMap `name` of the agent's namespace as `client` (creating it if needed).
async fn write_configmap(client: &kube::Client, name: &str, data: BTreeMap<String, String>) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), AGENT_NS);
    match api.get_opt(name).await.unwrap() {
        Some(mut cm) => {
            cm.data = Some(data);
            api.replace(name, &PostParams::default(), &cm).await.unwrap();
        }
        None => {
            let cm = ConfigMap {
                metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
                data: Some(data),
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm).await.unwrap();
        }
    }
}

/// An outbox holding a `success` for `release`: once with a made-up MAC, once as the agent
/// before sealing wrote entries (a bare status).
fn forged_outbox(release: &str, commit: &str) -> BTreeMap<String, String> {
    let success = Status::new(CLUSTER, release, commit, State::Success, "all gates passed (forged)");
    let entries = serde_json::json!([{ "status": success, "hmacSha256": "00".repeat(32) }, success]);
    BTreeMap::from([("statuses".to_string(), entries.to_string())])
}

/// `cluster`'s status key as registered and pinned: `ssh-ed25519 AAAA…`, without the comment.
fn pinned_key(fleet: &Fleet, cluster: &str) -> String {
    fleet.status_public_key(cluster).split(' ').take(2).collect::<Vec<_>>().join(" ")
}

/// Starting an agent over the current state fails; returns its error.
async fn start_refused(fleet: &Fleet) -> String {
    let config = fleet.settings().resolve().unwrap();
    match within("agent start", 60, AgentServices::start(config)).await {
        Ok(_) => panic!("the agent started over a state it did not write"),
        Err(e) => error_chain(&e),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_writer_forges_an_outbox_success_and_edits_trust_memory_and_the_agent_refuses() {
    let fleet = Fleet::start("state-forgery", false).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 90, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    // What anyone who may read ConfigMaps can keep: the sealed state before rel-2's rejection.
    let admin_configmaps: Api<ConfigMap> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    let before_rejection = admin_configmaps.get(STATE).await.unwrap().data.unwrap();
    let rel2 = fleet.blocked_release("rel-2");
    fleet.promote("rel-2");
    assert!(matches!(within("rel-2", 90, agent.reconcile()).await.unwrap(), Outcome::Blocked { .. }));
    assert!(fleet.state().await.rejected().contains_key("rel-2"));
    let writer = configmap_writer(&fleet).await;

    // 1. A success for the blocked rel-2 in the outbox, for the agent to sign and push.
    write_configmap(&writer, OUTBOX, forged_outbox("rel-2", &rel2)).await;
    assert_eq!(within("pass", 90, agent.pass()).await.unwrap(), Outcome::Rejected("rel-2".into()));
    let states: Vec<State> = fleet.statuses(&rel2).iter().map(|s| s.state).collect();
    assert!(!states.contains(&State::Success), "a forged success was delivered: {states:?}");
    assert_eq!(fleet.outbox_text().await, "[]", "the forged entries are taken out");
    let events = fleet.events_json().await;
    assert!(events.contains("OutboxEntryRefused"), "{events}");
    assert!(events.contains(&format!("dropped an entry of the status outbox {OUTBOX} (rel-2 success")), "{events}");
    assert!(events.contains("does not verify") && events.contains("carries no hmacSha256"), "{events}");

    // 2. The saved copy written back (its MAC is the agent's own): refused as older than the
    //    state the agent last wrote; the real one back is accepted again.
    let configmaps: Api<ConfigMap> = Api::namespaced(writer.clone(), AGENT_NS);
    let current = configmaps.get(STATE).await.unwrap().data.unwrap();
    write_configmap(&writer, STATE, before_rejection).await;
    let err = within("pass", 90, agent.pass()).await.unwrap_err();
    assert_eq!(err.reason(), "StateUnauthenticated");
    assert!(error_chain(&err).contains("a saved copy written back"), "{}", error_chain(&err));
    write_configmap(&writer, STATE, current).await;
    assert_eq!(within("pass", 90, agent.pass()).await.unwrap(), Outcome::Rejected("rel-2".into()));

    // 3. Trust memory edited: rel-2's rejection cleared, `newest` gone, cluster-b's status key
    //    pinned to the attacker's.
    let mut data = configmaps.get(STATE).await.unwrap().data.unwrap();
    assert!(data["trust"].contains("\"newest\"") && data["rejected"].contains("rel-2"), "{data:?}");
    let b_key = pinned_key(&fleet, "cluster-b");
    assert!(data["trust"].contains(&b_key), "cluster-b's key is pinned: {}", data["trust"]);
    let trust: serde_json::Value = serde_json::from_str(&data["trust"]).unwrap();
    let mut trust = trust.as_object().unwrap().clone();
    trust.remove("newest");
    trust["statusKeys"]["cluster-b"] = pinned_key(&fleet, "cluster-c").into();
    data.insert("trust".into(), serde_json::Value::Object(trust).to_string());
    data.insert("rejected".into(), "{}".into());
    write_configmap(&writer, STATE, data).await;
    let err = within("pass", 90, agent.pass()).await.unwrap_err();
    assert_eq!(err.reason(), "StateUnauthenticated");
    let text = error_chain(&err);
    assert!(text.contains(&format!("state ConfigMap {AGENT_NS}/{STATE} is refused")), "{text}");
    assert!(text.contains("does not verify under the agent's state key"), "{text}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")), "rel-2 never applied");
    let states: Vec<State> = fleet.statuses(&rel2).iter().map(|s| s.state).collect();
    assert_eq!(states, [State::Failure], "only the real verdict on rel-2");
    let events = fleet.events_json().await;
    assert!(events.contains("StateUnauthenticated") && events.contains(STATE), "{events}");
    drop(agent);
    let refused = start_refused(&fleet).await;
    assert!(refused.contains(&format!("state ConfigMap {AGENT_NS}/{STATE} is refused")), "{refused}");

    // 4. The state deleted (everything remembered at once), then one written in the format of
    //    the agent before states were sealed: refused too, the key says the state was sealed.
    configmaps.delete(STATE, &Default::default()).await.unwrap();
    let refused = start_refused(&fleet).await;
    assert!(refused.contains("no longer exists, though this agent sealed it before"), "{refused}");
    let old = BTreeMap::from([
        ("schema".to_string(), "fleetgate.io/agent-state/v1".to_string()),
        ("phase".to_string(), "Idle".to_string()),
        ("current".to_string(), "rel-1".to_string()),
    ]);
    write_configmap(&writer, STATE, old).await;
    let refused = start_refused(&fleet).await;
    assert!(refused.contains("carries no hmacSha256 although this agent sealed its state before"), "{refused}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
}

/// A state as the agent before sealing wrote it, made worse by whoever could write it: rel-1 in
/// its bake since long ago (finishing it would report `success` without applying anything), a
/// `success` waiting to be delivered, cluster-b's status key pinned to another, an accepted tip
/// and a fleet name of the writer's choice — and rel-2 rejected.
fn previous_version_state(b_key: &str) -> BTreeMap<String, String> {
    let operation = r#"{"release": "rel-1", "commit": "0000000000000000000000000000000000000001",
        "startedAt": "2020-01-01T00:00:00Z", "appliedAt": "2020-01-01T00:00:01Z"}"#;
    let forged = Status::new(CLUSTER, "rel-1", "0000000000000000000000000000000000000001", State::Success, "forged");
    BTreeMap::from([
        ("schema".into(), "fleetgate.io/agent-state/v1".into()),
        ("phase".into(), "Baking".into()),
        ("desired".into(), "rel-1".into()),
        ("current".into(), "rel-1".into()),
        ("lastKnownGood".into(), "rel-0".into()),
        ("operation".into(), operation.into()),
        (
            "rejected".into(),
            r#"{"rel-2": {"reason": "GateFailed", "message": "pod-restarts 4 > 3", "at": "2020-01-01T00:00:02Z"}}"#
                .into(),
        ),
        (
            "trust".into(),
            serde_json::json!({"fleet": "another-fleet", "acceptedTip": "0000000000000000000000000000000000000002",
                "statusKeys": {"cluster-b": b_key}})
            .to_string(),
        ),
        ("unreported".into(), serde_json::to_string(&[forged]).unwrap()),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_upgraded_over_an_unsealed_state_keeps_only_what_makes_it_stricter() {
    let fleet = Fleet::start("state-migration", false).await;
    let rel1 = fleet.release("rel-1", |_| {});
    fleet.release("rel-2", |_| {});
    fleet.promote("rel-1");
    let admin = fleet.cluster.client();
    let other_key = pinned_key(&fleet, "cluster-c");
    write_configmap(&admin, STATE, previous_version_state(&other_key)).await;
    write_configmap(&admin, OUTBOX, forged_outbox("rel-2", &rel1)).await;

    let mut agent = fleet.agent().await;
    let events = fleet.events_json().await;
    assert!(events.contains("StateMigrated"), "{events}");
    assert!(
        events.contains(
            "dropped the operation in progress, the current release, the releases that passed here, \
                         undelivered statuses, the fleet name, the accepted tip, status-key pins"
        ),
        "{events}"
    );
    // Sealed at once, under a key the agent made.
    let cm = Api::<ConfigMap>::namespaced(admin.clone(), AGENT_NS).get(STATE).await.unwrap();
    assert!(cm.data.unwrap().contains_key("hmacSha256"));
    assert!(Api::<Secret>::namespaced(admin.clone(), AGENT_NS).get_opt(STATE_KEY).await.unwrap().is_some());

    // rel-1 is really applied and baked, not reported from the forged bake.
    assert_eq!(within("rel-1", 90, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    assert!(fleet.namespace_applied(OPERATOR_NS).await);
    let descriptions: Vec<String> = fleet.statuses(&rel1).into_iter().map(|s| s.description).collect();
    assert!(!descriptions.iter().any(|d| d.contains("forged")), "{descriptions:?}");
    assert_eq!(fleet.outbox_text().await, "[]");
    let state = fleet.state().await;
    assert_ne!(state.trust().fleet.as_deref(), Some("another-fleet"), "the writer's fleet name is not pinned");
    assert_eq!(state.trust().status_keys["cluster-b"], pinned_key(&fleet, "cluster-b"), "re-pinned from Git");
    assert_ne!(state.trust().accepted_tip.as_deref(), Some("0000000000000000000000000000000000000002"));

    // The rejection it carried holds: an unsigned tip asking for rel-2 starts nothing.
    fleet.promote("rel-2");
    assert_eq!(within("rel-2", 90, agent.reconcile()).await.unwrap(), Outcome::Rejected("rel-2".into()));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
}

/// The generation the state key Secret records (the oldest state a start believes).
async fn recorded_generation(fleet: &Fleet) -> u64 {
    let secret = Api::<Secret>::namespaced(fleet.cluster.client(), AGENT_NS).get(STATE_KEY).await.unwrap();
    secret.metadata.annotations.unwrap()["fleetgate.io/state-generation"].parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_copy_written_back_while_no_agent_runs_is_refused_by_the_next_start() {
    let fleet = Fleet::start("state-rollback", false).await;
    fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let mut agent = fleet.agent().await;
    assert_eq!(within("rel-1", 90, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    let writer = configmap_writer(&fleet).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(writer.clone(), AGENT_NS);
    let before_rejection = configmaps.get(STATE).await.unwrap().data.unwrap();
    fleet.blocked_release("rel-2");
    fleet.promote("rel-2");
    assert!(matches!(within("rel-2", 90, agent.reconcile()).await.unwrap(), Outcome::Blocked { .. }));
    assert!(fleet.state().await.rejected().contains_key("rel-2"));
    let current = configmaps.get(STATE).await.unwrap().data.unwrap();
    assert_eq!(recorded_generation(&fleet).await, current["generation"].parse::<u64>().unwrap());

    // The agent stops; the copy from before rel-2's rejection goes back (its MAC is the agent's
    // own). The next process has no memory of its own, but the key Secret's record says it is old.
    drop(agent);
    write_configmap(&writer, STATE, before_rejection).await;
    let refused = start_refused(&fleet).await;
    assert!(refused.contains(&format!("state ConfigMap {AGENT_NS}/{STATE} is refused")), "{refused}");
    assert!(refused.contains("a saved copy written back") && refused.contains(STATE_KEY), "{refused}");
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")), "rel-2 never applied");

    // A crash between the ConfigMap write and the Secret's record leaves the record behind the
    // state: the real state back, the record one lower, the next start accepts it and remembers
    // rel-2's rejection.
    write_configmap(&writer, STATE, current.clone()).await;
    let secrets: Api<Secret> = Api::namespaced(fleet.cluster.client(), AGENT_NS);
    let mut secret = secrets.get(STATE_KEY).await.unwrap();
    let behind = current["generation"].parse::<u64>().unwrap() - 1;
    secret.metadata.annotations.as_mut().unwrap().insert("fleetgate.io/state-generation".into(), behind.to_string());
    secrets.replace(STATE_KEY, &PostParams::default(), &secret).await.unwrap();
    let mut agent = fleet.agent().await;
    assert_eq!(within("pass", 90, agent.pass()).await.unwrap(), Outcome::Rejected("rel-2".into()));
    assert_eq!(fleet.operator_image().await, Some(image_of("rel-1")));
}
