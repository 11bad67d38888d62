//! Shared set-up of the apply engine's integration tests: a real API server, an engine on it,
//! the fixtures' releases, and ways to read the cluster's state back.

use fleetgate::apply::{ApplyError, ApplyOptions, ChangeSet, Engine};
use fleetgate::manifests::admission::AdmissionPolicy;
use fleetgate::model::{
    Document, ImageRef, RELEASE_ADMISSION_POLICY_KIND, Release, ReleaseAdmissionPolicySpec, ReleaseSpec, parse_document,
};
use fleetgate::release::VerifiedRelease;
use fleetgate_testenv::{ClusterOptions, TestCluster};
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, verbs};
use std::collections::BTreeMap;
use std::path::Path;

pub const AGENT_NS: &str = "fleetgate-system";
pub const OPERATOR_NS: &str = "redis-system";
/// The fleet's name of the test cluster (the agent's inventory id derives from it).
pub const CLUSTER: &str = "cluster-a";

/// Starts a cluster (API server only) and returns it with an engine whose agent namespace exists.
pub async fn start(name: &str) -> (TestCluster, Engine) {
    let cluster = TestCluster::start(ClusterOptions::new(name)).await.expect("test cluster starts");
    let client = cluster.client();
    cluster.create_namespace(AGENT_NS).await.expect("agent namespace");
    // The API server creates Service default/kubernetes a moment after it serves: tests that
    // compare `cluster_state` before and after must not see it appear in between.
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), "default");
    fleetgate_testenv::wait::eventually("Service default/kubernetes", 60, || async {
        services.get_opt("kubernetes").await.ok().flatten().map(drop)
    })
    .await;
    (cluster, Engine::new(client, ApplyOptions::for_cluster(AGENT_NS, CLUSTER)))
}

/// The manifests stage and the apply, as one pass of the agent runs them.
pub async fn apply(
    engine: &Engine,
    release: &VerifiedRelease,
    policy: &AdmissionPolicy,
) -> Result<ChangeSet, ApplyError> {
    engine.apply(engine.admit(release, policy).await?).await
}

/// The release `id` made of the fixture directory `tests/testdata/apply/<dir>` (its files
/// keyed by path below that directory, e.g. `operator/deployment.yaml`), plus `extra` files.
pub fn release(dir: &str, id: &str, extra: &[(&str, &str)]) -> VerifiedRelease {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/apply").join(dir);
    let mut files = BTreeMap::new();
    read_dir(&root, &root, &mut files);
    for (path, text) in extra {
        files.insert(path.to_string(), text.as_bytes().to_vec());
    }
    let spec = ReleaseSpec {
        git_commit: "a1b2c3d4e5f6".into(),
        image: ImageRef {
            repository: "registry.example.com/redis-operator".into(),
            tag: format!("{id}-tag"),
            digest: None,
        },
        images: Vec::new(),
        chart_version: "1.2.3".into(),
        chart: None,
        crd_version: "v1alpha2".into(),
        crds: Vec::new(),
        accept_crd_changes: Vec::new(),
        target_clusters: vec!["cluster-a".into(), "cluster-b".into()],
        rollback_to: None,
        fleet: Some("redis-fleet".into()),
        sequence: Some(1),
        revokes: Vec::new(),
        requires: None,
        manifests: "operator/".into(),
        namespace: Some(OPERATOR_NS.to_string()),
        deploy_timestamp: None,
        variants: Vec::new(),
    };
    let release: Release = Document::new("Release", id, spec);
    VerifiedRelease::assume_verified(release, "0123456789abcdef", files)
}

/// `release` without the files `drop` (paths as in [`release`]), under id `id`.
pub fn without(release: &VerifiedRelease, id: &str, drop: &[&str]) -> VerifiedRelease {
    let files =
        release.files().iter().filter(|(p, _)| !drop.contains(&p.as_str())).map(|(p, b)| (p.clone(), b.clone()));
    let mut doc = release.release().clone();
    doc.metadata.name = id.to_string();
    VerifiedRelease::assume_verified(doc, release.commit(), files.collect())
}

fn read_dir(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) {
    for entry in std::fs::read_dir(dir).expect("fixture dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            read_dir(root, &path, files);
        } else {
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            files.insert(rel, std::fs::read(&path).expect("fixture file"));
        }
    }
}

/// The reference policy of the repo (`policies/admission-policy.yaml`) as the agent's baseline.
pub fn policy() -> AdmissionPolicy {
    AdmissionPolicy::baseline(policy_spec())
}

pub fn policy_spec() -> ReleaseAdmissionPolicySpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/admission-policy.yaml");
    let text = std::fs::read_to_string(&path).expect("reference policy");
    parse_document::<ReleaseAdmissionPolicySpec>("admission-policy.yaml", &text, RELEASE_ADMISSION_POLICY_KIND)
        .expect("reference policy parses")
        .spec
}

/// An API for `api_version`/`kind` (namespaced when `ns` is given), through discovery.
pub async fn api(client: &kube::Client, api_version: &str, kind: &str, ns: Option<&str>) -> Api<DynamicObject> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let discovery = Discovery::new(client.clone()).run_aggregated().await.expect("discovery");
    let (ar, _) = discovery.resolve_gvk(&gvk).unwrap_or_else(|| panic!("{api_version} {kind} is served"));
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Reads one object, or None.
pub async fn get(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    ns: Option<&str>,
    name: &str,
) -> Option<DynamicObject> {
    api(client, api_version, kind, ns).await.get_opt(name).await.expect("get")
}

/// Every object the API server holds — `kind namespace/name` → resourceVersion — except kinds the
/// control plane itself keeps rewriting (leases, events, endpoints, API priority and fairness
/// status, APIService status) and Service IP allocations (`IPAddress`, which the API server's
/// repair loop may create for `default/kubernetes` seconds after start-up).
pub async fn cluster_state(client: &kube::Client) -> BTreeMap<String, String> {
    const CHURNING: [&str; 6] = [
        "coordination.k8s.io",
        "events.k8s.io",
        "flowcontrol.apiserver.k8s.io",
        "apiregistration.k8s.io",
        "discovery.k8s.io",
        "internal.apiserver.k8s.io",
    ];
    let discovery = Discovery::new(client.clone()).run_aggregated().await.expect("discovery");
    let mut state = BTreeMap::new();
    for group in discovery.groups() {
        if CHURNING.contains(&group.name()) {
            continue;
        }
        for (ar, caps) in group.recommended_resources() {
            if !caps.supports_operation(verbs::LIST) || matches!(ar.kind.as_str(), "Event" | "Endpoints" | "IPAddress")
            {
                continue;
            }
            let list = Api::<DynamicObject>::all_with(client.clone(), &ar).list(&ListParams::default()).await;
            for o in list.expect("list").items {
                let key = format!(
                    "{}/{} {}/{}",
                    ar.group,
                    ar.kind,
                    o.metadata.namespace.clone().unwrap_or_default(),
                    o.metadata.name.clone().unwrap_or_default()
                );
                state.insert(key, o.metadata.resource_version.clone().unwrap_or_default());
            }
        }
    }
    state
}
