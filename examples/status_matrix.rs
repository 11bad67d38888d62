//! Measures the status view at fleet scale: CLUSTERS clusters (default 1,000) × RELEASES releases
//! (default 20), every cluster with a two-entry history on every release but the newest.
//!
//! The Git side is what agents leave: one notes ref per cluster, one note per release commit,
//! every entry signed by its cluster's key, packed as a fetch leaves them. That repository and the
//! clusters' public keys are generated on the first run of a size (on every core; 10,000 × 20
//! signs 388,600 entries) into `$TMPDIR/fleetgate-status-bench-<size>-<version>` and reused by
//! the next runs.
//!
//! Then, phase by phase: `read_all` with every signature checked (a first run), the pure steps
//! over the view's statuses (`Matrix::build`, the renderers, `-o json`), where a read's time goes, and
//! what `fleetgate status` does after its fetch, end to end — open the verified-notes memory,
//! read the notes and the heartbeats (checking those it does not remember), save the memory, build the matrix
//! with RUNNING, LAST SEEN and stale, make its text terminal-safe, render the 80-column table —
//! on a first run (no memory), on the runs after it (notes and heartbeats remembered), and on a
//! run after every heartbeat moved (notes remembered, every heartbeat checked).
//!
//! Every cluster has a heartbeat ref too, written at each run (not kept in the fixture) and signed
//! by a key generated for the run; the heartbeats are verified against those keys.
//!
//! `cargo build --release --example status_matrix && target/release/examples/status_matrix
//! [CLUSTERS] [RELEASES]` — figures go to docs/BENCHMARKS.md ("Status matrix").

use fleetgate::model::{Cluster, ClusterSpec, Document, FleetConfig, FleetSpec, OperatorIdentity, RolloutSettings};
use fleetgate::status::{
    Matrix, Member, Origin, ReleaseRef, RenderOptions, State, Status, StatusIdentity, StatusKey, StatusKeys,
    StatusNote, StatusSet, StatusSigner, VerifiedNotes, heartbeat, members,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const WAVES: [&str; 4] = ["canary", "wave-1", "wave-2", "wave-3"];

fn fleet(clusters: usize, releases: &[ReleaseRef]) -> FleetConfig {
    let newest = &releases[0].id;
    let fleet = Document::new(
        "Fleet",
        "bench-fleet",
        FleetSpec {
            operator: OperatorIdentity { name: "redis-operator".into(), namespace: "redis-system".into(), image: None },
            release: Some(newest.clone()),
            waves: WAVES.iter().map(|w| (*w).into()).collect(),
            rollout: RolloutSettings { max_failed_clusters: 5 },
            promotions: Default::default(),
            status: Default::default(),
            paused: false,
        },
    );
    let clusters = (0..clusters)
        .map(|i| {
            let name = format!("cluster-{i:04}");
            // 2 % of the canary wave, then 18 %, 30 %, 50 %.
            let wave = match i * 100 / clusters {
                0..2 => WAVES[0],
                2..20 => WAVES[1],
                20..50 => WAVES[2],
                _ => WAVES[3],
            };
            // Every 50th cluster is pinned to the previous release.
            let pin = (i % 50 == 49).then(|| releases[1].id.clone());
            let c: Cluster = Document::new(
                "Cluster",
                &name,
                ClusterSpec { wave: Some(wave.into()), release: pin, status_key: None, paused: false },
            );
            (name, c)
        })
        .collect();
    FleetConfig {
        fleet,
        clusters,
        gate_policies: Vec::new(),
        admission_policies: Vec::new(),
        admission_policy_files: Default::default(),
    }
}

/// Bumped when the generated notes change, so an older fixture is not reused.
const FIXTURE: &str = "v2";

/// The notes repository and the clusters' public keys for this size: generated on the first run,
/// kept in the temp directory for the next ones.
fn fixture(config: &FleetConfig, rels: &[ReleaseRef]) -> (PathBuf, StatusKeys) {
    let size = format!("{}x{}", config.clusters.len(), rels.len());
    let dir = std::env::temp_dir().join(format!("fleetgate-status-bench-{size}-{FIXTURE}-{}", fleetgate::VERSION));
    let (repo, keys, complete) = (dir.join("notes.git"), dir.join("keys"), dir.join("complete"));
    if !complete.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        let start = Instant::now();
        generate(&repo, &keys, config, rels);
        std::fs::write(&complete, "").expect("marker");
        println!("generated {} in {:.1} s", dir.display(), start.elapsed().as_secs_f64());
    } else {
        println!("reusing {}", dir.display());
    }
    let mut registered = StatusKeys::new(config.fleet.name());
    for line in std::fs::read_to_string(&keys).expect("keys").lines() {
        let (cluster, key) = line.split_once(' ').expect("cluster and key");
        registered.insert(cluster, StatusKey::parse(key).expect("a key"));
    }
    (repo, registered)
}

/// Every cluster's notes, as its agent writes them, on every core (each worker with its own
/// handle on the repository); then packed. `keys` gets one `cluster ssh-ed25519 …` line each.
fn generate(repo: &Path, keys: &Path, config: &FleetConfig, rels: &[ReleaseRef]) {
    git2::Repository::init_bare(repo).expect("bare repo");
    let clusters: Vec<(usize, &str)> = config.clusters.keys().map(String::as_str).enumerate().collect();
    let fleet = config.fleet.name();
    let lines = on_every_core(&clusters, |part| {
        let repo = git2::Repository::open_bare(repo).expect("bare repo");
        let sig = git2::Signature::now("bench", "bench@localhost").expect("signature");
        part.iter()
            .map(|&(i, name)| {
                let signer = StatusSigner::generate(name).expect("a key");
                let mut tree = repo.treebuilder(None).expect("tree builder");
                for (commit, note) in notes_of(i, name, rels, &signer, fleet) {
                    let blob = repo.blob(note.to_text().as_bytes()).expect("blob");
                    tree.insert(commit, blob, 0o100644).expect("tree entry");
                }
                let tree = repo.find_tree(tree.write().expect("tree")).expect("tree");
                let commit = repo.commit(None, &sig, &sig, "Notes added by bench", &tree, &[]).expect("commit");
                repo.reference(&fleetgate::status::notes_ref(name), commit, true, "bench").expect("ref");
                format!("{name} {}\n", signer.public())
            })
            .collect()
    });
    std::fs::write(keys, lines.concat()).expect("keys");
    let packed = std::process::Command::new("git").args(["repack", "-adq"]).current_dir(repo).status();
    assert!(packed.is_ok_and(|s| s.success()), "git repack");
}

/// The notes of cluster number `i` (oldest release first): on every release but the newest
/// `pending` then `success`; on the newest, `pending` then `failure` for 1 cluster in 97, then
/// `pending` again (baking) for 39 in 97, nothing for the rest (60 % not started). Each entry
/// signed with the cluster's next sequence.
fn notes_of(
    i: usize,
    name: &str,
    rels: &[ReleaseRef],
    signer: &StatusSigner,
    fleet: &str,
) -> Vec<(String, StatusNote)> {
    let mut sequence = 0;
    let mut notes = Vec::new();
    for (r, rel) in rels.iter().enumerate().rev() {
        let (state, description) = match (r, i % 97) {
            (0, 0) => (State::Failure, "rolled back to rel-prev: error-rate 7.3 % > 5 %"),
            (0, n) if n < 40 => (State::Pending, "baking 4/10 min"),
            (0, _) => continue,
            _ => (State::Success, "all 4 gates passed over 10m bake"),
        };
        let mut note = StatusNote::new(name);
        for mut entry in [
            Status::new(name, &rel.id, &rel.commit, State::Pending, "applying"),
            Status::new(name, &rel.id, &rel.commit, state, description),
        ] {
            sequence += 1;
            signer.sign(&mut entry, fleet, sequence).expect("signs");
            note.append(&entry);
        }
        notes.push((rel.commit.clone(), note));
    }
    notes
}

/// `work` over `items`, split in one part per core.
fn on_every_core<T: Sync, R: Send>(items: &[T], work: impl Fn(&[T]) -> Vec<R> + Sync) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        let work = &work;
        let handles: Vec<_> =
            items.chunks(items.len().div_ceil(cores).max(1)).map(|part| s.spawn(move || work(part))).collect();
        handles.into_iter().flat_map(|h| h.join().expect("a worker")).collect()
    })
}

/// Wall time (best and median of the runs) and the process's CPU time in its best run (every
/// thread's: on a loaded machine closer to what a quiet one takes than the wall time).
struct Timing {
    best: Duration,
    median: Duration,
    cpu: Duration,
}

fn cpu_time() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to write to; the clock exists on Linux.
    assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) }, 0);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `f` run `runs` times (what a run returns is dropped after its time is taken).
fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> (Timing, T) {
    let mut times = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let (start, cpu) = (Instant::now(), cpu_time());
        let value = f();
        times.push((start.elapsed(), cpu_time() - cpu));
        last = Some(value);
    }
    times.sort();
    let timing = Timing { best: times[0].0, median: times[runs / 2].0, cpu: times[0].1 };
    (timing, last.expect("at least one run"))
}

fn row(what: &str, t: &Timing, size: &str) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("  {what:<44} {:>9.2} / {:>9.2} ms  cpu {:>9.2} ms   {size}", ms(t.best), ms(t.median), ms(t.cpu));
}

/// What `fleetgate status` does after its fetch (`cli::status`), over one state of the repo.
struct View<'a> {
    repo: &'a git2::Repository,
    commits: &'a [git2::Oid],
    keys: &'a StatusKeys,
    /// The keys of this run's heartbeats (see the module doc).
    heartbeat_keys: &'a StatusKeys,
    now: chrono::DateTime<chrono::Utc>,
    config: &'a FleetConfig,
    members: &'a [Member],
    rels: &'a [ReleaseRef],
    origin: &'a Origin,
}

/// The 80-column table as a person's terminal shows it, ages from now.
fn narrow() -> RenderOptions {
    RenderOptions { width: 80, colours: true, now: chrono::Utc::now(), exact_times: false }
}

impl View<'_> {
    /// Open the memory in `memo`, read the notes and the heartbeats, save the memory, build,
    /// make terminal-safe, render the 80-column table.
    fn status(&self, memo: &Path) -> String {
        self.status_lapped(memo, &mut |_, _| {})
    }

    /// [`View::status`], telling `lap` each step's wall time as it ends.
    fn status_lapped(&self, memo: &Path, lap: &mut dyn FnMut(&'static str, Duration)) -> String {
        let mut last = Instant::now();
        let mut step = |name| lap(name, std::mem::replace(&mut last, Instant::now()).elapsed());
        let mut memo = VerifiedNotes::open(memo);
        step("VerifiedNotes::open");
        // The heartbeats beside the notes, as `FleetView::load_remembering` reads them.
        let mut beats_memo = std::mem::take(&mut memo.beats);
        let (path, beat_keys) = (self.repo.path(), self.heartbeat_keys);
        let (set, beats) = std::thread::scope(|s| {
            let beats = s.spawn(|| {
                let repo = git2::Repository::open(path).expect("repo");
                heartbeat::read_remembering(&repo, beat_keys, &mut beats_memo).expect("heartbeats read")
            });
            let set = fleetgate::status::read_all_remembering(self.repo, self.commits, self.keys, &mut memo)
                .expect("notes read");
            (set, beats.join().expect("heartbeats read"))
        });
        memo.beats = beats_memo;
        step("notes and heartbeats, read together");
        memo.save().expect("memory saved");
        step("VerifiedNotes::save");
        let mut matrix = self.build(set);
        step("Matrix::build");
        // One clock for every run, so their tables (ages included) compare equal.
        matrix.judge_liveness(&beats, None, self.now);
        step("Matrix::judge_liveness");
        matrix.for_each_text_mut(fleetgate::cli::make_terminal_safe);
        step("terminal-safe text");
        let table = fleetgate::status::render_table(&matrix, RenderOptions { now: self.now, ..narrow() });
        step("render_table, 80 columns");
        drop((beats, memo));
        // Left to the exit, as `fleetgate status` leaves it (see `cli::status::show`).
        std::mem::forget(matrix);
        step("dropping the rest");
        table
    }

    fn build(&self, set: StatusSet) -> Matrix {
        Matrix::build(&self.config.fleet, self.members, self.rels, set, self.origin, chrono::Utc::now())
    }
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("CLUSTERS and RELEASES are numbers"));
    let clusters = args.next().unwrap_or(1000);
    let releases = args.next().unwrap_or(20);
    let rels: Vec<ReleaseRef> = (0..releases)
        .map(|i| ReleaseRef {
            id: format!("rel-2025{:04}-001", 1231 - i),
            commit: format!("{i:040x}"),
            created_at: None,
        })
        .collect();
    let config = fleet(clusters, &rels);
    let (repo_dir, keys) = fixture(&config, &rels);
    let repo = git2::Repository::open_bare(&repo_dir).expect("bare repo");
    let commits: Vec<git2::Oid> = rels.iter().map(|r| git2::Oid::from_str(&r.commit).expect("hex")).collect();
    let members = members(&config);
    let origin = Origin { branch: "main".into(), revision: "0".repeat(40) };
    let mut heartbeat_keys = StatusKeys::new(keys.fleet());
    let written = Instant::now();
    for m in &members {
        let me = StatusIdentity::new(keys.fleet(), StatusSigner::generate(&m.name).expect("key"));
        heartbeat::record(&repo, &me, &m.name, Duration::from_secs(120)).expect("heartbeat written");
        heartbeat_keys.insert(&m.name, me.signer.public());
    }
    println!("{} heartbeats written in {:.1} s", members.len(), written.elapsed().as_secs_f64());
    let view = View {
        repo: &repo,
        commits: &commits,
        keys: &keys,
        heartbeat_keys: &heartbeat_keys,
        now: chrono::Utc::now(),
        config: &config,
        members: &members,
        rels: &rels,
        origin: &origin,
    };
    let big = clusters * releases > 50_000;
    // A first read over 10,000 clusters takes seconds: fewer rounds there.
    let (runs, cold_runs, git_runs) = if big { (5, 1, 5) } else { (11, 3, 11) };

    println!("status view: {clusters} clusters × {releases} releases (best / median)");
    let (read, set) = time(cold_runs, || fleetgate::status::read_all(&repo, &commits, &keys).expect("notes read"));
    assert_eq!(set.latest("cluster-0000", &rels[1].id).map(|s| s.state), Some(State::Success));
    assert!(set.unverified("cluster-0000", &rels[1].id).is_empty(), "every entry verifies");

    // The pure steps run over what the view reads: each cluster's latest entry per release.
    let set =
        fleetgate::status::read_all_remembering(&repo, &commits, &keys, &mut VerifiedNotes::new()).expect("notes read");
    println!("pure steps, {runs} runs each");
    // Each build takes a set of its own (it moves the entries into its cells).
    let mut sets: Vec<StatusSet> = (0..runs).map(|_| set.clone()).collect();
    let (build, matrix) = time(runs, || view.build(sets.pop().expect("a set per run")));
    // What `-o wide` renders: every column, exact times.
    let wide = RenderOptions { width: releases * 12 + 60, colours: false, now: chrono::Utc::now(), exact_times: true };
    let (t80, table) = time(runs, || fleetgate::status::render_table(&matrix, narrow()));
    let (twide, wide_table) = time(runs, || fleetgate::status::render_table(&matrix, wide));
    let (rel, details) =
        time(runs, || fleetgate::status::render_release(&matrix, &rels[0].id, narrow()).expect("release exists"));
    let (json_t, json) = time(runs, || serde_json::to_string(&matrix).expect("serializes"));
    let mut safe = matrix.clone();
    let (safe, ()) = time(runs, || safe.for_each_text_mut(fleetgate::cli::make_terminal_safe));
    row("Matrix::build", &build, &format!("{} cells", clusters * releases));
    row("render_table, 80 columns", &t80, &format!("{} lines", table.lines().count()));
    row("render_table, all columns", &twide, &format!("{} lines", wide_table.lines().count()));
    row("render_release (details, 80 cols)", &rel, &format!("{} lines", details.lines().count()));
    row("serde_json (-o json)", &json_t, &format!("{:.1} MB", json.len() as f64 / 1e6));
    row("terminal-safe text (for_each_text_mut)", &safe, "");

    println!("where a read's time goes (one run each)");
    breakdown(&repo, &commits, &keys);

    println!("reads and end to end, {git_runs} runs each ({cold_runs} for a first run)");
    row("read_all, every signature checked", &read, &format!("{clusters} refs × {releases} commits"));
    let mut memo = VerifiedNotes::new();
    fleetgate::status::read_all_remembering(&repo, &commits, &keys, &mut memo).expect("notes read");
    let (warm, _) = time(git_runs, || {
        fleetgate::status::read_all_remembering(&repo, &commits, &keys, &mut memo).expect("notes read")
    });
    row("read_all, notes remembered (in memory)", &warm, "");
    let (beats_t, beats) = time(git_runs, || heartbeat::read(&repo, &heartbeat_keys).expect("heartbeats read"));
    row("heartbeat::read, every signature checked", &beats_t, &format!("{} verified", beats.len()));

    let dir = tempfile::tempdir().expect("temp dir");
    // The memory's directory holds the notes' file and the heartbeats' next to it.
    let memo_dir = dir.path().join("memo");
    let memo_file = memo_dir.join("verified-notes");
    let first_run = || {
        let _ = std::fs::remove_dir_all(&memo_dir);
        view.status(&memo_file)
    };
    let (cold, first_table) = time(cold_runs, first_run);
    let size = std::fs::metadata(&memo_file).expect("memory written").len();
    let (open, _) = time(git_runs, || VerifiedNotes::open(&memo_file));
    row("VerifiedNotes::open (read, checksum, index)", &open, &format!("{:.1} MB", size as f64 / 1e6));
    row("end to end, first run (no memory)", &cold, "");
    let (e2e, shown) = time(git_runs, || view.status(&memo_file));
    assert_eq!(shown, first_table, "the same table from remembered notes and heartbeats");
    row("end to end, notes and beats remembered", &e2e, "");
    let mut laps: Vec<(&str, Vec<Duration>)> = Vec::new();
    for _ in 0..git_runs {
        let mut n = 0;
        view.status_lapped(&memo_file, &mut |name, took| {
            match laps.get_mut(n) {
                Some((_, times)) => times.push(took),
                None => laps.push((name, vec![took])),
            }
            n += 1;
        });
    }
    for (name, mut times) in laps {
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!("    {name:<42} {:>9.2} / {:>9.2} ms", ms(times[0]), ms(times[times.len() / 2]));
    }
    // Every beat moved since the last run (runs a heartbeat interval or more apart): the notes
    // remembered, every heartbeat checked.
    let beats_file = memo_dir.join("verified-heartbeats");
    let (moved, shown) = time(git_runs, || {
        std::fs::remove_file(&beats_file).expect("heartbeats remembered");
        view.status(&memo_file)
    });
    assert_eq!(shown, first_table, "the same table with every heartbeat checked");
    row("end to end, notes remembered, beats moved", &moved, "");
}

/// Where a read's time goes, phase by phase over the same notes: the notes trees walk (all a
/// remembering read does in Git), the blob reads, JSON parsing, signature checks (one thread),
/// and filling the set.
fn breakdown(repo: &git2::Repository, commits: &[git2::Oid], keys: &StatusKeys) {
    use fleetgate::status::notes::NOTES_PREFIX;
    let notes_trees = || {
        let mut found = Vec::new();
        for r in repo.references_glob(&format!("{NOTES_PREFIX}*")).expect("refs") {
            let r = r.expect("ref");
            let cluster = r.name().expect("utf-8")[NOTES_PREFIX.len()..].to_string();
            let tree = r.peel_to_commit().expect("commit").tree().expect("tree");
            for commit in commits {
                if let Some(entry) = tree.get_name(&commit.to_string()) {
                    found.push((cluster.clone(), commit.to_string(), entry.id()));
                }
            }
        }
        found
    };
    let (walk, found) = time(1, notes_trees);
    row("  notes trees walk (blob ids)", &walk, &format!("{} notes", found.len()));

    let (read, blobs) = time(1, || -> Vec<_> {
        found
            .iter()
            .map(|(cluster, commit, blob)| (cluster, commit, repo.find_blob(*blob).expect("blob").content().to_vec()))
            .collect()
    });
    let bytes: usize = blobs.iter().map(|b| b.2.len()).sum();
    row("  blob reads (after the walk)", &read, &format!("{:.1} MB", bytes as f64 / 1e6));

    let (parse, notes) = time(1, || -> Vec<_> {
        blobs
            .iter()
            .map(|(cluster, commit, text)| {
                (*cluster, *commit, StatusNote::parse(std::str::from_utf8(text).expect("utf-8")).expect("a note"))
            })
            .collect()
    });
    let entries: usize = notes.iter().map(|n| n.2.entries.len()).sum();
    row("  JSON parsing (StatusNote::parse)", &parse, &format!("{entries} entries"));

    // Over 10,000 clusters this phase alone takes minutes: a sample of 20,000 entries there.
    let sample = if entries > 50_000 { 20_000 } else { entries };
    let (verify, verified) = time(1, || {
        notes
            .iter()
            .flat_map(|(cluster, commit, note)| note.entries.iter().map(move |e| keys.verify(cluster, commit, e)))
            .take(sample)
            .filter(Result::is_ok)
            .count()
    });
    row("  signature checks (StatusKeys::verify)", &verify, &format!("{verified} of {entries} verified"));

    let mut notes = Some(notes);
    let (fill, _) = time(1, || {
        let mut set = StatusSet::new();
        for (_, _, note) in notes.take().expect("one run") {
            for entry in note.entries {
                set.insert(entry);
            }
        }
        set
    });
    row("  StatusSet::insert", &fill, "");
}
