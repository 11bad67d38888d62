//! `fleetgate-testenv up --clusters a,b,c [--workloads] [--deploy deploy/] --dir DIR`: starts local
//! test clusters for the demo and for poking around by hand, writes `DIR/<name>.kubeconfig` (the
//! admin) for each — with `--deploy`, also applies that directory's manifests and writes
//! `DIR/<name>.agent.kubeconfig` (the agent's ServiceAccount token) — then `DIR/ready` once all are up, and runs until SIGINT/SIGTERM, when it stops every process and removes what it
//! wrote.
//!
//! `fleetgate-testenv gitea --dir DIR [--repo fleet]`: starts Gitea (when `hack/gitea-binary.sh`
//! built it) with an empty public repo, writes `DIR/gitea.env` (shell assignments: URL, token,
//! repository, clone and push URLs, the bare repo's path), and runs until SIGINT/SIGTERM.
//! `--check` only says whether the binary is there (exit 0) or not (exit 1, with how to build it).
//!
//! `fleetgate-testenv startup-time [--runs 5] [--workloads]`: measures how long one cluster takes
//! to start (median of the runs).

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use fleetgate_testenv::{ClusterOptions, DeployManifests, TestCluster};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(name = "fleetgate-testenv", about = "Real local Kubernetes control planes for fleetgate's demo and tests")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start clusters and keep them running until interrupted.
    Up {
        /// Cluster names, comma separated (lowercase letters, digits, '-').
        #[arg(long, value_delimiter = ',', required = true)]
        clusters: Vec<String>,
        /// Also run kube-controller-manager, kube-scheduler and kwok with a fake node, so
        /// Deployments get Pods that become Ready.
        #[arg(long)]
        workloads: bool,
        /// Where to write `<name>.kubeconfig` and `ready`.
        #[arg(long)]
        dir: PathBuf,
        /// Apply the agent's manifests from this directory (its kustomization.yaml's resources, as
        /// `kubectl apply -k`) and write `<name>.agent.kubeconfig` with a token of its ServiceAccount.
        #[arg(long, value_name = "DIR")]
        deploy: Option<PathBuf>,
    },
    /// Start Gitea with one empty repo and keep it running until interrupted.
    Gitea {
        /// Where to write `gitea.env`.
        #[arg(long, required_unless_present = "check")]
        dir: Option<PathBuf>,
        /// The repo to create (owned by the admin user).
        #[arg(long, default_value = "fleet")]
        repo: String,
        /// Only check that the binary is built.
        #[arg(long)]
        check: bool,
    },
    /// Start and stop one cluster several times and print each start-up time and the median.
    StartupTime {
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Time clusters with kube-controller-manager, kube-scheduler, kwok and a Ready node.
        #[arg(long)]
        workloads: bool,
    },
}

// The servers do the work; this process only waits, so one thread is plenty.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Cmd::Up { clusters, workloads, dir, deploy } => up(clusters, workloads, &dir, deploy.as_deref()).await,
        Cmd::StartupTime { runs, workloads } => startup_time(runs, workloads).await,
        Cmd::Gitea { check: true, .. } => match fleetgate_testenv::Gitea::binary() {
            Some(bin) => {
                println!("{}", bin.display());
                return ExitCode::SUCCESS;
            }
            None => {
                eprintln!("{}", fleetgate_testenv::Gitea::skip_message());
                return ExitCode::FAILURE;
            }
        },
        Cmd::Gitea { dir, repo, .. } => gitea(&dir.expect("clap requires --dir"), &repo).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleetgate-testenv: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn up(names: Vec<String>, workloads: bool, dir: &Path, deploy: Option<&Path>) -> anyhow::Result<()> {
    let manifests = deploy.map(DeployManifests::load).transpose()?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let ready = dir.join("ready");
    // A stale marker from an earlier run must not announce clusters that are not up yet.
    let _ = std::fs::remove_file(&ready);
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;

    let started = Instant::now();
    let starts = names.iter().map(|n| TestCluster::start(ClusterOptions::new(n.clone()).with_workloads(workloads)));
    let clusters = tokio::select! {
        all = join_all(starts) => all?,
        _ = sigint.recv() => anyhow::bail!("interrupted while starting"),
        _ = sigterm.recv() => anyhow::bail!("terminated while starting"),
    };

    let mut written = Vec::new();
    for c in &clusters {
        let path = dir.join(format!("{}.kubeconfig", c.name()));
        std::fs::copy(c.kubeconfig_path(), &path).with_context(|| format!("writing {}", path.display()))?;
        println!("cluster {} ready: server {} kubeconfig {}", c.name(), c.server_url(), path.display());
        written.push(path);
        if let Some(manifests) = &manifests {
            let agent =
                c.deploy_agent(manifests).await.with_context(|| format!("deploying the agent to {}", c.name()))?;
            let path = dir.join(format!("{}.agent.kubeconfig", c.name()));
            std::fs::copy(agent.kubeconfig_path(), &path).with_context(|| format!("writing {}", path.display()))?;
            println!("cluster {}: agent as its ServiceAccount: kubeconfig {}", c.name(), path.display());
            written.push(path);
        }
    }
    std::fs::write(&ready, format!("{}\n", names.join("\n")))?;
    written.push(ready);
    eprintln!(
        "fleetgate-testenv: {} cluster(s) up in {:.1}s; Ctrl-C stops them",
        clusters.len(),
        started.elapsed().as_secs_f64()
    );

    tokio::select! {
        _ = sigint.recv() => {}
        _ = sigterm.recv() => {}
    }
    eprintln!("fleetgate-testenv: stopping");
    for path in written {
        let _ = std::fs::remove_file(path);
    }
    drop(clusters);
    Ok(())
}

async fn gitea(dir: &Path, repo: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let env = dir.join("gitea.env");
    // A stale file from an earlier run must not announce a Gitea that is not up yet.
    let _ = std::fs::remove_file(&env);
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let gitea = fleetgate_testenv::Gitea::start().await?;
    let clone = gitea.create_repo(repo).await?;
    let text = format!(
        "GITEA_URL='{}'\nGITEA_TOKEN='{}'\nGITEA_REPOSITORY='{}'\nGITEA_CLONE_URL='{clone}'\nGITEA_PUSH_URL='{}'\nGITEA_REPO_PATH='{}'\n",
        gitea.url(),
        gitea.token(),
        gitea.repository(repo),
        gitea.push_url(repo),
        gitea.repo_path(repo).display()
    );
    // Written whole under another name first: a reader never sees half of it.
    std::fs::write(dir.join("gitea.env.tmp"), text)?;
    std::fs::rename(dir.join("gitea.env.tmp"), &env)?;
    eprintln!("fleetgate-testenv: Gitea {} up at {}; Ctrl-C stops it", fleetgate_testenv::GITEA_VERSION, gitea.url());
    tokio::select! {
        _ = sigint.recv() => {}
        _ = sigterm.recv() => {}
    }
    let _ = std::fs::remove_file(env);
    Ok(())
}

async fn startup_time(runs: usize, workloads: bool) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be at least 1");
    let mut secs = Vec::new();
    for run in 1..=runs {
        let started = Instant::now();
        let cluster = TestCluster::start(ClusterOptions::new("timing").with_workloads(workloads)).await?;
        let took = started.elapsed().as_secs_f64();
        cluster.stop();
        println!("run {run}: {took:.2}s");
        secs.push(took);
    }
    secs.sort_by(f64::total_cmp);
    let median = if runs % 2 == 1 { secs[runs / 2] } else { (secs[runs / 2 - 1] + secs[runs / 2]) / 2.0 };
    let what = if workloads { "with workloads" } else { "control plane only" };
    println!("median start-up ({what}, {runs} runs): {median:.2}s");
    Ok(())
}

/// Runs the starts concurrently; the first error wins (dropping the set aborts the others, which
/// stops whatever they had started).
async fn join_all<F>(futs: impl Iterator<Item = F>) -> anyhow::Result<Vec<TestCluster>>
where
    F: Future<Output = anyhow::Result<TestCluster>> + Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for (i, f) in futs.enumerate() {
        set.spawn(async move { (i, f.await) });
    }
    let mut out: Vec<Option<TestCluster>> = Vec::new();
    while let Some(res) = set.join_next().await {
        let (i, cluster) = res?;
        let cluster = cluster?;
        if out.len() <= i {
            out.resize_with(i + 1, || None);
        }
        out[i] = Some(cluster);
    }
    Ok(out.into_iter().flatten().collect())
}
