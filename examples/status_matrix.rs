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
//! over its statuses (`Matrix::build`, the renderers, `-o json`), where a read's time goes, and
//! what `fleetgate status` does after its fetch, end to end — open the verified-notes memory,
//! read the notes, save the memory, build the matrix, make its text terminal-safe, render the
//! 80-column table — on a first run (no memory) and on the runs after it.
//!
//! `cargo build --release --example status_matrix && target/release/examples/status_matrix
//! [CLUSTERS] [RELEASES]` — figures go to docs/BENCHMARKS.md ("Status matrix").

use fleetgate::model::{Cluster, ClusterSpec, Document, FleetConfig, FleetSpec, OperatorIdentity, RolloutSettings};
use fleetgate::status::{
    Matrix, Member, Origin, ReleaseRef, RenderOptions, State, Status, StatusKey, StatusKeys, StatusNote, StatusSet,
    StatusSigner, VerifiedNotes, members,
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
    FleetConfig { fleet, clusters, gate_policies: Vec::new(), admission_policies: Vec::new() }
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

/// Best and median of `runs` timings of `f`.
fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, Duration, T) {
    let mut times = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        last = Some(f());
        times.push(start.elapsed());
    }
    times.sort();
    (times[0], times[runs / 2], last.expect("at least one run"))
}

fn row(what: &str, min: Duration, med: Duration, size: &str) {
    println!("  {what:<44} {:>9.2} ms / {:>9.2} ms   {size}", min.as_secs_f64() * 1e3, med.as_secs_f64() * 1e3);
}

/// What `fleetgate status` does after its fetch (`cli::status`), over one state of the repo.
struct View<'a> {
    repo: &'a git2::Repository,
    commits: &'a [git2::Oid],
    keys: &'a StatusKeys,
    config: &'a FleetConfig,
    members: &'a [Member],
    rels: &'a [ReleaseRef],
    origin: &'a Origin,
}

const NARROW: RenderOptions = RenderOptions { width: 80, colours: true };

impl View<'_> {
    /// Open the memory in `memo`, read the notes, save the memory, build, make terminal-safe,
    /// render the 80-column table.
    fn status(&self, memo: &Path) -> String {
        let mut memo = VerifiedNotes::open(memo);
        let set =
            fleetgate::status::read_all_remembering(self.repo, self.commits, self.keys, &mut memo).expect("notes read");
        memo.save().expect("memory saved");
        let mut matrix = self.build(&set);
        matrix.for_each_text_mut(fleetgate::cli::make_terminal_safe);
        fleetgate::status::render_table(&matrix, NARROW)
    }

    fn build(&self, set: &StatusSet) -> Matrix {
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
    let view = View {
        repo: &repo,
        commits: &commits,
        keys: &keys,
        config: &config,
        members: &members,
        rels: &rels,
        origin: &origin,
    };
    let big = clusters * releases > 50_000;
    // A first read over 10,000 clusters takes seconds: fewer rounds there.
    let (runs, cold_runs, git_runs) = if big { (5, 1, 5) } else { (11, 3, 11) };

    println!("status view: {clusters} clusters × {releases} releases (best / median)");
    let (read_min, read_med, set) =
        time(cold_runs, || fleetgate::status::read_all(&repo, &commits, &keys).expect("notes read"));
    assert_eq!(set.latest("cluster-0000", &rels[1].id).map(|s| s.state), Some(State::Success));
    assert!(set.unverified("cluster-0000", &rels[1].id).is_empty(), "every entry verifies");

    println!("pure steps, {runs} runs each");
    let (build_min, build_med, matrix) = time(runs, || view.build(&set));
    let wide = RenderOptions { width: releases * 12 + 40, colours: false };
    let (t80_min, t80_med, table) = time(runs, || fleetgate::status::render_table(&matrix, NARROW));
    let (twide_min, twide_med, wide_table) = time(runs, || fleetgate::status::render_table(&matrix, wide));
    let (rel_min, rel_med, details) =
        time(runs, || fleetgate::status::render_release(&matrix, &rels[0].id, NARROW).expect("release exists"));
    let (json_min, json_med, json) = time(runs, || serde_json::to_string(&matrix).expect("serializes"));
    let mut safe = matrix.clone();
    let (safe_min, safe_med, ()) = time(runs, || safe.for_each_text_mut(fleetgate::cli::make_terminal_safe));
    row("Matrix::build", build_min, build_med, &format!("{} cells", clusters * releases));
    row("render_table, 80 columns", t80_min, t80_med, &format!("{} lines", table.lines().count()));
    row("render_table, all columns", twide_min, twide_med, &format!("{} lines", wide_table.lines().count()));
    row("render_release (details, 80 cols)", rel_min, rel_med, &format!("{} lines", details.lines().count()));
    row("serde_json (-o json)", json_min, json_med, &format!("{:.1} MB", json.len() as f64 / 1e6));
    row("terminal-safe text (for_each_text_mut)", safe_min, safe_med, "");

    println!("where a read's time goes (one run each)");
    breakdown(&repo, &commits, &keys);

    println!("reads and end to end, {git_runs} runs each ({cold_runs} for a first run)");
    row("read_all, every signature checked", read_min, read_med, &format!("{clusters} refs × {releases} commits"));
    let mut memo = VerifiedNotes::new();
    fleetgate::status::read_all_remembering(&repo, &commits, &keys, &mut memo).expect("notes read");
    let (warm_min, warm_med, _) = time(git_runs, || {
        fleetgate::status::read_all_remembering(&repo, &commits, &keys, &mut memo).expect("notes read")
    });
    row("read_all, notes remembered (in memory)", warm_min, warm_med, "");

    let dir = tempfile::tempdir().expect("temp dir");
    let memo_file = dir.path().join("verified-notes");
    let first_run = || {
        let _ = std::fs::remove_file(&memo_file);
        view.status(&memo_file)
    };
    let (cold_min, cold_med, _) = time(cold_runs, first_run);
    let size = std::fs::metadata(&memo_file).expect("memory written").len();
    let (open_min, open_med, _) = time(git_runs, || VerifiedNotes::open(&memo_file));
    row("VerifiedNotes::open (read, checksum, index)", open_min, open_med, &format!("{:.1} MB", size as f64 / 1e6));
    row("end to end, first run (no memory)", cold_min, cold_med, "");
    let (e2e_min, e2e_med, shown) = time(git_runs, || view.status(&memo_file));
    assert_eq!(shown, table, "the same table from remembered notes");
    row("end to end, notes verified before", e2e_min, e2e_med, "");
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
    let start = Instant::now();
    let found = notes_trees();
    let walk = start.elapsed();
    row("  notes trees walk (blob ids)", walk, walk, &format!("{} notes", found.len()));

    let start = Instant::now();
    let blobs: Vec<_> = found
        .into_iter()
        .map(|(cluster, commit, blob)| (cluster, commit, repo.find_blob(blob).expect("blob").content().to_vec()))
        .collect();
    let read = start.elapsed();
    let bytes: usize = blobs.iter().map(|b| b.2.len()).sum();
    row("  blob reads (after the walk)", read, read, &format!("{:.1} MB", bytes as f64 / 1e6));

    let start = Instant::now();
    let notes: Vec<_> = blobs
        .iter()
        .map(|(cluster, commit, text)| {
            (cluster, commit, StatusNote::parse(std::str::from_utf8(text).expect("utf-8")).expect("a note"))
        })
        .collect();
    let parse = start.elapsed();
    let entries: usize = notes.iter().map(|n| n.2.entries.len()).sum();
    row("  JSON parsing (StatusNote::parse)", parse, parse, &format!("{entries} entries"));

    let start = Instant::now();
    let verified = notes
        .iter()
        .flat_map(|(cluster, commit, note)| note.entries.iter().map(move |e| keys.verify(cluster, commit, e)))
        .filter(Result::is_ok)
        .count();
    let verify = start.elapsed();
    row("  signature checks (StatusKeys::verify)", verify, verify, &format!("{verified} verified"));

    let start = Instant::now();
    let mut set = StatusSet::new();
    for (_, _, note) in notes {
        for entry in note.entries {
            set.insert(entry);
        }
    }
    let fill = start.elapsed();
    row("  StatusSet::insert", fill, fill, "");
}
