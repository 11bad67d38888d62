//! Real operators as upstream publishes them, through the whole pipeline against a real cluster:
//! Argo CD's `install.yaml` (objects without `metadata.namespace`, installed the way
//! `kubectl apply -n argocd` installs them; three images; wildcard ClusterRoles; CRDs of up to
//! 1.5 MB) and prometheus-operator's `bundle.yaml` (ten CRDs in one 4 MB file). Both are
//! fetched at test time from the Go module proxy into the cache (`hack/upstream-operators.sh`).
//!
//! Each goes: `release create` of the older version (as published: only the images and versions
//! are given), `validate`, the agent's RBAC from `fleetgate agent rbac` applied on a cluster
//! where the operator never ran, install by the agent as its ServiceAccount, a custom resource a
//! user creates, `release create` of the newer version (the CRD findings that version really has
//! accepted with the flags the refusal prints, as a release engineer would), upgrade, then a
//! `fleetgate rollback --cluster … --push`: the older images run again, no CRD is narrowed, the
//! custom resource is intact and the older release reports `success`. Step times are printed
//! with the upstream versions (docs/BENCHMARKS.md, "Upstream operators").

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::Outcome;
use fleetgate::gates::crd_compat;
use fleetgate::status::State;
use fleetgate_testenv::upstream::Upstream;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_fleetgate");

/// What differs between the operators; the steps are the same.
struct Operator {
    older: Upstream,
    newer: Upstream,
    /// fleet.yaml `spec.operator.name` and `.namespace` (the release's default namespace).
    name: &'static str,
    namespace: &'static str,
    /// The manager's image repository (`--image`); the other container images are `--extra-image`.
    manager: &'static str,
    crd_version: &'static str,
    /// A Deployment of the release whose first container runs the manager image.
    deployment: &'static str,
    /// A custom resource a user creates (in `namespace`), and its plural.
    custom_resource: &'static str,
    plural: &'static str,
}

/// Wall times of the steps, printed as they happen.
struct Clock(Instant, String);

impl Clock {
    fn lap(&mut self, step: &str) {
        eprintln!("[upstream {}] {step}: {:.1} s", self.1, self.0.elapsed().as_secs_f64());
        self.0 = Instant::now();
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Every container image of the file's pod templates, in file order, without repeats.
fn container_images(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let docs = fleetgate::model::parse_multi(&file.display().to_string(), &text).expect("upstream manifests parse");
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for doc in docs {
        let spec = &doc["spec"]["template"]["spec"];
        for list in ["initContainers", "containers"] {
            for c in spec[list].as_array().into_iter().flatten() {
                let image = c["image"].as_str().unwrap().to_string();
                if seen.insert(image.clone()) {
                    out.push(image);
                }
            }
        }
    }
    out
}

/// `release create` arguments for the images: the manager as `--image`, each other image as
/// `--extra-image NAME=REF`, named after the last segment of its repository.
fn image_args(images: &[String], manager: &str) -> Vec<String> {
    let mut args = Vec::new();
    for image in images {
        let repository = image.rsplit_once(':').map_or(image.as_str(), |(r, _)| r);
        if repository == manager {
            args.extend(["--image".to_string(), image.clone()]);
        } else {
            let name = repository.rsplit('/').next().unwrap();
            args.extend(["--extra-image".to_string(), format!("{name}={image}")]);
        }
    }
    assert!(args.iter().any(|a| a == "--image"), "no container runs {manager}: {images:?}");
    args
}

/// `release create` of `upstream` as release `id`: the published file as the release's only
/// manifest, the images it runs, its version as the chart version; `extra` appended.
fn release_create(fleet: &Fleet, op: &Operator, upstream: &Upstream, id: &str, extra: &[String]) -> Output {
    let published = upstream.fetch().unwrap_or_else(|e| panic!("{e:#}"));
    let render = fleet.dir.path().join("render").join(id);
    std::fs::create_dir_all(&render).unwrap();
    std::fs::copy(&published, render.join(published.file_name().unwrap())).unwrap();
    run(Command::new(BIN)
        .args(["release", "create", "--repo"])
        .arg(&fleet.work)
        .args(["--id", id, "--manifests"])
        .arg(&render)
        .args(image_args(&container_images(&published), op.manager))
        .args(["--chart-version", upstream.version.trim_start_matches('v'), "--crd-version", op.crd_version])
        .args(["--git-commit", "0123456789abcdef0123456789abcdef01234567", "--all"])
        .args(["--sign-key", &fleet.fpr, "--gpg-home"])
        .arg(fleet.gpg.path())
        .arg("--admission-policy")
        .arg(baseline(fleet))
        .args(extra)
        .arg("--push"))
}

/// The spoke's baseline admission policy (the agent's `admissionPolicy`), also given to
/// `release create` and `validate` so they judge as the agent will.
fn baseline(fleet: &Fleet) -> PathBuf {
    fleet.dir.path().join("baseline.yaml")
}

/// The `allowedRbac: […]` line an admission refusal prints for the repo's policy.
fn printed_policy_line(text: &str) -> String {
    let mut lines = text.lines().skip_while(|l| !l.trim_start().starts_with("in policies/admission.yaml"));
    let line = lines.find(|l| l.trim_start().starts_with("allowedRbac: ["));
    line.unwrap_or_else(|| panic!("no allowedRbac line for policies/admission.yaml in: {text}")).trim().to_string()
}

/// The values of the `--accept-crd-change` flags a refusal prints.
fn printed_acceptances(text: &str) -> Vec<String> {
    let Some(line) = text.lines().find(|l| l.trim_start().starts_with("--accept-crd-change ")) else {
        return Vec::new();
    };
    line.split("--accept-crd-change ")
        .map(|v| v.trim().trim_matches('\'').to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// Grants the agent what `fleetgate agent rbac` prints for release `id` (its Namespace first),
/// in place of deploy/'s template-Operator RBAC: what a spoke running this operator installs.
async fn grant(fleet: &Fleet, id: &str) {
    let out = run(Command::new(BIN)
        .args(["agent", "rbac", "--release", id, "--trusted-keys"])
        .arg(&fleet.trusted)
        .arg("--repo")
        .arg(&fleet.work));
    assert!(out.status.success(), "agent rbac {id}: {}", text(&out));
    let rbac = String::from_utf8(out.stdout).unwrap();
    let manifests = deploy_manifests().replace_file("rbac-operator.yaml", &rbac).unwrap();
    fleet.cluster.deploy_agent(&manifests).await.unwrap_or_else(|e| panic!("applying agent rbac's output: {e:#}"));
}

async fn manager_image(fleet: &Fleet, op: &Operator) -> String {
    let api: Api<Deployment> = Api::namespaced(fleet.cluster.client(), op.namespace);
    let d = api.get(op.deployment).await.unwrap();
    d.spec.unwrap().template.spec.unwrap().containers[0].image.clone().unwrap()
}

/// The live CRDs of the given names.
async fn live_crds(fleet: &Fleet, names: &[String]) -> Vec<CustomResourceDefinition> {
    let api: Api<CustomResourceDefinition> = Api::all(fleet.cluster.client());
    let mut out = Vec::new();
    for name in names {
        out.push(api.get(name).await.unwrap_or_else(|e| panic!("CRD {name}: {e}")));
    }
    out
}

/// Names of the CRDs in the published file.
fn crd_names(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let docs = fleetgate::model::parse_multi("crds", &text).unwrap();
    docs.into_iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

async fn release_install_upgrade_and_roll_back(cluster_name: &str, op: Operator) {
    let mut clock = Clock(Instant::now(), format!("{} → {}", op.older.label(), op.newer.label()));
    let fleet = Fleet::start(cluster_name, true).await;
    let older_file: PathBuf = op.older.fetch().unwrap_or_else(|e| panic!("{e:#}"));
    op.newer.fetch().unwrap_or_else(|e| panic!("{e:#}"));
    clock.lap("start cluster (kwok), git daemon, gpg; fetch both versions from the Go module proxy");

    // The fleet releases this operator into its namespace; the repo's policy and the spoke's
    // baseline admit its namespace and kinds, and no RBAC grant beyond named objects yet.
    fleet.edit("fleet.yaml", "name: redis-operator", &format!("name: {}", op.name));
    fleet.edit("fleet.yaml", "namespace: redis-system", &format!("namespace: {}", op.namespace));
    let policy = format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: ReleaseAdmissionPolicy\nmetadata:\n  name: {}\nspec:\n  \
         allowedNamespaces: [{}]\n  allowedClusterScopedKinds:\n    - CustomResourceDefinition.apiextensions.k8s.io\n    \
         - ClusterRole.rbac.authorization.k8s.io\n    - ClusterRoleBinding.rbac.authorization.k8s.io\n",
        op.name, op.namespace
    );
    std::fs::write(fleet.work.join("policies/admission.yaml"), &policy).unwrap();
    std::fs::write(baseline(&fleet), &policy).unwrap();
    fleet.set_policy("5s", "  rollbackBakeTime: 2s\n", QUICK_GATES);

    // The older version, as published: admission refuses the grants it makes, all at once, and
    // says which policy lines admit them; the release engineer adds them and runs it again.
    let refused = release_create(&fleet, &op, &op.older, "rel-1", &[]);
    assert!(!refused.status.success(), "the grants are refused before signing");
    assert!(fleet.git(&["tag", "-l", "rel-1"]).is_empty(), "nothing signed: {}", text(&refused));
    let line = printed_policy_line(&text(&refused));
    eprintln!("[upstream {}] admission asked for: {line}", clock.1);
    let admitted = format!("{policy}  {line}\n");
    std::fs::write(fleet.work.join("policies/admission.yaml"), &admitted).unwrap();
    std::fs::write(baseline(&fleet), &admitted).unwrap();
    fleet.commit_and_push(&format!("admission: what {} needs", op.older.label()));
    let out = release_create(&fleet, &op, &op.older, "rel-1", &[]);
    assert!(out.status.success(), "release create rel-1 ({}): {}", op.older.label(), text(&out));
    clock.lap(&format!("release create rel-1 ({})", op.older.label()));
    let out = run(Command::new(BIN)
        .args(["validate", "--repo"])
        .arg(&fleet.work)
        .arg("--trusted-keys")
        .arg(&fleet.trusted)
        .arg("--admission-policy")
        .arg(baseline(&fleet))
        .args(["--release", "rel-1"]));
    assert!(out.status.success(), "validate rel-1: {}", text(&out));

    // With only deploy/'s RBAC (the template operator's), the agent may write none of it: the
    // dry run says so before anything is applied, names the command that grants it, and the
    // pass after the grant applies the release.
    fleet.promote("rel-1");
    let settings = fleetgate::agent::AgentSettings { admission_policy: Some(baseline(&fleet)), ..fleet.settings() };
    let mut agent = fleet.agent_with(settings).await;
    let missing =
        within("rel-1 without its RBAC", 120, agent.reconcile()).await.expect_err("the agent lacks the rights");
    let missing = fleetgate::model::error_chain(&missing);
    assert!(
        missing.contains("may not write") && missing.contains("fleetgate agent rbac --release"),
        "RBAC missing, and what to run: {missing}"
    );
    eprintln!("[upstream {}] without its RBAC: {}", clock.1, missing.lines().take(3).collect::<Vec<_>>().join(" | "));
    let deployments: Api<Deployment> = Api::namespaced(fleet.cluster.client(), op.namespace);
    assert!(deployments.get_opt(op.deployment).await.unwrap().is_none(), "nothing was applied");
    grant(&fleet, "rel-1").await;
    clock.lap("validate; the agent refuses for want of RBAC; agent rbac applied (namespace first)");
    assert_eq!(within("install rel-1", 240, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    clock.lap(&format!("agent installs rel-1 ({}) as its ServiceAccount, bakes 5 s", op.older.label()));
    let older_manager = manager_image(&fleet, &op).await;
    assert!(older_manager.ends_with(&format!(":{}", op.older.version)), "{older_manager}");
    let crds = crd_names(&older_file);

    // A user's custom resource.
    let mut cr: DynamicObject = serde_saphyr::from_str(op.custom_resource).unwrap();
    let (group, version) = cr.types.as_ref().unwrap().api_version.split_once('/').unwrap();
    let ar = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: cr.types.as_ref().unwrap().api_version.clone(),
        kind: cr.types.as_ref().unwrap().kind.clone(),
        plural: op.plural.into(),
    };
    cr.metadata.namespace = Some(op.namespace.into());
    let crs: Api<DynamicObject> = Api::namespaced_with(fleet.cluster.client(), op.namespace, &ar);
    let name = cr.metadata.name.clone().unwrap();
    crs.create(&PostParams::default(), &cr).await.expect("the custom resource validates against the CRD");

    // The newer version: whatever CRD findings it really has are accepted with the printed flags.
    let mut out = release_create(&fleet, &op, &op.newer, "rel-2", &[]);
    if !out.status.success() {
        let accept = printed_acceptances(&text(&out));
        assert!(!accept.is_empty(), "release create rel-2 refused without a way forward: {}", text(&out));
        eprintln!("[upstream {}] rel-2's CRD findings, accepted: {accept:?}", clock.1);
        let flags: Vec<String> = accept.iter().flat_map(|a| ["--accept-crd-change".to_string(), a.clone()]).collect();
        out = release_create(&fleet, &op, &op.newer, "rel-2", &flags);
    }
    assert!(out.status.success(), "release create rel-2 ({}): {}", op.newer.label(), text(&out));
    assert!(text(&out).contains("rel-1"), "the CRD baseline is the last-known-good rel-1: {}", text(&out));
    grant(&fleet, "rel-2").await;
    clock.lap(&format!("release create rel-2 ({}); agent rbac", op.newer.label()));
    fleet.promote("rel-2");
    assert_eq!(within("upgrade to rel-2", 240, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-2".into()));
    clock.lap(&format!("agent upgrades to rel-2 ({})", op.newer.label()));
    let newer_manager = manager_image(&fleet, &op).await;
    assert!(newer_manager.ends_with(&format!(":{}", op.newer.version)), "{newer_manager}");
    let upgraded = live_crds(&fleet, &crds).await;

    // Back through Git, as people do it.
    let out = run(Command::new(BIN)
        .args(["rollback", "--cluster", CLUSTER, "--reason", "the upgrade misbehaves", "--push", "--repo"])
        .arg(&fleet.work));
    assert!(out.status.success(), "fleetgate rollback: {}", text(&out));
    assert_eq!(within("roll back to rel-1", 240, agent.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));
    clock.lap("fleetgate rollback --push; the agent returns to rel-1");
    assert_eq!(manager_image(&fleet, &op).await, older_manager, "the older manager runs again");
    // No CRD is narrowed under the data the newer version may have stored: from the upgraded
    // CRDs to what stays, fleetgate's own compatibility check finds nothing that breaks.
    let after = live_crds(&fleet, &crds).await;
    let narrowed = crd_compat::check_all(&upgraded, &after);
    assert!(narrowed.is_empty(), "narrowed on the way back: {narrowed:#?}");
    let kept = upgraded.iter().zip(&after).filter(|(u, a)| u.spec == a.spec).count();
    eprintln!("[upstream {}] {kept} of {} CRDs kept as the newer version has them", clock.1, crds.len());
    crs.get(&name).await.expect("the custom resource survives upgrade and rollback");
    let commit = fleet.git(&["rev-parse", "rel-1^{commit}"]);
    let status = fleet.statuses(&commit).pop().expect("a status of rel-1");
    assert_eq!(status.state, State::Success, "{}", status.description);
    assert!(status.description.contains("rolled back from rel-2"), "{}", status.description);
    eprintln!("[upstream {}] rel-1's status: {}", clock.1, status.description);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argo_cd_as_published_installs_without_namespaces_upgrades_and_rolls_back_through_git() {
    release_install_upgrade_and_roll_back(
        "upstream-argo",
        Operator {
            older: Upstream::argo_cd("v3.5.8"),
            newer: Upstream::argo_cd("v3.6.2"),
            name: "argocd",
            namespace: "argocd",
            manager: "quay.io/argoproj/argocd",
            crd_version: "v1alpha1",
            deployment: "argocd-server",
            custom_resource: "apiVersion: argoproj.io/v1alpha1\nkind: AppProject\nmetadata: {name: team-a}\n\
                              spec:\n  description: Team A\n  sourceRepos: ['*']\n  \
                              destinations: [{namespace: team-a, server: 'https://kubernetes.default.svc'}]\n",
            plural: "appprojects",
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_operator_bundle_with_ten_large_crds_upgrades_and_rolls_back_through_git() {
    release_install_upgrade_and_roll_back(
        "upstream-prom",
        Operator {
            older: Upstream::prometheus_operator("v0.84.0"),
            newer: Upstream::prometheus_operator("v0.85.0"),
            name: "prometheus-operator",
            namespace: "default",
            manager: "quay.io/prometheus-operator/prometheus-operator",
            crd_version: "v1",
            deployment: "prometheus-operator",
            custom_resource: "apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nmetadata: {name: web}\n\
                              spec:\n  selector: {matchLabels: {app: web}}\n  podMetricsEndpoints: [{port: metrics}]\n",
            plural: "podmonitors",
        },
    )
    .await;
}
