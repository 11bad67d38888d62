//! `fleetgate reconcile --cluster C`: wake a cluster's agent now, as `flux reconcile` does. It
//! writes the request time into an annotation of the agent's state ConfigMap (which the agent
//! watches), waits until the agent says a pass that started after the request has finished (it
//! copies the value into a second annotation), and shows the agent's phase and releases then.
//! Needs `patch` and `get` on ConfigMaps in the agent's namespace — the on-call engineer's rights,
//! not the agent's.

use super::args::KubeArgs;
use super::output::{OutputFormat, heading, next};
use crate::agent::config::DEFAULT_STATE_NAMESPACE;
use crate::agent::state::{RECONCILE_HANDLED_ANNOTATION, RECONCILE_REQUEST_ANNOTATION, StateStore};
use anyhow::{Context as _, anyhow};
use chrono::{SecondsFormat, Utc};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The cluster's name in the fleet repo; its agent keeps its state in fleetgate-state-<NAME>.
    #[arg(long, value_name = "NAME")]
    pub cluster: String,
    /// Namespace of the agent's state ConfigMap.
    #[arg(short = 'n', long, default_value = DEFAULT_STATE_NAMESPACE)]
    pub namespace: String,
    /// Return once the request is written, without waiting for the agent.
    #[arg(long)]
    pub no_wait: bool,
    /// How long to wait for the agent to finish a pass.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// The global `--kubeconfig` / `--context` (set by [`super::run`]).
    #[arg(skip)]
    pub kube: KubeArgs,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// What `-o json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    cluster: String,
    requested_at: String,
    /// Whether the agent finished a pass after the request (always false with `--no-wait`).
    handled: bool,
    waited_ms: u64,
    phase: Option<String>,
    current: Option<String>,
    desired: Option<String>,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let client =
        args.kube.access().client().await.context("connecting to the cluster (check --kubeconfig and --context)")?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let name = format!("fleetgate-state-{}", args.cluster);
    let requested = Utc::now().to_rfc3339_opts(SecondsFormat::Nanos, true);
    let patch = serde_json::json!({"metadata": {"annotations": {RECONCILE_REQUEST_ANNOTATION: requested}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 404 => anyhow!(
            "no ConfigMap {name} in namespace {}: no agent for cluster {} has run there (check --cluster, -n and --context)",
            args.namespace,
            args.cluster
        ),
        e => anyhow!(e).context(format!("annotating ConfigMap {}/{name} (patch on configmaps needed)", args.namespace)),
    })?;

    let started = Instant::now();
    let mut handled = false;
    if !args.no_wait {
        if args.output == OutputFormat::Table {
            eprintln!(
                "waiting for the agent of {} (up to {})…",
                args.cluster,
                humantime::format_duration(args.timeout)
            );
        }
        while started.elapsed() < args.timeout {
            let cm = api.get(&name).await.with_context(|| format!("reading ConfigMap {}/{name}", args.namespace))?;
            let annotations = cm.metadata.annotations.unwrap_or_default();
            if annotations.get(RECONCILE_HANDLED_ANNOTATION) == Some(&requested) {
                handled = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let state = StateStore::new(client, &args.namespace, &args.cluster).peek().await?.map(|p| p.state);
    let report = Report {
        cluster: args.cluster.clone(),
        requested_at: requested,
        handled,
        waited_ms: started.elapsed().as_millis() as u64,
        phase: state.as_ref().map(|s| s.phase().to_string()),
        current: state.as_ref().and_then(|s| s.current().map(str::to_string)),
        desired: state.as_ref().and_then(|s| s.desired().map(str::to_string)),
    };
    let timed_out = !args.no_wait && !handled;
    if !args.output.print_machine(&report)? {
        print_report(&report, &args, timed_out);
    }
    Ok(if timed_out { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn print_report(r: &Report, args: &Args, timed_out: bool) {
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "—".into());
    if args.no_wait {
        heading(&format!("Asked the agent of {} to reconcile", r.cluster));
    } else if timed_out {
        heading(&format!(
            "The agent of {} did not finish a pass within {}",
            r.cluster,
            humantime::format_duration(args.timeout)
        ));
    } else {
        heading(&format!(
            "Reconciled {}: a pass started after the request finished in {:.1}s",
            r.cluster,
            r.waited_ms as f64 / 1000.0
        ));
    }
    println!("  phase      {}", dash(&r.phase));
    println!("  running    {}", dash(&r.current));
    println!("  desired    {}", dash(&r.desired));
    if timed_out {
        next(
            "check that its agent runs and leads (`fleetgate get agents`, `kubectl -n fleetgate-system logs deploy/fleetgate-agent`)",
        );
    }
}
