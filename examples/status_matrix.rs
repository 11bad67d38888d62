//! Measures the status view at fleet scale: 1,000 clusters × 20 releases (every cluster reported on
//! every release), built into a `Matrix` and rendered as the 80-column table, the wide table, one
//! release's details, and `-o json`. Pure functions: no Git, no terminal.
//!
//! Then the Git side of `fleetgate status`: the same statuses as notes in a local bare repository
//! (one notes ref per cluster, one note per release commit), read back with `status::read_all`.
//!
//! `cargo run --release --example status_matrix [CLUSTERS] [RELEASES]` — figures go to
//! docs/BENCHMARKS.md ("Status matrix").

use fleetgate::model::{Cluster, ClusterSpec, Document, FleetConfig, FleetSpec, OperatorIdentity, RolloutSettings};
use fleetgate::status::{
    Matrix, Origin, ReleaseRef, RenderOptions, State, Status, StatusKeys, StatusSet, StatusSigner, VerifiedNotes,
    members,
};
use std::collections::BTreeMap;
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
            let c: Cluster = Document::new("Cluster", &name, ClusterSpec { wave: Some(wave.into()), release: pin, status_key: None, paused: false });
            (name, c)
        })
        .collect();
    FleetConfig { fleet, clusters, gate_policies: Vec::new(), admission_policies: Vec::new() }
}

/// Every entry signed by its cluster's key with that cluster's next sequence, as agents write them
/// (oldest release first).
fn statuses(config: &FleetConfig, releases: &[ReleaseRef], signers: &BTreeMap<String, StatusSigner>) -> StatusSet {
    let mut set = StatusSet::new();
    let mut sequences: BTreeMap<&str, u64> = BTreeMap::new();
    let fleet = config.fleet.name();
    for (r, rel) in releases.iter().enumerate().rev() {
        for (i, name) in config.clusters.keys().enumerate() {
            let (state, description) = match (r, i % 97) {
                (0, 0) => (State::Failure, "rolled back to rel-prev: error-rate 7.3 % > 5 %".to_string()),
                (0, n) if n < 40 => (State::Pending, "baking 4/10 min".to_string()),
                (0, _) => continue,
                _ => (State::Success, "all 4 gates passed over 10m bake".to_string()),
            };
            for entry in [Status::new(name, &rel.id, &rel.commit, State::Pending, "applying"), Status::new(name, &rel.id, &rel.commit, state, description)] {
                let mut entry = entry;
                let sequence = sequences.entry(name).or_default();
                *sequence += 1;
                signers[name].sign(&mut entry, fleet, *sequence).expect("signs");
                set.insert(entry);
            }
        }
    }
    set
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
    let signers: BTreeMap<String, StatusSigner> =
        config.clusters.keys().map(|c| (c.clone(), StatusSigner::generate(c).expect("a key"))).collect();
    let mut keys = StatusKeys::new(config.fleet.name());
    for (cluster, signer) in &signers {
        keys.insert(cluster, signer.public());
    }
    let set = statuses(&config, &rels, &signers);
    let members = members(&config);
    let origin = Origin { branch: "main".into(), revision: "0".repeat(40) };
    let runs = 11;

    let (build_min, build_med, matrix) = time(runs, || Matrix::build(&config.fleet, &members, &rels, &set, &origin, chrono::Utc::now()));
    let narrow = RenderOptions { width: 80, colours: true };
    let wide = RenderOptions { width: 20 * 12 + 40, colours: false };
    let (t80_min, t80_med, table) = time(runs, || fleetgate::status::render_table(&matrix, narrow));
    let (twide_min, twide_med, wide_table) = time(runs, || fleetgate::status::render_table(&matrix, wide));
    let (rel_min, rel_med, details) =
        time(runs, || fleetgate::status::render_release(&matrix, &rels[0].id, narrow).expect("release exists"));
    let (json_min, json_med, json) = time(runs, || serde_json::to_string(&matrix).expect("serializes"));

    println!("status matrix: {clusters} clusters × {releases} releases, {runs} runs each (best / median)");
    let row = |what: &str, min: Duration, med: Duration, size: String| {
        println!("  {what:<34} {:>9.2} ms / {:>9.2} ms   {size}", min.as_secs_f64() * 1e3, med.as_secs_f64() * 1e3);
    };
    row("Matrix::build", build_min, build_med, format!("{} cells", clusters * releases));
    row("render_table, 80 columns", t80_min, t80_med, format!("{} lines", table.lines().count()));
    row("render_table, all columns", twide_min, twide_med, format!("{} lines", wide_table.lines().count()));
    row("render_release (details, 80 cols)", rel_min, rel_med, format!("{} lines", details.lines().count()));
    row("serde_json (-o json)", json_min, json_med, format!("{:.1} MB", json.len() as f64 / 1e6));
    let total = build_med + t80_med;
    println!("  build + 80-column table (median): {:.2} ms", total.as_secs_f64() * 1e3);

    // The Git side, as agents write it: every entry signed by its cluster's key, and the notes
    // packed, as a fetch leaves them.
    let dir = tempfile::tempdir().expect("temp dir");
    let repo = git2::Repository::init_bare(dir.path()).expect("bare repo");
    let commits = write_notes(&repo, &config, &rels, &set);
    let packed = std::process::Command::new("git").args(["repack", "-adq"]).current_dir(dir.path()).status();
    assert!(packed.is_ok_and(|s| s.success()), "git repack");
    let repo = git2::Repository::open_bare(dir.path()).expect("bare repo");
    breakdown(&repo, &commits, &keys, row);
    // Fewer rounds over 10,000 clusters: a first read there takes seconds.
    let git_runs = if clusters * releases > 50_000 { 3 } else { 5 };
    let (read_min, read_med, read) = time(git_runs, || fleetgate::status::read_all(&repo, &commits, &keys).expect("notes read"));
    assert_eq!(read.latest("cluster-0000", &rels[1].id).map(|s| s.state), Some(State::Success));
    assert!(read.unverified("cluster-0000", &rels[1].id).is_empty(), "every entry verifies");
    row("status::read_all (every signature checked)", read_min, read_med, format!("{clusters} refs × {releases} commits"));
    let mut memo = VerifiedNotes::new();
    fleetgate::status::read_all_remembering(&repo, &commits, &keys, &mut memo).expect("notes read");
    let read_warm = || fleetgate::status::read_all_remembering(&repo, &commits, &keys, &mut memo).expect("notes read");
    let (warm_min, warm_med, _) = time(git_runs, read_warm);
    row("read_all, notes verified before", warm_min, warm_med, String::new());

    // What `fleetgate status` does after its fetch: read, build, make every string terminal-safe
    // (cli::output::terminal_safe: a round trip through serde_json::Value), render.
    let (safe_min, safe_med, _) = time(git_runs, || {
        serde_json::from_value::<Matrix>(serde_json::to_value(&matrix).expect("to value")).expect("from value")
    });
    row("terminal-safe round trip of the matrix", safe_min, safe_med, String::new());
    let mut memo = VerifiedNotes::new();
    let end_to_end = |memo: &mut VerifiedNotes| {
        let set = fleetgate::status::read_all_remembering(&repo, &commits, &keys, memo).expect("notes read");
        let matrix = Matrix::build(&config.fleet, &members, &rels, &set, &origin, chrono::Utc::now());
        let matrix: Matrix = serde_json::from_value(serde_json::to_value(&matrix).expect("to value")).expect("from value");
        fleetgate::status::render_table(&matrix, narrow)
    };
    let (cold_min, cold_med, _) = time(git_runs, || end_to_end(&mut VerifiedNotes::new()));
    row("end to end, first run", cold_min, cold_med, String::new());
    end_to_end(&mut memo);
    let (e2e_min, e2e_med, _) = time(git_runs, || end_to_end(&mut memo));
    row("end to end, notes verified before", e2e_min, e2e_med, String::new());
}

/// Where `read_all`'s time goes, phase by phase over the same notes (one run each): the
/// notes-ref walk with its blob reads, JSON parsing, signature checks, and filling the set.
fn breakdown(
    repo: &git2::Repository,
    commits: &[git2::Oid],
    keys: &StatusKeys,
    row: impl Fn(&str, Duration, Duration, String),
) {
    use fleetgate::status::{StatusNote, notes::NOTES_PREFIX};
    let start = Instant::now();
    let mut blobs = Vec::new();
    for r in repo.references_glob(&format!("{NOTES_PREFIX}*")).expect("refs") {
        let r = r.expect("ref");
        let cluster = r.name().expect("utf-8")[NOTES_PREFIX.len()..].to_string();
        let tree = r.peel_to_commit().expect("commit").tree().expect("tree");
        for commit in commits {
            if let Some(entry) = tree.get_name(&commit.to_string()) {
                let blob = repo.find_blob(entry.id()).expect("blob");
                blobs.push((cluster.clone(), commit.to_string(), blob.content().to_vec()));
            }
        }
    }
    let read = start.elapsed();
    let bytes: usize = blobs.iter().map(|b| b.2.len()).sum();
    row("  refs walk + blob reads", read, read, format!("{} notes, {:.1} MB", blobs.len(), bytes as f64 / 1e6));

    let start = Instant::now();
    let notes: Vec<_> = blobs
        .iter()
        .map(|(cluster, commit, text)| {
            (cluster, commit, StatusNote::parse(std::str::from_utf8(text).expect("utf-8")).expect("a note"))
        })
        .collect();
    let parse = start.elapsed();
    let entries: usize = notes.iter().map(|n| n.2.entries.len()).sum();
    row("  JSON parsing (StatusNote::parse)", parse, parse, format!("{entries} entries"));

    let start = Instant::now();
    let verified = notes
        .iter()
        .flat_map(|(cluster, commit, note)| note.entries.iter().map(move |e| keys.verify(cluster, commit, e)))
        .filter(Result::is_ok)
        .count();
    let verify = start.elapsed();
    row("  signature checks (StatusKeys::verify)", verify, verify, format!("{verified} verified"));

    let start = Instant::now();
    let mut set = StatusSet::new();
    for (_, _, note) in notes {
        for entry in note.entries {
            set.insert(entry);
        }
    }
    let fill = start.elapsed();
    row("  StatusSet::insert", fill, fill, String::new());
}

/// Writes every cluster's notes ref directly (one commit whose tree holds one note per release
/// commit) — the layout `status::write` produces, without 20,000 pushes.
fn write_notes(repo: &git2::Repository, config: &FleetConfig, rels: &[ReleaseRef], set: &StatusSet) -> Vec<git2::Oid> {
    use fleetgate::status::StatusNote;
    let sig = git2::Signature::now("bench", "bench@localhost").expect("signature");
    let commits: Vec<git2::Oid> = rels.iter().map(|r| git2::Oid::from_str(&r.commit).expect("hex")).collect();
    for name in config.clusters.keys() {
        let mut tree = repo.treebuilder(None).expect("tree builder");
        for (rel, commit) in rels.iter().zip(&commits) {
            let history = set.history(name, &rel.id);
            if history.is_empty() {
                continue;
            }
            let mut note = StatusNote::new(name);
            for entry in history {
                note.append(entry);
            }
            let blob = repo.blob(note.to_text().as_bytes()).expect("blob");
            tree.insert(commit.to_string(), blob, 0o100644).expect("tree entry");
        }
        let tree = repo.find_tree(tree.write().expect("tree")).expect("tree");
        let commit = repo.commit(None, &sig, &sig, "Notes added by bench", &tree, &[]).expect("commit");
        repo.reference(&fleetgate::status::notes_ref(name), commit, true, "bench").expect("ref");
    }
    commits
}
