//! `fleetgate validate`: the fleet repo's quality gate. Schemas, references, signatures (with
//! `--trusted-keys`), mapping consistency and CRD compatibility between consecutive releases,
//! over the branch tip and every release tag. Every finding is reported with file and line.
//!
//! Exit 0 clean, 1 findings, 2 usage or configuration error (unreadable repo or key file).

use super::output::{OutputFormat, colours};
use crate::model::Finding;
use crate::release::{Keyring, SignatureVerdict, ValidationReport, validate_repo};
use crate::source::{Checkout, Credentials, Source};
use anyhow::Context;
use owo_colors::OwoColorize;
use std::path::{Path, PathBuf};
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
    /// SSH private key for ssh:// URLs.
    #[arg(long, value_name = "FILE")]
    pub ssh_key: Option<PathBuf>,
    /// Environment variable holding a token for https:// URLs.
    #[arg(long, value_name = "VAR", default_value = "FLEETGATE_GIT_TOKEN")]
    pub token_env: String,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let keyring = trusted_keys(&args.trusted_keys)?;
    // git2 and gpgme block; keep them off the async runtime.
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<ValidationReport> {
        let credentials = Credentials {
            ssh_key: args.ssh_key.clone(),
            token: std::env::var(&args.token_env).ok(),
            ..Default::default()
        };
        let (checkout, _state) = open_repo(&args.repo, args.branch.as_deref(), credentials)?;
        Ok(validate_repo(&checkout, keyring.as_ref(), args.release.as_deref())?)
    })
    .await??;
    if !args.output.print_machine(&report)? {
        print_human(&report);
    }
    Ok(if report.is_clean() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The keys of `--trusted-keys`, or `None` when none were given.
pub(super) fn trusted_keys(files: &[PathBuf]) -> anyhow::Result<Option<Keyring>> {
    if files.is_empty() {
        return Ok(None);
    }
    Ok(Some(Keyring::from_files(files).context("loading --trusted-keys")?))
}

/// A local repository as it is, or a URL fetched into a temporary mirror (kept alive by the
/// returned directory).
pub(super) fn open_repo(
    repo: &str,
    branch: Option<&str>,
    credentials: Credentials,
) -> anyhow::Result<(Checkout, Option<tempfile::TempDir>)> {
    let path = Path::new(repo);
    if !repo.contains("://") && path.exists() {
        let checkout =
            Checkout::open_local(path, branch).with_context(|| format!("{repo} is not a readable Git repository"))?;
        return Ok((checkout, None));
    }
    let state = tempfile::tempdir()?;
    let mut source = Source::open(repo, state.path(), credentials)?.with_branch(branch.unwrap_or("main"));
    source.sync().with_context(|| format!("fetching {repo}"))?;
    Ok((source.checkout()?, Some(state)))
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
        let verdict = if t.findings.is_empty() { paint("ok", true) } else { paint(&format!("{} finding(s)", t.findings.len()), false) };
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
                [c.id.clone(), c.commit[..12].to_string(), sig, if n == 0 { paint("0", true) } else { paint(&n.to_string(), false) }]
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
