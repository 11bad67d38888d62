//! Every hint leads somewhere: each `fleetgate SUBCOMMAND … --flag` written in the sources (the
//! next steps refusals print: `release create`, `promote`, `rollback`, `validate`, the agent's
//! statuses) and in the docs names a subcommand that exists and flags it takes, and every other
//! `--flag` in the sources belongs to some subcommand or to one of the tools fleetgate drives.
//! A hint naming an option that was renamed or removed fails here, whichever message prints it.

use super::Cli;
use clap::CommandFactory;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Flags of other programs that fleetgate's messages and comments quote (git, gpg, helm, kubectl,
/// cargo, curl), with the tool they belong to.
const FOREIGN: &[(&str, &str)] = &[
    ("--ff-only", "git"),
    ("--no-ff", "git"),
    ("--tags", "git"),
    ("--no-edit", "git"),
    ("--list-secret-keys", "gpg"),
    ("--import", "gpg"),
    ("--include-crds", "helm"),
    ("--kube-version", "helm"),
    ("--server-side", "kubectl"),
    ("--show-managed-fields", "kubectl"),
    ("--for", "kubectl events"),
    ("--notes", "git log"),
    ("--delete", "git push"),
    ("--test-threads", "cargo test"),
    ("--retry", "curl"),
];

/// Every command path (`["agent", "rbac"]`) and the long flags it takes, globals included.
fn commands() -> BTreeMap<Vec<String>, BTreeSet<String>> {
    fn walk(cmd: &clap::Command, path: Vec<String>, out: &mut BTreeMap<Vec<String>, BTreeSet<String>>) {
        let mut flags: BTreeSet<String> =
            cmd.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect();
        flags.insert("--help".into());
        for sub in cmd.get_subcommands() {
            let mut p = path.clone();
            p.push(sub.get_name().to_string());
            walk(sub, p, out);
        }
        out.insert(path, flags);
    }
    let mut cli = Cli::command();
    // Propagates global arguments into every subcommand.
    cli.build();
    let mut out = BTreeMap::new();
    walk(&cli, Vec::new(), &mut out);
    out
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// `fleetgate` commands in `text`: the command path and the flags written after it, up to the
/// end of the command (a quote, a backtick, a closing parenthesis, `;`, a line end).
fn written_commands(text: &str, commands: &BTreeMap<Vec<String>, BTreeSet<String>>) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("fleetgate ") {
        let rest = &text[at + "fleetgate ".len()..];
        let end = rest.find(['`', '"', ')', ';', '\n', '|', '>']).unwrap_or(rest.len());
        let words: Vec<&str> = rest[..end].split_whitespace().collect();
        let mut path = Vec::new();
        for w in &words {
            let mut next = path.clone();
            next.push(w.to_string());
            if commands.contains_key(&next) { path = next } else { break }
        }
        if path.is_empty() {
            continue; // prose: "fleetgate applies…"
        }
        let flags = words[path.len()..]
            .iter()
            .filter(|w| w.starts_with("--"))
            .map(|w| w.split(['=', ',', '.', ':', '…', '[']).next().unwrap().to_string())
            .filter(|w| w.len() > 2)
            .collect();
        out.push((path, flags));
    }
    out
}

#[test]
fn every_command_and_flag_a_message_or_a_doc_names_exists() {
    let commands = commands();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = Vec::new();
    files(&root.join("src"), "rs", &mut sources);
    // This file names flags only as examples of what it looks for.
    sources.retain(|f| !f.ends_with("cli/hints.rs"));
    let mut docs = vec![root.join("README.md")];
    files(&root.join("docs"), "md", &mut docs);
    files(&root.join("deploy"), "md", &mut docs);
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in sources.iter().chain(&docs) {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file.strip_prefix(root).unwrap().display().to_string();
        for (path, flags) in written_commands(&text, &commands) {
            for flag in flags {
                checked += 1;
                if !commands[&path].contains(&flag) {
                    wrong.push(format!("{name}: `fleetgate {}` has no {flag}", path.join(" ")));
                }
            }
        }
    }
    // Bare flags in the sources ("pass --to ID"): some subcommand, or a quoted tool, has them.
    let any: BTreeSet<&String> = commands.values().flatten().collect();
    // Not `--forge-*`: a family of flags, named by its prefix.
    let flag = regex::Regex::new(r"(?:^|[\s`(\[])(--[a-z][a-z0-9-]*[a-z0-9])(?:[^a-z0-9*-]|$)").unwrap();
    for file in &sources {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file.strip_prefix(root).unwrap().display().to_string();
        for m in flag.captures_iter(&text) {
            let f = &m[1];
            if !any.contains(&f.to_string()) && !FOREIGN.iter().any(|(x, _)| *x == f) {
                wrong
                    .push(format!("{name}: {f} is no flag of any fleetgate command (nor of a tool listed in FOREIGN)"));
            }
        }
    }
    assert!(checked > 50, "only {checked} flags found: the scan is broken");
    assert!(wrong.is_empty(), "hints that lead nowhere:\n{}", wrong.join("\n"));
}
