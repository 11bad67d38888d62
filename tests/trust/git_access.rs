//! Git access the way an agent in a cluster needs it, each against the real server started here on
//! loopback:
//!
//! * SSH with strict host key checking against Debian's `sshd` serving the fleet repo (Git
//!   commands only): fetch and status-note pushes with the right `known_hosts`; a wrong host key,
//!   a host missing from `known_hosts` and no `known_hosts` at all each refused before any
//!   credential is offered, not retried, with a message that says what to put where. Also
//!   through the agent's configuration (`gitSshKey`/`gitKnownHosts` files of a mounted Secret,
//!   re-read per connection), a whole agent as deployed, `fleetgate validate --known-hosts` and
//!   `fleetgate promote --push`.
//! * HTTPS (fleetgate's own transport) against Gitea served over TLS with a CA made here: `caFile`
//!   makes it work, no `caFile` or the wrong CA is `SourceError::Certificate`, not retried; a
//!   private repo is fetched and pushed to with a token, and refused without one or with a wrong
//!   one (`SourceError::Auth`, not retried); the CLI asks Git's credential helpers when it has no
//!   token.
//! * Proxies: Git over HTTPS through Debian's tinyproxy (its log shows the `CONNECT`s), and
//!   `NO_PROXY` bypassing it, also from the environment of `fleetgate validate`; `http://` repos
//!   through `HTTP_PROXY` (plain HTTP is fleetgate's own transport too).
//! * Every CLI command that reaches a repo takes the same flags.
//!
//! A test whose server binary is absent says so and returns.

use crate::agent_support;
use crate::fleet_support;
use crate::status_support;
use crate::tls_support;

use fleet_support::{FleetRemote, RELEASE};
use fleetgate::agent::config::AgentSettings;
use fleetgate::model::ErrorClass;
use fleetgate::source::{CA_HINT, Credentials, ProxyEnv, RetryPolicy, Source, SourceError};
use fleetgate::status::{self, GitRemote, NotesError, State, Status};
use fleetgate_testenv::{Gitea, GiteaOptions, Sshd, Tinyproxy, git_in, ssh_keygen};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use tls_support::{Pki, pki};

/// The fleet repo (the template with a signed release) served by sshd, and the agent's deploy key.
struct SshFleet {
    remote: FleetRemote,
    sshd: Sshd,
    url: String,
    /// The agent's private key (its public half is the server's one authorized key).
    key: PathBuf,
    dir: tempfile::TempDir,
}

/// None (after saying so) when sshd is not installed.
fn ssh_fleet() -> Option<SshFleet> {
    if Sshd::binary().is_none() {
        eprintln!("{}", Sshd::skip_message());
        return None;
    }
    let remote = FleetRemote::new();
    remote.signed_tag(RELEASE);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("deploy_key");
    ssh_keygen(&key, "fleetgate-agent");
    let sshd = Sshd::start(&std::fs::read_to_string(key.with_extension("pub")).unwrap()).expect("sshd");
    let url = sshd.url(&remote.daemon.path("fleet.git"));
    Some(SshFleet { remote, sshd, url, key, dir })
}

impl SshFleet {
    fn credentials(&self, known_hosts: Option<String>) -> Credentials {
        Credentials { ssh_key: Some(self.key.clone()), known_hosts, ..Credentials::default() }
    }

    /// A mirror of the repo over SSH in a fresh state dir, with `credentials`; retries kept short.
    fn source(&self, credentials: Credentials) -> (tempfile::TempDir, Source) {
        let state = tempfile::tempdir().unwrap();
        let source = Source::open(&self.url, state.path(), credentials).unwrap().with_retry(quick_retry());
        (state, source)
    }

    /// [`wrong_known_hosts`] for this server.
    fn wrong_known_hosts(&self) -> String {
        wrong_known_hosts(&self.sshd)
    }

    /// The SHA-256 fingerprint of the server's host key, as `ssh-keygen -l` prints it.
    fn fingerprint(&self) -> String {
        let file = self.dir.path().join("server.pub");
        std::fs::write(&file, format!("{}\n", self.sshd.host_key())).unwrap();
        let out = Command::new("ssh-keygen").arg("-l").arg("-f").arg(&file).output().unwrap();
        assert!(out.status.success(), "ssh-keygen -l: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).split_whitespace().nth(1).unwrap().to_string()
    }
}

/// A known_hosts line for `sshd` with another key (an impostor's, or a rotated one).
fn wrong_known_hosts(sshd: &Sshd) -> String {
    let keys = tempfile::tempdir().unwrap();
    let other = keys.path().join("other_host_key");
    ssh_keygen(&other, "another host");
    let key = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    let key: Vec<&str> = key.split_whitespace().take(2).collect();
    format!("[127.0.0.1]:{} {}\n", sshd.port(), key.join(" "))
}

/// The agent's Git credentials Secret as its volume is mounted: one file per key
/// (`ssh-privatekey`, `known_hosts`) in a directory under `dir`, which is returned.
fn credentials_secret(dir: &Path, key: &Path, known_hosts: &str) -> PathBuf {
    let secret = dir.join("git-credentials");
    std::fs::create_dir(&secret).unwrap();
    std::fs::copy(key, secret.join("ssh-privatekey")).unwrap();
    std::fs::write(secret.join("known_hosts"), known_hosts).unwrap();
    secret
}

fn quick_retry() -> RetryPolicy {
    RetryPolicy { attempts: 2, initial: Duration::from_millis(50), max: Duration::from_millis(100) }
}

/// The error of a sync that must be refused for its host key; its message.
fn host_key_refusal(source: &mut Source) -> String {
    match source.sync() {
        Err(e @ SourceError::HostKey { .. }) => {
            assert_eq!(e.class(), ErrorClass::Stalling, "a refused host key is not retried");
            e.to_string()
        }
        other => panic!("expected SourceError::HostKey, got {other:?}"),
    }
}

#[test]
fn ssh_fetches_and_pushes_status_notes_with_the_right_host_key() {
    let Some(f) = ssh_fleet() else { return };
    let creds = f.credentials(Some(f.sshd.known_hosts_line()));
    let (state, mut source) = f.source(creds.clone());
    let synced = source.sync().expect("sync over ssh");
    assert!(synced.fetched);
    assert_eq!(synced.tip.to_string(), f.remote.git(&["rev-parse", "main"]).trim());
    assert!(source.checkout().unwrap().tag(RELEASE).unwrap().is_some(), "the release tag came over ssh");

    // A status note, written in the mirror as the agent does, pushed over the same connection setup.
    let mirror = git2::Repository::open_bare(state.path().join("mirror.git")).unwrap();
    let commit = f.remote.git(&["rev-parse", &format!("{RELEASE}^{{commit}}")]).trim().to_string();
    let s = Status::new("cluster-a", RELEASE, &commit, State::Success, "all gates passed");
    let remote = GitRemote::new(&f.url).with_access(creds.clone());
    status::write(&mirror, &remote, &s, &status_support::identity("cluster-a")).expect("status note pushed over ssh");
    let bare = f.remote.daemon.path("fleet.git");
    let pushed = git_in(&bare, &["rev-parse", "refs/notes/fleetgate/cluster-a"]);
    assert_eq!(pushed, mirror.refname_to_id("refs/notes/fleetgate/cluster-a").unwrap().to_string());

    // Another agent's mirror fetches that note over SSH.
    let (_state, mut other) = f.source(creds);
    other.sync().unwrap();
    assert!(other.local_refs().unwrap().refs.contains_key("refs/notes/fleetgate/cluster-a"));
    // ls-remote + fetch per sync, plus the push (and its pre-push fetch): all through sshd.
    assert!(f.sshd.sessions() >= 4, "sshd served {} sessions:\n{}", f.sshd.sessions(), f.sshd.log());
}

#[test]
fn ssh_refuses_a_wrong_host_key_before_offering_the_key() {
    let Some(f) = ssh_fleet() else { return };
    let (_state, mut source) = f.source(f.credentials(Some(f.wrong_known_hosts())));
    let message = host_key_refusal(&mut source);
    println!("{message}");
    assert!(message.contains("SSH HOST KEY MISMATCH"), "{message}");
    assert!(message.contains(&format!("[127.0.0.1]:{}", f.sshd.port())), "names the host: {message}");
    assert!(message.contains(&f.fingerprint()), "names the key the server offered: {message}");
    assert!(message.contains("update known_hosts"), "says what to do: {message}");
    assert_eq!(source.stats().ls_remotes, 1, "refused once, not retried");

    // Pushing status notes is refused the same way (the release fetched over git:// first).
    let agent = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(agent.path()).unwrap();
    repo.remote_anonymous(&f.remote.url).unwrap().fetch(&["+refs/tags/*:refs/tags/*"], None, None).unwrap();
    let commit = f.remote.git(&["rev-parse", &format!("{RELEASE}^{{commit}}")]).trim().to_string();
    let s = Status::new("cluster-a", RELEASE, &commit, State::Success, "x");
    let remote = GitRemote::new(&f.url).with_access(f.credentials(Some(f.wrong_known_hosts())));
    match status::write(&repo, &remote, &s, &status_support::identity("cluster-a")) {
        Err(NotesError::Fetch { source, .. } | NotesError::Push { source, .. }) => {
            assert!(source.message().contains("SSH HOST KEY MISMATCH"), "{source}")
        }
        other => panic!("expected a refused connection, got {other:?}"),
    }
    // The host check comes before authentication: the impostor never saw the deploy key.
    assert!(!f.sshd.log().contains("Accepted key"), "the key was offered:\n{}", f.sshd.log());
    assert_eq!(f.sshd.sessions(), 0);
}

#[test]
fn ssh_refuses_a_host_missing_from_known_hosts_and_a_missing_known_hosts() {
    let Some(f) = ssh_fleet() else { return };
    // The right key, but listed for another port: a different host to SSH.
    let elsewhere = format!("[127.0.0.1]:{} {}\n", f.sshd.port() + 1, f.sshd.host_key());
    let (_s1, mut source) = f.source(f.credentials(Some(elsewhere)));
    let message = host_key_refusal(&mut source);
    println!("{message}");
    assert!(message.contains("known_hosts lists no key for this host"), "{message}");
    assert!(message.contains(&f.fingerprint()) && message.contains("ssh-keyscan"), "{message}");

    let (_s2, mut source) = f.source(f.credentials(None));
    let message = host_key_refusal(&mut source);
    println!("{message}");
    assert!(message.contains("no known_hosts is configured"), "{message}");
    for hint in ["key `known_hosts` of the Git credentials Secret", "--git-known-hosts", "--known-hosts"] {
        assert!(message.contains(hint), "{hint} missing: {message}");
    }
    assert_eq!(f.sshd.sessions(), 0);
}

/// The agent as deployed: its settings name files of the mounted credentials Secret, which are
/// read again for every connection, so a rotated `known_hosts` applies without a restart.
#[test]
fn the_agent_reads_known_hosts_from_its_credentials_secret() {
    let Some(f) = ssh_fleet() else { return };
    let secret = credentials_secret(f.dir.path(), &f.key, &f.sshd.known_hosts_line());
    let config = f.dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "repo: {}\ncluster: cluster-a\ntrustedKeys: [{}]\nstateDir: {}\n\
             gitSshKey: {}/ssh-privatekey\ngitKnownHosts: {}/known_hosts\n",
            f.url,
            f.remote.trusted.display(),
            f.dir.path().join("state").display(),
            secret.display(),
            secret.display()
        ),
    )
    .unwrap();
    let agent = AgentSettings::from_file(&config).unwrap().resolve().unwrap();
    let open = || {
        Source::open(&agent.repo.url(), &agent.state_dir, agent.git_credentials.to_source().unwrap())
            .unwrap()
            .with_retry(quick_retry())
    };
    assert!(open().sync().expect("the agent's settings reach the repo over ssh").fetched);

    // The Secret is updated with a key the server does not have: the next connection refuses.
    std::fs::write(secret.join("known_hosts"), f.wrong_known_hosts()).unwrap();
    let message = host_key_refusal(&mut open());
    assert!(message.contains("SSH HOST KEY MISMATCH"), "{message}");
}

/// A whole agent as deployed (its ServiceAccount, deploy/'s RBAC, a real API server) whose fleet
/// repo is reached over SSH only: it fetches, applies and pushes its statuses through sshd; given a
/// known_hosts with another key, its pass fails on the host key and nothing is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_as_deployed_reconciles_over_ssh_and_refuses_a_wrong_host_key() {
    use agent_support::{CLUSTER, Fleet, within};
    use fleetgate::agent::Outcome;
    if Sshd::binary().is_none() {
        eprintln!("{}", Sshd::skip_message());
        return;
    }
    let fleet = Fleet::start("git-ssh", false).await;
    let commit = fleet.release("rel-1", |_| {});
    fleet.promote("rel-1");
    let key = fleet.dir.path().join("deploy_key");
    ssh_keygen(&key, "fleetgate-agent");
    let sshd = Sshd::start(&std::fs::read_to_string(key.with_extension("pub")).unwrap()).expect("sshd");
    let secret = credentials_secret(fleet.dir.path(), &key, &sshd.known_hosts_line());
    let settings = || fleetgate::agent::AgentSettings {
        repo: Some(sshd.url(&fleet.daemon.path("fleet.git"))),
        git_ssh_key: Some(secret.join("ssh-privatekey")),
        git_known_hosts: Some(secret.join("known_hosts")),
        ..fleet.settings()
    };

    let mut agent = fleet.agent_with(settings()).await;
    let outcome = within("reconcile rel-1 over ssh", 90, agent.reconcile()).await.unwrap();
    assert_eq!(outcome, Outcome::Succeeded("rel-1".into()));
    let statuses = fleet.statuses(&commit);
    assert_eq!(statuses.last().map(|s| (s.cluster.as_str(), s.state)), Some((CLUSTER, State::Success)), "{statuses:?}");
    assert!(sshd.sessions() >= 3, "fetches and status pushes went through sshd:\n{}", sshd.log());
    drop(agent);

    // The Secret's known_hosts now holds another key: a restarted agent refuses the server.
    std::fs::write(secret.join("known_hosts"), wrong_known_hosts(&sshd)).unwrap();
    let mut agent = fleet.agent_with(settings()).await;
    let err = within("reconcile with a wrong host key", 60, agent.reconcile()).await.unwrap_err();
    let message = fleetgate::model::error_chain(&err);
    assert!(message.contains("SSH HOST KEY MISMATCH"), "{message}");
    assert!(matches!(err, fleetgate::agent::ReconcileError::Source(SourceError::HostKey { .. })), "{err:?}");
}

/// `fleetgate` with `args`, its environment cleared of the machine's Git and SSH settings.
fn fleetgate(args: &[&str], env: &[(&str, &str)], home: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(args)
        .env("HOME", home)
        .env("NO_COLOR", "1")
        .env_remove("SSH_AUTH_SOCK")
        .env_remove("FLEETGATE_KNOWN_HOSTS")
        .env_remove("FLEETGATE_GIT_CA_FILE")
        .env_remove("FLEETGATE_GIT_TOKEN")
        .envs(["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"].map(|v| (v, "")))
        .envs(env.iter().copied())
        .current_dir(home)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn validate_over_ssh_checks_the_host_key_given_with_known_hosts() {
    let Some(f) = ssh_fleet() else { return };
    let home = f.dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let good = f.dir.path().join("known_hosts");
    std::fs::write(&good, f.sshd.known_hosts_line()).unwrap();
    let (key, trusted) = (f.key.display().to_string(), f.remote.trusted.display().to_string());
    let validate = |known_hosts: &Path| {
        let kh = known_hosts.display().to_string();
        let args = ["validate", "--repo", &f.url, "--trusted-keys", &trusted, "--ssh-key", &key, "--known-hosts", &kh];
        fleetgate(&args, &[], &home)
    };
    let out = validate(&good);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));

    let wrong = f.dir.path().join("wrong_known_hosts");
    std::fs::write(&wrong, f.wrong_known_hosts()).unwrap();
    let out = validate(&wrong);
    println!("{}", stderr(&out));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("SSH HOST KEY MISMATCH"), "{}", stderr(&out));
    assert!(stderr(&out).contains(&f.fingerprint()), "{}", stderr(&out));
}

/// `fleetgate promote --push` over SSH: the statuses it checks are fetched and the promotion
/// branch pushed through sshd; with a wrong host key (and `--offline`, so the push is the first
/// connection) the push is refused and says why.
#[test]
fn promote_pushes_over_ssh_and_refuses_a_wrong_host_key() {
    let Some(f) = ssh_fleet() else { return };
    // The fleet runs nothing yet, so promoting the release to the canary changes something.
    f.remote.edit("fleet.yaml", "  release: rel-20250315-001", "  # release: rel-20250315-001");
    f.remote.commit_all("the fleet runs nothing");
    f.remote.git(&["push", "-q", "origin", "main"]);
    // Who commits the promotion (the test's HOME has no Git configuration).
    git_in(&f.remote.work, &["config", "user.name", "Release Manager"]);
    git_in(&f.remote.work, &["config", "user.email", "rm@example.com"]);
    let home = f.dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let good = f.dir.path().join("known_hosts");
    std::fs::write(&good, f.sshd.known_hosts_line()).unwrap();
    let wrong = f.dir.path().join("wrong_known_hosts");
    std::fs::write(&wrong, f.wrong_known_hosts()).unwrap();
    let (key, trusted, work) =
        (f.key.display().to_string(), f.remote.trusted.display().to_string(), f.remote.work.display().to_string());
    let promote = |branch: &str, known_hosts: &Path, extra: &[&str]| {
        let kh = known_hosts.display().to_string();
        let mut args = vec!["promote", RELEASE, "--cluster", "cluster-a", "--repo", &work, "--branch", branch];
        args.extend([
            "--trusted-keys",
            &trusted,
            "--push",
            "--remote",
            &f.url,
            "--ssh-key",
            &key,
            "--known-hosts",
            &kh,
        ]);
        args.extend(extra);
        fleetgate(&args, &[], &home)
    };
    let out = promote("promote/over-ssh", &good, &[]);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    let bare = f.remote.daemon.path("fleet.git");
    assert!(!git_in(&bare, &["branch", "--list", "promote/over-ssh"]).is_empty(), "the branch was not pushed");

    let out = promote("promote/refused", &wrong, &["--offline"]);
    println!("{}", stderr(&out));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("SSH HOST KEY MISMATCH"), "{}", stderr(&out));
    assert!(git_in(&bare, &["branch", "--list", "promote/refused"]).is_empty());
}

/// Every command that reaches a repo takes the same Git access flags (one shared args struct).
#[test]
fn every_command_that_reaches_a_repo_takes_known_hosts_and_ca_file() {
    let home = tempfile::tempdir().unwrap();
    let commands: [(&[&str], [&str; 2]); 7] = [
        (&["agent"], ["--git-known-hosts", "--git-ca-file"]),
        (&["validate"], ["--known-hosts", "--ca-file"]),
        (&["status"], ["--known-hosts", "--ca-file"]),
        (&["diff"], ["--known-hosts", "--ca-file"]),
        (&["promote"], ["--known-hosts", "--ca-file"]),
        (&["rollback"], ["--known-hosts", "--ca-file"]),
        (&["wait"], ["--known-hosts", "--ca-file"]),
    ];
    for (command, flags) in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let out = fleetgate(&args, &[], home.path());
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{command:?} --help: {}", stderr(&out));
        for flag in flags {
            assert!(help.contains(flag), "fleetgate {} lacks {flag}:\n{help}", command.join(" "));
        }
    }
}

/// The fleet repo (with a signed release) on Gitea, over HTTPS with a CA made here or over HTTP.
struct GiteaFleet {
    gitea: Gitea,
    url: String,
    /// None: plain HTTP.
    pki: Option<Pki>,
    remote: FleetRemote,
    dir: tempfile::TempDir,
}

/// [`gitea_fleet`] over HTTPS.
async fn https_fleet() -> Option<GiteaFleet> {
    gitea_fleet(true).await
}

/// None (after saying so) when Gitea is not built.
async fn gitea_fleet(tls: bool) -> Option<GiteaFleet> {
    if Gitea::binary().is_none() {
        eprintln!("{}", Gitea::skip_message());
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = tls.then(|| pki(dir.path(), "forge"));
    let options = GiteaOptions { tls: pki.as_ref().map(|p| (p.chain.clone(), p.key.clone())) };
    let gitea = Gitea::start_with(options).await.expect("gitea");
    let url = gitea.create_repo("fleet").await.unwrap();
    let remote = FleetRemote::new();
    remote.signed_tag(RELEASE);
    let mut push = Command::new("git");
    push.arg("-C").arg(&remote.work).args([
        "push",
        "-q",
        &gitea.push_url("fleet"),
        "main",
        &format!("refs/tags/{RELEASE}"),
    ]);
    if let Some(pki) = &pki {
        // GIT_SSL_CAINFO, not http.sslCAInfo: the variable wins over the setting, and may be set here.
        push.env("GIT_SSL_CAINFO", &pki.ca);
    }
    let out = push.output().unwrap();
    assert!(out.status.success(), "git push to gitea: {}", String::from_utf8_lossy(&out.stderr));
    Some(GiteaFleet { gitea, url, pki, remote, dir })
}

impl GiteaFleet {
    /// The CA of a Gitea served over HTTPS.
    fn ca(&self) -> PathBuf {
        self.pki.as_ref().expect("gitea is served over https").ca.clone()
    }

    /// Makes the fleet repo private: reading it needs credentials.
    async fn make_private(&self) {
        let path = format!("/repos/{}", self.gitea.repository("fleet"));
        self.gitea.api(reqwest::Method::PATCH, &path, Some(serde_json::json!({"private": true}))).await.unwrap();
    }

    fn sync(&self, credentials: Credentials) -> Result<Source, SourceError> {
        let state = self.dir.path().join(format!("state-{}", next_state()));
        let mut source = Source::open(&self.url, &state, credentials)?.with_retry(quick_retry());
        source.sync()?;
        Ok(source)
    }
}

/// `result` is the refusal `is` accepts, not retried, naming `url` and saying `says`.
fn assert_refused(
    what: &str,
    result: Result<Source, SourceError>,
    is: fn(&SourceError) -> bool,
    url: &str,
    says: &str,
) {
    match result {
        Err(e) if is(&e) => {
            println!("{what}: {e}");
            assert_eq!(e.class(), ErrorClass::Stalling, "{what}: retried");
            assert!(e.to_string().contains(says) && e.to_string().contains(url), "{what}: {e}");
        }
        other => panic!("{what}: got {other:?}"),
    }
}

/// A number no other state dir of this test binary has.
fn next_state() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[tokio::test]
async fn https_with_a_private_ca_works_with_ca_file_and_is_refused_without() {
    let Some(f) = https_fleet().await else { return };
    let with_ca = Credentials { ca_file: Some(f.ca()), ..Credentials::default() };
    let source = f.sync(with_ca).expect("fetch over https with caFile");
    assert!(source.checkout().unwrap().tag(RELEASE).unwrap().is_some());

    let other = pki(f.dir.path(), "unrelated");
    for (what, creds) in [
        ("no caFile", Credentials::default()),
        ("another CA", Credentials { ca_file: Some(other.ca.clone()), ..Credentials::default() }),
    ] {
        let certificate = |e: &SourceError| matches!(e, SourceError::Certificate { .. });
        assert_refused(what, f.sync(creds), certificate, &f.url, CA_HINT);
    }
}

/// A private repo over HTTPS: the token fetches it and pushes a status note to it (fleetgate's
/// own `https://` transport, both directions); no token and a wrong token are each an
/// authentication error that names the URL and is not retried.
#[tokio::test]
async fn https_with_a_token_fetches_and_pushes_a_private_repo() {
    let Some(f) = https_fleet().await else { return };
    f.make_private().await;
    let with_token = |token: Option<&str>| Credentials {
        ca_file: Some(f.ca()),
        token: token.map(str::to_string),
        ..Credentials::default()
    };
    let creds = with_token(Some(f.gitea.token()));
    let source = f.sync(creds.clone()).expect("fetch the private repo over https with the token");
    let checkout = source.checkout().unwrap();
    assert!(checkout.tag(RELEASE).unwrap().is_some());

    let commit = f.remote.git(&["rev-parse", &format!("{RELEASE}^{{commit}}")]).trim().to_string();
    let s = Status::new("cluster-a", RELEASE, &commit, State::Success, "all gates passed");
    let remote = GitRemote::new(&f.url).with_access(creds);
    status::write(checkout.repo(), &remote, &s, &status_support::identity("cluster-a"))
        .expect("status note pushed over https");
    let pushed = git_in(&f.gitea.repo_path("fleet"), &["rev-parse", "refs/notes/fleetgate/cluster-a"]);
    assert_eq!(pushed, checkout.repo().refname_to_id("refs/notes/fleetgate/cluster-a").unwrap().to_string());

    for (what, token, says) in [
        ("no token", None, "asks for credentials and none are configured"),
        ("a wrong token", Some("0123456789abcdef0123456789abcdef01234567"), "rejected the configured credentials"),
    ] {
        let auth = |e: &SourceError| matches!(e, SourceError::Auth { .. });
        assert_refused(what, f.sync(with_token(token)), auth, &f.url, says);
    }
}

/// The CLI on a person's machine, with no token: Git's credential helpers (from `~/.gitconfig`)
/// answer the server's 401 over HTTPS, as `git` would ask them; without a helper the refusal says
/// that credentials are missing.
#[tokio::test]
async fn the_cli_asks_git_credential_helpers_for_a_private_https_repo() {
    let Some(f) = https_fleet().await else { return };
    f.make_private().await;
    let home = f.dir.path().join("home-with-helper");
    std::fs::create_dir(&home).unwrap();
    let (ca, trusted) = (f.ca().display().to_string(), f.remote.trusted.display().to_string());
    let args = ["validate", "--repo", &f.url, "--trusted-keys", &trusted, "--ca-file", &ca];

    let out = fleetgate(&args, &[], &home);
    assert!(!out.status.success(), "a private repo without credentials was read: {}", stderr(&out));
    assert!(stderr(&out).contains("asks for credentials and none are configured"), "{}", stderr(&out));

    let helper = format!("!f() {{ echo username=fleetgate; echo password={}; }}; f", f.gitea.token());
    std::fs::write(home.join(".gitconfig"), format!("[credential]\n\thelper = \"{helper}\"\n")).unwrap();
    let out = fleetgate(&args, &[], &home);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
}

#[tokio::test]
async fn git_goes_through_https_proxy_unless_no_proxy_covers_the_host() {
    if Tinyproxy::binary().is_none() {
        eprintln!("{}", Tinyproxy::skip_message());
        return;
    }
    let Some(f) = https_fleet().await else { return };
    let proxy = Tinyproxy::start().expect("tinyproxy");
    let through = |no_proxy: Vec<String>| Credentials {
        ca_file: Some(f.ca()),
        proxy: ProxyEnv { https: Some(proxy.url()), http: None, no_proxy },
        ..Credentials::default()
    };
    let gitea = f.gitea.url().trim_start_matches("https://").to_string();
    let connect = format!("CONNECT {gitea} ");
    let source = f.sync(through(vec![])).expect("fetch through the proxy");
    assert!(source.checkout().unwrap().tag(RELEASE).unwrap().is_some());
    let requests = proxy.requests();
    // The refs listed and the pack fetched through the proxy's tunnel (one, kept alive, or more).
    assert!(requests.iter().any(|r| r.starts_with(&connect)), "{requests:?}");

    let before = proxy.requests().len();
    f.sync(through(vec!["localhost".into(), "127.0.0.1".into()])).expect("fetch bypassing the proxy");
    assert_eq!(proxy.requests().len(), before, "NO_PROXY covers 127.0.0.1: {:?}", proxy.requests());

    // The CLI takes the proxy from its environment, as reqwest does.
    let home = f.dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let (ca, trusted) = (f.ca().display().to_string(), f.remote.trusted.display().to_string());
    let args = ["validate", "--repo", &f.url, "--trusted-keys", &trusted, "--ca-file", &ca];
    let out = fleetgate(&args, &[("HTTPS_PROXY", &proxy.url())], &home);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(proxy.requests().len() > before, "validate did not use HTTPS_PROXY: {:?}", proxy.requests());
    let before = proxy.requests().len();
    let out = fleetgate(&args, &[("HTTPS_PROXY", &proxy.url()), ("NO_PROXY", "127.0.0.1")], &home);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(proxy.requests().len(), before, "NO_PROXY was not honoured: {:?}", proxy.requests());
}

/// Plain HTTP is fleetgate's own transport too (it follows no redirect): an http:// repo goes
/// through the HTTP_PROXY that covers it.
#[tokio::test]
async fn http_urls_go_through_http_proxy() {
    if Tinyproxy::binary().is_none() {
        eprintln!("{}", Tinyproxy::skip_message());
        return;
    }
    let Some(f) = gitea_fleet(false).await else { return };
    let proxy = Tinyproxy::start().expect("tinyproxy");
    let creds = Credentials {
        proxy: ProxyEnv { https: Some(proxy.url()), http: Some(proxy.url()), no_proxy: vec![] },
        ..Credentials::default()
    };
    let source = f.sync(creds).expect("fetch over http");
    assert!(source.checkout().unwrap().tag(RELEASE).unwrap().is_some());
    assert!(!proxy.requests().is_empty(), "the fetch did not use HTTP_PROXY");
}
