//! `fleetgate events --cluster NAME`: the Kubernetes Events a cluster's agent recorded about its
//! state ConfigMap (one per state transition, a Warning per error; [`crate::agent::events`]),
//! oldest first so the newest is next to the prompt, as `flux events` prints them. `--for
//! KIND/NAME` shows the Events about another object of `--namespace` instead, whoever wrote them
//! (the Operator's Deployment in its namespace, say).
//!
//! The cluster is reached through the global `--kubeconfig` / `--context`. Reads only.

use super::args::{AgentRef, KubeArgs};
use super::output::{OutputFormat, terminal_safe, terminal_width};
use crate::agent::events::{is_agents, last_seen};
use crate::status::matrix::age;
use crate::status::truncate;
use anyhow::Context as _;
use chrono::{DateTime, Utc};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub agent: AgentRef,
    /// The Events about this object of --namespace instead, whoever wrote them, e.g.
    /// `Deployment/redis-operator`.
    #[arg(long = "for", value_name = "KIND/NAME", value_parser = parse_object)]
    pub for_object: Option<(String, String)>,
    /// Only Events seen within this long, e.g. `1h`, `30m`.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub since: Option<Duration>,
    /// The global `--kubeconfig` / `--context` (set by [`super::run`]).
    #[arg(skip)]
    pub kube: KubeArgs,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

fn parse_object(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() => Ok((kind.to_string(), name.to_string())),
        _ => Err(format!("{s:?}: expected KIND/NAME, e.g. Deployment/redis-operator")),
    }
}

/// One Event (`-o json`: a list of these, oldest first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventRow {
    pub last_seen: DateTime<Utc>,
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub kind: String,
    pub reason: String,
    /// `KIND/NAME` of the object the Event is about.
    pub object: String,
    pub message: String,
    /// The step it happened in (`Verify`, `Apply`, `Bake`, `Rollback`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Who wrote it: the agent Pod, for the agent's Events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporter: Option<String>,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let client =
        args.kube.access().client().await.context("connecting to the cluster (check --kubeconfig and --context)")?;
    let events = Api::<Event>::namespaced(client, &args.agent.namespace)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing the Events of namespace {} (check --namespace)", args.agent.namespace))?
        .items;
    let since = args.since.and_then(|d| chrono::Duration::from_std(d).ok()).map(|d| Utc::now() - d);
    let rows = rows(&events, |e| match &args.for_object {
        Some((kind, name)) => regards(e, kind, name),
        None => is_agents(e, &args.agent.cluster),
    })
    .into_iter()
    .filter(|r| since.is_none_or(|s| r.last_seen >= s))
    .collect::<Vec<_>>();
    if !args.output.print_machine(&rows)? {
        if rows.is_empty() {
            let about = match &args.for_object {
                Some((kind, name)) => format!("{kind}/{name}"),
                None => format!("cluster {}'s agent (check --cluster and --namespace)", args.agent.cluster),
            };
            // Said on stderr: stdout stays an empty table for scripts.
            eprintln!(
                "no Events in namespace {} about {about}; the API server keeps Events for 1 h by default",
                args.agent.namespace
            );
        } else {
            print!("{}", table(&terminal_safe(&rows)?, Utc::now()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// True when `event` is about object `kind`/`name` (the kind in any case, as kubectl takes it).
fn regards(event: &Event, kind: &str, name: &str) -> bool {
    event.regarding.as_ref().is_some_and(|r| {
        r.kind.as_deref().is_some_and(|k| k.eq_ignore_ascii_case(kind)) && r.name.as_deref() == Some(name)
    })
}

/// The rows of the Events `keep` selects, oldest first; an Event with no time at all is dropped
/// (it cannot be placed).
fn rows(events: &[Event], keep: impl Fn(&Event) -> bool) -> Vec<EventRow> {
    let mut rows: Vec<EventRow> = events
        .iter()
        .filter(|e| keep(e))
        .filter_map(|e| {
            let regarding = e.regarding.clone().unwrap_or_default();
            Some(EventRow {
                last_seen: last_seen(e)?,
                kind: e.type_.clone().unwrap_or_else(|| "Normal".to_string()),
                reason: e.reason.clone().unwrap_or_default(),
                object: format!("{}/{}", regarding.kind.unwrap_or_default(), regarding.name.unwrap_or_default()),
                message: e.note.clone().unwrap_or_default(),
                action: e.action.clone(),
                reporter: e.reporting_instance.clone().or_else(|| e.reporting_controller.clone()),
            })
        })
        .collect();
    rows.sort_by_key(|r| r.last_seen);
    rows
}

/// LAST SEEN / TYPE / REASON / OBJECT / MESSAGE; the message is cut to what the terminal leaves.
fn table(rows: &[EventRow], now: DateTime<Utc>) -> String {
    let head = ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"].map(String::from);
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| [age(r.last_seen, now), r.kind.clone(), r.reason.clone(), r.object.clone(), r.message.clone()])
        .collect();
    let mut widths = head.clone().map(|h| h.chars().count());
    for c in &cells {
        for (w, v) in widths.iter_mut().zip(c) {
            *w = (*w).max(v.chars().count());
        }
    }
    let others: usize = widths[..4].iter().map(|w| w + 2).sum();
    widths[4] = widths[4].min(terminal_width().saturating_sub(others).max(20));
    let line = |vals: &[String; 5]| {
        let cols: Vec<String> = vals.iter().zip(&widths).map(|(v, w)| format!("{:<w$}", truncate(v, *w))).collect();
        cols.join("  ").trim_end().to_string() + "\n"
    };
    std::iter::once(&head).chain(&cells).map(line).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::events::REPORTING_CONTROLLER;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn event(secs: i64, reason: &str, kind: &str, name: &str) -> Event {
        Event {
            event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())),
            type_: Some("Normal".into()),
            reason: Some(reason.into()),
            note: Some(format!("{reason} note")),
            regarding: Some(ObjectReference { kind: Some(kind.into()), name: Some(name.into()), ..Default::default() }),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            ..Default::default()
        }
    }

    #[test]
    fn rows_are_the_selected_events_oldest_first() {
        let events = [
            event(30, "ReleaseSucceeded", "ConfigMap", "fleetgate-state-eu-1"),
            event(10, "ReleaseStarted", "ConfigMap", "fleetgate-state-eu-1"),
            event(20, "ScalingReplicaSet", "Deployment", "redis-operator"),
        ];
        let agents = rows(&events, |e| is_agents(e, "eu-1"));
        let reasons: Vec<&str> = agents.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(reasons, ["ReleaseStarted", "ReleaseSucceeded"]);
        assert_eq!(agents[0].object, "ConfigMap/fleetgate-state-eu-1");
        let deployment = rows(&events, |e| regards(e, "deployment", "redis-operator"));
        assert_eq!(deployment.len(), 1);
        assert_eq!(deployment[0].reason, "ScalingReplicaSet");
    }

    #[test]
    fn the_table_shows_ages_and_cuts_messages_to_the_terminal() {
        let mut row = rows(&[event(0, "ReleaseStarted", "ConfigMap", "fleetgate-state-eu-1")], |_| true);
        row[0].message = "x".repeat(500);
        let text = table(&row, DateTime::from_timestamp(180, 0).unwrap());
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("LAST SEEN") && lines[0].ends_with("MESSAGE"), "{text}");
        assert!(lines[1].starts_with("3 m ago") && lines[1].contains("ReleaseStarted"), "{text}");
        assert!(lines[1].chars().count() <= terminal_width().max(120), "{text}");
    }

    #[test]
    fn for_takes_kind_slash_name() {
        assert_eq!(parse_object("Deployment/redis-operator"), Ok(("Deployment".into(), "redis-operator".into())));
        assert!(parse_object("redis-operator").is_err());
        assert!(parse_object("Deployment/").is_err());
    }
}
