//! The Git server is the fleet's only hub: how much does it take when many agents poll it?
//!
//! N simulated agents (threads) run the agent's real source and status code against one local
//! `git daemon`: each polls with [`Source::sync`] (one ls-remote; a fetch only when a ref moved),
//! loads the tip's configuration, reads the verified statuses of the desired release and asks
//! [`may_start`] whether its wave may start; when it may not, it tells its source whom it waits
//! for (the agent's [`fleetgate::source::NotesSchedule`] renewal, every waiting poll); when it
//! may, it "applies" and "bakes" (nothing: no Kubernetes here) and writes the three signed
//! statuses a real agent writes (`pending` applying, `pending` baking, `success`) to its own
//! notes ref with [`notes::write`]; a push that fails is tried again at the next poll, as the
//! agent's outbox does. A release is promoted fleet-wide through four waves (1 %,
//! 9 %, 30 %, 60 % of the clusters).
//!
//! Agents poll on after their own success until every agent has succeeded, as real ones do.
//! Printed per run: ls-remotes and fetches per agent (all, and those of the notes alone), notes pushes that
//! had to merge (conflicts), the daemon's CPU time (its own plus its reaped `git-upload-pack` /
//! `git-receive-pack` children, from /proc), the ls-remote latency, and the times from the
//! promotion to the last canary success and from there to the last agent of the last wave starting.
//!
//! `cargo run --release --example git_scale -- [AGENTS] [POLL_SECONDS] [AGENTS POLL ...]`
//! (default: 100 2  250 2  500 2  1000 5  1000 2). Figures: docs/RELIABILITY.md.
//!
//! `… git_scale heartbeats AGENTS INTERVAL_SECONDS`: the extra load of liveness alone. A repo with
//! AGENTS clusters' notes refs is served; the daemon's CPU and the ls-remote's size and time are
//! measured before any heartbeat ref exists, then every agent publishes one signed heartbeat
//! ([`heartbeat::beat`], spread evenly over one interval: the steady rate of AGENTS agents at that
//! interval), then the ls-remote again with AGENTS heartbeat refs advertised, and a reader's
//! verification of all of them ([`heartbeat::read`]). Figures: docs/BENCHMARKS.md.

use fleetgate::model::FleetConfig;
use fleetgate::source::{Credentials, NotesSchedule, Source};
use fleetgate::status::{
    GitRemote, Move, State, Status, StatusIdentity, StatusKeys, StatusSigner, heartbeat, may_start, members, notes,
};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

const FLEET: &str = "scale-fleet";
const WAVES: [(&str, f64); 4] = [("canary", 0.01), ("wave-1", 0.10), ("wave-2", 0.40), ("wave-3", 1.0)];

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git").current_dir(dir).args(args).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn wave_of(i: usize, n: usize) -> &'static str {
    WAVES.iter().find(|(_, upto)| (i as f64) < upto * n as f64).map(|(w, _)| *w).unwrap_or("wave-3")
}

fn fleet_yaml(release: &str) -> String {
    format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Fleet\nmetadata:\n  name: {FLEET}\nspec:\n  operator:\n    name: op\n    namespace: op-system\n  release: {release}\n  waves: [{}]\n  promotions: unsigned\n  rollout:\n    maxFailedClusters: 1\n",
        WAVES.map(|(w, _)| w).join(", ")
    )
}

/// The daemon's CPU seconds: its own and its reaped children's (utime, stime, cutime, cstime).
/// `git daemon` runs `git-daemon` as a child of the `git` wrapper: that child is the server.
fn cpu_seconds(wrapper: u32) -> f64 {
    let children = std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children")).unwrap_or_default();
    let pid = children.split_whitespace().next().map(str::to_string).unwrap_or(wrapper.to_string());
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    // Fields 14-17 of proc(5); `after` starts at field 3.
    let ticks: f64 = fields[11..15].iter().map(|f| f.parse::<f64>().unwrap()).sum();
    ticks / 100.0
}

/// A `git daemon` serving `base`, and the URL of its `fleet.git`.
fn start_daemon(base: &Path) -> (Child, String) {
    // Not testenv's GitDaemon: git daemon serves 32 connections at a time unless told otherwise,
    // which would cap the very load this measures, and the CPU figure needs its pid.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let daemon: Child = Command::new("git")
        .args(["daemon", "--reuseaddr", "--export-all", "--enable=receive-pack", "--listen=127.0.0.1"])
        .arg(format!("--port={port}"))
        .arg(format!("--base-path={}", base.display()))
        .arg("--max-connections=0")
        .arg(base)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
    (daemon, format!("git://127.0.0.1:{port}/fleet.git"))
}

fn stop_daemon(daemon: &mut Child) {
    // Killing the `git` wrapper leaves its `git-daemon` child serving (and holding our stdout).
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", daemon.id())).unwrap_or_default();
    for pid in children.split_whitespace() {
        Command::new("kill").arg(pid).status().ok();
    }
    daemon.kill().ok();
    daemon.wait().ok();
}

/// `count` ls-remotes one after the other: the refs advertised, the advertisement's bytes (ref
/// lines as protocol v0 sends them), the daemon's CPU milliseconds per ls-remote and the p50 time.
fn ls_remotes(url: &str, daemon: &Child, count: usize) -> (usize, usize, f64, f64) {
    let repo_dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(repo_dir.path()).unwrap();
    let cpu = cpu_seconds(daemon.id());
    let mut times = Vec::new();
    let (mut refs, mut bytes) = (0, 0);
    for _ in 0..count {
        let t = Instant::now();
        let mut remote = repo.remote_anonymous(url).unwrap();
        let conn = remote.connect_auth(git2::Direction::Fetch, None, None).unwrap();
        let heads = conn.list().unwrap();
        refs = heads.len();
        // pkt-line: 4 length bytes, 40 hex, a space, the name, a newline.
        bytes = heads.iter().map(|h| 4 + 40 + 1 + h.name().len() + 1).sum();
        drop(conn);
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let cpu_ms = (cpu_seconds(daemon.id()) - cpu) * 1000.0 / count as f64;
    times.sort_by(f64::total_cmp);
    (refs, bytes, cpu_ms, times[times.len() / 2])
}

/// `git_scale heartbeats AGENTS INTERVAL_SECONDS` (see the module doc).
fn heartbeats(n: usize, interval: Duration) {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("repos");
    std::fs::create_dir_all(&base).unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    std::fs::write(work.join("fleet.yaml"), fleet_yaml("rel-1")).unwrap();
    git(&work, &["add", "."]);
    git(&work, &["-c", "user.name=sim", "-c", "user.email=sim@example.com", "commit", "-qm", "rel-1"]);
    git(&work, &["tag", "rel-1"]);
    // Every cluster has its notes ref in a real fleet: the advertisement heartbeats add to.
    let tip =
        String::from_utf8(Command::new("git").current_dir(&work).args(["rev-parse", "HEAD"]).output().unwrap().stdout)
            .unwrap();
    let updates: String = (0..n).map(|i| format!("create refs/notes/fleetgate/c-{i:04} {}", tip)).collect();
    let mut update = Command::new("git")
        .current_dir(&work)
        .args(["update-ref", "--stdin"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(update.stdin.as_mut().unwrap(), updates.as_bytes()).unwrap();
    assert!(update.wait().unwrap().success());
    let bare = base.join("fleet.git");
    git(&base, &["init", "-q", "--bare", "-b", "main", "fleet.git"]);
    git(&work, &["push", "-q", bare.to_str().unwrap(), "main", "--tags", "refs/notes/*:refs/notes/*"]);
    let (mut daemon, url) = start_daemon(&base);

    let (refs_before, bytes_before, cpu_before, p50_before) = ls_remotes(&url, &daemon, 200);

    // One beat per agent, spread evenly over one interval, from 8 senders (each its own repo).
    let signers: Vec<StatusSigner> = (0..n).map(|i| StatusSigner::generate(&format!("c-{i:04}")).unwrap()).collect();
    let mut keys = StatusKeys::new(FLEET);
    for (i, s) in signers.iter().enumerate() {
        keys.insert(&format!("c-{i:04}"), s.public());
    }
    let signers = Arc::new(signers);
    let cpu = cpu_seconds(daemon.id());
    let start = Instant::now();
    let senders = 8;
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..senders)
        .map(|t| {
            let (signers, latencies, errors, url) = (signers.clone(), latencies.clone(), errors.clone(), url.clone());
            std::thread::spawn(move || {
                let local = tempfile::tempdir().unwrap();
                let repo = git2::Repository::init_bare(local.path()).unwrap();
                let remote = GitRemote::new(url);
                for i in (t..n).step_by(senders) {
                    let due = interval.mul_f64(i as f64 / n as f64);
                    std::thread::sleep(due.saturating_sub(start.elapsed()));
                    let identity = StatusIdentity::new(FLEET, signers[i].clone());
                    let t = Instant::now();
                    match heartbeat::beat(&repo, &remote, &identity, &format!("c-{i:04}"), interval) {
                        Ok(_) => latencies.lock().unwrap().push(t.elapsed().as_secs_f64() * 1000.0),
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let wall = start.elapsed().as_secs_f64();
    let beat_cpu = cpu_seconds(daemon.id()) - cpu;
    let mut lat = latencies.lock().unwrap().clone();
    lat.sort_by(f64::total_cmp);
    let pct =
        |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0.0);

    let (refs_after, bytes_after, cpu_after, p50_after) = ls_remotes(&url, &daemon, 200);
    stop_daemon(&mut daemon);

    // A reader (`fleetgate status`) verifies every heartbeat of its mirror.
    let server = git2::Repository::open_bare(&bare).unwrap();
    let t = Instant::now();
    let read = heartbeat::read(&server, &keys).unwrap();
    let read_ms = t.elapsed().as_secs_f64() * 1000.0;
    let disk = Command::new("du").args(["-sk"]).arg(&bare).output().unwrap();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    println!(
        "| agents | interval | beats pushed (errors) | beats/s | daemon CPU for the beats (% of one core) | push p50 / p99 | ls-remote refs before → after | advertisement bytes before → after | daemon CPU per ls-remote before → after | ls-remote p50 before → after | reader verifies {n} heartbeats | server repo size | load avg |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {n} | {}s | {} ({}) | {:.1} | {:.1} s ({:.1} %) | {:.0} / {:.0} ms | {refs_before} → {refs_after} | {bytes_before} → {bytes_after} | {cpu_before:.1} → {cpu_after:.1} ms | {p50_before:.1} → {p50_after:.1} ms | {read_ms:.0} ms ({} verified) | {} KiB | {} |",
        interval.as_secs(),
        lat.len(),
        errors.load(Ordering::Relaxed),
        lat.len() as f64 / wall,
        beat_cpu,
        100.0 * beat_cpu / wall,
        pct(0.5),
        pct(0.99),
        read.len(),
        String::from_utf8_lossy(&disk.stdout).split_whitespace().next().unwrap_or("?"),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    );
}

#[derive(Default)]
struct Totals {
    ls_remotes: AtomicU64,
    fetches: AtomicU64,
    notes_fetches: AtomicU64,
    pushes: AtomicU64,
    merged_pushes: AtomicU64,
    errors: AtomicU64,
    /// The first few distinct error messages, to say what failed.
    first_errors: Mutex<Vec<String>>,
    /// Agents that reported `success` for rel-2; every agent polls on until all have.
    succeeded: AtomicUsize,
    ls_remote_micros: Mutex<Vec<u64>>,
    /// (wave index, started at since the promotion, succeeded at).
    starts: Mutex<Vec<(usize, Duration)>>,
}

impl Totals {
    fn error(&self, what: &str, e: &dyn std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_errors.lock().unwrap();
        let message = format!("{what}: {e}");
        if first.len() < 4 && !first.iter().any(|m| m.get(..40) == message.get(..40)) {
            first.push(message);
        }
    }
}

struct Run {
    agents: usize,
    poll: Duration,
}

fn run(run: &Run) {
    let n = run.agents;
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("repos");
    std::fs::create_dir_all(&base).unwrap();
    git(&base, &["init", "-q", "--bare", "-b", "main", "fleet.git"]);

    // The fleet repo: N clusters with registered status keys, rel-1 everywhere.
    let work = dir.path().join("work");
    std::fs::create_dir_all(work.join("clusters")).unwrap();
    let signers: Vec<StatusSigner> = (0..n).map(|i| StatusSigner::generate(&format!("c-{i:04}")).unwrap()).collect();
    for (i, s) in signers.iter().enumerate() {
        let yaml = format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: c-{i:04}\nspec:\n  wave: {}\n  statusKey: {}\n",
            wave_of(i, n),
            s.public().to_openssh()
        );
        std::fs::write(work.join(format!("clusters/c-{i:04}.yaml")), yaml).unwrap();
    }
    std::fs::write(work.join("fleet.yaml"), fleet_yaml("rel-1")).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    git(&work, &["add", "."]);
    git(&work, &["-c", "user.name=sim", "-c", "user.email=sim@example.com", "commit", "-qm", "rel-1"]);
    git(&work, &["tag", "rel-1"]);
    git(
        &work,
        &[
            "-c",
            "user.name=sim",
            "-c",
            "user.email=sim@example.com",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "build rel-2",
        ],
    );
    git(&work, &["tag", "rel-2"]);
    let bare = base.join("fleet.git");
    git(&work, &["push", "-q", bare.to_str().unwrap(), "main", "--tags"]);

    let (mut daemon, url) = start_daemon(&base);

    // Every agent clones and settles on rel-1 first (not measured).
    let totals = Arc::new(Totals::default());
    let ready = Arc::new(Barrier::new(n + 1));
    let go = Arc::new(Barrier::new(n + 1));
    let promoted_at = Arc::new(Mutex::new(Instant::now()));
    let deadline = Duration::from_secs(600);
    let mut handles = Vec::new();
    for (i, signer) in signers.into_iter().enumerate() {
        let (url, totals, ready, go, promoted_at) =
            (url.clone(), totals.clone(), ready.clone(), go.clone(), promoted_at.clone());
        let state = dir.path().join(format!("agent-{i:04}"));
        let poll = run.poll;
        handles.push(
            std::thread::Builder::new()
                .stack_size(512 * 1024)
                .spawn(move || {
                    let name = format!("c-{i:04}");
                    let wave = WAVES.iter().position(|(w, _)| *w == wave_of(i, n)).unwrap();
                    let mut source =
                        Source::open(&url, &state, Credentials::default()).unwrap().with_notes(NotesSchedule::Fresh);
                    while source.sync().is_err() {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    let identity = StatusIdentity::new(FLEET, signer);
                    let remote = GitRemote::new(url.clone());
                    let mirror = git2::Repository::open(state.join("mirror.git")).unwrap();
                    ready.wait();
                    go.wait();
                    let before = source.stats();
                    // Polls are spread over the interval, as independent agents' are.
                    std::thread::sleep(poll.mul_f64((i as f64 * 0.618_034) % 1.0));
                    let start = Instant::now();
                    let mut first = true;
                    // Started rel-2; its statuses not yet in Git; all of them delivered.
                    let (mut started, mut outbox, mut done): (bool, Vec<Status>, bool) = (false, Vec::new(), false);
                    // Whom the last gate decision waited for: the statuses in the mirror only
                    // change with a fetch, so the decision stands until the next one.
                    let mut waiting: Option<std::collections::BTreeSet<String>> = None;
                    while totals.succeeded.load(Ordering::Relaxed) < n {
                        let t = Instant::now();
                        let outcome = match source.sync() {
                            Ok(o) => o,
                            Err(e) => {
                                totals.error("sync", &e);
                                std::thread::sleep(poll);
                                continue;
                            }
                        };
                        totals.ls_remote_micros.lock().unwrap().push(t.elapsed().as_micros() as u64);
                        if let Some(on) = waiting.as_ref().filter(|_| !started && !outcome.fetched) {
                            source.notes_schedule().wait_on(on.clone(), Instant::now());
                        }
                        if !started && (outcome.fetched || first) {
                            first = false;
                            let checkout = source.checkout().unwrap();
                            let config = FleetConfig::load(&checkout.tip_tree().unwrap()).unwrap();
                            let desired = config.desired_release(&name).map(|(r, _)| r.to_string()).unwrap();
                            if desired == "rel-2" {
                                let tag = checkout.tag("rel-2").unwrap().unwrap();
                                let keys = StatusKeys::registered(&config);
                                let statuses =
                                    fleetgate::status::read_all(checkout.repo(), &[tag.commit], &keys).unwrap();
                                let decision = may_start(
                                    &config.fleet,
                                    &members(&config),
                                    &statuses,
                                    &name,
                                    "rel-2",
                                    chrono::Utc::now(),
                                    Move::Forward,
                                );
                                if decision.allowed {
                                    waiting = None;
                                    let at = promoted_at.lock().unwrap().elapsed();
                                    totals.starts.lock().unwrap().push((wave, at));
                                    let commit = tag.commit.to_string();
                                    outbox = [
                                        (State::Pending, "applying rel-2 (from rel-1)"),
                                        (State::Pending, "baking for 0s"),
                                        (State::Success, "bake passed"),
                                    ]
                                    .map(|(state, what)| Status::new(&name, "rel-2", commit.clone(), state, what))
                                    .into();
                                    started = true;
                                } else {
                                    let on: std::collections::BTreeSet<String> =
                                        decision.waits_for.into_iter().collect();
                                    source.notes_schedule().wait_on(on.clone(), Instant::now());
                                    waiting = Some(on);
                                }
                            }
                        }
                        // What a push could not deliver is tried again next poll, as the agent's outbox does.
                        while let Some(status) = outbox.first() {
                            match notes::write(&mirror, &remote, status, &identity) {
                                Ok(w) => {
                                    totals.pushes.fetch_add(w.attempts as u64, Ordering::Relaxed);
                                    if w.attempts > 1 {
                                        totals.merged_pushes.fetch_add(1, Ordering::Relaxed);
                                    }
                                    outbox.remove(0);
                                }
                                Err(e) => {
                                    totals.error("notes push", &e);
                                    break;
                                }
                            }
                        }
                        if started && !done && outbox.is_empty() {
                            done = true;
                            totals.succeeded.fetch_add(1, Ordering::Relaxed);
                        }
                        if start.elapsed() > deadline {
                            totals.error("deadline", &"rel-2 not done within 600 s");
                            break;
                        }
                        std::thread::sleep(poll.saturating_sub(t.elapsed()));
                    }
                    let after = source.stats();
                    totals.ls_remotes.fetch_add(after.ls_remotes - before.ls_remotes, Ordering::Relaxed);
                    totals.fetches.fetch_add(after.fetches - before.fetches, Ordering::Relaxed);
                    totals.notes_fetches.fetch_add(after.notes_fetches - before.notes_fetches, Ordering::Relaxed);
                })
                .unwrap(),
        );
    }
    ready.wait();

    // The promotion: fleet.yaml moves to rel-2 (one commit, as a merged PR would).
    let cpu_before = cpu_seconds(daemon.id());
    std::fs::write(work.join("fleet.yaml"), fleet_yaml("rel-2")).unwrap();
    git(&work, &["-c", "user.name=sim", "-c", "user.email=sim@example.com", "commit", "-qam", "promote rel-2"]);
    git(&work, &["push", "-q", bare.to_str().unwrap(), "main"]);
    *promoted_at.lock().unwrap() = Instant::now();
    let wall = Instant::now();
    go.wait();
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = wall.elapsed().as_secs_f64();
    let cpu = cpu_seconds(daemon.id()) - cpu_before;
    stop_daemon(&mut daemon);

    let starts = totals.starts.lock().unwrap();
    let last_of = |w: usize| starts.iter().filter(|(x, _)| *x == w).map(|(_, t)| *t).max().unwrap_or_default();
    let last_canary = last_of(0);
    let last_wave = last_of(WAVES.len() - 1);
    let mut lat = totals.ls_remote_micros.lock().unwrap().clone();
    lat.sort_unstable();
    let pct =
        |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0);
    let ls = totals.ls_remotes.load(Ordering::Relaxed) as f64;
    let fetches = totals.fetches.load(Ordering::Relaxed) as f64;
    let notes_fetches = totals.notes_fetches.load(Ordering::Relaxed) as f64;
    for message in totals.first_errors.lock().unwrap().iter() {
        eprintln!("  {n} agents: {message}");
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "| {n} | {}s | {}/{n} | {:.1} | {:.2} ({:.2}) | {} | {} | {:.1}s ({:.0}%) | {:.1} / {:.1} ms | {:.1}s | {:.1}s | {} | {} |",
        run.poll.as_secs(),
        starts.len(),
        ls / n as f64,
        fetches / n as f64,
        notes_fetches / n as f64,
        totals.pushes.load(Ordering::Relaxed),
        totals.merged_pushes.load(Ordering::Relaxed),
        cpu,
        100.0 * cpu / elapsed,
        pct(0.5) as f64 / 1000.0,
        pct(0.99) as f64 / 1000.0,
        last_canary.as_secs_f64(),
        (last_wave.saturating_sub(last_canary)).as_secs_f64(),
        totals.errors.load(Ordering::Relaxed),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    );
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().map(String::as_str) == Some("heartbeats") {
        let n: usize = raw.get(1).map_or(1000, |a| a.parse().expect("AGENTS"));
        let interval: u64 = raw.get(2).map_or(120, |a| a.parse().expect("INTERVAL_SECONDS"));
        return heartbeats(n, Duration::from_secs(interval));
    }
    let args: Vec<u64> = raw.iter().map(|a| a.parse().expect("numbers: AGENTS POLL_SECONDS ...")).collect();
    let pairs: Vec<(u64, u64)> = if args.is_empty() {
        vec![(100, 2), (250, 2), (500, 2), (1000, 5), (1000, 2)]
    } else {
        args.chunks(2).map(|c| (c[0], *c.get(1).unwrap_or(&2))).collect()
    };
    println!(
        "| agents | poll | started rel-2 | ls-remotes/agent | fetches/agent (notes alone) | notes pushes | merged pushes | git daemon CPU (% of wall) | ls-remote p50 / p99 | promotion → last canary | last canary → last agent of last wave | errors | load avg |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (agents, poll) in pairs {
        run(&Run { agents: agents as usize, poll: Duration::from_secs(poll) });
    }
}
