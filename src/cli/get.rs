//! `fleetgate get agents --repo PATH|URL`: one row per cluster of the fleet (clusters/*.yaml at the
//! branch tip): its agent's phase and current/desired release from the state ConfigMap, the leader
//! from the Lease holder, and the last report and agent version from its signed statuses in Git.
//!
//! Each cluster is reached through the global `--kubeconfig` with the context named like the
//! cluster, or the one `--context-for CLUSTER=CONTEXT` gives. A cluster that cannot be reached
//! (no such context, API server down, RBAC) gets `unreachable: <error>` in its row and keeps what
//! Git says; the table is always printed. Reads only: nothing is created or changed.

use super::args::{FleetRepoArgs, KubeArgs, read_fleet};
use super::output::{OutputFormat, terminal_safe, terminal_width};
use crate::agent::config::{DEFAULT_STATE_NAMESPACE, KubeAccess, lease_name};
use crate::agent::state::{PAUSED_ANNOTATION, StateStore};
use crate::model::error_chain;
use crate::status::truncate;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Each cluster's agent: phase, release, last report, leader, version.
    Agents(AgentsArgs),
}

#[derive(Debug, clap::Args)]
pub struct AgentsArgs {
    #[command(flatten)]
    pub fleet: FleetRepoArgs,
    /// The kubeconfig context of a cluster whose context is not named like it; repeatable.
    #[arg(long, value_name = "CLUSTER=CONTEXT", value_parser = parse_mapping)]
    pub context_for: Vec<(String, String)>,
    /// Namespace of the agents' state ConfigMap and Lease.
    #[arg(short = 'n', long, default_value = DEFAULT_STATE_NAMESPACE)]
    pub namespace: String,
    /// How long to wait for each cluster's API server.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: GetFormat,
}

/// `-o` of `fleetgate get`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GetFormat {
    #[default]
    Table,
    /// More columns: desired release, context, agent version.
    Wide,
    Json,
    Yaml,
}

fn parse_mapping(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((c, x)) if !c.is_empty() && !x.is_empty() => Ok((c.to_string(), x.to_string())),
        _ => Err(format!("{s:?}: expected CLUSTER=CONTEXT")),
    }
}

/// One cluster's row (`-o json`: a list of these).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRow {
    pub cluster: String,
    pub wave: String,
    pub context: String,
    /// From the state ConfigMap: `Idle`, `Baking`, …; `None` when unreachable or not written yet.
    pub phase: Option<String>,
    pub current: Option<String>,
    pub desired: Option<String>,
    /// The Lease holder (the agent Pod leading), if any.
    pub leader: Option<String>,
    /// The newest verified status the cluster wrote to Git (its agent's clock).
    pub last_report: Option<DateTime<Utc>>,
    pub version: Option<String>,
    /// Why the agent holds its cluster: the Git setting, else its state ConfigMap's annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// `unreachable: …` when the cluster could not be read; the Git columns are still filled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `kube`: the global flags; only `--kubeconfig` counts here (each cluster has its own context).
pub async fn run(command: Command, kube: KubeArgs) -> anyhow::Result<ExitCode> {
    let Command::Agents(args) = command;
    let (_state, mut source) = args.fleet.open_mirror("fleetgate-get")?;
    let view = tokio::task::spawn_blocking(move || read_fleet(&mut source)).await??;
    let matrix = view.into_matrix(None);
    let contexts: BTreeMap<String, String> = args.context_for.iter().cloned().collect();
    let rows = matrix.waves.iter().flat_map(|w| w.clusters.iter().map(move |c| (w, c))).map(|(wave, row)| {
        let newest = row.newest_status();
        let context = contexts.get(&row.name).cloned().unwrap_or_else(|| row.name.clone());
        let base = AgentRow {
            cluster: row.name.clone(),
            wave: wave.name.clone(),
            context: context.clone(),
            last_report: newest.map(|s| s.reported_at),
            version: newest.map(|s| s.agent_version.clone()).filter(|v| !v.is_empty()),
            paused: row.paused.clone(),
            ..AgentRow::default()
        };
        let access = KubeAccess::Kubeconfig { path: kube.kubeconfig.clone(), context: Some(context) };
        let namespace = args.namespace.clone();
        async move {
            match tokio::time::timeout(args.timeout, live(base.clone(), &access, &namespace)).await {
                Ok(Ok(row)) => row,
                Ok(Err(e)) => AgentRow { error: Some(format!("unreachable: {}", error_chain(e.as_ref()))), ..base },
                Err(_) => AgentRow {
                    error: Some(format!("unreachable: no answer within {}", humantime::format_duration(args.timeout))),
                    ..base
                },
            }
        }
    });
    let rows: Vec<AgentRow> = futures::future::join_all(rows).await;
    match args.output {
        GetFormat::Json => OutputFormat::Json.print_machine(&rows)?,
        GetFormat::Yaml => OutputFormat::Yaml.print_machine(&rows)?,
        format => {
            print!("{}", table(&terminal_safe(&rows)?, format == GetFormat::Wide));
            true
        }
    };
    Ok(ExitCode::SUCCESS)
}

/// `row` with what the cluster's API server says.
async fn live(mut row: AgentRow, access: &KubeAccess, namespace: &str) -> anyhow::Result<AgentRow> {
    let client = access.client().await?;
    let state = StateStore::new(client.clone(), namespace, &row.cluster).peek().await?;
    let lease = kube::Api::<Lease>::namespaced(client, namespace)
        .get_opt(&lease_name(&row.cluster))
        .await
        .with_context(|| format!("reading Lease {namespace}/{}", lease_name(&row.cluster)))?;
    match state {
        Some(peeked) => {
            let s = &peeked.state;
            row.phase = Some(s.phase().to_string());
            row.current = s.current().map(str::to_string);
            row.desired = s.desired().map(str::to_string);
            row.paused = row.paused.or(peeked.paused.map(|r| format!("{PAUSED_ANNOTATION}: {r}")));
        }
        None => row.phase = Some("no state yet".to_string()),
    }
    row.leader = lease.and_then(|l| l.spec?.holder_identity).filter(|h| !h.is_empty());
    Ok(row)
}

fn table(rows: &[AgentRow], wide: bool) -> String {
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "—".to_string());
    let mut head = vec!["CLUSTER", "WAVE", "PHASE", "RELEASE", "LAST REPORT", "LEADER"];
    if wide {
        head.extend(["DESIRED", "CONTEXT", "VERSION"]);
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = vec![
                r.cluster.clone(),
                r.wave.clone(),
                match (&r.error, &r.paused) {
                    (Some(e), _) => e.clone(),
                    (None, Some(_)) => format!("{} (paused)", dash(&r.phase)),
                    (None, None) => dash(&r.phase),
                },
                dash(&r.current),
                r.last_report
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_else(|| "never".into()),
                dash(&r.leader),
            ];
            if wide {
                c.extend([dash(&r.desired), r.context.clone(), dash(&r.version)]);
            }
            c
        })
        .collect();
    // The error column is the one that can be long: cut it to what the terminal leaves, unless wide.
    let mut widths: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for c in &cells {
        for (w, v) in widths.iter_mut().zip(c) {
            *w = (*w).max(v.chars().count());
        }
    }
    if !wide {
        let others: usize = widths.iter().enumerate().filter(|(i, _)| *i != 2).map(|(_, w)| w + 2).sum();
        widths[2] = widths[2].min(terminal_width().saturating_sub(others).max(12));
    }
    let line = |vals: Vec<String>| {
        let mut l = String::new();
        for (i, (v, w)) in vals.iter().zip(&widths).enumerate() {
            let v = truncate(v, *w);
            l.push_str(&format!("{v:<w$}", w = *w));
            if i + 1 < vals.len() {
                l.push_str("  ");
            }
        }
        l.trim_end().to_string() + "\n"
    };
    let mut out = line(head.iter().map(|h| h.to_string()).collect());
    for c in cells {
        out.push_str(&line(c));
    }
    out
}
