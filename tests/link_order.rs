//! link/cc, the linker .cargo/config.toml sets: a program linked with a symbol-ordering list of
//! readable names (no crate hashes, as link/agent.order holds them) has those functions first, in
//! the list's order, whichever order that is; a list naming functions the program lacks still
//! links. Built with the real rustc and lld, as build.rs asks for the `agent` profile.
#![cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]

use std::path::Path;
use std::process::Command;

const PROGRAM: &str = r#"
#[inline(never)]
fn first<T: std::fmt::Debug>(t: T) { println!("{t:?}"); }
#[inline(never)]
fn second() { println!("second"); }
#[inline(never)]
fn third() { println!("third"); }
fn main() { first(1u8); second(); third(); }
"#;

/// Links PROGRAM with `order` as the list; the address of each function, by readable name.
fn link(dir: &Path, order: &[&str]) -> Vec<(String, u64)> {
    std::fs::write(dir.join("main.rs"), PROGRAM).unwrap();
    let list = dir.join("order");
    std::fs::write(&list, order.iter().map(|n| format!("{n}\n")).collect::<String>()).unwrap();
    let linker = Path::new(env!("CARGO_MANIFEST_DIR")).join("link/cc");
    let out = Command::new("rustc")
        .current_dir(dir)
        .args(["--edition", "2021", "-C", "opt-level=z", "-C", "metadata=linkordertest"])
        .args(["-C", "symbol-mangling-version=v0", "-C"])
        .arg(format!("linker={}", linker.display()))
        .arg("-C")
        .arg(format!("link-arg=-Wl,--symbol-ordering-file={}", list.display()))
        .args(["-C", "link-arg=-Wl,--no-warn-symbol-ordering", "-o", "program", "main.rs"])
        .output()
        .unwrap();
    assert!(out.status.success(), "rustc: {}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(dir.join("program")).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&run.stdout), "1\nsecond\nthird\n");

    let nm = Command::new("nm").args(["--defined-only", "-C"]).arg(dir.join("program")).output().unwrap();
    assert!(nm.status.success());
    String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ' ');
            let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
            let name = parts.nth(1)?;
            // `main[1a2b…]::second` → `main::second`, as the list names it.
            let readable = name.split('[').next()?.to_string() + name.split_once(']').map_or("", |(_, rest)| rest);
            Some((readable, addr))
        })
        .collect()
}

fn addr(symbols: &[(String, u64)], name: &str) -> u64 {
    symbols.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} not in {symbols:?}")).1
}

#[test]
fn the_listed_functions_come_first_in_the_lists_order() {
    let dir = tempfile::tempdir().unwrap();
    for order in [
        ["main::third", "main::second", "main::first::<u8>"],
        ["main::first::<u8>", "main::second", "main::third"],
    ] {
        let symbols = link(dir.path(), &order);
        let at: Vec<u64> = order.iter().map(|n| addr(&symbols, n)).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{order:?} linked at {at:?}");
        let main = addr(&symbols, "main::main");
        assert!(at.iter().all(|a| *a < main), "the unlisted main::main ({main:#x}) before a listed one: {at:?}");
    }
}

#[test]
fn a_list_naming_functions_the_program_lacks_still_links() {
    let dir = tempfile::tempdir().unwrap();
    let symbols = link(dir.path(), &["gone::since::then", "main::second", "<main::Nothing>::method"]);
    assert!(addr(&symbols, "main::second") < addr(&symbols, "main::third"));
}
