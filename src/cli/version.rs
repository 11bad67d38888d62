//! `fleetgate version [--repo PATH|URL] [-o json|yaml]`: this client's version (and the commit it
//! was built from when the build set `FLEETGATE_GIT_COMMIT`), and with `--repo` the version each
//! cluster's agent last reported in its signed statuses (the newest verified entry of any
//! release), so it needs no access to the clusters.

use super::args::{GitAccess, read_fleet};
use super::output::{OutputFormat, terminal_safe};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The fleet repo (a local path or a URL): also show each agent's last reported version.
    #[arg(long)]
    pub repo: Option<String>,
    /// The tracked branch whose clusters/ lists the fleet.
    #[arg(long, default_value = "main")]
    pub branch: String,
    #[command(flatten)]
    pub git: GitAccess,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Versions {
    pub client: ClientVersion,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<AgentVersion>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientVersion {
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// What a cluster's newest verified status says about its agent; `version` is `None` where the
/// cluster never reported (or only unverified entries exist, which are not believed).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentVersion {
    pub cluster: String,
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_at: Option<DateTime<Utc>>,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let client = ClientVersion {
        version: crate::VERSION.to_string(),
        commit: option_env!("FLEETGATE_GIT_COMMIT").map(str::to_string),
    };
    let agents = match &args.repo {
        None => Vec::new(),
        Some(repo) => {
            let (_state, mut source) = args.git.open_mirror(repo, &args.branch, "fleetgate-version")?;
            let view = tokio::task::spawn_blocking(move || read_fleet(&mut source)).await??;
            agents(&view.into_matrix(None))
        }
    };
    let versions = Versions { client, agents };
    if args.output.print_machine(&versions)? {
        return Ok(ExitCode::SUCCESS);
    }
    let v = terminal_safe(&versions)?;
    match &v.client.commit {
        Some(c) => println!("client  fleetgate {} (commit {c})", v.client.version),
        None => println!("client  fleetgate {}", v.client.version),
    }
    if args.repo.is_some() {
        let w = v.agents.iter().map(|a| a.cluster.chars().count()).max().unwrap_or(0).max("CLUSTER".len());
        println!("\n{:<w$}  {:<10}  {:<20}  RELEASE", "CLUSTER", "AGENT", "LAST REPORT");
        for a in &v.agents {
            println!(
                "{:<w$}  {:<10}  {:<20}  {}",
                a.cluster,
                a.version.as_deref().filter(|v| !v.is_empty()).unwrap_or("—"),
                a.reported_at
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_else(|| "never".into()),
                a.release.as_deref().unwrap_or("—")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Per cluster (in wave order), what its newest verified status says.
fn agents(m: &crate::status::Matrix) -> Vec<AgentVersion> {
    m.waves
        .iter()
        .flat_map(|w| &w.clusters)
        .map(|row| {
            let newest = row.newest_status();
            AgentVersion {
                cluster: row.name.clone(),
                version: newest.map(|s| s.agent_version.clone()),
                release: newest.map(|s| s.release.clone()),
                reported_at: newest.map(|s| s.reported_at),
            }
        })
        .collect()
}
