//! Agent identities for the status tests that write notes without running an agent: one status
//! key per cluster name for the whole test binary, and the keys a reader believes them with; and
//! [`fleet`], a fleet repo served by `git daemon` with two releases and statuses on them.

use fleetgate::status::{self, GitRemote, State, Status, StatusIdentity, StatusKeys, StatusSigner};
use fleetgate_testenv::{GitDaemon, git_in, git_in_env};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

/// The fleet the identities belong to (the template's name).
pub const FLEET: &str = "redis-fleet";

fn signers() -> &'static Mutex<BTreeMap<String, StatusSigner>> {
    static SIGNERS: OnceLock<Mutex<BTreeMap<String, StatusSigner>>> = OnceLock::new();
    SIGNERS.get_or_init(Default::default)
}

/// `cluster`'s agent identity (the same key every time in this process).
pub fn identity(cluster: &str) -> StatusIdentity {
    let mut signers = signers().lock().unwrap();
    let signer = signers.entry(cluster.to_string()).or_insert_with(|| StatusSigner::generate(cluster).unwrap()).clone();
    StatusIdentity::new(FLEET, signer)
}

/// Keys that believe every identity made so far.
pub fn keys() -> StatusKeys {
    let mut keys = StatusKeys::new(FLEET);
    for (cluster, signer) in signers().lock().unwrap().iter() {
        keys.insert(cluster, signer.public());
    }
    keys
}

pub const OLD: &str = "rel-20250301-001";
pub const NEW: &str = "rel-20250315-001";

pub fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A cluster file registering the status key of `name`'s test identity.
pub fn cluster(name: &str, wave: &str, pin: Option<&str>) -> String {
    let pin = pin.map(|r| format!("  release: {r}\n")).unwrap_or_default();
    let key = identity(name).signer.public();
    format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  wave: {wave}\n{pin}  statusKey: {key}\n"
    )
}

pub struct Fleet {
    pub daemon: GitDaemon,
    pub url: String,
    pub old: String,
    pub new: String,
}

/// canary: cluster-a, cluster-b · prod: cluster-c, cluster-d (pinned to OLD). The fleet wants NEW.
/// cluster-a and cluster-c carry the label `region: eu`.
/// OLD succeeded everywhere; on NEW cluster-a succeeded, cluster-b failed and rolled back.
pub fn fleet() -> Fleet {
    let daemon = GitDaemon::start().unwrap();
    let url = daemon.create_bare("fleet.git").unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    git_in(w, &["init", "-q", "-b", "main"]);
    let fleet_yaml = |release: &str| {
        format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Fleet\nmetadata:\n  name: redis-fleet\nspec:\n  operator:\n    name: redis-operator\n    namespace: redis-system\n  release: {release}\n  waves: [canary, prod]\n  rollout:\n    maxFailedClusters: 2\n"
        )
    };
    // Labelled as a platform team would (`fleetgate status -l region=eu`).
    let in_eu = |name: &str, text: String| {
        text.replace(&format!("  name: {name}\n"), &format!("  name: {name}\n  labels:\n    region: eu\n"))
    };
    write(w, "clusters/cluster-a.yaml", &in_eu("cluster-a", cluster("cluster-a", "canary", None)));
    write(w, "clusters/cluster-b.yaml", &cluster("cluster-b", "canary", None));
    write(w, "clusters/cluster-c.yaml", &in_eu("cluster-c", cluster("cluster-c", "prod", None)));
    write(w, "clusters/cluster-d.yaml", &cluster("cluster-d", "prod", Some(OLD)));
    let mut commits = Vec::new();
    for (id, date) in [(OLD, "2025-03-01T10:00:00Z"), (NEW, "2025-03-15T10:00:00Z")] {
        write(w, "fleet.yaml", &fleet_yaml(id));
        write(w, "release.yaml", &format!("kind: Release\nmetadata:\n  name: {id}\n"));
        let env = [("GIT_COMMITTER_DATE", date), ("GIT_AUTHOR_DATE", date)];
        git_in_env(w, &env, &["add", "."]);
        git_in_env(w, &env, &["commit", "-q", "-m", &format!("release {id}")]);
        git_in_env(w, &env, &["tag", "-a", id, "-m", id]);
        commits.push(git_in(w, &["rev-parse", "HEAD"]));
    }
    // Tags on a commit without release.yaml are not releases.
    git_in(w, &["rm", "-q", "release.yaml"]);
    git_in(w, &["commit", "-q", "-m", "tidy"]);
    git_in(w, &["tag", "not-a-release"]);
    git_in(w, &["tag", "-a", "docs-1", "-m", "docs"]);
    git_in(w, &["push", "-q", "--tags", &url, "main"]);
    let fleet = Fleet { daemon, url, old: commits[0].clone(), new: commits[1].clone() };

    let agent = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(agent.path()).unwrap();
    repo.remote_anonymous(&fleet.url).unwrap().fetch(&["+refs/tags/*:refs/tags/*"], None, None).unwrap();
    let remote = GitRemote::new(&fleet.url);
    for c in ["cluster-a", "cluster-b", "cluster-c", "cluster-d"] {
        let ok = Status::new(c, OLD, &fleet.old, State::Success, "all 4 gates passed over 10m");
        status::write(&repo, &remote, &ok, &identity(c)).unwrap();
    }
    let a = identity("cluster-a");
    status::write(&repo, &remote, &Status::new("cluster-a", NEW, &fleet.new, State::Pending, "baking"), &a).unwrap();
    status::write(&repo, &remote, &Status::new("cluster-a", NEW, &fleet.new, State::Success, "all 4 gates passed"), &a)
        .unwrap();
    let failed = Status::new(
        "cluster-b",
        NEW,
        &fleet.new,
        State::Failure,
        "rolled back to rel-20250301-001: error-rate 7.3 % > 5 %",
    )
    .rolled_back_to(OLD);
    status::write(&repo, &remote, &failed, &identity("cluster-b")).unwrap();
    fleet
}

/// `fleetgate ARGS` as a person at an 80-column terminal without colours runs it, with no repo
/// from the environment.
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(args)
        .env("COLUMNS", "80")
        .env("NO_COLOR", "1")
        .env_remove("FLEETGATE_REPO")
        .output()
        .unwrap()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Writes `cluster`'s status for release `id` into the notes of the fleet repo at `repo` as its
/// agent would: signed with its key (registered first on `main` with `cluster register` when it
/// is not yet), then added with plain `git notes` (replacing the cluster's note on that commit).
/// Sequences count up across the test binary: a later report is the newer word.
pub fn report(repo: &Path, cluster: &str, id: &str, state: State) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQUENCE: AtomicU64 = AtomicU64::new(1);
    let me = identity(cluster);
    let fleet_repo = fleetgate::releng::FleetRepo::open(repo).unwrap();
    fleetgate::releng::register::register(&fleet_repo, "main", cluster, &me.signer.public().to_string(), None).unwrap();
    let commit = git_in(repo, &["rev-parse", &format!("{id}^{{commit}}")]);
    let mut entry = Status::new(cluster, id, &commit, state, "reported by the test");
    me.signer.sign(&mut entry, FLEET, SEQUENCE.fetch_add(1, Ordering::Relaxed)).unwrap();
    let mut note = fleetgate::status::StatusNote::new(cluster);
    note.append(&entry);
    git_in(repo, &["notes", "--ref", &format!("fleetgate/{cluster}"), "add", "-f", "-m", &note.to_text(), &commit]);
}

/// Headless Chromium from PATH, or None after saying SKIPPED (the page tests need it).
pub fn chromium() -> Option<std::path::PathBuf> {
    let found = ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::var_os("PATH")?.to_str()?.split(':').map(|d| std::path::Path::new(d).join(name)).find(|p| p.is_file())
    });
    if found.is_none() {
        eprintln!("SKIPPED: no chromium on PATH (`make deps-test` installs Debian's chromium)");
    }
    found
}
