//! Variants of one release against real components: three test clusters (etcd + kube-apiserver,
//! deploy/ applied, each agent running as deploy/'s ServiceAccount), the fleet repo on a
//! `git daemon`, one release cut with the real `fleetgate release create --variant` and signed
//! with a throw-away GnuPG key.
//!
//! * one release with two variants — `eu` (its own registry, 2 replicas) for agents labelled
//!   `region=eu`, `us` (another registry, 1 replica) the default: each cluster runs the variant
//!   its agent's labels select (the live Deployment's image and replicas say so), the waves
//!   open in order across variants, and `fleetgate status` shows both variants;
//! * the unsigned branch relabels a cluster in `clusters/` to give it the other variant: the
//!   cluster keeps the variant its own agent's labels select, and `fleetgate diff --label`
//!   selects as the agent does;
//! * a cluster no variant fits (no default) refuses the release before applying anything, with an
//!   `error` status naming its facts and every selector;
//! * a variant that fails its gates rolls back to the previous release in the variant the
//!   cluster runs.

use crate::agent_support;

use agent_support::*;
use fleetgate::agent::{Agent, AgentSettings, Outcome};
use fleetgate::status::{Matrix, State};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use std::path::Path;
use std::process::Command;

const EU_REGISTRY: &str = "eu.registry.example.com/redis-operator";
const US_REGISTRY: &str = "us.registry.example.com/redis-operator";

async fn pass(agent: &mut Agent, what: &str) -> Outcome {
    within(what, 120, agent.reconcile()).await.unwrap()
}

/// `settings` with the agent's own labels `region=REGION`: what the spoke says it is.
fn in_region(settings: AgentSettings, region: &str) -> AgentSettings {
    AgentSettings { labels: vec![format!("region={region}").parse().unwrap()], ..settings }
}

/// The rendered base copied to `to` with the Operator's image from `registry` and `replicas`.
fn render_variant(base: &Path, to: &Path, registry: &str, id: &str, replicas: u32) {
    copy_dir(base, to);
    let deployment = to.join("deployment.yaml");
    let text = std::fs::read_to_string(&deployment).unwrap();
    assert!(text.contains("  replicas: 2\n"), "the template's Deployment sets replicas: 2");
    let text = text
        .replace(&image_of(id), &format!("{registry}:v-{id}"))
        .replace("  replicas: 2\n", &format!("  replicas: {replicas}\n"));
    std::fs::write(&deployment, text).unwrap();
}

/// Cuts `id` with variants `eu` (selected by the agent label `region=eu`: [`EU_REGISTRY`], 2
/// replicas) and `us` (the default: [`US_REGISTRY`], 1 replica), and promotes it fleet-wide.
/// Returns the tagged commit.
fn release_with_variants(fleet: &Fleet, id: &str) -> String {
    release_with_variants_edited(fleet, id, |_| {})
}

/// [`release_with_variants`] after `edit` changed the eu variant's rendering (its folder).
fn release_with_variants_edited(fleet: &Fleet, id: &str, edit: impl FnOnce(&Path)) -> String {
    let (eu, us) =
        (fleet.dir.path().join(format!("variant-eu-{id}")), fleet.dir.path().join(format!("variant-us-{id}")));
    let eu_arg = format!("eu={}", eu.display());
    let us_arg = format!("us={}", us.display());
    let eu_image = format!("eu={EU_REGISTRY}:v-{id}");
    let us_image = format!("us={US_REGISTRY}:v-{id}");
    let args = [
        "--variant",
        &eu_arg,
        "--variant-selector",
        "eu={matchLabels: {region: eu}}",
        "--variant-image",
        &eu_image,
        "--variant",
        &us_arg,
        "--variant-image",
        &us_image,
    ];
    let commit = fleet.release_with(&args, id, |render| {
        render_variant(render, &eu, EU_REGISTRY, id, 2);
        render_variant(render, &us, US_REGISTRY, id, 1);
        edit(&eu);
    });
    fleet.promote(id);
    commit
}

/// The Operator Deployment of a cluster: its image and replicas.
async fn operator_deployment(client: kube::Client) -> (String, i32) {
    let api: Api<Deployment> = Api::namespaced(client, OPERATOR_NS);
    let d = within("read the Operator Deployment", 30, api.get("redis-operator")).await.unwrap();
    let spec = d.spec.unwrap();
    let image = spec.template.spec.unwrap().containers[0].image.clone().unwrap();
    (image, spec.replicas.unwrap_or(1))
}

/// Each cluster's latest state and variant for `release` in `fleetgate status -o json`.
fn cells(view: &Matrix, release: &str) -> Vec<(String, Option<State>, Option<String>)> {
    let column = view.releases.iter().position(|r| r.id == release).expect("the release's column");
    let mut out: Vec<_> = view
        .waves
        .iter()
        .flat_map(|w| &w.clusters)
        .map(|c| {
            let cell = &c.cells[column];
            (c.name.clone(), cell.state, cell.status.as_ref().and_then(|s| s.variant.clone()))
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_cluster_runs_the_variant_its_own_labels_select_and_the_waves_hold_across_variants() {
    let fleet = Fleet::start("variants-a", false).await;
    let (b_spoke, b_settings) = fleet.spoke("variants-b", "cluster-b").await;
    let (c_spoke, c_settings) = fleet.spoke("variants-c", "cluster-c").await;
    let commit = release_with_variants(&fleet, "rel-1");

    let mut a = fleet.agent_with(in_region(fleet.settings(), "eu")).await;
    let mut b = fleet.agent_with(in_region(b_settings, "us")).await;
    let mut c = fleet.agent_with(in_region(c_settings, "eu")).await;

    // wave-1 (cluster-b, us) waits for the canary (cluster-a, eu): one release, one gate.
    assert_eq!(
        pass(&mut b, "cluster-b before the canary").await,
        Outcome::Waiting { release: "rel-1".into(), reason: "waiting for wave canary: cluster-a no status yet".into() }
    );
    assert_eq!(pass(&mut a, "cluster-a rel-1").await, Outcome::Succeeded("rel-1".into()));
    assert_eq!(operator_deployment(fleet.cluster.client()).await, (format!("{EU_REGISTRY}:v-rel-1"), 2));

    // wave-2 (cluster-c, eu) waits for wave-1, whose cluster runs the other variant.
    assert_eq!(
        pass(&mut c, "cluster-c before wave-1").await,
        Outcome::Waiting { release: "rel-1".into(), reason: "waiting for wave wave-1: cluster-b no status yet".into() }
    );
    assert_eq!(pass(&mut b, "cluster-b rel-1").await, Outcome::Succeeded("rel-1".into()));
    assert_eq!(operator_deployment(b_spoke.client()).await, (format!("{US_REGISTRY}:v-rel-1"), 1));
    // cluster-a's eu success and cluster-b's us success open wave-2 alike.
    assert_eq!(pass(&mut c, "cluster-c rel-1").await, Outcome::Succeeded("rel-1".into()));
    assert_eq!(operator_deployment(c_spoke.client()).await, (format!("{EU_REGISTRY}:v-rel-1"), 2));

    // The signed statuses say which variant each cluster ran; the fleet view shows both.
    let last = fleet.statuses_of("cluster-b", &commit).pop().unwrap();
    assert_eq!((last.state, last.variant.as_deref()), (State::Success, Some("us")));
    let success = |name: &str, variant: &str| (name.to_string(), Some(State::Success), Some(variant.to_string()));
    assert_eq!(
        cells(&fleet.status_json("rel-1"), "rel-1"),
        [success("cluster-a", "eu"), success("cluster-b", "us"), success("cluster-c", "eu")]
    );
    let out = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["status", "rel-1", "--repo", &fleet.url])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("variant us: all gates passed") && text.contains("variant eu: all gates passed"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relabelling_a_cluster_on_the_unsigned_branch_does_not_give_it_another_variant() {
    let fleet = Fleet::start("variants-relabel", false).await;
    // The push: cluster-a's labels in clusters/ now say what the eu variant selects. It is even
    // carried into the signed release's tree, since the release is cut on top of it.
    fleet.edit("clusters/cluster-a.yaml", "    region: eu-west-1\n", "    region: eu\n");
    fleet.commit_and_push("cluster-a is in eu now");
    let commit = release_with_variants(&fleet, "rel-1");

    // The spoke's own configuration says us.
    let mut a = fleet.agent_with(in_region(fleet.settings(), "us")).await;
    assert_eq!(pass(&mut a, "cluster-a rel-1").await, Outcome::Succeeded("rel-1".into()));
    assert_eq!(operator_deployment(fleet.cluster.client()).await, (format!("{US_REGISTRY}:v-rel-1"), 1));
    let last = fleet.statuses(&commit).pop().unwrap();
    assert_eq!((last.state, last.variant.as_deref()), (State::Success, Some("us")));

    // Relabelled again on the tip, after the release: the next passes keep the us variant
    // (drift correction compares the live objects with the us rendering: nothing to change).
    fleet.edit("clusters/cluster-a.yaml", "    region: eu\n", "    region: eu\n    tier: gold\n");
    fleet.commit_and_push("cluster-a, again");
    assert_eq!(pass(&mut a, "cluster-a after the relabel").await, Outcome::UpToDate);
    assert_eq!(operator_deployment(fleet.cluster.client()).await, (format!("{US_REGISTRY}:v-rel-1"), 1));

    // `fleetgate diff` selects as the agent does: with the agent's labels, no drift; with the
    // labels the branch claims, the eu rendering, which is not what runs.
    let diff = |region: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
            .args(["diff", "--repo", &fleet.url, "--cluster", CLUSTER, "--label", &format!("region={region}")])
            .arg("--kubeconfig")
            .arg(fleet.cluster.kubeconfig_path())
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, text) = diff("us");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.starts_with("cluster cluster-a: desired release rel-1, variant us ("), "{text}");
    let (code, text) = diff("eu");
    assert_eq!(code, Some(1), "{text}");
    let wanted = format!("image: {EU_REGISTRY}:v-rel-1");
    assert!(text.contains("variant eu") && text.lines().any(|l| l.starts_with('-') && l.ends_with(&wanted)), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_no_variant_fits_refuses_the_release_naming_its_facts_and_the_selectors() {
    let fleet = Fleet::start("variants-none", false).await;
    // Only an eu variant, and no default.
    let eu = fleet.dir.path().join("variant-eu-only");
    let (eu_arg, eu_image) = (format!("eu={}", eu.display()), format!("eu={EU_REGISTRY}:v-rel-1"));
    let args =
        ["--variant", &eu_arg, "--variant-selector", "eu={matchLabels: {region: eu}}", "--variant-image", &eu_image];
    let commit = fleet.release_with(&args, "rel-1", |render| render_variant(render, &eu, EU_REGISTRY, "rel-1", 2));
    fleet.promote("rel-1");

    let mut a = fleet.agent_with(in_region(fleet.settings(), "ap")).await;
    let reason = match pass(&mut a, "cluster-a rel-1").await {
        Outcome::Refused { release, reason } if release == "rel-1" => reason,
        other => panic!("expected rel-1 refused, got {other:?}"),
    };
    for said in [
        "no variant fits this cluster (Kubernetes v1.",
        "agent labels {region=ap}",
        "the variants select: eu: region=eu",
    ] {
        assert!(reason.contains(said), "{said}: {reason}");
    }
    let last = fleet.statuses(&commit).pop().unwrap();
    assert_eq!(last.state, State::Error);
    assert!(
        last.description.starts_with("refused, nothing applied: release rel-1 has no variant for this cluster: "),
        "{}",
        last.description
    );
    assert_eq!(fleet.operator_image().await, None, "nothing was applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_variant_that_fails_its_gates_rolls_back_to_the_previous_release_in_the_same_variant() {
    let fleet = Fleet::start("variants-rollback", true).await;
    fleet.set_gates("20s", STRICT_RESTARTS);
    release_with_variants(&fleet, "rel-1");
    let mut a = fleet.agent_with(in_region(fleet.settings(), "eu")).await;
    assert_eq!(within("rel-1", 120, a.reconcile()).await.unwrap(), Outcome::Succeeded("rel-1".into()));

    // rel-2's eu variant crash-loops (its us variant would not): the eu cluster fails its gate and
    // goes back to rel-1, from the last-known-good store, in the variant its facts select there.
    let rel2 = release_with_variants_edited(&fleet, "rel-2", crash_looping);
    assert_eq!(
        within("rel-2", 240, a.reconcile()).await.unwrap(),
        Outcome::RolledBack { release: "rel-2".into(), to: Some("rel-1".into()) }
    );
    assert_eq!(operator_deployment(fleet.cluster.client()).await, (format!("{EU_REGISTRY}:v-rel-1"), 2));
    let failure = fleet.statuses(&rel2).pop().unwrap();
    assert_eq!(
        (failure.state, failure.rollback_to.as_deref(), failure.variant.as_deref()),
        (State::Failure, Some("rel-1"), Some("eu"))
    );
    assert!(failure.description.starts_with("rolled back to rel-1: pod-restarts"), "{}", failure.description);
}
