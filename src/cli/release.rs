//! `fleetgate release create`: flags into a [`CreateRequest`], one call to
//! [`fleetgate::releng::create::create`], an optional push, and the result for people or pipelines.

use super::args::SigningFormat;
use super::output::{Done, OutputFormat, crd_line, fail, heading, next};
use crate::model::{AdmissionBaseline, Requirements};
use crate::releng::chart::ChartInput;
use crate::releng::create::{self, CreateOutcome, CreateReport, CreateRequest, Targets};
use crate::releng::publish;
use crate::releng::push::{self, Pushed};
use crate::releng::{FleetRepo, RelengError};
use crate::source::Credentials;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Write release.yaml, commit rendered manifests, sign and tag.
    Create(CreateArgs),
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The fleet repo (a clone; bare or not).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Release id, also the tag name (e.g. rel-20250315-001).
    #[arg(long)]
    pub id: String,
    /// Folder with the rendered manifests (Helm output); it replaces operator/.
    #[arg(long, required_unless_present = "chart", conflicts_with = "chart")]
    pub manifests: Option<PathBuf>,
    /// A Helm chart (folder or .tgz) to render into operator/ with `helm template --include-crds`
    /// (helm from $FLEETGATE_HELM, else PATH), as release spec.operator.name in namespace
    /// spec.operator.namespace of fleet.yaml. Its Chart.yaml version is the chart version.
    #[arg(long, value_name = "DIR|CHART.tgz")]
    pub chart: Option<PathBuf>,
    /// A values file for --chart (repeatable, merged in order; digested into release.yaml).
    #[arg(long = "values", value_name = "FILE", requires = "chart")]
    pub values: Vec<PathBuf>,
    /// A value for --chart, as `helm --set` takes it (repeatable, applied after the files).
    #[arg(long = "set", value_name = "KEY=VALUE", requires = "chart")]
    pub set: Vec<String>,
    /// A variant of the release, rendered for the clusters its --variant-selector matches:
    /// NAME=VALUES.yaml with --chart (that file merged over the base values), else NAME=DIR of its
    /// rendered manifests (repeatable; clusters try the variants in this order, the first match
    /// wins). Signed with the release as spec.variants, under the same id and sequence.
    #[arg(long = "variant", value_name = "NAME=FILE|DIR")]
    pub variants: Vec<String>,
    /// Which clusters run variant NAME, as YAML over facts the cluster's agent owns:
    /// `NAME={matchLabels: {region: eu}, architectures: [arm64], kubernetes: ">=1.30"}` (matchLabels
    /// against the agent's own --label settings). Only the last variant may have none: it is the
    /// default.
    #[arg(long = "variant-selector", value_name = "NAME=YAML")]
    pub variant_selectors: Vec<String>,
    /// The image variant NAME runs instead of --image (NAME=IMAGE), or instead of the
    /// --extra-image called IMAGE (NAME.IMAGE=IMAGE); repeatable.
    #[arg(long = "variant-image", value_name = "NAME[.IMAGE]=IMAGE")]
    pub variant_images: Vec<String>,
    /// The digest of one architecture's image inside the multi-arch index a variant's image pins
    /// (NAME=ARCH@sha256:… for its --image, NAME.IMAGE=ARCH@sha256:… for an --extra-image;
    /// repeatable): the variant then runs only on clusters whose every node is of a listed
    /// architecture.
    #[arg(long = "variant-platform", value_name = "NAME[.IMAGE]=ARCH@DIGEST")]
    pub variant_platforms: Vec<String>,
    /// The Operator image: REPOSITORY:TAG[@sha256:DIGEST].
    #[arg(long)]
    pub image: String,
    /// A further image the release runs or passes to the manager: NAME=REPOSITORY:TAG[@DIGEST]
    /// (repeatable; recorded as spec.images).
    #[arg(long = "extra-image", value_name = "NAME=IMAGE")]
    pub extra_images: Vec<String>,
    /// An intentional breaking CRD change this release accepts: RULE, RULE:PATH or RULE:CRD:PATH,
    /// PATH covering its subtree (repeatable; signed with the release as spec.acceptCrdChanges,
    /// which every agent's CRD gate honours). A refusal prints the flags that accept what it found.
    #[arg(long = "accept-crd-change", value_name = "RULE[:[CRD:]PATH]")]
    pub accept_crd_changes: Vec<String>,
    /// The agents' baseline ReleaseAdmissionPolicy (their `admissionPolicy` file), which the
    /// branch's policies/ narrow: the release is judged by it before it is signed. Default: the
    /// one deploy/config.yaml ships.
    #[arg(long, value_name = "FILE")]
    pub admission_policy: Option<PathBuf>,
    /// Sign even though admission refuses the manifests, for this reason (recorded with the
    /// violations in the signed tag message). Agents still refuse what their policies refuse.
    #[arg(long, value_name = "REASON")]
    pub allow_admission: Option<String>,
    /// The chart version (with --chart, Chart.yaml's version is taken instead).
    #[arg(long, required_unless_present = "chart", conflicts_with = "chart")]
    pub chart_version: Option<String>,
    /// The CRD version every CRD of the release serves (e.g. v1alpha2).
    #[arg(long)]
    pub crd_version: String,
    /// The Operator's source commit.
    #[arg(long)]
    pub git_commit: String,
    /// Clusters the release may run on (comma-separated).
    #[arg(long, value_delimiter = ',', required_unless_present = "all", conflicts_with = "all")]
    pub targets: Vec<String>,
    /// Target every cluster in clusters/.
    #[arg(long)]
    pub all: bool,
    /// Explicit rollback target (default: the newest earlier release that some cluster reported
    /// `success` for).
    #[arg(long)]
    pub rollback_to: Option<String>,
    /// Earlier releases this one withdraws (comma-separated; spec.revokes): no agent applies
    /// them again, e.g. a build with a known vulnerability.
    #[arg(long, value_delimiter = ',')]
    pub revokes: Vec<String>,
    /// Namespace for namespaced objects whose manifest names none, as `kubectl apply -n NS` gives
    /// it to an upstream install.yaml (spec.namespace; default: fleet.yaml's operator.namespace).
    #[arg(long, short = 'n', value_name = "NS")]
    pub namespace: Option<String>,
    /// Kubernetes versions the release needs, as a semver range (e.g. ">=1.28").
    #[arg(long)]
    pub requires_kubernetes: Option<String>,
    /// Node architectures the images are built for (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub architectures: Vec<String>,
    /// The key that signs the tag (and the commit): the fingerprint of a secret key in the GnuPG
    /// home, or with `--signing-format ssh` an OpenSSH private key file.
    #[arg(long, env = "FLEETGATE_SIGN_KEY", value_name = "FINGERPRINT|PATH")]
    pub sign_key: String,
    /// How --sign-key signs, as Git's `gpg.format`: openpgp (gpg) or ssh (an SSH signature).
    #[arg(long, value_enum, default_value_t, env = "FLEETGATE_SIGNING_FORMAT")]
    pub signing_format: SigningFormat,
    /// GnuPG home holding the key (default: $GNUPGHOME, else ~/.gnupg).
    #[arg(long)]
    pub gpg_home: Option<PathBuf>,
    /// Branch to commit on (default: the branch HEAD points at).
    #[arg(long)]
    pub branch: Option<String>,
    /// Use the statuses in the local notes refs; by default they are fetched from --remote first
    /// (when it exists): they choose the default rollback target and the CRD baselines.
    #[arg(long)]
    pub offline: bool,
    /// Push the branch and the tag.
    #[arg(long)]
    pub push: bool,
    /// Remote to push to (a name or URL).
    #[arg(long, default_value = "origin")]
    pub remote: String,
    #[command(flatten)]
    pub git: super::args::GitAccess,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: OutputFormat,
}

pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Create(args) => create_cmd(args),
    }
}

fn create_cmd(args: CreateArgs) -> anyhow::Result<ExitCode> {
    let format = args.output;
    let access = args.git.credentials()?;
    match create_and_push(&args, &access) {
        Ok(c) => {
            let done = Done { result: "done", report: &c.report, pushed: c.pushed.as_ref(), pull_request: None };
            if !format.print_machine(&done)? {
                print_human(&args, &c);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => fail(format, &e),
    }
}

/// What `release create` did, and what the human output needs besides.
struct Created {
    report: CreateReport,
    pushed: Option<Pushed>,
    first_wave: Option<String>,
    has_remote: bool,
}

fn create_and_push(args: &CreateArgs, access: &Credentials) -> Result<Created, RelengError> {
    let requires = (args.requires_kubernetes.is_some() || !args.architectures.is_empty()).then(|| Requirements {
        kubernetes: args.requires_kubernetes.clone(),
        architectures: args.architectures.clone(),
    });
    let req = CreateRequest {
        id: args.id.clone(),
        manifests: args.manifests.clone().unwrap_or_default(),
        chart: args.chart.as_ref().map(|chart| ChartInput {
            chart: chart.clone(),
            values: args.values.clone(),
            set: args.set.clone(),
        }),
        image: create::parse_image(&args.image)?,
        images: args.extra_images.iter().map(|s| create::parse_named_image(s)).collect::<Result<_, _>>()?,
        chart_version: args.chart_version.clone().unwrap_or_default(),
        accept_crd_changes: args.accept_crd_changes.clone(),
        crd_version: args.crd_version.clone(),
        git_commit: args.git_commit.clone(),
        targets: if args.all { Targets::All } else { Targets::List(args.targets.clone()) },
        rollback_to: args.rollback_to.clone(),
        revokes: args.revokes.clone(),
        namespace: args.namespace.clone(),
        requires,
        branch: args.branch.clone(),
        admission_baseline: AdmissionBaseline::read_or_shipped(args.admission_policy.as_deref())?,
        allow_admission: args.allow_admission.clone(),
        variants: create::parse_variants(
            &args.variants,
            &args.variant_selectors,
            &args.variant_images,
            &args.variant_platforms,
        )?,
    };
    let repo = FleetRepo::open(&args.repo)?;
    // The clusters' statuses choose the CRD baselines and the default rollback target: read the
    // newest ones.
    if !args.offline {
        publish::fetch_statuses(&repo, &args.remote, access)?;
    }
    let mut signer = args.signing_format.open(&args.sign_key, args.gpg_home.as_deref())?;
    let report = create::create(&repo, &req, &mut signer)?;
    let pushed = if args.push {
        let refs = vec![format!("refs/heads/{}", report.branch), format!("refs/tags/{}", report.id)];
        Some(push::push(&repo, &args.remote, &refs, access)?)
    } else {
        None
    };
    let tip = repo.branch_tip(&report.branch)?;
    let first_wave = repo
        .fleet_state(&tip.tree()?, &report.branch)
        .ok()
        .and_then(|s| s.config.fleet.spec.waves.first().map(|w| w.name.clone()));
    Ok(Created { report, pushed, first_wave, has_remote: repo.has_remote(&args.remote) })
}

fn short(hex: &str) -> &str {
    &hex[..hex.len().min(10)]
}

fn print_human(args: &CreateArgs, c: &Created) {
    let (r, pushed, first_wave) = (&c.report, c.pushed.as_ref(), c.first_wave.as_deref());
    match r.outcome {
        CreateOutcome::Created => heading(&format!("Released {} on branch {}", r.id, r.branch)),
        CreateOutcome::AlreadyReleased => heading(&format!("Already released: {} has exactly this content", r.id)),
    }
    let m = &r.mapping;
    println!("  commit     {}", short(&r.commit));
    println!("  tag        {} (object {}), signed by {}", r.id, short(&r.tag), r.signer);
    println!("  image      {}", m.image.reference());
    let chart = m.chart.as_ref().map_or_else(|| m.chart_version.clone(), |c| format!("{} {}", c.name, c.version));
    println!("  chart      {chart}   CRD version {}   source {}", m.crd_version, m.git_commit);
    if let Some(c) = &m.chart {
        println!("  values     {}", c.values_digest);
    }
    println!("  targets    {}", m.target_clusters.join(", "));
    match (&m.rollback_to, r.rollback_succeeded_on.as_slice()) {
        (None, _) => {
            println!("  rollback   (each cluster's last-known-good release: no earlier release succeeded anywhere yet)")
        }
        (Some(to), []) => println!("  rollback   {to}"),
        (Some(to), on) => println!("  rollback   {to} (succeeded on {})", on.join(", ")),
    }
    println!("  manifests  {} file(s) under {}", r.manifest_files, m.manifests);
    for v in &m.variants {
        let selects = v.selector.as_ref().map_or_else(|| "the default".to_string(), |s| format!("selects {s}"));
        println!("  variant    {}: {} under {} ({selects})", v.name, v.image.reference(), v.manifests);
    }
    for b in &r.crd_baselines {
        println!("  baseline   {b}: {}", b.verdict.summary());
    }
    let against: Vec<&str> = r.crd_baselines.iter().map(|b| b.release.as_str()).collect();
    let against = (!against.is_empty()).then(|| against.join(", "));
    println!("  CRDs       {}", crd_line(&r.crd_compatibility, against.as_deref()));
    for f in &r.crd_compatibility.findings {
        println!("               - {f}");
    }
    for a in &m.accept_crd_changes {
        println!("             accepts {a} (signed as spec.acceptCrdChanges)");
    }
    // An existing release was judged when it was cut.
    match (r.outcome, &r.admission_override) {
        (CreateOutcome::AlreadyReleased, _) => {}
        (CreateOutcome::Created, None) => {
            println!("  admission  admitted by the agents' baseline and the branch's policies")
        }
        (CreateOutcome::Created, Some(o)) => {
            println!("  admission  REFUSED, signed anyway (--allow-admission): {}", o.reason);
            for v in &o.violations {
                println!("               - {v}");
            }
        }
    }
    if !r.roles_judged_live.is_empty() {
        println!(
            "             bindings of {}, which the release does not define, are judged by the agents against the cluster's roles",
            r.roles_judged_live.join(", ")
        );
    }
    match pushed {
        Some(p) => println!("  pushed     {} to {}", p.refs.join(", "), p.remote),
        None => println!("  pushed     nothing (local only)"),
    }
    let repo = args.repo.display();
    let wave = first_wave.map(|w| format!("--wave {w}")).unwrap_or_else(|| "--cluster NAME".into());
    let promote = format!("fleetgate promote {} {wave} --repo {repo} --trusted-keys KEYS.asc", r.id);
    match (pushed, c.has_remote) {
        (Some(_), _) => next(&format!("{promote} --open-pr")),
        (None, true) => next(&format!(
            "git -C {repo} push {} {} {} (or re-run with --push), then {promote} --open-pr",
            args.remote, r.branch, r.id
        )),
        (None, false) => next(&promote),
    }
}
