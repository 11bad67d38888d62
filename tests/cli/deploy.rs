//! The shipped manifests in `deploy/` against a real API server: every object passes a server-side
//! dry run (after its Namespaces are created for real), `kustomization.yaml` lists every manifest,
//! and the agent's RBAC is least privilege in both directions — as its ServiceAccount (a token),
//! the template Operator (`fleet-repo-template/operator/`) applies by server-side dry run, while
//! what the agent must not do (delete Namespaces, read other namespaces' Secrets, grant
//! `cluster-admin`) is denied.

use fleetgate::agent::AgentSettings;
use fleetgate::model::{RELEASE_ADMISSION_POLICY_KIND, ReleaseAdmissionPolicy, parse_document};
use fleetgate_testenv::{ClusterOptions, DeployManifests, TestCluster};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use serde::Deserialize;
use std::path::{Path, PathBuf};

const SERVICE_ACCOUNT: &str = "system:serviceaccount:fleetgate-system:fleetgate-agent";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every YAML file under `dir`, recursively, in path order; not the Helm chart's (deploy/chart:
/// templates and values, not manifests; tests/cli/helm_chart.rs checks it renders these objects).
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path == repo().join("deploy/chart") {
            continue;
        }
        if path.is_dir() {
            out.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The documents of a file, each with the file's name for messages.
fn documents(path: &Path) -> Vec<(String, DynamicObject)> {
    let text = std::fs::read_to_string(path).unwrap();
    let name = path.strip_prefix(repo()).unwrap().display().to_string();
    serde_saphyr::from_multiple::<serde_json::Value>(&text)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .into_iter()
        .map(|v| {
            (name.clone(), serde_json::from_value(v).unwrap_or_else(|e| panic!("{name}: not a Kubernetes object: {e}")))
        })
        .collect()
}

fn gvk(obj: &DynamicObject) -> GroupVersionKind {
    let types = obj.types.as_ref().expect("apiVersion and kind");
    GroupVersionKind::try_from(types).unwrap()
}

/// The API of `obj`'s kind, namespaced where the kind is.
fn api_for(client: kube::Client, discovery: &Discovery, obj: &DynamicObject) -> Api<DynamicObject> {
    let gvk = gvk(obj);
    let (resource, caps) = discovery.resolve_gvk(&gvk).unwrap_or_else(|| panic!("{gvk:?} is not served"));
    match caps.scope {
        Scope::Namespaced => {
            Api::namespaced_with(client, obj.metadata.namespace.as_deref().unwrap_or("default"), &resource)
        }
        Scope::Cluster => Api::all_with(client, &resource),
    }
}

/// The settings the Deployment gives the agent agree with the rest of deploy/: `agent.yaml` and
/// the baseline admission policy parse (unknown keys are errors), and every path they name lies on
/// a volume the Deployment mounts.
#[test]
fn the_agent_configuration_matches_the_deployment() {
    let config = documents(&repo().join("deploy/config.yaml")).remove(0).1;
    let data = config.data["data"].as_object().expect("ConfigMap data");
    let agent_yaml = data["agent.yaml"].as_str().unwrap();
    let settings: AgentSettings = serde_saphyr::from_str(agent_yaml).expect("agent.yaml is valid agent configuration");

    let deployment =
        documents(&repo().join("deploy/deployment.yaml")).into_iter().find(|(_, o)| gvk(o).kind == "Deployment");
    let container = deployment.unwrap().1.data["spec"]["template"]["spec"]["containers"][0].clone();
    let mounts: Vec<String> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap().to_string())
        .collect();
    let mounted = |p: &Path| mounts.iter().any(|m| p.starts_with(m));
    let config_arg = container["args"].as_array().unwrap().iter().find_map(|a| a.as_str()?.strip_prefix("--config="));
    let config_path = Path::new(config_arg.expect("--config= in the Deployment's args"));
    assert!(mounted(config_path), "{config_path:?} is not on a mounted volume");
    assert!(data.contains_key(config_path.file_name().unwrap().to_str().unwrap()));

    let policy_path = settings.admission_policy.expect("an admission baseline");
    let mut paths = vec![policy_path.clone(), settings.state_dir.expect("stateDir")];
    paths.extend(settings.trusted_keys);
    // Listening beyond loopback needs the webhook secret (or an explicit insecureWebhook).
    paths.extend(settings.webhook_secret_file.clone());
    assert!(settings.webhook_secret_file.is_some() || settings.insecure_webhook == Some(true));
    for p in &paths {
        assert!(mounted(p), "{p:?} is not on a volume the Deployment mounts ({mounts:?})");
    }
    let policy_key = policy_path.file_name().unwrap().to_str().unwrap();
    let policy_text = data[policy_key].as_str().expect("the admission policy is in the same ConfigMap");
    let policy: ReleaseAdmissionPolicy =
        parse_document(policy_key, policy_text, RELEASE_ADMISSION_POLICY_KIND).unwrap();
    assert!(!policy.spec.allow_cluster_admin_bindings);
    assert_eq!(settings.listen.unwrap().to_string(), "0.0.0.0:8080", "probes and the Service reach the agent");
}

#[tokio::test]
async fn deploy_manifests_pass_a_server_side_dry_run_and_rbac_is_least_privilege() {
    let cluster = TestCluster::start(ClusterOptions::new("deploy")).await.expect("test cluster starts");
    let admin = cluster.client();
    let discovery = Discovery::new(admin.clone()).run().await.unwrap();

    let manifests: Vec<(String, DynamicObject)> = yaml_files(&repo().join("deploy"))
        .iter()
        .filter(|p| p.file_name().unwrap() != "kustomization.yaml")
        .flat_map(|p| documents(p))
        .collect();
    assert!(manifests.len() >= 15, "only {} objects in deploy/", manifests.len());

    // Namespaces for real (the namespaced objects need them), then a dry run of everything else.
    let (namespaces, rest): (Vec<_>, Vec<_>) = manifests.iter().partition(|(_, o)| gvk(o).kind == "Namespace");
    for (file, ns) in &namespaces {
        api_for(admin.clone(), &discovery, ns)
            .create(&PostParams::default(), ns)
            .await
            .unwrap_or_else(|e| panic!("{file}: {e}"));
    }
    let dry_run = PostParams { dry_run: true, ..Default::default() };
    let mut failures = Vec::new();
    for (file, obj) in &rest {
        if let Err(e) = api_for(admin.clone(), &discovery, obj).create(&dry_run, obj).await {
            failures.push(format!("{file}: {} {}: {e}", gvk(obj).kind, obj.metadata.name.as_deref().unwrap_or("?")));
        }
    }
    assert!(failures.is_empty(), "server-side dry run refused:\n{}", failures.join("\n"));

    // kustomization.yaml names every top-level manifest, so `kubectl apply -k deploy/` ships all.
    #[derive(Deserialize)]
    struct Kustomization {
        resources: Vec<String>,
    }
    let k: Kustomization =
        serde_saphyr::from_str(&std::fs::read_to_string(repo().join("deploy/kustomization.yaml")).unwrap()).unwrap();
    let mut top_level: Vec<String> = yaml_files(&repo().join("deploy"))
        .iter()
        .filter(|p| p.parent() == Some(&repo().join("deploy")) && p.file_name().unwrap() != "kustomization.yaml")
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    top_level.sort();
    let mut listed = k.resources.clone();
    listed.sort();
    assert_eq!(listed, top_level);

    // deploy/ for real, then act as the agent's ServiceAccount with a TokenRequest token.
    let manifests = DeployManifests::shipped().unwrap();
    let agent = cluster.deploy_agent(&manifests).await.unwrap_or_else(|e| panic!("{e:#}")).client();

    // The agent can apply the template Operator (server-side apply, as it does, dry run).
    let apply = PatchParams::apply("fleetgate").dry_run();
    let mut refused = Vec::new();
    for path in yaml_files(&repo().join("fleet-repo-template/operator")) {
        for (file, obj) in documents(&path) {
            let name = obj.metadata.name.clone().unwrap();
            if let Err(e) = api_for(agent.clone(), &discovery, &obj).patch(&name, &apply, &Patch::Apply(&obj)).await {
                refused.push(format!("{file}: {} {name}: {e}", gvk(&obj).kind));
            }
        }
    }
    assert!(refused.is_empty(), "the agent's RBAC does not cover the template Operator:\n{}", refused.join("\n"));

    // ... and no more than it needs.
    let reviews: Api<SubjectAccessReview> = Api::all(admin.clone());
    let table: &[(&str, &str, &str, &str, &str, bool)] = &[
        // (verb, group, resource, namespace, name, allowed)
        ("update", "", "configmaps", "fleetgate-system", "fleetgate-state-canary", true),
        ("create", "events.k8s.io", "events", "fleetgate-system", "", true),
        ("update", "coordination.k8s.io", "leases", "fleetgate-system", "fleetgate-agent-canary", true),
        ("create", "apiextensions.k8s.io", "customresourcedefinitions", "", "redisclusters.cache.example.com", true),
        ("create", "", "secrets", "fleetgate-system", "", true),
        ("update", "", "secrets", "fleetgate-system", "fleetgate-state-key-canary", true),
        ("create", "apiextensions.k8s.io", "customresourcedefinitions", "", "other.example.com", false),
        ("patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "someone-else", false),
        ("patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "redis-operator", false),
        ("patch", "rbac.authorization.k8s.io", "clusterroles", "", "someone-else", false),
        // Admission reads the roles a release's bindings grant, wherever they are; writes none.
        ("get", "rbac.authorization.k8s.io", "clusterroles", "", "someone-else", true),
        ("get", "rbac.authorization.k8s.io", "roles", "kube-system", "someone-else", true),
        ("list", "rbac.authorization.k8s.io", "clusterroles", "", "", false),
        ("bind", "rbac.authorization.k8s.io", "roles", "kube-system", "someone-else", false),
        ("get", "", "secrets", "redis-system", "", false),
        ("patch", "cache.example.com", "redisclusters", "team-a", "cache-1", true),
        ("create", "apps", "deployments", "redis-system", "", true),
        ("escalate", "rbac.authorization.k8s.io", "clusterroles", "", "redis-operator", true),
        ("delete", "", "namespaces", "", "redis-system", false),
        ("get", "", "secrets", "kube-system", "", false),
        ("update", "", "configmaps", "default", "", false),
        ("create", "apps", "deployments", "default", "", false),
        ("create", "coordination.k8s.io", "leases", "kube-system", "", false),
        ("escalate", "rbac.authorization.k8s.io", "clusterroles", "", "cluster-admin", false),
        ("bind", "rbac.authorization.k8s.io", "clusterroles", "", "cluster-admin", false),
        ("delete", "cache.example.com", "redisclusters", "team-a", "cache-1", false),
    ];
    let mut wrong = Vec::new();
    for &(verb, group, resource, namespace, name, expected) in table {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(SERVICE_ACCOUNT.into()),
                groups: Some(vec!["system:serviceaccounts".into(), "system:serviceaccounts:fleetgate-system".into()]),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    group: Some(group.into()),
                    resource: Some(resource.into()),
                    namespace: Some(namespace.into()).filter(|n: &String| !n.is_empty()),
                    name: Some(name.into()).filter(|n: &String| !n.is_empty()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = reviews.create(&PostParams::default(), &review).await.unwrap();
        let allowed = answer.status.map(|s| s.allowed).unwrap_or(false);
        if allowed != expected {
            wrong.push(format!("{verb} {group}/{resource} {namespace}/{name}: allowed={allowed}, expected {expected}"));
        }
    }
    assert!(wrong.is_empty(), "RBAC is not what deploy/ promises:\n{}", wrong.join("\n"));

    // A ClusterRole the agent does not hold the permissions for, and may not escalate, is refused.
    let evil: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": { "name": "not-the-operator" },
        "rules": [{ "apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"] }]
    }))
    .unwrap();
    let err = api_for(agent.clone(), &discovery, &evil)
        .patch("not-the-operator", &apply, &Patch::Apply(&evil))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("forbidden"), "{err}");
}

/// `fleetgate agent rbac` on a signed release of the template Operator (cut with the real
/// `release create`, signed by a throw-away gpg key) prints exactly the grants deploy/ ships.
#[test]
fn agent_rbac_of_the_template_release_is_what_deploy_grants() {
    use fleetgate::apply::yaml_grants;
    const BIN: &str = env!("CARGO_BIN_EXE_fleetgate");
    let dir = tempfile::Builder::new().prefix("fg-rbac").tempdir().unwrap();
    let work = dir.path().join("fleet");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(BIN).args(args).output().unwrap();
        assert!(out.status.success(), "fleetgate {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let w = work.to_str().unwrap();
    run(&["init", w]);
    let gpg = fleetgate_testenv::GpgHome::new().unwrap();
    let fpr = gpg.generate_key("Release Bot", "release@example.com").unwrap();
    let key = gpg.write_public_key(&fpr, &dir.path().join("key.asc")).unwrap();
    let manifests = repo().join("fleet-repo-template/operator");
    run(&[
        "release",
        "create",
        "--repo",
        w,
        "--id",
        "rel-1",
        "--manifests",
        manifests.to_str().unwrap(),
        "--image",
        "registry.example.com/redis-operator:v1.2.3-build.456",
        "--chart-version",
        "1.0.0",
        "--crd-version",
        "v1alpha2",
        "--git-commit",
        "a1b2c3d4e5f6",
        "--all",
        "--sign-key",
        &fpr,
        "--gpg-home",
        gpg.path().to_str().unwrap(),
    ]);
    let printed = run(&["agent", "rbac", "--repo", w, "--release", "rel-1", "--trusted-keys", key.to_str().unwrap()]);

    let shipped = std::fs::read_to_string(repo().join("deploy/rbac-operator.yaml")).unwrap();
    assert_eq!(
        yaml_grants("printed", &printed).unwrap(),
        yaml_grants("shipped", &shipped).unwrap(),
        "printed:\n{printed}"
    );
    assert!(printed.contains("kind: ClusterRoleBinding") && printed.contains("kind: RoleBinding"), "{printed}");
}
