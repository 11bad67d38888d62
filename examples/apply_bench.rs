//! fleetgate's apply engine against Flux's (`fluxcd/pkg/ssa`, run by `bench/ssa` as
//! kustomize-controller runs it), on ONE real kube-apiserver + etcd from fleetgate-testenv, the
//! engines alternating case by case (which goes first flips every round, so both meet the same
//! machine load).
//!
//! ```text
//! cargo run --release --example apply_bench [-- ROUNDS]      # default 3 rounds; `make bench`
//! ```
//!
//! Cases: 200 ConfigMaps (and their Namespace) created, applied again unchanged, 10 % of them
//! changed, then 50 of them dropped and pruned; the real-shaped operator of
//! `testenv/src/operator_fixture.rs` (ten CRDs of 0.3–1 MB, rendered by the real helm) installed
//! and upgraded to its next chart ([`SETTLE_SECS`] after the install, as a bake would separate
//! them). Each engine gets its own namespaces and inventory; the
//! operator's CRDs are cluster-wide, so they are deleted between the two engines' operator runs.
//!
//! fleetgate's figure is what the agent does for a release: `admit` (discovery, parse, admission
//! policy, inventory read), a `snapshot_before` the release when one was applied before (what
//! the release changes of the previous one), `apply` (objects it would not change left alone,
//! server-side dry run of the rest, adoption check, inventory, phases, release-manifest) and
//! `prune` where the case drops objects; each step is also shown on its own, with its requests. Flux's is
//! kustomize-controller's reconcile minus its own status write: owner labels, `ApplyAllStaged`
//! (which waits for CRDs and Namespaces with `WaitForSet`), inventory diff and `DeleteAll`.
//! Neither engine waits for workloads to roll out (kustomize-controller's `wait: false` default;
//! fleetgate's bake gates do that). Requests are counted on each engine's client: a transport
//! wrapper in Go, a tower layer on fleetgate's kube client — every HTTP request each one sends.

use fleetgate::apply::{ApplyOptions, Engine};
use fleetgate::manifests::admission::AdmissionPolicy;
use fleetgate::model::{Document, ImageRef, RbacGrant, ReleaseAdmissionPolicySpec, ReleaseSpec};
use fleetgate::release::VerifiedRelease;
use fleetgate::releng::chart::{ChartInput, RenderTarget};
use fleetgate_testenv::operator_fixture::{CoreSchemas, CrdGeneration, FixtureChart, FixtureImages, KINDS};
use fleetgate_testenv::{ClusterOptions, TestCluster};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, PostParams};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

const CONFIGMAPS: usize = 200;

/// A manifest set: file name → YAML.
type Files = BTreeMap<String, Vec<u8>>;

/// The Namespace and `n` ConfigMaps; those with `i % 10 == 0` get another payload when `changed`,
/// those with `i >= keep` are left out.
fn configmaps(namespace: &str, changed: bool, keep: usize) -> Files {
    let mut text = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n");
    for i in 0..keep {
        let payload = if changed && i % 10 == 0 { "y" } else { "x" }.repeat(256);
        text.push_str(&format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-{i:04}\n  namespace: {namespace}\n\
             data:\n  index: \"{i}\"\n  payload: {payload}\n"
        ));
    }
    BTreeMap::from([("objects.yaml".to_string(), text.into_bytes())])
}

fn release(id: &str, files: &Files) -> VerifiedRelease {
    let spec = ReleaseSpec {
        fleet: Some("bench-fleet".into()),
        sequence: Some(1),
        revokes: Vec::new(),
        git_commit: "bench".into(),
        image: ImageRef { repository: "example/bench".into(), tag: "v1".into(), digest: None },
        images: Vec::new(),
        chart_version: "1.0.0".into(),
        chart: None,
        crd_version: "v1".into(),
        crds: Vec::new(),
        accept_crd_changes: Vec::new(),
        target_clusters: vec!["bench".into()],
        rollback_to: None,
        requires: None,
        manifests: "operator/".into(),
        namespace: None,
        deploy_timestamp: None,
        variants: Vec::new(),
    };
    let files = files.iter().map(|(name, text)| (format!("operator/{name}"), text.clone())).collect();
    VerifiedRelease::assume_verified(Document::new("Release", id, spec), "bench", files)
}

/// One run's figures.
#[derive(Debug, Clone, Default)]
struct Run {
    ms: f64,
    requests: u64,
    /// fleetgate only: (step, ms, requests) in order.
    steps: Vec<(&'static str, f64, u64)>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// fleetgate's engine on a client whose requests are counted.
struct Fleetgate {
    client: kube::Client,
    requests: Arc<AtomicU64>,
    policy: AdmissionPolicy,
}

impl Fleetgate {
    async fn new(kubeconfig: &Path) -> anyhow::Result<Fleetgate> {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        let requests = Arc::new(AtomicU64::new(0));
        let count = requests.clone();
        let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
            count.fetch_add(1, Ordering::Relaxed);
            req
        });
        let client = kube::client::ClientBuilder::try_from(config)?.with_layer(&layer).build();
        let policy = AdmissionPolicy::baseline(ReleaseAdmissionPolicySpec {
            allowed_namespaces: Some(vec!["bench-*".into()]),
            allowed_cluster_scoped_kinds: Some(vec![
                "CustomResourceDefinition.apiextensions.k8s.io".into(),
                "ClusterRole.rbac.authorization.k8s.io".into(),
                "ClusterRoleBinding.rbac.authorization.k8s.io".into(),
                "ValidatingWebhookConfiguration.admissionregistration.k8s.io".into(),
                "MutatingWebhookConfiguration.admissionregistration.k8s.io".into(),
            ]),
            // The fixture's manager creates Deployments and Pods cluster-wide, as real operators'
            // managers do: what their fleet's policy lists (the hint the refusal prints).
            allowed_rbac: vec![RbacGrant::ClusterPods],
            ..Default::default()
        });
        Ok(Fleetgate { client, requests, policy })
    }

    fn engine(&self, inventory: &str) -> Engine {
        let mut options = ApplyOptions::new("fleetgate-system");
        options.inventory = inventory.into();
        Engine::new(self.client.clone(), options)
    }

    /// What the agent does for one release: admit, snapshot (when `snapshot`), apply, prune
    /// (when `prune`).
    async fn run(&self, engine: &Engine, rel: &VerifiedRelease, snapshot: bool, prune: bool) -> anyhow::Result<Run> {
        let before = self.requests.load(Ordering::Relaxed);
        let start = Instant::now();
        let mut steps = Vec::new();
        let (mut step, mut step_requests) = (Instant::now(), before);
        let mut lap = |name: &'static str, steps: &mut Vec<(&'static str, f64, u64)>| {
            let now = self.requests.load(Ordering::Relaxed);
            steps.push((name, ms(step.elapsed()), now - step_requests));
            (step, step_requests) = (Instant::now(), now);
        };
        let admitted = engine.admit(rel, &self.policy).await?;
        lap("admit", &mut steps);
        if snapshot {
            engine.snapshot_before(&admitted).await?;
            lap("snapshot", &mut steps);
        }
        engine.apply(admitted).await?;
        lap("apply", &mut steps);
        if prune {
            engine.prune().await?;
            lap("prune", &mut steps);
        }
        Ok(Run { ms: ms(start.elapsed()), requests: self.requests.load(Ordering::Relaxed) - before, steps })
    }
}

/// The long-lived `flux-ssa-bench` process (warm client and REST mapper, like a controller).
struct Flux {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Flux {
    fn start(kubeconfig: &Path) -> anyhow::Result<Flux> {
        let bin = fleetgate_testenv::flux_ssa_bench_binary()?;
        let mut child = tokio::process::Command::new(bin)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        Ok(Flux { _child: child, stdin, stdout })
    }

    async fn run(&mut self, dir: &Path) -> anyhow::Result<Run> {
        self.stdin.write_all(format!("apply {}\n", dir.display()).as_bytes()).await?;
        let line = self.stdout.next_line().await?.ok_or_else(|| anyhow::anyhow!("flux-ssa-bench exited"))?;
        let v: serde_json::Value = serde_json::from_str(&line)?;
        if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
            anyhow::bail!("flux-ssa-bench: {e}");
        }
        Ok(Run {
            ms: v["ms"].as_f64().unwrap_or_default(),
            requests: v["requests"].as_u64().unwrap_or_default(),
            steps: Vec::new(),
        })
    }
}

/// Writes `files` into a fresh directory for flux-ssa-bench (flat: it reads `DIR/*.yaml`).
fn flux_dir(root: &Path, name: &str, files: &Files) -> anyhow::Result<PathBuf> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)?;
    for (file, text) in files {
        std::fs::write(dir.join(file.replace('/', "_")), text)?;
    }
    Ok(dir)
}

/// The fixture operator rendered by helm as release `name` into namespace `namespace`.
fn render(chart: &Path, name: &str, namespace: &str) -> anyhow::Result<Files> {
    let helm = fleetgate_testenv::operator_fixture::helm_binary()?;
    let input = ChartInput { chart: chart.to_path_buf(), values: Vec::new(), set: Vec::new() };
    let target = RenderTarget { release_name: name.into(), namespace: namespace.into(), kube_version: None };
    Ok(fleetgate::releng::chart::render(&helm, &input, &target)?.files)
}

/// Deletes the fixture's CRDs and waits until they are gone.
async fn delete_crds(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for k in KINDS {
        let _ = api.delete(&k.crd_name(), &DeleteParams::default()).await;
    }
    for k in KINDS {
        while api.get_opt(&k.crd_name()).await?.is_some() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

/// Between a release and the next one an agent bakes for minutes; the bench waits this long
/// between the operator's install and its upgrade, for both engines, so the upgrade does not
/// measure the API server still starting to serve ten new CRDs.
const SETTLE_SECS: u64 = 10;

/// What the installed operator's informers do while its release bakes, for both engines: a first
/// LIST of each of its kinds. kube-apiserver builds a CRD's serving storage (structural schemas,
/// validators of every version) on the first request for one of its resources, about a second
/// for these ~1 MB CRDs; in a cluster the running operator made that request long before the
/// next release's snapshot lists its custom resources. Without it the bench would charge that
/// second to fleetgate's snapshot (the only LIST of those kinds here; Flux makes none).
async fn operator_informers_start(client: &kube::Client) -> anyhow::Result<()> {
    for k in KINDS {
        let versions = k.versions(CrdGeneration::Initial);
        let (version, _) = versions.iter().find(|(_, storage)| *storage).expect("a storage version");
        let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(k.group, version, k.kind), k.plural);
        Api::<DynamicObject>::all_with(client.clone(), &ar).list(&ListParams::default().limit(1)).await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rounds: usize = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(3);
    let cluster = TestCluster::start(ClusterOptions::new("apply-bench")).await?;
    let admin = cluster.client();
    let agent_ns = Namespace {
        metadata: ObjectMeta { name: Some("fleetgate-system".into()), ..Default::default() },
        ..Default::default()
    };
    Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &agent_ns).await?;
    let fg = Fleetgate::new(cluster.kubeconfig_path()).await?;
    let mut flux = Flux::start(cluster.kubeconfig_path())?;

    let work = tempfile::tempdir()?;
    let core = CoreSchemas::fetch(&admin).await?;
    let images = |t: &str| FixtureImages { manager_tag: t.into(), proxy_tag: t.into(), webhook_tag: t.into() };
    let charts = [("1.0.0", CrdGeneration::Initial, "v1.0.0"), ("1.1.0", CrdGeneration::Upgraded, "v1.1.0")].map(
        |(version, generation, tag)| {
            let dir = work.path().join(format!("chart-{version}"));
            FixtureChart { version: version.into(), generation, images: images(tag) }.write(&dir, &core).map(|_| dir)
        },
    );
    let charts: Vec<PathBuf> = charts.into_iter().collect::<anyhow::Result<_>>()?;

    // case → (fleetgate runs, flux runs)
    const CASES: [&str; 6] = [
        "200 ConfigMaps: create",
        "200 ConfigMaps: no-op",
        "200 ConfigMaps: 10 % changed",
        "prune 50 of them",
        "operator: install",
        "operator: upgrade",
    ];
    let mut results: Vec<(Vec<Run>, Vec<Run>)> = vec![Default::default(); CASES.len()];
    for r in 0..rounds {
        let fg_first = r % 2 == 0;
        // ConfigMaps: each engine its own namespace and inventory.
        let (fg_ns, flux_ns) = (format!("bench-fg-{r}"), format!("bench-flux-{r}"));
        let engine = fg.engine(&format!("bench-fg-{r}"));
        let variants = [(false, CONFIGMAPS), (false, CONFIGMAPS), (true, CONFIGMAPS), (true, CONFIGMAPS - 50)];
        for (case, (changed, keep)) in variants.into_iter().enumerate() {
            let id = ["rel-a", "rel-a", "rel-b", "rel-c"][case];
            let rel = release(id, &configmaps(&fg_ns, changed, keep));
            let dir = flux_dir(work.path(), &format!("{flux_ns}-{case}"), &configmaps(&flux_ns, changed, keep))?;
            let (snapshot, prune) = (case >= 2, case == 3);
            for turn in 0..2 {
                if (turn == 0) == fg_first {
                    results[case].0.push(fg.run(&engine, &rel, snapshot, prune).await?);
                } else {
                    results[case].1.push(flux.run(&dir).await?);
                }
            }
        }
        // The operator: install then upgrade, one engine after the other (they share the CRDs).
        for turn in 0..2 {
            let is_fg = (turn == 0) == fg_first;
            let who = if is_fg { "fg" } else { "flux" };
            let (name, ns) = (format!("fx-{who}-{r}"), format!("bench-fx-{who}-{r}"));
            let engine = fg.engine(&format!("bench-op-{r}"));
            for (step, chart) in charts.iter().enumerate() {
                if step == 1 {
                    operator_informers_start(&admin).await?;
                    tokio::time::sleep(std::time::Duration::from_secs(SETTLE_SECS)).await;
                }
                let files = render(chart, &name, &ns)?;
                let run = if is_fg {
                    let rel = release(&format!("rel-op-{step}"), &files);
                    fg.run(&engine, &rel, step == 1, false).await?
                } else {
                    flux.run(&flux_dir(work.path(), &format!("{name}-{step}"), &files)?).await?
                };
                let slot = &mut results[4 + step];
                if is_fg { slot.0.push(run) } else { slot.1.push(run) }
            }
            delete_crds(&admin).await?;
        }
    }

    println!(
        "apply: fleetgate's engine vs Flux's (fluxcd/pkg/ssa v0.78.0), one kube-apiserver, {rounds} rounds alternating, medians"
    );
    println!(
        "{:<30} {:>12} {:>10} {:>7} {:>9} {:>9}   fleetgate's steps (ms / requests)",
        "case", "fleetgate ms", "flux ms", "ratio", "fg req", "flux req"
    );
    for (case, (fgr, fxr)) in CASES.iter().zip(&results) {
        let f = median(fgr.iter().map(|r| r.ms).collect());
        let x = median(fxr.iter().map(|r| r.ms).collect());
        let fq = median(fgr.iter().map(|r| r.requests as f64).collect());
        let xq = median(fxr.iter().map(|r| r.requests as f64).collect());
        let steps: Vec<String> = fgr[0]
            .steps
            .iter()
            .enumerate()
            .map(|(i, (name, _, _))| {
                let ms = median(fgr.iter().map(|r| r.steps[i].1).collect());
                let requests = median(fgr.iter().map(|r| r.steps[i].2 as f64).collect());
                format!("{name} {ms:.0}/{requests:.0}")
            })
            .collect();
        println!("{case:<30} {f:>12.0} {x:>10.0} {:>7.2} {fq:>9.0} {xq:>9.0}   {}", f / x, steps.join(", "));
    }
    Ok(())
}
