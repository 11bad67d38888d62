//! Output shared by every command: the `-o` format, printing a serializable value as JSON/YAML,
//! and the pieces of human output several commands print the same way (headings, "Next:" hints,
//! cluster moves, CRD verdicts, errors), and [`terminal_safe`] for text others wrote (status
//! descriptions, names from the repo) before it reaches a terminal.

use crate::model::error_chain;
use crate::releng::checks::CrdVerdict;
use crate::releng::forge_pr::OpenedPullRequest;
use crate::releng::promote::ClusterMove;
use crate::releng::publish::Published;
use crate::releng::push::Pushed;
use crate::releng::{FleetRepo, Refusal, RelengError};
use owo_colors::OwoColorize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::process::ExitCode;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// For people: tables and sentences, colours on a TTY.
    #[default]
    Table,
    Json,
    Yaml,
}

impl OutputFormat {
    /// Prints `value` as JSON or YAML and returns true; returns false for `Table` so the
    /// caller prints its own human form.
    pub fn print_machine<T: Serialize>(self, value: &T) -> anyhow::Result<bool> {
        match self {
            OutputFormat::Table => Ok(false),
            OutputFormat::Json => {
                println!("{}", serde_json::to_string_pretty(value)?);
                Ok(true)
            }
            OutputFormat::Yaml => {
                print!("{}", serde_saphyr::to_string(value)?);
                Ok(true)
            }
        }
    }
}

/// True when stdout should get colours, as the `supports-color` crate decides it: always with
/// `CLICOLOR_FORCE`/`FORCE_COLOR` (not 0), else never with `NO_COLOR` or `TERM=dumb`, else when
/// stdout is a terminal.
pub fn colours() -> bool {
    supports_color::on_cached(supports_color::Stream::Stdout).is_some()
}

/// The width tables fit in: `COLUMNS` when set (scripts, tests), else the terminal's own width
/// when stdout is one, else 80. Never below 40.
pub fn terminal_width() -> usize {
    let columns = std::env::var("COLUMNS").ok().and_then(|c| c.parse::<usize>().ok());
    let terminal = || terminal_size::terminal_size_of(std::io::stdout()).map(|(w, _)| usize::from(w.0));
    columns.or_else(terminal).filter(|w| *w >= 40).unwrap_or(80)
}

/// How a release command ended, for `-o json|yaml`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Done<'a, T: Serialize> {
    pub result: &'static str,
    #[serde(flatten)]
    pub report: &'a T,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pushed: Option<&'a Pushed>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<&'a OpenedPullRequest>,
}

impl<'a, T: Serialize> Done<'a, T> {
    pub fn published(p: &'a Published<T>) -> Self {
        Done { result: "done", report: &p.report, pushed: p.pushed.as_ref(), pull_request: p.pull_request.as_ref() }
    }
}

/// The end of a command that prepares a Git change and publishes it (promote, rollback): print
/// what was done with `print`, then the error that stopped publishing, if any.
pub fn finish_published<R>(
    format: OutputFormat,
    outcome: Result<(FleetRepo, Published<R>), RelengError>,
    print: impl FnOnce(&FleetRepo, &Published<R>) -> anyhow::Result<()>,
) -> anyhow::Result<ExitCode> {
    let (repo, done) = match outcome {
        Ok(v) => v,
        Err(e) => return fail(format, &e),
    };
    print(&repo, &done)?;
    match &done.error {
        Some(e) => fail(format, e),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// Prints a refusal or error in the chosen format, its sources once each, and returns its exit
/// code (1 refused, 2 other).
pub fn fail(format: OutputFormat, err: &RelengError) -> anyhow::Result<ExitCode> {
    let (result, code) = match err.refusal() {
        Some(_) => ("refused", 1),
        None => ("error", 2),
    };
    #[derive(Serialize)]
    struct Failed<'a> {
        result: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<&'a str>,
        message: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        details: Option<&'a Refusal>,
    }
    let text = error_chain(err);
    let failed =
        Failed { result, code: err.refusal().map(|r| r.code()), message: text.clone(), details: err.refusal() };
    if !format.print_machine(&failed)? {
        let text = text.strip_prefix("refused: ").unwrap_or(&text);
        if colours() {
            eprintln!("{} {text}", format!("{result}:").red().bold());
        } else {
            eprintln!("{result}: {text}");
        }
    }
    Ok(ExitCode::from(code))
}

/// A heading line, green and bold on a terminal.
pub fn heading(text: &str) {
    if colours() {
        println!("{}", text.green().bold());
    } else {
        println!("{text}");
    }
}

/// A "Next:" hint line.
pub fn next(text: &str) {
    if colours() {
        println!("\n{} {text}", "Next:".bold());
    } else {
        println!("\nNext: {text}");
    }
}

/// The `Next:` hints of a command that publishes a change people then wait for (rollback,
/// pause); only the words about what to watch differ between commands.
pub struct PublishHints {
    /// After `--open-pr`.
    pub after_pr: &'static str,
    /// After `--push`.
    pub after_push: &'static str,
    /// Committed on the base branch of a repo with no remote, which the agents read as it is:
    /// given the `fleetgate status --repo …` command to watch with.
    pub on_local_base: fn(&str) -> String,
}

/// The end of a published change's report: what was pushed, the PR, and what to do next (push,
/// merge, or watch), for a change committed on `branch` into `base`.
pub fn print_published_tail<R>(
    done: &Published<R>,
    repo: &FleetRepo,
    repo_path: &std::path::Path,
    remote: &str,
    (branch, base): (&str, &str),
    hints: &PublishHints,
) {
    if let Some(p) = &done.pushed {
        println!("  pushed     {} to {}", p.refs.join(", "), p.remote);
    }
    match (&done.pull_request, &done.pushed) {
        (Some(pr), _) => {
            println!("  PR         #{} {}", pr.number, pr.url);
            next(hints.after_pr);
        }
        (None, Some(_)) => next(hints.after_push),
        (None, None) if branch == base && repo.has_remote(remote) => next(&format!(
            "git -C {} push {remote} {base} (or re-run with --push) so the agents see it",
            repo_path.display()
        )),
        (None, None) if branch == base => next(&format!(
            "the agents follow {base}; {}",
            (hints.on_local_base)(&format!("`fleetgate status --repo {}`", repo_path.display()))
        )),
        (None, None) => next(&format!("push {branch} and open a PR into {base} (or re-run with --open-pr)")),
    }
}

/// The `clusters` lines of a promotion or rollback: each cluster's wave and move.
pub fn print_moves(moves: &[ClusterMove]) {
    println!("  clusters");
    for m in moves {
        println!("    {:<20} wave {:<10} {} -> {}", m.cluster, m.wave, m.from_or_none(), m.to);
    }
}

/// `compatible with rel-1`, `INCOMPATIBLE with rel-1 (2 finding(s))`, `nothing to compare with (first release)`.
pub fn crd_line(v: &CrdVerdict, against: Option<&str>) -> String {
    match (v.compared, against) {
        (true, Some(a)) => format!("{} with {a}", v.summary()),
        _ => format!("{} ({})", v.summary(), if against.is_some() { "nothing installed" } else { "first release" }),
    }
}

/// `text` with nothing a terminal would act on: CR, LF, tab and the other whitespace controls
/// become a space (a description is one line), every other control character (ESC of an ANSI
/// sequence, BEL, backspace, C1 controls) and the bidirectional overrides that reorder what is
/// shown become a visible `\u{…}` escape, so a forged status can neither repaint the screen nor
/// hide what it says.
pub fn terminal_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\t' | '\n' | '\r' | '\u{b}' | '\u{c}' => out.push(' '),
            c if acted_on(c) => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out
}

/// A character [`terminal_text`] replaces: a control character or a bidirectional override.
fn acted_on(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// [`terminal_text`] in place, for `Matrix::for_each_text_mut`: text with nothing to replace
/// (nearly all of it) is left as it is, not copied.
pub fn make_terminal_safe(text: &mut String) {
    // Printable ASCII, nearly all of it, is checked a byte at a time without stopping early, which
    // the compiler turns into vector code: a fleet's matrix holds millions of strings.
    if text.bytes().fold(true, |printable, b| printable & (b' '..=b'~').contains(&b)) {
        return;
    }
    if text.chars().any(acted_on) {
        *text = terminal_text(text);
    }
}

/// `value` with [`terminal_text`] applied to every string in it, for the table renderers, whose
/// input (descriptions, cluster and release names) comes from the repo and its notes. JSON and
/// YAML output print the value itself: their encoders escape control characters already.
pub fn terminal_safe<T: Serialize + DeserializeOwned>(value: &T) -> anyhow::Result<T> {
    fn clean(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => *s = terminal_text(s),
            serde_json::Value::Array(items) => items.iter_mut().for_each(clean),
            serde_json::Value::Object(map) => map.values_mut().for_each(clean),
            _ => {}
        }
    }
    let mut v = serde_json::to_value(value)?;
    clean(&mut v);
    Ok(serde_json::from_value(v)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::plain("rolled back: error-rate 7.3 % > 5 %", "rolled back: error-rate 7.3 % > 5 %")]
    #[case::ansi("\x1b[2J\x1b[32msuccess\x1b[0m", "\\u{1b}[2J\\u{1b}[32msuccess\\u{1b}[0m")]
    #[case::carriage_return("failure\rsuccess", "failure success")]
    #[case::newline_and_tab("a\nb\tc", "a b c")]
    #[case::bell_backspace_c1("x\x07\x08\u{9b}y", "x\\u{7}\\u{8}\\u{9b}y")]
    #[case::bidi_override("ok \u{202e}deliaf", "ok \\u{202e}deliaf")]
    #[case::unicode_kept("déployé · ✓", "déployé · ✓")]
    fn terminal_text_leaves_nothing_a_terminal_acts_on(#[case] given: &str, #[case] shown: &str) {
        assert_eq!(terminal_text(given), shown);
        let mut in_place = given.to_string();
        make_terminal_safe(&mut in_place);
        assert_eq!(in_place, shown, "in place as well");
    }

    #[test]
    fn text_is_made_terminal_safe_in_place() {
        let mut text = "ok \u{202e}x\r".to_string();
        make_terminal_safe(&mut text);
        assert_eq!(text, "ok \\u{202e}x ");
        let mut plain = "déployé · ✓".to_string();
        make_terminal_safe(&mut plain);
        assert_eq!(plain, "déployé · ✓");
    }

    #[test]
    fn terminal_safe_cleans_every_string_of_a_value() {
        let v = serde_json::json!({"a": ["\x1b[31mx", {"b": "y\r"}], "n": 1});
        assert_eq!(terminal_safe(&v).unwrap(), serde_json::json!({"a": ["\\u{1b}[31mx", {"b": "y "}], "n": 1}));
    }
}
