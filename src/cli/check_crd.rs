//! `fleetgate check-crd OLD NEW [--accept RULE[:[CRD:]PATH]]…`: offline CRD compatibility verdict.
//!
//! Exit 0 compatible (warnings and accepted findings are listed, not counted), 1 incompatible
//! (findings listed), 2 unreadable input or bad usage.

use super::output::{OutputFormat, colours};
use crate::gates::crd_compat::{self, Acceptance, Finding, Severity};
use anyhow::Context;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use owo_colors::OwoColorize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The CRD in place now (a file with one or more CustomResourceDefinitions; other kinds are skipped).
    pub old: PathBuf,
    /// The CRD that would replace it.
    pub new: PathBuf,
    /// Versions objects are stored in (the live CRD's `status.storedVersions`). Default: the old
    /// file's `status.storedVersions`, else its storage version. Only with one CRD per file.
    #[arg(long, value_delimiter = ',')]
    pub stored_versions: Option<Vec<String>>,
    /// Accept an intentional breaking change: `RULE` (e.g. `field-removed`), `RULE:PATH`
    /// (`maximum-lowered:.spec.replicas`, that path and below) or `RULE:CRD:PATH`. Repeatable.
    /// Accepted findings are still listed but no longer make the verdict incompatible.
    #[arg(long = "accept", value_name = "RULE[:PATH]")]
    pub accept: Vec<Acceptance>,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Report<'a> {
    old: &'a Path,
    new: &'a Path,
    compatible: bool,
    crds: Vec<String>,
    findings: &'a [Finding],
    /// `--accept` values that matched no finding (a stale acceptance is worth removing).
    unused_acceptances: Vec<String>,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let old = read_crds(&args.old)?;
    let new = read_crds(&args.new)?;
    let findings = match &args.stored_versions {
        Some(stored) => {
            let (o, n) = match (old.as_slice(), new.as_slice()) {
                ([o], [n]) => (o, n),
                _ => anyhow::bail!(
                    "--stored-versions needs exactly one CRD in each file ({} has {}, {} has {}); \
                     drop the flag to use each CRD's status.storedVersions",
                    args.old.display(),
                    old.len(),
                    args.new.display(),
                    new.len()
                ),
            };
            crd_compat::check_with(o, n, stored, &args.accept)
        }
        None if old.len() == 1 && new.len() == 1 => {
            crd_compat::check_with(&old[0], &new[0], &crd_compat::stored_versions(&old[0]), &args.accept)
        }
        None => crd_compat::check_all_with(&old, &new, &args.accept),
    };
    let report = Report {
        old: &args.old,
        new: &args.new,
        compatible: crd_compat::is_compatible(&findings),
        crds: old.iter().filter_map(|c| c.metadata.name.clone()).collect(),
        findings: &findings,
        unused_acceptances: args
            .accept
            .iter()
            .filter(|a| !findings.iter().any(|f| a.matches(f)))
            .map(ToString::to_string)
            .collect(),
    };
    for a in &report.unused_acceptances {
        eprintln!("note: --accept {a} matched no finding");
    }
    if !args.output.print_machine(&report)? {
        print_table(&report);
    }
    Ok(if report.compatible { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Every CustomResourceDefinition in a (multi-document) YAML file; none is an error.
fn read_crds(path: &Path) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {file}; check the path"))?;
    let mut crds = Vec::new();
    for (i, doc) in crate::model::parse_multi(&file, &text)?.into_iter().enumerate() {
        if doc.get("kind").and_then(|k| k.as_str()) != Some("CustomResourceDefinition") {
            continue;
        }
        let crd: CustomResourceDefinition = serde_json::from_value(doc).with_context(|| {
            format!("{file}: document {} is not a valid apiextensions.k8s.io/v1 CustomResourceDefinition", i + 1)
        })?;
        crds.push(crd);
    }
    anyhow::ensure!(!crds.is_empty(), "{file} holds no CustomResourceDefinition");
    Ok(crds)
}

fn print_table(r: &Report<'_>) {
    let colour = colours();
    let paint = |word: &str, good: bool| match (colour, good) {
        (false, _) => word.to_string(),
        (true, true) => word.green().bold().to_string(),
        (true, false) => word.red().bold().to_string(),
    };
    let n = r.findings.len();
    let counted = format!("{n} finding{}", if n == 1 { "" } else { "s" });
    if r.compatible {
        let word = paint("compatible", true);
        println!("{word}: {} can replace {} ({})", r.new.display(), r.old.display(), r.crds.join(", "));
        if n == 0 {
            return;
        }
        println!("{counted}, none blocking:");
    } else {
        let word = paint("incompatible", false);
        println!("{word}: {counted} replacing {} with {}", r.old.display(), r.new.display());
    }
    // The CRD column only when the files hold several CRDs.
    let with_crd = r.crds.len() > 1;
    let rows: Vec<Vec<String>> = r
        .findings
        .iter()
        .map(|f| {
            let severity = match (f.severity, f.accepted) {
                (Severity::Incompatible, true) => "accepted".to_string(),
                (s, _) => s.to_string(),
            };
            let mut row = vec![
                f.rule.to_string(),
                severity,
                f.version.clone().unwrap_or_else(|| "-".into()),
                f.path.clone(),
                f.message.clone(),
            ];
            if with_crd {
                row.insert(0, f.crd.clone());
            }
            row
        })
        .collect();
    let mut header: Vec<String> = ["RULE", "SEVERITY", "VERSION", "PATH", "MESSAGE"].map(str::to_string).to_vec();
    if with_crd {
        header.insert(0, "CRD".into());
    }
    let last = header.len() - 1;
    let widths: Vec<usize> =
        (0..last).map(|i| rows.iter().chain([&header]).map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (cell, w) in row.iter().zip(&widths) {
            line.push_str(&format!("{cell:w$}  "));
        }
        line.push_str(&row[last]);
        println!("{line}");
    }
}
