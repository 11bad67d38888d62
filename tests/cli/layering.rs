//! The module dependencies of docs/ARCHITECTURE.md, enforced: each top-level module of `src/`
//! may use only the modules its entry in [`ALLOWED`] lists (and itself), and no `cli` command
//! module may use another command module. Reads the source text, so it needs no build of anything
//! and fails with the offending file and line. The list is the graph the code has, no looser: an
//! allowed use the code no longer makes fails too, as does a list that differs from the docs'
//! table or that has a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the modules it may use. The graph branches: `gates` needs neither
/// Git nor releases, `status` no manifests, `manifests` no Git.
const ALLOWED: &[(&str, &[&str])] = &[
    ("model", &[]),
    ("http", &[]),
    ("source", &["model", "http"]),
    ("release", &["model", "source"]),
    ("manifests", &["model", "release"]),
    ("gates", &["model", "http"]),
    ("apply", &["model", "source", "release", "manifests"]),
    ("status", &["model", "http", "source", "release"]),
    ("validate", &["model", "source", "release", "manifests", "gates", "apply", "status"]),
    ("releng", &["model", "http", "source", "release", "manifests", "gates", "apply", "status"]),
    // The write-back commits promotions to Git signed, with releng's `Signer` and `FleetState`.
    ("agent", &["model", "http", "source", "release", "manifests", "gates", "apply", "status", "releng"]),
    ("cli", &["model", "source", "release", "gates", "apply", "status", "validate", "releng", "agent"]),
];

/// `cli` modules every command may share: they hold no command.
const CLI_SHARED: &[&str] = &["mod", "output", "args"];

fn allowed(module: &str) -> Option<&'static [&'static str]> {
    ALLOWED.iter().find(|(m, _)| *m == module).map(|(_, uses)| *uses)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text with `//` comments removed (doc links name higher modules on purpose).
fn code_lines(text: &str) -> Vec<String> {
    text.lines().map(|l| l.find("//").map_or(l, |i| &l[..i]).to_string()).collect()
}

/// Every crate-level module a source text refers to: `crate::x`, `crate::{x::…, y}` and
/// `fleetgate::x` (the binary's view), with the line of each.
fn references(text: &str) -> Vec<(usize, String)> {
    let code = code_lines(text).join("\n");
    let line_at = |pos: usize| code[..pos].matches('\n').count() + 1;
    let mut out = Vec::new();
    for prefix in ["crate::", "fleetgate::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(prefix) {
            let start = from + i + prefix.len();
            from = start;
            if code[start..].starts_with('{') {
                // A group: its top-level items are modules (or crate-root items).
                let mut depth = 0;
                let mut item = String::new();
                for c in code[start..].chars() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    if depth == 1 && (c.is_alphanumeric() || c == '_') {
                        item.push(c);
                    } else if !item.is_empty() {
                        out.push((line_at(start), std::mem::take(&mut item)));
                    }
                    if depth > 1 {
                        item.clear();
                    }
                }
            } else {
                let name: String = code[start..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                out.push((line_at(start), name));
            }
        }
    }
    out
}

/// The crate module a file under `src/` belongs to (`src/gates/x.rs` → `gates`), and for `cli`
/// files the command (`src/cli/diff.rs` → `diff`).
fn owner(rel: &Path) -> (String, Option<String>) {
    let parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let module = parts[0].trim_end_matches(".rs").to_string();
    let command = (module == "cli" && parts.len() > 1).then(|| parts[1].trim_end_matches(".rs").to_string());
    (module, command)
}

/// Every use of a top-level module by another, as `(file under src/, line, user, used)`.
fn uses(root: &Path) -> Vec<(PathBuf, usize, String, String)> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let rel = file.strip_prefix(root).unwrap().to_path_buf();
        let (module, _) = owner(&rel);
        if allowed(&module).is_none() {
            continue; // lib.rs, main.rs
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, used) in references(&text) {
            // Crate-root items (`crate::VERSION`) are no module.
            if used != module && allowed(&used).is_some() {
                out.push((rel.clone(), line, module.clone(), used));
            }
        }
    }
    out
}

fn violations(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for (rel, line, module, used) in uses(root) {
        if !allowed(&module).unwrap().contains(&used.as_str()) {
            found.push(format!(
                "src/{}:{line}: `{module}` uses `{used}`, which its entry in tests/cli/layering.rs ALLOWED \
                 (and docs/ARCHITECTURE.md) does not list",
                rel.display()
            ));
        }
    }
    let mut files = Vec::new();
    rust_files(root, &mut files);
    files.sort();
    for file in files {
        let rel = file.strip_prefix(root).unwrap();
        let Some(command) = owner(rel).1.filter(|c| !CLI_SHARED.contains(&c.as_str())) else { continue };
        let code = code_lines(&std::fs::read_to_string(&file).unwrap()).join("\n");
        for (n, l) in code.lines().enumerate() {
            for other in cli_commands(root) {
                if other != command
                    && (l.contains(&format!("super::{other}::")) || l.contains(&format!("crate::cli::{other}::")))
                {
                    found.push(format!("src/{}:{}: command `{command}` uses command `{other}`", rel.display(), n + 1));
                }
            }
        }
    }
    found
}

fn cli_commands(root: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root.join("cli"))
        .unwrap()
        .map(|e| e.unwrap().path().file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|c| !CLI_SHARED.contains(&c.as_str()))
        .collect();
    out.sort();
    out
}

/// The modules `docs/ARCHITECTURE.md`'s "Module dependencies" table lists, each with the
/// modules in its "may use" column.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md")).unwrap();
    let section = doc.split("\n## Module dependencies\n").nth(1).expect("a \"Module dependencies\" section");
    let names = |cell: &str| -> BTreeSet<String> { cell.split('`').skip(1).step_by(2).map(str::to_string).collect() };
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // the header and its rule
        .map(|row| {
            let cells: Vec<&str> = row.split('|').collect();
            let module = names(cells[1]).into_iter().next().expect("a module in the first column");
            (module, names(cells[2]))
        })
        .collect()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn modules_use_only_what_their_entry_allows() {
    let found = violations(&src());
    assert!(found.is_empty(), "module dependencies broken (see docs/ARCHITECTURE.md):\n{}", found.join("\n"));
}

#[test]
fn every_allowed_use_is_one_the_code_makes() {
    let used: BTreeSet<(String, String)> = uses(&src()).into_iter().map(|(_, _, m, u)| (m, u)).collect();
    let stale: Vec<String> = ALLOWED
        .iter()
        .flat_map(|(m, uses)| uses.iter().map(move |u| (m.to_string(), u.to_string())))
        .filter(|edge| !used.contains(edge))
        .map(|(m, u)| format!("`{m}` may use `{u}` but no longer does: drop it from ALLOWED and the docs' table"))
        .collect();
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

#[test]
fn every_top_level_module_has_an_entry() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let declared: BTreeSet<&str> = lib.lines().filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';')).collect();
    assert!(!declared.is_empty());
    let listed: BTreeSet<&str> = ALLOWED.iter().map(|(m, _)| *m).collect();
    assert_eq!(declared, listed, "modules of src/lib.rs and entries of ALLOWED in tests/cli/layering.rs");
}

#[test]
fn the_docs_table_lists_the_same_dependencies() {
    let listed: BTreeMap<String, BTreeSet<String>> =
        ALLOWED.iter().map(|(m, uses)| (m.to_string(), uses.iter().map(|u| u.to_string()).collect())).collect();
    assert_eq!(
        documented(),
        listed,
        "docs/ARCHITECTURE.md \"Module dependencies\" against tests/cli/layering.rs ALLOWED"
    );
}

#[test]
fn the_allowed_graph_has_no_cycle() {
    // Peel off modules whose every allowed use is already peeled; what stays is on a cycle.
    let mut left: Vec<(&str, &[&str])> = ALLOWED.to_vec();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    while let Some(i) = left.iter().position(|(_, uses)| uses.iter().all(|u| done.contains(u))) {
        done.insert(left.remove(i).0);
    }
    assert!(left.is_empty(), "modules on a cycle of ALLOWED: {:?}", left.iter().map(|(m, _)| m).collect::<Vec<_>>());
}

#[test]
fn the_check_sees_each_form_of_a_disallowed_use() {
    // The detector itself, on plain text: a check that cannot fail would prove nothing.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    for module in ["model", "gates", "apply", "cli"] {
        std::fs::create_dir_all(src.join(module)).unwrap();
    }
    let files: BTreeMap<&str, &str> = BTreeMap::from([
        ("model/a.rs", "use crate::source::Checkout;\n"),
        ("model/b.rs", "use crate::{gates::crd_compat, model::Finding};\n"),
        ("model/c.rs", "fn f() { crate::agent::run(); } // crate::cli in a comment is fine\n"),
        ("model/d.rs", "use crate::model::Finding;\nconst V: &str = crate::VERSION;\n"),
        // Below `gates` in the old straight line of layers, yet not a module `gates` uses.
        ("gates/a.rs", "use crate::http::client;\n\nuse fleetgate::source::Checkout;\n"),
        ("apply/a.rs", "use crate::{manifests::ManifestSet, release::VerifiedRelease};\n"),
        ("cli/diff.rs", "use super::validate::open_repo;\nuse super::output::OutputFormat;\n"),
        ("cli/validate.rs", "use crate::validate::validate_repo;\n"),
        ("cli/output.rs", "\n"),
    ]);
    for (path, text) in files {
        std::fs::write(src.join(path), text).unwrap();
    }
    let found = violations(src);
    let not_listed = "which its entry in tests/cli/layering.rs ALLOWED (and docs/ARCHITECTURE.md) does not list";
    let expected = [
        format!("src/gates/a.rs:3: `gates` uses `source`, {not_listed}"),
        format!("src/model/a.rs:1: `model` uses `source`, {not_listed}"),
        format!("src/model/b.rs:1: `model` uses `gates`, {not_listed}"),
        format!("src/model/c.rs:1: `model` uses `agent`, {not_listed}"),
        "src/cli/diff.rs:1: command `diff` uses command `validate`".to_string(),
    ];
    assert_eq!(found, expected);
}
