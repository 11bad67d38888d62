//! The agent's loop against real components, driven in-process one pass at a time: a real test
//! cluster (etcd + kube-apiserver, with kube-controller-manager, kube-scheduler and kwok when
//! workloads must roll out — a rollback waits for that), a fleet repo made from the template and
//! served by a real `git daemon`, a throw-away GnuPG key that signs the release tags, and releases
//! cut with the real `fleetgate release create`.
//!
//! The agents run as deployed: the cluster gets `deploy/` (what `kubectl apply -k deploy/`
//! installs, less the agent's own Deployment) and every agent authenticates as the
//! `fleetgate-agent` ServiceAccount with a TokenRequest token, so it holds exactly deploy/'s RBAC.
//! The test itself observes and sets up with the admin client ([`Fleet::cluster`]).
//!
//! Every cluster of the template gets a status key made by the real `ssh-keygen`, registered in
//! its `clusters/<name>.yaml` with the real `fleetgate cluster register` ([`Fleet::status_key`]
//! is the file an agent of that cluster is given).
//!
//! Each test makes a [`Fleet`], cuts and promotes releases, builds an [`Agent`] with
//! [`Fleet::agent`] and calls [`Agent::reconcile`] for each pass it wants. Dropping an agent and
//! building another over the same cluster is a restart: the state ConfigMap is all that survives
//! (the new agent gets a fresh Git cache, like a Pod's emptyDir).

use fleetgate::agent::state::{AgentState, StateStore};
use fleetgate::agent::{Agent, AgentServices, AgentSettings};
use fleetgate::status::{GitRemote, Status, StatusIdentity, StatusNote, StatusSigner};
pub use fleetgate_testenv::wait::{eventually, within};
use fleetgate_testenv::{
    AgentIdentity, ClusterOptions, DeployManifests, GitDaemon, GpgHome, TestCluster, git_in, ssh_keygen,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::Api;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The canary of the template: first wave, so no other cluster's status gates it.
pub const CLUSTER: &str = "cluster-a";
/// `metadata.name` of the template's `fleet.yaml`.
pub const FLEET_NAME: &str = "redis-fleet";
/// The agent's namespace (state, inventory, snapshots).
pub const AGENT_NS: &str = "fleetgate-system";
/// Where the template's Operator runs.
pub const OPERATOR_NS: &str = "redis-system";
const BIN: &str = env!("CARGO_BIN_EXE_fleetgate");

/// A gate policy that passes whenever the Operator's pods do not crash: bake 3 s, every second.
pub const QUICK_GATES: &str = "    - name: pod-restarts\n      podRestarts: {max: 3}\n";

/// A gate that a crash-looping Operator ([`crash_looping`]) fails within one bake.
pub const STRICT_RESTARTS: &str = "    - name: pod-restarts\n      podRestarts: {max: 1}\n";

/// A gate no release of the template passes: it waits for a Deployment the Operator never has.
pub const FAILING_GATES: &str = "    - name: canary-probe\n      onUnknown: fail\n      deploymentAvailable: {names: [redis-operator-canary-probe]}\n";

pub struct Fleet {
    pub cluster: TestCluster,
    /// The agents' credentials: the `fleetgate-agent` ServiceAccount of deploy/.
    pub agent_identity: AgentIdentity,
    pub daemon: GitDaemon,
    /// `git://` URL of the fleet repo.
    pub url: String,
    /// The working clone releases are cut and promoted from.
    pub work: PathBuf,
    pub gpg: GpgHome,
    /// The release key (trusted by the agents).
    pub fpr: String,
    /// Its armored public key: the agents' `--trusted-keys`.
    pub trusted: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Fleet {
    /// A cluster named `name` (with simulated workloads when `workloads`) with [`deploy_manifests`]
    /// applied, and the template fleet repo on a git daemon with a [`QUICK_GATES`] policy and no
    /// release yet.
    pub async fn start(name: &str, workloads: bool) -> Fleet {
        Fleet::start_deployed(name, workloads, &deploy_manifests()).await
    }

    /// [`start`](Self::start) with other manifests in place of deploy/'s (another Operator's RBAC).
    pub async fn start_deployed(name: &str, workloads: bool, manifests: &DeployManifests) -> Fleet {
        let cluster = TestCluster::start(ClusterOptions::new(name).with_workloads(workloads))
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let agent_identity =
            cluster.deploy_agent(manifests).await.unwrap_or_else(|e| panic!("deploying the agent: {e:#}"));
        let daemon = GitDaemon::start().expect("git daemon");
        let url = daemon.create_bare("fleet.git").expect("bare repo");
        let dir = tempfile::Builder::new().prefix("fg-agent").tempdir().unwrap();
        let work = dir.path().join("fleet");
        let init = Command::new(BIN).arg("init").arg(&work).output().unwrap();
        assert!(init.status.success(), "fleetgate init: {}", String::from_utf8_lossy(&init.stderr));
        let gpg = GpgHome::new().expect("gpg home");
        let fpr = gpg.generate_key("Release Bot", "release@example.com").expect("gpg key");
        let trusted = gpg.write_public_key(&fpr, &dir.path().join("release-key.asc")).unwrap();
        let fleet = Fleet { cluster, agent_identity, daemon, url, work, gpg, fpr, trusted, dir };
        fleet.git(&["remote", "add", "origin", &fleet.url]);
        for name in ["cluster-a", "cluster-b", "cluster-c"] {
            fleet.register_status_key(name, &fleet.status_public_key(name));
        }
        fleet.set_gates("3s", QUICK_GATES);
        fleet
    }

    /// The status key file of `cluster`'s agent (an OpenSSH Ed25519 key `ssh-keygen` made on
    /// first use).
    pub fn status_key(&self, cluster: &str) -> PathBuf {
        let path = self.dir.path().join(format!("status-key-{cluster}"));
        if !path.exists() {
            ssh_keygen(&path, cluster);
        }
        path
    }

    /// `ssh-ed25519 AAAA… comment` of [`status_key`](Self::status_key).
    pub fn status_public_key(&self, cluster: &str) -> String {
        let public = self.status_key(cluster).with_extension("pub");
        std::fs::read_to_string(public).unwrap().trim().to_string()
    }

    /// `fleetgate cluster register CLUSTER --status-key KEY` in the working clone (a commit on
    /// main, not pushed).
    pub fn register_status_key(&self, cluster: &str, key: &str) {
        let out = Command::new(BIN)
            .args(["cluster", "register", cluster, "--status-key", key, "--repo"])
            .arg(&self.work)
            .output()
            .unwrap();
        assert!(out.status.success(), "cluster register: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Runs git in the working clone with a fixed identity; returns stdout, trimmed.
    pub fn git(&self, args: &[&str]) -> String {
        git_in(&self.work, args)
    }

    /// Replaces `policies/gates.yaml` with a policy of `gates` (a YAML list indented by four
    /// spaces) baked for `bake`, evaluated every second, commits and pushes it. Releases cut
    /// afterwards carry it in their tag; the branch tip carries it from now on.
    pub fn set_gates(&self, bake: &str, gates: &str) {
        self.set_policy(bake, "", gates);
    }

    /// [`set_gates`](Self::set_gates) with more `spec` fields (lines indented by two spaces).
    pub fn set_policy(&self, bake: &str, spec: &str, gates: &str) {
        let policy = format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: GatePolicy\nmetadata:\n  name: redis-operator\nspec:\n  \
             bakeTime: {bake}\n  interval: 1s\n  callTimeout: 5s\n  onUnknown: failAfterBake\n{spec}  gates:\n{gates}"
        );
        std::fs::write(self.work.join("policies/gates.yaml"), policy).unwrap();
        self.commit_and_push(&format!("gates: bake {bake}"));
    }

    pub fn commit_and_push(&self, message: &str) {
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "--allow-empty", "-m", message]);
        self.git(&["push", "-q", "origin", "main"]);
    }

    /// Cuts release `id` signed by the trusted key, from the template's Operator manifests at image
    /// tag `v-<id>`, after `edit` changed them (the render directory is passed). Pushes branch and
    /// tag; returns the tagged commit.
    pub fn release(&self, id: &str, edit: impl FnOnce(&Path)) -> String {
        self.release_signed_by(id, &self.gpg, &self.fpr, edit)
    }

    /// [`release`](Self::release) signed by any key.
    pub fn release_signed_by(&self, id: &str, gpg: &GpgHome, fpr: &str, edit: impl FnOnce(&Path)) -> String {
        self.cut(id, gpg, fpr, &[], edit)
    }

    /// [`release`](Self::release) with more `release create` arguments (e.g. `--revokes rel-1`).
    pub fn release_with(&self, args: &[&str], id: &str, edit: impl FnOnce(&Path)) -> String {
        self.cut(id, &self.gpg, &self.fpr, args, edit)
    }

    /// A release the canary's admission baseline blocks (it binds cluster-admin; the release's
    /// own policy accepts it): a real rejection in the cluster, not a refusal at `release create`.
    pub fn blocked_release(&self, id: &str) -> String {
        self.release_with(&["--allow-admission", "the canary must block it"], id, |dir| {
            std::fs::write(
                dir.join("too-much.yaml"),
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: too-much\n\
                 roleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: cluster-admin\n\
                 subjects:\n  - kind: ServiceAccount\n    name: redis-operator\n    namespace: redis-system\n",
            )
            .unwrap();
        })
    }

    fn cut(&self, id: &str, gpg: &GpgHome, fpr: &str, args: &[&str], edit: impl FnOnce(&Path)) -> String {
        let render = self.dir.path().join("render").join(id);
        copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fleet-repo-template/operator"), &render);
        let deployment = render.join("deployment.yaml");
        let text = std::fs::read_to_string(&deployment).unwrap();
        let text = text.replace("redis-operator:v1.2.3-build.456", &format!("redis-operator:v-{id}"));
        std::fs::write(&deployment, text).unwrap();
        edit(&render);
        let out = Command::new(BIN)
            .args(["release", "create", "--repo"])
            .arg(&self.work)
            .args(["--id", id, "--manifests"])
            .arg(&render)
            .args(["--image", &format!("registry.example.com/redis-operator:v-{id}")])
            .args(["--chart-version", "1.0.0", "--crd-version", "v1alpha2", "--git-commit", "a1b2c3d4e5f6", "--all"])
            .args(["--sign-key", fpr, "--gpg-home"])
            .arg(gpg.path())
            .args(args)
            .arg("--push")
            .output()
            .unwrap();
        assert!(out.status.success(), "release create {id}: {}", String::from_utf8_lossy(&out.stderr));
        self.git(&["rev-parse", &format!("{id}^{{commit}}")])
    }

    /// Asks for `id` fleet-wide (`fleet.yaml` `spec.release`), commits and pushes.
    pub fn promote(&self, id: &str) {
        self.write_fleet_release(id);
        self.commit_and_push(&format!("promote {id} to the fleet"));
    }

    /// Sets `fleet.yaml` `spec.release` in the working clone.
    pub fn write_fleet_release(&self, id: &str) {
        let path = self.work.join("fleet.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut done = false;
        let lines: Vec<String> = text
            .lines()
            .map(|line| {
                let bare = line.trim_start().trim_start_matches("# ");
                if !done && line.starts_with("  ") && !line.starts_with("   ") && bare.starts_with("release: ") {
                    done = true;
                    format!("  release: {id}")
                } else {
                    line.to_string()
                }
            })
            .collect();
        assert!(done, "fleet.yaml has no spec.release line");
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    }

    /// Agent settings for [`CLUSTER`] against this fleet: the ServiceAccount's kubeconfig, no
    /// leader election, HTTP on a free port, a fresh Git cache, its registered status key.
    pub fn settings(&self) -> AgentSettings {
        self.settings_for(CLUSTER)
    }

    /// [`settings`](Self::settings) for any cluster of the fleet.
    pub fn settings_for(&self, name: &str) -> AgentSettings {
        static AGENTS: AtomicUsize = AtomicUsize::new(0);
        let cache = self.dir.path().join(format!("agent-cache-{}", AGENTS.fetch_add(1, Ordering::Relaxed)));
        AgentSettings {
            repo: Some(self.url.clone()),
            cluster: Some(name.into()),
            fleet: Some(FLEET_NAME.into()),
            status_key: Some(self.status_key(name)),
            kubeconfig: Some(self.agent_identity.kubeconfig_path().to_path_buf()),
            trusted_keys: vec![self.trusted.clone()],
            state_dir: Some(cache),
            listen: Some("127.0.0.1:0".parse().unwrap()),
            leader_elect: Some(false),
            // Write-back is on by default; here the working clone pushes after the agent, so a
            // test that wants the agent's commits asks for them.
            write_back: Some(false),
            ..Default::default()
        }
    }

    /// A spoke of its own for the fleet's cluster `name` (a test cluster called `spoke`, with
    /// deploy/ applied) and agent settings for it: for tests where several clusters each apply a
    /// release (two agents over one API server would find each other's objects foreign). The
    /// cluster must outlive the agent.
    pub async fn spoke(&self, spoke: &str, name: &str) -> (TestCluster, AgentSettings) {
        let cluster = TestCluster::start(ClusterOptions::new(spoke)).await.unwrap_or_else(|e| panic!("{e:#}"));
        let identity =
            cluster.deploy_agent(&deploy_manifests()).await.unwrap_or_else(|e| panic!("deploying the agent: {e:#}"));
        let settings =
            AgentSettings { kubeconfig: Some(identity.kubeconfig_path().to_path_buf()), ..self.settings_for(name) };
        (cluster, settings)
    }

    /// An agent started with `settings` (its services running, its state loaded).
    pub async fn agent_with(&self, settings: AgentSettings) -> Agent {
        let config = settings.resolve().unwrap_or_else(|e| panic!("agent settings: {e}"));
        let services = within("agent services start", 60, AgentServices::start(config)).await.unwrap();
        Agent::new(services).unwrap()
    }

    pub async fn agent(&self) -> Agent {
        self.agent_with(self.settings()).await
    }

    /// The state store the agents use, for setting up a state "left by a killed agent".
    /// `fleetgate agent` for [`CLUSTER`] as a process named `name` (its Lease identity starts with
    /// it), as the two-replica and kill -9 tests run it: its own Git cache, a 1 s poll, HTTP on
    /// `port`, a Lease of `lease_seconds`, write-back as `write_back` says.
    pub fn agent_command(&self, name: &str, port: u16, lease_seconds: u64, write_back: bool) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env("POD_NAME", name).args(["--log=info", "agent", "--repo", &self.url, "--cluster", CLUSTER]);
        cmd.args(["--fleet", FLEET_NAME]);
        cmd.arg("--status-key").arg(self.status_key(CLUSTER));
        cmd.arg("--kubeconfig").arg(self.agent_identity.kubeconfig_path());
        cmd.arg("--trusted-keys").arg(&self.trusted);
        cmd.arg("--state-dir").arg(self.dir.path().join(format!("cache-{name}")));
        cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--interval", "1s"]);
        cmd.args(["--lease-duration", &format!("{lease_seconds}s"), &format!("--write-back={write_back}")]);
        cmd
    }

    pub fn store(&self) -> StateStore {
        StateStore::new(self.cluster.client(), AGENT_NS, CLUSTER)
    }

    pub async fn state(&self) -> AgentState {
        within("load state", 30, self.store().load()).await.unwrap()
    }

    /// The `phase` key of the state ConfigMap, as a watcher (or `kubectl`) sees it.
    pub async fn phase(&self) -> Option<String> {
        let api: Api<ConfigMap> = Api::namespaced(self.cluster.client(), AGENT_NS);
        let cm = api.get_opt(&format!("fleetgate-state-{CLUSTER}")).await.ok()??;
        cm.data?.get("phase").cloned()
    }

    /// The statuses [`CLUSTER`] published for `commit`, oldest first, read from the notes ref on
    /// the git daemon's repo (what `fleetgate status` reads).
    pub fn statuses(&self, commit: &str) -> Vec<Status> {
        self.statuses_of(CLUSTER, commit)
    }

    /// [`statuses`](Self::statuses) of any cluster.
    pub fn statuses_of(&self, cluster: &str, commit: &str) -> Vec<Status> {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(self.daemon.path("fleet.git"))
            .args(["notes", &format!("--ref=refs/notes/fleetgate/{cluster}"), "show", commit])
            .output()
            .unwrap();
        if !out.status.success() {
            return Vec::new();
        }
        StatusNote::parse(&String::from_utf8_lossy(&out.stdout)).expect("a status note").entries
    }

    /// Asserts the last status of `release` (cut at `commit`) is its `failure`: rolled back to
    /// rel-1 by the restart gate `gate` (threshold `≤ 1`), with rel-1's image live again.
    pub async fn assert_rolled_back_by_restarts(&self, commit: &str, gate: &str) {
        let failure = self.statuses(commit).pop().expect("a status for the failed release");
        assert_eq!(failure.state, fleetgate::status::State::Failure);
        let cause = format!("rolled back to rel-1: {gate}");
        assert!(failure.description.starts_with(&cause), "{}", failure.description);
        let g = &failure.gates[0];
        assert_eq!((g.name.as_str(), g.threshold.as_str(), g.verdict.as_str()), (gate, "≤ 1", "fail"));
        assert_eq!(self.operator_image().await, Some(image_of("rel-1")));
    }

    /// The Operator Deployment's image, if it exists.
    pub async fn operator_image(&self) -> Option<String> {
        let api: Api<Deployment> = Api::namespaced(self.cluster.client(), OPERATOR_NS);
        let d = api.get_opt("redis-operator").await.unwrap()?;
        d.spec?.template.spec?.containers.first()?.image.clone()
    }

    /// Whether the agent applied Namespace `name` (it exists with fields owned by the agent's
    /// field manager): deploy/ creates the Operator's namespace itself, so existence says nothing.
    pub async fn namespace_applied(&self, name: &str) -> bool {
        let Some(ns) = Api::<Namespace>::all(self.cluster.client()).get_opt(name).await.unwrap() else { return false };
        ns.metadata.managed_fields.unwrap_or_default().iter().any(|f| f.manager.as_deref() == Some("fleetgate"))
    }
}

/// deploy/ of this checkout, as shipped.
pub fn deploy_manifests() -> DeployManifests {
    DeployManifests::shipped().unwrap_or_else(|e| panic!("{e:#}"))
}

/// The image of release `id` as [`Fleet::release`] renders it.
pub fn image_of(id: &str) -> String {
    format!("registry.example.com/redis-operator:v-{id}")
}

/// Copies the folder `from` (recursively) to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Everything the process logs through `tracing` from now on (every test of the binary shares
/// it: the subscriber is global, as the agent's tasks run on every runtime thread), at the
/// agent's production level (`info`) and everything fleetgate says at `debug`.
#[derive(Clone, Default)]
pub struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn install() -> LogCapture {
        static CAPTURE: std::sync::OnceLock<LogCapture> = std::sync::OnceLock::new();
        CAPTURE
            .get_or_init(|| {
                let capture = LogCapture::default();
                let subscriber = tracing_subscriber::fmt()
                    .json()
                    .with_env_filter(tracing_subscriber::EnvFilter::new("info,fleetgate=debug"))
                    .with_writer(capture.clone())
                    .finish();
                tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");
                capture
            })
            .clone()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogCapture {
    type Writer = LogCapture;

    fn make_writer(&'a self) -> LogCapture {
        self.clone()
    }
}

impl Fleet {
    /// Every object in the git daemon's repo (commits, trees, blobs, notes of every ref), as text.
    pub fn repo_objects(&self) -> String {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(self.daemon.path("fleet.git"))
            .args(["cat-file", "--batch-all-objects", "--batch"])
            .output()
            .unwrap();
        assert!(out.status.success(), "git cat-file: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The statuses waiting in [`CLUSTER`]'s outbox ConfigMap for Git to answer, as JSON text
    /// (`[]` when it was emptied, empty when there never was one).
    pub async fn outbox_text(&self) -> String {
        let api: Api<ConfigMap> = Api::namespaced(self.cluster.client(), AGENT_NS);
        let cm = api.get_opt(&format!("fleetgate-outbox-{CLUSTER}")).await.unwrap();
        cm.and_then(|c| c.data).and_then(|mut d| d.remove("statuses")).unwrap_or_default()
    }

    /// Every Event in the cluster (`events.k8s.io/v1` and core `v1`), as JSON.
    pub async fn events_json(&self) -> String {
        use kube::api::ListParams;
        let client = self.cluster.client();
        let new =
            Api::<k8s_openapi::api::events::v1::Event>::all(client.clone()).list(&ListParams::default()).await.unwrap();
        let core = Api::<k8s_openapi::api::core::v1::Event>::all(client).list(&ListParams::default()).await.unwrap();
        format!("{}\n{}", serde_json::to_string(&new.items).unwrap(), serde_json::to_string(&core.items).unwrap())
    }
}

/// What someone who can push, but holds no key, can do to the fleet repo (the attack tests).
impl Fleet {
    /// Replaces `from` with `to` in `path` of the working clone (the text must be there).
    pub fn edit(&self, path: &str, from: &str, to: &str) {
        let file = self.work.join(path);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains(from), "{path} does not contain {from:?}");
        std::fs::write(&file, text.replacen(from, to, 1)).unwrap();
    }

    /// Commits everything as a promotion signed by the release key (which the agents also take
    /// as their promotion key when given none), and pushes.
    pub fn commit_signed_and_push(&self, message: &str) {
        self.git(&["add", "-A"]);
        self.gpg.run_git(&self.work, &self.fpr, &["commit", "-q", "-S", "--allow-empty", "-m", message]).unwrap();
        self.git(&["push", "-q", "origin", "main"]);
    }

    /// [`promote`](Self::promote) as a signed decision.
    pub fn promote_signed(&self, id: &str) {
        self.write_fleet_release(id);
        self.commit_signed_and_push(&format!("promote {id} to the fleet (signed)"));
    }

    /// Force-pushes `commit` as the branch tip.
    pub fn force_push(&self, commit: &str) {
        self.git(&["reset", "-q", "--hard", commit]);
        self.git(&["push", "-q", "-f", "origin", "main"]);
    }

    pub fn tip(&self) -> String {
        self.git(&["rev-parse", "HEAD"])
    }

    /// Commits everything signed with `cluster`'s status key (an SSH signature, as `git commit -S`
    /// with `gpg.format=ssh` makes): what a compromised cluster, or its agent's write-back, can
    /// sign. Pushes.
    pub fn commit_signed_by_cluster_and_push(&self, cluster: &str, message: &str) {
        let key = format!("user.signingkey={}", self.status_key(cluster).display());
        self.git(&["add", "-A"]);
        self.git(&["-c", "gpg.format=ssh", "-c", &key, "commit", "-q", "-S", "--allow-empty", "-m", message]);
        self.git(&["push", "-q", "origin", "main"]);
    }

    /// `fleetgate status RELEASE -o json` against the git daemon: what a person sees.
    pub fn status_json(&self, release: &str) -> fleetgate::status::Matrix {
        let out = Command::new(BIN)
            .args(["status", release, "--repo", &self.url, "-o", "json"])
            .env_remove("FLEETGATE_REPO")
            .output()
            .unwrap();
        assert!(out.status.code().is_some_and(|c| c <= 1), "status: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `cluster`'s agent identity read from its key file: what that agent (or a compromise of its
    /// cluster) signs statuses with.
    pub fn status_identity(&self, cluster: &str) -> StatusIdentity {
        let text = std::fs::read_to_string(self.status_key(cluster)).unwrap();
        StatusIdentity::new(FLEET_NAME, StatusSigner::from_openssh(&text).unwrap())
    }

    /// Writes `status` into its cluster's notes ref on the server, signed as `identity`: another
    /// cluster's agent reporting, without running it.
    pub fn write_status_as(&self, identity: &StatusIdentity, status: &Status) {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_bare(dir.path()).unwrap();
        let remote = GitRemote::new(&self.url);
        fleetgate::status::sync(&repo, &remote).unwrap();
        fleetgate::status::write(&repo, &remote, status, identity).unwrap();
    }
}

/// A [`Fleet::release`] edit: the Operator's pods crash-loop (in a cluster with workloads).
pub fn crash_looping(render: &Path) {
    let path = render.join("deployment.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let label = format!("{}: \"true\"", fleetgate_testenv::TEST_FAIL_LABEL);
    // The pod template's labels are the second `labels:` block of the Deployment.
    let (head, tail) = text.split_at(text.match_indices("labels:").nth(1).expect("pod template labels").0);
    let indent = head.rsplit('\n').next().unwrap_or_default().len();
    let tail = tail.replacen("labels:\n", &format!("labels:\n{}  {label}\n", " ".repeat(indent)), 1);
    std::fs::write(&path, format!("{head}{tail}")).unwrap();
}
