//! `fleetgate plan [--base main] [--head HEAD]`: flags into a [`PlanRequest`], one call to
//! [`fleetgate::releng::plan::plan`] (after fetching statuses), optionally
//! [`fleetgate::releng::plan::post`], and the verdict for people or pipelines. Exit 0 for ok
//! and needs, 1 refused, 2 when the plan could not be made or posted.

use super::args::GitAccess;
use super::output::{OutputFormat, colours, fail, heading, next, terminal_text};
use crate::model::AdmissionBaseline;
use crate::release::Keyring;
use crate::releng::plan::{self, PlanReport, PlanRequest, Posted, Verdict};
use crate::releng::publish::fetch_statuses;
use crate::releng::{FleetRepo, RelengError};
use crate::status::ForgeSettings;
use owo_colors::OwoColorize;
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The fleet repo (a clone holding both revisions).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// What the pull request merges into: a branch or revision (in CI often origin/main).
    #[arg(long, default_value = "main")]
    pub base: String,
    /// The pull request's head: a branch or revision.
    #[arg(long, default_value = "HEAD")]
    pub head: String,
    /// Armored public keys the agents trust; target releases must be signed by one (repeatable).
    #[arg(long, value_name = "FILE", env = "FLEETGATE_TRUSTED_KEYS", value_delimiter = ',', required = true)]
    pub trusted_keys: Vec<PathBuf>,
    /// The agents' baseline ReleaseAdmissionPolicy (their `admissionPolicy` file), which the
    /// head's policies/ narrow. Default: the one deploy/config.yaml ships.
    #[arg(long, value_name = "FILE")]
    pub admission_policy: Option<PathBuf>,
    /// Publish the verdict on the forge given with --forge-*: commit status fleetgate/plan on
    /// the head and a comment on its pull request, edited in place on later runs.
    #[arg(long)]
    pub post: bool,
    #[command(flatten)]
    pub forge: ForgeSettings,
    /// Remote the agents' statuses are fetched from, a name or URL.
    #[arg(long, default_value = "origin")]
    pub remote: String,
    /// Use the statuses already in the local clone instead of fetching them from --remote.
    #[arg(long)]
    pub offline: bool,
    #[command(flatten)]
    pub git: GitAccess,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// The report with where it was posted, for `-o json|yaml`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Shown<'a> {
    result: &'static str,
    #[serde(flatten)]
    report: &'a PlanReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    posted: Option<&'a Posted>,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let access = args.git.credentials()?;
    let forge = match args.post {
        true => Some(args.forge.clone().resolve()?.ok_or_else(|| {
            anyhow::anyhow!(
                "--post needs a forge: pass --forge-kind, --forge-url and --forge-repository (token from --forge-token-file or $FLEETGATE_FORGE_TOKEN)"
            )
        })?),
        false => None,
    };
    let (repo, report) = match make(&args, &access) {
        Ok(v) => v,
        Err(e) => return fail(args.output, &e),
    };
    let posted = match &forge {
        Some(forge) => match plan::post(&report, forge, plan::branch_name(&repo, &args.base).as_deref()).await {
            Ok(p) => Some(p),
            Err(e) => {
                print(&args, &report, None)?;
                return fail(args.output, &e);
            }
        },
        None => None,
    };
    print(&args, &report, posted.as_ref())?;
    Ok(match report.verdict {
        Verdict::Ok | Verdict::Needs => ExitCode::SUCCESS,
        Verdict::Refused => ExitCode::from(1),
    })
}

fn make(args: &Args, access: &crate::source::Credentials) -> Result<(FleetRepo, PlanReport), RelengError> {
    let repo = FleetRepo::open(&args.repo)?;
    let trust = Keyring::from_key_files(&args.trusted_keys)?.ok_or_else(|| {
        RelengError::Usage("pass --trusted-keys FILE (the armored public keys your agents trust)".into())
    })?;
    if !args.offline {
        fetch_statuses(&repo, &args.remote, access)?;
    }
    let req = PlanRequest {
        base: args.base.clone(),
        head: args.head.clone(),
        admission_baseline: AdmissionBaseline::read_or_shipped(args.admission_policy.as_deref())?,
    };
    let report = plan::plan(&repo, &req, &trust)?;
    Ok((repo, report))
}

fn print(args: &Args, r: &PlanReport, posted: Option<&Posted>) -> anyhow::Result<()> {
    let result = match r.verdict {
        Verdict::Refused => "refused",
        Verdict::Ok | Verdict::Needs => "done",
    };
    if args.output.print_machine(&Shown { result, report: r, posted })? {
        return Ok(());
    }
    let short = |c: &str| c[..c.len().min(10)].to_string();
    heading(&terminal_text(&format!(
        "Plan of {} ({}) into {} ({})",
        r.head.rev,
        short(&r.head.commit),
        r.base.rev,
        short(&r.base.commit)
    )));
    let verdict = |v: Verdict| {
        let word = v.to_string();
        match (colours(), v) {
            (false, _) => word,
            (true, Verdict::Ok) => word.green().bold().to_string(),
            (true, Verdict::Needs) => word.yellow().bold().to_string(),
            (true, Verdict::Refused) => word.red().bold().to_string(),
        }
    };
    if r.clusters.is_empty() {
        println!("  no cluster's desired release changes");
    }
    for c in &r.clusters {
        let m = &c.moves;
        let line = format!(
            "{:<20} wave {:<10} {} -> {:<14} CRDs {}",
            m.cluster,
            m.wave,
            m.from_or_none(),
            m.to,
            c.crd.summary()
        );
        println!("  {}  {}", terminal_text(&line), verdict(c.verdict()));
        for b in &c.refused {
            println!("      refused: {}", terminal_text(&b.to_string()));
        }
        for n in &c.needs {
            println!("      needs:   {}", terminal_text(&n.to_string()));
        }
    }
    println!("  verdict    {}", verdict(r.verdict));
    if let Some(p) = posted {
        let on = match p.pull_requests.as_slice() {
            [] => "no open pull request has this head, so no comment".to_string(),
            prs => format!("commented on #{}", prs.iter().map(u64::to_string).collect::<Vec<_>>().join(", #")),
        };
        println!("  posted     {} {} on {}; {on}", p.context, p.state, short(&p.commit));
    }
    match r.verdict {
        Verdict::Refused => next("fix what is refused (a new release, or the policy), push, and plan again"),
        Verdict::Needs => next(
            "merge when reviewed; then give what is needed (approvals, signatures) and watch with `fleetgate status`",
        ),
        Verdict::Ok if r.clusters.is_empty() => {}
        Verdict::Ok => next("merge when reviewed; then watch the clusters with `fleetgate status`"),
    }
    Ok(())
}
