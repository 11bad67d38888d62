//! Leader election against a real API server: of two candidates exactly one leads; when the leader
//! stops renewing (a crash) the other takes over only after the lease duration has passed; a
//! graceful step-down hands over within a retry period; and a leader whose Lease is taken from it
//! notices and stops leading.

use fleetgate::agent::lease::{LeaderElector, LeaderHandle, Leadership, LeaseConfig};
use fleetgate_testenv::{ClusterOptions, DeployManifests, TestCluster};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, Patch, PatchParams};
use std::time::{Duration, Instant};

const NS: &str = "fleetgate-system";
const LEASE: &str = "fleetgate-agent-canary";
const DURATION: Duration = Duration::from_secs(3);

/// A candidate authenticated as the agent's ServiceAccount (deploy/'s RBAC).
fn candidate(agent: &kube::Client, identity: &str) -> LeaderHandle {
    LeaderElector::new(
        agent.clone(),
        LeaseConfig { namespace: NS.into(), name: LEASE.into(), identity: identity.into(), lease_duration: DURATION },
    )
    .spawn()
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what} did not happen within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

#[tokio::test]
async fn one_leader_takeover_after_expiry_fast_handover_and_loss() {
    let cluster = TestCluster::start(ClusterOptions::new("lease")).await.expect("test cluster starts");
    let agent = cluster.deploy_agent(&DeployManifests::shipped().unwrap()).await.expect("deploy/ applied").client();
    let leases: Api<Lease> = Api::namespaced(cluster.client(), NS);

    // Two candidates: exactly one leads, the other follows it by name.
    let a = candidate(&agent, "agent-a");
    wait_until("a leads", Duration::from_secs(10), || a.is_leading()).await;
    let b = candidate(&agent, "agent-b");
    wait_until("b sees a", Duration::from_secs(10), || {
        b.current() == Leadership::Following { holder: Some("agent-a".into()) }
    })
    .await;
    // Several retry periods later still exactly one leader.
    tokio::time::sleep(DURATION).await;
    assert!(a.is_leading() && !b.is_leading(), "a={:?} b={:?}", a.current(), b.current());
    let spec = leases.get(LEASE).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("agent-a"));
    assert_eq!(spec.lease_duration_seconds, Some(3));

    // a crashes (stops renewing without releasing): b takes over, but only once a full lease
    // duration passed since a's last renewal. a renewed at most one retry period (3s/7) before the
    // crash, so b may lead as early as 3s - 0.43s after it, never earlier.
    let crashed = Instant::now();
    drop(a);
    let took = wait_until("b takes over", DURATION * 4, || b.is_leading()).await;
    assert!(took >= DURATION - DURATION / 7 - Duration::from_millis(50), "b took over after only {took:?}");
    println!("takeover after crash: {:?} (lease {DURATION:?})", crashed.elapsed());
    let spec = leases.get(LEASE).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("agent-b"));
    assert_eq!(spec.lease_transitions, Some(1));

    // A graceful stop releases the Lease: a new candidate leads within about one retry period.
    let c = candidate(&agent, "agent-c");
    wait_until("c follows b", Duration::from_secs(10), || {
        c.current() == Leadership::Following { holder: Some("agent-b".into()) }
    })
    .await;
    let stepped = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), b.step_down()).await.expect("step_down finishes");
    let took = wait_until("c takes over", DURATION, || c.is_leading()).await;
    println!("handover after step-down: {:?}", stepped.elapsed());
    assert!(took < DURATION, "{took:?}");

    // Someone else takes the Lease (another agent with a skewed view, or a human): c notices at its
    // next renewal and stops leading; until_not_leading wakes the loop to stop work.
    let intruder = serde_json::json!({ "spec": {
        "holderIdentity": "intruder",
        "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
        "leaseDurationSeconds": 60 } });
    leases.patch(LEASE, &PatchParams::default(), &Patch::Merge(&intruder)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), c.until_not_leading()).await.expect("c stops leading");
    assert_eq!(c.current(), Leadership::Following { holder: Some("intruder".into()) });
}
