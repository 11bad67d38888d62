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
use fleetgate::status::{Matrix, Origin, ReleaseRef, RenderOptions, State, Status, StatusSet, members};
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
            waves: WAVES.iter().map(|w| w.to_string()).collect(),
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
            let c: Cluster = Document::new("Cluster", &name, ClusterSpec { wave: wave.into(), release: pin, status_key: None, paused: false });
            (name, c)
        })
        .collect();
    FleetConfig { fleet, clusters, gate_policies: Vec::new(), admission_policies: Vec::new() }
}

fn statuses(config: &FleetConfig, releases: &[ReleaseRef]) -> StatusSet {
    let mut set = StatusSet::new();
    for (r, rel) in releases.iter().enumerate() {
        for (i, name) in config.clusters.keys().enumerate() {
            let (state, description) = match (r, i % 97) {
                (0, 0) => (State::Failure, "rolled back to rel-prev: error-rate 7.3 % > 5 %".to_string()),
                (0, n) if n < 40 => (State::Pending, "baking 4/10 min".to_string()),
                (0, _) => continue,
                _ => (State::Success, "all 4 gates passed over 10m bake".to_string()),
            };
            set.insert(Status::new(name, &rel.id, &rel.commit, State::Pending, "applying"));
            set.insert(Status::new(name, &rel.id, &rel.commit, state, description));
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
    let set = statuses(&config, &rels);
    let members = members(&config);
    let origin = Origin { branch: "main".into(), revision: "0".repeat(40) };
    let runs = 11;

    let (build_min, build_med, matrix) = time(runs, || Matrix::build(&config.fleet, &members, &rels, &set, &origin));
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

    let dir = tempfile::tempdir().expect("temp dir");
    let repo = git2::Repository::init_bare(dir.path()).expect("bare repo");
    let commits = write_notes(&repo, &config, &rels, &set);
    let (read_min, read_med, read) = time(5, || fleetgate::status::read_all(&repo, &commits, &fleetgate::status::StatusKeys::default()).expect("notes read"));
    assert_eq!(read.latest("cluster-0000", &rels[1].id).map(|s| s.state), Some(State::Success));
    row("status::read_all (Git notes)", read_min, read_med, format!("{clusters} refs × {releases} commits"));
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
