//! The module layering of docs/ARCHITECTURE.md, enforced: a module may use only modules of lower
//! layers (and itself), and no `cli` command module may use another command module. Reads the
//! source text, so it needs no build of anything and fails with the offending file and line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Lowest first. Modules of one layer do not use each other.
const LAYERS: &[&[&str]] = &[
    &["model", "http"],
    &["source"],
    &["release"],
    &["manifests"],
    &["gates"],
    &["apply"],
    &["status"],
    &["releng", "validate"],
    &["agent"],
    &["cli"],
];

/// `cli` modules every command may share: they hold no command.
const CLI_SHARED: &[&str] = &["mod", "output", "args"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
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

fn violations(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let rel = file.strip_prefix(root).unwrap();
        let (module, command) = owner(rel);
        let Some(own) = layer_of(&module) else { continue }; // lib.rs, main.rs
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, used) in references(&text) {
            if let Some(theirs) = layer_of(&used)
                && used != module
                && theirs >= own
            {
                found.push(format!(
                    "src/{}:{line}: `{module}` (layer {own}) uses `{used}` (layer {theirs})",
                    rel.display()
                ));
            }
        }
        if let Some(command) = command.filter(|c| !CLI_SHARED.contains(&c.as_str())) {
            let code = code_lines(&text).join("\n");
            for (n, l) in code.lines().enumerate() {
                for other in cli_commands(root) {
                    if other != command
                        && (l.contains(&format!("super::{other}::")) || l.contains(&format!("crate::cli::{other}::")))
                    {
                        found.push(format!(
                            "src/{}:{}: command `{command}` uses command `{other}`",
                            rel.display(),
                            n + 1
                        ));
                    }
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

#[test]
fn lower_modules_never_use_higher_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&root);
    assert!(found.is_empty(), "layering broken (see docs/ARCHITECTURE.md):\n{}", found.join("\n"));
}

#[test]
fn every_top_level_module_has_a_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(root.join("lib.rs")).unwrap();
    let declared: Vec<&str> = lib.lines().filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';')).collect();
    assert!(!declared.is_empty());
    let missing: Vec<&&str> = declared.iter().filter(|m| layer_of(m).is_none()).collect();
    assert!(missing.is_empty(), "modules without a layer in tests/cli/layering.rs: {missing:?}");
}

#[test]
fn the_check_sees_each_form_of_a_back_edge() {
    // The detector itself, on plain text: a check that cannot fail would prove nothing.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("model")).unwrap();
    std::fs::create_dir_all(src.join("cli")).unwrap();
    let files: BTreeMap<&str, &str> = BTreeMap::from([
        ("model/a.rs", "use crate::source::Checkout;\n"),
        ("model/b.rs", "use crate::{gates::crd_compat, model::Finding};\n"),
        ("model/c.rs", "fn f() { crate::agent::run(); } // crate::cli in a comment is fine\n"),
        ("model/d.rs", "use crate::model::Finding;\n"),
        ("cli/diff.rs", "use super::validate::open_repo;\nuse super::output::OutputFormat;\n"),
        ("cli/validate.rs", "use crate::validate::validate_repo;\n"),
        ("cli/output.rs", "\n"),
    ]);
    for (path, text) in files {
        std::fs::write(src.join(path), text).unwrap();
    }
    let found = violations(src);
    let expected = [
        "src/cli/diff.rs:1: command `diff` uses command `validate`",
        "src/model/a.rs:1: `model` (layer 0) uses `source` (layer 1)",
        "src/model/b.rs:1: `model` (layer 0) uses `gates` (layer 4)",
        "src/model/c.rs:1: `model` (layer 0) uses `agent` (layer 8)",
    ];
    assert_eq!(found, expected);
}
