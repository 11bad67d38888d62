//! docs/QUICKSTART.md, run: every command of its `console` blocks runs in order in one bash
//! session in a scratch directory (the built `fleetgate` on `PATH`, a clean `HOME`, a throw-away
//! `GNUPGHOME` as the page makes one, no Git server: the page works on a local clone), and what
//! each prints must be what the page shows after both are normalized (commit and object ids, key
//! fingerprints, times and the scratch directory become placeholders; tests/docs_support).
//!
//! When a command's output changes on purpose (a new line in `fleetgate rollback`'s plan, a
//! reworded hint), regenerate the page's outputs from a real run and review the diff:
//!
//! ```sh
//! FLEETGATE_BLESS=1 cargo test --test cli docs_quickstart
//! git diff docs/QUICKSTART.md
//! ```
//!
//! With `FLEETGATE_BLESS=1` the test writes each command's real output into the page (real ids
//! and fingerprints of that run) instead of comparing; a command that exits non-zero still fails
//! it, so a broken step is never written into the page.

use crate::docs_support;

use docs_support::{Page, Shell, normalize};
use std::path::Path;

const PAGE: &str = "docs/QUICKSTART.md";

#[test]
fn quickstart_commands_print_what_the_page_shows() {
    let page = Page::read(PAGE);
    let shell = Shell::new();
    let commands = page.console();
    assert!(commands.len() >= 15, "only {} commands found in {PAGE}", commands.len());
    let mut outputs = Vec::new();
    let mut wrong = Vec::new();
    for shown in commands {
        let ran = shell.run(&shown.command);
        assert_eq!(
            ran.code, 0,
            "{PAGE}: `{}` exited {}; a command shown failing must say so (`; echo \"exit code $?\"`). It printed:\n{}",
            shown.command, ran.code, ran.output
        );
        let (expected, actual) = (shell.normalize(&shown.output.join("\n")), shell.normalize(&ran.output));
        if expected != actual {
            wrong.push(format!("$ {}\n--- the page shows\n{expected}\n+++ it printed\n{actual}", shown.command));
        }
        outputs.push(ran.output);
    }
    if std::env::var_os("FLEETGATE_BLESS").is_some_and(|v| v == "1") {
        page.bless(&outputs);
        eprintln!("{PAGE}: wrote the outputs of this run ({} differed); review with git diff", wrong.len());
        return;
    }
    assert!(
        wrong.is_empty(),
        "{PAGE} shows other output than the commands print ({} of them; normalized below). If the change is \
         intended, regenerate the page: FLEETGATE_BLESS=1 cargo test --test cli docs_quickstart\n\n{}",
        wrong.len(),
        wrong.join("\n\n")
    );
}

/// The placeholders the comparison rests on: ids and places are replaced, release ids (dates
/// after a `-`) are not.
#[test]
fn ids_and_places_are_normalized_and_release_ids_are_not() {
    let dir = Path::new("/tmp/fgdocX");
    let text = "commit 3de3c29212 reverts 45445ac9d9 in /tmp/fgdocX/work  \nrel-20250315-001 by \
                6969D7140AE21C1F001C5081A23564E763F87994 at 2026-12-04T18:40:01Z\n\n";
    assert_eq!(normalize(text, dir), "commit [HASH] reverts [HASH] in [DIR]/work\nrel-20250315-001 by [KEY] at [TIME]");
}
