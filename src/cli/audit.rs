//! `fleetgate audit --repo PATH|URL [--cluster C] [--since T]`: every status each cluster's agent
//! wrote, oldest first, from the history of its notes ref ([`crate::status::audit`]), each
//! checked against the cluster's registered status key as `fleetgate status` checks it.
//!
//! The table shows time, cluster, release, state, whether the entry verified, the deciding gate
//! figure and the description, and under a release's start who approved it for which wave and
//! why (when its wave requires approval); `-o json|yaml` prints every record in full. Text from the notes
//! goes through [`terminal_safe`] in the table.
//!
//! Exit codes: 0 every record shown verified; 1 some did not (they are shown, marked why);
//! 2 bad usage, unreachable repo, or an invalid fleet configuration.

use super::args::FleetRepoArgs;
use super::output::{OutputFormat, terminal_safe};
use crate::model::FleetConfig;
use crate::status::StatusKeys;
use crate::status::audit::{Filter, Record, read_log};
use anyhow::Context;
use chrono::{DateTime, NaiveDate, Utc};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub fleet: FleetRepoArgs,
    /// Only this cluster's records.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// Only records reported at or after T: an RFC 3339 time (2025-03-15T10:00:00Z), a date
    /// (2025-03-15, UTC) or a duration ago (24h, 7d).
    #[arg(long, value_name = "T", value_parser = parse_since)]
    pub since: Option<DateTime<Utc>>,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// `--since`: a time, a date, or a duration before now.
fn parse_since(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    if let Ok(d) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).expect("midnight exists").and_utc());
    }
    let ago = humantime::parse_duration(text)
        .map_err(|_| format!("{text:?} is not an RFC 3339 time, a date (YYYY-MM-DD) or a duration (24h, 7d)"))?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|ago| Utc::now().checked_sub_signed(ago))
        .ok_or_else(|| format!("{text:?} is too long ago"))
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (_state, mut source) = args.fleet.open_mirror("fleetgate-audit")?;
    let filter = Filter { cluster: args.cluster.clone(), since: args.since };
    let records = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Record>> {
        source.sync().with_context(|| format!("reading {}", source.url()))?;
        let checkout = source.checkout()?;
        let config = FleetConfig::load(&checkout.tip_tree()?).context("the branch tip's fleet configuration")?;
        Ok(read_log(checkout.repo(), &StatusKeys::registered(&config), &filter)?)
    })
    .await??;
    if !args.output.print_machine(&records)? {
        print!("{}", table(&terminal_safe(&records)?));
    }
    let all_verified = records.iter().all(|r| r.verified);
    Ok(if all_verified { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// One line per record under a header; an unverified record says why on the next line.
fn table(records: &[Record]) -> String {
    if records.is_empty() {
        return "no status records\n".to_string();
    }
    let rows: Vec<[String; 6]> = records
        .iter()
        .map(|r| {
            let s = &r.status;
            let deciding = s.gates.iter().find(|g| g.verdict == "fail").or(s.gates.first());
            let figure = deciding.map(|g| format!("{} {} ({})", g.name, g.observed, g.threshold)).unwrap_or_default();
            let verified = if r.verified { "yes" } else { "NO" };
            [
                r.at().format("%Y-%m-%d %H:%M:%S").to_string(),
                r.cluster.clone(),
                s.release.clone(),
                s.state.to_string(),
                verified.to_string(),
                figure,
            ]
        })
        .collect();
    let header = ["TIME (UTC)", "CLUSTER", "RELEASE", "STATE", "VERIFIED", "FIGURE"];
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).chain([header[i].len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: &[&str], last: &str| {
        let mut out: String = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}  ")).collect();
        out.push_str(last);
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(&header, "DESCRIPTION");
    for (record, row) in records.iter().zip(&rows) {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        out.push_str(&line(&cells, &record.status.description));
        if let Some(a) = &record.status.approval {
            let why = a.why.split_whitespace().collect::<Vec<_>>().join(" ");
            out.push_str(&format!("  ↳ approved for wave {} by {} ({}): {why}\n", a.wave, a.by, a.via));
        }
        if let Some(why) = &record.unverified {
            out.push_str(&format!("  ↳ unverified: {why}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_time_a_date_or_a_duration_ago() {
        assert_eq!(parse_since("2025-03-15T10:00:00+02:00").unwrap().to_rfc3339(), "2025-03-15T08:00:00+00:00");
        assert_eq!(parse_since("2025-03-15").unwrap().to_rfc3339(), "2025-03-15T00:00:00+00:00");
        let ago = Utc::now() - parse_since("2h").unwrap();
        assert!((ago.num_minutes() - 120).abs() <= 1, "{ago}");
        assert!(parse_since("yesterday").unwrap_err().contains("is not an RFC 3339 time"));
    }

    #[test]
    fn a_start_shows_who_approved_it_for_which_wave_and_why() {
        let approval = crate::model::ApprovalRecord {
            by: "Ana <ana@example.com> (key ABC)".into(),
            why: "CAB-1234\nlow risk".into(),
            wave: "prod".into(),
            via: "tag approve/rel-2/prod".into(),
        };
        let status =
            crate::status::Status::new("c", "rel-2", "0".repeat(40), crate::status::State::Pending, "applying")
                .approved(approval);
        let record = Record { cluster: "c".into(), notes_commit: "n".into(), verified: true, unverified: None, status };
        let text = table(&[record]);
        assert!(
            text.contains("  ↳ approved for wave prod by Ana <ana@example.com> (key ABC) (tag approve/rel-2/prod): CAB-1234 low risk\n"),
            "{text}"
        );
    }
}
