//! `fleetgate validate`: the fleet repo's quality gate. Schemas, references, signatures (with
//! `--trusted-keys`), mapping consistency, CRD compatibility between consecutive releases and
//! admission (the agents' baseline, `--admission-policy`, narrowed by each release's policies),
//! over the branch tip and every release tag. Every finding is reported with file and line.
//!
//! Exit 0 clean, 1 findings, 2 usage or configuration error (unreadable repo or key file).

use super::args::GitAccess;
use super::output::{OutputFormat, colours};
use crate::model::{AdmissionBaseline, Finding};
use crate::release::Keyring;
use crate::source::open_repo;
use crate::validate::{SignatureVerdict, ValidationReport, validate_repo};
use anyhow::Context;
use owo_colors::OwoColorize;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The fleet repo: a local path (its committed state is checked, not the work tree) or a
    /// Git URL (file://, git://, ssh://, https://).
    #[arg(long, default_value = ".")]
    pub repo: String,
    /// Armored public key of a trusted release signer (repeatable). Without it, signatures are
    /// reported as not checked.
    #[arg(long = "trusted-keys", value_name = "FILE")]
    pub trusted_keys: Vec<PathBuf>,
    /// Check only this release tag (and its CRD compatibility with the release before it).
    #[arg(long, value_name = "ID")]
    pub release: Option<String>,
    /// Branch whose tip holds the configuration. Default: what HEAD points to in a local repo,
    /// `main` for a URL.
    #[arg(long)]
    pub branch: Option<String>,
    /// The agents' baseline ReleaseAdmissionPolicy (their `admissionPolicy` file), which each
    /// release's own policies narrow. Default: the one deploy/config.yaml ships.
    #[arg(long, value_name = "FILE")]
    pub admission_policy: Option<PathBuf>,
    #[command(flatten)]
    pub git: GitAccess,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let keyring = Keyring::from_key_files(&args.trusted_keys).context("loading --trusted-keys")?;
    let credentials = args.git.credentials()?;
    let baseline = AdmissionBaseline::read_or_shipped(args.admission_policy.as_deref())?;
    let (repo, branch, release) = (args.repo.clone(), args.branch.clone(), args.release.clone());
    // git2 and gpgme block; keep them off the async runtime.
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<ValidationReport> {
        let opened = open_repo(&repo, branch.as_deref(), credentials)?;
        Ok(validate_repo(opened.checkout(), keyring.as_ref(), release.as_deref(), &baseline.spec)?)
    })
    .await??;
    if !args.output.print_machine(&report)? {
        print_human(&report);
    }
    Ok(if report.is_clean() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn paint(text: &str, ok: bool) -> String {
    match (colours(), ok) {
        (false, _) => text.to_string(),
        (true, true) => text.green().to_string(),
        (true, false) => text.red().bold().to_string(),
    }
}

fn print_human(r: &ValidationReport) {
    println!("fleet repo: branch {} at {}", r.branch, &r.commit[..12.min(r.commit.len())]);
    let config = match &r.summary {
        Some(s) if r.config.is_empty() => paint(
            &format!(
                "ok ({}, {}, {}, {})",
                count(s.clusters, "cluster", "clusters"),
                count(s.waves, "wave", "waves"),
                count(s.gate_policies, "gate policy", "gate policies"),
                count(s.admission_policies, "admission policy", "admission policies"),
            ),
            true,
        ),
        _ => paint(&format!("{} finding(s)", r.config.len()), false),
    };
    println!("  configuration   {config}");
    if let Some(t) = &r.tip_release {
        let state = if t.tagged { "tagged" } else { "not tagged yet" };
        let verdict = if t.findings.is_empty() {
            paint("ok", true)
        } else {
            paint(&format!("{} finding(s)", t.findings.len()), false)
        };
        println!("  release.yaml    {} ({state}) {verdict}", if t.id.is_empty() { "?" } else { &t.id });
    }
    let signatures = if r.signatures_checked { "checked" } else { "not checked (no --trusted-keys)" };
    println!("  signatures      {signatures}");
    if r.releases.is_empty() {
        println!("  releases        no signed releases yet (cut one with `fleetgate release create`)");
    } else {
        println!();
        let rows: Vec<[String; 4]> = r
            .releases
            .iter()
            .map(|c| {
                let sig = match &c.signature {
                    SignatureVerdict::Valid { signer } => paint(&format!("valid ({})", tail(signer)), true),
                    SignatureVerdict::Refused { reason } => paint(&format!("refused: {reason}"), false),
                    SignatureVerdict::NotChecked => "not checked".to_string(),
                };
                let n = c.findings.len();
                [
                    c.id.clone(),
                    c.commit[..12].to_string(),
                    sig,
                    if n == 0 { paint("0", true) } else { paint(&n.to_string(), false) },
                ]
            })
            .collect();
        let w0 = rows.iter().map(|r| r[0].len()).max().unwrap_or(0).max("RELEASE".len());
        println!("  {:<w0$}  {:<12}  {:<9}  SIGNATURE", "RELEASE", "COMMIT", "FINDINGS");
        for [id, commit, sig, n] in rows {
            // The findings count may carry colour codes; pad by its visible width.
            let pad = 9usize.saturating_sub(strip_width(&n));
            println!("  {id:<w0$}  {commit:<12}  {n}{}  {sig}", " ".repeat(pad));
        }
    }
    for c in r.releases.iter().filter(|c| !c.roles_judged_live.is_empty()) {
        println!(
            "  {}: bindings of {}, which the release does not define, are judged by the agents against the cluster's roles",
            c.id,
            c.roles_judged_live.join(", ")
        );
    }
    let findings: Vec<&Finding> = r.findings().collect();
    println!();
    if findings.is_empty() {
        println!("{}", paint("no findings", true));
        return;
    }
    println!("{}", paint(&format!("{} finding(s):", findings.len()), false));
    for f in findings {
        println!("  {}  [{}] {}", f.at, f.rule, f.message);
    }
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The last 16 hex digits of a fingerprint (its long key id).
fn tail(fingerprint: &str) -> &str {
    &fingerprint[fingerprint.len().saturating_sub(16)..]
}

fn strip_width(s: &str) -> usize {
    let mut width = 0;
    let mut in_escape = false;
    for c in s.chars() {
        match (in_escape, c) {
            (false, '\u{1b}') => in_escape = true,
            (true, 'm') => in_escape = false,
            (false, _) => width += 1,
            _ => {}
        }
    }
    width
}
