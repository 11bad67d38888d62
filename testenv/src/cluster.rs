//! Real Kubernetes test clusters: etcd + kube-apiserver on loopback ports, each cluster in its own
//! short directory under `/tmp` with its own CA, serving certificate, admin client certificate
//! (group `system:masters`) and service-account key. With [`ClusterOptions::with_workloads`] it also
//! runs kube-controller-manager, kube-scheduler and kwok with one fake node, so Deployments really
//! produce ReplicaSets and Pods that become Running and Ready — or, for pods labelled
//! [`TEST_FAIL_LABEL`]`: "true"`, crash-loop forever (see `testenv/kwok/stages.yaml`).
//!
//! Start with [`TestCluster::start`]; dropping the handle (or [`TestCluster::stop`]) kills every
//! process and removes the directory. For outage tests, kube-apiserver can be stopped and started
//! again on the same port with the same certificates ([`TestCluster::stop_apiserver`],
//! [`TestCluster::start_apiserver`]; etcd keeps the data) and etcd paused with `SIGSTOP`
//! ([`TestCluster::pause_etcd`], [`TestCluster::resume_etcd`]). Processes are also bound to the test process itself
//! (`PR_SET_PDEATHSIG`), so a killed or aborted test run leaves none behind.
//!
//! Binaries come from [`binaries_dir`]: `KUBEBUILDER_ASSETS` if set, else `hack/k8s-binaries.sh`.

use crate::process::{Guarded, free_port};
use anyhow::{Context as _, bail};
use base64::Engine as _;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, ObjectMeta, PostParams};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

/// Pods carrying this label with value `"true"` never become Ready: kwok keeps their containers
/// crash-looping with a climbing `restartCount` (the failure stage in `testenv/kwok/stages.yaml`).
pub const TEST_FAIL_LABEL: &str = "fleetgate.io/test-fail";

/// Name of the one fake node of a cluster started with workloads.
pub const FAKE_NODE_NAME: &str = "kwok-node-0";

/// The complete kwok Stage set (node lifecycle, pod lifecycle, failure stage), compiled in so the
/// binaries do not depend on where the source tree is.
const KWOK_STAGES: &str = include_str!("../kwok/stages.yaml");

/// Attempts per start: free ports are picked before the servers bind them, so another process may
/// take one in between; such a clash is retried with fresh ports.
const START_ATTEMPTS: usize = 3;

/// Directory holding kube-apiserver, etcd and (for workloads) kube-controller-manager,
/// kube-scheduler and kwok.
///
/// `KUBEBUILDER_ASSETS` (the envtest convention) wins when set. Otherwise runs
/// `hack/k8s-binaries.sh` from the repository (`FLEETGATE_REPO`, else this crate's parent
/// directory), which prints the cache directory at once when the binaries are built and builds
/// them with Go otherwise (10-20 minutes cold). The answer is computed once per process.
pub fn binaries_dir() -> anyhow::Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| find_binaries_dir().map_err(|e| format!("{e:#}"))).clone().map_err(anyhow::Error::msg)
}

fn find_binaries_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    run_hack_script(
        "k8s-binaries.sh",
        &[],
        "set FLEETGATE_REPO to the fleetgate checkout, or KUBEBUILDER_ASSETS to a directory with kube-apiserver and etcd",
    )
}

/// `flux-ssa-bench` (bench/ssa: Flux's server-side apply engine, for examples/apply_bench.rs),
/// built into the cache by `hack/flux-ssa-bench.sh` on first use.
pub fn flux_ssa_bench_binary() -> anyhow::Result<PathBuf> {
    run_hack_script("flux-ssa-bench.sh", &[], "set FLEETGATE_REPO to the fleetgate checkout")
}

/// Runs `hack/<name>` of the fleetgate checkout (`FLEETGATE_REPO`, else this crate's parent) and
/// returns the path it prints last: the scripts that build a tool into the cache answer with
/// its location at once when it is there, and build it first otherwise. `hint` says what to do
/// when the script is missing.
pub(crate) fn run_hack_script(name: &str, args: &[&str], hint: &str) -> anyhow::Result<PathBuf> {
    let script = checkout_dir().join("hack").join(name);
    anyhow::ensure!(script.is_file(), "{} not found: {hint}", script.display());
    // stderr is inherited so a cold build shows its progress.
    let out = Command::new("bash")
        .arg(&script)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(out.status.success(), "{} failed ({})", script.display(), out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .with_context(|| format!("{} printed no path", script.display()))?;
    Ok(PathBuf::from(path))
}

/// The fleetgate checkout: `FLEETGATE_REPO`, else this crate's parent directory.
pub(crate) fn checkout_dir() -> PathBuf {
    match std::env::var_os("FLEETGATE_REPO").filter(|d| !d.is_empty()) {
        Some(repo) => PathBuf::from(repo),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
    }
}

/// What to start. `ClusterOptions::new("a").with_workloads(true)`.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Cluster name: lowercase letters, digits and `-`, at most 20 characters. Used in the
    /// kubeconfig (cluster and context name) and the directory name.
    pub name: String,
    /// Also run kube-controller-manager, kube-scheduler and kwok with one fake node.
    pub with_workloads: bool,
    /// Upper bound for the whole start, including waiting for `/readyz` and the node.
    pub start_timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions { name: "test".into(), with_workloads: false, start_timeout: Duration::from_secs(180) }
    }
}

impl ClusterOptions {
    pub fn new(name: impl Into<String>) -> Self {
        ClusterOptions { name: name.into(), ..Default::default() }
    }

    pub fn with_workloads(mut self, on: bool) -> Self {
        self.with_workloads = on;
        self
    }

    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }
}

/// A running cluster. Drop (or [`TestCluster::stop`]) kills its processes, newest first, and removes
/// its directory.
pub struct TestCluster {
    name: String,
    /// In start order; killed in reverse.
    procs: Vec<Guarded>,
    client: kube::Client,
    server_url: String,
    kubeconfig: PathBuf,
    /// Where the binaries are, and kube-apiserver's flags: a restart runs the same command.
    bin: PathBuf,
    apiserver_args: Vec<String>,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("name", &self.name)
            .field("server_url", &self.server_url)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// Starts the cluster and waits until kube-apiserver's `/readyz` is ok (and, with workloads,
    /// until the fake node is Ready and schedulable). Fails with the tail of every process's log.
    pub async fn start(opts: ClusterOptions) -> anyhow::Result<TestCluster> {
        validate_name(&opts.name)?;
        let bin = tokio::task::spawn_blocking(binaries_dir).await??;
        let mut needed = vec!["etcd", "kube-apiserver"];
        if opts.with_workloads {
            needed.extend(["kube-controller-manager", "kube-scheduler", "kwok"]);
        }
        for b in needed {
            anyhow::ensure!(
                bin.join(b).is_file(),
                "{} has no {b}: run hack/k8s-binaries.sh (or unset KUBEBUILDER_ASSETS, which lacks it)",
                bin.display()
            );
        }
        let deadline = Instant::now() + opts.start_timeout;
        let mut attempt = 1;
        loop {
            match start_once(&opts, &bin, deadline).await {
                Ok(cluster) => return Ok(cluster),
                Err(e) if attempt < START_ATTEMPTS && format!("{e:#}").contains("address already in use") => {
                    tracing::warn!(cluster = %opts.name, attempt, "port clash while starting, retrying with fresh ports");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Stops every process and removes the directory (the same as dropping the handle).
    pub fn stop(self) {
        drop(self);
    }

    /// A client authenticated as the admin user (`system:masters`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Creates namespace `name` (most tests need the agent's or the operator's first).
    pub async fn create_namespace(&self, name: &str) -> anyhow::Result<()> {
        let ns =
            Namespace { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() };
        Api::<Namespace>::all(self.client())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(())
    }

    /// Kubeconfig file with the certificates inline (`*-data`), context = cluster name.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `https://127.0.0.1:PORT`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// Name and pid of every running process of the cluster, in start order.
    pub fn processes(&self) -> Vec<(&str, u32)> {
        self.procs.iter().map(|p| (p.name(), p.pid())).collect()
    }

    /// The cluster's directory: certificates, etcd data, kubeconfig, `<process>.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills kube-apiserver. etcd keeps the data; the controllers, kwok and every client lose the
    /// server until [`start_apiserver`](Self::start_apiserver).
    pub fn stop_apiserver(&mut self) -> anyhow::Result<()> {
        let at = self.procs.iter().position(|p| p.name() == APISERVER).context("kube-apiserver is not running")?;
        drop(self.procs.remove(at));
        Ok(())
    }

    /// Starts kube-apiserver again after [`stop_apiserver`](Self::stop_apiserver): the same flags,
    /// so the same port, certificates and service-account keys (tokens issued before still
    /// authenticate). Returns once `/readyz` is ok, within `timeout`.
    pub async fn start_apiserver(&mut self, timeout: Duration) -> anyhow::Result<()> {
        anyhow::ensure!(!self.procs.iter().any(|p| p.name() == APISERVER), "kube-apiserver is running");
        let mut procs = Procs { dir: self.dir.path().to_path_buf(), list: Vec::new() };
        procs.spawn(&self.bin, APISERVER, self.apiserver_args.clone())?;
        let client = self.client.clone();
        let ready = wait_until("kube-apiserver /readyz after a restart", Instant::now() + timeout, &mut procs, || {
            apiserver_ready(&client)
        })
        .await;
        let tails = if ready.is_err() { procs.log_tails() } else { String::new() };
        // Back after etcd, so Drop still stops the apiserver's clients first and etcd last.
        let after_etcd = self.procs.iter().position(|p| p.name() == "etcd").map_or(0, |i| i + 1);
        self.procs.splice(after_etcd..after_etcd, procs.list.drain(..));
        ready.map_err(|e| anyhow::anyhow!("{e:#}{tails}"))
    }

    /// Freezes etcd with `SIGSTOP`: it keeps its connections open and answers nothing, as a
    /// stalled disk or a paused VM would, until [`resume_etcd`](Self::resume_etcd).
    pub fn pause_etcd(&self) -> anyhow::Result<()> {
        self.signal_etcd(libc::SIGSTOP)
    }

    /// Lets a [`pause_etcd`](Self::pause_etcd)d etcd run again (`SIGCONT`).
    pub fn resume_etcd(&self) -> anyhow::Result<()> {
        self.signal_etcd(libc::SIGCONT)
    }

    fn signal_etcd(&self, signal: libc::c_int) -> anyhow::Result<()> {
        let etcd = self.procs.iter().find(|p| p.name() == "etcd").context("etcd is not running")?;
        let pid = libc::pid_t::try_from(etcd.pid())?;
        // SAFETY: kill(2) on the pid of a child this handle owns and has not reaped.
        if unsafe { libc::kill(pid, signal) } != 0 {
            bail!("signalling etcd ({pid}): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }
}

const APISERVER: &str = "kube-apiserver";

/// Whether kube-apiserver's `/readyz` says ok.
async fn apiserver_ready(client: &kube::Client) -> anyhow::Result<bool> {
    let req = http::Request::get("/readyz").body(Vec::new())?;
    Ok(client.request_text(req).await?.trim() == "ok")
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        // Clients of the apiserver first, etcd last, so nothing logs a storm of errors meanwhile.
        while let Some(proc) = self.procs.pop() {
            drop(proc);
        }
        // The TempDir field then removes the directory.
    }
}

fn validate_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 20
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    anyhow::ensure!(ok, "cluster name {name:?}: use 1-20 lowercase letters, digits and '-'");
    Ok(())
}

/// One try at starting: on error everything started so far is killed and the directory removed.
async fn start_once(opts: &ClusterOptions, bin: &Path, deadline: Instant) -> anyhow::Result<TestCluster> {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(sweep_stale_dirs);
    // Short paths under /tmp: a long TMPDIR would only make logs harder to read.
    let dir = tempfile::Builder::new().prefix(&format!("fg-{}-", opts.name)).tempdir_in("/tmp")?;
    std::fs::write(dir.path().join(OWNER_FILE), std::process::id().to_string())?;
    let mut procs = Procs { dir: dir.path().to_path_buf(), list: Vec::new() };
    match start_processes(opts, bin, deadline, &mut procs).await {
        Ok(Started { client, server_url, kubeconfig, apiserver_args }) => Ok(TestCluster {
            name: opts.name.clone(),
            procs: std::mem::take(&mut procs.list),
            client,
            server_url,
            kubeconfig,
            bin: bin.to_path_buf(),
            apiserver_args,
            dir,
        }),
        Err(e) => {
            let tails = procs.log_tails();
            drop(procs);
            Err(anyhow::anyhow!("starting test cluster {:?} failed: {e:#}{tails}", opts.name))
        }
    }
}

/// Marks a cluster directory with the pid of the process that owns it.
const OWNER_FILE: &str = "fleetgate-testenv.pid";

/// Removes cluster directories left by test processes that were killed before `Drop` could run
/// (their servers died with them, see [`spawn_bound`]).
fn sweep_stale_dirs() {
    let Ok(entries) = std::fs::read_dir("/tmp") else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_name().to_string_lossy().starts_with("fg-") {
            continue;
        }
        let Some(pid) = std::fs::read_to_string(path.join(OWNER_FILE)).ok().and_then(|s| s.trim().parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only checks whether the process exists.
        let gone =
            unsafe { libc::kill(pid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// The processes of a cluster being started, with their logs in `dir/<name>.log`.
struct Procs {
    dir: PathBuf,
    list: Vec<Guarded>,
}

impl Procs {
    fn spawn(&mut self, bin: &Path, name: &str, args: Vec<String>) -> anyhow::Result<()> {
        let mut cmd = Command::new(bin.join(name));
        cmd.args(args).current_dir(&self.dir);
        let proc = spawn_bound(name, cmd, &self.dir.join(format!("{name}.log")))?;
        self.list.push(proc);
        Ok(())
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        for p in &mut self.list {
            if let Some(status) = p.exited() {
                bail!("{} exited early ({status})", p.name());
            }
        }
        Ok(())
    }

    fn log_tails(&self) -> String {
        let mut out = String::new();
        for p in &self.list {
            let log = self.dir.join(format!("{}.log", p.name()));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            out.push_str(&format!("\n--- last lines of {} ---\n{}", log.display(), tail.join("\n")));
        }
        out
    }
}

/// Polls `probe` every 100 ms (each try bounded to 5 s) until it says yes, a process dies, or the
/// deadline passes (then the probe's last error is reported).
async fn wait_until<F, Fut>(what: &str, deadline: Instant, procs: &mut Procs, mut probe: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    loop {
        procs.check_alive().with_context(|| format!("while waiting for {what}"))?;
        // A server that accepts connections but never answers must not stall past the deadline.
        let last = match tokio::time::timeout(Duration::from_secs(5), probe()).await {
            Ok(Ok(true)) => return Ok(()),
            Ok(Ok(false)) => "not yet".to_string(),
            Ok(Err(e)) => format!("{e:#}"),
            Err(_) => "no answer within 5s".to_string(),
        };
        if Instant::now() > deadline {
            bail!("timed out waiting for {what} (last: {last})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What [`start_processes`] leaves running and how to reach it.
struct Started {
    client: kube::Client,
    server_url: String,
    kubeconfig: PathBuf,
    apiserver_args: Vec<String>,
}

async fn start_processes(
    opts: &ClusterOptions,
    bin: &Path,
    deadline: Instant,
    procs: &mut Procs,
) -> anyhow::Result<Started> {
    let dir = procs.dir.clone();
    let p = |f: &str| dir.join(f).display().to_string();
    let pki = Pki::generate()?;
    pki.write(&dir)?;

    let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    procs.spawn(
        bin,
        "etcd",
        vec![
            "--name=default".into(),
            format!("--data-dir={}", p("etcd")),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            // Tests do not need durability; fsync dominates etcd's latency on a busy disk.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ],
    )?;
    let etcd_addr = format!("127.0.0.1:{etcd_port}");
    wait_until("etcd to listen", deadline, procs, || async {
        Ok(tokio::net::TcpStream::connect(&etcd_addr).await.is_ok())
    })
    .await?;

    let server_url = format!("https://127.0.0.1:{api_port}");
    // The flags controller-runtime's envtest uses (pkg/internal/testing/controlplane/apiserver.go).
    let apiserver_args = vec![
        format!("--etcd-servers={etcd_url}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={api_port}"),
        format!("--cert-dir={}", p("certs")),
        format!("--tls-cert-file={}", p("apiserver.crt")),
        format!("--tls-private-key-file={}", p("apiserver.key")),
        format!("--client-ca-file={}", p("ca.crt")),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--allow-privileged=true".into(),
        "--authorization-mode=RBAC".into(),
        // As envtest: Pods are admitted without waiting for the namespace's `default`
        // ServiceAccount (with workloads, the controller-manager still creates it).
        "--disable-admission-plugins=ServiceAccount".into(),
        format!("--service-account-issuer={server_url}"),
        format!("--service-account-key-file={}", p("sa.pub")),
        format!("--service-account-signing-key-file={}", p("sa.key")),
        // The `kubernetes` Service would point at 127.0.0.1, which Endpoints reject.
        "--endpoint-reconciler-type=none".into(),
        "--profiling=false".into(),
    ];
    procs.spawn(bin, APISERVER, apiserver_args.clone())?;

    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, pki.kubeconfig(&opts.name, &server_url))?;
    let client = client_from_kubeconfig(&kubeconfig).await?;
    wait_until("kube-apiserver /readyz", deadline, procs, || apiserver_ready(&client)).await?;

    if opts.with_workloads {
        start_workloads(bin, deadline, procs, &client, &kubeconfig).await?;
    }
    Ok(Started { client, server_url, kubeconfig, apiserver_args })
}

async fn start_workloads(
    bin: &Path,
    deadline: Instant,
    procs: &mut Procs,
    client: &kube::Client,
    kubeconfig: &Path,
) -> anyhow::Result<()> {
    let dir = procs.dir.clone();
    let p = |f: &str| dir.join(f).display().to_string();
    let kc = format!("--kubeconfig={}", kubeconfig.display());
    procs.spawn(
        bin,
        "kube-controller-manager",
        vec![
            kc.clone(),
            "--controllers=*".into(),
            "--leader-elect=false".into(),
            // Serve nothing: no port to collide with, and no delegated authn/authz to set up.
            "--secure-port=0".into(),
            format!("--service-account-private-key-file={}", p("sa.key")),
            format!("--root-ca-file={}", p("ca.crt")),
            format!("--cluster-signing-cert-file={}", p("ca.crt")),
            format!("--cluster-signing-key-file={}", p("ca.key")),
        ],
    )?;
    procs.spawn(bin, "kube-scheduler", vec![kc.clone(), "--leader-elect=false".into(), "--secure-port=0".into()])?;
    std::fs::write(dir.join("kwok-stages.yaml"), KWOK_STAGES)?;
    procs.spawn(
        bin,
        "kwok",
        vec![
            kc,
            format!("--config={}", p("kwok-stages.yaml")),
            "--manage-all-nodes=false".into(),
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".into(),
        ],
    )?;

    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &fake_node()).await.context("creating the fake node")?;
    // Ready comes from kwok; the not-ready taint goes once kube-controller-manager has seen it.
    wait_until("the fake node to be Ready and schedulable", deadline, procs, || async {
        let node = nodes.get(FAKE_NODE_NAME).await?;
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute"));
        Ok(ready && !tainted)
    })
    .await
}

fn fake_node() -> Node {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": FAKE_NODE_NAME,
            "annotations": { "kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0" },
            "labels": {
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": FAKE_NODE_NAME,
                "type": "kwok",
            },
        },
        "status": {
            "allocatable": { "cpu": "32", "memory": "256Gi", "pods": "110" },
            "capacity": { "cpu": "32", "memory": "256Gi", "pods": "110" },
        },
    }))
    .expect("static node manifest")
}

pub(crate) async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// A cluster's certificates and keys, all ECDSA P-256 in PKCS#8 PEM: Go reads them, and so does
/// kube's rustls client.
struct Pki {
    ca_cert: String,
    ca_key: String,
    serving_cert: String,
    serving_key: String,
    admin_cert: String,
    admin_key: String,
    sa_key: String,
    sa_pub: String,
}

impl Pki {
    fn generate() -> anyhow::Result<Pki> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
            KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name.push(DnType::CommonName, "fleetgate-testenv-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::from_params(&ca, &ca_key);

        let leaf = |sans: Vec<String>, cn: &str, org: Option<&str>, eku: ExtendedKeyUsagePurpose| {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(sans)?;
            params.distinguished_name = rcgen::DistinguishedName::new();
            params.distinguished_name.push(DnType::CommonName, cn);
            if let Some(org) = org {
                params.distinguished_name.push(DnType::OrganizationName, org);
            }
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.extended_key_usages = vec![eku];
            params.use_authority_key_identifier_extension = true;
            let cert = params.signed_by(&key, &issuer)?;
            anyhow::Ok((cert.pem(), key.serialize_pem()))
        };
        let sans = ["127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc"];
        let (serving_cert, serving_key) = leaf(
            sans.iter().map(|s| s.to_string()).collect(),
            "kube-apiserver",
            None,
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (admin_cert, admin_key) =
            leaf(Vec::new(), "fleetgate-admin", Some("system:masters"), ExtendedKeyUsagePurpose::ClientAuth)?;
        // Signs service-account tokens (apiserver) and is the token controller's key.
        let sa_key = KeyPair::generate()?;
        Ok(Pki {
            ca_cert: ca_cert.pem(),
            ca_key: ca_key.serialize_pem(),
            serving_cert,
            serving_key,
            admin_cert,
            admin_key,
            sa_key: sa_key.serialize_pem(),
            sa_pub: sa_key.public_key_pem(),
        })
    }

    fn write(&self, dir: &Path) -> anyhow::Result<()> {
        for (file, pem) in [
            ("ca.crt", &self.ca_cert),
            ("ca.key", &self.ca_key),
            ("apiserver.crt", &self.serving_cert),
            ("apiserver.key", &self.serving_key),
            ("sa.key", &self.sa_key),
            ("sa.pub", &self.sa_pub),
        ] {
            std::fs::write(dir.join(file), pem)?;
        }
        std::fs::create_dir_all(dir.join("certs"))?;
        Ok(())
    }

    fn kubeconfig(&self, name: &str, server_url: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: {server_url}
    certificate-authority-data: {ca}
users:
- name: {name}-admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: {name}
  context:
    cluster: {name}
    user: {name}-admin
current-context: {name}
",
            ca = b64(&self.ca_cert),
            cert = b64(&self.admin_cert),
            key = b64(&self.admin_key),
        )
    }
}

/// Spawns through [`Guarded::spawn`] from one long-lived thread, with `PR_SET_PDEATHSIG` set in the
/// child: the kernel then kills the child when that thread — which lives as long as the test
/// process — dies, even if the process is killed or aborts without running `Drop`. (The signal
/// follows the spawning *thread*, so spawning from a short-lived test or blocking-pool thread
/// would kill servers too early.)
fn spawn_bound(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Guarded> {
    type Job = (String, Command, PathBuf, mpsc::Sender<anyhow::Result<Guarded>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();

    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure only calls async-signal-safe functions (prctl, getppid).
        unsafe {
            let parent = std::process::id() as libc::pid_t;
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("parent exited during spawn"));
                }
                Ok(())
            });
        }
    }

    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for (name, cmd, log, reply) in rx {
                    let _ = reply.send(Guarded::spawn(&name, cmd, &log));
                }
            })
            .expect("spawning the testenv-spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    sender
        .lock()
        .map_err(|_| anyhow::anyhow!("testenv spawner lock poisoned"))?
        .send((name.to_string(), cmd, log.to_path_buf(), reply_tx))
        .map_err(|_| anyhow::anyhow!("testenv spawner thread is gone"))?;
    reply_rx.recv().map_err(|_| anyhow::anyhow!("testenv spawner thread is gone"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["a", "eu-west-1", "c0"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "A", "a_b", "a/b", "twenty-one-characters"] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kubeconfig_parses_and_carries_the_admin_identity() {
        let pki = Pki::generate().unwrap();
        let yaml = pki.kubeconfig("a", "https://127.0.0.1:6443");
        let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("a"));
        let auth = kc.auth_infos[0].auth_info.as_ref().unwrap();
        let cert =
            base64::engine::general_purpose::STANDARD.decode(auth.client_certificate_data.as_ref().unwrap()).unwrap();
        assert!(String::from_utf8(cert).unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pki.admin_key.starts_with("-----BEGIN PRIVATE KEY-----"), "PKCS#8");
    }
}
