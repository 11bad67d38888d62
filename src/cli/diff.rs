//! `fleetgate diff --repo PATH|URL --cluster NAME`: live objects of a cluster against the release
//! Git says it should run, as unified diffs over the fields the release sets (server defaults,
//! status and bookkeeping fields never show). A release with variants is compared in the variant
//! the cluster's live facts and its agent's labels (`--label`) select, as the agent selects it.
//!
//! Exit 0 no drift, 1 drift (an object differs or is missing), 2 usage, repository or cluster
//! error. Changes nothing; the agent (or `fleetgate agent`'s next apply) corrects drift.

use super::args::{GitAccess, KubeArgs};
use super::output::{OutputFormat, colours};
use crate::agent::config::{DEFAULT_STATE_NAMESPACE, Label};
use crate::apply::{ApplyOptions, DriftInput, DriftInputError, DriftRelease, DriftReport, DriftState, Engine};
use crate::gates::read_cluster_facts;
use crate::model::Finding;
use crate::release::{Keyring, ReleaseFiles};
use crate::source::open_repo;
use anyhow::Context;
use owo_colors::OwoColorize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Timeout of each call that reads the cluster's facts (server version, nodes).
const FACTS_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The fleet repo: a local path or a Git URL (file://, git://, ssh://, https://).
    #[arg(long, env = "FLEETGATE_REPO")]
    pub repo: String,
    /// The cluster's name in the fleet repo (clusters/<NAME>.yaml).
    #[arg(long, value_name = "NAME")]
    pub cluster: String,
    /// Compare with this release instead of the one the branch tip asks for.
    #[arg(long, value_name = "ID")]
    pub release: Option<String>,
    /// Branch whose tip says which release the cluster should run. Default: what HEAD points
    /// to in a local repo, `main` for a URL.
    #[arg(long)]
    pub branch: Option<String>,
    /// The global `--kubeconfig` / `--context` (set by [`super::run`]).
    #[arg(skip)]
    pub kube: KubeArgs,
    /// Namespace of the agent (its inventory says which release was last applied).
    #[arg(short = 'n', long, default_value = DEFAULT_STATE_NAMESPACE)]
    pub namespace: String,
    /// A label of the cluster's agent, KEY=VALUE (repeatable; its `--label`s): with the cluster's
    /// live facts it selects the variant of a release that has variants, as the agent does.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<Label>,
    /// Armored public key of a trusted release signer (repeatable). With it the release tag's
    /// signature is verified first; without it the tag's content is compared as it is.
    #[arg(long = "trusted-keys", value_name = "FILE")]
    pub trusted_keys: Vec<PathBuf>,
    #[command(flatten)]
    pub git: GitAccess,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let trust = Keyring::from_key_files(&args.trusted_keys).context("loading --trusted-keys")?;
    let credentials = args.git.credentials()?;
    let (repo, branch, cluster, release) =
        (args.repo.clone(), args.branch.clone(), args.cluster.clone(), args.release.clone());
    let labels: BTreeMap<String, String> = args.labels.into_iter().map(|l| (l.key, l.value)).collect();
    // git2 and gpgme block; keep them off the async runtime.
    let mut desired = tokio::task::spawn_blocking(move || -> anyhow::Result<DriftInput> {
        let opened = open_repo(&repo, branch.as_deref(), credentials)?;
        let read = DriftInput::read(opened.checkout(), &cluster, release.as_deref(), trust.as_ref());
        // Problems of a release read unchecked are shown; only an unreadable release.yaml stops
        // the comparison.
        match &read {
            Ok(DriftInput { release: DriftRelease::Unverified { release, findings }, .. }) => {
                warn(release.id(), findings)
            }
            Err(DriftInputError::NoRelease { id, findings }) => warn(id, findings),
            _ => {}
        }
        Ok(read?)
    })
    .await??;

    let client =
        args.kube.access().client().await.context("connecting to the cluster (check --kubeconfig and --context)")?;
    // A release with variants: the one this cluster's facts and its agent's labels select.
    let variant = if desired.release.has_variants() {
        let facts = read_cluster_facts(&client, FACTS_TIMEOUT).await.context("reading the cluster's facts")?;
        let (release, variant) = desired
            .release
            .for_cluster(&facts, &labels)
            .context("choosing the release's variant (pass the cluster's agent labels with --label KEY=VALUE)")?;
        desired.release = release;
        variant
    } else {
        None
    };
    let engine = Engine::new(client, ApplyOptions::for_cluster(&args.namespace, &args.cluster));
    let report = engine.drift(desired.release.files()).await.context("comparing the release with the cluster")?;
    let applied = engine.inventory().await.context("reading the agent's inventory")?.map(|i| i.release);

    if !args.output.print_machine(&report)? {
        print_human(&args.cluster, &desired, variant.as_deref(), applied.as_deref(), &report);
    }
    Ok(if report.has_drift() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn warn(id: &str, findings: &[Finding]) {
    for f in findings {
        eprintln!("warning: release {id}: {f}");
    }
}

fn print_human(
    cluster: &str,
    desired: &DriftInput,
    variant: Option<&str>,
    applied: Option<&str>,
    report: &DriftReport,
) {
    let id = desired.release.files().id();
    let trust =
        if desired.release.is_verified() { "signature verified" } else { "signature not checked: pass --trusted-keys" };
    let variant = variant.map(|v| format!(", variant {v}")).unwrap_or_default();
    println!("cluster {cluster}: desired release {id}{variant} ({trust})");
    match applied {
        Some(a) if a != id => println!("the agent last applied {a}, not {id}"),
        Some(_) => {}
        None => println!("the agent has not applied any release here yet"),
    }
    let colour = colours();
    for o in report.drifted() {
        match &o.state {
            DriftState::Missing => {
                let line = format!("missing: {}", o.object);
                println!("{}", if colour { line.red().to_string() } else { line });
            }
            DriftState::Drifted { diff } => {
                for line in diff.lines() {
                    let painted = match line.chars().next() {
                        _ if !colour => line.to_string(),
                        Some('+') => line.green().to_string(),
                        Some('-') => line.red().to_string(),
                        Some('@') => line.cyan().to_string(),
                        _ => line.to_string(),
                    };
                    println!("{painted}");
                }
            }
            DriftState::InSync => {}
        }
    }
    let drifted = report.drifted().count();
    if drifted == 0 {
        println!("no drift: {} objects match release {id}", report.objects.len());
    } else {
        println!("{drifted} of {} objects drifted from release {id}", report.objects.len());
    }
}
